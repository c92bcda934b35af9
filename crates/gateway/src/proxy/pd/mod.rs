//! The attempt stage's part of prefill/decode disaggregation. In a pool with `role: prefill`
//! endpoints the first attempt's pick is the decode endpoint (prefill-only endpoints refused);
//! [`kvgate_core::disagg`] then decides, from the predicted-TTFT model and what the prefix
//! cache holds on each endpoint, whether the prompt is prefilled there or on a prefill
//! endpoint, and which one. A remote prefill runs as the protocol's reference router runs it
//! ([`legs`]); when the prefill leg fails (not with a 4xx) the decode endpoint prefills itself
//! and the request does not fail. Retries and hedges of the decode leg are plain attempts
//! on decode endpoints: each prefills locally.

mod legs;

use crate::dispatch::{AttemptFuture, Dispatch};
use crate::endpoint_config::EndpointRole;
use crate::pool::RoleMember;
use crate::state::Shared;
use crate::upstream::Sending;
use axum::http::{HeaderMap, HeaderValue};
use bytes::Bytes;
use kvgate_core::disagg::{Candidate, Prefill, Side, Verdict};
use kvgate_core::policy::calibration::Coefficients;
use kvgate_core::{EndpointId, Request};
use std::sync::{Arc, OnceLock};

/// The response header naming the prefill endpoint of a disaggregated request.
pub(crate) const PREFILL_ENDPOINT_HEADER: &str = "x-kvgate-prefill-endpoint";
/// The response header with the disaggregation decision: `outcome; reason; local_ms=..;
/// remote_ms=..`.
pub(crate) const DISAGG_HEADER: &str = "x-kvgate-disagg";

/// One request's legs, as its response headers and access log line report them.
#[derive(Debug)]
pub(super) struct Legs {
    verdict: Verdict,
    /// The prefill endpoint's name, when the decision was remote.
    prefill: Option<Arc<str>>,
    /// `local`, `remote`, `fallback` or `rejected`, once known.
    outcome: OnceLock<&'static str>,
    /// The prefill leg's time, seconds.
    prefill_secs: OnceLock<f64>,
}

impl Legs {
    fn settle(&self, shared: &Shared, outcome: &'static str) {
        if self.outcome.set(outcome).is_ok() {
            shared.disagg.count(outcome);
        }
    }

    /// The outcome so far (`pending` while the prefill leg runs).
    pub(super) fn outcome(&self) -> &'static str {
        self.outcome.get().copied().unwrap_or("pending")
    }

    /// The `x-kvgate-disagg` value.
    pub(super) fn summary(&self) -> String {
        let v = &self.verdict;
        let mut s = format!(
            "{}; {}; uncached={}; local_ms={:.1}",
            self.outcome(),
            v.why,
            v.uncached_tokens,
            v.local_secs * 1e3
        );
        if let Some(r) = v.remote_secs {
            s.push_str(&format!("; remote_ms={:.1}", r * 1e3));
        }
        s
    }

    /// Adds the headers naming both legs.
    pub(super) fn add_headers(&self, headers: &mut HeaderMap) {
        if let Ok(v) = HeaderValue::from_str(&self.summary()) {
            headers.insert(DISAGG_HEADER, v);
        }
        let remote = matches!(self.outcome(), "remote");
        if let Some(v) = self
            .prefill
            .as_deref()
            .filter(|_| remote)
            .and_then(|p| HeaderValue::from_str(p).ok())
        {
            headers.insert(PREFILL_ENDPOINT_HEADER, v);
        }
    }

    /// Tells the access log of both legs.
    pub(super) fn record(&self, facts: &mut crate::ending::Facts) {
        let remote = matches!(self.outcome(), "remote");
        facts.disagg = Some(self.outcome());
        facts.disagg_why = Some(self.verdict.why.label());
        facts.prefill_endpoint = self.prefill.clone().filter(|_| remote);
        facts.prefill_ms = self.prefill_secs.get().map(|s| s * 1e3);
        facts.prefill_uncached_tokens = self.verdict.remote_uncached_tokens.filter(|_| remote);
    }
}

/// `forwarded` with an `X-Request-Id` (`kvgate-ID` when the client sent none): both legs carry
/// the same one, as vLLM's proxy sends them (the engines' logs then pair them).
pub(super) fn with_request_id(mut forwarded: Arc<HeaderMap>, id: u64) -> Arc<HeaderMap> {
    if !forwarded.contains_key("x-request-id") {
        if let Ok(v) = HeaderValue::from_str(&format!("kvgate-{id}")) {
            Arc::make_mut(&mut forwarded).insert("x-request-id", v);
        }
    }
    forwarded
}

/// The pool's endpoints with their roles when it has prefill endpoints (disaggregation
/// applies), else `None`.
pub(super) fn members(shared: &Shared, request: &Request) -> Option<Vec<RoleMember>> {
    if !shared.pool.has_prefill_endpoints() {
        return None;
    }
    Some(shared.pool.role_members(request.model.as_deref()))
}

/// `tried` and the prefill-only endpoints: where a decode leg may not go.
pub(super) fn decode_refusals(members: &[RoleMember], tried: &[EndpointId]) -> Vec<EndpointId> {
    let mut refused = tried.to_vec();
    refused.extend(
        members
            .iter()
            .filter(|m| m.role == EndpointRole::Prefill)
            .map(|m| m.id),
    );
    refused
}

/// What one attempt needs besides its decode dispatch.
pub(super) struct Launch<'a> {
    pub(super) shared: &'a Arc<Shared>,
    pub(super) request: &'a Arc<Request>,
    pub(super) members: Vec<RoleMember>,
    pub(super) sending: &'a Sending,
    pub(super) body: Bytes,
    pub(super) forwarded: Arc<HeaderMap>,
}

impl Launch<'_> {
    /// Decides where the prefill of the attempt on `decode` runs and starts it: the future
    /// resolves with the decode leg's first bytes, as any attempt's does.
    pub(super) fn start(self, decode: Dispatch) -> (AttemptFuture, Arc<Legs>) {
        let verdict = self.decide(decode.target.id);
        let shared = self.shared;
        let prefill = match verdict.prefill {
            Prefill::Remote(id) => {
                let refused = all_but(&self.members, id);
                Dispatch::pick(
                    shared,
                    self.request,
                    &refused,
                    crate::pool::Attempt::First,
                    false,
                )
                .ok()
            }
            Prefill::Local => None,
        };
        let legs = Arc::new(Legs {
            verdict,
            prefill: prefill.as_ref().map(|p| p.target.name.clone()),
            outcome: OnceLock::new(),
            prefill_secs: OnceLock::new(),
        });
        let future = match prefill {
            Some(prefill) => legs::remote(self, decode, prefill, legs.clone()),
            None => {
                legs.settle(
                    shared,
                    if verdict.is_remote() {
                        "fallback"
                    } else {
                        "local"
                    },
                );
                legs::local(self, decode, f64::from(verdict.uncached_tokens))
            }
        };
        (future, legs)
    }

    /// The core decision for a decode leg on `decode`.
    fn decide(&self, decode: EndpointId) -> Verdict {
        let shared = self.shared;
        let prefills: Vec<&RoleMember> = self
            .members
            .iter()
            .filter(|m| m.role == EndpointRole::Prefill && m.healthy)
            .collect();
        let mut ids: Vec<EndpointId> = prefills.iter().map(|m| m.id).collect();
        ids.push(decode);
        let cached = shared.pool.cached_tokens(self.request, &ids);
        let learned = shared.pool.learned();
        let prior = shared.disagg.config.prior();
        let side = |id: EndpointId, cached: u32, decodes: u32| Side {
            coefficients: learned
                .iter()
                .find(|(e, _)| *e == id)
                .map_or(prior, |(_, m)| Coefficients {
                    fixed: m.fixed_seconds,
                    per_decode: 0.0,
                    per_token: 1.0 / m.prefill_tokens_per_second.max(1.0),
                    interference: 0.0,
                }),
            queued_tokens: shared.disagg.ledger.queued(id),
            decodes: f64::from(decodes),
            cached_tokens: cached,
        };
        let running = self
            .members
            .iter()
            .find(|m| m.id == decode)
            .map_or(0, |m| m.running);
        let decode_side = side(decode, cached[prefills.len()], running);
        let candidates: Vec<Candidate> = prefills
            .iter()
            .zip(&cached)
            .map(|(m, &c)| Candidate {
                endpoint: m.id,
                side: side(m.id, c, 0),
            })
            .collect();
        let prompt = self.request.prompt_tokens.max(1);
        shared
            .disagg
            .decider
            .decide(prompt, &decode_side, &candidates)
    }
}

/// Every endpoint but `keep`: a pick that may only go to `keep`.
fn all_but(members: &[RoleMember], keep: EndpointId) -> Vec<EndpointId> {
    members
        .iter()
        .map(|m| m.id)
        .filter(|&id| id != keep)
        .collect()
}

/// Every endpoint that is not a healthy prefill endpoint, and `tried`: where a prefill
/// leg's retry may not go.
fn prefill_refusals(members: &[RoleMember], tried: EndpointId) -> Vec<EndpointId> {
    members
        .iter()
        .filter(|m| m.role != EndpointRole::Prefill || m.id == tried)
        .map(|m| m.id)
        .collect()
}
