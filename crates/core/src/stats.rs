//! The one percentile definition kvgate uses everywhere (simulator reports, benchmark reports,
//! the hedging delay): linear interpolation between the two nearest ranks, NumPy's default
//! `linear` method, which vLLM's `benchmark_serving.py` uses for its P50/P90/P95/P99 (it calls
//! `np.percentile`). For sorted `x` of length `n`, `p(q)` is read at fractional index
//! `q * (n - 1)`.

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
