//! A deployment simulated as configured (`kvgate sim --config FILE`): the gateway's
//! endpoints as a fleet of replicas at stated speeds, its policy with its parameters, its scrape
//! period and its admission limits, on one of the capacity sweeps' workloads
//! (`scenario/families.rs`). The report is a capacity sweep (`scenario/capacity.rs`): per row, the
//! largest request rate whose TTFT P95 meets the SLO with under 1% failed requests. The first
//! row is the configured policy as configured; then other policies at their defaults on the
//! same fleet, and the oracle router, so an operator sees what a change would do before
//! deploying it.
//!
//! Each replica is `kvgate engine`'s default model ([`EngineConfig::default`]: 256 slots,
//! 8,192 blocks of 16 tokens, chunked prefill with a 2,048-token budget,
//! [`crate::model::CostModel::default`], an ~8B model on one H100-class GPU) at speed 1; a
//! stated speed scales its iteration times.
//! The routers weigh each replica by its configured weight, as the gateway does, whatever its
//! speed. The caller (the CLI) maps its configuration to a [`Deployment`]; this crate knows
//! nothing of the gateway's.
//!
//! The default rates scale with the fleet's total speed, so that the sweep brackets the knees
//! of fleets larger or faster than the two replicas its grids were read off
//! (`rates_per_speed`); `rates=` replaces them.

use super::capacity::sweep;
use super::families::{self, no_extra, rates, Family};
use super::metrics::Slo;
use super::{policy_names, share, Error, Options, Params, Report};
use crate::fleet::{AdmissionLimits, FleetConfig, KvSignal, Outcome, ReplicaConfig};
use crate::model::{Batching, EngineConfig};
use crate::workload::AgenticConfig;
use kvgate_core::dispatch::DispatchConfig;
use kvgate_core::{Nanos, PolicyConfig};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// The workloads a configuration can be simulated on, the default first.
pub const WORKLOADS: [&str; 4] = ["agentic", "fanout", "shared-prefix", "random"];

/// The policies compared with the configured one, at their defaults, unless `--policy` names
/// others. `kv_cost` is left out: its block index costs about ten times more per simulated
/// request than the rest (`--policy kv_cost` runs it).
const COMPARED: [&str; 6] = [
    "predicted_ttft",
    "cache_aware",
    "prefix_hash",
    "consistent_hash",
    "least_outstanding",
    "round_robin",
];

/// The oracle's row.
const ORACLE_ROW: &str = "oracle (perfect information)";

/// A gateway's deployment, as the simulation sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Deployment {
    /// The endpoints, in the configuration's order.
    pub endpoints: Vec<Endpoint>,
    /// The routing policy with its parameters.
    pub policy: PolicyConfig,
    /// The engines' scrape period (`scrape.interval_ms`).
    pub scrape_interval: Nanos,
    /// The admission gate; `None`: none.
    pub admission: Option<AdmissionLimits>,
    /// The dispatch core's parameters: tier spillover acts in the simulation; breakers,
    /// retries and hedging do not (no replica fails).
    pub dispatch: DispatchConfig,
    /// Every endpoint publishes its KV events to the gateway.
    pub kv_events: bool,
    /// What the configuration holds that the simulation leaves out, one sentence each.
    pub notes: Vec<String>,
}

/// One endpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct Endpoint {
    /// Its display name.
    pub name: String,
    /// Its speed relative to the default engine model (2.0: iterations take half as long).
    pub speed: f64,
    /// Its configured weight.
    pub weight: f64,
    /// Its priority tier.
    pub tier: u32,
}

/// Sweep rates per unit of the fleet's total speed, in the workload's own unit. Read off wider
/// sweeps of the README's example configuration (two replicas, seed 1, 2026-12-06), where every
/// row first failed at 0.75-1.25 sessions/s (`agentic`), 0.375-0.75 bursts/s (`fanout`), 25
/// req/s (`shared-prefix`) and 12.5 req/s (`random`): each grid runs from well below the
/// earliest of those knees to past the latest, finer between.
fn rates_per_speed(workload: &str) -> &'static [f64] {
    match workload {
        "fanout" => &[
            0.0625, 0.125, 0.1875, 0.25, 0.3125, 0.375, 0.4375, 0.5, 0.625,
        ],
        "shared-prefix" => &[2.5, 5.0, 7.5, 8.75, 10.0, 10.625, 11.25, 12.5, 15.0],
        "random" => &[1.25, 2.5, 3.75, 4.5, 5.0, 5.5, 6.0, 6.5, 7.5],
        _ => &[0.125, 0.25, 0.3125, 0.375, 0.4375, 0.5, 0.5625, 0.625, 0.75],
    }
}

/// Runs the capacity sweep of `deployment` on `workload` (one of [`WORKLOADS`]).
pub fn run(deployment: &Deployment, workload: &str, options: &Options) -> Result<Report, Error> {
    if deployment.endpoints.is_empty() {
        return Err(Error::Deployment("no endpoints to simulate".into()));
    }
    let mut p = Params::new(&options.sets);
    let fleet = fleet(deployment, &mut p)?;
    let slo = Slo {
        ttft: p.f64("slo_ttft_ms", 1_000.0)?,
        tpot: f64::INFINITY,
    };
    let (rows, same) = rows(deployment, options, &mut p)?;
    let speed: f64 = deployment.endpoints.iter().map(|e| e.speed).sum();
    let scaled: Vec<f64> = rates_per_speed(workload)
        .iter()
        .map(|r| ((r * speed) * 1_000.0).round() / 1_000.0)
        .collect();
    let rates = rates(&mut p, &scaled)?;
    let family = match workload {
        "agentic" => families::sessions(families::agentic(
            &mut p,
            AgenticConfig {
                requests: 6_000,
                max_context: 16_000,
                ..AgenticConfig::default()
            },
        )?),
        "fanout" => families::bursts(&mut p)?,
        "shared-prefix" | "random" => {
            families::open_loop(&mut p, workload == "shared-prefix", rates[0])?
        }
        other => return Err(Error::UnknownWorkload(other.to_string())),
    };
    let mut params = p.finish()?;
    params.insert("workload".into(), json!(workload));
    params.insert("deployment".into(), echo(deployment));
    let header = header(deployment, &fleet, workload, &family, slo);
    let sweep_rows: Vec<(String, Option<PolicyConfig>)> = rows
        .iter()
        .map(|r| (r.label.clone(), r.config.clone()))
        .collect();
    let gated = |o: &Outcome| {
        BTreeMap::from([
            ("admission_waited".to_string(), json!(o.admission_queued)),
            ("admission_refused".to_string(), json!(o.admission_rejected)),
            (
                "admission_timed_out".to_string(),
                json!(o.admission_expired),
            ),
        ])
    };
    let extra: &families::Extra = if deployment.admission.is_some() {
        &gated
    } else {
        &no_extra
    };
    let exp = family.experiment("configured", fleet, slo, rates, extra);
    let mut report = sweep(&exp, &sweep_rows, options.seed, params);
    for (v, row) in report.results.iter_mut().zip(&rows) {
        v["row"] = json!(row.label);
        v["policy"] = json!(row.policy);
        v["configured"] = json!(row.configured);
    }
    report.table = format!("{header}\n{}", report.table);
    report.notes.extend(notes(deployment));
    report.notes.extend(same);
    Ok(report)
}

/// One row of the report.
struct Row {
    /// Its name in the table and the JSON's `row`.
    label: String,
    /// The policy's name (`oracle` for the oracle).
    policy: String,
    /// The policy's configuration; `None`: the oracle.
    config: Option<PolicyConfig>,
    /// The configured policy as configured.
    configured: bool,
}

/// The configured policy (its parameters, then `--set POLICY.FIELD=V`), each compared policy
/// at its defaults (the same settings applied) unless that is the configured one again, and the
/// oracle unless `oracle=false`; and a note naming the policy left out as the configured one.
fn rows(
    deployment: &Deployment,
    options: &Options,
    p: &mut Params<'_>,
) -> Result<(Vec<Row>, Option<String>), Error> {
    let name = deployment.policy.name();
    let tree = serde_json::to_value(&deployment.policy).expect("policy configs serialise");
    let fields: Vec<(&str, Value)> = tree
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| *k != "name")
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect();
    let configured = p.policy(name, &fields)?;
    let mut rows = vec![Row {
        label: format!("{name} (configured)"),
        policy: name.to_string(),
        config: Some(configured.clone()),
        configured: true,
    }];
    let mut same = None;
    for other in policy_names(options, &COMPARED) {
        let config = p.policy(&other, &[])?;
        if config == configured {
            same = Some(format!(
                "{other} at its defaults is the configured policy: one row shows both."
            ));
        } else {
            rows.push(Row {
                label: other.clone(),
                policy: other,
                config: Some(config),
                configured: false,
            });
        }
    }
    if p.bool("oracle", true)? {
        rows.push(Row {
            label: ORACLE_ROW.into(),
            policy: "oracle".into(),
            config: None,
            configured: false,
        });
    }
    Ok((rows, same))
}

/// The deployment's fleet: one replica of the default engine model (changed by `slots`,
/// `kv_blocks` and `max_num_batched_tokens`) per endpoint, behind `routers` gateways (1) that
/// share their state after `share_ms` (never).
fn fleet(d: &Deployment, p: &mut Params<'_>) -> Result<FleetConfig, Error> {
    let base = EngineConfig::default();
    let budget = match base.batching {
        Batching::Chunked {
            max_num_batched_tokens,
        } => max_num_batched_tokens,
        _ => 2_048,
    };
    let engine = EngineConfig {
        max_num_seqs: p.u64("slots", base.max_num_seqs as u64)? as usize,
        kv_blocks: p.u64("kv_blocks", base.kv_blocks as u64)? as usize,
        batching: Batching::Chunked {
            max_num_batched_tokens: p.u64("max_num_batched_tokens", budget as u64)? as usize,
        },
        ..base
    };
    Ok(FleetConfig {
        replicas: d
            .endpoints
            .iter()
            .map(|e| ReplicaConfig {
                weight: Some(e.weight),
                tier: e.tier,
                ..ReplicaConfig::new(engine, e.speed)
            })
            .collect(),
        routers: p.u64("routers", 1)?.max(1) as usize,
        scrape_interval: d.scrape_interval,
        staggered: true,
        policy: PolicyConfig::default_for("random").expect("known"),
        session_names: p.bool("session_names", true)?,
        kv_events: d.kv_events,
        sample_interval: Nanos::ZERO,
        maintain_interval: Nanos::from_secs(10),
        kv_signal: KvSignal::Referenced,
        oracle: false,
        failures: Vec::new(),
        resume: None,
        resume_yield: Nanos::ZERO,
        resume_stage: None,
        resume_stage_grow: false,
        rehome: None,
        rehome_delay: Nanos::ZERO,
        share: share(p)?,
        horizon: None,
        admission: d.admission,
        dispatch: d.dispatch.clone(),
    })
}

/// The deployment as the JSON's `params.deployment`.
fn echo(d: &Deployment) -> Value {
    json!({
        "endpoints": d.endpoints.iter().map(|e| json!({
            "name": e.name, "speed": e.speed, "weight": e.weight, "tier": e.tier,
        })).collect::<Vec<_>>(),
        "policy": d.policy,
        "scrape_ms": d.scrape_interval.as_millis_f64(),
        "kv_events": d.kv_events,
        "spillover": d.dispatch.spillover,
        "admission": d.admission.map(|a| json!({
            "max_concurrency": a.max_concurrency,
            "max_queue": a.max_queue,
            "queue_timeout_ms": a.queue_timeout.as_millis_f64(),
        })),
    })
}

/// What is simulated, above the table.
fn header(
    d: &Deployment,
    fleet: &FleetConfig,
    workload: &str,
    family: &Family,
    slo: Slo,
) -> String {
    let endpoints: Vec<String> = d
        .endpoints
        .iter()
        .map(|e| {
            let tier = if e.tier > 0 {
                format!(", tier {}", e.tier)
            } else {
                String::new()
            };
            format!("{} (speed {}, weight {}{tier})", e.name, e.speed, e.weight)
        })
        .collect();
    let engine = &fleet.replicas[0].engine;
    let admission = d.admission.map_or("none".into(), |a| {
        format!(
            "{} in flight, {} waiting, {} s timeout",
            a.max_concurrency,
            a.max_queue,
            a.queue_timeout.as_secs_f64()
        )
    });
    format!(
        "fleet: {}\nengine: kvgate engine's default model ({} slots, {} KV blocks of {} tokens) \
         times each speed\nrouting: {} scraping every {} ms, KV events {}, admission \
         {}\nworkload: {workload} (rates in {}), {} requests per rate; SLO: TTFT P95 <= {} ms, \
         under 1% failed\n",
        endpoints.join(", "),
        engine.max_num_seqs,
        engine.kv_blocks,
        engine.block_size,
        match fleet.routers {
            1 => "one gateway".to_string(),
            n => format!("{n} gateways"),
        },
        d.scrape_interval.as_millis_f64(),
        if d.kv_events { "on" } else { "off" },
        admission,
        family.rate_unit,
        family.requests,
        slo.ttft,
    )
}

/// What the rows are and what the simulation leaves out.
fn notes(d: &Deployment) -> Vec<String> {
    let mut notes = vec![
        "rows: the configured policy with its configured parameters first (\"configured\": true), \
         then each compared policy at its defaults (`kvgate policies`); --set POLICY.FIELD=V \
         changes every row of that policy, the configured one included."
            .to_string(),
        "engine: each endpoint is kvgate engine's default model (an ~8B model on one H100-class \
         GPU: 12 ms per step, ~8,300 prefill tokens/s) at its --speed (1 unless stated); the \
         routers weigh endpoints by their configured weight, not by the speed."
            .to_string(),
        "simulated as configured: endpoints (weights, tiers and tier spillover), the policy, the \
         scrape period, KV events (when every endpoint publishes them), the admission limits \
         and queue timeout. Not simulated: replica failures (so retries, hedging, breakers and \
         stream resumption never act), the admission queue's fair order, headroom and \
         max_prefills (it is first come, first served), tenancy, tokenizers (the sim's prompts \
         are token ids, matched exactly), TLS and the network."
            .to_string(),
    ];
    notes.extend(d.notes.iter().cloned());
    notes
}

#[cfg(test)]
mod tests;
