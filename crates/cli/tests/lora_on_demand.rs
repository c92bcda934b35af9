//! LoRA adapters loaded on demand (`lora.on_demand`), against real processes: emulated engines
//! started with `--enable-lora` and no adapters. Concurrent requests for a new adapter cause one
//! `POST /v1/load_lora_adapter` on one engine and all go there; an adapter without a configured
//! path is a 404 naming it; an engine that refuses the load makes the request a 502 with the
//! engine's reason, counted in `kvgate_lora_loads_total`.

mod support;

use support::*;

const YAML: &str = "admin_token: t\nlora:\n  on_demand: true\n  paths:\n    sql: /adapters/sql\n";

/// Waits until the gateway learned every endpoint's models from its `/v1/models` (before, an
/// endpoint of unknown model serves any name, and nothing is loaded).
async fn discovered(gateway: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let status = admin_json(gateway, "/admin/endpoints", "t").await;
        let endpoints = status["endpoints"].as_array().unwrap();
        if endpoints
            .iter()
            .all(|e| e["models"] == serde_json::json!(["test-model"]))
        {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never discovered: {status}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

async fn metrics(gateway: &str) -> String {
    let r = client().get(format!("{gateway}/metrics")).send().await;
    r.unwrap().text().await.unwrap()
}

async fn models(engine: &str) -> String {
    let r = client().get(format!("{engine}/v1/models")).send().await;
    r.unwrap().text().await.unwrap()
}

#[tokio::test]
async fn concurrent_requests_for_a_new_adapter_cause_one_load() {
    let e0 = engine("e0", "1", &["--enable-lora"]);
    let e1 = engine("e1", "1", &["--enable-lora"]);
    let gw = gateway_with_config(&[&e0, &e1], "lora-on-demand", YAML).await;
    discovered(&gw.url).await;
    let requests = (0..8).map(|n| {
        let url = gw.url.clone();
        tokio::spawn(async move {
            let r = complete(&url, "test-model:sql", n).await;
            let endpoint = header(&r, "x-kvgate-endpoint");
            (r.status().as_u16(), endpoint)
        })
    });
    let mut endpoints = std::collections::BTreeSet::new();
    for r in requests {
        let (status, endpoint) = r.await.unwrap();
        assert_eq!(status, 200);
        endpoints.insert(endpoint);
    }
    assert_eq!(
        endpoints.len(),
        1,
        "all went where it was loaded: {endpoints:?}"
    );
    let listing: Vec<bool> = [&e0, &e1]
        .iter()
        .map(|e| async { models(&e.url).await.contains("\"sql\"") })
        .collect::<futures_util::future::JoinAll<_>>()
        .await;
    assert_eq!(listing.iter().filter(|l| **l).count(), 1, "{listing:?}");
    let text = metrics(&gw.url).await;
    assert!(
        text.contains("kvgate_lora_loads_total{reason=\"ok\"} 1\n"),
        "{text}"
    );
    // The bare adapter name now routes there too, with no second load.
    let r = complete(&gw.url, "sql", 9).await;
    assert_eq!(r.status(), 200);
    assert!(endpoints.contains(&header(&r, "x-kvgate-endpoint")));

    let r = complete(&gw.url, "test-model:chat", 0).await;
    assert_eq!(r.status(), 404);
    let body = r.text().await.unwrap();
    assert!(body.contains("`chat`") && body.contains("`sql`"), "{body}");
    let text = metrics(&gw.url).await;
    assert!(
        text.contains("kvgate_lora_loads_total{reason=\"ok\"} 1\n"),
        "{text}"
    );
}

#[tokio::test]
async fn a_refused_load_is_a_502_with_the_engine_s_reason() {
    let plain = engine("e0", "1", &[]);
    let gw = gateway_with_config(&[&plain], "lora-on-demand-refused", YAML).await;
    discovered(&gw.url).await;
    let r = complete(&gw.url, "test-model:sql", 0).await;
    assert_eq!(r.status(), 502);
    let body = r.text().await.unwrap();
    assert!(body.contains("--enable-lora"), "{body}");
    let text = metrics(&gw.url).await;
    assert!(
        text.contains("kvgate_lora_loads_total{reason=\"refused\"} 1\n"),
        "{text}"
    );
}
