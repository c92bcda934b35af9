//! Exponential backoff with full jitter: the wait before retry `n` (0-based) is uniform in
//! `[0, min(cap, base * 2^n)]` (AWS Architecture Blog, "Exponential Backoff And Jitter", 2015:
//! full jitter spreads synchronised clients best for the least total work).

use crate::Nanos;
use rand::{Rng, RngCore};
use serde::{Deserialize, Serialize};

/// Backoff parameters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Backoff {
    /// The ceiling of the first wait.
    pub base_ms: u64,
    /// The largest ceiling.
    pub cap_ms: u64,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            base_ms: 25,
            cap_ms: 1_000,
        }
    }
}

impl Backoff {
    /// The ceiling for retry `attempt` (0-based): `min(cap, base * 2^attempt)`.
    pub fn ceiling(&self, attempt: u32) -> Nanos {
        let factor = 1u64.checked_shl(attempt.min(62)).unwrap_or(u64::MAX);
        Nanos::from_millis(self.base_ms.saturating_mul(factor).min(self.cap_ms))
    }

    /// The wait before retry `attempt`, drawn uniformly from `[0, ceiling(attempt)]`.
    pub fn delay(&self, attempt: u32, rng: &mut dyn RngCore) -> Nanos {
        let ceiling = self.ceiling(attempt).0;
        Nanos(rng.random_range(0..=ceiling))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::SeedableRng;

    #[test]
    fn ceilings_double_up_to_the_cap() {
        let b = Backoff {
            base_ms: 10,
            cap_ms: 75,
        };
        let c: Vec<u64> = (0..5).map(|n| b.ceiling(n).0 / 1_000_000).collect();
        assert_eq!(c, vec![10, 20, 40, 75, 75]);
        assert_eq!(b.ceiling(200), Nanos::from_millis(75));
    }

    proptest! {
        #[test]
        fn delays_stay_within_the_ceiling(seed in any::<u64>(), attempt in 0u32..80) {
            let b = Backoff::default();
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            prop_assert!(b.delay(attempt, &mut rng) <= b.ceiling(attempt));
        }
    }
}
