//! `kvgate demo`: the same agentic traffic through the gateway under several policies, against
//! emulated engines started in this process, summarised in one comparison table.
//!
//! Every policy gets a fresh fleet (cold caches) and the same seeded agentic sessions (the
//! simulator's model, `kvgate sim --scenario mix`): tenants whose sessions share a system
//! prompt, turns that resend the growing conversation, occasional fan-outs. Sessions start at
//! the same times under every policy; each next turn follows its answer after a think time, so
//! a policy that answers sooner also gets its next turns sooner.

use anyhow::Context;
use clap::Parser;
use kvgate_bench::{BenchArgs, TargetReport};
use kvgate_engine::EngineConfig;
use kvgate_gateway::{Config, EndpointConfig, Gateway};
use std::io::Write;

/// Flags of `kvgate demo`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Policies to compare, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "round_robin,least_outstanding,power_of_two,prefix_hash,cache_aware,kv_cost,predicted_ttft"
    )]
    policies: Vec<String>,
    /// Emulated engines behind the gateway.
    #[arg(long, default_value_t = 4)]
    engines: usize,
    /// Agentic sessions started per second.
    #[arg(long, default_value_t = 3.0)]
    rate: f64,
    /// Seconds of traffic per policy (each run then waits for its last answers).
    #[arg(long, default_value_t = 6.0)]
    duration: f64,
    /// Real seconds per modelled second of the engines (1 = real time).
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// Seed of the traffic and of the gateway's random choices.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Also write every policy's full bench report as JSON to this file.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

/// The bench flags of one run: the same agentic sessions for every policy, with a think time
/// short enough that sessions reach their later turns (and their cached prefixes) in a demo.
#[derive(Debug, Parser)]
struct BenchCli {
    #[command(flatten)]
    bench: BenchArgs,
}

fn bench_args(args: &Args, url: &str) -> anyhow::Result<BenchArgs> {
    let argv = [
        "bench".to_string(),
        format!("--url={url}"),
        "--workload=agentic".into(),
        "--agentic-think-time-ms=1000".into(),
        format!("--rate={}", args.rate),
        format!("--duration={}", args.duration),
        format!("--seed={}", args.seed),
        "--no-progress".into(),
        "--quiet".into(),
    ];
    Ok(BenchCli::try_parse_from(argv)
        .context("building the demo's bench flags")?
        .bench)
}

/// One policy's run: a fresh fleet, a gateway in front of it, the bench through the gateway.
async fn run_policy(args: &Args, policy: &str) -> anyhow::Result<TargetReport> {
    let mut engines = Vec::new();
    let mut config = Config::default();
    for i in 0..args.engines.max(1) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let engine_config = EngineConfig {
            id: format!("engine-{i}"),
            time_scale: args.time_scale,
            seed: args.seed + i as u64,
            ..EngineConfig::default()
        };
        let model = engine_config.model.clone();
        let engine = kvgate_engine::spawn(engine_config, listener).await?;
        config.endpoints.push(EndpointConfig {
            name: Some(format!("engine-{i}")),
            model: Some(model),
            ..EndpointConfig::from_url(format!("http://{}", engine.local_addr()))
        });
        engines.push(engine);
    }
    config.set_policy(policy)?;
    let gateway = Gateway::with_seed(config, args.seed)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(gateway.serve(listener, async move {
        let _ = stopped.await;
    }));
    let outcome = kvgate_bench::run(&bench_args(args, &url)?).await;
    let _ = stop.send(());
    server.await.context("gateway task")??;
    for engine in engines {
        engine.shutdown();
        engine.join().await?;
    }
    let mut outcome = outcome?;
    outcome
        .results
        .pop()
        .with_context(|| format!("no report for {policy}"))
}

pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    for policy in &args.policies {
        if kvgate_core::PolicyConfig::default_for(policy).is_none() {
            anyhow::bail!("unknown policy {policy:?} (see `kvgate policies`)");
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let mut rows = Vec::new();
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "kvgate demo: {} emulated engines, agentic sessions at {}/s for {} s per policy (seed {})",
        args.engines, args.rate, args.duration, args.seed
    )?;
    for policy in &args.policies {
        write!(out, "  {policy} ...")?;
        out.flush()?;
        let report = runtime.block_on(run_policy(args, policy))?;
        writeln!(out, " {} requests", report.requests)?;
        rows.push((policy.clone(), report));
    }
    writeln!(out)?;
    out.write_all(table(&rows).as_bytes())?;
    if let Some(path) = &args.json {
        let json: serde_json::Map<String, serde_json::Value> = rows
            .iter()
            .map(|(p, r)| Ok((p.clone(), serde_json::to_value(r)?)))
            .collect::<anyhow::Result<_>>()?;
        std::fs::write(path, serde_json::to_string_pretty(&json)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn table(rows: &[(String, TargetReport)]) -> String {
    let mut s = format!(
        "{:<20} {:>10} {:>10} {:>10} {:>10} {:>12} {:>7}\n",
        "policy", "TTFT p50", "TTFT p95", "E2E p95", "cache hit", "output tok/s", "errors"
    );
    for (policy, r) in rows {
        s.push_str(&format!(
            "{:<20} {:>8.0}ms {:>8.0}ms {:>8.0}ms {:>9.1}% {:>12.0} {:>7}\n",
            policy,
            r.ttft_ms.p50,
            r.ttft_ms.p95,
            r.e2e_ms.p95,
            100.0 * r.cache_hit_ratio.unwrap_or(0.0),
            r.output_throughput,
            r.failed,
        ));
    }
    s
}
