//! Endpoint-selection policies.
//!
//! A policy is a function of plain data: a borrowed request, a borrowed fleet snapshot, the
//! current time and a random source in; a [`Decision`] with its reason out. It owns its state
//! (`&mut self`), is told what happened afterwards through [`Policy::observe`], and never
//! performs I/O. Eligibility (health, model, endpoints a request already tried) is the caller's
//! predicate in [`Fleet`]; retries, failover and admission live outside policies.
//!
//! Every policy's `Config` has defaults equal to the reference system it imitates (each module
//! names it; docs/background.md has the formulas); [`PolicyConfig`] is the serde-tagged union of
//! them, used by `serve`, `sim` and `bench`.

mod cache_aware;
mod consistent_hash;
mod kv_cost;
mod least;
mod peak_ewma;
mod predicted_ttft;
mod prefix_hash;
mod simple;
mod weighted_least_request;

pub use cache_aware::CacheAware;
pub use consistent_hash::{ConsistentHash, HashKey};
pub use kv_cost::{CostInputs, KvCost};
pub use least::{LeastKv, LeastOutstanding, PowerOfTwo};
pub use peak_ewma::{Ewma, PeakEwma};
pub use predicted_ttft::calibration;
pub use predicted_ttft::PredictedTtft;
pub use prefix_hash::PrefixHash;
pub use simple::{RandomPick, RoundRobin, WeightedRoundRobin};
pub use weighted_least_request::{envoy_weight, WeightedLeastRequest};

use crate::index::{IndexSpec, Overlaps};
use crate::{Decision, Event, Fleet, LoadConfig, Nanos, Rejection, Request};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use std::fmt;

/// What a policy is asked: the request, the fleet with its eligibility predicate, what the
/// prefix cache believes each endpoint holds of this request, and the time.
#[derive(Clone, Copy, Debug)]
pub struct Query<'a> {
    /// The request.
    pub request: &'a Request,
    /// Every member and which may take this request.
    pub fleet: Fleet<'a>,
    /// The prefix cache's overlaps with the request (empty when the policy asks for no index).
    pub overlaps: &'a Overlaps,
    /// Now, on the caller's clock.
    pub now: Nanos,
}

/// The role every selection rule plays.
pub trait Policy: fmt::Debug + Send {
    /// The policy's name as listed by `kvgate policies`.
    fn name(&self) -> &'static str;

    /// Chooses an endpoint among the eligible members of `query.fleet`.
    fn select(&mut self, query: &Query<'_>, rng: &mut dyn RngCore) -> Decision;

    /// Learns what happened after a decision. The default ignores events.
    fn observe(&mut self, _event: &Event<'_>) {}

    /// Periodic upkeep on the owner's clock.
    fn maintain(&mut self, _now: Nanos) {}

    /// Each candidate's score in the last [`Policy::select`], for decision records: the score's
    /// name and `(fleet position, score)` pairs, lower better. `None` for policies whose ranking
    /// the caller sees anyway (matched prefix, load, turn).
    fn last_scores(&self) -> Option<(&'static str, &[(usize, f64)])> {
        None
    }

    /// What the policy has learned about `endpoint` by `now`, for policies that learn a model
    /// of each endpoint (`predicted_ttft`); exported as gauges.
    fn model(&mut self, _endpoint: crate::EndpointId, _now: Nanos) -> Option<EndpointModel> {
        None
    }
}

/// A learned model of one endpoint's speed.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct EndpointModel {
    /// Prefill tokens per second beside an empty decode batch.
    pub prefill_tokens_per_second: f64,
    /// Fixed time to first token, seconds.
    pub fixed_seconds: f64,
    /// How much slower (above 1) than the fleet it is.
    pub speed_factor: f64,
    /// Effective (decayed) samples behind the factor.
    pub samples: f64,
}

/// The rejection for a fleet with no eligible endpoint.
pub(crate) fn no_route(fleet: Fleet<'_>) -> Decision {
    Decision::Reject(if fleet.is_empty() {
        Rejection::NoEndpoints
    } else {
        Rejection::NoRoutableEndpoint
    })
}

/// Routes to the fleet position in `picked` with the reason made from its score, or rejects.
pub(crate) fn route_or_reject(
    fleet: Fleet<'_>,
    picked: Option<(usize, f64)>,
    reason: impl FnOnce(f64) -> crate::Reason,
) -> Decision {
    match picked {
        Some((i, score)) => Decision::Route(crate::Route {
            endpoint: fleet.views()[i].id,
            reason: reason(score),
        }),
        None => no_route(fleet),
    }
}

/// A policy's entry in the catalogue: name, one-line summary, and what each parameter means.
#[derive(Debug, Clone, Copy)]
pub struct PolicyDoc {
    /// The name.
    pub name: &'static str,
    /// One line on what it does and where it comes from.
    pub summary: &'static str,
    /// `(parameter, meaning)` pairs; defaults come from the serialised default config.
    pub params: &'static [(&'static str, &'static str)],
}

const LOAD_PARAMS: &[(&str, &str)] = &[(
    "load",
    "stale-signal handling shared by every load-reading policy (crates/core/src/load.rs)",
)];

/// What every policy's `Config` provides to the registry: its catalogue entry, its checks and
/// how to build the policy. Implementing this and adding one line to [`registry!`] is all a new
/// policy needs.
pub trait Params: Clone + Default + PartialEq + Serialize + for<'de> Deserialize<'de> {
    /// The catalogue entry; `DOC.name` is the `name` tag in configuration files.
    const DOC: PolicyDoc;

    /// Builds the policy.
    fn build(&self) -> Box<dyn Policy>;

    /// The stale-signal settings, for policies that read load.
    fn load(&self) -> Option<&LoadConfig> {
        None
    }

    /// Checks parameter ranges; returns the offending parameter and why.
    fn validate(&self) -> Result<(), (&'static str, &'static str)> {
        Ok(())
    }

    /// The prefix index the policy consults, if any.
    fn index(&self) -> Option<IndexSpec> {
        None
    }
}

/// `Err((param, why))` unless `ok`.
pub(crate) fn check(
    ok: bool,
    param: &'static str,
    why: &'static str,
) -> Result<(), (&'static str, &'static str)> {
    if ok {
        Ok(())
    } else {
        Err((param, why))
    }
}

/// One line per policy: the variant of [`PolicyConfig`] and the `Config` it wraps. Everything
/// else (names, catalogue, validation, building) comes from the config's [`Params`].
macro_rules! registry {
    ($($(#[$doc:meta])* $variant:ident => $module:ident :: $config:ident,)*) => {
        /// Configurations, one module per policy, each with its own `Config`.
        pub mod config {
            $(pub use super::$module::$config as $variant;)*
        }

        /// One policy and its parameters: the `policy` section of kvgate's configuration.
        #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
        #[serde(tag = "name", rename_all = "snake_case")]
        pub enum PolicyConfig {
            $($(#[$doc])* $variant($module::$config),)*
        }

        impl PolicyConfig {
            /// Every policy name, in the order `kvgate policies` lists them.
            pub const NAMES: &'static [&'static str] = &[$(<$module::$config as Params>::DOC.name,)*];

            /// The default configuration of the policy called `name`.
            pub fn default_for(name: &str) -> Option<Self> {
                $(if name == <$module::$config as Params>::DOC.name {
                    return Some(PolicyConfig::$variant(<$module::$config>::default()));
                })*
                None
            }

            /// The catalogue entry.
            pub fn doc(&self) -> PolicyDoc {
                match self { $(PolicyConfig::$variant(_) => <$module::$config as Params>::DOC,)* }
            }

            /// Builds the policy.
            pub fn build(&self) -> Box<dyn Policy> {
                match self { $(PolicyConfig::$variant(c) => c.build(),)* }
            }

            /// The stale-signal settings, for policies that read load.
            pub fn load(&self) -> Option<&LoadConfig> {
                match self { $(PolicyConfig::$variant(c) => c.load(),)* }
            }

            /// The prefix index the policy consults, if any.
            pub fn index(&self) -> Option<IndexSpec> {
                match self { $(PolicyConfig::$variant(c) => c.index(),)* }
            }

            fn check_params(&self) -> Result<(), (&'static str, &'static str)> {
                match self { $(PolicyConfig::$variant(c) => c.validate(),)* }
            }
        }
    };
}

registry! {
    /// Uniform (weight-proportional) random choice.
    Random => simple::RandomConfig,
    /// Strict rotation.
    RoundRobin => simple::RoundRobinConfig,
    /// Smooth weighted round robin (nginx).
    WeightedRoundRobin => simple::WeightedRoundRobinConfig,
    /// Fewest waiting + running + own dispatches.
    LeastOutstanding => least::LeastOutstandingConfig,
    /// Least loaded of `d` random choices.
    PowerOfTwo => least::PowerOfTwoConfig,
    /// Lowest KV cache usage.
    LeastKv => least::LeastKvConfig,
    /// Consistent hashing with bounded load.
    ConsistentHash => consistent_hash::Config,
    /// Hash of the first k tokens on a ring, with a load escape.
    PrefixHash => prefix_hash::Config,
    /// SGLang's cache-aware rule over an approximate radix tree.
    CacheAware => cache_aware::Config,
    /// NVIDIA Dynamo's KV block cost.
    KvCost => kv_cost::Config,
    /// Envoy's weighted least request.
    WeightedLeastRequest => weighted_least_request::Config,
    /// Peak EWMA latency (Finagle, linkerd).
    PeakEwma => peak_ewma::Config,
    /// kvgate's own: the earliest predicted first token.
    PredictedTtft => predicted_ttft::Config,
}

impl PolicyConfig {
    /// The policy's name.
    pub fn name(&self) -> &'static str {
        self.doc().name
    }

    /// The shared stale-signal parameters every load-reading policy has.
    pub fn load_params() -> &'static [(&'static str, &'static str)] {
        LOAD_PARAMS
    }

    /// Checks parameter ranges, saying which one is wrong.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let policy = self.name();
        let error = |(param, why)| ConfigError { policy, param, why };
        if let Some(load) = self.load() {
            load.validate().map_err(error)?;
        }
        self.check_params().map_err(error)
    }
}

/// A parameter out of range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("policy {policy}: parameter {param} {why}")]
pub struct ConfigError {
    /// The policy.
    pub policy: &'static str,
    /// The parameter.
    pub param: &'static str,
    /// What is wrong.
    pub why: &'static str,
}

#[cfg(test)]
mod tests;
