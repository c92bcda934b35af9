//! `kvgate sim`: run one of the simulator's scenarios and print a table or JSON.

use anyhow::Context;
use kvgate_sim::scenario::{self, Options, SCENARIOS};
use std::collections::BTreeMap;

/// How to print the report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Format {
    /// A readable table with notes.
    Table,
    /// JSON with top-level `scenario` and `results`.
    Json,
}

/// Run a fleet simulation scenario (routing-lab, staleness-lab, prefix-player, batching,
/// agentic, sweep).
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The scenario to run.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(SCENARIOS))]
    scenario: String,
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
    let report = scenario::run(&args.scenario, &options)
        .with_context(|| format!("scenario {}", args.scenario))?;
    match args.format {
        Format::Table => print!("{}", report.to_text()),
        Format::Json => print!("{}", report.to_json()),
    }
    Ok(())
}
