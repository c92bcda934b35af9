//! Percentile summaries, by kvgate's one definition ([`kvgate_core::stats::summary`]: linear
//! interpolation between the two nearest ranks, NumPy's default, which vLLM's benchmark reports
//! use), the same the simulator reports. An empty sample has no percentiles: they are NaN here,
//! so the tables print "-", and serialise as JSON `null`.

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
        let s = kvgate_core::stats::summary(values);
        let nan = |x: Option<f64>| x.unwrap_or(f64::NAN);
        Self {
            count: s.count,
            mean: nan(s.mean),
            p50: nan(s.p50),
            p90: nan(s.p90),
            p95: nan(s.p95),
            p99: nan(s.p99),
            max: nan(s.max),
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
    fn empty_summary_serialises_as_null() {
        assert!(Summary::of(&mut []).p50.is_nan());
        let v = serde_json::to_value(Summary::of(&mut [])).unwrap();
        assert!(v["p99"].is_null() && v["mean"].is_null());
        assert_eq!(v["count"], 0);
    }
}
