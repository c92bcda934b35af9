//! Every fault mode over real HTTP, set at startup or through the admin API.

mod common;

use common::*;
use futures_util::StreamExt;
use kvgate_engine::EngineConfig;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn with_faults(specs: &[&str]) -> EngineConfig {
    EngineConfig {
        faults: specs.iter().map(|s| s.parse().unwrap()).collect(),
        ..fast_config()
    }
}

fn streamed(max_tokens: u32) -> Value {
    json!({"prompt": "stream me some tokens", "max_tokens": max_tokens, "ignore_eos": true, "stream": true})
}

/// Reads a streamed body chunk by chunk, returning the content pieces with their arrival times
/// and whether the stream ended cleanly.
async fn read_stream(response: reqwest::Response) -> (Vec<(Instant, String)>, bool) {
    let mut pieces = Vec::new();
    let mut buffer = String::new();
    let mut body = response.bytes_stream();
    while let Some(chunk) = body.next().await {
        let Ok(chunk) = chunk else {
            return (pieces, false);
        };
        buffer.push_str(std::str::from_utf8(&chunk).unwrap());
        while let Some(end) = buffer.find("\n\n") {
            let event: String = buffer.drain(..end + 2).collect();
            let data = event.trim().strip_prefix("data: ").unwrap().to_owned();
            if data == "[DONE]" {
                return (pieces, true);
            }
            let v: Value = serde_json::from_str(&data).unwrap();
            if let Some(text) = v["choices"][0]["text"].as_str() {
                pieces.push((Instant::now(), text.to_owned()));
            }
        }
    }
    (pieces, false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_faults_answer_with_status_and_retry_after() {
    let engine = start(with_faults(&["429:retry_after=7"])).await;
    let r = engine.post("/v1/completions", json!({"prompt": "x"})).await;
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "7");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], 429);
    for (spec, status) in [("500", 500), ("503", 503)] {
        engine.set_faults(&[spec]).await;
        let r = engine
            .post("/v1/chat/completions", chat("x", 2, false))
            .await;
        assert_eq!(r.status(), status);
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], status);
    }
    // Health and metrics are not affected by request faults.
    assert_eq!(engine.get("/health").await.status(), 200);
    assert_eq!(engine.get("/metrics").await.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probabilistic_faults_hit_some_requests_reproducibly() {
    async fn statuses() -> Vec<u16> {
        let engine = start(with_faults(&["503:p=0.5"])).await;
        let mut out = Vec::new();
        for _ in 0..40 {
            out.push(
                engine
                    .post("/v1/completions", json!({"prompt": "x", "max_tokens": 1}))
                    .await
                    .status()
                    .as_u16(),
            );
        }
        out
    }
    let first = statuses().await;
    assert_eq!(first, statuses().await, "same seed, same draws");
    let failed = first.iter().filter(|&&s| s == 503).count();
    assert!(failed > 0 && failed < 40, "{failed}");
    assert!(first.iter().all(|&s| s == 503 || s == 200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_fault_drops_the_connection_before_any_byte() {
    let engine = start(with_faults(&["reset"])).await;
    let error = engine
        .client
        .post(format!("{}/v1/completions", engine.base))
        .json(&json!({"prompt": "x"}))
        .send()
        .await;
    let error = error.expect_err("the connection must fail");
    assert!(!error.is_timeout(), "{error}");
    // The engine keeps serving other connections once the fault is cleared.
    engine
        .client
        .delete(format!("{}/admin/faults", engine.base))
        .send()
        .await
        .unwrap();
    assert_eq!(
        engine
            .post("/v1/completions", json!({"prompt": "x", "max_tokens": 1}))
            .await
            .status(),
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stall_before_first_token_delays_the_stream() {
    let engine = start(with_faults(&["stall_first:ms=300"])).await;
    let sent = Instant::now();
    let response = engine.post("/v1/completions", streamed(3)).await;
    assert_eq!(response.status(), 200, "headers arrive before the stall");
    let (pieces, clean) = read_stream(response).await;
    assert!(clean);
    assert_eq!(pieces.len(), 3);
    assert!(pieces[0].0 - sent >= Duration::from_millis(300));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_stall_is_aborted_when_the_client_gives_up() {
    // Real time (scaled) so that the sequence is still decoding when the client leaves.
    let engine = start(EngineConfig {
        time_scale: 0.05,
        ..with_faults(&["stall_first"])
    })
    .await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let response = client
        .post(format!("{}/v1/completions", engine.base))
        .json(&streamed(4000))
        .send()
        .await
        .unwrap();
    let (pieces, clean) = read_stream(response).await;
    assert!(pieces.is_empty() && !clean);
    engine
        .wait_metrics("the abandoned request counted as aborted", |m| {
            labelled(m, "vllm:request_success_total", "finished_reason", "abort") == 1.0
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stall_mid_stream_pauses_after_k_tokens() {
    let engine = start(with_faults(&["stall_mid:after=2,ms=300"])).await;
    let sent = Instant::now();
    let (pieces, clean) = read_stream(engine.post("/v1/completions", streamed(5)).await).await;
    assert!(clean);
    assert_eq!(pieces.len(), 5);
    // The third token leaves at least 300 ms after the second was produced, so after the
    // request was sent: a bound that holds however late this busy client reads the second.
    assert!(pieces[2].0 - sent >= Duration::from_millis(300));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_mid_stream_cuts_after_k_tokens() {
    let engine = start(EngineConfig {
        time_scale: 0.05,
        ..with_faults(&["disconnect_mid:after=3"])
    })
    .await;
    let (pieces, clean) = read_stream(engine.post("/v1/completions", streamed(4000)).await).await;
    assert!(!clean, "the stream must not end with [DONE]");
    assert_eq!(pieces.len(), 3);
    engine
        .wait_metrics("the cut request counted as aborted", |m| {
            labelled(m, "vllm:request_success_total", "finished_reason", "abort") == 1.0
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_decode_stretches_every_decode_iteration() {
    // Default cost model: a decode iteration of one short sequence is ~12 ms; at time scale
    // 0.05 that is ~0.6 ms real, and 10x slower with the fault.
    let config = EngineConfig {
        time_scale: 0.05,
        ..with_faults(&["slow_decode:factor=10"])
    };
    let engine = start(config).await;
    let sent = Instant::now();
    let (pieces, clean) = read_stream(engine.post("/v1/completions", streamed(21)).await).await;
    assert!(clean && pieces.len() == 21);
    // 20 decode iterations of at least 12 ms x 0.05 x 10 each.
    assert!(
        sent.elapsed() >= Duration::from_millis(120),
        "{:?}",
        sent.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_refuses_new_requests_and_finishes_running_ones() {
    let config = EngineConfig {
        time_scale: 0.05,
        ..fast_config()
    };
    let engine = start(config).await;
    let running = engine.post("/v1/completions", streamed(40)).await;
    engine.set_faults(&["drain"]).await;
    let refused = engine.post("/v1/completions", json!({"prompt": "x"})).await;
    assert_eq!(refused.status(), 503);
    assert_eq!(engine.get("/health").await.status(), 503);
    let (pieces, clean) = read_stream(running).await;
    assert!(clean && pieces.len() == 40, "the running request completes");
    let listing: Value = engine
        .client
        .delete(format!("{}/admin/faults", engine.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listing, json!({"faults": []}));
    assert_eq!(engine.get("/health").await.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_api_lists_validates_and_requires_the_token() {
    let engine = start(fast_config()).await;
    engine
        .set_faults(&["429:retry_after=2,p=0.5", "stall_first:ms=10"])
        .await;
    let listing: Value = engine.get("/admin/faults").await.json().await.unwrap();
    assert_eq!(
        listing,
        json!({"faults": ["429:retry_after=2,p=0.5", "stall_first:ms=10"]})
    );
    let bad = engine
        .post("/admin/faults", json!({"faults": ["teapot"]}))
        .await;
    assert_eq!(bad.status(), 400);
    let listing: Value = engine.get("/admin/faults").await.json().await.unwrap();
    assert_eq!(
        listing["faults"].as_array().unwrap().len(),
        2,
        "a bad spec changes nothing"
    );

    let engine = start(EngineConfig {
        admin_token: Some("s3cret".to_owned()),
        ..fast_config()
    })
    .await;
    let url = format!("{}/admin/faults", engine.base);
    assert_eq!(engine.client.get(&url).send().await.unwrap().status(), 401);
    let wrong = engine
        .client
        .get(&url)
        .bearer_auth("nope")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    let ok = engine
        .client
        .post(&url)
        .bearer_auth("s3cret")
        .json(&json!({"faults": ["500"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    assert_eq!(
        engine
            .post("/v1/completions", json!({"prompt": "x"}))
            .await
            .status(),
        500
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_streamed_requests_meet_stalls_and_disconnects_too() {
    let engine = start(with_faults(&["stall_first:ms=200"])).await;
    let sent = Instant::now();
    let r = engine
        .post("/v1/completions", json!({"prompt": "x", "max_tokens": 2}))
        .await;
    assert_eq!(r.status(), 200);
    assert!(sent.elapsed() >= Duration::from_millis(200));

    let engine = start(EngineConfig {
        time_scale: 0.05,
        ..with_faults(&["disconnect_mid:after=2"])
    })
    .await;
    let result = engine
        .client
        .post(format!("{}/v1/completions", engine.base))
        .json(&json!({"prompt": "x", "max_tokens": 4000, "ignore_eos": true}))
        .send()
        .await;
    assert!(result.is_err(), "the connection is reset before a response");
    engine
        .wait_metrics("the cut request counted as aborted", |m| {
            labelled(m, "vllm:request_success_total", "finished_reason", "abort") == 1.0
        })
        .await;
}
