//! A sequence's KV blocks: admitting it with its prefix-cache hits, reserving blocks as it
//! grows (preempting from the back of the batch to make room), and offering its computed
//! blocks to the prefix cache.

use super::{EngineModel, Seq};
use crate::model::pool::BlockId;
use crate::model::{Batching, Iteration, SeqEvent};
use kvgate_core::index::blocks::{KvEvent, Tier};

impl EngineModel {
    /// Makes sure `running[i]` has blocks for `tokens` more tokens, preempting running
    /// sequences from the back as needed. Returns the sequence's computed tokens, or `None`
    /// when `running[i]` itself had to go.
    pub(super) fn reserve(&mut self, i: usize, tokens: u32, it: &mut Iteration) -> Option<u32> {
        let id = self.running[i];
        let bs = self.config.block_size;
        loop {
            let seq = &self.seqs[&id];
            let computed = seq.computed;
            let need = (computed as usize + tokens as usize)
                .div_ceil(bs)
                .saturating_sub(seq.blocks.len());
            if need == 0 {
                return Some(computed);
            }
            if need <= self.pool.available() {
                let mut fresh = Vec::with_capacity(need);
                for _ in 0..need {
                    fresh.push(self.allocate(it));
                }
                self.seqs
                    .get_mut(&id)
                    .expect("running")
                    .blocks
                    .extend(fresh);
                return Some(computed);
            }
            let victim = self.running.pop().expect("running is not empty");
            self.preempt(victim, it);
            if victim == id {
                return None;
            }
        }
    }

    fn allocate(&mut self, it: &mut Iteration) -> BlockId {
        let (block, evicted) = self.pool.allocate().expect("checked available");
        if let (Some(hash), true) = (evicted, self.kv_events) {
            it.kv_events.push(KvEvent::BlockRemoved {
                block_hashes: vec![hash],
                tier: Tier::Device,
            });
        }
        block
    }

    fn preempt(&mut self, id: u64, it: &mut Iteration) {
        let seq = self.seqs.get_mut(&id).expect("running");
        self.pool.release(&seq.blocks);
        seq.blocks.clear();
        seq.computed = 0;
        seq.transferred = 0;
        seq.registered = 0;
        seq.target = (seq.prompt.len() as u32).max(1) + seq.output;
        self.waiting.push_front(id);
        self.preemptions += 1;
        it.events.push(SeqEvent::Preempted { id });
    }

    /// Admits the head of the queue (the first request whose LoRA adapter may join the batch,
    /// [`EngineModel::admissible`]) if a slot and its blocks are available, computing at most
    /// `budget` tokens of it this iteration. Returns the tokens scheduled.
    pub(super) fn admit(&mut self, budget: Option<u32>, it: &mut Iteration) -> Option<u32> {
        if self.running.len() >= self.config.max_num_seqs {
            return None;
        }
        let pos = self.admissible()?;
        let id = self.waiting[pos];
        let bs = self.config.block_size;
        let seq = &self.seqs[&id];
        // At least one token is computed, so the last token can be sampled.
        let max_hits = (seq.target as usize - 1) / bs;
        let mut found = std::mem::take(&mut self.found);
        found.clear();
        let mut idle_hits = 0;
        for h in seq.hashes.iter().take(max_hits) {
            match self.pool.lookup(*h) {
                Some((block, idle)) => {
                    found.push(block);
                    idle_hits += usize::from(idle);
                }
                None => break,
            }
        }
        let hits = found.len();
        let local = (hits * bs) as u32;
        let cached = local.max(seq.transferred.min(seq.target - 1));
        let tokens = (seq.target - cached).min(budget.unwrap_or(u32::MAX));
        let need = (cached as usize + tokens as usize).div_ceil(bs) - hits;
        if need + idle_hits > self.pool.available() {
            self.found = found;
            return None;
        }
        self.waiting.remove(pos);
        let mut blocks = Vec::with_capacity((seq.target as usize).div_ceil(bs));
        for &block in &found {
            self.pool.acquire(block);
            blocks.push(block);
        }
        self.found = found;
        // Evictions here cannot touch this sequence's hits: they are referenced now.
        for _ in 0..need {
            blocks.push(self.allocate(it));
        }
        let seq = self.seqs.get_mut(&id).expect("waiting");
        seq.blocks = blocks;
        seq.computed = cached;
        seq.registered = hits;
        seq.cached_tokens = cached;
        let prompt_len = seq.prompt.len() as u64;
        self.prefix_queries_tokens += prompt_len;
        self.prefix_hits_tokens += u64::from(local);
        self.running.push(id);
        self.adapter_admitted(id);
        if self.caches_on_schedule() {
            self.register(id, cached + tokens, it);
        }
        Some(tokens)
    }

    /// Whether blocks are offered to the prefix cache when scheduled rather than once computed.
    /// vLLM v1, whose scheduler is the chunked one, caches a block when it allocates the slots that
    /// will hold it (`KVCacheManager::allocate_slots` caches up to the computed plus the newly
    /// scheduled tokens), so a sequence admitted later in the same iteration finds the blocks an
    /// earlier one is computing there: each layer's KV is written before attention reads it, so the
    /// hits are sound, and a fan-out's siblings never recompute the prefix their first call is
    /// prefilling (checked on vLLM 0.32: four prompts sharing 800 tokens, sent in one batch, report
    /// 3 x 800 cached tokens). vLLM v0 marked blocks computed after the step, which the
    /// whole-prompt modes (and the reference labs built on them) keep; caching on schedule there
    /// too moved the routing lab off its reference ordering (`least_kv`'s TTFT P95 at seed 5 fell
    /// below `random`'s; docs/background.md#routing-lab).
    pub(super) fn caches_on_schedule(&self) -> bool {
        matches!(self.config.batching, Batching::Chunked { .. })
    }

    /// Offers to the prefix cache the full prompt blocks of `id` through its first `upto`
    /// tokens ([`Self::caches_on_schedule`] says when).
    pub(super) fn register(&mut self, id: u64, upto: u32, it: &mut Iteration) {
        if !self.config.prefix_caching {
            return;
        }
        let bs = self.config.block_size;
        let seq = self.seqs.get(&id).expect("scheduled");
        let full = (upto as usize / bs).min(seq.hashes.len());
        let mut stored_from = None;
        for b in seq.registered..full {
            let ok = self.pool.register(seq.blocks[b], seq.hashes[b]);
            match (ok, stored_from) {
                (true, None) => stored_from = Some(b),
                (false, Some(from)) => {
                    if self.kv_events {
                        let lora = self.adapter_name(seq.adapter);
                        it.kv_events.push(stored_event(seq, from, b, bs, lora));
                    }
                    stored_from = None;
                }
                _ => {}
            }
        }
        if let (Some(from), true) = (stored_from, self.kv_events) {
            let lora = self.adapter_name(seq.adapter);
            it.kv_events.push(stored_event(seq, from, full, bs, lora));
        }
        let seq = self.seqs.get_mut(&id).expect("scheduled");
        seq.registered = seq.registered.max(full);
    }
}

/// `BlockStored` for prompt blocks `from..to` of `seq`.
fn stored_event(seq: &Seq, from: usize, to: usize, bs: usize, lora: Option<String>) -> KvEvent {
    KvEvent::BlockStored {
        block_hashes: seq.hashes[from..to].to_vec(),
        parent_block_hash: from.checked_sub(1).map(|p| seq.hashes[p]),
        token_ids: seq.prompt[from * bs..to * bs].to_vec(),
        block_size: bs as u32,
        tier: Tier::Device,
        lora_name: lora,
    }
}
