//! Prefix indexes: where the router believes each endpoint holds a prompt's prefix in its KV
//! cache.
//!
//! Two implementations answer the same question, "how much of this prompt does each endpoint
//! already have?":
//! - [`radix::RadixTree`], an approximate tree of what the router itself sent where (SGLang's
//!   approach: no engine cooperation, character- or token-keyed);
//! - [`blocks::BlockIndex`], keyed by chained KV-block hashes and fed by the engines' own KV
//!   events (Dynamo's and vLLM's approach), or by the router's dispatches when events are off.
//!
//! Keys are scoped: the model and, unless sharing is configured, the tenant are part of every key,
//! so one tenant's prompts never earn affinity (and an observable cache hit) from another's: a hit
//! shows as a short TTFT, which has recovered other users' prompts (Song et al., arXiv:2409.20002).

pub mod blocks;
pub mod cache;
pub mod events;
mod pending;
pub mod radix;
mod tail;

pub use cache::{IndexSpec, Prediction, PrefixCache, TreeKey};
pub use tail::TailScale;

use crate::{EndpointId, Nanos, Request};
use serde::Serialize;
use std::fmt;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// A request's prefix key: a scope and the prompt's text and/or tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefixKey<'a> {
    /// Keys with different scopes never match each other.
    pub scope: u64,
    /// The prompt text as bytes.
    pub text: Option<&'a [u8]>,
    /// The prompt's token ids.
    pub tokens: Option<&'a [u32]>,
    /// The LoRA adapter: engines hash an adapter's blocks apart from the base model's and from
    /// each other's (vLLM puts the adapter in each block's extra hash keys).
    pub adapter: Option<&'a str>,
}

impl<'a> PrefixKey<'a> {
    /// The key of `request`: scoped by model, and by tenant unless `share_across_tenants`.
    pub fn of(request: &'a Request, share_across_tenants: bool) -> Self {
        let mut scope = 0x6b76_u64;
        if let Some(model) = &request.model {
            scope = xxh3_64_with_seed(model.as_bytes(), scope);
        }
        if let Some(adapter) = &request.adapter {
            scope = blocks::adapter_scope(adapter, scope);
        }
        if !share_across_tenants {
            if let Some(tenant) = &request.tenant {
                scope = xxh3_64_with_seed(tenant.as_bytes(), scope ^ 0x7465_6e61_6e74);
            }
        }
        PrefixKey {
            scope,
            text: request.prompt.text.as_deref().map(str::as_bytes),
            tokens: request.prompt.tokens.as_deref(),
            adapter: request.adapter.as_deref(),
        }
    }

    /// The seed of this key's first block in an index fed by engine events: the engine's own
    /// scope for the base model, an adapter's scope for a LoRA request.
    pub fn engine_scope(&self) -> u64 {
        self.adapter.map_or(blocks::ENGINE_SCOPE, |a| {
            blocks::adapter_scope(a, blocks::ENGINE_SCOPE)
        })
    }
}

/// How much of a prompt one endpoint holds, per cache tier (device, host, disk, as Dynamo counts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Overlap {
    /// The endpoint.
    pub endpoint: EndpointId,
    /// Leading units in device (GPU) memory.
    pub device: u32,
    /// Leading units beyond `device` in host memory.
    pub host: u32,
    /// Leading units beyond `device + host` on disk.
    pub disk: u32,
    /// When the last matched unit was last sent there (or reported stored): the recency an
    /// engine's LRU cache evicts by.
    pub touched: Nanos,
    /// Leading units held by prompts sent there whose prefill has not finished (an index
    /// mirroring engines only): computed before this request is admitted, or not yet.
    pub pending: u32,
}

impl Unit {
    /// `units` of a prompt `total` units long, as tokens of its `prompt_tokens` (at most that
    /// many).
    pub fn tokens(self, units: u32, total: u32, prompt_tokens: u32) -> u32 {
        let tokens = match self {
            Unit::Tokens => u64::from(units),
            Unit::Blocks(size) => u64::from(units) * u64::from(size),
            Unit::Bytes if total == 0 => 0,
            Unit::Bytes => u64::from(units) * u64::from(prompt_tokens) / u64::from(total),
        };
        tokens.min(u64::from(prompt_tokens)) as u32
    }
}

/// `cached` tokens of a prompt of `prompt_tokens` as an engine reports them: at most all but the
/// last token, which it always computes, and in whole blocks of `block` tokens when the block
/// size is known (vLLM v1's `get_computed_blocks`; the sim's engine model does the same).
pub fn as_reported(cached: f64, prompt_tokens: f64, block: Option<u32>) -> f64 {
    let cached = cached.min(prompt_tokens - 1.0).max(0.0);
    match block.filter(|&b| b > 1).map(f64::from) {
        Some(b) => (cached / b).floor() * b,
        None => cached,
    }
}

/// What an index counts in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    /// Token ids.
    #[default]
    Tokens,
    /// Bytes of text (tokens are read in proportion to the prompt's token count).
    Bytes,
    /// KV blocks of this many tokens.
    Blocks(u32),
}

impl Overlap {
    /// Units held in any tier.
    pub fn total(&self) -> u32 {
        self.device + self.host + self.disk
    }
}

/// Every endpoint's overlap with one prompt. Endpoints with no overlap are absent.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Overlaps {
    /// Units in the prompt (characters, tokens or blocks, depending on the index).
    pub total: u32,
    /// What the units are.
    pub unit: Unit,
    /// Per endpoint, sorted by endpoint id.
    pub endpoints: Vec<Overlap>,
    /// Leading units of the prompt that other prompts in the index share with it where the
    /// most of them part ways ([`RadixTree::match_shared`](radix::RadixTree::match_shared)):
    /// a system prompt many requests follow, as against a conversation's own history. 0 when
    /// the index cannot tell (a block index keeps no order among prompts).
    pub shared: u32,
    /// Whether some endpoint's entries the index has had to evict since it joined (its
    /// mirrored cache ran out of room, or usage showed the engine evicted): from then on a copy
    /// displaces something. False when the index cannot tell. A flag, not the list, since a
    /// lookup runs on every pick; the indexes list the endpoints (`RadixTree::evicted`).
    #[serde(skip)]
    pub evicted: bool,
    /// The prompt's chained block hashes, when an index mirroring engines cut them for the
    /// lookup: the dispatch that follows reuses them instead of hashing the prompt again.
    #[serde(skip)]
    pub(crate) block_hashes: Vec<u64>,
    /// For endpoints with a KV-event stream: the tokens the engines' events alone say it holds,
    /// and whether that stream is trusted ([`events::Trust::Live`]).
    #[serde(skip)]
    pub(crate) engine: Vec<(EndpointId, u32, bool)>,
    /// How a text-keyed index's uncached tails are counted ([`TailScale`]).
    #[serde(skip)]
    pub(crate) tail: TailScale,
}

impl Overlaps {
    /// `units` of this index as prompt tokens, for a prompt of `prompt_tokens` tokens (at most
    /// that many).
    pub fn tokens(&self, units: u32, prompt_tokens: u32) -> u32 {
        self.tail.cached(
            self.unit.tokens(units, self.total, prompt_tokens),
            prompt_tokens,
        )
    }

    /// Prompt tokens `endpoint` holds in any tier.
    pub fn cached_tokens(&self, endpoint: EndpointId, prompt_tokens: u32) -> u32 {
        self.tokens(self.of(endpoint).total(), prompt_tokens)
    }

    /// The overlap of `endpoint`, zero when absent.
    pub fn of(&self, endpoint: EndpointId) -> Overlap {
        self.endpoints
            .binary_search_by_key(&endpoint, |o| o.endpoint)
            .map(|i| self.endpoints[i])
            .unwrap_or(Overlap {
                endpoint,
                ..Overlap::default()
            })
    }

    /// The largest overlap in any tier.
    pub fn best(&self) -> u32 {
        self.endpoints.iter().map(Overlap::total).max().unwrap_or(0)
    }
}

/// The role every prefix index plays.
pub trait PrefixIndex: fmt::Debug + Send {
    /// Every endpoint's overlap with `key`; `&self`, so lookups may share a read lock.
    fn overlaps(&self, key: &PrefixKey<'_>, now: Nanos) -> Overlaps;
    /// Records that `endpoint` now holds `key` (and refreshes its recency).
    fn insert(&mut self, key: &PrefixKey<'_>, endpoint: EndpointId, now: Nanos);
    /// Forgets everything held by `endpoint`.
    fn remove_endpoint(&mut self, endpoint: EndpointId);
    /// Periodic upkeep (size or age based eviction), called by the owner on its own clock.
    fn evict(&mut self, now: Nanos);
}
