//! `predicted_ttft` on the classic open-loop benchmarks, where none of the peers' failure modes is
//! in play: shared prefixes that every replica holds (`shared-prefix`, capacity ends at the batch
//! slots) and prompts that share nothing (`random`). The default rule must never fall below 0.95x
//! the best peer rule's capacity on any workload; these check that on one seed at the scenarios'
//! shapes, with fewer requests so a test build runs them in seconds; and on `shared-prefix` again
//! after a warm-up, as `kvgate bench --sweep` leaves the engines for its next rate.

use kvgate_sim::scenario::{run, Options};
use std::collections::BTreeMap;

const PEERS: [&str; 3] = ["cache_aware", "least_outstanding", "kv_cost"];

/// A warm-up of a minute at the sweep's first rate, as the bench's first rate leaves it.
const WARM: [(&str, &str); 2] = [("warmup_requests", "1500"), ("warmup_rate", "25")];

fn capacities(scenario: &str, rates: &str, extra: &[(&str, &str)]) -> BTreeMap<String, f64> {
    let mut policies = vec!["predicted_ttft".to_string()];
    policies.extend(PEERS.iter().map(|p| p.to_string()));
    let options = Options {
        policies,
        seed: 1,
        sets: [("requests", "2500"), ("rates", rates), ("oracle", "false")]
            .iter()
            .chain(extra)
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    };
    let report = run(scenario, &options).expect("scenario runs");
    let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
    json["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let name = r["policy"].as_str().unwrap().to_string();
            (name, r["capacity"].as_f64().unwrap_or(0.0))
        })
        .collect()
}

fn assert_within_5_percent_of_the_best_peer(scenario: &str, rates: &str, extra: &[(&str, &str)]) {
    let caps = capacities(scenario, rates, extra);
    let best = PEERS.iter().map(|p| caps[*p]).fold(0.0, f64::max);
    assert!(
        best > 0.0,
        "{scenario}: no peer met the SLO at any rate: {caps:?}"
    );
    assert!(
        caps["predicted_ttft"] >= 0.95 * best,
        "{scenario}: {caps:?}"
    );
}

#[test]
fn with_shared_prefixes_that_fit_everywhere_it_keeps_up_with_the_best_peer() {
    assert_within_5_percent_of_the_best_peer("shared-prefix", "25,30,35,37.5,40,45", &[]);
}

#[test]
fn with_shared_prefixes_on_warm_engines_it_keeps_up_with_the_best_peer() {
    assert_within_5_percent_of_the_best_peer("shared-prefix", "25,30,35,37.5,40,45", &WARM);
}

/// The warm-up carries the engines' caches and the router's state into the measured run:
/// `least_outstanding`, which recomputes every prompt on every replica from cold, is worth
/// several req/s more once they hold them all.
#[test]
fn a_warm_up_leaves_the_caches_warm_for_the_measured_run() {
    let rates = "25,30,35,37.5,40,45";
    let cold = capacities("shared-prefix", rates, &[]);
    let warm = capacities("shared-prefix", rates, &WARM);
    assert!(
        warm["least_outstanding"] > cold["least_outstanding"] + 2.0,
        "cold {cold:?}, warm {warm:?}"
    );
}

#[test]
fn with_prompts_that_share_nothing_it_keeps_up_with_the_best_peer() {
    assert_within_5_percent_of_the_best_peer("random", "15,20,22.5,25,27.5,30", &[]);
}

/// After a warm-up the figures describe the measured requests alone: each rate's requests per
/// replica add up to the measured count, the hit ratio is theirs (every prompt already cached
/// somewhere), and the replicas' whole-run counters, which no record can split, are null.
#[test]
fn a_warm_up_is_left_out_of_the_figures() {
    let report = |extra: &[(&str, &str)]| {
        let options = Options {
            policies: vec!["least_outstanding".into()],
            seed: 1,
            sets: [("requests", "400"), ("rates", "10"), ("oracle", "false")]
                .iter()
                .chain(extra)
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        let json = run("shared-prefix", &options).expect("runs").to_json();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        v["results"][0].clone()
    };
    let cold = report(&[]);
    let warm = report(&[("warmup_requests", "600"), ("warmup_rate", "10")]);
    let point = &warm["points"][0];
    let assigned: u64 = point["assigned"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert_eq!(assigned, 400);
    let hit = |r: &serde_json::Value| r["points"][0]["cache_hit_ratio"].as_f64().unwrap();
    assert!(hit(&warm) > hit(&cold), "{} vs {}", hit(&warm), hit(&cold));
    for key in ["prefill_tokens", "utilisation", "mean_load_skew", "reasons"] {
        assert!(warm[key].is_null(), "{key}: {}", warm[key]);
        assert!(!cold[key].is_null(), "{key}");
    }
}
