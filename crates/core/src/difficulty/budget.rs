//! The escalation budget: a cascade's escalations are retries of the same request on another
//! tier, so they get a retry budget (Envoy's `retry_budget`, tower's `Budget`; the SRE book's
//! rule of retries at most 10% of requests): a ratio of the recent requests plus a floor per
//! second, one budget per tenant and one over all of them. When the cheap tier degrades and
//! every answer looks unsure, the strong tier then sees at most `1 + ratio` of its share of
//! traffic instead of all of it.

use super::DifficultyError;
use crate::resilience::{RetryBudget, RetryBudgetConfig};
use crate::Nanos;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The budgets' parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EscalationBudgetConfig {
    /// Over all tenants.
    pub global: RetryBudgetConfig,
    /// For each tenant.
    pub per_tenant: RetryBudgetConfig,
    /// Tenants tracked one by one; later ones share one budget (the tenant names come from the
    /// keys' configuration, so this bounds memory only when it is misconfigured).
    pub max_tenants: usize,
}

impl Default for EscalationBudgetConfig {
    fn default() -> Self {
        EscalationBudgetConfig {
            global: RetryBudgetConfig {
                ratio: 0.1,
                min_per_sec: 1.0,
                window_ms: 10_000,
            },
            per_tenant: RetryBudgetConfig {
                ratio: 0.2,
                min_per_sec: 0.5,
                window_ms: 10_000,
            },
            max_tenants: 10_000,
        }
    }
}

impl EscalationBudgetConfig {
    /// Checks the ratios and floors.
    pub fn validate(&self) -> Result<(), DifficultyError> {
        for (what, b) in [
            ("escalation budget ratio", &self.global),
            ("escalation budget ratio", &self.per_tenant),
        ] {
            if !(b.ratio.is_finite()
                && b.ratio >= 0.0
                && b.min_per_sec.is_finite()
                && b.min_per_sec >= 0.0)
            {
                return Err(DifficultyError::OutOfRange {
                    what,
                    value: b.ratio,
                });
            }
            if b.window_ms == 0 {
                return Err(DifficultyError::Zero("escalation budget window_ms"));
            }
        }
        Ok(())
    }
}

/// Which budget refused an escalation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BudgetDenied {
    /// The tenant's own.
    Tenant,
    /// The one over all tenants.
    Global,
}

/// Requests and escalations per tenant and overall.
#[derive(Clone, Debug)]
pub struct EscalationBudget {
    config: EscalationBudgetConfig,
    global: RetryBudget,
    tenants: BTreeMap<String, RetryBudget>,
    overflow: RetryBudget,
}

impl EscalationBudget {
    /// Empty budgets.
    pub fn new(config: EscalationBudgetConfig) -> Result<EscalationBudget, DifficultyError> {
        config.validate()?;
        Ok(EscalationBudget {
            global: RetryBudget::new(config.global.clone()),
            overflow: RetryBudget::new(config.per_tenant.clone()),
            tenants: BTreeMap::new(),
            config,
        })
    }

    fn tenant(&mut self, tenant: &str) -> &mut RetryBudget {
        if !self.tenants.contains_key(tenant) && self.tenants.len() >= self.config.max_tenants {
            return &mut self.overflow;
        }
        let config = &self.config.per_tenant;
        self.tenants
            .entry(tenant.to_string())
            .or_insert_with(|| RetryBudget::new(config.clone()))
    }

    /// Records one request of `tenant` that could escalate.
    pub fn request(&mut self, tenant: &str, now: Nanos) {
        self.global.request(now);
        self.tenant(tenant).request(now);
    }

    /// Withdraws one escalation of `tenant` from both budgets, or says which refused (a
    /// tenant's withdrawal is given back when the global budget refuses).
    pub fn try_escalate(&mut self, tenant: &str, now: Nanos) -> Result<(), BudgetDenied> {
        if !self.tenant(tenant).try_retry(now) {
            return Err(BudgetDenied::Tenant);
        }
        if !self.global.try_retry(now) {
            self.tenant(tenant).refund(now);
            return Err(BudgetDenied::Global);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(tenant_ratio: f64, global_ratio: f64) -> EscalationBudget {
        let b = |ratio| RetryBudgetConfig {
            ratio,
            min_per_sec: 0.0,
            window_ms: 10_000,
        };
        EscalationBudget::new(EscalationBudgetConfig {
            global: b(global_ratio),
            per_tenant: b(tenant_ratio),
            max_tenants: 2,
        })
        .unwrap()
    }

    #[test]
    fn a_storm_is_held_to_the_ratio() {
        let mut b = budget(0.5, 0.1);
        let now = Nanos::from_secs(1);
        for _ in 0..100 {
            b.request("a", now);
        }
        let granted = (0..100)
            .filter(|_| b.try_escalate("a", now).is_ok())
            .count();
        assert_eq!(granted, 10, "the global tenth");
        assert_eq!(b.try_escalate("a", now), Err(BudgetDenied::Global));
    }

    #[test]
    fn one_tenant_cannot_spend_anothers_share() {
        let mut b = budget(0.1, 1.0);
        let now = Nanos::from_secs(1);
        for _ in 0..100 {
            b.request("a", now);
            b.request("b", now);
        }
        assert_eq!(
            (0..50).filter(|_| b.try_escalate("a", now).is_ok()).count(),
            10
        );
        assert_eq!(b.try_escalate("a", now), Err(BudgetDenied::Tenant));
        assert!(b.try_escalate("b", now).is_ok());
    }

    #[test]
    fn tenants_past_the_bound_share_one_budget() {
        let mut b = budget(0.1, 1.0);
        let now = Nanos::from_secs(1);
        for t in ["a", "b", "c", "d"] {
            for _ in 0..10 {
                b.request(t, now);
            }
        }
        assert_eq!(b.tenants.len(), 2);
        assert!(b.try_escalate("c", now).is_ok());
        assert!(b.try_escalate("d", now).is_ok());
        assert_eq!(
            b.try_escalate("c", now),
            Err(BudgetDenied::Tenant),
            "c and d share 2 of 20"
        );
        let bad = EscalationBudgetConfig {
            global: RetryBudgetConfig {
                ratio: -1.0,
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(EscalationBudget::new(bad).is_err());
    }
}
