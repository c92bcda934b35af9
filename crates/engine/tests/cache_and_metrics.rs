//! The prefix cache seen from outside (cached_tokens in usage, vLLM's hit counters) and the
//! metrics moving with the traffic.

mod common;

use common::*;
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_prompt_reports_cached_tokens_and_the_hit_counter_rises() {
    let engine = start(fast_config()).await;
    let prompt = long_prompt("shared", 300);
    let before = engine.metrics().await;
    assert_eq!(sample(&before, "vllm:prefix_cache_hits_total"), 0.0);

    let first: Value = engine
        .post("/v1/chat/completions", chat(&prompt, 4, false))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let prompt_tokens = first["usage"]["prompt_tokens"].as_u64().unwrap();
    let after_first = engine.metrics().await;
    assert_eq!(sample(&after_first, "vllm:prefix_cache_hits_total"), 0.0);
    assert_eq!(
        sample(&after_first, "vllm:prefix_cache_queries_total"),
        prompt_tokens as f64
    );

    // Streamed this time: the usage chunk carries the same detail.
    let events = sse_data(
        &engine
            .post("/v1/chat/completions", chat(&prompt, 4, true))
            .await
            .text()
            .await
            .unwrap(),
    );
    let usage: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    let cached = usage["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    // Every full 16-token block of the prompt is reused; at least one token is computed.
    assert!(
        cached > 0 && cached < prompt_tokens,
        "{cached} of {prompt_tokens}"
    );
    assert_eq!(cached % 16, 0);
    assert!(cached >= prompt_tokens - 16, "{cached} of {prompt_tokens}");
    let after_second = engine.metrics().await;
    assert_eq!(
        sample(&after_second, "vllm:prefix_cache_hits_total"),
        cached as f64
    );
    assert_eq!(
        sample(&after_second, "vllm:prefix_cache_queries_total"),
        2.0 * prompt_tokens as f64
    );

    // A different prompt shares only the chat template's head, less than a block: no hit.
    let other: Value = engine
        .post(
            "/v1/chat/completions",
            chat(&long_prompt("other", 300), 4, false),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(other["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_prefix_caching_nothing_is_cached() {
    let engine = start(kvgate_engine::EngineConfig {
        prefix_caching: false,
        ..fast_config()
    })
    .await;
    let prompt = long_prompt("shared", 200);
    for _ in 0..2 {
        let r: Value = engine
            .post(
                "/v1/completions",
                json!({"prompt": prompt, "max_tokens": 2}),
            )
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(r["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    }
    assert_eq!(
        sample(&engine.metrics().await, "vllm:prefix_cache_hits_total"),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn histograms_and_token_counters_follow_the_requests() {
    let engine = start(fast_config()).await;
    for i in 0..5 {
        engine
            .post(
                "/v1/chat/completions",
                chat(&format!("request {i}"), 6, true),
            )
            .await
            .text()
            .await
            .unwrap();
    }
    let m = engine.metrics().await;
    for name in [
        "vllm:time_to_first_token_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_inference_time_seconds",
        "vllm:request_time_per_output_token_seconds",
    ] {
        assert_eq!(histogram_count(&m, name), 5, "{name}");
    }
    // One inter-token gap per token after the first.
    assert_eq!(
        histogram_count(&m, "vllm:inter_token_latency_seconds"),
        5 * 5
    );
    assert_eq!(sample(&m, "vllm:generation_tokens_total"), 30.0);
    assert_eq!(sample(&m, "vllm:num_requests_running"), 0.0);
    assert_eq!(sample(&m, "vllm:num_requests_waiting"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_kv_pool_shows_usage_and_preemptions() {
    // 64 blocks of 16 tokens; eight concurrent 300-token prompts with long outputs cannot all
    // fit, so the engine preempts. The time scale keeps them concurrent and the pool full for
    // about a second, long enough for a poll of /metrics to see it on a loaded machine.
    let config = kvgate_engine::EngineConfig {
        kv_blocks: 64,
        max_model_len: 1024,
        time_scale: 0.1,
        ..fast_config()
    };
    let engine = start(config).await;
    let mut streams = Vec::new();
    for i in 0..8 {
        let body = json!({"prompt": long_prompt(&format!("p{i}x"), 100), "max_tokens": 200, "ignore_eos": true, "stream": true});
        let client = engine.client.clone();
        let url = format!("{}/v1/completions", engine.base);
        streams.push(tokio::spawn(async move {
            client
                .post(url)
                .json(&body)
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        }));
    }
    engine
        .wait_metrics("KV usage above 0.5", |m| {
            sample(m, "vllm:kv_cache_usage_perc") > 0.5
        })
        .await;
    for s in streams {
        let body = s.await.unwrap();
        assert!(body.ends_with("data: [DONE]\n\n"));
    }
    let m = engine.metrics().await;
    assert!(sample(&m, "vllm:num_preemptions_total") > 0.0);
    assert_eq!(sample(&m, "vllm:kv_cache_usage_perc"), 0.0);
}
