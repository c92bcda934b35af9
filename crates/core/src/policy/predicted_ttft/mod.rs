//! kvgate's own rule: send each request where its first token is predicted to come soonest.
//!
//! For every eligible endpoint:
//!
//! ```text
//! cached   = what the prefix index knows it holds of this prompt, plus what an earlier
//!            dispatch there is still prefilling: engines cache a block as they schedule it
//!            (vLLM v1) or hold back a request sharing a prefix with one in the batch (SGLang),
//!            so a fan-out's sibling queued behind the first call finds the whole prefix cached
//! own      = prompt tokens - cached
//! queued   = uncached prefill work this router sent there that is predicted not computed yet:
//!            each dispatch adds its own tokens, the backlog drains at the endpoint's learned
//!            prefill rate, and a first token clears everything sent before it (engines admit
//!            first come, first served)
//! phase    = what is left of the endpoint's iteration in progress, read off the streams this
//!            router relays ([`Cadence`]): an arrival waits for it before the scheduler sees it
//! slot     = the wait for a batch slot when the engine runs as many sequences as it can
//!            ([`slots`]): a slot frees as a running sequence finishes
//! ttft     = phase + slot + fixed + per_decode * decodes
//!            + (queued + own) * (per_token + interference * decodes)
//! ```
//! and the pick minimises that plus the delay its own prefill imposes on the queue it joins,
//! weighted by `externality_weight` (ties at random); copying a shared prefix that a burst is
//! queueing for is exempt from that term ([`sessions`]), and while no replica's cache evicts, a
//! shared prefix one replica alone holds may go to a second where no prefill waits, as if it
//! were cached there ([`second_copy`]). `fixed`, `per_token` and `interference` are learned per
//! endpoint from every first token (less its phase) and the engine's usage ([`calibration`]),
//! starting from the fleet's pooled fit. There is no balance threshold: beyond its second copy
//! a hot prefix spreads to another replica exactly when recomputing it there, counting what the
//! duplicated prefill costs the queue it joins, is predicted faster than queueing at home, and
//! a slower replica gets work only while its shorter queue makes up for its speed.
//!
//! The index it consults mirrors each engine's cache (`mirror_engines`): bounded by the KV
//! capacity the engine reports, and corrected when usage shows a predicted hit missed. Prompt
//! token estimates (four bytes per token from text) are scaled by the ratio the engine's usage
//! reports. A request for a LoRA adapter adds what it waits for the adapter beyond the queue
//! ([`adapters`]: the adapter's load where a slot is free, the drain of another adapter's batch
//! where none is). Load signals go through [`LoadView`]: blackout and slow start apply as to every
//! load-reading policy (a slow-starting endpoint's prediction is divided by its factor).

mod adapters;
pub mod calibration;
mod observe;
mod prediction;
mod queue;
mod second_copy;
mod sessions;
mod slots;

use super::{check, no_route, Params, Policy, PolicyDoc, Query};
use crate::fasthash::IntMap;
use crate::index::{IndexSpec, TreeKey};
use crate::{Decision, EndpointId, Event, LoadConfig, LoadView, Nanos, Reason, Route};
use calibration::{Calibration, Coefficients};
use prediction::{Observed, Pending, Prediction, Scrape};
use queue::Queue;
use rand::RngCore;
use second_copy::SoleHolder;
use serde::{Deserialize, Serialize};
use sessions::Sessions;

const DOC: PolicyDoc = PolicyDoc {
    name: "predicted_ttft",
    summary:
        "earliest predicted first token: queued + uncached prefill at a learned per-replica speed",
    params: &[
        (
            "prior_prefill_tokens_per_second",
            "prefill speed assumed before any sample",
        ),
        (
            "prior_fixed_ms",
            "fixed time to first token assumed before any sample",
        ),
        ("calibration_secs", "time constant over which samples fade"),
        (
            "prior_strength",
            "pseudo-samples pulling the fleet's fit towards the prior (a quarter of them each endpoint's speed towards the fleet)",
        ),
        (
            "key",
            "text, tokens or auto (tokens when the request has them)",
        ),
        (
            "max_tree_size",
            "index bound per endpoint until the engine reports its KV capacity",
        ),
        (
            "mirror_engines",
            "bound the index by engine KV capacity and correct it from usage",
        ),
        ("share_across_tenants", "let tenants share cache affinity"),
        (
            "externality_weight",
            "weight of the delay a request's prefill imposes on the queue behind it",
        ),
        (
            "replicate_shared_prefixes",
            "copy a shared prefix in concurrent demand free of the externality charge",
        ),
        (
            "second_copies",
            "give a shared prefix one replica alone holds a second, while no cache evicts",
        ),
        (
            "lora_aware",
            "price a LoRA adapter's load and the stall behind other adapters' batches",
        ),
        (
            "lora_load_ms",
            "time to load an adapter an engine does not run",
        ),
        (
            "lora_stall_ms",
            "wait for another adapter's batch to drain when every adapter slot is taken",
        ),
        ("load", "stale-signal handling"),
    ],
};

/// `predicted_ttft` parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Prefill speed assumed before any sample (an ~8B model on one H100 does about 8,000).
    pub prior_prefill_tokens_per_second: f64,
    /// Fixed time to first token assumed before any sample.
    pub prior_fixed_ms: f64,
    /// Time constant over which calibration samples fade.
    pub calibration_secs: f64,
    /// Pseudo-samples pulling the fleet's fit towards the prior; a quarter of them pull each
    /// endpoint's speed factor towards the fleet.
    pub prior_strength: f64,
    /// Text or token keys for the index.
    pub key: TreeKey,
    /// Index bound per endpoint (symbols) until the engine reports its KV capacity.
    pub max_tree_size: usize,
    /// Bound the index by each engine's KV capacity and correct it from usage.
    pub mirror_engines: bool,
    /// Let tenants share cache affinity.
    pub share_across_tenants: bool,
    /// Weight of the externality term, the delay a request's prefill imposes on the requests
    /// queued behind it (ρ/(1-ρ) of its prefill time, M/M/1). Agentic traffic is burstier than
    /// Poisson, so the M/M/1 figure understates that delay (Kingman's G/G/1 approximation
    /// scales it by (c_a² + c_s²)/2). 3 measured best over `kvgate sim`'s failure-mode sweeps
    /// (5 seeds each, against 2 and 4: 2 fell below `cache_aware` on the heterogeneous sweep, 4
    /// held fan-out bursts too long and lost 3% there; docs/routing.md has the table); on the
    /// engine model corrected to cache blocks as they are scheduled, 3 is the highest of 1.5 to
    /// 4 or within 1.7% of it on every sweep;
    /// measuring Kingman's factor from the dispatches instead put fan-out bursts at ~15 and
    /// lost a third of their capacity.
    pub externality_weight: f64,
    /// Exempt from the externality the duplicated prefill of a prefix other sessions share
    /// that a request is prefilling now ([`sessions`]): hot system prompts spread to more
    /// replicas. On `kvgate sim`'s sweeps (5 seeds) +5% capacity on fan-out and +4% on many
    /// tenants, the other scenarios within ±1% (docs/routing.md).
    pub replicate_shared_prefixes: bool,
    /// Let a request take a shared prefix that one replica alone holds to a replica with no
    /// prefill queued as if it were cached there, while no replica's cache has had to evict
    /// ([`second_copy`]). On the classic shared-prefix benchmark through the gateway: 35 req/s
    /// against 30 without (docs/routing.md).
    pub second_copies: bool,
    /// Price LoRA adapters ([`adapters`]): off, a request for an adapter is predicted as if
    /// every engine ran it (adapter-blind).
    pub lora_aware: bool,
    /// Time to load an adapter into an engine's batch slots: the emulated engine's
    /// `--lora-load-ms` default (a rank-8 to rank-16 adapter read from local disk).
    pub lora_load_ms: f64,
    /// The wait for another adapter's batch to drain where every slot is taken: about one
    /// request's decode on the default engine model (128 output tokens at 12 ms per iteration).
    pub lora_stall_ms: f64,
    /// Stale-signal handling.
    pub load: LoadConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            prior_prefill_tokens_per_second: 8_000.0,
            prior_fixed_ms: 20.0,
            calibration_secs: 60.0,
            prior_strength: 20.0,
            key: TreeKey::Auto,
            max_tree_size: 67_108_864,
            mirror_engines: true,
            share_across_tenants: false,
            externality_weight: 3.0,
            replicate_shared_prefixes: true,
            second_copies: true,
            lora_aware: true,
            lora_load_ms: 100.0,
            lora_stall_ms: 1_500.0,
            load: LoadConfig::default(),
        }
    }
}

impl Params for Config {
    const DOC: PolicyDoc = DOC;
    fn build(&self) -> Box<dyn Policy> {
        Box::new(PredictedTtft::new(self.clone()))
    }
    fn load(&self) -> Option<&LoadConfig> {
        Some(&self.load)
    }
    fn validate(&self) -> Result<(), (&'static str, &'static str)> {
        check(
            self.prior_prefill_tokens_per_second > 0.0,
            "prior_prefill_tokens_per_second",
            "must be positive",
        )?;
        check(
            self.prior_fixed_ms >= 0.0,
            "prior_fixed_ms",
            "must not be negative",
        )?;
        check(
            self.calibration_secs > 0.0,
            "calibration_secs",
            "must be positive",
        )?;
        check(
            self.prior_strength > 0.0,
            "prior_strength",
            "must be positive",
        )?;
        check(
            self.externality_weight >= 0.0 && self.externality_weight.is_finite(),
            "externality_weight",
            "must be a finite number, not negative",
        )?;
        check(
            self.lora_load_ms >= 0.0
                && self.lora_load_ms.is_finite()
                && self.lora_stall_ms >= 0.0
                && self.lora_stall_ms.is_finite(),
            "lora_load_ms",
            "lora_load_ms and lora_stall_ms must be finite numbers, not negative",
        )?;
        check(
            self.max_tree_size >= 1,
            "max_tree_size",
            "must be at least 1",
        )
    }
    fn index(&self) -> Option<IndexSpec> {
        Some(IndexSpec::Radix {
            key: self.key,
            max_size: self.max_tree_size,
            eviction_interval: Nanos::from_secs(60),
            share_across_tenants: self.share_across_tenants,
            mirror_engines: self.mirror_engines,
        })
    }
}

/// The predicted-TTFT policy. See the module documentation.
#[derive(Debug)]
pub struct PredictedTtft {
    config: Config,
    calibration: Calibration,
    queues: IntMap<EndpointId, Queue>,
    pending: IntMap<(u64, EndpointId), Pending>,
    /// Engine prompt tokens per estimated token, learned from usage.
    token_ratio: f64,
    predictions: Vec<Option<Prediction>>,
    /// The last pick (request, endpoint) and the phase and slot wait it predicted there, which
    /// its [`Event::Dispatched`] records: the event carries no view of the endpoint.
    chosen: Option<(u64, EndpointId, f64)>,
    /// The last pick's predictions as decision-record scores, milliseconds.
    scores: Vec<(usize, f64)>,
    sessions: Sessions,
    adapters: adapters::SentAdapters,
}

impl PredictedTtft {
    /// A new instance.
    pub fn new(config: Config) -> Self {
        let prior = Coefficients {
            fixed: config.prior_fixed_ms / 1e3,
            per_decode: 0.0,
            per_token: 1.0 / config.prior_prefill_tokens_per_second,
            interference: 0.0,
        };
        PredictedTtft {
            calibration: Calibration::new(
                prior,
                Nanos::from_secs_f64(config.calibration_secs),
                config.prior_strength,
            ),
            config,
            queues: IntMap::default(),
            pending: IntMap::default(),
            token_ratio: 1.0,
            predictions: Vec::new(),
            chosen: None,
            scores: Vec::new(),
            sessions: Sessions::default(),
            adapters: adapters::SentAdapters::default(),
        }
    }

    fn prompt_tokens(&self, estimate: u32) -> f64 {
        (f64::from(estimate) * self.token_ratio).max(1.0)
    }

    /// The shared prefix this request may take to a second replica ([`second_copy`]): only
    /// while no replica's cache has had to evict (a copy then displaces nothing). The caller
    /// asks only for a request that names no session or starts one (a session's later
    /// requests stay with their history).
    fn second_copy(
        &self,
        query: &Query<'_>,
        predictions: &[Option<Prediction>],
        prompt: f64,
    ) -> Option<SoleHolder> {
        let overlaps = query.overlaps;
        if !self.config.second_copies || overlaps.evicted {
            return None;
        }
        let shared = f64::from(overlaps.tokens(overlaps.shared, prompt as u32));
        SoleHolder::of(predictions.iter().flatten().map(|p| p.held), shared)
    }
}

impl Policy for PredictedTtft {
    fn name(&self) -> &'static str {
        DOC.name
    }

    fn select(&mut self, query: &Query<'_>, rng: &mut dyn RngCore) -> Decision {
        let (fleet, now) = (query.fleet, query.now);
        let load = self.config.load.clone();
        let view = LoadView::new(fleet, &load, now);
        let prompt = self.prompt_tokens(query.request.prompt_tokens);
        let mut predictions = std::mem::take(&mut self.predictions);
        predictions.clear();
        predictions.resize(fleet.len(), None);
        let running_at = self.running_at(query, &view);
        for i in view.routable() {
            let e = &fleet.views()[i];
            let scrape = match (view.is_fresh(i), e.observation) {
                (true, Some(o)) => Some(Scrape {
                    running: o.running,
                    waiting: o.waiting,
                    at: e.observed_at,
                    own_since: e.own_since_observation,
                }),
                _ => None,
            };
            let phase = e
                .cadence
                .and_then(|c| c.remaining(now))
                .map_or(0.0, Nanos::as_secs_f64);
            let observed = Observed {
                scrape,
                block_size: e.observation.and_then(|o| o.block_size),
            };
            let mut p = self.predict(e.id, query.overlaps, prompt, observed, phase, now);
            p.ttft += self.adapter_wait(query, e, &running_at);
            predictions[i] = Some(p);
        }
        self.scores.clear();
        self.scores.extend(view.routable().filter_map(|i| {
            let p = predictions[i]?;
            Some((i, p.ttft / view.slow_start_factor(i) * 1e3))
        }));
        let weight = self.config.externality_weight;
        // The externality is priced in the fleet's prefill time, not the endpoint's: a slow
        // replica's slowness is already in its predicted TTFT, and charging its queue again per
        // token pushed work off the slow replicas past the point where their spare capacity was
        // worth it (the sim's heterogeneous sweep, 5 seeds: 19.5 -> 20.3 req/s).
        let pooled = self.calibration.fleet(now);
        let key = Sessions::key(query.request);
        let home = key.and_then(|k| self.sessions.home(k, now));
        let replicable = if self.config.replicate_shared_prefixes {
            let held = predictions.iter().flatten().map(|p| p.held);
            sessions::replicable(held, home, key.is_some())
        } else {
            0.0
        };
        let second = if home.is_none() {
            self.second_copy(query, &predictions, prompt)
        } else {
            None
        };
        let picked = view.argmin_by(rng, |i| {
            predictions[i].map_or(f64::INFINITY, |p| {
                let seconds_per_token = pooled.seconds_per_token(p.decodes);
                if let Some(cost) = second.and_then(|s| s.cost(&p, seconds_per_token, weight)) {
                    return cost / view.slow_start_factor(i);
                }
                let copied = (replicable - (prompt - p.own)).clamp(0.0, p.own - 1.0);
                let work = (p.own - copied) * seconds_per_token;
                let cost = p.ttft + weight * p.externality * work;
                cost / view.slow_start_factor(i)
            })
        });
        let decision = match picked {
            Some((i, _)) => {
                let id = fleet.views()[i].id;
                let p = predictions[i].expect("eligible endpoints are predicted");
                self.chosen = Some((query.request.id, id, p.remaining));
                Decision::Route(Route {
                    endpoint: id,
                    reason: Reason::PredictedTtft {
                        ttft_ms: p.ttft / view.slow_start_factor(i) * 1e3,
                        cached_tokens: (prompt - p.own).max(0.0) as u32,
                    },
                })
            }
            None => no_route(fleet),
        };
        self.predictions = predictions;
        decision
    }

    fn last_scores(&self) -> Option<(&'static str, &[(usize, f64)])> {
        Some(("predicted_ttft_ms", &self.scores))
    }

    fn model(&mut self, endpoint: EndpointId, now: Nanos) -> Option<super::EndpointModel> {
        let c = self.calibration.coefficients(endpoint.0, now);
        Some(super::EndpointModel {
            prefill_tokens_per_second: 1.0 / c.per_token,
            fixed_seconds: c.fixed,
            speed_factor: self.calibration.factor(endpoint.0, now),
            samples: self.calibration.samples(endpoint.0, now),
        })
    }

    fn observe(&mut self, event: &Event<'_>) {
        match *event {
            Event::Dispatched {
                request,
                endpoint,
                at,
                overlaps,
            } => {
                if let Some(adapter) = &request.adapter {
                    self.adapters.dispatched(endpoint, adapter, at);
                }
                self.dispatched(request, endpoint, at, overlaps);
            }
            Event::FirstToken {
                request,
                endpoint,
                ttft,
                at,
            } => self.first_token(request, endpoint, ttft, at),
            Event::Usage {
                request,
                endpoint,
                at,
                usage,
            } => self.usage_reported(request, endpoint, at, &usage),
            Event::Completed {
                request,
                endpoint,
                at,
                latency,
                ..
            } => self.completed(request, endpoint, at, latency),
            Event::Failed {
                request,
                endpoint,
                at,
                ..
            } => self.finish(request, endpoint, at),
            Event::EndpointRemoved { endpoint } => {
                self.queues.remove(&endpoint);
                self.adapters.remove(endpoint);
                self.calibration.remove(endpoint.0);
                self.pending.retain(|&(_, e), _| e != endpoint);
            }
            Event::Kv { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests;
