//! LoRA adapters in the engine model, as vLLM serves them (`--enable-lora`): a batch holds at
//! most `max_loras` distinct adapters, and the scheduler skips a waiting request whose adapter
//! would be one too many (vLLM `v1/core/sched/scheduler.py`), so it waits until some running
//! adapter's requests have all finished while requests for running adapters are admitted past
//! it. Adapter weights live in a CPU cache of `max_cpu_loras` adapters (least recently used
//! goes; vLLM's default size is `max_loras`); admitting a request whose adapter is not there
//! loads it first, which lengthens that iteration by `load`. An adapter's prompt blocks hash
//! apart from the base model's and from other adapters' (vLLM puts the adapter in each block's
//! extra hash keys), and its KV events carry its name (`lora_name`).

use kvgate_core::Nanos;
use serde::{Deserialize, Serialize};

/// How the engine serves adapters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoraConfig {
    /// Distinct adapters one batch may hold (vLLM `--max-loras`, default 1).
    pub max_loras: usize,
    /// Adapters kept loaded in memory (vLLM `--max-cpu-loras`, default `max_loras`).
    pub max_cpu_loras: usize,
    /// Time to load an adapter that is not in memory.
    pub load: Nanos,
}

impl Default for LoraConfig {
    fn default() -> Self {
        LoraConfig {
            max_loras: 1,
            max_cpu_loras: 1,
            load: Nanos::from_millis(100),
        }
    }
}

/// The adapters of the requests the engine holds (vLLM's `vllm:lora_requests_info` labels).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoraStats {
    /// `max_lora`.
    pub max_loras: usize,
    /// Distinct adapters of running requests, in batch order.
    pub running: Vec<String>,
    /// Distinct adapters of waiting requests, in queue order.
    pub waiting: Vec<String>,
    /// Adapters loaded so far.
    pub loads: u64,
}
