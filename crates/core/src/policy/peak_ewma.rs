//! Peak EWMA latency (Finagle's `PeakEwma`, linkerd's and tower's balancers).
//!
//! Each endpoint keeps a latency estimate that jumps up to any slower sample at once ("peak") and
//! otherwise moves towards new samples with weight `exp(-elapsed / decay)`; between samples it
//! decays towards zero with the same time constant, so an endpoint that was slow gets probed again.
//! The cost is `estimate * (in_flight + 1)`, compared over `choices` random endpoints (P2C, as
//! linkerd does; 0 = all). Endpoints without a sample use `default_rtt_ms`. For LLM traffic the
//! sample is the time to first token: streaming delays the completion signal, so end-to-end
//! latency mostly measures output length, not the endpoint. Defaults are linkerd's: decay 10 s, default
//! RTT 30 ms.

use super::least::least_of_sample;
use super::{check, route_or_reject, Params, Policy, PolicyDoc, Query};
use crate::{Decision, EndpointId, EndpointView, Event, LoadConfig, LoadView, Nanos, Reason};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

const DOC: PolicyDoc = PolicyDoc {
    name: "peak_ewma",
    summary: "peak-sensitive latency EWMA times (in-flight + 1), P2C (Finagle, linkerd)",
    params: &[
        ("decay_ms", "EWMA time constant"),
        ("default_rtt_ms", "estimate for endpoints without a sample"),
        ("choices", "endpoints compared per pick; 0 compares all"),
        ("load", "slow start settings"),
    ],
};

/// `peak_ewma` parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// EWMA time constant.
    pub decay_ms: u64,
    /// Estimate for endpoints without a sample.
    pub default_rtt_ms: f64,
    /// Endpoints compared per pick; 0 compares all.
    pub choices: usize,
    /// Slow start settings.
    pub load: LoadConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            decay_ms: 10_000,
            default_rtt_ms: 30.0,
            choices: 2,
            load: LoadConfig::default(),
        }
    }
}

impl Params for Config {
    const DOC: PolicyDoc = DOC;
    fn build(&self) -> Box<dyn Policy> {
        Box::new(PeakEwma::new(self.clone()))
    }
    fn load(&self) -> Option<&LoadConfig> {
        Some(&self.load)
    }
    fn validate(&self) -> Result<(), (&'static str, &'static str)> {
        check(self.decay_ms >= 1, "decay_ms", "must be positive")
    }
}

/// A time-explicit peak-sensitive EWMA.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ewma {
    value_ms: f64,
    at: Nanos,
}

impl Ewma {
    /// Starts at `value_ms` at `at`.
    pub fn new(value_ms: f64, at: Nanos) -> Self {
        Ewma { value_ms, at }
    }

    /// The estimate at `now`, decayed since the last sample.
    pub fn get_at(&self, now: Nanos, decay: Nanos) -> f64 {
        let elapsed = now.saturating_since(self.at).as_secs_f64();
        self.value_ms * (-elapsed / decay.as_secs_f64()).exp()
    }

    /// Adds a sample at `now`.
    pub fn add(&mut self, sample_ms: f64, now: Nanos, decay: Nanos) {
        let current = self.get_at(now, decay);
        self.value_ms = if sample_ms > current {
            sample_ms
        } else {
            let elapsed = now.saturating_since(self.at).as_secs_f64();
            let w = (-elapsed / decay.as_secs_f64()).exp();
            current * w + sample_ms * (1.0 - w)
        };
        self.at = now;
    }
}

/// The peak-EWMA policy.
#[derive(Debug)]
pub struct PeakEwma {
    config: Config,
    estimates: HashMap<EndpointId, Ewma>,
    scratch: Vec<usize>,
}

impl PeakEwma {
    /// A new instance.
    pub fn new(config: Config) -> Self {
        PeakEwma {
            config,
            estimates: HashMap::new(),
            scratch: Vec::new(),
        }
    }

    fn cost(&self, e: &EndpointView, now: Nanos, slow_start: f64) -> f64 {
        let decay = Nanos::from_millis(self.config.decay_ms);
        let rtt = self
            .estimates
            .get(&e.id)
            .map_or(self.config.default_rtt_ms, |x| x.get_at(now, decay));
        rtt * (f64::from(e.own_inflight) + 1.0) / slow_start
    }
}

impl Policy for PeakEwma {
    fn name(&self) -> &'static str {
        DOC.name
    }

    fn select(&mut self, query: &Query<'_>, rng: &mut dyn RngCore) -> Decision {
        let (fleet, now) = (query.fleet, query.now);
        let view = LoadView::new(fleet, &self.config.load, now);
        let choices = if self.config.choices == 0 {
            usize::MAX
        } else {
            self.config.choices
        };
        let mut scratch = std::mem::take(&mut self.scratch);
        let picked = least_of_sample(&view, choices, &mut scratch, rng, |i| {
            self.cost(&fleet.views()[i], now, view.slow_start_factor(i))
        });
        self.scratch = scratch;
        route_or_reject(fleet, picked, |cost_ms| Reason::LowestLatency { cost_ms })
    }

    fn observe(&mut self, event: &Event<'_>) {
        let decay = Nanos::from_millis(self.config.decay_ms);
        match *event {
            Event::FirstToken {
                endpoint, at, ttft, ..
            } => {
                let sample = ttft.as_millis_f64();
                self.estimates
                    .entry(endpoint)
                    .and_modify(|x| x.add(sample, at, decay))
                    .or_insert_with(|| Ewma::new(sample, at));
            }
            Event::EndpointRemoved { endpoint } => {
                self.estimates.remove(&endpoint);
            }
            _ => {}
        }
    }
}
