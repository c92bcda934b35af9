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
use super::{as_reported, Overlap, Overlaps, PrefixIndex, PrefixKey, TailScale, Unit};
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

/// What the index predicted one endpoint held of one request, kept until usage says what it
/// really held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prediction {
    /// The endpoint.
    pub endpoint: EndpointId,
    /// Predicted units held when this request is prefilled: what the index lists, or more
    /// when an earlier dispatch still prefilling will have cached it by then.
    pub units: u32,
    /// Units the index listed as held at the pick, without the in-flight part: only a miss
    /// of these shows an eviction. A shortfall in the in-flight part is a sibling admitted
    /// before its prefix was computed, and the entries are right.
    pub held: u32,
    /// Units in the prompt.
    pub total: u32,
    /// What the units are.
    pub unit: Unit,
    /// When the matched prefix was last sent there.
    pub touched: Nanos,
    /// The prompt's text length, when keyed by text.
    pub text_bytes: Option<usize>,
    /// Whether the token tree (not the text tree) holds it.
    pub by_tokens: bool,
    /// When the endpoint has a KV-event stream: the tokens its events alone say it holds, and
    /// whether the stream was trusted (then `units` is exactly that).
    pub engine: Option<(u32, bool)>,
    /// How the index counted uncached tails at the pick.
    pub tail: TailScale,
}

impl Prediction {
    /// Whether this prediction came from a trusted engine event stream, and so should match
    /// the engine's `cached_tokens` to the token rather than to a block.
    pub fn is_exact(&self) -> bool {
        self.engine
            .is_some_and(|(tokens, live)| live && self.unit == Unit::Tokens && tokens == self.units)
    }
}

impl Prediction {
    /// The predicted cached tokens of a prompt of `prompt_tokens` tokens.
    pub fn cached_tokens(&self, prompt_tokens: u32) -> u32 {
        self.tail.cached(
            self.unit.tokens(self.units, self.total, prompt_tokens),
            prompt_tokens,
        )
    }

    /// How many bytes of the prompt's text key the endpoint is predicted to hold: the match
    /// itself when the index is keyed by text, else the matched share of the key's length.
    /// `None` when the request had no text key.
    pub fn cached_text_bytes(&self) -> Option<usize> {
        let bytes = self.text_bytes?;
        if self.unit == Unit::Bytes {
            return Some((self.units as usize).min(bytes));
        }
        let share = f64::from(self.units) / f64::from(self.total.max(1));
        Some((share.min(1.0) * bytes as f64) as usize)
    }
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
            (Some(engines), Some(tokens)) => engines.overlay(routed, tokens, now),
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
        let key = PrefixKey::of(request, self.share_across_tenants);
        match &mut self.index {
            Index::Radix {
                mirror: true,
                pending,
                ..
            } => pending.add(request.id, endpoint, &key, &overlaps.block_hashes),
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

    /// What this index predicted for `request` on `endpoint`, kept from the pick until the
    /// engine's usage arrives ([`Self::correct`]): what the endpoint holds, or, when more, what
    /// prompts sent there and still in prefill will have put in its cache by the time this one
    /// is prefilled (engines cache a block as they schedule it, so a request queued behind its
    /// prefix's first sender finds it).
    pub fn prediction(
        &self,
        request: &Request,
        endpoint: EndpointId,
        overlaps: &Overlaps,
    ) -> Prediction {
        let key = PrefixKey::of(request, self.share_across_tenants);
        let by_tokens = match &self.index {
            Index::Radix { key: by, .. } => {
                matches!(
                    (*by, key.tokens.is_some()),
                    (TreeKey::Tokens, _) | (TreeKey::Auto, true)
                )
            }
            Index::Blocks { .. } => true,
        };
        let overlap = overlaps.of(endpoint);
        Prediction {
            endpoint,
            units: overlap.total().max(overlap.pending),
            held: overlap.total(),
            total: overlaps.total,
            unit: overlaps.unit,
            touched: overlap.touched,
            text_bytes: key.text.map(<[u8]>::len),
            by_tokens,
            engine: overlaps
                .engine
                .iter()
                .find(|(e, _, _)| *e == endpoint)
                .map(|&(_, tokens, live)| (tokens, live)),
            tail: overlaps.tail,
        }
    }

    /// The engine's usage said `cached_tokens` of the prompt's `prompt_tokens` came from its
    /// cache, where this index predicted `predicted` at the dispatch; the engine caches in
    /// blocks of `block` tokens. When what the index listed as held, read as the engine counts
    /// (whole blocks, at most `prompt_tokens - 1`, the tail scaled), was over by more than a
    /// block, the engine evicted what this index still listed: an index that mirrors engines
    /// forgets everything that endpoint was sent at or before the missed prefix was (LRU
    /// order). Also learns the text's bytes per token and how its tails are counted.
    pub fn correct(&mut self, predicted: &Prediction, usage: (u32, u32), block: u32) {
        let (prompt_tokens, cached_tokens) = usage;
        if let (Some(engines), Some((tokens, _))) = (&mut self.engines, predicted.engine) {
            engines.verified(predicted.endpoint, tokens == cached_tokens);
        }
        let Index::Radix {
            text,
            tokens,
            mirror: true,
            bytes_per_token,
            tail,
            ..
        } = &mut self.index
        else {
            return;
        };
        if prompt_tokens == 0 {
            return;
        }
        if let Some(bytes) = predicted.text_bytes {
            let ratio = bytes as f64 / f64::from(prompt_tokens);
            if ratio.is_finite() && ratio > 0.0 {
                *bytes_per_token += (ratio - *bytes_per_token) * 0.05;
            }
        }
        let as_engine = |units: u32, tail: TailScale| {
            let read = predicted.unit.tokens(units, predicted.total, prompt_tokens);
            let read = f64::from(tail.cached(read, prompt_tokens));
            as_reported(read, f64::from(prompt_tokens), Some(block)) as u32
        };
        let by_text = predicted.unit == Unit::Bytes;
        if by_text && predicted.units > 0 {
            let read = as_engine(predicted.units, TailScale::default());
            tail.learn(
                prompt_tokens - cached_tokens.min(prompt_tokens),
                prompt_tokens - read,
            );
        }
        let scale = if by_text { *tail } else { TailScale::default() };
        if as_engine(predicted.held, scale) <= cached_tokens.saturating_add(block) {
            return;
        }
        if predicted.by_tokens {
            tokens.evict_older(predicted.endpoint, predicted.touched);
        } else {
            text.evict_older(predicted.endpoint, predicted.touched);
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
mod tests {
    use super::*;

    fn prediction(unit: Unit, units: u32, total: u32, text_bytes: Option<usize>) -> Prediction {
        Prediction {
            endpoint: EndpointId(0),
            units,
            held: units,
            total,
            unit,
            touched: Nanos::ZERO,
            text_bytes,
            by_tokens: unit != Unit::Bytes,
            engine: None,
            tail: TailScale::default(),
        }
    }

    #[test]
    fn the_held_share_of_a_text_key_is_the_match_or_its_share_of_the_key() {
        // Keyed by text: the match is in the key's own bytes.
        let text = prediction(Unit::Bytes, 1_200, 2_000, Some(2_000));
        assert_eq!(text.cached_text_bytes(), Some(1_200));
        // Keyed by tokens or blocks: the matched share of the key.
        let tokens = prediction(Unit::Tokens, 300, 500, Some(2_000));
        assert_eq!(tokens.cached_text_bytes(), Some(1_200));
        let blocks = prediction(Unit::Blocks(16), 40, 40, Some(2_000));
        assert_eq!(blocks.cached_text_bytes(), Some(2_000));
        // No text key (a token prompt): nothing to say.
        assert_eq!(
            prediction(Unit::Tokens, 300, 500, None).cached_text_bytes(),
            None
        );
    }
}
