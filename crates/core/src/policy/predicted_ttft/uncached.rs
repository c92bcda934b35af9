//! How many tokens the engine computes for each uncached token the index predicts.
//!
//! A text-keyed index reads tokens off bytes in proportion to the whole prompt's count, so the
//! uncached tail is counted at the prompt's average bytes per token, and a tail of another kind
//! of text (a short question after a long system prompt, code after prose) is miscounted by
//! the same share every time. On two real vLLM engines serving the multi-turn chats of
//! `scripts/real-vllm-ttft-prediction.sh`, the engines computed a median 1.25x the uncached
//! tokens the index predicted, the predictions were late by that share of their prefill, and
//! a fit that learned from the engine's counts could not correct them.
//!
//! The scale is the running median of the engine's count over the prediction, on a log scale:
//! each report moves it a fixed step towards its side. A median, not a mean, because an
//! eviction or a restart makes one request's tail the whole prompt, many times the prediction,
//! and that says nothing about how the next tail is counted; up to half the reports can be
//! such misses without moving it. With token keys and no misses it stays at 1.

/// Engine uncached tokens per predicted one (see the module documentation): the log of the
/// running median.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct UncachedScale {
    log: f64,
}

impl UncachedScale {
    /// Log-scale step per report: 1%, so a steady 25% is learned in about 25 reports and one
    /// report moves a prediction by 1%.
    const STEP: f64 = 0.01;

    /// The scale stays within a factor of two either way: past that the index, not the
    /// count, is wrong.
    const LIMIT: f64 = std::f64::consts::LN_2;

    /// `predicted` uncached tokens as the engine will count them.
    pub(super) fn apply(&self, predicted: f64) -> f64 {
        (predicted * self.log.exp()).max(1.0)
    }

    /// One report: the engine computed `reported` uncached tokens where the index predicted
    /// `predicted`.
    pub(super) fn learn(&mut self, reported: f64, predicted: f64) {
        let r = (reported.max(1.0) / predicted.max(1.0)).ln();
        let step = if r > self.log {
            Self::STEP
        } else if r < self.log {
            -Self::STEP
        } else {
            0.0
        };
        self.log = (self.log + step).clamp(-Self::LIMIT, Self::LIMIT);
    }

    /// The current scale.
    #[cfg(test)]
    pub(super) fn scale(&self) -> f64 {
        self.log.exp()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learns_a_steady_miscount_and_ignores_misses() {
        let mut s = UncachedScale::default();
        for k in 0..400u64 {
            let predicted = 40.0 + (k % 9) as f64 * 30.0;
            // Every fourth report is a miss: the whole 3,000-token prompt was computed.
            let reported = if k % 4 == 0 {
                3_000.0
            } else {
                predicted * 1.25
            };
            s.learn(reported, predicted);
        }
        assert!((s.scale() / 1.25 - 1.0).abs() < 0.02, "{}", s.scale());
        assert!((s.apply(100.0) - 125.0).abs() < 3.0);
    }

    #[test]
    fn exact_counts_keep_it_at_one() {
        let mut s = UncachedScale::default();
        for k in 0..100u64 {
            let n = 10.0 + k as f64;
            s.learn(n, n);
        }
        assert_eq!(s.scale(), 1.0);
    }
}
