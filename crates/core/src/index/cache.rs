//! The router's belief about what each endpoint caches, kept apart from the decision itself.
//!
//! A [`PrefixCache`] wraps the index a policy asked for ([`IndexSpec`]) and answers "how much of
//! this request does each endpoint hold?" with `&self`, so the gateway can run that lookup
//! (which walks the whole prompt, up to megabytes) under a read lock, before it takes the
//! router's lock, and apply inserts, engine KV events and eviction under a write lock that picks
//! never wait for (DESIGN.md "The decision core's shape"). The simulator owns one directly.
//!
//! Eviction is incremental: [`PrefixCache::maintain`] trims at its own period, and the radix
//! tree bounds each endpoint's size on insert (amortised LRU, see [`super::radix`]).

use super::blocks::{BlockIndex, KvEvent};
use super::radix::RadixTree;
use super::{Overlaps, PrefixIndex, PrefixKey};
use crate::{EndpointId, Nanos, Request};
use serde::{Deserialize, Serialize};

/// What a radix tree is keyed by.
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

/// Which index a policy consults, and how it is kept.
#[derive(Clone, Debug, PartialEq)]
pub enum IndexSpec {
    /// An approximate radix tree of what this router sent where (SGLang).
    Radix {
        /// Text or token keys.
        key: TreeKey,
        /// Stored symbols per endpoint.
        max_size: usize,
        /// Period of the size trim in [`PrefixCache::maintain`].
        eviction_interval: Nanos,
        /// Let tenants share cache affinity.
        share_across_tenants: bool,
    },
    /// Chained KV-block hashes (Dynamo, vLLM): fed by this router's dispatches with a TTL, or
    /// by engine KV events when `ttl` is `None`.
    Blocks {
        /// Tokens per block.
        block_size: usize,
        /// Lifetime of dispatch-inserted entries; `None` when engine events feed the index.
        ttl: Option<Nanos>,
        /// Let tenants share cache affinity.
        share_across_tenants: bool,
    },
}

#[derive(Debug)]
enum Index {
    Radix {
        key: TreeKey,
        text: Box<RadixTree<u8>>,
        tokens: Box<RadixTree<u32>>,
        interval: Nanos,
    },
    Blocks {
        index: BlockIndex,
        period: Nanos,
    },
}

/// An index and its upkeep schedule. See the module documentation.
#[derive(Debug)]
pub struct PrefixCache {
    index: Index,
    share_across_tenants: bool,
    last_maintained: Option<Nanos>,
}

impl PrefixCache {
    /// An empty cache as `spec` describes.
    pub fn new(spec: &IndexSpec) -> Self {
        match *spec {
            IndexSpec::Radix {
                key,
                max_size,
                eviction_interval,
                share_across_tenants,
            } => PrefixCache {
                index: Index::Radix {
                    key,
                    text: Box::new(RadixTree::new(max_size)),
                    tokens: Box::new(RadixTree::new(max_size)),
                    interval: eviction_interval,
                },
                share_across_tenants,
                last_maintained: None,
            },
            IndexSpec::Blocks {
                block_size,
                ttl,
                share_across_tenants,
            } => PrefixCache {
                // Expired entries are already ignored by lookups, so the sweep only bounds memory:
                // a tenth of the TTL is often enough.
                index: Index::Blocks {
                    index: BlockIndex::new(block_size, ttl),
                    period: Nanos(ttl.map_or(0, |t| t.0 / 10).max(1_000_000_000 / 10)),
                },
                share_across_tenants,
                last_maintained: None,
            },
        }
    }

    fn key<'r>(&self, request: &'r Request) -> PrefixKey<'r> {
        PrefixKey::of(request, self.share_across_tenants)
    }

    /// Every endpoint's overlap with `request` (in the index's units: bytes, tokens or
    /// blocks), and the request's own length in those units.
    pub fn overlaps(&self, request: &Request, now: Nanos) -> Overlaps {
        let key = self.key(request);
        match &self.index {
            Index::Radix {
                key: by,
                text,
                tokens,
                ..
            } => match (by, key.tokens.is_some()) {
                (TreeKey::Tokens, _) | (TreeKey::Auto, true) => tokens.overlaps(&key, now),
                _ => text.overlaps(&key, now),
            },
            Index::Blocks { index, .. } => index.overlaps(&key, now),
        }
    }

    /// `request` was sent to `endpoint`: an approximate index now believes the endpoint holds
    /// it (a block index fed by engine events waits for the engine to say so).
    pub fn dispatched(&mut self, request: &Request, endpoint: EndpointId, now: Nanos) {
        let key = PrefixKey::of(request, self.share_across_tenants);
        match &mut self.index {
            Index::Radix {
                key: by,
                text,
                tokens,
                ..
            } => match (*by, key.tokens.is_some()) {
                (TreeKey::Tokens, _) | (TreeKey::Auto, true) => tokens.insert(&key, endpoint, now),
                _ => text.insert(&key, endpoint, now),
            },
            Index::Blocks { index, .. } => {
                if index.is_approximate() {
                    index.insert(&key, endpoint, now);
                }
            }
        }
    }

    /// An engine reported KV cache changes; only an event-fed block index uses them.
    pub fn kv_event(&mut self, endpoint: EndpointId, event: &KvEvent, now: Nanos) {
        if let Index::Blocks { index, .. } = &mut self.index {
            if !index.is_approximate() {
                index.apply(endpoint, event, now);
            }
        }
    }

    /// The endpoint left the pool: forget what it held.
    pub fn remove_endpoint(&mut self, endpoint: EndpointId) {
        match &mut self.index {
            Index::Radix { text, tokens, .. } => {
                text.remove_endpoint(endpoint);
                tokens.remove_endpoint(endpoint);
            }
            Index::Blocks { index, .. } => index.remove_endpoint(endpoint),
        }
    }

    /// Periodic upkeep on the owner's clock: the radix tree's size trim every eviction interval,
    /// the block index's TTL sweep every tenth of the TTL.
    pub fn maintain(&mut self, now: Nanos) {
        let period = match &self.index {
            Index::Radix { interval, .. } => *interval,
            Index::Blocks { period, .. } => *period,
        };
        if self
            .last_maintained
            .is_some_and(|last| now.saturating_since(last) < period)
        {
            return;
        }
        self.last_maintained = Some(now);
        match &mut self.index {
            Index::Radix { text, tokens, .. } => {
                text.evict(now);
                tokens.evict(now);
            }
            Index::Blocks { index, .. } => index.evict(now),
        }
    }

    /// The text tree, for inspection and benchmarks (`None` for a block index).
    pub fn text_tree(&self) -> Option<&RadixTree<u8>> {
        match &self.index {
            Index::Radix { text, .. } => Some(text),
            Index::Blocks { .. } => None,
        }
    }
}
