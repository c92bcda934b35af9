//! Prefill/decode disaggregation's concern: its configuration section, its metrics, the
//! prefill work this gateway has queued at each endpoint, and the request bodies of both legs
//! in the two wire protocols ([`body`]). The request path drives it (`crate::proxy`): the pool's
//! policy picks the decode endpoint, [`kvgate_core::disagg`] decides where the prefill runs.

pub(crate) mod body;

use crate::error::ConfigError;
use crate::metrics::{latency_histogram, Counter, Family, Histograms, Registry, Unit};
use kvgate_core::disagg::{Config as Decision, Decider};
use kvgate_core::policy::calibration::Coefficients;
use kvgate_core::EndpointId;
use prometheus_client::encoding::EncodeLabelSet;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// How the legs of a disaggregated request talk to their engines.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    /// vLLM's KV connector: the prefill answers with `kv_transfer_params`, then the decode
    /// leg carries them (vLLM's `toy_proxy_server`).
    #[default]
    Vllm,
    /// SGLang's bootstrap: both legs at once with the same `bootstrap_room`.
    Sglang,
}

impl Protocol {
    /// The protocol's name.
    pub fn label(self) -> &'static str {
        match self {
            Protocol::Vllm => "vllm",
            Protocol::Sglang => "sglang",
        }
    }
}

/// The pool's `disaggregation` section. It takes effect when an endpoint has `role: prefill`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DisaggConfig {
    /// The wire protocol of both legs.
    pub protocol: Protocol,
    /// When the prefill goes to a prefill endpoint (mode, threshold, link).
    pub decision: Decision,
    /// The longest a prefill leg may take before the request prefills on its decode endpoint.
    pub prefill_timeout_ms: u64,
    /// Prefill speed assumed for an endpoint the policy has learned nothing of (the same
    /// prior as `predicted_ttft`'s).
    pub prior_prefill_tokens_per_second: f64,
    /// Fixed time to first token assumed likewise.
    pub prior_fixed_ms: f64,
}

impl Default for DisaggConfig {
    fn default() -> Self {
        DisaggConfig {
            protocol: Protocol::Vllm,
            decision: Decision::default(),
            prefill_timeout_ms: 60_000,
            prior_prefill_tokens_per_second: 8_000.0,
            prior_fixed_ms: 20.0,
        }
    }
}

impl DisaggConfig {
    /// Checks every setting.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.decision.validate().map_err(|e| {
            ConfigError::invalid(format!("disaggregation.decision.{}", e.field), e.why)
        })?;
        if self.prefill_timeout_ms == 0 {
            return Err(ConfigError::invalid(
                "disaggregation.prefill_timeout_ms",
                "must be at least 1",
            ));
        }
        let prior = self.prior_prefill_tokens_per_second;
        if !(prior.is_finite() && prior > 0.0) {
            return Err(ConfigError::invalid(
                "disaggregation.prior_prefill_tokens_per_second",
                "must be a positive number",
            ));
        }
        if !(self.prior_fixed_ms.is_finite() && self.prior_fixed_ms >= 0.0) {
            return Err(ConfigError::invalid(
                "disaggregation.prior_fixed_ms",
                "must be a finite number, not negative",
            ));
        }
        Ok(())
    }

    /// The coefficients assumed for an endpoint without a learned model.
    pub fn prior(&self) -> Coefficients {
        Coefficients {
            fixed: self.prior_fixed_ms / 1e3,
            per_decode: 0.0,
            per_token: 1.0 / self.prior_prefill_tokens_per_second,
            interference: 0.0,
        }
    }
}

/// `mode` and `outcome` of a disaggregation decision.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DisaggLabels {
    /// `never`, `always`, `threshold` or `conditional`.
    pub mode: &'static str,
    /// `local` (decided so), `remote` (prefilled on a prefill endpoint), `fallback` (decided
    /// remote, the prefill leg failed, prefilled locally) or `rejected` (the prefill endpoint
    /// refused the request with a 4xx; the decode endpoint answered it).
    pub outcome: &'static str,
}

/// The prefill leg's protocol.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProtocolLabel {
    /// `vllm` or `sglang`.
    pub protocol: &'static str,
}

/// Disaggregation's families.
#[derive(Clone, Debug)]
pub struct DisaggMetrics {
    /// Requests of a pool with prefill endpoints, by mode and outcome.
    pub requests: Family<DisaggLabels, Counter>,
    /// Prefill legs from send to the decode leg's start (vLLM: the prefill's answer; SGLang:
    /// the prefill's answer or the decode's first bytes, whichever came first).
    pub prefill_leg: Histograms<ProtocolLabel>,
}

impl DisaggMetrics {
    /// Every family, registered in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = DisaggMetrics {
            requests: Family::default(),
            prefill_leg: Family::new_with_constructor(latency_histogram),
        };
        registry.register(
            "disagg_requests",
            "Requests of a pool with prefill endpoints by mode and outcome (local, remote, fallback, rejected)",
            metrics.requests.clone(),
        );
        registry.register_with_unit(
            "disagg_prefill_leg",
            "Prefill legs of disaggregated requests",
            Unit::Seconds,
            metrics.prefill_leg.clone(),
        );
        metrics
    }
}

/// Prefill tokens this gateway sent to each endpoint whose first token has not come: the
/// queue a new prefill there waits behind, as far as this gateway knows.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    queued: Mutex<HashMap<EndpointId, f64>>,
}

impl Ledger {
    /// Tokens queued at `endpoint`.
    pub(crate) fn queued(&self, endpoint: EndpointId) -> f64 {
        let queued = self.queued.lock().unwrap_or_else(|p| p.into_inner());
        queued.get(&endpoint).copied().unwrap_or(0.0)
    }

    fn add(&self, endpoint: EndpointId, tokens: f64) {
        let mut queued = self.queued.lock().unwrap_or_else(|p| p.into_inner());
        let q = queued.entry(endpoint).or_default();
        *q = (*q + tokens).max(0.0);
    }
}

/// A prefill's place in the [`Ledger`], given back when dropped (its first token came, or it
/// ended otherwise).
#[derive(Debug)]
pub(crate) struct Queued {
    ledger: Arc<Ledger>,
    endpoint: EndpointId,
    tokens: f64,
}

impl Drop for Queued {
    fn drop(&mut self) {
        self.ledger.add(self.endpoint, -self.tokens);
    }
}

impl Ledger {
    /// Queues `tokens` of prefill at `endpoint` until the guard drops.
    pub(crate) fn enqueue(self: &Arc<Self>, endpoint: EndpointId, tokens: f64) -> Queued {
        self.add(endpoint, tokens);
        Queued {
            ledger: self.clone(),
            endpoint,
            tokens,
        }
    }
}

/// The concern's state.
#[derive(Debug)]
pub(crate) struct Disagg {
    pub(crate) config: DisaggConfig,
    pub(crate) decider: Decider,
    pub(crate) metrics: DisaggMetrics,
    pub(crate) ledger: Arc<Ledger>,
}

impl Disagg {
    pub(crate) fn new(config: DisaggConfig, metrics: DisaggMetrics) -> Self {
        Disagg {
            decider: Decider::new(config.decision.clone()),
            config,
            metrics,
            ledger: Arc::default(),
        }
    }

    /// Counts one request's decision and outcome.
    pub(crate) fn count(&self, outcome: &'static str) {
        let mode = self.config.decision.mode.label();
        self.metrics
            .requests
            .get_or_create(&DisaggLabels { mode, outcome })
            .inc();
    }
}

#[cfg(test)]
mod tests;
