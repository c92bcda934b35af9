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

    pub async fn metrics(&self) -> Exposition {
        let text = self.get("/metrics").await.text().await.unwrap();
        parse_metrics(&text)
    }

    /// Polls `/metrics` until `check` holds, failing after a deadline.
    pub async fn wait_metrics(&self, what: &str, check: impl Fn(&Exposition) -> bool) {
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

/// A parsed Prometheus text exposition.
pub type Exposition = openmetrics_parser::MetricsExposition<
    openmetrics_parser::PrometheusType,
    openmetrics_parser::PrometheusValue,
>;

/// Parses the text format strictly (a malformed exposition fails the test).
///
/// openmetrics-parser's grammar, like prometheus-parse's regex, does not accept the colon that
/// the exposition format allows in metric names (and vLLM uses in every name), so the `vllm:`
/// prefix is read as `vllm_` and families are keyed back under their real names.
pub fn parse_metrics(text: &str) -> Exposition {
    let renamed = text.replace("vllm:", "vllm_");
    let mut parsed = openmetrics_parser::prometheus::parse_prometheus(&renamed)
        .unwrap_or_else(|e| panic!("bad exposition: {e:?}\n{text}"));
    parsed.families = parsed
        .families
        .drain()
        .map(|(name, family)| match name.strip_prefix("vllm_") {
            Some(rest) if text.contains(&format!("vllm:{rest}")) => {
                (format!("vllm:{rest}"), family)
            }
            _ => (name, family),
        })
        .collect();
    parsed
}

/// The value of the first sample of a counter or gauge family.
pub fn sample(metrics: &Exposition, name: &str) -> f64 {
    let family = metrics
        .families
        .get(name)
        .unwrap_or_else(|| panic!("no metric {name}"));
    let s = family
        .iter_samples()
        .next()
        .unwrap_or_else(|| panic!("{name} has no sample"));
    match &s.value {
        openmetrics_parser::PrometheusValue::Gauge(n)
        | openmetrics_parser::PrometheusValue::Unknown(n) => n.as_f64(),
        openmetrics_parser::PrometheusValue::Counter(c) => c.value.as_f64(),
        other => panic!("{name} is not a scalar: {other:?}"),
    }
}

/// The observation count of the first sample of a histogram family.
pub fn histogram_count(metrics: &Exposition, name: &str) -> u64 {
    let family = metrics
        .families
        .get(name)
        .unwrap_or_else(|| panic!("no metric {name}"));
    match &family.iter_samples().next().unwrap().value {
        openmetrics_parser::PrometheusValue::Histogram(h) => h.count.unwrap_or(0),
        other => panic!("{name} is not a histogram: {other:?}"),
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

/// The value of the sample of counter/gauge `name` whose label `label` is `value`.
pub fn labelled(metrics: &Exposition, name: &str, label: &str, value: &str) -> f64 {
    let family = metrics
        .families
        .get(name)
        .unwrap_or_else(|| panic!("no metric {name}"));
    for s in family.iter_samples() {
        let labels = s.get_labelset().unwrap();
        if labels.iter().any(|(k, v)| k == label && v == value) {
            return match &s.value {
                openmetrics_parser::PrometheusValue::Gauge(n) => n.as_f64(),
                openmetrics_parser::PrometheusValue::Counter(c) => c.value.as_f64(),
                other => panic!("{name}: {other:?}"),
            };
        }
    }
    panic!("{name} has no sample with {label}={value}")
}
