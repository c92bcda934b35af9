//! A prefill/decode fleet on simulated time: replicas running the engine model, each a prefill,
//! decode or whole-request replica, a router that keeps each session on one decode replica
//! and asks [`kvgate_core::disagg`] where each prompt is prefilled, and the KV link between the
//! pools (a transfer lands on the decode replica `Transfer::seconds` after its prefill ended,
//! and the decode replica then computes only the prompt's last token).
//!
//! The router's view is exact, not scraped: its own queue of uncached prefill tokens per
//! replica, the engine's running sequences, and what each replica holds of a session's last
//! prompt (the replica that last computed or received it). The prices come from the cost model
//! itself (its step overhead, prefill and per-sequence costs), so the comparison is of the
//! modes, not of a learned model's error.

use crate::model::{CostModel, EngineConfig, EngineModel, SeqEvent, SeqRequest};
use crate::workload::{Spec, Workload};
use kvgate_core::disagg::{Candidate, Decider, Prefill, Side};
use kvgate_core::policy::calibration::Coefficients;
use kvgate_core::{EndpointId, Nanos};
use rand::RngCore;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

/// What each replica does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
    Prefill,
    Decode,
}

/// What one request measured.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Measured {
    pub(super) ttft: Option<f64>,
    pub(super) tpot: Option<f64>,
    pub(super) remote: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Arrival(usize),
    Step(usize),
    Transferred(u64),
}

struct Request {
    spec: Spec,
    session: u64,
    arrived: Nanos,
    decode: usize,
    first: Option<Nanos>,
    remote: bool,
    /// Uncached tokens queued at the replica prefilling it, until its first token there.
    queued: (usize, f64),
}

struct Replica {
    engine: EngineModel,
    role: Role,
    busy: bool,
    pending: Vec<SeqEvent>,
    queued: f64,
}

/// The fleet and its run.
pub(super) struct PdFleet {
    now: Nanos,
    queue: BinaryHeap<Reverse<(Nanos, u64, Event)>>,
    seq: u64,
    replicas: Vec<Replica>,
    decider: Decider,
    coefficients: Coefficients,
    /// Arrivals not yet routed, and whether each is the workload's open-loop one (whose
    /// arrival draws the next).
    arrivals: Vec<Option<(Spec, bool)>>,
    requests: BTreeMap<u64, Request>,
    next_id: u64,
    /// Per session: its decode replica, and (replica, tokens) holding its last prompt.
    homes: BTreeMap<u64, (usize, Vec<(usize, usize)>)>,
    decoders: Vec<usize>,
    pub(super) measured: Vec<Measured>,
    pub(super) output_tokens: u64,
}

impl PdFleet {
    pub(super) fn new(engine: EngineConfig, roles: &[Role], decider: Decider) -> Self {
        let cost: CostModel = engine.cost;
        PdFleet {
            now: Nanos::ZERO,
            queue: BinaryHeap::new(),
            seq: 0,
            replicas: roles
                .iter()
                .map(|&role| Replica {
                    engine: EngineModel::new(engine).with_kv_events(false),
                    role,
                    busy: false,
                    pending: Vec::new(),
                    queued: 0.0,
                })
                .collect(),
            decider,
            coefficients: Coefficients {
                fixed: cost.step_overhead_ns / 1e9,
                per_decode: cost.decode_seq_ns / 1e9,
                per_token: cost.prefill_token_ns / 1e9,
                interference: 0.0,
            },
            arrivals: Vec::new(),
            requests: BTreeMap::new(),
            next_id: 1,
            homes: BTreeMap::new(),
            decoders: (0..roles.len())
                .filter(|&i| roles[i] == Role::Decode)
                .collect(),
            measured: Vec::new(),
            output_tokens: 0,
        }
    }

    fn push(&mut self, at: Nanos, event: Event) {
        self.seq += 1;
        self.queue.push(Reverse((at, self.seq, event)));
    }

    fn arrive(&mut self, spec: Spec, open: bool) {
        let at = spec.arrival;
        self.arrivals.push(Some((spec, open)));
        self.push(at, Event::Arrival(self.arrivals.len() - 1));
    }

    /// Runs the workload to its end (its follow-ups arrive when a request finishes); returns
    /// the time of the last event.
    pub(super) fn run(&mut self, workload: &mut dyn Workload, rng: &mut dyn RngCore) -> Nanos {
        if let Some(spec) = workload.next_open(rng) {
            self.arrive(spec, true);
        }
        while let Some(Reverse((at, _, event))) = self.queue.pop() {
            self.now = at;
            match event {
                Event::Arrival(i) => {
                    let (spec, open) = self.arrivals[i].take().expect("arrives once");
                    if open {
                        if let Some(next) = workload.next_open(rng) {
                            self.arrive(next, true);
                        }
                    }
                    self.route(spec);
                }
                Event::Step(r) => self.step_ended(r, workload, rng),
                Event::Transferred(id) => self.transferred(id),
            }
        }
        self.now
    }

    fn held(&self, session: u64, replica: usize) -> u32 {
        self.homes.get(&session).map_or(0, |(_, held)| {
            held.iter()
                .find(|(r, _)| *r == replica)
                .map_or(0, |&(_, n)| n as u32)
        })
    }

    fn side(&self, replica: usize, session: u64) -> Side {
        let r = &self.replicas[replica];
        Side {
            coefficients: self.coefficients,
            queued_tokens: r.queued,
            decodes: f64::from(r.engine.stats().running),
            cached_tokens: self.held(session, replica),
        }
    }

    fn route(&mut self, spec: Spec) {
        // A request without a session is its own.
        let session = spec.session.unwrap_or(u64::MAX - spec.tag);
        let decode = match self.homes.get(&session) {
            Some(&(d, _)) => d,
            None => {
                // A new session goes to the decode replica with the lowest predicted TTFT (its
                // queued prefill and the sequences it runs), as the gateway's `predicted_ttft`
                // picks a decode endpoint. Queued prefill alone left every session of a decode
                // pool that never prefills on its first replica.
                let prompt = spec.tokens.len() as u32;
                let (d, _) = self
                    .decoders
                    .iter()
                    .map(|&r| (r, self.side(r, session).ttft(prompt)))
                    .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)))
                    .expect("a decode replica");
                self.homes.insert(session, (d, Vec::new()));
                d
            }
        };
        let prompt = spec.tokens.len() as u32;
        let candidates: Vec<Candidate> = (0..self.replicas.len())
            .filter(|&r| self.replicas[r].role == Role::Prefill)
            .map(|r| Candidate {
                endpoint: EndpointId(r as u32),
                side: Side {
                    decodes: 0.0,
                    ..self.side(r, session)
                },
            })
            .collect();
        let verdict = self
            .decider
            .decide(prompt, &self.side(decode, session), &candidates);
        let (at, remote) = match verdict.prefill {
            Prefill::Remote(e) => (e.0 as usize, true),
            Prefill::Local => (decode, false),
        };
        let uncached = f64::from(prompt.saturating_sub(self.held(session, at)));
        let id = self.next_id;
        self.next_id += 1;
        let output = if remote { 1 } else { spec.output };
        let seq = SeqRequest {
            id,
            prompt: spec.tokens.clone(),
            max_output_tokens: output,
        };
        self.requests.insert(
            id,
            Request {
                spec,
                session,
                arrived: self.now,
                decode,
                first: None,
                remote,
                queued: (at, uncached),
            },
        );
        self.replicas[at].queued += uncached;
        self.replicas[at].engine.submit(seq);
        self.kick(at);
    }

    fn kick(&mut self, r: usize) {
        if self.replicas[r].busy {
            return;
        }
        if let Some(it) = self.replicas[r].engine.step() {
            let replica = &mut self.replicas[r];
            replica.busy = true;
            replica.pending = it.events;
            self.output_tokens += u64::from(it.output_tokens);
            let at = self.now + it.duration.max(Nanos(1));
            self.push(at, Event::Step(r));
        }
    }

    fn step_ended(&mut self, r: usize, workload: &mut dyn Workload, rng: &mut dyn RngCore) {
        self.replicas[r].busy = false;
        for event in std::mem::take(&mut self.replicas[r].pending) {
            match event {
                SeqEvent::FirstToken { id, .. } => self.first_token(r, id),
                SeqEvent::Finished { id, output_tokens } => {
                    self.finished(r, id, output_tokens, workload, rng)
                }
                _ => {}
            }
        }
        self.kick(r);
    }

    fn first_token(&mut self, r: usize, id: u64) {
        let Some(req) = self.requests.get_mut(&id) else {
            return;
        };
        let (at, tokens) = std::mem::replace(&mut req.queued, (r, 0.0));
        self.replicas[at].queued = (self.replicas[at].queued - tokens).max(0.0);
        let leg_is_prefill = req.remote && self.replicas[r].role == Role::Prefill;
        if !leg_is_prefill && req.first.is_none() {
            req.first = Some(self.now);
        }
    }

    fn finished(
        &mut self,
        r: usize,
        id: u64,
        output: u32,
        workload: &mut dyn Workload,
        rng: &mut dyn RngCore,
    ) {
        let Some(req) = self.requests.get(&id) else {
            return;
        };
        let session = req.session;
        let prompt = req.spec.tokens.len();
        if req.remote && self.replicas[r].role == Role::Prefill {
            // The prefill leg: the decode replica receives the KV it lacks over the link.
            let lacking = (prompt as u32).saturating_sub(self.held(session, req.decode));
            let secs = self.decider.config().transfer.seconds(lacking);
            self.remember(session, r, prompt);
            self.push(
                self.now + Nanos::from_secs_f64(secs),
                Event::Transferred(id),
            );
            return;
        }
        let req = self.requests.remove(&id).expect("present");
        self.remember(session, r, prompt);
        let ttft = req.first.map(|f| (f - req.arrived).as_secs_f64() * 1e3);
        let tpot = req
            .first
            .filter(|_| output > 1)
            .map(|f| (self.now - f).as_secs_f64() * 1e3 / f64::from(output - 1));
        self.measured.push(Measured {
            ttft,
            tpot,
            remote: req.remote,
        });
        let mut next = Vec::new();
        workload.on_complete(req.spec.tag, self.now, rng, &mut next);
        for spec in next {
            self.arrive(spec, false);
        }
    }

    /// Replica `r` now holds the session's prompt of `tokens` tokens (it computed or received
    /// it); an older prompt elsewhere is a prefix of it, still held.
    fn remember(&mut self, session: u64, r: usize, tokens: usize) {
        if let Some((_, held)) = self.homes.get_mut(&session) {
            match held.iter_mut().find(|(x, _)| *x == r) {
                Some(h) => h.1 = tokens,
                None => held.push((r, tokens)),
            }
        }
    }

    fn transferred(&mut self, id: u64) {
        let Some(req) = self.requests.get_mut(&id) else {
            return;
        };
        let d = req.decode;
        req.queued = (d, 0.0);
        let seq = SeqRequest {
            id,
            prompt: req.spec.tokens.clone(),
            max_output_tokens: req.spec.output,
        };
        let transferred = seq.prompt.len() as u32;
        self.replicas[d].engine.submit_transferred(seq, transferred);
        self.kick(d);
    }

    /// Prefix-cache hits over lookups, every replica.
    pub(super) fn cache_hit_ratio(&self) -> Option<f64> {
        let (mut hits, mut queries) = (0u64, 0u64);
        for r in &self.replicas {
            let s = r.engine.stats();
            hits += s.prefix_hits_tokens;
            queries += s.prefix_queries_tokens;
        }
        (queries > 0).then(|| hits as f64 / queries as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvgate_core::disagg::{Config, Mode};
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    /// `n` one-turn sessions, 50 ms apart, each with a prompt of its own.
    struct OneTurn {
        n: u64,
        next: u64,
    }

    impl Workload for OneTurn {
        fn next_open(&mut self, _: &mut dyn RngCore) -> Option<Spec> {
            let session = self.next;
            if session == self.n {
                return None;
            }
            self.next += 1;
            let base = (session as u32) << 20;
            Some(Spec {
                arrival: Nanos::from_millis(50 * session),
                tokens: (0..2_000).map(|i| base | i).collect(),
                output: 100,
                tenant: None,
                session: Some(session),
                tag: session,
            })
        }
    }

    fn fleet(mode: Mode, roles: &[Role]) -> PdFleet {
        let engine = super::super::engine(16_384);
        let decider = Decider::new(Config {
            mode,
            ..Config::default()
        });
        PdFleet::new(engine, roles, decider)
    }

    /// With every prefill sent away a decode replica's queued prefill is always empty; sessions
    /// must still spread over the decode pool by what each replica runs.
    #[test]
    fn sessions_spread_over_a_decode_pool_that_never_prefills() {
        use Role::{Decode, Prefill};
        let mut f = fleet(Mode::Always, &[Prefill, Prefill, Decode, Decode]);
        f.run(
            &mut OneTurn { n: 40, next: 0 },
            &mut ChaCha8Rng::seed_from_u64(1),
        );
        let mut per_decoder = BTreeMap::new();
        for (decode, _) in f.homes.values() {
            *per_decoder.entry(*decode).or_insert(0) += 1;
        }
        assert_eq!(per_decoder.len(), 2, "{per_decoder:?}");
        assert!(per_decoder.values().all(|&n| n >= 10), "{per_decoder:?}");
        assert_eq!(f.measured.len(), 40);
        assert!(f.measured.iter().all(|m| m.remote));
    }
}
