//! A service-level objective on TTFT and TPOT, its attainment and goodput, as vLLM's
//! `benchmark_serving.py` defines goodput (`--goodput ttft:MS tpot:MS`, DistServe's
//! definition): a request is *good* when it succeeded and each latency it has a bound for is
//! within that bound; attainment is good requests over issued requests (so failures count
//! against it), goodput is good requests per second.

/// Bounds on one request's latencies, in whatever unit the caller measures them (the bench uses
/// milliseconds, the simulator ticks). An unset bound always holds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Slo {
    /// Largest acceptable time to first token.
    pub ttft: Option<f64>,
    /// Largest acceptable time per output token after the first.
    pub tpot: Option<f64>,
}

impl Slo {
    /// Whether a successful request with this TTFT and TPOT meets the objective. A TTFT bound
    /// fails a request that has no first token; TPOT is undefined for a single output token,
    /// so a missing TPOT meets any bound.
    pub fn met(&self, ttft: Option<f64>, tpot: Option<f64>) -> bool {
        let ttft_ok = match (self.ttft, ttft) {
            (None, _) => true,
            (Some(limit), Some(t)) => t <= limit,
            (Some(_), None) => false,
        };
        let tpot_ok = match (self.tpot, tpot) {
            (Some(limit), Some(t)) => t <= limit,
            _ => true,
        };
        ttft_ok && tpot_ok
    }
}

/// Requests that met an SLO out of those issued.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Attainment {
    /// Requests that succeeded and met the SLO.
    pub met: u64,
    /// Requests issued, failed ones included.
    pub issued: u64,
}

impl Attainment {
    /// Counts one issued request, good or not.
    pub fn add(&mut self, good: bool) {
        self.issued += 1;
        self.met += u64::from(good);
    }

    /// Good over issued requests; `None` when none was issued.
    pub fn share(&self) -> Option<f64> {
        (self.issued > 0).then(|| self.met as f64 / self.issued as f64)
    }

    /// Good requests per unit of `span` (seconds, ticks); `None` over an empty span.
    pub fn goodput(&self, span: f64) -> Option<f64> {
        (span > 0.0).then(|| self.met as f64 / span)
    }

    /// Whether the share reaches `target` (a sweep's pass mark); no requests never passes.
    pub fn meets(&self, target: f64) -> bool {
        self.share().is_some_and(|s| s >= target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_bound_holds_or_fails_alone() {
        let slo = Slo {
            ttft: Some(50.0),
            tpot: Some(10.0),
        };
        assert!(slo.met(Some(50.0), Some(10.0)));
        assert!(!slo.met(Some(60.0), Some(1.0)));
        assert!(!slo.met(Some(1.0), Some(21.0)));
        assert!(slo.met(Some(1.0), None), "one output token: TPOT undefined");
        assert!(!slo.met(None, None), "no first token under a TTFT bound");
        assert!(Slo::default().met(None, None));
    }

    #[test]
    fn attainment_counts_failures_and_nothing_is_null() {
        let mut a = Attainment::default();
        assert_eq!((a.share(), a.goodput(1.0)), (None, Some(0.0)));
        assert!(!a.meets(0.0));
        for good in [true, true, false, false, true] {
            a.add(good);
        }
        assert_eq!(a.share(), Some(0.6));
        assert_eq!(a.goodput(2.0), Some(1.5));
        assert_eq!(a.goodput(0.0), None);
        assert!(a.meets(0.6) && !a.meets(0.61));
    }
}
