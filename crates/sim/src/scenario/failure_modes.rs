//! The failure modes measured against SGLang's router, vllm-router and LiteLLM, each as a capacity
//! sweep ([`super::capacity`]) over the same policies and the oracle:
//!
//! | scenario | what breaks the peers |
//! |---|---|
//! | `fanout` | a few shared prompts fanning out in parallel bursts: affinity parks each on one replica and the imbalance threshold never trips |
//! | `heterogeneous` | two of four replicas 2.5x slower: a speed-blind rule sends them the hottest prefixes |
//! | `tenants` | many tenants whose prompts do not fit in one replica's cache: an index that believes everything it ever sent is still cached |
//! | `replica-loss` | a replica dies mid-run: its queue must go elsewhere without failing anyone |
//! | `mix` | the agentic mix (sessions, growing context, fan-out) on four replicas |
//! | `shared-prefix` | the classic shared-prefix benchmark (vLLM's `prefix_repetition`, SGLang's generated-shared-prefix): 32 system prompts that every replica can hold, Poisson arrivals, long answers, so capacity ends at the batch slots and only balance counts |
//! | `random` | prompts that share nothing: locality is worth nothing and a rule must fall back to balance |
//!
//! Every fleet: four replicas of [`CostModel::default`] (an ~8B model on one H100: ~8,300
//! prefill tokens/s, 12 ms per step), chunked prefill with a 2,048-token budget, 128 slots,
//! 16-token blocks; one router (as one gateway) scraping every 500 ms (the gateway's default);
//! the SLO is TTFT P95 within 1 s and under 1% failed requests. Each sweep's rates bracket the
//! peers' knees; `rates=` overrides them.
//!
//! Each rate runs on a fresh fleet, from cold caches. `kvgate bench --sweep` runs its rates one
//! after the other on the same engines, so a rule that spread every prompt everywhere while
//! missing at a low rate meets a high one warm (docs/routing.md, "On the classic benchmarks").
//! `shared-prefix` and `random` take `warmup_requests=N`: each run starts with N requests at
//! `warmup_rate` (the sweep's lowest rate by default) on the same prompts, not measured.

use super::capacity::{sweep, Experiment, ORACLE};
use super::metrics::Slo;
use super::{policy_names, share, Error, Options, Params, Report};
use crate::dist::{Arrivals, Lengths};
use crate::fleet::{Failure, FleetConfig, KvSignal, Outcome, ReplicaConfig, RequestRecord};
use crate::model::{Batching, CostModel, EngineConfig};
use crate::workload::{
    Agentic, AgenticConfig, Bursts, BurstsConfig, OpenLoop, OpenLoopConfig, PrefixGroups, Warmed,
    Workload,
};
use kvgate_core::{Nanos, PolicyConfig};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};

/// The rows every failure-mode sweep compares, then the oracle.
pub(super) const DEFAULT_POLICIES: [&str; 6] = [
    "predicted_ttft",
    "cache_aware",
    "consistent_hash",
    "prefix_hash",
    "least_outstanding",
    "kv_cost",
];

/// Where a warmed run's measured requests start their unique token ids: the warm-up's start at
/// 0, and ids wrap at 2^30 ([`crate::workload::UniqueTokens`]), so each half holds one of them.
const MEASURED_IDS_FROM: u32 = 1 << 29;

/// Refuses a warm-up whose unique token ids, or the measured run's after it, could run past
/// their half of the id space into the other's: a measured question would then find part of
/// itself cached from the warm-up. Bounded by the longest prompt's unique part per request.
fn check_unique_ids(
    prompt: Lengths,
    groups: Option<PrefixGroups>,
    warmup_requests: u64,
    requests: u64,
) -> Result<(), Error> {
    let shared = groups.map_or(0, |g| (f64::from(prompt.max) * g.share).floor() as u32);
    let per_request = u64::from(prompt.max.saturating_sub(shared) + 1);
    let room = u64::from(MEASURED_IDS_FROM);
    for (key, n) in [("warmup_requests", warmup_requests), ("requests", requests)] {
        if n.saturating_mul(per_request) > room {
            return Err(Error::BadSetting {
                key: key.into(),
                why: format!(
                    "{n} requests of up to {per_request} unique tokens each need more than the \
                     {room} token ids a warmed run gives each part; ask for at most {}",
                    room / per_request
                ),
            });
        }
    }
    Ok(())
}

fn fleet(p: &mut Params<'_>, speeds: &[f64], kv_blocks: u64) -> Result<FleetConfig, Error> {
    let replicas = p.u64("replicas", 4)?.max(1) as usize;
    let speeds = p.list_f64("speeds", speeds)?;
    let engine = EngineConfig {
        max_num_seqs: p.u64("slots", 128)? as usize,
        kv_blocks: p.u64("kv_blocks", kv_blocks)? as usize,
        block_size: 16,
        batching: Batching::Chunked {
            max_num_batched_tokens: p.u64("max_num_batched_tokens", 2_048)? as usize,
        },
        prefix_caching: true,
        cost: CostModel::default(),
    };
    Ok(FleetConfig {
        replicas: (0..replicas)
            .map(|i| ReplicaConfig {
                engine,
                speed: speeds[i % speeds.len()],
            })
            .collect(),
        routers: p.u64("routers", 1)?.max(1) as usize,
        scrape_interval: Nanos::from_millis(p.u64("scrape_ms", 500)?),
        staggered: true,
        policy: PolicyConfig::default_for("random").expect("known"),
        session_names: p.bool("session_names", true)?,
        kv_events: p.bool("kv_events", false)?,
        sample_interval: Nanos::ZERO,
        maintain_interval: Nanos::from_secs(10),
        kv_signal: KvSignal::Referenced,
        oracle: false,
        failures: Vec::new(),
        resume: {
            let per_endpoint = p.u64("resume_per_endpoint", 1)? as u32;
            p.bool("resume", true)?.then_some(per_endpoint)
        },
        resume_yield: Nanos::from_millis(p.u64("resume_yield_ms", 1_000)?),
        resume_stage: Some(p.u64("resume_stage_tokens", 512)? as u32).filter(|&t| t > 0),
        resume_stage_grow: p.bool("resume_stage_grow", true)?,
        rehome: {
            // The gateway's default window (`resume.rehome_s`).
            let window = p.f64("rehome_s", 10.0)?;
            (window > 0.0).then(|| Nanos::from_secs_f64(window))
        },
        rehome_delay: Nanos::from_millis(p.u64("rehome_delay_ms", 0)?),
        share: share(p)?,
        horizon: None,
    })
}

fn agentic(p: &mut Params<'_>, base: AgenticConfig) -> Result<AgenticConfig, Error> {
    Ok(AgenticConfig {
        requests: p.u64("requests", base.requests)?,
        tenants: p.u64("tenants", u64::from(base.tenants))? as u32,
        system_tokens: p.u64("system_tokens", u64::from(base.system_tokens))? as u32,
        turns: p.f64("turns", base.turns)?,
        think_time_s: p.f64("think_time_s", base.think_time_s)?,
        fanout_prob: p.f64("fanout_prob", base.fanout_prob)?,
        fanout: p.u64("fanout", u64::from(base.fanout))? as u32,
        max_context: p.u64("max_context", u64::from(base.max_context))? as u32,
        ..base
    })
}

fn rates(p: &mut Params<'_>, default: &[f64]) -> Result<Vec<f64>, Error> {
    let mut r = p.list_f64("rates", default)?;
    r.sort_by(f64::total_cmp);
    Ok(r)
}

fn no_extra(_: &Outcome) -> BTreeMap<String, Value> {
    BTreeMap::new()
}

/// TTFT P95 (ms) of the requests that arrived in the 30 s before `at` and in the 30 s after.
/// When `lost` died at `at`, also the same after the loss without the first request of each
/// displaced session (one whose last request before the loss went to `lost`). That request
/// must recompute the session's context wherever it goes, so its TTFT is set by the context's
/// length, not by the routing; the split shows how much of the rise is that floor. With no
/// replica lost (`lose_replica=false`) only the windows are reported: the same windows of a
/// fleet that lost nothing show how much of the rise the workload itself brings, and of a fleet
/// of the survivors alone, how much their load does.
fn before_and_after(outcome: &Outcome, at: Nanos, lost: Option<u32>) -> BTreeMap<String, Value> {
    let window = Nanos::from_secs(30);
    let ttft = |r: &RequestRecord| r.first_token.map(|f| (f - r.arrival).as_millis_f64());
    let percentile = |mut v: Vec<f64>, q: f64| {
        v.sort_by(f64::total_cmp);
        kvgate_core::stats::percentile(&v, q).map(|x| (x * 10.0).round() / 10.0)
    };
    let p95 = |v: Vec<f64>| percentile(v, 0.95);
    let in_window = |r: &&RequestRecord, lo: Nanos, hi: Nanos| r.arrival >= lo && r.arrival < hi;
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
    let mut home: HashMap<u64, u32> = HashMap::new();
    for r in outcome.records.iter().filter(|r| r.arrival < at) {
        if let Some(s) = r.session {
            home.insert(s, r.replica);
        }
    }
    // The first request (and siblings sent with it) of each displaced session after the loss.
    let mut first_after: HashMap<u64, Nanos> = HashMap::new();
    for r in outcome.records.iter().filter(|r| r.arrival >= at) {
        if let Some(s) = r.session.filter(|s| home.get(s) == Some(&lost)) {
            let t = first_after.entry(s).or_insert(r.arrival);
            *t = (*t).min(r.arrival);
        }
    }
    let recomputes = |r: &RequestRecord| {
        r.session
            .and_then(|s| first_after.get(&s))
            .is_some_and(|&t| r.arrival == t)
    };
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
    let recompute_ttfts: Vec<f64> = after
        .iter()
        .filter(|r| recomputes(r))
        .filter_map(|r| ttft(r))
        .collect();
    keys.extend([
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
    ]);
    keys
}

/// Runs the failure-mode scenario `name` (one of [`super::SCENARIOS`] from `fanout` on).
pub(super) fn run(name: &'static str, options: &Options) -> Result<Report, Error> {
    let mut p = Params::new(&options.sets);
    let slo = Slo {
        ttft: p.f64("slo_ttft_ms", 1_000.0)?,
        tpot: f64::INFINITY,
    };
    let mut rows = Vec::new();
    for policy in policy_names(options, &DEFAULT_POLICIES) {
        let config = p.policy(&policy, &[])?;
        rows.push((policy, Some(config)));
    }
    if p.bool("oracle", true)? {
        rows.push((ORACLE.to_string(), None));
    }
    let seed = options.seed;
    match name {
        "fanout" => {
            let base = BurstsConfig::default();
            let lengths = |p: &mut Params<'_>, key: &str, base: crate::dist::Lengths| {
                p.f64(key, base.mean)
                    .map(|mean| crate::dist::Lengths { mean, ..base })
            };
            let bursts = BurstsConfig {
                requests: p.u64("requests", base.requests)?,
                prompts: p.u64("prompts", u64::from(base.prompts))? as u32,
                prompt_tokens: p.u64("prompt_tokens", u64::from(base.prompt_tokens))? as u32,
                fanout: p.u64("fanout", u64::from(base.fanout))? as u32,
                context: lengths(&mut p, "context_tokens", base.context)?,
                task: lengths(&mut p, "task_tokens", base.task)?,
                ..base
            };
            let fleet = fleet(&mut p, &[1.0], 16_384)?;
            // Steps of 1/8 burst/s from 1 to 2.25: the best rules' knees lie between 1.25 and 2
            // bursts/s, where TTFT P95 climbs steeply, and interpolating across the half-burst
            // step this grid once had put `predicted_ttft`'s capacity 8% low and
            // `least_outstanding`'s 2% low (5 seeds; docs/routing.md).
            let rates = rates(
                &mut p,
                &[
                    0.25, 0.5, 0.75, 1.0, 1.125, 1.25, 1.375, 1.5, 1.625, 1.75, 1.875, 2.0, 2.25,
                ],
            )?;
            let make = move |rate: f64| -> Box<dyn Workload> {
                Box::new(Bursts::new(BurstsConfig { rate, ..bursts }))
            };
            let exp = Experiment {
                name,
                fleet,
                slo,
                workload: &make,
                rates,
                requests: bursts.requests,
                warmup_secs: 0.0,
                per_unit: f64::from(bursts.fanout.max(1)),
                rate_unit: "bursts/s",
                extra: &no_extra,
            };
            Ok(sweep(&exp, &rows, seed, p.finish()?))
        }
        "shared-prefix" | "random" => {
            let fleet = fleet(&mut p, &[1.0], 16_384)?;
            let shared = name == "shared-prefix";
            // The gateway bench's shapes (scripts/routing-bench.sh): 32 prefixes of 2,048 tokens
            // before a 128-token question and 256 tokens out; or 1,024 tokens in and 128 out,
            // each spread +-50% (a lognormal of the same mean and spread, clamped to it).
            let spread = |mean: f64| Lengths {
                mean,
                cv: 0.29,
                min: (mean * 0.5) as u32,
                max: (mean * 1.5) as u32,
            };
            let (prompt, output, groups) = if shared {
                let prefix = p.u64("prefix_tokens", 2_048)? as f64;
                let suffix = p.u64("suffix_tokens", 128)? as f64;
                let groups = PrefixGroups {
                    groups: p.u64("prefixes", 32)? as u32,
                    share: prefix / (prefix + suffix),
                    zipf: p.f64("zipf", 0.0)?,
                };
                let output = Lengths::fixed(p.u64("output_tokens", 256)? as u32);
                (
                    Lengths::fixed((prefix + suffix) as u32),
                    output,
                    Some(groups),
                )
            } else {
                let prompt = spread(p.f64("prompt_tokens", 1_024.0)?);
                (prompt, spread(p.f64("output_tokens", 128.0)?), None)
            };
            let default_rates: &[f64] = if shared {
                &[10.0, 20.0, 25.0, 30.0, 32.5, 35.0, 37.5, 40.0, 45.0]
            } else {
                &[10.0, 15.0, 20.0, 22.5, 25.0, 27.5, 30.0, 35.0]
            };
            let rates = rates(&mut p, default_rates)?;
            let burstiness = p.positive_f64("burstiness", 1.0)?;
            let requests = p.u64("requests", 6_000)?;
            let warmup_requests = p.u64("warmup_requests", 0)?;
            let warmup_rate = p.positive_f64("warmup_rate", rates[0])?;
            if warmup_requests > 0 {
                check_unique_ids(prompt, groups, warmup_requests, requests)?;
            }
            let make = move |rate: f64| -> Box<dyn Workload> {
                let open = |rate: f64, requests: u64| {
                    OpenLoop::new(OpenLoopConfig {
                        arrivals: Arrivals { rate, burstiness },
                        time_unit: Nanos::from_secs(1),
                        requests,
                        prompt,
                        output,
                        long_fraction: 0.0,
                        long_output: output,
                        groups,
                    })
                };
                if warmup_requests == 0 {
                    return Box::new(open(rate, requests));
                }
                Box::new(Warmed::new(
                    Box::new(open(warmup_rate, warmup_requests)),
                    Box::new(open(rate, requests).with_unique_from(MEASURED_IDS_FROM)),
                ))
            };
            let exp = Experiment {
                name,
                fleet,
                slo,
                workload: &make,
                rates,
                requests,
                warmup_secs: warmup_requests as f64 / warmup_rate,
                per_unit: 1.0,
                rate_unit: "req/s",
                extra: &no_extra,
            };
            Ok(sweep(&exp, &rows, seed, p.finish()?))
        }
        _ => {
            let standard = AgenticConfig {
                requests: 6_000,
                max_context: 16_000,
                ..AgenticConfig::default()
            };
            let (speeds, kv_blocks, base, default_rates): (&[f64], u64, AgenticConfig, &[f64]) =
                match name {
                    "heterogeneous" => (
                        &[1.0, 1.0, 0.4, 0.4],
                        16_384,
                        standard,
                        &[0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0],
                    ),
                    "tenants" => (
                        &[1.0],
                        4_096,
                        AgenticConfig {
                            requests: 6_000,
                            tenants: 32,
                            system_tokens: 6_000,
                            turns: 4.0,
                            max_context: 12_000,
                            ..AgenticConfig::default()
                        },
                        &[0.25, 0.5, 0.75, 1.0, 1.125, 1.25, 1.375, 1.5, 1.75, 2.0],
                    ),
                    "replica-loss" => (
                        &[1.0],
                        16_384,
                        standard,
                        &[1.5, 2.0, 2.5, 3.0, 3.25, 3.5, 3.75, 4.0, 5.0],
                    ),
                    "mix" => (
                        &[1.0],
                        16_384,
                        standard,
                        &[3.0, 4.0, 5.0, 5.5, 6.0, 6.25, 6.5, 6.75, 7.0, 8.0],
                    ),
                    other => return Err(Error::UnknownScenario(other.to_string())),
                };
            let mut fleet = fleet(&mut p, speeds, kv_blocks)?;
            let workload = agentic(&mut p, base)?;
            let rates = rates(&mut p, default_rates)?;
            let fail_at = if name == "replica-loss" {
                let at = Nanos::from_secs_f64(p.f64("fail_at_s", 120.0)?);
                let replica = fleet.replicas.len() - 1;
                let lose = p.bool("lose_replica", true)?;
                if lose {
                    fleet.failures.push(Failure { replica, at });
                }
                Some((at, lose.then_some(replica as u32)))
            } else {
                None
            };
            let make = move |rate: f64| -> Box<dyn Workload> {
                Box::new(Agentic::new(AgenticConfig {
                    session_rate: rate,
                    ..workload
                }))
            };
            let extra = move |o: &Outcome| match fail_at {
                Some((at, lost)) => before_and_after(o, at, lost),
                None => BTreeMap::new(),
            };
            let exp = Experiment {
                name,
                fleet,
                slo,
                workload: &make,
                rates,
                requests: workload.requests,
                warmup_secs: 0.0,
                per_unit: workload.turns
                    * (1.0 + workload.fanout_prob * f64::from(workload.fanout)),
                rate_unit: "sessions/s",
                extra: &extra,
            };
            Ok(sweep(&exp, &rows, seed, p.finish()?))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(session: u64, replica: u32, arrival_s: u64, ttft_ms: u64) -> RequestRecord {
        let arrival = Nanos::from_secs(arrival_s);
        RequestRecord {
            arrival,
            first_token: Some(arrival + Nanos::from_millis(ttft_ms)),
            finished: None,
            replica,
            router: 0,
            prompt_tokens: 1_000,
            cached_tokens: 0,
            output_tokens: 1,
            tag: 0,
            tenant: None,
            session: Some(session),
            retries: 0,
            failed: false,
            predicted_ttft_ms: None,
            predicted_cached: None,
            resumed: None,
        }
    }

    #[test]
    fn only_the_first_request_of_a_session_displaced_by_the_loss_counts_as_a_recompute() {
        let mut o = Outcome::new(2);
        // Session 1 lived on replica 1 (lost at 100 s), session 2 on replica 0.
        o.records.push(record(1, 1, 90, 100));
        o.records.push(record(2, 0, 95, 100));
        // After the loss: session 1's next request recomputes (900 ms), its later ones do not.
        o.records.push(record(1, 0, 105, 900));
        o.records.push(record(1, 0, 110, 120));
        o.records.push(record(2, 0, 106, 110));
        let keys = before_and_after(&o, Nanos::from_secs(100), Some(1));
        assert_eq!(keys["recomputes_30s_after"], json!(1));
        assert_eq!(keys["requests_30s_after"], json!(3));
        assert_eq!(keys["recompute_ttft_p50"], json!(900.0));
        let without = keys["ttft_p95_30s_after_without_recomputes"]
            .as_f64()
            .unwrap();
        let with = keys["ttft_p95_30s_after"].as_f64().unwrap();
        assert!(without < 121.0 && with > 500.0, "{without} {with}");
    }

    #[test]
    fn with_no_replica_lost_only_the_windows_are_reported() {
        let mut o = Outcome::new(2);
        o.records.push(record(1, 1, 90, 100));
        o.records.push(record(1, 0, 105, 300));
        o.records.push(record(2, 0, 140, 900));
        let keys = before_and_after(&o, Nanos::from_secs(100), None);
        let names: Vec<&str> = keys.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "requests_30s_after",
                "ttft_p95_30s_after",
                "ttft_p95_30s_before"
            ]
        );
        assert_eq!(keys["ttft_p95_30s_before"], json!(100.0));
        assert_eq!(keys["ttft_p95_30s_after"], json!(300.0));
        assert_eq!(keys["requests_30s_after"], json!(1));
    }
}
