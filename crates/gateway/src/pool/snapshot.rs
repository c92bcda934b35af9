//! The endpoints as last published, and everything that reads only them: readiness,
//! `/v1/models`, the admin API's status and the per-endpoint gauges never take the pool's lock.

use super::endpoint::EndpointInfo;
use super::Pool;
use crate::endpoint_config::EndpointConfig;
use crate::metrics;
use kvgate_core::resilience::BreakerState;
use kvgate_core::{EndpointId, Health, Observation};
use serde::Serialize;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// One endpoint as the admin API reports it.
#[derive(Clone, Debug, Serialize)]
pub struct EndpointStatus {
    /// Identity.
    pub id: EndpointId,
    /// Display name.
    pub name: String,
    /// Base URL.
    pub url: String,
    /// Models it serves (configured or discovered).
    pub models: Vec<String>,
    /// Weight.
    pub weight: f64,
    /// Labels.
    pub labels: std::collections::BTreeMap<String, String>,
    /// `healthy`, `draining` or `unhealthy` as the policy currently sees it.
    pub health: Health,
    /// Why it takes no traffic now (down and the cause with its fix, draining, cooling down
    /// and for how long); absent while it takes traffic.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What it is routed without (its load signals, when `/metrics` fails); absent when
    /// nothing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
    /// Breaker state.
    pub breaker: BreakerState,
    /// Last scrape.
    pub observation: Option<Observation>,
    /// Requests this gateway has in flight there.
    pub inflight: u32,
    /// How long its engine's iterations take, milliseconds, from the gaps between the
    /// chunks of the streams this gateway relays ([`kvgate_core::Cadence`]); absent until
    /// a stream has shown two iterations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iteration_ms: Option<f64>,
    /// Its KV-event stream (trust, entries held, next sequence number), once one arrived.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_events: Option<kvgate_core::index::events::StreamStatus>,
    /// Its LoRA adapters as its engine last reported them (`vllm:lora_requests_info`, SGLang's
    /// adapter pool); absent when it reports none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adapters: Option<kvgate_core::lora::AdapterState>,
}

/// The endpoints as last published: read without the lock.
#[derive(Debug, Default)]
pub(super) struct Snapshot {
    pub(super) policy: &'static str,
    pub(super) endpoints: Vec<EndpointInfo>,
    /// Whether any endpoint prefills only, derived once per publication so the request path
    /// asks without scanning the endpoints.
    pub(super) has_prefill: bool,
}

impl Snapshot {
    pub(super) fn get(&self, id: EndpointId) -> Option<&EndpointInfo> {
        self.endpoints
            .binary_search_by_key(&id, |e| e.id)
            .ok()
            .map(|i| &self.endpoints[i])
    }
}

impl Pool {
    /// Ids and configs of every endpoint.
    pub fn configs(&self) -> Vec<(EndpointId, EndpointConfig)> {
        let snapshot = self.snapshot.load();
        snapshot
            .endpoints
            .iter()
            .map(|e| (e.id, e.about.config.clone()))
            .collect()
    }

    /// Ids of every endpoint.
    pub fn endpoint_ids(&self) -> Vec<EndpointId> {
        self.snapshot
            .load()
            .endpoints
            .iter()
            .map(|e| e.id)
            .collect()
    }

    /// The base URL of an endpoint still in the pool.
    pub fn base_of(&self, id: EndpointId) -> Option<Arc<str>> {
        self.snapshot.load().get(id).map(|e| e.about.base.clone())
    }

    /// The iteration clock of an endpoint still in the pool, which its streams tick.
    pub fn cadence_of(&self, id: EndpointId) -> Option<Arc<super::CadenceCell>> {
        self.snapshot.load().get(id).map(|e| e.cadence.clone())
    }

    /// Where an endpoint still in the pool publishes KV events, if configured.
    pub fn kv_events_of(&self, id: EndpointId) -> Option<String> {
        self.snapshot.load().get(id)?.about.config.kv_events.clone()
    }

    /// The display name of an endpoint still in the pool.
    pub fn name_of(&self, id: EndpointId) -> Option<Arc<str>> {
        self.snapshot.load().get(id).map(|e| e.about.name.clone())
    }

    /// Whether `endpoint` still lacks a model name.
    pub fn needs_models(&self, endpoint: EndpointId) -> bool {
        self.snapshot
            .load()
            .get(endpoint)
            .is_some_and(|e| e.about.models.is_empty())
    }

    /// Whether some endpoint serves `model` (endpoints of unknown model serve anything).
    pub fn serves(&self, model: &str) -> bool {
        let snapshot = self.snapshot.load();
        snapshot
            .endpoints
            .iter()
            .any(|e| e.about.serves(Some(model)))
    }

    /// The models of the pool, sorted and deduplicated.
    pub fn models(&self) -> Vec<String> {
        let snapshot = self.snapshot.load();
        let mut models: Vec<String> = snapshot
            .endpoints
            .iter()
            .flat_map(|e| {
                e.about
                    .models
                    .iter()
                    .chain(&e.about.config.served_as)
                    .cloned()
            })
            .collect();
        models.sort();
        models.dedup();
        models
    }

    /// Whether at least one endpoint passes its health checks (readiness). A Retry-After
    /// window or an open breaker does not count: they are short, and every gateway replica sees
    /// them at once, so a readiness probe following them would take all replicas out of a
    /// Kubernetes Service together.
    pub fn any_healthy(&self) -> bool {
        let snapshot = self.snapshot.load();
        snapshot.endpoints.iter().any(|e| e.passes_health_checks())
    }

    /// The endpoints where a request this gateway sent (or a peer shared) awaits its first
    /// token; a non-streamed request counts until it ends. A continuation yields to them
    /// (`crate::resume`).
    pub fn awaiting_first_token(&self) -> Vec<EndpointId> {
        let core = self.lock();
        let router = core.dispatch.router();
        core.endpoints
            .iter()
            .map(|e| e.id)
            .filter(|&id| router.awaiting_first_token(id) > 0)
            .collect()
    }

    /// The endpoints whose engine metrics (vLLM's or SGLang's) the scrapes have not read: a
    /// hosted API, or an engine not yet scraped.
    pub fn without_engine_metrics(&self) -> Vec<EndpointId> {
        let core = self.lock();
        core.dispatch
            .router()
            .views()
            .iter()
            .filter(|v| v.observation.is_none())
            .map(|v| v.id)
            .collect()
    }

    /// How many of this gateway's requests to `endpoint` await their first token.
    pub fn awaiting_first_token_at(&self, endpoint: EndpointId) -> u32 {
        self.lock().dispatch.router().awaiting_first_token(endpoint)
    }

    /// How long until an endpoint serving `model`, now kept out only by a Retry-After window or
    /// an open breaker, takes traffic again: the `Retry-After` of a 503 when nothing is
    /// routable. `None` when no such endpoint exists.
    pub fn routable_again_in(&self, model: Option<&str>) -> Option<Duration> {
        let now = self.clock.now();
        let snapshot = self.snapshot.load();
        snapshot
            .endpoints
            .iter()
            .filter(|e| e.about.serves(model))
            .filter_map(|e| e.routable_again_at(now))
            .min()
            .map(|at| Duration::from_nanos(at.0.saturating_sub(now.0)))
    }

    /// Every endpoint's status; also refreshes the per-endpoint gauges.
    pub fn status(&self) -> Vec<EndpointStatus> {
        let now = self.clock.now();
        let snapshot = self.snapshot.load();
        let adapters = self.adapter_states();
        let cache = self.cache.read().unwrap_or_else(|p| p.into_inner());
        snapshot
            .endpoints
            .iter()
            .map(|e| {
                let health = e.health(now);
                let breaker = e.breaker.state(now);
                let inflight = e.inflight.load(Ordering::Relaxed);
                let label = metrics::endpoint(&e.about.name);
                self.metrics
                    .endpoint_up
                    .get_or_create(&label)
                    .set(i64::from(health == Health::Healthy));
                self.metrics
                    .breaker
                    .get_or_create(&label)
                    .set(breaker.as_gauge());
                self.metrics
                    .inflight
                    .get_or_create(&label)
                    .set(i64::from(inflight));
                let iteration = e
                    .cadence
                    .get()
                    .filter(|c| c.interval.0 > 0)
                    .map(|c| c.interval.as_secs_f64());
                if let Some(seconds) = iteration {
                    self.metrics.iteration.get_or_create(&label).set(seconds);
                }
                EndpointStatus {
                    id: e.id,
                    name: e.about.name.to_string(),
                    url: e.about.base.to_string(),
                    models: e.about.models.clone(),
                    weight: e.about.config.weight,
                    labels: e.about.config.labels.clone(),
                    health,
                    reason: super::unroutable::reason(e, now),
                    warning: super::unroutable::warning(e),
                    breaker,
                    observation: e.observation,
                    inflight,
                    iteration_ms: iteration.map(|s| s * 1e3),
                    kv_events: cache.engine_status(e.id),
                    adapters: adapters.get(&e.id).cloned(),
                }
            })
            .collect()
    }
}
