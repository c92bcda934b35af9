//! An index of KV blocks keyed by chained block hashes (Dynamo's KV indexer, vLLM's prefix cache
//! keys).
//!
//! A prompt is cut into full blocks of `block_size` tokens; block `i`'s hash covers its tokens
//! and block `i - 1`'s hash, so equal hashes mean equal prefixes. The index maps each hash to
//! the endpoints (and cache tiers) holding it; an endpoint's overlap is its run of leading
//! blocks.
//!
//! Engines name blocks by their own hashes, which a router cannot reproduce (vLLM seeds them
//! per process), so events carry token ids and the index recomputes its own chained hashes,
//! remembering each endpoint's external-to-local mapping for later removals. Without events the
//! router inserts what it dispatched (Dynamo's approximate indexer) and entries expire after
//! `ttl`.

use super::{Overlap, Overlaps, PrefixIndex, PrefixKey, Unit};
use crate::{EndpointId, Nanos};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Where a cached block lives (vLLM's `medium`: GPU, CPU, DISK).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum Tier {
    /// Accelerator memory.
    Device = 0,
    /// Host (CPU) memory.
    Host,
    /// Local disk or a shared store.
    Disk,
}

/// One KV cache change reported by an engine (vLLM `BlockStored`, `BlockRemoved`,
/// `AllBlocksCleared`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum KvEvent {
    /// Blocks were stored; `token_ids` holds `block_size` tokens per block, in order.
    BlockStored {
        /// The engine's hashes of the stored blocks.
        block_hashes: Vec<u64>,
        /// The engine's hash of the block before the first one, if any.
        parent_block_hash: Option<u64>,
        /// The blocks' tokens.
        token_ids: Vec<u32>,
        /// Tokens per block.
        block_size: u32,
        /// Where they were stored.
        tier: Tier,
        /// The LoRA adapter the blocks were computed with (vLLM's `lora_name`); `None` for the
        /// base model. The same tokens under another adapter are other blocks.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lora_name: Option<String>,
    },
    /// Blocks were evicted.
    BlockRemoved {
        /// The engine's hashes of the removed blocks.
        block_hashes: Vec<u64>,
        /// From where.
        tier: Tier,
    },
    /// The engine dropped its whole cache.
    AllBlocksCleared,
}

/// Chained hashes of the full blocks of `tokens`, seeded by `scope`: block `i` hashes its
/// tokens' little-endian bytes with block `i - 1`'s hash as the seed. The bytes are laid out one
/// block at a time (a 480K-token prompt's all at once would be 1.9 MB copied per pick).
pub fn block_hashes(tokens: &[u32], block_size: usize, scope: u64) -> Vec<u64> {
    let size = block_size.max(1);
    let mut bytes = vec![0u8; 4 * size];
    let mut parent = scope;
    tokens
        .chunks_exact(size)
        .map(|block| {
            for (to, t) in bytes.chunks_exact_mut(4).zip(block) {
                to.copy_from_slice(&t.to_le_bytes());
            }
            parent = xxh3_64_with_seed(&bytes, parent);
            parent
        })
        .collect()
}

/// Chained hashes of a text key, cutting it into blocks of `4 * block_size` bytes (about
/// `block_size` tokens at four bytes per token) when no token ids are known.
pub fn text_block_hashes(text: &[u8], block_size: usize, scope: u64) -> Vec<u64> {
    chain(text, 4 * block_size.max(1), scope)
}

fn chain(bytes: &[u8], chunk: usize, seed: u64) -> Vec<u64> {
    let mut parent = seed;
    bytes
        .chunks_exact(chunk)
        .map(|block| {
            parent = xxh3_64_with_seed(block, parent);
            parent
        })
        .collect()
}

/// Block hashes are already uniform 64-bit values: hashing them again would only cost time.
#[derive(Clone, Copy, Debug, Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type BlockMap<V> = HashMap<u64, V, BuildHasherDefault<PassThrough>>;

/// The seed of the first block of a chain stored by an engine event.
pub const ENGINE_SCOPE: u64 = 0x6b76;

/// `scope` narrowed to one LoRA adapter: blocks computed with an adapter never match the base
/// model's or another adapter's.
pub fn adapter_scope(adapter: &str, scope: u64) -> u64 {
    xxh3_64_with_seed(adapter.as_bytes(), scope ^ 0x6c6f_7261)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Holder {
    endpoint: EndpointId,
    tier: Tier,
    at: Nanos,
}

/// The block index. See the module documentation.
#[derive(Clone, Debug)]
pub struct BlockIndex {
    block_size: usize,
    /// Expiry of router-inserted entries; `None` when fed by engine events.
    ttl: Option<Nanos>,
    blocks: BlockMap<Vec<Holder>>,
    external: HashMap<(EndpointId, u64), u64>,
    unplaced: u64,
    /// Entries (block, tier) held per endpoint: what bounds an event-fed index's memory.
    held: HashMap<EndpointId, usize>,
    /// Endpoints whose engine reported removing blocks since it joined or last cleared all.
    evicted: BTreeSet<EndpointId>,
}

impl BlockIndex {
    /// An index of `block_size`-token blocks. With `ttl`, router-side inserts expire after it.
    pub fn new(block_size: usize, ttl: Option<Nanos>) -> Self {
        BlockIndex {
            block_size: block_size.max(1),
            ttl,
            blocks: BlockMap::default(),
            external: HashMap::new(),
            unplaced: 0,
            held: HashMap::new(),
            evicted: BTreeSet::new(),
        }
    }

    /// The endpoints whose engine reported removing blocks since it joined or last cleared
    /// all, in id order.
    pub fn evicted(&self) -> impl Iterator<Item = EndpointId> + '_ {
        self.evicted.iter().copied()
    }

    /// Whether this router's dispatches feed the index (entries expire after the TTL), rather
    /// than engine KV events.
    pub fn is_approximate(&self) -> bool {
        self.ttl.is_some()
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Distinct blocks known.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether no block is known.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Entries (a block in one tier) `endpoint` holds.
    pub fn held_by(&self, endpoint: EndpointId) -> usize {
        self.held.get(&endpoint).copied().unwrap_or(0)
    }

    /// Stored events whose parent block was unknown (for example after lost events); their
    /// blocks cannot be placed in the chain.
    pub fn unplaced(&self) -> u64 {
        self.unplaced
    }

    /// The key's chained block hashes (tokens if known, else text).
    ///
    /// An index fed by engine events ignores the key's scope: an engine's cache is keyed by
    /// token content alone, so that is what its events can be matched on (tenant isolation
    /// inside an engine is the engine's business, vLLM's `cache_salt`).
    pub fn hashes_of(&self, key: &PrefixKey<'_>) -> Vec<u64> {
        let scope = if self.ttl.is_none() {
            key.engine_scope()
        } else {
            key.scope
        };
        match (key.tokens, key.text) {
            (Some(tokens), _) => block_hashes(tokens, self.block_size, scope),
            (None, Some(text)) => text_block_hashes(text, self.block_size, scope),
            (None, None) => Vec::new(),
        }
    }

    /// Per endpoint, the run of leading blocks of `hashes` it holds, split by tier: the first
    /// `device` blocks are all on the device, and so on down the tiers (a block on a faster tier
    /// after a slower one counts at the slower tier). Costs O(blocks + holders of those blocks).
    pub fn overlaps_of(&self, hashes: &[u64], now: Nanos) -> Overlaps {
        let cutoff = self
            .ttl
            .map_or(Nanos::ZERO, |ttl| now.saturating_since(ttl));
        let mut runs: Vec<Run> = Vec::new();
        let mut touched: Vec<u32> = Vec::new();
        let mut started: Vec<u32> = Vec::new();
        for (i, h) in hashes.iter().enumerate() {
            let i = i as u32;
            let Some(holders) = self.blocks.get(h) else {
                break;
            };
            touched.clear();
            for x in holders {
                if x.at < cutoff {
                    continue;
                }
                let e = x.endpoint.0 as usize;
                if e >= runs.len() {
                    runs.resize(e + 1, Run::EMPTY);
                }
                let run = &mut runs[e];
                if run.blocks == i {
                    if run.tier == Run::NO_TIER {
                        touched.push(x.endpoint.0);
                        run.block_touched = x.at;
                    }
                    run.tier = run.tier.min(x.tier as u8);
                    run.block_touched = run.block_touched.max(x.at);
                }
            }
            if touched.is_empty() {
                break;
            }
            for &e in &touched {
                runs[e as usize].count_block();
                if i == 0 {
                    started.push(e);
                }
            }
        }
        started.sort_unstable();
        let endpoints = started
            .into_iter()
            .map(|e| runs[e as usize].overlap(EndpointId(e)))
            .collect();
        Overlaps {
            total: u32::try_from(hashes.len()).unwrap_or(u32::MAX),
            unit: Unit::Blocks(u32::try_from(self.block_size).unwrap_or(u32::MAX)),
            endpoints,
            shared: 0,
            evicted: !self.evicted.is_empty(),
            block_hashes: Vec::new(),
            engine: Vec::new(),
            tail: Default::default(),
        }
    }

    /// Applies one engine event from `endpoint`.
    pub fn apply(&mut self, endpoint: EndpointId, event: &KvEvent, at: Nanos) {
        match event {
            KvEvent::BlockStored {
                block_hashes: ext,
                parent_block_hash,
                token_ids,
                block_size,
                tier,
                lora_name,
            } => {
                let bs = (*block_size as usize).max(1);
                let parent = match parent_block_hash {
                    None => lora_name
                        .as_deref()
                        .map_or(ENGINE_SCOPE, |a| adapter_scope(a, ENGINE_SCOPE)),
                    Some(p) => match self.external.get(&(endpoint, *p)) {
                        Some(&local) => local,
                        None => {
                            self.unplaced += 1;
                            return;
                        }
                    },
                };
                let locals = block_hashes(token_ids, bs, parent);
                for (ext_hash, &local) in ext.iter().zip(&locals) {
                    self.external.insert((endpoint, *ext_hash), local);
                    self.hold(local, endpoint, *tier, at);
                }
            }
            KvEvent::BlockRemoved {
                block_hashes: ext,
                tier,
            } => {
                self.evicted.insert(endpoint);
                for h in ext {
                    if let Some(local) = self.external.get(&(endpoint, *h)).copied() {
                        self.release(local, endpoint, Some(*tier));
                        if !self.holds(local, endpoint) {
                            self.external.remove(&(endpoint, *h));
                        }
                    }
                }
            }
            KvEvent::AllBlocksCleared => self.remove_endpoint(endpoint),
        }
    }

    fn holds(&self, local: u64, endpoint: EndpointId) -> bool {
        self.blocks
            .get(&local)
            .is_some_and(|v| v.iter().any(|x| x.endpoint == endpoint))
    }

    fn hold(&mut self, local: u64, endpoint: EndpointId, tier: Tier, at: Nanos) {
        let holders = self.blocks.entry(local).or_default();
        match holders
            .iter_mut()
            .find(|x| x.endpoint == endpoint && x.tier == tier)
        {
            Some(x) => x.at = x.at.max(at),
            None => {
                holders.push(Holder { endpoint, tier, at });
                *self.held.entry(endpoint).or_default() += 1;
            }
        }
    }

    fn release(&mut self, local: u64, endpoint: EndpointId, tier: Option<Tier>) {
        if let Some(holders) = self.blocks.get_mut(&local) {
            let before = holders.len();
            holders.retain(|x| !(x.endpoint == endpoint && tier.is_none_or(|t| t == x.tier)));
            if let Some(n) = self.held.get_mut(&endpoint) {
                *n = n.saturating_sub(before - holders.len());
            }
            if holders.is_empty() {
                self.blocks.remove(&local);
            }
        }
    }
}

impl PrefixIndex for BlockIndex {
    fn overlaps(&self, key: &PrefixKey<'_>, now: Nanos) -> Overlaps {
        let hashes = self.hashes_of(key);
        self.overlaps_of(&hashes, now)
    }

    fn insert(&mut self, key: &PrefixKey<'_>, endpoint: EndpointId, now: Nanos) {
        for h in self.hashes_of(key) {
            self.hold(h, endpoint, Tier::Device, now);
        }
    }

    fn remove_endpoint(&mut self, endpoint: EndpointId) {
        self.blocks.retain(|_, holders| {
            holders.retain(|x| x.endpoint != endpoint);
            !holders.is_empty()
        });
        self.external.retain(|(e, _), _| *e != endpoint);
        self.held.remove(&endpoint);
        self.evicted.remove(&endpoint);
    }

    fn evict(&mut self, now: Nanos) {
        if let Some(ttl) = self.ttl {
            let held = &mut self.held;
            self.blocks.retain(|_, holders| {
                holders.retain(|x| {
                    let keep = now.saturating_since(x.at) <= ttl;
                    if !keep {
                        if let Some(n) = held.get_mut(&x.endpoint) {
                            *n = n.saturating_sub(1);
                        }
                    }
                    keep
                });
                !holders.is_empty()
            });
        }
    }
}

/// One endpoint's run of leading blocks while [`BlockIndex::overlaps_of`] walks a prompt.
#[derive(Clone, Copy)]
struct Run {
    blocks: u32,
    /// The fastest tier holding the block being walked, or [`Run::NO_TIER`].
    tier: u8,
    counts: [u32; 3],
    touched: Nanos,
    block_touched: Nanos,
}

impl Run {
    /// No holder of the block being walked found yet.
    const NO_TIER: u8 = u8::MAX;

    const EMPTY: Run = Run {
        blocks: 0,
        tier: Self::NO_TIER,
        counts: [0; 3],
        touched: Nanos::ZERO,
        block_touched: Nanos::ZERO,
    };

    /// Counts the block just walked at its tier and readies the run for the next block.
    fn count_block(&mut self) {
        // Once a block was found on a slower tier, later blocks count there too.
        let floor = if self.counts[2] > 0 {
            2
        } else if self.counts[1] > 0 {
            1
        } else {
            0
        };
        self.counts[usize::from(self.tier.max(floor))] += 1;
        self.blocks += 1;
        self.tier = Self::NO_TIER;
        self.touched = self.block_touched;
    }

    /// The run as `endpoint`'s overlap.
    fn overlap(&self, endpoint: EndpointId) -> Overlap {
        Overlap {
            endpoint,
            device: self.counts[0],
            host: self.counts[1],
            disk: self.counts[2],
            touched: self.touched,
            pending: 0,
        }
    }
}

#[cfg(test)]
mod tests;
