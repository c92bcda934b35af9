//! The named experiments behind `kvgate sim --scenario NAME`. Section numbers are the reference
//! article's (docs/background.md#the-reference-experiments).
//!
//! | scenario | what it shows |
//! |---|---|
//! | `routing-lab` | §4.2: every selection rule on the same arrivals |
//! | `staleness-lab` | §5.6: herding on a shared stale snapshot and its mitigations |
//! | `prefix-player` | §6.1: affinity versus balance, step by step with reasons |
//! | `batching` | §7.2: static, continuous and chunked-prefill batching |
//! | `agentic` | sessions with growing context and fan-out on a realistic cost model |
//! | `sweep` | goodput versus arrival rate; each policy's capacity under the SLO |
//! | `fanout`, `heterogeneous`, `tenants`, `replica-loss`, `mix` | capacity under a TTFT SLO in the failure modes measured against the peers' routers, against the oracle router |
//! | `shared-prefix`, `random` | the same on the classic open-loop benchmarks: shared prefixes that fit everywhere, and prompts that share nothing |
//! | `pd` | prefill/decode disaggregation's modes on long-prompt agentic sessions at one fleet size |
//!
//! [`configured`] runs a gateway's own configuration (`kvgate sim --config FILE`) as such a
//! capacity sweep.
//!
//! Every scenario returns a [`Report`]: parameters, one result object per policy or variant,
//! notes, and a rendered table. Reports are deterministic: the same seed and settings give
//! byte-identical JSON (maps are ordered, no hash-map iteration reaches output or decisions).

mod agentic;
mod batching;
mod capacity;
pub mod configured;
mod failure_modes;
mod families;
pub mod metrics;
mod params;
mod pd;
mod prefix_player;
mod routing_lab;
mod staleness_lab;
mod sweep;
mod table;

pub use metrics::{PolicyResult, Slo};
pub use params::Params;
pub use table::Table;

use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;

/// The scenario names, in the order `kvgate sim` lists them.
pub const SCENARIOS: [&str; 14] = [
    "routing-lab",
    "staleness-lab",
    "prefix-player",
    "batching",
    "agentic",
    "sweep",
    "fanout",
    "heterogeneous",
    "tenants",
    "replica-loss",
    "mix",
    "shared-prefix",
    "random",
    "pd",
];

/// What the user asked for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// Policies to compare; empty means the scenario's default set.
    pub policies: Vec<String>,
    /// The seed of every random draw.
    pub seed: u64,
    /// `--set key=value` settings.
    pub sets: BTreeMap<String, String>,
}

/// Why a scenario could not run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No such scenario.
    #[error("unknown scenario {0:?}; expected one of {list}", list = SCENARIOS.join(", "))]
    UnknownScenario(String),
    /// No such policy.
    #[error("unknown policy {0:?}; `kvgate policies` lists them")]
    UnknownPolicy(String),
    /// No such workload for a configuration ([`configured::WORKLOADS`]).
    #[error("unknown workload {0:?}; expected one of {list}", list = configured::WORKLOADS.join(", "))]
    UnknownWorkload(String),
    /// A deployment the simulation cannot run.
    #[error("{0}")]
    Deployment(String),
    /// A setting has a bad value.
    #[error("--set {key}: {why}")]
    BadSetting {
        /// The key.
        key: String,
        /// What is wrong.
        why: String,
    },
    /// A setting no part of the scenario reads.
    #[error("--set {key}: not a parameter of this scenario (parameters: {known})")]
    UnknownSetting {
        /// The key.
        key: String,
        /// The parameters the scenario reads.
        known: String,
    },
}

/// A scenario's results.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    /// The scenario name.
    pub scenario: String,
    /// The seed.
    pub seed: u64,
    /// Effective parameters.
    pub params: BTreeMap<String, Value>,
    /// One object per policy or variant.
    pub results: Vec<Value>,
    /// What the numbers mean, and where the model departs from the reference.
    pub notes: Vec<String>,
    /// The rendered table (not part of the JSON).
    #[serde(skip)]
    pub table: String,
}

impl Report {
    /// Pretty JSON with a trailing newline.
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).expect("reports serialise");
        s.push('\n');
        s
    }

    /// The table followed by the notes.
    pub fn to_text(&self) -> String {
        let mut s = format!(
            "scenario {} (seed {})\n\n{}",
            self.scenario, self.seed, self.table
        );
        for note in &self.notes {
            s.push_str("\n- ");
            s.push_str(note);
        }
        s.push('\n');
        s
    }

    /// The result of `name` (matching `policy` or `variant`), for tests and callers.
    pub fn result(&self, name: &str) -> Option<&Value> {
        self.results.iter().find(|r| {
            r.get("variant").and_then(Value::as_str) == Some(name)
                || (r.get("variant").is_none()
                    && r.get("policy").and_then(Value::as_str) == Some(name))
        })
    }
}

/// Runs scenario `name`.
pub fn run(name: &str, options: &Options) -> Result<Report, Error> {
    match name {
        "routing-lab" => routing_lab::run(options),
        "staleness-lab" => staleness_lab::run(options),
        "prefix-player" => prefix_player::run(options),
        "batching" => batching::run(options),
        "agentic" => agentic::run(options),
        "sweep" => sweep::run(options),
        "pd" => pd::run(options),
        // The rest of the list is the failure-mode sweeps, which reject a name they do not run.
        _ => match SCENARIOS.iter().find(|n| **n == name) {
            Some(n) => failure_modes::run(n, options),
            None => Err(Error::UnknownScenario(name.to_string())),
        },
    }
}

/// `share_ms=D`: the routers share their dispatches, first tokens and completions with each
/// other after D milliseconds, as gateway replicas over NATS (`kvgate serve --cluster`); absent
/// or negative, each router knows only its own.
pub(crate) fn share(p: &mut Params<'_>) -> Result<Option<kvgate_core::Nanos>, Error> {
    let ms = p.f64("share_ms", -1.0)?;
    Ok((ms >= 0.0).then(|| kvgate_core::Nanos((ms * 1e6).round() as u64)))
}

/// The policies to run: the user's, or `defaults`.
fn policy_names(options: &Options, defaults: &[&str]) -> Vec<String> {
    if options.policies.is_empty() {
        defaults.iter().map(|s| s.to_string()).collect()
    } else {
        options.policies.clone()
    }
}

fn to_value<T: Serialize>(v: &T) -> Value {
    serde_json::to_value(v).expect("results serialise")
}

/// `f` over `items` on up to `available_parallelism` threads, results in input order. Runs are
/// independent and seeded, so the output does not depend on scheduling.
fn par_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(items.len().max(1));
    if threads <= 1 {
        return items.iter().map(f).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut out: Vec<(usize, R)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(item) = items.get(i) else { break };
                        mine.push((i, f(item)));
                    }
                    mine
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("simulation thread panicked"))
            .collect()
    });
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, r)| r).collect()
}
