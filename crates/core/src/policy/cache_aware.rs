//! SGLang's cache-aware rule (its router's `cache_aware` policy), over kvgate's approximate radix
//! tree.
//!
//! ```text
//! imbalanced = (max_load - min_load) > balance_abs_threshold
//!              AND max_load > min_load * balance_rel_threshold
//! if imbalanced:                      least loaded               (BalanceEscape)
//! elif best match / prompt > cache_threshold: the best match     (PrefixAffinity)
//! else:                               least loaded               (LowMatch)
//! ```
//! The dispatched request's prompt is then inserted under the endpoint it went to (by the
//! router's [`crate::index::PrefixCache`], which this policy asks for). Defaults are
//! those of SGLang's Rust gateway binary: threshold 0.3, absolute 64, relative 1.5, eviction
//! every 120 s, 67,108,864 stored characters per endpoint. Where SGLang picks an arbitrary
//! tenant among equal matches, kvgate takes the least loaded of them. The tree is keyed by text
//! bytes, or by token ids when the request carries them and `key` says so.

use super::{check, no_route, Params, Policy, PolicyDoc, Query};
use crate::index::IndexSpec;
use crate::index::TreeKey;
use crate::{Decision, LoadConfig, LoadView, Nanos, Reason, Route};
use rand::RngCore;
use serde::{Deserialize, Serialize};

const DOC: PolicyDoc = PolicyDoc {
    name: "cache_aware",
    summary:
        "SGLang's rule: prefix match over an approximate radix tree unless the fleet is imbalanced",
    params: &[
        (
            "cache_threshold",
            "minimum matched share of the prompt for affinity",
        ),
        (
            "balance_abs_threshold",
            "imbalance needs max_load - min_load above this",
        ),
        (
            "balance_rel_threshold",
            "... and max_load above min_load times this",
        ),
        (
            "eviction_interval_secs",
            "how often maintain() trims the tree",
        ),
        (
            "max_tree_size",
            "stored characters (or tokens) per endpoint",
        ),
        (
            "key",
            "text, tokens or auto (tokens when the request has them)",
        ),
        ("share_across_tenants", "let tenants share cache affinity"),
        ("load", "stale-signal handling"),
    ],
};

/// `cache_aware` parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Minimum matched share of the prompt for affinity.
    pub cache_threshold: f64,
    /// Absolute load gap for imbalance.
    pub balance_abs_threshold: f64,
    /// Relative load ratio for imbalance.
    pub balance_rel_threshold: f64,
    /// Period of tree trimming in [`Policy::maintain`].
    pub eviction_interval_secs: u64,
    /// Stored symbols per endpoint.
    pub max_tree_size: usize,
    /// Text or token keys.
    pub key: TreeKey,
    /// Let tenants share cache affinity.
    pub share_across_tenants: bool,
    /// Stale-signal handling.
    pub load: LoadConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            cache_threshold: 0.3,
            balance_abs_threshold: 64.0,
            balance_rel_threshold: 1.5,
            eviction_interval_secs: 120,
            max_tree_size: 67_108_864,
            key: TreeKey::Auto,
            share_across_tenants: false,
            load: LoadConfig::default(),
        }
    }
}

impl Config {
    /// SGLang's imbalance test.
    pub fn is_imbalanced(&self, max_load: f64, min_load: f64) -> bool {
        max_load - min_load > self.balance_abs_threshold
            && max_load > min_load * self.balance_rel_threshold
    }
}

impl Params for Config {
    const DOC: PolicyDoc = DOC;
    fn build(&self) -> Box<dyn Policy> {
        Box::new(CacheAware::new(self.clone()))
    }
    fn load(&self) -> Option<&LoadConfig> {
        Some(&self.load)
    }
    fn validate(&self) -> Result<(), (&'static str, &'static str)> {
        check(
            (0.0..=1.0).contains(&self.cache_threshold),
            "cache_threshold",
            "must be within 0..=1",
        )?;
        check(
            self.balance_rel_threshold >= 1.0,
            "balance_rel_threshold",
            "must be at least 1",
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
            eviction_interval: Nanos::from_secs(self.eviction_interval_secs),
            share_across_tenants: self.share_across_tenants,
            mirror_engines: false,
        })
    }
}

/// The cache-aware policy.
#[derive(Debug)]
pub struct CacheAware {
    config: Config,
}

impl CacheAware {
    /// A new instance.
    pub fn new(config: Config) -> Self {
        CacheAware { config }
    }
}

impl Policy for CacheAware {
    fn name(&self) -> &'static str {
        DOC.name
    }

    fn select(&mut self, query: &Query<'_>, rng: &mut dyn RngCore) -> Decision {
        let fleet = query.fleet;
        let view = LoadView::new(fleet, &self.config.load, query.now);
        let Some((least, min_load)) = view.least_loaded(rng) else {
            return no_route(fleet);
        };
        let max_load = view
            .routable()
            .map(|i| view.ranked_load(i))
            .fold(f64::MIN, f64::max);
        let route = |i: usize, reason| {
            Decision::Route(Route {
                endpoint: fleet.views()[i].id,
                reason,
            })
        };
        if self.config.is_imbalanced(max_load, min_load) {
            return route(least, Reason::BalanceEscape { max_load, min_load });
        }
        let overlaps = query.overlaps;
        let best = overlaps
            .endpoints
            .iter()
            .filter_map(|o| {
                let i = fleet.position(o.endpoint)?;
                fleet.eligible(i).then_some((i, o.device))
            })
            .max_by(|a, b| {
                a.1.cmp(&b.1)
                    .then_with(|| view.ranked_load(b.0).total_cmp(&view.ranked_load(a.0)))
            });
        let total = overlaps.total;
        let matched = best.map_or(0, |(_, m)| m);
        let rate = if total == 0 {
            0.0
        } else {
            f64::from(matched) / f64::from(total)
        };
        match best {
            Some((i, matched)) if rate > self.config.cache_threshold => {
                route(i, Reason::PrefixAffinity { matched, total })
            }
            _ => route(least, Reason::LowMatch { matched, total }),
        }
    }
}
