//! The pool: every endpoint's state, the policy, the in-flight ledger, the retry budget and the
//! hedging delay, behind one lock (STYLE.md "One owner, `&mut self`"). Every method holds the lock
//! for a few microseconds and never across an `.await`.
//!
//! Health filtering lives here, outside the policy: an endpoint is offered to the policy as
//! routable only if it is not draining, passes its health checks, is not inside a Retry-After
//! window, its breaker admits traffic, it serves the requested model, and it was not already
//! tried for this request.

use crate::config::EndpointConfig;
use crate::metrics::{self, Metrics, PickLabels};
use axum::http::HeaderValue;
use kvgate_core::decision::FailureKind;
use kvgate_core::resilience::{Backoff, Breaker, BreakerConfig, HedgeDelay, RetryBudget, Ticket};
use kvgate_core::{
    Decision, EndpointId, EndpointView, Event, Health, InflightLedger, Nanos, Observation, Policy,
    PolicyConfig, Rejection, Request,
};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub use crate::clock::Clock;

/// Where the policy sent a request.
#[derive(Clone, Debug)]
pub struct Target {
    /// The endpoint.
    pub id: EndpointId,
    /// Its display name.
    pub name: Arc<str>,
    /// Its base URL.
    pub base: Arc<str>,
    /// [`kvgate_core::Reason::label`] of the pick.
    pub reason: &'static str,
    /// The endpoint's own `Authorization` value, if it has an API key.
    pub authorization: Option<HeaderValue>,
    /// The breaker's permission for this dispatch (a half-open probe or not), handed back
    /// with its outcome.
    pub ticket: Ticket,
}

/// One endpoint as the admin API reports it.
#[derive(Clone, Debug, Serialize)]
pub struct EndpointStatus {
    /// Identity.
    pub id: EndpointId,
    /// Display name.
    pub name: String,
    /// Base URL.
    pub url: String,
    /// Models it serves (configured or discovered).
    pub models: Vec<String>,
    /// Weight.
    pub weight: f64,
    /// Labels.
    pub labels: std::collections::BTreeMap<String, String>,
    /// `healthy`, `draining` or `unhealthy` as the policy currently sees it.
    pub health: Health,
    /// Breaker state.
    pub breaker: kvgate_core::resilience::BreakerState,
    /// Last scrape.
    pub observation: Option<Observation>,
    /// Requests this gateway has in flight there.
    pub inflight: u32,
}

fn authorization(config: &EndpointConfig) -> Option<HeaderValue> {
    let key = config.api_key.as_deref()?;
    let mut value = HeaderValue::from_str(&format!("Bearer {key}")).ok()?;
    value.set_sensitive(true);
    Some(value)
}

#[derive(Debug)]
struct Endpoint {
    id: EndpointId,
    name: Arc<str>,
    base: Arc<str>,
    config: EndpointConfig,
    models: Vec<String>,
    draining: bool,
    healthy: bool,
    reports_down: bool,
    authorization: Option<HeaderValue>,
    scrape_failures: u32,
    served_since_scrape: bool,
    avoid_until: Nanos,
    breaker: Breaker,
    observation: Option<Observation>,
    observed_at: Nanos,
    joined_at: Nanos,
}

impl Endpoint {
    fn serves(&self, model: Option<&str>) -> bool {
        match model {
            Some(m) => self.models.is_empty() || self.models.iter().any(|x| x == m),
            None => true,
        }
    }

    /// Not draining, answering its health checks and not reporting itself down: what
    /// readiness looks at, whatever Retry-After window or open breaker keeps it out for now.
    fn passes_health_checks(&self) -> bool {
        !self.draining && self.healthy && !self.reports_down
    }

    /// When an endpoint that passes its health checks but is kept out by a Retry-After window
    /// or an open breaker takes traffic again; `None` when it is routable now or when nothing
    /// but a health check can bring it back.
    fn routable_again_at(&self, now: Nanos) -> Option<Nanos> {
        if !self.passes_health_checks() {
            return None;
        }
        let avoid = (now < self.avoid_until).then_some(self.avoid_until);
        match (avoid, self.breaker.open_until(now)) {
            (None, None) => None,
            (a, b) => a.max(b),
        }
    }

    fn health(&self, now: Nanos) -> Health {
        if self.draining {
            Health::Draining
        } else if !self.healthy
            || self.reports_down
            || now < self.avoid_until
            || !self.breaker.is_available(now)
        {
            Health::Unhealthy
        } else {
            Health::Healthy
        }
    }
}

#[derive(Debug)]
struct State {
    policy: Box<dyn Policy>,
    policy_name: &'static str,
    ledger: InflightLedger,
    rng: ChaCha8Rng,
    endpoints: Vec<Endpoint>,
    next_id: u32,
    budget: RetryBudget,
    hedge: HedgeDelay,
    breaker: BreakerConfig,
    fleet: Vec<EndpointView>,
}

/// The pool (see the module docs).
#[derive(Debug)]
pub struct Pool {
    state: Mutex<State>,
    clock: Clock,
    metrics: Arc<Metrics>,
}

impl Pool {
    /// A pool with no endpoints.
    pub fn new(
        policy: &PolicyConfig,
        config: &crate::Config,
        clock: Clock,
        metrics: Arc<Metrics>,
        seed: u64,
    ) -> Self {
        Pool {
            state: Mutex::new(State {
                policy: policy.build(),
                policy_name: policy.name(),
                ledger: InflightLedger::new(),
                rng: ChaCha8Rng::seed_from_u64(seed),
                endpoints: Vec::new(),
                next_id: 0,
                budget: RetryBudget::new(config.retry.budget.clone()),
                hedge: HedgeDelay::new(config.hedge.clone()),
                breaker: config.breaker.clone(),
                fleet: Vec::new(),
            }),
            clock,
            metrics,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind; keep serving.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The clock.
    pub fn clock(&self) -> Clock {
        self.clock
    }

    /// The policy's name.
    pub fn policy_name(&self) -> &'static str {
        self.lock().policy_name
    }

    /// Replaces the policy (its learned state starts over).
    pub fn set_policy(&self, policy: &PolicyConfig) {
        let mut s = self.lock();
        s.policy = policy.build();
        s.policy_name = policy.name();
    }

    /// Adds an endpoint; it joins now (blackout and slow start count from here).
    pub fn add(&self, config: EndpointConfig) -> EndpointId {
        let now = self.clock.now();
        let mut s = self.lock();
        let id = EndpointId(s.next_id);
        s.next_id += 1;
        let name: Arc<str> = config.display_name().into();
        self.metrics
            .breaker
            .get_or_create(&metrics::endpoint(&name))
            .set(0);
        self.metrics
            .endpoint_up
            .get_or_create(&metrics::endpoint(&name))
            .set(1);
        let endpoint = Endpoint {
            id,
            authorization: authorization(&config),
            base: config.base_url().into(),
            models: config.model.iter().cloned().collect(),
            name,
            config,
            draining: false,
            healthy: true,
            reports_down: false,
            scrape_failures: 0,
            served_since_scrape: false,
            avoid_until: Nanos::ZERO,
            breaker: Breaker::new(s.breaker.clone()),
            observation: None,
            observed_at: Nanos::ZERO,
            joined_at: now,
        };
        s.endpoints.push(endpoint);
        id
    }

    /// Removes an endpoint at once; requests already sent there run to completion.
    pub fn remove(&self, id: EndpointId) -> bool {
        let mut s = self.lock();
        let Some(i) = s.endpoints.iter().position(|e| e.id == id) else {
            return false;
        };
        let gone = s.endpoints.remove(i);
        s.ledger.remove(id);
        s.policy.observe(&Event::EndpointRemoved { endpoint: id });
        let label = metrics::endpoint(&gone.name);
        self.metrics.endpoint_up.remove(&label);
        self.metrics.breaker.remove(&label);
        true
    }

    /// Stops (or resumes) sending new requests to an endpoint.
    pub fn set_draining(&self, id: EndpointId, draining: bool) -> bool {
        let mut s = self.lock();
        match s.endpoints.iter_mut().find(|e| e.id == id) {
            Some(e) => {
                e.draining = draining;
                true
            }
            None => false,
        }
    }

    /// Updates weight, labels and configured model of an endpoint in place.
    pub fn update(&self, id: EndpointId, config: EndpointConfig) {
        let mut s = self.lock();
        if let Some(e) = s.endpoints.iter_mut().find(|e| e.id == id) {
            if let Some(m) = &config.model {
                e.models = vec![m.clone()];
            }
            e.authorization = authorization(&config);
            e.config = config;
        }
    }

    /// Ids and configs of every endpoint.
    pub fn configs(&self) -> Vec<(EndpointId, EndpointConfig)> {
        self.lock()
            .endpoints
            .iter()
            .map(|e| (e.id, e.config.clone()))
            .collect()
    }

    /// The base URL of an endpoint still in the pool.
    pub fn base_of(&self, id: EndpointId) -> Option<Arc<str>> {
        self.lock()
            .endpoints
            .iter()
            .find(|e| e.id == id)
            .map(|e| e.base.clone())
    }

    /// Chooses an endpoint for `request` among those not in `exclude`, and records the dispatch
    /// (ledger, breaker probe, [`Event::Dispatched`]) in the same critical section.
    pub fn pick(&self, request: &Request, exclude: &[EndpointId]) -> Result<Target, Rejection> {
        let now = self.clock.now();
        let mut guard = self.lock();
        let s = &mut *guard;
        let model = request.model.as_deref();
        s.fleet.clear();
        for e in &s.endpoints {
            let mut view = EndpointView::new(e.id);
            view.weight = e.config.weight;
            view.health = if exclude.contains(&e.id) || !e.serves(model) {
                Health::Unhealthy
            } else {
                e.health(now)
            };
            view.observation = e.observation;
            view.observed_at = e.observed_at;
            view.joined_at = e.joined_at;
            s.ledger.annotate(&mut view);
            s.fleet.push(view);
        }
        let started = Instant::now();
        let decision = s.policy.select(request, &s.fleet, now, &mut s.rng);
        self.metrics
            .decision
            .observe(started.elapsed().as_secs_f64());
        let route = match decision {
            Decision::Route(route) => route,
            Decision::Reject(r) => return Err(r),
        };
        let Some(e) = s.endpoints.iter_mut().find(|e| e.id == route.endpoint) else {
            return Err(Rejection::NoRoutableEndpoint);
        };
        // The health filter above let only endpoints whose breaker admits traffic through; a
        // policy routing elsewhere all the same gets an ordinary ticket.
        let ticket = e.breaker.acquire(now).unwrap_or_default();
        let target = Target {
            ticket,
            id: e.id,
            name: e.name.clone(),
            base: e.base.clone(),
            reason: route.reason.label(),
            authorization: e.authorization.clone(),
        };
        s.ledger.dispatched(target.id, request.id, now);
        s.policy.observe(&Event::Dispatched {
            request,
            endpoint: target.id,
            at: now,
        });
        self.metrics
            .picks
            .get_or_create(&PickLabels {
                policy: s.policy_name,
                reason: target.reason,
            })
            .inc();
        Ok(target)
    }

    /// Records an original request for the retry budget.
    pub fn request_started(&self) {
        let now = self.clock.now();
        self.lock().budget.request(now);
    }

    /// Withdraws a retry from the budget; returns when it was withdrawn (for
    /// [`Self::refund_retry`]), or `None` when the budget is spent.
    pub fn try_retry(&self) -> Option<Nanos> {
        let now = self.clock.now();
        self.lock().budget.try_retry(now).then_some(now)
    }

    /// Gives back a retry withdrawn at `withdrawn_at` that was never sent.
    pub fn refund_retry(&self, withdrawn_at: Nanos) {
        self.lock().budget.refund(withdrawn_at);
    }

    /// The wait before retry `attempt` (0-based), drawn from the pool's random source.
    pub fn backoff(&self, backoff: &Backoff, attempt: u32) -> Duration {
        let delay = backoff.delay(attempt, &mut self.lock().rng);
        Duration::from_nanos(delay.0)
    }

    /// A uniformly random duration in `[0, max)`, for phases.
    pub fn jitter(&self, max: Duration) -> Duration {
        use rand::Rng;
        let max = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX).max(1);
        Duration::from_nanos(self.lock().rng.random_range(0..max))
    }

    /// The current hedging delay, if hedging is on.
    pub fn hedge_delay(&self) -> Option<Duration> {
        self.lock().hedge.delay().map(|n| Duration::from_nanos(n.0))
    }

    /// The first bytes of a 2xx answer to `request` arrived from `endpoint` after `ttft`.
    ///
    /// Only a stream's first bytes are a first token: a non-streaming answer's first bytes come
    /// when generation ends, so its `ttft` is the end-to-end time, and a policy learning from it
    /// (peak EWMA) would learn output lengths rather than endpoint speed. For those the policy
    /// hears only `Completed`/`Failed`, and the hedging delay gets no sample; both kinds count
    /// as a breaker success and as proof of life.
    pub fn first_token(
        &self,
        request: u64,
        endpoint: EndpointId,
        ticket: Ticket,
        ttft: Nanos,
        stream: bool,
    ) {
        let now = self.clock.now();
        let mut s = self.lock();
        if let Some(e) = s.endpoints.iter_mut().find(|e| e.id == endpoint) {
            // Answering traffic is proof of life (passive health checking).
            e.served_since_scrape = true;
            e.healthy = true;
            e.scrape_failures = 0;
            e.breaker.record(ticket, true, now);
            self.metrics
                .breaker
                .get_or_create(&metrics::endpoint(&e.name))
                .set(e.breaker.state(now).as_gauge());
        }
        if stream {
            s.hedge.record(ttft);
            s.policy.observe(&Event::FirstToken {
                request,
                endpoint,
                at: now,
                ttft,
            });
        }
    }

    /// `endpoint` answered with a status other than 2xx, 5xx or 429 (those are attempt
    /// failures): the answer goes to the client as it is, but it is neither a first token nor
    /// proof of life. 401, 403, 404 and 408 say the endpoint cannot serve (a wrong key, a model
    /// or route it lacks, a request it gave up on) and count as breaker failures, as LiteLLM
    /// cools such deployments down; any other status (400, 413, 422) is the client's own fault
    /// and only frees a half-open probe slot.
    pub fn refused(&self, endpoint: EndpointId, ticket: Ticket, status: u16) {
        let now = self.clock.now();
        let mut s = self.lock();
        if let Some(e) = s.endpoints.iter_mut().find(|e| e.id == endpoint) {
            if matches!(status, 401 | 403 | 404 | 408) {
                e.breaker.record(ticket, false, now);
            } else {
                e.breaker.release(ticket);
            }
            self.metrics
                .breaker
                .get_or_create(&metrics::endpoint(&e.name))
                .set(e.breaker.state(now).as_gauge());
        }
    }

    /// `request` finished normally on `endpoint`.
    pub fn completed(
        &self,
        request: u64,
        endpoint: EndpointId,
        latency: Nanos,
        output_tokens: u32,
    ) {
        let now = self.clock.now();
        let mut s = self.lock();
        s.ledger.finished(endpoint, request);
        s.policy.observe(&Event::Completed {
            request,
            endpoint,
            at: now,
            latency,
            output_tokens,
        });
    }

    /// `request` failed on `endpoint`. Connection errors, 5xx and timeouts count against the
    /// breaker; a Retry-After keeps the endpoint out of routing for its duration.
    pub fn failed(
        &self,
        request: u64,
        endpoint: EndpointId,
        ticket: Ticket,
        kind: FailureKind,
        retry_after: Option<Duration>,
    ) {
        let now = self.clock.now();
        let mut s = self.lock();
        s.ledger.finished(endpoint, request);
        if let Some(e) = s.endpoints.iter_mut().find(|e| e.id == endpoint) {
            if let Some(wait) = retry_after {
                let until = now + Nanos(u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX));
                e.avoid_until = e.avoid_until.max(until);
            }
            if matches!(kind, FailureKind::Cancelled | FailureKind::Overloaded) {
                e.breaker.release(ticket);
            } else {
                e.breaker.record(ticket, false, now);
            }
            self.metrics
                .breaker
                .get_or_create(&metrics::endpoint(&e.name))
                .set(e.breaker.state(now).as_gauge());
        }
        s.policy.observe(&Event::Failed {
            request,
            endpoint,
            at: now,
            kind,
        });
    }

    /// A scrape of `endpoint` sent at `sent_at` returned `observation` (`None` when the engine
    /// answered without metrics kvgate reads). The endpoint is healthy again.
    pub fn observed(&self, endpoint: EndpointId, observation: Option<Observation>, sent_at: Nanos) {
        let mut s = self.lock();
        let State {
            endpoints, ledger, ..
        } = &mut *s;
        if let Some(e) = endpoints.iter_mut().find(|e| e.id == endpoint) {
            e.healthy = true;
            e.scrape_failures = 0;
            e.served_since_scrape = false;
            if let Some(obs) = observation {
                e.observation = Some(obs);
                e.observed_at = sent_at;
                ledger.observed(endpoint, sent_at);
            }
        }
    }

    /// A scrape of `endpoint` failed; after `threshold` in a row it is unhealthy. A failed scrape
    /// does not count while the endpoint answered requests since the previous scrape: an engine
    /// too busy to answer `/metrics` in time is not a dead engine, and taking the last endpoint
    /// out of a pool for it would turn load into errors.
    pub fn scrape_failed(&self, endpoint: EndpointId, threshold: u32) {
        let mut s = self.lock();
        if let Some(e) = s.endpoints.iter_mut().find(|e| e.id == endpoint) {
            if std::mem::take(&mut e.served_since_scrape) {
                return;
            }
            e.scrape_failures += 1;
            if e.scrape_failures >= threshold {
                e.healthy = false;
            }
        }
    }

    /// Records what the engine's own `/health` said: a 5xx (for example an engine draining for
    /// shutdown) keeps it out of routing until `/health` is fine again, whatever traffic it
    /// still answers.
    pub fn reported_health(&self, endpoint: EndpointId, up: bool) {
        let mut s = self.lock();
        if let Some(e) = s.endpoints.iter_mut().find(|e| e.id == endpoint) {
            e.reports_down = !up;
        }
    }

    /// The display name of an endpoint still in the pool.
    pub fn name_of(&self, id: EndpointId) -> Option<Arc<str>> {
        self.lock()
            .endpoints
            .iter()
            .find(|e| e.id == id)
            .map(|e| e.name.clone())
    }

    /// Whether `endpoint` still lacks a model name.
    pub fn needs_models(&self, endpoint: EndpointId) -> bool {
        self.lock()
            .endpoints
            .iter()
            .any(|e| e.id == endpoint && e.models.is_empty())
    }

    /// Records the models an endpoint reported.
    pub fn set_models(&self, endpoint: EndpointId, models: Vec<String>) {
        let mut s = self.lock();
        if let Some(e) = s.endpoints.iter_mut().find(|e| e.id == endpoint) {
            if e.config.model.is_none() {
                e.models = models;
            }
        }
    }

    /// Whether some endpoint serves `model` (endpoints of unknown model serve anything).
    pub fn serves(&self, model: &str) -> bool {
        self.lock().endpoints.iter().any(|e| e.serves(Some(model)))
    }

    /// The models of the pool, sorted and deduplicated.
    pub fn models(&self) -> Vec<String> {
        let s = self.lock();
        let mut models: Vec<String> = s
            .endpoints
            .iter()
            .flat_map(|e| e.models.iter().cloned())
            .collect();
        models.sort();
        models.dedup();
        models
    }

    /// Whether at least one endpoint passes its health checks (readiness). A Retry-After
    /// window or an open breaker does not count: they are short, and every gateway replica sees
    /// them at once, so a readiness probe following them would take all replicas out of a
    /// Kubernetes Service together.
    pub fn any_healthy(&self) -> bool {
        self.lock()
            .endpoints
            .iter()
            .any(Endpoint::passes_health_checks)
    }

    /// How long until an endpoint serving `model`, now kept out only by a Retry-After window or
    /// an open breaker, takes traffic again: the `Retry-After` of a 503 when nothing is
    /// routable. `None` when no such endpoint exists.
    pub fn routable_again_in(&self, model: Option<&str>) -> Option<Duration> {
        let now = self.clock.now();
        self.lock()
            .endpoints
            .iter()
            .filter(|e| e.serves(model))
            .filter_map(|e| e.routable_again_at(now))
            .min()
            .map(|at| Duration::from_nanos(at.0.saturating_sub(now.0)))
    }

    /// Every endpoint's status; also refreshes the per-endpoint gauges.
    pub fn status(&self) -> Vec<EndpointStatus> {
        let now = self.clock.now();
        let s = self.lock();
        s.endpoints
            .iter()
            .map(|e| {
                let health = e.health(now);
                let inflight = s.ledger.inflight(e.id);
                let label = metrics::endpoint(&e.name);
                self.metrics
                    .endpoint_up
                    .get_or_create(&label)
                    .set(i64::from(health == Health::Healthy));
                self.metrics
                    .breaker
                    .get_or_create(&label)
                    .set(e.breaker.state(now).as_gauge());
                self.metrics
                    .inflight
                    .get_or_create(&label)
                    .set(i64::from(inflight));
                EndpointStatus {
                    id: e.id,
                    name: e.name.to_string(),
                    url: e.base.to_string(),
                    models: e.models.clone(),
                    weight: e.config.weight,
                    labels: e.config.labels.clone(),
                    health,
                    breaker: e.breaker.state(now),
                    observation: e.observation,
                    inflight,
                }
            })
            .collect()
    }

    /// Periodic upkeep: the policy's own (prefix-tree eviction).
    pub fn maintain(&self) {
        let now = self.clock.now();
        self.lock().policy.maintain(now);
    }
}

#[cfg(test)]
#[path = "pool_tests.rs"]
mod tests;
