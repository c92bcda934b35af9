//! The scheduler: which sequences compute what in each iteration. See the parent module for the
//! semantics.

use super::pool::{BlockId, BlockPool};
use super::{Batching, EngineConfig, EngineStats, Iteration, SeqEvent, SeqRequest};
use kvgate_core::fasthash::IntMap;
use kvgate_core::index::blocks::KvEvent;
use std::collections::VecDeque;
use xxhash_rust::xxh3::xxh3_64_with_seed;

mod blocks;
mod lora;
mod schedule;

/// Seed of the engine's own block hashes (engines hash with their own seed; routers recompute from
/// token ids).
const ENGINE_HASH_SEED: u64 = 0x656e_6769_6e65;

/// Chained hashes of the full blocks of `tokens`: block `i` hashes its tokens (little-endian
/// bytes) seeded by block `i - 1`'s hash, exactly as
/// [`kvgate_core::index::blocks::block_hashes`] with `scope = ENGINE_HASH_SEED`, without
/// allocating per block.
pub(crate) fn chained_hashes(tokens: &[u32], block_size: usize) -> Vec<u64> {
    chained_hashes_from(tokens, block_size, ENGINE_HASH_SEED)
}

/// [`chained_hashes`] from another seed (a LoRA adapter's: its blocks are not the base model's).
fn chained_hashes_from(tokens: &[u32], block_size: usize, seed: u64) -> Vec<u64> {
    let full = tokens.len() / block_size * block_size;
    let bytes: Vec<u8> = tokens[..full]
        .iter()
        .flat_map(|t| t.to_le_bytes())
        .collect();
    let mut parent = seed;
    bytes
        .chunks_exact(block_size * 4)
        .map(|block| {
            parent = xxh3_64_with_seed(block, parent);
            parent
        })
        .collect()
}

#[derive(Clone, Debug)]
struct Seq {
    prompt: Vec<u32>,
    /// Chained hashes of the prompt's full blocks.
    hashes: Vec<u64>,
    max_output: u32,
    output: u32,
    /// Tokens whose KV is held in `blocks`.
    computed: u32,
    /// Tokens to compute before the next token is sampled: the prompt, plus generated tokens
    /// after a preemption.
    target: u32,
    blocks: Vec<BlockId>,
    /// Leading prompt blocks already offered to the cache.
    registered: usize,
    cached_tokens: u32,
    /// The oracle's guess at submission of the prompt tokens the cache will serve.
    expected_cached: u32,
    /// Leading prompt tokens whose KV another engine computed and sent ([`EngineModel::submit_transferred`]).
    transferred: u32,
    /// Its LoRA adapter (an index into the engine's adapter names plus one), 0 for the base
    /// model.
    adapter: u32,
}

impl Seq {
    fn prefilling(&self) -> bool {
        self.computed < self.target
    }
}

/// One unit of scheduled work: `tokens` for sequence `id`.
#[derive(Clone, Copy, Debug)]
struct Work {
    id: u64,
    tokens: u32,
    decode: bool,
    /// Context tokens a decode attends to (0 for prefill chunks).
    context: u32,
}

/// The engine. See the module documentation of [`crate::model`].
#[derive(Clone, Debug)]
pub struct EngineModel {
    config: EngineConfig,
    pool: BlockPool,
    seqs: IntMap<u64, Seq>,
    waiting: VecDeque<u64>,
    running: Vec<u64>,
    rejected: Vec<u64>,
    /// Scratch space for the cached blocks found at admission.
    found: Vec<BlockId>,
    token_events: bool,
    kv_events: bool,
    /// Prompt-block hashes of every sequence held, counted (kept only for the oracle).
    pending: Option<IntMap<u64, u32>>,
    prefix_queries_tokens: u64,
    prefix_hits_tokens: u64,
    preemptions: u64,
    /// LoRA adapters, when the engine serves them ([`EngineModel::with_lora`]).
    lora: Option<lora::Adapters>,
}

impl EngineModel {
    /// An idle engine with an empty pool.
    pub fn new(config: EngineConfig) -> Self {
        let config = EngineConfig {
            max_num_seqs: config.max_num_seqs.max(1),
            block_size: config.block_size.max(1),
            ..config
        };
        EngineModel {
            pool: BlockPool::new(config.kv_blocks, config.prefix_caching),
            config,
            seqs: IntMap::default(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            rejected: Vec::new(),
            found: Vec::new(),
            token_events: true,
            kv_events: true,
            pending: None,
            prefix_queries_tokens: 0,
            prefix_hits_tokens: 0,
            preemptions: 0,
            lora: None,
        }
    }

    /// Whether [`SeqEvent::Token`] events are produced (default on).
    pub fn with_token_events(mut self, on: bool) -> Self {
        self.token_events = on;
        self
    }

    /// Whether [`Iteration::kv_events`] are produced (default on).
    pub fn with_kv_events(mut self, on: bool) -> Self {
        self.kv_events = on;
        self
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Queues a request. A request whose prompt plus output can never fit in the pool is
    /// finished with zero output at the next step. An id already held is ignored.
    pub fn submit(&mut self, request: SeqRequest) {
        self.submit_seeded(request, 0, ENGINE_HASH_SEED);
    }

    fn submit_seeded(&mut self, request: SeqRequest, adapter: u32, seed: u64) {
        if self.seqs.contains_key(&request.id) {
            return;
        }
        let bs = self.config.block_size;
        let max_output = request.max_output_tokens.max(1);
        let prompt_len = u32::try_from(request.prompt.len()).unwrap_or(u32::MAX);
        let need = (prompt_len as usize + max_output as usize).div_ceil(bs);
        let hashes = if self.config.prefix_caching {
            chained_hashes_from(&request.prompt, bs, seed)
        } else {
            Vec::new()
        };
        let expected_cached = self.oracle_cached(&hashes, prompt_len);
        self.hold_hashes(&hashes);
        let seq = Seq {
            prompt: request.prompt,
            hashes,
            max_output,
            output: 0,
            computed: 0,
            target: prompt_len.max(1),
            blocks: Vec::new(),
            registered: 0,
            cached_tokens: 0,
            expected_cached,
            transferred: 0,
            adapter,
        };
        self.seqs.insert(request.id, seq);
        if need > self.pool.total() {
            self.rejected.push(request.id);
        } else {
            self.waiting.push_back(request.id);
        }
    }

    /// Queues a request whose first `transferred` prompt tokens arrive with their KV from a
    /// prefill engine (prefill/decode disaggregation: vLLM's KV connector loads the remote blocks
    /// before the request is scheduled). At admission those tokens count as computed, beyond
    /// whatever the prefix cache holds; at least one token is still computed so the next can be
    /// sampled. A preemption loses them: the engine recomputes its own KV.
    pub fn submit_transferred(&mut self, request: SeqRequest, transferred: u32) {
        let id = request.id;
        self.submit(request);
        self.mark_transferred(id, transferred);
    }

    /// Marks the first `transferred` prompt tokens of the queued request `id` as arriving with
    /// their KV (see [`Self::submit_transferred`]; for a request queued another way, such as
    /// for a LoRA adapter).
    pub fn mark_transferred(&mut self, id: u64, transferred: u32) {
        if let Some(seq) = self.seqs.get_mut(&id) {
            seq.transferred = transferred;
        }
    }

    /// Drops a request (the client went away), freeing its blocks. Returns its
    /// [`SeqEvent::Finished`], or `None` when the id is unknown.
    pub fn abort(&mut self, id: u64) -> Option<SeqEvent> {
        let seq = self.seqs.remove(&id)?;
        self.release_hashes(&seq.hashes);
        self.pool.release(&seq.blocks);
        if let Some(i) = self.running.iter().position(|&r| r == id) {
            self.running.remove(i);
        } else if let Some(i) = self.waiting.iter().position(|&w| w == id) {
            self.waiting.remove(i);
        } else {
            self.rejected.retain(|&r| r != id);
        }
        Some(SeqEvent::Finished {
            id,
            output_tokens: seq.output,
        })
    }

    /// Drops every sequence (the replica died): their blocks are freed and the cache emptied.
    /// Returns each one's id, prompt, output budget and output tokens so far, in id order.
    pub fn fail(&mut self) -> Vec<(u64, Vec<u32>, u32, u32)> {
        let mut out: Vec<(u64, Vec<u32>, u32, u32)> = self
            .seqs
            .drain()
            .map(|(id, s)| (id, s.prompt, s.max_output, s.output))
            .collect();
        out.sort_unstable_by_key(|x| x.0);
        self.waiting.clear();
        self.running.clear();
        self.rejected.clear();
        if let Some(pending) = &mut self.pending {
            pending.clear();
        }
        self.pool = super::pool::BlockPool::new(self.config.kv_blocks, self.config.prefix_caching);
        out
    }

    /// Whether nothing is running, waiting or pending rejection.
    pub fn is_idle(&self) -> bool {
        self.seqs.is_empty()
    }

    /// Runs one iteration; `None` when idle.
    pub fn step(&mut self) -> Option<Iteration> {
        if self.seqs.is_empty() {
            return None;
        }
        let mut it = Iteration::default();
        for id in std::mem::take(&mut self.rejected) {
            if let Some(seq) = self.seqs.remove(&id) {
                self.release_hashes(&seq.hashes);
            }
            it.events.push(SeqEvent::Finished {
                id,
                output_tokens: 0,
            });
        }
        let work = match self.config.batching {
            Batching::Chunked {
                max_num_batched_tokens,
            } => self.schedule_chunked(max_num_batched_tokens.max(1), &mut it),
            Batching::Continuous => self.schedule_continuous(&mut it),
            Batching::Static => self.schedule_static(&mut it),
        };
        it.scheduled_seqs = work.len() as u32;
        let mut context_tokens = 0u64;
        for w in &work {
            if w.decode {
                it.decode_seqs += 1;
                context_tokens += u64::from(w.context);
            } else {
                it.prefill_tokens += w.tokens;
            }
        }
        it.duration = self.config.cost.iteration(
            u64::from(it.prefill_tokens),
            u64::from(it.decode_seqs),
            context_tokens,
        ) + self.take_adapter_loads();
        let mut finished = Vec::new();
        for w in work {
            if self.execute(w, &mut it) {
                finished.push(w.id);
            }
        }
        if !finished.is_empty() {
            self.running.retain(|id| !finished.contains(id));
        }
        Some(it)
    }

    /// Drops the whole prefix cache (vLLM `reset_prefix_cache`): idle cached blocks become
    /// free and blocks in use stop being shareable. Returns `AllBlocksCleared` when anything was
    /// cached and KV events are on.
    pub fn reset_prefix_cache(&mut self) -> Option<KvEvent> {
        let any = self.pool.clear_cache();
        for seq in self.seqs.values_mut() {
            // Blocks still held are no longer cached; do not offer them again.
            seq.registered = seq
                .registered
                .max(seq.computed as usize / self.config.block_size);
        }
        (any && self.kv_events).then_some(KvEvent::AllBlocksCleared)
    }

    /// Checks the pool and queue invariants (tests only).
    #[cfg(test)]
    pub(crate) fn check(&self) -> Result<(), String> {
        self.pool.check()?;
        if self.running.len() > self.config.max_num_seqs {
            return Err("too many running".into());
        }
        let held: usize = self.seqs.values().map(|s| s.blocks.len()).sum();
        if held < self.pool.in_use() {
            return Err(format!(
                "{held} blocks held but {} in use",
                self.pool.in_use()
            ));
        }
        for id in self.waiting.iter().chain(&self.running) {
            if !self.seqs.contains_key(id) {
                return Err(format!("queued {id} unknown"));
            }
        }
        if self.waiting.len() + self.running.len() + self.rejected.len() != self.seqs.len() {
            return Err("queues and sequences disagree".into());
        }
        Ok(())
    }

    /// The gauges and counters.
    pub fn stats(&self) -> EngineStats {
        let total = self.pool.total();
        EngineStats {
            running: self.running.len() as u32,
            waiting: (self.waiting.len() + self.rejected.len()) as u32,
            kv_usage: if total == 0 {
                0.0
            } else {
                self.pool.in_use() as f64 / total as f64
            },
            uncached_blocks: self.uncached_blocks(),
            free_blocks: self.pool.available() as u64,
            total_blocks: total as u64,
            prefix_queries_tokens: self.prefix_queries_tokens,
            prefix_hits_tokens: self.prefix_hits_tokens,
            preemptions: self.preemptions,
        }
    }

    /// Blocks the running sequences hold beyond their admission's prefix-cache hits. A block
    /// one sequence computed and another reuses counts once, for the one that computed it; a
    /// reused block stops counting when its owner finishes.
    fn uncached_blocks(&self) -> u64 {
        let bs = self.config.block_size;
        self.running
            .iter()
            .map(|id| {
                let seq = &self.seqs[id];
                seq.blocks
                    .len()
                    .saturating_sub(seq.cached_tokens as usize / bs) as u64
            })
            .sum()
    }

    /// Applies scheduled work; returns whether the sequence finished.
    fn execute(&mut self, w: Work, it: &mut Iteration) -> bool {
        let on_schedule = self.caches_on_schedule();
        let seq = self.seqs.get_mut(&w.id).expect("scheduled");
        seq.computed += w.tokens;
        if !w.decode && !on_schedule {
            let computed = seq.computed;
            self.register(w.id, computed, it);
        }
        let seq = self.seqs.get_mut(&w.id).expect("scheduled");
        if seq.prefilling() {
            return false;
        }
        seq.output += 1;
        it.output_tokens += 1;
        if seq.output == 1 {
            it.events.push(SeqEvent::FirstToken {
                id: w.id,
                cached_tokens: seq.cached_tokens,
            });
        } else if self.token_events {
            it.events.push(SeqEvent::Token { id: w.id });
        }
        if seq.output < seq.max_output {
            return false;
        }
        let seq = self.seqs.remove(&w.id).expect("scheduled");
        self.release_hashes(&seq.hashes);
        self.pool.release(&seq.blocks);
        it.events.push(SeqEvent::Finished {
            id: w.id,
            output_tokens: seq.output,
        });
        true
    }
}

#[path = "oracle.rs"]
mod oracle;

#[cfg(test)]
mod tests;
