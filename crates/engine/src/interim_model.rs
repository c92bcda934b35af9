//! A minimal continuous-batching model used until `kvgate_sim::model` is merged: unbounded
//! prefix cache of full prompt blocks, whole-prompt prefill in one iteration, one token per
//! running sequence per iteration.

use crate::backend::{EngineStats, Iteration, SeqEvent, SeqRequest, StepModel};
use kvgate_core::index::blocks::{block_hashes, KvEvent, Tier};
use kvgate_core::Nanos;
use std::collections::{HashSet, VecDeque};

#[derive(Debug)]
struct Seq {
    id: u64,
    max_output_tokens: u32,
    produced: u32,
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct InterimModel {
    max_num_seqs: usize,
    block_size: usize,
    cached: HashSet<u64>,
    waiting: VecDeque<SeqRequest>,
    running: Vec<Seq>,
    stats: EngineStats,
}

impl InterimModel {
    pub(crate) fn new(max_num_seqs: usize, block_size: usize) -> Self {
        InterimModel {
            max_num_seqs,
            block_size,
            cached: HashSet::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            stats: EngineStats::default(),
        }
    }
}

impl StepModel for InterimModel {
    fn submit(&mut self, request: SeqRequest) {
        self.waiting.push_back(request);
    }

    fn abort(&mut self, id: u64) {
        self.waiting.retain(|r| r.id != id);
        self.running.retain(|s| s.id != id);
    }

    fn step(&mut self) -> Option<Iteration> {
        if self.waiting.is_empty() && self.running.is_empty() {
            return None;
        }
        let mut events = Vec::new();
        let mut kv_events = Vec::new();
        let decode_seqs = self.running.len() as u32;
        for seq in &mut self.running {
            seq.produced += 1;
            events.push(SeqEvent::Token { id: seq.id });
        }
        let mut prefill_tokens = 0u32;
        while self.running.len() < self.max_num_seqs {
            let Some(req) = self.waiting.pop_front() else {
                break;
            };
            let hashes = block_hashes(&req.prompt, self.block_size, 0);
            let hit = hashes
                .iter()
                .take_while(|h| self.cached.contains(h))
                .count();
            let cached_tokens = (hit * self.block_size) as u32;
            let new: Vec<u64> = hashes[hit..].to_vec();
            if !new.is_empty() {
                let start = hit * self.block_size;
                kv_events.push(KvEvent::BlockStored {
                    parent_block_hash: hit.checked_sub(1).map(|i| hashes[i]),
                    token_ids: req.prompt[start..start + new.len() * self.block_size].to_vec(),
                    block_hashes: new.clone(),
                    block_size: self.block_size as u32,
                    tier: Tier::Device,
                });
                self.cached.extend(new);
            }
            self.stats.prefix_queries_tokens += req.prompt.len() as u64;
            self.stats.prefix_hits_tokens += u64::from(cached_tokens);
            prefill_tokens += req.prompt.len() as u32 - cached_tokens;
            events.push(SeqEvent::FirstToken {
                id: req.id,
                cached_tokens,
            });
            self.running.push(Seq {
                id: req.id,
                max_output_tokens: req.max_output_tokens,
                produced: 1,
            });
        }
        self.running.retain(|s| {
            let done = s.produced >= s.max_output_tokens;
            if done {
                events.push(SeqEvent::Finished {
                    id: s.id,
                    output_tokens: s.produced,
                });
            }
            !done
        });
        self.stats.running = self.running.len() as u32;
        self.stats.waiting = self.waiting.len() as u32;
        let duration = Nanos(
            5_000_000 + 100_000 * u64::from(prefill_tokens) + 200_000 * u64::from(decode_seqs),
        );
        Some(Iteration {
            duration,
            decode_seqs,
            events,
            kv_events,
        })
    }

    fn stats(&self) -> EngineStats {
        self.stats
    }
}
