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

fn conversation(target_tokens: usize, tok: &ChatTokenizer) -> Map<String, Value> {
    let mut messages = vec![json!({"role": "system", "content": "You are a helpful assistant."})];
    let mut state = 7u64;
    let mut body = Map::new();
    loop {
        let mut text = String::new();
        for _ in 0..200 {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            text.push_str(WORDS[(state >> 60) as usize]);
            text.push(' ');
        }
        let role = if messages.len() % 2 == 1 {
            "user"
        } else {
            "assistant"
        };
        messages.push(json!({"role": role, "content": text}));
        body.insert("messages".into(), Value::Array(messages.clone()));
        if tok.chat_prompt(&body).unwrap().len() >= target_tokens {
            return body;
        }
    }
}

fn bench(c: &mut Criterion) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../test-data/tokenizer");
    let tok = ChatTokenizer::load(&dir).unwrap();
    let body = conversation(8192, &tok);
    let tokens = tok.chat_prompt(&body).unwrap().len();
    c.bench_function(
        &format!("chat_prompt_and_block_hashes/{tokens}_tokens"),
        |b| {
            b.iter(|| {
                let ids = tok.chat_prompt(black_box(&body)).unwrap();
                black_box(block_hashes(&ids, 16, ENGINE_SCOPE))
            })
        },
    );
    c.bench_function("render_only", |b| {
        b.iter(|| black_box(tok.render_chat(black_box(&body)).unwrap()))
    });
    let text = tok.render_chat(&body).unwrap();
    c.bench_function("encode_only", |b| {
        b.iter(|| black_box(tok.encode(black_box(&text), false).unwrap()))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
