//! Worked examples from the reference systems' documentation and behaviour shared by every policy.

use super::config;
use super::kv_cost::CostInputs;
use super::*;
use crate::index::{Overlap, PrefixCache};
use crate::router::accept_all;
use crate::{
    EndpointId, EndpointView, Health, Nanos, Observation, Reason, Request, Route, Routing,
};
use proptest::prelude::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

fn fleet(n: u32) -> Vec<EndpointView> {
    (0..n).map(|i| EndpointView::new(EndpointId(i))).collect()
}

fn with_load(loads: &[u32]) -> Vec<EndpointView> {
    loads
        .iter()
        .enumerate()
        .map(|(i, &l)| {
            EndpointView::new(EndpointId(i as u32)).observed(
                Observation {
                    running: l,
                    ..Observation::default()
                },
                Nanos::ZERO,
            )
        })
        .collect()
}

/// Asks `policy` about `request` over `views` (every healthy member eligible), with the
/// overlaps `cache` finds (none without a cache).
fn select<P: Policy + ?Sized>(
    policy: &mut P,
    cache: Option<&PrefixCache>,
    request: &Request,
    views: &[EndpointView],
    now: Nanos,
    rng: &mut ChaCha8Rng,
) -> Decision {
    let overlaps = cache.map(|c| c.overlaps(request, now)).unwrap_or_default();
    let query = Query {
        request,
        fleet: Fleet::of(views),
        overlaps: &overlaps,
        now,
    };
    policy.select(&query, rng)
}

/// Records that `request` went to `endpoint`, in the cache and the policy, as a router would.
fn dispatch<P: Policy + ?Sized>(
    policy: &mut P,
    cache: &mut PrefixCache,
    request: &Request,
    endpoint: EndpointId,
    at: Nanos,
) {
    let overlaps = cache.overlaps(request, at);
    cache.dispatched(request, endpoint, at, &overlaps);
    policy.observe(&Event::Dispatched {
        request,
        endpoint,
        at,
        overlaps: &overlaps,
    });
}

fn cache_for(config: &PolicyConfig) -> PrefixCache {
    PrefixCache::new(&config.index().expect("the policy uses an index"))
}

fn inputs(prefill: f64, device: u32, decode: f64) -> CostInputs {
    CostInputs {
        prefill_blocks: prefill,
        overlap: Overlap {
            device,
            ..Overlap::default()
        },
        decode_blocks: decode,
        ..CostInputs::default()
    }
}

/// Dynamo's cost (docs/background.md#dynamo-kv-cost): (raw prefill, device overlap, decode) =
/// (10,2,10), (10,5,5), (10,8,9) cost 18, 10, 11 with credit 1.0.
#[test]
fn dynamo_cost_table_one() {
    let c = config::KvCost::default();
    let costs: Vec<f64> = [(10.0, 2, 10.0), (10.0, 5, 5.0), (10.0, 8, 9.0)]
        .iter()
        .map(|&(p, o, d)| c.cost(&inputs(p, o, d)))
        .collect();
    assert_eq!(costs, vec![18.0, 10.0, 11.0]);
    assert_eq!(chosen_by_kv_cost(&[(2, 10), (5, 5), (8, 9)]), EndpointId(1));
}

/// Seed 003: overlaps 8, 6, 2, 0 of 10 blocks with decode 12, 4, 3, 1 cost 14, 8, 11, 11; W2
/// (the second worker) wins.
#[test]
fn dynamo_cost_table_two() {
    let c = config::KvCost::default();
    let costs: Vec<f64> = [(8, 12.0), (6, 4.0), (2, 3.0), (0, 1.0)]
        .iter()
        .map(|&(o, d)| c.cost(&inputs(10.0, o, d)))
        .collect();
    assert_eq!(costs, vec![14.0, 8.0, 11.0, 11.0]);
    assert_eq!(
        chosen_by_kv_cost(&[(8, 12), (6, 4), (2, 3), (0, 1)]),
        EndpointId(1)
    );
}

#[test]
fn dynamo_tiers_and_decay_reduce_credit() {
    let c = config::KvCost {
        overlap_credit_decay: 1.0,
        ..config::KvCost::default()
    };
    let mut x = inputs(10.0, 4, 0.0);
    x.overlap.host = 4;
    x.overlap.disk = 2;
    assert_eq!(config::KvCost::default().cost(&x), 10.0 - 4.0 - 3.0 - 0.5);
    x.normalized_excess_prefill = 1.0;
    assert_eq!(c.cost(&x), 10.0 - 2.0 - 3.0 - 0.5);
}

/// Runs the whole kv_cost policy: each worker gets `overlap` of a 10-block prompt through a
/// finished dispatch of a prefix of it, and `decode` blocks of its own through an unrelated
/// request still in flight there (the active blocks Dynamo's router tracks).
fn chosen_by_kv_cost(workers: &[(usize, u64)]) -> EndpointId {
    let config = config::KvCost {
        block_size: 4,
        ..config::KvCost::default()
    };
    let mut cache = cache_for(&PolicyConfig::KvCost(config.clone()));
    let mut policy = KvCost::new(config);
    let prompt: Vec<u32> = (0..40).collect();
    for (w, &(overlap, decode)) in workers.iter().enumerate() {
        let e = EndpointId(w as u32);
        if overlap > 0 {
            let r = Request::from_tokens(100 + w as u64, prompt[..overlap * 4].to_vec());
            dispatch(&mut policy, &mut cache, &r, e, Nanos::ZERO);
            policy.observe(&Event::Completed {
                request: r.id,
                endpoint: e,
                at: Nanos::ZERO,
                latency: Nanos::ZERO,
                output_tokens: 1,
            });
        }
        let base = 10_000 * (w as u32 + 1);
        let busy = Request::from_tokens(200 + w as u64, (base..base + decode as u32 * 4).collect());
        dispatch(&mut policy, &mut cache, &busy, e, Nanos::ZERO);
    }
    let fleet: Vec<EndpointView> = (0..workers.len() as u32)
        .map(|w| EndpointView::new(EndpointId(w)))
        .collect();
    let d = select(
        &mut policy,
        Some(&cache),
        &Request::from_tokens(1, prompt),
        &fleet,
        Nanos::ZERO,
        &mut rng(1),
    );
    d.endpoint().unwrap()
}

/// SGLang: imbalanced iff max - min > 64 AND max > 1.5 min (Rust gateway defaults).
#[test]
fn sglang_imbalance_rule_at_both_thresholds() {
    let c = config::CacheAware::default();
    // Absolute threshold: relative condition holds in both cases.
    assert!(!c.is_imbalanced(99.0, 35.0), "gap 64 is not above 64");
    assert!(c.is_imbalanced(100.0, 35.0), "gap 65 is above 64");
    // Relative threshold: absolute condition holds in both cases.
    assert!(!c.is_imbalanced(300.0, 200.0), "300 is not above 1.5 x 200");
    assert!(c.is_imbalanced(301.0, 200.0), "301 is above 1.5 x 200");
}

#[test]
fn cache_aware_follows_the_prefix_until_imbalanced() {
    let mut cache = cache_for(&PolicyConfig::CacheAware(config::CacheAware::default()));
    let mut p = CacheAware::new(config::CacheAware::default());
    let long = "system: you are a helpful agent. ".repeat(20);
    let first = Request::from_text(1, format!("{long} turn one"));
    let balanced = with_load(&[0, 0, 0]);
    let d = select(
        &mut p,
        Some(&cache),
        &first,
        &balanced,
        Nanos::ZERO,
        &mut rng(3),
    );
    let home = d.endpoint().unwrap();
    assert!(matches!(
        d,
        Decision::Route(Route {
            reason: Reason::LowMatch { .. },
            ..
        })
    ));
    dispatch(&mut p, &mut cache, &first, home, Nanos::ZERO);
    let second = Request::from_text(2, format!("{long} turn two"));
    for seed in 0..20 {
        let d = select(
            &mut p,
            Some(&cache),
            &second,
            &balanced,
            Nanos(1),
            &mut rng(seed),
        );
        assert_eq!(d.endpoint(), Some(home));
        assert!(matches!(
            d,
            Decision::Route(Route {
                reason: Reason::PrefixAffinity { .. },
                ..
            })
        ));
    }
    let mut loads = [10u32, 10, 10];
    loads[home.0 as usize] = 100;
    let d = select(
        &mut p,
        Some(&cache),
        &second,
        &with_load(&loads),
        Nanos(2),
        &mut rng(4),
    );
    assert_ne!(d.endpoint(), Some(home));
    assert!(matches!(
        d,
        Decision::Route(Route {
            reason: Reason::BalanceEscape { .. },
            ..
        })
    ));
    // Another tenant's identical prompt earns no affinity.
    let other = Request::from_text(3, format!("{long} turn two")).with_tenant("acme");
    let d = select(
        &mut p,
        Some(&cache),
        &other,
        &balanced,
        Nanos(3),
        &mut rng(5),
    );
    assert!(matches!(
        d,
        Decision::Route(Route {
            reason: Reason::LowMatch { matched: 0, .. },
            ..
        })
    ));
}

/// Envoy: weight / (active + 1)^bias.
#[test]
fn envoy_weight_at_bias_zero_and_one() {
    assert_eq!(envoy_weight(10.0, 4.0, 0.0), 10.0);
    assert_eq!(envoy_weight(10.0, 4.0, 1.0), 2.0);
    assert_eq!(envoy_weight(10.0, 0.0, 1.0), 10.0);
    assert!((envoy_weight(9.0, 8.0, 0.5) - 3.0).abs() < 1e-12);
}

#[test]
fn weighted_least_request_with_bias_zero_is_weighted_round_robin() {
    let mut fleet = fleet(2);
    fleet[0].weight = 3.0;
    fleet[1].own_since_observation = 50;
    let mut p = WeightedLeastRequest::new(config::WeightedLeastRequest {
        active_request_bias: 0.0,
        ..Default::default()
    });
    let picks: Vec<u32> = (0..8)
        .map(|_| {
            select(
                &mut p,
                None,
                &Request::default(),
                &fleet,
                Nanos::ZERO,
                &mut rng(0),
            )
            .endpoint()
            .unwrap()
            .0
        })
        .collect();
    assert_eq!(picks.iter().filter(|&&e| e == 0).count(), 6);
    let mut biased = WeightedLeastRequest::new(config::WeightedLeastRequest::default());
    let picks: Vec<u32> = (0..8)
        .map(|_| {
            select(
                &mut biased,
                None,
                &Request::default(),
                &fleet,
                Nanos::ZERO,
                &mut rng(0),
            )
            .endpoint()
            .unwrap()
            .0
        })
        .collect();
    assert_eq!(
        picks.iter().filter(|&&e| e == 0).count(),
        8,
        "load 50 divides weight 1 by 51"
    );
}

#[test]
fn smooth_weighted_round_robin_interleaves() {
    let mut fleet = fleet(3);
    fleet[0].weight = 5.0;
    let mut p = WeightedRoundRobin::new(Default::default());
    let picks: Vec<u32> = (0..7)
        .map(|_| {
            select(
                &mut p,
                None,
                &Request::default(),
                &fleet,
                Nanos::ZERO,
                &mut rng(0),
            )
            .endpoint()
            .unwrap()
            .0
        })
        .collect();
    assert_eq!(
        picks,
        vec![0, 0, 1, 0, 2, 0, 0],
        "nginx's {{5,1,1}} sequence"
    );
}

#[test]
fn least_kv_ignores_waiting_work() {
    let mut fleet = with_load(&[0, 0]);
    fleet[0].observation = Some(Observation {
        waiting: 40,
        kv_usage: 0.1,
        ..Observation::default()
    });
    fleet[1].observation = Some(Observation {
        running: 2,
        kv_usage: 0.3,
        ..Observation::default()
    });
    let mut kv = LeastKv::new(Default::default());
    assert_eq!(
        select(
            &mut kv,
            None,
            &Request::default(),
            &fleet,
            Nanos::ZERO,
            &mut rng(0)
        )
        .endpoint(),
        Some(EndpointId(0))
    );
    let mut lo = LeastOutstanding::new(Default::default());
    assert_eq!(
        select(
            &mut lo,
            None,
            &Request::default(),
            &fleet,
            Nanos::ZERO,
            &mut rng(0)
        )
        .endpoint(),
        Some(EndpointId(1))
    );
}

#[test]
fn every_policy_rejects_an_empty_or_unroutable_fleet() {
    for &name in PolicyConfig::NAMES {
        let config = PolicyConfig::default_for(name).unwrap();
        let mut p = config.build();
        let cache = config.index().map(|spec| PrefixCache::new(&spec));
        let cache = cache.as_ref();
        assert_eq!(p.name(), name);
        let r = Request::from_text(1, "x");
        assert_eq!(
            select(&mut *p, cache, &r, &[], Nanos::ZERO, &mut rng(0)),
            Decision::Reject(crate::Rejection::NoEndpoints)
        );
        let mut down = fleet(2);
        down[0].health = Health::Unhealthy;
        down[1].health = Health::Draining;
        assert_eq!(
            select(&mut *p, cache, &r, &down, Nanos::ZERO, &mut rng(0)),
            Decision::Reject(crate::Rejection::NoRoutableEndpoint),
            "{name}"
        );
        let mut half = fleet(3);
        half[1].health = Health::Unhealthy;
        for k in 0..30 {
            let d = select(
                &mut *p,
                cache,
                &Request::from_text(k, format!("p{k}")),
                &half,
                Nanos::ZERO,
                &mut rng(k),
            );
            assert_ne!(
                d.endpoint(),
                Some(EndpointId(1)),
                "{name} routed to an unhealthy endpoint"
            );
        }
    }
}

#[test]
fn configs_round_trip_and_reject_unknown_fields() {
    for &name in PolicyConfig::NAMES {
        let c = PolicyConfig::default_for(name).unwrap();
        let json = serde_json::to_string(&c).unwrap();
        let back: PolicyConfig = serde_json::from_str(&json).unwrap();
        assert_eq!(back, c);
        assert!(c.validate().is_ok());
    }
    let bad = r#"{"name":"cache_aware","cache_treshold":0.5}"#;
    assert!(serde_json::from_str::<PolicyConfig>(bad).is_err());
    let out_of_range = PolicyConfig::CacheAware(config::CacheAware {
        cache_threshold: 2.0,
        ..Default::default()
    });
    assert_eq!(
        out_of_range.validate().unwrap_err().param,
        "cache_threshold"
    );
}

/// Replays a trace of requests, dispatches and completions through a router.
fn decision_log(name: &str, seed: u64) -> Vec<String> {
    let mut routing = Routing::new(&PolicyConfig::default_for(name).unwrap(), seed);
    for e in fleet(5) {
        routing.router_mut().add(e);
    }
    let mut log = Vec::new();
    for k in 0..200u64 {
        let req = Request::from_text(k, format!("tenant prompt {} and more", k % 7))
            .with_session(format!("s{}", k % 11));
        let d = routing.route(&req, Nanos(k * 1000), &accept_all);
        if let Some(e) = d.endpoint() {
            if k % 3 == 0 {
                routing.completed(k, e, Nanos(k * 1000 + 1), Nanos(1), 1);
            }
        }
        log.push(format!("{d:?}"));
    }
    log
}

#[test]
fn the_same_seed_gives_the_same_picks() {
    for &name in PolicyConfig::NAMES {
        assert_eq!(decision_log(name, 42), decision_log(name, 42), "{name}");
    }
    assert_ne!(decision_log("random", 1), decision_log("random", 2));
}

proptest! {
    /// Bounded load: with only this router's dispatches as load, no endpoint ever carries more
    /// than ceil(c * m / n) of the m requests placed so far.
    #[test]
    fn bounded_load_never_exceeds_capacity(n in 1u32..12, m in 1usize..300, c in 1.0f64..2.0, seed in any::<u64>()) {
        let mut p = ConsistentHash::new(config::ConsistentHash { balance_factor: c, key: HashKey::Request, ..Default::default() });
        let mut fleet = fleet(n);
        let mut r = rng(seed);
        for k in 0..m {
            let req = Request { id: k as u64 ^ seed, ..Request::default() };
            let e = select(&mut p, None, &req, &fleet, Nanos::ZERO, &mut r).endpoint().unwrap();
            fleet[e.0 as usize].own_since_observation += 1;
            let cap = crate::hashring::bounded_capacity(c, (k + 1) as f64, n as usize);
            for x in &fleet {
                prop_assert!(f64::from(x.own_since_observation) <= cap, "{} > {cap}", x.own_since_observation);
            }
        }
    }

    /// Same seed, same picks, for random inputs and every policy.
    #[test]
    fn same_seed_same_picks(seed in any::<u64>(), k in 0usize..PolicyConfig::NAMES.len()) {
        let name = PolicyConfig::NAMES[k];
        prop_assert_eq!(decision_log(name, seed), decision_log(name, seed));
    }
}

/// With engine KV events, a request (with a model and a tenant) matches the blocks an engine
/// reported storing, and a removal takes the affinity away.
#[test]
fn kv_cost_follows_engine_kv_events() {
    use crate::index::blocks::{block_hashes, KvEvent, Tier};
    let config = PolicyConfig::KvCost(config::KvCost {
        block_size: 4,
        use_kv_events: true,
        ..Default::default()
    });
    let mut routing = Routing::new(&config, 0);
    for e in fleet(4) {
        routing.router_mut().add(e);
    }
    let prompt: Vec<u32> = (0..32).collect();
    let ext: Vec<u64> = block_hashes(&prompt, 4, 1234);
    let stored = KvEvent::BlockStored {
        lora_name: None,
        block_hashes: ext.clone(),
        parent_block_hash: None,
        token_ids: prompt.clone(),
        block_size: 4,
        tier: Tier::Device,
    };
    routing.kv_event(EndpointId(2), &stored, Nanos::ZERO);
    let mut req = Request::from_tokens(1, prompt.clone()).with_tenant("t1");
    req.model = Some("m".into());
    let d = routing.route(&req, Nanos::ZERO, &accept_all);
    assert_eq!(d.endpoint(), Some(EndpointId(2)));
    routing.completed(req.id, EndpointId(2), Nanos::ZERO, Nanos::ZERO, 1);
    assert!(
        matches!(d, Decision::Route(Route { reason: Reason::LeastCost { cost }, .. }) if cost == 0.0)
    );
    let removed = KvEvent::BlockRemoved {
        block_hashes: ext[..1].to_vec(),
        tier: Tier::Device,
    };
    routing.kv_event(EndpointId(2), &removed, Nanos(1));
    let d = routing.route(&req, Nanos(1), &accept_all);
    assert!(
        matches!(d, Decision::Route(Route { reason: Reason::LeastCost { cost }, .. }) if cost == 8.0)
    );
}

/// A hedged request is in flight on two endpoints; the loser's cancellation must not erase the
/// winner's KV blocks from kv_cost's bookkeeping.
#[test]
fn kv_cost_keeps_a_hedge_winners_blocks_when_the_loser_is_cancelled() {
    let mut p = KvCost::new(config::KvCost {
        block_size: 4,
        ..Default::default()
    });
    let r = Request::from_tokens(7, (0..40).collect());
    let overlaps = crate::index::Overlaps::default();
    for e in [0, 1] {
        p.observe(&Event::Dispatched {
            request: &r,
            endpoint: EndpointId(e),
            at: Nanos::ZERO,
            overlaps: &overlaps,
        });
    }
    p.observe(&Event::FirstToken {
        request: 7,
        endpoint: EndpointId(0),
        at: Nanos(1),
        ttft: Nanos(1),
    });
    p.observe(&Event::Failed {
        request: 7,
        endpoint: EndpointId(1),
        at: Nanos(1),
        kind: crate::decision::FailureKind::Cancelled,
    });
    let other = Request::from_tokens(8, (1000..1040).collect());
    for seed in 0..20 {
        let d = select(&mut p, None, &other, &fleet(3), Nanos(2), &mut rng(seed));
        assert_ne!(
            d.endpoint(),
            Some(EndpointId(0)),
            "the winner still decodes 10 blocks"
        );
    }
}
