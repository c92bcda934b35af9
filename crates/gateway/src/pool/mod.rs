//! The pool: kvgate-core's [`DispatchCore`] (router, eligibility rules, retry budget, hedging
//! delay) behind one lock, the prefix cache behind its own read-write lock, what the gateway
//! keeps of each endpoint besides (URL, key, headers, in-flight counter), and a snapshot of
//! the endpoints published lock-free for everything that only reads (readiness,
//! `/v1/models`, the admin API's status, gauges, metric labels). The simulator's fleet drives
//! the same core through [`kvgate_core::dispatch::Dispatcher`], in the same order.
//!
//! The lock is held for a pick and for event updates only, never across an `.await` and never
//! for index work: a prompt is looked up in the prefix cache (up to megabytes of text) under
//! the cache's read lock before the pick takes the pool's lock, and inserted under its write
//! lock after; periodic eviction also runs under the cache's lock. A streaming request takes the
//! pool's lock three times: to pick, at its first token, at its end.
//!
//! Eligibility lives in the dispatch core, outside the policy: a member is offered to the
//! policy only if its health checks pass, no Retry-After window or open breaker holds it back,
//! it serves the requested model, it is within its deployment limits, and this request has not
//! tried it yet.

mod cadence;
mod disagg;
mod endpoint;
mod gate;
mod health;
mod lora;
mod members;
mod metrics;
mod outcome;
mod peer;
mod snapshot;
mod target;
mod unroutable;

pub use crate::clock::Clock;
pub use cadence::CadenceCell;
pub use disagg::RoleMember;
pub use gate::{Held, Placed};
pub(crate) use members::EndpointSet;
pub use metrics::PoolMetrics;
pub use peer::PeerEnd;
pub(crate) use peer::{PoolEvent, Progress, Subscriber};
pub use snapshot::EndpointStatus;
use snapshot::Snapshot;
pub use target::{Attempt, Target};

use crate::endpoint_config::EndpointConfig;
use crate::observe::decisions::{DecisionRecord, DecisionRing};
use arc_swap::ArcSwap;
use endpoint::{About, Endpoint, EndpointInfo};
use kvgate_core::dispatch::{self, DispatchConfig, DispatchCore};
use kvgate_core::index::{Overlaps, PrefixCache};
use kvgate_core::policy::EndpointModel;
use kvgate_core::resilience::{Attempts, Next};
use kvgate_core::{EndpointId, Nanos, PolicyConfig, Rejection, Request};
use rand::RngCore;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

/// Everything under the pool's lock.
#[derive(Debug)]
struct Core {
    dispatch: DispatchCore,
    /// Sorted by id, the same members as the dispatch core's.
    endpoints: Vec<Endpoint>,
    next_id: u32,
}

impl Core {
    fn endpoint(&self, id: EndpointId) -> Option<&Endpoint> {
        let i = self.endpoints.binary_search_by_key(&id, |e| e.id).ok()?;
        Some(&self.endpoints[i])
    }

    fn endpoint_mut(&mut self, id: EndpointId) -> Option<&mut Endpoint> {
        let i = self.endpoints.binary_search_by_key(&id, |e| e.id).ok()?;
        Some(&mut self.endpoints[i])
    }

    /// Copies the router's in-flight count of `id` into the published counter.
    fn sync_inflight(&self, id: EndpointId) {
        let inflight = self
            .dispatch
            .router()
            .view(id)
            .map_or(0, |v| v.own_inflight);
        if let Some(e) = self.endpoint(id) {
            e.inflight.store(inflight, Ordering::Relaxed);
        }
    }
}

/// What the pool is built from: the parts of the configuration it reads (the configuration
/// composes them, [`crate::config::Config::pool_settings`]).
#[derive(Clone, Debug)]
pub struct Settings {
    /// The dispatch core's parameters.
    pub dispatch: DispatchConfig,
    /// The routing policy.
    pub policy: PolicyConfig,
    /// The KV-event index's bound per endpoint.
    pub max_event_entries: usize,
    /// Decision records kept for `/admin/decisions`.
    pub decision_records: usize,
}

/// The pool (see the module docs).
#[derive(Debug)]
pub struct Pool {
    core: Mutex<Core>,
    cache: RwLock<PrefixCache>,
    snapshot: ArcSwap<Snapshot>,
    clock: Clock,
    metrics: PoolMetrics,
    locks: AtomicU64,
    decisions: DecisionRing,
    /// What the policy learned of each endpoint at the last upkeep (policies that learn).
    learned: ArcSwap<Vec<(EndpointId, EndpointModel)>>,
    /// The KV-event index's bound per endpoint.
    max_event_entries: usize,
    /// Who hears what this pool's own requests did (in a cluster, the link to the peers).
    subscriber: std::sync::OnceLock<Arc<dyn Subscriber>>,
    /// Model names engines listed as LoRA adapters (`lora`).
    adapters: RwLock<std::collections::BTreeSet<String>>,
    /// Each endpoint's last adapter report, for the admin API without the core's lock.
    adapter_reports:
        RwLock<std::collections::BTreeMap<EndpointId, kvgate_core::lora::AdapterState>>,
    /// The LoRA gate's held requests, each woken when the gate releases it.
    waiters: gate::Waiters,
}

impl Pool {
    /// A pool with no endpoints.
    pub fn new(settings: &Settings, clock: Clock, metrics: PoolMetrics, seed: u64) -> Self {
        let core = Core {
            dispatch: DispatchCore::new(&settings.dispatch, &settings.policy, seed),
            endpoints: Vec::new(),
            next_id: 0,
        };
        let max_event_entries = settings.max_event_entries;
        let pool = Pool {
            cache: RwLock::new(dispatch::cache_for(&settings.policy, max_event_entries)),
            max_event_entries,
            snapshot: ArcSwap::default(),
            core: Mutex::new(core),
            clock,
            metrics,
            locks: AtomicU64::new(0),
            decisions: DecisionRing::new(settings.decision_records),
            learned: ArcSwap::default(),
            subscriber: Default::default(),
            adapters: Default::default(),
            adapter_reports: Default::default(),
            waiters: Default::default(),
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
        let endpoints: Vec<EndpointInfo> = core
            .endpoints
            .iter()
            .zip(core.dispatch.members())
            .map(|(e, status)| {
                debug_assert_eq!(e.id, status.id);
                EndpointInfo {
                    about: e.about.clone(),
                    status: status.clone(),
                    inflight: e.inflight.clone(),
                    cadence: e.cadence.clone(),
                    trouble: e.trouble.clone(),
                    metrics_missing: e.metrics_missing,
                }
            })
            .collect();
        let has_prefill = endpoints
            .iter()
            .any(|e| e.about.config.role == crate::endpoint_config::EndpointRole::Prefill);
        self.snapshot.store(Arc::new(Snapshot {
            policy: core.dispatch.router().policy_name(),
            endpoints,
            has_prefill,
        }));
    }

    /// Publishes when `changed`.
    fn publish_if(&self, core: &Core, changed: bool) {
        if changed {
            self.publish(core);
        }
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
            core.dispatch.router_mut().set_policy(policy);
            self.publish(&core);
        }
        let mut cache = self.cache_mut();
        let mut fresh = dispatch::cache_for(policy, self.max_event_entries);
        fresh.carry_engine_events(&mut cache);
        *cache = fresh;
    }

    /// Adds an endpoint; it joins now (blackout and slow start count from here).
    pub fn add(&self, config: EndpointConfig) -> EndpointId {
        let now = self.clock.now();
        let mut core = self.lock();
        let id = EndpointId(core.next_id);
        core.next_id += 1;
        let label = crate::metrics::endpoint(&config.display_name());
        self.metrics.breaker.get_or_create(&label).set(0);
        self.metrics.endpoint_up.get_or_create(&label).set(1);
        let endpoint = Endpoint::new(id, config);
        core.dispatch.add(id, &endpoint.spec(), now);
        core.endpoints.push(endpoint);
        self.publish(&core);
        id
    }

    /// Removes an endpoint at once; requests already sent there run to completion.
    pub fn remove(&self, id: EndpointId) -> bool {
        {
            let mut core = self.lock();
            let Ok(i) = core.endpoints.binary_search_by_key(&id, |e| e.id) else {
                return false;
            };
            let gone = core.endpoints.remove(i);
            core.dispatch.remove(id);
            self.wake_released(&mut core);
            self.publish(&core);
            let label = crate::metrics::endpoint(&gone.about.name);
            self.metrics.endpoint_up.remove(&label);
            self.metrics.breaker.remove(&label);
            self.metrics.inflight.remove(&label);
        }
        self.cache_mut().remove_endpoint(id);
        self.note_adapter_report(id, None);
        true
    }

    /// Stops (or resumes) sending new requests to an endpoint.
    pub fn set_draining(&self, id: EndpointId, draining: bool) -> bool {
        let mut core = self.lock();
        if core.dispatch.set_draining(id, draining).is_none() {
            return false;
        }
        self.publish(&core);
        true
    }

    /// Applies a reloaded configuration to an endpoint (weight, model, labels, key, limits).
    pub fn update(&self, id: EndpointId, config: EndpointConfig) {
        let now = self.clock.now();
        let mut core = self.lock();
        let Some(e) = core.endpoint_mut(id) else {
            return;
        };
        let models = match &config.model {
            Some(m) => vec![m.clone()],
            None => e.about.models.clone(),
        };
        e.about = Arc::new(About::new(config, models));
        let spec = e.spec();
        core.dispatch.update(id, &spec, now);
        self.publish(&core);
    }

    /// Replaces the spillover thresholds (a reloaded file).
    pub fn set_spillover(&self, spillover: crate::endpoint_config::SpilloverConfig) {
        self.lock().dispatch.set_spillover(spillover);
    }

    /// The spillover thresholds in force.
    pub fn spillover(&self) -> crate::endpoint_config::SpilloverConfig {
        self.lock().dispatch.spillover().clone()
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
    /// breaker ticket, limits, the policy's `Dispatched`) in the same critical section; then,
    /// outside it, tells the prefix cache. Endpoints in `tried` are refused, except that a
    /// retry falls back to them when nothing else can take it.
    pub fn pick(
        &self,
        request: &Request,
        tried: &[EndpointId],
        attempt: Attempt,
    ) -> Result<Target, Rejection> {
        match self.place(request, tried, attempt, false)? {
            gate::Placed::Go(target) => Ok(*target),
            gate::Placed::Held(_) => Err(Rejection::NoRoutableEndpoint),
        }
    }

    /// [`Pool::pick`], through the LoRA gate when `gated` ([`Pool::pick_gated`]).
    fn place(
        &self,
        request: &Request,
        tried: &[EndpointId],
        attempt: Attempt,
        gated: bool,
    ) -> Result<gate::Placed, Rejection> {
        let now = self.clock.now();
        let overlaps = self.lookup(request, now);
        let mut target = {
            let mut guard = self.lock();
            let core = &mut *guard;
            let started = Instant::now();
            for e in &core.endpoints {
                core.dispatch
                    .router_mut()
                    .set_cadence(e.id, e.cadence.get());
            }
            let picked = if gated {
                core.dispatch
                    .pick_gated(request, &overlaps, tried, attempt, now)
            } else {
                core.dispatch
                    .pick(request, &overlaps, tried, attempt, now)
                    .map(dispatch::Gated::Picked)
            };
            self.metrics
                .decision
                .observe(started.elapsed().as_secs_f64());
            let picked = match picked? {
                dispatch::Gated::Picked(picked) => picked,
                dispatch::Gated::Held(hold) => return Ok(self.held(core, request.id, hold)),
            };
            core.sync_inflight(picked.route.endpoint);
            let target = self.target(core, request, attempt, &overlaps, &picked)?;
            self.count_pick(core.dispatch.router().policy_name(), &target);
            self.count_hold(&picked);
            self.publish_if(core, picked.changed);
            target
        };
        self.decisions.push(target.decision.clone());
        target.prediction = Some(dispatch::record_dispatch(
            &mut self.cache_mut(),
            request,
            target.id,
            &overlaps,
            now,
        ));
        if let Some(subscriber) = self.subscriber.get() {
            subscriber.notify(PoolEvent::Dispatched {
                endpoint: target.base.clone(),
                request,
            });
        }
        Ok(gate::Placed::Go(Box::new(target)))
    }

    /// Up to `limit` recent decision records, newest first; only `request`'s when given.
    pub fn decisions(&self, limit: usize, request: Option<u64>) -> Vec<Arc<DecisionRecord>> {
        self.decisions.recent(limit, request)
    }

    /// After a failed attempt: wait, retry after a backoff, or give up (the retry budget is
    /// shared by every request, so this takes the lock; failures are the rare path).
    pub fn next_after_failure(&self, attempts: &mut Attempts, rng: &mut dyn RngCore) -> Next {
        let now = self.clock.now();
        self.lock().dispatch.next_after_failure(attempts, now, rng)
    }

    /// Gives back a retry withdrawn at `withdrawn_at` that was never sent.
    pub fn refund_retry(&self, withdrawn_at: Nanos) {
        self.lock().dispatch.refund_retry(withdrawn_at);
    }

    /// A uniformly random duration in `[0, max)`, for phases.
    pub fn jitter(&self, max: Duration) -> Duration {
        use rand::Rng;
        let max = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX).max(1);
        Duration::from_nanos(self.lock().dispatch.router_mut().rng().random_range(0..max))
    }

    /// Records which run of its engine a scrape of `endpoint` came from; whether the engine
    /// restarted since the previous one. A restarted engine's cache is empty, so the index
    /// forgets what it held there: else the policy keeps predicting hits on a cold engine and
    /// sends it the returning sessions it held, each a full prefill, all at once. The batch size
    /// learned from its scrapes goes too (a restart is how an operator changes it).
    pub fn incarnation(&self, endpoint: EndpointId, run: crate::engine_state::Incarnation) -> bool {
        if run == crate::engine_state::Incarnation::default() {
            return false;
        }
        let mut core = self.lock();
        let Some(e) = core.endpoint_mut(endpoint) else {
            return false;
        };
        let restarted = e
            .incarnation
            .replace(run)
            .is_some_and(|before| run.restarted_since(&before));
        if restarted {
            core.dispatch.engine_restarted(endpoint);
            self.publish(&core);
            drop(core);
            self.cache_mut().endpoint_restarted(endpoint);
        }
        restarted
    }

    /// Records the models an endpoint reported.
    pub fn set_models(&self, endpoint: EndpointId, models: Vec<String>) {
        let mut core = self.lock();
        let Some(e) = core.endpoint_mut(endpoint) else {
            return;
        };
        if e.about.config.model.is_none() {
            e.about = Arc::new(About::new(e.about.config.clone(), models));
            let serving = e.about.serving.clone();
            core.dispatch.set_serving(endpoint, serving);
            self.publish(&core);
        }
    }

    /// Periodic upkeep: the policy's, then the prefix cache's (eviction) under its own lock.
    pub fn maintain(&self) {
        let now = self.clock.now();
        let models = { self.lock().dispatch.maintain(now) };
        let snapshot = self.snapshot.load();
        for &(id, m) in &models {
            let Some(e) = snapshot.get(id) else { continue };
            let label = crate::metrics::endpoint(&e.about.name);
            let set = |family: &crate::metrics::Family<_, crate::metrics::FloatGauge>, v: f64| {
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
mod replay_tests;
#[cfg(test)]
mod tests;
