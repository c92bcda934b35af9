//! Agentic sessions on a realistic cost model (docs/background.md#agentic-workloads): tenants'
//! shared system prompts, conversations that resend their growing context every turn, think time,
//! and fan-out bursts of parallel calls sharing the parent's prefix.
//!
//! Replicas use [`CostModel::default`] (an ~8B model on one H100-class GPU) with chunked prefill
//! (2,048-token budget), 128 slots and 16,384 KV blocks of 16 tokens; two routers scrape every
//! 50 ms; 1 tick = 1 ms. Sessions arrive at `session_rate_per_replica` x replicas per second so
//! the load per replica stays the same when `replicas` changes. The SLO is TTFT <= 2,000 ms and
//! TPOT <= 50 ms (docs/background.md#open-loop-evaluation-and-capacity).

use super::metrics::{summarise, Slo, Window};
use super::table::{num, pct, Table};
use super::{par_map, policy_names, share, to_value, Error, Options, Params, Report};
use crate::fleet::{self, FleetConfig, KvSignal, ReplicaConfig};
use crate::model::{Batching, CostModel, EngineConfig};
use crate::workload::{Agentic, AgenticConfig};
use kvgate_core::{Nanos, PolicyConfig};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// `kv_cost` is left out of the default set because its block index (kvgate-core) costs about
/// ten times more per request than the rest of a simulated request; `--policy kv_cost` runs it.
const DEFAULT_POLICIES: [&str; 5] = [
    "round_robin",
    "least_outstanding",
    "power_of_two",
    "prefix_hash",
    "cache_aware",
];

/// `replicas` engines like one H100 serving an ~8B model, behind routers scraping every 50 ms.
fn fleet(p: &mut Params<'_>, replicas: usize) -> Result<FleetConfig, Error> {
    let engine = EngineConfig {
        max_num_seqs: p.u64("slots", 128)? as usize,
        kv_blocks: p.u64("kv_blocks", 16_384)? as usize,
        block_size: 16,
        batching: Batching::Chunked {
            max_num_batched_tokens: p.u64("max_num_batched_tokens", 2_048)? as usize,
        },
        prefix_caching: true,
        cost: CostModel::default(),
    };
    let speeds = p.list_f64("speeds", &[1.0])?;
    Ok(FleetConfig {
        replicas: (0..replicas)
            .map(|i| ReplicaConfig::new(engine, speeds[i % speeds.len()]))
            .collect(),
        routers: p.u64("routers", 2)?.max(1) as usize,
        scrape_interval: Nanos::from_millis(p.u64("scrape_ms", 50)?),
        staggered: p.bool("staggered", true)?,
        policy: PolicyConfig::default_for("random").expect("known"),
        session_names: p.bool("session_names", true)?,
        kv_events: p.bool("kv_events", false)?,
        sample_interval: Nanos::from_millis(100),
        maintain_interval: Nanos::from_secs(10),
        kv_signal: KvSignal::Referenced,
        oracle: false,
        failures: Vec::new(),
        resume: Some(1),
        resume_yield: Nanos::from_secs(1),
        rehome: None,
        rehome_delay: Nanos::ZERO,
        resume_stage: None,
        resume_stage_grow: true,
        share: share(p)?,
        horizon: None,
        admission: None,
        dispatch: Default::default(),
    })
}

pub(super) fn run(options: &Options) -> Result<Report, Error> {
    let mut p = Params::new(&options.sets);
    let replicas = p.u64("replicas", 8)?.max(1) as usize;
    let per_replica = p.f64("session_rate_per_replica", 0.25)?;
    let base = AgenticConfig {
        session_rate: per_replica * replicas as f64,
        requests: 20_000,
        ..AgenticConfig::default()
    };
    let workload = super::families::agentic(&mut p, base)?;
    let fleet = fleet(&mut p, replicas)?;
    let slo = Slo {
        ttft: p.f64("slo_ttft_ms", 2_000.0)?,
        tpot: p.f64("slo_tpot_ms", 50.0)?,
    };
    let names = policy_names(options, &DEFAULT_POLICIES);
    let mut configs = Vec::new();
    for name in &names {
        configs.push((name.clone(), p.policy(name, &[])?));
    }
    let params = p.finish()?;
    let mut table = Table::new(&[
        "policy",
        "TTFT p50 ms",
        "TTFT p95 ms",
        "TPOT p95 ms",
        "SLO met",
        "goodput/s",
        "cache hit",
        "gap",
        "preempt",
    ]);
    let mut results = Vec::new();
    let summaries = par_map(&configs, |(name, config)| {
        let mut f = fleet.clone();
        f.policy = config.clone();
        let mut w = Agentic::new(workload);
        let mut rng = ChaCha8Rng::seed_from_u64(options.seed);
        let outcome = fleet::run(&f, &mut w, &mut rng, options.seed);
        summarise(name, None, &outcome, slo, Window::WholeRun)
    });
    for ((name, _), r) in configs.into_iter().zip(summaries) {
        table.row(vec![
            name,
            num(r.ttft_p50, 0),
            num(r.ttft_p95, 0),
            num(r.tpot_p95, 1),
            pct(r.slo_attainment),
            num(r.goodput * 1_000.0, 2),
            pct(r.cache_hit_ratio),
            r.assignment_gap.to_string(),
            r.preemptions.to_string(),
        ]);
        results.push(to_value(&r));
    }
    Ok(Report {
        scenario: "agentic".into(),
        seed: options.seed,
        params,
        results,
        notes: vec![
            "Times in ms (1 tick = 1 ms); goodput in SLO-meeting requests per second; closed-loop \
             turns, so output_tokens_per_tick is over the whole run."
                .into(),
            "Answers are not cached by the engine model (generated token ids are unknown to it), \
             so each turn's previous answer is prefilled again."
                .into(),
        ],
        table: table.render(),
    })
}
