use super::body::{answer_params, host_of, sglang, vllm_decode, vllm_prefill};
use super::*;
use serde_json::{json, Value};

fn parse(b: &[u8]) -> Value {
    serde_json::from_slice(b).unwrap()
}

#[test]
fn the_vllm_prefill_leg_is_one_token_without_a_stream() {
    let client = json!({
        "model": "m", "messages": [], "stream": true, "stream_options": {"include_usage": true},
        "max_tokens": 300, "max_completion_tokens": 300, "min_tokens": 20,
    });
    let leg = parse(&vllm_prefill(client.to_string().as_bytes()).unwrap());
    assert_eq!(leg["stream"], false);
    assert_eq!(
        (
            leg["max_tokens"].clone(),
            leg["max_completion_tokens"].clone()
        ),
        (json!(1), json!(1))
    );
    assert!(leg.get("stream_options").is_none() && leg.get("min_tokens").is_none());
    assert_eq!(leg["kv_transfer_params"]["do_remote_decode"], true);
    assert_eq!(leg["kv_transfer_params"]["remote_host"], Value::Null);
    let without = parse(&vllm_prefill(br#"{"prompt":"x"}"#).unwrap());
    assert!(without.get("max_completion_tokens").is_none());
    assert!(vllm_prefill(b"[1]").is_none());
}

#[test]
fn the_vllm_decode_leg_is_the_clients_body_with_the_answers_params() {
    let answer = json!({"id": "x", "kv_transfer_params": {"remote_host": "h", "extra": [1]}});
    let params = answer_params(answer.to_string().as_bytes()).unwrap();
    let client =
        json!({"stream": true, "min_tokens": 5, "stream_options": {"include_usage": true}});
    let leg = parse(&vllm_decode(client.to_string().as_bytes(), params).unwrap());
    assert_eq!(
        leg["kv_transfer_params"]["extra"],
        json!([1]),
        "forwarded opaquely"
    );
    assert_eq!(
        (leg["stream"].clone(), leg["min_tokens"].clone()),
        (json!(true), json!(5))
    );
    assert!(answer_params(br#"{"kv_transfer_params": null}"#).is_none());
}

#[test]
fn sglang_bootstrap_fields_are_arrays_for_batched_prompts() {
    let one = parse(&sglang(br#"{"prompt":"a"}"#, "10.0.0.1", Some(8998), 42).unwrap());
    assert_eq!(one["bootstrap_host"], "10.0.0.1");
    assert_eq!(
        (one["bootstrap_port"].clone(), one["bootstrap_room"].clone()),
        (json!(8998), json!(42))
    );
    let many = parse(&sglang(br#"{"prompt":["a","b"]}"#, "h", None, 7).unwrap());
    assert_eq!(many["bootstrap_room"], json!([7, 8]));
    assert_eq!(many["bootstrap_port"], json!([null, null]));
    // A prompt of token ids is one prompt.
    let ids = parse(&sglang(br#"{"prompt":[1,2,3]}"#, "h", None, 7).unwrap());
    assert_eq!(ids["bootstrap_room"], json!(7));
}

#[test]
fn hosts_come_from_base_urls() {
    assert_eq!(host_of("http://[::1]:8000").as_deref(), Some("::1"));
    assert_eq!(host_of("http://10.0.0.1:8100").as_deref(), Some("10.0.0.1"));
}

#[test]
fn the_ledger_gives_back_what_a_guard_queued() {
    let ledger = Arc::new(Ledger::default());
    let e = EndpointId(3);
    let a = ledger.enqueue(e, 100.0);
    let b = ledger.enqueue(e, 50.0);
    assert_eq!(ledger.queued(e), 150.0);
    drop(a);
    assert_eq!(ledger.queued(e), 50.0);
    drop(b);
    assert_eq!(ledger.queued(e), 0.0);
}

#[test]
fn bad_settings_name_their_field() {
    let mut c = DisaggConfig::default();
    assert!(c.validate().is_ok());
    c.decision.transfer.bandwidth_gbps = -1.0;
    let e = c.validate().unwrap_err().to_string();
    assert!(
        e.contains("disaggregation.decision.transfer.bandwidth_gbps"),
        "{e}"
    );
    let c = DisaggConfig {
        prefill_timeout_ms: 0,
        ..DisaggConfig::default()
    };
    assert!(c
        .validate()
        .unwrap_err()
        .to_string()
        .contains("prefill_timeout_ms"));
}
