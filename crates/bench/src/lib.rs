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

mod args;
pub mod arrivals;
pub mod client;
pub mod engines;
mod error;
pub mod plot;
pub mod records;
pub mod report;
mod resummarise;
pub mod runner;
pub mod sessions;
pub mod stats;
pub mod sweep;
pub mod workload;

use std::io::IsTerminal;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

pub use args::{Api, BenchArgs};
pub use error::BenchError;
pub use report::{Capacity, Slo, TargetReport};

use arrivals::{Ramp, RampAxis};
use client::{BodyOptions, Record, Sender, Target};
use kvgate_sim::dist::Lengths;
use kvgate_sim::workload::{Agentic, AgenticConfig, Bursts, BurstsConfig};
use runner::{Limits, Schedule};
use sessions::Sessions;
use workload::{Kind, PrefixConfig, RandomConfig, Workload};

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

/// A closed-loop workload: the simulator's model at an offered rate.
#[derive(Debug, Clone, Copy)]
enum Closed {
    Agentic(AgenticConfig),
    Fanout(BurstsConfig),
}

impl Closed {
    fn at(self, rate: f64) -> Box<dyn kvgate_sim::workload::Workload + Send> {
        match self {
            Closed::Agentic(c) => Box::new(Agentic::new(AgenticConfig {
                session_rate: rate,
                ..c
            })),
            Closed::Fanout(c) => Box::new(Bursts::new(BurstsConfig { rate, ..c })),
        }
    }

    /// Requests per started session or burst, roughly (for the progress bar).
    fn per_unit(self) -> f64 {
        match self {
            Closed::Agentic(c) => c.turns * (1.0 + c.fanout_prob * f64::from(c.fanout)),
            Closed::Fanout(c) => f64::from(c.fanout.max(1)),
        }
    }
}

/// What the run sends.
#[derive(Debug, Clone)]
enum Plan {
    Open(Kind),
    Closed(Closed),
}

fn mean(base: Lengths, mean: f64) -> Lengths {
    Lengths {
        mean: mean.max(1.0),
        ..base
    }
}

fn plan(args: &BenchArgs) -> Result<Plan, BenchError> {
    match args.workload.as_str() {
        "agentic" => {
            let d = AgenticConfig::default();
            return Ok(Plan::Closed(Closed::Agentic(AgenticConfig {
                requests: u64::MAX,
                tenants: args.agentic_tenants.max(1),
                system_tokens: args.agentic_system_len,
                turns: args.agentic_turns.max(1.0),
                user_text: mean(d.user_text, args.agentic_user_len),
                answer: mean(d.answer, args.agentic_output_len),
                think_time_s: args.agentic_think_time_ms.max(0.0) / 1e3,
                fanout_prob: args.agentic_fanout_prob.clamp(0.0, 1.0),
                fanout: args.agentic_fan_out,
                max_context: args.agentic_max_context,
                ..d
            })));
        }
        "fanout" => {
            let d = BurstsConfig::default();
            return Ok(Plan::Closed(Closed::Fanout(BurstsConfig {
                requests: u64::MAX,
                prompts: args.fanout_prompts.max(1),
                prompt_tokens: args.fanout_prompt_len,
                fanout: args.fanout_calls.max(1),
                context: mean(d.context, args.fanout_context_len),
                task: mean(d.task, args.fanout_task_len),
                ..d
            })));
        }
        _ => {}
    }
    workload_kind(args).map(Plan::Open)
}

fn workload_kind(args: &BenchArgs) -> Result<Kind, BenchError> {
    Ok(match args.workload.as_str() {
        "random" => Kind::Random(RandomConfig {
            input_len: args.random_input_len,
            output_len: args.random_output_len,
            range_ratio: args.random_range_ratio.clamp(0.0, 1.0),
        }),
        "prefix-repetition" | "prefix_repetition" => Kind::PrefixRepetition(PrefixConfig {
            prefix_len: args.prefix_repetition_prefix_len,
            suffix_len: args.prefix_repetition_suffix_len,
            num_prefixes: args.prefix_repetition_num_prefixes,
            output_len: args.prefix_repetition_output_len,
        }),
        file => Kind::Replay(Workload::load_jsonl(Path::new(file))?),
    })
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

fn ramp(args: &BenchArgs, limits: &Limits) -> Ramp {
    match (args.ramp_up_start_rps, args.ramp_up_end_rps) {
        (Some(start), Some(end)) => match (limits.num_requests, limits.duration_s) {
            (Some(n), _) => Ramp::Linear {
                start,
                end,
                over: n as f64,
                axis: RampAxis::Requests,
            },
            (None, Some(d)) => Ramp::Linear {
                start,
                end,
                over: d,
                axis: RampAxis::Seconds,
            },
            (None, None) => Ramp::Constant,
        },
        _ => Ramp::Constant,
    }
}

fn progress_bar(args: &BenchArgs, total: Option<u64>) -> ProgressBar {
    if args.no_progress || !std::io::stdout().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = match total {
        Some(n) => ProgressBar::new(n),
        None => ProgressBar::no_length(),
    };
    if let Ok(style) = ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {msg} {wide_bar} {pos}/{len} responses ({per_sec})",
    ) {
        bar.set_style(style);
    }
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// One rate's run against the targets.
struct Run<'a> {
    targets: &'a Arc<[Target]>,
    opts: &'a BodyOptions,
    sender: &'a Sender,
    bar: &'a ProgressBar,
}

impl Run<'_> {
    /// An open-loop schedule: every request to every target at the same instant.
    async fn open(&self, schedule: &mut Schedule) -> Vec<Vec<Record>> {
        runner::run_schedule(
            schedule,
            self.targets.clone(),
            self.opts,
            self.sender.clone(),
            self.bar,
        )
        .await
    }

    /// A closed-loop model: each target runs its own copy (the same sessions start at the same
    /// times; what follows depends on that target's answers), all at once.
    async fn closed(
        &self,
        closed: Closed,
        rate: f64,
        seed: u64,
        limits: Limits,
    ) -> Vec<Vec<Record>> {
        let runs: Vec<_> = self
            .targets
            .iter()
            .map(|t| {
                let target: Arc<[Target]> = Arc::from(vec![t.clone()]);
                let mut sessions = Sessions::new(closed.at(rate), seed, limits);
                let (opts, sender, bar) =
                    (self.opts.clone(), self.sender.clone(), self.bar.clone());
                tokio::spawn(async move {
                    runner::run_schedule(&mut sessions, target, &opts, sender, &bar)
                        .await
                        .pop()
                        .unwrap_or_default()
                })
            })
            .collect();
        let mut out = Vec::with_capacity(runs.len());
        for run in runs {
            // A panicking run is a bug in the bench; surface it rather than report a short run.
            out.push(
                run.await
                    .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic())),
            );
        }
        out
    }
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
    let rates: Vec<Option<f64>> = match (&args.sweep, args.ramp_up_start_rps) {
        (Some(spec), _) => sweep::parse(spec)?.into_iter().map(Some).collect(),
        (None, Some(_)) => vec![None],
        (None, None) => vec![Some(args.rate)],
    };
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
    let timeout = Duration::from_secs_f64(args.timeout_s);
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(usize::MAX)
        .pool_idle_timeout(Duration::from_secs(90))
        .tcp_nodelay(true)
        .connect_timeout(timeout.min(Duration::from_secs(30)))
        .build()
        .map_err(BenchError::Client)?;
    let targets: Arc<[Target]> = args.urls.iter().map(|u| Target::new(u, args.api)).collect();
    let model = match &args.model {
        Some(m) => m.clone(),
        None => client::first_model(&http, &targets[0], args.api_key.as_deref())
            .await
            .unwrap_or_else(|| "default".to_owned()),
    };
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
    let warm_units = match &plan {
        Plan::Open(kind) => {
            let per_unit = Workload::new(kind.clone(), args.seed, None).requests_per_unit();
            args.warmup_requests.div_ceil(per_unit)
        }
        Plan::Closed(_) => 0,
    };
    if args.warmup_requests > 0 {
        let rate = rates[0]
            .or(args.ramp_up_start_rps)
            .unwrap_or(args.rate)
            .max(1.0);
        let warm = Limits {
            duration_s: None,
            num_requests: Some(args.warmup_requests),
        };
        let bar = progress_bar(args, Some(args.warmup_requests * targets.len() as u64));
        bar.set_message("warm-up");
        let run = Run {
            targets: &targets,
            opts: &opts,
            sender: &sender,
            bar: &bar,
        };
        match &plan {
            Plan::Open(kind) => {
                let workload = Workload::new(kind.clone(), args.seed, args.output_len);
                let arrivals = arrivals::Arrivals::new(
                    runner::arrival_config(rate, args.burstiness, Ramp::Constant),
                    args.seed ^ 0x5741_524d,
                );
                run.open(&mut Schedule::new(arrivals, workload, warm)).await;
            }
            Plan::Closed(closed) => {
                run.closed(*closed, rate, args.seed ^ 0x5741_524d, warm)
                    .await;
            }
        }
        bar.finish_and_clear();
    }
    let mut records_file = args
        .records
        .as_deref()
        .map(records::RecordsFile::create)
        .transpose()?;
    let mut results = Vec::new();
    // Each rate of a sweep continues the workload where the previous rate stopped, so a random
    // workload stays uncached and agentic sessions stay new; a replay file restarts per rate.
    let mut carried: Option<Workload> = None;
    for (k, rate) in rates.iter().enumerate() {
        let rate_value = rate.unwrap_or(0.0);
        let expected = limits.num_requests.or_else(|| {
            let d = limits.duration_s?;
            let per_unit = match &plan {
                Plan::Closed(c) => c.per_unit(),
                Plan::Open(_) => 1.0,
            };
            (rate_value.is_finite() && rate.is_some()).then_some((rate_value * d * per_unit) as u64)
        });
        let bar = progress_bar(args, expected.map(|n| n * targets.len() as u64));
        if let Some(r) = rate {
            bar.set_message(format!("{r} req/s"));
        }
        let run = Run {
            targets: &targets,
            opts: &opts,
            sender: &sender,
            bar: &bar,
        };
        let watch = (!args.engines.is_empty()).then(|| {
            let groups = args
                .engines
                .iter()
                .map(|g| g.split(',').map(|u| u.trim().to_owned()).collect())
                .collect();
            engines::EngineWatch::start(http.clone(), groups)
        });
        let per_target = match &plan {
            Plan::Open(kind) => {
                let workload = match carried.take() {
                    Some(w) if !matches!(kind, Kind::Replay(_)) => w,
                    _ => {
                        let mut w = Workload::new(kind.clone(), args.seed, args.output_len);
                        w.skip_units(warm_units);
                        w
                    }
                };
                let arrivals = arrivals::Arrivals::new(
                    runner::arrival_config(rate_value, args.burstiness, ramp(args, &limits)),
                    args.seed,
                );
                let mut schedule = Schedule::new(arrivals, workload, limits);
                let records = run.open(&mut schedule).await;
                carried = Some(schedule.into_workload());
                records
            }
            // A fresh model per rate, its stream offset by the rate's index: new sessions.
            Plan::Closed(closed) => {
                let seed = args.seed.wrapping_add(k as u64 * 0x9e37_79b9);
                run.closed(*closed, rate_value, seed, limits).await
            }
        };
        bar.finish_and_clear();
        let mut loads = watch.map(engines::EngineWatch::finish).unwrap_or_default();
        loads.resize(targets.len(), None);
        for ((t, records), load) in targets.iter().zip(&per_target).zip(loads) {
            let mut report = TargetReport::new(&t.name, *rate, records, &slo);
            report.engines = load;
            results.push(report);
            if let Some(file) = &mut records_file {
                file.write(&t.name, *rate, records)?;
            }
        }
    }
    if let Some(file) = records_file {
        file.finish()?;
    }
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
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn parse(extra: &[&str]) -> Result<BenchArgs, clap::Error> {
        let mut argv = vec!["bench", "--url", "http://x"];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv).map(|c| c.bench)
    }

    #[test]
    fn validation_rejects_unrunnable_flags() {
        for bad in [
            &["--rate", "0"][..],
            &["--rate", "inf", "--duration", "5"],
            &["--burstiness", "0"],
            &["--ramp-up-start-rps", "0", "--ramp-up-end-rps", "5"],
            &["--capacity-attainment", "1.5"],
            &["--num-requests", "0"],
        ] {
            let args = parse(bad).unwrap();
            assert!(
                matches!(validate(&args), Err(BenchError::Config(_))),
                "{bad:?}"
            );
        }
        assert!(validate(&parse(&["--rate", "inf", "--num-requests", "5"]).unwrap()).is_ok());
        assert!(
            parse(&["--rate", "5", "--sweep", "1:2:1"]).is_err(),
            "rate and sweep conflict"
        );
        assert!(
            parse(&["--ramp-up-start-rps", "1"]).is_err(),
            "ramp needs both ends"
        );
    }

    #[test]
    fn vllm_aliases_parse() {
        let a = parse(&["--request-rate", "3", "--num-prompts", "7"]).unwrap();
        assert_eq!((a.rate, a.num_requests), (3.0, Some(7)));
        assert_eq!(limits(&parse(&[]).unwrap()).num_requests, Some(1000));
        let ramp = ramp(
            &parse(&["--ramp-up-start-rps", "1", "--ramp-up-end-rps", "9"]).unwrap(),
            &Limits {
                duration_s: None,
                num_requests: Some(100),
            },
        );
        assert_eq!(
            ramp,
            Ramp::Linear {
                start: 1.0,
                end: 9.0,
                over: 100.0,
                axis: RampAxis::Requests
            }
        );
    }
}
