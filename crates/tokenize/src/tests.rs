//! Exactness against Hugging Face: `test-data/tokenizer/expected.json` holds what transformers'
//! `apply_chat_template` and the fast tokenizer produced for each case
//! (`scripts/make-test-tokenizer.py`).

use super::*;
use std::path::PathBuf;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../test-data/tokenizer")
}

fn expected() -> Value {
    let bytes = std::fs::read(dir().join("expected.json")).expect("expected.json");
    serde_json::from_slice(&bytes).unwrap()
}

#[test]
fn chat_prompts_render_and_encode_as_transformers_does() {
    let tok = ChatTokenizer::load(&dir()).unwrap();
    let expected = expected();
    let cases = expected["cases"].as_array().expect("chat cases");
    assert!(cases.len() >= 20, "{} cases", cases.len());
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let mut body = Map::new();
        body.insert("messages".into(), case["messages"].clone());
        body.insert("tools".into(), case["tools"].clone());
        body.insert(
            "add_generation_prompt".into(),
            case["add_generation_prompt"].clone(),
        );
        let text = tok
            .render_chat(&body)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            text,
            case["text"].as_str().unwrap(),
            "{name}: rendered text"
        );
        let ids: Vec<u32> = serde_json::from_value(case["ids"].clone()).unwrap();
        assert_eq!(tok.chat_prompt(&body).unwrap(), ids, "{name}: ids");
    }
}

#[test]
fn completion_prompts_encode_with_and_without_special_tokens() {
    let tok = ChatTokenizer::load(&dir()).unwrap();
    let expected = expected();
    for case in expected["completions"].as_array().unwrap() {
        let mut body = Map::new();
        body.insert("prompt".into(), case["prompt"].clone());
        let ids: Vec<u32> = serde_json::from_value(case["ids"].clone()).unwrap();
        assert_eq!(tok.completion_prompt(&body).unwrap(), ids);
        body.insert("add_special_tokens".into(), Value::Bool(false));
        let ids: Vec<u32> = serde_json::from_value(case["ids_no_special"].clone()).unwrap();
        assert_eq!(tok.completion_prompt(&body).unwrap(), ids);
    }
}

#[test]
fn a_growing_conversation_keeps_its_token_prefix() {
    let tok = ChatTokenizer::load(&dir()).unwrap();
    let turn = |n: usize| {
        let mut messages =
            vec![serde_json::json!({"role": "system", "content": "You route requests."})];
        for i in 0..n {
            messages.push(serde_json::json!({"role": "user", "content": format!("question {i} about the cache")}));
            messages
                .push(serde_json::json!({"role": "assistant", "content": format!("answer {i}")}));
        }
        messages.push(serde_json::json!({"role": "user", "content": "and now?"}));
        let mut body = Map::new();
        body.insert("messages".into(), Value::Array(messages));
        tok.chat_prompt(&body).unwrap()
    };
    let (short, long) = (turn(1), turn(3));
    // Everything up to the last user turn of the shorter conversation is shared.
    let shared = short.iter().zip(&long).take_while(|(a, b)| a == b).count();
    assert!(
        shared + 12 >= short.len(),
        "shared {shared} of {}",
        short.len()
    );
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let tok = ChatTokenizer::load(&dir()).unwrap();
    let mut body = Map::new();
    assert!(tok.render_chat(&body).is_err());
    body.insert(
        "messages".into(),
        serde_json::json!([{"role": "nobody", "content": "x"}]),
    );
    assert!(matches!(
        tok.render_chat(&body),
        Err(TokenizeError::Template(_))
    ));
    body.insert("messages".into(), serde_json::json!(["not an object"]));
    assert!(tok.render_chat(&body).is_err());
    body.insert("prompt".into(), serde_json::json!([1, -2]));
    assert!(tok.completion_prompt(&body).is_err());
    let missing = ChatTokenizer::load(std::path::Path::new("no/such/dir"));
    assert!(matches!(missing, Err(TokenizeError::Load { .. })));
}

#[test]
fn piece_encoding_equals_whole_encoding() {
    let tok = ChatTokenizer::load(&dir()).unwrap();
    let pieces = tok
        .pieces
        .as_ref()
        .expect("the test tokenizer cuts position-independently");
    let words = [
        "the",
        " cache",
        "<|im_start|>",
        "<|im_end|>",
        "\n",
        "  ",
        "é",
        "東京",
        "<s>",
        "user",
        "<|im",
        "_end|>",
        ".",
        "0",
    ];
    let mut state = 1u64;
    for case in 0..300 {
        let mut text = String::new();
        let len = 1 + case % 120;
        for _ in 0..len {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            text.push_str(words[(state >> 59) as usize % words.len()]);
            if state % 7 == 0 {
                // A long stretch, so the cache path is taken too.
                text.push_str(&" the cache router".repeat(20));
            }
        }
        let whole = tok.encode_reference(&text, false).unwrap();
        assert_eq!(tok.encode_whole(&text, false).unwrap(), whole, "{text:?}");
        assert_eq!(tok.encode(&text, false).unwrap(), whole, "{text:?}");
        // Twice: the second time from the cache.
        assert_eq!(
            tok.encode(&text, false).unwrap(),
            whole,
            "{text:?} (cached)"
        );
    }
    assert!(pieces.remembered() > 0);
}

/// Words of generated conversations: added tokens and fragments of them (a message may hold the
/// text of a special token), Unicode, and a long stretch (so the stretch cache is used too).
const WORDS: [&str; 14] = [
    "the",
    " cache",
    "<|im_start|>",
    "<|im_end|>",
    "\n",
    "  ",
    "é",
    "東京",
    "<s>",
    "<|im",
    "_end|>",
    ".",
    "0",
    " the cache router the cache router the cache router the cache router the cache router \
     the cache router the cache router the cache router the cache router the cache router \
     the cache router the cache router the cache router the cache router the cache router",
];

fn message(role: u8, words: &[u8]) -> Value {
    let content: String = words
        .iter()
        .map(|&w| WORDS[w as usize % WORDS.len()])
        .collect();
    match role % 4 {
        0 => serde_json::json!({"role": "user", "content": content}),
        1 if words.len() % 3 == 0 => serde_json::json!({"role": "assistant", "content": content,
            "tool_calls": [{"id": "c", "type": "function",
                "function": {"name": "read", "arguments": format!("{{\"p\": {content:?}}}")}}]}),
        1 => serde_json::json!({"role": "assistant", "content": content}),
        2 => serde_json::json!({"role": "tool", "tool_call_id": "c", "content": content}),
        _ => serde_json::json!({"role": "system", "content": content}),
    }
}

fn chat(messages: &[Value], generation_prompt: bool) -> Map<String, Value> {
    let mut body = Map::new();
    body.insert("messages".into(), Value::Array(messages.to_vec()));
    body.insert(
        "add_generation_prompt".into(),
        Value::Bool(generation_prompt),
    );
    body
}

/// The memo's ids are the tokenizers crate's on the whole rendered text, and the stretch path's.
fn assert_exact(tok: &ChatTokenizer, body: &Map<String, Value>, session: u64) -> usize {
    let (ids, reused) = tok.chat_prompt_in(body, session).unwrap();
    let text = tok.render_chat(body).unwrap();
    assert_eq!(ids, tok.encode_reference(&text, false).unwrap(), "{text:?}");
    assert_eq!(ids, tok.chat_prompt(body).unwrap(), "{text:?}");
    if let Some(kept) = tok.memo().get(session) {
        assert_eq!(
            *kept.text, text,
            "rendered with the previous turn's messages"
        );
    }
    reused
}

type Edit = (u8, u16, u8, Vec<u8>);

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// Conversations that grow, change an earlier message, shrink, or end with or without the
    /// generation prompt, turn after turn in one session: every turn's ids equal a full
    /// encoding.
    #[test]
    fn the_memo_encodes_every_turn_as_the_full_path(
        start in proptest::collection::vec((0u8..4, proptest::collection::vec(0u8..14, 0..12)), 1..8),
        edits in proptest::collection::vec(
            (0u8..4, 0u16..64, 0u8..4, proptest::collection::vec(0u8..14, 0..12)), 1..8),
    ) {
        let tok = ChatTokenizer::load(&dir()).unwrap();
        let mut messages: Vec<Value> = start.iter().map(|(r, w)| message(*r, w)).collect();
        assert_exact(&tok, &chat(&messages, true), 9);
        for (kind, at, role, words) in &edits as &[Edit] {
            let at = usize::from(*at) % messages.len();
            match kind {
                0 | 1 => messages.push(message(*role, words)),
                2 => messages[at] = message(*role, words),
                _ => messages.truncate(at + 1),
            }
            assert_exact(&tok, &chat(&messages, at % 2 == 0), 9);
        }
    }
}

#[test]
fn the_memo_reuses_a_sessions_prefix_and_falls_back_when_it_changed() {
    let tok = ChatTokenizer::load(&dir()).unwrap();
    let long = |i: usize| message(0, &[13, 0, (i % 13) as u8, 13]);
    let mut messages: Vec<Value> = (0..6).map(long).collect();
    assert_eq!(
        assert_exact(&tok, &chat(&messages, true), 1),
        0,
        "nothing yet"
    );
    let before = tok.chat_prompt(&chat(&messages, true)).unwrap().len();
    messages.push(message(1, &[0, 1]));
    messages.push(long(7));
    let reused = assert_exact(&tok, &chat(&messages, true), 1);
    // Everything up to the generation prompt's `<|im_start|>` was the previous turn's.
    assert!(
        reused + 8 >= before && reused < before,
        "{reused} of {before}"
    );
    // Another session starts from nothing and leaves the first one's entry alone.
    assert_eq!(assert_exact(&tok, &chat(&messages[..2], true), 2), 0);
    assert_eq!(tok.memo().sessions(), 2);
    // An earlier message changed: only what precedes it is reused, and the ids stay exact.
    messages[1] = message(0, &[2, 3, 9, 10]);
    let reused = assert_exact(&tok, &chat(&messages, true), 1);
    let first = tok.chat_prompt(&chat(&messages[..1], false)).unwrap().len();
    assert!(
        reused <= first + 1,
        "{reused} reused, the first message is {first}"
    );
    // The first message changed: only the default system prompt before it is reused.
    messages[0] = message(0, &[4, 4]);
    assert!(assert_exact(&tok, &chat(&messages, true), 1) < first);
    // Tool-call arguments given as an object reach `tojson` in the client's key order: the same
    // object in another order is another message.
    let call = |args: Value| {
        serde_json::json!({"role": "assistant", "content": "",
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": args}}]})
    };
    messages.push(call(serde_json::json!({"a": 1, "b": 2})));
    assert_exact(&tok, &chat(&messages, true), 1);
    *messages.last_mut().unwrap() = call(serde_json::json!({"b": 2, "a": 1}));
    assert_exact(&tok, &chat(&messages, true), 1);
    // A request that adds special tokens takes the full path.
    let mut body = chat(&messages, true);
    body.insert("add_special_tokens".into(), Value::Bool(true));
    assert_eq!(
        tok.chat_prompt_in(&body, 1).unwrap().0,
        tok.chat_prompt(&body).unwrap()
    );
    assert_eq!(tok.chat_prompt_in(&body, 1).unwrap().1, 0);
}

#[test]
fn a_memo_without_room_keeps_nothing_and_stays_exact() {
    let tok = ChatTokenizer::load(&dir()).unwrap().with_memo_budget(0);
    let messages: Vec<Value> = (0..4).map(|i| message(0, &[13, i])).collect();
    for _ in 0..2 {
        assert_eq!(assert_exact(&tok, &chat(&messages, true), 1), 0);
    }
    assert_eq!((tok.memo().sessions(), tok.memo().bytes()), (0, 0));
}
