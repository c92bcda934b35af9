//! The OpenAI API over real HTTP: streaming chunk order and usage, non-streaming bodies,
//! models, health and error bodies.

mod common;

use common::*;
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_chat_has_role_contents_finish_usage_done_in_order() {
    let engine = start(fast_config()).await;
    let response = engine
        .post(
            "/v1/chat/completions",
            chat("tell me about caches", 5, true),
        )
        .await;
    assert_eq!(response.status(), 200);
    assert!(response.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let events = sse_data(&response.text().await.unwrap());
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    // role, 5 contents (the last with finish_reason), usage
    assert_eq!(chunks.len(), 7, "{chunks:#?}");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let id = chunks[0]["id"].as_str().unwrap();
    assert!(id.starts_with("chatcmpl-"));
    for (i, chunk) in chunks[1..6].iter().enumerate() {
        assert_eq!(chunk["id"], id);
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["model"], "test-model");
        let choice = &chunk["choices"][0];
        assert!(choice["delta"]["content"]
            .as_str()
            .unwrap()
            .starts_with(' '));
        let expected = if i == 4 { json!("length") } else { Value::Null };
        assert_eq!(choice["finish_reason"], expected);
    }
    let usage = &chunks[6]["usage"];
    assert_eq!(chunks[6]["choices"], json!([]));
    assert_eq!(usage["completion_tokens"], 5);
    let prompt_tokens = usage["prompt_tokens"].as_u64().unwrap();
    assert!(prompt_tokens > 0);
    assert_eq!(usage["total_tokens"].as_u64().unwrap(), prompt_tokens + 5);
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_completion_without_usage_ends_with_done() {
    let engine = start(fast_config()).await;
    let body = json!({"model": "test-model", "prompt": "once upon a time", "max_tokens": 3, "ignore_eos": true, "stream": true});
    let events = sse_data(
        &engine
            .post("/v1/completions", body)
            .await
            .text()
            .await
            .unwrap(),
    );
    assert_eq!(events.len(), 4, "{events:?}");
    assert_eq!(events[3], "[DONE]");
    let chunks: Vec<Value> = events[..3]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "text_completion" && c.get("usage").is_none()));
    assert_eq!(chunks[2]["choices"][0]["finish_reason"], "length");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_streamed_responses_are_deterministic_and_complete() {
    let engine = start(fast_config()).await;
    let first: Value = engine
        .post("/v1/chat/completions", chat("same prompt", 12, false))
        .await
        .json()
        .await
        .unwrap();
    let second: Value = engine
        .post("/v1/chat/completions", chat("same prompt", 12, false))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(first["object"], "chat.completion");
    assert_eq!(first["choices"][0]["message"]["role"], "assistant");
    let text = first["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(text.split_whitespace().count(), 12);
    assert_eq!(
        text,
        second["choices"][0]["message"]["content"].as_str().unwrap()
    );
    assert_eq!(first["usage"]["completion_tokens"], 12);
    assert_ne!(first["id"], second["id"]);

    let body = json!({"model": "test-model", "prompt": [11, 12, 13, 14], "max_tokens": 2, "ignore_eos": true});
    let completion: Value = engine
        .post("/v1/completions", body)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(completion["object"], "text_completion");
    assert_eq!(completion["usage"]["prompt_tokens"], 4);
    assert_eq!(completion["choices"][0]["finish_reason"], "length");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_ignore_eos_lengths_are_sampled_and_capped() {
    let engine = start(fast_config()).await;
    let mut stops = 0;
    for i in 0..20 {
        let body = json!({"prompt": format!("prompt number {i}"), "max_tokens": 20});
        let r: Value = engine
            .post("/v1/completions", body)
            .await
            .json()
            .await
            .unwrap();
        let n = r["usage"]["completion_tokens"].as_u64().unwrap();
        assert!((1..=20).contains(&n));
        let reason = r["choices"][0]["finish_reason"].as_str().unwrap();
        assert_eq!(reason == "length", n == 20, "{r}");
        stops += usize::from(reason == "stop");
    }
    // Mean 16 capped at 20: with this seed most end on their own, some hit the cap.
    assert!(stops > 0 && stops < 20, "{stops}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_health_and_unknown_routes() {
    let engine = start(fast_config()).await;
    let models: Value = engine.get("/v1/models").await.json().await.unwrap();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "test-model");
    assert_eq!(models["data"][0]["max_model_len"], 8192);
    assert_eq!(engine.get("/health").await.status(), 200);
    let missing = engine.get("/v2/nothing").await;
    assert_eq!(missing.status(), 404);
    let wrong_method = engine.get("/v1/chat/completions").await;
    assert_eq!(wrong_method.status(), 405);
}

async fn error_of(engine: &TestEngine, path: &str, body: reqwest::Body) -> (u16, Value) {
    let response = engine
        .client
        .post(format!("{}{path}", engine.base))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_openai_style_errors() {
    let engine = start(fast_config()).await;
    let long = long_prompt("w", 5000);
    let cases: Vec<(&str, String, u16, &str)> = vec![
        (
            "/v1/chat/completions",
            "{not json".to_owned(),
            400,
            "Bad Request",
        ),
        (
            "/v1/chat/completions",
            json!({"model": "other", "messages": [{"role": "user", "content": "x"}]}).to_string(),
            404,
            "NotFoundError",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "n": 3}).to_string(),
            400,
            "BadRequestError",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 9000}).to_string(),
            400,
            "BadRequestError",
        ),
        (
            "/v1/completions",
            json!({"prompt": long, "max_tokens": 10}).to_string(),
            400,
            "BadRequestError",
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "temperature": -0.5}).to_string(),
            400,
            "BadRequestError",
        ),
    ];
    for (path, body, status, kind) in cases {
        let (got, error) = error_of(&engine, path, body.clone().into()).await;
        assert_eq!(got, status, "{body}: {error}");
        let e = &error["error"];
        assert_eq!(e["type"], kind, "{error}");
        assert_eq!(e["code"], status);
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()));
        assert!(e.get("param").is_some());
    }
    let body = json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 9000});
    let (_, e) = error_of(&engine, "/v1/chat/completions", body.to_string().into()).await;
    let message = e["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("cannot be greater than max_model_len=8192"),
        "{message}"
    );
    let body = json!({"prompt": long_prompt("w", 5000), "max_tokens": 10});
    let (_, e) = error_of(&engine, "/v1/completions", body.to_string().into()).await;
    let message = e["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("maximum context length is 8192 tokens"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_engine_shuts_down() {
    let engine = start(fast_config()).await;
    assert_eq!(engine.get("/health").await.status(), 200);
    engine.handle.shutdown();
    let base = engine.base.clone();
    engine.handle.join().await.unwrap();
    assert!(reqwest::get(format!("{base}/health")).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_gives_up_aborts_its_sequence() {
    // Scaled real time: 4,000 decode iterations take seconds, the clients leave after 300 ms.
    let engine = start(kvgate_engine::EngineConfig {
        time_scale: 0.05,
        ..fast_config()
    })
    .await;
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_millis(300))
        .build()
        .unwrap();
    for stream in [false, true] {
        let body = json!({"prompt": "a long answer please", "max_tokens": 4000, "ignore_eos": true, "stream": stream});
        let result = match client
            .post(format!("{}/v1/completions", engine.base))
            .json(&body)
            .send()
            .await
        {
            Ok(response) => response.text().await.map(|_| ()),
            Err(e) => Err(e),
        };
        assert!(result.unwrap_err().is_timeout());
    }
    engine
        .wait_metrics("both sequences aborted and the batch empty", |m| {
            labelled(m, "vllm:request_success_total", "finished_reason", "abort") == 2.0
                && sample(m, "vllm:num_requests_running") == 0.0
        })
        .await;
}
