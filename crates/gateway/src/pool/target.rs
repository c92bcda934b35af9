//! What a pick hands the request path: the endpoint and everything an attempt there needs.

use crate::observe::decisions::DecisionRecord;
use axum::http::HeaderValue;
use kvgate_core::index::Prediction;
use kvgate_core::resilience::Ticket;
use kvgate_core::EndpointId;
use std::sync::Arc;
use std::time::Duration;

/// Where the policy sent an attempt.
#[derive(Clone, Debug)]
pub struct Target {
    /// The endpoint.
    pub id: EndpointId,
    /// Its display name.
    pub name: Arc<str>,
    /// Its base URL.
    pub base: Arc<str>,
    /// Its iteration clock, which the attempt's stream ticks.
    pub cadence: Arc<super::CadenceCell>,
    /// [`kvgate_core::Reason::label`] of the pick.
    pub reason: &'static str,
    /// Why it went there, with the candidates as the pick saw them.
    pub decision: Arc<DecisionRecord>,
    /// The endpoint's own `Authorization` value, if it has an API key.
    pub authorization: Option<HeaderValue>,
    /// The breaker's permission for this dispatch (a half-open probe or not), handed back
    /// with its outcome.
    pub ticket: Ticket,
    /// For a request's first attempt: how long to wait before hedging, if hedging is on.
    pub hedge_after: Option<Duration>,
    /// What the prefix cache predicted this endpoint held of the request.
    pub prediction: Option<Prediction>,
    /// The policy's predicted time to first token, seconds, when it predicts one.
    pub predicted_ttft: Option<f64>,
    /// Headers configured for this endpoint, sent with the attempt.
    pub headers: Arc<axum::http::HeaderMap>,
    /// The model name to send in place of the request's (the request named an alias).
    pub send_model: Option<Arc<str>>,
    /// The endpoint's priority tier.
    pub tier: u32,
    /// Why a higher tier was passed over although it could take the request (`ttft`,
    /// `queue`, `session`); `None` when it could not.
    pub spilled: Option<&'static str>,
    /// The endpoint's own token price, if configured.
    pub price: Option<kvgate_core::tenancy::Price>,
    /// Send the session as `prompt_cache_key` (the endpoint asks for it).
    pub prompt_cache_key: bool,
}

pub use kvgate_core::dispatch::Attempt;
