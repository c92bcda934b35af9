use super::*;
use std::collections::BTreeMap;

fn endpoint(name: &str, speed: f64, weight: f64, tier: u32) -> Endpoint {
    Endpoint {
        name: name.into(),
        speed,
        weight,
        tier,
    }
}

/// Two replicas behind `policy`, the gateway's default scrape period and admission limits.
fn deployment(policy: PolicyConfig) -> Deployment {
    Deployment {
        endpoints: vec![endpoint("a", 1.0, 1.0, 0), endpoint("b", 1.0, 1.0, 0)],
        policy,
        scrape_interval: Nanos::from_millis(500),
        admission: Some(AdmissionLimits {
            max_concurrency: 4096,
            max_queue: 4096,
            queue_timeout: Nanos::from_secs(30),
        }),
        kv_events: false,
        dispatch: Default::default(),
        notes: vec!["a note from the caller".into()],
    }
}

fn cache_aware(balance_abs_threshold: f64) -> PolicyConfig {
    match PolicyConfig::default_for("cache_aware").unwrap() {
        PolicyConfig::CacheAware(mut c) => {
            c.balance_abs_threshold = balance_abs_threshold;
            PolicyConfig::CacheAware(c)
        }
        other => panic!("{other:?}"),
    }
}

fn options(policies: &[&str], sets: &[(&str, &str)]) -> Options {
    Options {
        policies: policies.iter().map(|s| s.to_string()).collect(),
        seed: 1,
        sets: sets
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

/// A short run: 300 requests at two session rates.
const SHORT: [(&str, &str); 2] = [("requests", "300"), ("rates", "0.25,0.5")];

fn rows_of(report: &Report) -> Vec<(String, String, bool)> {
    report
        .results
        .iter()
        .map(|r| {
            assert!(r.get("capacity").is_some(), "{r}");
            (
                r["row"].as_str().unwrap().to_string(),
                r["policy"].as_str().unwrap().to_string(),
                r["configured"].as_bool().unwrap(),
            )
        })
        .collect()
}

#[test]
fn the_configured_policy_comes_first_then_the_compared_ones_then_the_oracle() {
    let d = deployment(cache_aware(8.0));
    let report = run(&d, "agentic", &options(&[], &SHORT)).unwrap();
    let rows = rows_of(&report);
    let s = |x: &str| x.to_string();
    assert_eq!(
        rows[0],
        (s("cache_aware (configured)"), s("cache_aware"), true)
    );
    let rest: Vec<&str> = rows[1..].iter().map(|r| r.0.as_str()).collect();
    assert_eq!(
        rest,
        [
            "predicted_ttft",
            "cache_aware",
            "prefix_hash",
            "consistent_hash",
            "least_outstanding",
            "round_robin",
            "oracle (perfect information)"
        ]
    );
    assert_eq!(rows.last().unwrap().1, "oracle");
    assert!(rows[1..].iter().all(|r| !r.2));
    assert_eq!(report.scenario, "configured");
    assert_eq!(report.params["workload"], "agentic");
    assert_eq!(report.params["requests"], 300);
    assert_eq!(report.params["rates"], serde_json::json!([0.25, 0.5]));
    let echoed = &report.params["deployment"];
    assert_eq!(echoed["endpoints"][1]["name"], "b");
    assert_eq!(echoed["policy"]["balance_abs_threshold"], 8.0);
    assert_eq!(echoed["admission"]["max_concurrency"], 4096);
    assert!(report.notes.iter().any(|n| n == "a note from the caller"));
    assert!(report.table.contains("cache_aware (configured)"));
    assert!(report.table.starts_with("fleet: a (speed 1, weight 1), b"));
}

#[test]
fn a_compared_policy_equal_to_the_configured_one_is_one_row() {
    let d = deployment(PolicyConfig::default_for("cache_aware").unwrap());
    let sets = [SHORT[0], SHORT[1], ("oracle", "false")];
    let report = run(
        &d,
        "agentic",
        &options(&["cache_aware", "round_robin"], &sets),
    )
    .unwrap();
    let rows: Vec<String> = rows_of(&report).into_iter().map(|r| r.0).collect();
    assert_eq!(rows, ["cache_aware (configured)", "round_robin"]);
    assert!(report
        .notes
        .iter()
        .any(|n| n.starts_with("cache_aware at its defaults is the configured policy")));
}

#[test]
fn policy_settings_change_the_configured_row_too() {
    let d = deployment(cache_aware(8.0));
    let sets: BTreeMap<String, String> =
        [("cache_aware.balance_rel_threshold".into(), "3".into())].into();
    let mut p = Params::new(&sets);
    let (rows, same) = rows(&d, &options(&["cache_aware"], &[]), &mut p).unwrap();
    assert_eq!(same, None);
    let rel = |c: &Option<PolicyConfig>| match c {
        Some(PolicyConfig::CacheAware(c)) => (c.balance_abs_threshold, c.balance_rel_threshold),
        other => panic!("{other:?}"),
    };
    let default_abs = match PolicyConfig::default_for("cache_aware").unwrap() {
        PolicyConfig::CacheAware(c) => c.balance_abs_threshold,
        _ => unreachable!(),
    };
    assert_eq!(
        rel(&rows[0].config),
        (8.0, 3.0),
        "configured, then the setting"
    );
    assert_eq!(
        rel(&rows[1].config),
        (default_abs, 3.0),
        "defaults, then the setting"
    );
    assert!(rows[2].config.is_none() && rows[2].policy == "oracle");
}

#[test]
fn each_endpoint_is_a_replica_with_its_speed_weight_and_tier_and_the_gate_is_the_configs() {
    let mut d = deployment(cache_aware(8.0));
    d.endpoints = vec![endpoint("fast", 2.0, 1.0, 0), endpoint("slow", 0.5, 3.0, 1)];
    d.scrape_interval = Nanos::from_millis(200);
    let sets = BTreeMap::new();
    let f = fleet(&d, &mut Params::new(&sets)).unwrap();
    let got: Vec<(f64, Option<f64>, u32)> = f
        .replicas
        .iter()
        .map(|r| (r.speed, r.weight, r.tier))
        .collect();
    assert_eq!(got, [(2.0, Some(1.0), 0), (0.5, Some(3.0), 1)]);
    assert_eq!(f.replicas[0].engine, EngineConfig::default());
    assert_eq!(f.scrape_interval, Nanos::from_millis(200));
    assert_eq!(f.admission, d.admission);
    assert_eq!(f.routers, 1);
}

#[test]
fn the_default_rates_scale_with_the_fleets_speed() {
    let mut d = deployment(cache_aware(8.0));
    d.endpoints = vec![endpoint("a", 2.0, 1.0, 0), endpoint("b", 2.0, 1.0, 0)];
    let sets = [("requests", "60"), ("oracle", "false")];
    let report = run(&d, "random", &options(&["round_robin"], &sets)).unwrap();
    let per_speed = rates_per_speed("random");
    let expected: Vec<f64> = per_speed.iter().map(|r| r * 4.0).collect();
    assert_eq!(report.params["rates"], serde_json::json!(expected));
}

#[test]
fn a_gate_that_refuses_what_it_cannot_send_at_once_costs_capacity() {
    let sets = [SHORT[0], SHORT[1], ("oracle", "false")];
    let opts = options(&["least_outstanding"], &sets);
    let open = deployment(PolicyConfig::default_for("least_outstanding").unwrap());
    let mut tight = open.clone();
    tight.admission = Some(AdmissionLimits {
        max_concurrency: 1,
        max_queue: 0,
        queue_timeout: Nanos::from_secs(30),
    });
    let row = |d: &Deployment| run(d, "agentic", &opts).unwrap().results[0].clone();
    let (open, tight) = (row(&open), row(&tight));
    assert!(open["capacity"].is_number(), "{}", open["capacity"]);
    assert!(tight["capacity"].is_null(), "{}", tight["capacity"]);
    for p in open["points"].as_array().unwrap() {
        assert_eq!(p["admission_waited"], 0, "{p}");
        assert_eq!(p["admission_refused"], 0, "{p}");
    }
    let refused = tight["points"][0]["admission_refused"].as_u64().unwrap();
    assert!(refused > 0);
    assert_eq!(
        tight["points"][0]["admission_waited"], 0,
        "no queue to wait in"
    );
}

#[test]
fn what_cannot_run_says_why() {
    let mut d = deployment(cache_aware(8.0));
    let opts = options(&[], &[]);
    assert!(matches!(
        run(&d, "nonsense", &opts),
        Err(Error::UnknownWorkload(_))
    ));
    let bad = options(&[], &[("rat", "1")]);
    assert!(matches!(
        run(&d, "agentic", &bad),
        Err(Error::UnknownSetting { .. })
    ));
    d.endpoints.clear();
    assert!(matches!(
        run(&d, "agentic", &opts),
        Err(Error::Deployment(_))
    ));
}

#[test]
fn a_second_tier_takes_requests_only_past_the_configured_spillover() {
    let mut d = deployment(PolicyConfig::default_for("least_outstanding").unwrap());
    d.endpoints[1].tier = 1;
    let sets = [SHORT[0], ("rates", "0.5"), ("oracle", "false")];
    let opts = options(&["least_outstanding"], &sets);
    let assigned = |d: &Deployment| {
        let report = run(d, "agentic", &opts).unwrap();
        report.results[0]["points"][0]["assigned"].clone()
    };
    let kept = assigned(&d);
    assert_eq!(kept[1], 0, "{kept}");
    d.dispatch.spillover.queue = Some(1);
    let spilled = assigned(&d);
    assert!(spilled[1].as_u64().unwrap() > 0, "{spilled}");
}
