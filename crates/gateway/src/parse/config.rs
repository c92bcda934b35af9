//! `requests:` in the configuration: body and token limits, and the headers and fields that
//! name a request's tenant, session, deadline and priority.

use crate::error::ConfigError;
use serde::{Deserialize, Serialize};

/// Request parsing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RequestConfig {
    /// Largest accepted body.
    pub max_body_bytes: usize,
    /// Largest accepted `max_tokens` / `max_completion_tokens`.
    pub max_tokens_limit: u64,
    /// Header naming the tenant; else the hashed API key.
    pub tenant_header: String,
    /// Header naming the session.
    pub session_header: String,
    /// Further headers read as the session when `session_header` is absent, in order (the
    /// conventions of other gateways and SDKs).
    pub session_fallback_headers: Vec<String>,
    /// Top-level body fields read as the session when no header names one (OpenAI's `user`
    /// identifies the end user, whose conversations share a prefix).
    pub session_body_fields: Vec<String>,
    /// Ask streaming upstreams for a final usage chunk (`stream_options.include_usage`) when the
    /// client did not, and strip that chunk from what the client receives: usage's
    /// `cached_tokens` is how kvgate learns whether its cache prediction held.
    pub stream_usage: bool,
    /// Header carrying the request's deadline in milliseconds from arrival.
    pub deadline_header: String,
    /// Header carrying the priority (`interactive` or `batch`).
    pub priority_header: String,
}

impl Default for RequestConfig {
    fn default() -> Self {
        RequestConfig {
            max_body_bytes: 8 * 1024 * 1024,
            max_tokens_limit: 1 << 20,
            tenant_header: "x-kvgate-tenant".into(),
            session_header: "x-kvgate-session".into(),
            session_fallback_headers: vec!["x-session-id".into(), "session_id".into()],
            session_body_fields: vec!["user".into()],
            stream_usage: true,
            deadline_header: "x-kvgate-deadline-ms".into(),
            priority_header: "x-kvgate-priority".into(),
        }
    }
}

impl RequestConfig {
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.max_body_bytes == 0 {
            return Err(ConfigError::invalid(
                "requests.max_body_bytes",
                "must be positive",
            ));
        }
        Ok(())
    }
}
