//! A prefill/decode fleet on simulated time: replicas running the engine model, each a prefill,
//! decode or whole-request replica, a router that keeps each session on one decode replica
//! and asks [`kvgate_core::disagg`] where each prompt is prefilled, and the KV link between the
//! pools (a transfer lands on the decode replica `Transfer::seconds` after its prefill ended,
//! and the decode replica then computes only the prompt's last token).
//!
//! The router's view is exact, not scraped: its own queue of uncached prefill tokens per
//! replica, the engine's running sequences, and what each replica's cache holds of a prompt
//! (the engine's own blocks, a tenant's system prompt as much as a session's context, as the
//! gateway's prefix index tracks both). The prices come from the cost model
//! itself (its step overhead, prefill and per-sequence costs), so the comparison is of the
//! modes, not of a learned model's error.

use crate::model::{chained_hashes, CostModel, EngineConfig, EngineModel, SeqEvent, SeqRequest};
use crate::workload::{Spec, Workload};
use kvgate_core::disagg::{Candidate, Decider, Prefill, Side};
use kvgate_core::policy::calibration::Coefficients;
use kvgate_core::{EndpointId, Nanos};
use rand::RngCore;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashSet};

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
    /// A session's first request's TTFT floor in ms ([`PdFleet::floor`]).
    pub(super) floor: Option<f64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Arrival(usize),
    Step(usize),
    Transferred(u64),
}

struct Request {
    spec: Spec,
    arrived: Nanos,
    decode: usize,
    first: Option<Nanos>,
    remote: bool,
    floor: Option<f64>,
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
    /// Per session: its decode replica.
    homes: BTreeMap<u64, usize>,
    decoders: Vec<usize>,
    pub(super) measured: Vec<Measured>,
    pub(super) output_tokens: u64,
    /// The chained hashes of every block of every prompt that arrived.
    seen: HashSet<u64>,
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
                    engine: EngineModel::new(engine)
                        .with_kv_events(false)
                        .with_oracle(true),
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
            seen: HashSet::new(),
        }
    }

    /// The least time to a first token any router could give a session's opening `prompt`:
    /// the prefill, alone on an idle replica, of its tokens past the longest prefix (in whole
    /// blocks, as engines cache) of any prompt that arrived before it. Engines admit in arrival
    /// order, so no placement, split or mode has these tokens cached anywhere when this prompt
    /// is prefilled, and every mode's TTFT of this request is at least this; a later turn's floor is counted as 0 (an engine may hold the answer it generated),
    /// so the floors' percentiles bound every mode's from below.
    fn floor(&mut self, prompt: &[u32]) -> f64 {
        const BLOCK: usize = 16;
        let mut cached = 0;
        for (i, chain) in chained_hashes(prompt, BLOCK).into_iter().enumerate() {
            if cached == i * BLOCK && self.seen.contains(&chain) {
                cached += BLOCK;
            }
            self.seen.insert(chain);
        }
        self.coefficients
            .predict((prompt.len() - cached) as f64, 0.0)
            * 1e3
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
                    let floor = self.floor(&spec.tokens);
                    if open {
                        if let Some(next) = workload.next_open(rng) {
                            self.arrive(next, true);
                        }
                    }
                    self.route(spec, open.then_some(floor));
                }
                Event::Step(r) => self.step_ended(r, workload, rng),
                Event::Transferred(id) => self.transferred(id),
            }
        }
        self.now
    }

    fn held(&self, replica: usize, prompt: &[u32]) -> u32 {
        self.replicas[replica].engine.oracle_cached_tokens(prompt)
    }

    fn side(&self, replica: usize, prompt: &[u32]) -> Side {
        let r = &self.replicas[replica];
        Side {
            coefficients: self.coefficients,
            queued_tokens: r.queued,
            decodes: f64::from(r.engine.stats().running),
            cached_tokens: self.held(replica, prompt),
        }
    }

    fn route(&mut self, spec: Spec, floor: Option<f64>) {
        // A request without a session is its own.
        let session = spec.session.unwrap_or(u64::MAX - spec.tag);
        let prompt = spec.tokens.len() as u32;
        let decode = match self.homes.get(&session) {
            Some(&d) => d,
            None => {
                // A new session goes to the decode replica with the lowest predicted TTFT (its
                // queued prefill, the sequences it runs and what it holds of the prompt), as
                // the gateway's `predicted_ttft` picks a decode endpoint. Queued prefill alone
                // left every session of a decode pool that never prefills on its first replica.
                let (d, _) = self
                    .decoders
                    .iter()
                    .map(|&r| (r, self.side(r, &spec.tokens).ttft(prompt)))
                    .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)))
                    .expect("a decode replica");
                self.homes.insert(session, d);
                d
            }
        };
        let candidates: Vec<Candidate> = (0..self.replicas.len())
            .filter(|&r| self.replicas[r].role == Role::Prefill)
            .map(|r| Candidate {
                endpoint: EndpointId(r as u32),
                side: Side {
                    decodes: 0.0,
                    ..self.side(r, &spec.tokens)
                },
            })
            .collect();
        let verdict = self
            .decider
            .decide(prompt, &self.side(decode, &spec.tokens), &candidates);
        let (at, remote) = match verdict.prefill {
            Prefill::Remote(e) => (e.0 as usize, true),
            Prefill::Local => (decode, false),
        };
        let uncached = f64::from(prompt.saturating_sub(self.held(at, &spec.tokens)));
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
                arrived: self.now,
                decode,
                first: None,
                remote,
                floor,
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
        let prompt = req.spec.tokens.len() as u32;
        if req.remote && self.replicas[r].role == Role::Prefill {
            // The prefill leg: the decode replica receives the KV it lacks over the link.
            let lacking = prompt.saturating_sub(self.held(req.decode, &req.spec.tokens));
            let secs = self.decider.config().transfer.seconds(lacking);
            self.push(
                self.now + Nanos::from_secs_f64(secs),
                Event::Transferred(id),
            );
            return;
        }
        let req = self.requests.remove(&id).expect("present");
        let ttft = req.first.map(|f| (f - req.arrived).as_secs_f64() * 1e3);
        let tpot = req
            .first
            .filter(|_| output > 1)
            .map(|f| (self.now - f).as_secs_f64() * 1e3 / f64::from(output - 1));
        self.measured.push(Measured {
            ttft,
            tpot,
            remote: req.remote,
            floor: req.floor,
        });
        let mut next = Vec::new();
        workload.on_complete(req.spec.tag, self.now, rng, &mut next);
        for spec in next {
            self.arrive(spec, false);
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
        for decode in f.homes.values() {
            *per_decoder.entry(*decode).or_insert(0) += 1;
        }
        assert_eq!(per_decoder.len(), 2, "{per_decoder:?}");
        assert!(per_decoder.values().all(|&n| n >= 10), "{per_decoder:?}");
        assert_eq!(f.measured.len(), 40);
        assert!(f.measured.iter().all(|m| m.remote));
    }

    #[test]
    fn a_floor_prices_only_the_blocks_no_earlier_prompt_had() {
        let mut f = fleet(Mode::Never, &[Role::Decode]);
        let ms = |tokens: f64| f.coefficients.predict(tokens, 0.0) * 1e3;
        let (first, fresh_tail, again) = (ms(64.0), ms(20.0), ms(0.0));
        assert_eq!(f.floor(&(0..64).collect::<Vec<_>>()), first);
        // Three whole blocks shared, then one new block and a partial one.
        let tail: Vec<u32> = (0..48).chain(1_000..1_020).collect();
        assert_eq!(f.floor(&tail), fresh_tail);
        assert_eq!(f.floor(&(0..64).collect::<Vec<_>>()), again);
        // A shared block after a differing one is not a prefix.
        let shifted: Vec<u32> = (1_000..1_016).chain(16..64).collect();
        assert_eq!(f.floor(&shifted), first);
    }
}
