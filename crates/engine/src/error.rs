//! Errors: the library's typed error and the OpenAI/vLLM-shaped HTTP error body.
//!
//! vLLM answers every bad request with `{"error": {"message", "type", "param", "code"}}` where
//! `type` is the exception class name (`BadRequestError`, `NotFoundError`, ...) and `code` the
//! HTTP status (see `test-data/vllm/error-*.json`).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// Why the engine could not start or keep serving.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The configuration is inconsistent.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The KV event publisher could not start.
    #[error(transparent)]
    KvEvents(#[from] crate::kv_events::KvEventsError),
    /// The tokenizer directory could not be loaded.
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] kvgate_tokenize::TokenizeError),
    /// The listener failed.
    #[error("listener failed: {0}")]
    Io(#[from] std::io::Error),
}

/// An error answered to an HTTP client.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
    pub(crate) param: Option<&'static str>,
    pub(crate) retry_after_secs: Option<u64>,
    /// Overrides the `type` derived from the status (vLLM reports body decode errors as
    /// `"Bad Request"`).
    pub(crate) kind: Option<&'static str>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            param: None,
            retry_after_secs: None,
            kind: None,
        }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub(crate) fn bad_param(param: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            param: Some(param),
            ..Self::bad_request(message)
        }
    }

    /// The Python exception class name vLLM reports as `type`.
    fn type_name(&self) -> &'static str {
        if let Some(kind) = self.kind {
            return kind;
        }
        match self.status {
            StatusCode::BAD_REQUEST => "BadRequestError",
            StatusCode::UNAUTHORIZED => "AuthenticationError",
            StatusCode::FORBIDDEN => "PermissionDeniedError",
            StatusCode::NOT_FOUND => "NotFoundError",
            StatusCode::METHOD_NOT_ALLOWED => "MethodNotAllowed",
            StatusCode::PAYLOAD_TOO_LARGE => "RequestEntityTooLarge",
            StatusCode::UNSUPPORTED_MEDIA_TYPE => "UnsupportedMediaType",
            StatusCode::TOO_MANY_REQUESTS => "RateLimitError",
            StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailableError",
            _ => "InternalServerError",
        }
    }

    /// The JSON body.
    pub(crate) fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.type_name(),
                "param": self.param,
                "code": self.status.as_u16(),
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if let Some(secs) = self.retry_after_secs {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}
