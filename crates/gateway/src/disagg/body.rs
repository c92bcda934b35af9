//! The legs' bodies: the client's JSON rewritten as each protocol's reference router writes it.

use bytes::Bytes;
use serde_json::{Map, Value};

fn object(body: &[u8]) -> Option<Map<String, Value>> {
    serde_json::from_slice(body).ok()
}

fn encode(fields: &Map<String, Value>) -> Bytes {
    Bytes::from(serde_json::to_vec(fields).unwrap_or_default())
}

/// vLLM's prefill leg, as `toy_proxy_server` sends it: the client's body with
/// `kv_transfer_params` asking for a remote decode, no stream (and no `stream_options`), one
/// output token (`max_completion_tokens` too when the client set it) and no `min_tokens`.
/// `None` for a body that is not a JSON object.
pub(crate) fn vllm_prefill(body: &[u8]) -> Option<Bytes> {
    let mut fields = object(body)?;
    fields.insert(
        "kv_transfer_params".into(),
        serde_json::json!({
            "do_remote_decode": true,
            "do_remote_prefill": false,
            "remote_engine_id": null,
            "remote_block_ids": null,
            "remote_host": null,
            "remote_port": null,
        }),
    );
    fields.insert("stream".into(), Value::Bool(false));
    fields.insert("max_tokens".into(), Value::from(1));
    if fields.contains_key("max_completion_tokens") {
        fields.insert("max_completion_tokens".into(), Value::from(1));
    }
    fields.remove("stream_options");
    fields.remove("min_tokens");
    Some(encode(&fields))
}

/// The `kv_transfer_params` of a prefill's answer, when it carries an object of them.
pub(crate) fn answer_params(answer: &[u8]) -> Option<Value> {
    let mut fields = object(answer)?;
    match fields.remove("kv_transfer_params")? {
        p @ Value::Object(_) => Some(p),
        _ => None,
    }
}

/// vLLM's decode leg: the client's own body (its stream, `stream_options` and `min_tokens`)
/// with the prefill's parameters, forwarded as they came.
pub(crate) fn vllm_decode(body: &[u8], params: Value) -> Option<Bytes> {
    let mut fields = object(body)?;
    fields.insert("kv_transfer_params".into(), params);
    Some(encode(&fields))
}

/// SGLang's legs (one body for both): `bootstrap_host` (the prefill engine's host),
/// `bootstrap_port` (its bootstrap port, or null) and `bootstrap_room`; arrays of them, one
/// room per prompt, when `prompt` is a list of prompts (as `sgl-model-gateway` does).
pub(crate) fn sglang(body: &[u8], host: &str, port: Option<u16>, room: u64) -> Option<Bytes> {
    let mut fields = object(body)?;
    let batch = match fields.get("prompt") {
        Some(Value::Array(items)) if items.iter().all(|i| !i.is_number()) => Some(items.len()),
        _ => None,
    };
    let (host, port) = (Value::from(host), port.map_or(Value::Null, Value::from));
    match batch {
        Some(n) => {
            let rooms = (0..n as u64).map(|i| Value::from(room.wrapping_add(i) & (u64::MAX >> 1)));
            fields.insert("bootstrap_host".into(), Value::Array(vec![host; n]));
            fields.insert("bootstrap_port".into(), Value::Array(vec![port; n]));
            fields.insert("bootstrap_room".into(), Value::Array(rooms.collect()));
        }
        None => {
            fields.insert("bootstrap_host".into(), host);
            fields.insert("bootstrap_port".into(), port);
            fields.insert("bootstrap_room".into(), Value::from(room));
        }
    }
    Some(encode(&fields))
}

/// The host of a base URL (`http://host:port`), brackets of an IPv6 host removed.
pub(crate) fn host_of(base: &str) -> Option<String> {
    let uri: axum::http::Uri = base.parse().ok()?;
    let host = uri.host()?;
    Some(
        host.trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned(),
    )
}
