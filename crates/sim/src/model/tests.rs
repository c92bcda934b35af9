use super::*;
use proptest::prelude::*;

fn config(batching: Batching, kv_blocks: usize, max_num_seqs: usize) -> EngineConfig {
    EngineConfig {
        max_num_seqs,
        kv_blocks,
        block_size: 16,
        batching,
        prefix_caching: true,
        cost: CostModel::unit(),
    }
}

fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| seed * 100_000 + i).collect()
}

fn req(id: u64, prompt: Vec<u32>, out: u32) -> SeqRequest {
    SeqRequest {
        id,
        prompt,
        max_output_tokens: out,
    }
}

fn tick(n: u64) -> Nanos {
    Nanos(n * TICK_NANOS)
}

#[test]
fn one_request_prefills_then_decodes_then_finishes() {
    let mut e = EngineModel::new(config(Batching::Continuous, 100, 4));
    assert!(e.step().is_none());
    e.submit(req(1, prompt(1, 40), 3));
    assert_eq!(e.stats().waiting, 1);
    let it = e.step().unwrap();
    assert_eq!(it.duration, tick(1));
    assert_eq!((it.prefill_tokens, it.decode_seqs), (40, 0));
    assert_eq!(
        it.events,
        vec![SeqEvent::FirstToken {
            id: 1,
            cached_tokens: 0
        }]
    );
    match &it.kv_events[..] {
        [KvEvent::BlockStored {
            block_hashes,
            parent_block_hash: None,
            token_ids,
            block_size: 16,
            ..
        }] => {
            assert_eq!(block_hashes.len(), 2);
            assert_eq!(token_ids, &prompt(1, 32));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(e.stats().running, 1);
    let it = e.step().unwrap();
    assert_eq!(it.events, vec![SeqEvent::Token { id: 1 }]);
    assert_eq!((it.prefill_tokens, it.decode_seqs), (0, 1));
    let it = e.step().unwrap();
    assert_eq!(
        it.events,
        vec![
            SeqEvent::Token { id: 1 },
            SeqEvent::Finished {
                id: 1,
                output_tokens: 3
            }
        ]
    );
    assert!(e.step().is_none());
    let s = e.stats();
    assert_eq!((s.running, s.waiting, s.kv_usage), (0, 0, 0.0));
    assert_eq!(s.free_blocks, 100);
}

#[test]
fn a_repeated_prefix_is_served_from_the_cache() {
    let mut e = EngineModel::new(config(Batching::Continuous, 100, 4));
    e.submit(req(1, prompt(1, 40), 1));
    e.step().unwrap();
    let mut p = prompt(1, 36);
    p.extend(7..19);
    e.submit(req(2, p, 1));
    let it = e.step().unwrap();
    assert_eq!(
        it.events[0],
        SeqEvent::FirstToken {
            id: 2,
            cached_tokens: 32
        }
    );
    assert_eq!(it.prefill_tokens, 16);
    // Block 2 of request 2 is new and full; it extends the cached chain.
    match &it.kv_events[..] {
        [KvEvent::BlockStored {
            block_hashes,
            parent_block_hash: Some(_),
            ..
        }] => assert_eq!(block_hashes.len(), 1),
        other => panic!("{other:?}"),
    }
    let s = e.stats();
    assert_eq!((s.prefix_queries_tokens, s.prefix_hits_tokens), (88, 32));
}

#[test]
fn a_fully_cached_prompt_still_computes_its_last_block() {
    let mut e = EngineModel::new(config(Batching::Continuous, 100, 4));
    e.submit(req(1, prompt(1, 32), 1));
    e.step().unwrap();
    e.submit(req(2, prompt(1, 32), 1));
    let it = e.step().unwrap();
    assert_eq!(it.prefill_tokens, 16);
    assert_eq!(
        it.events[0],
        SeqEvent::FirstToken {
            id: 2,
            cached_tokens: 16
        }
    );
}

#[test]
fn without_prefix_caching_nothing_is_reused() {
    let mut c = config(Batching::Continuous, 100, 4);
    c.prefix_caching = false;
    let mut e = EngineModel::new(c);
    e.submit(req(1, prompt(1, 40), 1));
    assert!(e.step().unwrap().kv_events.is_empty());
    e.submit(req(2, prompt(1, 40), 1));
    assert_eq!(e.step().unwrap().prefill_tokens, 40);
}

#[test]
fn continuous_prefill_stalls_decodes_and_takes_ticks_per_budget() {
    let mut e = EngineModel::new(config(Batching::Continuous, 1000, 4));
    e.submit(req(1, prompt(1, 10), 10));
    e.step().unwrap();
    e.step().unwrap();
    e.submit(req(2, prompt(2, 3000), 5));
    let it = e.step().unwrap();
    assert_eq!((it.prefill_tokens, it.decode_seqs), (3000, 0));
    assert_eq!(it.duration, tick(6));
    let it = e.step().unwrap();
    assert_eq!(it.decode_seqs, 2);
}

#[test]
fn chunked_prefill_shares_the_budget_with_decodes() {
    let budget = 20;
    let mut e = EngineModel::new(config(
        Batching::Chunked {
            max_num_batched_tokens: budget,
        },
        1000,
        4,
    ));
    e.submit(req(1, prompt(1, 10), 10));
    e.step().unwrap();
    e.submit(req(2, prompt(2, 50), 5));
    let mut chunks = Vec::new();
    loop {
        let it = e.step().unwrap();
        assert_eq!(it.decode_seqs, 1, "request 1 decodes every iteration");
        chunks.push(it.prefill_tokens);
        if it
            .events
            .iter()
            .any(|ev| matches!(ev, SeqEvent::FirstToken { id: 2, .. }))
        {
            break;
        }
    }
    assert_eq!(chunks, vec![19, 19, 12]);
}

/// The cached tokens each request's first token reports when `batching` admits two prompts
/// sharing a 64-token prefix in one iteration.
fn siblings_in_one_iteration(batching: Batching) -> Vec<(u64, u32)> {
    let mut e = EngineModel::new(config(batching, 1000, 4));
    let shared = prompt(1, 64);
    for id in 1..=2 {
        let mut p = shared.clone();
        p.extend(prompt(10 + id as u32, 8));
        e.submit(req(id, p, 1));
    }
    let it = e.step().unwrap();
    let mut firsts: Vec<(u64, u32)> = it
        .events
        .iter()
        .filter_map(|ev| match *ev {
            SeqEvent::FirstToken { id, cached_tokens } => Some((id, cached_tokens)),
            _ => None,
        })
        .collect();
    firsts.sort_unstable();
    firsts
}

#[test]
fn a_chunked_iteration_caches_blocks_as_it_schedules_them() {
    // vLLM v1: the second prompt finds the 4 shared blocks the first is computing in the same
    // iteration, and the iteration computes 72 + 8 tokens.
    let chunked = Batching::Chunked {
        max_num_batched_tokens: 512,
    };
    assert_eq!(siblings_in_one_iteration(chunked), vec![(1, 0), (2, 64)]);
    // Whole-prompt batching caches them once computed: both compute the prefix.
    assert_eq!(
        siblings_in_one_iteration(Batching::Continuous),
        vec![(1, 0), (2, 0)]
    );
}

#[test]
fn static_batching_waits_for_the_whole_batch() {
    let mut e = EngineModel::new(config(Batching::Static, 1000, 4));
    e.submit(req(1, prompt(1, 10), 2));
    e.submit(req(2, prompt(2, 10), 6));
    let it = e.step().unwrap();
    assert_eq!((it.output_tokens, it.scheduled_seqs), (2, 2));
    e.submit(req(3, prompt(3, 10), 1));
    for _ in 0..5 {
        let it = e.step().unwrap();
        assert_eq!(it.prefill_tokens, 0, "request 3 waits for the batch");
    }
    assert_eq!(e.stats().running, 0);
    let it = e.step().unwrap();
    assert_eq!(it.prefill_tokens, 10);
}

#[test]
fn slots_limit_the_batch() {
    let mut e = EngineModel::new(config(Batching::Continuous, 1000, 2));
    for id in 0..3 {
        e.submit(req(id, prompt(id as u32, 10), 3));
    }
    e.step().unwrap();
    let s = e.stats();
    assert_eq!((s.running, s.waiting), (2, 1));
}

#[test]
fn running_out_of_blocks_preempts_the_newest_and_recomputes_it() {
    // 6 blocks of 16 tokens. Two 40-token prompts take 3 blocks each; decoding past 48 tokens
    // needs a 7th block.
    let mut e = EngineModel::new(config(Batching::Continuous, 6, 4));
    e.submit(req(1, prompt(1, 40), 20));
    e.submit(req(2, prompt(2, 40), 20));
    let mut preempted = Vec::new();
    let mut outputs = std::collections::BTreeMap::new();
    let mut tokens = std::collections::BTreeMap::<u64, u32>::new();
    while let Some(it) = e.step() {
        e.check().unwrap();
        for ev in it.events {
            match ev {
                SeqEvent::Preempted { id } => preempted.push(id),
                SeqEvent::Finished { id, output_tokens } => {
                    outputs.insert(id, output_tokens);
                }
                SeqEvent::FirstToken { id, .. } | SeqEvent::Token { id } => {
                    *tokens.entry(id).or_default() += 1;
                }
            }
        }
    }
    assert_eq!(preempted.first(), Some(&2));
    assert_eq!(e.stats().preemptions, preempted.len() as u64);
    assert_eq!(outputs, [(1, 20), (2, 20)].into());
    assert_eq!(tokens, [(1, 20), (2, 20)].into());
}

#[test]
fn idle_cached_blocks_are_evicted_oldest_first() {
    let mut e = EngineModel::new(config(Batching::Continuous, 4, 4));
    e.submit(req(1, prompt(1, 32), 1));
    e.step().unwrap(); // 2 cached blocks, idle
    e.submit(req(2, prompt(2, 32), 1));
    e.step().unwrap(); // 2 more, pool now all idle cached
    e.submit(req(3, prompt(3, 16), 1));
    let it = e.step().unwrap();
    // Request 3 needs 1 block: it evicts the oldest idle block, request 1's tail (a sequence
    // releases its tail before its head).
    let tail = kvgate_core::index::blocks::block_hashes(&prompt(1, 32), 16, 0x656e_6769_6e65)[1];
    let removed: Vec<_> = it
        .kv_events
        .iter()
        .filter_map(|k| match k {
            KvEvent::BlockRemoved { block_hashes, .. } => Some(block_hashes.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(removed, vec![vec![tail]]);
    e.submit(req(4, prompt(1, 32), 1));
    let it = e.step().unwrap();
    assert_eq!(
        it.events[0],
        SeqEvent::FirstToken {
            id: 4,
            cached_tokens: 16
        },
        "request 1's head is still cached"
    );
    e.check().unwrap();
}

#[test]
fn abort_frees_blocks_and_reports_output() {
    let mut e = EngineModel::new(config(Batching::Continuous, 100, 4));
    e.submit(req(1, prompt(1, 40), 50));
    e.step().unwrap();
    e.step().unwrap();
    assert!(e.stats().kv_usage > 0.0);
    assert_eq!(
        e.abort(1),
        Some(SeqEvent::Finished {
            id: 1,
            output_tokens: 2
        })
    );
    assert_eq!(e.abort(1), None);
    assert_eq!(e.stats().kv_usage, 0.0);
    assert!(e.step().is_none());
    e.check().unwrap();
}

#[test]
fn a_request_that_cannot_fit_is_rejected() {
    let mut e = EngineModel::new(config(Batching::Continuous, 2, 4));
    e.submit(req(1, prompt(1, 40), 1));
    let it = e.step().unwrap();
    assert_eq!(
        it.events,
        vec![SeqEvent::Finished {
            id: 1,
            output_tokens: 0
        }]
    );
    assert!(e.step().is_none());
}

#[test]
fn reset_prefix_cache_forgets_everything() {
    let mut e = EngineModel::new(config(Batching::Continuous, 100, 4));
    e.submit(req(1, prompt(1, 40), 1));
    e.step().unwrap();
    assert_eq!(e.reset_prefix_cache(), Some(KvEvent::AllBlocksCleared));
    assert_eq!(e.reset_prefix_cache(), None);
    e.submit(req(2, prompt(1, 40), 1));
    assert_eq!(e.step().unwrap().prefill_tokens, 40);
    e.check().unwrap();
}

#[test]
fn token_events_can_be_skipped() {
    let mut e = EngineModel::new(config(Batching::Continuous, 100, 4))
        .with_token_events(false)
        .with_kv_events(false);
    e.submit(req(1, prompt(1, 40), 3));
    let mut events = Vec::new();
    while let Some(it) = e.step() {
        assert!(it.kv_events.is_empty());
        events.extend(it.events);
    }
    assert_eq!(events.len(), 2);
}

fn batching() -> impl Strategy<Value = Batching> {
    prop_oneof![
        Just(Batching::Static),
        Just(Batching::Continuous),
        (1usize..64).prop_map(|b| Batching::Chunked {
            max_num_batched_tokens: b
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever the mode and pressure, every request ends exactly once with all its tokens
    /// (or is rejected / aborted), the pool stays consistent, and the engine ends empty.
    #[test]
    fn every_request_completes_and_the_pool_stays_consistent(
        batching in batching(),
        kv_blocks in 4usize..40,
        slots in 1usize..6,
        caching in any::<bool>(),
        reqs in prop::collection::vec((0u32..4, 1usize..80, 1u32..30, 0u8..10), 1..25),
    ) {
        let mut c = config(batching, kv_blocks, slots);
        c.prefix_caching = caching;
        let mut e = EngineModel::new(c);
        let mut expected = std::collections::BTreeMap::new();
        let mut got = std::collections::BTreeMap::new();
        let mut tokens = std::collections::BTreeMap::<u64, u32>::new();
        let mut aborted = std::collections::BTreeSet::new();
        let mut first_seen = std::collections::BTreeSet::new();
        let mut steps = 0;
        for (i, &(group, len, out, action)) in reqs.iter().enumerate() {
            let id = i as u64;
            e.submit(req(id, prompt(group, len), out));
            expected.insert(id, out);
            if action == 0 && i > 0 && !got.contains_key(&(id - 1)) {
                if let Some(SeqEvent::Finished { output_tokens, .. }) = e.abort(id - 1) {
                    aborted.insert(id - 1);
                    got.insert(id - 1, output_tokens);
                }
            }
            for _ in 0..action {
                let Some(it) = e.step() else { break };
                steps += 1;
                record(&it, &mut got, &mut tokens, &mut first_seen);
            }
            e.check().map_err(TestCaseError::fail)?;
        }
        while let Some(it) = e.step() {
            steps += 1;
            prop_assert!(steps < 100_000, "engine does not drain");
            record(&it, &mut got, &mut tokens, &mut first_seen);
            e.check().map_err(TestCaseError::fail)?;
        }
        prop_assert_eq!(got.len(), expected.len());
        for (id, out) in &expected {
            let fits = (reqs[*id as usize].1 + *out as usize).div_ceil(16) <= kv_blocks;
            if aborted.contains(id) {
                prop_assert!(got[id] <= *out);
            } else if fits {
                prop_assert_eq!(got[id], *out);
                prop_assert_eq!(tokens.get(id).copied().unwrap_or(0), *out);
            } else {
                prop_assert_eq!(got[id], 0);
            }
        }
        let s = e.stats();
        prop_assert_eq!((s.running, s.waiting, s.free_blocks), (0, 0, kv_blocks as u64));
    }
}

fn record(
    it: &Iteration,
    got: &mut std::collections::BTreeMap<u64, u32>,
    tokens: &mut std::collections::BTreeMap<u64, u32>,
    first_seen: &mut std::collections::BTreeSet<u64>,
) {
    for ev in &it.events {
        match *ev {
            SeqEvent::Finished { id, output_tokens } => {
                assert!(got.insert(id, output_tokens).is_none(), "finished twice");
            }
            SeqEvent::FirstToken { id, .. } => {
                assert!(first_seen.insert(id), "two first tokens");
                *tokens.entry(id).or_default() += 1;
            }
            SeqEvent::Token { id } => {
                assert!(first_seen.contains(&id), "token before the first");
                *tokens.entry(id).or_default() += 1;
            }
            SeqEvent::Preempted { .. } => {}
        }
    }
}

#[test]
fn uncached_blocks_leave_out_prefix_hits() {
    let mut e = EngineModel::new(config(Batching::Continuous, 100, 4));
    e.submit(req(1, prompt(1, 64), 2));
    e.step().unwrap();
    assert_eq!(e.stats().uncached_blocks, 4, "a cold prompt counts in full");
    e.submit(req(2, prompt(1, 64), 10));
    e.step().unwrap();
    let s = e.stats();
    assert_eq!(s.total_blocks - s.free_blocks, 5, "three blocks are shared");
    assert_eq!(s.uncached_blocks, 5, "request 2 counts only its own block");
    e.step().unwrap();
    let s = e.stats();
    assert_eq!(s.running, 1, "request 1 finished");
    assert_eq!(s.total_blocks - s.free_blocks, 5);
    assert_eq!(
        s.uncached_blocks, 2,
        "the hits request 2 still holds count as cached"
    );
    e.check().unwrap();
}

#[test]
fn a_transferred_prompt_computes_only_its_last_token() {
    let chunked = Batching::Chunked {
        max_num_batched_tokens: 512,
    };
    let mut e = EngineModel::new(config(chunked, 100, 4));
    e.submit_transferred(req(1, prompt(1, 600), 2), 600);
    let it = e.step().unwrap();
    assert_eq!(it.prefill_tokens, 1);
    assert_eq!(
        it.events,
        vec![SeqEvent::FirstToken {
            id: 1,
            cached_tokens: 599
        }]
    );
    // The engine's own prefix-cache hit rate does not count the transfer.
    assert_eq!(e.stats().prefix_hits_tokens, 0);
    // Without the transfer the same prompt takes two chunks before its first token.
    let mut e = EngineModel::new(config(chunked, 100, 4));
    e.submit(req(1, prompt(1, 600), 2));
    assert_eq!(e.step().unwrap().prefill_tokens, 512);
}
