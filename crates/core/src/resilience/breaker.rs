//! A circuit breaker per endpoint: closed while the failure ratio over a sliding window stays
//! under a threshold; open (no traffic) for a cool-down once it is crossed with enough volume;
//! then half-open, letting a bounded number of probe requests through, closing on a success and
//! reopening on a failure (Nygard, "Release It!", ch. 5; the ratio-over-window trigger is
//! Hystrix's `errorThresholdPercentage` with `requestVolumeThreshold`).
//!
//! Every permission to send is a [`Ticket`] handed back with the outcome. LLM streams run for
//! minutes, so outcomes of requests sent before a trip ("stragglers") keep arriving while the
//! breaker is open or half-open; the ticket says whether a dispatch is a probe and of which
//! half-open round (a generation bumped by every trip and reset), so only the current round's
//! probes decide half-open, and other outcomes count only while the breaker is closed.

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

/// The permission [`Breaker::acquire`] gave one dispatch, to be handed back with its outcome.
/// The default ticket is an ordinary (non-probe) dispatch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ticket {
    /// The generation of the half-open round this dispatch probes, if it is a probe.
    probe: Option<u64>,
}

impl Ticket {
    /// Whether the dispatch was sent as a half-open probe.
    pub fn is_probe(self) -> bool {
        self.probe.is_some()
    }
}

/// A breaker's state at a glance, copied out of it: it reads the state at any later instant
/// (an open breaker turns half-open by time alone) without the outcome counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BreakerView {
    open_until: Option<Nanos>,
    half_open: bool,
    probes_full: bool,
}

impl BreakerView {
    /// The state at `now`.
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

    /// Whether a request may be sent at `now`, without taking a probe slot.
    pub fn is_available(&self, now: Nanos) -> bool {
        match self.state(now) {
            BreakerState::Closed => true,
            BreakerState::Open => false,
            // An open breaker past its cool-down has no probes out yet.
            BreakerState::HalfOpen => self.open_until.is_some() || !self.probes_full,
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
    /// Bumped by every trip and reset: probes of an earlier round are stragglers.
    generation: u64,
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
            generation: 0,
        }
    }

    /// The breaker's state without its counters: what a lock-free reader needs.
    pub fn view(&self) -> BreakerView {
        BreakerView {
            open_until: self.open_until,
            half_open: self.half_open,
            probes_full: self.probes_out >= self.config.half_open_probes.max(1),
        }
    }

    /// The state at `now` (an open breaker whose cool-down has ended reads as half-open).
    pub fn state(&self, now: Nanos) -> BreakerState {
        self.view().state(now)
    }

    /// When an open breaker starts letting probes through; `None` unless it is open at `now`.
    pub fn open_until(&self, now: Nanos) -> Option<Nanos> {
        self.view().open_until(now)
    }

    /// Whether a request may be sent now, without taking a probe slot.
    pub fn is_available(&self, now: Nanos) -> bool {
        self.view().is_available(now)
    }

    /// Takes permission to send one request; while half-open this uses up a probe slot and the
    /// ticket marks the dispatch as a probe. `None` when no request may go now.
    pub fn acquire(&mut self, now: Nanos) -> Option<Ticket> {
        if !self.is_available(now) {
            return None;
        }
        if self.state(now) == BreakerState::HalfOpen {
            self.open_until = None;
            self.half_open = true;
            self.probes_out += 1;
            return Some(Ticket {
                probe: Some(self.generation),
            });
        }
        Some(Ticket::default())
    }

    fn is_closed(&self) -> bool {
        self.open_until.is_none() && !self.half_open
    }

    /// Whether `ticket` is a probe of the current half-open round.
    fn is_current_probe(&self, ticket: Ticket) -> bool {
        self.half_open && ticket.probe == Some(self.generation)
    }

    /// Records the outcome of the dispatch [`Self::acquire`] gave `ticket`: a current probe
    /// closes (success) or reopens (failure) the breaker; any other outcome counts in the
    /// window only while the breaker is closed (a straggler from before a trip, or a probe of an
    /// earlier round, says nothing about the endpoint now).
    pub fn record(&mut self, ticket: Ticket, success: bool, now: Nanos) {
        if self.is_current_probe(ticket) {
            self.probes_out = self.probes_out.saturating_sub(1);
            if success {
                self.reset();
            } else {
                self.trip(now);
            }
            return;
        }
        if ticket.is_probe() || !self.is_closed() {
            return;
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

    /// Records that the dispatch [`Self::acquire`] gave `ticket` ended without a verdict on the
    /// endpoint's health (the client went away, or the endpoint asked to back off with a 429):
    /// if it is a current probe its slot is freed so another probe can go; nothing is counted.
    pub fn release(&mut self, ticket: Ticket) {
        if self.is_current_probe(ticket) {
            self.probes_out = self.probes_out.saturating_sub(1);
        }
    }

    fn trip(&mut self, now: Nanos) {
        self.open_until = Some(now + Nanos::from_millis(self.config.open_ms));
        self.half_open = false;
        self.probes_out = 0;
        self.generation += 1;
    }

    fn reset(&mut self) {
        self.open_until = None;
        self.half_open = false;
        self.probes_out = 0;
        self.generation += 1;
        self.successes.clear();
        self.failures.clear();
    }
}

#[cfg(test)]
#[path = "breaker_tests.rs"]
mod tests;
