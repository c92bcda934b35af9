//! An engine's iteration clock as a router sees it through the streams it relays.
//!
//! An engine with continuous batching runs one iteration at a time and delivers a token to
//! every decoding sequence at its end (vLLM streams each iteration's tokens as they are
//! sampled). A request that arrives mid-iteration waits for that iteration to end before the
//! scheduler can admit it, so the time to its first token starts with the remainder of the
//! iteration in progress. On a busy engine an iteration lasts tens of milliseconds, as long as
//! a short prompt's whole prefill: not knowing where in the iteration the engine is costs a
//! prediction most of its accuracy on short prompts. `kvgate sim`'s all-knowing router, run
//! with the phase replaced by half an iteration, put 66% of its agentic predictions within 20%
//! instead of 84% (docs/routing.md).
//!
//! The streams a router relays show the phase: chunks of one iteration arrive together, the
//! next iteration's one iteration later. [`Cadence`] keeps when the last iteration's tokens
//! arrived and how long iterations take.

use crate::Nanos;
use serde::{Deserialize, Serialize};

/// Chunks closer together than this (or a quarter of the interval, if more) belong to the
/// same iteration: a scheduler hands one iteration's tokens to many streams within a
/// millisecond, and no engine iterates that fast under load.
const SAME_ITERATION: Nanos = Nanos(1_000_000);

/// Weight of each new gap in the interval's moving average. Most iterations only decode, and
/// their length drifts with the batch; the few that also prefill a chunk run long and are
/// covered by the overdue rule in [`Cadence::remaining`], so the average should follow the
/// drift without jumping at every long one. On `kvgate sim --scenario mix` (seed 1, 3 to 6
/// sessions/s) 0.1 put 83/78/72% of predictions within 20%, 0.25 gave 81/76/72% and 1 (the
/// last gap alone) 77/70/63%.
const ALPHA: f64 = 0.1;

/// A gap this many intervals long is a pause (the engine ran dry, or only prefilled), not an
/// iteration: it restarts the clock without entering the average.
const PAUSE: u64 = 4;

/// An endpoint's iteration clock (see the module documentation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cadence {
    /// When the last iteration's tokens arrived.
    pub last_at: Nanos,
    /// The moving average of the gaps between iterations; zero until two have been seen.
    pub interval: Nanos,
}

impl Cadence {
    /// A clock that saw its first tokens at `at`.
    pub fn starting(at: Nanos) -> Self {
        Cadence {
            last_at: at,
            interval: Nanos::ZERO,
        }
    }

    /// Tokens of a stream arrived at `at`.
    pub fn tick(&mut self, at: Nanos) {
        let gap = at.saturating_since(self.last_at);
        if gap <= SAME_ITERATION.max(Nanos(self.interval.0 / 4)) {
            return;
        }
        if self.interval == Nanos::ZERO {
            self.interval = gap;
        } else if gap.0 < self.interval.0.saturating_mul(PAUSE) {
            let blended = self.interval.0 as f64 + (gap.0 as f64 - self.interval.0 as f64) * ALPHA;
            self.interval = Nanos(blended.round() as u64);
        }
        self.last_at = at;
    }

    /// How long until the iteration in progress at `now` ends, if the clock can tell. The
    /// iteration that started when the last tokens arrived ends one interval later. Past that
    /// it is a longer one (it prefills a chunk) whose end the clock cannot see: half an
    /// interval, the mean remainder at an unknown phase (at an average weight of 0.25, without
    /// it the same sweep put 79/73/66% within 20% instead of 81/76/72%). After [`PAUSE`] intervals without tokens the engine is
    /// idle or only prefilling (the router's own queue model covers that), and before two
    /// iterations have been seen the clock knows nothing: `None`.
    pub fn remaining(&self, now: Nanos) -> Option<Nanos> {
        if self.interval == Nanos::ZERO {
            return None;
        }
        let end = self.last_at + self.interval;
        if now < end {
            Some(end - now)
        } else if now < self.last_at + Nanos(self.interval.0.saturating_mul(PAUSE)) {
            Some(Nanos(self.interval.0 / 2))
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn the_iteration_in_progress_ends_one_interval_after_the_last_tokens() {
        let mut c = Cadence::starting(Nanos(100 * MS));
        assert_eq!(
            c.remaining(Nanos(101 * MS)),
            None,
            "one iteration says nothing"
        );
        c.tick(Nanos(120 * MS));
        assert_eq!(c.interval, Nanos(20 * MS));
        assert_eq!(c.remaining(Nanos(125 * MS)), Some(Nanos(15 * MS)));
        assert_eq!(
            c.remaining(Nanos(140 * MS)),
            Some(Nanos(10 * MS)),
            "overdue: half an interval"
        );
        assert_eq!(c.remaining(Nanos(200 * MS)), None, "a pause: nothing known");
    }

    #[test]
    fn chunks_of_one_iteration_do_not_shorten_the_interval() {
        let mut c = Cadence::starting(Nanos(100 * MS));
        c.tick(Nanos(120 * MS));
        for k in 0..5 {
            c.tick(Nanos(120 * MS + k * 200_000));
        }
        assert_eq!(c.interval, Nanos(20 * MS));
        assert_eq!(
            c.last_at,
            Nanos(120 * MS),
            "the iteration ended with its first chunk"
        );
        c.tick(Nanos(124 * MS));
        assert_eq!(
            c.interval,
            Nanos(20 * MS),
            "within a quarter interval: same iteration"
        );
    }

    #[test]
    fn the_interval_follows_the_batch_and_ignores_pauses() {
        let mut c = Cadence::starting(Nanos(MS));
        let mut t = MS;
        for _ in 0..40 {
            t += 30 * MS;
            c.tick(Nanos(t));
        }
        assert!((c.interval.0 as i64 - 30 * MS as i64).abs() < MS as i64 / 10);
        t += 10_000 * MS;
        c.tick(Nanos(t));
        assert!((c.interval.0 as i64 - 30 * MS as i64).abs() < MS as i64 / 10);
        assert_eq!(c.last_at, Nanos(t), "a pause restarts the clock");
        t += 40 * MS;
        c.tick(Nanos(t));
        assert_eq!(c.interval, Nanos(30 * MS + MS), "a tenth of the change");
    }
}
