//! SGLang's `model: "base:adapter"` through the gateway, against real processes: one emulated
//! engine serving adapters `a` and `b` and one serving only the base model. A request naming
//! `test-model:a` goes only to the engine that lists `a` (sent there as `a`, vLLM's form; the
//! emulated engine takes both), carries the adapter into routing (the decision record names
//! it), and a name whose adapter no engine lists is a 404.

mod support;

use support::*;

#[tokio::test]
async fn base_colon_adapter_goes_to_the_engines_listing_the_adapter() {
    let lora = engine("e0", "1", &["--lora-modules", "a", "b"]);
    let plain = engine("e1", "1", &[]);
    let gw = gateway(
        &[&lora, &plain],
        &["--policy", "round_robin", "--admin-token", "t"],
    )
    .await;
    // Until an endpoint's models are known it serves any name: wait for both.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let status = admin_json(&gw.url, "/admin/endpoints", "t").await;
        let known = |e: &serde_json::Value| e["models"].as_array().is_some_and(|m| !m.is_empty());
        if status["endpoints"].as_array().unwrap().iter().all(known) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never discovered: {status}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let lora_name = lora.url.trim_start_matches("http://").to_owned();
    for n in 0..4 {
        let r = complete(&gw.url, "test-model:a", n).await;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-kvgate-endpoint"), lora_name);
        let path = format!(
            "/admin/decisions?request={}",
            header(&r, "x-kvgate-request-id")
        );
        let decisions = admin_json(&gw.url, &path, "t").await;
        assert_eq!(decisions["decisions"][0]["adapter"], "a", "{decisions}");
    }
    // The base model still goes to both.
    let mut seen = std::collections::BTreeSet::new();
    for n in 0..4 {
        let r = complete(&gw.url, "test-model", n).await;
        assert_eq!(r.status(), 200);
        seen.insert(header(&r, "x-kvgate-endpoint"));
    }
    assert_eq!(seen.len(), 2, "{seen:?}");
    let r = complete(&gw.url, "test-model:zz", 0).await;
    assert_eq!(r.status(), 404);
    let body = r.text().await.unwrap();
    assert!(body.contains("test-model:zz"), "{body}");
}
