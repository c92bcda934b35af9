//! Reading an inference request: bounded body, UTF-8, JSON, field types and limits, then the
//! [`kvgate_core::Request`] a policy sees. The body itself is forwarded byte for byte.
//!
//! The prefix key is a stable serialisation of what an engine's prefix cache would see first: tool
//! definitions, then every message in order (system, earlier turns, the new turn) for chat, or the
//! prompt for completions. Two turns of one conversation therefore share a text prefix (prefix
//! caching keys on the leading tokens).

use crate::error::ApiError;
use axum::http::{header, HeaderMap};
use bytes::Bytes;
use kvgate_core::request::estimate_tokens;
use kvgate_core::{Priority, Prompt, ReasoningEffort, Request};
use kvgate_tokenize::ChatTokenizer;
use serde_json::{Map, Value};
use std::fmt::Write as _;
use std::time::Duration;
use xxhash_rust::xxh3::xxh3_64;

/// Which OpenAI API a request is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completions,
}

impl Api {
    /// `chat` or `completions`, for logs.
    pub fn name(self) -> &'static str {
        match self {
            Api::Chat => "chat",
            Api::Completions => "completions",
        }
    }

    /// The upstream path.
    pub fn path(self) -> &'static str {
        match self {
            Api::Chat => "/v1/chat/completions",
            Api::Completions => "/v1/completions",
        }
    }
}

/// A validated inference request.
#[derive(Clone, Debug)]
pub struct Inference {
    /// Which API.
    pub api: Api,
    /// The body, forwarded unchanged.
    pub body: Bytes,
    /// Whether the client asked for SSE.
    pub stream: bool,
    /// The routing view (id assigned later).
    pub request: Request,
    /// How long the request may wait in the gateway's queue, if the client said.
    pub deadline: Option<Duration>,
    /// The gateway added `stream_options.include_usage` to the body: the usage chunk is for
    /// kvgate and is stripped from the client's stream.
    pub strip_usage: bool,
    /// The byte length of the prompt text before its last message (chat), when there is any:
    /// calls that fan out from one context share that head (fan-out serialisation keys on it,
    /// hashing it only when the gate is on).
    pub shared_head: Option<usize>,
    /// When the model has a tokenizer: how rendering and tokenizing the prompt went (its time,
    /// or why it failed; the request then goes on keyed by text).
    pub tokenized: Option<Result<Duration, String>>,
    /// Why a stream of this request that breaks after its first token cannot be continued on
    /// another endpoint (`n`, `logprobs`, ...); `None` when it can (see `crate::resume`).
    pub unresumable: Option<&'static str>,
}

/// Validates `body` and `headers` for `api`.
pub fn parse(
    api: Api,
    headers: &HeaderMap,
    body: Bytes,
    limits: &RequestConfig,
) -> Result<Inference, ApiError> {
    parse_with(api, headers, body, limits, |_| None)
}

/// [`parse`], and the prompt's token ids from `tokenizer_for` the request's model, if it has
/// one: rendered and encoded as the engine will (see `kvgate_tokenize`), once per request,
/// before any lock is taken.
pub fn parse_with<'t>(
    api: Api,
    headers: &HeaderMap,
    body: Bytes,
    limits: &RequestConfig,
    tokenizer_for: impl FnOnce(Option<&str>) -> Option<&'t ChatTokenizer>,
) -> Result<Inference, ApiError> {
    let mut fields = json_object(&body, limits.max_body_bytes)?;
    let model = optional_str(&fields, "model")?.map(str::to_string);
    let stream = match fields.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(type_error("stream", "a boolean")),
    };
    let max_output_tokens = max_tokens(&fields, limits.max_tokens_limit)?;
    let (text, head_len) = match api {
        Api::Chat => chat_prefix(&fields)?,
        Api::Completions => (completion_prefix(&fields)?, 0),
    };
    let shared_head = (head_len > 0).then_some(head_len);
    let (reasoning_effort, thinking_budget) = reasoning(&fields)?;
    let mut prompt_tokens = estimate_tokens(&text);
    let mut tokens = None;
    let session = session(headers, &fields, limits);
    let tenant = tenant(headers, &limits.tenant_header);
    let tokenized = tokenizer_for(model.as_deref()).map(|tokenizer| {
        let memo = session
            .as_deref()
            .map(|s| memo_key(model.as_deref(), tenant.as_deref(), s));
        let (ids, took) = tokenize(tokenizer, api, &fields, memo)?;
        prompt_tokens = u32::try_from(ids.len()).unwrap_or(u32::MAX);
        tokens = Some(ids);
        Ok(took)
    });
    let unresumable = resumable::unresumable(api, stream, &fields);
    let (body, strip_usage) = match stream && limits.stream_usage {
        true => with_stream_usage(body, &mut fields)?,
        false => (body, false),
    };
    let request = Request {
        adapter: None,
        id: 0,
        tenant,
        session,
        model,
        prompt: Prompt {
            text: Some(text),
            tokens,
        },
        prompt_tokens,
        max_output_tokens,
        reasoning_effort,
        thinking_budget,
        priority: match header_str(headers, &limits.priority_header) {
            Some("batch") => Priority::Batch,
            _ => Priority::Interactive,
        },
    };
    let deadline = deadline(headers, &limits.deadline_header)?;
    Ok(Inference {
        api,
        body,
        stream,
        request,
        deadline,
        strip_usage,
        shared_head,
        tokenized,
        unresumable,
    })
}

/// The body as a JSON object, or the error that says why it is not one.
fn json_object(body: &[u8], max_bytes: usize) -> Result<Map<String, Value>, ApiError> {
    if body.len() > max_bytes {
        return Err(ApiError::too_large(max_bytes));
    }
    if let Err(e) = std::str::from_utf8(body) {
        return Err(ApiError::invalid(
            "invalid_encoding",
            format!("the body is not valid UTF-8 (at byte {})", e.valid_up_to()),
        ));
    }
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::invalid("invalid_json", format!("the body is not valid JSON: {e}"))
    })?;
    match value {
        Value::Object(fields) => Ok(fields),
        _ => Err(ApiError::invalid(
            "invalid_type",
            "the body must be a JSON object",
        )),
    }
}

/// The prompt's token ids as the engine will encode them, and how long that took. A chat turn
/// of a `session` (its [`memo_key`]) is encoded from where it parts from the session's last
/// prompt (`kvgate_tokenize::PromptMemo`: same ids, only the new suffix encoded).
fn tokenize(
    tokenizer: &ChatTokenizer,
    api: Api,
    fields: &Map<String, Value>,
    session: Option<u64>,
) -> Result<(Vec<u32>, Duration), String> {
    let started = std::time::Instant::now();
    let ids = match (api, session) {
        (Api::Chat, Some(key)) => tokenizer.chat_prompt_in(fields, key).map(|(ids, _)| ids),
        (Api::Chat, None) => tokenizer.chat_prompt(fields),
        (Api::Completions, _) => tokenizer.completion_prompt(fields),
    };
    ids.map(|ids| (ids, started.elapsed()))
        .map_err(|e| e.to_string())
}

/// The memo's key of a session: its name within the model and tenant, so that one tenant's
/// session names never meet another's (a collision would only cost the reuse: the memo compares
/// the rendered text before it reuses anything).
fn memo_key(model: Option<&str>, tenant: Option<&str>, session: &str) -> u64 {
    let mut key = Vec::with_capacity(64 + session.len());
    for part in [model, tenant, Some(session)] {
        let part = part.unwrap_or_default().as_bytes();
        key.extend_from_slice(&(part.len() as u64).to_le_bytes());
        key.extend_from_slice(part);
    }
    xxh3_64(&key)
}

/// The request's deadline from the `header` naming it in milliseconds, if present.
fn deadline(headers: &HeaderMap, header: &str) -> Result<Option<Duration>, ApiError> {
    let Some(v) = header_str(headers, header) else {
        return Ok(None);
    };
    let ms = v.trim().parse().map_err(|_| {
        ApiError::invalid(
            "invalid_header",
            format!("{header} must be a whole number of milliseconds"),
        )
    })?;
    Ok(Some(Duration::from_millis(ms)))
}

/// The session: the first of the session headers present, else the first body field that is
/// a non-empty string.
fn session(
    headers: &HeaderMap,
    fields: &Map<String, Value>,
    limits: &RequestConfig,
) -> Option<String> {
    std::iter::once(&limits.session_header)
        .chain(&limits.session_fallback_headers)
        .find_map(|h| header_str(headers, h))
        .or_else(|| {
            limits
                .session_body_fields
                .iter()
                .find_map(|f| match fields.get(f) {
                    Some(Value::String(s)) if !s.is_empty() => Some(s.as_str()),
                    _ => None,
                })
        })
        .map(str::to_string)
}

/// A streaming body that does not ask for usage gets `stream_options.include_usage: true`
/// (re-serialised; the fields are otherwise unchanged) and is marked for the usage chunk to be
/// stripped; one that asks for it is forwarded as it was.
fn with_stream_usage(
    body: Bytes,
    fields: &mut Map<String, Value>,
) -> Result<(Bytes, bool), ApiError> {
    let options = match fields.get_mut("stream_options") {
        None | Some(Value::Null) => {
            fields.insert("stream_options".into(), Value::Object(Map::new()));
            fields.get_mut("stream_options").expect("just inserted")
        }
        Some(v @ Value::Object(_)) => v,
        Some(_) => return Err(type_error("stream_options", "an object")),
    };
    let Value::Object(options) = options else {
        unreachable!("checked above")
    };
    match options.get("include_usage") {
        Some(Value::Bool(true)) => return Ok((body, false)),
        None | Some(Value::Null) | Some(Value::Bool(false)) => {}
        Some(_) => return Err(type_error("stream_options.include_usage", "a boolean")),
    }
    options.insert("include_usage".into(), Value::Bool(true));
    let rewritten = serde_json::to_vec(fields).map_err(|e| {
        ApiError::invalid(
            "invalid_json",
            format!("the body could not be re-encoded: {e}"),
        )
    })?;
    Ok((Bytes::from(rewritten), true))
}

fn type_error(param: &str, expected: &str) -> ApiError {
    ApiError::invalid("invalid_type", format!("`{param}` must be {expected}")).with_param(param)
}

fn optional_str<'a>(
    fields: &'a Map<String, Value>,
    key: &str,
) -> Result<Option<&'a str>, ApiError> {
    match fields.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(type_error(key, "a string")),
    }
}

fn max_tokens(fields: &Map<String, Value>, limit: u64) -> Result<Option<u32>, ApiError> {
    let mut out = None;
    for key in ["max_tokens", "max_completion_tokens"] {
        match fields.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::Number(n)) => match n.as_u64() {
                Some(v) if (1..=limit).contains(&v) => {
                    out = Some(u32::try_from(v).unwrap_or(u32::MAX));
                }
                _ => {
                    return Err(ApiError::invalid(
                        "invalid_value",
                        format!("`{key}` must be an integer between 1 and {limit}, got {n}"),
                    )
                    .with_param(key))
                }
            },
            Some(_) => return Err(type_error(key, "an integer")),
        }
    }
    Ok(out)
}

/// Reasoning effort (`reasoning_effort`, or the Responses API's `reasoning.effort`) and a
/// thinking budget (`thinking.budget_tokens`). Unknown effort names are left to the engine.
fn reasoning(
    fields: &Map<String, Value>,
) -> Result<(Option<ReasoningEffort>, Option<u32>), ApiError> {
    let effort = match fields.get("reasoning_effort") {
        None | Some(Value::Null) => match fields.get("reasoning") {
            Some(Value::Object(r)) => r.get("effort"),
            None | Some(Value::Null) => None,
            Some(_) => return Err(type_error("reasoning", "an object")),
        },
        some => some,
    };
    let effort = match effort {
        None | Some(Value::Null) => None,
        Some(Value::String(e)) => match e.as_str() {
            "none" | "minimal" => Some(ReasoningEffort::Minimal),
            "low" => Some(ReasoningEffort::Low),
            "medium" => Some(ReasoningEffort::Medium),
            "high" | "xhigh" => Some(ReasoningEffort::High),
            _ => None,
        },
        Some(_) => return Err(type_error("reasoning_effort", "a string")),
    };
    let budget = match fields.get("thinking") {
        Some(Value::Object(t)) => match t.get("budget_tokens") {
            None | Some(Value::Null) => None,
            Some(Value::Number(n)) => Some(
                n.as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| type_error("thinking.budget_tokens", "a whole number"))?,
            ),
            Some(_) => return Err(type_error("thinking.budget_tokens", "a whole number")),
        },
        _ => None,
    };
    Ok((effort, budget))
}

/// The length of the prefix key [`parse`] gives a body with these fields; `None` when they
/// do not parse.
pub(crate) fn key_len(fields: &Map<String, Value>, api: Api) -> Option<usize> {
    match api {
        Api::Chat => chat_prefix(fields).ok().map(|(text, _)| text.len()),
        Api::Completions => completion_prefix(fields).ok().map(|text| text.len()),
    }
}

/// The prefix key, and the byte length of its part before the last message.
fn chat_prefix(fields: &Map<String, Value>) -> Result<(String, usize), ApiError> {
    let messages = match fields.get("messages") {
        None | Some(Value::Null) => {
            return Err(
                ApiError::invalid("missing_required_parameter", "`messages` is required")
                    .with_param("messages"),
            )
        }
        Some(Value::Array(m)) if m.is_empty() => {
            return Err(
                ApiError::invalid("invalid_value", "`messages` must not be empty")
                    .with_param("messages"),
            )
        }
        Some(Value::Array(m)) => m,
        Some(_) => return Err(type_error("messages", "an array of messages")),
    };
    let mut text = String::with_capacity(256);
    match fields.get("tools") {
        None | Some(Value::Null) => {}
        Some(tools @ Value::Array(_)) => {
            let _ = writeln!(text, "<|tools|>{tools}");
        }
        Some(_) => return Err(type_error("tools", "an array")),
    }
    let mut head_len = 0;
    for (i, message) in messages.iter().enumerate() {
        if i + 1 == messages.len() {
            head_len = text.len();
        }
        let Value::Object(m) = message else {
            return Err(type_error(&format!("messages[{i}]"), "an object"));
        };
        let Some(Value::String(role)) = m.get("role") else {
            return Err(type_error(&format!("messages[{i}].role"), "a string"));
        };
        let _ = write!(text, "<|{role}|>");
        if let Some(Value::String(name)) = m.get("name") {
            let _ = write!(text, "{name}: ");
        }
        match m.get("content") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => text.push_str(s),
            Some(Value::Array(parts)) => {
                for part in parts {
                    match part.get("text") {
                        Some(Value::String(s)) => text.push_str(s),
                        _ => {
                            let _ = write!(text, "{part}");
                        }
                    }
                }
            }
            Some(_) => {
                return Err(type_error(
                    &format!("messages[{i}].content"),
                    "a string or an array of parts",
                ))
            }
        }
        if let Some(calls) = m.get("tool_calls").filter(|c| !c.is_null()) {
            let _ = write!(text, "{calls}");
        }
        text.push('\n');
    }
    Ok((text, head_len))
}

fn completion_prefix(fields: &Map<String, Value>) -> Result<String, ApiError> {
    let bad = || {
        type_error(
            "prompt",
            "a string, an array of strings or an array of token ids",
        )
    };
    match fields.get("prompt") {
        None | Some(Value::Null) => Err(ApiError::invalid(
            "missing_required_parameter",
            "`prompt` is required",
        )
        .with_param("prompt")),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(items)) => {
            let mut text = String::new();
            for item in items {
                match item {
                    Value::String(s) => text.push_str(s),
                    Value::Number(n) if n.is_u64() => {
                        let _ = write!(text, "<{n}>");
                    }
                    _ => return Err(bad()),
                }
            }
            Ok(text)
        }
        Some(_) => Err(bad()),
    }
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .filter(|s| !s.is_empty())
}

/// The tenant: the tenant header when present, else a hash of the bearer API key (the key itself
/// never reaches logs, metrics or the prefix index).
fn tenant(headers: &HeaderMap, tenant_header: &str) -> Option<String> {
    if let Some(t) = header_str(headers, tenant_header) {
        return Some(t.to_string());
    }
    let auth = header_str(headers, header::AUTHORIZATION.as_str())?;
    let key = auth.strip_prefix("Bearer ").unwrap_or(auth).trim();
    (!key.is_empty()).then(|| format!("key:{:016x}", xxh3_64(key.as_bytes())))
}

mod config;
mod resumable;

pub use config::RequestConfig;

#[cfg(test)]
mod tests;
