//! The emulated engine's configuration: identity, the engine model's capacity, time scale,
//! output lengths, KV events and faults.

use crate::faults::Fault;
pub use kvgate_sim::model::CostModel;
use serde::{Deserialize, Serialize};
use std::str::FromStr;

/// How the engine model forms batches; see `kvgate_sim::model::Batching`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchingMode {
    /// A batch runs until its longest sequence ends.
    Static,
    /// Iteration-level scheduling; an iteration with a prefill does no decoding.
    Continuous,
    /// Continuous batching with chunked prefill within `max_num_batched_tokens` (vLLM's default).
    Chunked,
}

impl FromStr for BatchingMode {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "static" => Ok(BatchingMode::Static),
            "continuous" => Ok(BatchingMode::Continuous),
            "chunked" => Ok(BatchingMode::Chunked),
            other => Err(ConfigError(format!(
                "unknown batching mode `{other}` (static, continuous, chunked)"
            ))),
        }
    }
}

/// Everything `serve` needs. [`EngineConfig::default`] resembles a mid-size model (~8B) on one
/// GPU, like the simulator's default engine model.
///
/// It is also a serde config section (snake_case keys as the fields, every key optional, faults
/// as spec strings), so a config file can describe emulated engines.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineConfig {
    /// Name of this engine in logs and in the `x-kvgate-engine` response header.
    pub id: String,
    /// The served model name (`/v1/models`, `model` in responses, the `model_name` label).
    pub model: String,
    /// KV blocks in the pool (vLLM `num_gpu_blocks`).
    pub kv_blocks: usize,
    /// Tokens per KV block (vLLM `--block-size`; 16 on GPUs).
    pub block_size: usize,
    /// Batch slots (vLLM `--max-num-seqs`).
    pub max_num_seqs: usize,
    /// Token budget per iteration with chunked prefill (vLLM `--max-num-batched-tokens`).
    pub max_num_batched_tokens: usize,
    /// How batches are formed.
    pub batching: BatchingMode,
    /// Iteration time as a function of the work in it.
    pub cost: CostModel,
    /// Longest prompt plus output accepted (vLLM `--max-model-len`).
    pub max_model_len: usize,
    /// Whether full prompt blocks are reused across requests (vLLM `--enable-prefix-caching`).
    pub prefix_caching: bool,
    /// Real seconds slept per modelled second of engine time; 0 runs as fast as possible.
    pub time_scale: f64,
    /// Mean output length, in tokens, when a request does not force its length with `ignore_eos`.
    pub mean_output_tokens: u32,
    /// Seed for output lengths, output text and fault draws.
    pub seed: u64,
    /// ZMQ endpoint for KV events (`tcp://*:5557` binds, `tcp://127.0.0.1:5557` connects).
    pub kv_events: Option<String>,
    /// Topic frame of each KV-event message (vLLM's `kv_events_config.topic`).
    pub kv_events_topic: String,
    /// A model directory (`tokenizer.json`, chat template) to tokenize prompts with, as vLLM
    /// would with that model; without one, the built-in stand-in tokenizer.
    #[serde(default)]
    pub tokenizer: Option<std::path::PathBuf>,
    /// Faults active from startup.
    #[serde(with = "fault_specs")]
    pub faults: Vec<Fault>,
    /// Bearer token for `/admin/*`; without one only loopback clients may use it.
    pub admin_token: Option<String>,
    /// Which legs of disaggregated requests it serves (`crate::pd`).
    pub role: crate::pd::Role,
    /// KV link bandwidth to decode engines, gigabytes per second.
    pub kv_bandwidth_gbps: f64,
    /// Fixed time per KV transfer, milliseconds.
    pub kv_transfer_setup_ms: f64,
    /// KV bytes per token (the cost model's 8B model: 128 KiB).
    pub kv_bytes_per_token: u64,
    /// How long a prefill holds KV no decode engine has read.
    pub kv_lease_secs: f64,
    /// The longest a decode leg waits for its prefill's KV.
    pub kv_wait_ms: u64,
    /// LoRA adapters (vLLM `--enable-lora`, `--lora-modules`, `--max-loras`).
    pub lora: crate::lora::LoraSettings,
}

impl Default for EngineConfig {
    /// The simulator's default engine (an ~8B model on one H100: 256 slots, 8,192 blocks of 16
    /// tokens, chunked prefill with a 2,048-token budget, `CostModel::default()`), a 32K
    /// context, real time, mean output 128 tokens.
    fn default() -> Self {
        let model = kvgate_sim::model::EngineConfig::default();
        let transfer = kvgate_core::disagg::Transfer::default();
        let max_num_batched_tokens = match model.batching {
            kvgate_sim::model::Batching::Chunked {
                max_num_batched_tokens,
            } => max_num_batched_tokens,
            _ => 2048,
        };
        EngineConfig {
            id: "engine-0".to_owned(),
            model: "kvgate-emulated".to_owned(),
            kv_blocks: model.kv_blocks,
            block_size: model.block_size,
            max_num_seqs: model.max_num_seqs,
            max_num_batched_tokens,
            batching: BatchingMode::Chunked,
            cost: model.cost,
            max_model_len: 32_768,
            prefix_caching: true,
            time_scale: 1.0,
            mean_output_tokens: 128,
            seed: 0,
            kv_events: None,
            kv_events_topic: "kv-events".to_owned(),
            tokenizer: None,
            faults: Vec::new(),
            admin_token: None,
            role: crate::pd::Role::Both,
            kv_bandwidth_gbps: transfer.bandwidth_gbps,
            kv_transfer_setup_ms: transfer.setup_ms,
            kv_bytes_per_token: transfer.bytes_per_token,
            // vLLM's NIXL connector leases a prefill's blocks for 30 s.
            kv_lease_secs: 30.0,
            kv_wait_ms: 30_000,
            lora: crate::lora::LoraSettings::default(),
        }
    }
}

/// Faults as their spec strings in serde.
mod fault_specs {
    use super::Fault;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(faults: &[Fault], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(faults.iter().map(Fault::to_string))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Fault>, D::Error> {
        Vec::<String>::deserialize(d)?
            .iter()
            .map(|spec| spec.parse().map_err(serde::de::Error::custom))
            .collect()
    }
}

/// An inconsistent configuration.
#[derive(Debug, thiserror::Error)]
#[error("invalid engine configuration: {0}")]
pub struct ConfigError(pub(crate) String);

impl EngineConfig {
    /// Checks the values that would make the engine unable to serve.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let fail = |m: &str| Err(ConfigError(m.to_owned()));
        if self.model.is_empty() {
            return fail("model name is empty");
        }
        if self.block_size == 0 || self.kv_blocks == 0 || self.max_num_seqs == 0 {
            return fail("block_size, kv_blocks and max_num_seqs must be positive");
        }
        if self.max_num_batched_tokens == 0 {
            return fail("max_num_batched_tokens must be positive");
        }
        if self.max_model_len == 0 {
            return fail("max_model_len must be positive");
        }
        if self.max_model_len > self.kv_blocks * self.block_size {
            return fail("max_model_len exceeds the KV pool (kv_blocks x block_size tokens)");
        }
        if !(self.time_scale.is_finite() && self.time_scale >= 0.0) {
            return fail("time_scale must be a finite number >= 0");
        }
        let c = &self.cost;
        let costs = [
            c.step_overhead_ns,
            c.prefill_token_ns,
            c.decode_seq_ns,
            c.context_token_ns,
        ];
        if costs.iter().any(|v| !(v.is_finite() && *v >= 0.0)) {
            return fail("cost parameters must be finite and >= 0");
        }
        if self.mean_output_tokens == 0 {
            return fail("mean_output_tokens must be positive");
        }
        if !(self.kv_bandwidth_gbps.is_finite() && self.kv_bandwidth_gbps > 0.0) {
            return fail("kv_bandwidth_gbps must be a positive number");
        }
        if !(self.kv_transfer_setup_ms.is_finite() && self.kv_transfer_setup_ms >= 0.0) {
            return fail("kv_transfer_setup_ms must be a finite number >= 0");
        }
        if self.kv_bytes_per_token == 0 {
            return fail("kv_bytes_per_token must be positive");
        }
        if !(self.kv_lease_secs.is_finite() && self.kv_lease_secs > 0.0) {
            return fail("kv_lease_secs must be a positive number");
        }
        if let Some(problem) = self.lora.problem(&self.model) {
            return fail(&problem);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_round_trips_through_serde_with_fault_specs() {
        let json = r#"{"id": "e1", "time_scale": 0.5, "faults": ["429:retry_after=2,p=0.1"], "batching": "continuous"}"#;
        let config: EngineConfig = serde_json::from_str(json).unwrap();
        assert_eq!(config.id, "e1");
        assert_eq!(config.batching, BatchingMode::Continuous);
        assert_eq!(config.kv_blocks, EngineConfig::default().kv_blocks);
        assert_eq!(config.faults[0].to_string(), "429:retry_after=2,p=0.1");
        let again: EngineConfig =
            serde_json::from_str(&serde_json::to_string(&config).unwrap()).unwrap();
        assert_eq!(again.faults, config.faults);
        assert!(serde_json::from_str::<EngineConfig>(r#"{"faults": ["teapot"]}"#).is_err());
        assert!(serde_json::from_str::<EngineConfig>(r#"{"kv_block": 3}"#).is_err());
    }

    #[test]
    fn default_is_valid_and_bad_values_are_caught() {
        assert!(EngineConfig::default().validate().is_ok());
        let bad = EngineConfig {
            time_scale: -1.0,
            ..EngineConfig::default()
        };
        assert!(bad.validate().is_err());
        let bad = EngineConfig {
            kv_blocks: 10,
            ..EngineConfig::default()
        };
        assert!(bad.validate().is_err());
    }
}
