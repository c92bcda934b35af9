//! NVIDIA Dynamo's KV router cost (Dynamo docs, "Router guide", cost function), in KV blocks:
//!
//! ```text
//! credit   = device_overlap * device_credit + host_overlap * 0.75 + disk_overlap * 0.25
//! cost     = prefill_load_scale * max(prefill_blocks - credit, 0)
//!          + potential_decode_blocks + decode_active_request_weight * active_requests
//! device_credit = overlap_score_credit / (1 + decay * normalized_excess_prefill)
//! ```
//! `router_temperature = 0` takes the argmin; above 0 it samples a softmax over the costs
//! normalised to `[0, 1]`, which keeps many routers from herding on one snapshot.
//!
//! Where the reference leaves details open, kvgate's reading is:
//! - `prefill_blocks` are the request's blocks (the larger of its full-block count and
//!   `ceil(prompt_tokens / block_size)`);
//! - `potential_decode_blocks` are the blocks the requests this router has in flight on the
//!   endpoint add there, as Dynamo's router tracks its active sequences itself: a request's
//!   prefix already held there is not counted again (Dynamo counts unique blocks). Neither
//!   every in-flight prompt's full length nor the scraped KV usage is used: both count the
//!   shared prefix of a hot conversation once per request (or count cached and long-decoding
//!   context that costs no prefill), which made the home of a hot prefix look busiest in
//!   proportion to its hits and sent its requests away (in `kvgate sim --scenario mix` that cut
//!   the prefix hit ratio from ~90% to 78%);
//! - `normalized_excess_prefill` is the endpoint's pending prefill (blocks of its dispatched
//!   requests that have not produced a first token) above the fleet minimum, divided by this
//!   request's prefill blocks: a cache hit behind a deep prefill queue earns less credit.
//!
//! The overlap comes from a block index (the router's [`crate::index::PrefixCache`]): fed by
//! engine KV events when `use_kv_events`, else by this router's dispatches with a TTL (Dynamo's
//! approximate indexer, 120 s).

use super::{check, no_route, Params, Policy, PolicyDoc, Query};
use crate::index::{IndexSpec, Overlap, Overlaps, Unit};
use crate::{Decision, EndpointId, Event, LoadConfig, LoadView, Nanos, Reason, Request, Route};
use rand::{Rng, RngCore};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

const DOC: PolicyDoc = PolicyDoc {
    name: "kv_cost",
    summary: "Dynamo's block cost: prefill blocks less overlap credit, plus decode blocks; argmin or softmax",
    params: &[
        ("block_size", "tokens per KV block"),
        ("overlap_score_credit", "credit per device-resident overlapping block"),
        ("host_cache_hit_weight", "credit per host-memory block"),
        ("disk_cache_hit_weight", "credit per disk block"),
        ("prefill_load_scale", "weight of the uncached prefill blocks"),
        ("decode_active_request_weight", "weight of the active request count"),
        ("overlap_credit_decay", "shrinks device credit on endpoints with excess pending prefill"),
        ("router_temperature", "0 = argmin; > 0 samples a softmax over normalised costs"),
        ("use_kv_events", "index fed by engine KV events instead of own dispatches"),
        ("approx_ttl_secs", "lifetime of dispatch-inserted index entries"),
        ("share_across_tenants", "let tenants share cache affinity"),
        ("load", "stale-signal handling"),
    ],
};

/// `kv_cost` parameters; defaults are Dynamo's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Tokens per KV block.
    pub block_size: usize,
    /// Credit per device-resident overlapping block (Dynamo `overlap_score_weight`).
    pub overlap_score_credit: f64,
    /// Credit per host-memory block.
    pub host_cache_hit_weight: f64,
    /// Credit per disk block.
    pub disk_cache_hit_weight: f64,
    /// Weight of uncached prefill blocks.
    pub prefill_load_scale: f64,
    /// Weight of the active request count.
    pub decode_active_request_weight: f64,
    /// Decay of device credit with excess pending prefill; 0 disables it.
    pub overlap_credit_decay: f64,
    /// Softmax temperature; 0 takes the argmin.
    pub router_temperature: f64,
    /// Feed the index from engine KV events instead of own dispatches.
    pub use_kv_events: bool,
    /// Lifetime of dispatch-inserted entries.
    pub approx_ttl_secs: u64,
    /// Let tenants share cache affinity.
    pub share_across_tenants: bool,
    /// Stale-signal handling.
    pub load: LoadConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            block_size: 16,
            overlap_score_credit: 1.0,
            host_cache_hit_weight: 0.75,
            disk_cache_hit_weight: 0.25,
            prefill_load_scale: 1.0,
            decode_active_request_weight: 0.0,
            overlap_credit_decay: 0.0,
            router_temperature: 0.0,
            use_kv_events: false,
            approx_ttl_secs: 120,
            share_across_tenants: false,
            load: LoadConfig::default(),
        }
    }
}

impl Params for Config {
    const DOC: PolicyDoc = DOC;
    fn build(&self) -> Box<dyn Policy> {
        Box::new(KvCost::new(self.clone()))
    }
    fn load(&self) -> Option<&LoadConfig> {
        Some(&self.load)
    }
    fn validate(&self) -> Result<(), (&'static str, &'static str)> {
        check(self.block_size >= 1, "block_size", "must be at least 1")?;
        check(
            self.router_temperature >= 0.0,
            "router_temperature",
            "must not be negative",
        )
    }
    fn index(&self) -> Option<IndexSpec> {
        Some(IndexSpec::Blocks {
            block_size: self.block_size,
            ttl: (!self.use_kv_events).then(|| Nanos::from_secs(self.approx_ttl_secs)),
            share_across_tenants: self.share_across_tenants,
        })
    }
}

/// One endpoint's inputs to the cost formula.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CostInputs {
    /// The request's prefill blocks.
    pub prefill_blocks: f64,
    /// Overlapping blocks per tier.
    pub overlap: Overlap,
    /// Blocks the endpoint will be decoding.
    pub decode_blocks: f64,
    /// Active requests.
    pub active_requests: f64,
    /// Pending prefill above the fleet minimum, over this request's prefill blocks.
    pub normalized_excess_prefill: f64,
}

impl Config {
    /// The cost of sending a request with `inputs` to one endpoint.
    pub fn cost(&self, x: &CostInputs) -> f64 {
        let device_credit = self.overlap_score_credit
            / (1.0 + self.overlap_credit_decay * x.normalized_excess_prefill);
        let credit = f64::from(x.overlap.device) * device_credit
            + f64::from(x.overlap.host) * self.host_cache_hit_weight
            + f64::from(x.overlap.disk) * self.disk_cache_hit_weight;
        let adjusted_prefill = (x.prefill_blocks - credit).max(0.0);
        self.prefill_load_scale * adjusted_prefill
            + x.decode_blocks
            + self.decode_active_request_weight * x.active_requests
    }
}

#[derive(Clone, Copy, Debug)]
struct Active {
    endpoint: EndpointId,
    blocks: f64,
    prefilling: bool,
}

#[derive(Clone, Copy, Debug, Default)]
struct EndpointBlocks {
    active: f64,
    prefill: f64,
}

/// The Dynamo-style cost policy.
#[derive(Debug)]
pub struct KvCost {
    config: Config,
    /// Keyed by (request, endpoint): a hedged request is in flight on two endpoints at once.
    active: HashMap<(u64, EndpointId), Active>,
    per_endpoint: HashMap<EndpointId, EndpointBlocks>,
    costs: Vec<(usize, f64)>,
}

impl KvCost {
    /// A new instance.
    pub fn new(config: Config) -> Self {
        KvCost {
            config,
            active: HashMap::new(),
            per_endpoint: HashMap::new(),
            costs: Vec::new(),
        }
    }

    /// The request's prefill blocks: its full hashed blocks or its estimated length in blocks,
    /// whichever is larger.
    fn request_blocks(&self, request: &Request, overlaps: &Overlaps) -> f64 {
        let by_len = (request.prompt_tokens as usize).div_ceil(self.config.block_size);
        let hashed = self.blocks(overlaps, request, overlaps.total);
        (by_len as f64).max(hashed)
    }

    /// `units` of the index as blocks of this policy's size: a block index counts blocks, an
    /// index laid over by engine KV events counts tokens.
    fn blocks(&self, overlaps: &Overlaps, request: &Request, units: u32) -> f64 {
        match overlaps.unit {
            Unit::Blocks(_) => f64::from(units),
            _ => {
                f64::from(overlaps.tokens(units, request.prompt_tokens))
                    / self.config.block_size.max(1) as f64
            }
        }
    }

    fn overlap_in_blocks(&self, overlaps: &Overlaps, request: &Request, id: EndpointId) -> Overlap {
        let o = overlaps.of(id);
        if let Unit::Blocks(_) = overlaps.unit {
            return o;
        }
        let b = |units: u32| self.blocks(overlaps, request, units).floor() as u32;
        Overlap {
            device: b(o.device),
            host: b(o.host),
            disk: b(o.disk),
            pending: b(o.pending),
            ..o
        }
    }

    fn finish(&mut self, request: u64, endpoint: EndpointId) {
        if let Some(a) = self.active.remove(&(request, endpoint)) {
            let e = self.per_endpoint.entry(a.endpoint).or_default();
            e.active = (e.active - a.blocks).max(0.0);
            if a.prefilling {
                e.prefill = (e.prefill - a.blocks).max(0.0);
            }
        }
    }
}

impl Policy for KvCost {
    fn name(&self) -> &'static str {
        DOC.name
    }

    fn select(&mut self, query: &Query<'_>, rng: &mut dyn RngCore) -> Decision {
        let fleet = query.fleet;
        let views = fleet.views();
        let view = LoadView::new(fleet, &self.config.load, query.now);
        let overlaps = query.overlaps;
        let prefill_blocks = self.request_blocks(query.request, overlaps);
        let pending: Vec<EndpointBlocks> = views
            .iter()
            .map(|e| self.per_endpoint.get(&e.id).copied().unwrap_or_default())
            .collect();
        let min_pending = view
            .routable()
            .map(|i| pending[i].prefill)
            .fold(f64::INFINITY, f64::min);
        self.costs.clear();
        for i in view.routable() {
            let e = &views[i];
            let own = pending[i];
            let inputs = CostInputs {
                prefill_blocks,
                overlap: self.overlap_in_blocks(overlaps, query.request, e.id),
                decode_blocks: own.active,
                active_requests: view.load(i),
                normalized_excess_prefill: (own.prefill - min_pending) / prefill_blocks.max(1.0),
            };
            let cost = self.config.cost(&inputs) / view.slow_start_factor(i);
            self.costs.push((i, cost));
        }
        if self.costs.is_empty() {
            return no_route(fleet);
        }
        let (i, reason) = if self.config.router_temperature > 0.0 {
            let (i, cost) = softmax_sample(&self.costs, self.config.router_temperature, rng);
            (i, Reason::SampledCost { cost })
        } else {
            let (i, cost) = argmin(&self.costs, rng);
            (i, Reason::LeastCost { cost })
        };
        Decision::Route(Route {
            endpoint: views[i].id,
            reason,
        })
    }

    fn last_scores(&self) -> Option<(&'static str, &[(usize, f64)])> {
        Some(("cost", &self.costs))
    }

    fn observe(&mut self, event: &Event<'_>) {
        match *event {
            Event::Dispatched {
                request,
                endpoint,
                overlaps,
                ..
            } => {
                // The blocks this request adds there: a prefix it shares with what the
                // endpoint holds is counted once, as Dynamo's active-block tracking counts
                // unique blocks. Counting every request's whole prompt made the home of a hot
                // prefix look loaded in proportion to its hits, and pushed its requests away.
                let shared = f64::from(self.overlap_in_blocks(overlaps, request, endpoint).total());
                let blocks = (self.request_blocks(request, overlaps) - shared).max(1.0);
                self.finish(request.id, endpoint);
                self.active.insert(
                    (request.id, endpoint),
                    Active {
                        endpoint,
                        blocks,
                        prefilling: true,
                    },
                );
                let e = self.per_endpoint.entry(endpoint).or_default();
                e.active += blocks;
                e.prefill += blocks;
            }
            Event::FirstToken {
                request, endpoint, ..
            } => {
                if let Some(a) = self.active.get_mut(&(request, endpoint)) {
                    if a.prefilling {
                        a.prefilling = false;
                        let e = self.per_endpoint.entry(a.endpoint).or_default();
                        e.prefill = (e.prefill - a.blocks).max(0.0);
                    }
                }
            }
            Event::Completed {
                request, endpoint, ..
            }
            | Event::Failed {
                request, endpoint, ..
            } => {
                self.finish(request, endpoint);
            }
            Event::EndpointRemoved { endpoint } => {
                self.per_endpoint.remove(&endpoint);
                self.active.retain(|_, a| a.endpoint != endpoint);
            }
            Event::Kv { .. } | Event::Usage { .. } => {}
        }
    }
}

/// The lowest cost, ties broken uniformly at random. `costs` is not empty.
fn argmin(costs: &[(usize, f64)], rng: &mut dyn RngCore) -> (usize, f64) {
    let mut best = costs[0];
    let mut ties = 1u32;
    for &(i, c) in &costs[1..] {
        if c < best.1 {
            best = (i, c);
            ties = 1;
        } else if c == best.1 {
            ties += 1;
            if rng.random_range(0..ties) == 0 {
                best = (i, c);
            }
        }
    }
    best
}

/// Samples from `softmax(-normalised cost / temperature)`, costs normalised to `[0, 1]` by the
/// fleet's min and max (equal costs sample uniformly).
fn softmax_sample(costs: &[(usize, f64)], temperature: f64, rng: &mut dyn RngCore) -> (usize, f64) {
    let min = costs.iter().map(|c| c.1).fold(f64::INFINITY, f64::min);
    let max = costs.iter().map(|c| c.1).fold(f64::NEG_INFINITY, f64::max);
    let span = max - min;
    let weight = |c: f64| {
        let norm = if span > 0.0 { (c - min) / span } else { 0.0 };
        (-norm / temperature).exp()
    };
    let total: f64 = costs.iter().map(|c| weight(c.1)).sum();
    let mut x = rng.random::<f64>() * total;
    for &(i, c) in costs {
        x -= weight(c);
        if x < 0.0 {
            return (i, c);
        }
    }
    costs[costs.len() - 1]
}
