//! The LoRA gate against real processes: one emulated engine serving adapters `a` and `b` with
//! one adapter per batch (`--max-loras 1`, vLLM's default) behind the gateway. A long request
//! for `a` runs, one for `b` queues behind it, and new requests for `a` keep arriving. The
//! engine alone would admit every new `a` past `b` (exhaustive service: `b` waits as long as `a`
//! keeps coming); the gateway holds the new `a`s until `b`'s turn starts, so `b` gets its first
//! token once the first `a` ends, well within the bound, while `a`s still arrive. The held
//! requests are counted, answered, and their decision records say they were held.

mod support;

use std::time::{Duration, Instant};
use support::*;

/// A streamed completion for `adapter` of `tokens` tokens through the gateway; returns once the
/// first token arrived, with the time it took, the response's request id and a task that
/// reads the rest of the stream.
async fn stream(
    gateway: &str,
    adapter: &str,
    n: u32,
    tokens: u32,
) -> (Duration, String, tokio::task::JoinHandle<()>) {
    let sent = Instant::now();
    let mut response = client()
        .post(format!("{gateway}/v1/completions"))
        .header("x-kvgate-explain", "1")
        .json(&serde_json::json!({
            "model": adapter,
            "prompt": format!("request {n} for {adapter}"),
            "max_tokens": tokens,
            "ignore_eos": true,
            "stream": true,
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "{adapter} {n}");
    let id = header(&response, "x-kvgate-request-id");
    let first = response.chunk().await.unwrap();
    assert!(first.is_some(), "a first token");
    let ttft = sent.elapsed();
    let rest = tokio::spawn(async move { while let Ok(Some(_)) = response.chunk().await {} });
    (ttft, id, rest)
}

/// Polls the gateway's metrics until `check` holds (15 s at most).
async fn until_metrics(gateway: &str, what: &str, check: impl Fn(&str) -> bool) {
    wait_for(&format!("{gateway}/metrics"), what, check).await;
}

#[tokio::test]
async fn a_waiting_adapter_is_served_within_the_bound_while_the_other_keeps_arriving() {
    let e0 = engine("e0", "1", &["--lora-modules", "a", "b", "--max-loras", "1"]);
    let yaml = "policy: { name: predicted_ttft }\n\
                admin_token: t\n\
                lora: { gate: { enabled: true, max_hold_ms: 8000 } }\n";
    let gw = gateway_with_config(&[&e0], "lora-gate", yaml).await;
    wait_for(&format!("{}/v1/models", gw.url), "the adapters", |body| {
        body.contains("\"a\"") && body.contains("\"b\"")
    })
    .await;
    // `a` runs about 2.4 s (200 tokens at the engine's 12 ms per iteration).
    let (_, _, first_a) = stream(&gw.url, "a", 0, 200).await;
    // The gateway must know the engine's adapter slots (its scrape) before `b` arrives.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let status = admin_json(&gw.url, "/admin/endpoints", "t").await;
        let e = &status["endpoints"][0]["adapters"];
        if e["max_loras"] == 1 && e["running"] == serde_json::json!(["a"]) {
            break;
        }
        assert!(Instant::now() < deadline, "no adapter report: {status}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let url = gw.url.clone();
    let b = tokio::spawn(async move { stream(&url, "b", 1, 4).await });
    // `b` is sent (the engine queues it behind `a`) before more `a`s come.
    until_metrics(&gw.url, "b's dispatch", |m| {
        metric(m, "kvgate_inflight_requests{").is_some_and(|n| n >= 2.0)
    })
    .await;
    // `a`s keep arriving, one every 100 ms, until `b` has its first token.
    let mut arrivals = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut n = 2;
    while !b.is_finished() {
        tick.tick().await;
        let url = gw.url.clone();
        arrivals.push(tokio::spawn(async move { stream(&url, "a", n, 100).await }));
        n += 1;
        assert!(n < 200, "b never got its turn");
    }
    let (b_ttft, _, b_rest) = b.await.unwrap();
    assert!(
        b_ttft < Duration::from_millis(8_000),
        "b waited {b_ttft:?}, past the bound"
    );
    assert!(arrivals.len() >= 3, "a kept arriving: {}", arrivals.len());
    until_metrics(&gw.url, "the held requests' release", |m| {
        metric(m, "kvgate_lora_held_total{reason=\"released\"}").is_some_and(|n| n >= 1.0)
    })
    .await;
    // Every held `a` is answered; the decision records of those held say so.
    let mut held = 0;
    for task in arrivals {
        let (_, id, rest) = task.await.unwrap();
        rest.await.unwrap();
        let path = format!("/admin/decisions?request={id}");
        let record = admin_json(&gw.url, &path, "t").await;
        if let Some(hold) = record["decisions"][0].get("lora_hold") {
            assert_eq!(hold["behind"], "b", "{record}");
            assert_eq!(hold["released"], "released", "{record}");
            held += 1;
        }
    }
    assert!(held >= 1, "no decision record shows a hold");
    b_rest.await.unwrap();
    first_a.await.unwrap();
    let metrics = get_text(&client(), &gw.url, "/metrics").await;
    assert_eq!(
        metric(&metrics, "kvgate_lora_holding "),
        Some(0.0),
        "{metrics}"
    );
    assert!(metric(&metrics, "kvgate_lora_hold_seconds_count").is_some_and(|n| n >= 1.0));
}
