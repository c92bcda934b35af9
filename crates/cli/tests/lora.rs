//! LoRA adapter-aware routing against real processes: two emulated engines serving adapters
//! `a`, `b` and `c` with one adapter per batch (`--max-loras 1`), `a` running on one and `b` on
//! the other (long requests sent to the engines directly). The gateway learns the adapters from
//! `/v1/models`, reads `vllm:lora_requests_info` from each engine's `/metrics` (the admin API
//! shows it), and sends requests for `a` where `a` runs and for `b` where `b` runs; the decision
//! records say why.

mod support;

use std::time::{Duration, Instant};
use support::*;

fn lora_engine(id: &str) -> Proc {
    engine(
        id,
        "1",
        &["--lora-modules", "a", "b", "c", "--max-loras", "1"],
    )
}

/// Starts a long streamed request for `adapter` on `engine` directly and returns once its first
/// token came (the adapter runs there); the task holds the stream until the test ends.
async fn occupy(engine: &str, adapter: &str) -> tokio::task::JoinHandle<()> {
    let response = client()
        .post(format!("{engine}/v1/completions"))
        .json(&serde_json::json!({
            "model": adapter,
            "prompt": format!("keep {adapter} busy"),
            "max_tokens": 2000,
            "ignore_eos": true,
            "stream": true,
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut response = response;
    let first = response.chunk().await.unwrap();
    assert!(first.is_some(), "a first token");
    tokio::spawn(async move { while let Ok(Some(_)) = response.chunk().await {} })
}

/// Polls the admin API until each endpoint reports `running` (by endpoint name).
async fn wait_adapters(gateway: &str, running: &[(&str, &str)]) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let status = admin_json(gateway, "/admin/endpoints", "t").await;
        let seen = |name: &str, adapter: &str| {
            status["endpoints"].as_array().unwrap().iter().any(|e| {
                e["name"] == name && e["adapters"]["running"] == serde_json::json!([adapter])
            })
        };
        if running.iter().all(|(name, adapter)| seen(name, adapter)) {
            return status;
        }
        assert!(Instant::now() < deadline, "adapters never showed: {status}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn ask(gateway: &str, model: &str, n: u32) -> (String, String) {
    let r = complete(gateway, model, n).await;
    assert_eq!(r.status(), 200, "{model}");
    (
        header(&r, "x-kvgate-endpoint"),
        header(&r, "x-kvgate-request-id"),
    )
}

#[tokio::test]
async fn requests_for_an_adapter_go_where_it_runs() {
    let (e0, e1) = (lora_engine("e0"), lora_engine("e1"));
    let gw = gateway(
        &[&e0, &e1],
        &["--policy", "predicted_ttft", "--admin-token", "t"],
    )
    .await;
    wait_for(&format!("{}/v1/models", gw.url), "the adapters", |body| {
        ["\"a\"", "\"b\"", "\"c\""].iter().all(|m| body.contains(m))
    })
    .await;
    let name = |p: &Proc| p.url.trim_start_matches("http://").to_owned();
    let (n0, n1) = (name(&e0), name(&e1));
    let _a = occupy(&e0.url, "a").await;
    let _b = occupy(&e1.url, "b").await;
    let status = wait_adapters(&gw.url, &[(&n0, "a"), (&n1, "b")]).await;
    for e in status["endpoints"].as_array().unwrap() {
        assert_eq!(e["adapters"]["max_loras"], 1, "{e}");
    }

    for n in 0..4 {
        assert_eq!(ask(&gw.url, "a", n).await.0, n0, "a runs on e0");
        let (endpoint, request) = ask(&gw.url, "b", n).await;
        assert_eq!(endpoint, n1, "b runs on e1");
        let path = format!("/admin/decisions?request={request}");
        let decisions = admin_json(&gw.url, &path, "t").await;
        let record = &decisions["decisions"][0];
        assert_eq!(record["adapter"], "b", "{record}");
        let candidates = record["candidates"].as_array().unwrap();
        let chosen = candidates.iter().find(|c| c["chosen"] == true).unwrap();
        assert_eq!(chosen["adapter"], "running", "{record}");
        assert!(
            candidates
                .iter()
                .any(|c| c["chosen"] == false && c["adapter"] == "full"),
            "{record}"
        );
    }
}
