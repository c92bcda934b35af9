//! The workload families the capacity sweeps run ([`super::capacity`]), each read from its
//! `--set` keys: parallel fan-out bursts (`fanout`), agentic sessions (`heterogeneous`, `tenants`,
//! `replica-loss`, `mix`, and a configuration's default), and open-loop requests with or without
//! shared prefixes (`shared-prefix`, `random`). The failure-mode sweeps and `kvgate sim --config`
//! read them alike.

use super::capacity::Experiment;
use super::metrics::Slo;
use super::{Error, Params};
use crate::dist::{Arrivals, Lengths};
use crate::fleet::{FleetConfig, Outcome};
use crate::workload::{
    Agentic, AgenticConfig, Bursts, BurstsConfig, OpenLoop, OpenLoopConfig, PrefixGroups, Warmed,
    Workload,
};
use kvgate_core::Nanos;
use serde_json::Value;
use std::collections::BTreeMap;

/// A workload at any open-loop rate, and what a sweep needs to know of it.
pub(super) struct Family {
    /// The workload at a rate (in `rate_unit`).
    pub make: Box<dyn Fn(f64) -> Box<dyn Workload> + Sync>,
    /// Requests it issues, measured.
    pub requests: u64,
    /// Seconds of unmeasured warm-up arrivals before them.
    pub warmup_secs: f64,
    /// Requests per unit of rate (a session's turns, a burst's calls).
    pub per_unit: f64,
    /// What one unit of rate is.
    pub rate_unit: &'static str,
}

/// Extra numbers of one run (a [`Experiment`]'s `extra`).
pub(super) type Extra = dyn Fn(&Outcome) -> BTreeMap<String, Value> + Sync;

impl Family {
    /// The capacity sweep `name` of this workload on `fleet` at `rates`.
    pub(super) fn experiment<'a>(
        &'a self,
        name: &'static str,
        fleet: FleetConfig,
        slo: Slo,
        rates: Vec<f64>,
        extra: &'a Extra,
    ) -> Experiment<'a> {
        Experiment {
            name,
            fleet,
            slo,
            workload: &*self.make,
            rates,
            requests: self.requests,
            warmup_secs: self.warmup_secs,
            per_unit: self.per_unit,
            rate_unit: self.rate_unit,
            extra,
        }
    }
}

/// No extra numbers.
pub(super) fn no_extra(_: &Outcome) -> BTreeMap<String, Value> {
    BTreeMap::new()
}

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

/// `rates=` (a comma list, sorted), else `default`.
pub(super) fn rates(p: &mut Params<'_>, default: &[f64]) -> Result<Vec<f64>, Error> {
    let mut r = p.list_f64("rates", default)?;
    r.sort_by(f64::total_cmp);
    Ok(r)
}

/// Parallel bursts of a few shared prompts ([`BurstsConfig`]'s defaults, changed by `requests`,
/// `prompts`, `prompt_tokens`, `fanout`, `context_tokens` and `task_tokens`), in bursts/s.
pub(super) fn bursts(p: &mut Params<'_>) -> Result<Family, Error> {
    let base = BurstsConfig::default();
    let lengths = |p: &mut Params<'_>, key: &str, base: Lengths| {
        p.f64(key, base.mean).map(|mean| base.with_mean(mean))
    };
    let bursts = BurstsConfig {
        requests: p.u64("requests", base.requests)?,
        prompts: p.u64("prompts", u64::from(base.prompts))? as u32,
        prompt_tokens: p.u64("prompt_tokens", u64::from(base.prompt_tokens))? as u32,
        fanout: p.u64("fanout", u64::from(base.fanout))? as u32,
        context: lengths(p, "context_tokens", base.context)?,
        task: lengths(p, "task_tokens", base.task)?,
        ..base
    };
    Ok(Family {
        make: Box::new(move |rate| Box::new(Bursts::new(BurstsConfig { rate, ..bursts }))),
        requests: bursts.requests,
        warmup_secs: 0.0,
        per_unit: f64::from(bursts.fanout.max(1)),
        rate_unit: "bursts/s",
    })
}

/// Agentic sessions: `base`, changed by `requests`, `tenants`, `system_tokens`, `turns`,
/// `think_time_s`, `fanout_prob`, `fanout` and `max_context`.
pub(super) fn agentic(p: &mut Params<'_>, base: AgenticConfig) -> Result<AgenticConfig, Error> {
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

/// `workload` as a family, in sessions/s.
pub(super) fn sessions(workload: AgenticConfig) -> Family {
    Family {
        make: Box::new(move |rate| {
            Box::new(Agentic::new(AgenticConfig {
                session_rate: rate,
                ..workload
            }))
        }),
        requests: workload.requests,
        warmup_secs: 0.0,
        per_unit: workload.turns * (1.0 + workload.fanout_prob * f64::from(workload.fanout)),
        rate_unit: "sessions/s",
    }
}

/// The prompt lengths, output lengths and shared-prefix groups of `shared-prefix` (when
/// `shared`) or `random`.
fn open_loop_shape(
    p: &mut Params<'_>,
    shared: bool,
) -> Result<(Lengths, Lengths, Option<PrefixGroups>), Error> {
    // The gateway bench's shapes (scripts/routing-bench.sh): 32 prefixes of 2,048 tokens
    // before a 128-token question and 256 tokens out; or 1,024 tokens in and 128 out,
    // each spread +-50% (a lognormal of the same mean and spread, clamped to it).
    let spread = |mean: f64| Lengths {
        mean,
        cv: 0.29,
        min: (mean * 0.5) as u32,
        max: (mean * 1.5) as u32,
    };
    Ok(if shared {
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
    })
}

/// Open-loop requests, with shared prefixes (`shared`) or none, in req/s: Poisson arrivals (or
/// burstier, `burstiness`), after `warmup_requests` unmeasured ones at `warmup_rate`
/// (`lowest_rate` by default) on the same prompts.
pub(super) fn open_loop(
    p: &mut Params<'_>,
    shared: bool,
    lowest_rate: f64,
) -> Result<Family, Error> {
    let (prompt, output, groups) = open_loop_shape(p, shared)?;
    let burstiness = p.positive_f64("burstiness", 1.0)?;
    let requests = p.u64("requests", 6_000)?;
    let warmup_requests = p.u64("warmup_requests", 0)?;
    let warmup_rate = p.positive_f64("warmup_rate", lowest_rate)?;
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
    Ok(Family {
        make: Box::new(make),
        requests,
        warmup_secs: warmup_requests as f64 / warmup_rate,
        per_unit: 1.0,
        rate_unit: "req/s",
    })
}
