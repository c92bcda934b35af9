//! `kvgate sim --scenario pd`: prefill/decode disaggregation's four modes on long-prompt agentic
//! sessions, at the same fleet size. `never` runs every replica on whole requests; the other
//! modes split the fleet into `prefill_replicas` prefill replicas and the rest decode replicas,
//! and [`kvgate_core::disagg`] decides each prompt's prefill ([`fleet`]).
//!
//! The sessions are the agentic model `kvgate bench --workload agentic` sends (one generator,
//! [`crate::workload::Agentic`]), at `scripts/pd-bench.sh`'s shape: sessions arrive at
//! `session_rate` per second (Poisson), each belongs to one of `tenants` tenants and opens with
//! its tenant's system prompt (`system_tokens`, shared by the tenant's sessions), and runs
//! `turns` turns on average (geometric), each appending the previous answer and a tool result
//! (`turn_tokens` on average, lognormal) after a think time of `think_ms`; answers are
//! `output_tokens` long on average (lognormal), and a session ends once its context passes
//! `max_context`. Replicas are the agentic scenario's (an ~8B model on one H100, chunked
//! prefill in 2,048-token chunks).

mod fleet;

use super::table::{num, pct, Table};
use super::{to_value, Error, Options, Params, Report};
use crate::model::{Batching, CostModel, EngineConfig};
use crate::workload::{Agentic, AgenticConfig};
use fleet::{Measured, PdFleet, Role};
use kvgate_core::disagg::{Config, Decider, Mode};
use kvgate_core::stats::percentile;
use kvgate_core::Nanos;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

/// One mode's results.
#[derive(Debug, Serialize)]
struct ModeResult {
    variant: String,
    prefill_replicas: usize,
    decode_replicas: usize,
    requests: usize,
    remote_share: Option<f64>,
    ttft_p50: Option<f64>,
    ttft_p95: Option<f64>,
    /// The least TTFT p95 any mode could reach on this run's requests (`PdFleet::floor`).
    ttft_p95_floor: Option<f64>,
    tpot_p50: Option<f64>,
    tpot_p95: Option<f64>,
    slo_attainment: Option<f64>,
    cache_hit_ratio: Option<f64>,
    /// Not a routing comparison: no oracle assignment to measure a gap against.
    assignment_gap: Option<u64>,
    output_tokens_per_tick: Option<f64>,
}

fn sorted(values: impl Iterator<Item = f64>) -> Vec<f64> {
    let mut v: Vec<f64> = values.collect();
    v.sort_by(f64::total_cmp);
    v
}

fn summarise(
    variant: &str,
    roles: (usize, usize),
    fleet: &PdFleet,
    end: Nanos,
    slo: (f64, f64),
) -> ModeResult {
    let m: &[Measured] = &fleet.measured;
    let ttft = sorted(m.iter().filter_map(|r| r.ttft));
    let tpot = sorted(m.iter().filter_map(|r| r.tpot));
    let floors = sorted(m.iter().map(|r| r.floor.unwrap_or(0.0)));
    let met = m
        .iter()
        .filter(|r| r.ttft.is_some_and(|t| t <= slo.0) && r.tpot.is_none_or(|t| t <= slo.1))
        .count();
    let n = m.len();
    let share = |k: usize| (n > 0).then(|| k as f64 / n as f64);
    let ticks = end.as_secs_f64() * 1e3;
    ModeResult {
        variant: variant.to_owned(),
        prefill_replicas: roles.0,
        decode_replicas: roles.1,
        requests: n,
        remote_share: share(m.iter().filter(|r| r.remote).count()),
        ttft_p50: percentile(&ttft, 0.5),
        ttft_p95: percentile(&ttft, 0.95),
        ttft_p95_floor: percentile(&floors, 0.95),
        tpot_p50: percentile(&tpot, 0.5),
        tpot_p95: percentile(&tpot, 0.95),
        slo_attainment: share(met),
        cache_hit_ratio: fleet.cache_hit_ratio(),
        assignment_gap: None,
        output_tokens_per_tick: (ticks > 0.0).then(|| fleet.output_tokens as f64 / ticks),
    }
}

/// The scenario's `decode_stall_weight`: of 0, 0.1, 0.2, 0.3, 0.5, 0.7, 1, 1.5, 2, 3 and 5 at
/// every split, on seeds 1-3 only, the setting that beat `never` and `always` at its best split
/// (the highest SLO attainment, then the lowest TTFT p95) on the most of the twelve
/// comparisons (two modes, two tails, three seeds), ties by the lowest mean TPOT p95: 1.5 at 2:2
/// (nine; it loses every seed's TTFT p95 to `never`). Seeds 4-8 are held out to report it
/// (docs/pd.md). The gateway's default stays 0.1 (see the docs for why).
const STALL_WEIGHT: f64 = 1.5;

/// The prefill replica counts to run the disaggregated modes at: `prefill_replicas` (one or a
/// comma-separated list), by default every split of the fleet, so that each mode is compared
/// at its best split rather than at one split that suits one mode.
fn splits(p: &mut Params<'_>, replicas: usize) -> Result<Vec<usize>, Error> {
    let every: Vec<f64> = (1..replicas).map(|n| n as f64).collect();
    let listed = p.list_f64("prefill_replicas", &every)?;
    listed
        .iter()
        .map(|&n| {
            let ok = n.fract() == 0.0 && n >= 1.0 && n < replicas as f64;
            ok.then_some(n as usize).ok_or_else(|| Error::BadSetting {
                key: "prefill_replicas".into(),
                why: format!("{n} is not a whole number from 1 to {}", replicas - 1),
            })
        })
        .collect()
}

/// The decision's settings from `--set`.
fn decision(p: &mut Params<'_>) -> Result<Config, Error> {
    let mut decision = Config {
        threshold_tokens: p.u64("threshold_tokens", 2_048)? as u32,
        decode_stall_weight: p.f64("decode_stall_weight", STALL_WEIGHT)?,
        duplicate_prefill_weight: p.f64(
            "duplicate_prefill_weight",
            Config::default().duplicate_prefill_weight,
        )?,
        ..Config::default()
    };
    decision.transfer.bandwidth_gbps = p.positive_f64("bandwidth_gbps", 40.0)?;
    decision.transfer.setup_ms = p.f64("setup_ms", 1.0)?;
    decision.validate().map_err(|e| Error::BadSetting {
        key: e.field.into(),
        why: e.why.into(),
    })?;
    Ok(decision)
}

/// The workload's settings from `--set`: the agentic model `kvgate bench --workload agentic`
/// sends (the same generator), at `scripts/pd-bench.sh`'s shape, without fan-out.
fn workload(p: &mut Params<'_>) -> Result<AgenticConfig, Error> {
    let d = AgenticConfig::default();
    Ok(AgenticConfig {
        requests: p.u64("requests", 1_500)?.max(1),
        session_rate: p.positive_f64("session_rate", 0.6)?,
        tenants: p.u64("tenants", 64)?.max(1) as u32,
        system_tokens: p.u64("system_tokens", 8_000)? as u32,
        turns: p.positive_f64("turns", 4.0)?.max(1.0),
        user_text: d
            .user_text
            .with_mean(p.positive_f64("turn_tokens", 1_000.0)?),
        answer: d.answer.with_mean(p.positive_f64("output_tokens", 200.0)?),
        think_time_s: p.f64("think_ms", 1_000.0)?.max(0.0) / 1e3,
        fanout_prob: 0.0,
        max_context: p.u64("max_context", 32_000)? as u32,
        ..d
    })
}

/// Every replica's engine: the agentic scenario's, with `kv_blocks` blocks of KV.
fn engine(kv_blocks: usize) -> EngineConfig {
    EngineConfig {
        max_num_seqs: 128,
        kv_blocks,
        block_size: 16,
        batching: Batching::Chunked {
            max_num_batched_tokens: 2_048,
        },
        prefix_caching: true,
        cost: CostModel::default(),
    }
}

/// One run of `decider` on `replicas` replicas whose first `split` prefill (the rest decode):
/// the fleet afterwards, and the time of its last event.
fn simulate(
    engine: EngineConfig,
    (replicas, split): (usize, usize),
    decider: Decider,
    workload: AgenticConfig,
    seed: u64,
) -> (PdFleet, Nanos) {
    let roles: Vec<Role> = (0..replicas)
        .map(|i| {
            if i < split {
                Role::Prefill
            } else {
                Role::Decode
            }
        })
        .collect();
    let mut fleet = PdFleet::new(engine, &roles, decider);
    let end = fleet.run(
        &mut Agentic::new(workload),
        &mut ChaCha8Rng::seed_from_u64(seed),
    );
    (fleet, end)
}

/// One table row.
fn row(r: &ModeResult) -> Vec<String> {
    vec![
        r.variant.clone(),
        format!("{}:{}", r.prefill_replicas, r.decode_replicas),
        r.remote_share.map_or("-".into(), pct),
        r.ttft_p50.map_or("-".into(), |v| num(v, 0)),
        r.ttft_p95.map_or("-".into(), |v| num(v, 0)),
        r.ttft_p95_floor.map_or("-".into(), |v| num(v, 0)),
        r.tpot_p50.map_or("-".into(), |v| num(v, 1)),
        r.tpot_p95.map_or("-".into(), |v| num(v, 1)),
        r.slo_attainment.map_or("-".into(), pct),
    ]
}

pub(super) fn run(options: &Options) -> Result<Report, Error> {
    let mut p = Params::new(&options.sets);
    let replicas = p.u64("replicas", 4)?.max(2) as usize;
    let splits = splits(&mut p, replicas)?;
    let workload = workload(&mut p)?;
    let decision = decision(&mut p)?;
    let slo = (p.f64("slo_ttft_ms", 2_000.0)?, p.f64("slo_tpot_ms", 50.0)?);
    let engine = engine(p.u64("kv_blocks", 16_384)? as usize);
    let params = p.finish()?;
    let mut table = Table::new(&[
        "mode", "P:D", "remote", "TTFT p50", "TTFT p95", "floor", "TPOT p50", "TPOT p95", "SLO met",
    ]);
    let mut results = Vec::new();
    let runs = std::iter::once((Mode::Never, 0)).chain(
        [Mode::Always, Mode::Threshold, Mode::Conditional]
            .into_iter()
            .flat_map(|mode| splits.iter().map(move |&split| (mode, split))),
    );
    for (mode, split) in runs {
        let decider = Decider::new(Config {
            mode,
            ..decision.clone()
        });
        let (fleet, end) = simulate(engine, (replicas, split), decider, workload, options.seed);
        let r = summarise(mode.label(), (split, replicas - split), &fleet, end, slo);
        table.row(row(&r));
        results.push(to_value(&r));
    }
    Ok(Report {
        scenario: "pd".into(),
        seed: options.seed,
        params,
        results,
        notes: vec![
            "Times in ms. `never` runs every replica on whole requests; the other modes split \
             the same replicas into prefill and decode pools (P:D), at every split unless \
             `prefill_replicas` names some."
                .into(),
            "`floor`: the least TTFT p95 any mode could reach on the run's requests, each \
             session's first prompt prefilled alone on an idle replica past the longest prefix \
             of any earlier prompt (later turns counted as 0)."
                .into(),
            "The KV transfer costs setup plus 128 KiB per token over the link; the decode \
             replica then computes one token of the prompt."
                .into(),
        ],
        table: table.render(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn splits_of(set: Option<&str>, replicas: usize) -> Result<Vec<usize>, Error> {
        let mut sets = BTreeMap::new();
        if let Some(v) = set {
            sets.insert("prefill_replicas".to_owned(), v.to_owned());
        }
        splits(&mut Params::new(&sets), replicas)
    }

    #[test]
    fn every_split_by_default_or_the_ones_named() {
        assert_eq!(splits_of(None, 4).unwrap(), vec![1, 2, 3]);
        assert_eq!(splits_of(Some("3"), 4).unwrap(), vec![3]);
        assert_eq!(splits_of(Some("1,2"), 4).unwrap(), vec![1, 2]);
    }

    #[test]
    fn a_split_that_leaves_no_pool_is_refused() {
        for bad in ["0", "4", "1.5", "x"] {
            let e = splits_of(Some(bad), 4).unwrap_err();
            assert!(e.to_string().contains("prefill_replicas"), "{bad}: {e}");
        }
    }

    /// The floor is a bound: no request of any mode, at any split, reaches its first token
    /// sooner.
    #[test]
    fn no_mode_beats_a_first_prompts_floor() {
        let sets = BTreeMap::from([("requests".to_owned(), "300".to_owned())]);
        let workload = workload(&mut Params::new(&sets)).unwrap();
        for (mode, split) in [
            (Mode::Never, 0),
            (Mode::Always, 2),
            (Mode::Threshold, 1),
            (Mode::Conditional, 3),
        ] {
            let decider = Decider::new(Config {
                mode,
                ..Config::default()
            });
            let (fleet, _) = simulate(engine(16_384), (4, split), decider, workload, 7);
            let firsts: Vec<_> = fleet
                .measured
                .iter()
                .filter(|m| m.floor.is_some())
                .collect();
            assert!(firsts.len() > 20, "{}", firsts.len());
            for m in firsts {
                let (ttft, floor) = (m.ttft.unwrap(), m.floor.unwrap());
                // Equal on an idle replica, up to rounding.
                assert!(
                    ttft >= floor * (1.0 - 1e-9),
                    "{mode:?}: TTFT {ttft} below its floor {floor}"
                );
            }
        }
    }
}
