//! The gateway's clock as kvgate-core's [`Nanos`]: real monotonic time since the gateway
//! started, or a manual clock that tests move by hand (so pool tests run on simulated time).

use kvgate_core::Nanos;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The gateway's clock. Cheap to clone; clones of a manual clock move together.
#[derive(Clone, Debug)]
pub enum Clock {
    /// Monotonic real time since `origin`.
    Real {
        /// When the clock read zero.
        origin: Instant,
    },
    /// Time that moves only when [`Clock::advance`] is called.
    Manual(Arc<AtomicU64>),
}

impl Clock {
    /// A real clock starting now.
    pub fn new() -> Self {
        Clock::Real {
            origin: Instant::now(),
        }
    }

    /// A manual clock at zero.
    pub fn manual() -> Self {
        Clock::Manual(Arc::new(AtomicU64::new(0)))
    }

    /// Moves a manual clock forward; a real clock ignores it.
    pub fn advance(&self, by: Duration) {
        if let Clock::Manual(now) = self {
            let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
            now.fetch_add(by, Ordering::SeqCst);
        }
    }

    /// Now.
    pub fn now(&self) -> Nanos {
        match self {
            Clock::Real { origin } => since(*origin, Instant::now()),
            Clock::Manual(now) => Nanos(now.load(Ordering::SeqCst)),
        }
    }
}

fn since(origin: Instant, instant: Instant) -> Nanos {
    Nanos(u64::try_from(instant.saturating_duration_since(origin).as_nanos()).unwrap_or(u64::MAX))
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

/// Microseconds since the Unix epoch: the wall clock replicas on different hosts compare (NTP
/// keeps them within a millisecond or so).
pub(crate) fn now_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}
