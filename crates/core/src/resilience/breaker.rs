//! A circuit breaker per endpoint: closed while the failure ratio over a sliding window stays
//! under a threshold; open (no traffic) for a cool-down once it is crossed with enough volume;
//! then half-open, letting a bounded number of probe requests through, closing on a success and
//! reopening on a failure (Nygard, "Release It!", ch. 5; the ratio-over-window trigger is
//! Hystrix's `errorThresholdPercentage` with `requestVolumeThreshold`).

use super::WindowCounter;
use crate::Nanos;
use serde::{Deserialize, Serialize};

/// Breaker parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BreakerConfig {
    /// Failure share over the window that opens the breaker, 0..=1.
    pub failure_ratio: f64,
    /// Fewest outcomes in the window before the ratio is trusted.
    pub min_requests: u64,
    /// Window length.
    pub window_ms: u64,
    /// How long the breaker stays open before probing.
    pub open_ms: u64,
    /// Probe requests allowed at once while half-open.
    pub half_open_probes: u32,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            failure_ratio: 0.5,
            min_requests: 10,
            window_ms: 10_000,
            open_ms: 5_000,
            half_open_probes: 1,
        }
    }
}

/// Where a breaker is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakerState {
    /// Traffic flows; outcomes are counted.
    Closed,
    /// No traffic until the cool-down ends.
    Open,
    /// Probes only.
    HalfOpen,
}

impl BreakerState {
    /// 0 closed, 1 half-open, 2 open: the gauge value kvgate exports.
    pub fn as_gauge(self) -> i64 {
        match self {
            BreakerState::Closed => 0,
            BreakerState::HalfOpen => 1,
            BreakerState::Open => 2,
        }
    }
}

/// One endpoint's breaker.
#[derive(Clone, Debug)]
pub struct Breaker {
    config: BreakerConfig,
    successes: WindowCounter,
    failures: WindowCounter,
    open_until: Option<Nanos>,
    half_open: bool,
    probes_out: u32,
}

impl Breaker {
    /// A closed breaker.
    pub fn new(config: BreakerConfig) -> Self {
        let window = Nanos::from_millis(config.window_ms);
        Breaker {
            successes: WindowCounter::new(window, 10),
            failures: WindowCounter::new(window, 10),
            config,
            open_until: None,
            half_open: false,
            probes_out: 0,
        }
    }

    /// The state at `now` (an open breaker whose cool-down has ended reads as half-open).
    pub fn state(&self, now: Nanos) -> BreakerState {
        match self.open_until {
            Some(until) if now < until => BreakerState::Open,
            Some(_) => BreakerState::HalfOpen,
            None if self.half_open => BreakerState::HalfOpen,
            None => BreakerState::Closed,
        }
    }

    /// When an open breaker starts letting probes through; `None` unless it is open at `now`.
    pub fn open_until(&self, now: Nanos) -> Option<Nanos> {
        self.open_until.filter(|until| now < *until)
    }

    /// Whether a request may be sent now, without taking a probe slot.
    pub fn is_available(&self, now: Nanos) -> bool {
        match self.state(now) {
            BreakerState::Closed => true,
            BreakerState::Open => false,
            BreakerState::HalfOpen => self.probes_out < self.config.half_open_probes.max(1),
        }
    }

    /// Takes permission to send one request; while half-open this uses up a probe slot.
    pub fn acquire(&mut self, now: Nanos) -> bool {
        if !self.is_available(now) {
            return false;
        }
        if self.state(now) == BreakerState::HalfOpen {
            self.open_until = None;
            self.half_open = true;
            self.probes_out += 1;
        }
        true
    }

    /// Records an outcome of a request sent after [`Self::acquire`].
    pub fn record(&mut self, success: bool, now: Nanos) {
        if self.half_open {
            self.probes_out = self.probes_out.saturating_sub(1);
            if success {
                self.reset();
            } else {
                self.trip(now);
            }
            return;
        }
        if self.open_until.is_some() {
            return; // a straggler sent before the breaker opened
        }
        if success {
            self.successes.add(now, 1);
        } else {
            self.failures.add(now, 1);
            let failures = self.failures.sum(now);
            let total = failures + self.successes.sum(now);
            if total >= self.config.min_requests
                && failures as f64 >= self.config.failure_ratio * total as f64
            {
                self.trip(now);
            }
        }
    }

    /// Records that a request sent after [`Self::acquire`] ended without a verdict on the
    /// endpoint's health (the client went away, or the endpoint asked to back off with a 429):
    /// a half-open probe slot is freed so another probe can go, and nothing is counted.
    pub fn release(&mut self) {
        if self.half_open {
            self.probes_out = self.probes_out.saturating_sub(1);
        }
    }

    fn trip(&mut self, now: Nanos) {
        self.open_until = Some(now + Nanos::from_millis(self.config.open_ms));
        self.half_open = false;
        self.probes_out = 0;
    }

    fn reset(&mut self) {
        self.open_until = None;
        self.half_open = false;
        self.probes_out = 0;
        self.successes.clear();
        self.failures.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Nanos {
        Nanos::from_millis(v)
    }

    fn breaker() -> Breaker {
        Breaker::new(BreakerConfig {
            failure_ratio: 0.5,
            min_requests: 4,
            window_ms: 1_000,
            open_ms: 500,
            half_open_probes: 1,
        })
    }

    #[test]
    fn opens_on_the_ratio_then_probes_then_closes() {
        let mut b = breaker();
        b.record(true, ms(0));
        b.record(false, ms(1));
        b.record(true, ms(2));
        assert_eq!(b.state(ms(3)), BreakerState::Closed, "below min_requests");
        b.record(false, ms(3));
        assert_eq!(b.state(ms(4)), BreakerState::Open, "2 of 4 failed");
        assert!(!b.acquire(ms(100)));
        assert_eq!(b.open_until(ms(100)), Some(ms(503)));
        assert_eq!(b.state(ms(503)), BreakerState::HalfOpen);
        assert_eq!(b.open_until(ms(503)), None);
        assert!(b.acquire(ms(503)), "one probe");
        assert!(!b.acquire(ms(504)), "only one probe at a time");
        b.record(true, ms(510));
        assert_eq!(b.state(ms(511)), BreakerState::Closed);
        assert!(b.acquire(ms(511)));
    }

    #[test]
    fn a_failed_probe_reopens() {
        let mut b = breaker();
        for t in 0..4 {
            b.record(false, ms(t));
        }
        assert!(b.acquire(ms(600)));
        b.record(false, ms(601));
        assert_eq!(b.state(ms(602)), BreakerState::Open);
        assert_eq!(b.state(ms(1101)), BreakerState::HalfOpen);
    }

    #[test]
    fn a_probe_without_a_verdict_frees_its_slot() {
        let mut b = breaker();
        for t in 0..4 {
            b.record(false, ms(t));
        }
        assert!(b.acquire(ms(600)));
        assert!(!b.is_available(ms(601)));
        b.release();
        assert_eq!(b.state(ms(602)), BreakerState::HalfOpen);
        assert!(b.acquire(ms(602)), "a new probe may go");
    }

    #[test]
    fn old_failures_leave_the_window() {
        let mut b = breaker();
        for t in 0..3 {
            b.record(false, ms(t));
        }
        for t in 0..4 {
            b.record(true, ms(2_000 + t));
        }
        b.record(false, ms(2_010));
        assert_eq!(b.state(ms(2_011)), BreakerState::Closed, "1 of 5 in window");
    }
}
