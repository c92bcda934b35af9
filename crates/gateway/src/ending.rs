//! How a request ended, recorded once: an [`Ending`] travels with the request from the moment
//! it arrives (through admission, attempts and the response body) and, when it is dropped,
//! writes `kvgate_requests_total{outcome, policy, endpoint}` and the request's access-log line.
//! A request whose future or body is dropped before anyone set an outcome (the client went
//! away) ends as `cancelled`.

use crate::observe::access_log::AccessRecord;
use crate::observe::decisions::DecisionRecord;
use crate::observe::otel::{self, LiveSpan};
use crate::parse::Api;
use crate::pool::Target;
use crate::state::Shared;
use axum::http::{HeaderMap, HeaderValue};
use kvgate_core::resilience::Outcome;
use kvgate_core::{Request, Usage};
use opentelemetry::trace::{Span as _, SpanContext};
use opentelemetry::KeyValue;
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
    /// Continuations of a broken stream that took over (`crate::resume`).
    pub(crate) resumes: u32,
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
    /// What the prefix cache predicted the answering endpoint held of the prompt.
    pub(crate) prediction: Option<kvgate_core::index::Prediction>,
    /// The answering deployment's token price (its own, else the model's in `tenancy.prices`).
    pub(crate) price: Option<kvgate_core::tenancy::Price>,
    /// How the semantic cache took part, when it is on.
    pub(crate) cache: Option<&'static str>,
    /// A routed name's tier and why (`crate::cascade`).
    pub(crate) route: Option<Arc<str>>,
    /// Prefill/decode disaggregation's outcome (`local`, `remote`, `fallback`, `rejected`).
    pub(crate) disagg: Option<&'static str>,
    /// The reason of its decision.
    pub(crate) disagg_why: Option<&'static str>,
    /// The endpoint that prefilled, when not the one that answered.
    pub(crate) prefill_endpoint: Option<Arc<str>>,
    /// The prefill leg's time.
    pub(crate) prefill_ms: Option<f64>,
    /// The tokens the decision expected the prefill endpoint to compute.
    pub(crate) prefill_uncached_tokens: Option<u32>,
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
    span: Option<LiveSpan>,
    armed: bool,
    /// The request's standing with its tenant, settled when the request ends.
    lease: Option<crate::tenancy::Lease>,
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
            span: None,
            armed: true,
            lease: None,
        }
    }

    /// Starts the request's trace span when traces are on, under the client's `traceparent`.
    pub(crate) fn trace(&mut self, headers: &HeaderMap) {
        if let Some(t) = &self.shared.tracing {
            let arrived = SystemTime::now() - self.arrived.elapsed();
            self.span = Some(t.request_span(headers, arrived));
        }
    }

    /// The request span's context, the parent of its attempts' spans.
    pub(crate) fn span_context(&self) -> Option<SpanContext> {
        self.span.as_ref().map(|s| s.span_context().clone())
    }

    /// The gateway's shared state.
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
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

    /// The answer ended: an `ok` one with `usage` as the client saw it (`None` when the engine
    /// sent none) and `tokens` output tokens counted on the stream; one that was not ok (an
    /// error status passed through) ends as an upstream error, its body's "tokens" not output.
    pub(crate) fn answered(&mut self, ok: bool, usage: Option<Usage>, tokens: u32) {
        if ok {
            self.facts.usage = usage;
            self.facts.output_tokens = Some(usage.map_or(tokens, |u| u.output_tokens));
            self.outcome = Outcome::Ok;
        } else {
            self.outcome = Outcome::UpstreamError;
        }
    }

    /// How many attempts ran and what the answering one (`answered`; else the `last`
    /// decision) went by: its decision, the cache prediction and the price that cost it (its
    /// deployment's, else `model`'s in `tenancy.prices`).
    pub(crate) fn attempts(
        &mut self,
        count: usize,
        answered: Option<&Target>,
        last: Option<Arc<DecisionRecord>>,
        model: Option<&str>,
    ) {
        let price = answered
            .and_then(|t| t.price)
            .or_else(|| self.shared.tenancy.price(model));
        let facts = &mut self.facts;
        facts.attempts = u32::try_from(count).unwrap_or(u32::MAX);
        facts.decision = answered.map(|t| t.decision.clone()).or(last);
        facts.prediction = answered.and_then(|t| t.prediction);
        facts.price = price;
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
        if let Some(span) = &mut self.span {
            span.update_name(otel::span_name(api, request.model.as_deref()));
            span.set_attribute(KeyValue::new("gen_ai.operation.name", otel::operation(api)));
            if let Some(m) = &request.model {
                span.set_attribute(KeyValue::new("gen_ai.request.model", m.clone()));
            }
            if let Some(s) = &request.session {
                span.set_attribute(KeyValue::new("gen_ai.conversation.id", s.clone()));
            }
        } else if !self.shared.access_log.enabled() {
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
            span: self.span.take(),
            armed: true,
            lease: self.lease.take(),
        }
    }

    /// Takes the request's tenant lease, to settle when the request ends; the tenant may have
    /// changed (a key names it).
    pub(crate) fn lease(&mut self, lease: crate::tenancy::Lease) {
        if self.shared.access_log.enabled() {
            self.facts.tenant = Some(lease.tenant.clone()).filter(|t| !t.is_empty());
        }
        self.lease = Some(lease);
    }

    /// The request left the admission queue, which charged its prompt to its tenant.
    pub(crate) fn admitted(&mut self) {
        if let Some(lease) = &mut self.lease {
            lease.admitted = true;
        }
    }

    /// `events` output events have streamed so far: the fair queue charges them as they come (VTC
    /// charges output incrementally), in steps of 16 to keep the lock cold.
    pub(crate) fn streamed(&mut self, events: u32) {
        if let Some(lease) = &mut self.lease {
            let new = events.saturating_sub(lease.streamed);
            if new >= 16 {
                lease.streamed = events;
                let weight = self.shared.tenancy.output_weight();
                self.shared
                    .admission
                    .charge(&lease.tenant, f64::from(new) * weight);
            }
        }
    }

    /// Settles the lease: what the request used replaces what admission estimated.
    fn settle(&mut self) {
        let Some(lease) = self.lease.take() else {
            return;
        };
        let f = &self.facts;
        let actual = match (f.usage, self.outcome) {
            (Some(u), _) => kvgate_core::tenancy::Charge::from_usage(&u),
            (None, Outcome::Ok | Outcome::StreamError | Outcome::Cancelled) if f.attempts > 0 => {
                kvgate_core::tenancy::Charge {
                    input: f64::from(lease.prompt_tokens()),
                    cached_input: 0.0,
                    output: f64::from(f.output_tokens.unwrap_or(lease.streamed)),
                }
            }
            _ => kvgate_core::tenancy::Charge::default(),
        };
        let tenant = lease.tenant.clone();
        let now = self.shared.pool.clock().now();
        let price = f.price;
        let correction = self
            .shared
            .tenancy
            .settle(lease, &actual, price.as_ref(), now);
        self.shared.admission.charge(&tenant, correction);
    }

    /// Ends the request's span with what is known of the request.
    fn end_span(&mut self, mut span: LiveSpan) {
        let f = &self.facts;
        let mut attrs = vec![
            KeyValue::new("kvgate.request_id", self.id as i64),
            KeyValue::new("kvgate.outcome", self.outcome.label()),
            KeyValue::new("kvgate.attempts", i64::from(f.attempts)),
        ];
        if let Some(s) = f.status {
            attrs.push(KeyValue::new("http.response.status_code", i64::from(s)));
        }
        if let Some(e) = &self.endpoint {
            attrs.push(KeyValue::new("kvgate.endpoint", e.to_string()));
        }
        if let Some(d) = &f.decision {
            attrs.push(KeyValue::new("kvgate.reason", d.reason.label()));
        }
        if let Some(u) = f.usage {
            attrs.push(KeyValue::new(
                "gen_ai.usage.input_tokens",
                i64::from(u.prompt_tokens),
            ));
            if let Some(c) = u.cached_tokens {
                attrs.push(KeyValue::new("kvgate.usage.cached_tokens", i64::from(c)));
            }
        }
        if let Some(n) = f.usage.map(|u| u.output_tokens).or(f.output_tokens) {
            attrs.push(KeyValue::new("gen_ai.usage.output_tokens", i64::from(n)));
        }
        let ttft = f
            .first_token
            .filter(|_| f.stream == Some(true))
            .map(|t| t - self.arrived);
        if let Some(ttft) = ttft {
            attrs.push(KeyValue::new(
                "gen_ai.server.time_to_first_token",
                ttft.as_secs_f64(),
            ));
        }
        if let Some(tpot) = ttft.and_then(|t| self.tpot_ms(t)) {
            attrs.push(KeyValue::new(
                "gen_ai.server.time_per_output_token",
                tpot / 1e3,
            ));
        }
        span.set_attributes(attrs);
        if self.outcome != Outcome::Ok {
            otel::fail(&mut span, self.outcome.label());
        }
        span.end();
    }

    /// Time per output token after the first, for a stream that ended well with two tokens or
    /// more.
    /// The request's cost from the engine's usage at the deployment's price (cached prompt
    /// tokens at the cached price); counted per endpoint in `kvgate_cost_usd_total`.
    fn cost_usd(&self) -> Option<f64> {
        let f = &self.facts;
        let cost = f
            .price?
            .cost(&kvgate_core::tenancy::Charge::from_usage(&f.usage?));
        if let Some(endpoint) = &self.endpoint {
            self.shared
                .metrics
                .usage
                .cost_usd
                .get_or_create(&crate::metrics::endpoint(endpoint))
                .inc_by(cost);
        }
        Some(cost)
    }

    fn tpot_ms(&self, ttft: Duration) -> Option<f64> {
        let f = &self.facts;
        let n = f.usage.map(|u| u.output_tokens).or(f.output_tokens)?;
        (n > 1 && self.outcome == Outcome::Ok)
            .then(|| (self.arrived.elapsed() - ttft).as_secs_f64() * 1e3 / f64::from(n - 1))
    }

    fn log(&self, cost_usd: Option<f64>) {
        let f = &self.facts;
        let now = Instant::now();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let output = f.usage.map(|u| u.output_tokens).or(f.output_tokens);
        let ttft = f
            .first_token
            .filter(|_| f.stream == Some(true))
            .map(|t| t - self.arrived);
        let tpot = ttft.and_then(|t| self.tpot_ms(t));
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
            resumes: f.resumes,
            outcome: self.outcome.label(),
            status: f.status,
            queue_ms: f.queued.map(ms),
            ttft_ms: ttft.map(ms),
            tpot_ms: tpot,
            e2e_ms: ms(now - self.arrived),
            prompt_tokens: f.usage.map(|u| u.prompt_tokens),
            cached_tokens: f.usage.and_then(|u| u.cached_tokens),
            predicted_cached_tokens: f
                .prediction
                .zip(f.usage)
                .map(|(p, u)| self.shared.pool.reported_cached(&p, u.prompt_tokens)),
            cost_usd,
            output_tokens: output,
            reason: decision.map(|d| d.reason.label()),
            why: decision.map(|d| d.reason.to_string()),
            cache: f.cache,
            route: f.route.as_deref(),
            disagg: f.disagg,
            disagg_why: f.disagg_why,
            prefill_endpoint: f.prefill_endpoint.as_deref(),
            prefill_ms: f.prefill_ms,
            prefill_uncached_tokens: f.prefill_uncached_tokens,
        });
        if !written {
            self.shared.metrics.requests.access_log_dropped.inc();
        }
    }
}

impl Drop for Ending {
    fn drop(&mut self) {
        if self.armed {
            self.settle();
            self.shared.metrics.requests.request(
                self.outcome.label(),
                self.shared.pool.policy_name(),
                self.endpoint.as_deref().unwrap_or("none"),
            );
            let cost_usd = self.cost_usd();
            if self.shared.access_log.enabled() {
                self.log(cost_usd);
            }
            if let Some(span) = self.span.take() {
                self.end_span(span);
            }
        }
    }
}
