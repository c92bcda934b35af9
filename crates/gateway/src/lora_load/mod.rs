//! Loading a LoRA adapter on demand (`lora.on_demand`, off by default). vLLM and SGLang load an
//! adapter at runtime on `POST /v1/load_lora_adapter` `{"lora_name", "lora_path"}` (vLLM with
//! `VLLM_ALLOW_RUNTIME_LORA_UPDATING`, SGLang always); a request naming an adapter no endpoint
//! of its base model lists would otherwise be a 404. With `on_demand` on, the gateway picks the
//! least loaded healthy endpoint of the base model, asks it to load the adapter from the path
//! configured for its name, and routes the request there. Concurrent requests for the same
//! adapter wait on one load per endpoint (singleflight): an engine refuses a second load of a
//! name it holds, and a burst for a new adapter must not turn into a burst of disk reads.

use crate::error::{ApiError, ConfigError};
use crate::metrics::{Counter, Family, ReasonLabel, Registry};
use crate::pool::{EndpointStatus, Pool};
use crate::upstream::{self, HttpClient};
use bytes::Bytes;
use http_body_util::Full;
use kvgate_core::EndpointId;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::OnceCell;

/// The `lora` section.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoraConfig {
    /// Load an adapter no endpoint lists when a request names it.
    pub on_demand: bool,
    /// Where each adapter that may be loaded lives, by name (the `lora_path` sent to the engine,
    /// a path on the engine's machine or a Hugging Face repository id).
    pub paths: BTreeMap<String, String>,
    /// How long a load may take before the request gets a 503.
    pub load_timeout_ms: u64,
    /// Gated admission: a running adapter's new requests wait while another adapter waits
    /// behind its batch (`kvgate_core::lora::LoraGate`, docs/lora.md).
    pub gate: kvgate_core::lora::GateConfig,
}

impl Default for LoraConfig {
    fn default() -> Self {
        LoraConfig {
            on_demand: false,
            paths: BTreeMap::new(),
            // vLLM reads an adapter from local disk in well under a second; a download from a hub
            // takes longer, and the request waits for it either way.
            load_timeout_ms: 30_000,
            gate: kvgate_core::lora::GateConfig::default(),
        }
    }
}

impl LoraConfig {
    /// Checks the section's values.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.gate.max_hold_ms == 0 {
            return Err(ConfigError::invalid(
                "lora.gate.max_hold_ms",
                "must be at least 1",
            ));
        }
        if self.load_timeout_ms == 0 {
            return Err(ConfigError::invalid(
                "lora.load_timeout_ms",
                "must be at least 1",
            ));
        }
        for (name, path) in &self.paths {
            if name.trim().is_empty() || name.contains(':') {
                return Err(ConfigError::invalid(
                    "lora.paths",
                    format!("`{name}` is not an adapter name (empty, or holds `:`)"),
                ));
            }
            if path.trim().is_empty() {
                return Err(ConfigError::invalid(
                    format!("lora.paths.{name}"),
                    "must not be empty",
                ));
            }
        }
        Ok(())
    }
}

/// The metric families of on-demand loading.
#[derive(Clone, Debug, Default)]
pub(crate) struct LoadMetrics {
    /// Loads asked of engines, by result (`ok`, `refused`, `unreachable`).
    pub(crate) loads: Family<ReasonLabel, Counter>,
    /// Requests that waited for a load another request had started.
    pub(crate) joined: Counter,
}

impl LoadMetrics {
    /// The families, registered in `registry`.
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let m = LoadMetrics::default();
        registry.register(
            "lora_loads",
            "LoRA adapters the gateway asked engines to load, by result (ok, refused, unreachable)",
            m.loads.clone(),
        );
        registry.register(
            "lora_load_joins",
            "Requests that waited for a LoRA adapter load another request had started",
            m.joined.clone(),
        );
        m
    }
}

/// Why a load failed; every waiter of the flight gets the same.
#[derive(Clone, Debug)]
enum Failure {
    /// The engine answered with an error (its reason).
    Refused(String),
    /// The engine could not be reached in time.
    Unreachable(String),
}

type Flight = Arc<OnceCell<Result<(), Failure>>>;

/// On-demand adapter loading, with one load in flight per (endpoint, adapter).
pub(crate) struct Loader {
    config: LoraConfig,
    client: HttpClient,
    metrics: LoadMetrics,
    flights: Mutex<HashMap<(EndpointId, String), Flight>>,
}

impl std::fmt::Debug for Loader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Loader {
    pub(crate) fn new(config: &LoraConfig, client: HttpClient, metrics: LoadMetrics) -> Self {
        Loader {
            config: config.clone(),
            client,
            metrics,
            flights: Mutex::default(),
        }
    }

    /// Makes `model` served when it names an adapter no endpoint lists and loading is on:
    /// `Ok` when nothing was needed or the load succeeded (the request then routes to the
    /// endpoint that loaded it), a 404 naming the adapter when no path is configured for it, a
    /// 502 with the engine's reason when the engine refused, a 503 when it could not be reached.
    pub(crate) async fn ensure(&self, pool: &Pool, model: &str) -> Result<(), ApiError> {
        if !self.config.on_demand || pool.serves(model) {
            return Ok(());
        }
        let (base, adapter) = match model.split_once(':') {
            Some((base, adapter)) if pool.serves(base) => (Some(base), adapter),
            _ => (None, model),
        };
        let Some(path) = self.config.paths.get(adapter) else {
            if base.is_none() {
                return Ok(()); // not an adapter's name: admission answers the unknown model
            }
            return Err(ApiError::unknown_adapter(adapter, &pool.adapter_names()));
        };
        let status = pool.status();
        let Some(target) = least_loaded(&status, base) else {
            return Err(ApiError::no_endpoint(format!(
                "no healthy endpoint to load the LoRA adapter `{adapter}` on"
            )));
        };
        let (flight, leader) = {
            let mut flights = self.flights.lock().unwrap_or_else(|e| e.into_inner());
            if pool.serves(model) {
                return Ok(()); // a load finished while this request looked
            }
            let key = (target.id, adapter.to_owned());
            match flights.get(&key) {
                Some(f) => (f.clone(), false),
                None => {
                    let f = Flight::default();
                    flights.insert(key, f.clone());
                    (f, true)
                }
            }
        };
        if !leader {
            self.metrics.joined.inc();
        }
        let result = flight
            .get_or_init(|| self.load(pool, target, adapter, path))
            .await
            .clone();
        if leader {
            let key = (target.id, adapter.to_owned());
            let mut flights = self.flights.lock().unwrap_or_else(|e| e.into_inner());
            flights.remove(&key);
        }
        result.map_err(|failure| match failure {
            Failure::Refused(reason) => ApiError::upstream(format!(
                "loading the LoRA adapter `{adapter}` failed: {reason}"
            )),
            Failure::Unreachable(reason) => ApiError::no_endpoint(format!(
                "loading the LoRA adapter `{adapter}` failed: {reason}"
            )),
        })
    }

    /// Asks `target` to load `adapter` from `path`; on success the pool lists it there.
    async fn load(
        &self,
        pool: &Pool,
        target: &EndpointStatus,
        adapter: &str,
        path: &str,
    ) -> Result<(), Failure> {
        let result = self.post(pool, target, adapter, path).await;
        let label = match &result {
            Ok(()) => "ok",
            Err(Failure::Refused(_)) => "refused",
            Err(Failure::Unreachable(_)) => "unreachable",
        };
        self.metrics
            .loads
            .get_or_create(&ReasonLabel { reason: label })
            .inc();
        match &result {
            Ok(()) => {
                tracing::info!(endpoint = %target.name, adapter, "LoRA adapter loaded");
                pool.adapter_loaded(target.id, adapter);
            }
            Err(e) => {
                tracing::warn!(endpoint = %target.name, adapter, "LoRA adapter load failed: {e:?}")
            }
        }
        result
    }

    async fn post(
        &self,
        pool: &Pool,
        target: &EndpointStatus,
        adapter: &str,
        path: &str,
    ) -> Result<(), Failure> {
        let body = serde_json::json!({"lora_name": adapter, "lora_path": path}).to_string();
        let url = format!("{}/v1/load_lora_adapter", target.url.trim_end_matches('/'));
        let mut request = axum::http::Request::post(&url)
            .header(axum::http::header::CONTENT_TYPE, "application/json");
        if let Some(authorization) = pool.authorization_of(target.id) {
            request = request.header(axum::http::header::AUTHORIZATION, authorization);
        }
        let request = request
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| Failure::Unreachable(e.to_string()))?;
        let timeout = Duration::from_millis(self.config.load_timeout_ms);
        match upstream::fetch(&self.client, request, 64 * 1024, timeout).await {
            Ok((status, _)) if status.is_success() => Ok(()),
            Ok((status, body)) => {
                let reason = reason(&body);
                // vLLM refuses a second load of a name it holds; the adapter is there.
                if reason.contains("has already been loaded") {
                    return Ok(());
                }
                Err(Failure::Refused(format!(
                    "{url} answered {status}: {reason}"
                )))
            }
            Err(trouble) => Err(Failure::Unreachable(trouble.to_string())),
        }
    }
}

/// The message of an OpenAI-style error body (`{"error": {"message"}}`, or vLLM's and
/// FastAPI's `{"message"}` / `{"detail"}`), else the body as text.
fn reason(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else {
        return text.trim().to_owned();
    };
    let found = [&v["error"]["message"], &v["message"], &v["detail"]]
        .into_iter()
        .find_map(|m| m.as_str().map(str::to_owned));
    found.unwrap_or_else(|| text.trim().to_owned())
}

/// The healthy endpoint of `base` (any healthy endpoint without one) with the least load:
/// waiting plus running at the last scrape, plus this gateway's requests in flight; the lowest
/// id breaks ties.
fn least_loaded<'s>(
    status: &'s [EndpointStatus],
    base: Option<&str>,
) -> Option<&'s EndpointStatus> {
    status
        .iter()
        .filter(|e| e.health == kvgate_core::Health::Healthy)
        .filter(|e| base.is_none_or(|b| e.models.iter().any(|m| m == b)))
        .min_by_key(|e| {
            let observed = e
                .observation
                .as_ref()
                .map_or(0, |o| u64::from(o.waiting) + u64::from(o.running));
            (observed + u64::from(e.inflight), e.id)
        })
}

#[cfg(test)]
mod tests;
