//! A deployment's own rate limits (`endpoints[].limits`: requests, input and output tokens per
//! minute, concurrency), as a hosted provider enforces them on its account: an endpoint over
//! any of them is left out of the pick, so the next endpoint of its tier, or the next tier,
//! takes the request, as LiteLLM routes around a deployment at its RPM/TPM. Charged at dispatch
//! from the request's estimate ([`crate::tenancy::ChargeModel`]) and corrected from the engine's
//! usage when the attempt ends; an attempt that fails before its first token gives its tokens
//! back (a provider does not bill it) but not its request.

use crate::tenancy::{Charge, LimitsConfig, RateLimiter, TokenWeights};
use crate::{Nanos, Usage};
use std::collections::HashMap;

/// See the module documentation.
#[derive(Debug)]
pub struct DeploymentLimits {
    limiter: RateLimiter,
    /// What each attempt in flight here was charged, by request id.
    charged: HashMap<u64, Charge>,
}

impl DeploymentLimits {
    /// Limits as configured, full at `now`.
    pub fn new(config: &LimitsConfig, now: Nanos) -> Self {
        DeploymentLimits {
            limiter: RateLimiter::new(config, TokenWeights::default(), now),
            charged: HashMap::new(),
        }
    }

    /// Whether `charge` fits every limit now.
    pub fn admits(&mut self, now: Nanos, charge: &Charge) -> bool {
        self.limiter.check(now, charge).is_ok()
    }

    /// Request `id` was sent here with `charge`.
    pub fn dispatched(&mut self, id: u64, now: Nanos, charge: Charge) {
        self.limiter.commit(now, &charge);
        self.charged.insert(id, charge);
    }

    /// Request `id`'s attempt here ended; `usage` when it was answered.
    pub fn ended(&mut self, id: u64, now: Nanos, usage: Option<&Usage>) {
        if let Some(estimated) = self.charged.remove(&id) {
            let actual = usage.map(Charge::from_usage).unwrap_or_default();
            self.limiter.settle(now, &estimated, &actual);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deployment_at_its_rpm_refuses_until_it_refills_and_failures_refund_tokens() {
        let config = LimitsConfig {
            rpm: Some(60.0),
            input_tpm: Some(6_000.0),
            burst_secs: Some(2.0),
            ..LimitsConfig::default()
        };
        let mut limits = DeploymentLimits::new(&config, Nanos::ZERO);
        let charge = Charge {
            input: 100.0,
            ..Charge::default()
        };
        let t0 = Nanos::ZERO;
        // Two seconds of burst: two requests of one per second.
        assert!(limits.admits(t0, &charge));
        limits.dispatched(1, t0, charge);
        assert!(limits.admits(t0, &charge));
        limits.dispatched(2, t0, charge);
        assert!(!limits.admits(t0, &charge), "the request bucket is empty");
        assert!(limits.admits(Nanos::from_secs_f64(1.0), &charge));
        // A failed attempt gives its input tokens back, not its request.
        limits.ended(1, Nanos::from_secs_f64(1.0), None);
        limits.ended(2, Nanos::from_secs_f64(1.0), None);
        assert!(limits.charged.is_empty());
    }
}
