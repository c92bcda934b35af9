//! The emulator against golden fixtures captured from a real vLLM (test-data/vllm, see
//! test-data/README.md): JSON shapes of every response kind, error bodies, and metric names,
//! types and label names.

mod common;

use common::*;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};

fn fixture(name: &str) -> String {
    let path = format!("{}/../../test-data/vllm/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Every path in a JSON value with the kind of value found there. Nulls are their own kind, so
/// a field vLLM leaves null must also be null (or absent elsewhere) in the emulator.
fn shape(value: &Value) -> BTreeMap<String, &'static str> {
    fn walk(value: &Value, path: String, out: &mut BTreeMap<String, &'static str>) {
        let kind = match value {
            Value::Null => "null",
            Value::Bool(_) => "bool",
            Value::Number(_) => "number",
            Value::String(_) => "string",
            Value::Array(items) => {
                for item in items.iter().take(1) {
                    walk(item, format!("{path}[]"), out);
                }
                "array"
            }
            Value::Object(map) => {
                for (k, v) in map {
                    walk(v, format!("{path}.{k}"), out);
                }
                "object"
            }
        };
        out.insert(path, kind);
    }
    let mut out = BTreeMap::new();
    walk(value, String::new(), &mut out);
    out
}

fn assert_same_shape(what: &str, real: &Value, emulated: &Value) {
    let (real, emulated) = (shape(real), shape(emulated));
    assert_eq!(real, emulated, "{what}: shape differs from the real vLLM");
}

/// The shape of each chunk kind in a stream: role, content, finish, usage.
fn stream_shapes(body: &str) -> Vec<Value> {
    let events = sse_data(body);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect()
}

async fn emulated(path: &str, body: Value) -> String {
    let engine = start(fast_config()).await;
    engine.post(path, body).await.text().await.unwrap()
}

fn chat_body(stream: bool) -> Value {
    let mut body = chat(
        "the load balancer routes each request to the engine",
        8,
        false,
    );
    if stream {
        body["stream"] = true.into();
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

fn completion_body(stream: bool) -> Value {
    let mut body = json!({"model": "test-model", "prompt": "the load balancer routes", "max_tokens": 8, "ignore_eos": true});
    if stream {
        body["stream"] = true.into();
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_streamed_bodies_have_vllm_shapes() {
    let real: Value = serde_json::from_str(&fixture("chat-completion.json")).unwrap();
    let ours: Value =
        serde_json::from_str(&emulated("/v1/chat/completions", chat_body(false)).await).unwrap();
    assert_same_shape("chat completion", &real, &ours);

    let real: Value = serde_json::from_str(&fixture("completion.json")).unwrap();
    let ours: Value =
        serde_json::from_str(&emulated("/v1/completions", completion_body(false)).await).unwrap();
    // vLLM leaves created_cache_tokens null for completions and 0 for chat; the shape matches.
    assert_same_shape("completion", &real, &ours);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_chunks_have_vllm_shapes_in_vllm_order() {
    for (path, fixture_name, body) in [
        (
            "/v1/chat/completions",
            "chat-completion-stream.txt",
            chat_body(true),
        ),
        (
            "/v1/completions",
            "completion-stream.txt",
            completion_body(true),
        ),
    ] {
        let real = stream_shapes(&fixture(fixture_name));
        let ours = stream_shapes(&emulated(path, body).await);
        assert_eq!(
            real.len(),
            ours.len(),
            "{fixture_name}: chunk count (both 8 tokens)"
        );
        for (i, (r, o)) in real.iter().zip(&ours).enumerate() {
            assert_same_shape(&format!("{fixture_name} chunk {i}"), r, o);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_bodies_match_vllm() {
    let engine = start(fast_config()).await;
    let cases = [
        (
            "error-unknown-model.json",
            json!({"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}),
        ),
        (
            "error-context-length.json",
            json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 100000}),
        ),
        (
            "error-bad-temperature.json",
            json!({"messages": [{"role": "user", "content": "x"}], "temperature": -1}),
        ),
    ];
    for (name, body) in cases {
        let real: Value = serde_json::from_str(&fixture(name)).unwrap();
        let response = engine.post("/v1/chat/completions", body).await;
        assert_eq!(response.status().as_u16(), real["status"], "{name}");
        let ours: Value = response.json().await.unwrap();
        assert_same_shape(name, &real["body"], &ours);
        for key in ["type", "param", "code"] {
            assert_eq!(
                real["body"]["error"][key], ours["error"][key],
                "{name}: {key}"
            );
        }
    }
    let real: Value = serde_json::from_str(&fixture("error-bad-json.json")).unwrap();
    let response = engine
        .client
        .post(format!("{}/v1/chat/completions", engine.base))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), real["status"]);
    let ours: Value = response.json().await.unwrap();
    assert_eq!(ours["error"]["type"], real["body"]["error"]["type"]);
    assert_eq!(ours["error"]["code"], real["body"]["error"]["code"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_list_matches_vllm_shape_where_it_matters() {
    let real: Value = serde_json::from_str(&fixture("models.json")).unwrap();
    let engine = start(fast_config()).await;
    let ours: Value = engine.get("/v1/models").await.json().await.unwrap();
    for key in [
        "id",
        "object",
        "created",
        "owned_by",
        "root",
        "parent",
        "max_model_len",
    ] {
        assert_eq!(
            shape(&real["data"][0][key]),
            shape(&ours["data"][0][key]),
            "models: {key}"
        );
    }
}

/// (type, label names) of each metric family.
fn families(metrics: &Exposition) -> BTreeMap<String, (String, BTreeSet<String>)> {
    metrics
        .families
        .iter()
        .map(|(name, family)| {
            let labels = family.get_label_names().iter().cloned().collect();
            (name.clone(), (family.family_type.to_string(), labels))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_use_vllm_names_types_and_labels() {
    let real = families(&parse_metrics(&fixture("metrics.txt")));
    let engine = start(fast_config()).await;
    engine
        .post(
            "/v1/chat/completions",
            chat("warm up the histograms", 4, true),
        )
        .await
        .text()
        .await
        .unwrap();
    let ours = families(&engine.metrics().await);
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:num_requests_waiting_by_reason",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:num_preemptions_total",
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
        "vllm:e2e_request_latency_seconds",
    ] {
        assert!(real.contains_key(name), "fixture lacks {name}");
        assert!(ours.contains_key(name), "emulator lacks {name}");
    }
    for (name, (kind, labels)) in &ours {
        let (real_kind, real_labels) = real
            .get(name)
            .unwrap_or_else(|| panic!("{name} is not a vLLM metric"));
        assert_eq!(kind, real_kind, "{name}: type");
        if name == "vllm:cache_config_info" {
            // vLLM lists its whole CacheConfig; the emulator the fields it models.
            assert!(labels.is_subset(real_labels), "{name}: {labels:?}");
        } else {
            assert_eq!(labels, real_labels, "{name}: label names");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn histogram_buckets_equal_vllm_buckets() {
    fn bounds(metrics: &Exposition, name: &str) -> Vec<f64> {
        let family = metrics
            .families
            .get(name)
            .unwrap_or_else(|| panic!("no {name}"));
        match &family.iter_samples().next().unwrap().value {
            openmetrics_parser::PrometheusValue::Histogram(h) => {
                h.buckets.iter().map(|b| b.upper_bound).collect()
            }
            other => panic!("{name}: {other:?}"),
        }
    }
    let real = parse_metrics(&fixture("metrics.txt"));
    let engine = start(fast_config()).await;
    let ours = engine.metrics().await;
    for name in [
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_time_per_output_token_seconds",
        "vllm:request_inference_time_seconds",
    ] {
        assert_eq!(bounds(&real, name), bounds(&ours, name), "{name}");
    }
}
