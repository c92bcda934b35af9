//! Capacity over a rate sweep: the highest offered rate at which the target still met its SLO
//! (the capacity-planning question "how much load can this fleet take at this SLO", as
//! DistServe and vLLM's goodput sweeps ask it). It is the highest passing rate, not the last one
//! before the first miss, so one noisy step below the knee (a cold cache on the sweep's first
//! rate) does not hide a higher passing rate; the rates below it that missed are listed beside
//! it instead. Which runs pass (attainment at or above a share, or TTFT P95 within a bound) is
//! the caller's test.

use serde::Serialize;

/// A sweep's capacity and what bounds it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Capacity {
    /// The highest passing rate; `None` when no rate passed (the capacity is below
    /// `lowest_rate_tried`, not 0).
    pub capacity: Option<f64>,
    /// The lowest rate the sweep ran; `None` for an empty sweep.
    pub lowest_rate_tried: Option<f64>,
    /// The highest rate the sweep ran; `None` for an empty sweep.
    pub highest_rate_tried: Option<f64>,
    /// Whether the highest rate passed: the capacity is at least that, perhaps more.
    pub saturated: bool,
    /// Rates below `capacity` that failed, ascending and without repeats.
    pub missed_below: Vec<f64>,
}

/// The capacity of a sweep given as `(rate, passed)` in any order (a rate may repeat, as
/// across rounds; it passes if any of its runs did).
pub fn capacity(points: impl IntoIterator<Item = (f64, bool)>) -> Capacity {
    let points: Vec<(f64, bool)> = points.into_iter().collect();
    let rates = || points.iter().map(|p| p.0);
    let lowest = rates().min_by(f64::total_cmp);
    let highest = rates().max_by(f64::total_cmp);
    let best = points
        .iter()
        .filter(|p| p.1)
        .map(|p| p.0)
        .max_by(f64::total_cmp);
    let mut missed: Vec<f64> = match best {
        Some(best) => points
            .iter()
            .filter(|p| !p.1 && p.0 < best)
            .map(|p| p.0)
            .collect(),
        None => Vec::new(),
    };
    missed.sort_by(f64::total_cmp);
    missed.dedup();
    Capacity {
        capacity: best,
        lowest_rate_tried: lowest,
        highest_rate_tried: highest,
        saturated: best.is_some() && best == highest,
        missed_below: missed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn highest_passing_rate_with_the_misses_below_it() {
        // A cold start missing the first rate, then passing up to 35, then the knee.
        let c = capacity([
            (25.0, false),
            (30.0, true),
            (32.0, false),
            (35.0, true),
            (40.0, false),
        ]);
        assert_eq!(c.capacity, Some(35.0));
        assert_eq!(c.missed_below, vec![25.0, 32.0]);
        assert_eq!(
            (c.lowest_rate_tried, c.highest_rate_tried),
            (Some(25.0), Some(40.0))
        );
        assert!(!c.saturated);
        assert!(capacity([(1.0, true), (2.0, true)]).saturated);
    }

    #[test]
    fn never_reached_is_null_with_the_lowest_rate() {
        let c = capacity([(10.0, false), (5.0, false)]);
        assert_eq!(c.capacity, None);
        assert_eq!(c.lowest_rate_tried, Some(5.0));
        assert!(c.missed_below.is_empty() && !c.saturated);
        let json = serde_json::to_value(&c).unwrap();
        assert!(json["capacity"].is_null());
        assert_eq!(json["lowest_rate_tried"], 5.0);
        assert_eq!(capacity([]), Capacity::default());
    }

    proptest! {
        #[test]
        fn never_above_the_highest_rate_tried(
            points in proptest::collection::vec((0.1f64..100.0, any::<bool>()), 0..30),
        ) {
            let c = capacity(points.iter().copied());
            if let Some(cap) = c.capacity {
                prop_assert!(cap <= c.highest_rate_tried.unwrap());
                prop_assert!(cap >= c.lowest_rate_tried.unwrap());
                prop_assert!(points.contains(&(cap, true)));
                prop_assert!(c.missed_below.iter().all(|&m| m < cap));
            } else {
                prop_assert!(points.iter().all(|p| !p.1));
            }
        }
    }
}
