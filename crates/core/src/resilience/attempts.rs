//! One request's attempts before its first token: when to retry, when to hedge, when to give up,
//! and how the request ended ([`Outcome`]).
//!
//! Retries multiply across layers, so: retry in one layer only, within a budget shared by every
//! request ([`RetryBudget`], after Google's SRE book, "Handling Overload"), with full-jitter
//! backoff; hedge once, after a delay taken from observed TTFTs (Dean and Barroso, "The Tail at
//! Scale"); never past the client's deadline; and never after the first token (the driver stops
//! consulting this machine once an attempt produced bytes). The gateway's proxy is a short driver
//! around it; a test walks it through a scripted timeline.

use super::{Backoff, RetryBudget};
use crate::Nanos;
use rand::RngCore;
use serde::Serialize;

/// How a request ended, one label each in `kvgate_requests_total{outcome}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Answered (any status the upstream chose to send that was not a failure).
    Ok,
    /// Every attempt failed before its first token.
    UpstreamError,
    /// The upstream broke after the first token.
    StreamError,
    /// The client went away.
    Cancelled,
    /// The request was invalid.
    ClientError,
    /// No endpoint could take it.
    NoEndpoint,
    /// The admission queue was full.
    QueueFull,
    /// The client's deadline passed (in the queue or between attempts).
    Deadline,
    /// Refused by a key's or tenant's rate limit, budget or model list, or without a valid key.
    Refused,
}

impl Outcome {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::UpstreamError => "upstream_error",
            Outcome::StreamError => "stream_error",
            Outcome::Cancelled => "cancelled",
            Outcome::ClientError => "client_error",
            Outcome::NoEndpoint => "no_endpoint",
            Outcome::QueueFull => "queue_full",
            Outcome::Deadline => "deadline",
            Outcome::Refused => "refused",
        }
    }
}

/// Which limit refused a retry (`kvgate_retries_denied_total{reason}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Denied {
    /// The client's deadline passed, or the backoff would outlast it.
    Deadline,
    /// `max_attempts` were made.
    Attempts,
    /// The retry budget is spent.
    Budget,
}

impl Denied {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Denied::Deadline => "deadline",
            Denied::Attempts => "attempts",
            Denied::Budget => "budget",
        }
    }
}

/// What the driver does after an attempt failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Another attempt (a hedge) is still running: wait for it.
    Wait,
    /// Send another attempt after `after`. If it finds no endpoint, hand `withdrawn_at` back to
    /// [`RetryBudget::refund`].
    Retry {
        /// The backoff.
        after: Nanos,
        /// When the retry was withdrawn from the budget.
        withdrawn_at: Nanos,
    },
    /// Stop; the request ends with `outcome` because `denied` refused a retry.
    GiveUp {
        /// How the request ends.
        outcome: Outcome,
        /// Which limit.
        denied: Denied,
    },
}

/// The attempt state of one request. See the module documentation.
#[derive(Clone, Debug)]
pub struct Attempts {
    max_attempts: u32,
    backoff: Backoff,
    deadline: Option<Nanos>,
    retries: u32,
    running: u32,
    hedge_pending: bool,
}

impl Attempts {
    /// A request that may make `max_attempts` attempts (hedges not counted), waiting `backoff`
    /// between them, until `deadline`; `hedge` arms the one hedge.
    pub fn new(max_attempts: u32, backoff: Backoff, deadline: Option<Nanos>, hedge: bool) -> Self {
        Attempts {
            max_attempts,
            backoff,
            deadline,
            retries: 0,
            running: 0,
            hedge_pending: hedge,
        }
    }

    /// Whether the client's deadline has passed at `now`.
    pub fn expired(&self, now: Nanos) -> bool {
        self.deadline.is_some_and(|d| now >= d)
    }

    /// An attempt was sent.
    pub fn launched(&mut self) {
        self.running += 1;
    }

    /// Retries made so far.
    pub fn retries(&self) -> u32 {
        self.retries
    }

    /// The hedging timer fired: whether to send the one hedge now (not after the deadline, not
    /// twice).
    pub fn hedge_due(&mut self, now: Nanos) -> bool {
        std::mem::take(&mut self.hedge_pending) && !self.expired(now)
    }

    /// An attempt failed before its first token at `now`.
    pub fn failed(&mut self, now: Nanos, budget: &mut RetryBudget, rng: &mut dyn RngCore) -> Next {
        self.running = self.running.saturating_sub(1);
        if self.running > 0 {
            return Next::Wait;
        }
        let give_up = |outcome, denied| Next::GiveUp { outcome, denied };
        if self.expired(now) {
            return give_up(Outcome::Deadline, Denied::Deadline);
        }
        if self.retries + 1 >= self.max_attempts {
            return give_up(Outcome::UpstreamError, Denied::Attempts);
        }
        if !budget.try_retry(now) {
            return give_up(Outcome::UpstreamError, Denied::Budget);
        }
        let after = self.backoff.delay(self.retries, rng);
        if self.deadline.is_some_and(|d| now + after >= d) {
            // The backoff alone would outlast the client's deadline.
            budget.refund(now);
            return give_up(Outcome::Deadline, Denied::Deadline);
        }
        self.retries += 1;
        Next::Retry {
            after,
            withdrawn_at: now,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resilience::RetryBudgetConfig;
    use rand::SeedableRng;

    fn budget(floor_per_sec: f64) -> RetryBudget {
        RetryBudget::new(RetryBudgetConfig {
            ratio: 0.0,
            min_per_sec: floor_per_sec,
            window_ms: 10_000,
        })
    }

    fn backoff() -> Backoff {
        Backoff {
            base_ms: 10,
            cap_ms: 10,
        }
    }

    #[test]
    fn retries_until_the_attempt_limit() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let mut b = budget(10.0);
        let mut a = Attempts::new(3, backoff(), None, false);
        a.launched();
        assert!(matches!(
            a.failed(Nanos(0), &mut b, &mut rng),
            Next::Retry { after, .. } if after <= Nanos::from_millis(10)
        ));
        a.launched();
        assert!(matches!(
            a.failed(Nanos(1), &mut b, &mut rng),
            Next::Retry { .. }
        ));
        a.launched();
        assert_eq!(
            a.failed(Nanos(2), &mut b, &mut rng),
            Next::GiveUp {
                outcome: Outcome::UpstreamError,
                denied: Denied::Attempts
            }
        );
        assert_eq!(a.retries(), 2);
    }

    #[test]
    fn a_running_hedge_is_waited_for_and_the_budget_can_refuse() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2);
        let mut b = budget(0.1); // one retry per 10 s window
        let mut a = Attempts::new(5, backoff(), None, true);
        a.launched();
        assert!(a.hedge_due(Nanos(5)));
        assert!(!a.hedge_due(Nanos(6)), "one hedge only");
        a.launched();
        assert_eq!(a.failed(Nanos(7), &mut b, &mut rng), Next::Wait);
        assert!(matches!(
            a.failed(Nanos(8), &mut b, &mut rng),
            Next::Retry { .. }
        ));
        a.launched();
        assert_eq!(
            a.failed(Nanos(9), &mut b, &mut rng),
            Next::GiveUp {
                outcome: Outcome::UpstreamError,
                denied: Denied::Budget
            }
        );
    }

    #[test]
    fn the_deadline_stops_retries_and_refunds_a_backoff_that_would_outlast_it() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let mut b = budget(0.1);
        let long = Backoff {
            base_ms: 1_000,
            cap_ms: 1_000,
        };
        // Every draw from this seed is well above 1 ms; the deadline is 1 ms away.
        let mut a = Attempts::new(5, long, Some(Nanos::from_millis(1)), true);
        a.launched();
        let next = a.failed(Nanos(0), &mut b, &mut rng);
        assert_eq!(
            next,
            Next::GiveUp {
                outcome: Outcome::Deadline,
                denied: Denied::Deadline
            }
        );
        assert!(b.try_retry(Nanos(1)), "the withdrawn retry was refunded");
        let mut late = Attempts::new(5, backoff(), Some(Nanos(10)), true);
        assert!(!late.hedge_due(Nanos(10)), "no hedge after the deadline");
        late.launched();
        assert_eq!(
            late.failed(Nanos(10), &mut b, &mut rng),
            Next::GiveUp {
                outcome: Outcome::Deadline,
                denied: Denied::Deadline
            }
        );
    }
}
