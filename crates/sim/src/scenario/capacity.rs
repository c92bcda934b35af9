//! Capacity under an SLO (docs/background.md#open-loop-evaluation-and-capacity): sweep the
//! open-loop arrival rate of one workload on one fleet, and report for each policy, and for the
//! oracle router, the largest request rate whose TTFT P95 meets the SLO with fewer than 1% failed
//! requests.
//!
//! Unlike [`kvgate_core::stats::capacity`] (the highest passing swept rate, which the bench and
//! the `sweep` scenario report), this capacity is interpolated: between the last passing rate
//! and the first failing one, the rate where TTFT P95 crosses the SLO (linearly), or the last
//! passing rate when errors failed it. Rates above the first failure are not consulted, so a
//! lucky point past the knee cannot raise a capacity. It resolves policies whose knees fall
//! between two swept rates, at the cost of that difference. `capacity` is in requests per
//! second; the sweep's own unit (sessions or bursts per second) is `rate`. When the lowest rate
//! fails, `capacity` is null and `lowest_rate_tried` is that rate (in the sweep's unit).

use super::metrics::{summarise, PolicyResult, Slo, Window};
use super::table::{num, pct, Table};
use super::{par_map, Report};
use crate::fleet::{self, FleetConfig, Outcome};
use crate::workload::{Workload, WARM_TAG};
use kvgate_core::{Nanos, PolicyConfig};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;

/// The oracle's row name.
pub(super) const ORACLE: &str = "oracle";

/// Failed requests tolerated at a passing rate.
pub(super) const MAX_ERROR_RATE: f64 = 0.01;

/// One experiment: a fleet, a workload family and an SLO.
pub(super) struct Experiment<'a> {
    /// The scenario's name.
    pub name: &'static str,
    /// The fleet (its policy is replaced per row).
    pub fleet: FleetConfig,
    /// The SLO (ticks).
    pub slo: Slo,
    /// The workload at an open-loop rate.
    pub workload: &'a (dyn Fn(f64) -> Box<dyn Workload> + Sync),
    /// Rates to sweep, ascending.
    pub rates: Vec<f64>,
    /// Requests the workload issues, measured.
    pub requests: u64,
    /// Seconds of unmeasured warm-up arrivals before them.
    pub warmup_secs: f64,
    /// What one rate unit is ("sessions/s", "bursts/s").
    pub rate_unit: &'static str,
    /// Requests per unit of rate (a session's turns, a burst's calls), for the run's horizon.
    pub per_unit: f64,
    /// Extra numbers per run (for example TTFT P95 before and after a replica died).
    pub extra: &'a (dyn Fn(&Outcome) -> BTreeMap<String, Value> + Sync),
}

/// One swept rate.
#[derive(Clone, Debug, Serialize)]
pub(super) struct Point {
    pub rate: f64,
    pub request_rate: f64,
    pub ttft_p95: f64,
    pub error_rate: f64,
    pub cache_hit_ratio: f64,
    pub slo_attainment: f64,
    pub assigned: Vec<u64>,
    /// Share of requests whose measured TTFT was within 20% of the router's prediction (null
    /// for policies that do not predict).
    pub predicted_within_20pct: Option<f64>,
    /// The same share among requests whose measured TTFT was at least 500 ms, where an
    /// iteration in progress at arrival (up to ~260 ms with a full 2,048-token chunk, which no
    /// router can see) weighs less than 20%.
    pub predicted_within_20pct_over_500ms: Option<f64>,
    /// Median and 90th percentile of |measured - predicted| TTFT, milliseconds.
    pub prediction_error_ms: Option<[f64; 2]>,
    /// Shares of predicted requests whose predicted cached tokens were within one block of the
    /// engine's (exact), above (over) or below (under): how good the router's index is.
    pub cache_prediction: Option<BTreeMap<&'static str, f64>>,
    pub passed: bool,
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// One row.
#[derive(Clone, Debug, Serialize)]
pub(super) struct CapacityResult {
    /// Requests per second at the SLO; null when the lowest rate fails.
    pub capacity: Option<f64>,
    /// The lowest rate swept, when it failed (the capacity is below it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lowest_rate_tried: Option<f64>,
    /// Whether even the highest swept rate passed (the capacity is at least this).
    pub saturated: bool,
    /// This row's capacity over the oracle's.
    pub vs_oracle: Option<f64>,
    /// The full summary at the last passing rate (the lowest when none passed), with the
    /// policy's name.
    #[serde(flatten)]
    pub at_capacity: PolicyResult,
    pub points: Vec<Point>,
}

fn passes(r: &PolicyResult, failed: u64, slo: Slo) -> (bool, f64) {
    let error_rate = failed as f64 / r.requests.max(1) as f64;
    (
        r.ttft_p95 <= slo.ttft && error_rate < MAX_ERROR_RATE,
        error_rate,
    )
}

/// Runs every (row, rate) and assembles the report. `rows`: each row's name and policy; `None`
/// is the oracle, whose capacity the others are compared with.
pub(super) fn sweep(
    exp: &Experiment<'_>,
    rows: &[(String, Option<PolicyConfig>)],
    seed: u64,
    params: BTreeMap<String, Value>,
) -> Report {
    let jobs: Vec<(usize, f64)> = (0..rows.len())
        .flat_map(|r| exp.rates.iter().map(move |&rate| (r, rate)))
        .collect();
    let runs = par_map(&jobs, |&(r, rate)| {
        let (name, config) = &rows[r];
        run_point(exp, name, config.as_ref(), rate, seed)
    });
    let mut results: Vec<CapacityResult> = Vec::new();
    let mut runs = runs.into_iter();
    for _ in rows {
        let (points, summaries): (Vec<Point>, Vec<PolicyResult>) = exp
            .rates
            .iter()
            .map(|_| runs.next().expect("one run per job"))
            .unzip();
        results.push(capacity_result(exp, points, &summaries));
    }
    let oracle = rows
        .iter()
        .zip(&results)
        .find(|((_, config), _)| config.is_none())
        .and_then(|(_, r)| r.capacity);
    for r in &mut results {
        r.vs_oracle = match (r.capacity, oracle) {
            (Some(c), Some(o)) if o > 0.0 => Some(round(c / o, 3)),
            _ => None,
        };
    }
    Report {
        scenario: exp.name.to_string(),
        seed,
        table: render(exp, &results),
        params,
        results: results
            .iter()
            .map(|r| {
                let mut v = serde_json::to_value(r).expect("serialises");
                if exp.warmup_secs > 0.0 {
                    for key in WARM_UP_INCLUDED {
                        v[key] = Value::Null;
                    }
                }
                v
            })
            .collect(),
        notes: notes(exp),
    }
}

/// Runs one row (`config`, or the oracle when `None`) at one rate on a fresh fleet.
fn run_point(
    exp: &Experiment<'_>,
    name: &str,
    config: Option<&PolicyConfig>,
    rate: f64,
    seed: u64,
) -> (Point, PolicyResult) {
    let mut fleet = exp.fleet.clone();
    match config {
        Some(c) => fleet.policy = c.clone(),
        None => fleet.oracle = true,
    }
    // Long enough for every arrival at this rate, twice over, plus ten minutes to drain;
    // what is still queued after that is a failure (the SLO is long lost).
    let arrivals_s = exp.requests as f64 / (rate * exp.per_unit).max(1e-9);
    fleet.horizon = Some(Nanos::from_secs_f64(
        2.0 * (exp.warmup_secs + arrivals_s) + 600.0,
    ));
    let mut workload = (exp.workload)(rate);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut outcome = fleet::run(&fleet, workload.as_mut(), &mut rng, seed);
    // A warm-up's requests are not measured; the rate counts from the last of them.
    let warm_end = outcome
        .records
        .iter()
        .filter(|r| r.tag >= WARM_TAG)
        .map(|r| r.arrival)
        .max();
    let all_output = outcome.output_tokens;
    outcome.records.retain(|r| r.tag < WARM_TAG);
    let mut summary = summarise(name, None, &outcome, exp.slo, Window::WholeRun);
    if let Some(from) = warm_end {
        measured_only(&mut summary, &outcome, from, all_output);
    }
    let warm_end = warm_end.unwrap_or(Nanos(0));
    let failed = outcome
        .records
        .iter()
        .filter(|r| r.failed || r.finished.is_none())
        .count() as u64;
    let span = outcome
        .last_arrival
        .saturating_since(warm_end)
        .as_secs_f64()
        .max(1e-9);
    let (passed, error_rate) = passes(&summary, failed, exp.slo);
    let point = Point {
        rate,
        request_rate: round(outcome.records.len() as f64 / span, 3),
        ttft_p95: summary.ttft_p95,
        error_rate: round(error_rate, 4),
        cache_hit_ratio: summary.cache_hit_ratio,
        slo_attainment: summary.slo_attainment,
        assigned: summary.assigned.clone(),
        predicted_within_20pct: prediction_accuracy(&outcome, 0.0),
        predicted_within_20pct_over_500ms: prediction_accuracy(&outcome, 500.0),
        prediction_error_ms: prediction_error(&outcome),
        cache_prediction: cache_prediction(&outcome),
        passed,
        extra: (exp.extra)(&outcome),
    };
    (point, summary)
}

/// One row's capacity from its points at ascending rates: interpolated on TTFT between the
/// last passing rate and the first failing one (when TTFT, not errors, failed it).
fn capacity_result(
    exp: &Experiment<'_>,
    points: Vec<Point>,
    summaries: &[PolicyResult],
) -> CapacityResult {
    let first_fail = points.iter().position(|p| !p.passed);
    let capacity = match first_fail {
        None => points.last().map(|p| p.request_rate),
        Some(0) => None,
        Some(f) => Some({
            let (ok, bad) = (&points[f - 1], &points[f]);
            let by_ttft = bad.error_rate < MAX_ERROR_RATE && bad.ttft_p95 > ok.ttft_p95;
            if by_ttft {
                let t = (exp.slo.ttft - ok.ttft_p95) / (bad.ttft_p95 - ok.ttft_p95);
                ok.request_rate + t.clamp(0.0, 1.0) * (bad.request_rate - ok.request_rate)
            } else {
                ok.request_rate
            }
        }),
    };
    let at = first_fail.map_or(points.len() - 1, |f| f.saturating_sub(1));
    CapacityResult {
        capacity: capacity.map(|c| round(c, 3)),
        lowest_rate_tried: capacity
            .is_none()
            .then(|| exp.rates.first().copied())
            .flatten(),
        saturated: first_fail.is_none(),
        vs_oracle: None,
        at_capacity: summaries[at].clone(),
        points,
    }
}

/// The report's notes: what capacity means and what the oracle is.
fn notes(exp: &Experiment<'_>) -> Vec<String> {
    vec![
        format!(
            "capacity: requests/s at which TTFT P95 meets {} ms with under {:.0}% failed \
             (interpolated between the last passing and first failing {}); '>=' when the \
             highest rate passed. Cells: TTFT P95 ms at each rate, * past the SLO.",
            exp.slo.ttft,
            MAX_ERROR_RATE * 100.0,
            exp.rate_unit
        ),
        "oracle: routes each request where the true queue, the true cache contents and the \
         true replica speed put its first token earliest (greedy, with perfect information)."
            .into(),
    ]
}

fn render(exp: &Experiment<'_>, results: &[CapacityResult]) -> String {
    let mut header = vec![
        "policy".to_string(),
        "capacity req/s".into(),
        "vs oracle".into(),
        "hit @cap".into(),
    ];
    header.extend(exp.rates.iter().map(|r| format!("@{r}")));
    let refs: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut table = Table::new(&refs);
    for r in results {
        let mut row = vec![
            r.at_capacity.policy.clone(),
            format!(
                "{}{}",
                if r.saturated { ">=" } else { "" },
                r.capacity.map_or("-".into(), |c| num(c, 2))
            ),
            r.vs_oracle.map_or("-".into(), |v| format!("{v:.2}")),
            pct(r.at_capacity.cache_hit_ratio),
        ];
        row.extend(
            r.points
                .iter()
                .map(|p| format!("{}{}", num(p.ttft_p95, 0), if p.passed { "" } else { "*" })),
        );
        table.row(row);
    }
    table.render()
}

/// Share of predicted requests (after the first tenth, the warm-up) whose measured TTFT was
/// within 20% of the prediction.
/// (measured, predicted) TTFT in milliseconds of the predicted requests after the first 10%
/// (the calibration's warm-up).
fn predictions(outcome: &Outcome) -> impl Iterator<Item = (f64, f64)> + '_ {
    let skip = outcome.records.len() / 10;
    outcome.records.iter().skip(skip).filter_map(|r| {
        let (p, first) = (r.predicted_ttft_ms?, r.first_token?);
        Some(((first - r.arrival).as_millis_f64(), f64::from(p)))
    })
}

/// The share of predicted requests measured at `min_ms` or more whose TTFT was within 20% of
/// the prediction.
pub(super) fn prediction_accuracy(outcome: &Outcome, min_ms: f64) -> Option<f64> {
    let (mut n, mut ok) = (0u64, 0u64);
    for (measured, predicted) in predictions(outcome).filter(|&(m, _)| m >= min_ms) {
        n += 1;
        ok += u64::from((measured - predicted).abs() <= 0.2 * measured);
    }
    (n > 0).then(|| round(ok as f64 / n as f64, 4))
}

/// Median and 90th percentile of the absolute prediction error, milliseconds.
fn prediction_error(outcome: &Outcome) -> Option<[f64; 2]> {
    let mut errors: Vec<f64> = predictions(outcome).map(|(m, p)| (m - p).abs()).collect();
    errors.sort_by(f64::total_cmp);
    let at = |q| kvgate_core::stats::percentile(&errors, q).map(|e| round(e, 1));
    Some([at(0.5)?, at(0.9)?])
}

/// Exact (within 16 tokens), over and under shares of the predicted cached tokens.
pub(super) fn cache_prediction(outcome: &Outcome) -> Option<BTreeMap<&'static str, f64>> {
    let mut counts = [0u64; 3];
    for r in &outcome.records {
        if let (Some(p), Some(_)) = (r.predicted_cached, r.first_token) {
            let k = if p.abs_diff(r.cached_tokens) <= 16 {
                0
            } else if p > r.cached_tokens {
                1
            } else {
                2
            };
            counts[k] += 1;
        }
    }
    let n: u64 = counts.iter().sum();
    (n > 0).then(|| {
        ["exact", "over", "under"]
            .into_iter()
            .zip(counts)
            .map(|(k, c)| (k, round(c as f64 / n as f64, 4)))
            .collect()
    })
}

/// Figures of a run's summary read from the replicas' counters, which a warm-up's requests
/// add to as well as the measured ones', and no record can split: null after a warm-up.
const WARM_UP_INCLUDED: [&str; 7] = [
    "prefill_tokens",
    "utilisation",
    "mean_load_skew",
    "max_load_skew",
    "load_skew_over_time",
    "preemptions",
    "reasons",
];

/// Restricts to the measured requests (the records left after the warm-up's, which arrived up
/// to `from`) what the replicas' counters gave `summary` for the whole run and the records
/// can give for them: the cache hit ratio (their cached share of prompt tokens), the requests
/// per replica, and the goodput and output rate over the time from `from` to the run's end;
/// `all_output` is the whole run's output tokens.
fn measured_only(summary: &mut PolicyResult, outcome: &Outcome, from: Nanos, all_output: u64) {
    let records = &outcome.records;
    let prompt: u64 = records.iter().map(|r| u64::from(r.prompt_tokens)).sum();
    let cached: u64 = records.iter().map(|r| u64::from(r.cached_tokens)).sum();
    summary.cache_hit_ratio = round(cached as f64 / prompt.max(1) as f64, 4);
    let mut assigned = vec![0u64; outcome.replicas.len()];
    for r in records {
        if let Some(n) = assigned.get_mut(r.replica as usize) {
            *n += 1;
        }
    }
    summary.assignment_gap =
        assigned.iter().max().unwrap_or(&0) - assigned.iter().min().unwrap_or(&0);
    summary.assigned = assigned;
    let end = outcome.end.as_secs_f64();
    let measured = outcome.end.saturating_since(from).as_secs_f64();
    if measured > 0.0 {
        let stretch = end / measured;
        let output: u64 = records.iter().map(|r| u64::from(r.output_tokens)).sum();
        let share = output as f64 / all_output.max(1) as f64;
        summary.goodput = round(summary.goodput * stretch, 4);
        summary.output_tokens_per_tick = round(summary.output_tokens_per_tick * stretch * share, 3);
    }
}

fn round(x: f64, d: i32) -> f64 {
    let f = 10f64.powi(d);
    (x * f).round() / f
}
