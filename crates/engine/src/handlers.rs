//! HTTP routes: the OpenAI API, health, metrics and the admin API.

use crate::error::ApiError;
use crate::faults::FaultKind;
use crate::request::{self, Endpoint, Parsed};
use crate::scheduler::Command;
use crate::server::Connection;
use crate::state::Shared;
use crate::stream::{self, SeqHandle, StreamPlan};
use crate::wire::{self, FinishReason, Usage};
use crate::{admin, backend::SeqRequest, metrics, pd, tokenizer};
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
        .route("/v1/embeddings", post(crate::embeddings::embeddings))
        .route("/v1/load_lora_adapter", post(crate::lora::load))
        .route("/v1/unload_lora_adapter", post(crate::lora::unload))
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .route("/kv_transfer/read", post(crate::pd::read))
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
    let card = |id: &str, root: &str, parent: Option<&str>| {
        serde_json::json!({
            "id": id,
            "object": "model",
            "created": shared.started_unix,
            "owned_by": "vllm",
            "root": root,
            "parent": parent,
            "max_model_len": shared.config.max_model_len,
            "permission": [],
        })
    };
    let mut data = vec![card(model, model, None)];
    // vLLM lists each adapter after the base model, its path as `root`, the base as `parent`.
    for (name, path) in shared.lora.list() {
        data.push(card(&name, &path, Some(model)));
    }
    Json(serde_json::json!({"object": "list", "data": data})).into_response()
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
    let text = match &snapshot.lora {
        Some(lora) => {
            let mut text = text;
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            shared.lora.observe(&lora.running, &lora.waiting, now);
            shared.lora.render(&mut text, lora.max_loras);
            text
        }
        None => text,
    };
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

/// The output length ([`output_length`]) and how it ends: at the limit, or a sampled stop.
fn output_plan(parsed: &Parsed, limit: u32, mean: u32, seed: u64) -> (u32, FinishReason) {
    let tokens = output_length(parsed, limit, mean, seed);
    let finish = if tokens >= limit {
        FinishReason::Length
    } else {
        FinishReason::Stop
    };
    (tokens, finish)
}

/// Reads the request's body (refused past `MAX_BODY_BYTES`) and parses it, with the leg of a
/// disaggregated request it is.
async fn read_request(
    shared: &Shared,
    endpoint: Endpoint,
    body: Body,
) -> Result<(Parsed, pd::Ask), ApiError> {
    let Ok(bytes) = axum::body::to_bytes(body, MAX_BODY_BYTES).await else {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "Request body too large or unreadable.",
        ));
    };
    let parsed = request::parse(endpoint, &bytes, shared.tokenizer.as_deref())?;
    Ok((parsed, pd::Ask::parse(&bytes, shared.pd.role)))
}

/// Refuses a request for another model, or one whose prompt and `max_tokens` do not fit the
/// context, with vLLM's wording. Answers the LoRA adapter the request names.
fn check_limits(shared: &Shared, parsed: &Parsed) -> Result<Option<String>, ApiError> {
    let config = &shared.config;
    let mut adapter = None;
    if let Some(model) = &parsed.model {
        let resolved = shared.lora.resolve(&config.model, model);
        if let Ok(named) = resolved {
            adapter = named;
        } else {
            return Err(ApiError {
                param: Some("model"),
                ..ApiError::new(
                    StatusCode::NOT_FOUND,
                    format!(
                        "The model `{model}` does not exist. Valid aliases: {}.",
                        config.model
                    ),
                )
            });
        }
    }
    let prompt_tokens = parsed.prompt.len();
    let requested = prompt_tokens + parsed.max_tokens.unwrap_or(0) as usize;
    if let Some(max_tokens) = parsed
        .max_tokens
        .filter(|&m| m as usize > config.max_model_len)
    {
        return Err(ApiError::bad_param(
            "max_tokens",
            format!(
                "max_tokens={max_tokens} cannot be greater than max_model_len={}. Please request fewer output \
                 tokens. (parameter=max_tokens, value={max_tokens})",
                config.max_model_len
            ),
        ));
    }
    if prompt_tokens >= config.max_model_len || requested > config.max_model_len {
        return Err(ApiError::bad_param(
            "max_tokens",
            format!(
                "This model's maximum context length is {} tokens. However, you requested {} tokens \
                 ({} in the messages, {} in the completion). Please reduce the length of the messages or completion.",
                config.max_model_len,
                requested,
                prompt_tokens,
                parsed.max_tokens.unwrap_or(0)
            ),
        ));
    }
    Ok(adapter)
}

/// Hands the request to the scheduler: a handle on its sequence, or an error when the engine
/// is shutting down.
fn submit(
    shared: &Shared,
    (prompt, adapter): (Vec<u32>, Option<String>),
    output_tokens: u32,
    finish: FinishReason,
    (arrived, transferred): (Instant, u32),
) -> Result<SeqHandle, ApiError> {
    let id = shared.next_id();
    let (tx, rx) = mpsc::unbounded_channel();
    let submitted = shared.commands.send(Command::Submit {
        request: SeqRequest {
            id,
            prompt,
            max_output_tokens: output_tokens,
        },
        length_limited: finish == FinishReason::Length,
        arrived,
        updates: tx,
        transferred,
        adapter,
    });
    if submitted.is_err() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "The engine is shutting down.",
        ));
    }
    Ok(SeqHandle {
        id,
        updates: rx,
        commands: shared.commands.clone(),
        finished: false,
    })
}

/// What a non-streamed response says besides its counts.
struct Answer<'a> {
    endpoint: Endpoint,
    response_id: &'a str,
    created: u64,
    model: &'a str,
    text_seed: u64,
    prompt_tokens: u32,
    finish: FinishReason,
    /// Alternatives per token when logprobs were asked for.
    logprobs: Option<u32>,
    /// The `low_confidence` fault met this request.
    low_confidence: bool,
    /// A prefill leg's top-level `kv_transfer_params`.
    kv_transfer_params: Option<serde_json::Value>,
}

impl Answer<'_> {
    /// The whole answer in one JSON body, for the completion and cached token counts the
    /// engine reported.
    fn full_response(&self, (completion_tokens, cached_tokens): (u32, u32)) -> Response {
        let text: String = (0..completion_tokens)
            .map(|i| tokenizer::output_word(self.text_seed, i))
            .collect();
        let usage = Usage {
            prompt_tokens: self.prompt_tokens,
            completion_tokens,
            cached_tokens,
        };
        let mut body = wire::full_response(
            self.endpoint,
            self.response_id,
            self.created,
            self.model,
            &text,
            self.finish,
            usage,
        );
        if let Some(top) = self.logprobs {
            body["choices"][0]["logprobs"] = crate::logprobs::json(
                self.endpoint,
                self.text_seed,
                completion_tokens,
                top,
                self.low_confidence,
            );
        }
        if let Some(params) = &self.kv_transfer_params {
            body["kv_transfer_params"] = params.clone();
        }
        Json(body).into_response()
    }
}

/// A request read and within the engine's limits (with the adapter it names), or the answer
/// refusing it (a drawn fault, a bad body, a limit).
async fn accept(
    shared: &Shared,
    faults: &crate::faults::RequestFaults,
    conn: &Connection,
    (endpoint, body): (Endpoint, Body),
) -> Result<(Parsed, pd::Ask, Option<String>), Response> {
    if let Some(kind) = faults.refuse {
        return Err(refuse(kind, conn).await);
    }
    let (parsed, ask) = read_request(shared, endpoint, body)
        .await
        .map_err(IntoResponse::into_response)?;
    let adapter = check_limits(shared, &parsed).map_err(IntoResponse::into_response)?;
    Ok((parsed, ask, adapter))
}

/// The `created` field of an answer: seconds since the Unix epoch.
fn unix_seconds() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn generate(
    shared: Arc<Shared>,
    conn: Connection,
    endpoint: Endpoint,
    body: Body,
) -> Response {
    let arrived = Instant::now();
    let faults = shared.faults.draw();
    let (parsed, ask, adapter) = match accept(&shared, &faults, &conn, (endpoint, body)).await {
        Ok(accepted) => accepted,
        Err(refused) => return refused,
    };
    let config = &shared.config;
    let prompt_tokens = parsed.prompt.len();
    let limit = parsed
        .max_tokens
        .unwrap_or((config.max_model_len - prompt_tokens) as u32);
    let text_seed = tokenizer::request_seed(&parsed.prompt, config.seed);
    // A prefill leg stops at its first token (SGLang's prefill server ignores the body's
    // max_tokens; vLLM's proxy sends max_tokens 1).
    let held = ask.held(&parsed.prompt);
    let limit = if held.is_some() { limit.min(1) } else { limit };
    let (output_tokens, finish) = output_plan(&parsed, limit, config.mean_output_tokens, text_seed);
    let transferred = match &ask {
        pd::Ask::Decode(source) => shared.pd.fetch(source, &parsed.prompt).await,
        _ => 0,
    };
    let parsed_logprobs = parsed.logprobs;
    let times = (arrived, transferred);
    let seq = match submit(
        &shared,
        (parsed.prompt, adapter),
        output_tokens,
        finish,
        times,
    ) {
        Ok(seq) => seq,
        Err(e) => return e.into_response(),
    };
    let response_id = wire::response_id(endpoint, seq.id, shared.id_salt);
    let created = unix_seconds();
    let mut response = if parsed.stream && held.is_none() {
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
        let Some(counts) = stream::collect(seq, &faults, &conn).await else {
            return ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "The engine stopped.")
                .into_response();
        };
        let kv_transfer_params = held.map(|(key, prompt)| {
            shared
                .pd
                .hold(key, &response_id, &prompt, config.block_size)
        });
        let answer = Answer {
            endpoint,
            response_id: &response_id,
            created,
            model: &config.model,
            text_seed,
            prompt_tokens: prompt_tokens as u32,
            finish,
            logprobs: parsed_logprobs,
            low_confidence: faults.low_confidence,
            kv_transfer_params,
        };
        answer.full_response(counts)
    };
    if let Ok(value) = HeaderValue::from_str(&config.id) {
        response.headers_mut().insert("x-kvgate-engine", value);
    }
    response
}

#[cfg(test)]
mod tests;
