//! Prefill/decode disaggregation between two emulated engines: vLLM's KV-connector parameters
//! and SGLang's bootstrap, the transfer skipping the decode engine's prefill, and the
//! failures that make it prefill locally.

mod common;

use common::{chat, fast_config, histogram_count, long_prompt, sample, start, TestEngine};
use kvgate_engine::{EngineConfig, Role};
use serde_json::{json, Value};

async fn engine(id: &str, role: Role, faults: &[&str]) -> TestEngine {
    start(EngineConfig {
        id: id.to_owned(),
        role,
        faults: faults.iter().map(|f| f.parse().unwrap()).collect(),
        ..fast_config()
    })
    .await
}

fn prefill_body(prompt: &str) -> Value {
    let mut body = chat(prompt, 1, false);
    body["kv_transfer_params"] = json!({
        "do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null,
        "remote_block_ids": null, "remote_host": null, "remote_port": null,
    });
    body
}

fn cached_tokens(answer: &Value) -> u64 {
    answer["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0)
}

#[tokio::test]
async fn vllm_parameters_move_the_prefill_to_the_prefill_engine() {
    let prefill = engine("p0", Role::Prefill, &[]).await;
    let decode = engine("d0", Role::Decode, &[]).await;
    let prompt = long_prompt("vllm", 400);
    let first = prefill
        .post("/v1/chat/completions", prefill_body(&prompt))
        .await;
    assert!(first.status().is_success());
    let first: Value = first.json().await.unwrap();
    let params = first["kv_transfer_params"].clone();
    assert_eq!(params["do_remote_prefill"], true);
    assert_eq!(params["remote_engine_id"], "p0");
    assert!(params["remote_block_ids"]
        .as_array()
        .is_some_and(|b| !b.is_empty()));
    let mut body = chat(&prompt, 8, false);
    body["kv_transfer_params"] = params;
    let answer: Value = decode
        .post("/v1/chat/completions", body)
        .await
        .json()
        .await
        .unwrap();
    let prompt_tokens = answer["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(cached_tokens(&answer), prompt_tokens - 1, "{answer}");
    let d = decode.metrics().await;
    assert_eq!(sample(&d, "kvgate_kv_transfers_total"), 1.0);
    assert_eq!(histogram_count(&d, "vllm:nixl_xfer_time_seconds"), 1);
    assert_eq!(
        sample(&d, "vllm:nixl_bytes_transferred_total"),
        (prompt_tokens - 1 + 1) as f64 * 131_072.0
    );
    // The decode engine's own prefix cache did not serve it.
    assert_eq!(sample(&d, "vllm:prefix_cache_hits_total"), 0.0);
    assert_eq!(
        sample(&prefill.metrics().await, "kvgate_kv_prefill_legs_total"),
        1.0
    );
    // A second read of the same KV finds nothing: the decode prefills locally.
    let mut body = chat(&prompt, 8, false);
    body["kv_transfer_params"] = first["kv_transfer_params"].clone();
    let again: Value = decode
        .post("/v1/chat/completions", body)
        .await
        .json()
        .await
        .unwrap();
    assert!(cached_tokens(&again) < prompt_tokens - 1);
    assert_eq!(
        sample(
            &decode.metrics().await,
            "vllm:nixl_num_failed_transfers_total"
        ),
        1.0
    );
}

#[tokio::test]
async fn invalid_parameters_and_failed_transfers_prefill_locally() {
    let prefill = engine("p0", Role::Prefill, &["kv_fail"]).await;
    let decode = engine("d0", Role::Decode, &[]).await;
    let prompt = long_prompt("bad", 300);
    let mut body = chat(&prompt, 4, true);
    body["kv_transfer_params"] = json!({"do_remote_prefill": true, "remote_host": "127.0.0.1"});
    let r = decode.post("/v1/chat/completions", body).await;
    assert!(r.status().is_success());
    let _ = r.text().await.unwrap();
    let d = decode.metrics().await;
    assert_eq!(sample(&d, "kvgate_kv_transfer_invalid_params_total"), 1.0);
    let first: Value = prefill
        .post("/v1/chat/completions", prefill_body(&prompt))
        .await
        .json()
        .await
        .unwrap();
    let mut body = chat(&prompt, 4, false);
    body["kv_transfer_params"] = first["kv_transfer_params"].clone();
    let r = decode.post("/v1/chat/completions", body).await;
    assert!(r.status().is_success());
    assert_eq!(
        sample(
            &decode.metrics().await,
            "vllm:nixl_num_failed_transfers_total"
        ),
        1.0
    );
}

#[tokio::test]
async fn sglang_legs_meet_by_bootstrap_room_in_either_order() {
    let prefill = engine("p0", Role::Prefill, &[]).await;
    let decode = engine("d0", Role::Decode, &[]).await;
    let addr = prefill.handle.local_addr();
    let prompt = long_prompt("sgl", 400);
    let mut body = chat(&prompt, 6, true);
    body["bootstrap_host"] = json!(addr.ip().to_string());
    body["bootstrap_port"] = json!(addr.port());
    body["bootstrap_room"] = json!(12345);
    // The decode leg first: it waits for the prefill of its room.
    let decode_leg = decode.post("/v1/chat/completions", body.clone());
    let prefill_leg = async {
        tokio::task::yield_now().await;
        prefill.post("/v1/chat/completions", body.clone()).await
    };
    let (d, p) = tokio::join!(decode_leg, prefill_leg);
    assert!(p.status().is_success());
    let p: Value = p.json().await.unwrap();
    assert_eq!(
        p["usage"]["completion_tokens"], 1,
        "the prefill leg stops at one token"
    );
    let text = d.text().await.unwrap();
    assert!(text.contains("[DONE]"));
    assert_eq!(
        sample(&decode.metrics().await, "kvgate_kv_transfers_total"),
        1.0
    );
    // An engine playing both roles serves the same body as an ordinary request.
    let both = engine("b0", Role::Both, &[]).await;
    let r = both.post("/v1/chat/completions", body).await;
    assert!(r.status().is_success());
    let _ = r.text().await.unwrap();
    let text = both.get("/metrics").await.text().await.unwrap();
    assert!(
        !text.contains("nixl"),
        "a plain engine shows no transfer metrics"
    );
}
