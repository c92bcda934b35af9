//! The first stages of every inference request, the proxy's and the endpoint picker's alike:
//! identify the client by its key, then read and parse the body (with the model's tokenizer,
//! when there is one), so every bad input gets the same OpenAI-shaped error.

use crate::error::ApiError;
use crate::metrics::ReasonLabel;
use crate::parse::{self, Api, Inference};
use crate::state::Shared;
use crate::tenancy::KeyConfig;
use axum::body::Body;
use axum::http::{header, request::Parts, HeaderMap};
use bytes::Bytes;
use std::sync::Arc;

/// The client's key (`None` when keys are not enforced), or the 401 for a missing or unknown
/// one: a client without a key learns nothing else from the gateway.
pub(crate) fn identify(
    shared: &Shared,
    headers: &HeaderMap,
) -> Result<Option<Arc<KeyConfig>>, ApiError> {
    shared.tenancy.identify(headers)
}

/// Which API a request path names.
pub(crate) fn api_of(path: &str) -> Option<Api> {
    if path.ends_with("/chat/completions") {
        Some(Api::Chat)
    } else if path.ends_with("/completions") {
        Some(Api::Completions)
    } else {
        None
    }
}

/// Reads a request's body within `requests.max_body_bytes` (a declared length over it is
/// refused before a byte is read) and parses it.
pub(crate) async fn read(
    shared: &Shared,
    api: Api,
    parts: &Parts,
    body: Body,
) -> Result<Inference, ApiError> {
    let limit = shared.config.requests.max_body_bytes;
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(ApiError::too_large(limit));
    }
    let bytes = axum::body::to_bytes(body, limit).await.map_err(|e| {
        let over = std::error::Error::source(&e)
            .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
        if over {
            ApiError::too_large(limit)
        } else {
            ApiError::invalid("body_read_error", format!("could not read the body: {e}"))
        }
    })?;
    parse(shared, api, &parts.headers, bytes)
}

/// Parses a request body of `api` as the gateway does (with the model's tokenizer, when it
/// has one) and counts how tokenizing went.
pub(crate) fn parse(
    shared: &Shared,
    api: Api,
    headers: &HeaderMap,
    bytes: Bytes,
) -> Result<Inference, ApiError> {
    let limits = &shared.config.requests;
    let inference = parse::parse_with(api, headers, bytes, limits, |model| {
        shared.tokenizers.get(model)
    })?;
    let m = &shared.metrics.engine_state;
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
