//! Driving a run against every target: the warm-up, then each offered rate in turn.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

use crate::arrivals::{self, Ramp, RampAxis};
use crate::client::{BodyOptions, Record, Sender, Target};
use crate::plan::{Closed, Plan};
use crate::runner::{self, Limits, Schedule};
use crate::sessions::Sessions;
use crate::workload::{Kind, Workload};
use crate::{engines, records, BenchArgs, BenchError, Slo, TargetReport};

pub(crate) fn ramp(args: &BenchArgs, limits: &Limits) -> Ramp {
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

/// What the warm-up and every rate share.
pub(crate) struct Setup<'a> {
    pub(crate) args: &'a BenchArgs,
    pub(crate) plan: &'a Plan,
    pub(crate) targets: &'a Arc<[Target]>,
    pub(crate) opts: &'a BodyOptions,
    pub(crate) sender: &'a Sender,
}

impl Setup<'_> {
    fn run<'b>(&'b self, bar: &'b ProgressBar) -> Run<'b> {
        Run {
            targets: self.targets,
            opts: self.opts,
            sender: self.sender,
            bar,
        }
    }

    /// Sends `--warmup-requests` unmeasured requests to every target at `rate`, from a
    /// workload seeded apart from the measured one.
    pub(crate) async fn warm_up(&self, rate: f64) {
        let args = self.args;
        let warm = Limits {
            duration_s: None,
            num_requests: Some(args.warmup_requests),
        };
        let bar = progress_bar(args, Some(args.warmup_requests * self.targets.len() as u64));
        bar.set_message("warm-up");
        let run = self.run(&bar);
        match self.plan {
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

    /// Runs every rate in turn: one report per target and rate, rate-major, each target's
    /// records also written to `--records` when asked.
    pub(crate) async fn measure(
        &self,
        rates: &[Option<f64>],
        limits: Limits,
        warm_units: u64,
        http: &reqwest::Client,
        slo: &Slo,
    ) -> Result<Vec<TargetReport>, BenchError> {
        let mut records_file = self
            .args
            .records
            .as_deref()
            .map(records::RecordsFile::create)
            .transpose()?;
        let mut results = Vec::new();
        // Each rate of a sweep continues the workload where the previous rate stopped, so a random
        // workload stays uncached and agentic sessions stay new; a replay file restarts per rate.
        let mut carried: Option<Workload> = None;
        for (k, rate) in rates.iter().enumerate() {
            let (per_target, loads) = self
                .at_rate(k, *rate, limits, warm_units, http, &mut carried)
                .await;
            for ((t, records), load) in self.targets.iter().zip(&per_target).zip(loads) {
                let mut report = TargetReport::new(&t.name, *rate, records, slo);
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
        Ok(results)
    }

    /// Runs the `k`th rate (`None`: ramped) against every target, watching the engines when
    /// `--engines` names them: each target's records and engine load. An open plan continues
    /// the workload `carried` from the previous rate, after the `warm_units` the warm-up used.
    async fn at_rate(
        &self,
        k: usize,
        rate: Option<f64>,
        limits: Limits,
        warm_units: u64,
        http: &reqwest::Client,
        carried: &mut Option<Workload>,
    ) -> (Vec<Vec<Record>>, Vec<Option<engines::EngineLoad>>) {
        let args = self.args;
        let rate_value = rate.unwrap_or(0.0);
        let expected = limits.num_requests.or_else(|| {
            let d = limits.duration_s?;
            let per_unit = match self.plan {
                Plan::Closed(c) => c.per_unit(),
                Plan::Open(_) => 1.0,
            };
            (rate_value.is_finite() && rate.is_some()).then_some((rate_value * d * per_unit) as u64)
        });
        let bar = progress_bar(args, expected.map(|n| n * self.targets.len() as u64));
        if let Some(r) = rate {
            bar.set_message(format!("{r} req/s"));
        }
        let run = self.run(&bar);
        let watch = (!args.engines.is_empty()).then(|| {
            let groups = args
                .engines
                .iter()
                .map(|g| g.split(',').map(|u| u.trim().to_owned()).collect())
                .collect();
            engines::EngineWatch::start(http.clone(), groups)
        });
        let per_target = match self.plan {
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
                *carried = Some(schedule.into_workload());
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
        loads.resize(self.targets.len(), None);
        (per_target, loads)
    }
}
