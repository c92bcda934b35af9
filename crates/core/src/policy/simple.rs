//! Load-blind rules: random, round robin and smooth weighted round robin.
//!
//! They need no signal and cost O(1) (O(n) for the weighted turn), and they fail exactly where LLM
//! requests differ in work (by two orders of magnitude: prompt times output length): they are the
//! baselines.

use super::{no_route, route_or_reject, Params, Policy, PolicyDoc, Query};
use crate::{Decision, EndpointId, Fleet, LoadConfig, LoadView, Reason, Route};
use rand::{Rng, RngCore};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

const RANDOM_DOC: PolicyDoc = PolicyDoc {
    name: "random",
    summary: "uniform random choice (weight-proportional when weights differ); the baseline",
    params: &[],
};
const ROUND_ROBIN_DOC: PolicyDoc = PolicyDoc {
    name: "round_robin",
    summary: "strict rotation over the routable endpoints",
    params: &[],
};
const WRR_DOC: PolicyDoc = PolicyDoc {
    name: "weighted_round_robin",
    summary: "nginx's smooth weighted round robin over static weights (times the slow-start ramp)",
    params: &[("load", "slow start settings (the ramp scales each weight)")],
};

/// `random` has no parameters.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RandomConfig {}

/// `round_robin` has no parameters.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoundRobinConfig {}

/// `weighted_round_robin` parameters.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WeightedRoundRobinConfig {
    /// Slow start (the ramp scales each endpoint's weight).
    pub load: LoadConfig,
}

impl Params for RandomConfig {
    const DOC: PolicyDoc = RANDOM_DOC;
    fn build(&self) -> Box<dyn crate::Policy> {
        Box::new(RandomPick::new(self.clone()))
    }
}

impl Params for RoundRobinConfig {
    const DOC: PolicyDoc = ROUND_ROBIN_DOC;
    fn build(&self) -> Box<dyn crate::Policy> {
        Box::new(RoundRobin::new(self.clone()))
    }
}

impl Params for WeightedRoundRobinConfig {
    const DOC: PolicyDoc = WRR_DOC;
    fn build(&self) -> Box<dyn crate::Policy> {
        Box::new(WeightedRoundRobin::new(self.clone()))
    }
    fn load(&self) -> Option<&LoadConfig> {
        Some(&self.load)
    }
}

/// Uniform random choice; weight-proportional when static weights differ.
#[derive(Debug)]
pub struct RandomPick;

impl RandomPick {
    /// A new instance.
    pub fn new(_config: RandomConfig) -> Self {
        RandomPick
    }
}

impl Policy for RandomPick {
    fn name(&self) -> &'static str {
        RANDOM_DOC.name
    }

    fn select(&mut self, query: &Query<'_>, rng: &mut dyn RngCore) -> Decision {
        let fleet = query.fleet;
        let eligible = || fleet.eligible_positions().map(|i| &fleet.views()[i]);
        let total: f64 = eligible().map(|e| e.weight.max(0.0)).sum();
        let routable = eligible().count();
        if routable == 0 {
            return no_route(fleet);
        }
        let chosen = if total > 0.0 {
            let mut x = rng.random::<f64>() * total;
            let mut pick = None;
            for e in eligible() {
                pick = Some(e.id);
                x -= e.weight.max(0.0);
                if x < 0.0 {
                    break;
                }
            }
            pick
        } else {
            eligible().nth(rng.random_range(0..routable)).map(|e| e.id)
        };
        route(chosen, Reason::Random, fleet)
    }
}

fn route(endpoint: Option<EndpointId>, reason: Reason, fleet: Fleet<'_>) -> Decision {
    match endpoint {
        Some(endpoint) => Decision::Route(Route { endpoint, reason }),
        None => no_route(fleet),
    }
}

/// Strict rotation over the routable endpoints, in fleet order.
#[derive(Debug, Default)]
pub struct RoundRobin {
    next: usize,
}

impl RoundRobin {
    /// A new instance.
    pub fn new(_config: RoundRobinConfig) -> Self {
        RoundRobin::default()
    }
}

impl Policy for RoundRobin {
    fn name(&self) -> &'static str {
        ROUND_ROBIN_DOC.name
    }

    fn select(&mut self, query: &Query<'_>, _rng: &mut dyn RngCore) -> Decision {
        let fleet = query.fleet;
        let routable = fleet.eligible_positions().count();
        if routable == 0 {
            return no_route(fleet);
        }
        let k = self.next % routable;
        self.next = self.next.wrapping_add(1);
        let chosen = fleet
            .eligible_positions()
            .nth(k)
            .map(|i| fleet.views()[i].id);
        route(chosen, Reason::RoundRobin, fleet)
    }
}

/// nginx's smooth weighted round robin: every pick adds each weight to its endpoint's current
/// value, takes the largest, and subtracts the total from it. Picks interleave in proportion to
/// the weights instead of bunching.
#[derive(Debug, Default)]
pub struct WeightedRoundRobin {
    config: WeightedRoundRobinConfig,
    current: HashMap<EndpointId, f64>,
}

impl WeightedRoundRobin {
    /// A new instance.
    pub fn new(config: WeightedRoundRobinConfig) -> Self {
        WeightedRoundRobin {
            config,
            current: HashMap::new(),
        }
    }
}

/// One step of smooth weighted round robin over `(endpoint, weight)`; returns the chosen index.
pub(super) fn smooth_step(
    current: &mut HashMap<EndpointId, f64>,
    weights: impl Iterator<Item = (usize, EndpointId, f64)>,
) -> Option<(usize, f64)> {
    let mut total = 0.0;
    let mut best: Option<(usize, EndpointId, f64, f64)> = None;
    for (i, id, w) in weights {
        let cur = current.entry(id).or_insert(0.0);
        *cur += w;
        total += w;
        if best.is_none_or(|(_, _, _, b)| *cur > b) {
            best = Some((i, id, w, *cur));
        }
    }
    let (i, id, w, _) = best?;
    if let Some(cur) = current.get_mut(&id) {
        *cur -= total;
    }
    Some((i, w))
}

impl Policy for WeightedRoundRobin {
    fn name(&self) -> &'static str {
        WRR_DOC.name
    }

    fn select(&mut self, query: &Query<'_>, _rng: &mut dyn RngCore) -> Decision {
        let fleet = query.fleet;
        let view = LoadView::new(fleet, &self.config.load, query.now);
        let weights = view
            .routable()
            .map(|i| (i, fleet.views()[i].id, view.effective_weight(i)));
        let picked = smooth_step(&mut self.current, weights);
        route_or_reject(fleet, picked, |weight| Reason::WeightedTurn { weight })
    }

    fn observe(&mut self, event: &crate::Event<'_>) {
        if let crate::Event::EndpointRemoved { endpoint } = event {
            self.current.remove(endpoint);
        }
    }
}
