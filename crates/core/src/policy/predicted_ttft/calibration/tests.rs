use super::*;

fn prior() -> Coefficients {
    Coefficients {
        fixed: 0.02,
        per_decode: 0.0,
        per_token: 1.0 / 10_000.0,
        interference: 0.0,
    }
}

#[test]
fn learns_two_speeds_and_a_new_endpoint_starts_from_the_fleet() {
    let mut c = Calibration::new(prior(), Nanos::from_secs(60), 1.0);
    let truth = |e: u32, work: f64, decodes: f64| {
        let per_token = if e == 0 { 1.0 / 8_000.0 } else { 1.0 / 3_000.0 };
        0.015 + 0.001 * decodes + work * (per_token + 2e-7 * decodes)
    };
    for k in 0..400u64 {
        let now = Nanos::from_millis(k * 50);
        for e in [0, 1] {
            let work = 200.0 + ((k * 7919 + u64::from(e) * 13) % 5_000) as f64;
            let decodes = ((k * 31) % 40) as f64;
            c.observe(e, now, work, decodes, truth(e, work, decodes));
        }
    }
    let now = Nanos::from_secs(20);
    for e in [0, 1] {
        let got = c.coefficients(e, now);
        for (work, decodes) in [(500.0, 0.0), (4_000.0, 30.0)] {
            let want = truth(e, work, decodes);
            let pred = got.predict(work, decodes);
            assert!(
                (pred / want - 1.0).abs() < 0.05,
                "endpoint {e} at {work}/{decodes}: {pred} vs {want}"
            );
        }
    }
    let newcomer = c.coefficients(7, now).per_token;
    let (f0, f1) = (c.factor(0, now), c.factor(1, now));
    assert!(
        (c.factor(7, now) - (f0 * f1).sqrt()).abs() < 1e-9,
        "the geometric mean of {f0} and {f1}"
    );
    assert!(
        newcomer > 1.0 / 8_000.0 && newcomer < 1.0 / 3_000.0,
        "a new endpoint starts between the two: {newcomer}"
    );
}

#[test]
fn converges_from_a_prior_four_times_too_fast() {
    // Two equal engines (a CPU vLLM's speed) behind a prior set for a GPU, one taking two
    // thirds of the requests. With a unit ridge the fit kept the prior's shape (36% over
    // at 50 tokens), and without the recentring the factors carried the level (1.5-1.8).
    let mut c = Calibration::new(prior(), Nanos::from_secs(60), 20.0);
    let truth = |work: f64, decodes: f64| 0.04 + 0.003 * decodes + work / 2_500.0;
    for k in 0..200u64 {
        let now = Nanos::from_millis(k * 400);
        let e = u32::from(k % 3 == 0);
        let work = 30.0 + ((k * 7919) % 270) as f64;
        let decodes = ((k * 13) % 6) as f64;
        c.observe(e, now, work, decodes, truth(work, decodes));
    }
    let now = Nanos::from_secs(80);
    for (e, decodes) in [(0, 0.0), (0, 5.0), (1, 0.0), (1, 5.0)] {
        let got = c.coefficients(e, now);
        for work in [50.0, 250.0] {
            let (pred, want) = (got.predict(work, decodes), truth(work, decodes));
            assert!(
                (pred / want - 1.0).abs() < 0.15,
                "endpoint {e} at {work}/{decodes}: {pred} vs {want}"
            );
        }
    }
    let (f0, f1) = (c.factor(0, now), c.factor(1, now));
    assert!((f0 / f1 - 1.0).abs() < 0.2, "factors {f0} and {f1}");
    assert!(
        (f0.ln() + f1.ln()).abs() < 0.2,
        "factors {f0} and {f1} centred on the fleet"
    );
}

#[test]
fn short_first_tokens_are_not_priced_by_the_spread_of_long_ones() {
    // A cached request waits one short iteration; a long prefill also waits out the
    // iteration in progress, anywhere from none to a full 260 ms chunk.
    let mut c = Calibration::new(prior(), Nanos::from_secs(60), 1.0);
    for k in 0..600u64 {
        let now = Nanos::from_millis(k * 50);
        let phase = ((k * 7919) % 1_000) as f64 / 1_000.0;
        let (work, ttft) = if k % 2 == 0 {
            (20.0, 0.03 * (0.95 + 0.1 * phase))
        } else {
            let work = 1_000.0 + ((k * 131) % 3_000) as f64;
            (work, 0.03 + work / 8_000.0 + 0.26 * phase)
        };
        c.observe(0, now, work, 0.0, ttft);
    }
    let short = c.coefficients(0, Nanos::from_secs(30)).predict(20.0, 0.0);
    assert!(
        (short / 0.03 - 1.0).abs() < 0.2,
        "a cached request predicted at {short} s, measured about 0.03 s"
    );
}

#[test]
fn an_outlier_is_clipped_and_old_samples_fade() {
    let mut c = Calibration::new(prior(), Nanos::from_secs(10), 1.0);
    for k in 0..100u64 {
        let work = 1_000.0 + (k % 10) as f64 * 300.0;
        c.observe(
            0,
            Nanos::from_millis(k * 10),
            work,
            0.0,
            0.02 + work / 5_000.0,
        );
    }
    let before = c.coefficients(0, Nanos::from_secs(1)).per_token;
    c.observe(0, Nanos::from_secs(1), 1_000.0, 0.0, 60.0);
    let after = c.coefficients(0, Nanos::from_secs(1)).per_token;
    assert!((after / before - 1.0).abs() < 0.05, "{before} -> {after}");
    assert!(c.samples(0, Nanos::from_secs(1)) > 50.0);
    assert!(c.samples(0, Nanos::from_secs(100)) < 0.01);
}
