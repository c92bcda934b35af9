//! HTTP routes: the OpenAI API, health, metrics and the admin API.

use crate::error::ApiError;
use crate::faults::FaultKind;
use crate::request::{self, Endpoint, Parsed};
use crate::scheduler::Command;
use crate::server::Connection;
use crate::state::Shared;
use crate::stream::{self, SeqHandle, StreamPlan};
use crate::wire::{self, FinishReason, Usage};
use crate::{admin, backend::SeqRequest, metrics, tokenizer};
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;

/// Largest request body accepted (long prompts are a few MB at most).
const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

/// The engine's routes.
pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .route(
            "/admin/faults",
            get(admin::get_faults)
                .post(admin::set_faults)
                .delete(admin::clear_faults),
        )
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(shared)
}

async fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        Json(serde_json::json!({"detail": "Not Found"})),
    )
        .into_response()
}

async fn method_not_allowed() -> Response {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        Json(serde_json::json!({"detail": "Method Not Allowed"})),
    )
        .into_response()
}

async fn chat(
    State(shared): State<Arc<Shared>>,
    Extension(conn): Extension<Connection>,
    body: Body,
) -> Response {
    generate(shared, conn, Endpoint::Chat, body).await
}

async fn completions(
    State(shared): State<Arc<Shared>>,
    Extension(conn): Extension<Connection>,
    body: Body,
) -> Response {
    generate(shared, conn, Endpoint::Completions, body).await
}

async fn models(State(shared): State<Arc<Shared>>) -> Response {
    let model = &shared.config.model;
    Json(serde_json::json!({
        "object": "list",
        "data": [{
            "id": model,
            "object": "model",
            "created": shared.started_unix,
            "owned_by": "vllm",
            "root": model,
            "parent": null,
            "max_model_len": shared.config.max_model_len,
            "permission": [],
        }],
    }))
    .into_response()
}

async fn health(State(shared): State<Arc<Shared>>) -> Response {
    if shared.faults.draining() {
        StatusCode::SERVICE_UNAVAILABLE.into_response()
    } else {
        StatusCode::OK.into_response()
    }
}

async fn metrics_text(State(shared): State<Arc<Shared>>) -> Response {
    let snapshot = shared
        .metrics
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let text = metrics::render(
        &snapshot,
        &shared.cache_info,
        &shared.config.model,
        shared.started,
    );
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// Answers a request that a fault refuses.
async fn refuse(kind: FaultKind, conn: &Connection) -> Response {
    match kind {
        FaultKind::RateLimited { retry_after_secs } => ApiError {
            retry_after_secs: Some(retry_after_secs),
            ..ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "The engine is overloaded (injected fault); retry later.",
            )
        }
        .into_response(),
        FaultKind::InternalError => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Internal server error (injected fault).",
        )
        .into_response(),
        FaultKind::Draining => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "The engine is draining and accepts no new requests.",
        )
        .into_response(),
        FaultKind::ResetBeforeFirstByte => {
            conn.reset();
            std::future::pending().await
        }
        _ => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "Service unavailable (injected fault).",
        )
        .into_response(),
    }
}

/// The output length: exactly the limit with `ignore_eos`, else a geometric draw (mean
/// `mean`, seeded by the request) clamped to `[max(min_tokens, 1), limit]`.
fn output_length(parsed: &Parsed, limit: u32, mean: u32, seed: u64) -> u32 {
    if parsed.ignore_eos {
        return limit;
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let u: f64 = rng.random();
    let p = 1.0 / f64::from(mean.max(1));
    let draw = if p >= 1.0 {
        1.0
    } else {
        ((1.0 - u).ln() / (1.0 - p).ln()).ceil()
    };
    let floor = parsed.min_tokens.max(1);
    (draw.clamp(1.0, f64::from(u32::MAX)) as u32).clamp(floor.min(limit), limit)
}

async fn generate(
    shared: Arc<Shared>,
    conn: Connection,
    endpoint: Endpoint,
    body: Body,
) -> Response {
    let arrived = Instant::now();
    let faults = shared.faults.draw();
    if let Some(kind) = faults.refuse {
        return refuse(kind, &conn).await;
    }
    let bytes = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(b) => b,
        Err(_) => {
            return ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "Request body too large or unreadable.",
            )
            .into_response()
        }
    };
    let parsed = match request::parse(endpoint, &bytes, shared.tokenizer.as_deref()) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let config = &shared.config;
    if let Some(model) = &parsed.model {
        if model != &config.model {
            return ApiError {
                param: Some("model"),
                ..ApiError::new(
                    StatusCode::NOT_FOUND,
                    format!(
                        "The model `{model}` does not exist. Valid aliases: {}.",
                        config.model
                    ),
                )
            }
            .into_response();
        }
    }
    let prompt_tokens = parsed.prompt.len();
    let requested = prompt_tokens + parsed.max_tokens.unwrap_or(0) as usize;
    if let Some(max_tokens) = parsed
        .max_tokens
        .filter(|&m| m as usize > config.max_model_len)
    {
        return ApiError::bad_param(
            "max_tokens",
            format!(
                "max_tokens={max_tokens} cannot be greater than max_model_len={}. Please request fewer output \
                 tokens. (parameter=max_tokens, value={max_tokens})",
                config.max_model_len
            ),
        )
        .into_response();
    }
    if prompt_tokens >= config.max_model_len || requested > config.max_model_len {
        return ApiError::bad_param(
            "max_tokens",
            format!(
                "This model's maximum context length is {} tokens. However, you requested {} tokens \
                 ({} in the messages, {} in the completion). Please reduce the length of the messages or completion.",
                config.max_model_len,
                requested,
                prompt_tokens,
                parsed.max_tokens.unwrap_or(0)
            ),
        )
        .into_response();
    }
    let limit = parsed
        .max_tokens
        .unwrap_or((config.max_model_len - prompt_tokens) as u32);
    let text_seed = tokenizer::request_seed(&parsed.prompt, config.seed);
    let output_tokens = output_length(&parsed, limit, config.mean_output_tokens, text_seed);
    let finish = if output_tokens >= limit {
        FinishReason::Length
    } else {
        FinishReason::Stop
    };

    let id = shared.next_id();
    let (tx, rx) = mpsc::unbounded_channel();
    let submitted = shared.commands.send(Command::Submit {
        request: SeqRequest {
            id,
            prompt: parsed.prompt,
            max_output_tokens: output_tokens,
        },
        length_limited: finish == FinishReason::Length,
        arrived,
        updates: tx,
    });
    if submitted.is_err() {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "The engine is shutting down.",
        )
        .into_response();
    }
    let seq = SeqHandle {
        id,
        updates: rx,
        commands: shared.commands.clone(),
        finished: false,
    };
    let response_id = wire::response_id(endpoint, id, shared.id_salt);
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut response = if parsed.stream {
        let plan = StreamPlan {
            writer: wire::ChunkWriter::new(endpoint, &response_id, created, &shared.model_json),
            text_seed,
            prompt_tokens: prompt_tokens as u32,
            include_usage: parsed.include_usage,
            finish,
            faults,
            connection: conn,
        };
        let body = stream::body(seq, plan);
        (
            [(header::CONTENT_TYPE, "text/event-stream; charset=utf-8")],
            body,
        )
            .into_response()
    } else {
        let (completion_tokens, cached_tokens) = match stream::collect(seq, &faults, &conn).await {
            Some(counts) => counts,
            None => {
                return ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "The engine stopped.")
                    .into_response()
            }
        };
        let text: String = (0..completion_tokens)
            .map(|i| tokenizer::output_word(text_seed, i))
            .collect();
        let usage = Usage {
            prompt_tokens: prompt_tokens as u32,
            completion_tokens,
            cached_tokens,
        };
        let body = wire::full_response(
            endpoint,
            &response_id,
            created,
            &config.model,
            &text,
            finish,
            usage,
        );
        Json(body).into_response()
    };
    if let Ok(value) = HeaderValue::from_str(&config.id) {
        response.headers_mut().insert("x-kvgate-engine", value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::EngineConfig;
    use crate::faults::FaultState;
    use crate::metrics::MetricsState;
    use axum::http::Request;
    use std::sync::Mutex;
    use tower::ServiceExt;

    /// The router without a socket or a scheduler (for routes that do not generate).
    fn app(faults: &[&str]) -> Router {
        let (tx, _rx) = mpsc::unbounded_channel();
        let faults = faults.iter().map(|f| f.parse().unwrap()).collect();
        let shared = Shared::new(
            EngineConfig {
                model: "m".to_owned(),
                ..EngineConfig::default()
            },
            tx,
            Arc::new(Mutex::new(MetricsState::default())),
            Arc::new(FaultState::new(faults, 0)),
            0.0,
        );
        router(Arc::new(shared))
    }

    async fn call(app: Router, method: &str, uri: &str, body: &str) -> (StatusCode, String) {
        let mut request = Request::builder()
            .method(method)
            .uri(uri)
            .body(Body::from(body.to_owned()))
            .unwrap();
        request
            .extensions_mut()
            .insert(Connection::for_test("127.0.0.1:1".parse().unwrap()));
        let response = app.oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, String::from_utf8(bytes.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn routes_answer_without_a_socket() {
        let (status, body) = call(app(&[]), "GET", "/v1/models", "").await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("\"id\":\"m\""));
        assert_eq!(call(app(&[]), "GET", "/health", "").await.0, StatusCode::OK);
        assert_eq!(
            call(app(&["drain"]), "GET", "/health", "").await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        let (status, body) = call(app(&[]), "GET", "/metrics", "").await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 0.0"));
        assert_eq!(
            call(app(&[]), "GET", "/nope", "").await.0,
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            call(app(&[]), "PUT", "/v1/completions", "").await.0,
            StatusCode::METHOD_NOT_ALLOWED
        );
    }

    #[tokio::test]
    async fn refusals_happen_before_the_engine_is_involved() {
        let (status, body) = call(app(&[]), "POST", "/v1/completions", "{").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(body.contains("\"type\":\"Bad Request\""), "{body}");
        let (status, _) = call(
            app(&[]),
            "POST",
            "/v1/completions",
            r#"{"model":"x","prompt":"a"}"#,
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        let (status, _) = call(
            app(&["500"]),
            "POST",
            "/v1/completions",
            r#"{"prompt":"a"}"#,
        )
        .await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        let (status, body) = call(app(&["drain"]), "POST", "/v1/chat/completions", "{}").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("draining"));
    }

    fn parsed(ignore_eos: bool, min_tokens: u32) -> Parsed {
        Parsed {
            model: None,
            prompt: vec![1, 2, 3],
            max_tokens: Some(50),
            min_tokens,
            ignore_eos,
            stream: false,
            include_usage: false,
        }
    }

    #[test]
    fn ignore_eos_gives_exactly_the_limit() {
        for seed in 0..100 {
            assert_eq!(output_length(&parsed(true, 0), 50, 8, seed), 50);
        }
    }

    #[test]
    fn sampled_lengths_are_seeded_bounded_and_near_the_mean() {
        let lengths: Vec<u32> = (0..2000)
            .map(|seed| output_length(&parsed(false, 3), 10_000, 40, seed))
            .collect();
        assert!(lengths.iter().all(|&n| (3..=10_000).contains(&n)));
        let mean = lengths.iter().map(|&n| f64::from(n)).sum::<f64>() / lengths.len() as f64;
        assert!((36.0..44.0).contains(&mean), "{mean}");
        let again: Vec<u32> = (0..2000)
            .map(|seed| output_length(&parsed(false, 3), 10_000, 40, seed))
            .collect();
        assert_eq!(lengths, again);
        assert!((0..100).all(|seed| output_length(&parsed(false, 0), 5, 40, seed) <= 5));
    }
}
