//! LoRA adapters on the wire: `/v1/models` lists them with their parent, requests name them
//! by `model` (or SGLang's `base:adapter`), runtime load and unload answer as vLLM does, and
//! `vllm:lora_requests_info` reports the running and waiting adapters.

mod common;

use common::*;
use kvgate_engine::LoraSettings;
use serde_json::json;

fn lora_config() -> kvgate_engine::EngineConfig {
    kvgate_engine::EngineConfig {
        lora: LoraSettings {
            modules: vec!["sql=/adapters/sql".into(), "chat".into()],
            ..LoraSettings::default()
        },
        ..fast_config()
    }
}

#[tokio::test]
async fn adapters_are_listed_served_loaded_and_reported() {
    let engine = start(lora_config()).await;
    let models: serde_json::Value = engine.get("/v1/models").await.json().await.unwrap();
    let cards = models["data"].as_array().unwrap();
    let ids: Vec<&str> = cards.iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["test-model", "chat", "sql"]);
    assert_eq!(cards[2]["parent"], "test-model");
    assert_eq!(cards[2]["root"], "/adapters/sql");
    assert!(cards[0]["parent"].is_null());

    for model in ["sql", "test-model:chat", "test-model"] {
        let answer = engine
            .post(
                "/v1/completions",
                json!({"model": model, "prompt": "hello", "max_tokens": 2}),
            )
            .await;
        assert_eq!(answer.status(), 200, "{model}");
    }
    let unknown = engine
        .post(
            "/v1/completions",
            json!({"model": "math", "prompt": "hello", "max_tokens": 2}),
        )
        .await;
    assert_eq!(unknown.status(), 404);

    let load = json!({"lora_name": "math", "lora_path": "/adapters/math"});
    let loaded = engine.post("/v1/load_lora_adapter", load.clone()).await;
    assert_eq!(loaded.status(), 200);
    assert!(loaded.text().await.unwrap().contains("added successfully"));
    assert_eq!(
        engine.post("/v1/load_lora_adapter", load).await.status(),
        400
    );
    let math = engine
        .post(
            "/v1/completions",
            json!({"model": "math", "prompt": "hello", "max_tokens": 2}),
        )
        .await;
    assert_eq!(math.status(), 200);
    let unload = json!({"lora_name": "math"});
    assert_eq!(
        engine
            .post("/v1/unload_lora_adapter", unload.clone())
            .await
            .status(),
        200
    );
    assert_eq!(
        engine
            .post("/v1/unload_lora_adapter", unload)
            .await
            .status(),
        404
    );

    let text = engine.get("/metrics").await.text().await.unwrap();
    let info: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("vllm:lora_requests_info{"))
        .collect();
    assert!(
        info.iter().any(|l| l.starts_with(
            "vllm:lora_requests_info{max_lora=\"1\",running_lora_adapters=\"\",waiting_lora_adapters=\"\"}"
        )),
        "{text}"
    );
    engine.handle.shutdown();
}

#[tokio::test]
async fn an_engine_without_lora_refuses_adapters() {
    let engine = start(fast_config()).await;
    let load = json!({"lora_name": "math", "lora_path": "/adapters/math"});
    assert_eq!(
        engine.post("/v1/load_lora_adapter", load).await.status(),
        400
    );
    let text = engine.get("/metrics").await.text().await.unwrap();
    assert!(!text.contains("vllm:lora_requests_info"));
    engine.handle.shutdown();
}
