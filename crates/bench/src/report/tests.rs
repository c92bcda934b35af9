use super::*;

fn rec(ttft: f64, e2e: f64, out: u64, sent: f64) -> Record {
    Record {
        ttft_ms: Some(ttft),
        e2e_ms: e2e,
        output_tokens: out,
        sent_s: sent,
        prompt_tokens: 100,
        cached_tokens: Some(25),
        ..Record::default()
    }
}

#[test]
fn slo_goodput_and_cache_ratio() {
    let slo = Slo {
        ttft_ms: Some(50.0),
        tpot_ms: Some(10.0),
    };
    let records = vec![
        rec(10.0, 100.0, 10, 0.0), // tpot 10: good
        rec(60.0, 100.0, 10, 1.0), // ttft too slow
        rec(10.0, 200.0, 10, 2.0), // tpot 21
        rec(10.0, 10.0, 1, 3.0),   // single token: tpot undefined, good
        Record {
            error: Some(ErrorKind::Http5xx),
            sent_s: 3.9,
            ..Record::default()
        },
    ];
    let r = TargetReport::new("a", Some(1.0), &records, &slo);
    assert_eq!((r.requests, r.completed, r.failed), (5, 4, 1));
    assert_eq!(r.slo_attainment, Some(2.0 / 5.0));
    assert!((r.duration_s - 3.9).abs() < 1e-9);
    assert!((r.goodput.unwrap() - 2.0 / 3.9).abs() < 1e-9);
    assert!((r.send_rate - 4.0 / 3.9).abs() < 1e-9);
    assert_eq!(r.cache_hit_ratio, Some(0.25));
    assert_eq!(r.errors["http_5xx"], 1);
    assert_eq!(r.errors["connect"], 0);
    assert_eq!(r.tpot_ms.count, 3);
    let json = serde_json::to_value(&r).unwrap();
    for key in ["ttft_ms", "tpot_ms", "e2e_ms", "send_lag_ms"] {
        for p in ["p50", "p90", "p95", "p99", "max"] {
            assert!(json[key][p].is_number(), "{key}.{p}");
        }
    }
    let capacity = Capacity {
        target: "http://a".into(),
        rate: Some(1.5),
        min_attainment: 0.95,
        lowest_rate_tried: Some(0.5),
        highest_rate_tried: Some(2.0),
        saturated: false,
        missed_below: Vec::new(),
    };
    let text = table(
        std::slice::from_ref(&r),
        std::slice::from_ref(&capacity),
        &slo,
        "bursts/s",
    );
    assert!(text.contains("http_5xx=1"), "{text}");
    assert!(
        text.contains("capacity of http://a: 1.5 bursts/s (SLO attainment >= 95%)"),
        "{text}"
    );
    let cold = Capacity {
        missed_below: vec![0.5, 1.0],
        ..capacity
    };
    let text = table(&[r], &[cold], &slo, "bursts/s");
    assert!(
        text.contains(
            "capacity of http://a: 1.5 bursts/s (SLO attainment >= 95%; missed at 0.5, 1 bursts/s below it)"
        ),
        "{text}"
    );
}

#[test]
fn send_gap_cv_measures_the_shape_of_the_sends() {
    // Evenly spaced sends (in any order): no variation.
    assert!(gap_cv(vec![0.3, 0.0, 0.2, 0.1]).unwrap() < 1e-12);
    // Gaps 1 and 3: mean 2, population sd 1.
    assert!((gap_cv(vec![0.0, 1.0, 4.0]).unwrap() - 0.5).abs() < 1e-12);
    assert_eq!(gap_cv(vec![0.0, 1.0]), None);
    assert_eq!(gap_cv(vec![1.0, 1.0, 1.0]), None);
    // Exponential gaps (Poisson sends) have CV 1, gamma(B) gaps 1/sqrt(B).
    use crate::arrivals::{Arrivals, Config, Ramp};
    for (burstiness, want) in [(1.0, 1.0), (4.0, 0.5), (0.25, 2.0)] {
        let cfg = Config {
            rate: 100.0,
            burstiness,
            ramp: Ramp::Constant,
        };
        let times: Vec<f64> = Arrivals::new(cfg, 11).take(20_000).collect();
        let records: Vec<Record> = times
            .iter()
            .map(|&t| Record {
                sent_s: t,
                ..Record::default()
            })
            .collect();
        let cv = TargetReport::new("a", Some(100.0), &records, &Slo::default())
            .send_gap_cv
            .unwrap();
        assert!((cv - want).abs() < 0.06 * want, "B={burstiness}: cv {cv}");
    }
}
