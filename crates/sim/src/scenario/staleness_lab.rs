//! The staleness lab (the reference article's §5.6, docs/background.md#staleness-lab): several
//! routers trust the same old snapshot and herd.
//!
//! The reference's abstract model, reproduced as is: 5 replicas, 4 routers, scrapes every 10
//! ticks, a fixed service time (every request stays outstanding for `service` = 20 ticks, whatever
//! the replica's load: the lab isolates the routing signal from engine effects). Each tick,
//! requests finish, routers whose scrape is due read every replica's outstanding count, then
//! the tick's arrivals (2 per tick by default, as the reference's first tick shows; `arrivals=
//! poisson` draws them instead) are dealt to the routers in turn and each router picks with its
//! own kvgate-core [`Routing`] (policy, ledger, random source) on the snapshot it last took.
//!
//! Measures, per tick after the dispatches: skew = max minus min true outstanding across
//! replicas (its maximum and mean over the run), and concentration = the share of ticks with
//! at least two arrivals in which all of them went to one replica.
//!
//! Variants: stale least-outstanding (`own_dispatch_correction = false`), plus own
//! dispatches (the default least_outstanding), P2C without correction, both (P2C with
//! correction), one router with own dispatches, stale least-outstanding scraping every tick, and
//! stale least-outstanding with staggered scrape phases. `--policy NAME` replaces the set with
//! the named policies at their defaults.

use super::table::{num, pct, Table};
use super::{policy_names, Error, Options, Params, Report};
use crate::model::TICK_NANOS;
use kvgate_core::router::accept_all;
use kvgate_core::{
    Decision, EndpointId, EndpointView, Nanos, Observation, PolicyConfig, Request, Routing,
};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use serde_json::json;
use std::collections::VecDeque;

/// One configuration the lab compares.
#[derive(Clone, Debug)]
struct Variant {
    name: String,
    policy: PolicyConfig,
    routers: usize,
    scrape: u64,
    staggered: bool,
}

impl Variant {
    fn new(name: &str, policy: PolicyConfig, routers: usize, scrape: u64, staggered: bool) -> Self {
        Variant {
            name: name.to_string(),
            policy,
            routers,
            scrape,
            staggered,
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Setup {
    replicas: usize,
    rate: f64,
    poisson: bool,
    service: u64,
    ticks: u64,
}

/// One variant's results.
#[derive(Clone, Debug, Serialize)]
struct StalenessResult {
    variant: String,
    policy: String,
    routers: usize,
    scrape_interval: u64,
    staggered: bool,
    max_skew: u32,
    mean_skew: f64,
    /// Mean absolute change of the skew from one tick to the next.
    oscillation: f64,
    concentration: f64,
    requests: u64,
    assigned: Vec<u64>,
    assignment_gap: u64,
    /// The lab has no engine, caches or tokens (a fixed service time isolates the routing
    /// signal), so these report keys are null rather than made-up values.
    ttft_p95: Option<f64>,
    slo_attainment: Option<f64>,
    cache_hit_ratio: Option<f64>,
    output_tokens_per_tick: Option<f64>,
}

fn poisson(rng: &mut ChaCha8Rng, mean: f64) -> u32 {
    // Knuth's product of uniforms; the lab's means are small.
    let limit = (-mean).exp();
    let mut k = 0;
    let mut p: f64 = rand::Rng::random(rng);
    while p > limit {
        k += 1;
        p *= rand::Rng::random::<f64>(rng);
    }
    k
}

/// One router per `v.routers`, each with its own random source and every replica.
fn routers(v: &Variant, s: Setup, seed: u64) -> Vec<Routing> {
    (0..v.routers.max(1))
        .map(|r| {
            let mut routing = Routing::new(&v.policy, seed ^ (0x0073_7461_6c65 + r as u64));
            for i in 0..s.replicas as u32 {
                routing.router_mut().add(EndpointView::new(EndpointId(i)));
            }
            routing
        })
        .collect()
}

/// Every router whose scrape falls on tick `t` (at its phase when staggered) takes a snapshot
/// of the true outstanding counts.
fn scrape(routers: &mut [Routing], v: &Variant, outstanding: &[u32], t: u64) {
    let m = routers.len() as u64;
    let interval = v.scrape.max(1);
    for (r, routing) in routers.iter_mut().enumerate() {
        let phase = if v.staggered {
            interval * r as u64 / m
        } else {
            0
        };
        if t % interval == phase {
            for (i, &running) in outstanding.iter().enumerate() {
                let observation = Observation {
                    running,
                    ..Observation::default()
                };
                routing.router_mut().observed(
                    EndpointId(i as u32),
                    observation,
                    Nanos(t * TICK_NANOS),
                );
            }
        }
    }
}

/// How many requests arrive in one tick.
fn arrivals(rng: &mut ChaCha8Rng, s: Setup) -> u32 {
    if s.poisson {
        poisson(rng, s.rate)
    } else {
        // `floor(rate)` arrivals, plus one with probability `frac(rate)`.
        let extra = rand::Rng::random::<f64>(rng) < s.rate.fract();
        s.rate.floor() as u32 + u32::from(extra)
    }
}

/// The reference's variants: stale and corrected least-outstanding, P2C, both, one router,
/// scraping every tick, and staggered scrapes.
fn reference_variants(
    p: &mut Params<'_>,
    routers: usize,
    scrape: u64,
    staggered: bool,
) -> Result<Vec<Variant>, Error> {
    let stale = [("load.own_dispatch_correction", json!(false))];
    let lo_stale = p.policy("least_outstanding", &stale)?;
    let lo_own = p.policy("least_outstanding", &[])?;
    let p2c = p.policy("power_of_two", &stale)?;
    let both = p.policy("power_of_two", &[])?;
    Ok(vec![
        Variant::new(
            "stale least-outstanding",
            lo_stale.clone(),
            routers,
            scrape,
            staggered,
        ),
        Variant::new(
            "+ own dispatches",
            lo_own.clone(),
            routers,
            scrape,
            staggered,
        ),
        Variant::new("P2C", p2c, routers, scrape, staggered),
        Variant::new("both", both, routers, scrape, staggered),
        Variant::new("1 router + own dispatches", lo_own, 1, scrape, staggered),
        Variant::new(
            "stale, scrape every tick",
            lo_stale.clone(),
            routers,
            1,
            staggered,
        ),
        Variant::new("stale, staggered phases", lo_stale, routers, scrape, true),
    ])
}

fn simulate(v: &Variant, s: Setup, seed: u64) -> StalenessResult {
    let tick = |t: u64| Nanos(t * TICK_NANOS);
    let mut arrivals_rng = ChaCha8Rng::seed_from_u64(seed);
    let mut routers = routers(v, s, seed);
    let m = routers.len() as u64;
    let mut outstanding = vec![0u32; s.replicas];
    let mut assigned = vec![0u64; s.replicas];
    // (finish tick, replica, router, request id), in finish order (fixed service time).
    let mut running: VecDeque<(u64, usize, usize, u64)> = VecDeque::new();
    let (mut max_skew, mut sum_skew, mut sum_delta) = (0u32, 0u64, 0u64);
    let (mut multi, mut concentrated) = (0u64, 0u64);
    let mut prev_skew: Option<u32> = None;
    let mut next_id = 0u64;
    let mut dealt = 0u64;
    for t in 0..s.ticks {
        while running.front().is_some_and(|f| f.0 <= t) {
            let (_, replica, router, id) = running.pop_front().expect("checked");
            outstanding[replica] -= 1;
            routers[router].completed(id, EndpointId(replica as u32), tick(t), tick(s.service), 1);
        }
        scrape(&mut routers, v, &outstanding, t);
        let n = arrivals(&mut arrivals_rng, s);
        let mut first_target = None;
        let mut all_same = true;
        for _ in 0..n {
            let r = (dealt % m) as usize;
            dealt += 1;
            let request = Request::from_text(next_id, "");
            let Decision::Route(route) = routers[r].route(&request, tick(t), &accept_all) else {
                continue;
            };
            let e = route.endpoint;
            let i = e.0 as usize;
            outstanding[i] += 1;
            assigned[i] += 1;
            running.push_back((t + s.service, i, r, next_id));
            next_id += 1;
            all_same &= first_target.is_none_or(|f| f == i);
            first_target = Some(i);
        }
        if n >= 2 {
            multi += 1;
            concentrated += u64::from(all_same);
        }
        let skew = outstanding.iter().max().unwrap_or(&0) - outstanding.iter().min().unwrap_or(&0);
        max_skew = max_skew.max(skew);
        sum_skew += u64::from(skew);
        if let Some(p) = prev_skew {
            sum_delta += u64::from(p.abs_diff(skew));
        }
        prev_skew = Some(skew);
    }
    let ticks = s.ticks.max(1) as f64;
    let round = |x: f64, d: i32| (x * 10f64.powi(d)).round() / 10f64.powi(d);
    StalenessResult {
        variant: v.name.clone(),
        policy: v.policy.name().to_string(),
        routers: v.routers,
        scrape_interval: v.scrape,
        staggered: v.staggered,
        max_skew,
        mean_skew: round(sum_skew as f64 / ticks, 3),
        oscillation: round(sum_delta as f64 / (ticks - 1.0).max(1.0), 3),
        concentration: round(concentrated as f64 / multi.max(1) as f64, 4),
        requests: next_id,
        assignment_gap: assigned.iter().max().unwrap_or(&0) - assigned.iter().min().unwrap_or(&0),
        assigned,
        ttft_p95: None,
        slo_attainment: None,
        cache_hit_ratio: None,
        output_tokens_per_tick: None,
    }
}

pub(super) fn run(options: &Options) -> Result<Report, Error> {
    let mut p = Params::new(&options.sets);
    let setup = Setup {
        replicas: p.u64("replicas", 5)?.max(1) as usize,
        rate: p.f64("rate", 2.0)?,
        poisson: p.choice("arrivals", "fixed", &["fixed", "poisson"])? == "poisson",
        service: p.u64("service", 20)?.max(1),
        ticks: p.u64("ticks", 2_000)?,
    };
    let routers = p.u64("routers", 4)?.max(1) as usize;
    let scrape = p.u64("scrape", 10)?.max(1);
    let staggered = p.bool("staggered", false)?;
    let variants = if options.policies.is_empty() {
        reference_variants(&mut p, routers, scrape, staggered)?
    } else {
        let mut v = Vec::new();
        for name in policy_names(options, &[]) {
            let config = p.policy(&name, &[])?;
            v.push(Variant::new(&name, config, routers, scrape, staggered));
        }
        v
    };
    let params = p.finish()?;
    let mut table = Table::new(&[
        "variant",
        "max skew",
        "mean skew",
        "oscillation",
        "concentration",
        "gap",
    ]);
    let mut results = Vec::new();
    for v in &variants {
        let r = simulate(v, setup, options.seed);
        table.row(vec![
            r.variant.clone(),
            r.max_skew.to_string(),
            num(r.mean_skew, 2),
            num(r.oscillation, 2),
            pct(r.concentration),
            r.assignment_gap.to_string(),
        ]);
        results.push(serde_json::to_value(&r).expect("serialises"));
    }
    Ok(Report {
        scenario: "staleness-lab".into(),
        seed: options.seed,
        params,
        results,
        notes: vec![
            "Skew = max - min true outstanding across replicas per tick; concentration = share \
             of ticks with 2+ arrivals that all went to one replica."
                .into(),
            "Reference (§5.6; 5 replicas, 4 routers, scrape every 10 ticks): stale 21 / 12.0 / \
             64%, + own dispatches 20 / 9.1 / 48%, P2C 9 / 5.2 / 21%, both 10 / 4.4 / 23%, one \
             router with own dispatches 3 / 1.44 / 6%, scrape every tick 87% concentration with \
             max skew 2 (max skew / mean skew / concentration)."
                .into(),
        ],
        table: table.render(),
    })
}
