//! Rate sweeps: the list of offered rates and each target's capacity.
//!
//! Capacity is kvgate's one definition ([`kvgate_core::stats::capacity`];
//! docs/background.md#open-loop-evaluation-and-capacity): the largest swept rate at which a
//! target's SLO attainment reached the threshold (`--capacity-attainment`, default 0.9). It is the
//! largest such rate, not the first failing one, so one noisy step below the knee does not hide a
//! higher passing rate; the rates below it that missed are listed beside it, since a cold start
//! on the sweep's first rate is one of them. When no rate passed it is null beside the lowest
//! rate tried, never 0.

use crate::error::BenchError;
use crate::report::{Capacity, TargetReport};

/// Parses `A:B:STEP` into `A, A + STEP, ...` up to `B` inclusive (within rounding).
pub fn parse(spec: &str) -> Result<Vec<f64>, BenchError> {
    let bad = || {
        BenchError::Config(format!(
            "--sweep expects A:B:STEP with 0 < A <= B, STEP > 0, got {spec:?}"
        ))
    };
    let parts: Vec<f64> = spec
        .split(':')
        .map(|p| p.trim().parse::<f64>().map_err(|_| bad()))
        .collect::<Result<_, _>>()?;
    let [a, b, step] = parts[..] else {
        return Err(bad());
    };
    if !(a > 0.0 && b >= a && step > 0.0 && b.is_finite()) {
        return Err(bad());
    }
    let n = ((b - a) / step + 1e-9).floor() as usize;
    if n > 10_000 {
        return Err(bad());
    }
    Ok((0..=n).map(|i| a + step * i as f64).collect())
}

/// The capacity of every target named in `results` (first-appearance order).
pub fn capacity(results: &[TargetReport], min_attainment: f64) -> Vec<Capacity> {
    let mut targets: Vec<&str> = Vec::new();
    for r in results {
        if !targets.contains(&r.target.as_str()) {
            targets.push(&r.target);
        }
    }
    targets
        .into_iter()
        .map(|target| {
            let c = kvgate_core::stats::capacity(
                results
                    .iter()
                    .filter(|r| r.target == target)
                    .filter_map(|r| Some((r.offered_rate?, r.attainment.meets(min_attainment)))),
            );
            Capacity {
                target: target.to_owned(),
                rate: c.capacity,
                min_attainment,
                lowest_rate_tried: c.lowest_rate_tried,
                highest_rate_tried: c.highest_rate_tried,
                saturated: c.saturated,
                missed_below: c.missed_below,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Slo;
    use kvgate_core::stats::Attainment;

    /// A report whose attainment is `att` (over 100 requests).
    fn at(target: &str, rate: f64, att: f64) -> TargetReport {
        let mut r = TargetReport::new(target, Some(rate), &[], &Slo::default());
        r.attainment = Attainment {
            met: (att * 100.0).round() as u64,
            issued: 100,
        };
        r
    }

    #[test]
    fn parses_inclusive_ranges() {
        assert_eq!(parse("1:3:1").unwrap(), vec![1.0, 2.0, 3.0]);
        assert_eq!(parse("0.5:1.5:0.5").unwrap(), vec![0.5, 1.0, 1.5]);
        assert_eq!(parse("2:3:5").unwrap(), vec![2.0]);
        for bad in ["1:2", "3:1:1", "1:2:0", "a:b:c", "0:1:1"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn capacity_is_largest_passing_rate() {
        let mk = at;
        let results = vec![
            mk("a", 1.0, 1.0),
            mk("b", 1.0, 0.5),
            mk("a", 2.0, 0.95),
            mk("b", 2.0, 0.1),
            mk("a", 3.0, 0.2),
        ];
        let c = capacity(&results, 0.9);
        assert_eq!(c[0].rate, Some(2.0));
        assert!(c[0].missed_below.is_empty());
        assert_eq!(c[1].target, "b");
        assert_eq!(c[1].rate, None);
        assert_eq!(c[1].lowest_rate_tried, Some(1.0));
        assert!(c[1].missed_below.is_empty());
        let json = serde_json::to_value(&c[1]).unwrap();
        assert!(
            json["rate"].is_null(),
            "never reached is null, not 0: {json}"
        );
        assert_eq!(json["lowest_rate_tried"], 1.0);
    }

    #[test]
    fn misses_below_the_capacity_are_listed() {
        let mk = |rate: f64, att: f64| at("a", rate, att);
        // A cold start missing the first rate, then passing up to 35, then the knee.
        let results = vec![
            mk(25.0, 0.76),
            mk(30.0, 1.0),
            mk(32.0, 0.93),
            mk(35.0, 1.0),
            mk(40.0, 0.34),
        ];
        let c = capacity(&results, 0.95);
        assert_eq!(c[0].rate, Some(35.0));
        assert_eq!(c[0].missed_below, vec![25.0, 32.0]);
    }
}
