//! An endpoint's iteration clock ([`kvgate_core::Cadence`]) kept outside the pool's lock: every
//! chunk of every stream ticks it, and a pick copies it into the router's view. Two atomics,
//! not a mutex: chunks of one iteration arriving on several streams at once may race, and the
//! clock is an estimate that either writer's result serves equally.

use kvgate_core::{Cadence, Nanos};
use std::sync::atomic::{AtomicU64, Ordering};

/// See the module documentation. A `last_at` of zero means no tokens seen yet.
#[derive(Debug, Default)]
pub struct CadenceCell {
    last_at: AtomicU64,
    interval: AtomicU64,
}

impl CadenceCell {
    /// The clock, once a stream has delivered tokens.
    pub fn get(&self) -> Option<Cadence> {
        let last_at = self.last_at.load(Ordering::Relaxed);
        (last_at != 0).then(|| Cadence {
            last_at: Nanos(last_at),
            interval: Nanos(self.interval.load(Ordering::Relaxed)),
        })
    }

    /// A stream from this endpoint delivered tokens at `at`.
    pub fn tick(&self, at: Nanos) {
        let next = match self.get() {
            Some(mut c) => {
                c.tick(at);
                c
            }
            None => Cadence::starting(at),
        };
        self.interval.store(next.interval.0, Ordering::Relaxed);
        self.last_at.store(next.last_at.0.max(1), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_make_the_clock_a_pick_reads() {
        let cell = CadenceCell::default();
        assert_eq!(cell.get(), None);
        cell.tick(Nanos(5_000_000));
        cell.tick(Nanos(5_100_000));
        cell.tick(Nanos(25_000_000));
        let c = cell.get().expect("ticked");
        assert_eq!(c.last_at, Nanos(25_000_000));
        assert_eq!(c.interval, Nanos(20_000_000));
        assert_eq!(c.remaining(Nanos(30_000_000)), Some(Nanos(15_000_000)));
    }
}
