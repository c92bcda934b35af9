//! An LLM serving engine at iteration granularity (continuous batching as in Orca, KV blocks as in
//! vLLM's PagedAttention): a slot-limited batch, a KV block pool with a prefix cache of full
//! blocks, and one of three batching modes.
//!
//! Shared by the fleet simulator and the emulated engine. The model is pure: it does not know
//! what time it is. [`EngineModel::step`] runs one iteration and returns how long it takes under
//! the [`CostModel`]; the caller advances its own clock (simulated ticks, or a real sleep).
//!
//! Semantics, following vLLM's scheduler:
//! - A sequence's prompt is cut into full blocks of `block_size` tokens with chained hashes
//!   ([`kvgate_core::index::blocks::block_hashes`]). On admission the leading blocks found in
//!   the prefix cache are reused; only the rest is prefilled, and at least one token is always
//!   computed. Blocks become cacheable when full; only prompt blocks are cached (generated
//!   tokens are not known to the model). With [`Batching::Chunked`] a block is cached when an
//!   iteration schedules its computation, as vLLM v1 does, so a sequence admitted later in the
//!   same iteration reuses it; the whole-prompt modes cache it once computed, as vLLM v0 did.
//! - The iteration that finishes a prefill samples a token: the first output token, or after a
//!   recompute the next one. Each later iteration decodes one token per running sequence.
//! - [`Batching::Continuous`]: when a waiting sequence can be admitted, the iteration prefills
//!   every sequence admitted (whole prompts) and running sequences do not decode (a prefill
//!   occupies the whole iteration and stalls decodes).
//!   [`Batching::Chunked`]: running sequences first (one token per decode, prefill chunks), then
//!   admissions, all within `max_num_batched_tokens` per iteration (Sarathi-Serve).
//!   [`Batching::Static`]: a new batch is admitted only when the previous one has fully
//!   finished.
//! - When a sequence needs a block and none is free (after evicting idle cached blocks), the most
//!   recently admitted running sequence is preempted: its blocks are released and it returns to
//!   the head of the queue to be recomputed (prompt plus the tokens it had generated).
//! - Admission is first come, first served; the head of the queue blocks those behind it.
//!
//! Refinements of the shared API draft: [`EngineModel::abort`] returns the
//! [`SeqEvent::Finished`] of the aborted sequence (an abort happens between iterations, so no
//! [`Iteration`] can carry it); [`EngineModel::with_token_events`] and
//! [`EngineModel::with_kv_events`] let a caller that does not need per-token events or KV
//! events (the fleet simulator) skip building them; a request whose prompt plus output can never
//! fit in the pool is finished at once with zero output tokens at the next step;
//! [`Iteration`] also carries `scheduled_seqs` and `output_tokens`; [`EngineModel::is_idle`],
//! [`EngineModel::config`] and [`EngineModel::reset_prefix_cache`] are additions.

mod cost;
mod engine;
pub mod lora;
mod pool;
#[cfg(test)]
mod tests;

pub use cost::{CostModel, TICK_NANOS};
pub(crate) use engine::chained_hashes;
pub use engine::EngineModel;
pub use lora::{LoraConfig, LoraStats};

use kvgate_core::index::blocks::KvEvent;
use kvgate_core::Nanos;
use serde::{Deserialize, Serialize};

/// How the engine forms batches (docs/background.md#batching-inside-the-engine).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Batching {
    /// A batch runs until its longest sequence finishes; then the next batch is admitted.
    Static,
    /// Iteration-level scheduling (Orca): finished sequences leave and waiting ones join every
    /// iteration; an iteration with a prefill does no decoding.
    Continuous,
    /// Continuous batching with chunked prefill (Sarathi-Serve): decodes and prefill chunks
    /// share a per-iteration token budget.
    Chunked {
        /// Tokens (decode tokens plus prefill chunk tokens) one iteration may compute.
        max_num_batched_tokens: usize,
    },
}

/// The engine's shape and policies.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct EngineConfig {
    /// Batch slots: the most sequences running at once (vLLM `max_num_seqs`).
    pub max_num_seqs: usize,
    /// KV blocks in the pool.
    pub kv_blocks: usize,
    /// Tokens per KV block (vLLM default 16).
    pub block_size: usize,
    /// The batching mode.
    pub batching: Batching,
    /// Whether full prompt blocks are kept in a prefix cache after use.
    pub prefix_caching: bool,
    /// The iteration-time model.
    pub cost: CostModel,
}

impl Default for EngineConfig {
    /// 256 slots, 16-token blocks, chunked prefill with a 2,048-token budget, prefix caching,
    /// the default cost model, and 8,192 blocks (131,072 tokens of KV).
    fn default() -> Self {
        EngineConfig {
            max_num_seqs: 256,
            kv_blocks: 8_192,
            block_size: 16,
            batching: Batching::Chunked {
                max_num_batched_tokens: 2_048,
            },
            prefix_caching: true,
            cost: CostModel::default(),
        }
    }
}

/// One generation request as the engine receives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeqRequest {
    /// Unique among the requests the engine holds.
    pub id: u64,
    /// The prompt's token ids.
    pub prompt: Vec<u32>,
    /// Output tokens to generate (the model has no end-of-sequence; at least one is produced).
    pub max_output_tokens: u32,
}

/// What happened to one sequence in an iteration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SeqEvent {
    /// The first output token was produced; `cached_tokens` of the prompt came from the prefix
    /// cache.
    FirstToken {
        /// The request.
        id: u64,
        /// Prompt tokens reused from the prefix cache at the admission that produced it.
        cached_tokens: u32,
    },
    /// One more output token (after the first).
    Token {
        /// The request.
        id: u64,
    },
    /// The sequence reached `max_output_tokens` (or was aborted or rejected) and released its
    /// blocks.
    Finished {
        /// The request.
        id: u64,
        /// Output tokens produced.
        output_tokens: u32,
    },
    /// Preempted for lack of KV blocks; it will be recomputed.
    Preempted {
        /// The request.
        id: u64,
    },
}

/// One engine iteration.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Iteration {
    /// How long it takes, from the cost model.
    pub duration: Nanos,
    /// Prompt tokens computed (cache hits excluded; recomputed tokens included).
    pub prefill_tokens: u32,
    /// Sequences that decoded one token (sequences finishing a prefill are not counted).
    pub decode_seqs: u32,
    /// Sequences that did any work (a decode or a prefill chunk): the batch's occupied slots.
    pub scheduled_seqs: u32,
    /// Output tokens produced: first tokens, decoded tokens and tokens sampled at the end of a
    /// recompute (counted even when [`SeqEvent::Token`] events are off).
    pub output_tokens: u32,
    /// Per-sequence events, in batch order.
    pub events: Vec<SeqEvent>,
    /// Prefix cache changes: `BlockStored` (device tier) and `BlockRemoved`.
    pub kv_events: Vec<KvEvent>,
}

/// A snapshot of the engine's gauges and counters (what vLLM's `/metrics` exposes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineStats {
    /// Sequences in the batch (`vllm:num_requests_running`).
    pub running: u32,
    /// Sequences queued (`vllm:num_requests_waiting`).
    pub waiting: u32,
    /// Fraction of blocks referenced by sequences (`vllm:kv_cache_usage_perc`, 1 = 100%).
    pub kv_usage: f64,
    /// Blocks held by running sequences beyond the prefix-cache hits each was admitted with: the KV
    /// footprint when cached blocks are counted as free (the routing lab's reading).
    pub uncached_blocks: u64,
    /// Blocks free or idle cached.
    pub free_blocks: u64,
    /// Blocks in the pool.
    pub total_blocks: u64,
    /// Prompt tokens looked up in the prefix cache (`vllm:prefix_cache_queries`).
    pub prefix_queries_tokens: u64,
    /// Prompt tokens found there (`vllm:prefix_cache_hits`).
    pub prefix_hits_tokens: u64,
    /// Preemptions so far (`vllm:num_preemptions`).
    pub preemptions: u64,
}
