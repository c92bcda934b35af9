//! Metrics per tenant. Label values are bounded: a tenant named in the configuration (or by a
//! key) is its own label, every other tenant is `other`, so hashed client keys cannot grow the
//! series without limit.

use crate::metrics::{Counter, Family, FloatGauge, ReasonLabel};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

/// A tenant.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabel {
    /// Its name, or `other`.
    pub tenant: String,
}

/// A tenant and a kind of token.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TokenLabels {
    /// The tenant.
    pub tenant: String,
    /// `input` (uncached), `cached_input` or `output`.
    pub kind: &'static str,
}

/// A tenant and why it was refused.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabels {
    /// The tenant (`unknown` for a request without a valid key).
    pub tenant: String,
    /// `unauthorized`, `model_not_allowed`, `budget`, or the rate limit: `requests`,
    /// `input_tokens`, `output_tokens`, `concurrency`.
    pub reason: &'static str,
}

/// A budget account.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AccountLabels {
    /// `key:NAME` or `tenant:NAME`.
    pub account: String,
    /// `tokens` or `usd`.
    pub unit: &'static str,
}

/// See the module documentation.
#[derive(Clone, Debug)]
pub struct TenantMetrics {
    /// Requests admitted past keys, limits and budgets.
    pub admitted: Family<TenantLabel, Counter>,
    /// Tokens served, from the engines' usage.
    pub tokens: Family<TokenLabels, Counter>,
    /// Weighted service (the fair queue's unit: tokens times their weight).
    pub service: Family<TenantLabel, Counter<f64, std::sync::atomic::AtomicU64>>,
    /// Requests refused before admission.
    pub refused: Family<RefusalLabels, Counter>,
    /// Spend per budget account (settled, as persisted).
    pub spend: Family<AccountLabels, FloatGauge>,
    /// Fan-out serialisation: `led`, `released` (a held call went after its leader's first
    /// token or failure), `timeout` (it went after the longest wait), `stepped_down` (it would
    /// have led but a peer replica claimed the prefix first).
    pub fanout: Family<ReasonLabel, Counter>,
    /// Time held calls waited for their leader.
    pub fanout_wait: Histogram,
}

impl Default for TenantMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl TenantMetrics {
    /// Empty metrics.
    pub fn new() -> Self {
        TenantMetrics {
            admitted: Family::default(),
            tokens: Family::default(),
            service: Family::default(),
            refused: Family::default(),
            spend: Family::default(),
            fanout: Family::default(),
            fanout_wait: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
        }
    }

    /// Registers every metric.
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "tenant_admitted_requests",
            "Requests admitted past keys, rate limits and budgets, per tenant",
            self.admitted.clone(),
        );
        registry.register(
            "tenant_tokens",
            "Tokens served per tenant from the engines' usage: input (uncached), cached_input, output",
            self.tokens.clone(),
        );
        registry.register(
            "tenant_service_weighted_tokens",
            "Weighted service per tenant, the fair queue's unit",
            self.service.clone(),
        );
        registry.register(
            "tenant_refused_requests",
            "Requests refused before admission per tenant and reason",
            self.refused.clone(),
        );
        registry.register(
            "budget_spend",
            "Settled spend per budget account",
            self.spend.clone(),
        );
        registry.register(
            "fanout_calls",
            "Fan-out serialisation: led, released, timeout",
            self.fanout.clone(),
        );
        registry.register_with_unit(
            "fanout_wait",
            "Time held fan-out calls waited for their leader's first token",
            Unit::Seconds,
            self.fanout_wait.clone(),
        );
    }
}
