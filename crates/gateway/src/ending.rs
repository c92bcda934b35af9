//! How a request ended, recorded once: an [`Ending`] travels with the request from the moment
//! it arrives (through admission, attempts and the response body) and, when it is dropped,
//! writes `kvgate_requests_total{outcome, policy, endpoint}` and the request's access-log line.
//! A request whose future or body is dropped before anyone set an outcome (the client went
//! away) ends as `cancelled`.

use crate::observe::access_log::AccessRecord;
use crate::observe::decisions::DecisionRecord;
use crate::parse::Api;
use crate::state::Shared;
use axum::http::HeaderValue;
use kvgate_core::resilience::Outcome;
use kvgate_core::{Request, Usage};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// What is learned about a request on its way, for the access log.
#[derive(Debug, Default)]
pub(crate) struct Facts {
    api: Option<Api>,
    client_request_id: Option<String>,
    tenant: Option<String>,
    session: Option<String>,
    model: Option<String>,
    stream: Option<bool>,
    /// Upstream attempts launched.
    pub(crate) attempts: u32,
    /// The status sent to the client.
    pub(crate) status: Option<u16>,
    /// Time waiting for admission.
    pub(crate) queued: Option<Duration>,
    /// When the client's first token was ready (streams).
    pub(crate) first_token: Option<Instant>,
    /// The engine's usage, or what the gateway counted.
    pub(crate) usage: Option<Usage>,
    /// Output tokens counted on the stream when the engine sent no usage.
    pub(crate) output_tokens: Option<u32>,
    /// The last pick's record.
    pub(crate) decision: Option<Arc<DecisionRecord>>,
}

/// The request's outcome so far. See the module documentation.
#[derive(Debug)]
pub(crate) struct Ending {
    shared: Arc<Shared>,
    id: u64,
    arrived: Instant,
    outcome: Outcome,
    endpoint: Option<Arc<str>>,
    facts: Facts,
    armed: bool,
}

impl Ending {
    /// A request that just arrived; it gets its id here.
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Ending {
            id: shared.next_request.fetch_add(1, Ordering::Relaxed),
            arrived: Instant::now(),
            shared,
            outcome: Outcome::Cancelled,
            endpoint: None,
            facts: Facts::default(),
            armed: true,
        }
    }

    /// The gateway's id of the request.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// When the request arrived.
    pub(crate) fn arrived(&self) -> Instant {
        self.arrived
    }

    /// Sets the outcome recorded at the end.
    pub(crate) fn set(&mut self, outcome: Outcome) {
        self.outcome = outcome;
    }

    /// Names the endpoint that answered (or last failed).
    pub(crate) fn at(&mut self, endpoint: Arc<str>) {
        self.endpoint = Some(endpoint);
    }

    /// What the access log reports of the request.
    pub(crate) fn facts(&mut self) -> &mut Facts {
        &mut self.facts
    }

    /// Notes the client's own request id, if it sent one.
    pub(crate) fn client_request_id(&mut self, id: Option<&HeaderValue>) {
        if self.shared.access_log.enabled() {
            self.facts.client_request_id = id.and_then(|v| v.to_str().ok()).map(str::to_owned);
        }
    }

    /// Notes who asked for what, once the request parsed.
    pub(crate) fn describe(&mut self, request: &Request, api: Api, stream: bool) {
        if !self.shared.access_log.enabled() {
            return;
        }
        let f = &mut self.facts;
        f.api = Some(api);
        f.stream = Some(stream);
        f.tenant.clone_from(&request.tenant);
        f.session.clone_from(&request.session);
        f.model.clone_from(&request.model);
    }

    /// Moves the record into a new owner (the response body); this one records nothing.
    pub(crate) fn take(&mut self) -> Ending {
        self.armed = false;
        Ending {
            shared: self.shared.clone(),
            id: self.id,
            arrived: self.arrived,
            outcome: self.outcome,
            endpoint: self.endpoint.take(),
            facts: std::mem::take(&mut self.facts),
            armed: true,
        }
    }

    fn log(&self) {
        let f = &self.facts;
        let now = Instant::now();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let output = f.usage.map(|u| u.output_tokens).or(f.output_tokens);
        let ttft = f
            .first_token
            .filter(|_| f.stream == Some(true))
            .map(|t| t - self.arrived);
        let tpot = match (ttft, output) {
            (Some(ttft), Some(n)) if n > 1 && self.outcome == Outcome::Ok => {
                Some(ms(now - self.arrived - ttft) / f64::from(n - 1))
            }
            _ => None,
        };
        let decision = f.decision.as_deref();
        let written = self.shared.access_log.write(&AccessRecord {
            ts: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            request_id: self.id,
            client_request_id: f.client_request_id.as_deref(),
            api: f.api.map(Api::name),
            tenant: f.tenant.as_deref(),
            session: f.session.as_deref(),
            model: f.model.as_deref(),
            stream: f.stream,
            endpoint: self.endpoint.as_deref(),
            attempts: f.attempts,
            outcome: self.outcome.label(),
            status: f.status,
            queue_ms: f.queued.map(ms),
            ttft_ms: ttft.map(ms),
            tpot_ms: tpot,
            e2e_ms: ms(now - self.arrived),
            prompt_tokens: f.usage.map(|u| u.prompt_tokens),
            cached_tokens: f.usage.and_then(|u| u.cached_tokens),
            output_tokens: output,
            reason: decision.map(|d| d.label),
            why: decision.map(|d| d.why.as_str()),
        });
        if !written {
            self.shared.metrics.access_log_dropped.inc();
        }
    }
}

impl Drop for Ending {
    fn drop(&mut self) {
        if self.armed {
            self.shared.metrics.request(
                self.outcome.label(),
                self.shared.pool.policy_name(),
                self.endpoint.as_deref().unwrap_or("none"),
            );
            if self.shared.access_log.enabled() {
                self.log();
            }
        }
    }
}
