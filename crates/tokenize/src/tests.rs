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
