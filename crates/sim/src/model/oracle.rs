//! What an all-knowing router would read off an engine: the true prefill work queued ahead of a
//! new request, how much of its prompt the cache will serve (blocks cached now, or held by
//! sequences already here, which will be cached by the time it is admitted), and the cost model
//! itself. The fleet's oracle router picks the replica where this predicts the earliest first
//! token; `kvgate sim` reports every policy's gap to it.
//!
//! It is an oracle of information, not of foresight: it greedily minimises each request's own
//! time to first token, as `predicted_ttft` does with learned, stale and approximate inputs.

use super::{chained_hashes, EngineModel};
use crate::model::{Batching, SeqEvent, SeqRequest};
use kvgate_core::fasthash::IntMap;
use kvgate_core::Nanos;

impl EngineModel {
    /// Keeps the prompt-block hashes of every sequence held, so [`Self::oracle_ttft`] can count
    /// blocks that are about to be cached. Off by default (it costs a map update per block).
    pub fn with_oracle(mut self, on: bool) -> Self {
        self.pending = on.then(IntMap::default);
        self
    }

    pub(super) fn hold_hashes(&mut self, hashes: &[u64]) {
        if let Some(pending) = &mut self.pending {
            for &h in hashes {
                *pending.entry(h).or_insert(0) += 1;
            }
        }
    }

    pub(super) fn release_hashes(&mut self, hashes: &[u64]) {
        if let Some(pending) = &mut self.pending {
            for h in hashes {
                if let Some(n) = pending.get_mut(h) {
                    *n -= 1;
                    if *n == 0 {
                        pending.remove(h);
                    }
                }
            }
        }
    }

    /// Prompt tokens the cache would serve a prompt with these block hashes: its leading
    /// blocks cached now or held by a sequence here (at least one token is always computed).
    pub(super) fn oracle_cached(&self, hashes: &[u64], prompt_len: u32) -> u32 {
        let Some(pending) = &self.pending else {
            return 0;
        };
        let bs = self.config.block_size;
        let max_hits = (prompt_len.max(1) as usize - 1) / bs;
        let hits = hashes
            .iter()
            .take(max_hits)
            .take_while(|h| self.pool.lookup(**h).is_some() || pending.contains_key(h))
            .count();
        (hits * bs) as u32
    }

    /// Prompt tokens the cache would serve `prompt` ([`Self::with_oracle`] on): its leading
    /// blocks cached now or held by a sequence here.
    pub fn oracle_cached_tokens(&self, prompt: &[u32]) -> u32 {
        let prompt_len = u32::try_from(prompt.len()).unwrap_or(u32::MAX);
        self.oracle_cached(&chained_hashes(prompt, self.config.block_size), prompt_len)
    }

    /// The time this engine would take, from the end of the iteration in progress, to produce
    /// the first token of `prompt` submitted now: the prefill work of every sequence ahead of it
    /// (first come, first served) plus its own uncached tokens, in iterations of the configured
    /// token budget shared with the current decode batch, timed by the cost model. Slots and
    /// KV capacity are not modelled (an oracle of information, not a second simulator).
    pub fn oracle_ttft(&self, prompt: &[u32]) -> Nanos {
        let bs = self.config.block_size;
        let prompt_len = u32::try_from(prompt.len()).unwrap_or(u32::MAX).max(1);
        let own = prompt_len - self.oracle_cached(&chained_hashes(prompt, bs), prompt_len);
        let mut ahead = 0u64;
        let (mut decodes, mut context) = (0u64, 0u64);
        for id in self.waiting.iter().chain(&self.rejected) {
            let seq = &self.seqs[id];
            ahead += u64::from(
                seq.target
                    .saturating_sub(seq.expected_cached.max(seq.computed)),
            );
        }
        for id in &self.running {
            let seq = &self.seqs[id];
            if seq.prefilling() {
                ahead += u64::from(seq.target - seq.computed);
            } else {
                decodes += 1;
                context += u64::from(seq.computed) + 1;
            }
        }
        let work = ahead + u64::from(own);
        let chunk = match self.config.batching {
            Batching::Chunked {
                max_num_batched_tokens,
            } => (max_num_batched_tokens as u64)
                .saturating_sub(decodes)
                .max(1),
            // Whole prompts in one iteration (decodes wait while anything prefills).
            Batching::Continuous | Batching::Static => work.max(1),
        };
        let decodes_in = match self.config.batching {
            Batching::Chunked { .. } => decodes,
            Batching::Continuous | Batching::Static => 0,
        };
        let context_in = if decodes_in > 0 { context } else { 0 };
        let full = work / chunk;
        let last = work % chunk;
        let cost = &self.config.cost;
        let mut total = Nanos(cost.iteration(chunk, decodes_in, context_in).0 * full);
        if last > 0 {
            total = total + cost.iteration(last, decodes_in, context_in);
        }
        total
    }

    /// The time this engine would take, from the end of the iteration in progress, to produce
    /// the first token of `prompt` submitted now, if nothing else arrived: a copy of the engine
    /// runs forward, its own scheduler, cache and cost model included. `None` when the prompt
    /// can never fit the pool.
    ///
    /// This is the best point prediction any router can make: it knows everything about the
    /// replica but the future. What it still misses is the work that arrives later and shares
    /// the iteration that computes this prompt's last chunk (FCFS puts that work behind it, but
    /// the chunk budget lets it in), and that is where `kvgate sim` reports the ceiling of
    /// prediction accuracy.
    pub fn forward_ttft(&self, prompt: &[u32]) -> Option<Nanos> {
        const PROBE: u64 = u64::MAX;
        let mut engine = self.clone().with_kv_events(false).with_token_events(false);
        engine.pending = None;
        engine.submit(SeqRequest {
            id: PROBE,
            prompt: prompt.to_vec(),
            max_output_tokens: 1,
        });
        let mut elapsed = Nanos::ZERO;
        while let Some(it) = engine.step() {
            elapsed = elapsed + it.duration;
            for event in &it.events {
                match *event {
                    SeqEvent::FirstToken { id: PROBE, .. } => return Some(elapsed),
                    SeqEvent::Finished { id: PROBE, .. } => return None,
                    _ => {}
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use crate::model::{Batching, CostModel, EngineConfig, EngineModel, SeqEvent, SeqRequest};
    use kvgate_core::Nanos;

    fn engine() -> EngineModel {
        EngineModel::new(EngineConfig {
            max_num_seqs: 8,
            kv_blocks: 1_000,
            block_size: 16,
            batching: Batching::Chunked {
                max_num_batched_tokens: 512,
            },
            prefix_caching: true,
            cost: CostModel::default(),
        })
        .with_token_events(false)
        .with_kv_events(false)
        .with_oracle(true)
    }

    #[test]
    fn queued_work_and_soon_cached_prefixes_count() {
        let mut e = engine();
        let cost = CostModel::default();
        let prompt: Vec<u32> = (0..1_000).collect();
        // Idle: its own 1,000 tokens in 512-token iterations.
        assert_eq!(
            e.oracle_ttft(&prompt),
            Nanos(cost.iteration(512, 0, 0).0 + cost.iteration(488, 0, 0).0)
        );
        e.submit(SeqRequest {
            id: 1,
            prompt: prompt.clone(),
            max_output_tokens: 4,
        });
        // The same prompt again: 992 tokens will be cached, 1,000 are queued ahead, 8 are its own.
        assert_eq!(
            e.oracle_ttft(&prompt),
            Nanos(cost.iteration(512, 0, 0).0 + cost.iteration(496, 0, 0).0)
        );
        let other: Vec<u32> = (5_000..5_100).collect();
        assert_eq!(
            e.oracle_ttft(&other),
            Nanos(cost.iteration(512, 0, 0).0 * 2 + cost.iteration(76, 0, 0).0)
        );
    }

    #[test]
    fn the_forward_prediction_is_what_the_engine_then_does() {
        let mut e = engine();
        let prompt: Vec<u32> = (0..1_000).collect();
        e.submit(SeqRequest {
            id: 1,
            prompt: prompt.clone(),
            max_output_tokens: 4,
        });
        let predicted = e.forward_ttft(&prompt).expect("fits");
        // A sibling sent now is admitted in the iteration that computes the first call's last
        // chunk and finds those blocks cached as they are scheduled (vLLM v1): it computes its
        // own last 8 tokens in that same iteration, as the queue model says.
        assert_eq!(predicted, e.oracle_ttft(&prompt));
        e.submit(SeqRequest {
            id: 2,
            prompt,
            max_output_tokens: 4,
        });
        let mut elapsed = Nanos::ZERO;
        loop {
            let it = e.step().expect("the sibling is still queued");
            elapsed = elapsed + it.duration;
            if it
                .events
                .iter()
                .any(|ev| matches!(ev, SeqEvent::FirstToken { id: 2, .. }))
            {
                break;
            }
        }
        assert_eq!(predicted, elapsed);
        let too_long: Vec<u32> = (0..20_000).collect();
        assert_eq!(e.forward_ttft(&too_long), None);
    }
}
