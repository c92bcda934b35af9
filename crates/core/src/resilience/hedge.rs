//! The hedging delay: send a second copy of a request that has not produced its first token
//! after the `percentile`-th TTFT seen recently (Dean and Barroso, "The Tail at Scale", CACM
//! 2013: hedged requests deferred to the 95th-percentile latency add about 5% load and cut the
//! tail sharply). The gateway cancels the copy that loses.

use crate::Nanos;
use serde::{Deserialize, Serialize};

/// Hedging parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HedgeConfig {
    /// Whether to hedge at all.
    pub enabled: bool,
    /// The TTFT percentile after which the hedge goes out, in 0..=100.
    pub percentile: f64,
    /// TTFT samples needed before the percentile is trusted; until then `initial_delay_ms`.
    pub min_samples: usize,
    /// The delay used until enough samples exist.
    pub initial_delay_ms: u64,
    /// Never hedge sooner than this.
    pub min_delay_ms: u64,
    /// How many recent TTFTs to keep.
    pub window: usize,
}

impl Default for HedgeConfig {
    fn default() -> Self {
        HedgeConfig {
            enabled: false,
            percentile: 95.0,
            min_samples: 50,
            initial_delay_ms: 1_000,
            min_delay_ms: 20,
            window: 512,
        }
    }
}

/// Recent TTFTs and the hedging delay derived from them.
#[derive(Clone, Debug)]
pub struct HedgeDelay {
    config: HedgeConfig,
    samples: Vec<u64>,
    next: usize,
    since_refresh: usize,
    cached: Nanos,
}

impl HedgeDelay {
    /// No samples yet: the delay is `initial_delay_ms`.
    pub fn new(config: HedgeConfig) -> Self {
        let cached = Nanos::from_millis(config.initial_delay_ms.max(config.min_delay_ms));
        HedgeDelay {
            samples: Vec::with_capacity(config.window.max(1)),
            config,
            next: 0,
            since_refresh: 0,
            cached,
        }
    }

    /// Records one observed TTFT. The percentile is recomputed every 16 samples, so recording is
    /// O(1) amortised over a sort of at most `window` values.
    pub fn record(&mut self, ttft: Nanos) {
        let cap = self.config.window.max(1);
        if self.samples.len() < cap {
            self.samples.push(ttft.0);
        } else {
            self.samples[self.next] = ttft.0;
        }
        self.next = (self.next + 1) % cap;
        self.since_refresh += 1;
        if self.samples.len() >= self.config.min_samples.max(1) && self.since_refresh >= 16 {
            self.refresh();
        }
    }

    fn refresh(&mut self) {
        self.since_refresh = 0;
        let mut sorted: Vec<f64> = self.samples.iter().map(|&n| n as f64).collect();
        sorted.sort_by(f64::total_cmp);
        let p = self.config.percentile.clamp(0.0, 100.0) / 100.0;
        if let Some(at) = crate::stats::percentile(&sorted, p) {
            self.cached = Nanos(at as u64).max(Nanos::from_millis(self.config.min_delay_ms));
        }
    }

    /// The delay after which a request without a first token is hedged, or `None` when
    /// hedging is off.
    pub fn delay(&self) -> Option<Nanos> {
        self.config.enabled.then_some(self.cached)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delay_follows_the_percentile_after_min_samples() {
        let mut h = HedgeDelay::new(HedgeConfig {
            enabled: true,
            percentile: 90.0,
            min_samples: 32,
            initial_delay_ms: 700,
            min_delay_ms: 1,
            window: 100,
        });
        assert_eq!(h.delay(), Some(Nanos::from_millis(700)));
        for i in 1..=96 {
            h.record(Nanos::from_millis(i));
        }
        assert_eq!(
            h.delay(),
            Some(Nanos(86_500_000)),
            "refreshed at 96 samples: 1..=96 ms read at index 0.9 * 95 = 85.5"
        );
    }

    #[test]
    fn disabled_never_hedges_and_floor_applies() {
        let off = HedgeDelay::new(HedgeConfig::default());
        assert_eq!(off.delay(), None);
        let mut h = HedgeDelay::new(HedgeConfig {
            enabled: true,
            min_samples: 1,
            min_delay_ms: 50,
            ..HedgeConfig::default()
        });
        for _ in 0..16 {
            h.record(Nanos::from_millis(2));
        }
        assert_eq!(h.delay(), Some(Nanos::from_millis(50)));
    }
}
