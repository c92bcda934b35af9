//! Recent time to first token for the live page: the last [`CAPACITY`] streamed first tokens
//! with their wall-clock second, summarised per second on request. Prometheus histograms answer
//! the same question over long windows; this answers "what happened in the last two minutes"
//! without one, at a fixed memory cost.

use serde::Serialize;
use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// Samples kept: two minutes at about 34 streams per second, or fewer seconds above that.
const CAPACITY: usize = 4096;

/// One second's first tokens.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct SecondSummary {
    /// Unix time, seconds.
    pub(crate) t: u64,
    /// First tokens in that second.
    pub(crate) n: usize,
    /// Median TTFT, milliseconds.
    pub(crate) p50_ms: f64,
    /// 95th percentile (nearest rank), milliseconds.
    pub(crate) p95_ms: f64,
}

/// The recent samples.
#[derive(Debug, Default)]
pub(crate) struct TtftSeries {
    samples: Mutex<VecDeque<(u64, f32)>>,
}

impl TtftSeries {
    /// Records a first token after `ttft_ms`, now.
    pub(crate) fn record(&self, ttft_ms: f64) {
        let second = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self.push(second, ttft_ms);
    }

    fn push(&self, second: u64, ttft_ms: f64) {
        let mut samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        if samples.len() == CAPACITY {
            samples.pop_front();
        }
        samples.push_back((second, ttft_ms as f32));
    }

    /// Per-second summaries of the samples no older than `since` (Unix seconds), oldest first.
    pub(crate) fn summary(&self, since: u64) -> Vec<SecondSummary> {
        let samples: Vec<(u64, f32)> = {
            let s = self.samples.lock().unwrap_or_else(|p| p.into_inner());
            s.iter().copied().filter(|&(t, _)| t >= since).collect()
        };
        let mut out = Vec::new();
        let mut start = 0;
        while start < samples.len() {
            let t = samples[start].0;
            let end = start + samples[start..].iter().take_while(|s| s.0 == t).count();
            let mut v: Vec<f64> = samples[start..end].iter().map(|s| f64::from(s.1)).collect();
            v.sort_by(f64::total_cmp);
            let rank = |q: f64| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
            out.push(SecondSummary {
                t,
                n: v.len(),
                p50_ms: rank(0.5),
                p95_ms: rank(0.95),
            });
            start = end;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summarises_each_second_and_forgets_the_oldest() {
        let s = TtftSeries::default();
        for i in 1..=20 {
            s.push(100, f64::from(i));
        }
        s.push(101, 7.0);
        let sum = s.summary(0);
        assert_eq!(sum.len(), 2);
        assert_eq!(
            (sum[0].t, sum[0].n, sum[0].p50_ms, sum[0].p95_ms),
            (100, 20, 10.0, 19.0)
        );
        assert_eq!((sum[1].n, sum[1].p95_ms), (1, 7.0));
        assert_eq!(s.summary(101).len(), 1);
        for _ in 0..CAPACITY {
            s.push(200, 1.0);
        }
        assert_eq!(s.summary(0).len(), 1, "older samples gave way");
    }
}
