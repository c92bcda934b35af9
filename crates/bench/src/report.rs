//! Per-target reports: latency summaries, SLO attainment, goodput, cache hit ratio, errors; the
//! readable table and the JSON document.
//!
//! Definitions (the SLO, attainment and goodput are kvgate's one definition,
//! [`kvgate_core::stats`], the same the simulator reports; docs/background.md#latency-metrics and
//! #open-loop-evaluation-and-capacity):
//! - a request is *good* when it succeeded, its TTFT is within `--slo-ttft-ms` and its TPOT is
//!   within `--slo-tpot-ms` (an unset SLO always holds; TPOT is undefined, hence met, for a
//!   single output token);
//! - `slo_attainment` = good / issued requests (failures count against it; null with none);
//! - `duration_s` runs from the start of the schedule to the last response's end;
//!   `achieved_rate` = successful requests / `duration_s`, `goodput` = good requests /
//!   `duration_s` (vLLM's definitions; goodput is null over an empty run);
//! - `send_rate` = (issued - 1) / (last send - first send): what actually left the client;
//! - `send_gap_cv` = standard deviation / mean of the gaps between consecutive actual sends:
//!   1 for Poisson arrivals, 1/sqrt(B) for gamma arrivals with `--burstiness B`, so it shows
//!   whether the client kept the arrival process's shape, not only its mean rate;
//! - `cache_hit_ratio` = cached prompt tokens / prompt tokens over the successful requests whose
//!   usage reported `prompt_tokens_details.cached_tokens`; it and `cached_tokens` are null when
//!   none did (an engine without prefix caching omits it: that is unknown, not 0);
//! - `send_lag_ms` = actual minus scheduled send time. A large lag means the client, not the
//!   server, limited the rate, and the run is not a valid open-loop measurement.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use kvgate_core::stats::{self, Attainment};

use crate::client::{ErrorKind, Record};
use crate::stats::Summary;

/// Send lag P99 above which the table warns that the run is invalid.
pub const LAG_WARN_MS: f64 = 10.0;

/// Service-level objective of one request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Slo {
    /// TTFT bound in milliseconds.
    pub ttft_ms: Option<f64>,
    /// TPOT bound in milliseconds.
    pub tpot_ms: Option<f64>,
}

impl Slo {
    /// Whether `r` succeeded and met the objective.
    pub fn met(&self, r: &Record) -> bool {
        let bounds = stats::Slo {
            ttft: self.ttft_ms,
            tpot: self.tpot_ms,
        };
        r.error.is_none() && bounds.met(r.ttft_ms, r.tpot_ms())
    }
}

/// Results of one target at one offered rate.
#[derive(Debug, Clone, Serialize)]
pub struct TargetReport {
    /// The target URL as given.
    pub target: String,
    /// Offered rate per target (requests or sessions per second; `null` for a ramp).
    pub offered_rate: Option<f64>,
    /// The send-time window `[from, to)` in seconds this report is restricted to
    /// (`--from-records` with `--window`); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window_s: Option<[f64; 2]>,
    /// Requests issued.
    pub requests: u64,
    /// Requests that succeeded.
    pub completed: u64,
    /// Requests that failed.
    pub failed: u64,
    /// Start of the schedule to the end of the last response, seconds.
    pub duration_s: f64,
    /// Rate at which requests actually left the client.
    pub send_rate: f64,
    /// Coefficient of variation of the gaps between consecutive sends (`null` below 3 requests).
    pub send_gap_cv: Option<f64>,
    /// Successful requests per second.
    pub achieved_rate: f64,
    /// SLO-meeting requests per second (`null` over an empty run).
    pub goodput: Option<f64>,
    /// Share of issued requests that met the SLO (`null` when none was issued).
    pub slo_attainment: Option<f64>,
    /// Cached prompt tokens / prompt tokens over the requests that reported cached tokens.
    pub cache_hit_ratio: Option<f64>,
    /// Prompt tokens (usage) over successful requests.
    pub prompt_tokens: u64,
    /// Cached prompt tokens (usage) over the successful requests that reported them; `null`
    /// when none did.
    pub cached_tokens: Option<u64>,
    /// Output tokens over successful requests.
    pub output_tokens: u64,
    /// Output tokens per second.
    pub output_throughput: f64,
    /// Time to first token.
    pub ttft_ms: Summary,
    /// Time per output token.
    pub tpot_ms: Summary,
    /// Inter-chunk latency, pooled over requests.
    pub itl_ms: Summary,
    /// End-to-end latency.
    pub e2e_ms: Summary,
    /// Send lag behind the schedule.
    pub send_lag_ms: Summary,
    /// Failures by kind (every kind listed, zeros included).
    pub errors: BTreeMap<&'static str, u64>,
    /// The engines' load while it ran, when `--engines` named them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engines: Option<crate::engines::EngineLoad>,
    /// Good and issued requests (for capacity; not serialised).
    #[serde(skip)]
    pub attainment: Attainment,
    /// Sorted TTFT samples of successful requests (for CDFs; not serialised).
    #[serde(skip)]
    pub ttft_samples: Vec<f64>,
    /// Sorted E2E samples of successful requests (for CDFs; not serialised).
    #[serde(skip)]
    pub e2e_samples: Vec<f64>,
}

impl TargetReport {
    /// Builds the report of `records` (all requests one target received at one rate).
    pub fn new(target: &str, offered_rate: Option<f64>, records: &[Record], slo: &Slo) -> Self {
        let ok: Vec<&Record> = records.iter().filter(|r| r.error.is_none()).collect();
        let errors = error_counts(records);
        let mut attainment = Attainment::default();
        for r in records {
            attainment.add(slo.met(r));
        }
        let duration_s = records
            .iter()
            .map(|r| r.sent_s + r.e2e_ms / 1e3)
            .fold(0.0, f64::max);
        let per_s = |n: f64| {
            if duration_s > 0.0 {
                n / duration_s
            } else {
                0.0
            }
        };
        let send_rate = send_rate(records);
        let send_gap_cv = gap_cv(records.iter().map(|r| r.sent_s).collect());
        let prompt_tokens: u64 = ok.iter().map(|r| r.prompt_tokens).sum();
        let reported: Vec<&&Record> = ok.iter().filter(|r| r.cached_tokens.is_some()).collect();
        let cached_tokens = (!reported.is_empty())
            .then(|| reported.iter().filter_map(|r| r.cached_tokens).sum::<u64>());
        let reported_prompt: u64 = reported.iter().map(|r| r.prompt_tokens).sum();
        let output_tokens: u64 = ok.iter().map(|r| r.output_tokens).sum();
        let mut ttft: Vec<f64> = ok.iter().filter_map(|r| r.ttft_ms).collect();
        let mut tpot: Vec<f64> = ok.iter().filter_map(|r| r.tpot_ms()).collect();
        let mut itl: Vec<f64> = ok
            .iter()
            .flat_map(|r| r.itl_ms.iter().map(|&x| f64::from(x)))
            .collect();
        let mut e2e: Vec<f64> = ok.iter().map(|r| r.e2e_ms).collect();
        let mut lag: Vec<f64> = records.iter().map(|r| r.lag_ms).collect();
        let ttft_ms = Summary::of(&mut ttft);
        let e2e_ms = Summary::of(&mut e2e);
        Self {
            target: target.to_owned(),
            offered_rate,
            window_s: None,
            requests: records.len() as u64,
            completed: ok.len() as u64,
            failed: (records.len() - ok.len()) as u64,
            duration_s,
            send_rate,
            send_gap_cv,
            achieved_rate: per_s(ok.len() as f64),
            goodput: attainment.goodput(duration_s),
            slo_attainment: attainment.share(),
            cache_hit_ratio: cached_tokens
                .filter(|_| reported_prompt > 0)
                .map(|c| c as f64 / reported_prompt as f64),
            prompt_tokens,
            cached_tokens,
            output_tokens,
            output_throughput: per_s(output_tokens as f64),
            ttft_ms,
            tpot_ms: Summary::of(&mut tpot),
            itl_ms: Summary::of(&mut itl),
            e2e_ms,
            send_lag_ms: Summary::of(&mut lag),
            errors,
            engines: None,
            attainment,
            ttft_samples: ttft,
            e2e_samples: e2e,
        }
    }
}

/// Requests per error kind, every kind listed (zero when it did not occur).
fn error_counts(records: &[Record]) -> BTreeMap<&'static str, u64> {
    let mut errors: BTreeMap<&'static str, u64> =
        ErrorKind::ALL.iter().map(|k| (k.name(), 0)).collect();
    for r in records {
        if let Some(e) = r.error {
            *errors.entry(e.name()).or_default() += 1;
        }
    }
    errors
}

/// Requests sent per second between the first send and the last (0 with fewer than two).
fn send_rate(records: &[Record]) -> f64 {
    let (first, last) = records
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), r| {
            (a.min(r.sent_s), b.max(r.sent_s))
        });
    if records.len() > 1 && last > first {
        (records.len() - 1) as f64 / (last - first)
    } else {
        0.0
    }
}

/// Coefficient of variation (population standard deviation / mean) of the gaps between the
/// sorted instants `times`; `None` with fewer than two gaps or a zero mean gap.
pub fn gap_cv(mut times: Vec<f64>) -> Option<f64> {
    times.sort_by(f64::total_cmp);
    let gaps: Vec<f64> = times.windows(2).map(|w| w[1] - w[0]).collect();
    if gaps.len() < 2 {
        return None;
    }
    let n = gaps.len() as f64;
    let mean = gaps.iter().sum::<f64>() / n;
    if mean <= 0.0 {
        return None;
    }
    let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / n;
    Some(var.sqrt() / mean)
}

/// Capacity of one target in a sweep: [`kvgate_core::stats::capacity`] over its rates, a rate
/// passing when its SLO attainment reaches `--capacity-attainment`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Capacity {
    /// The target URL as given.
    pub target: String,
    /// Largest swept rate whose SLO attainment reached the threshold; `null` if none did.
    pub rate: Option<f64>,
    /// The attainment threshold used.
    pub min_attainment: f64,
    /// The lowest and highest rates swept (the capacity is below the lowest when `rate` is
    /// null, and at least the highest when `saturated`).
    pub lowest_rate_tried: Option<f64>,
    /// See `lowest_rate_tried`.
    pub highest_rate_tried: Option<f64>,
    /// Whether the highest swept rate passed.
    pub saturated: bool,
    /// Swept rates below `rate` whose attainment fell short, ascending: a cold start on the
    /// sweep's first rate, or a noisy step, that the largest passing rate steps over. Ranking
    /// by the last rate before the first miss instead (as `kvgate sim`'s failure-mode
    /// scenarios do) can reorder targets that have any (docs/routing.md, "On the classic
    /// benchmarks").
    pub missed_below: Vec<f64>,
}

fn fmt_ms(x: f64) -> String {
    if x.is_nan() {
        "-".into()
    } else if x >= 100.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.1}")
    }
}

/// One line per target's capacity.
fn capacity_lines(out: &mut String, capacity: &[Capacity], rate_unit: &str) {
    for c in capacity {
        let rate = match (c.rate, c.lowest_rate_tried) {
            (Some(x), _) => format!("{x} {rate_unit}"),
            (None, Some(low)) => format!("below the lowest swept rate, {low} {rate_unit}"),
            (None, None) => "no rate swept".into(),
        };
        let missed = if c.missed_below.is_empty() {
            String::new()
        } else {
            let rates: Vec<String> = c.missed_below.iter().map(f64::to_string).collect();
            format!("; missed at {} {rate_unit} below it", rates.join(", "))
        };
        let _ = writeln!(
            out,
            "capacity of {}: {rate} (SLO attainment >= {:.0}%{missed})",
            c.target,
            c.min_attainment * 100.0
        );
    }
}

/// Each target's errors, and a warning where the client fell behind its schedule.
fn warnings(out: &mut String, results: &[TargetReport]) {
    for r in results {
        let errs: Vec<String> = r
            .errors
            .iter()
            .filter(|(_, &n)| n > 0)
            .map(|(k, n)| format!("{k}={n}"))
            .collect();
        if !errs.is_empty() {
            let _ = writeln!(out, "errors at {}: {}", r.target, errs.join(" "));
        }
        if r.send_lag_ms.p99 > LAG_WARN_MS {
            let _ = writeln!(
                out,
                "WARNING: send lag P99 {:.1} ms at {} exceeds {LAG_WARN_MS} ms: the client fell \
                 behind its schedule, so this run is not a valid open-loop measurement",
                r.send_lag_ms.p99, r.target
            );
        }
    }
}

/// The readable table: one row per target and rate, then capacities and warnings.
/// `rate_unit` names what `--rate` counts: requests, or the sessions or bursts that open-loop
/// workloads start (`--rate` docs).
pub fn table(
    results: &[TargetReport],
    capacity: &[Capacity],
    slo: &Slo,
    rate_unit: &str,
) -> String {
    let mut out = String::new();
    let label = |r: &TargetReport| match r.window_s {
        Some([a, b]) => format!("{} [{a}, {b}) s", r.target),
        None => r.target.clone(),
    };
    let name_w = results
        .iter()
        .map(|r| label(r).len())
        .max()
        .unwrap_or(6)
        .max(6);
    let _ = writeln!(
        out,
        "{:<name_w$} {:>7} {:>7} {:>5} {:>8} {:>8} {:>6} | {:>7} {:>7} {:>7} | {:>6} {:>6} | {:>7} {:>7} | {:>5} {:>6}",
        "target", "rate", "ok", "err", "achieved", "goodput", "SLO%", "TTFTp50", "TTFTp95",
        "TTFTp99", "TPOTp50", "TPOTp95", "E2Ep50", "E2Ep99", "cache", "lagp99"
    );
    for r in results {
        let rate = r.offered_rate.map_or("ramp".into(), |x| format!("{x:.1}"));
        let cache = r
            .cache_hit_ratio
            .map_or("-".into(), |x| format!("{:.0}%", x * 100.0));
        let _ = writeln!(
            out,
            "{:<name_w$} {:>7} {:>7} {:>5} {:>8.1} {:>8} {:>6} | {:>7} {:>7} {:>7} | {:>7} {:>7} | {:>7} {:>7} | {:>5} {:>6}",
            label(r),
            rate,
            r.completed,
            r.failed,
            r.achieved_rate,
            r.goodput.map_or("-".into(), |g| format!("{g:.1}")),
            r.slo_attainment
                .map_or("-".into(), |a| format!("{:.1}%", a * 100.0)),
            fmt_ms(r.ttft_ms.p50),
            fmt_ms(r.ttft_ms.p95),
            fmt_ms(r.ttft_ms.p99),
            fmt_ms(r.tpot_ms.p50),
            fmt_ms(r.tpot_ms.p95),
            fmt_ms(r.e2e_ms.p50),
            fmt_ms(r.e2e_ms.p99),
            cache,
            fmt_ms(r.send_lag_ms.p99),
        );
    }
    let slo_text = match (slo.ttft_ms, slo.tpot_ms) {
        (None, None) => "none (every success counts)".to_owned(),
        (a, b) => format!(
            "TTFT <= {} ms, TPOT <= {} ms",
            a.map_or("-".into(), |x| x.to_string()),
            b.map_or("-".into(), |x| x.to_string())
        ),
    };
    let _ = writeln!(out, "latencies in ms; SLO: {slo_text}");
    for r in results {
        if let Some(e) = &r.engines {
            let _ = writeln!(
                out,
                "engines of {}: {:.2} requests each on average; busiest minus mean {:.2} (mean), {:.2} (p95) over {} samples",
                r.target, e.mean_inflight, e.herding_mean, e.herding_p95, e.samples
            );
        }
    }
    capacity_lines(&mut out, capacity, rate_unit);
    warnings(&mut out, results);
    out
}

#[cfg(test)]
mod tests;
