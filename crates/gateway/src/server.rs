//! The HTTP front: routes and the one inference reader.

use crate::ending::Ending;
use crate::error::ApiError;
use crate::metrics::ReasonLabel;
use crate::parse::{self, Api, Inference};
use crate::state::Shared;
use crate::{admin, proxy};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
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
    let inference = parse(state, api, &parts.headers, bytes)?;
    Ok((inference, parts.headers))
}

/// Parses a request body of `api` as the gateway does (with the model's tokenizer, when it
/// has one) and counts how tokenizing went.
pub(crate) fn parse(
    state: &Shared,
    api: Api,
    headers: &HeaderMap,
    bytes: axum::body::Bytes,
) -> Result<Inference, ApiError> {
    let limits = &state.config.requests;
    let inference = parse::parse_with(api, headers, bytes, limits, |model| {
        state.tokenizers.get(model)
    })?;
    let m = &state.metrics.engine_state;
    match &inference.tokenized {
        Some(Ok(took)) => {
            m.tokenized
                .get_or_create(&ReasonLabel { reason: "ok" })
                .inc();
            m.tokenize_seconds.observe(took.as_secs_f64());
        }
        Some(Err(why)) => {
            m.tokenized
                .get_or_create(&ReasonLabel { reason: "error" })
                .inc();
            tracing::debug!(error = %why, "prompt not tokenized; routing by text");
        }
        None => {}
    }
    Ok(inference)
}

async fn inference(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let mut ending = Ending::new(shared.clone());
    ending.client_request_id(req.headers().get("x-request-id"));
    ending.trace(req.headers());
    // The key first: a client without one learns nothing else from the gateway.
    let answer = match shared.tenancy.identify(req.headers()) {
        Err(e) => {
            ending.set(Outcome::Refused);
            Err(e)
        }
        Ok(key) => match read(req, &shared).await {
            Ok((inference, headers)) => {
                ending.describe(&inference.request, inference.api, inference.stream);
                proxy::handle(shared, inference, key, &headers, &mut ending).await
            }
            Err(e) => {
                ending.set(Outcome::ClientError);
                Err(e)
            }
        },
    };
    let mut response = match answer {
        Ok(r) => r,
        Err(e) => e.into_response(),
    };
    // A response whose body took the record over has set its status there already.
    ending
        .facts()
        .status
        .get_or_insert(response.status().as_u16());
    response
        .headers_mut()
        .insert(REQUEST_ID_HEADER, HeaderValue::from(ending.id()));
    response
}

/// The response header carrying the gateway's id of the request, which `/admin/decisions`
/// and the access log use.
pub const REQUEST_ID_HEADER: &str = "x-kvgate-request-id";

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
            .merge(crate::observe::ui::router());
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
