//! The live page: `GET /ui` is one self-contained HTML file (no CDN, no build step) that polls
//! `GET /ui/state` every second and draws the fleet, the recent decisions and TTFT over the last
//! two minutes. The page holds no data; the state requires the admin token when one is set (the
//! page asks for it and keeps it for the browser tab only).

use crate::error::ApiError;
use crate::metrics;
use crate::state::Shared;
use crate::telemetry::Metrics;
use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use kvgate_core::policy::EndpointModel;
use kvgate_core::EndpointId;
use serde::Serialize;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

const PAGE: &str = include_str!("ui.html");

/// Seconds of TTFT history the page plots.
const HISTORY_SECS: u64 = 120;

/// Decisions the page lists.
const DECISIONS: usize = 25;

/// One endpoint as the page shows it.
#[derive(Debug, Serialize)]
struct EndpointRow {
    #[serde(flatten)]
    status: crate::pool::EndpointStatus,
    /// Cached over checked prompt tokens, from the engine's usage; absent until one reported.
    hit_ratio: Option<f64>,
    /// Output tokens generated there.
    output_tokens: u64,
    /// The policy's learned slowness against the fleet, when it learns one and has samples.
    speed_factor: Option<f64>,
    /// Its learned prefill speed.
    prefill_tokens_per_second: Option<f64>,
}

fn counter(family: &metrics::Family<metrics::EndpointLabel, metrics::Counter>, name: &str) -> u64 {
    family.get(&metrics::endpoint(name)).map_or(0, |c| c.get())
}

fn row(
    m: &Metrics,
    status: crate::pool::EndpointStatus,
    learned: &[(EndpointId, EndpointModel)],
) -> EndpointRow {
    let name = status.name.clone();
    let checked = counter(&m.usage.cache_checked_tokens, &name);
    // A model with no samples behind it is the fleet's prior, not something measured there.
    let model = learned
        .iter()
        .find(|(id, model)| *id == status.id && model.samples > 0.0)
        .map(|&(_, model)| model);
    EndpointRow {
        hit_ratio: (checked > 0)
            .then(|| counter(&m.usage.cached_tokens, &name) as f64 / checked as f64),
        output_tokens: counter(&m.usage.output_tokens, &name),
        speed_factor: model.map(|m| m.speed_factor),
        prefill_tokens_per_second: model.map(|m| m.prefill_tokens_per_second),
        status,
    }
}

async fn page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        PAGE,
    )
}

async fn state(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
) -> Result<Json<serde_json::Value>, ApiError> {
    if s.config.admin_token.is_some() {
        crate::admin::authorize(&s, &headers)?;
    }
    let policy = s.pool.policy_name();
    let learned = s.pool.learned();
    let endpoints: Vec<EndpointRow> = s
        .pool
        .status()
        .into_iter()
        .map(|e| row(&s.metrics, e, &learned))
        .collect();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Ok(Json(serde_json::json!({
        "policy": policy,
        "now": now,
        "queue_depth": s.metrics.admission.queue_depth.get(),
        "endpoints": endpoints,
        "decisions": s.pool.decisions(DECISIONS, None),
        "ttft": s.ttft_series.summary(now.saturating_sub(HISTORY_SECS)),
    })))
}

/// `/ui` and `/ui/state`.
pub(crate) fn router() -> Router<Arc<Shared>> {
    Router::new()
        .route("/ui", get(page))
        .route("/ui/state", get(state))
}
