//! Tokenizing and block-hashing an 8k-token chat prompt: the work the gateway adds per request
//! when a tokenizer is configured (target: under 1 ms median).
//! Run: `cargo bench -p kvgate-tokenize --bench tokenize`.
#![allow(missing_docs)] // criterion's macros generate undocumented functions

use criterion::{criterion_group, criterion_main, Criterion};
use kvgate_core::index::blocks::{block_hashes, ENGINE_SCOPE};
use kvgate_tokenize::ChatTokenizer;
use serde_json::{json, Map, Value};
use std::hint::black_box;
use std::path::PathBuf;

const WORDS: [&str; 16] = [
    "the", "router", "sends", "each", "request", "to", "a", "replica", "whose", "cache", "holds",
    "its", "prefix", "and", "balances", "load",
];

/// Words of a conversation: from [`WORDS`], or (`random`) letter strings of 2-10 letters, nearly
/// every one new (the worst case for a word cache).
fn words(state: &mut u64, random: bool) -> String {
    let mut next = || {
        *state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *state >> 33
    };
    let mut text = String::new();
    for _ in 0..200 {
        if random {
            for _ in 0..2 + next() % 9 {
                text.push(char::from(b'a' + (next() % 26) as u8));
            }
        } else {
            text.push_str(WORDS[(next() >> 27) as usize % WORDS.len()]);
        }
        text.push(' ');
    }
    text
}

fn conversation(target_tokens: usize, tok: &ChatTokenizer, random: bool) -> Map<String, Value> {
    let mut messages = vec![json!({"role": "system", "content": "You are a helpful assistant."})];
    let mut state = 7u64;
    let mut body = Map::new();
    loop {
        let role = if messages.len() % 2 == 1 {
            "user"
        } else {
            "assistant"
        };
        messages.push(json!({"role": role, "content": words(&mut state, random)}));
        body.insert("messages".into(), Value::Array(messages.clone()));
        if tok.chat_prompt(&body).unwrap().len() >= target_tokens {
            return body;
        }
    }
}

/// Renders, encodes (no stretch remembered) and block-hashes `body`; `forget`: the word cache is
/// emptied before each iteration too.
fn never_seen(
    c: &mut Criterion,
    name: &str,
    tok: &ChatTokenizer,
    body: &Map<String, Value>,
    forget: bool,
) {
    let tokens = tok.chat_prompt(body).unwrap().len();
    c.bench_function(&format!("{name}_and_block_hashes/{tokens}_tokens"), |b| {
        b.iter(|| {
            if forget {
                tok.forget();
            }
            let text = tok.render_chat(black_box(body)).unwrap();
            let ids = tok.encode_whole(&text, false).unwrap();
            black_box(block_hashes(&ids, 16, ENGINE_SCOPE))
        })
    });
}

fn bench(c: &mut Criterion) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../test-data/tokenizer");
    let tok = ChatTokenizer::load(&dir).unwrap();
    let body = conversation(8192, &tok, false);
    let tokens = tok.chat_prompt(&body).unwrap().len();
    // A prompt never seen: the whole text through the tokenizer, its words known from earlier
    // prompts (as in a running gateway).
    never_seen(c, "cold_chat_prompt", &tok, &body, false);
    // The first prompt after start: nothing remembered, not even words.
    never_seen(c, "first_chat_prompt", &tok, &body, true);
    // The worst case for the word cache: every word new, nothing remembered.
    let random = conversation(8192, &tok, true);
    never_seen(c, "first_random_words_chat_prompt", &tok, &random, true);
    // The next turn of a conversation: the same history and a new user message (~150 tokens,
    // different every iteration), as a multi-turn chat or an agent loop sends them.
    let mut turn = 0u64;
    let mut next = body.clone();
    c.bench_function(
        &format!("next_turn_chat_prompt_and_block_hashes/{tokens}_tokens"),
        |b| {
            b.iter(|| {
                turn += 1;
                let Some(Value::Array(messages)) = next.get_mut("messages") else {
                    unreachable!()
                };
                if messages.len() > 1 + body["messages"].as_array().unwrap().len() {
                    messages.pop();
                }
                let words: Vec<&str> = (0..120)
                    .map(|i| WORDS[((turn * 31 + i * 7) % 16) as usize])
                    .collect();
                messages.push(
                    json!({"role": "user", "content": format!("turn {turn}: {}", words.join(" "))}),
                );
                let ids = tok.chat_prompt(black_box(&next)).unwrap();
                black_box(block_hashes(&ids, 16, ENGINE_SCOPE))
            })
        },
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
