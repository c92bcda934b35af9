//! The HTTP front: routes, the one inference reader, and serving with graceful shutdown.

use crate::ending::Ending;
use crate::error::ApiError;
use crate::parse::{self, Api, Inference};
use crate::state::Shared;
use crate::{admin, proxy};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use kvgate_core::resilience::Outcome;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Reads and validates an inference body: the single path every inference request passes, so
/// every bad input gets the same OpenAI-shaped error.
async fn read(req: Request, state: &Shared) -> Result<(Inference, HeaderMap), ApiError> {
    let api = if req.uri().path().ends_with("/chat/completions") {
        Api::Chat
    } else {
        Api::Completions
    };
    let limits = &state.config.requests;
    let (parts, body) = req.into_parts();
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limits.max_body_bytes) {
        return Err(ApiError::too_large(limits.max_body_bytes));
    }
    let bytes = axum::body::to_bytes(body, limits.max_body_bytes)
        .await
        .map_err(|e| {
            let over = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            if over {
                ApiError::too_large(limits.max_body_bytes)
            } else {
                ApiError::invalid("body_read_error", format!("could not read the body: {e}"))
            }
        })?;
    let inference = parse::parse(api, &parts.headers, bytes, limits)?;
    Ok((inference, parts.headers))
}

async fn inference(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let mut ending = Ending::new(shared.clone());
    let answer = match read(req, &shared).await {
        Ok((inference, headers)) => proxy::handle(shared, inference, &headers, &mut ending).await,
        Err(e) => {
            ending.set(Outcome::ClientError);
            Err(e)
        }
    };
    match answer {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn models(State(shared): State<Arc<Shared>>) -> Json<serde_json::Value> {
    let data: Vec<_> = shared
        .pool
        .models()
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

/// Every route of the gateway.
pub(crate) fn router(shared: Arc<Shared>) -> Router {
    let mut router = Router::new()
        .route("/v1/chat/completions", post(inference))
        .route("/v1/completions", post(inference))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .fallback(not_found);
    if shared.config.admin_token.is_some() {
        router = router.merge(admin::router());
    }
    // The extractor enforces its own limit with a clear error; lift axum's default 2 MB cap.
    router
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(shared)
}
