//! State shared by every request handler.

use crate::config::EngineConfig;
use crate::faults::FaultState;
use crate::metrics::{CacheInfo, MetricsState};
use crate::scheduler::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) config: EngineConfig,
    /// `model` as a JSON string literal, quotes included, escaped once.
    pub(crate) model_json: String,
    pub(crate) commands: mpsc::UnboundedSender<Command>,
    pub(crate) metrics: Arc<Mutex<MetricsState>>,
    pub(crate) faults: Arc<FaultState>,
    pub(crate) cache_info: CacheInfo,
    /// The model's tokenizer, when configured (else the stand-in of `tokenizer.rs`).
    pub(crate) tokenizer: Option<Arc<kvgate_tokenize::ChatTokenizer>>,
    /// Unix seconds at startup (`created` of the model card, whole seconds there).
    pub(crate) started_unix: u64,
    /// The same to the millisecond, as `process_start_time_seconds`: what tells a router that
    /// an engine at the same address restarted (and lost its cache).
    pub(crate) started: f64,
    /// Mixed into response ids so that engines with different ids (or seeds) never repeat
    /// each other's ids.
    pub(crate) id_salt: u64,
    /// Prefill/decode disaggregation.
    pub(crate) pd: crate::pd::Pd,
    /// The LoRA adapters it answers to.
    pub(crate) lora: crate::lora::Registry,
    next_id: AtomicU64,
}

impl Shared {
    pub(crate) fn new(
        config: EngineConfig,
        commands: mpsc::UnboundedSender<Command>,
        metrics: Arc<Mutex<MetricsState>>,
        faults: Arc<FaultState>,
        (started, addr): (f64, std::net::SocketAddr),
    ) -> Self {
        let cache_info = CacheInfo {
            block_size: config.block_size,
            num_gpu_blocks: config.kv_blocks,
            enable_prefix_caching: config.prefix_caching,
        };
        let id_salt = xxhash_rust::xxh3::xxh3_64_with_seed(config.id.as_bytes(), config.seed);
        let pd = crate::pd::Pd::new(&config, addr, metrics.clone());
        let lora = crate::lora::Registry::new(&config.lora);
        Shared {
            pd,
            model_json: serde_json::to_string(&config.model).unwrap_or_else(|_| "\"\"".to_owned()),
            config,
            commands,
            metrics,
            faults,
            cache_info,
            tokenizer: None,
            started_unix: started as u64,
            started: (started * 1000.0).round() / 1000.0,
            id_salt,
            lora,
            next_id: AtomicU64::new(1),
        }
    }

    /// A fresh sequence id.
    pub(crate) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }
}
