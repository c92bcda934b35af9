//! A counter over a sliding time window, kept as a ring of fixed-width buckets (the shape of
//! Finagle's and linkerd's retry budgets and of Hystrix's rolling statistics).
//!
//! The window is `buckets` slots of `window / buckets` each; a count is attributed to the slot of
//! its timestamp and forgotten once the slot is reused. Resolution is therefore one bucket: the
//! sum covers the current slot and the `buckets - 1` before it, so events in the oldest bucket
//! width of the window may already be forgotten.

use crate::Nanos;

/// Counts events over the last `window` of time.
#[derive(Clone, Debug)]
pub struct WindowCounter {
    slot_width: u64,
    slots: Vec<Slot>,
}

#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    epoch: u64,
    count: u64,
}

impl WindowCounter {
    /// A counter over `window` split into `buckets` slots.
    ///
    /// Precondition: `buckets >= 1`; a zero window is treated as one nanosecond per slot.
    pub fn new(window: Nanos, buckets: usize) -> Self {
        debug_assert!(buckets >= 1, "a window needs at least one bucket");
        let buckets = buckets.max(1);
        WindowCounter {
            slot_width: (window.0 / buckets as u64).max(1),
            slots: vec![Slot::default(); buckets],
        }
    }

    /// Adds `n` events at `now`.
    pub fn add(&mut self, now: Nanos, n: u64) {
        let epoch = now.0 / self.slot_width;
        let len = self.slots.len() as u64;
        let slot = &mut self.slots[(epoch % len) as usize];
        if slot.epoch != epoch {
            *slot = Slot { epoch, count: 0 };
        }
        slot.count += n;
    }

    /// Events counted in the window ending at `now`.
    pub fn sum(&self, now: Nanos) -> u64 {
        let current = now.0 / self.slot_width;
        let len = self.slots.len() as u64;
        self.slots
            .iter()
            .filter(|s| s.epoch + len > current && s.epoch <= current)
            .map(|s| s.count)
            .sum()
    }

    /// Takes back up to `n` events added at `at` (saturating); a no-op once `at`'s slot has
    /// been reused, since those events have left the window anyway.
    pub fn remove(&mut self, at: Nanos, n: u64) {
        let epoch = at.0 / self.slot_width;
        let len = self.slots.len() as u64;
        let slot = &mut self.slots[(epoch % len) as usize];
        if slot.epoch == epoch {
            slot.count = slot.count.saturating_sub(n);
        }
    }

    /// Forgets everything.
    pub fn clear(&mut self) {
        self.slots.fill(Slot::default());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn counts_expire_after_the_window() {
        let mut w = WindowCounter::new(Nanos::from_secs(10), 10);
        w.add(Nanos::from_secs(1), 3);
        w.add(Nanos::from_secs(5), 2);
        assert_eq!(w.sum(Nanos::from_secs(6)), 5);
        assert_eq!(w.sum(Nanos::from_secs(10)), 5);
        assert_eq!(
            w.sum(Nanos::from_secs(11)),
            2,
            "second 1 has left the window"
        );
        assert_eq!(w.sum(Nanos::from_secs(14)), 2);
        assert_eq!(w.sum(Nanos::from_secs(16)), 0);
    }

    #[test]
    fn removal_takes_back_only_live_events() {
        let mut w = WindowCounter::new(Nanos::from_secs(10), 10);
        w.add(Nanos::from_secs(1), 2);
        w.add(Nanos::from_secs(5), 1);
        w.remove(Nanos::from_secs(1), 1);
        assert_eq!(w.sum(Nanos::from_secs(6)), 2);
        w.remove(Nanos::from_secs(5), 5);
        assert_eq!(
            w.sum(Nanos::from_secs(6)),
            1,
            "saturates at the slot's count"
        );
        w.add(Nanos::from_secs(11), 4);
        w.remove(Nanos::from_secs(1), 1);
        assert_eq!(
            w.sum(Nanos::from_secs(11)),
            4,
            "a reused slot is left alone"
        );
    }

    proptest! {
        /// The bucketed sum lies between a naive recount of events in the last
        /// `window - bucket width` and one over the whole `window`.
        #[test]
        fn agrees_with_a_naive_recount(mut times in proptest::collection::vec(0u64..100_000, 1..200), probe in 0u64..120_000) {
            times.sort_unstable();
            let mut w = WindowCounter::new(Nanos(10_000), 10);
            for &t in &times { w.add(Nanos(t), 1); }
            let probe = probe.max(*times.last().unwrap());
            let got = w.sum(Nanos(probe));
            let strict = times.iter().filter(|&&t| t + 9_000 > probe).count() as u64;
            let loose = times.iter().filter(|&&t| t + 10_000 > probe).count() as u64;
            prop_assert!(strict <= got && got <= loose, "strict {strict} got {got} loose {loose}");
        }
    }
}
