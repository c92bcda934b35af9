//! `kvgate serve`: the gateway. Flags override the YAML file given with `--config`; policy flags
//! are spelled like SGLang's launcher where the concept is the same. With no endpoints at all it
//! starts the embedded default: emulated engines in this process behind the gateway.

use anyhow::Context;
use kvgate_engine::EngineConfig;
use kvgate_gateway::{Config, EndpointConfig, Gateway};
use std::path::PathBuf;

/// Flags of `kvgate serve`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// YAML configuration file (reloaded when it changes: endpoints and policy).
    #[arg(long)]
    pub(crate) config: Option<PathBuf>,
    /// Address to listen on (default 127.0.0.1:8080; port 0 picks a free one and prints it).
    #[arg(long)]
    pub(crate) listen: Option<String>,
    /// An upstream engine's base URL (repeatable); added to those of the file.
    #[arg(long = "endpoint", value_name = "URL")]
    endpoints: Vec<String>,
    /// Routing policy (`kvgate policies` lists them).
    #[arg(long)]
    policy: Option<String>,
    /// cache_aware: minimum matched share of the prompt for affinity.
    #[arg(long)]
    cache_threshold: Option<f64>,
    /// cache_aware: imbalance needs max_load - min_load above this.
    #[arg(long)]
    balance_abs_threshold: Option<f64>,
    /// cache_aware: ... and max_load above min_load times this.
    #[arg(long)]
    balance_rel_threshold: Option<f64>,
    /// cache_aware: seconds between prefix-tree trims.
    #[arg(long)]
    eviction_interval_secs: Option<u64>,
    /// cache_aware: stored characters per endpoint in the prefix tree.
    #[arg(long)]
    max_tree_size: Option<usize>,
    /// Any policy parameter, `key=value` (dotted for nested: `load.expiry_ms=500`); repeatable.
    #[arg(long = "policy-set", value_name = "KEY=VALUE")]
    policy_set: Vec<String>,
    /// Attempts per request before the first token, including the first.
    #[arg(long)]
    max_attempts: Option<u32>,
    /// Hedge streaming requests at this TTFT percentile (enables hedging).
    #[arg(long)]
    hedge_percentile: Option<f64>,
    /// Requests in flight upstream at once.
    #[arg(long)]
    max_concurrency: Option<usize>,
    /// Requests waiting for admission before 429.
    #[arg(long)]
    max_queue: Option<usize>,
    /// Largest request body in bytes.
    #[arg(long)]
    max_body_bytes: Option<usize>,
    /// Engine metrics scrape period in milliseconds.
    #[arg(long)]
    scrape_interval_ms: Option<u64>,
    /// Seconds in-flight streams may run after SIGTERM.
    #[arg(long)]
    shutdown_grace_secs: Option<u64>,
    /// Bearer token enabling the admin API.
    #[arg(long, env = "KVGATE_ADMIN_TOKEN")]
    admin_token: Option<String>,
    /// A separate address for the admin API and /metrics (needs an admin token).
    #[arg(long)]
    admin_listen: Option<String>,
    /// TLS certificate chain (PEM; re-read when it changes); needs --tls-key.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// TLS private key (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Require admin clients to present certificates signed by this CA (PEM; mTLS).
    #[arg(long)]
    admin_client_ca: Option<PathBuf>,
    /// Client connections open at once (at the cap the oldest idle one is closed).
    #[arg(long)]
    max_connections: Option<usize>,
    /// Seconds a client has to send a request's headers (HTTP/1 keep-alive waits included).
    #[arg(long)]
    header_read_timeout_secs: Option<f64>,
    /// Seconds a connection may stay open with no request in flight.
    #[arg(long)]
    idle_timeout_secs: Option<f64>,
    /// Access log, one JSON line per request: `stdout` (default), `stderr`, `off` or a file.
    #[arg(long, value_name = "TARGET")]
    access_log: Option<String>,
    /// Share routing state with other replicas over this NATS server (`nats://host:port`,
    /// comma-separated for several).
    #[arg(long, value_name = "URL")]
    cluster: Option<String>,
    /// Replicas with the same cluster name share state (default `default`).
    #[arg(long, requires = "cluster")]
    cluster_name: Option<String>,
    /// Emulated engines started in-process when no endpoint is configured.
    #[arg(long, default_value_t = 2)]
    embedded_engines: usize,
    /// Real seconds per modelled second of the embedded engines (0: no delays).
    #[arg(long, default_value_t = 1.0)]
    embedded_time_scale: f64,
    /// Worker threads of the async runtime (default: one per core).
    #[arg(long)]
    pub(crate) threads: Option<usize>,
    /// Check the configuration (file and flags) as serving would, print it with every
    /// default, and exit without serving.
    #[arg(long)]
    check: bool,
}

impl Args {
    /// With `--check`: checks and prints `config` instead of running; whether it did.
    pub(crate) fn checked(&self, config: &Config) -> anyhow::Result<bool> {
        if !self.check {
            return Ok(false);
        }
        let source = self
            .config
            .as_ref()
            .map_or_else(|| "the flags".to_string(), |p| p.display().to_string());
        crate::config_check::report(config, &source, false)?;
        Ok(true)
    }
}

/// The policy flags: `--policy`, SGLang's cache-aware flags, then each `--policy-set`.
fn apply_policy_flags(config: &mut Config, args: &Args) -> anyhow::Result<()> {
    if let Some(name) = &args.policy {
        config.set_policy(name)?;
    }
    let sglang_flags = [
        (
            "cache_threshold",
            args.cache_threshold.map(|v| v.to_string()),
        ),
        (
            "balance_abs_threshold",
            args.balance_abs_threshold.map(|v| v.to_string()),
        ),
        (
            "balance_rel_threshold",
            args.balance_rel_threshold.map(|v| v.to_string()),
        ),
        (
            "eviction_interval_secs",
            args.eviction_interval_secs.map(|v| v.to_string()),
        ),
        ("max_tree_size", args.max_tree_size.map(|v| v.to_string())),
    ];
    for (key, value) in sglang_flags {
        if let Some(value) = value {
            config.set_policy_param(key, &value)?;
        }
    }
    for pair in &args.policy_set {
        let (key, value) = pair
            .split_once('=')
            .with_context(|| format!("--policy-set {pair:?}: expected KEY=VALUE"))?;
        config.set_policy_param(key.trim(), value.trim())?;
    }
    Ok(())
}

/// `--tls-cert` and `--tls-key`, and `--admin-client-ca`, which needs them.
fn apply_tls_flags(config: &mut Config, args: &Args) -> anyhow::Result<()> {
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        config.tls = Some(kvgate_gateway::TlsConfig {
            cert_file: cert.clone(),
            key_file: key.clone(),
            admin_client_ca_file: None,
        });
    }
    if let Some(ca) = &args.admin_client_ca {
        let tls = config
            .tls
            .as_mut()
            .context("--admin-client-ca needs TLS (--tls-cert and --tls-key)")?;
        tls.admin_client_ca_file = Some(ca.clone());
    }
    Ok(())
}

pub(crate) fn build_config(args: &Args) -> anyhow::Result<Config> {
    let mut config = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            Config::from_yaml(&text).with_context(|| format!("loading {}", path.display()))?
        }
        None => Config::default(),
    };
    if let Some(listen) = &args.listen {
        config.listen.clone_from(listen);
    }
    config
        .endpoints
        .extend(args.endpoints.iter().map(EndpointConfig::from_url));
    apply_policy_flags(&mut config, args)?;
    if let Some(v) = args.max_attempts {
        config.retry.max_attempts = v;
    }
    if let Some(p) = args.hedge_percentile {
        config.hedge.enabled = true;
        config.hedge.percentile = p;
    }
    if let Some(v) = args.max_concurrency {
        config.admission.max_concurrency = v;
    }
    if let Some(v) = args.max_queue {
        config.admission.max_queue = v;
    }
    if let Some(v) = args.max_body_bytes {
        config.requests.max_body_bytes = v;
    }
    if let Some(v) = args.scrape_interval_ms {
        config.scrape.interval_ms = v;
    }
    if let Some(v) = args.shutdown_grace_secs {
        config.shutdown_grace_secs = v;
    }
    if args.admin_token.is_some() {
        config.admin_token.clone_from(&args.admin_token);
    }
    if args.admin_listen.is_some() {
        config.admin_listen.clone_from(&args.admin_listen);
    }
    apply_tls_flags(&mut config, args)?;
    let observability = &mut config.observability;
    if args.access_log.is_some() {
        observability.access_log.clone_from(&args.access_log);
    }
    observability
        .access_log
        .get_or_insert_with(|| "stdout".into());
    let listener = &mut config.listener;
    if let Some(v) = args.max_connections {
        listener.max_connections = v;
    }
    if let Some(v) = args.header_read_timeout_secs {
        listener.header_read_timeout_secs = v;
    }
    if let Some(v) = args.idle_timeout_secs {
        listener.idle_timeout_secs = v;
    }
    if args.cluster.is_some() {
        config.cluster.url.clone_from(&args.cluster);
    }
    if let Some(name) = &args.cluster_name {
        config.cluster.name.clone_from(name);
    }
    config.validate()?;
    Ok(config)
}

pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let mut config = build_config(args)?;
    if args.checked(&config)? {
        return Ok(());
    }
    let runtime = crate::runtime(args.threads)?;
    runtime.block_on(async {
        let mut engines = Vec::new();
        if config.endpoints.is_empty() && config.discovery.inference_pool.is_none() {
            for i in 0..args.embedded_engines.max(1) {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
                let engine_config = EngineConfig {
                    id: format!("engine-{i}"),
                    time_scale: args.embedded_time_scale,
                    seed: i as u64,
                    ..EngineConfig::default()
                };
                let engine = kvgate_engine::spawn(engine_config.clone(), listener).await?;
                let url = format!("http://{}", engine.local_addr());
                println!("kvgate serve: embedded engine-{i} on {url}");
                config.endpoints.push(EndpointConfig {
                    name: Some(format!("engine-{i}")),
                    model: Some(engine_config.model.clone()),
                    ..EndpointConfig::from_url(url)
                });
                engines.push(engine);
            }
        }
        let listener = tokio::net::TcpListener::bind(&config.listen)
            .await
            .with_context(|| format!("binding {}", config.listen))?;
        let addr = listener.local_addr()?;
        let admin = match &config.admin_listen {
            Some(at) => Some(
                tokio::net::TcpListener::bind(at)
                    .await
                    .with_context(|| format!("binding the admin listener {at}"))?,
            ),
            None => None,
        };
        // One per client connection, one per upstream request, and some for the rest.
        crate::descriptors::raise_limit(
            (config.listener.max_connections + config.admission.max_concurrency + 256) as u64,
        );
        let policy = config.policy.name();
        let scheme = if config.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let admin_at = match &admin {
            Some(a) => format!(", admin on {scheme}://{}", a.local_addr()?),
            None => String::new(),
        };
        let gateway = Gateway::new(config)?;
        if let Some(path) = &args.config {
            gateway.watch_config(path.clone());
        }
        // One parseable line for scripts and tests that listen on port 0.
        println!("kvgate serve listening on {scheme}://{addr} (policy {policy}{admin_at})");
        gateway
            .serve_with_admin(listener, admin, wait_for_signal())
            .await?;
        for engine in engines {
            engine.shutdown();
            engine.join().await?;
        }
        Ok(())
    })
}

pub(crate) async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        else {
            let _ = ctrl_c.await;
            return;
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    #[test]
    fn sglang_spelled_flags_and_policy_set_reach_the_policy() {
        let cli = Cli::parse_from([
            "serve",
            "--endpoint",
            "http://127.0.0.1:1",
            "--policy",
            "cache_aware",
            "--cache-threshold",
            "0.4",
            "--balance-abs-threshold",
            "8",
            "--policy-set",
            "load.expiry_ms=700",
        ]);
        let config = build_config(&cli.args).unwrap();
        let kvgate_core::PolicyConfig::CacheAware(c) = &config.policy else {
            panic!()
        };
        assert_eq!(
            (c.cache_threshold, c.balance_abs_threshold, c.load.expiry_ms),
            (0.4, 8.0, 700)
        );
        let bad = Cli::parse_from([
            "serve",
            "--policy",
            "round_robin",
            "--cache-threshold",
            "0.4",
        ]);
        assert!(build_config(&bad.args).is_err());
    }
}
