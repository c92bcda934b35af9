//! The attempt driver: one request's attempts, from the first pick to the first bytes of the
//! answer. The decisions are the pure state machine's (`kvgate_core::resilience::Attempts`:
//! retry budget, attempt limit, backoff, deadline, hedge delay); this drives it on real time.

use super::admit::Admitted;
use super::respond::{add_explanation, respond, upstream_failure};
use crate::dispatch::{AttemptFuture, Dispatch};
use crate::ending::Ending;
use crate::error::ApiError;
use crate::metrics;
use crate::observe::decisions::DecisionRecord;
use crate::observe::otel::{self, LiveSpan};
use crate::parse::Inference;
use crate::pool::Attempt;
use crate::relay::{Origin, Resume};
use crate::state::Shared;
use crate::upstream::{self, AttemptError, Ready, Sending};
use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Response};
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

/// One request's attempts: what each needs to be sent, the ones running, and where they went.
pub(super) struct Run {
    shared: Arc<Shared>,
    request: Arc<Request>,
    body: Bytes,
    stream: bool,
    strip_usage: bool,
    /// Why a broken stream cannot be continued elsewhere, or `None` when it can.
    unresumable: Option<&'static str>,
    pub(super) sending: Sending,
    rng: ChaCha8Rng,
    tried: Vec<EndpointId>,
    running: FuturesUnordered<AttemptFuture>,
    hedged_to: Option<EndpointId>,
    /// Whether the client asked for [`super::EXPLAIN_HEADER`].
    pub(super) explain: bool,
    last_endpoint: Option<Arc<str>>,
    last_decision: Option<Arc<DecisionRecord>>,
    /// The request span's context, when traces are on.
    pub(super) trace: Option<SpanContext>,
    /// Its prefill and decode legs, when its pool disaggregates.
    legs: Option<Arc<super::pd::Legs>>,
}

impl Run {
    pub(super) fn new(
        shared: Arc<Shared>,
        inference: Inference,
        headers: &HeaderMap,
        id: u64,
    ) -> Self {
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
            explain: false,
            last_endpoint: None,
            last_decision: None,
            trace: None,
            legs: None,
            shared,
        }
    }

    /// The attempt loop: the first attempt, then retries after failures and a hedge when the
    /// timer fires first, until an attempt's first bytes arrive (the answer) or the attempts
    /// are spent (the last failure, or the deadline). After the first bytes nothing is retried.
    pub(super) async fn drive(
        mut self,
        admitted: Admitted,
        deadline: Option<Nanos>,
        ending: &mut Ending,
    ) -> Result<Response<Body>, ApiError> {
        let hedge_after = match self.launch_first().await {
            Ok(after) => after,
            Err(r) => {
                ending.set(Outcome::NoEndpoint);
                return Err(self.no_endpoint(r));
            }
        };
        let retry = &self.shared.config.retry;
        let hedging = self.stream && hedge_after.is_some();
        let mut attempts =
            Attempts::new(retry.max_attempts, retry.backoff.clone(), deadline, hedging);
        attempts.launched();
        // No timer at all when hedging is off: a timer per request costs a timer-wheel entry.
        let mut hedge_timer = hedge_after
            .filter(|_| hedging)
            .map(|d| Box::pin(tokio::time::sleep(d)));
        let mut admitted = Some(admitted);
        loop {
            let armed = hedge_timer.is_some();
            let hedge = async {
                match hedge_timer.as_mut() {
                    Some(t) => t.await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                Some((dispatch, result)) = self.running.next() => match result {
                    Ok(ready) => {
                        let admitted = admitted.take().expect("answered once");
                        return Ok(self.answered(ready, dispatch, admitted, ending));
                    }
                    Err(error) => {
                        let last = self.explain.then(|| dispatch.target.decision.summary());
                        if let Some((outcome, answer)) = self.failed(dispatch, error, &mut attempts).await {
                            return self.give_up(outcome, answer, last, ending);
                        }
                    }
                },
                () = hedge, if armed => {
                    hedge_timer = None;
                    self.hedge(&mut attempts);
                }
            }
        }
    }

    /// The hedge timer fired before any first bytes: a second attempt elsewhere, when the
    /// state machine allows it.
    fn hedge(&mut self, attempts: &mut Attempts) {
        if attempts.hedge_due(self.shared.pool.clock().now()) && self.launch(Attempt::Hedge).is_ok()
        {
            attempts.launched();
            let launched = metrics::reason("launched");
            self.shared
                .metrics
                .requests
                .hedges
                .get_or_create(&launched)
                .inc();
        }
    }

    /// An attempt's first bytes arrived: the others are dropped (a losing hedge is
    /// cancelled), the session's turn recorded, and the answer streams to the client.
    fn answered(
        mut self,
        ready: Ready,
        dispatch: Dispatch,
        admitted: Admitted,
        ending: &mut Ending,
    ) -> Response<Body> {
        let Admitted {
            mut permit,
            held,
            ratelimit_headers,
            ..
        } = admitted;
        if let Some(l) = held.leader {
            l.first_token();
        }
        let shared = self.shared.clone();
        if self.hedged_to == Some(dispatch.target.id) {
            let won = metrics::reason("won");
            shared.metrics.requests.hedges.get_or_create(&won).inc();
        }
        drop(std::mem::take(&mut self.running));
        shared
            .rehome
            .answered(&self.request, &self.body, &self.sending);
        ending.at(dispatch.target.name.clone());
        self.account(ending, Some(&dispatch));
        if let Some(legs) = &self.legs {
            legs.record(ending.facts());
        }
        permit.prefilled();
        let explained = self.explain.then(|| dispatch.target.decision.summary());
        let owners = (permit, ending.take());
        let resume = self.resume();
        let mut response = respond(
            ready,
            dispatch,
            owners,
            (self.stream, self.strip_usage),
            resume,
        );
        add_explanation(&mut response, explained);
        if let Some(legs) = &self.legs {
            legs.add_headers(response.headers_mut());
        }
        for (name, value) in ratelimit_headers.iter() {
            if let Ok(v) = HeaderValue::from_str(value) {
                response.headers_mut().insert(*name, v);
            }
        }
        response
    }

    /// Every attempt failed: the request ends with `outcome` and `answer`.
    fn give_up(
        &self,
        outcome: Outcome,
        answer: Result<Response<Body>, ApiError>,
        last: Option<String>,
        ending: &mut Ending,
    ) -> Result<Response<Body>, ApiError> {
        ending.set(outcome);
        if let Some(name) = self.last_endpoint.clone() {
            ending.at(name);
        }
        if let Some(legs) = &self.legs {
            legs.record(ending.facts());
        }
        self.account(ending, None);
        answer.map(|mut r| {
            add_explanation(&mut r, last);
            r
        })
    }

    /// The first attempt: picked through the LoRA gate, which may hold it (without polling:
    /// the pool wakes it) until another adapter's turn starts or the bound passes; then it
    /// picks again. Returns the hedging delay.
    async fn launch_first(&mut self) -> Result<Option<Duration>, Rejection> {
        loop {
            let refused = self.refused();
            match Dispatch::pick_gated(&self.shared, &self.request, &refused, self.stream)? {
                Ok(dispatch) => return Ok(self.start(dispatch, Attempt::First)),
                Err(held) => self.shared.pool.hold(held).await,
            }
        }
    }

    /// The endpoints this request may not use: those tried, and on a disaggregated pool the
    /// prefill-only ones.
    fn refused(&self) -> Vec<EndpointId> {
        match super::pd::members(&self.shared, &self.request) {
            Some(m) => super::pd::decode_refusals(&m, &self.tried),
            None => self.tried.clone(),
        }
    }

    /// Picks an endpoint for another attempt and starts it; for the first attempt, returns the
    /// hedging delay. A retry's backoff is slept before this, so the ledger entry, the
    /// `Dispatched` event, a breaker probe slot and the TTFT clock all start at the send.
    fn launch(&mut self, attempt: Attempt) -> Result<Option<Duration>, Rejection> {
        let refused = self.refused();
        let dispatch = Dispatch::pick(&self.shared, &self.request, &refused, attempt, self.stream)?;
        Ok(self.start(dispatch, attempt))
    }

    /// Starts the attempt `dispatch` picked; for the first attempt, returns the hedging delay.
    fn start(&mut self, mut dispatch: Dispatch, attempt: Attempt) -> Option<Duration> {
        let members = super::pd::members(&self.shared, &self.request);
        let target = &dispatch.target;
        let hedge_after = target.hedge_after;
        self.tried.push(target.id);
        self.last_decision = Some(target.decision.clone());
        if attempt == Attempt::Hedge {
            self.hedged_to = Some(target.id);
        }
        let mut forwarded = self.sending.forwarded.clone();
        dispatch.span = self.attempt_span(&dispatch.target, attempt, &mut forwarded);
        let future = match members.filter(|_| attempt == Attempt::First) {
            Some(members) => {
                let launch = super::pd::Launch {
                    shared: &self.shared,
                    request: &self.request,
                    members,
                    sending: &self.sending,
                    body: self.body.clone(),
                    forwarded: super::pd::with_request_id(forwarded, self.request.id),
                };
                let (future, legs) = launch.start(dispatch);
                self.legs = Some(legs);
                future
            }
            None => dispatch.send(&self.sending, self.body.clone(), forwarded),
        };
        self.running.push(future);
        hedge_after
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
                metrics.requests.retries_denied.get_or_create(&why).inc();
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
                    .requests
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
        let answered = answered.map(|d| &d.target);
        let model = self.request.model.as_deref();
        ending.attempts(
            self.tried.len(),
            answered,
            self.last_decision.clone(),
            model,
        );
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
        let why = self
            .shared
            .pool
            .why_unroutable(self.request.model.as_deref());
        let mut error = ApiError::no_endpoint(format!("{rejection}: {why}"));
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
