//! `replica-loss`'s extra report keys: TTFT around the moment a replica dies, and what became
//! of the requests it held.

use crate::fleet::{Outcome, RequestRecord};
use kvgate_core::Nanos;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};

/// The request's TTFT in milliseconds, if it got a first token.
fn ttft(r: &RequestRecord) -> Option<f64> {
    r.first_token.map(|f| (f - r.arrival).as_millis_f64())
}

/// The `q` quantile of `v`, rounded to 0.1.
fn percentile(mut v: Vec<f64>, q: f64) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    kvgate_core::stats::percentile(&v, q).map(|x| (x * 10.0).round() / 10.0)
}

fn p95(v: Vec<f64>) -> Option<f64> {
    percentile(v, 0.95)
}

fn in_window(r: &&RequestRecord, lo: Nanos, hi: Nanos) -> bool {
    r.arrival >= lo && r.arrival < hi
}

/// TTFT P95 (ms) of the requests that arrived in the 30 s before `at` and in the 30 s after.
/// When `lost` died at `at`, also the same after the loss without the first request of each
/// displaced session (one whose last request before the loss went to `lost`). That request
/// must recompute the session's context wherever it goes, so its TTFT is set by the context's
/// length, not by the routing; the split shows how much of the rise is that floor. With no
/// replica lost (`lose_replica=false`) only the windows are reported: the same windows of a
/// fleet that lost nothing show how much of the rise the workload itself brings, and of a fleet
/// of the survivors alone, how much their load does.
pub(super) fn before_and_after(
    outcome: &Outcome,
    at: Nanos,
    lost: Option<u32>,
) -> BTreeMap<String, Value> {
    let window = Nanos::from_secs(30);
    let after: Vec<&RequestRecord> = outcome
        .records
        .iter()
        .filter(|r| in_window(r, at, at + window))
        .collect();
    let mut keys = BTreeMap::from([
        (
            "ttft_p95_30s_before".into(),
            json!(p95(outcome
                .records
                .iter()
                .filter(|r| in_window(r, at - window, at))
                .filter_map(ttft)
                .collect())),
        ),
        (
            "ttft_p95_30s_after".into(),
            json!(p95(after.iter().filter_map(|r| ttft(r)).collect())),
        ),
        ("requests_30s_after".into(), json!(after.len())),
    ]);
    let Some(lost) = lost else {
        return keys;
    };
    let first_after = displaced_sessions(outcome, at, lost);
    keys.extend(recompute_keys(&after, &first_after));
    keys.extend(continuation_keys(outcome));
    keys
}

/// When the first request (and siblings sent with it) of each session whose last request
/// before `at` went to `lost` arrived after the loss.
fn displaced_sessions(outcome: &Outcome, at: Nanos, lost: u32) -> HashMap<u64, Nanos> {
    let mut home: HashMap<u64, u32> = HashMap::new();
    for r in outcome.records.iter().filter(|r| r.arrival < at) {
        if let Some(s) = r.session {
            home.insert(s, r.replica);
        }
    }
    let mut first_after: HashMap<u64, Nanos> = HashMap::new();
    for r in outcome.records.iter().filter(|r| r.arrival >= at) {
        if let Some(s) = r.session.filter(|s| home.get(s) == Some(&lost)) {
            let t = first_after.entry(s).or_insert(r.arrival);
            *t = (*t).min(r.arrival);
        }
    }
    first_after
}

/// TTFT after the loss with and without the displaced sessions' first requests, which must
/// recompute their context.
fn recompute_keys(
    after: &[&RequestRecord],
    first_after: &HashMap<u64, Nanos>,
) -> [(String, Value); 3] {
    let recomputes = |r: &RequestRecord| {
        r.session
            .and_then(|s| first_after.get(&s))
            .is_some_and(|&t| r.arrival == t)
    };
    let recompute_ttfts: Vec<f64> = after
        .iter()
        .filter(|r| recomputes(r))
        .filter_map(|r| ttft(r))
        .collect();
    [
        (
            "ttft_p95_30s_after_without_recomputes".into(),
            json!(p95(after
                .iter()
                .filter(|r| !recomputes(r))
                .filter_map(|r| ttft(r))
                .collect())),
        ),
        ("recomputes_30s_after".into(), json!(recompute_ttfts.len())),
        (
            "recompute_ttft_p50".into(),
            json!(percentile(recompute_ttfts, 0.5)),
        ),
    ]
}

/// What became of the streams in flight: failed before or after their first token, continued
/// elsewhere (and how long their clients waited), retried, and the resume machinery's counts.
fn continuation_keys(outcome: &Outcome) -> [(String, Value); 10] {
    let failed_before_first_token = outcome
        .records
        .iter()
        .filter(|r| r.failed && r.output_tokens == 0)
        .count();
    // Streams the loss broke mid-answer and continued elsewhere: how long each client waited
    // between two tokens (from the loss to the continuation's first token).
    let waits: Vec<f64> = outcome
        .records
        .iter()
        .filter_map(|r| r.resumed)
        .filter_map(|c| c.first_token.map(|t| (t - c.broken).as_millis_f64()))
        .collect();
    let failed_after_first_token = outcome
        .records
        .iter()
        .filter(|r| r.failed && r.output_tokens > 0)
        .count();
    [
        (
            "failed_before_first_token".into(),
            json!(failed_before_first_token),
        ),
        (
            "failed_after_first_token".into(),
            json!(failed_after_first_token),
        ),
        ("continued".into(), json!(waits.len())),
        ("warmups_queued".into(), json!(outcome.warmups_queued)),
        ("warmups_sent".into(), json!(outcome.warmups_sent)),
        ("heads_grown".into(), json!(outcome.heads_grown)),
        ("heads_held".into(), json!(outcome.heads_held)),
        (
            "continued_wait_p50_ms".into(),
            json!(percentile(waits.clone(), 0.5)),
        ),
        (
            "continued_wait_max_ms".into(),
            json!(percentile(waits, 1.0)),
        ),
        (
            "retried".into(),
            json!(outcome.records.iter().filter(|r| r.retries > 0).count()),
        ),
    ]
}
