//! kvgate's emulated inference engine: a server that behaves like vLLM on the wire (OpenAI API
//! with SSE streaming, `vllm:*` Prometheus metrics, KV-cache events over ZMQ) while its timing
//! comes from the simulator's engine model (continuous batching, chunked prefill, a KV block
//! pool with an LRU prefix cache, preemption) run in real time, scaled by a time factor.
//!
//! Run one in-process (the gateway's embedded default does this):
//!
//! ```no_run
//! # async fn demo() -> Result<(), kvgate_engine::EngineError> {
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let config = kvgate_engine::EngineConfig { time_scale: 0.0, ..Default::default() };
//! let engine = kvgate_engine::spawn(config, listener).await?;
//! println!("engine on http://{}", engine.local_addr());
//! engine.shutdown();
//! engine.join().await?;
//! # Ok(()) }
//! ```
//!
//! See `crates/engine/README.md` for flags, the fault spec and the KV-event format.

// Tests spell out whole scenarios step by step; the length limit is for the code they test.
#![cfg_attr(test, allow(clippy::too_many_lines))]

mod admin;
mod backend;
mod config;
mod embeddings;
mod error;
mod faults;
mod handlers;
mod kv_events;
mod logprobs;
mod lora;
mod metrics;
mod pd;
mod request;
mod scheduler;
mod server;
mod state;
mod stream;
pub mod tokenizer;
mod wire;

pub use config::{BatchingMode, ConfigError, CostModel, EngineConfig};
pub use error::EngineError;
pub use faults::{Fault, FaultKind, FaultSpecError};
pub use kv_events::KvEventsError;
pub use lora::LoraSettings;
pub use pd::Role;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
/// Re-exported: the shutdown signal of [`serve`].
pub use tokio_util::sync::CancellationToken;

/// Serves the engine on `listener` until `shutdown` is cancelled.
///
/// Fails at once on an invalid configuration or an unusable KV-event endpoint; later returns
/// only when the listener itself fails or after shutdown.
pub async fn serve(
    config: EngineConfig,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<(), EngineError> {
    let running = start(config, listener, shutdown).await?;
    running.await.unwrap_or(Ok(()))
}

/// Starts the engine on `listener` in background tasks and returns a handle to it.
pub async fn spawn(
    config: EngineConfig,
    listener: TcpListener,
) -> Result<EngineHandle, EngineError> {
    let local_addr = listener.local_addr()?;
    let shutdown = CancellationToken::new();
    let task = start(config, listener, shutdown.clone()).await?;
    Ok(EngineHandle {
        local_addr,
        shutdown,
        task,
    })
}

/// A running in-process engine.
#[derive(Debug)]
pub struct EngineHandle {
    local_addr: SocketAddr,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), EngineError>>,
}

impl EngineHandle {
    /// The address the engine listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The token that stops the engine when cancelled.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Stops accepting, drops open connections and stops the scheduler.
    pub fn shutdown(&self) {
        self.shutdown.cancel();
    }

    /// Waits until the engine has stopped.
    pub async fn join(self) -> Result<(), EngineError> {
        self.task.await.unwrap_or(Ok(()))
    }
}

async fn start(
    config: EngineConfig,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<JoinHandle<Result<(), EngineError>>, EngineError> {
    config.validate()?;
    let tokenizer = match &config.tokenizer {
        Some(dir) => Some(Arc::new(kvgate_tokenize::ChatTokenizer::load(dir)?)),
        None => None,
    };
    let faults = Arc::new(faults::FaultState::new(config.faults.clone(), config.seed));
    let kv_sink = match &config.kv_events {
        Some(endpoint) => Some(
            kv_events::start(
                endpoint,
                config.kv_events_topic.clone(),
                faults.clone(),
                shutdown.clone(),
            )
            .await?,
        ),
        None => None,
    };
    let metrics = Arc::new(Mutex::new(metrics::MetricsState::default()));
    let (commands, command_rx) = tokio::sync::mpsc::unbounded_channel();
    let model = backend::build(&config);
    tokio::spawn(scheduler::run(
        model,
        command_rx,
        metrics.clone(),
        faults.clone(),
        kv_sink,
        config.time_scale,
        shutdown.clone(),
    ));
    let started = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let addr = listener.local_addr()?;
    let mut shared = state::Shared::new(config, commands, metrics, faults, (started, addr));
    shared.tokenizer = tokenizer;
    let shared = Arc::new(shared);
    let app = handlers::router(shared);
    Ok(tokio::spawn(async move {
        server::accept_loop(listener, app, shutdown)
            .await
            .map_err(EngineError::Io)
    }))
}
