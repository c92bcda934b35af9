//! A request's cache key: the fingerprint of everything but its last user message, and that
//! message.
//!
//! The fingerprint is the SHA-256 of a canonical JSON rendering of the body (keys sorted,
//! integral floats written as integers) with the last user message's text taken out: the
//! system prompt, the history, tools and `tool_choice`, `response_format`, the sampling
//! parameters, `seed`, `max_tokens`, `n`, `logprobs`, the model and the stream flag all
//! change it (vLLM Semantic Router fingerprints the same way). Two spellings of the same
//! request meet: `stream` absent or false, and `stream_options.include_usage` absent or
//! false (the gateway adds it to streams to count usage and strips the usage again).

use crate::parse::Api;
use kvgate_core::semcache::Fingerprint;
use serde_json::{Map, Value};
use std::fmt::Write as _;

/// What the cache keys a request on.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RequestKey {
    /// Everything but the last user message.
    pub(crate) fingerprint: Fingerprint,
    /// The last user message's text; empty when the request does not end with one (a tool
    /// result, a token-id prompt): such requests match exactly or not at all.
    pub(crate) message: String,
    /// The sampling temperature (1 when absent, the API's default).
    pub(crate) temperature: f64,
}

/// The key of a parsed `body` of `api`; `stripped_usage` says the gateway added
/// `include_usage` to it. `None` when the body is not a JSON object (parse refused those).
pub(crate) fn of(api: Api, body: &[u8], stripped_usage: bool) -> Option<RequestKey> {
    let Ok(Value::Object(mut fields)) = serde_json::from_slice::<Value>(body) else {
        return None;
    };
    let temperature = fields
        .get("temperature")
        .and_then(Value::as_f64)
        .unwrap_or(1.0);
    normalise(&mut fields, stripped_usage);
    let message = match api {
        Api::Chat => take_last_user_message(&mut fields),
        Api::Completions => match fields.get("prompt") {
            Some(Value::String(p)) => {
                let p = p.clone();
                fields.insert("prompt".into(), Value::Null);
                p
            }
            _ => String::new(),
        },
    };
    let mut canonical = String::with_capacity(256);
    let _ = writeln!(canonical, "{}", api.name());
    write_canonical(&mut canonical, &Value::Object(fields));
    let digest = ring::digest::digest(&ring::digest::SHA256, canonical.as_bytes());
    let mut fingerprint = [0u8; 32];
    fingerprint.copy_from_slice(digest.as_ref());
    Some(RequestKey {
        fingerprint: Fingerprint(fingerprint),
        message,
        temperature,
    })
}

fn normalise(fields: &mut Map<String, Value>, stripped_usage: bool) {
    let stream = matches!(fields.get("stream"), Some(Value::Bool(true)));
    fields.insert("stream".into(), Value::Bool(stream));
    let mut drop_options = false;
    if let Some(Value::Object(options)) = fields.get_mut("stream_options") {
        let asked =
            !stripped_usage && matches!(options.get("include_usage"), Some(Value::Bool(true)));
        options.insert("include_usage".into(), Value::Bool(asked));
        drop_options = !asked && options.len() == 1;
    }
    if drop_options || matches!(fields.get("stream_options"), Some(Value::Null)) {
        fields.remove("stream_options");
    }
}

/// Takes the text of the last message out when it is a user's (a string, or text parts
/// only), leaving its role behind; returns it, or an empty string when there is none.
fn take_last_user_message(fields: &mut Map<String, Value>) -> String {
    let Some(Value::Array(messages)) = fields.get_mut("messages") else {
        return String::new();
    };
    let Some(Value::Object(last)) = messages.last_mut() else {
        return String::new();
    };
    if last.get("role").and_then(Value::as_str) != Some("user") {
        return String::new();
    }
    let text = match last.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for part in parts {
                match (part.get("type").and_then(Value::as_str), part.get("text")) {
                    (Some("text"), Some(Value::String(t))) => {
                        if !text.is_empty() {
                            text.push('\n');
                        }
                        text.push_str(t);
                    }
                    // An image or audio part: the message is more than its text.
                    _ => return String::new(),
                }
            }
            text
        }
        _ => return String::new(),
    };
    last.insert("content".into(), Value::Null);
    text
}

/// JSON with object keys sorted and integral floats as integers, whatever order or spelling
/// the client used.
fn write_canonical(out: &mut String, value: &Value) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                write_canonical(out, &map[k]);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(out, item);
            }
            out.push(']');
        }
        Value::Number(n) => match n.as_f64() {
            Some(f) if !n.is_u64() && !n.is_i64() && f.fract() == 0.0 && f.abs() < 9e15 => {
                let _ = write!(out, "{}", f as i64);
            }
            _ => {
                let _ = write!(out, "{n}");
            }
        },
        other => {
            let _ = write!(out, "{other}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key(body: Value) -> RequestKey {
        of(Api::Chat, body.to_string().as_bytes(), false).unwrap()
    }

    fn base() -> Value {
        json!({
            "model": "m",
            "messages": [
                {"role": "system", "content": "be terse"},
                {"role": "user", "content": "What is 2 + 2?"}
            ]
        })
    }

    #[test]
    fn the_last_user_message_is_the_message_and_the_rest_the_fingerprint() {
        let k = key(base());
        assert_eq!(k.message, "What is 2 + 2?");
        let mut other = base();
        other["messages"][1]["content"] = json!("What is 3 + 3?");
        assert_eq!(key(other).fingerprint, k.fingerprint);
        let reordered = json!({
            "messages": base()["messages"].clone(),
            "model": "m",
            "stream": false,
        });
        assert_eq!(key(reordered).fingerprint, k.fingerprint);
    }

    #[test]
    fn every_other_field_changes_the_fingerprint() {
        let k = key(base());
        let changes = [
            ("model", json!("other")),
            ("temperature", json!(0.5)),
            ("top_p", json!(0.9)),
            ("seed", json!(7)),
            ("max_tokens", json!(16)),
            ("n", json!(2)),
            ("stream", json!(true)),
            ("logprobs", json!(true)),
            (
                "tools",
                json!([{"type": "function", "function": {"name": "f"}}]),
            ),
            ("tool_choice", json!("auto")),
            ("response_format", json!({"type": "json_object"})),
        ];
        for (field, value) in changes {
            let mut body = base();
            body[field] = value;
            assert_ne!(key(body).fingerprint, k.fingerprint, "{field}");
        }
        let mut system = base();
        system["messages"][0]["content"] = json!("be verbose");
        assert_ne!(key(system).fingerprint, k.fingerprint, "system prompt");
    }

    #[test]
    fn a_request_not_ending_with_a_user_message_has_no_message() {
        let mut body = base();
        body["messages"][1] = json!({"role": "tool", "content": "42", "tool_call_id": "c"});
        assert_eq!(key(body).message, "");
        let mut image = base();
        image["messages"][1]["content"] = json!([{"type": "image_url", "image_url": {"url": "x"}}]);
        assert_eq!(key(image).message, "");
    }

    #[test]
    fn the_usage_the_gateway_added_is_not_the_clients() {
        let asked = json!({"model": "m", "stream": true, "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": "hi"}]});
        let bytes = asked.to_string();
        let added = of(Api::Chat, bytes.as_bytes(), true).unwrap();
        let own = of(Api::Chat, bytes.as_bytes(), false).unwrap();
        assert_ne!(added.fingerprint, own.fingerprint);
        let plain = json!({"model": "m", "stream": true, "stream_options": {},
            "messages": [{"role": "user", "content": "hi"}]});
        assert_eq!(key(plain).fingerprint, added.fingerprint);
        assert_eq!(json!(1.0).to_string(), "1.0");
        let mut one = base();
        one["temperature"] = json!(1.0);
        let mut int = base();
        int["temperature"] = json!(1);
        assert_eq!(key(one).fingerprint, key(int).fingerprint);
    }
}
