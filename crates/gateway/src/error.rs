//! The gateway's errors. [`ApiError`] is the one error a client sees: every refusal, bad input
//! and upstream failure is rendered as OpenAI's error object
//! `{"error": {"message", "type", "param", "code"}}` with a fitting status. [`ConfigError`] is
//! what an operator sees of a configuration that cannot run; every concern's validation returns
//! it, so it sits below them all.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use std::path::PathBuf;

/// A configuration that cannot run.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The YAML did not parse or had unknown fields.
    #[error("configuration file: {0}")]
    Yaml(#[source] yaml_serde::Error),
    /// A policy parameter is out of range.
    #[error(transparent)]
    Policy(#[from] kvgate_core::policy::ConfigError),
    /// No policy has that name.
    #[error("unknown policy {0:?}; `kvgate policies` lists them")]
    UnknownPolicy(String),
    /// `--policy-set` named a parameter the policy does not have or gave a bad value.
    #[error("policy parameter {key}={value}: {source}")]
    PolicyParam {
        /// The parameter.
        key: String,
        /// The value given.
        value: String,
        /// Why it was refused.
        #[source]
        source: serde_json::Error,
    },
    /// The TLS files cannot be used.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The access log file could not be opened.
    #[error("observability.access_log: cannot open {path}: {source}")]
    AccessLog {
        /// The path.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Some other field is invalid.
    #[error("{field}: {why}")]
    Invalid {
        /// The field.
        field: String,
        /// What is wrong.
        why: String,
    },
}

impl ConfigError {
    /// `field` is invalid for the reason `why`.
    pub(crate) fn invalid(field: impl Into<String>, why: impl Into<String>) -> Self {
        ConfigError::Invalid {
            field: field.into(),
            why: why.into(),
        }
    }
}

/// TLS files that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or holds no usable PEM item.
    #[error("{path}: {why}")]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// rustls refused the key, the chain or the CA.
    #[error("TLS: {0}")]
    Rustls(String),
}

/// An error answered to the client.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable explanation.
    pub message: String,
    /// OpenAI's error `type`.
    pub kind: &'static str,
    /// The offending request field, if one.
    pub param: Option<String>,
    /// A stable machine-readable code.
    pub code: &'static str,
    /// Seconds for a `Retry-After` header.
    pub retry_after_secs: Option<u64>,
    /// Further response headers (`x-ratelimit-*` on a rate-limit refusal).
    pub headers: Box<[(&'static str, String)]>,
}

#[derive(Serialize)]
struct Envelope<'a> {
    error: Body<'a>,
}

#[derive(Serialize)]
struct Body<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: &'a str,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, code: &'static str, message: String) -> Self {
        ApiError {
            status,
            message,
            kind,
            param: None,
            code,
            retry_after_secs: None,
            headers: Box::new([]),
        }
    }

    /// 400 for a malformed or invalid request.
    pub fn invalid(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            code,
            message.into(),
        )
    }

    /// Names the offending field.
    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    /// 413 for a body over the limit.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "request_too_large",
            format!("request body exceeds the limit of {limit} bytes"),
        )
    }

    /// 404 for a model no endpoint serves.
    pub fn unknown_model(model: &str, served: &[String]) -> Self {
        let served = quoted_list(served, "none is known yet");
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "model_not_found",
            format!("the model `{model}` does not exist in this pool (models served: {served})"),
        )
        .with_param("model")
    }

    /// 404 for a LoRA adapter no endpoint lists and the gateway has no path to load it from.
    pub fn unknown_adapter(adapter: &str, served: &[String]) -> Self {
        let served = quoted_list(served, "none");
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "model_not_found",
            format!(
                "the LoRA adapter `{adapter}` is not loaded on any endpoint and `lora.paths` \
                 names no path to load it from (adapters served: {served})"
            ),
        )
        .with_param("model")
    }

    /// 429 when the gateway's queue is full.
    pub fn overloaded(retry_after_secs: u64) -> Self {
        let mut e = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            "queue_full",
            "the gateway's queue is full; retry later".into(),
        );
        e.retry_after_secs = Some(retry_after_secs);
        e
    }

    /// 429 for a batch request shed from a full queue to make room for interactive work.
    pub fn shed(retry_after_secs: u64) -> Self {
        let mut e = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            "shed",
            "the gateway's queue is full and batch work was shed for interactive work; retry later"
                .into(),
        );
        e.retry_after_secs = Some(retry_after_secs);
        e
    }

    /// 429 for a request over its key's or tenant's rate limit.
    pub fn rate_limited(message: String) -> Self {
        Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            "rate_limit_exceeded",
            message,
        )
    }

    /// 429 for a request its budget has no room for (OpenAI's `insufficient_quota`); no
    /// Retry-After, since waiting does not refill a budget.
    pub fn budget_exceeded(message: String) -> Self {
        Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "insufficient_quota",
            "budget_exceeded",
            message,
        )
    }

    /// 401 for a missing or unknown client API key.
    pub fn invalid_api_key(presented: bool) -> Self {
        let message = if presented {
            "the API key is not valid for this gateway"
        } else {
            "an API key is required: send `Authorization: Bearer KEY`"
        };
        Self::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "invalid_api_key",
            message.into(),
        )
    }

    /// 403 for a model the key may not use.
    pub fn model_not_allowed(key: &str, model: &str) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "invalid_request_error",
            "model_not_allowed",
            format!("the key `{key}` may not use the model `{model}`"),
        )
        .with_param("model")
    }

    /// 504 for a request that waited in the queue past its deadline.
    pub fn deadline_exceeded() -> Self {
        Self::new(
            StatusCode::GATEWAY_TIMEOUT,
            "timeout_error",
            "deadline_exceeded",
            "the request's deadline passed while it was queued".into(),
        )
    }

    /// 504 for a request whose deadline passed before an endpoint answered it: no further attempt
    /// is made for a client that no longer waits.
    pub fn deadline_passed_upstream() -> Self {
        Self::new(
            StatusCode::GATEWAY_TIMEOUT,
            "timeout_error",
            "deadline_exceeded",
            "the request's deadline passed before an endpoint answered it".into(),
        )
    }

    /// 503 when no endpoint can take the request.
    pub fn no_endpoint(why: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "no_endpoint",
            format!("no endpoint available: {why}"),
        )
    }

    /// 502 when every attempt upstream failed.
    pub fn upstream(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_GATEWAY,
            "server_error",
            "upstream_error",
            message.into(),
        )
    }

    /// 401 for the admin API.
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "invalid_token",
            "a valid admin bearer token is required".into(),
        )
    }

    /// The JSON body.
    pub fn body(&self) -> String {
        serde_json::to_string(&Envelope {
            error: Body {
                message: &self.message,
                kind: self.kind,
                param: self.param.as_deref(),
                code: self.code,
            },
        })
        .unwrap_or_default()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            self.body(),
        )
            .into_response();
        if let Some(secs) = self.retry_after_secs {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        for (name, value) in self.headers.into_vec() {
            if let Ok(v) = HeaderValue::from_str(&value) {
                response.headers_mut().insert(name, v);
            }
        }
        response
    }
}

/// `names` as `` `a`, `b` `` for an error message, or `empty` when there are none.
fn quoted_list(names: &[String], empty: &str) -> String {
    if names.is_empty() {
        return empty.to_string();
    }
    names
        .iter()
        .map(|m| format!("`{m}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_openai_shape() {
        let e = ApiError::invalid("invalid_type", "bad").with_param("stream");
        let v: serde_json::Value = serde_json::from_str(&e.body()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"error": {"message": "bad", "type": "invalid_request_error", "param": "stream", "code": "invalid_type"}})
        );
        let r = ApiError::overloaded(3).into_response();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "3");
    }
}
