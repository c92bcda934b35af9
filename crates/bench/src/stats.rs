//! Percentile summaries.
//!
//! Percentiles interpolate linearly between the two nearest ranks (NumPy's default `linear`
//! method, which vLLM's benchmark reports use): for sorted `x` of length `n`, `p(q)` is read at
//! fractional index `q * (n - 1)`. An empty sample has no percentiles; they serialise as JSON
//! `null`.

use serde::Serialize;

/// Mean, P50/P90/P95/P99 and max of one metric.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Summary {
    /// Number of samples.
    pub count: usize,
    /// Arithmetic mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest sample.
    pub max: f64,
}

impl Summary {
    /// Summarises `values`, sorting them in place. NaNs are not expected (debug-asserted).
    pub fn of(values: &mut [f64]) -> Self {
        debug_assert!(values.iter().all(|v| !v.is_nan()), "NaN sample");
        values.sort_by(f64::total_cmp);
        let n = values.len();
        if n == 0 {
            return Self {
                count: 0,
                mean: f64::NAN,
                p50: f64::NAN,
                p90: f64::NAN,
                p95: f64::NAN,
                p99: f64::NAN,
                max: f64::NAN,
            };
        }
        Self {
            count: n,
            mean: values.iter().sum::<f64>() / n as f64,
            p50: percentile(values, 0.50),
            p90: percentile(values, 0.90),
            p95: percentile(values, 0.95),
            p99: percentile(values, 0.99),
            max: values[n - 1],
        }
    }
}

/// The `q`-quantile (`0 <= q <= 1`) of `sorted`, interpolated linearly; NaN when empty.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    debug_assert!((0.0..=1.0).contains(&q), "quantile out of range");
    debug_assert!(
        sorted.windows(2).all(|w| w[0] <= w[1]),
        "input must be sorted"
    );
    match sorted.len() {
        0 => f64::NAN,
        1 => sorted[0],
        n => {
            let pos = q * (n - 1) as f64;
            let lo = pos.floor() as usize;
            let hi = (lo + 1).min(n - 1);
            let frac = pos - lo as f64;
            sorted[lo] + (sorted[hi] - sorted[lo]) * frac
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_match_numpy_linear() {
        let mut v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        let s = Summary::of(&mut v);
        assert_eq!(s.count, 100);
        assert_eq!(s.mean, 50.5);
        assert_eq!(s.p50, 50.5);
        assert!((s.p90 - 90.1).abs() < 1e-9);
        assert!((s.p95 - 95.05).abs() < 1e-9);
        assert!((s.p99 - 99.01).abs() < 1e-9);
        assert_eq!(s.max, 100.0);
    }

    #[test]
    fn small_samples() {
        assert_eq!(percentile(&[7.0], 0.99), 7.0);
        assert_eq!(percentile(&[1.0, 3.0], 0.5), 2.0);
        assert!(Summary::of(&mut []).p50.is_nan());
    }

    #[test]
    fn empty_summary_serialises_as_null() {
        let v = serde_json::to_value(Summary::of(&mut [])).unwrap();
        assert!(v["p99"].is_null());
        assert_eq!(v["count"], 0);
    }
}
