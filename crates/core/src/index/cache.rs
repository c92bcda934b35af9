//! The router's belief about what each endpoint caches, kept apart from the decision itself.
//!
//! A [`PrefixCache`] wraps the index a policy asked for ([`IndexSpec`]) and answers "how much of
//! this request does each endpoint hold?" with `&self`, so the gateway can run that lookup
//! (which walks the whole prompt, up to megabytes) under a read lock, before it takes the
//! router's lock, and apply inserts, engine KV events and eviction under a write lock that picks
//! never wait for (docs/architecture.md, "The decision core's shape"). The simulator owns one
//! directly.
//!
//! Eviction is incremental: [`PrefixCache::maintain`] trims at its own period, and the radix
//! tree bounds each endpoint's size on insert (amortised LRU, see [`super::radix`]).

use super::blocks::{BlockIndex, KvEvent};
use super::events::{BatchOutcome, EngineCaches, StreamStatus};
use super::pending::{self, PendingPrompts, BLOCK_TOKENS};
use super::radix::RadixTree;
use super::{Overlap, Overlaps, PrefixIndex, PrefixKey, TailScale};
use crate::{EndpointId, Nanos, Request};
use serde::{Deserialize, Serialize};

mod prediction;
pub use prediction::Prediction;

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
        /// Mirror each engine's cache: bound each endpoint's entries by the KV capacity it
        /// reports ([`PrefixCache::set_capacity`]) and forget what its LRU must have evicted when
        /// usage shows a predicted hit missed ([`PrefixCache::correct`]).
        mirror_engines: bool,
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
        mirror: bool,
        /// Text bytes per engine token, learned from usage (four until then).
        bytes_per_token: f64,
        /// How the text tree's uncached tails are counted, learned from usage.
        tail: TailScale,
        /// Prompts sent and not yet prefilled (mirroring only: they enter the tree at their
        /// first token, when the engine has cached them).
        pending: Box<PendingPrompts>,
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
    /// The engines' KV events, laid over `index` for requests with token ids.
    engines: Option<EngineCaches>,
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
                mirror_engines,
            } => PrefixCache {
                index: Index::Radix {
                    key,
                    text: Box::new(RadixTree::new(max_size)),
                    tokens: Box::new(RadixTree::new(max_size)),
                    interval: eviction_interval,
                    mirror: mirror_engines,
                    bytes_per_token: 4.0,
                    tail: TailScale::default(),
                    pending: Box::default(),
                },
                share_across_tenants,
                last_maintained: None,
                engines: None,
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
                engines: None,
            },
        }
    }

    /// Also takes the engines' KV events ([`Self::kv_batch`]), at most `max_entries` per
    /// endpoint ([`EngineCaches`]).
    pub fn with_engine_events(mut self, max_entries: usize) -> Self {
        self.engines = Some(EngineCaches::new(max_entries));
        self
    }

    /// Takes over `from`'s engine KV-event state (a new index for a new policy keeps what the
    /// engines reported).
    pub fn carry_engine_events(&mut self, from: &mut PrefixCache) {
        if from.engines.is_some() {
            self.engines = from.engines.take();
        }
    }

    /// Batch `seq` of `endpoint`'s KV-event stream (`None` when engine events are off).
    pub fn kv_batch(
        &mut self,
        endpoint: EndpointId,
        seq: u64,
        events: &[KvEvent],
        now: Nanos,
    ) -> Option<BatchOutcome> {
        Some(self.engines.as_mut()?.batch(endpoint, seq, events, now))
    }

    /// `endpoint`'s KV-event stream, if it has one.
    pub fn engine_status(&self, endpoint: EndpointId) -> Option<StreamStatus> {
        self.engines.as_ref()?.status(endpoint)
    }

    fn key<'r>(&self, request: &'r Request) -> PrefixKey<'r> {
        PrefixKey::of(request, self.share_across_tenants)
    }

    /// Every endpoint's overlap with `request` (in the index's units: bytes, tokens or
    /// blocks), and the request's own length in those units.
    pub fn overlaps(&self, request: &Request, now: Nanos) -> Overlaps {
        let routed = self.routed_overlaps(request, now);
        match (&self.engines, request.prompt.tokens.as_deref()) {
            (Some(engines), Some(tokens)) => {
                let scope = self.key(request).engine_scope();
                engines.overlay(routed, tokens, scope, now)
            }
            _ => routed,
        }
    }

    /// What the router's own index holds of `request`.
    fn routed_overlaps(&self, request: &Request, now: Nanos) -> Overlaps {
        let key = self.key(request);
        match &self.index {
            Index::Radix {
                key: by,
                text,
                tokens,
                pending,
                mirror,
                tail,
                ..
            } => {
                let by_tokens = matches!(
                    (by, key.tokens.is_some()),
                    (TreeKey::Tokens, _) | (TreeKey::Auto, true)
                );
                let mut out = if by_tokens {
                    tokens.overlaps(&key, now)
                } else {
                    let mut out = text.overlaps(&key, now);
                    out.tail = *tail;
                    out
                };
                if *mirror {
                    out.block_hashes = pending::hashes(&key);
                }
                if !pending.is_empty() {
                    let per_block = if by_tokens {
                        BLOCK_TOKENS
                    } else {
                        4 * BLOCK_TOKENS
                    };
                    let held = pending.overlaps(&out.block_hashes);
                    merge_pending(&mut out, held, per_block as u32);
                }
                out
            }
            Index::Blocks { index, .. } => index.overlaps(&key, now),
        }
    }

    /// `request`, whose lookup found `overlaps`, was sent to `endpoint`: an approximate index
    /// now believes the endpoint holds it (a block index fed by engine events waits for the
    /// engine to say so).
    pub fn dispatched(
        &mut self,
        request: &Request,
        endpoint: EndpointId,
        now: Nanos,
        overlaps: &Overlaps,
    ) {
        let mut key = PrefixKey::of(request, self.share_across_tenants);
        match &mut self.index {
            Index::Radix {
                key: by,
                mirror: true,
                pending,
                ..
            } => {
                let computed;
                let hashes = if overlaps.block_hashes.is_empty() {
                    computed = pending::hashes(&key);
                    &computed
                } else {
                    &overlaps.block_hashes
                };
                // Held until the first token, then inserted in one tree: only that tree's key
                // is kept (a long prompt's other key would be megabytes copied for nothing).
                match (*by, key.tokens.is_some()) {
                    (TreeKey::Tokens, _) | (TreeKey::Auto, true) => key.text = None,
                    _ => key.tokens = None,
                }
                pending.add(request.id, endpoint, &key, hashes);
            }
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

    /// Request `id`'s first token came from `endpoint`: an index mirroring engines now knows
    /// the engine has its prompt cached.
    pub fn first_token(&mut self, id: u64, endpoint: EndpointId, now: Nanos) {
        if let Index::Radix {
            key: by,
            text,
            tokens,
            mirror: true,
            pending,
            ..
        } = &mut self.index
        {
            if let Some(owned) = pending.take(id, endpoint) {
                let key = owned.key();
                match (*by, key.tokens.is_some()) {
                    (TreeKey::Tokens, _) | (TreeKey::Auto, true) => {
                        tokens.insert(&key, endpoint, now)
                    }
                    _ => text.insert(&key, endpoint, now),
                }
            }
        }
    }

    /// Request `id` ended on `endpoint` (without a first token, its prompt never got cached).
    pub fn finished(&mut self, id: u64, endpoint: EndpointId) {
        if let Index::Radix { pending, .. } = &mut self.index {
            pending.take(id, endpoint);
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
        self.forget_held(endpoint);
        if let Some(engines) = &mut self.engines {
            engines.remove_endpoint(endpoint);
        }
    }

    /// The endpoint's engine restarted (its scrape said so): its cache is empty. Forgets what
    /// it held, but an event stream from it keeps its place, so the new process's batches
    /// still read as a restart there.
    pub fn endpoint_restarted(&mut self, endpoint: EndpointId) {
        self.forget_held(endpoint);
        if let Some(engines) = &mut self.engines {
            engines.forget(endpoint);
        }
    }

    fn forget_held(&mut self, endpoint: EndpointId) {
        match &mut self.index {
            Index::Radix {
                text,
                tokens,
                pending,
                ..
            } => {
                text.remove_endpoint(endpoint);
                tokens.remove_endpoint(endpoint);
                pending.remove_endpoint(endpoint);
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

    /// `endpoint`'s engine can hold `tokens` of KV (its blocks times their size, as scraped):
    /// an index that mirrors engines keeps no more than that for it, least recently used first.
    pub fn set_capacity(&mut self, endpoint: EndpointId, tokens: u64) {
        if let Index::Radix {
            text,
            tokens: tree,
            mirror: true,
            bytes_per_token,
            ..
        } = &mut self.index
        {
            let bound = |k: f64| usize::try_from((tokens as f64 * k) as u64).unwrap_or(usize::MAX);
            if tree.bound_of(endpoint) != bound(1.0) {
                tree.set_bound(endpoint, bound(1.0));
            }
            let bytes = bound(*bytes_per_token);
            // Re-trimming the text tree for every small change of the ratio would be waste.
            let old = text.bound_of(endpoint) as f64;
            if (old - bytes as f64).abs() > old * 0.05 {
                text.set_bound(endpoint, bytes);
            }
        }
    }

    /// The text tree, for inspection and benchmarks (`None` for a block index).
    pub fn text_tree(&self) -> Option<&RadixTree<u8>> {
        match &self.index {
            Index::Radix { text, .. } => Some(text),
            Index::Blocks { .. } => None,
        }
    }

    /// Approximate heap bytes of the radix trees (0 for a block index), for benchmarks.
    pub fn heap_bytes(&self) -> usize {
        match &self.index {
            Index::Radix { text, tokens, .. } => text.heap_bytes() + tokens.heap_bytes(),
            Index::Blocks { .. } => 0,
        }
    }
}

/// Adds the in-flight overlaps (`blocks` of `per_block` units each) to `out`, capped at the
/// prompt's length; endpoints with only in-flight overlap join with nothing cached.
fn merge_pending(out: &mut Overlaps, pending: Vec<(EndpointId, u32)>, per_block: u32) {
    for (endpoint, blocks) in pending {
        let units = blocks.saturating_mul(per_block).min(out.total);
        match out
            .endpoints
            .binary_search_by_key(&endpoint, |o| o.endpoint)
        {
            Ok(i) => out.endpoints[i].pending = units,
            Err(i) => out.endpoints.insert(
                i,
                Overlap {
                    endpoint,
                    pending: units,
                    ..Overlap::default()
                },
            ),
        }
    }
}

#[cfg(test)]
mod tests;
