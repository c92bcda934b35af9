//! The boundary between the server and the engine model that decides timing.
//!
//! The scheduler needs five operations of [`kvgate_sim::model::EngineModel`] (submit, abort,
//! step, stats, the LoRA adapter gauges); [`StepModel`] names them so the scheduler depends on a role, not on the
//! simulator's full surface.

use crate::config::EngineConfig;
use kvgate_sim::model::{Batching, EngineModel};
pub(crate) use kvgate_sim::model::{EngineStats, Iteration, LoraStats, SeqEvent, SeqRequest};

/// What the scheduler needs from an engine model.
pub(crate) trait StepModel: Send + 'static {
    /// Drops a sequence (the client went away) and frees its blocks.
    fn abort(&mut self, id: u64);
    /// Runs one iteration; `None` when nothing is running or waiting.
    fn step(&mut self) -> Option<Iteration>;
    /// Current gauges and counters.
    fn stats(&self) -> EngineStats;
    /// Queues a sequence for a LoRA adapter (`None`: the base model) whose first
    /// `transferred` prompt tokens' KV came from a prefill engine.
    fn submit(&mut self, request: SeqRequest, adapter: Option<&str>, transferred: u32);
    /// The adapter gauges, when adapters are served.
    fn lora_stats(&self) -> Option<LoraStats>;
}

impl StepModel for EngineModel {
    fn abort(&mut self, id: u64) {
        // The returned `Finished` is not needed: the handler that aborts is already gone.
        let _ = EngineModel::abort(self, id);
    }

    fn step(&mut self) -> Option<Iteration> {
        EngineModel::step(self)
    }

    fn stats(&self) -> EngineStats {
        EngineModel::stats(self)
    }

    fn submit(&mut self, request: SeqRequest, adapter: Option<&str>, transferred: u32) {
        let id = request.id;
        EngineModel::submit_with_adapter(self, request, adapter);
        if transferred > 0 {
            EngineModel::mark_transferred(self, id, transferred);
        }
    }

    fn lora_stats(&self) -> Option<LoraStats> {
        EngineModel::lora_stats(self)
    }
}

/// The simulator's engine model configured from `config`.
pub(crate) fn build(config: &EngineConfig) -> Box<dyn StepModel> {
    let batching = match config.batching {
        crate::config::BatchingMode::Static => Batching::Static,
        crate::config::BatchingMode::Continuous => Batching::Continuous,
        crate::config::BatchingMode::Chunked => Batching::Chunked {
            max_num_batched_tokens: config.max_num_batched_tokens,
        },
    };
    let model = EngineModel::new(kvgate_sim::model::EngineConfig {
        max_num_seqs: config.max_num_seqs,
        kv_blocks: config.kv_blocks,
        block_size: config.block_size,
        batching,
        prefix_caching: config.prefix_caching,
        cost: config.cost,
    })
    .with_kv_events(config.kv_events.is_some());
    let model = if config.lora.enabled() {
        model.with_lora(config.lora.model_config())
    } else {
        model
    };
    Box::new(model)
}
