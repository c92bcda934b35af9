//! The boundary between the server and the engine model that decides timing.
//!
//! The scheduler only needs the five operations of `kvgate_sim::model::EngineModel` (submit,
//! abort, step, stats). [`StepModel`] names them so the scheduler can be tested against a model
//! and the simulator's model plugs in with one `impl`.

use kvgate_core::index::blocks::KvEvent;
use kvgate_core::Nanos;

/// One sequence to run: its prompt tokens and how many tokens to generate.
#[derive(Clone, Debug)]
pub(crate) struct SeqRequest {
    pub(crate) id: u64,
    pub(crate) prompt: Vec<u32>,
    pub(crate) max_output_tokens: u32,
}

/// What happened to one sequence during an iteration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SeqEvent {
    /// The first output token; `cached_tokens` of the prompt came from the prefix cache.
    FirstToken { id: u64, cached_tokens: u32 },
    /// One more output token.
    Token { id: u64 },
    /// The sequence ended and released its blocks.
    Finished { id: u64, output_tokens: u32 },
    /// The sequence lost its blocks and will be recomputed.
    #[allow(dead_code)]
    Preempted { id: u64 },
}

/// One engine iteration.
#[derive(Clone, Debug)]
pub(crate) struct Iteration {
    pub(crate) duration: Nanos,
    pub(crate) decode_seqs: u32,
    pub(crate) events: Vec<SeqEvent>,
    pub(crate) kv_events: Vec<KvEvent>,
}

/// Gauges and counters the engine model keeps.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct EngineStats {
    pub(crate) running: u32,
    pub(crate) waiting: u32,
    pub(crate) kv_usage: f64,
    pub(crate) prefix_queries_tokens: u64,
    pub(crate) prefix_hits_tokens: u64,
    pub(crate) preemptions: u64,
}

/// What the scheduler needs from an engine model.
pub(crate) trait StepModel: Send + 'static {
    /// Queues a sequence.
    fn submit(&mut self, request: SeqRequest);
    /// Drops a sequence (the client went away) and frees its blocks.
    fn abort(&mut self, id: u64);
    /// Runs one iteration; `None` when nothing is running or waiting.
    fn step(&mut self) -> Option<Iteration>;
    /// Current gauges and counters.
    fn stats(&self) -> EngineStats;
}

/// The engine model for `config`.
pub(crate) fn build(config: &crate::config::EngineConfig) -> Box<dyn StepModel> {
    Box::new(crate::interim_model::InterimModel::new(
        config.max_num_seqs,
        config.block_size,
    ))
}
