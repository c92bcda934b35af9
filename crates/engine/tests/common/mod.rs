//! Helpers shared by the integration tests: an in-process engine on a free loopback port and
//! small HTTP / SSE / Prometheus utilities.
#![allow(dead_code, unreachable_pub)]

use kvgate_engine::{EngineConfig, EngineHandle};
use std::time::{Duration, Instant};

/// A running engine and its base URL.
pub struct TestEngine {
    pub handle: EngineHandle,
    pub base: String,
    pub client: reqwest::Client,
}

/// A config for tests: no delays, small pool, fixed seed.
pub fn fast_config() -> EngineConfig {
    EngineConfig {
        model: "test-model".to_owned(),
        time_scale: 0.0,
        kv_blocks: 4096,
        block_size: 16,
        max_model_len: 8192,
        mean_output_tokens: 16,
        seed: 7,
        ..EngineConfig::default()
    }
}

pub async fn start(config: EngineConfig) -> TestEngine {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let handle = kvgate_engine::spawn(config, listener).await.unwrap();
    let base = format!("http://{}", handle.local_addr());
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    TestEngine {
        handle,
        base,
        client,
    }
}

impl TestEngine {
    pub async fn post(&self, path: &str, body: serde_json::Value) -> reqwest::Response {
        self.client
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.client
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap()
    }

    pub async fn metrics(&self) -> prometheus_parse::Scrape {
        let text = self.get("/metrics").await.text().await.unwrap();
        parse_metrics(&text)
    }

    /// Polls `/metrics` until `check` holds, failing after a deadline.
    pub async fn wait_metrics(
        &self,
        what: &str,
        check: impl Fn(&prometheus_parse::Scrape) -> bool,
    ) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if check(&self.metrics().await) {
                return;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub async fn set_faults(&self, faults: &[&str]) {
        let response = self
            .post("/admin/faults", serde_json::json!({ "faults": faults }))
            .await;
        assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
    }
}

pub fn parse_metrics(text: &str) -> prometheus_parse::Scrape {
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).unwrap()
}

/// The value of a sample without labels beyond engine/model_name.
pub fn sample(scrape: &prometheus_parse::Scrape, name: &str) -> f64 {
    let s = scrape
        .samples
        .iter()
        .find(|s| s.metric == name)
        .unwrap_or_else(|| panic!("no sample {name}"));
    match s.value {
        prometheus_parse::Value::Counter(v)
        | prometheus_parse::Value::Gauge(v)
        | prometheus_parse::Value::Untyped(v) => v,
        _ => panic!("{name} is not a scalar"),
    }
}

/// The `data:` payloads of an SSE body, in order.
pub fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter(|event| !event.trim().is_empty())
        .map(|event| {
            event
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not an SSE data event: {event:?}"))
                .to_owned()
        })
        .collect()
}

/// A chat request body.
pub fn chat(content: &str, max_tokens: u32, stream: bool) -> serde_json::Value {
    let mut body = serde_json::json!({
        "model": "test-model",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "ignore_eos": true,
    });
    if stream {
        body["stream"] = true.into();
        body["stream_options"] = serde_json::json!({"include_usage": true});
    }
    body
}

/// A long, distinctive prompt (many KV blocks).
pub fn long_prompt(tag: &str, words: usize) -> String {
    (0..words).map(|i| format!("{tag}{i} ")).collect()
}
