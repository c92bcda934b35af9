//! `kvgate bench`: an open-loop load generator for OpenAI-compatible LLM endpoints.
//!
//! Requests leave at times drawn from an arrival process (Poisson or gamma, optionally ramped),
//! never waiting for responses (closed loops hide overload: Schroeder, Wierman and Harchol-Balter,
//! "Open Versus Closed: A Cautionary Tale", NSDI 2006). Each request is measured on the client
//! (TTFT, TPOT, ITL, E2E, tokens, cached tokens, errors, send lag) and the run is summarised per
//! target (and per rate in a sweep) as a table, JSON and a plot.
//!
//! ```no_run
//! # async fn demo() -> Result<(), kvgate_bench::BenchError> {
//! use clap::Parser;
//! #[derive(Parser)]
//! struct Cli {
//!     #[command(flatten)]
//!     bench: kvgate_bench::BenchArgs,
//! }
//! let cli = Cli::parse_from(["bench", "--url", "http://127.0.0.1:8080", "--rate", "20"]);
//! let outcome = kvgate_bench::run(&cli.bench).await?;
//! println!("goodput {:?}", outcome.results[0].goodput);
//! # Ok(()) }
//! ```

// Tests spell out whole scenarios step by step; the length limit is for the code they test.
#![cfg_attr(test, allow(clippy::too_many_lines))]

mod args;
pub mod arrivals;
pub mod client;
mod drive;
pub mod engines;
mod error;
mod plan;
pub mod plot;
pub mod records;
pub mod report;
mod resummarise;
pub mod runner;
pub mod sessions;
pub mod stats;
pub mod sweep;
pub mod workload;

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

pub use args::{Api, BenchArgs};
pub use error::BenchError;
pub use report::{Capacity, Slo, TargetReport};

use client::{BodyOptions, Sender, Target};
use drive::Setup;
use plan::{plan, Plan};
use runner::Limits;
use workload::Workload;

/// What a run produced.
#[derive(Debug, Clone, Serialize)]
pub struct BenchOutcome {
    /// One report per target and offered rate (rate-major order: every target at the first
    /// rate, then every target at the next).
    pub results: Vec<TargetReport>,
    /// Capacity per target (sweeps only; empty otherwise).
    pub capacity: Vec<Capacity>,
    /// The SLO the reports were judged against.
    pub slo: Slo,
    /// The model name sent.
    pub model: String,
    /// The workload name or file.
    pub workload: String,
    /// The seed.
    pub seed: u64,
}

fn validate(args: &BenchArgs) -> Result<(), BenchError> {
    let bad = |m: &str| Err(BenchError::Config(m.to_owned()));
    if args.urls.is_empty() && args.from_records.is_none() {
        return bad("at least one --url is required");
    }
    if args.engines.len() > args.urls.len() {
        return bad("--engines names the engines of one --url each: more --engines than --url");
    }
    if args.rate.is_nan() || args.rate <= 0.0 {
        return bad("--rate must be positive");
    }
    let unbounded = args.sweep.is_none() && args.ramp_up_start_rps.is_none();
    if unbounded && args.rate.is_infinite() && args.num_requests.is_none() {
        return bad("--rate inf needs --num-requests");
    }
    if !(args.burstiness > 0.0 && args.burstiness.is_finite()) {
        return bad("--burstiness must be a positive number");
    }
    if args.duration.is_some_and(|d| d.is_nan() || d <= 0.0) {
        return bad("--duration must be positive");
    }
    if args.num_requests == Some(0) {
        return bad("--num-requests must be positive");
    }
    if args.timeout_s.is_nan() || args.timeout_s <= 0.0 {
        return bad("--timeout-s must be positive");
    }
    if !(0.0..=1.0).contains(&args.capacity_attainment) {
        return bad("--capacity-attainment must be within 0..1");
    }
    if args.sweep.is_some() && args.ramp_up_start_rps.is_some() {
        return bad("--sweep and --ramp-up-* are exclusive");
    }
    let finite_positive = |r: f64| r.is_finite() && r > 0.0;
    if args.ramp_up_start_rps.is_some_and(|r| !finite_positive(r))
        || args.ramp_up_end_rps.is_some_and(|r| !finite_positive(r))
    {
        return bad("ramp-up rates must be positive and finite");
    }
    Ok(())
}

fn limits(args: &BenchArgs) -> Limits {
    Limits {
        duration_s: args.duration,
        num_requests: args.num_requests.or(if args.duration.is_none() {
            Some(1000)
        } else {
            None
        }),
    }
}

/// The offered rates, one run each: the sweep's, or one (`None` when ramped).
fn rates(args: &BenchArgs) -> Result<Vec<Option<f64>>, BenchError> {
    Ok(match (&args.sweep, args.ramp_up_start_rps) {
        (Some(spec), _) => sweep::parse(spec)?.into_iter().map(Some).collect(),
        (None, Some(_)) => vec![None],
        (None, None) => vec![Some(args.rate)],
    })
}

/// `--model`, or the first model the first target lists, or `default`.
async fn model_name(args: &BenchArgs, http: &reqwest::Client, targets: &[Target]) -> String {
    match &args.model {
        Some(m) => m.clone(),
        None => client::first_model(http, &targets[0], args.api_key.as_deref())
            .await
            .unwrap_or_else(|| "default".to_owned()),
    }
}

/// Workload units (sessions, prefixes) the warm-up's requests take from an open plan, which
/// the measured rates then skip; a closed plan starts fresh sessions anyway.
fn warm_units(args: &BenchArgs, plan: &Plan) -> u64 {
    match plan {
        Plan::Open(kind) => {
            let per_unit = Workload::new(kind.clone(), args.seed, None).requests_per_unit();
            args.warmup_requests.div_ceil(per_unit)
        }
        Plan::Closed(_) => 0,
    }
}

/// Refuses a `--plot` path whose extension names no format the plot can write.
fn check_plot_path(args: &BenchArgs) -> Result<(), BenchError> {
    if let Some(plot) = &args.plot {
        let ext = plot
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        if !matches!(ext.as_deref(), Some("svg" | "png")) {
            return Err(BenchError::Config(format!(
                "--plot must end in .svg or .png: {}",
                plot.display()
            )));
        }
    }
    Ok(())
}

/// One HTTP client for every request: idle connections are kept for reuse, however many.
fn http_client(timeout: Duration) -> Result<reqwest::Client, BenchError> {
    reqwest::Client::builder()
        .pool_max_idle_per_host(usize::MAX)
        .pool_idle_timeout(Duration::from_secs(90))
        .tcp_nodelay(true)
        .connect_timeout(timeout.min(Duration::from_secs(30)))
        .build()
        .map_err(BenchError::Client)
}

/// Prints the table (unless `--quiet`) and writes the JSON and plot files asked for.
fn emit(args: &BenchArgs, outcome: &BenchOutcome) -> Result<(), BenchError> {
    if !args.quiet {
        let rate_unit = match args.workload.as_str() {
            "agentic" => "sessions/s",
            "fanout" => "bursts/s",
            _ => "req/s",
        };
        let table = report::table(&outcome.results, &outcome.capacity, &outcome.slo, rate_unit);
        print!("{table}");
    }
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(outcome).map_err(BenchError::Json)?;
        std::fs::write(path, text + "\n").map_err(|source| BenchError::Io {
            path: path.clone(),
            source,
        })?;
    }
    if let Some(path) = &args.plot {
        let sweep = args.sweep.is_some() || args.from_records.is_some();
        plot::draw(path, &outcome.results, sweep)?;
    }
    Ok(())
}

/// Runs the benchmark described by `args`: every target, every rate; prints the table to
/// stdout and writes the JSON and plot files when asked. With `--from-records` it sends
/// nothing and summarises the file's requests instead.
pub async fn run(args: &BenchArgs) -> Result<BenchOutcome, BenchError> {
    validate(args)?;
    if let Some(path) = &args.from_records {
        let outcome = resummarise::outcome(args, path)?;
        emit(args, &outcome)?;
        return Ok(outcome);
    }
    let plan = plan(args)?;
    let rates = rates(args)?;
    check_plot_path(args)?;
    let timeout = Duration::from_secs_f64(args.timeout_s);
    let http = http_client(timeout)?;
    let targets: Arc<[Target]> = args.urls.iter().map(|u| Target::new(u, args.api)).collect();
    let model = model_name(args, &http, &targets).await;
    let opts = BodyOptions {
        model: model.clone(),
        api: args.api,
        stream: !args.no_stream,
        ignore_eos: args.ignore_eos,
    };
    let slo = Slo {
        ttft_ms: args.slo_ttft_ms,
        tpot_ms: args.slo_tpot_ms,
    };
    let limits = limits(args);
    let sender = Sender {
        client: http.clone(),
        stream: !args.no_stream,
        key: args.api_key.clone(),
        run_start: tokio::time::Instant::now(),
        timeout,
    };
    let warm_units = warm_units(args, &plan);
    let setup = Setup {
        args,
        plan: &plan,
        targets: &targets,
        opts: &opts,
        sender: &sender,
    };
    if args.warmup_requests > 0 {
        let rate = rates[0]
            .or(args.ramp_up_start_rps)
            .unwrap_or(args.rate)
            .max(1.0);
        setup.warm_up(rate).await;
    }
    let results = setup
        .measure(&rates, limits, warm_units, &http, &slo)
        .await?;
    let capacity = if args.sweep.is_some() {
        sweep::capacity(&results, args.capacity_attainment)
    } else {
        Vec::new()
    };
    let outcome = BenchOutcome {
        results,
        capacity,
        slo,
        model,
        workload: args.workload.clone(),
        seed: args.seed,
    };
    emit(args, &outcome)?;
    Ok(outcome)
}

#[cfg(test)]
mod tests;
