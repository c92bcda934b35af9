//! Per-target reports: latency summaries, SLO attainment, goodput, cache hit ratio, errors; the
//! readable table and the JSON document.
//!
//! Definitions (docs/background.md#latency-metrics and #open-loop-evaluation-and-capacity):
//! - a request is *good* when it succeeded, its TTFT is within `--slo-ttft-ms` and its TPOT is
//!   within `--slo-tpot-ms` (an unset SLO always holds; TPOT is undefined, hence met, for a
//!   single output token);
//! - `slo_attainment` = good / issued requests (failures count against it);
//! - `duration_s` runs from the start of the schedule to the last response's end;
//!   `achieved_rate` = successful requests / `duration_s`, `goodput` = good requests /
//!   `duration_s` (vLLM's definitions);
//! - `send_rate` = (issued - 1) / (last send - first send): what actually left the client;
//! - `send_gap_cv` = standard deviation / mean of the gaps between consecutive actual sends:
//!   1 for Poisson arrivals, 1/sqrt(B) for gamma arrivals with `--burstiness B`, so it shows
//!   whether the client kept the arrival process's shape, not only its mean rate;
//! - `cache_hit_ratio` = cached prompt tokens / prompt tokens over successful requests, from
//!   `usage.prompt_tokens_details.cached_tokens` (null when the server reports no usage);
//! - `send_lag_ms` = actual minus scheduled send time. A large lag means the client, not the
//!   server, limited the rate, and the run is not a valid open-loop measurement.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

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
    /// Whether `r` met the objective.
    pub fn met(&self, r: &Record) -> bool {
        if r.error.is_some() {
            return false;
        }
        let ttft_ok = match (self.ttft_ms, r.ttft_ms) {
            (None, _) => true,
            (Some(limit), Some(t)) => t <= limit,
            (Some(_), None) => false,
        };
        let tpot_ok = match (self.tpot_ms, r.tpot_ms()) {
            (Some(limit), Some(t)) => t <= limit,
            _ => true,
        };
        ttft_ok && tpot_ok
    }
}

/// Results of one target at one offered rate.
#[derive(Debug, Clone, Serialize)]
pub struct TargetReport {
    /// The target URL as given.
    pub target: String,
    /// Offered rate per target (requests or sessions per second; `null` for a ramp).
    pub offered_rate: Option<f64>,
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
    /// SLO-meeting requests per second.
    pub goodput: f64,
    /// Share of issued requests that met the SLO.
    pub slo_attainment: f64,
    /// Cached prompt tokens / prompt tokens.
    pub cache_hit_ratio: Option<f64>,
    /// Prompt tokens (usage) over successful requests.
    pub prompt_tokens: u64,
    /// Cached prompt tokens (usage) over successful requests.
    pub cached_tokens: u64,
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
        let mut errors: BTreeMap<&'static str, u64> =
            ErrorKind::ALL.iter().map(|k| (k.name(), 0)).collect();
        for r in records {
            if let Some(e) = r.error {
                *errors.entry(e.name()).or_default() += 1;
            }
        }
        let good = records.iter().filter(|r| slo.met(r)).count() as f64;
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
        let (first, last) = records
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), r| {
                (a.min(r.sent_s), b.max(r.sent_s))
            });
        let send_rate = if records.len() > 1 && last > first {
            (records.len() - 1) as f64 / (last - first)
        } else {
            0.0
        };
        let send_gap_cv = gap_cv(records.iter().map(|r| r.sent_s).collect());
        let prompt_tokens: u64 = ok.iter().map(|r| r.prompt_tokens).sum();
        let cached_tokens: u64 = ok.iter().map(|r| r.cached_tokens).sum();
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
            requests: records.len() as u64,
            completed: ok.len() as u64,
            failed: (records.len() - ok.len()) as u64,
            duration_s,
            send_rate,
            send_gap_cv,
            achieved_rate: per_s(ok.len() as f64),
            goodput: per_s(good),
            slo_attainment: if records.is_empty() {
                0.0
            } else {
                good / records.len() as f64
            },
            cache_hit_ratio: (prompt_tokens > 0)
                .then(|| cached_tokens as f64 / prompt_tokens as f64),
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
            ttft_samples: ttft,
            e2e_samples: e2e,
        }
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

/// Capacity of one target in a sweep.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Capacity {
    /// The target URL as given.
    pub target: String,
    /// Largest swept rate whose SLO attainment reached the threshold; `null` if none did.
    pub rate: Option<f64>,
    /// The attainment threshold used.
    pub min_attainment: f64,
    /// Swept rates below `rate` whose attainment fell short, ascending: a cold start on the
    /// sweep's first rate, or a noisy step, that the largest passing rate steps over. Ranking
    /// by the last rate before the first miss instead (as `kvgate sim` does) can reorder
    /// targets that have any (docs/routing.md, "On the classic benchmarks").
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
    let name_w = results
        .iter()
        .map(|r| r.target.len())
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
            "{:<name_w$} {:>7} {:>7} {:>5} {:>8.1} {:>8.1} {:>5.1}% | {:>7} {:>7} {:>7} | {:>7} {:>7} | {:>7} {:>7} | {:>5} {:>6}",
            r.target,
            rate,
            r.completed,
            r.failed,
            r.achieved_rate,
            r.goodput,
            r.slo_attainment * 100.0,
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
    for c in capacity {
        let rate = c.rate.map_or("below the lowest swept rate".into(), |x| {
            format!("{x} {rate_unit}")
        });
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
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(ttft: f64, e2e: f64, out: u64, sent: f64) -> Record {
        Record {
            ttft_ms: Some(ttft),
            e2e_ms: e2e,
            output_tokens: out,
            sent_s: sent,
            prompt_tokens: 100,
            cached_tokens: 25,
            ..Record::default()
        }
    }

    #[test]
    fn slo_goodput_and_cache_ratio() {
        let slo = Slo {
            ttft_ms: Some(50.0),
            tpot_ms: Some(10.0),
        };
        let records = vec![
            rec(10.0, 100.0, 10, 0.0), // tpot 10: good
            rec(60.0, 100.0, 10, 1.0), // ttft too slow
            rec(10.0, 200.0, 10, 2.0), // tpot 21
            rec(10.0, 10.0, 1, 3.0),   // single token: tpot undefined, good
            Record {
                error: Some(ErrorKind::Http5xx),
                sent_s: 3.9,
                ..Record::default()
            },
        ];
        let r = TargetReport::new("a", Some(1.0), &records, &slo);
        assert_eq!((r.requests, r.completed, r.failed), (5, 4, 1));
        assert_eq!(r.slo_attainment, 2.0 / 5.0);
        assert!((r.duration_s - 3.9).abs() < 1e-9);
        assert!((r.goodput - 2.0 / 3.9).abs() < 1e-9);
        assert!((r.send_rate - 4.0 / 3.9).abs() < 1e-9);
        assert_eq!(r.cache_hit_ratio, Some(0.25));
        assert_eq!(r.errors["http_5xx"], 1);
        assert_eq!(r.errors["connect"], 0);
        assert_eq!(r.tpot_ms.count, 3);
        let json = serde_json::to_value(&r).unwrap();
        for key in ["ttft_ms", "tpot_ms", "e2e_ms", "send_lag_ms"] {
            for p in ["p50", "p90", "p95", "p99", "max"] {
                assert!(json[key][p].is_number(), "{key}.{p}");
            }
        }
        let capacity = Capacity {
            target: "http://a".into(),
            rate: Some(1.5),
            min_attainment: 0.95,
            missed_below: Vec::new(),
        };
        let text = table(
            std::slice::from_ref(&r),
            std::slice::from_ref(&capacity),
            &slo,
            "bursts/s",
        );
        assert!(text.contains("http_5xx=1"), "{text}");
        assert!(
            text.contains("capacity of http://a: 1.5 bursts/s (SLO attainment >= 95%)"),
            "{text}"
        );
        let cold = Capacity {
            missed_below: vec![0.5, 1.0],
            ..capacity
        };
        let text = table(&[r], &[cold], &slo, "bursts/s");
        assert!(
            text.contains(
                "capacity of http://a: 1.5 bursts/s (SLO attainment >= 95%; missed at 0.5, 1 bursts/s below it)"
            ),
            "{text}"
        );
    }

    #[test]
    fn send_gap_cv_measures_the_shape_of_the_sends() {
        // Evenly spaced sends (in any order): no variation.
        assert!(gap_cv(vec![0.3, 0.0, 0.2, 0.1]).unwrap() < 1e-12);
        // Gaps 1 and 3: mean 2, population sd 1.
        assert!((gap_cv(vec![0.0, 1.0, 4.0]).unwrap() - 0.5).abs() < 1e-12);
        assert_eq!(gap_cv(vec![0.0, 1.0]), None);
        assert_eq!(gap_cv(vec![1.0, 1.0, 1.0]), None);
        // Exponential gaps (Poisson sends) have CV 1, gamma(B) gaps 1/sqrt(B).
        use crate::arrivals::{Arrivals, Config, Ramp};
        for (burstiness, want) in [(1.0, 1.0), (4.0, 0.5), (0.25, 2.0)] {
            let cfg = Config {
                rate: 100.0,
                burstiness,
                ramp: Ramp::Constant,
            };
            let times: Vec<f64> = Arrivals::new(cfg, 11).take(20_000).collect();
            let records: Vec<Record> = times
                .iter()
                .map(|&t| Record {
                    sent_s: t,
                    ..Record::default()
                })
                .collect();
            let cv = TargetReport::new("a", Some(100.0), &records, &Slo::default())
                .send_gap_cv
                .unwrap();
            assert!((cv - want).abs() < 0.06 * want, "B={burstiness}: cv {cv}");
        }
    }
}
