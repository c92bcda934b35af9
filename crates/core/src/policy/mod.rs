//! Endpoint-selection policies.
//!
//! A policy is a function of plain data: a borrowed request, a borrowed fleet snapshot, the
//! current time and a random source in; a [`Decision`] with its reason out. It owns its state
//! (`&mut self`), is told what happened afterwards through [`Policy::observe`], and never
//! performs I/O. Health filtering happens through [`EndpointView::health`]; retries, failover
//! and admission live outside policies.
//!
//! Every policy's `Config` has defaults equal to the reference system it imitates (DOMAIN.md);
//! [`PolicyConfig`] is the serde-tagged union of them, used by `serve`, `sim` and `bench`.

mod cache_aware;
mod consistent_hash;
mod kv_cost;
mod least;
mod peak_ewma;
mod prefix_hash;
mod simple;
mod weighted_least_request;

pub use cache_aware::CacheAware;
pub use consistent_hash::{ConsistentHash, HashKey};
pub use kv_cost::{CostInputs, KvCost};
pub use least::{LeastKv, LeastOutstanding, PowerOfTwo};
pub use peak_ewma::{Ewma, PeakEwma};
pub use prefix_hash::PrefixHash;
pub use simple::{RandomPick, RoundRobin, WeightedRoundRobin};
pub use weighted_least_request::{envoy_weight, WeightedLeastRequest};

/// Configurations, one module per policy, each with its own `Config`.
pub mod config {
    pub use super::cache_aware::Config as CacheAware;
    pub use super::consistent_hash::Config as ConsistentHash;
    pub use super::kv_cost::Config as KvCost;
    pub use super::least::LeastKvConfig as LeastKv;
    pub use super::least::LeastOutstandingConfig as LeastOutstanding;
    pub use super::least::PowerOfTwoConfig as PowerOfTwo;
    pub use super::peak_ewma::Config as PeakEwma;
    pub use super::prefix_hash::Config as PrefixHash;
    pub use super::simple::RandomConfig as Random;
    pub use super::simple::RoundRobinConfig as RoundRobin;
    pub use super::simple::WeightedRoundRobinConfig as WeightedRoundRobin;
    pub use super::weighted_least_request::Config as WeightedLeastRequest;
}

use crate::{Decision, EndpointView, Event, Nanos, Rejection, Request};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use std::fmt;

/// The role every selection rule plays.
pub trait Policy: fmt::Debug + Send {
    /// The policy's name as listed by `kvgate policies`.
    fn name(&self) -> &'static str;

    /// Chooses an endpoint for `request` among the routable endpoints of `fleet`.
    fn select(
        &mut self,
        request: &Request,
        fleet: &[EndpointView],
        now: Nanos,
        rng: &mut dyn RngCore,
    ) -> Decision;

    /// Learns what happened after a decision. The default ignores events.
    fn observe(&mut self, _event: &Event<'_>) {}

    /// Periodic upkeep on the owner's clock (for example prefix-tree eviction).
    fn maintain(&mut self, _now: Nanos) {}
}

/// The rejection for a fleet with no routable endpoint.
pub(crate) fn no_route(fleet: &[EndpointView]) -> Decision {
    Decision::Reject(if fleet.is_empty() {
        Rejection::NoEndpoints
    } else {
        Rejection::NoRoutableEndpoint
    })
}

/// Routes to the fleet position in `picked` with the reason made from its score, or rejects.
pub(crate) fn route_or_reject(
    fleet: &[EndpointView],
    picked: Option<(usize, f64)>,
    reason: impl FnOnce(f64) -> crate::Reason,
) -> Decision {
    match picked {
        Some((i, score)) => Decision::Route(crate::Route {
            endpoint: fleet[i].id,
            reason: reason(score),
        }),
        None => no_route(fleet),
    }
}

/// One policy and its parameters: the `policy` section of kvgate's configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "snake_case")]
pub enum PolicyConfig {
    /// Uniform (weight-proportional) random choice.
    Random(config::Random),
    /// Strict rotation.
    RoundRobin(config::RoundRobin),
    /// Smooth weighted round robin (nginx).
    WeightedRoundRobin(config::WeightedRoundRobin),
    /// Fewest waiting + running + own dispatches.
    LeastOutstanding(config::LeastOutstanding),
    /// Least loaded of `d` random choices.
    PowerOfTwo(config::PowerOfTwo),
    /// Lowest KV cache usage.
    LeastKv(config::LeastKv),
    /// Consistent hashing with bounded load.
    ConsistentHash(config::ConsistentHash),
    /// Hash of the first k tokens on a ring, with a load escape.
    PrefixHash(config::PrefixHash),
    /// SGLang's cache-aware rule over an approximate radix tree.
    CacheAware(config::CacheAware),
    /// NVIDIA Dynamo's KV block cost.
    KvCost(config::KvCost),
    /// Envoy's weighted least request.
    WeightedLeastRequest(config::WeightedLeastRequest),
    /// Peak EWMA latency (Finagle, linkerd).
    PeakEwma(config::PeakEwma),
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

impl PolicyConfig {
    /// Every policy name, in the order `kvgate policies` lists them.
    pub const NAMES: [&'static str; 12] = [
        "random",
        "round_robin",
        "weighted_round_robin",
        "least_outstanding",
        "power_of_two",
        "least_kv",
        "consistent_hash",
        "prefix_hash",
        "cache_aware",
        "kv_cost",
        "weighted_least_request",
        "peak_ewma",
    ];

    /// The default configuration of the policy called `name`.
    pub fn default_for(name: &str) -> Option<Self> {
        Some(match name {
            "random" => PolicyConfig::Random(Default::default()),
            "round_robin" => PolicyConfig::RoundRobin(Default::default()),
            "weighted_round_robin" => PolicyConfig::WeightedRoundRobin(Default::default()),
            "least_outstanding" => PolicyConfig::LeastOutstanding(Default::default()),
            "power_of_two" => PolicyConfig::PowerOfTwo(Default::default()),
            "least_kv" => PolicyConfig::LeastKv(Default::default()),
            "consistent_hash" => PolicyConfig::ConsistentHash(Default::default()),
            "prefix_hash" => PolicyConfig::PrefixHash(Default::default()),
            "cache_aware" => PolicyConfig::CacheAware(Default::default()),
            "kv_cost" => PolicyConfig::KvCost(Default::default()),
            "weighted_least_request" => PolicyConfig::WeightedLeastRequest(Default::default()),
            "peak_ewma" => PolicyConfig::PeakEwma(Default::default()),
            _ => return None,
        })
    }

    /// The policy's name.
    pub fn name(&self) -> &'static str {
        self.doc().name
    }

    /// The catalogue entry.
    pub fn doc(&self) -> PolicyDoc {
        match self {
            PolicyConfig::Random(_) => simple::RANDOM_DOC,
            PolicyConfig::RoundRobin(_) => simple::ROUND_ROBIN_DOC,
            PolicyConfig::WeightedRoundRobin(_) => simple::WRR_DOC,
            PolicyConfig::LeastOutstanding(_) => least::LEAST_OUTSTANDING_DOC,
            PolicyConfig::PowerOfTwo(_) => least::POWER_OF_TWO_DOC,
            PolicyConfig::LeastKv(_) => least::LEAST_KV_DOC,
            PolicyConfig::ConsistentHash(_) => consistent_hash::DOC,
            PolicyConfig::PrefixHash(_) => prefix_hash::DOC,
            PolicyConfig::CacheAware(_) => cache_aware::DOC,
            PolicyConfig::KvCost(_) => kv_cost::DOC,
            PolicyConfig::WeightedLeastRequest(_) => weighted_least_request::DOC,
            PolicyConfig::PeakEwma(_) => peak_ewma::DOC,
        }
    }

    /// The shared stale-signal parameters every load-reading policy has.
    pub fn load_params() -> &'static [(&'static str, &'static str)] {
        LOAD_PARAMS
    }

    /// Checks parameter ranges, saying which one is wrong.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let check = |ok: bool, param: &'static str, why: &'static str| {
            if ok {
                Ok(())
            } else {
                Err(ConfigError {
                    policy: self.name(),
                    param,
                    why,
                })
            }
        };
        if let Some(load) = self.load() {
            load.validate().map_err(|(param, why)| ConfigError {
                policy: self.name(),
                param,
                why,
            })?;
        }
        match self {
            PolicyConfig::PowerOfTwo(c) => check(c.choices >= 1, "choices", "must be at least 1"),
            PolicyConfig::ConsistentHash(c) => check(
                c.balance_factor == 0.0 || c.balance_factor >= 1.0,
                "balance_factor",
                "must be 0 (unbounded) or at least 1",
            ),
            PolicyConfig::PrefixHash(c) => {
                check(c.prefix_tokens >= 1, "prefix_tokens", "must be at least 1")?;
                check(c.load_factor >= 1.0, "load_factor", "must be at least 1")
            }
            PolicyConfig::CacheAware(c) => {
                check(
                    (0.0..=1.0).contains(&c.cache_threshold),
                    "cache_threshold",
                    "must be within 0..=1",
                )?;
                check(
                    c.balance_rel_threshold >= 1.0,
                    "balance_rel_threshold",
                    "must be at least 1",
                )?;
                check(c.max_tree_size >= 1, "max_tree_size", "must be at least 1")
            }
            PolicyConfig::KvCost(c) => {
                check(c.block_size >= 1, "block_size", "must be at least 1")?;
                check(
                    c.router_temperature >= 0.0,
                    "router_temperature",
                    "must not be negative",
                )
            }
            PolicyConfig::WeightedLeastRequest(c) => {
                check(c.choice_count >= 1, "choice_count", "must be at least 1")?;
                check(
                    c.active_request_bias >= 0.0,
                    "active_request_bias",
                    "must not be negative",
                )
            }
            PolicyConfig::PeakEwma(c) => check(c.decay_ms >= 1, "decay_ms", "must be positive"),
            _ => Ok(()),
        }
    }

    /// The stale-signal settings, for policies that read load.
    pub fn load(&self) -> Option<&crate::LoadConfig> {
        match self {
            PolicyConfig::Random(_) | PolicyConfig::RoundRobin(_) => None,
            PolicyConfig::WeightedRoundRobin(c) => Some(&c.load),
            PolicyConfig::LeastOutstanding(c) => Some(&c.load),
            PolicyConfig::PowerOfTwo(c) => Some(&c.load),
            PolicyConfig::LeastKv(c) => Some(&c.load),
            PolicyConfig::ConsistentHash(c) => Some(&c.load),
            PolicyConfig::PrefixHash(c) => Some(&c.load),
            PolicyConfig::CacheAware(c) => Some(&c.load),
            PolicyConfig::KvCost(c) => Some(&c.load),
            PolicyConfig::WeightedLeastRequest(c) => Some(&c.load),
            PolicyConfig::PeakEwma(c) => Some(&c.load),
        }
    }

    /// Builds the policy.
    pub fn build(&self) -> Box<dyn Policy> {
        match self {
            PolicyConfig::Random(c) => Box::new(RandomPick::new(c.clone())),
            PolicyConfig::RoundRobin(c) => Box::new(RoundRobin::new(c.clone())),
            PolicyConfig::WeightedRoundRobin(c) => Box::new(WeightedRoundRobin::new(c.clone())),
            PolicyConfig::LeastOutstanding(c) => Box::new(LeastOutstanding::new(c.clone())),
            PolicyConfig::PowerOfTwo(c) => Box::new(PowerOfTwo::new(c.clone())),
            PolicyConfig::LeastKv(c) => Box::new(LeastKv::new(c.clone())),
            PolicyConfig::ConsistentHash(c) => Box::new(ConsistentHash::new(c.clone())),
            PolicyConfig::PrefixHash(c) => Box::new(PrefixHash::new(c.clone())),
            PolicyConfig::CacheAware(c) => Box::new(CacheAware::new(c.clone())),
            PolicyConfig::KvCost(c) => Box::new(KvCost::new(c.clone())),
            PolicyConfig::WeightedLeastRequest(c) => Box::new(WeightedLeastRequest::new(c.clone())),
            PolicyConfig::PeakEwma(c) => Box::new(PeakEwma::new(c.clone())),
        }
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
