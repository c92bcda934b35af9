//! Every metric family the gateway exports, composed into one registry: each concern registers
//! its own families (`crate::metrics` for requests and usage, the pool, admission, the watch,
//! continuations, tenancy, KV events, the cluster, the listeners) and `/metrics` encodes them
//! all.

use crate::admission::AdmissionMetrics;
use crate::cluster::ClusterMetrics;
use crate::disagg::DisaggMetrics;
use crate::engine_state::EngineStateMetrics;
use crate::listener::ConnectionMetrics;
use crate::metrics::{Counter, Family, ReasonLabel, Registry, RequestMetrics, UsageMetrics};
use crate::pool::PoolMetrics;
use crate::resume::ResumeMetrics;
use crate::tenancy::TenantMetrics;
use crate::watch::WatchMetrics;
use std::sync::Arc;

/// Every family, by concern.
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Registry,
    /// Requests as clients see them.
    pub(crate) requests: RequestMetrics,
    /// Tokens and dollars per endpoint.
    pub(crate) usage: UsageMetrics,
    /// Endpoints and decisions.
    pub(crate) pool: PoolMetrics,
    /// The admission queue.
    pub(crate) admission: AdmissionMetrics,
    /// The engines' scrapes.
    pub(crate) watch: WatchMetrics,
    /// Continuations and re-homing.
    pub(crate) resume: ResumeMetrics,
    /// Per-tenant admission, tokens, refusals, budgets and fan-out serialisation.
    pub(crate) tenants: TenantMetrics,
    /// Exact tokenization and KV-event ingestion.
    pub(crate) engine_state: EngineStateMetrics,
    /// State sharing between replicas.
    pub(crate) cluster: Arc<ClusterMetrics>,
    /// Client connections.
    pub(crate) connections: ConnectionMetrics,
    /// Discovery polls by result (`ok`, `error`).
    pub(crate) discovery: Family<ReasonLabel, Counter>,
    /// Configuration file reloads, `applied` or `rejected`.
    pub(crate) config_reloads: Family<ReasonLabel, Counter>,
    /// The semantic cache.
    pub(crate) semcache: Arc<crate::semcache::SemCacheMetrics>,
    /// Difficulty routing: tiers, escalations, the strong tier's load, thresholds.
    pub(crate) difficulty: crate::difficulty::DifficultyMetrics,
    /// Prefill/decode disaggregation.
    pub(crate) disagg: DisaggMetrics,
    /// LoRA adapters loaded on demand.
    pub(crate) lora_loads: crate::lora_load::LoadMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every family.
    pub(crate) fn new() -> Self {
        let mut registry = Registry::with_prefix("kvgate");
        let r = &mut registry;
        let (tenants, engine_state) = (TenantMetrics::new(), EngineStateMetrics::new());
        tenants.register(r);
        engine_state.register(r);
        let cluster = Arc::new(ClusterMetrics::default());
        cluster.register(r);
        let connections = ConnectionMetrics::default();
        connections.register(r);
        let discovery = Family::default();
        r.register(
            "discovery_polls",
            "Polls of the Kubernetes API for an InferencePool's pods, by result (ok, error)",
            discovery.clone(),
        );
        let config_reloads = Family::default();
        r.register(
            "config_reloads",
            "Configuration file changes applied, or rejected (the running configuration stays)",
            config_reloads.clone(),
        );
        let semcache = Arc::new(crate::semcache::SemCacheMetrics::register(r));
        let difficulty = crate::difficulty::DifficultyMetrics::default();
        difficulty.register(r);
        Metrics {
            semcache,
            difficulty,
            requests: RequestMetrics::register(r),
            usage: UsageMetrics::register(r),
            pool: PoolMetrics::register(r),
            admission: AdmissionMetrics::register(r),
            watch: WatchMetrics::register(r),
            resume: ResumeMetrics::register(r),
            disagg: DisaggMetrics::register(r),
            lora_loads: crate::lora_load::LoadMetrics::register(r),
            tenants,
            engine_state,
            cluster,
            connections,
            discovery,
            config_reloads,
            registry,
        }
    }

    /// Prometheus text exposition.
    pub(crate) fn encode(&self) -> String {
        let mut out = String::with_capacity(16 * 1024);
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::PolicyLabel;

    #[test]
    fn names_carry_the_prefix_and_units() {
        let m = Metrics::new();
        m.requests.request("ok", "round_robin", "e0");
        m.requests
            .ttft
            .get_or_create(&PolicyLabel {
                policy: "round_robin",
            })
            .observe(0.01);
        let text = m.encode();
        assert!(
            text.contains(
                "kvgate_requests_total{outcome=\"ok\",policy=\"round_robin\",endpoint=\"e0\"} 1"
            ),
            "{text}"
        );
        assert!(text.contains("kvgate_ttft_seconds_bucket"), "{text}");
        assert!(text.contains("kvgate_pending_requests"), "{text}");
    }

    /// The families `encode` announces, by the names a scraper sees (`_total` on counters).
    fn exposed(text: &str) -> std::collections::BTreeSet<String> {
        text.lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| match l.split_once(' ') {
                Some((name, "counter")) => format!("{name}_total"),
                Some((name, _)) => name.to_owned(),
                None => l.to_owned(),
            })
            .collect()
    }

    #[test]
    fn every_metric_is_documented_and_every_documented_one_exists() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/metrics.md");
        let doc = std::fs::read_to_string(path).unwrap();
        let documented: std::collections::BTreeSet<String> = doc
            .lines()
            .filter_map(|l| l.strip_prefix("| `")?.split('`').next())
            .map(str::to_owned)
            .collect();
        let exposed = exposed(&Metrics::new().encode());
        assert!(exposed.len() > 50, "{exposed:?}");
        let undocumented: Vec<_> = exposed.difference(&documented).collect();
        let gone: Vec<_> = documented.difference(&exposed).collect();
        assert!(
            undocumented.is_empty(),
            "not in docs/metrics.md: {undocumented:?}"
        );
        assert!(
            gone.is_empty(),
            "in docs/metrics.md but not exposed: {gone:?}"
        );
    }
}
