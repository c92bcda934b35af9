use super::*;
use crate::index::blocks::Tier;
use crate::index::blocks::ENGINE_SCOPE;
use proptest::prelude::*;

const BS: u32 = 4;

fn stored(tokens: &[u32], parent: Option<u64>, ext0: u64) -> KvEvent {
    KvEvent::BlockStored {
        lora_name: None,
        block_hashes: (0..(tokens.len() as u64 / u64::from(BS)))
            .map(|i| ext0 + i)
            .collect(),
        parent_block_hash: parent,
        token_ids: tokens.to_vec(),
        block_size: BS,
        tier: Tier::Device,
    }
}

fn approx(endpoints: &[(u32, u32)], total: u32) -> Overlaps {
    Overlaps {
        total,
        unit: Unit::Tokens,
        endpoints: endpoints
            .iter()
            .map(|&(e, device)| Overlap {
                endpoint: EndpointId(e),
                device,
                ..Overlap::default()
            })
            .collect(),
        ..Overlaps::default()
    }
}

#[test]
fn a_complete_stream_predicts_to_the_token() {
    let mut caches = EngineCaches::new(1000);
    let prompt: Vec<u32> = (0..13).collect();
    assert_eq!(
        caches.batch(
            EndpointId(0),
            0,
            &[stored(&prompt[..12], None, 100)],
            Nanos(0)
        ),
        BatchOutcome::InOrder
    );
    // The router believed endpoint 1 held 9 tokens; it has no stream, so that stands.
    let out = caches.overlay(approx(&[(1, 9)], 13), &prompt, ENGINE_SCOPE, Nanos(0));
    assert_eq!(out.unit, Unit::Tokens);
    assert_eq!(out.of(EndpointId(0)).device, 12);
    assert_eq!(out.of(EndpointId(1)).device, 9);
    // Twelve tokens of a twelve-token prompt: the last token is always recomputed.
    let out = caches.overlay(approx(&[], 12), &prompt[..12], ENGINE_SCOPE, Nanos(0));
    assert_eq!(out.of(EndpointId(0)).device, 8);
    assert_eq!(out.engine, vec![(EndpointId(0), 8, true)]);
    // A trusted stream overrides the router's belief either way.
    let out = caches.overlay(approx(&[(0, 4)], 13), &prompt, ENGINE_SCOPE, Nanos(0));
    assert_eq!(out.of(EndpointId(0)).device, 12);
}

#[test]
fn a_gap_is_noticed_at_the_next_batch_and_the_router_fills_in() {
    let mut caches = EngineCaches::new(1000);
    let prompt: Vec<u32> = (0..17).collect();
    let e = EndpointId(2);
    caches.batch(e, 0, &[stored(&prompt[..8], None, 100)], Nanos(0));
    caches.batch(e, 1, &[], Nanos(0));
    assert_eq!(
        caches.batch(e, 3, &[stored(&prompt[8..12], Some(101), 102)], Nanos(0)),
        BatchOutcome::Gap {
            expected: 2,
            got: 3
        }
    );
    let status = caches.status(e).unwrap();
    assert_eq!(status.trust, Trust::Unknown);
    // What came before the gap was dropped; the block after it has no known parent.
    assert_eq!(status.entries, 0);
    let out = caches.overlay(approx(&[(2, 10)], 17), &prompt, ENGINE_SCOPE, Nanos(0));
    assert_eq!(out.of(e).device, 10, "the larger of router and events");
    assert_eq!(out.engine, vec![(e, 0, false)]);
    // New blocks stored after the gap are used when they say more than the router does.
    caches.batch(e, 4, &[stored(&prompt[..16], None, 200)], Nanos(0));
    let out = caches.overlay(approx(&[(2, 10)], 17), &prompt, ENGINE_SCOPE, Nanos(0));
    assert_eq!(out.of(e).device, 16);
}

#[test]
fn a_restart_or_a_cleared_cache_makes_the_stream_whole_again() {
    let mut caches = EngineCaches::new(1000);
    let prompt: Vec<u32> = (0..9).collect();
    let e = EndpointId(0);
    caches.batch(e, 5, &[stored(&prompt[..8], None, 1)], Nanos(0));
    assert_eq!(caches.status(e).unwrap().trust, Trust::Unknown);
    assert_eq!(caches.batch(e, 0, &[], Nanos(1)), BatchOutcome::Restarted);
    let status = caches.status(e).unwrap();
    assert_eq!((status.trust, status.entries), (Trust::Live, 0));
    caches.batch(e, 3, &[stored(&prompt[..8], None, 1)], Nanos(2));
    assert_eq!(caches.status(e).unwrap().trust, Trust::Unknown);
    caches.batch(e, 4, &[KvEvent::AllBlocksCleared], Nanos(3));
    let status = caches.status(e).unwrap();
    assert_eq!((status.trust, status.entries), (Trust::Live, 0));
    assert_eq!(caches.batch(e, 4, &[], Nanos(3)), BatchOutcome::Stale);
}

#[test]
fn exact_predictions_in_a_row_restore_trust() {
    let mut caches = EngineCaches::new(1000);
    let e = EndpointId(1);
    caches.batch(e, 7, &[], Nanos(0));
    for i in 0..VERIFY_STREAK {
        assert_eq!(caches.status(e).unwrap().trust, Trust::Unknown, "after {i}");
        caches.verified(e, i != 3 || caches.status(e).unwrap().trust == Trust::Live);
    }
    // The miss at the fourth reset the streak.
    assert_eq!(caches.status(e).unwrap().trust, Trust::Unknown);
    for _ in 0..VERIFY_STREAK {
        caches.verified(e, true);
    }
    assert_eq!(caches.status(e).unwrap().trust, Trust::Live);
}

#[test]
fn another_block_size_is_not_matched() {
    let mut caches = EngineCaches::new(1000);
    caches.batch(
        EndpointId(0),
        0,
        &[stored(&[1, 2, 3, 4], None, 1)],
        Nanos(0),
    );
    let odd = KvEvent::BlockStored {
        lora_name: None,
        block_hashes: vec![9],
        parent_block_hash: None,
        token_ids: vec![1, 2, 3, 4, 5, 6, 7, 8],
        block_size: 8,
        tier: Tier::Device,
    };
    caches.batch(EndpointId(1), 0, &[odd], Nanos(0));
    assert_eq!(caches.status(EndpointId(1)).unwrap().trust, Trust::Unknown);
    assert_eq!(caches.status(EndpointId(1)).unwrap().entries, 0);
}

#[derive(Clone, Debug)]
enum Op {
    Store {
        endpoint: u32,
        parent: Option<u8>,
        first: u8,
        blocks: u8,
        host: bool,
    },
    Remove {
        endpoint: u32,
        first: u8,
        n: u8,
    },
    Clear {
        endpoint: u32,
    },
    Skip {
        endpoint: u32,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u32..3, prop::option::of(0u8..40), 0u8..40, 1u8..12, any::<bool>()).prop_map(
            |(endpoint, parent, first, blocks, host)| Op::Store { endpoint, parent, first, blocks, host }
        ),
        3 => (0u32..3, 0u8..40, 1u8..10).prop_map(|(endpoint, first, n)| Op::Remove { endpoint, first, n }),
        1 => (0u32..3).prop_map(|endpoint| Op::Clear { endpoint }),
        1 => (0u32..3).prop_map(|endpoint| Op::Skip { endpoint }),
    ]
}

proptest! {
    /// Whatever the engines send (unknown parents, removals of unknown blocks, lost batches),
    /// no endpoint holds more than the bound, and nothing panics.
    #[test]
    fn entries_stay_under_the_bound(ops in prop::collection::vec(op(), 1..200), bound in 1usize..40) {
        let mut caches = EngineCaches::new(bound);
        let mut seq = [0u64; 3];
        for op in ops {
            let (endpoint, events) = match op {
                Op::Store { endpoint, parent, first, blocks, host } => {
                    let tokens: Vec<u32> = (0..u32::from(blocks) * BS).map(|t| t + u32::from(first)).collect();
                    let ev = KvEvent::BlockStored { lora_name: None,
                        block_hashes: (0..u64::from(blocks)).map(|i| u64::from(first) + i).collect(),
                        parent_block_hash: parent.map(u64::from),
                        token_ids: tokens,
                        block_size: BS,
                        tier: if host { Tier::Host } else { Tier::Device },
                    };
                    (endpoint, vec![ev])
                }
                Op::Remove { endpoint, first, n } => (endpoint, vec![KvEvent::BlockRemoved {
                    block_hashes: (0..u64::from(n)).map(|i| u64::from(first) + i).collect(),
                    tier: Tier::Device,
                }]),
                Op::Clear { endpoint } => (endpoint, vec![KvEvent::AllBlocksCleared]),
                Op::Skip { endpoint } => {
                    seq[endpoint as usize] += 1;
                    continue;
                }
            };
            let s = &mut seq[endpoint as usize];
            caches.batch(EndpointId(endpoint), *s, &events, Nanos(0));
            *s += 1;
            for e in 0..3 {
                let held = caches.status(EndpointId(e)).map_or(0, |s| s.entries);
                prop_assert!(held <= bound, "endpoint {} holds {} > {}", e, held, bound);
            }
        }
        let query: Vec<u32> = (0..64).collect();
        let _ = caches.overlay(Overlaps::default(), &query, ENGINE_SCOPE, Nanos(0));
    }
}
