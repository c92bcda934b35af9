//! Percentile summaries, by kvgate's one percentile definition
//! ([`kvgate_core::stats::percentile`]: linear interpolation between the two nearest ranks,
//! NumPy's default, which vLLM's benchmark reports use), the same the simulator reports. An empty
//! sample has no percentiles; they serialise as JSON `null`.

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

/// The `q`-quantile (`0 <= q <= 1`) of ascending `sorted`; NaN (JSON `null`) when empty.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    kvgate_core::stats::percentile(sorted, q).unwrap_or(f64::NAN)
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
