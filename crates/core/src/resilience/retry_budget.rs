//! A retry budget: retries may add at most `ratio` of the recent request volume, plus a small
//! floor so that a quiet gateway can still retry (Finagle's `RetryBudget`, linkerd's
//! `retry_budget { retry_ratio, min_retries_per_second, ttl }`). It stops a fleet-wide outage from
//! being multiplied into a retry storm: when every attempt fails, traffic grows by at most
//! `1 + ratio` instead of `max_attempts`.

use super::WindowCounter;
use crate::Nanos;
use serde::{Deserialize, Serialize};

/// Retry budget parameters (linkerd's defaults: 20% over 10 s, at least 10 retries per second).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryBudgetConfig {
    /// Retries allowed as a share of requests in the window.
    pub ratio: f64,
    /// Retries always allowed per second of window, whatever the volume.
    pub min_per_sec: f64,
    /// Window length.
    pub window_ms: u64,
}

impl Default for RetryBudgetConfig {
    fn default() -> Self {
        RetryBudgetConfig {
            ratio: 0.2,
            min_per_sec: 10.0,
            window_ms: 10_000,
        }
    }
}

/// Tracks requests and retries over a window and says whether one more retry fits.
#[derive(Clone, Debug)]
pub struct RetryBudget {
    config: RetryBudgetConfig,
    requests: WindowCounter,
    retries: WindowCounter,
}

impl RetryBudget {
    /// An empty budget.
    pub fn new(config: RetryBudgetConfig) -> Self {
        let window = Nanos::from_millis(config.window_ms);
        RetryBudget {
            requests: WindowCounter::new(window, 10),
            retries: WindowCounter::new(window, 10),
            config,
        }
    }

    /// Records one original request (not a retry).
    pub fn request(&mut self, now: Nanos) {
        self.requests.add(now, 1);
    }

    /// Gives back a retry withdrawn at `withdrawn_at` that was never sent (no endpoint could
    /// take it), so that a failed pick does not shrink the budget.
    pub fn refund(&mut self, withdrawn_at: Nanos) {
        self.retries.remove(withdrawn_at, 1);
    }

    /// Withdraws one retry if the budget allows it; returns whether it did.
    pub fn try_retry(&mut self, now: Nanos) -> bool {
        let floor = self.config.min_per_sec * self.config.window_ms as f64 / 1000.0;
        let allowed = floor + self.config.ratio * self.requests.sum(now) as f64;
        if (self.retries.sum(now) as f64) < allowed {
            self.retries.add(now, 1);
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_are_capped_at_the_ratio_plus_the_floor() {
        let mut b = RetryBudget::new(RetryBudgetConfig {
            ratio: 0.1,
            min_per_sec: 0.5,
            window_ms: 10_000,
        });
        let now = Nanos::from_secs(1);
        for _ in 0..100 {
            b.request(now);
        }
        // floor 5 + 10% of 100 = 15 retries.
        let granted = (0..100).filter(|_| b.try_retry(now)).count();
        assert_eq!(granted, 15);
        // Eleven seconds later the window has emptied: only the floor remains.
        let later = Nanos::from_secs(12);
        assert_eq!((0..100).filter(|_| b.try_retry(later)).count(), 5);
    }

    #[test]
    fn a_refunded_retry_can_be_withdrawn_again() {
        let mut b = RetryBudget::new(RetryBudgetConfig {
            ratio: 0.0,
            min_per_sec: 0.1,
            window_ms: 10_000,
        });
        let now = Nanos::from_secs(1);
        assert!(b.try_retry(now));
        assert!(!b.try_retry(now), "the floor is one retry");
        b.refund(now);
        assert!(b.try_retry(Nanos::from_secs(2)));
    }
}
