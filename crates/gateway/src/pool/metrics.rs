//! The pool's own families: each endpoint's state and what the policy learned of it, and the
//! decisions.

use crate::metrics::{
    decision_histogram, Counter, EndpointLabel, Family, FloatGauge, Gauge, Histogram, PickLabels,
    ReasonLabel, Registry, ResultLabel, Unit,
};

/// The pool's endpoints and decisions.
#[derive(Clone, Debug)]
pub struct PoolMetrics {
    /// Breaker state per endpoint (0 closed, 1 half-open, 2 open).
    pub breaker: Family<EndpointLabel, Gauge>,
    /// Whether an endpoint is routable (1) or not (0).
    pub endpoint_up: Family<EndpointLabel, Gauge>,
    /// Requests this gateway has in flight per endpoint.
    pub inflight: Family<EndpointLabel, Gauge>,
    /// Policy picks by reason.
    pub picks: Family<PickLabels, Counter>,
    /// Time the policy took to decide.
    pub decision: Histogram,
    /// Cached-token predictions scored against the engine's usage.
    pub cache_prediction: Family<ResultLabel, Counter>,
    /// Learned prefill speed per endpoint (`predicted_ttft`).
    pub prefill_rate: Family<EndpointLabel, FloatGauge>,
    /// Engine iteration time per endpoint, from the streams relayed.
    pub iteration: Family<EndpointLabel, FloatGauge>,
    /// Learned fixed time to first token per endpoint (`predicted_ttft`).
    pub ttft_fixed: Family<EndpointLabel, FloatGauge>,
    /// Learned speed relative to the fleet per endpoint (`predicted_ttft`).
    pub speed_factor: Family<EndpointLabel, FloatGauge>,
    /// Attempts placed below the first priority tier, by why (`unavailable`, `ttft`, `queue`).
    pub spillover: Family<ReasonLabel, Counter>,
    /// LoRA requests the gate held, by how the hold ended (`released`, `bound`, `gone`).
    pub lora_held: Family<ReasonLabel, Counter>,
    /// How long the LoRA gate held each request it held.
    pub lora_hold: Histogram,
    /// LoRA requests the gate holds now.
    pub lora_holding: Gauge,
}

impl PoolMetrics {
    /// Every family, registered in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = PoolMetrics {
            breaker: Family::default(),
            endpoint_up: Family::default(),
            inflight: Family::default(),
            picks: Family::default(),
            decision: decision_histogram(),
            cache_prediction: Family::default(),
            prefill_rate: Family::default(),
            iteration: Family::default(),
            ttft_fixed: Family::default(),
            speed_factor: Family::default(),
            spillover: Family::default(),
            lora_held: Family::default(),
            lora_hold: crate::metrics::latency_histogram(),
            lora_holding: Gauge::default(),
        };
        metrics.register_lora(registry);
        registry.register(
            "breaker_state",
            "Circuit breaker per endpoint: 0 closed, 1 half-open, 2 open",
            metrics.breaker.clone(),
        );
        registry.register(
            "endpoint_up",
            "1 when the endpoint is routable",
            metrics.endpoint_up.clone(),
        );
        registry.register(
            "inflight_requests",
            "Requests in flight per endpoint",
            metrics.inflight.clone(),
        );
        registry.register(
            "picks",
            "Policy decisions by reason: affinity, miss, escape, hash_owner, overflow, predicted, least_loaded, ...",
            metrics.picks.clone(),
        );
        registry.register_with_unit(
            "decision",
            "Time the policy took to choose an endpoint",
            Unit::Seconds,
            metrics.decision.clone(),
        );
        registry.register(
            "cache_prediction",
            "Predicted cached prompt tokens against the engine's usage: exact (within one block), over or under",
            metrics.cache_prediction.clone(),
        );
        registry.register(
            "endpoint_prefill_tokens_per_second",
            "Learned prefill speed per endpoint (predicted_ttft)",
            metrics.prefill_rate.clone(),
        );
        registry.register_with_unit(
            "endpoint_iteration",
            "Engine iteration time per endpoint, from the gaps between chunks of the streams relayed",
            Unit::Seconds,
            metrics.iteration.clone(),
        );
        registry.register_with_unit(
            "endpoint_ttft_fixed",
            "Learned fixed time to first token per endpoint (predicted_ttft)",
            Unit::Seconds,
            metrics.ttft_fixed.clone(),
        );
        registry.register(
            "endpoint_speed_factor",
            "Learned slowness relative to the fleet per endpoint, 1 = fleet speed (predicted_ttft)",
            metrics.speed_factor.clone(),
        );
        registry.register(
            "spillover",
            "Attempts placed below the first priority tier: unavailable (every higher tier out), ttft or queue (spilled by the spillover thresholds), session (a spilled session kept on its tier)",
            metrics.spillover.clone(),
        );
        metrics
    }

    /// The LoRA gate's families.
    fn register_lora(&self, registry: &mut Registry) {
        registry.register(
            "lora_held",
            "LoRA requests the gate held while another adapter waited behind their adapter's batch, by how the hold ended: released (that adapter's turn started), bound (lora.gate.max_hold_ms), gone (the client left)",
            self.lora_held.clone(),
        );
        registry.register_with_unit(
            "lora_hold",
            "Time the LoRA gate held a request",
            Unit::Seconds,
            self.lora_hold.clone(),
        );
        registry.register(
            "lora_holding",
            "LoRA requests the gate holds now",
            self.lora_holding.clone(),
        );
    }
}
