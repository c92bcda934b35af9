//! The fleet: replicas running the [`crate::model`] engine, routers running kvgate-core
//! policies, and a discrete-event loop on simulated time.
//!
//! A router sees only what a real one could (docs/background.md#stale-signals-and-herding): a scrape of each replica's
//! `running`, `waiting` and KV gauges ([`KvSignal`] says what the KV gauge counts), refreshed
//! every `scrape_interval` (all routers at the same instants, or staggered evenly across the
//! interval), its own dispatches, and whatever its policy learns from the events the gateway
//! would send it (`Dispatched`, `FirstToken`, `Completed`, and optionally engine KV events).
//! Each router is a [`Dispatcher`]: the dispatch core and prefix cache the gateway's pool
//! drives, fed the same events in the same order (a differential test in the gateway replays
//! one trace through both and compares their decisions). Arrivals are dealt to routers in turn,
//! and may wait at the router's admission gate (`fleet/admission.rs`).
//!
//! Time is [`Nanos`]. The cost of the loop is O(log events) per event: an iteration, an arrival,
//! a scrape or a sample; nothing walks all requests.
//!
//! An iteration is computed when it starts and its tokens are delivered when it ends, so
//! routers learn of first tokens and completions at the right time; the engine's gauges already
//! reflect the iteration's outcome while it runs (a scrape can be up to one iteration early).

mod config;
mod outcome;

pub use config::{AdmissionLimits, Failure, FleetConfig, KvSignal, ReplicaConfig};
pub use outcome::{Outcome, ReplicaOutcome, RequestRecord, Resumption, SkewStats};
use route::request_of;

use crate::model::{EngineModel, Iteration};
use crate::workload::{Spec, UniqueTokens, Workload};
use kvgate_core::dispatch::{Dispatcher, MemberSpec};
use kvgate_core::{EndpointId, Nanos, Observation};
use rand_chacha::ChaCha8Rng;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

struct Replica {
    engine: EngineModel,
    speed: f64,
    quantum: u64,
    pending: Option<Iteration>,
    stepping: bool,
    /// When the iteration in progress ends.
    busy_until: Nanos,
    alive: bool,
    /// Per router, its requests decoding here: a router sees the engine's iterations through
    /// their streams ([`kvgate_core::Cadence`]).
    streams: Vec<u32>,
    /// Sequence number of the next batch of KV events its publisher sends.
    kv_seq: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// An iteration ends (delivering its tokens) and the next one starts.
    Step,
    Scrape,
    Maintain,
    Sample,
    Arrival,
    Fail,
    /// Re-homing starts for a lost replica ([`rehome`]).
    Rehome,
    /// A peer's news reaches a router ([`share`]).
    News,
    /// A request's wait at its router's admission gate is over ([`admission`]).
    Expire,
}

/// Runs `workload` through the fleet. `seed` drives the routers' random choices; the workload
/// draws from `workload_rng`, so every policy sees the same open-loop arrivals.
pub fn run(
    config: &FleetConfig,
    workload: &mut dyn Workload,
    workload_rng: &mut ChaCha8Rng,
    seed: u64,
) -> Outcome {
    Sim::new(config, seed).run_keeping(workload, workload_rng).0
}

/// [`run`], recording everything the first router is fed and decides
/// ([`kvgate_core::dispatch::trace`]): the gateway's tests replay that trace through its pool.
pub fn run_recorded(
    config: &FleetConfig,
    workload: &mut dyn Workload,
    workload_rng: &mut ChaCha8Rng,
    seed: u64,
) -> (Outcome, kvgate_core::dispatch::trace::Trace) {
    let mut sim = Sim::new(config, seed);
    let entries = config.kv_events.then(|| engine_event_entries(config));
    sim.routers[0].record(&config.policy, router_seed(seed, 0), entries);
    let (outcome, trace) = sim.run_keeping(workload, workload_rng);
    (outcome, trace.expect("the first router records"))
}

struct Sim<'c> {
    config: &'c FleetConfig,
    now: Nanos,
    queue: BinaryHeap<Reverse<(Nanos, Kind, u64, u64)>>,
    seq: u64,
    replicas: Vec<Replica>,
    routers: Vec<Dispatcher>,
    specs: Vec<Option<Spec>>,
    free_specs: Vec<usize>,
    open_pending: bool,
    follow_ups_pending: u64,
    arrivals: u64,
    out: Outcome,
    scratch: Vec<Spec>,
    news: Vec<Option<(usize, share::News)>>,
    free_news: Vec<usize>,
    /// Continuations waiting for a replica to take them ([`resume`]).
    held: std::collections::VecDeque<resume::Held>,
    /// The continuations (and warm-ups) sent to each replica still without a first token, with
    /// the limit per replica: the dispatch core's gate, as the gateway keeps it.
    gate: kvgate_core::dispatch::ContinuationGate,
    /// Ids for the text a broken stream had generated, resent in its continuation.
    generated: UniqueTokens,
    /// Per session, its last turn (the prompt its router sent) and where it ended: the dispatch
    /// core's re-homing record, as the gateway keeps it ([`rehome`]).
    last_turn: kvgate_core::dispatch::RehomeBook<u64, Vec<u32>>,
    /// Warm-ups by request id, and what each warms.
    warmups: std::collections::HashMap<u64, rehome::Warmup>,
    /// Each router's admission gate ([`admission`]).
    gates: Vec<admission::Gate>,
    /// When each request that waited at its gate was sent.
    sent: std::collections::BTreeMap<u64, Nanos>,
    /// A gate is handing out slots (a send that fails at once must not start another round).
    granting: bool,
}

/// Router `r`'s random seed in a fleet seeded by `seed`.
fn router_seed(seed: u64, r: usize) -> u64 {
    seed ^ (0x726f_7574_6572 + r as u64)
}

/// How many KV-event entries a router keeps per endpoint: the largest engine's blocks.
fn engine_event_entries(config: &FleetConfig) -> usize {
    let blocks = config.replicas.iter().map(|r| r.engine.kv_blocks);
    blocks.max().unwrap_or(0)
}

fn align(t: Nanos, quantum: u64) -> Nanos {
    if quantum == 0 {
        t
    } else {
        Nanos(t.0.div_ceil(quantum) * quantum)
    }
}

impl<'c> Sim<'c> {
    fn new(config: &'c FleetConfig, seed: u64) -> Self {
        let n = config.replicas.len();
        let replicas = config
            .replicas
            .iter()
            .map(|r| Replica {
                engine: EngineModel::new(r.engine)
                    .with_token_events(false)
                    .with_kv_events(config.kv_events)
                    .with_oracle(config.oracle),
                speed: if r.speed > 0.0 { r.speed } else { 1.0 },
                quantum: r.engine.cost.quantum_ns,
                pending: None,
                stepping: false,
                busy_until: Nanos::ZERO,
                alive: true,
                streams: vec![0; config.routers.max(1)],
                kv_seq: 0,
            })
            .collect();
        let routers = (0..config.routers.max(1))
            .map(|r| {
                let mut routing =
                    Dispatcher::new(&config.dispatch, &config.policy, router_seed(seed, r));
                if config.kv_events {
                    routing = routing.with_engine_events(engine_event_entries(config));
                }
                // The static weight is the configured one, else the replica's relative speed
                // (the operator knows it).
                for (i, rc) in config.replicas.iter().enumerate() {
                    let speed = if rc.speed > 0.0 { rc.speed } else { 1.0 };
                    let spec = MemberSpec {
                        weight: rc.weight.unwrap_or(speed),
                        tier: rc.tier,
                        ..MemberSpec::default()
                    };
                    routing.add(EndpointId(i as u32), &spec, Nanos::ZERO);
                }
                routing
            })
            .collect();
        Sim {
            config,
            now: Nanos::ZERO,
            queue: BinaryHeap::new(),
            seq: 0,
            replicas,
            routers,
            specs: Vec::new(),
            free_specs: Vec::new(),
            open_pending: false,
            follow_ups_pending: 0,
            arrivals: 0,
            out: Outcome::new(n),
            scratch: Vec::new(),
            news: Vec::new(),
            free_news: Vec::new(),
            held: Default::default(),
            gate: kvgate_core::dispatch::ContinuationGate::new(config.resume.unwrap_or(0)),
            generated: UniqueTokens::starting_at(resume::GENERATED_IDS),
            last_turn: rehome::book(config),
            warmups: Default::default(),
            gates: (0..config.routers.max(1))
                .map(|_| Default::default())
                .collect(),
            sent: Default::default(),
            granting: false,
        }
    }

    fn push(&mut self, at: Nanos, kind: Kind, payload: u64) {
        self.seq += 1;
        self.queue.push(Reverse((at, kind, self.seq, payload)));
    }

    fn push_spec(&mut self, spec: Spec, open: bool) {
        let at = spec.arrival.max(self.now);
        let slot = match self.free_specs.pop() {
            Some(i) => {
                self.specs[i] = Some(spec);
                i
            }
            None => {
                self.specs.push(Some(spec));
                self.specs.len() - 1
            }
        };
        self.push(at, Kind::Arrival, ((slot as u64) << 1) | u64::from(open));
    }

    /// Whether anything can still happen besides periodic bookkeeping.
    fn live(&self) -> bool {
        self.open_pending || self.follow_ups_pending > 0 || self.out.in_flight > 0
    }

    fn run_keeping(
        mut self,
        workload: &mut dyn Workload,
        rng: &mut ChaCha8Rng,
    ) -> (Outcome, Option<kvgate_core::dispatch::trace::Trace>) {
        if let Some(spec) = workload.next_open(rng) {
            self.open_pending = true;
            self.push_spec(spec, true);
        }
        let interval = self.config.scrape_interval;
        if interval > Nanos::ZERO {
            let m = self.routers.len() as u64;
            for r in 0..m {
                let phase = if self.config.staggered {
                    Nanos(interval.0 * r / m)
                } else {
                    Nanos::ZERO
                };
                self.push(phase, Kind::Scrape, r);
            }
        }
        if self.config.maintain_interval > Nanos::ZERO {
            self.push(self.config.maintain_interval, Kind::Maintain, 0);
        }
        if self.config.sample_interval > Nanos::ZERO {
            self.push(Nanos::ZERO, Kind::Sample, 0);
        }
        for f in self.config.failures.clone() {
            self.push(f.at, Kind::Fail, f.replica as u64);
        }
        while let Some(Reverse((at, kind, _, payload))) = self.queue.pop() {
            if self.config.horizon.is_some_and(|h| at > h) {
                break;
            }
            self.now = at;
            match kind {
                Kind::Step => self.step(payload as usize, workload, rng),
                Kind::Scrape => {
                    self.scrape(payload as usize);
                    if self.live() {
                        self.push(at + interval, Kind::Scrape, payload);
                    }
                }
                Kind::Maintain => {
                    for r in &mut self.routers {
                        r.maintain(at);
                    }
                    if self.live() {
                        self.push(at + self.config.maintain_interval, Kind::Maintain, 0);
                    }
                }
                Kind::Sample => {
                    self.sample();
                    if self.live() {
                        self.push(at + self.config.sample_interval, Kind::Sample, 0);
                    }
                }
                Kind::Arrival => self.arrive(payload, workload, rng),
                Kind::Fail => self.fail(payload as usize, workload, rng),
                Kind::Rehome => {
                    self.rehome(payload as u32);
                    self.release();
                }
                Kind::News => self.hear(payload as usize),
                Kind::Expire => self.expire(payload, workload, rng),
            }
        }
        for (i, r) in self.replicas.iter().enumerate() {
            let s = r.engine.stats();
            let o = &mut self.out.replicas[i];
            o.prefix_queries_tokens = s.prefix_queries_tokens;
            o.prefix_hits_tokens = s.prefix_hits_tokens;
            o.preemptions = s.preemptions;
        }
        self.forget_warmups();
        let trace = self.routers.first_mut().and_then(Dispatcher::take_trace);
        (self.out, trace)
    }

    fn scrape(&mut self, router: usize) {
        let now = self.now;
        let kv_signal = self.config.kv_signal;
        let r = &mut self.routers[router];
        for (i, replica) in self.replicas.iter().enumerate() {
            if !replica.alive {
                continue;
            }
            let s = replica.engine.stats();
            let kv_usage = match kv_signal {
                KvSignal::Referenced => s.kv_usage,
                KvSignal::Uncached if s.total_blocks == 0 => 0.0,
                KvSignal::Uncached => s.uncached_blocks as f64 / s.total_blocks as f64,
            };
            let obs = Observation {
                running: s.running,
                waiting: s.waiting,
                kv_usage,
                free_blocks: Some(s.free_blocks),
                total_blocks: Some(s.total_blocks),
                block_size: Some(replica.engine.config().block_size as u32),
            };
            r.observed(EndpointId(i as u32), obs, now);
        }
    }

    fn sample(&mut self) {
        let mut lo = u32::MAX;
        let mut hi = 0;
        for r in self.replicas.iter().filter(|r| r.alive) {
            let s = r.engine.stats();
            let load = s.running + s.waiting;
            lo = lo.min(load);
            hi = hi.max(load);
        }
        self.out.skew.add(f64::from(hi.saturating_sub(lo)));
    }

    fn arrive(&mut self, payload: u64, workload: &mut dyn Workload, rng: &mut ChaCha8Rng) {
        let slot = (payload >> 1) as usize;
        let spec = self.specs[slot].take().expect("pending spec");
        self.free_specs.push(slot);
        let now = self.now;
        if payload & 1 == 1 {
            // Pull the next open arrival lazily.
            match workload.next_open(rng) {
                Some(next) => self.push_spec(next, true),
                None => self.open_pending = false,
            }
        } else {
            self.follow_ups_pending -= 1;
        }
        self.arrivals += 1;
        if !self.open_pending && payload & 1 == 1 {
            self.out.last_arrival = now;
            self.out.output_before_last_arrival = self.out.output_tokens;
        }
        self.dispatch(spec, workload, rng);
    }

    fn dispatch(&mut self, spec: Spec, workload: &mut dyn Workload, rng: &mut ChaCha8Rng) {
        let id = self.out.records.len() as u64;
        let router = (self.arrivals as usize - 1) % self.routers.len();
        self.out.records.push(RequestRecord {
            arrival: spec.arrival,
            first_token: None,
            finished: None,
            replica: 0,
            router: router as u32,
            prompt_tokens: spec.tokens.len() as u32,
            cached_tokens: 0,
            output_tokens: 0,
            tag: spec.tag,
            tenant: spec.tenant,
            session: spec.session,
            retries: 0,
            failed: false,
            predicted_ttft_ms: None,
            predicted_cached: None,
            resumed: None,
        });
        self.remember_turn(id, spec.session, &spec.tokens);
        self.admit(id, spec.tokens, spec.output, workload, rng);
    }

    fn step(&mut self, i: usize, workload: &mut dyn Workload, rng: &mut ChaCha8Rng) {
        if !self.replicas[i].alive {
            return;
        }
        if let Some(it) = self.replicas[i].pending.take() {
            self.deliver(i, it, workload, rng);
        }
        let replica = &mut self.replicas[i];
        let Some(mut it) = replica.engine.step() else {
            replica.stepping = false;
            return;
        };
        it.duration = Nanos((it.duration.0 as f64 / replica.speed).round() as u64);
        let o = &mut self.out.replicas[i];
        o.iterations += 1;
        o.busy = o.busy + it.duration;
        if it.prefill_tokens > 0 {
            o.prefill_busy = o.prefill_busy + it.duration;
        }
        o.prefill_tokens += u64::from(it.prefill_tokens);
        if it.output_tokens == 0 {
            o.zero_output_iterations += 1;
        }
        o.slot_fill_sum += f64::from(it.scheduled_seqs)
            / self.config.replicas[i].engine.max_num_seqs.max(1) as f64;
        let next = self.now + it.duration;
        self.out.end = self.out.end.max(next);
        replica.busy_until = next;
        replica.pending = Some(it);
        self.push(next, Kind::Step, i as u64);
    }

    /// Hands a finished (or failed) request back to the workload and queues its follow-ups.
    fn follow_up(&mut self, tag: u64, workload: &mut dyn Workload, rng: &mut ChaCha8Rng) {
        let mut follow = std::mem::take(&mut self.scratch);
        workload.on_complete(tag, self.now, rng, &mut follow);
        for spec in follow.drain(..) {
            self.follow_ups_pending += 1;
            self.push_spec(spec, false);
        }
        self.scratch = follow;
    }
}

mod admission;
mod deliver;
mod failure;
mod rehome;
mod resume;
mod route;
mod share;

#[cfg(test)]
mod tests;
