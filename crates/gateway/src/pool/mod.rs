//! The pool: every endpoint's state, the core [`Router`] (policy, ledger, random source), the
//! retry budget and the hedging delay behind one lock; the prefix cache behind its own
//! read-write lock; and a snapshot of the endpoints published lock-free for everything that only
//! reads (readiness, `/v1/models`, the admin API's status, gauges, metric labels).
//!
//! The lock is held for a pick and for event updates only, never across an `.await` and never
//! for index work: a prompt is looked up in the prefix cache (up to megabytes of text) under
//! the cache's read lock before the pick takes the pool's lock, and inserted under its write
//! lock after; periodic eviction also runs under the cache's lock. A streaming request takes the
//! pool's lock three times: to pick, at its first token, at its end.
//!
//! Eligibility lives here, outside the policy: a member is offered to the policy only if its
//! health checks pass (the router's view), no Retry-After window or open breaker holds it
//! back, it serves the requested model, and this request has not tried it yet.

mod cadence;
mod endpoint;
mod limits;
mod outcome;
mod peer;
mod snapshot;
mod target;
mod tiers;

pub use crate::clock::Clock;
pub use cadence::CadenceCell;
pub use peer::PeerEnd;
pub use snapshot::EndpointStatus;
use snapshot::Snapshot;
pub use target::{Attempt, Target};

use crate::config::EndpointConfig;
use crate::metrics::{self, Metrics, PickLabels};
use crate::observe::decisions::{DecisionRecord, DecisionRing, PickScene};
use arc_swap::ArcSwap;
use endpoint::{About, Endpoint, EndpointInfo};
use kvgate_core::index::{IndexSpec, Overlaps, PrefixCache, TreeKey};
use kvgate_core::policy::EndpointModel;
use kvgate_core::resilience::{Attempts, BreakerConfig, HedgeDelay, Next, RetryBudget};
use kvgate_core::{
    EndpointId, EndpointView, Nanos, Observation, PolicyConfig, Reason, Rejection, Request, Router,
};
use rand::RngCore;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

/// The prefix cache for `policy`: its own index, or, for a policy that consults none, one
/// mirroring the engines, so every request's cached tokens are predicted and scored
/// (`kvgate_cache_prediction_total`) whatever the policy.
///
/// Every cache also takes the engines' KV events, laid over its index for endpoints that
/// publish them (inert for those that do not).
fn cache_for(policy: &PolicyConfig, max_event_entries: usize) -> PrefixCache {
    let spec = policy.index().unwrap_or(IndexSpec::Radix {
        key: TreeKey::Auto,
        max_size: 67_108_864,
        eviction_interval: Nanos::from_secs(60),
        share_across_tenants: false,
        mirror_engines: true,
    });
    PrefixCache::new(&spec).with_engine_events(max_event_entries)
}

/// Everything under the pool's lock.
#[derive(Debug)]
struct Core {
    router: Router,
    /// Sorted by id, the same members as the router's views.
    endpoints: Vec<Endpoint>,
    next_id: u32,
    budget: RetryBudget,
    hedge: HedgeDelay,
    breaker: BreakerConfig,
    spillover: crate::endpoint_config::SpilloverConfig,
    pins: tiers::SessionPins,
}

impl Core {
    fn endpoint(&mut self, id: EndpointId) -> Option<&mut Endpoint> {
        let i = self
            .endpoints
            .binary_search_by_key(&id, |e| e.info.id)
            .ok()?;
        Some(&mut self.endpoints[i])
    }

    /// Copies the router's in-flight count of `id` into the published counter.
    fn sync_inflight(&mut self, id: EndpointId) {
        let inflight = self.router.view(id).map_or(0, |v| v.own_inflight);
        if let Some(e) = self.endpoint(id) {
            e.info.inflight.store(inflight, Ordering::Relaxed);
        }
    }

    /// Sets `id`'s health-check state through `edit`; tells the router when it changed.
    fn set_checks(&mut self, id: EndpointId, edit: impl FnOnce(&mut EndpointInfo)) -> bool {
        let Some(e) = self.endpoint(id) else {
            return false;
        };
        let before = e.info.checked_health();
        edit(&mut e.info);
        let after = e.info.checked_health();
        if before != after {
            self.router.set_health(id, after);
        }
        before != after
    }
}

/// The pool (see the module docs).
#[derive(Debug)]
pub struct Pool {
    core: Mutex<Core>,
    cache: RwLock<PrefixCache>,
    snapshot: ArcSwap<Snapshot>,
    clock: Clock,
    metrics: Arc<Metrics>,
    locks: AtomicU64,
    decisions: DecisionRing,
    /// What the policy learned of each endpoint at the last upkeep (policies that learn).
    learned: ArcSwap<Vec<(EndpointId, EndpointModel)>>,
    /// The KV-event index's bound per endpoint.
    max_event_entries: usize,
    /// Where what this replica learns goes to its peers, in a cluster.
    outbox: std::sync::OnceLock<crate::cluster::Outbox>,
}

impl Pool {
    /// A pool with no endpoints.
    pub fn new(config: &crate::Config, clock: Clock, metrics: Arc<Metrics>, seed: u64) -> Self {
        let core = Core {
            router: Router::new(&config.policy, seed),
            endpoints: Vec::new(),
            next_id: 0,
            budget: RetryBudget::new(config.retry.budget.clone()),
            hedge: HedgeDelay::new(config.hedge.clone()),
            breaker: config.breaker.clone(),
            spillover: config.spillover.clone(),
            pins: tiers::SessionPins::default(),
        };
        let pool = Pool {
            cache: RwLock::new(cache_for(
                &config.policy,
                config.kv_events.max_entries_per_endpoint,
            )),
            max_event_entries: config.kv_events.max_entries_per_endpoint,
            snapshot: ArcSwap::default(),
            core: Mutex::new(core),
            clock,
            metrics,
            locks: AtomicU64::new(0),
            decisions: DecisionRing::new(config.observability.decision_records),
            learned: ArcSwap::default(),
            outbox: Default::default(),
        };
        pool.publish(&pool.lock());
        pool
    }

    fn lock(&self) -> MutexGuard<'_, Core> {
        self.locks.fetch_add(1, Ordering::Relaxed);
        // A panic while holding the lock leaves plain data behind; keep serving.
        self.core.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many times the pool's lock was taken: the request path's contention, for tests and
    /// diagnostics.
    pub fn lock_acquisitions(&self) -> u64 {
        self.locks.load(Ordering::Relaxed)
    }

    fn publish(&self, core: &Core) {
        self.snapshot.store(Arc::new(Snapshot {
            policy: core.router.policy_name(),
            endpoints: core.endpoints.iter().map(|e| e.info.clone()).collect(),
        }));
    }

    /// The clock.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// The policy's name.
    pub fn policy_name(&self) -> &'static str {
        self.snapshot.load().policy
    }

    /// Replaces the policy (what it learned starts over) and the prefix cache it consults.
    pub fn set_policy(&self, policy: &PolicyConfig) {
        {
            let mut core = self.lock();
            core.router.set_policy(policy);
            self.publish(&core);
        }
        let mut cache = self.cache_mut();
        let mut fresh = cache_for(policy, self.max_event_entries);
        fresh.carry_engine_events(&mut cache);
        *cache = fresh;
    }

    /// Adds an endpoint; it joins now (blackout and slow start count from here).
    pub fn add(&self, config: EndpointConfig) -> EndpointId {
        let now = self.clock.now();
        let mut core = self.lock();
        let id = EndpointId(core.next_id);
        core.next_id += 1;
        let label = metrics::endpoint(&config.display_name());
        self.metrics.breaker.get_or_create(&label).set(0);
        self.metrics.endpoint_up.get_or_create(&label).set(1);
        core.router.add(EndpointView {
            weight: config.weight,
            joined_at: now,
            ..EndpointView::new(id)
        });
        let breaker = core.breaker.clone();
        core.endpoints.push(Endpoint::new(id, config, breaker, now));
        self.publish(&core);
        id
    }

    /// Removes an endpoint at once; requests already sent there run to completion.
    pub fn remove(&self, id: EndpointId) -> bool {
        {
            let mut core = self.lock();
            let Ok(i) = core.endpoints.binary_search_by_key(&id, |e| e.info.id) else {
                return false;
            };
            let gone = core.endpoints.remove(i);
            core.router.remove(id);
            self.publish(&core);
            let label = metrics::endpoint(&gone.info.about.name);
            self.metrics.endpoint_up.remove(&label);
            self.metrics.breaker.remove(&label);
            self.metrics.inflight.remove(&label);
        }
        self.cache_mut().remove_endpoint(id);
        true
    }

    /// Stops (or resumes) sending new requests to an endpoint.
    pub fn set_draining(&self, id: EndpointId, draining: bool) -> bool {
        let mut core = self.lock();
        if core.endpoint(id).is_none() {
            return false;
        }
        core.set_checks(id, |e| e.draining = draining);
        self.publish(&core);
        true
    }

    /// Applies a reloaded configuration to an endpoint (weight, model, labels, key).
    pub fn update(&self, id: EndpointId, config: EndpointConfig) {
        let now = self.clock.now();
        let mut core = self.lock();
        let weight = config.weight;
        if let Some(e) = core.endpoint(id) {
            // Changed limits start afresh (their windows and in-flight count included).
            if e.info.about.config.limits != config.limits {
                e.limits = config
                    .limits
                    .as_ref()
                    .map(|l| limits::DeploymentLimits::new(l, now));
            }
            let models = match &config.model {
                Some(m) => vec![m.clone()],
                None => e.info.about.models.clone(),
            };
            e.info.about = Arc::new(About::new(config, models));
        }
        core.router.set_weight(id, weight);
        self.publish(&core);
    }

    /// Replaces the spillover thresholds (a reloaded file).
    pub fn set_spillover(&self, spillover: crate::endpoint_config::SpilloverConfig) {
        self.lock().spillover = spillover;
    }

    /// The spillover thresholds in force.
    pub fn spillover(&self) -> crate::endpoint_config::SpilloverConfig {
        self.lock().spillover.clone()
    }

    /// What the prefix cache holds of `request`.
    fn lookup(&self, request: &Request, now: Nanos) -> Overlaps {
        self.cache
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .overlaps(request, now)
    }

    fn cache_mut(&self) -> std::sync::RwLockWriteGuard<'_, PrefixCache> {
        self.cache.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Chooses an endpoint for an attempt of `request` and records the dispatch (ledger,
    /// breaker ticket, [`kvgate_core::Event::Dispatched`]) in the same critical section; then,
    /// outside it, tells the prefix cache. Endpoints in `tried` are refused, except that a
    /// retry falls back to them when nothing else can take it.
    pub fn pick(
        &self,
        request: &Request,
        tried: &[EndpointId],
        attempt: Attempt,
    ) -> Result<Target, Rejection> {
        let now = self.clock.now();
        let overlaps = self.lookup(request, now);
        let target = {
            let mut guard = self.lock();
            let core = &mut *guard;
            if attempt == Attempt::First {
                core.budget.request(now);
            }
            let started = Instant::now();
            for e in &core.endpoints {
                core.router.set_cadence(e.info.id, e.info.cadence.get());
            }
            let model = request.model.as_deref();
            // Deployments at one of their own rate limits sit this request out.
            let charge = kvgate_core::tenancy::ChargeModel::default().estimate(request);
            let at_limit: Vec<EndpointId> = core
                .endpoints
                .iter_mut()
                .filter_map(|e| {
                    let admits = e.limits.as_mut()?.admits(now, &charge);
                    (!admits).then_some(e.info.id)
                })
                .collect();
            let endpoints = &core.endpoints;
            // Preference order: endpoints not tried and not cooling down after a failure, then
            // not tried, then (a retry with nothing else) any.
            let accept = |v: &EndpointView, fresh: bool, cool: bool| {
                endpoints
                    .binary_search_by_key(&v.id, |e| e.info.id)
                    .is_ok_and(|k| {
                        let e = &endpoints[k].info;
                        !e.held_back(now) && e.about.serves(model) && !(cool && now < e.cool_until)
                    })
                    && !(fresh && tried.contains(&v.id))
                    && !at_limit.contains(&v.id)
            };
            let overlaps = &overlaps;
            let passes: &[(bool, bool)] = match attempt {
                Attempt::Retry => &[(true, true), (true, false), (false, false)],
                _ => &[(true, true), (true, false)],
            };
            let pin_ttl = Nanos::from_secs(core.spillover.session_pin_secs);
            let session = request.session.as_deref();
            let placed = tiers::place(
                tiers::Scene {
                    router: &mut core.router,
                    spillover: &core.spillover,
                    endpoints,
                    request,
                    overlaps,
                    now,
                    pinned: core.pins.get(session, now, pin_ttl),
                },
                passes,
                &accept,
            );
            self.metrics
                .decision
                .observe(started.elapsed().as_secs_f64());
            let tiers::Placement {
                route,
                pass,
                spilled: spill_reason,
            } = placed?;
            let tier_of = |v: &EndpointView| tiers::tier_of(endpoints, v);
            core.router.commit(request, route.endpoint, overlaps, now);
            core.pins
                .placed(session, (pass.2, spill_reason), now, pin_ttl);
            let scene = PickScene {
                request,
                attempt: attempt.label(),
                policy: core.router.policy_name(),
                views: core.router.views(),
                overlaps,
                scores: core.router.last_scores(),
            };
            let record = Arc::new(DecisionRecord::new(
                &scene,
                (route.endpoint, &route.reason),
                |v| tier_of(v) == pass.2 && accept(v, pass.0, pass.1),
                |id| {
                    endpoints
                        .binary_search_by_key(&id, |e| e.info.id)
                        .map_or_else(|_| Arc::from("?"), |k| endpoints[k].info.about.name.clone())
                },
            ));
            core.sync_inflight(route.endpoint);
            let Some(e) = core.endpoint(route.endpoint) else {
                return Err(Rejection::NoRoutableEndpoint);
            };
            // The predicate let only endpoints whose breaker admits traffic through.
            let ticket = e.breaker.acquire(now).unwrap_or_default();
            if let Some(limits) = &mut e.limits {
                limits.dispatched(request.id, now, charge);
            }
            let changed = e.sync_breaker();
            let about = e.info.about.clone();
            let target = Target {
                ticket,
                id: route.endpoint,
                name: e.info.about.name.clone(),
                base: e.info.about.base.clone(),
                cadence: e.info.cadence.clone(),
                reason: route.reason.label(),
                decision: record,
                authorization: e.info.about.authorization.clone(),
                hedge_after: if attempt == Attempt::First {
                    core.hedge.delay().map(|n| Duration::from_nanos(n.0))
                } else {
                    None
                },
                prediction: None,
                predicted_ttft: match route.reason {
                    Reason::PredictedTtft { ttft_ms, .. } => Some(ttft_ms / 1e3),
                    _ => None,
                },
                headers: about.headers.clone(),
                send_model: about.rename(model),
                tier: about.config.tier,
                spilled: spill_reason,
                price: about.config.price,
                prompt_cache_key: about.config.prompt_cache_key,
            };
            self.metrics
                .picks
                .get_or_create(&PickLabels {
                    policy: core.router.policy_name(),
                    reason: target.reason,
                })
                .inc();
            if target.tier > 0 {
                let reason = target.spilled.unwrap_or("unavailable");
                self.metrics
                    .spillover
                    .get_or_create(&metrics::ReasonLabel { reason })
                    .inc();
            }
            if changed {
                self.publish(core);
            }
            target
        };
        self.decisions.push(target.decision.clone());
        let mut target = target;
        let mut cache = self.cache_mut();
        target.prediction = Some(cache.prediction(request, target.id, &overlaps));
        cache.dispatched(request, target.id, now, &overlaps);
        drop(cache);
        if let Some(outbox) = self.outbox.get() {
            outbox.dispatched(target.base.clone(), request);
        }
        Ok(target)
    }

    /// Up to `limit` recent decision records, newest first; only `request`'s when given.
    pub fn decisions(&self, limit: usize, request: Option<u64>) -> Vec<Arc<DecisionRecord>> {
        self.decisions.recent(limit, request)
    }

    /// After a failed attempt: wait, retry after a backoff, or give up (the retry budget is
    /// shared by every request, so this takes the lock; failures are the rare path).
    pub fn next_after_failure(&self, attempts: &mut Attempts, rng: &mut dyn RngCore) -> Next {
        let now = self.clock.now();
        attempts.failed(now, &mut self.lock().budget, rng)
    }

    /// Gives back a retry withdrawn at `withdrawn_at` that was never sent.
    pub fn refund_retry(&self, withdrawn_at: Nanos) {
        self.lock().budget.refund(withdrawn_at);
    }

    /// A uniformly random duration in `[0, max)`, for phases.
    pub fn jitter(&self, max: Duration) -> Duration {
        use rand::Rng;
        let max = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX).max(1);
        Duration::from_nanos(self.lock().router.rng().random_range(0..max))
    }

    /// A scrape of `endpoint` sent at `sent_at` returned `observation` (`None` when the engine
    /// answered without metrics kvgate reads). The endpoint is healthy again.
    pub fn observed(&self, endpoint: EndpointId, observation: Option<Observation>, sent_at: Nanos) {
        let mut core = self.lock();
        core.set_checks(endpoint, |e| e.healthy = true);
        let Some(e) = core.endpoint(endpoint) else {
            return;
        };
        e.scrape_failures = 0;
        e.served_since_scrape = false;
        if let Some(obs) = observation {
            e.info.observation = Some(obs);
            if obs.waiting > 0 && obs.running > 0 {
                e.info.slots = Some(e.info.slots.map_or(obs.running, |s| s.max(obs.running)));
            }
            core.router.observed(endpoint, obs, sent_at);
        }
        self.publish(&core);
        drop(core);
        if let Some(tokens) = observation.and_then(|o| o.capacity_tokens()) {
            self.cache_mut().set_capacity(endpoint, tokens);
        }
    }

    /// Records which run of its engine a scrape of `endpoint` came from; whether the engine
    /// restarted since the previous one. A restarted engine's cache is empty, so the index
    /// forgets what it held there: else the policy keeps predicting hits on a cold engine and
    /// sends it the returning sessions it held, each a full prefill, all at once. The batch size
    /// learned from its scrapes goes too (a restart is how an operator changes it).
    pub fn incarnation(&self, endpoint: EndpointId, run: crate::scrape::Incarnation) -> bool {
        if run == crate::scrape::Incarnation::default() {
            return false;
        }
        let mut core = self.lock();
        let Some(e) = core.endpoint(endpoint) else {
            return false;
        };
        let restarted = e
            .incarnation
            .replace(run)
            .is_some_and(|before| run.restarted_since(&before));
        if restarted {
            e.info.slots = None;
            self.publish(&core);
            drop(core);
            self.cache_mut().endpoint_restarted(endpoint);
        }
        restarted
    }

    /// A scrape of `endpoint` failed; after `threshold` in a row it is unhealthy. A failed scrape
    /// does not count while the endpoint answered requests since the previous scrape: an engine
    /// too busy to answer `/metrics` in time is not a dead engine, and taking the last endpoint
    /// out of a pool for it would turn load into errors. Whether this failure made it
    /// unhealthy.
    pub fn scrape_failed(&self, endpoint: EndpointId, threshold: u32) -> bool {
        let mut core = self.lock();
        let Some(e) = core.endpoint(endpoint) else {
            return false;
        };
        if std::mem::take(&mut e.served_since_scrape) {
            return false;
        }
        e.scrape_failures += 1;
        let down = e.scrape_failures >= threshold;
        let went_down = down && core.set_checks(endpoint, |e| e.healthy = false);
        if went_down {
            self.publish(&core);
        }
        went_down
    }

    /// Records what the engine's own `/health` said: a 5xx (for example an engine draining for
    /// shutdown) keeps it out of routing until `/health` is fine again, whatever traffic it
    /// still answers.
    pub fn reported_health(&self, endpoint: EndpointId, up: bool) {
        let mut core = self.lock();
        if core.set_checks(endpoint, |e| e.reports_down = !up) {
            self.publish(&core);
        }
    }

    /// Records the models an endpoint reported.
    pub fn set_models(&self, endpoint: EndpointId, models: Vec<String>) {
        let mut core = self.lock();
        if let Some(e) = core.endpoint(endpoint) {
            if e.info.about.config.model.is_none() {
                e.info.about = Arc::new(About::new(e.info.about.config.clone(), models));
                self.publish(&core);
            }
        }
    }

    /// Periodic upkeep: the policy's, then the prefix cache's (eviction) under its own lock.
    pub fn maintain(&self) {
        let now = self.clock.now();
        let models = {
            let mut core = self.lock();
            core.router.maintain(now);
            core.router.models(now)
        };
        let snapshot = self.snapshot.load();
        for &(id, m) in &models {
            let Some(e) = snapshot.get(id) else { continue };
            let label = metrics::endpoint(&e.about.name);
            let set = |family: &metrics::Family<_, metrics::FloatGauge>, v: f64| {
                family.get_or_create(&label).set(v);
            };
            set(&self.metrics.prefill_rate, m.prefill_tokens_per_second);
            set(&self.metrics.ttft_fixed, m.fixed_seconds);
            set(&self.metrics.speed_factor, m.speed_factor);
        }
        self.learned.store(Arc::new(models));
        self.cache_mut().maintain(now);
    }

    /// What the policy learned of each endpoint at the last upkeep; empty for a policy that
    /// learns nothing.
    pub fn learned(&self) -> Arc<Vec<(EndpointId, EndpointModel)>> {
        self.learned.load_full()
    }
}

#[cfg(test)]
mod tests;
