//! The percentile: linear interpolation between the two nearest ranks, NumPy's default `linear`
//! method, which vLLM's `benchmark_serving.py` uses for its P50/P90/P95/P99 (it calls
//! `np.percentile`). For sorted `x` of length `n`, `p(q)` is read at fractional index
//! `q * (n - 1)`. Unlike nearest rank, it moves continuously with the samples, so two runs'
//! P99 over a few hundred requests do not jump by a whole inter-sample gap.

use serde::Serialize;

/// The `q`-quantile (`0 <= q <= 1`) of ascending `sorted`; `None` when it is empty.
pub fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    debug_assert!((0.0..=1.0).contains(&q), "quantile out of range");
    debug_assert!(
        sorted.windows(2).all(|w| w[0] <= w[1]),
        "input must be sorted"
    );
    match sorted.len() {
        0 => None,
        1 => Some(sorted[0]),
        n => {
            let pos = q.clamp(0.0, 1.0) * (n - 1) as f64;
            let lo = pos.floor() as usize;
            let hi = (lo + 1).min(n - 1);
            Some(sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64))
        }
    }
}

/// Count, mean, P50/P90/P95/P99 and max of one metric, the columns of vLLM's benchmark report.
/// Every figure but the count is `None` (JSON `null`) for an empty sample.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Summary {
    /// Number of samples.
    pub count: usize,
    /// Arithmetic mean.
    pub mean: Option<f64>,
    /// Median.
    pub p50: Option<f64>,
    /// 90th percentile.
    pub p90: Option<f64>,
    /// 95th percentile.
    pub p95: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
    /// Largest sample.
    pub max: Option<f64>,
}

/// Summarises `values`, sorting them in place (NaNs are not expected; debug-asserted).
pub fn summary(values: &mut [f64]) -> Summary {
    debug_assert!(values.iter().all(|v| !v.is_nan()), "NaN sample");
    values.sort_by(f64::total_cmp);
    let n = values.len();
    Summary {
        count: n,
        mean: (n > 0).then(|| values.iter().sum::<f64>() / n as f64),
        p50: percentile(values, 0.50),
        p90: percentile(values, 0.90),
        p95: percentile(values, 0.95),
        p99: percentile(values, 0.99),
        max: values.last().copied(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn matches_numpy_linear() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), Some(50.5));
        assert!((percentile(&v, 0.95).unwrap() - 95.05).abs() < 1e-9);
        assert!((percentile(&v, 0.99).unwrap() - 99.01).abs() < 1e-9);
        assert_eq!(percentile(&v, 1.0), Some(100.0));
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&[7.0], 0.99), Some(7.0));
        assert_eq!(percentile(&[1.0, 3.0], 0.5), Some(2.0));
        assert_eq!(percentile(&[], 0.5), None);
    }

    #[test]
    fn summary_of_nothing_is_null_not_zero() {
        let s = summary(&mut []);
        assert_eq!(s.count, 0);
        assert_eq!((s.mean, s.p50, s.p99, s.max), (None, None, None, None));
        let mut v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        let s = summary(&mut v);
        assert_eq!(
            (s.count, s.mean, s.p50, s.max),
            (100, Some(50.5), Some(50.5), Some(100.0))
        );
        assert!((s.p90.unwrap() - 90.1).abs() < 1e-9);
    }

    proptest! {
        #[test]
        fn monotone_in_q_and_within_the_sample(
            mut xs in proptest::collection::vec(-1e6f64..1e6, 1..200),
            a in 0.0f64..=1.0,
            b in 0.0f64..=1.0,
        ) {
            xs.sort_by(f64::total_cmp);
            let (lo, hi) = (a.min(b), a.max(b));
            let (p_lo, p_hi) = (percentile(&xs, lo).unwrap(), percentile(&xs, hi).unwrap());
            prop_assert!(p_lo <= p_hi + 1e-9 * p_hi.abs().max(1.0));
            let top = xs[xs.len() - 1];
            prop_assert!(p_lo >= xs[0] && p_hi <= top + 1e-9 * top.abs().max(1.0));
            prop_assert_eq!(percentile(&xs, 0.0), Some(xs[0]));
            prop_assert_eq!(percentile(&xs, 1.0), Some(xs[xs.len() - 1]));
        }
    }
}
