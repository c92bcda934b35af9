//! One attempt's bookkeeping from pick to end: the pool's events (first token, refusal,
//! completion, failure) and the latency histograms of the attempt that answered. Dropping an
//! unfinished [`Dispatch`] (a hedge that lost, a client that went away) reports it as
//! cancelled, so no path can leak a ledger entry. How the *request* ended is the
//! [`crate::ending::Ending`]'s business.

use crate::metrics::{EndpointLabel, PolicyLabel};
use crate::observe::otel::{self, LiveSpan};
use crate::pool::{Attempt, Held, Placed, Target};
use crate::state::Shared;
use crate::upstream::{self, AttemptError, Ready, Sending};
use axum::http::HeaderMap;
use bytes::Bytes;
use kvgate_core::decision::FailureKind;
use kvgate_core::{EndpointId, Nanos, Rejection, Request, Usage};
use opentelemetry::trace::Span as _;
use opentelemetry::KeyValue;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// An attempt on its way: its dispatch and, once the first bytes (or the failure) are in,
/// the result.
pub(crate) type AttemptFuture = Pin<Box<dyn Future<Output = AttemptOutcome> + Send>>;

/// How an attempt ended: its dispatch, and the upstream's answer or the error.
pub(crate) type AttemptOutcome = (Dispatch, Result<Ready, AttemptError>);

impl Dispatch {
    /// Sends `body` to this attempt's endpoint as `sending` says and waits for the first bytes
    /// (or the first-token timeout); the attempt learns of a first token or a refusal.
    pub(crate) fn send(
        self,
        sending: &Sending,
        body: Bytes,
        forwarded: Arc<HeaderMap>,
    ) -> AttemptFuture {
        let sending = sending.clone();
        let mut dispatch = self;
        Box::pin(async move {
            let t = &dispatch.target;
            let cache_key = sending.session.as_deref().filter(|_| t.prompt_cache_key);
            let body = upstream::rewritten(&body, t.send_model.as_deref(), cache_key);
            let headers = upstream::Headers {
                forwarded: &forwarded,
                authorization: t.authorization.as_ref(),
                configured: &t.headers,
            };
            let send = upstream::attempt(
                &sending.client,
                &t.base,
                sending.api,
                body,
                headers,
                sending.max_retry_after,
            );
            let result = match sending.first_token_timeout {
                Some(limit) => tokio::time::timeout(limit, send)
                    .await
                    .unwrap_or(Err(AttemptError::Timeout(limit))),
                None => send.await,
            };
            // Only a 2xx answer carries tokens; other statuses go to the client unchanged.
            match &result {
                Ok(ready) if ready.head.status.is_success() => dispatch.first_token(),
                Ok(ready) => dispatch.refused(ready.head.status.as_u16()),
                Err(_) => {}
            }
            (dispatch, result)
        })
    }
}

/// An attempt in flight.
#[derive(Debug)]
pub(crate) struct Dispatch {
    shared: Arc<Shared>,
    /// The request's id.
    pub(crate) request: u64,
    /// Where it went.
    pub(crate) target: Target,
    /// Whether the client asked for a stream (only streams feed TTFT and the hedge delay).
    stream: bool,
    sent: Nanos,
    first: Option<Nanos>,
    done: bool,
    /// The attempt's trace span, when traces are on.
    pub(crate) span: Option<LiveSpan>,
}

impl Dispatch {
    /// Starts an attempt: the pool picks an endpoint for `request` among those not `refused`
    /// (and records the dispatch), and the attempt is tracked from now. Every attempt starts
    /// here: the proxy's first attempts, retries and hedges, continuations, their staged
    /// heads, re-homing's warm-ups and the endpoint picker's picks.
    pub(crate) fn pick(
        shared: &Arc<Shared>,
        request: &Request,
        refused: &[EndpointId],
        attempt: Attempt,
        stream: bool,
    ) -> Result<Self, Rejection> {
        let target = shared.pool.pick(request, refused, attempt)?;
        Ok(Dispatch::new(shared.clone(), request.id, target, stream))
    }

    /// [`Dispatch::pick`] for a request's first attempt, through the LoRA gate: `Err` when the
    /// gate holds it ([`crate::pool::Pool::hold`], then pick again).
    pub(crate) fn pick_gated(
        shared: &Arc<Shared>,
        request: &Request,
        refused: &[EndpointId],
        stream: bool,
    ) -> Result<Result<Self, Held>, Rejection> {
        Ok(match shared.pool.pick_gated(request, refused)? {
            Placed::Go(target) => Ok(Dispatch::new(shared.clone(), request.id, *target, stream)),
            Placed::Held(held) => Err(held),
        })
    }

    /// Starts tracking an attempt that the pool already recorded as dispatched.
    fn new(shared: Arc<Shared>, request: u64, target: Target, stream: bool) -> Self {
        let sent = shared.pool.clock().now();
        Dispatch {
            shared,
            request,
            target,
            stream,
            sent,
            first: None,
            done: false,
            span: None,
        }
    }

    /// Restarts the attempt's clock: a decode leg sent after its prefill leg measures its time
    /// to first token from its own send, not the prefill's.
    pub(crate) fn restart_clock(&mut self) {
        self.sent = self.shared.pool.clock().now();
    }

    /// Whether the client asked for a stream.
    pub(crate) fn stream(&self) -> bool {
        self.stream
    }

    /// The first bytes of a 2xx answer arrived.
    pub(crate) fn first_token(&mut self) {
        let now = self.shared.pool.clock().now();
        self.first = Some(now);
        if self.stream {
            self.target.cadence.tick(now);
            let measured = (now - self.sent).as_secs_f64();
            if let Some(span) = &mut self.span {
                span.set_attribute(KeyValue::new("gen_ai.server.time_to_first_token", measured));
            }
            self.shared.ttft_series.record(measured * 1e3);
            if let Some(predicted) = self.target.predicted_ttft.filter(|&p| p > 0.0) {
                self.shared
                    .metrics
                    .requests
                    .ttft_prediction_ratio
                    .observe(measured / predicted);
            }
        }
        // A non-streaming response's first bytes are its end: not a first token (see
        // `Pool::first_token`).
        self.shared.pool.first_token(
            self.request,
            self.target.id,
            self.target.ticket,
            now - self.sent,
            self.stream,
        );
    }

    /// More of the stream arrived: the engine finished an iteration. The pieces of a
    /// non-streaming answer say nothing of iterations.
    pub(crate) fn tokens(&self) {
        if self.stream {
            self.target.cadence.tick(self.shared.pool.clock().now());
        }
    }

    /// The endpoint failed a connection or broke a stream: its cache may be gone, and if it no
    /// longer answers, the sessions it served are warmed elsewhere (`crate::relay::rehome`).
    pub(crate) fn suspect(&self) {
        self.shared.watch.losses.suspect(self.target.id);
    }

    /// The endpoint answered with a non-2xx status that is passed to the client as it is
    /// (see [`crate::pool::Pool::refused`]).
    pub(crate) fn refused(&self, status: u16) {
        self.shared
            .pool
            .refused(self.target.id, self.target.ticket, status);
    }

    /// The answer ended normally with `output_tokens` tokens (`0` when unknown) and the
    /// engine's `usage`, if it sent one.
    pub(crate) fn complete(mut self, output_tokens: u32, usage: Option<Usage>) {
        self.done = true;
        self.shared.rehome.ended(self.request, self.target.id);
        let now = self.shared.pool.clock().now();
        let e2e = now - self.sent;
        self.shared.pool.completed(
            self.request,
            self.target.id,
            e2e,
            output_tokens,
            (usage, self.target.prediction),
        );
        if let Some(mut span) = self.span.take() {
            let mut attrs = vec![KeyValue::new(
                "gen_ai.usage.output_tokens",
                i64::from(output_tokens),
            )];
            if let Some(u) = usage {
                attrs.push(KeyValue::new(
                    "gen_ai.usage.input_tokens",
                    i64::from(u.prompt_tokens),
                ));
                if let Some(c) = u.cached_tokens {
                    attrs.push(KeyValue::new("kvgate.usage.cached_tokens", i64::from(c)));
                }
            }
            if let (true, Some(first), true) = (self.stream, self.first, output_tokens > 1) {
                let tpot = (now - first).as_secs_f64() / f64::from(output_tokens - 1);
                attrs.push(KeyValue::new("gen_ai.server.time_per_output_token", tpot));
            }
            span.set_attributes(attrs);
            span.end();
        }
        let m = &self.shared.metrics;
        let label = PolicyLabel {
            policy: self.shared.pool.policy_name(),
        };
        m.requests
            .e2e
            .get_or_create(&label)
            .observe(e2e.as_secs_f64());
        let endpoint = EndpointLabel {
            endpoint: self.target.name.to_string(),
        };
        m.usage
            .output_tokens
            .get_or_create(&endpoint)
            .inc_by(u64::from(output_tokens));
        if let Some(u) = usage {
            let prompt = u64::from(u.prompt_tokens);
            m.usage
                .prompt_tokens
                .get_or_create(&endpoint)
                .inc_by(prompt);
            if let Some(cached) = u.cached_tokens {
                m.usage
                    .cached_tokens
                    .get_or_create(&endpoint)
                    .inc_by(u64::from(cached));
                m.usage
                    .cache_checked_tokens
                    .get_or_create(&endpoint)
                    .inc_by(prompt);
            }
        }
        if let (true, Some(first)) = (self.stream, self.first) {
            m.requests
                .ttft
                .get_or_create(&label)
                .observe((first - self.sent).as_secs_f64());
            if output_tokens > 1 {
                let tpot = (now - first).as_secs_f64() / f64::from(output_tokens - 1);
                m.requests.tpot.get_or_create(&label).observe(tpot);
            }
        }
    }

    /// The attempt failed.
    pub(crate) fn fail(mut self, kind: FailureKind, retry_after: Option<Duration>) {
        self.done = true;
        if kind == FailureKind::Connect {
            self.suspect();
        }
        self.end_failed(kind);
        self.shared.pool.failed(
            self.request,
            self.target.id,
            self.target.ticket,
            kind,
            retry_after,
        );
    }
}

impl Dispatch {
    fn end_failed(&mut self, kind: FailureKind) {
        if let Some(mut span) = self.span.take() {
            otel::fail(&mut span, kind.label());
            span.end();
        }
    }
}

impl Drop for Dispatch {
    fn drop(&mut self) {
        if !self.done {
            self.end_failed(FailureKind::Cancelled);
            self.shared.pool.failed(
                self.request,
                self.target.id,
                self.target.ticket,
                FailureKind::Cancelled,
                None,
            );
        }
    }
}
