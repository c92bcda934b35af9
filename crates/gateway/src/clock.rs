//! The gateway's clock: real monotonic time as kvgate-core's [`Nanos`], since the gateway started.

use kvgate_core::Nanos;
use std::time::Instant;

/// The gateway's monotonic clock as [`Nanos`] since the gateway started.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    origin: Instant,
}

impl Clock {
    /// A clock starting now.
    pub fn new() -> Self {
        Clock {
            origin: Instant::now(),
        }
    }

    /// Now.
    pub fn now(&self) -> Nanos {
        self.at(Instant::now())
    }

    /// `instant` on this clock.
    pub fn at(&self, instant: Instant) -> Nanos {
        Nanos(
            u64::try_from(instant.saturating_duration_since(self.origin).as_nanos())
                .unwrap_or(u64::MAX),
        )
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}
