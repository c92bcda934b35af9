//! From a run's records to the numbers a report shows (docs/background.md#latency-metrics): TTFT,
//! TPOT and E2E percentiles, SLO attainment and goodput (kvgate's one definition of each,
//! [`kvgate_core::stats`]; `null` when nothing was measured), prompt cache hit ratio, assignment
//! gap, per-replica utilisation, output throughput and sampled load skew. Times are in ticks (1 tick =
//! [`crate::model::TICK_NANOS`] ns = 1 ms).

use crate::fleet::Outcome;
use crate::model::TICK_NANOS;
use kvgate_core::stats::{self, percentile, Attainment};
use kvgate_core::Nanos;
use serde::Serialize;
use std::collections::BTreeMap;

/// The service-level objective a request must meet to count towards goodput.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Slo {
    /// Largest acceptable TTFT, ticks.
    pub ttft: f64,
    /// Largest acceptable TPOT, ticks; infinite when only TTFT matters.
    pub tpot: f64,
}

impl Slo {
    /// The same bounds in kvgate's one SLO definition (an infinite bound is none).
    pub fn bounds(&self) -> stats::Slo {
        let bound = |x: f64| x.is_finite().then_some(x);
        stats::Slo {
            ttft: bound(self.ttft),
            tpot: bound(self.tpot),
        }
    }
}

/// One policy's (or variant's) results.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PolicyResult {
    /// The policy name.
    pub policy: String,
    /// The variant, when a scenario compares configurations of one policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    /// Requests dispatched.
    pub requests: u64,
    /// Requests finished.
    pub completed: u64,
    /// TTFT median, ticks.
    pub ttft_p50: f64,
    /// TTFT 95th percentile, ticks.
    pub ttft_p95: f64,
    /// TTFT 99th percentile, ticks.
    pub ttft_p99: f64,
    /// Largest TTFT, ticks.
    pub ttft_max: f64,
    /// Mean TPOT over requests with two or more output tokens, ticks.
    pub tpot_mean: f64,
    /// TPOT 95th percentile, ticks.
    pub tpot_p95: f64,
    /// E2E median, ticks.
    pub e2e_p50: f64,
    /// E2E 95th percentile, ticks.
    pub e2e_p95: f64,
    /// Share of requests meeting the SLO (null when none was dispatched).
    pub slo_attainment: f64,
    /// Requests meeting the SLO per tick of the arrival window.
    pub goodput: f64,
    /// Prompt tokens served from prefix caches over prompt tokens looked up.
    pub cache_hit_ratio: f64,
    /// Prompt tokens computed (including recomputation after preemption).
    pub prefill_tokens: u64,
    /// Largest minus smallest number of requests assigned to a replica.
    pub assignment_gap: u64,
    /// Requests assigned per replica.
    pub assigned: Vec<u64>,
    /// Busy share of each replica over the run.
    pub utilisation: Vec<f64>,
    /// Output tokens per tick over the arrival window (all output over the run when the
    /// workload is closed-loop).
    pub output_tokens_per_tick: f64,
    /// Mean sampled skew of outstanding requests (max minus min across replicas).
    pub mean_load_skew: f64,
    /// Largest sampled skew.
    pub max_load_skew: f64,
    /// Mean sampled skew in each twentieth of the run: load skew over time.
    pub load_skew_over_time: Vec<f64>,
    /// Preemptions across the fleet.
    pub preemptions: u64,
    /// Decisions by reason label.
    pub reasons: BTreeMap<String, u64>,
}

/// The `q`-quantile of sorted `xs` by kvgate's one definition ([`percentile`], NumPy's linear
/// interpolation as vLLM's benchmark reports it); NaN (JSON `null`) when nothing was measured.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    percentile(sorted, q).unwrap_or(f64::NAN)
}

fn ticks(n: Nanos) -> f64 {
    n.0 as f64 / TICK_NANOS as f64
}

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

/// Over which time throughput and goodput are measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Window {
    /// From zero to the last open-loop arrival (output after it is not counted): an open
    /// loop's steady state, where a policy that falls behind delivers less.
    Arrivals,
    /// From zero to the last token (closed loops).
    WholeRun,
}

/// Summarises `outcome` for `policy`.
pub fn summarise(
    policy: &str,
    variant: Option<&str>,
    outcome: &Outcome,
    slo: Slo,
    window: Window,
) -> PolicyResult {
    let mut ttft = Vec::with_capacity(outcome.records.len());
    let mut tpot = Vec::new();
    let mut e2e = Vec::with_capacity(outcome.records.len());
    let bounds = slo.bounds();
    let mut met = 0u64;
    let mut completed = 0u64;
    for r in &outcome.records {
        let (Some(first), Some(done)) = (r.first_token, r.finished) else {
            continue;
        };
        completed += 1;
        let t = ticks(first - r.arrival);
        ttft.push(t);
        e2e.push(ticks(done - r.arrival));
        let per_token =
            (r.output_tokens > 1).then(|| ticks(done - first) / f64::from(r.output_tokens - 1));
        tpot.extend(per_token);
        met += u64::from(bounds.met(Some(t), per_token));
    }
    for v in [&mut ttft, &mut tpot, &mut e2e] {
        v.sort_by(f64::total_cmp);
    }
    let requests = outcome.records.len() as u64 + outcome.rejected;
    let attainment = Attainment {
        met,
        issued: requests,
    };
    let (queries, hits) = outcome.replicas.iter().fold((0u64, 0u64), |(q, h), r| {
        (q + r.prefix_queries_tokens, h + r.prefix_hits_tokens)
    });
    let assigned: Vec<u64> = outcome.replicas.iter().map(|r| r.assigned).collect();
    let gap = assigned.iter().max().unwrap_or(&0) - assigned.iter().min().unwrap_or(&0);
    let end = ticks(outcome.end).max(1e-9);
    let arrivals = ticks(outcome.last_arrival);
    let (out_tokens, out_window) = if window == Window::Arrivals && arrivals > 0.0 {
        (outcome.output_before_last_arrival, arrivals)
    } else {
        (outcome.output_tokens, end)
    };
    PolicyResult {
        policy: policy.to_string(),
        variant: variant.map(str::to_string),
        requests,
        completed,
        ttft_p50: round(quantile(&ttft, 0.50), 2),
        ttft_p95: round(quantile(&ttft, 0.95), 2),
        ttft_p99: round(quantile(&ttft, 0.99), 2),
        ttft_max: round(ttft.last().copied().unwrap_or(f64::NAN), 2),
        tpot_mean: round(tpot.iter().sum::<f64>() / tpot.len() as f64, 3),
        tpot_p95: round(quantile(&tpot, 0.95), 3),
        e2e_p50: round(quantile(&e2e, 0.50), 2),
        e2e_p95: round(quantile(&e2e, 0.95), 2),
        slo_attainment: round(attainment.share().unwrap_or(f64::NAN), 4),
        goodput: round(
            attainment.goodput(out_window.max(1e-9)).unwrap_or(f64::NAN),
            4,
        ),
        cache_hit_ratio: round(hits as f64 / queries.max(1) as f64, 4),
        prefill_tokens: outcome.replicas.iter().map(|r| r.prefill_tokens).sum(),
        assignment_gap: gap,
        assigned,
        utilisation: outcome
            .replicas
            .iter()
            .map(|r| round(ticks(r.busy) / end, 4))
            .collect(),
        output_tokens_per_tick: round(out_tokens as f64 / out_window.max(1e-9), 3),
        mean_load_skew: round(outcome.skew.mean(), 3),
        max_load_skew: outcome.skew.max,
        load_skew_over_time: outcome.skew.over_time(20),
        preemptions: outcome.replicas.iter().map(|r| r.preemptions).sum(),
        reasons: outcome
            .reasons
            .0
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_and_nothing_measured_is_null() {
        let xs: Vec<f64> = (1..=100).map(f64::from).collect();
        assert!((quantile(&xs, 0.95) - 95.05).abs() < 1e-9);
        assert_eq!(quantile(&xs, 0.5), 50.5);
        assert!(quantile(&[], 0.5).is_nan());
        assert_eq!(serde_json::to_string(&quantile(&[], 0.5)).unwrap(), "null");
    }
}
