//! An engine's batch slots: how long a request waits for one when every slot is decoding.
//!
//! An engine runs at most `max_num_seqs` sequences (vLLM's scheduler; 128 in the sim's
//! failure-mode fleet). Past that, an arrival waits in the engine's queue, not for prefill
//! compute but for a running sequence to finish, and the prefill model sees none of it: on the
//! heterogeneous gateway sweep the two fast engines sat at 128 running with up to 20 waiting
//! for seconds while the policy kept predicting ~140 ms there (docs/routing.md).
//!
//! The limit is not in vLLM's metrics, so it is read off them: the most sequences a fresh
//! scrape ever showed running. The engine counts as full while its scrapes keep showing
//! requests waiting with that many running, give or take [`NEAR`] of it (sequences finish and
//! join between steps); [`PERSISTENT`] scrapes in a row, because a request that arrived between
//! two scheduler steps is briefly waiting at any load. Counts under [`MIN_SLOTS`] are not taken
//! as a limit at all. Once full, slots free up as sequences finish: `limit` sequences each
//! decoding for the endpoint's typical decode time free one every `decode / limit` seconds on
//! average, and the `k`-th arrival past the limit waits for `k` of them. The wait applies only
//! while the engine shows itself full, so a ceiling read at a lower load than the engine can
//! take costs nothing until the engine queues there.

use crate::Nanos;

/// Scrapes in a row that must show the engine full before arrivals are predicted to wait.
const PERSISTENT: u32 = 2;

/// How far under the ceiling (a share of it) a full engine's running count may read.
const NEAR: f64 = 1.0 / 16.0;

/// The fewest slots taken as a limit: engines serving traffic worth routing run dozens to
/// hundreds (vLLM's default `max_num_seqs` is 256 on GPUs), while a brief wait at a handful of
/// running sequences is an arrival between two steps.
const MIN_SLOTS: u32 = 16;

/// Weight of one finished request in the running mean of decode times: about the last 20.
const DECODE_WEIGHT: f64 = 0.05;

/// One endpoint's batch slots as its scrapes and finished requests show them.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Slots {
    /// The most sequences a fresh scrape showed running.
    ceiling: u32,
    /// Scrapes in a row, to the last, that showed the engine full.
    full: u32,
    /// The last scrape counted, so that one scrape read by many picks counts once.
    seen_at: Option<Nanos>,
    /// Seconds from first token to the end of a request, a running mean.
    decode_secs: Option<f64>,
}

impl Slots {
    /// Reads one fresh scrape taken at `at`.
    pub(super) fn observe(&mut self, running: u32, waiting: u32, at: Nanos) {
        if self.seen_at == Some(at) {
            return;
        }
        self.seen_at = Some(at);
        self.ceiling = self.ceiling.max(running);
        let near = f64::from(running) >= f64::from(self.ceiling) * (1.0 - NEAR);
        self.full = if waiting > 0 && near {
            self.full.saturating_add(1)
        } else {
            0
        };
    }

    /// Learns from one request that decoded for `secs` after its first token.
    pub(super) fn finished(&mut self, secs: f64) {
        if !secs.is_finite() || secs < 0.0 {
            return;
        }
        self.decode_secs = Some(match self.decode_secs {
            Some(mean) => mean + (secs - mean) * DECODE_WEIGHT,
            None => secs,
        });
    }

    /// The engine's slot limit while it shows itself full.
    pub(super) fn limit(&self) -> Option<u32> {
        (self.full >= PERSISTENT && self.ceiling >= MIN_SLOTS).then_some(self.ceiling)
    }

    /// Seconds a request arriving now waits for a slot when `occupancy` sequences (running and
    /// waiting) are already there: 0 while the engine is not full or its decode time unknown.
    pub(super) fn wait(&self, occupancy: u32) -> f64 {
        let (Some(limit), Some(decode)) = (self.limit(), self.decode_secs) else {
            return 0.0;
        };
        let past = occupancy.saturating_add(1).saturating_sub(limit);
        f64::from(past) * decode / f64::from(limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrapes(slots: &mut Slots, from: u64, readings: &[(u32, u32)]) {
        for (i, &(running, waiting)) in readings.iter().enumerate() {
            slots.observe(running, waiting, Nanos::from_secs(from + i as u64));
        }
    }

    #[test]
    fn a_full_engine_makes_arrivals_wait_for_finishing_sequences() {
        let mut s = Slots::default();
        s.finished(4.0);
        scrapes(&mut s, 0, &[(40, 0), (128, 3), (126, 9)]);
        assert_eq!(s.limit(), Some(128));
        assert_eq!(s.wait(100), 0.0);
        // The arrival that takes the last slot does not wait; the next one waits for one.
        assert_eq!(s.wait(127), 0.0);
        assert_eq!(s.wait(128), 4.0 / 128.0);
        // The 20th arrival past the limit waits for 20 of 128 sequences decoding 4 s each.
        assert!((s.wait(128 + 19) - 20.0 * 4.0 / 128.0).abs() < 1e-12);
        // The queue drained: no wait, whatever the count.
        scrapes(&mut s, 10, &[(127, 0)]);
        assert_eq!(s.wait(140), 0.0);
    }

    #[test]
    fn arrivals_between_steps_are_not_a_full_engine() {
        let mut s = Slots::default();
        s.finished(2.0);
        // Waiting at the highest count so far, but a handful of sequences.
        scrapes(&mut s, 0, &[(3, 1), (3, 1), (3, 1), (3, 2)]);
        assert_eq!(s.limit(), None);
        assert_eq!(s.wait(50), 0.0);
        // One scrape at a time catches an arrival waiting at the ceiling.
        scrapes(&mut s, 10, &[(64, 1), (60, 0), (64, 1), (64, 0)]);
        assert_eq!(s.limit(), None);
        // Waiting well under the ceiling is prefill, not slots.
        scrapes(&mut s, 20, &[(40, 5), (40, 7), (41, 3)]);
        assert_eq!(s.limit(), None);
    }

    #[test]
    fn one_scrape_read_by_many_picks_counts_once() {
        let mut s = Slots::default();
        for _ in 0..5 {
            s.observe(32, 4, Nanos::from_secs(1));
        }
        assert_eq!(s.limit(), None);
        s.observe(32, 4, Nanos::from_secs(2));
        assert_eq!(s.limit(), Some(32));
    }

    #[test]
    fn unknown_decode_time_predicts_no_wait() {
        let mut s = Slots::default();
        scrapes(&mut s, 0, &[(128, 5), (128, 5), (128, 5)]);
        assert_eq!(s.wait(200), 0.0);
        s.finished(f64::NAN);
        assert_eq!(s.wait(200), 0.0);
    }
}
