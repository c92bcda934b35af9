//! Whether a streamed answer that breaks can be continued on another endpoint exactly: a
//! property of the request's fields, read once when it is parsed (the continuation itself is
//! `crate::relay`'s).

use super::Api;
use serde_json::{Map, Value};

/// Why a request's stream could not be continued exactly, or `None` when it can: only
/// streams; one choice (`n`, `best_of`); no `logprobs` (the first engine's cannot be
/// re-created); no structured output (a grammar would restart at the continuation); a
/// completion prompt that is text (token ids cannot be extended with text) and no `echo`.
pub(crate) fn unresumable(
    api: Api,
    stream: bool,
    fields: &Map<String, Value>,
) -> Option<&'static str> {
    let set = |name: &str| {
        fields
            .get(name)
            .is_some_and(|v| !v.is_null() && *v != Value::Bool(false))
    };
    let above_one = |name: &str| {
        fields
            .get(name)
            .and_then(Value::as_u64)
            .is_some_and(|n| n > 1)
    };
    if !stream {
        return Some("not_streamed");
    }
    if above_one("n") || above_one("best_of") {
        return Some("n");
    }
    if set("logprobs") || set("top_logprobs") {
        return Some("logprobs");
    }
    let structured = [
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
        "structured_outputs",
    ];
    let format = fields
        .get("response_format")
        .and_then(|f| f.get("type"))
        .and_then(Value::as_str)
        .is_some_and(|t| t != "text");
    if format || structured.iter().any(|k| set(k)) {
        return Some("structured_output");
    }
    if api == Api::Completions {
        if set("echo") {
            return Some("echo");
        }
        let text = match fields.get("prompt") {
            Some(Value::String(_)) => true,
            Some(Value::Array(items)) => items.len() == 1 && items[0].is_string(),
            _ => false,
        };
        if !text {
            return Some("token_prompt");
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(json: &str) -> Map<String, Value> {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn only_requests_a_continuation_can_keep_exact_are_resumable() {
        let chat = |extra: &str| {
            let json = format!(r#"{{"messages":[{{"role":"user","content":"hi"}}]{extra}}}"#);
            unresumable(Api::Chat, true, &fields(&json))
        };
        assert_eq!(chat(""), None);
        assert_eq!(chat(r#","n":1,"logprobs":false,"tools":[]"#), None);
        assert_eq!(chat(r#","response_format":{"type":"text"}"#), None);
        assert_eq!(chat(r#","n":2"#), Some("n"));
        assert_eq!(chat(r#","logprobs":true"#), Some("logprobs"));
        assert_eq!(chat(r#","top_logprobs":3"#), Some("logprobs"));
        assert_eq!(
            chat(r#","response_format":{"type":"json_object"}"#),
            Some("structured_output")
        );
        assert_eq!(chat(r#","guided_regex":"a+""#), Some("structured_output"));
        let body = fields(r#"{"messages":[]}"#);
        assert_eq!(unresumable(Api::Chat, false, &body), Some("not_streamed"));
        let completion = |json: &str| unresumable(Api::Completions, true, &fields(json));
        assert_eq!(completion(r#"{"prompt":"once"}"#), None);
        assert_eq!(completion(r#"{"prompt":["once"]}"#), None);
        assert_eq!(completion(r#"{"prompt":[1,2,3]}"#), Some("token_prompt"));
        assert_eq!(completion(r#"{"prompt":"once","echo":true}"#), Some("echo"));
        assert_eq!(
            completion(r#"{"prompt":"once","logprobs":2}"#),
            Some("logprobs")
        );
        assert_eq!(completion(r#"{"prompt":"once","best_of":3}"#), Some("n"));
    }
}
