//! What every handler and background task shares.

use crate::admission::Admission;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::observe::access_log::AccessLog;
use crate::pool::{Clock, Pool};
use crate::upstream::{self, HttpClient};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use tokio::sync::watch;

/// The gateway's shared state.
#[derive(Debug)]
pub(crate) struct Shared {
    /// The configuration the gateway started with (endpoints and policy may change since).
    pub(crate) config: Config,
    /// Endpoints, policy, ledger.
    pub(crate) pool: Pool,
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
    pub(crate) tracing: Option<crate::observe::otel::Tracing>,
    /// Recent streamed first tokens, for the live page.
    pub(crate) ttft_series: crate::observe::series::TtftSeries,
    /// Keys, limits, budgets, agent controls.
    pub(crate) tenancy: crate::tenancy::Tenancy,
    /// The models' tokenizers, for prompts tokenized as their engines will.
    pub(crate) tokenizers: crate::engine_state::Tokenizers,
    /// Mid-stream continuations in flight per endpoint.
    pub(crate) resume_gates: std::sync::Arc<crate::resume::Gates>,
    /// Each session's last turn, warmed elsewhere when its endpoint is lost.
    pub(crate) rehome: crate::resume::Rehome,
    /// Configuration reloads and the last one's result.
    reloads: std::sync::Mutex<crate::reload::ReloadLog>,
}

impl Shared {
    /// Builds the state; endpoints from `config` are added to the pool. Fails when the tenancy
    /// store cannot be opened.
    pub(crate) fn new(
        config: Config,
        seed: u64,
        access_log: AccessLog,
        tracing: Option<crate::observe::otel::Tracing>,
    ) -> Result<Arc<Self>, crate::ConfigError> {
        let metrics = Arc::new(Metrics::new());
        let tenancy = crate::tenancy::Tenancy::new(&config.tenancy, metrics.clone())?;
        let tokenizers = crate::engine_state::Tokenizers::load(&config.tokenizers)?;
        let ca_files: Vec<&std::path::Path> = config
            .endpoints
            .iter()
            .filter_map(|e| e.ca_file.as_deref())
            .collect();
        let client = upstream::client(&ca_files).map_err(|e| crate::ConfigError::Invalid {
            field: "endpoints[].ca_file".into(),
            why: e.to_string(),
        })?;
        let pool = Pool::new(&config, Clock::new(), metrics.clone(), seed);
        for e in &config.endpoints {
            pool.add(e.clone());
        }
        let (stop, _) = watch::channel(false);
        Ok(Arc::new(Shared {
            tenancy,
            tokenizers,
            admission: Admission::new(config.admission.clone(), metrics.clone()),
            pool,
            metrics,
            client,
            draining: AtomicBool::new(false),
            next_request: AtomicU64::new(1),
            seed,
            stop,
            access_log,
            tracing,
            ttft_series: Default::default(),
            resume_gates: std::sync::Arc::new(crate::resume::Gates::new(
                config.resume.per_endpoint,
            )),
            rehome: crate::resume::Rehome::new(&config.resume),
            reloads: Default::default(),
            config,
        }))
    }
}

impl Shared {
    /// The reload log (a poisoned lock is taken over: the log is only counters).
    pub(crate) fn reloads(&self) -> std::sync::MutexGuard<'_, crate::reload::ReloadLog> {
        self.reloads.lock().unwrap_or_else(|p| p.into_inner())
    }
}
