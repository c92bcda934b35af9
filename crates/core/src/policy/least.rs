//! Load-aware rules over the stale-corrected load signal: least outstanding (full scan), power
//! of d choices, and least KV usage.
//!
//! Least outstanding counts waiting + running + our own dispatches since the scrape: every
//! accepted-but-unfinished request. Power of two choices (Azar et al. 1994, Mitzenmacher 1996)
//! samples `d` endpoints and takes the less loaded, which resists herding on a stale snapshot.
//! Least KV usage is the cautionary tale: waiting requests hold no KV blocks, so it herds onto
//! replicas with deep queues (the routing lab's worst row, docs/background.md#routing-lab).

use super::{check, route_or_reject, Params, Policy, PolicyDoc, Query};
use crate::{Decision, LoadConfig, LoadView, Reason};
use rand::RngCore;
use serde::{Deserialize, Serialize};

const LEAST_OUTSTANDING_DOC: PolicyDoc = PolicyDoc {
    name: "least_outstanding",
    summary: "fewest waiting + running + own dispatches since the scrape (full scan)",
    params: super::LOAD_PARAMS,
};
const POWER_OF_TWO_DOC: PolicyDoc = PolicyDoc {
    name: "power_of_two",
    summary: "least outstanding of d random endpoints (Mitzenmacher); resists herding",
    params: &[
        ("choices", "how many endpoints to sample (d)"),
        super::LOAD_PARAMS[0],
    ],
};
const LEAST_KV_DOC: PolicyDoc = PolicyDoc {
    name: "least_kv",
    summary: "lowest KV cache usage; blind to waiting requests (the reference's failure case)",
    params: super::LOAD_PARAMS,
};

/// `least_outstanding` parameters.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LeastOutstandingConfig {
    /// Stale-signal handling.
    pub load: LoadConfig,
}

/// `power_of_two` parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PowerOfTwoConfig {
    /// Endpoints sampled per pick (d); 2 captures nearly all the benefit (d > 2 gains 1/ln d).
    pub choices: usize,
    /// Stale-signal handling.
    pub load: LoadConfig,
}

impl Default for PowerOfTwoConfig {
    fn default() -> Self {
        PowerOfTwoConfig {
            choices: 2,
            load: LoadConfig::default(),
        }
    }
}

/// `least_kv` parameters.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LeastKvConfig {
    /// Stale-signal handling (expiry and blackout; KV usage has no own-dispatch correction).
    pub load: LoadConfig,
}

impl Params for LeastOutstandingConfig {
    const DOC: PolicyDoc = LEAST_OUTSTANDING_DOC;
    fn build(&self) -> Box<dyn Policy> {
        Box::new(LeastOutstanding::new(self.clone()))
    }
    fn load(&self) -> Option<&LoadConfig> {
        Some(&self.load)
    }
}

impl Params for PowerOfTwoConfig {
    const DOC: PolicyDoc = POWER_OF_TWO_DOC;
    fn build(&self) -> Box<dyn Policy> {
        Box::new(PowerOfTwo::new(self.clone()))
    }
    fn load(&self) -> Option<&LoadConfig> {
        Some(&self.load)
    }
    fn validate(&self) -> Result<(), (&'static str, &'static str)> {
        check(self.choices >= 1, "choices", "must be at least 1")
    }
}

impl Params for LeastKvConfig {
    const DOC: PolicyDoc = LEAST_KV_DOC;
    fn build(&self) -> Box<dyn Policy> {
        Box::new(LeastKv::new(self.clone()))
    }
    fn load(&self) -> Option<&LoadConfig> {
        Some(&self.load)
    }
}

/// Fewest outstanding requests, full scan, random tie-break.
#[derive(Debug)]
pub struct LeastOutstanding {
    config: LeastOutstandingConfig,
}

impl LeastOutstanding {
    /// A new instance.
    pub fn new(config: LeastOutstandingConfig) -> Self {
        LeastOutstanding { config }
    }
}

impl Policy for LeastOutstanding {
    fn name(&self) -> &'static str {
        LEAST_OUTSTANDING_DOC.name
    }

    fn select(&mut self, query: &Query<'_>, rng: &mut dyn RngCore) -> Decision {
        let fleet = query.fleet;
        let view = LoadView::new(fleet, &self.config.load, query.now);
        route_or_reject(fleet, view.least_loaded(rng), |load| Reason::LeastLoaded {
            load,
        })
    }
}

/// The least loaded of `choices` distinct random routable endpoints.
#[derive(Debug)]
pub struct PowerOfTwo {
    config: PowerOfTwoConfig,
    routable: Vec<usize>,
}

impl PowerOfTwo {
    /// A new instance.
    pub fn new(config: PowerOfTwoConfig) -> Self {
        PowerOfTwo {
            config,
            routable: Vec::new(),
        }
    }
}

/// Samples `d` distinct routable endpoints and returns the least loaded with its load.
pub(super) fn least_of_sample(
    view: &LoadView<'_>,
    d: usize,
    scratch: &mut Vec<usize>,
    rng: &mut dyn RngCore,
    score: impl Fn(usize) -> f64,
) -> Option<(usize, f64)> {
    scratch.clear();
    scratch.extend(view.routable());
    if scratch.is_empty() {
        return None;
    }
    let d = d.clamp(1, scratch.len());
    let mut best: Option<(usize, f64)> = None;
    for k in rand::seq::index::sample(rng, scratch.len(), d) {
        let i = scratch[k];
        let s = score(i);
        if best.is_none_or(|(_, b)| s < b) {
            best = Some((i, s));
        }
    }
    best
}

impl Policy for PowerOfTwo {
    fn name(&self) -> &'static str {
        POWER_OF_TWO_DOC.name
    }

    fn select(&mut self, query: &Query<'_>, rng: &mut dyn RngCore) -> Decision {
        let fleet = query.fleet;
        let view = LoadView::new(fleet, &self.config.load, query.now);
        let d = self.config.choices;
        let picked = least_of_sample(&view, d, &mut self.routable, rng, |i| view.ranked_load(i));
        let sampled = d.min(self.routable.len());
        route_or_reject(fleet, picked, |load| Reason::PowerOfChoices {
            sampled,
            load,
        })
    }
}

/// Lowest reported KV cache usage, random tie-break.
#[derive(Debug)]
pub struct LeastKv {
    config: LeastKvConfig,
}

impl LeastKv {
    /// A new instance.
    pub fn new(config: LeastKvConfig) -> Self {
        LeastKv { config }
    }
}

impl Policy for LeastKv {
    fn name(&self) -> &'static str {
        LEAST_KV_DOC.name
    }

    fn select(&mut self, query: &Query<'_>, rng: &mut dyn RngCore) -> Decision {
        let fleet = query.fleet;
        let view = LoadView::new(fleet, &self.config.load, query.now);
        let picked = view.argmin_by(rng, |i| view.kv_usage(i));
        route_or_reject(fleet, picked, |usage| Reason::LeastKv { usage })
    }
}
