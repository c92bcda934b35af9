use super::*;
use axum::http::{HeaderValue, StatusCode};

fn chat(body: &str) -> Result<Inference, ApiError> {
    parse(
        Api::Chat,
        &HeaderMap::new(),
        Bytes::copy_from_slice(body.as_bytes()),
        &RequestConfig::default(),
    )
}

#[test]
fn two_turns_of_one_conversation_share_a_prefix() {
    let first = chat(r#"{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}"#).unwrap();
    let second = chat(r#"{"model":"m","stream":true,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"},{"role":"assistant","content":"hello"},{"role":"user","content":[{"type":"text","text":"more"}]}]}"#).unwrap();
    let a = first.request.prompt.text.unwrap();
    let b = second.request.prompt.text.unwrap();
    assert!(b.starts_with(&a), "{a:?} / {b:?}");
    assert!(second.stream && !first.stream);
    assert_eq!(second.request.model.as_deref(), Some("m"));
}

#[test]
fn tools_come_first_in_the_key() {
    let r = chat(r#"{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}]}"#).unwrap();
    assert!(r.request.prompt.text.unwrap().starts_with("<|tools|>"));
}

#[test]
fn bad_inputs_get_clear_errors() {
    let cases: &[(&[u8], &str, Option<&str>)] = &[
        (b"{not json", "invalid_json", None),
        (b"[1,2]", "invalid_type", None),
        (b"{\"messages\":\"hi\"}", "invalid_type", Some("messages")),
        (b"{}", "missing_required_parameter", Some("messages")),
        (b"{\"messages\":[]}", "invalid_value", Some("messages")),
        (
            b"{\"messages\":[{\"content\":\"x\"}]}",
            "invalid_type",
            Some("messages[0].role"),
        ),
        (
            b"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":\"yes\"}",
            "invalid_type",
            Some("stream"),
        ),
        (
            b"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":100000000000}",
            "invalid_value",
            Some("max_tokens"),
        ),
        (
            b"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":-1}",
            "invalid_value",
            Some("max_tokens"),
        ),
        (
            b"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":\"5\"}",
            "invalid_type",
            Some("max_tokens"),
        ),
        (
            b"{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}",
            "invalid_encoding",
            None,
        ),
    ];
    for (body, code, param) in cases {
        let e = parse(
            Api::Chat,
            &HeaderMap::new(),
            Bytes::copy_from_slice(body),
            &RequestConfig::default(),
        )
        .unwrap_err();
        assert_eq!(
            e.status,
            StatusCode::BAD_REQUEST,
            "{}",
            String::from_utf8_lossy(body)
        );
        assert_eq!(
            (e.code, e.param.as_deref()),
            (*code, *param),
            "{}",
            String::from_utf8_lossy(body)
        );
    }
    let limits = RequestConfig {
        max_body_bytes: 8,
        ..RequestConfig::default()
    };
    let e = parse(
        Api::Chat,
        &HeaderMap::new(),
        Bytes::from_static(b"{\"messages\":[]}"),
        &limits,
    )
    .unwrap_err();
    assert_eq!(e.status, StatusCode::PAYLOAD_TOO_LARGE);
}

#[test]
fn completions_accept_strings_and_token_arrays() {
    let parse_c = |b: &'static str| {
        parse(
            Api::Completions,
            &HeaderMap::new(),
            Bytes::from_static(b.as_bytes()),
            &RequestConfig::default(),
        )
    };
    assert_eq!(
        parse_c(r#"{"prompt":"abc"}"#)
            .unwrap()
            .request
            .prompt
            .text
            .as_deref(),
        Some("abc")
    );
    assert_eq!(
        parse_c(r#"{"prompt":[1,2]}"#)
            .unwrap()
            .request
            .prompt
            .text
            .as_deref(),
        Some("<1><2>")
    );
    assert_eq!(
        parse_c(r#"{"prompt":{"a":1}}"#)
            .unwrap_err()
            .param
            .as_deref(),
        Some("prompt")
    );
    assert_eq!(
        parse_c(r#"{}"#).unwrap_err().code,
        "missing_required_parameter"
    );
}

#[test]
fn tenant_from_header_or_hashed_key_and_deadline() {
    let mut h = HeaderMap::new();
    h.insert(
        "authorization",
        HeaderValue::from_static("Bearer sk-secret"),
    );
    h.insert("x-kvgate-session", HeaderValue::from_static("s1"));
    h.insert("x-kvgate-deadline-ms", HeaderValue::from_static("250"));
    let body = Bytes::from_static(br#"{"messages":[{"role":"user","content":"x"}]}"#);
    let r = parse(Api::Chat, &h, body.clone(), &RequestConfig::default()).unwrap();
    let tenant = r.request.tenant.unwrap();
    assert!(tenant.starts_with("key:") && !tenant.contains("secret"));
    assert_eq!(r.request.session.as_deref(), Some("s1"));
    assert_eq!(r.deadline, Some(Duration::from_millis(250)));
    h.insert("x-kvgate-tenant", HeaderValue::from_static("acme"));
    h.insert("x-kvgate-deadline-ms", HeaderValue::from_static("soon"));
    assert_eq!(
        parse(Api::Chat, &h, body.clone(), &RequestConfig::default())
            .unwrap_err()
            .code,
        "invalid_header"
    );
    h.remove("x-kvgate-deadline-ms");
    assert_eq!(
        parse(Api::Chat, &h, body, &RequestConfig::default())
            .unwrap()
            .request
            .tenant
            .as_deref(),
        Some("acme")
    );
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    fn message() -> impl Strategy<Value = serde_json::Value> {
        (
            prop::sample::select(vec!["system", "user", "assistant", "tool"]),
            ".{0,40}",
        )
            .prop_map(|(role, content)| serde_json::json!({"role": role, "content": content}))
    }

    proptest! {
        /// Appending turns to a conversation only ever extends its prefix key, so the policy can
        /// find every earlier turn's prefix.
        #[test]
        fn later_turns_extend_the_prefix_key(history in prop::collection::vec(message(), 1..8), more in prop::collection::vec(message(), 1..3)) {
            let body = |m: &[serde_json::Value]| Bytes::from(serde_json::json!({"messages": m}).to_string());
            let cfg = RequestConfig::default();
            let mut all = history.clone();
            all.extend(more);
            let a = parse(Api::Chat, &HeaderMap::new(), body(&history), &cfg).unwrap().request.prompt.text.unwrap();
            let b = parse(Api::Chat, &HeaderMap::new(), body(&all), &cfg).unwrap().request.prompt.text.unwrap();
            prop_assert!(b.starts_with(&a));
        }

        /// Any byte string is either accepted or refused with a 4xx; parsing never panics.
        #[test]
        fn arbitrary_bodies_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            match parse(Api::Chat, &HeaderMap::new(), Bytes::from(bytes), &RequestConfig::default()) {
                Ok(_) => {}
                Err(e) => prop_assert!(e.status.is_client_error()),
            }
        }
    }
}

#[test]
fn the_session_comes_from_the_usual_headers_then_the_body_user() {
    let body = Bytes::from_static(br#"{"user":"u7","messages":[{"role":"user","content":"x"}]}"#);
    let limits = RequestConfig::default();
    let session = |h: &HeaderMap| {
        parse(Api::Chat, h, body.clone(), &limits)
            .unwrap()
            .request
            .session
    };
    let mut h = HeaderMap::new();
    assert_eq!(session(&h).as_deref(), Some("u7"));
    h.insert("session_id", HeaderValue::from_static("s-under"));
    assert_eq!(session(&h).as_deref(), Some("s-under"));
    h.insert("x-session-id", HeaderValue::from_static("s-dash"));
    assert_eq!(session(&h).as_deref(), Some("s-dash"));
    h.insert("x-kvgate-session", HeaderValue::from_static("s-own"));
    assert_eq!(session(&h).as_deref(), Some("s-own"));
}

#[test]
fn a_stream_without_usage_asks_for_it_and_is_marked_for_stripping() {
    let r = chat(r#"{"stream":true,"messages":[{"role":"user","content":"x"}]}"#).unwrap();
    assert!(r.strip_usage);
    let sent: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(sent["stream_options"]["include_usage"], true);
    assert_eq!(sent["messages"][0]["content"], "x");
    let asked = r#"{"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"x"}]}"#;
    let r = chat(asked).unwrap();
    assert!(!r.strip_usage);
    assert_eq!(&r.body[..], asked.as_bytes(), "forwarded byte for byte");
    let plain = chat(r#"{"messages":[{"role":"user","content":"x"}]}"#).unwrap();
    assert!(
        !plain.strip_usage,
        "a non-streaming answer carries its usage anyway"
    );
    assert_eq!(
        chat(r#"{"stream":true,"stream_options":3,"messages":[{"role":"user","content":"x"}]}"#)
            .unwrap_err()
            .code,
        "invalid_type"
    );
}

#[test]
fn reasoning_effort_and_thinking_budget_are_read_and_bad_types_refused() {
    let r =
        chat(r#"{"messages":[{"role":"user","content":"x"}],"reasoning_effort":"high"}"#).unwrap();
    assert_eq!(r.request.reasoning_effort, Some(ReasoningEffort::High));
    let r = chat(r#"{"messages":[{"role":"user","content":"x"}],"reasoning":{"effort":"low"},"thinking":{"type":"enabled","budget_tokens":2048}}"#).unwrap();
    assert_eq!(r.request.reasoning_effort, Some(ReasoningEffort::Low));
    assert_eq!(r.request.thinking_budget, Some(2048));
    // A name kvgate does not know is the engine's business.
    let r = chat(r#"{"messages":[{"role":"user","content":"x"}],"reasoning_effort":"extreme"}"#)
        .unwrap();
    assert_eq!(r.request.reasoning_effort, None);
    for bad in [
        r#"{"messages":[{"role":"user","content":"x"}],"reasoning_effort":3}"#,
        r#"{"messages":[{"role":"user","content":"x"}],"thinking":{"budget_tokens":-1}}"#,
    ] {
        assert_eq!(
            chat(bad).unwrap_err().status,
            StatusCode::BAD_REQUEST,
            "{bad}"
        );
    }
}

#[test]
fn the_shared_head_is_the_prompt_without_its_last_message() {
    let call = |task: &str| {
        chat(&format!(r#"{{"messages":[{{"role":"system","content":"shared context"}},{{"role":"user","content":"{task}"}}]}}"#))
            .unwrap()
            .shared_head
            .unwrap()
    };
    assert_eq!(
        call("task one"),
        call("task two"),
        "siblings share the head"
    );
    let single = chat(r#"{"messages":[{"role":"user","content":"x"}]}"#).unwrap();
    assert_eq!(single.shared_head, None, "one message shares nothing");
}

/// A named session's turns are tokenized through the tokenizer's memo, per model, tenant and
/// session, with the ids the full path gives.
#[test]
fn a_sessions_turns_are_tokenized_incrementally_and_exactly() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../test-data/tokenizer");
    let tok = ChatTokenizer::load(&dir).unwrap();
    let turn = |n: usize, session: Option<&str>, tenant: &str| {
        let mut messages = vec![serde_json::json!({"role": "system", "content": "be brief"})];
        for i in 0..n {
            messages.push(serde_json::json!({"role": "user", "content": format!("question {i}")}));
            messages
                .push(serde_json::json!({"role": "assistant", "content": format!("answer {i}")}));
        }
        let body = serde_json::json!({"model": "m", "messages": messages});
        let mut headers = HeaderMap::new();
        headers.insert("x-kvgate-tenant", HeaderValue::from_str(tenant).unwrap());
        if let Some(s) = session {
            headers.insert("x-kvgate-session", HeaderValue::from_str(s).unwrap());
        }
        let bytes = Bytes::from(serde_json::to_vec(&body).unwrap());
        let parsed = parse_with(
            Api::Chat,
            &headers,
            bytes,
            &RequestConfig::default(),
            |_| Some(&tok),
        )
        .unwrap();
        parsed.request.prompt.tokens.unwrap()
    };
    for n in 1..4 {
        assert_eq!(turn(n, Some("s1"), "a"), turn(n, None, "a"), "turn {n}");
    }
    assert_eq!(tok.memo().sessions(), 1);
    turn(1, Some("s1"), "b");
    assert_eq!(
        tok.memo().sessions(),
        2,
        "another tenant's session of the same name"
    );
}
