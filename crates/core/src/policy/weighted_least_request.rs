//! Envoy's weighted least request (Envoy docs, "Load balancers: weighted least request").
//!
//! With equal weights Envoy samples `choice_count` endpoints and takes the one with fewest
//! active requests (P2C). With unequal weights it schedules by dynamic weight
//! `weight / (active_requests + 1)^active_request_bias`: bias 1 divides capacity by load, bias
//! 0 ignores load (plain weighted round robin). kvgate schedules those weights with smooth
//! weighted round robin, as Envoy does with its earliest-deadline-first scheduler, and counts
//! active requests with the stale-corrected load signal.

use super::least::least_of_sample;
use super::simple::smooth_step;
use super::{check, route_or_reject, Params, Policy, PolicyDoc, Query};
use crate::{Decision, EndpointId, LoadConfig, LoadView, Reason};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

const DOC: PolicyDoc = PolicyDoc {
    name: "weighted_least_request",
    summary: "Envoy: weight / (active + 1)^bias with unequal weights, P2C with equal ones",
    params: &[
        (
            "active_request_bias",
            "exponent of (active + 1); 0 = weighted round robin",
        ),
        ("choice_count", "endpoints sampled when weights are equal"),
        ("load", "stale-signal handling"),
    ],
};

/// `weighted_least_request` parameters; defaults are Envoy's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Exponent of `(active + 1)`.
    pub active_request_bias: f64,
    /// Endpoints sampled when weights are equal.
    pub choice_count: usize,
    /// Stale-signal handling.
    pub load: LoadConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            active_request_bias: 1.0,
            choice_count: 2,
            load: LoadConfig::default(),
        }
    }
}

impl Params for Config {
    const DOC: PolicyDoc = DOC;
    fn build(&self) -> Box<dyn Policy> {
        Box::new(WeightedLeastRequest::new(self.clone()))
    }
    fn load(&self) -> Option<&LoadConfig> {
        Some(&self.load)
    }
    fn validate(&self) -> Result<(), (&'static str, &'static str)> {
        check(self.choice_count >= 1, "choice_count", "must be at least 1")?;
        check(
            self.active_request_bias >= 0.0,
            "active_request_bias",
            "must not be negative",
        )
    }
}

/// Envoy's dynamic weight: `weight / (active + 1)^bias`.
pub fn envoy_weight(weight: f64, active: f64, bias: f64) -> f64 {
    if bias == 0.0 {
        weight
    } else if bias == 1.0 {
        weight / (active + 1.0)
    } else {
        weight / (active + 1.0).powf(bias)
    }
}

/// Envoy's weighted least request.
#[derive(Debug)]
pub struct WeightedLeastRequest {
    config: Config,
    current: HashMap<EndpointId, f64>,
    scratch: Vec<usize>,
}

impl WeightedLeastRequest {
    /// A new instance.
    pub fn new(config: Config) -> Self {
        WeightedLeastRequest {
            config,
            current: HashMap::new(),
            scratch: Vec::new(),
        }
    }
}

impl Policy for WeightedLeastRequest {
    fn name(&self) -> &'static str {
        DOC.name
    }

    fn select(&mut self, query: &Query<'_>, rng: &mut dyn RngCore) -> Decision {
        let fleet = query.fleet;
        let view = LoadView::new(fleet, &self.config.load, query.now);
        let mut weights = view.routable().map(|i| view.effective_weight(i));
        let first = weights.next();
        let equal = weights.all(|w| Some(w) == first);
        let bias = self.config.active_request_bias;
        let picked = if equal {
            least_of_sample(
                &view,
                self.config.choice_count,
                &mut self.scratch,
                rng,
                |i| view.load(i),
            )
            .map(|(i, load)| (i, envoy_weight(view.effective_weight(i), load, bias)))
        } else {
            let dynamic = view.routable().map(|i| {
                (
                    i,
                    fleet.views()[i].id,
                    envoy_weight(view.effective_weight(i), view.load(i), bias),
                )
            });
            smooth_step(&mut self.current, dynamic)
        };
        route_or_reject(fleet, picked, |weight| Reason::WeightedLeastRequest {
            weight,
        })
    }

    fn observe(&mut self, event: &crate::Event<'_>) {
        if let crate::Event::EndpointRemoved { endpoint } = event {
            self.current.remove(endpoint);
        }
    }
}
