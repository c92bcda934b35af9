//! SGLang's cache-aware rule (DOMAIN.md §5.5), over kvgate's approximate radix tree.
//!
//! ```text
//! imbalanced = (max_load - min_load) > balance_abs_threshold
//!              AND max_load > min_load * balance_rel_threshold
//! if imbalanced:                      least loaded               (BalanceEscape)
//! elif best match / prompt > cache_threshold: the best match     (PrefixAffinity)
//! else:                               least loaded               (LowMatch)
//! ```
//! The dispatched request's prompt is then inserted under the endpoint it went to. Defaults are
//! those of SGLang's Rust gateway binary: threshold 0.3, absolute 64, relative 1.5, eviction
//! every 120 s, 67,108,864 stored characters per endpoint. Where SGLang picks an arbitrary
//! tenant among equal matches, kvgate takes the least loaded of them. The tree is keyed by text
//! bytes, or by token ids when the request carries them and `key` says so.

use super::{no_route, Policy, PolicyDoc};
use crate::index::radix::RadixTree;
use crate::index::{Overlaps, PrefixIndex, PrefixKey};
use crate::{Decision, EndpointView, Event, LoadConfig, LoadView, Nanos, Reason, Request, Route};
use rand::RngCore;
use serde::{Deserialize, Serialize};

pub(super) const DOC: PolicyDoc = PolicyDoc {
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

/// What the tree is keyed by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TreeKey {
    /// Token ids when the request has them, else text.
    #[default]
    Auto,
    /// Raw text bytes (SGLang).
    Text,
    /// Token ids.
    Tokens,
}

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

/// The cache-aware policy.
#[derive(Debug)]
pub struct CacheAware {
    config: Config,
    text: RadixTree<u8>,
    tokens: RadixTree<u32>,
    last_eviction: Option<Nanos>,
}

impl CacheAware {
    /// A new instance.
    pub fn new(config: Config) -> Self {
        let size = config.max_tree_size;
        CacheAware {
            config,
            text: RadixTree::new(size),
            tokens: RadixTree::new(size),
            last_eviction: None,
        }
    }

    /// The text tree, for inspection and benchmarks.
    pub fn text_tree(&self) -> &RadixTree<u8> {
        &self.text
    }

    fn tree_for(&mut self, key: &PrefixKey<'_>) -> &mut dyn PrefixIndex {
        match (self.config.key, key.tokens.is_some()) {
            (TreeKey::Tokens, _) | (TreeKey::Auto, true) => &mut self.tokens,
            _ => &mut self.text,
        }
    }

    fn overlaps(&mut self, request: &Request, now: Nanos) -> Overlaps {
        let key = PrefixKey::of(request, self.config.share_across_tenants);
        self.tree_for(&key).overlaps(&key, now)
    }
}

impl Policy for CacheAware {
    fn name(&self) -> &'static str {
        DOC.name
    }

    fn select(
        &mut self,
        request: &Request,
        fleet: &[EndpointView],
        now: Nanos,
        rng: &mut dyn RngCore,
    ) -> Decision {
        let load = self.config.load.clone();
        let view = LoadView::new(fleet, &load, now);
        let Some((least, min_load)) = view.least_loaded(rng) else {
            return no_route(fleet);
        };
        let max_load = view
            .routable()
            .map(|i| view.ranked_load(i))
            .fold(f64::MIN, f64::max);
        let route = |i: usize, reason| {
            Decision::Route(Route {
                endpoint: fleet[i].id,
                reason,
            })
        };
        if self.config.is_imbalanced(max_load, min_load) {
            return route(least, Reason::BalanceEscape { max_load, min_load });
        }
        let overlaps = self.overlaps(request, now);
        let best = overlaps
            .endpoints
            .iter()
            .filter_map(|o| {
                let i = fleet.iter().position(|e| e.id == o.endpoint)?;
                fleet[i].is_routable().then_some((i, o.device))
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

    fn observe(&mut self, event: &Event<'_>) {
        match event {
            Event::Dispatched {
                request,
                endpoint,
                at,
            } => {
                let key = PrefixKey::of(request, self.config.share_across_tenants);
                self.tree_for(&key).insert(&key, *endpoint, *at);
            }
            Event::EndpointRemoved { endpoint } => {
                self.text.remove_endpoint(*endpoint);
                self.tokens.remove_endpoint(*endpoint);
            }
            _ => {}
        }
    }

    fn maintain(&mut self, now: Nanos) {
        let interval = Nanos::from_secs(self.config.eviction_interval_secs);
        if self
            .last_eviction
            .is_none_or(|last| now.saturating_since(last) >= interval)
        {
            self.text.evict(now);
            self.tokens.evict(now);
            self.last_eviction = Some(now);
        }
    }
}
