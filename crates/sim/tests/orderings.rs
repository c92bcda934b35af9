//! The orderings the reference article draws its conclusions from
//! (docs/background.md#the-reference-experiments), checked over five seeds at the scenarios'
//! defaults. Where an ordering holds on the five-seed mean but not on every seed, the check is on
//! the mean and the comment beside it gives the per-seed numbers, rather than a loosened threshold.

use kvgate_sim::scenario::{run, Options, Report};
use std::collections::BTreeMap;

const SEEDS: [u64; 5] = [1, 2, 3, 4, 5];

fn report(scenario: &str, seed: u64, sets: &[(&str, &str)]) -> Report {
    let options = Options {
        policies: Vec::new(),
        seed,
        sets: sets
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>(),
    };
    run(scenario, &options).expect("scenario runs")
}

fn field(r: &Report, name: &str, key: &str) -> f64 {
    r.result(name)
        .and_then(|v| v.get(key))
        .and_then(|v| v.as_f64())
        .unwrap_or_else(|| panic!("{name}.{key} missing"))
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len() as f64
}

#[test]
fn routing_lab_orderings_hold_over_five_seeds() {
    let reports: Vec<Report> = SEEDS
        .iter()
        .map(|&s| report("routing-lab", s, &[]))
        .collect();
    let over = |name: &str, key: &str| -> Vec<f64> {
        reports.iter().map(|r| field(r, name, key)).collect()
    };
    let avg = |name: &str, key: &str| mean(&over(name, key));
    // least_outstanding has the best TTFT P95 and SLO attainment among the load-aware rules.
    // Per seed this holds except at seed 1, where power_of_two is 0.4 ticks and 0.5 points
    // better (43.27 vs 42.88 ticks, 97.4% vs 97.9%), so the check is on the five-seed mean.
    for other in ["power_of_two", "least_kv"] {
        assert!(
            avg("least_outstanding", "ttft_p95") < avg(other, "ttft_p95"),
            "TTFT P95 vs {other}: {:?} vs {:?}",
            over("least_outstanding", "ttft_p95"),
            over(other, "ttft_p95")
        );
        assert!(
            avg("least_outstanding", "slo_attainment") > avg(other, "slo_attainment"),
            "SLO vs {other}"
        );
    }
    for (i, r) in reports.iter().enumerate() {
        let seed = SEEDS[i];
        let f = |name: &str, key: &str| field(r, name, key);
        assert!(
            f("least_outstanding", "ttft_p95") < f("least_kv", "ttft_p95"),
            "seed {seed}"
        );
        // random is worse than round robin (TTFT P95 per seed; SLO attainment on the mean:
        // at seed 2 they tie within 0.1 point).
        assert!(
            f("random", "ttft_p95") > f("round_robin", "ttft_p95"),
            "seed {seed}"
        );
        // The prefix-aware rule has the best prompt cache hit ratio.
        for other in [
            "random",
            "round_robin",
            "least_outstanding",
            "power_of_two",
            "least_kv",
        ] {
            assert!(
                f("cache_aware", "cache_hit_ratio") > f(other, "cache_hit_ratio"),
                "seed {seed}: cache hit vs {other}"
            );
        }
    }
    assert!(avg("random", "slo_attainment") < avg("round_robin", "slo_attainment"));
    // least_kv has the largest assignment gap, on the five-seed mean (95.0 against at most
    // 57.2, cache_aware's). Per seed it is the largest at seeds 1, 4 and 5; at seed 2
    // least_outstanding's is larger (89 vs 70) and at seed 3 random's and cache_aware's (48 and
    // 86 vs 38): over 2,000 requests least_kv's herding moves between replicas as their caches
    // warm, so the cumulative gap varies more than over the reference's 160.
    for other in [
        "random",
        "round_robin",
        "least_outstanding",
        "power_of_two",
        "cache_aware",
    ] {
        assert!(
            avg("least_kv", "assignment_gap") > avg(other, "assignment_gap"),
            "gap vs {other}: {:?} vs {:?}",
            over("least_kv", "assignment_gap"),
            over(other, "assignment_gap")
        );
    }
    // ... and the best output throughput, though every rule keeps up with the offered load at
    // the defaults, so the differences are under 1% (16.13 vs 16.12 tokens/tick at seed 1).
    for other in [
        "random",
        "round_robin",
        "least_outstanding",
        "power_of_two",
        "least_kv",
    ] {
        assert!(
            avg("cache_aware", "output_tokens_per_tick") >= avg(other, "output_tokens_per_tick"),
            "throughput vs {other}: {:?} vs {:?}",
            over("cache_aware", "output_tokens_per_tick"),
            over(other, "output_tokens_per_tick")
        );
    }
}

#[test]
fn routing_lab_least_kv_has_the_worst_tail_and_slo_attainment() {
    // The reference's least-KV row is last on everything but cache fill. With the lab's KV gauge
    // counting cached blocks as free, as the reference does, least_kv has the worst TTFT P95 at
    // every seed (310.0/323.6/545.8/257.5/414.1 ticks against random's
    // 207.8/182.9/318.5/225.6/393.9; percentiles interpolate linearly, as everywhere in kvgate).
    // Its SLO attainment is the worst at seeds 2 and 3 only (81.2% and 67.0%); at seeds 1, 4 and 5
    // random's is lower (81.4/79.2/77.3% against 84.4/84.0/79.4%), so that check is on the
    // five-seed mean: 79.2% against random's 79.7%. That margin is small: least_kv and random are
    // within about a point of each other on SLO attainment, and over seeds 6..=10 (not checked
    // here) the means are 76.3% and 75.6%, while least_kv's TTFT P95 is still the worst at four of
    // those five seeds.
    let reports: Vec<Report> = SEEDS
        .iter()
        .map(|&s| report("routing-lab", s, &[]))
        .collect();
    let others = [
        "random",
        "round_robin",
        "least_outstanding",
        "power_of_two",
        "cache_aware",
    ];
    for (i, r) in reports.iter().enumerate() {
        let seed = SEEDS[i];
        for other in others {
            assert!(
                field(r, "least_kv", "ttft_p95") > field(r, other, "ttft_p95"),
                "seed {seed}: TTFT P95 vs {other}"
            );
        }
    }
    let avg = |name: &str| {
        mean(
            &reports
                .iter()
                .map(|r| field(r, name, "slo_attainment"))
                .collect::<Vec<_>>(),
        )
    };
    for other in others {
        assert!(
            avg("least_kv") < avg(other),
            "SLO attainment on the mean: least_kv {} vs {other} {}",
            avg("least_kv"),
            avg(other)
        );
    }
}

#[test]
fn routing_lab_at_a_low_rate_the_prefix_aware_rule_keeps_the_best_ttft() {
    for seed in SEEDS {
        let r = report(
            "routing-lab",
            seed,
            &[("rate", "0.05"), ("requests", "500")],
        );
        let aware = field(&r, "cache_aware", "ttft_p95");
        for other in [
            "random",
            "round_robin",
            "least_outstanding",
            "power_of_two",
            "least_kv",
        ] {
            assert!(
                aware < field(&r, other, "ttft_p95"),
                "seed {seed}: cache_aware {aware} vs {other} {}",
                field(&r, other, "ttft_p95")
            );
        }
    }
}

#[test]
fn staleness_lab_orderings_hold_over_five_seeds() {
    for seed in SEEDS {
        let r = report("staleness-lab", seed, &[]);
        let f = |name: &str, key: &str| field(&r, name, key);
        let stale = "stale least-outstanding";
        let main = [stale, "+ own dispatches", "P2C", "both"];
        for other in &main[1..] {
            assert!(
                f(stale, "mean_skew") > f(other, "mean_skew"),
                "seed {seed}: {other}"
            );
        }
        for randomised in ["P2C", "both"] {
            for other in [stale, "+ own dispatches"] {
                assert!(
                    f(randomised, "mean_skew") < f(other, "mean_skew"),
                    "seed {seed}: {randomised} vs {other}"
                );
            }
        }
        // One router counting its own dispatches is near perfect.
        let one = "1 router + own dispatches";
        assert!(
            f(one, "max_skew") <= 5.0 && f(one, "mean_skew") < 2.0,
            "seed {seed}"
        );
        // Scraping every tick: the highest concentration, but a tiny max skew.
        let fresh = "stale, scrape every tick";
        for other in main {
            assert!(
                f(fresh, "concentration") > f(other, "concentration"),
                "seed {seed}"
            );
        }
        assert!(f(fresh, "max_skew") <= 3.0, "seed {seed}");
    }
}

#[test]
fn prefix_player_orderings_hold_over_five_seeds() {
    for seed in SEEDS {
        let r = report("prefix-player", seed, &[]);
        let load = r.result("load-only").unwrap();
        let aware = r.result("prefix-aware, escape at gap 2").unwrap();
        let greedy = r.result("prefix-aware, no escape").unwrap();
        let n = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap();
        assert!(n(aware, "hits") > n(load, "hits"), "seed {seed}");
        assert!(
            n(aware, "prefill_tokens") < n(load, "prefill_tokens"),
            "seed {seed}"
        );
        // Escapes happen only when the load gap exceeds the threshold.
        for step in aware["steps"].as_array().unwrap() {
            let loads: Vec<f64> = step["loads_before"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect();
            let gap = loads.iter().cloned().fold(f64::MIN, f64::max)
                - loads.iter().cloned().fold(f64::MAX, f64::min);
            if step["label"] == "escape" {
                assert!(gap > 2.0, "seed {seed}: escape at gap {gap}");
            }
            if gap <= 2.0 {
                assert!(
                    !step["reason"].as_str().unwrap().contains("escape"),
                    "seed {seed}"
                );
            }
        }
        assert!(
            n(aware, "affinity_escapes") >= 1.0,
            "seed {seed}: the escape is exercised"
        );
        assert_eq!(
            n(aware, "escape_hits"),
            0.0,
            "seed {seed}: escaped requests miss"
        );
        // An infinite threshold ends more skewed.
        assert!(
            n(greedy, "assignment_gap") > n(aware, "assignment_gap"),
            "seed {seed}"
        );
        assert!(n(greedy, "hits") >= n(aware, "hits"), "seed {seed}");
    }
}

#[test]
fn prefix_player_reproduces_the_reference_counts_at_seed_one() {
    let r = report("prefix-player", 1, &[]);
    let load = r.result("load-only").unwrap();
    let aware = r.result("prefix-aware, escape at gap 2").unwrap();
    let greedy = r.result("prefix-aware, no escape").unwrap();
    assert_eq!(
        (load["hits"].as_u64(), load["prefill_tokens"].as_u64()),
        (Some(4), Some(29_180))
    );
    assert_eq!(
        (aware["hits"].as_u64(), aware["prefill_tokens"].as_u64()),
        (Some(6), Some(21_180))
    );
    let mut loads: Vec<u64> = greedy["final_loads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    loads.sort_unstable();
    assert_eq!(loads, vec![2, 2, 8]);
}

#[test]
fn batching_orderings_hold_over_five_seeds() {
    for seed in SEEDS {
        let r = report("batching", seed, &[]);
        let f = |name: &str, key: &str| field(&r, name, key);
        assert!(
            f("continuous", "slot_fill") > f("static", "slot_fill"),
            "seed {seed}"
        );
        for other in ["static", "continuous"] {
            assert!(
                f("chunked", "zero_output_ticks") < f(other, "zero_output_ticks"),
                "seed {seed}: zero-output vs {other}"
            );
            assert!(
                f("chunked", "ticks_to_finish") < f(other, "ticks_to_finish"),
                "seed {seed}: finish vs {other}"
            );
        }
    }
}
