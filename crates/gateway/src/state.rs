//! What the request path and the admin API share: the concerns below, each built once from its
//! part of the configuration. Background tasks get narrow handles cut from it (the engine
//! watch, the cluster's sharing, discovery), never the whole.

use crate::admission::Admission;
use crate::config::{Config, ReloadLog};
use crate::engine_state::Tokenizers;
use crate::error::ConfigError;
use crate::observe::access_log::AccessLog;
use crate::observe::otel::Tracing;
use crate::observe::series::TtftSeries;
use crate::pool::{Clock, Pool};
use crate::resume::{Gates, Rehome};
use crate::telemetry::Metrics;
use crate::tenancy::Tenancy;
use crate::upstream::{self, HttpClient};
use crate::watch::{EngineWatch, Loss, LossSignal};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::{mpsc, watch};

/// The gateway's shared state.
#[derive(Debug)]
pub(crate) struct Shared {
    /// The configuration the gateway started with (endpoints and policy may change since).
    pub(crate) config: Config,
    /// Endpoints, policy, ledger.
    pub(crate) pool: Arc<Pool>,
    /// Metrics.
    pub(crate) metrics: Arc<Metrics>,
    /// The upstream client.
    pub(crate) client: HttpClient,
    /// The concurrency gate.
    pub(crate) admission: Admission,
    /// Set once SIGTERM (or the caller's shutdown future) fired: `/ready` turns 503.
    pub(crate) draining: AtomicBool,
    /// Request ids.
    pub(crate) next_request: AtomicU64,
    /// The gateway's seed: each request's random draws (backoff jitter) come from it and the
    /// request id, so they need no lock.
    pub(crate) seed: u64,
    /// Tells background tasks to stop.
    pub(crate) stop: watch::Sender<bool>,
    /// One JSON line per request.
    pub(crate) access_log: AccessLog,
    /// OpenTelemetry traces, when on.
    pub(crate) tracing: Option<Tracing>,
    /// Recent streamed first tokens, for the live page.
    pub(crate) ttft_series: TtftSeries,
    /// Keys, limits, budgets, agent controls.
    pub(crate) tenancy: Arc<Tenancy>,
    /// The models' tokenizers, for prompts tokenized as their engines will.
    pub(crate) tokenizers: Tokenizers,
    /// Mid-stream continuations in flight per endpoint.
    pub(crate) resume_gates: Arc<Gates>,
    /// Each session's last turn, warmed elsewhere when its endpoint is lost.
    pub(crate) rehome: Rehome,
    /// What watching an endpoint's engine needs; its loss signal is where attempts report
    /// signs of loss too.
    pub(crate) watch: EngineWatch,
    /// The signs of loss, until the request path starts handling them.
    losses: Mutex<Option<mpsc::UnboundedReceiver<Loss>>>,
    /// Configuration reloads and the last one's result.
    reloads: Mutex<ReloadLog>,
    /// Answers served again (`semantic_cache:`).
    pub(crate) semcache: Arc<crate::semcache::SemCache>,
    /// LoRA adapters loaded on demand (`lora:`).
    pub(crate) lora: crate::lora_load::Loader,
    /// Routed names' scorers, controllers, budgets and strong-tier slots.
    pub(crate) difficulty: crate::difficulty::Difficulty,
    /// Prefill/decode disaggregation.
    pub(crate) disagg: crate::disagg::Disagg,
}

/// A poisoned lock is taken over: what these locks guard stays consistent at every await.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    /// Builds the state; endpoints from `config` are added to the pool. Fails when the tenancy
    /// store, a tokenizer or an endpoint's CA file cannot be opened.
    pub(crate) fn new(
        config: Config,
        seed: u64,
        access_log: AccessLog,
        tracing: Option<Tracing>,
    ) -> Result<Arc<Self>, ConfigError> {
        let metrics = Arc::new(Metrics::new());
        let tenancy = Tenancy::new(&config.tenancy, metrics.tenants.clone())?;
        let tokenizers = Tokenizers::load(&config.tokenizers, config.tokenizer_memo_bytes)?;
        let client = upstream_client(&config)?;
        let difficulty =
            crate::difficulty::Difficulty::new(&config.routing, &metrics.difficulty, &client)?;
        let pool = Arc::new(Pool::new(
            &config.pool_settings(),
            Clock::new(),
            metrics.pool.clone(),
            seed,
        ));
        for e in &config.endpoints {
            pool.add(e.clone());
        }
        let semcache = Arc::new(crate::semcache::SemCache::new(
            &config.semantic_cache,
            client.clone(),
            metrics.semcache.clone(),
            pool.clock().clone(),
        )?);
        let lora =
            crate::lora_load::Loader::new(&config.lora, client.clone(), metrics.lora_loads.clone());
        let rehome = Rehome::new(&config.resume, pool.clock().clone());
        let (stop, stopped) = watch::channel(false);
        let (signal, losses) = LossSignal::channel();
        let watch = EngineWatch {
            pool: pool.clone(),
            client: client.clone(),
            metrics: metrics.watch.clone(),
            engine_state: metrics.engine_state.clone(),
            scrape: config.scrape.clone(),
            kv_events: config.kv_events.clone(),
            losses: signal,
            stop: stopped,
        };
        Ok(Arc::new(Shared {
            tenancy: Arc::new(tenancy),
            tokenizers,
            admission: Admission::new(config.admission.clone(), metrics.admission.clone()),
            pool,
            metrics: metrics.clone(),
            client,
            draining: AtomicBool::new(false),
            next_request: AtomicU64::new(1),
            seed,
            stop,
            access_log,
            tracing,
            ttft_series: TtftSeries::default(),
            resume_gates: Arc::new(Gates::new(config.resume.per_endpoint)),
            rehome,
            watch,
            losses: Mutex::new(Some(losses)),
            reloads: Mutex::default(),
            semcache,
            lora,
            difficulty,
            disagg: crate::disagg::Disagg::new(
                config.disaggregation.clone(),
                metrics.disagg.clone(),
            ),
            config,
        }))
    }

    /// The reload log.
    pub(crate) fn reloads(&self) -> MutexGuard<'_, ReloadLog> {
        lock(&self.reloads)
    }

    /// The signs of loss, once: whoever starts handling them takes them.
    pub(crate) fn take_losses(&self) -> Option<mpsc::UnboundedReceiver<Loss>> {
        lock(&self.losses).take()
    }
}

/// The upstream client, trusting the endpoints' own CA files besides the system's.
pub(crate) fn upstream_client(config: &Config) -> Result<HttpClient, ConfigError> {
    let ca_files: Vec<&std::path::Path> = config
        .endpoints
        .iter()
        .filter_map(|e| e.ca_file.as_deref())
        .collect();
    upstream::client(&ca_files)
        .map_err(|e| ConfigError::invalid("endpoints[].ca_file", e.to_string()))
}
