//! Capacity planning (docs/background.md#open-loop-evaluation-and-capacity): sweep the open-loop
//! arrival rate, and report for each policy the largest rate whose TTFT P95 stays within the SLO:
//! its capacity ([`kvgate_core::stats::capacity`]; `null`, with the lowest rate tried beside it,
//! when no rate passes).
//!
//! The fleet and workload are the routing lab's ([`super::routing_lab`]); every `--set` of the
//! lab applies. `rates` is a comma-separated list (default 0.10 to 0.30 per tick in steps of
//! 0.025); `requests` defaults to 1,000 per point. Each point reports goodput (requests meeting
//! the TTFT SLO per tick), TTFT P95 and SLO attainment.

use super::metrics::{summarise, PolicyResult, Window};
use super::routing_lab::{Lab, DEFAULT_POLICIES};
use super::table::{num, Table};
use super::{par_map, policy_names, Error, Options, Params, Report};
use kvgate_core::stats::capacity;
use serde::Serialize;
use serde_json::Value;

#[derive(Clone, Debug, Serialize)]
struct Point {
    rate: f64,
    goodput: f64,
    ttft_p95: f64,
    slo_attainment: f64,
    output_tokens_per_tick: f64,
}

#[derive(Clone, Debug, Serialize)]
struct SweepResult {
    policy: String,
    /// Largest swept rate with TTFT P95 within the SLO; null when none is.
    capacity: Option<f64>,
    /// The lowest rate swept, when no rate passed (the capacity is below it).
    #[serde(skip_serializing_if = "Option::is_none")]
    lowest_rate_tried: Option<f64>,
    /// The result at the capacity point (or the lowest rate when none meets the SLO).
    #[serde(flatten)]
    at_capacity: PolicyResult,
    points: Vec<Point>,
}

fn parse_rates(raw: Option<&String>) -> Result<Vec<f64>, Error> {
    let Some(raw) = raw else {
        return Ok((0..9).map(|i| 0.1 + 0.025 * f64::from(i)).collect());
    };
    let rates: Result<Vec<f64>, _> = raw.split(',').map(|s| s.trim().parse::<f64>()).collect();
    match rates {
        Ok(r) if !r.is_empty() && r.iter().all(|x| x.is_finite() && *x > 0.0) => Ok(r),
        _ => Err(Error::BadSetting {
            key: "rates".into(),
            why: format!("{raw:?} is not a comma-separated list of positive rates"),
        }),
    }
}

/// One policy's table row and result from its runs at each of `rates`, in order: its capacity
/// is the highest rate whose TTFT P95 meets `slo_ttft`.
fn policy_result(
    name: String,
    rates: &[f64],
    runs: &mut impl Iterator<Item = PolicyResult>,
    slo_ttft: f64,
) -> (Vec<String>, Value) {
    let mut points = Vec::new();
    let mut summaries = Vec::new();
    for &rate in rates {
        let r = runs.next().expect("one result per job");
        points.push(Point {
            rate,
            goodput: r.goodput,
            ttft_p95: r.ttft_p95,
            slo_attainment: r.slo_attainment,
            output_tokens_per_tick: r.output_tokens_per_tick,
        });
        summaries.push(r);
    }
    let passed = |pt: &Point| pt.ttft_p95 <= slo_ttft;
    let cap = capacity(points.iter().map(|pt| (pt.rate, passed(pt))));
    let best = points
        .iter()
        .rposition(|pt| Some(pt.rate) == cap.capacity && passed(pt));
    let mut row = vec![name.clone(), cap.capacity.map_or("-".into(), |c| num(c, 3))];
    row.extend(points.iter().map(|pt| {
        format!(
            "{}{}",
            num(pt.goodput, 3),
            if passed(pt) { "" } else { "*" }
        )
    }));
    let at_capacity = summaries.swap_remove(best.unwrap_or(0));
    let result = serde_json::to_value(SweepResult {
        policy: name,
        capacity: cap.capacity,
        lowest_rate_tried: cap
            .capacity
            .is_none()
            .then_some(cap.lowest_rate_tried)
            .flatten(),
        at_capacity,
        points,
    })
    .expect("serialises");
    (row, result)
}

pub(super) fn run(options: &Options) -> Result<Report, Error> {
    let rates = parse_rates(options.sets.get("rates"))?;
    let mut sets = options.sets.clone();
    sets.remove("rates");
    let mut p = Params::new(&sets);
    let mut lab = Lab::read(&mut p, 0.2)?;
    if !sets.contains_key("requests") {
        lab.workload.requests = 1_000;
    }
    let names = policy_names(options, &DEFAULT_POLICIES);
    let mut configs = Vec::new();
    for name in &names {
        configs.push((name.clone(), lab.policy(&mut p, name)?));
    }
    let mut params = p.finish()?;
    params.remove("rate");
    params.insert("rates".into(), serde_json::json!(rates));
    params.insert("requests".into(), serde_json::json!(lab.workload.requests));
    let mut header = vec!["policy".to_string(), "capacity".to_string()];
    header.extend(rates.iter().map(|r| format!("@{r:.3}")));
    let header_refs: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut table = Table::new(&header_refs);
    let mut results: Vec<Value> = Vec::new();
    let jobs: Vec<(usize, f64)> = (0..configs.len())
        .flat_map(|c| rates.iter().map(move |&r| (c, r)))
        .collect();
    let mut all = par_map(&jobs, |&(c, rate)| {
        let (name, config) = &configs[c];
        let mut l = lab.clone();
        l.workload.arrivals.rate = rate;
        let outcome = l.run(config.clone(), options.seed);
        summarise(name, None, &outcome, l.slo, Window::Arrivals)
    })
    .into_iter();
    for (name, _) in configs.iter() {
        let (row, result) = policy_result(name.clone(), &rates, &mut all, lab.slo.ttft);
        table.row(row);
        results.push(result);
    }
    Ok(Report {
        scenario: "sweep".into(),
        seed: options.seed,
        params,
        results,
        notes: vec![
            "Cells: goodput (requests meeting the TTFT SLO per tick) at each arrival rate; * marks \
             a TTFT P95 above the SLO. Capacity: the largest rate without a *."
                .into(),
        ],
        table: table.render(),
    })
}
