//! `kvgate`: one binary, one subcommand per job. Thin: it parses flags and calls the crates.

// Tests spell out whole scenarios step by step; the length limit is for the code they test.
#![cfg_attr(test, allow(clippy::too_many_lines))]

mod bench;
mod config_check;
mod demo;
mod descriptors;
mod engine;
mod epp;
mod plot;
mod policies;
mod probe;
mod route_eval;
mod serve;
mod sim;
mod stats;

use clap::{Parser, Subcommand};

/// A KV-cache-aware load balancer and gateway for LLM serving.
#[derive(Debug, Parser)]
#[command(name = "kvgate", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List every routing policy with its parameters and defaults.
    Policies(policies::Args),
    /// Run an emulated vLLM-compatible engine.
    Engine(Box<engine::Args>),
    /// Run the gateway (with no endpoints: emulated engines in-process behind it).
    Serve(Box<serve::Args>),
    /// Pick endpoints for an Envoy gateway (Gateway API Inference Extension, ext_proc gRPC).
    Epp(Box<serve::Args>),
    /// Run a fleet simulation scenario, or simulate a gateway configuration (`--config FILE`).
    Sim(sim::Args),
    /// Open-loop benchmark of OpenAI-compatible endpoints (goodput under an SLO).
    Bench(Box<bench::Args>),
    /// Compare policies on the same agentic traffic through the gateway, against emulated engines.
    Demo(demo::Args),
    /// Draw time series from JSON lines (one panel per field), as the soak records them.
    Plot(plot::Args),
    /// Count, mean, percentiles and max of a column of numbers (or of a field of JSON lines).
    Stats(stats::Args),
    /// Check a configuration file and print it with every default (`kvgate config check FILE`).
    Config(config_check::Args),
    /// Print a shell completion script (`kvgate completions bash > /etc/bash_completion.d/kvgate`).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// GET an http:// URL; exit 0 on 2xx, 1 otherwise (the container image's health check).
    Probe(probe::Args),
    /// Judge the difficulty scorers on labelled data (RouteLLM's APGR and CPT, held-out split).
    RouteEval(route_eval::Args),
}

fn main() -> anyhow::Result<()> {
    init_logging();
    let result = run(Cli::parse());
    // A closed pipe (`kvgate policies | head`) is how a reader says it has read enough.
    if let Err(e) = &result {
        let broken_pipe =
            |kind: Option<std::io::ErrorKind>| kind == Some(std::io::ErrorKind::BrokenPipe);
        if e.chain().any(|c| {
            broken_pipe(c.downcast_ref::<std::io::Error>().map(std::io::Error::kind))
                || broken_pipe(
                    c.downcast_ref::<serde_json::Error>()
                        .and_then(|j| j.io_error_kind()),
                )
        }) {
            return Ok(());
        }
    }
    result
}

/// Diagnostics go to stderr through `tracing` (stdout carries results and the access log);
/// `KVGATE_LOG` filters them as `RUST_LOG` would (`info` by default).
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("KVGATE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Policies(args) => policies::run(&args),
        Command::Engine(args) => engine::run(&args),
        Command::Serve(args) => serve::run(&args),
        Command::Epp(args) => epp::run(&args),
        Command::Sim(args) => sim::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Demo(args) => demo::run(&args),
        Command::Plot(args) => plot::run(&args),
        Command::Stats(args) => stats::run(&args),
        Command::Config(args) => config_check::run(&args),
        Command::Completions { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut command, "kvgate", &mut std::io::stdout());
            Ok(())
        }
        Command::Probe(args) => probe::run(&args),
        Command::RouteEval(args) => route_eval::run(&args),
    }
}

/// The multi-threaded runtime of a long-running subcommand, with `threads` workers if given
/// (else one per core).
fn runtime(threads: Option<usize>) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = threads {
        builder.worker_threads(threads.max(1));
    }
    anyhow::Context::context(builder.enable_all().build(), "starting the async runtime")
}
