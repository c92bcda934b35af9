use super::*;
use crate::policy::calibration::Coefficients;
use proptest::prelude::*;

/// About the default cost model: 20 ms fixed, 8,000 prefill tokens/s, 0.15 ms per decode.
fn coefficients() -> Coefficients {
    Coefficients {
        fixed: 0.02,
        per_decode: 0.000_15,
        per_token: 1.0 / 8000.0,
        interference: 0.0,
    }
}

fn side(queued: f64, decodes: f64, cached: u32) -> Side {
    Side {
        coefficients: coefficients(),
        queued_tokens: queued,
        decodes,
        cached_tokens: cached,
    }
}

fn candidate(id: u32, queued: f64, cached: u32) -> Candidate {
    Candidate {
        endpoint: EndpointId(id),
        side: side(queued, 0.0, cached),
    }
}

fn decider(mode: Mode) -> Decider {
    Decider::new(Config {
        mode,
        ..Config::default()
    })
}

#[test]
fn never_and_no_candidate_stay_local() {
    let decode = side(0.0, 0.0, 0);
    let v = decider(Mode::Never).decide(10_000, &decode, &[candidate(1, 0.0, 0)]);
    assert_eq!((v.prefill, v.why), (Prefill::Local, Why::Never));
    for mode in [Mode::Always, Mode::Threshold, Mode::Conditional] {
        let v = decider(mode).decide(10_000, &decode, &[]);
        assert_eq!((v.prefill, v.why), (Prefill::Local, Why::NoPrefillEndpoint));
        assert_eq!(v.remote_secs, None);
    }
}

#[test]
fn always_goes_remote_even_for_a_cached_prompt() {
    let v = decider(Mode::Always).decide(100, &side(0.0, 0.0, 100), &[candidate(3, 0.0, 0)]);
    assert_eq!(v.prefill, Prefill::Remote(EndpointId(3)));
    assert_eq!(v.uncached_tokens, 0);
}

#[test]
fn threshold_counts_the_decode_endpoints_uncached_tokens() {
    let d = decider(Mode::Threshold);
    let c = [candidate(1, 0.0, 0)];
    // 5,000 tokens, 3,000 cached on the decode endpoint: 2,000 uncached < 2,048.
    let v = d.decide(5_000, &side(0.0, 0.0, 3_000), &c);
    assert_eq!(v.why, Why::BelowThreshold);
    let v = d.decide(5_000, &side(0.0, 0.0, 2_952), &c);
    assert_eq!(
        (v.prefill, v.why),
        (Prefill::Remote(EndpointId(1)), Why::AboveThreshold)
    );
    let busy = [candidate(1, 8_192.0, 0)];
    let v = d.decide(5_000, &side(0.0, 0.0, 0), &busy);
    assert_eq!(v.why, Why::PrefillBusy);
}

#[test]
fn conditional_keeps_short_prompts_and_sends_long_ones_beside_decodes() {
    let d = decider(Mode::Conditional);
    let c = [candidate(1, 0.0, 0)];
    // A short prompt: the remote leg pays its own fixed cost, the transfer and a decode step.
    let v = d.decide(200, &side(0.0, 8.0, 0), &c);
    assert_eq!(v.why, Why::LocalCheaper, "{v:?}");
    // A long prompt beside a busy decode batch: the stall tips it.
    let v = d.decide(16_000, &side(0.0, 32.0, 0), &c);
    assert_eq!(v.why, Why::RemoteCheaper, "{v:?}");
    // The same prompt mostly cached on the decode endpoint stays.
    let v = d.decide(16_000, &side(0.0, 32.0, 15_900), &c);
    assert_eq!(v.why, Why::LocalCheaper, "{v:?}");
}

#[test]
fn conditional_avoids_a_queued_prefill_pool() {
    let d = decider(Mode::Conditional);
    let decode = side(0.0, 32.0, 0);
    let v = d.decide(16_000, &decode, &[candidate(1, 200_000.0, 0)]);
    assert_eq!(v.why, Why::LocalCheaper, "{v:?}");
}

#[test]
fn a_slow_link_keeps_the_prefill_local() {
    let mut config = Config::default();
    config.transfer.bandwidth_gbps = 0.05;
    let v = Decider::new(config).decide(16_000, &side(0.0, 32.0, 0), &[candidate(1, 0.0, 0)]);
    assert_eq!(v.why, Why::LocalCheaper, "{v:?}");
}

#[test]
fn the_prefill_endpoint_is_chosen_by_cache_then_queue() {
    let d = decider(Mode::Always);
    let decode = side(0.0, 0.0, 0);
    let c = [
        candidate(1, 0.0, 0),
        candidate(2, 0.0, 6_000),
        candidate(3, 0.0, 0),
    ];
    assert_eq!(
        d.decide(8_000, &decode, &c).prefill,
        Prefill::Remote(EndpointId(2))
    );
    // Soonest ready when duplicated prefill is free: 3 (9,000 tokens of work against 2's
    // 11,000); charged once, 3's 6,000 tokens that 2 holds make it 2.
    let c = [
        candidate(1, 4_000.0, 0),
        candidate(2, 9_000.0, 6_000),
        candidate(3, 1_000.0, 0),
    ];
    let free = Decider::new(Config {
        mode: Mode::Always,
        duplicate_prefill_weight: 0.0,
        ..Config::default()
    });
    assert_eq!(
        free.decide(8_000, &decode, &c).prefill,
        Prefill::Remote(EndpointId(3))
    );
    assert_eq!(
        d.decide(8_000, &decode, &c).prefill,
        Prefill::Remote(EndpointId(2))
    );
    // Ties go to the lowest id, whatever the order.
    let c = [candidate(5, 0.0, 0), candidate(4, 0.0, 0)];
    assert_eq!(
        d.decide(8_000, &decode, &c).prefill,
        Prefill::Remote(EndpointId(4))
    );
}

#[test]
fn transfer_time_is_setup_plus_bytes_over_bandwidth() {
    let t = Transfer::default();
    // 10,000 tokens x 128 KiB = 1.31 GB at 40 GB/s = 32.8 ms, plus 1 ms.
    assert!((t.seconds(10_000) - (0.001 + 1.310_72 / 40.0)).abs() < 1e-12);
    assert_eq!(t.bytes(2), 262_144);
}

#[test]
fn invalid_settings_name_the_setting() {
    let mut c = Config::default();
    assert_eq!(c.validate(), Ok(()));
    c.transfer.bandwidth_gbps = 0.0;
    assert_eq!(c.validate().unwrap_err().field, "transfer.bandwidth_gbps");
    let c = Config {
        decode_stall_weight: f64::NAN,
        ..Config::default()
    };
    assert_eq!(c.validate().unwrap_err().field, "decode_stall_weight");
    let mut c = Config::default();
    c.transfer.bytes_per_token = 0;
    assert!(c
        .validate()
        .unwrap_err()
        .to_string()
        .contains("bytes_per_token"));
    let parsed: Result<Config, _> = serde_json::from_str(r#"{"mode":"sometimes"}"#);
    assert!(parsed.is_err());
    let parsed: Config = serde_json::from_str(r#"{"mode":"threshold"}"#).unwrap();
    assert_eq!(parsed.mode, Mode::Threshold);
}

proptest! {
    /// Conditional picks the cheaper of the two prices it reports, and the prefill endpoint
    /// it names is the cheapest candidate (soonest ready, plus the duplicated prefill).
    #[test]
    fn conditional_takes_the_lower_price(
        prompt in 1u32..40_000,
        cached in 0u32..40_000,
        queued in 0.0f64..50_000.0,
        decodes in 0.0f64..64.0,
        pool in proptest::collection::vec((0.0f64..50_000.0, 0u32..40_000), 1..5),
    ) {
        let decode = side(queued, decodes, cached.min(prompt));
        let candidates: Vec<_> = pool
            .iter()
            .enumerate()
            .map(|(i, &(q, c))| candidate(i as u32, q, c.min(prompt)))
            .collect();
        let v = decider(Mode::Conditional).decide(prompt, &decode, &candidates);
        let remote = v.remote_secs.unwrap();
        prop_assert!(v.local_secs.is_finite() && remote.is_finite());
        prop_assert_eq!(v.is_remote(), remote < v.local_secs);
        let always = decider(Mode::Always).decide(prompt, &decode, &candidates);
        if let Prefill::Remote(e) = always.prefill {
            let fewest = candidates.iter().map(|c| c.side.uncached(prompt)).min().unwrap();
            let cost = |s: &Side| {
                let duplicated = f64::from(s.uncached(prompt) - fewest);
                s.ttft(prompt) + duplicated * s.coefficients.seconds_per_token(s.decodes)
            };
            let mine = cost(&candidates[e.0 as usize].side);
            prop_assert!(candidates.iter().all(|c| mine <= cost(&c.side)));
        } else {
            prop_assert!(false, "always with candidates goes remote");
        }
    }

    /// More cached tokens on the decode endpoint never turn a local decision remote.
    #[test]
    fn caching_more_at_the_decode_endpoint_never_sends_it_away(
        prompt in 1u32..40_000,
        cached in 0u32..40_000,
        more in 0u32..40_000,
        decodes in 0.0f64..64.0,
    ) {
        let d = decider(Mode::Conditional);
        let c = [candidate(1, 0.0, 0)];
        let before = d.decide(prompt, &side(0.0, decodes, cached.min(prompt)), &c);
        let after = d.decide(prompt, &side(0.0, decodes, cached.saturating_add(more).min(prompt)), &c);
        prop_assert!(before.is_remote() || !after.is_remote());
    }
}

#[test]
fn a_remote_leg_queues_what_its_endpoint_computes() {
    let v = decider(Mode::Always).decide(
        9_000,
        &side(0.0, 0.0, 0),
        &[candidate(1, 0.0, 8_000), candidate(2, 0.0, 0)],
    );
    assert_eq!(v.prefill, Prefill::Remote(EndpointId(1)));
    assert_eq!(v.remote_uncached_tokens, Some(1_000));
    assert_eq!(v.remote_tokens(EndpointId(1), 9_000), 1_000);
    // A retry elsewhere was not priced: its whole prompt.
    assert_eq!(v.remote_tokens(EndpointId(2), 9_000), 9_000);
    let local = decider(Mode::Never).decide(9_000, &side(0.0, 0.0, 0), &[candidate(1, 0.0, 0)]);
    assert_eq!(local.remote_tokens(EndpointId(1), 9_000), 9_000);
}

#[test]
fn a_duplicate_prefill_is_charged_when_choosing_the_prefill_endpoint() {
    // Endpoint 1 holds 8,000 of the 9,000 tokens behind 10,000 queued; endpoint 2 holds
    // nothing and is idle: soonest ready is 2 (9,000 tokens against 11,000).
    let candidates = [candidate(1, 10_000.0, 8_000), candidate(2, 0.0, 0)];
    let pick = |weight| {
        Decider::new(Config {
            mode: Mode::Always,
            duplicate_prefill_weight: weight,
            ..Config::default()
        })
        .decide(9_000, &side(0.0, 0.0, 0), &candidates)
        .prefill
    };
    assert_eq!(pick(0.0), Prefill::Remote(EndpointId(2)));
    // Charged once, the 8,000 duplicated tokens outweigh the 2,000-token head start.
    assert_eq!(pick(1.0), Prefill::Remote(EndpointId(1)));
}

#[test]
fn a_negative_duplicate_weight_is_refused() {
    let config = Config {
        duplicate_prefill_weight: -1.0,
        ..Config::default()
    };
    assert_eq!(
        config.validate().unwrap_err().field,
        "duplicate_prefill_weight"
    );
}
