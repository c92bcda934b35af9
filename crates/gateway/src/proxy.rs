//! The inference handler: admission, pick, attempts with retries and a hedge before the first
//! token, then the pass-through stream.
//!
//! ```text
//! admit -> pick -> attempt ─ first bytes ─────────────────────────────> stream to the client
//!                    │ connect error, 5xx, 429 (Retry-After steers away)
//!                    └─> core::resilience::Attempts: wait for a hedge still running, retry
//!                        after a full-jitter backoff (budget, attempts, deadline), or give up
//!          hedge timer (TTFT percentile) fires first -> second attempt elsewhere; the first
//!          attempt to produce bytes wins and the other is dropped (its connection closes, which
//!          cancels it upstream)
//! ```
//! The decisions are the pure state machine's; this module only drives it on real time.

use crate::admission::Claim;
use crate::body::Tracked;
use crate::dispatch::{AttemptFuture, Dispatch, Sending};
use crate::ending::Ending;
use crate::error::ApiError;
use crate::metrics;
use crate::observe::decisions::DecisionRecord;
use crate::observe::otel::{self, LiveSpan};
use crate::parse::Inference;
use crate::pool::Attempt;
use crate::resume::{Origin, Resume};
use crate::state::Shared;
use crate::upstream::{self, AttemptError, Ready};
use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Response};
use bytes::Bytes;
use futures_util::stream::{FuturesUnordered, StreamExt};
use kvgate_core::resilience::{Attempts, Next, Outcome};
use kvgate_core::{EndpointId, Nanos, Rejection, Request};
use opentelemetry::trace::SpanContext;
use opentelemetry::KeyValue;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use std::time::Duration;

/// The response header naming the endpoint that served the request.
pub const ENDPOINT_HEADER: &str = "x-kvgate-endpoint";
/// Response header naming the priority tier that served a request, when not the first.
pub const SPILLOVER_TIER_HEADER: &str = "x-kvgate-spillover-tier";
/// Why it was not the first tier: `unavailable`, `ttft`, `queue` or `session`.
pub const SPILLOVER_REASON_HEADER: &str = "x-kvgate-spillover-reason";

/// A request header: `1` asks for [`EXPLAIN_HEADER`] on the response, the pick's reason and
/// candidates in one line.
pub const EXPLAIN_HEADER: &str = "x-kvgate-explain";

fn add_explanation(response: &mut Response<Body>, summary: Option<String>) {
    if let Some(v) = summary.and_then(|s| HeaderValue::from_str(&s).ok()) {
        response.headers_mut().insert(EXPLAIN_HEADER, v);
    }
}

const HOP_BY_HOP: [HeaderName; 5] = [
    header::CONNECTION,
    header::TRANSFER_ENCODING,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
];

/// Serves one validated inference request of the client with `key`; `ending` learns how it
/// ended.
pub(crate) async fn handle(
    shared: Arc<Shared>,
    mut inference: Inference,
    key: Option<Arc<crate::tenancy::KeyConfig>>,
    headers: &HeaderMap,
    ending: &mut Ending,
) -> Result<Response<Body>, ApiError> {
    // The client's deadline counts from here, the request's arrival as the proxy sees it.
    let arrived = shared.pool.clock().now();
    let deadline = inference.deadline.map(|d| arrived + nanos(d));
    if let Some(model) = &inference.request.model {
        if !shared.pool.serves(model) {
            ending.set(Outcome::ClientError);
            return Err(ApiError::unknown_model(model));
        }
    }
    let mut lease = shared
        .tenancy
        .admit(key, &mut inference.request, arrived)
        .inspect_err(|_| ending.set(Outcome::Refused))?;
    let ratelimit_headers = std::mem::take(&mut lease.ratelimit_headers);
    let (tenant, weight, cost, keyed) = (
        lease.tenant.clone(),
        lease.weight,
        lease.admission_cost(&shared.tenancy),
        lease.keyed,
    );
    ending.lease(lease);
    // Before the queue: a held call takes no slot while it waits.
    let held = match crate::tenancy::hold(&shared, &inference, &tenant).await {
        Ok(h) => h,
        Err(e) => {
            ending.set(Outcome::Refused);
            return Err(e);
        }
    };
    let claim = Claim {
        tenant: &tenant,
        weight,
        cost,
        priority: inference.request.priority,
    };
    // The deadline counts from arrival: time held for a session slot or a fan-out leader is
    // already spent.
    let left = inference
        .deadline
        .map(|d| d.saturating_sub(ending.arrived().elapsed()));
    let admitted = shared.admission.admit(claim, left).await;
    ending.facts().queued = Some(ending.arrived().elapsed());
    let mut permit = match admitted {
        Ok(p) => {
            ending.admitted();
            p
        }
        Err(e) => {
            let full = e.status.as_u16() == 429;
            ending.set(if full {
                Outcome::QueueFull
            } else {
                Outcome::Deadline
            });
            return Err(e);
        }
    };
    let crate::tenancy::Held {
        _session,
        mut leader,
    } = held;
    let explain = headers
        .get(EXPLAIN_HEADER)
        .is_some_and(|v| v.as_bytes() == b"1" || v.as_bytes().eq_ignore_ascii_case(b"true"));
    let mut run = Run::new(shared.clone(), inference, headers, ending.id());
    if keyed {
        // The client's key is the gateway's, not an engine's.
        Arc::make_mut(&mut run.sending.forwarded).remove(header::AUTHORIZATION);
    }
    run.trace = ending.span_context();
    let hedge_after = match run.launch(Attempt::First) {
        Ok(after) => after,
        Err(r) => {
            ending.set(Outcome::NoEndpoint);
            return Err(run.no_endpoint(r));
        }
    };
    let retry = &shared.config.retry;
    let hedging = run.stream && hedge_after.is_some();
    let mut attempts = Attempts::new(retry.max_attempts, retry.backoff.clone(), deadline, hedging);
    attempts.launched();
    // No timer at all when hedging is off: a timer per request costs a timer-wheel entry.
    let mut hedge_timer = hedge_after
        .filter(|_| hedging)
        .map(|d| Box::pin(tokio::time::sleep(d)));
    loop {
        let armed = hedge_timer.is_some();
        let hedge = async {
            match hedge_timer.as_mut() {
                Some(t) => t.await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            Some((dispatch, result)) = run.running.next() => match result {
                Ok(ready) => {
                    if let Some(l) = leader.take() {
                        l.first_token();
                    }
                    if run.hedged_to == Some(dispatch.target.id) {
                        shared.metrics.hedges.get_or_create(&metrics::reason("won")).inc();
                    }
                    drop(std::mem::take(&mut run.running)); // cancels a losing hedge
                    shared.rehome.answered(&run.request, &run.body, &run.sending, dispatch.target.id);
                    ending.at(dispatch.target.name.clone());
                    run.account(ending, Some(&dispatch));
                    permit.prefilled();
                    let explained = explain.then(|| dispatch.target.decision.summary());
                    let owners = (permit, ending.take());
                    let resume = run.resume();
                    let mut response = respond(ready, dispatch, owners, (run.stream, run.strip_usage), resume);
                    add_explanation(&mut response, explained);
                    for (name, value) in ratelimit_headers.iter() {
                        if let Ok(v) = HeaderValue::from_str(value) {
                            response.headers_mut().insert(*name, v);
                        }
                    }
                    return Ok(response);
                }
                Err(error) => {
                    let last = explain.then(|| dispatch.target.decision.summary());
                    if let Some((outcome, answer)) = run.failed(dispatch, error, &mut attempts).await {
                        ending.set(outcome);
                        if let Some(name) = run.last_endpoint.clone() {
                            ending.at(name);
                        }
                        run.account(ending, None);
                        return answer.map(|mut r| {
                            add_explanation(&mut r, last);
                            r
                        });
                    }
                }
            },
            () = hedge, if armed => {
                hedge_timer = None;
                if attempts.hedge_due(shared.pool.clock().now()) && run.launch(Attempt::Hedge).is_ok() {
                    attempts.launched();
                    shared.metrics.hedges.get_or_create(&metrics::reason("launched")).inc();
                }
            }
        }
    }
}

fn nanos(d: Duration) -> Nanos {
    Nanos(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// One request's attempts: what each needs to be sent, the ones running, and where they went.
struct Run {
    shared: Arc<Shared>,
    request: Arc<Request>,
    body: Bytes,
    stream: bool,
    strip_usage: bool,
    /// Why a broken stream cannot be continued elsewhere, or `None` when it can.
    unresumable: Option<&'static str>,
    sending: Sending,
    rng: ChaCha8Rng,
    tried: Vec<EndpointId>,
    running: FuturesUnordered<AttemptFuture>,
    hedged_to: Option<EndpointId>,
    last_endpoint: Option<Arc<str>>,
    last_decision: Option<Arc<DecisionRecord>>,
    /// The request span's context, when traces are on.
    trace: Option<SpanContext>,
}

impl Run {
    fn new(shared: Arc<Shared>, inference: Inference, headers: &HeaderMap, id: u64) -> Self {
        let mut request = inference.request;
        request.id = id;
        let retry = &shared.config.retry;
        // Streams only: a non-streaming response's first bytes come when generation ends, so a
        // first-token timeout would cut off every long answer (and retry it elsewhere).
        let first_token_timeout = (inference.stream && retry.first_token_timeout_ms > 0)
            .then(|| Duration::from_millis(retry.first_token_timeout_ms));
        let sending = Sending {
            client: shared.client.clone(),
            api: inference.api,
            forwarded: Arc::new(upstream::forwarded_headers(headers)),
            first_token_timeout,
            max_retry_after: Duration::from_secs(retry.max_retry_after_secs),
            session: request.session.clone(),
        };
        Run {
            rng: ChaCha8Rng::seed_from_u64(shared.seed ^ request.id),
            request: Arc::new(request),
            body: inference.body,
            stream: inference.stream,
            strip_usage: inference.strip_usage,
            unresumable: inference.unresumable,
            sending,
            tried: Vec::with_capacity(2),
            running: FuturesUnordered::new(),
            hedged_to: None,
            last_endpoint: None,
            last_decision: None,
            trace: None,
            shared,
        }
    }

    /// Picks an endpoint for another attempt and starts it; for the first attempt, returns the
    /// hedging delay. A retry's backoff is slept before this, so the ledger entry, the
    /// `Dispatched` event, a breaker probe slot and the TTFT clock all start at the send.
    fn launch(&mut self, attempt: Attempt) -> Result<Option<Duration>, Rejection> {
        let target = self.shared.pool.pick(&self.request, &self.tried, attempt)?;
        let hedge_after = target.hedge_after;
        self.tried.push(target.id);
        self.last_decision = Some(target.decision.clone());
        if attempt == Attempt::Hedge {
            self.hedged_to = Some(target.id);
        }
        let mut forwarded = self.sending.forwarded.clone();
        let span = self.attempt_span(&target, attempt, &mut forwarded);
        let mut dispatch = Dispatch::new(self.shared.clone(), self.request.id, target, self.stream);
        dispatch.span = span;
        self.running
            .push(self.sending.send(dispatch, self.body.clone(), forwarded));
        Ok(hedge_after)
    }

    /// An attempt failed before its first bytes: report it, then wait for a running hedge,
    /// retry, or end the request with an outcome and the answer to send.
    async fn failed(
        &mut self,
        dispatch: Dispatch,
        error: AttemptError,
        attempts: &mut Attempts,
    ) -> Option<(Outcome, Result<Response<Body>, ApiError>)> {
        let name = dispatch.target.name.clone();
        self.last_endpoint = Some(name.clone());
        dispatch.fail(error.kind(), error.retry_after());
        let metrics = &self.shared.metrics;
        match self.shared.pool.next_after_failure(attempts, &mut self.rng) {
            Next::Wait => None,
            Next::GiveUp { outcome, denied } => {
                let why = metrics::reason(denied.label());
                metrics.retries_denied.get_or_create(&why).inc();
                Some(match outcome {
                    Outcome::Deadline => (outcome, Err(ApiError::deadline_passed_upstream())),
                    _ => (outcome, Ok(upstream_failure(error, &name))),
                })
            }
            Next::Retry {
                after,
                withdrawn_at,
            } => {
                metrics
                    .retries
                    .get_or_create(&metrics::reason(error.label()))
                    .inc();
                if after > Nanos::ZERO {
                    tokio::time::sleep(Duration::from_nanos(after.0)).await;
                }
                if self.launch(Attempt::Retry).is_ok() {
                    attempts.launched();
                    return None;
                }
                // Nothing was sent: the retry goes back into the budget.
                self.shared.pool.refund_retry(withdrawn_at);
                Some((Outcome::UpstreamError, Ok(upstream_failure(error, &name))))
            }
        }
    }

    /// The attempt's client span, when traces are on; its context replaces the client's
    /// `traceparent` in what goes upstream.
    fn attempt_span(
        &self,
        target: &crate::pool::Target,
        attempt: Attempt,
        forwarded: &mut Arc<HeaderMap>,
    ) -> Option<LiveSpan> {
        let (tracing, parent) = (self.shared.tracing.as_ref()?, self.trace.as_ref()?);
        let mut attrs = vec![
            KeyValue::new("gen_ai.operation.name", otel::operation(self.sending.api)),
            KeyValue::new("kvgate.endpoint", target.name.to_string()),
            KeyValue::new("kvgate.attempt", attempt.label()),
            KeyValue::new("kvgate.reason", target.reason),
            KeyValue::new("kvgate.why", target.decision.reason.to_string()),
        ];
        if let Some(m) = &self.request.model {
            attrs.push(KeyValue::new("gen_ai.request.model", m.clone()));
        }
        if let Ok(uri) = target.base.parse::<axum::http::Uri>() {
            if let Some(host) = uri.host() {
                attrs.push(KeyValue::new("server.address", host.to_owned()));
            }
            if let Some(port) = uri.port_u16() {
                attrs.push(KeyValue::new("server.port", i64::from(port)));
            }
        }
        let name = otel::span_name(self.sending.api, self.request.model.as_deref());
        Some(tracing.attempt_span(parent, name, attrs, Arc::make_mut(forwarded)))
    }

    /// Tells the access log how many attempts ran and why the last (or the winning one, the
    /// `answered` attempt) went where it went.
    fn account(&self, ending: &mut Ending, answered: Option<&Dispatch>) {
        let facts = ending.facts();
        facts.attempts = u32::try_from(self.tried.len()).unwrap_or(u32::MAX);
        facts.decision = answered
            .map(|d| d.target.decision.clone())
            .or_else(|| self.last_decision.clone());
        facts.prediction = answered.and_then(|d| d.target.prediction);
        facts.price = answered
            .and_then(|d| d.target.price)
            .or_else(|| self.shared.tenancy.price(self.request.model.as_deref()));
    }

    /// What continues the answer elsewhere if its stream breaks, or why nothing can.
    fn resume(&self) -> Result<Box<Resume>, &'static str> {
        if !self.shared.config.resume.enabled {
            return Err("disabled");
        }
        if let Some(why) = self.unresumable {
            return Err(why);
        }
        Ok(Box::new(Resume::new(Origin {
            shared: self.shared.clone(),
            request: self.request.clone(),
            body: self.body.clone(),
            sending: self.sending.clone(),
            tried: self.tried.clone(),
        })))
    }

    /// The 503 when no endpoint can take the request: every endpoint may be inside a
    /// Retry-After window or behind an open breaker, so say when the first takes traffic again;
    /// when they are all down, the next health check is the earliest one could be back.
    fn no_endpoint(&self, rejection: Rejection) -> ApiError {
        let mut error = ApiError::no_endpoint(rejection);
        let next_check = Duration::from_millis(self.shared.config.scrape.interval_ms);
        let wait = self
            .shared
            .pool
            .routable_again_in(self.request.model.as_deref())
            .unwrap_or(next_check);
        error.retry_after_secs = Some(wait.as_secs_f64().ceil().max(1.0) as u64);
        error
    }
}

fn respond(
    ready: Ready,
    dispatch: Dispatch,
    (permit, mut ending): (crate::admission::Permit, Ending),
    (stream, strip_usage): (bool, bool),
    resume: Result<Box<Resume>, &'static str>,
) -> Response<Body> {
    let Ready {
        mut head,
        first,
        rest,
    } = ready;
    for h in &HOP_BY_HOP {
        head.headers.remove(h);
    }
    let sse = stream
        || head
            .headers
            .get(header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if let Ok(v) = HeaderValue::from_str(&dispatch.target.name) {
        head.headers.insert(ENDPOINT_HEADER, v);
    }
    if dispatch.target.tier > 0 {
        // Served below the first tier: a higher tier was out (down, cooling down, in a
        // Retry-After window) or spilled the request over (`spillover`).
        let reason = dispatch.target.spilled.unwrap_or("unavailable");
        head.headers.insert(
            SPILLOVER_TIER_HEADER,
            HeaderValue::from(dispatch.target.tier),
        );
        head.headers
            .insert(SPILLOVER_REASON_HEADER, HeaderValue::from_static(reason));
    }
    let ok = head.status.is_success();
    let facts = ending.facts();
    facts.status = Some(head.status.as_u16());
    facts.first_token = (ok && stream).then(std::time::Instant::now);
    let owners = (permit, ending);
    let body = Tracked::new(
        first,
        rest,
        dispatch,
        owners,
        (sse, ok, strip_usage),
        resume,
    );
    Response::from_parts(head, Body::new(body))
}

/// The answer once every attempt failed: the last upstream error response as it was (so a
/// client sees the engine's own 429 and Retry-After), or a 502 for connection failures.
fn upstream_failure(error: AttemptError, endpoint: &str) -> Response<Body> {
    use axum::response::IntoResponse;
    match error {
        AttemptError::Status {
            status,
            mut headers,
            body,
            ..
        } => {
            for h in &HOP_BY_HOP {
                headers.remove(h);
            }
            headers.remove(header::CONTENT_LENGTH);
            if let Ok(v) = HeaderValue::from_str(endpoint) {
                headers.insert(ENDPOINT_HEADER, v);
            }
            let mut response = Response::new(Body::from(body));
            *response.status_mut() = status;
            *response.headers_mut() = headers;
            response
        }
        other => ApiError::upstream(format!("{endpoint}: {other}")).into_response(),
    }
}
