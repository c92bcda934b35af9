//! The gateway's per-request cost on long agentic contexts: the next turn of one
//! conversation of 128K and 480K tokens (the test tokenizer's), re-sent whole as agentic coding
//! clients do. Measured apart: JSON parse and the text key, rendering and tokenizing (the full
//! path and the per-session memo), block hashing, and the index work of a pick for
//! `predicted_ttft` and `cache_aware` keyed by tokens and by text; then the whole next turn.
//! Index memory per session is printed.
//! Run: `cargo bench -p kvgate-gateway --bench long_context`.
//!
//! The test tokenizer's 2,048-token vocabulary makes more tokens per byte than a model's
//! 128K-vocabulary one: 1.9 bytes per token on this code-like text, where about 4 is the usual
//! figure for large vocabularies. A 480K-token conversation here is therefore fewer bytes than a
//! production model's: the bench prints bytes, and `1.9mb/*` runs a conversation of 480K tokens
//! at 4 bytes each (which the test tokenizer makes about 980K tokens).
#![allow(missing_docs)] // criterion's macros generate undocumented functions

use axum::http::HeaderMap;
use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use kvgate_core::index::blocks::{block_hashes, text_block_hashes};
use kvgate_core::policy::PolicyConfig;
use kvgate_core::router::accept_all;
use kvgate_core::{EndpointId, EndpointView, Nanos, Observation, Request, Routing};
use kvgate_gateway::parse::{parse, parse_with, Api, RequestConfig};
use kvgate_tokenize::ChatTokenizer;
use serde_json::{json, Map, Value};
use std::hint::black_box;
use std::path::PathBuf;
use std::time::Duration;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    fn pick<'a>(&mut self, of: &[&'a str]) -> &'a str {
        of[self.next() as usize % of.len()]
    }
}

const IDENTS: [&str; 24] = [
    "request", "endpoint", "cache", "prefix", "tokens", "index", "router", "policy", "session",
    "overlap", "block", "hash", "config", "state", "metrics", "queue", "tenant", "stream",
    "latency", "budget", "decision", "engine", "prompt", "usage",
];

/// About `bytes` of Rust-like source: what a coding agent's tool results are made of.
fn code(rng: &mut Rng, bytes: usize) -> String {
    let mut s = String::with_capacity(bytes + 80);
    while s.len() < bytes {
        let (a, b, c) = (rng.pick(&IDENTS), rng.pick(&IDENTS), rng.pick(&IDENTS));
        let n = rng.next() % 1000;
        match rng.next() % 4 {
            0 => s.push_str(&format!("    let {a}_{n} = {b}.{c}({n});\n")),
            1 => s.push_str(&format!("fn {a}_{b}(&self, {c}: u32) -> Option<{b}> {{\n")),
            2 => s.push_str(&format!(
                "    // The {a} of each {b} bounds the {c} ({n}).\n"
            )),
            _ => s.push_str(&format!(
                "    if {a}.{b}.len() > {n} {{ return {c}; }}\n}}\n"
            )),
        }
    }
    s
}

fn tools() -> Value {
    let tool = |name: &str, what: &str| {
        json!({"type": "function", "function": {"name": name, "description": what,
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
            "required": ["path"]}}})
    };
    json!([
        tool("read_file", "Read a file of the repository."),
        tool("write_file", "Replace a file of the repository."),
        tool("run", "Run a shell command in the repository."),
        tool("search", "Search the repository for a pattern."),
    ])
}

/// One agent step: a tool call and its result of `bytes`, seeded by `step`.
fn step(step: u64, bytes: usize) -> [Value; 2] {
    let mut rng = Rng(step.wrapping_mul(0x9e37_79b9) | 1);
    let id = format!("call_{step}");
    let args = format!("{{\"path\": \"src/{}_{step}.rs\"}}", rng.pick(&IDENTS));
    [
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function",
            "function": {"name": "read_file", "arguments": args}}]}),
        json!({"role": "tool", "tool_call_id": id, "content": code(&mut rng, bytes)}),
    ]
}

fn body(messages: &[Value], extra: &[Value]) -> Bytes {
    let all: Vec<&Value> = messages.iter().chain(extra).collect();
    let body = json!({"model": "m", "user": "agent-1", "tools": tools(), "messages": all});
    Bytes::from(serde_json::to_vec(&body).unwrap())
}

/// A coding agent's conversation of at least `target` tokens: a system prompt, then tasks of a
/// few tool calls each with results of 0.5-12 KB.
fn conversation(tok: &ChatTokenizer, target: usize) -> Vec<Value> {
    let mut rng = Rng(7);
    let system = code(&mut rng, 8000);
    let mut messages = vec![json!({"role": "system", "content": system})];
    let mut n = 1_000_000u64;
    loop {
        messages.push(
            json!({"role": "user", "content": format!("Task {n}: fix the {} in {}.",
            rng.pick(&IDENTS), rng.pick(&IDENTS))}),
        );
        for _ in 0..1 + rng.next() % 4 {
            n += 1;
            messages.extend(step(n, 500 + rng.next() as usize % 12_000));
        }
        messages.push(json!({"role": "assistant", "content": code(&mut rng, 300)}));
        let fields = serde_json::from_slice(&body(&messages, &[])).unwrap();
        if tok.chat_prompt(&fields).unwrap().len() >= target {
            return messages;
        }
    }
}

fn headers() -> HeaderMap {
    HeaderMap::new()
}

/// The next turn's body: the conversation and a new step of 2-8 KB (different every call).
struct Turns {
    messages: Vec<Value>,
    turn: u64,
}

impl Turns {
    fn next(&mut self) -> Bytes {
        self.turn += 1;
        let bytes = 2000 + (self.turn as usize * 7919) % 6000;
        body(&self.messages, &step(self.turn, bytes))
    }
}

fn fleet() -> Vec<EndpointView> {
    (0..8)
        .map(|i| {
            EndpointView::new(EndpointId(i)).observed(
                Observation {
                    running: 2,
                    waiting: 0,
                    kv_usage: 0.3,
                    free_blocks: Some(700_000),
                    total_blocks: Some(1_000_000),
                    block_size: Some(16),
                },
                Nanos::ZERO,
            )
        })
        .collect()
}

/// A routing of `policy` over eight endpoints, as the gateway keeps it (engine-event layer on,
/// inert without streams).
fn routing(policy: &str) -> Routing {
    let mut r = Routing::new(&PolicyConfig::default_for(policy).unwrap(), 1).with_engine_events(1);
    for e in fleet() {
        let (id, observation) = (e.id, e.observation.unwrap());
        r.router_mut().add(e);
        r.observed(id, observation, Nanos::ZERO);
    }
    r
}

/// One pick's index work, as the gateway's pool does it: the lookup, the policy, the dispatch
/// recorded in the cache, then the first token (an index mirroring engines inserts the prompt
/// then) and the end.
fn pick(routing: &mut Routing, request: &Request, now: Nanos) {
    let d = routing.route(request, now, &accept_all);
    let e = d.endpoint().unwrap();
    routing.first_token(request.id, e, now, Nanos(1));
    routing.completed(request.id, e, now, Nanos(2), 1);
}

/// The parts and the whole of one conversation's next turn.
fn bench_size(c: &mut Criterion, tok: &ChatTokenizer, label: &str, mut turns: Turns) {
    let limits = RequestConfig::default();
    let sample = turns.next();
    let parsed = parse_with(Api::Chat, &headers(), sample.clone(), &limits, |_| {
        Some(tok)
    })
    .unwrap();
    let (text, tokens) = (
        parsed.request.prompt.text.clone().unwrap(),
        parsed.request.prompt.tokens.clone().unwrap(),
    );
    let parsed_fields: Map<String, Value> = serde_json::from_slice(&sample).unwrap();
    let rendered = tok.render_chat(&parsed_fields).unwrap();
    eprintln!(
        "{label}: {} messages, body {} bytes, text key {} bytes, rendered {} bytes, {} tokens ({:.2} bytes/token)",
        turns.messages.len() + 2,
        sample.len(),
        text.len(),
        rendered.len(),
        tokens.len(),
        rendered.len() as f64 / tokens.len() as f64,
    );
    let batched = |c: &mut Criterion, name: &str, f: &mut dyn FnMut(Bytes)| {
        let mut t = Turns {
            messages: turns.messages.clone(),
            turn: 1000,
        };
        c.bench_function(&format!("{label}/{name}"), |b| {
            b.iter_batched(|| t.next(), &mut *f, BatchSize::PerIteration)
        });
    };
    batched(c, "parse_json_and_text_key", &mut |body| {
        black_box(parse(Api::Chat, &headers(), body, &limits).unwrap());
    });
    let fields = |c: &mut Criterion, name: &str, f: &mut dyn FnMut(Map<String, Value>)| {
        let mut t = Turns {
            messages: turns.messages.clone(),
            turn: 1000,
        };
        c.bench_function(&format!("{label}/{name}"), |b| {
            b.iter_batched(
                || serde_json::from_slice(&t.next()).unwrap(),
                &mut *f,
                BatchSize::PerIteration,
            )
        });
    };
    fields(c, "render", &mut |f| {
        black_box(tok.render_chat(&f).unwrap());
    });
    fields(c, "render_and_encode_full", &mut |f| {
        black_box(tok.chat_prompt(&f).unwrap());
    });
    tok.memo().forget();
    fields(c, "render_and_encode_memo", &mut |f| {
        black_box(tok.chat_prompt_in(&f, 1).unwrap());
    });
    eprintln!(
        "{label}: the memo holds {} bytes for {} session(s)",
        tok.memo().bytes(),
        tok.memo().sessions()
    );
    c.bench_function(&format!("{label}/block_hashes_tokens"), |b| {
        b.iter(|| black_box(block_hashes(&tokens, 16, 7)))
    });
    c.bench_function(&format!("{label}/block_hashes_text"), |b| {
        b.iter(|| black_box(text_block_hashes(text.as_bytes(), 16, 7)))
    });
}

/// The index work of a pick for each policy, keyed by tokens and by text, and the index memory
/// the session takes.
fn bench_index(c: &mut Criterion, tok: &ChatTokenizer, label: &str, turns: &Turns) {
    let limits = RequestConfig::default();
    for policy in ["predicted_ttft", "cache_aware"] {
        for keyed in ["tokens", "text"] {
            let mut routing = routing(policy);
            let mut t = Turns {
                messages: turns.messages.clone(),
                turn: 2000,
            };
            let mut id = 0u64;
            let mut request = |body: Bytes| {
                id += 1;
                let mut r = parse_with(Api::Chat, &headers(), body, &limits, |_| {
                    (keyed == "tokens").then_some(tok)
                })
                .unwrap()
                .request;
                r.id = id;
                r
            };
            let before = heap(&routing);
            // The conversation so far, as its earlier turns left it.
            pick(&mut routing, &request(body(&turns.messages, &[])), Nanos(1));
            eprintln!(
                "{label}: {policy} keyed by {keyed}: the session holds {} bytes of index",
                heap(&routing) - before
            );
            c.bench_function(&format!("{label}/index_{policy}_{keyed}"), |b| {
                b.iter_batched(
                    || request(t.next()),
                    |r| pick(&mut routing, &r, Nanos(r.id)),
                    BatchSize::PerIteration,
                )
            });
        }
    }
}

/// The whole next turn as the gateway does it: parse, render and tokenize (with the memo, or the
/// full path: no session named), then a `predicted_ttft` pick keyed by tokens.
fn bench_next_turn(c: &mut Criterion, tok: &ChatTokenizer, label: &str, turns: &Turns) {
    for memo in [false, true] {
        let limits = RequestConfig {
            session_body_fields: if memo {
                vec!["user".into()]
            } else {
                Vec::new()
            },
            ..RequestConfig::default()
        };
        let mut routing = routing("predicted_ttft");
        let mut t = Turns {
            messages: turns.messages.clone(),
            turn: 3000,
        };
        tok.memo().forget();
        let first = body(&turns.messages, &[]);
        let r = parse_with(Api::Chat, &headers(), first, &limits, |_| Some(tok)).unwrap();
        pick(&mut routing, &r.request, Nanos(1));
        let mut id = 1;
        let name = if memo {
            "next_turn_memo"
        } else {
            "next_turn_full"
        };
        c.bench_function(&format!("{label}/{name}"), |b| {
            b.iter_batched(
                || t.next(),
                |body| {
                    let mut r = parse_with(Api::Chat, &headers(), body, &limits, |_| Some(tok))
                        .unwrap()
                        .request;
                    id += 1;
                    r.id = id;
                    pick(&mut routing, &r, Nanos(id));
                },
                BatchSize::PerIteration,
            )
        });
    }
}

/// The part of a turn the issue bounds: rendering and tokenizing (with the memo, or the full
/// path), then a `predicted_ttft` pick keyed by tokens, which block-hashes and walks the index;
/// the body is parsed (and the text key built) before the clock starts.
fn bench_tokenize_hash_index(c: &mut Criterion, tok: &ChatTokenizer, label: &str, turns: &Turns) {
    let limits = RequestConfig::default();
    for memo in [false, true] {
        let mut routing = routing("predicted_ttft");
        let mut t = Turns {
            messages: turns.messages.clone(),
            turn: 4000,
        };
        tok.memo().forget();
        let first = body(&turns.messages, &[]);
        let r = parse_with(Api::Chat, &headers(), first, &limits, |_| Some(tok)).unwrap();
        tok.chat_prompt_in(
            &serde_json::from_slice(&body(&turns.messages, &[])).unwrap(),
            1,
        )
        .unwrap();
        pick(&mut routing, &r.request, Nanos(1));
        let mut id = 1;
        let name = if memo {
            "tokenize_hash_index_memo"
        } else {
            "tokenize_hash_index_full"
        };
        c.bench_function(&format!("{label}/{name}"), |b| {
            b.iter_batched(
                || {
                    let body = t.next();
                    let fields: Map<String, Value> = serde_json::from_slice(&body).unwrap();
                    (
                        parse(Api::Chat, &headers(), body, &limits).unwrap().request,
                        fields,
                    )
                },
                |(mut r, fields)| {
                    let ids = match memo {
                        true => tok.chat_prompt_in(&fields, 1).unwrap().0,
                        false => tok.chat_prompt(&fields).unwrap(),
                    };
                    r.prompt_tokens = ids.len() as u32;
                    r.prompt.tokens = Some(ids);
                    id += 1;
                    r.id = id;
                    pick(&mut routing, &r, Nanos(id));
                    (r, fields)
                },
                BatchSize::PerIteration,
            )
        });
    }
}

/// Heap bytes of the routing's radix trees (what a session's prompts cost the index).
fn heap(routing: &Routing) -> usize {
    routing.cache().map_or(0, |c| c.heap_bytes())
}

fn bench(c: &mut Criterion) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../test-data/tokenizer");
    let tok = ChatTokenizer::load(&dir).unwrap();
    for (label, target) in [("128k", 128_000), ("480k", 480_000), ("1.9mb", 980_000)] {
        let messages = conversation(&tok, target);
        let turns = Turns { messages, turn: 0 };
        bench_tokenize_hash_index(c, &tok, label, &turns);
        bench_next_turn(c, &tok, label, &turns);
        bench_index(c, &tok, label, &turns);
        bench_size(c, &tok, label, turns);
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    targets = bench
}
criterion_main!(benches);
