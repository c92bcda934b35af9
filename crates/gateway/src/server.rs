//! The HTTP front: the routes of each listener.

use crate::admin;
use crate::error::ApiError;
use crate::parse::Api;
use crate::proxy::intake;
use crate::state::Shared;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// `/v1/chat/completions` and `/v1/completions`: the proxy's stages, behind difficulty
/// routing for routed names.
async fn inference(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let api = intake::api_of(req.uri().path()).unwrap_or(Api::Completions);
    crate::cascade::serve(shared, api, req).await
}

async fn models(State(shared): State<Arc<Shared>>) -> Json<serde_json::Value> {
    let mut names = shared.pool.models();
    names.extend(shared.difficulty.names().map(str::to_owned));
    names.sort();
    names.dedup();
    let data: Vec<_> = names
        .into_iter()
        .map(|id| serde_json::json!({"id": id, "object": "model", "created": 0, "owned_by": "kvgate"}))
        .collect();
    Json(serde_json::json!({"object": "list", "data": data}))
}

async fn health() -> &'static str {
    "ok"
}

async fn ready(State(shared): State<Arc<Shared>>) -> (StatusCode, &'static str) {
    if shared.draining.load(Ordering::Relaxed) {
        (StatusCode::SERVICE_UNAVAILABLE, "draining")
    } else if shared.pool.any_healthy() {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "no healthy endpoint")
    }
}

async fn metrics(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    shared.pool.status(); // refreshes per-endpoint gauges
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        shared.metrics.encode(),
    )
}

async fn not_found() -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        ..ApiError::invalid("unknown_url", "no such route")
    }
}

/// Which routes a listener serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Face {
    /// The API, health and readiness; `/metrics` and `/admin/*` too unless `admin_listen` is set.
    Public,
    /// `/admin/*`, `/metrics` and `/health`, on `admin_listen`.
    Admin,
}

/// The routes of one listener.
pub(crate) fn router(shared: Arc<Shared>, face: Face) -> Router {
    let separate_admin = shared.config.admin_listen.is_some();
    let mut router = Router::new().route("/health", get(health));
    if face == Face::Public {
        router = router
            .route("/v1/chat/completions", post(inference))
            .route("/v1/completions", post(inference))
            .route("/v1/models", get(models))
            .route("/ready", get(ready));
    }
    if face == Face::Admin || !separate_admin {
        router = router
            .route("/metrics", get(metrics))
            .merge(crate::ui::router());
        if shared.config.admin_token.is_some() {
            router = router.merge(admin::router());
        }
    }
    // The extractor enforces its own limit with a clear error; lift axum's default 2 MB cap.
    router
        .fallback(not_found)
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(shared)
}
