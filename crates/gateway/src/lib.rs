//! kvgate's gateway: an OpenAI-compatible HTTP proxy that picks a replica for every request with
//! a kvgate-core policy, on live (and honestly stale) engine signals.
//!
//! One request passes the proxy's stages: the client's key, a bounded and validated body
//! ([`parse`]), admission (tenancy, agent controls, the fair queue), the policy's pick from a
//! snapshot of the pool ([`pool`]) and attempts that, until the first bytes arrive, may be
//! retried elsewhere (connect errors, 5xx, 429 with Retry-After; retry budget, full-jitter
//! backoff, per-endpoint circuit breaker) or hedged at a TTFT percentile, then the answer
//! streamed through frame by frame, and the end reported once to the policy, the metrics and
//! the access log. After the first byte nothing is retried. The modules sit in layers that
//! import only downward (docs/architecture.md).
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let mut config = kvgate_gateway::Config::default();
//! config.endpoints.push(kvgate_gateway::EndpointConfig::from_url("http://127.0.0.1:9001"));
//! let gateway = kvgate_gateway::Gateway::new(config)?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! gateway.serve(listener, async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! # Ok(()) }
//! ```

#![cfg_attr(test, allow(clippy::too_many_lines))]
// What only an optional subsystem uses (the pool's and tenancy's events for the cluster link,
// an attempt's stream flag for the picker) is dead in a build without it; the shipped binary
// builds with every feature, where dead code is an error.
#![cfg_attr(
    not(all(
        feature = "cluster",
        feature = "epp",
        feature = "otel",
        feature = "store"
    )),
    allow(dead_code, unused_imports)
)]

pub mod config;
pub mod error;
pub mod metrics;
pub mod parse;
pub mod pool;
mod watch;

mod admin;
mod admission;
mod cascade;
mod clock;
pub mod cluster;
pub mod difficulty;
pub mod disagg;
pub mod discovery;
mod dispatch;
mod ending;
pub mod endpoint_config;
pub mod engine_state;
#[cfg(feature = "epp")]
mod epp;
#[cfg(test)]
mod fuzz;
mod listener;
pub mod lora_load;
pub mod observe;
mod proxy;
mod relay;
mod reload;
mod resume;
pub mod semcache;
mod server;
mod state;
mod telemetry;
pub mod tenancy;
mod ui;
mod upstream;
mod usage;

pub use cluster::ClusterConfig;
pub use config::{Config, EndpointConfig, ListenerConfig, TlsConfig};
pub use error::{ApiError, ConfigError, TlsError};
pub use pool::EndpointStatus;
pub use proxy::{
    ENDPOINT_HEADER, EXPLAIN_HEADER, REQUEST_ID_HEADER, SPILLOVER_REASON_HEADER,
    SPILLOVER_TIER_HEADER,
};

use state::Shared;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// A configured gateway. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Gateway {
    shared: Arc<Shared>,
    tls: Option<Arc<listener::tls::Tls>>,
}

impl Gateway {
    /// Validates `config` and builds the gateway (no tasks start until [`Gateway::serve`]).
    pub fn new(config: Config) -> Result<Self, ConfigError> {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id());
        Self::with_seed(config, seed)
    }

    /// Everything [`Gateway::new`] checks, short of opening what a running gateway holds (the
    /// tenancy store, the access log, the trace exporter): the configuration's rules, the TLS
    /// certificate and key, the endpoints' CA files and the tokenizers. For `kvgate config
    /// check` and `kvgate serve --check`, which may run beside the gateway they check.
    pub fn check(config: &Config) -> Result<(), ConfigError> {
        config.validate()?;
        if let Some(t) = &config.tls {
            listener::tls::Tls::new(t, config.listener.http2)?;
        }
        engine_state::Tokenizers::load(&config.tokenizers, config.tokenizer_memo_bytes)?;
        state::upstream_client(config)?;
        Ok(())
    }

    /// Like [`Gateway::new`] with a fixed random seed (random policies, backoff jitter, phases).
    pub fn with_seed(config: Config, seed: u64) -> Result<Self, ConfigError> {
        config.validate()?;
        let tls = match &config.tls {
            Some(t) => Some(Arc::new(listener::tls::Tls::new(t, config.listener.http2)?)),
            None => None,
        };
        let access_log = match config.observability.access_log.as_deref() {
            None => observe::access_log::AccessLog::default(),
            Some(target) => observe::access_log::AccessLog::open(target).map_err(|source| {
                ConfigError::AccessLog {
                    path: target.to_owned(),
                    source,
                }
            })?,
        };
        Ok(Gateway {
            shared: {
                let tracing = observe::otel::Tracing::from_config(&config.observability)?;
                Shared::new(config, seed, access_log, tracing)?
            },
            tls,
        })
    }

    /// The HTTP routes of the public listener, for `oneshot` tests.
    pub fn router(&self) -> axum::Router {
        server::router(self.shared.clone(), server::Face::Public)
    }

    /// Every endpoint's status.
    pub fn status(&self) -> Vec<EndpointStatus> {
        self.shared.pool.status()
    }

    /// How many times the pool's lock has been taken: a streaming request takes it three
    /// times (pick, first token, end), readers never. For tests and contention diagnostics.
    pub fn pool_lock_acquisitions(&self) -> u64 {
        self.shared.pool.lock_acquisitions()
    }

    /// Exports the finished spans now, when traces are on (they leave in batches otherwise).
    pub fn flush_traces(&self) {
        if let Some(t) = &self.shared.tracing {
            t.flush();
        }
    }

    /// The Prometheus exposition of the gateway's metrics.
    pub fn metrics_text(&self) -> String {
        self.shared.metrics.encode()
    }

    /// Reloads endpoints and policy from `path` whenever it changes (polled every second).
    /// Call before or after [`Gateway::serve`]; must run inside a tokio runtime.
    pub fn watch_config(&self, path: PathBuf) {
        reload::spawn(self.shared.clone(), path, Duration::from_secs(1));
    }

    /// Starts the scrape loops and periodic upkeep, then serves on `listener` until `shutdown`
    /// completes; after that it stops accepting, marks itself not ready, and lets in-flight
    /// requests finish for up to `shutdown_grace_secs` before returning.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        self.serve_with_admin(listener, None, shutdown).await
    }

    /// [`Gateway::serve`], with the admin API and metrics on `admin` when the configuration
    /// sets `admin_listen` (the caller binds it, so tests can use port 0).
    pub async fn serve_with_admin(
        self,
        listener: TcpListener,
        admin: Option<TcpListener>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let shared = self.shared.clone();
        start_background(&shared);
        let listening =
            listener::Listening::new(&shared.config.listener, shared.metrics.connections.clone());
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        tokio::spawn(listening.clone().sweep(stop_rx.clone()));
        if let Some(tls) = &self.tls {
            tokio::spawn(tls.clone().watch(Duration::from_secs(1), stop_rx.clone()));
        }
        let public = server::router(shared.clone(), server::Face::Public);
        let tls = |admin: bool| {
            self.tls.as_ref().map(|t| {
                if admin {
                    t.admin.clone()
                } else {
                    t.public.clone()
                }
            })
        };
        tokio::spawn(
            listening
                .clone()
                .serve(listener, public, tls(false), stop_rx.clone()),
        );
        if let Some(admin) = admin {
            let routes = server::router(shared.clone(), server::Face::Admin);
            tokio::spawn(listening.clone().serve(admin, routes, tls(true), stop_rx));
        }
        shutdown.await;
        shared.draining.store(true, Ordering::Relaxed);
        let _ = shared.stop.send(true);
        let _ = stop_tx.send(true);
        let grace = Duration::from_secs(shared.config.shutdown_grace_secs);
        if tokio::time::timeout(grace, listening.conns.drained())
            .await
            .is_err()
        {
            tracing::warn!("grace period over; closing the remaining connections");
        }
        // Everything settled by now is on disk before the process exits.
        let last = shared.clone();
        if let Ok(Err(e)) = tokio::task::spawn_blocking(move || last.tenancy.flush()).await {
            tracing::error!("could not write spend at shutdown: {e}");
        }
        Ok(())
    }
}

#[cfg(feature = "epp")]
impl Gateway {
    /// `kvgate epp`: starts the scrape loops and upkeep, then serves Envoy's ext_proc (the
    /// endpoint-picker protocol) and gRPC health on `grpc`, and `/metrics` (with the admin API
    /// when a token is set) on `http` if given, until `shutdown` completes.
    pub async fn serve_epp(
        self,
        grpc: TcpListener,
        http: Option<TcpListener>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let shared = self.shared.clone();
        start_background(&shared);
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        if let Some(http) = http {
            let listening = listener::Listening::new(
                &shared.config.listener,
                shared.metrics.connections.clone(),
            );
            let routes = server::router(shared.clone(), server::Face::Admin);
            tokio::spawn(listening.serve(http, routes, None, stop_rx));
        }
        let (picker, health) = epp::services(shared.clone()).await;
        let served = tonic::transport::Server::builder()
            .add_service(health)
            .add_service(picker)
            .serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(grpc),
                shutdown,
            )
            .await;
        shared.draining.store(true, Ordering::Relaxed);
        let _ = shared.stop.send(true);
        let _ = stop_tx.send(true);
        served.map_err(std::io::Error::other)
    }
}

/// The scrape loops, KV-event subscribers, spend writer and once-a-second upkeep of a
/// gateway or picker, until it stops.
fn start_background(shared: &Arc<Shared>) {
    for status in shared.pool.status() {
        shared.watch.start(status.id);
    }
    if let Some(losses) = shared.take_losses() {
        tokio::spawn(relay::rehome::handle_losses(shared.clone(), losses));
    }
    cluster::spawn(cluster::Sharing {
        config: shared.config.cluster.clone(),
        pool: shared.pool.clone(),
        tenancy: shared.tenancy.clone(),
        semcache: shared.semcache.clone(),
        metrics: shared.metrics.cluster.clone(),
        seed: shared.seed,
        stop: shared.stop.subscribe(),
    });
    discovery::spawn(
        &shared.config.discovery,
        shared.watch.clone(),
        shared.metrics.discovery.clone(),
    );
    if shared.tenancy.persists() {
        tokio::spawn(flush_spend(shared.clone()));
    }
    let upkeep = shared.clone();
    let mut stop = shared.stop.subscribe();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = tick.tick() => { upkeep.pool.maintain(); upkeep.pool.status(); }
                _ = stop.changed() => return,
            }
        }
    });
}

/// Writes settled spend to the tenancy store every `flush_ms` until the gateway stops.
async fn flush_spend(shared: Arc<Shared>) {
    let mut stop = shared.stop.subscribe();
    let mut tick = tokio::time::interval(shared.tenancy.flush_every());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let s = shared.clone();
        match tokio::task::spawn_blocking(move || s.tenancy.flush()).await {
            Ok(Err(e)) => tracing::error!("could not write spend: {e}"),
            Err(e) => tracing::error!("spend writer failed: {e}"),
            Ok(Ok(_)) => {}
        }
    }
}
