//! What a simulated fleet is: its replicas, routers, signals and the events that befall it.

use crate::model::EngineConfig;
use kvgate_core::{Nanos, PolicyConfig};

/// One replica: its engine and relative speed (2.0 = iterations take half as long).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReplicaConfig {
    /// The engine.
    pub engine: EngineConfig,
    /// Speed factor applied to iteration times.
    pub speed: f64,
    /// The weight its routers are given (the gateway's `endpoints[].weight`). `None`: its
    /// speed, as an operator who knows each replica's speed would set it. A configuration
    /// simulated as written ([`crate::scenario::configured`]) gives the configured weight, which
    /// may not match the speed.
    pub weight: Option<f64>,
    /// Its priority tier (the gateway's `endpoints[].tier`, 0 first).
    pub tier: u32,
}

impl ReplicaConfig {
    /// A replica of `engine` at `speed`, weighted by its speed, in tier 0.
    pub fn new(engine: EngineConfig, speed: f64) -> Self {
        ReplicaConfig {
            engine,
            speed,
            weight: None,
            tier: 0,
        }
    }
}

/// The fleet and its routers.
#[derive(Clone, Debug)]
pub struct FleetConfig {
    /// The replicas.
    pub replicas: Vec<ReplicaConfig>,
    /// How many routers share the traffic.
    pub routers: usize,
    /// Scrape period; zero reads the gauges fresh at every decision.
    pub scrape_interval: Nanos,
    /// Spread the routers' scrape phases evenly over the interval instead of aligning them.
    pub staggered: bool,
    /// The policy every router runs (each its own instance).
    pub policy: PolicyConfig,
    /// Routers see each request's session name, as from clients that send `X-Session-Id` or
    /// the body's `user`; without it a session is only its prompts.
    pub session_names: bool,
    /// Publish each replica's KV events to every router, one batch per iteration: to the
    /// policies (`Event::Kv`) and laid over their prefix index, as the gateway does.
    pub kv_events: bool,
    /// How often the true load skew is sampled; zero disables sampling.
    pub sample_interval: Nanos,
    /// How often `Policy::maintain` runs.
    pub maintain_interval: Nanos,
    /// What the scraped KV usage gauge counts.
    pub kv_signal: KvSignal,
    /// Route by the oracle (true queues, cache contents and speeds) instead of the policy.
    pub oracle: bool,
    /// Replicas that die during the run.
    pub failures: Vec<Failure>,
    /// What a router does with a stream whose replica dies after its first token. `None`: the
    /// request fails. `Some(n)`: it sends a continuation elsewhere, at most `n` at once per
    /// replica still awaiting their first token, the rest waiting at the router (0: no limit).
    /// The gateway's `resume` with `per_endpoint` (on, 1 by default).
    pub resume: Option<u32>,
    /// How long after its stream broke a continuation yields to new requests: until then it
    /// goes only to a replica where no request its router sent awaits a first token. The
    /// gateway's `resume.yield_ms` (docs/routing.md, Limits, "A lost replica"). Zero: never.
    pub resume_yield: Nanos,
    /// Stage a continuation's prefill in pieces of this many tokens: each head of its prompt
    /// goes first as a one-token warm-up, on the replica of the piece before, so a request
    /// that arrives there meanwhile waits behind one piece rather than the whole prompt.
    /// `None`: one piece.
    pub resume_stage: Option<u32>,
    /// A staged head grows by two pieces instead of one when, as it leaves, no request its
    /// router sent to that replica awaits a first token: nobody is queued there for a small
    /// piece to spare, and each head costs the continuation about two iterations of the
    /// replica (its own, and the one that starts before the next head arrives).
    pub resume_stage_grow: bool,
    /// Re-home the sessions a lost replica held: for each whose last turn ended there at most
    /// this long before re-homing starts (the loss, or `rehome_delay` after it), the router
    /// sends that turn's prompt again for one token, a warm-up, so the session's next turn
    /// finds its context cached elsewhere (the fleet's `rehome` module). `None`: off.
    pub rehome: Option<Nanos>,
    /// How long after the loss re-homing starts: a gateway learns that an engine's cache is
    /// gone from its failed scrapes, a few intervals late.
    pub rehome_delay: Nanos,
    /// Routers share their dispatches, first tokens and completions with each other after this
    /// delay (gateway replicas over a message bus); `None`: each knows only its own.
    pub share: Option<Nanos>,
    /// Simulated time after which the run stops; what has not finished by then never does
    /// (an overloaded fleet's queue would take hours of simulated time to drain, and its
    /// answer is already known).
    pub horizon: Option<Nanos>,
    /// The dispatch core's parameters (retry budget, hedge, breakers, tier spillover), the
    /// gateway's `pool_settings().dispatch`; breakers and retries act only when replicas fail.
    pub dispatch: kvgate_core::dispatch::DispatchConfig,
    /// The gateway's admission gate at each router ([`AdmissionLimits`]); `None`: every
    /// request is sent at once.
    pub admission: Option<AdmissionLimits>,
}

/// The gateway's `admission` limits, per router (each gateway replica has its own gate):
/// requests in flight upstream at once, requests waiting beyond them, and how long one may
/// wait. The fleet's `admission` module says what of the gateway's gate it models.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdmissionLimits {
    /// Requests sent and not ended, at most (`admission.max_concurrency`).
    pub max_concurrency: usize,
    /// Requests waiting for a slot, at most; beyond it one fails at once, as the gateway's 429
    /// (`admission.max_queue`).
    pub max_queue: usize,
    /// The longest wait; a request still waiting then fails, as the gateway's 504
    /// (`admission.queue_timeout_ms`).
    pub queue_timeout: Nanos,
}

/// A replica dying at an instant: everything it holds is lost. Requests that had no first
/// token yet are sent again by their router (as the gateway retries before the first token);
/// those mid-stream fail. Every router forgets the replica at once (the gateway notices a dead
/// engine by its refused connections within a request or two).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failure {
    /// Which replica.
    pub replica: usize,
    /// When.
    pub at: Nanos,
}

/// What a replica's scraped KV usage counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvSignal {
    /// Blocks referenced by any sequence, as vLLM's `kv_cache_usage_perc`: a shared prefix
    /// block in use counts once.
    #[default]
    Referenced,
    /// Blocks running sequences hold beyond the prefix-cache hits they were admitted with:
    /// cached blocks are free (the reference routing lab's model, docs/background.md#routing-lab).
    Uncached,
}
