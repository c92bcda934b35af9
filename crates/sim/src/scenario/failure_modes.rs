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

use super::capacity::{sweep, ORACLE};
use super::families::{self, no_extra, rates};
use super::metrics::Slo;
use super::{policy_names, share, Error, Options, Params, Report};
use crate::fleet::{Failure, FleetConfig, KvSignal, Outcome, ReplicaConfig};
use crate::model::{Batching, CostModel, EngineConfig};
use crate::workload::AgenticConfig;
use kvgate_core::{Nanos, PolicyConfig};
use std::collections::BTreeMap;

mod loss_windows;
use loss_windows::before_and_after;

/// The rows every failure-mode sweep compares, then the oracle.
pub(super) const DEFAULT_POLICIES: [&str; 6] = [
    "predicted_ttft",
    "cache_aware",
    "consistent_hash",
    "prefix_hash",
    "least_outstanding",
    "kv_cost",
];

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
            .map(|i| ReplicaConfig::new(engine, speeds[i % speeds.len()]))
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
        admission: None,
        dispatch: Default::default(),
    })
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
        "fanout" => fanout(name, p, &rows, slo, seed),
        "shared-prefix" | "random" => open_loop(name, p, &rows, slo, seed),
        _ => agentic_sweep(name, p, &rows, slo, seed),
    }
}

/// The policies a sweep compares, each with its configuration (`None`: the oracle).
type Rows = [(String, Option<PolicyConfig>)];

/// `fanout`: parallel bursts of a few shared prompts.
fn fanout(
    name: &'static str,
    mut p: Params<'_>,
    rows: &Rows,
    slo: Slo,
    seed: u64,
) -> Result<Report, Error> {
    let family = families::bursts(&mut p)?;
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
    let exp = family.experiment(name, fleet, slo, rates, &no_extra);
    Ok(sweep(&exp, rows, seed, p.finish()?))
}

/// `shared-prefix` and `random`: Poisson (or burstier) arrivals of independent requests,
/// after an optional unmeasured warm-up.
fn open_loop(
    name: &'static str,
    mut p: Params<'_>,
    rows: &Rows,
    slo: Slo,
    seed: u64,
) -> Result<Report, Error> {
    let fleet = fleet(&mut p, &[1.0], 16_384)?;
    let shared = name == "shared-prefix";
    let default_rates: &[f64] = if shared {
        &[10.0, 20.0, 25.0, 30.0, 32.5, 35.0, 37.5, 40.0, 45.0]
    } else {
        &[10.0, 15.0, 20.0, 22.5, 25.0, 27.5, 30.0, 35.0]
    };
    let rates = rates(&mut p, default_rates)?;
    let family = families::open_loop(&mut p, shared, rates[0])?;
    let exp = family.experiment(name, fleet, slo, rates, &no_extra);
    Ok(sweep(&exp, rows, seed, p.finish()?))
}

/// An agentic scenario's replica speeds, KV blocks per replica, workload and default rates.
type AgenticShape = (&'static [f64], u64, AgenticConfig, &'static [f64]);

/// The fleet and workload each agentic scenario runs.
fn agentic_shape(name: &str) -> Result<AgenticShape, Error> {
    let standard = AgenticConfig {
        requests: 6_000,
        max_context: 16_000,
        ..AgenticConfig::default()
    };
    Ok(match name {
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
    })
}

/// `heterogeneous`, `tenants`, `replica-loss` and `mix`: agentic sessions at a session rate.
fn agentic_sweep(
    name: &'static str,
    mut p: Params<'_>,
    rows: &Rows,
    slo: Slo,
    seed: u64,
) -> Result<Report, Error> {
    let (speeds, kv_blocks, base, default_rates) = agentic_shape(name)?;
    let mut fleet = fleet(&mut p, speeds, kv_blocks)?;
    let workload = families::agentic(&mut p, base)?;
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
    let extra = move |o: &Outcome| match fail_at {
        Some((at, lost)) => before_and_after(o, at, lost),
        None => BTreeMap::new(),
    };
    let family = families::sessions(workload);
    let exp = family.experiment(name, fleet, slo, rates, &extra);
    Ok(sweep(&exp, rows, seed, p.finish()?))
}

#[cfg(test)]
mod tests;
