//! Load-blind rules: random, round robin and smooth weighted round robin.
//!
//! They need no signal and cost O(1) (O(n) for the weighted turn), and they fail exactly where
//! LLM requests differ in work (DOMAIN.md §1, §4): they are the baselines.

use super::{no_route, route_or_reject, Policy, PolicyDoc};
use crate::{
    Decision, EndpointId, EndpointView, LoadConfig, LoadView, Nanos, Reason, Request, Route,
};
use rand::{Rng, RngCore};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

pub(super) const RANDOM_DOC: PolicyDoc = PolicyDoc {
    name: "random",
    summary: "uniform random choice (weight-proportional when weights differ); the baseline",
    params: &[],
};
pub(super) const ROUND_ROBIN_DOC: PolicyDoc = PolicyDoc {
    name: "round_robin",
    summary: "strict rotation over the routable endpoints",
    params: &[],
};
pub(super) const WRR_DOC: PolicyDoc = PolicyDoc {
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

    fn select(
        &mut self,
        _request: &Request,
        fleet: &[EndpointView],
        _now: Nanos,
        rng: &mut dyn RngCore,
    ) -> Decision {
        let total: f64 = fleet
            .iter()
            .filter(|e| e.is_routable())
            .map(|e| e.weight.max(0.0))
            .sum();
        let routable = fleet.iter().filter(|e| e.is_routable()).count();
        if routable == 0 {
            return no_route(fleet);
        }
        let chosen = if total > 0.0 {
            let mut x = rng.random::<f64>() * total;
            let mut pick = None;
            for e in fleet.iter().filter(|e| e.is_routable()) {
                pick = Some(e.id);
                x -= e.weight.max(0.0);
                if x < 0.0 {
                    break;
                }
            }
            pick
        } else {
            fleet
                .iter()
                .filter(|e| e.is_routable())
                .nth(rng.random_range(0..routable))
                .map(|e| e.id)
        };
        route(chosen, Reason::Random, fleet)
    }
}

fn route(endpoint: Option<EndpointId>, reason: Reason, fleet: &[EndpointView]) -> Decision {
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

    fn select(
        &mut self,
        _request: &Request,
        fleet: &[EndpointView],
        _now: Nanos,
        _rng: &mut dyn RngCore,
    ) -> Decision {
        let routable = fleet.iter().filter(|e| e.is_routable()).count();
        if routable == 0 {
            return no_route(fleet);
        }
        let k = self.next % routable;
        self.next = self.next.wrapping_add(1);
        let chosen = fleet
            .iter()
            .filter(|e| e.is_routable())
            .nth(k)
            .map(|e| e.id);
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

    fn select(
        &mut self,
        _request: &Request,
        fleet: &[EndpointView],
        now: Nanos,
        _rng: &mut dyn RngCore,
    ) -> Decision {
        let view = LoadView::new(fleet, &self.config.load, now);
        let weights = view
            .routable()
            .map(|i| (i, fleet[i].id, view.effective_weight(i)));
        let picked = smooth_step(&mut self.current, weights);
        route_or_reject(fleet, picked, |weight| Reason::WeightedTurn { weight })
    }

    fn observe(&mut self, event: &crate::Event<'_>) {
        if let crate::Event::EndpointRemoved { endpoint } = event {
            self.current.remove(endpoint);
        }
    }
}
