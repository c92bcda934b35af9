//! Which sequences compute what in one iteration, per batching mode (the parent module's
//! documentation states the semantics): chunked prefill shares a token budget with the decodes,
//! continuous batching prefills whole admitted prompts and stalls decodes for that iteration,
//! static batching admits only once the previous batch has finished.

use super::{EngineModel, Work};
use crate::model::Iteration;

impl EngineModel {
    pub(super) fn schedule_chunked(&mut self, budget: usize, it: &mut Iteration) -> Vec<Work> {
        let mut budget = budget as u32;
        let mut work = Vec::with_capacity(self.running.len() + 1);
        let preemptions_before = self.preemptions;
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let seq = &self.seqs[&id];
            let (tokens, decode) = if seq.prefilling() {
                ((seq.target - seq.computed).min(budget), false)
            } else {
                (1, true)
            };
            let Some(computed) = self.reserve(i, tokens, it) else {
                break; // `id` itself was preempted: it was last, nothing follows
            };
            budget -= tokens;
            if !decode {
                self.register(id, computed + tokens, it);
            }
            let context = if decode { computed + 1 } else { 0 };
            work.push(Work {
                id,
                tokens,
                decode,
                context,
            });
            i += 1;
        }
        // Like vLLM, nothing new is admitted in an iteration that had to preempt.
        if self.preemptions == preemptions_before {
            while budget > 0 {
                let Some(tokens) = self.admit(Some(budget), it) else {
                    break;
                };
                let id = *self.running.last().expect("admitted");
                budget -= tokens;
                work.push(Work {
                    id,
                    tokens,
                    decode: false,
                    context: 0,
                });
            }
        }
        work
    }

    pub(super) fn schedule_continuous(&mut self, it: &mut Iteration) -> Vec<Work> {
        let mut work = Vec::new();
        self.admit_whole(&mut work, it);
        if work.is_empty() {
            self.schedule_decodes(&mut work, it);
        }
        work
    }

    pub(super) fn schedule_static(&mut self, it: &mut Iteration) -> Vec<Work> {
        let mut work = Vec::new();
        if self.running.is_empty() {
            self.admit_whole(&mut work, it);
        } else {
            self.schedule_decodes(&mut work, it);
        }
        work
    }

    /// Admits every waiting sequence that fits, each prefilling its whole prompt.
    fn admit_whole(&mut self, work: &mut Vec<Work>, it: &mut Iteration) {
        while let Some(tokens) = self.admit(None, it) {
            let id = *self.running.last().expect("admitted");
            work.push(Work {
                id,
                tokens,
                decode: false,
                context: 0,
            });
        }
    }

    /// One decode token for every running sequence, preempting from the back for blocks.
    pub(super) fn schedule_decodes(&mut self, work: &mut Vec<Work>, it: &mut Iteration) {
        let mut i = 0;
        while i < self.running.len() {
            let id = self.running[i];
            let Some(computed) = self.reserve(i, 1, it) else {
                break;
            };
            work.push(Work {
                id,
                tokens: 1,
                decode: true,
                context: computed + 1,
            });
            i += 1;
        }
    }
}
