//! Pick latency of the policies with the heaviest state, and the radix tree's memory per stored
//! character. Run: `cargo bench -p kvgate-core --bench pick`.
#![allow(missing_docs)] // criterion's macros generate undocumented functions

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use kvgate_core::decision::FailureKind;
use kvgate_core::index::radix::RadixTree;
use kvgate_core::policy::PolicyConfig;
use kvgate_core::router::accept_all;
use kvgate_core::{EndpointId, EndpointView, Nanos, Observation, Request, Router, Routing, Usage};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::hint::black_box;

fn fleet(n: u32, rng: &mut ChaCha8Rng) -> Vec<EndpointView> {
    (0..n)
        .map(|i| {
            EndpointView::new(EndpointId(i)).observed(
                Observation {
                    running: rng.random_range(0..8),
                    waiting: rng.random_range(0..4),
                    kv_usage: rng.random(),
                    free_blocks: Some(rng.random_range(0..1000)),
                    total_blocks: Some(1000),
                    block_size: Some(16),
                },
                Nanos::ZERO,
            )
        })
        .collect()
}

/// A routing of `name` over `fleet`.
fn routing(name: &str, fleet: &[EndpointView]) -> Routing {
    let mut routing = Routing::new(&PolicyConfig::default_for(name).unwrap(), 1);
    for e in fleet {
        routing.router_mut().add(e.clone());
    }
    routing
}

/// Measures a whole pick (index lookup, policy, dispatch bookkeeping) of `query`, undoing the
/// dispatch after each so the state stays the same.
fn bench_pick(c: &mut Criterion, label: &str, routing: &mut Routing, query: &Request) {
    c.bench_function(label, |b| {
        b.iter(|| {
            let overlaps = routing
                .cache()
                .map(|cache| cache.overlaps(query, Nanos(1)))
                .unwrap_or_default();
            let router: &mut Router = routing.router_mut();
            let d = router.pick(query, &overlaps, Nanos(1), &accept_all);
            if let Some(e) = d.endpoint() {
                router.completed(query.id, e, Nanos(1), Nanos(0), 0);
            }
            black_box(d)
        })
    });
}

/// `groups` shared system prompts of 2k characters, each followed by unique conversation text,
/// until `total` characters were sent.
fn corpus(total: usize, rng: &mut ChaCha8Rng) -> (Vec<String>, Vec<String>) {
    let word = |rng: &mut ChaCha8Rng| -> String {
        (0..rng.random_range(3..9))
            .map(|_| char::from(rng.random_range(b'a'..=b'z')))
            .collect()
    };
    let text = |rng: &mut ChaCha8Rng, chars: usize| {
        let mut s = String::new();
        while s.len() < chars {
            s.push_str(&word(rng));
            s.push(' ');
        }
        s
    };
    let systems: Vec<String> = (0..32).map(|_| text(rng, 2000)).collect();
    let mut prompts = Vec::new();
    let mut sent = 0;
    while sent < total {
        let p = format!(
            "{}{}",
            systems[rng.random_range(0..systems.len())],
            text(rng, 6000)
        );
        sent += p.len();
        prompts.push(p);
    }
    (systems, prompts)
}

fn bench_cache_aware(c: &mut Criterion) {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let fleet = fleet(64, &mut rng);
    let (systems, prompts) = corpus(1_000_000, &mut rng);
    let mut routing = routing("cache_aware", &fleet);
    for (k, p) in prompts.iter().enumerate() {
        let r = Request::from_text(k as u64, p.clone());
        routing.route(&r, Nanos(k as u64), &accept_all);
    }
    let query = Request::from_text(u64::MAX, format!("{}{}", systems[3], "x".repeat(6200)));
    assert!(query.prompt.text.as_ref().unwrap().len() >= 8000);
    bench_pick(
        c,
        "cache_aware pick, 64 endpoints, 1M chars, 8k prompt",
        &mut routing,
        &query,
    );

    let mut tree = RadixTree::<u8>::new(usize::MAX);
    for (k, p) in prompts.iter().enumerate() {
        tree.insert_key(0, p.as_bytes(), EndpointId(k as u32 % 64), Nanos(k as u64));
    }
    let inserted: usize = prompts.iter().map(String::len).sum();
    eprintln!(
        "radix tree: {} characters sent, {} stored, {} heap bytes: {:.2} bytes per stored character, {:.2} per sent",
        inserted,
        tree.stored(),
        tree.heap_bytes(),
        tree.heap_bytes() as f64 / tree.stored() as f64,
        tree.heap_bytes() as f64 / inserted as f64,
    );
    c.bench_function("radix insert 8k prompt", |b| {
        b.iter_batched(
            || tree.clone(),
            |mut t| {
                t.insert_key(
                    0,
                    query.prompt.text.as_ref().unwrap().as_bytes(),
                    EndpointId(1),
                    Nanos(9),
                )
            },
            BatchSize::LargeInput,
        )
    });
}

fn bench_kv_cost(c: &mut Criterion) {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let fleet = fleet(64, &mut rng);
    let mut routing = routing("kv_cost", &fleet);
    let system: Vec<u32> = (0..1024).map(|_| rng.random_range(0..32000)).collect();
    for k in 0..2000u64 {
        let mut tokens = system[..rng.random_range(0..1024)].to_vec();
        tokens.extend((0..512).map(|_| rng.random_range(0..32000u32)));
        routing.route(&Request::from_tokens(k, tokens), Nanos(k), &accept_all);
    }
    let mut q = system.clone();
    q.extend(0..1024);
    let query = Request::from_tokens(u64::MAX, q);
    bench_pick(
        c,
        "kv_cost pick, 64 endpoints, 2k-token prompt",
        &mut routing,
        &query,
    );
}

/// predicted_ttft as the gateway drives it: every prompt of the corpus dispatched, answered
/// (first token, usage with the cached tokens the index predicted, completion) and so learned
/// from; the last 32 still in flight, so queued work and pending prefixes are part of each
/// pick, and every engine's iteration clock is running. Engines report room for 100,000 blocks
/// of 16 tokens, so the mirrored index keeps the whole corpus: the sent 1.7M characters leave
/// over a million stored once corrections evicted what usage said was gone.
fn bench_predicted_ttft(c: &mut Criterion) {
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let fleet = fleet(64, &mut rng);
    let (systems, prompts) = corpus(1_700_000, &mut rng);
    let mut routing = routing("predicted_ttft", &fleet);
    for e in &fleet {
        let observation = Observation {
            total_blocks: Some(100_000),
            free_blocks: Some(50_000),
            ..e.observation.unwrap_or_default()
        };
        routing.observed(e.id, observation, Nanos::ZERO);
    }
    let ms = |k: usize| Nanos::from_millis(k as u64 * 50);
    let in_flight = 32;
    let mut sent: Vec<(u64, EndpointId, u32)> = Vec::new();
    for (k, p) in prompts.iter().enumerate() {
        let r = Request::from_text(k as u64, p.clone());
        if let Some(e) = routing.route(&r, ms(k), &accept_all).endpoint() {
            sent.push((k as u64, e, r.prompt_tokens));
        }
        if sent.len() > in_flight {
            let (id, e, tokens) = sent.remove(0);
            let ttft = Nanos::from_millis(20 + u64::from(tokens) / 8);
            routing.first_token(id, e, ms(k), ttft);
            let usage = Usage {
                prompt_tokens: tokens,
                cached_tokens: Some(tokens / 4),
                output_tokens: 100,
            };
            routing.usage(id, e, ms(k), usage);
            routing.completed(id, e, ms(k), ttft, 100);
        }
    }
    let stored = routing
        .cache()
        .and_then(|c| c.text_tree())
        .map_or(0, |t| t.stored());
    eprintln!("predicted_ttft index: {stored} characters stored");
    let now = ms(prompts.len());
    // Every engine iterating, each at its own phase, as the streams relayed show them.
    for (i, e) in fleet.iter().enumerate() {
        for k in 0..3u64 {
            let at = now - Nanos::from_millis(70 - 25 * k) + Nanos(i as u64 * 300_000);
            routing.tokens(e.id, at);
        }
    }
    let query = Request::from_text(u64::MAX, format!("{}{}", systems[3], "x".repeat(6200)));
    bench_pick(
        c,
        "predicted_ttft pick, 64 endpoints, 1M chars, 8k prompt",
        &mut routing,
        &query,
    );
    // The whole route as the simulator drives it: the pick plus the prefix cache's record of
    // the prompt in flight (which the gateway does outside its lock), undone by a failure.
    c.bench_function(
        "predicted_ttft route with cache bookkeeping, 64 endpoints, 1M chars, 8k prompt",
        |b| {
            b.iter(|| {
                let d = routing.route(&query, now, &accept_all);
                if let Some(e) = d.endpoint() {
                    routing.failed(query.id, e, now, FailureKind::Cancelled);
                }
                black_box(d)
            })
        },
    );
}

fn bench_power_of_two(c: &mut Criterion) {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let fleet = fleet(1024, &mut rng);
    let mut routing = routing("power_of_two", &fleet);
    let r = Request::from_text(1, "hello");
    bench_pick(c, "power_of_two pick, 1024 endpoints", &mut routing, &r);
}

criterion_group!(
    benches,
    bench_cache_aware,
    bench_kv_cost,
    bench_predicted_ttft,
    bench_power_of_two
);
criterion_main!(benches);
