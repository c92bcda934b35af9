//! Judging a scorer on labelled data as RouteLLM's `evals/evaluate.py` does, so figures are
//! comparable with the paper's.
//!
//! Each row has a score and whether the weak and the strong model answered it correctly.
//! - The curve: thresholds at the score quantiles `0, 1/b, ..., 1` (pandas `qcut` bin edges,
//!   `b = 10`); at each, the rows scoring `>= t` (`> t` at the last edge) go strong; a point is
//!   (strong share in %, accuracy in %). Points are sorted by strong share.
//! - `AUC = trapz(accuracy, strong% / 100)`.
//! - `APGR = (AUC - weak_auc) / (strong_auc - weak_auc)`, where `weak_auc` (`strong_auc`) is
//!   the trapezoid integral of the weak (strong) model's constant accuracy over the same
//!   strong shares: the share of the quality gap recovered on average, 0 for a router no better
//!   than weak-only, about 0.5 for random routing.
//! - `CPT(x%)`: the strong share at which accuracy reaches `weak + x (strong - weak)`, linearly
//!   interpolated on the curve (`np.interp(target, accuracy, strong%)`, read at the first
//!   point the curve reaches the target): the cost of recovering `x` of the gap.

use super::DifficultyError;
use crate::stats::percentile;

/// One labelled, scored row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Row {
    /// The scorer's P(strong needed).
    pub score: f64,
    /// The weak model answered correctly.
    pub weak: bool,
    /// The strong model answered correctly.
    pub strong: bool,
}

/// A point of the curve, both in percent.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    /// Requests sent strong.
    pub strong_pct: f64,
    /// Correct answers.
    pub accuracy: f64,
}

/// A scorer's figures on some rows.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// The curve, by strong share.
    pub curve: Vec<Point>,
    /// Weak-only accuracy, %.
    pub weak_accuracy: f64,
    /// Strong-only accuracy, %.
    pub strong_accuracy: f64,
    /// Area under the curve.
    pub auc: f64,
    /// Average performance gap recovered; `None` when the models are equally accurate.
    pub apgr: Option<f64>,
    /// Strong share (%) to recover 50% of the gap; `None` when the curve never reaches it.
    pub cpt50: Option<f64>,
}

fn pct(hits: usize, n: usize) -> f64 {
    100.0 * hits as f64 / n as f64
}

fn trapz(points: &[Point], y: impl Fn(&Point) -> f64) -> f64 {
    points
        .windows(2)
        .map(|w| (w[1].strong_pct - w[0].strong_pct) / 100.0 * (y(&w[0]) + y(&w[1])) / 2.0)
        .sum()
}

/// The curve and its figures over `rows` with `bins` quantile bins.
pub fn evaluate(rows: &[Row], bins: usize) -> Result<Report, DifficultyError> {
    if rows.is_empty() {
        return Err(DifficultyError::Empty("rows"));
    }
    if bins == 0 {
        return Err(DifficultyError::Zero("bins"));
    }
    let mut sorted: Vec<f64> = rows.iter().map(|r| r.score).collect();
    sorted.sort_by(f64::total_cmp);
    let n = rows.len();
    let mut curve: Vec<Point> = (0..=bins)
        .map(|i| {
            let t = percentile(&sorted, i as f64 / bins as f64).unwrap_or(0.0);
            let strong = |r: &Row| if i == bins { r.score > t } else { r.score >= t };
            let sent = rows.iter().filter(|r| strong(r)).count();
            let right = rows
                .iter()
                .filter(|r| if strong(r) { r.strong } else { r.weak })
                .count();
            Point {
                strong_pct: pct(sent, n),
                accuracy: pct(right, n),
            }
        })
        .collect();
    curve.sort_by(|a, b| a.strong_pct.total_cmp(&b.strong_pct));
    let weak_accuracy = pct(rows.iter().filter(|r| r.weak).count(), n);
    let strong_accuracy = pct(rows.iter().filter(|r| r.strong).count(), n);
    Ok(figures(curve, weak_accuracy, strong_accuracy))
}

/// The figures of a curve (also of an averaged one, as RouteLLM averages random routing).
pub fn figures(curve: Vec<Point>, weak_accuracy: f64, strong_accuracy: f64) -> Report {
    let auc = trapz(&curve, |p| p.accuracy);
    let weak_auc = trapz(&curve, |_| weak_accuracy);
    let strong_auc = trapz(&curve, |_| strong_accuracy);
    let gap = strong_auc - weak_auc;
    let apgr = (gap.abs() > f64::EPSILON).then(|| (auc - weak_auc) / gap);
    let cpt50 = cpt(
        &curve,
        weak_accuracy + 0.5 * (strong_accuracy - weak_accuracy),
    );
    Report {
        curve,
        weak_accuracy,
        strong_accuracy,
        auc,
        apgr,
        cpt50,
    }
}

/// The strong share at which the curve first reaches `target` accuracy.
fn cpt(curve: &[Point], target: f64) -> Option<f64> {
    let first = curve.first()?;
    if first.accuracy >= target {
        return Some(first.strong_pct);
    }
    curve.windows(2).find_map(|w| {
        let (a, b) = (w[0], w[1]);
        (b.accuracy >= target).then(|| {
            let f = (target - a.accuracy) / (b.accuracy - a.accuracy);
            a.strong_pct + f * (b.strong_pct - a.strong_pct)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(n: usize, oracle: bool) -> Vec<Row> {
        // Weak right on even rows, strong right on all; an oracle scores the weak misses high.
        (0..n)
            .map(|i| Row {
                score: if oracle {
                    (if i % 2 == 0 { 0.1 } else { 0.9 }) + i as f64 * 1e-6
                } else {
                    i as f64
                },
                weak: i % 2 == 0,
                strong: true,
            })
            .collect()
    }

    #[test]
    fn an_oracle_recovers_the_gap_at_the_least_cost() {
        let r = evaluate(&rows(1000, true), 10).unwrap();
        assert_eq!((r.weak_accuracy, r.strong_accuracy), (50.0, 100.0));
        assert!(r.apgr.unwrap() > 0.7, "{r:?}");
        // Half the gap (75%) needs a quarter of the requests strong.
        assert!((r.cpt50.unwrap() - 25.0).abs() < 1.0, "{r:?}");
        let first = r.curve.first().unwrap();
        let last = r.curve.last().unwrap();
        assert_eq!((first.strong_pct, last.strong_pct), (0.0, 100.0));
    }

    #[test]
    fn a_blind_scorer_recovers_about_half() {
        let r = evaluate(&rows(1000, false), 10).unwrap();
        assert!((r.apgr.unwrap() - 0.5).abs() < 0.02, "{r:?}");
        assert!((r.cpt50.unwrap() - 50.0).abs() < 2.0, "{r:?}");
        assert!(evaluate(&[], 10).is_err());
        let same = [Row {
            score: 0.5,
            weak: true,
            strong: true,
        }];
        assert_eq!(evaluate(&same, 10).unwrap().apgr, None);
    }
}
