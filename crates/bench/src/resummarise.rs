//! `--from-records FILE`: the reports of a records file (`--records`) rebuilt by the same
//! definitions, without sending a request. Scripts pick records (a window around a fault, the
//! displaced sessions' first turns, every rate of separate runs) and leave the percentiles, SLO
//! attainment and capacity to kvgate's one definition of each rather than computing their own.

use std::path::Path;

use crate::args::BenchArgs;
use crate::client::Record;
use crate::error::BenchError;
use crate::records::{self, Labelled};
use crate::report::{Slo, TargetReport};
use crate::{sweep, BenchOutcome};

/// Parses `FROM:TO` seconds (`FROM < TO`).
fn window(spec: &str) -> Result<[f64; 2], BenchError> {
    let bad = || BenchError::Config(format!("--window expects FROM:TO seconds, got {spec:?}"));
    let (a, b) = spec.split_once(':').ok_or_else(bad)?;
    let (a, b): (f64, f64) = (
        a.trim().parse().map_err(|_| bad())?,
        b.trim().parse().map_err(|_| bad())?,
    );
    if a < b {
        Ok([a, b])
    } else {
        Err(bad())
    }
}

/// The reports of `labelled` per target and offered rate (first-appearance order), restricted
/// to requests sent within `within` when given.
fn reports(labelled: &[Labelled], slo: &Slo, within: Option<[f64; 2]>) -> Vec<TargetReport> {
    let mut groups: Vec<(&str, Option<f64>, Vec<Record>)> = Vec::new();
    for (target, rate, record) in labelled {
        if within.is_some_and(|[lo, hi]| !(lo..hi).contains(&record.sent_s)) {
            continue;
        }
        let i = match groups.iter().position(|g| g.0 == target && g.1 == *rate) {
            Some(i) => i,
            None => {
                groups.push((target, *rate, Vec::new()));
                groups.len() - 1
            }
        };
        groups[i].2.push(record.clone());
    }
    groups
        .into_iter()
        .map(|(target, rate, records)| {
            let mut r = TargetReport::new(target, rate, &records, slo);
            r.window_s = within;
            r
        })
        .collect()
}

/// Summarises the records file `path` as `args` asks (SLO, capacity threshold, windows).
pub(crate) fn outcome(args: &BenchArgs, path: &Path) -> Result<BenchOutcome, BenchError> {
    let labelled = records::read(path)?;
    let slo = Slo {
        ttft_ms: args.slo_ttft_ms,
        tpot_ms: args.slo_tpot_ms,
    };
    let windows = args
        .windows
        .iter()
        .map(|w| window(w))
        .collect::<Result<Vec<_>, _>>()?;
    let (results, capacity) = if windows.is_empty() {
        let results = reports(&labelled, &slo, None);
        let capacity = sweep::capacity(&results, args.capacity_attainment);
        (results, capacity)
    } else {
        let results = windows
            .into_iter()
            .flat_map(|w| reports(&labelled, &slo, Some(w)))
            .collect();
        (results, Vec::new())
    };
    Ok(BenchOutcome {
        results,
        capacity,
        slo,
        model: args.model.clone().unwrap_or_default(),
        workload: path.display().to_string(),
        seed: args.seed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_parse_and_split_by_send_time() {
        assert_eq!(window("1.5:3").unwrap(), [1.5, 3.0]);
        for bad in ["3:1", "1", "a:b", "2:2"] {
            assert!(window(bad).is_err(), "{bad}");
        }
        let rec = |sent_s: f64, ttft: f64| Record {
            sent_s,
            ttft_ms: Some(ttft),
            e2e_ms: ttft,
            ..Record::default()
        };
        let labelled: Vec<Labelled> = [(0.5, 10.0), (1.5, 20.0), (2.5, 30.0)]
            .into_iter()
            .map(|(s, t)| ("a".to_owned(), Some(2.0), rec(s, t)))
            .chain([("b".to_owned(), Some(2.0), rec(0.1, 5.0))])
            .collect();
        let all = reports(&labelled, &Slo::default(), None);
        assert_eq!((all.len(), all[0].requests, all[1].requests), (2, 3, 1));
        let late = reports(&labelled, &Slo::default(), Some([1.0, 3.0]));
        assert_eq!(late.len(), 1, "b sent nothing in the window");
        assert_eq!((late[0].requests, late[0].ttft_ms.p50), (2, 25.0));
        assert_eq!(late[0].window_s, Some([1.0, 3.0]));
    }
}
