//! Prefix hashing: hash the first k tokens (xxhash), look the hash up on a consistent-hash ring,
//! and escape to the least loaded endpoint when the owner's load exceeds the mean times
//! `load_factor` (the SGLang router's `prefix_hash` policy). Adding an endpoint moves about 1/(n+1)
//! of the prefixes, so most cached prefixes stay where they are.

use super::consistent_hash::{eligible_walk, prefix_hash_of, RingCache};
use super::{check, no_route, Params, Policy, PolicyDoc, Query};
use crate::hashring::DEFAULT_VNODES;
use crate::index::PrefixKey;
use crate::{Decision, LoadConfig, LoadView, Reason, Route};
use rand::RngCore;
use serde::{Deserialize, Serialize};

const DOC: PolicyDoc = PolicyDoc {
    name: "prefix_hash",
    summary:
        "xxhash of the first k tokens on a ring; escape to least loaded above mean x load_factor",
    params: &[
        (
            "prefix_tokens",
            "k: leading tokens hashed (4 bytes of text per token without token ids)",
        ),
        (
            "load_factor",
            "escape when the owner's load > mean load x load_factor",
        ),
        ("vnodes", "ring points per unit weight"),
        ("share_across_tenants", "let tenants share prefix placement"),
        ("load", "stale-signal handling"),
    ],
};

/// `prefix_hash` parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Leading tokens hashed.
    pub prefix_tokens: usize,
    /// Escape threshold as a multiple of the mean load.
    pub load_factor: f64,
    /// Ring points per unit weight.
    pub vnodes: u32,
    /// Let tenants share prefix placement.
    pub share_across_tenants: bool,
    /// Stale-signal handling.
    pub load: LoadConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            prefix_tokens: 256,
            load_factor: 1.25,
            vnodes: DEFAULT_VNODES,
            share_across_tenants: false,
            load: LoadConfig::default(),
        }
    }
}

impl Params for Config {
    const DOC: PolicyDoc = DOC;
    fn build(&self) -> Box<dyn Policy> {
        Box::new(PrefixHash::new(self.clone()))
    }
    fn load(&self) -> Option<&LoadConfig> {
        Some(&self.load)
    }
    fn validate(&self) -> Result<(), (&'static str, &'static str)> {
        check(
            self.prefix_tokens >= 1,
            "prefix_tokens",
            "must be at least 1",
        )?;
        check(self.load_factor >= 1.0, "load_factor", "must be at least 1")
    }
}

/// Prefix hashing with a load escape.
#[derive(Debug)]
pub struct PrefixHash {
    config: Config,
    rings: RingCache,
}

impl PrefixHash {
    /// A new instance.
    pub fn new(config: Config) -> Self {
        PrefixHash {
            config,
            rings: RingCache::default(),
        }
    }
}

impl Policy for PrefixHash {
    fn name(&self) -> &'static str {
        DOC.name
    }

    fn select(&mut self, query: &Query<'_>, rng: &mut dyn RngCore) -> Decision {
        let fleet = query.fleet;
        let view = LoadView::new(fleet, &self.config.load, query.now);
        let key = PrefixKey::of(query.request, self.config.share_across_tenants);
        let hash = prefix_hash_of(&key, self.config.prefix_tokens * 4).unwrap_or(query.request.id);
        let ring = self.rings.get(fleet.views(), self.config.vnodes);
        let Some((owner_id, owner)) = eligible_walk(ring, fleet, hash).next() else {
            return no_route(fleet);
        };
        let (sum, n) = view
            .routable()
            .fold((0.0, 0usize), |(s, n), i| (s + view.ranked_load(i), n + 1));
        let mean = sum / n.max(1) as f64;
        let owner_load = view.ranked_load(owner);
        if owner_load > mean * self.config.load_factor {
            if let Some((i, min_load)) = view.least_loaded(rng) {
                return Decision::Route(Route {
                    endpoint: fleet.views()[i].id,
                    reason: Reason::BalanceEscape {
                        max_load: owner_load,
                        min_load,
                    },
                });
            }
        }
        Decision::Route(Route {
            endpoint: owner_id,
            reason: Reason::HashOwner,
        })
    }
}
