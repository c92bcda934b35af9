//! `kvgate sim`: run one of the simulator's scenarios, or a gateway configuration
//! (`--config`), and print a table or JSON.

use anyhow::Context;
use kvgate_sim::scenario::{self, configured, Options, SCENARIOS};
use std::collections::BTreeMap;
use std::path::PathBuf;

mod config;

/// How to print the report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Format {
    /// A readable table with notes.
    Table,
    /// JSON with top-level `scenario` and `results`.
    Json,
}

/// Run a fleet simulation scenario (routing-lab, staleness-lab, prefix-player, batching,
/// agentic, sweep, ...), or simulate a gateway configuration (`--config FILE`): its endpoints
/// as a fleet, its policy and admission, capacity per policy.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["scenario", "config"])))]
pub(crate) struct Args {
    /// The scenario to run.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(SCENARIOS))]
    scenario: Option<String>,
    /// A gateway configuration (YAML, as for `kvgate serve --config`) to simulate: capacity
    /// under the SLO of its policy as configured, of other policies and of the oracle.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// With --config: an endpoint's speed relative to the default engine model, by its name or
    /// URL (`10.0.0.2:8000=0.5`); repeatable; 1 when not given.
    #[arg(
        long = "speed",
        value_name = "NAME=FACTOR",
        conflicts_with = "scenario"
    )]
    speeds: Vec<String>,
    /// With --config: the workload (agentic sessions by default).
    #[arg(long, conflicts_with = "scenario",
          value_parser = clap::builder::PossibleValuesParser::new(configured::WORKLOADS))]
    workload: Option<String>,
    /// With --config that names no endpoints (or discovers them from Kubernetes): simulate N
    /// identical replicas.
    #[arg(long, value_name = "N", conflicts_with = "scenario")]
    replicas: Option<usize>,
    /// A policy to include (repeatable); default: the scenario's own set.
    #[arg(long = "policy")]
    policies: Vec<String>,
    /// Seed of every random draw; the same seed gives byte-identical JSON.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
    /// Override a scenario parameter or a policy field (`rate=0.05`,
    /// `cache_aware.balance_abs_threshold=8`); repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
}

pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let mut sets = BTreeMap::new();
    for kv in &args.sets {
        let (k, v) = kv
            .split_once('=')
            .with_context(|| format!("--set {kv:?}: expected KEY=VALUE"))?;
        sets.insert(k.trim().to_string(), v.trim().to_string());
    }
    let options = Options {
        policies: args.policies.clone(),
        seed: args.seed,
        sets,
    };
    let report = match (&args.scenario, &args.config) {
        (Some(name), _) => {
            scenario::run(name, &options).with_context(|| format!("scenario {name}"))?
        }
        (None, Some(path)) => {
            let deployment = config::deployment(path, &args.speeds, args.replicas)?;
            let workload = args.workload.as_deref().unwrap_or(configured::WORKLOADS[0]);
            configured::run(&deployment, workload, &options)
                .with_context(|| format!("simulating {}", path.display()))?
        }
        (None, None) => unreachable!("clap requires --scenario or --config"),
    };
    match args.format {
        Format::Table => print!("{}", report.to_text()),
        Format::Json => print!("{}", report.to_json()),
    }
    Ok(())
}
