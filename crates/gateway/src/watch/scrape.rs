//! Live signals: each endpoint's `/metrics` scraped on an interval, every loop starting at a random
//! phase so scrapes of a large pool do not arrive together (signals are always stale,
//! docs/background.md#stale-signals-and-herding; spreading them keeps the staleness uniform). Each
//! round asks `/health` first: a 5xx there takes the endpoint out of routing at once. A round that
//! fails to connect or times out counts towards unhealthy; any HTTP answer counts as alive.
//! Endpoints that do not name their model are asked once through `/v1/models`.
//! What the engines' answers say is read by `crate::engine_state::exposition`.

use super::EngineWatch;
use crate::engine_state::exposition::{parse_models, parse_scrape};
use crate::engine_state::lora::{listed_adapters, parse_adapters};
use crate::error::ConfigError;
use crate::upstream::Trouble;
use axum::http::{Method, Request, StatusCode};
use bytes::Bytes;
use http_body_util::Full;
use kvgate_core::EndpointId;
use serde::{Deserialize, Serialize};
use std::time::Duration;

async fn get(watch: &EngineWatch, base: &str, path: &str) -> Result<(StatusCode, Bytes), Trouble> {
    let request = Request::builder()
        .method(Method::GET)
        .uri(format!("{base}{path}"))
        .body(Full::new(Bytes::new()))
        .map_err(|e| Trouble::Other {
            detail: format!("{base}{path}: {e}"),
        })?;
    let timeout = Duration::from_millis(watch.scrape.timeout_ms);
    crate::upstream::fetch(&watch.client, request, 4 * 1024 * 1024, timeout)
        .await
        .inspect_err(|trouble| {
            tracing::debug!(url = %format!("{base}{path}"), %trouble, "scrape failed");
        })
}

/// Scrapes one endpoint now: whether its engine answered (any HTTP status), `None` when the
/// endpoint has left the pool.
pub(crate) async fn scrape_once(watch: &EngineWatch, id: EndpointId) -> Option<bool> {
    let base = watch.pool.base_of(id)?;
    let sent_at = watch.pool.clock().now();
    let name = watch
        .pool
        .name_of(id)
        .map(|n| n.to_string())
        .unwrap_or_default();
    // The engine's own verdict first: vLLM and SGLang answer /health with 200 when serving and
    // 5xx when not (the emulated engine's `drain` fault too). No /health (404) says nothing.
    let health = get(watch, &base, "/health").await;
    if let Ok((status, _)) = &health {
        if watch.pool.reported_health(id, status.as_u16()) {
            let trouble = Trouble::Reports {
                status: status.as_u16(),
            };
            tracing::warn!(endpoint = %name, url = %base, cause = %trouble.label(),
                "endpoint unhealthy: {trouble}");
        }
    }
    let reached = health.is_ok();
    let metrics = match health {
        Ok(_) => get(watch, &base, "/metrics").await,
        Err(trouble) => Err(trouble),
    };
    let (status, body) = match metrics {
        Ok(answer) => answer,
        Err(trouble) => {
            failed(watch, id, (&name, &base), trouble, reached);
            return Some(reached);
        }
    };
    if watch.pool.metrics_answered(id, status.as_u16()) {
        tracing::warn!(endpoint = %name, url = %base,
            "GET {base}/metrics answered {status}: routing it without its load signals (is \
             the URL the engine's base URL, without /v1?)");
    }
    let text = status
        .is_success()
        .then(|| std::str::from_utf8(&body).ok())
        .flatten();
    let (observation, run) = text.map(parse_scrape).unwrap_or_default();
    watch
        .pool
        .adapters_observed(id, text.and_then(parse_adapters));
    if watch.pool.incarnation(id, run) {
        restarted(watch, id, &name);
    }
    if let Some(trouble) = watch.pool.observed(id, observation, sent_at) {
        tracing::info!(endpoint = %name, url = %base, was = %trouble, "endpoint healthy again");
    }
    count(watch, name, "ok");
    if watch.pool.needs_models(id) {
        if let Ok((status, body)) = get(watch, &base, "/v1/models").await {
            watch.pool.note_adapters(listed_adapters(&body));
            let models = parse_models(&body);
            if status.is_success() && !models.is_empty() {
                watch.pool.set_models(id, models);
            }
        }
    }
    Some(true)
}

/// A scrape of `id` failed with `trouble` (after its engine answered `/health`, when
/// `reached`). The warning comes once, when the failure takes the endpoint out, naming the
/// cause and its fix.
fn failed(
    watch: &EngineWatch,
    id: EndpointId,
    (name, base): (&str, &str),
    trouble: Trouble,
    reached: bool,
) {
    let label = trouble.label();
    let message = trouble.to_string();
    if watch
        .pool
        .scrape_failed(id, watch.scrape.unhealthy_after, trouble)
    {
        tracing::warn!(endpoint = %name, url = %base, cause = %label, "endpoint unhealthy: {message}");
        if !reached {
            // An engine that died between requests breaks no stream: this is the first sign
            // that its sessions' cache is gone.
            watch.losses.lost(id);
        }
    }
    count(watch, name.to_string(), "error");
}

fn count(watch: &EngineWatch, endpoint: String, result: &'static str) {
    watch
        .metrics
        .scrapes
        .get_or_create(&crate::metrics::ScrapeLabels { endpoint, result })
        .inc();
}

/// The engine at `id` restarted: the pool has forgotten what the index held there; its
/// sessions are re-homed when that is on (a restart loses a cache as a crash does).
fn restarted(watch: &EngineWatch, id: EndpointId, name: &str) {
    tracing::info!(endpoint = %name, "engine restarted; its cached prefixes are forgotten");
    let label = crate::metrics::endpoint(name);
    watch.metrics.restarts.get_or_create(&label).inc();
    watch.losses.lost(id);
}

/// How often an endpoint that does not name its model is asked `/v1/models` again: vLLM and
/// SGLang load LoRA adapters at runtime (`POST /v1/load_lora_adapter`), which appear only there.
const MODELS_REFRESH_MS: u64 = 5_000;

/// Asks `/v1/models` again of an endpoint whose models were discovered.
async fn refresh_models(watch: &EngineWatch, id: EndpointId) {
    if watch.pool.model_configured(id) {
        return;
    }
    let Some(base) = watch.pool.base_of(id) else {
        return;
    };
    if let Ok((status, body)) = get(watch, &base, "/v1/models").await {
        let models = parse_models(&body);
        if status.is_success() && !models.is_empty() {
            watch.pool.note_adapters(listed_adapters(&body));
            watch.pool.set_models(id, models);
        }
    }
}

/// Starts the scrape loop of one endpoint; it ends when the endpoint leaves the pool or the
/// gateway stops.
pub(crate) fn spawn(watch: EngineWatch, id: EndpointId) {
    let mut stop = watch.stop.clone();
    tokio::spawn(async move {
        let interval = Duration::from_millis(watch.scrape.interval_ms);
        // First scrape at once (a new endpoint needs its model and health), then a random phase.
        if scrape_once(&watch, id).await.is_none() {
            return;
        }
        let mut next = tokio::time::Instant::now() + watch.pool.jitter(interval);
        let every = (MODELS_REFRESH_MS / watch.scrape.interval_ms).max(1);
        let mut rounds = 0u64;
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(next) => {}
                _ = stop.changed() => return,
            }
            next += interval;
            let Some(answered) = scrape_once(&watch, id).await else {
                return;
            };
            rounds += 1;
            if answered && rounds % every == 0 {
                refresh_models(&watch, id).await;
            }
        }
    });
}

/// Engine metrics scraping.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScrapeConfig {
    /// Period of each endpoint's scrape; each loop starts at a random phase within it.
    pub interval_ms: u64,
    /// Timeout of one scrape.
    pub timeout_ms: u64,
    /// Consecutive failed scrapes after which an endpoint is unhealthy.
    pub unhealthy_after: u32,
}

impl Default for ScrapeConfig {
    fn default() -> Self {
        ScrapeConfig {
            interval_ms: 500,
            timeout_ms: 1_000,
            unhealthy_after: 2,
        }
    }
}

impl ScrapeConfig {
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        // Both are added to `Instant`s, which overflow far below u64::MAX milliseconds; a day
        // is beyond any useful period or timeout.
        const DAY_MS: u64 = 86_400_000;
        if !(1..=DAY_MS).contains(&self.interval_ms) {
            return Err(ConfigError::invalid(
                "scrape.interval_ms",
                "must be between 1 and 86400000",
            ));
        }
        if !(1..=DAY_MS).contains(&self.timeout_ms) {
            return Err(ConfigError::invalid(
                "scrape.timeout_ms",
                "must be between 1 and 86400000",
            ));
        }
        Ok(())
    }
}
