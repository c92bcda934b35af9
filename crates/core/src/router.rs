//! The router: one policy with the state every policy reads (the fleet's views, the in-flight
//! ledger) and the seeded random source, plus the event wiring, so the simulator and the gateway
//! route through the very same sequence (docs/architecture.md, "The decision core's shape").
//!
//! A pick is: the caller's eligibility predicate and the prefix cache's overlaps in, the
//! policy's [`Decision`] out, and when it routes, the dispatch recorded in the ledger and
//! reported to the policy ([`Event::Dispatched`]) before the call returns. Feedback (first
//! token, usage, completion, failure, engine KV events) comes back through methods named after
//! what happened; membership, health and scrapes too. Time is an argument of every call.
//!
//! The [`PrefixCache`] a policy asks for is kept outside the router, because the gateway looks
//! prompts up under a read lock before it takes the router's lock and inserts them after.
//! [`Routing`] owns both for single-threaded drivers (every simulator scenario).

use crate::decision::{FailureKind, Usage};
use crate::fasthash::IntMap;
use crate::index::blocks::KvEvent;
use crate::index::{Overlaps, Prediction, PrefixCache};
use crate::policy::Query;
use crate::{
    lora, Cadence, Decision, EndpointId, EndpointView, Event, Fleet, Health, InflightLedger, Nanos,
    Observation, Policy, PolicyConfig, Request,
};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// A policy, the fleet as it sees it, the in-flight ledger and the random source.
#[derive(Debug)]
pub struct Router {
    config: PolicyConfig,
    policy: Box<dyn Policy>,
    views: Vec<EndpointView>,
    ledger: InflightLedger,
    rng: ChaCha8Rng,
}

/// The predicate that accepts every healthy member.
pub fn accept_all(_: &EndpointView) -> bool {
    true
}

impl Router {
    /// A router running `config`'s policy with no endpoints, its random source seeded by `seed`.
    pub fn new(config: &PolicyConfig, seed: u64) -> Self {
        Router {
            policy: config.build(),
            config: config.clone(),
            views: Vec::new(),
            ledger: InflightLedger::new(),
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }

    /// The policy's configuration.
    pub fn config(&self) -> &PolicyConfig {
        &self.config
    }

    /// The policy's name.
    pub fn policy_name(&self) -> &'static str {
        self.config.name()
    }

    /// Replaces the policy; what the old one learned is dropped, the fleet and ledger stay.
    pub fn set_policy(&mut self, config: &PolicyConfig) {
        self.policy = config.build();
        self.config = config.clone();
    }

    /// Every member, in id order, with the ledger's counts.
    pub fn views(&self) -> &[EndpointView] {
        &self.views
    }

    /// Member `id`'s view.
    pub fn view(&self, id: EndpointId) -> Option<&EndpointView> {
        self.position(id).map(|i| &self.views[i])
    }

    /// The candidates' scores in the last pick, by fleet position (see
    /// [`Policy::last_scores`]).
    pub fn last_scores(&self) -> Option<(&'static str, &[(usize, f64)])> {
        self.policy.last_scores()
    }

    /// The random source, for the owner's own draws (backoff jitter, scrape phases).
    pub fn rng(&mut self) -> &mut ChaCha8Rng {
        &mut self.rng
    }

    fn position(&self, id: EndpointId) -> Option<usize> {
        self.views.binary_search_by_key(&id, |v| v.id).ok()
    }

    /// Copies the ledger's counts of `id` into its view.
    fn refresh(&mut self, id: EndpointId) {
        if let Some(i) = self.position(id) {
            self.ledger.annotate(&mut self.views[i]);
        }
    }

    /// A member joins (its `joined_at` starts blackout and slow start). An id already present
    /// has its view replaced.
    pub fn add(&mut self, mut view: EndpointView) {
        self.ledger.annotate(&mut view);
        match self.views.binary_search_by_key(&view.id, |v| v.id) {
            Ok(i) => self.views[i] = view,
            Err(i) => self.views.insert(i, view),
        }
    }

    /// A member leaves: the ledger and the policy forget it. Requests already sent there may
    /// still report back; they are ignored.
    pub fn remove(&mut self, id: EndpointId) -> bool {
        let Some(i) = self.position(id) else {
            return false;
        };
        self.views.remove(i);
        self.ledger.remove(id);
        self.policy
            .observe(&Event::EndpointRemoved { endpoint: id });
        true
    }

    /// Sets a member's static weight.
    pub fn set_weight(&mut self, id: EndpointId, weight: f64) {
        if let Some(i) = self.position(id) {
            self.views[i].weight = weight;
        }
    }

    /// Sets a member's health (draining, failing health checks).
    pub fn set_health(&mut self, id: EndpointId, health: Health) {
        if let Some(i) = self.position(id) {
            self.views[i].health = health;
        }
    }

    /// A stream this router relays from `id` delivered tokens at `at` ([`Cadence`]).
    pub fn tokens(&mut self, id: EndpointId, at: Nanos) {
        if let Some(i) = self.position(id) {
            let view = &mut self.views[i];
            match &mut view.cadence {
                Some(c) => c.tick(at),
                None => view.cadence = Some(Cadence::starting(at)),
            }
        }
    }

    /// Sets `id`'s iteration clock, kept outside the router (the gateway's streams keep theirs
    /// without the pool's lock).
    pub fn set_cadence(&mut self, id: EndpointId, cadence: Option<Cadence>) {
        if let Some(i) = self.position(id) {
            self.views[i].cadence = cadence;
        }
    }

    /// A scrape of `id` taken at `at` returned `observation`.
    pub fn observed(&mut self, id: EndpointId, observation: Observation, at: Nanos) {
        if let Some(i) = self.position(id) {
            self.views[i].observation = Some(observation);
            self.views[i].observed_at = at;
            self.ledger.observed(id, at);
            self.ledger.annotate(&mut self.views[i]);
        }
    }

    /// Sets each view's LoRA outlook for the next pick (`None` clears it).
    pub fn set_lora_outlooks(&mut self, f: impl Fn(&EndpointView) -> Option<lora::Outlook>) {
        self.views.iter_mut().for_each(|v| v.lora_outlook = f(v));
    }

    /// What member `id`'s engine last said of its LoRA adapters (`None`: it reports none).
    pub fn set_adapters(&mut self, id: EndpointId, adapters: Option<crate::lora::AdapterState>) {
        if let Some(i) = self.position(id) {
            self.views[i].adapters = adapters;
        }
    }

    /// Chooses an endpoint for `request` among the healthy members `accept` lets through, and
    /// when one is chosen records the dispatch (ledger, [`Event::Dispatched`]) at `now`.
    pub fn pick(
        &mut self,
        request: &Request,
        overlaps: &Overlaps,
        now: Nanos,
        accept: &dyn Fn(&EndpointView) -> bool,
    ) -> Decision {
        let decision = self.choose(request, overlaps, now, accept);
        if let Decision::Route(route) = &decision {
            self.commit(request, route.endpoint, overlaps, now);
        }
        decision
    }

    /// The policy's choice among the endpoints `accept` lets through, not yet recorded: a
    /// caller weighing several choices (priority tiers, spillover) records the one it sends
    /// with [`Self::commit`]. Nothing is counted as dispatched until then.
    pub fn choose(
        &mut self,
        request: &Request,
        overlaps: &Overlaps,
        now: Nanos,
        accept: &dyn Fn(&EndpointView) -> bool,
    ) -> Decision {
        let query = Query {
            request,
            fleet: Fleet::new(&self.views, accept),
            overlaps,
            now,
        };
        self.policy.select(&query, &mut self.rng)
    }

    /// Records that `request` goes to `endpoint` (ledger, policy's `Dispatched` event).
    pub fn commit(
        &mut self,
        request: &Request,
        endpoint: EndpointId,
        overlaps: &Overlaps,
        now: Nanos,
    ) {
        self.ledger.dispatched(endpoint, request.id, now);
        self.refresh(endpoint);
        self.policy.observe(&Event::Dispatched {
            request,
            endpoint,
            at: now,
            overlaps,
        });
    }

    /// Requests sent to `id` and not finished whose first token has not come (see
    /// [`InflightLedger::awaiting_first_token`]).
    pub fn awaiting_first_token(&self, id: EndpointId) -> u32 {
        self.ledger.awaiting_first_token(id)
    }

    /// The first token of `request` arrived from `endpoint` `ttft` after its dispatch.
    pub fn first_token(&mut self, request: u64, endpoint: EndpointId, now: Nanos, ttft: Nanos) {
        self.ledger.first_token(endpoint, request);
        self.policy.observe(&Event::FirstToken {
            request,
            endpoint,
            at: now,
            ttft,
        });
    }

    /// The engine's `usage` for `request`.
    pub fn usage(&mut self, request: u64, endpoint: EndpointId, now: Nanos, usage: Usage) {
        self.policy.observe(&Event::Usage {
            request,
            endpoint,
            at: now,
            usage,
        });
    }

    /// `request` finished normally on `endpoint`, `latency` after its dispatch.
    pub fn completed(
        &mut self,
        request: u64,
        endpoint: EndpointId,
        now: Nanos,
        latency: Nanos,
        output_tokens: u32,
    ) {
        self.ledger.finished(endpoint, request);
        self.refresh(endpoint);
        self.policy.observe(&Event::Completed {
            request,
            endpoint,
            at: now,
            latency,
            output_tokens,
        });
    }

    /// `request` failed (or was cancelled) on `endpoint`.
    pub fn failed(&mut self, request: u64, endpoint: EndpointId, now: Nanos, kind: FailureKind) {
        self.ledger.finished(endpoint, request);
        self.refresh(endpoint);
        self.policy.observe(&Event::Failed {
            request,
            endpoint,
            at: now,
            kind,
        });
    }

    /// An engine reported KV cache changes.
    pub fn kv_event(&mut self, endpoint: EndpointId, event: &KvEvent, now: Nanos) {
        self.policy.observe(&Event::Kv {
            endpoint,
            event,
            at: now,
        });
    }

    /// Periodic upkeep of the policy.
    pub fn maintain(&mut self, now: Nanos) {
        self.policy.maintain(now);
    }

    /// What the policy learned about each member, for those that learn one.
    pub fn models(&mut self, now: Nanos) -> Vec<(EndpointId, crate::policy::EndpointModel)> {
        let ids: Vec<EndpointId> = self.views.iter().map(|v| v.id).collect();
        ids.into_iter()
            .filter_map(|id| self.policy.model(id, now).map(|m| (id, m)))
            .collect()
    }
}

/// A router and the prefix cache its policy asked for, owned together, with no eligibility
/// rules beyond the caller's `accept` predicate: the harness of the policy tests, the pick
/// benchmark and the simulator's policy labs. The fleet simulator and the gateway drive the
/// full [`crate::dispatch`] core instead; both share this type's cache steps
/// ([`crate::dispatch::record_dispatch`], [`crate::dispatch::correct`],
/// [`crate::dispatch::record_kv_batch`]).
#[derive(Debug)]
pub struct Routing {
    router: Router,
    cache: Option<PrefixCache>,
    /// What the cache predicted for each dispatch awaiting usage.
    predictions: IntMap<(u64, EndpointId), Prediction>,
}

impl Routing {
    /// A router for `config` seeded by `seed`, with the index its policy asks for.
    pub fn new(config: &PolicyConfig, seed: u64) -> Self {
        Routing {
            cache: config.index().map(|spec| PrefixCache::new(&spec)),
            router: Router::new(config, seed),
            predictions: IntMap::default(),
        }
    }

    /// Also lays the engines' KV-event streams over the policy's index ([`Self::kv_batch`]),
    /// at most `max_entries` per endpoint, as the gateway does.
    pub fn with_engine_events(mut self, max_entries: usize) -> Self {
        self.cache = self.cache.map(|c| c.with_engine_events(max_entries));
        self
    }

    /// Batch `seq` of `endpoint`'s KV-event stream: into the index's engine layer, and each
    /// event to the policy.
    pub fn kv_batch(&mut self, endpoint: EndpointId, seq: u64, events: &[KvEvent], now: Nanos) {
        if let Some(cache) = &mut self.cache {
            crate::dispatch::record_kv_batch(cache, endpoint, seq, events, now);
        }
        for event in events {
            self.router.kv_event(endpoint, event, now);
        }
    }

    /// The router.
    pub fn router(&self) -> &Router {
        &self.router
    }

    /// The router, for membership changes and scrapes.
    pub fn router_mut(&mut self) -> &mut Router {
        &mut self.router
    }

    /// The prefix cache, if the policy uses one.
    pub fn cache(&self) -> Option<&PrefixCache> {
        self.cache.as_ref()
    }

    /// Looks `request` up in the prefix cache, picks, and records the dispatch in both.
    pub fn route(
        &mut self,
        request: &Request,
        now: Nanos,
        accept: &dyn Fn(&EndpointView) -> bool,
    ) -> Decision {
        let overlaps = self
            .cache
            .as_ref()
            .map(|c| c.overlaps(request, now))
            .unwrap_or_default();
        let decision = self.router.pick(request, &overlaps, now, accept);
        if let (Some(cache), Some(endpoint)) = (&mut self.cache, decision.endpoint()) {
            let prediction =
                crate::dispatch::record_dispatch(cache, request, endpoint, &overlaps, now);
            self.predictions.insert((request.id, endpoint), prediction);
        }
        decision
    }

    /// A peer (another gateway replica sharing its decisions) sent `request` to `endpoint` at
    /// `now`: this router counts it in flight there and its policy and prefix cache learn it
    /// as if it were its own dispatch, so replicas neither herd onto the same idle endpoint nor
    /// lose a conversation's affinity when its turns reach different replicas. The peer's
    /// later first token and completion come through [`Self::first_token`], [`Self::usage`]
    /// and [`Self::completed`] with the same request id (ids must be unique across peers).
    pub fn peer_dispatched(&mut self, request: &Request, endpoint: EndpointId, now: Nanos) {
        let overlaps = self
            .cache
            .as_ref()
            .map(|c| c.overlaps(request, now))
            .unwrap_or_default();
        self.router.commit(request, endpoint, &overlaps, now);
        if let Some(cache) = &mut self.cache {
            cache.dispatched(request, endpoint, now, &overlaps);
        }
    }

    /// See [`Router::tokens`].
    pub fn tokens(&mut self, id: EndpointId, at: Nanos) {
        self.router.tokens(id, at);
    }

    /// A scrape of `id` taken at `at`: the router's view, and the cache's bound for an engine
    /// that reports its KV capacity.
    pub fn observed(&mut self, id: EndpointId, observation: Observation, at: Nanos) {
        if let (Some(cache), Some(tokens)) = (&mut self.cache, observation.capacity_tokens()) {
            cache.set_capacity(id, tokens);
        }
        self.router.observed(id, observation, at);
    }

    /// See [`Router::first_token`]; an index mirroring engines now lists the prompt as cached.
    pub fn first_token(&mut self, request: u64, endpoint: EndpointId, now: Nanos, ttft: Nanos) {
        if let Some(cache) = &mut self.cache {
            cache.first_token(request, endpoint, now);
        }
        self.router.first_token(request, endpoint, now, ttft);
    }

    /// See [`Router::usage`]; the cache also learns whether its prediction held.
    pub fn usage(&mut self, request: u64, endpoint: EndpointId, now: Nanos, usage: Usage) {
        if let (Some(cache), Some(p)) =
            (&mut self.cache, self.predictions.get(&(request, endpoint)))
        {
            let block = self
                .router
                .view(endpoint)
                .and_then(|v| v.observation?.block_size);
            crate::dispatch::correct(cache, usage, p, block);
        }
        self.router.usage(request, endpoint, now, usage);
    }

    /// See [`Router::completed`].
    pub fn completed(
        &mut self,
        request: u64,
        endpoint: EndpointId,
        now: Nanos,
        latency: Nanos,
        output_tokens: u32,
    ) {
        self.predictions.remove(&(request, endpoint));
        if let Some(cache) = &mut self.cache {
            cache.finished(request, endpoint);
        }
        self.router
            .completed(request, endpoint, now, latency, output_tokens);
    }

    /// See [`Router::failed`].
    pub fn failed(&mut self, request: u64, endpoint: EndpointId, now: Nanos, kind: FailureKind) {
        self.predictions.remove(&(request, endpoint));
        if let Some(cache) = &mut self.cache {
            cache.finished(request, endpoint);
        }
        self.router.failed(request, endpoint, now, kind);
    }

    /// An engine's KV events reach both the policy and the index.
    pub fn kv_event(&mut self, endpoint: EndpointId, event: &KvEvent, now: Nanos) {
        if let Some(cache) = &mut self.cache {
            cache.kv_event(endpoint, event, now);
        }
        self.router.kv_event(endpoint, event, now);
    }

    /// A member leaves the router and the index.
    pub fn remove(&mut self, id: EndpointId) -> bool {
        if let Some(cache) = &mut self.cache {
            cache.remove_endpoint(id);
        }
        self.predictions.retain(|&(_, e), _| e != id);
        self.router.remove(id)
    }

    /// Periodic upkeep of the policy and the index.
    pub fn maintain(&mut self, now: Nanos) {
        self.router.maintain(now);
        if let Some(cache) = &mut self.cache {
            cache.maintain(now);
        }
    }
}
