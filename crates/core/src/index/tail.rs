//! How many tokens the engine computes for each uncached token a text-keyed index predicts.
//!
//! A text-keyed index reads tokens off bytes in proportion to the whole prompt's count, so the
//! uncached tail is counted at the prompt's average bytes per token, and a tail of another kind
//! of text (a new turn's chat-template tokens, which have no text, a short question after a
//! long system prompt, code after prose) is miscounted by the same share every time. On two
//! real vLLM engines serving the multi-turn chats of `scripts/real-vllm-ttft-prediction.sh`,
//! the engines computed a median 1.25x the uncached tokens the index predicted: 19 tokens more
//! on tails predicted under 40 tokens, 60 on tails of 175-530. Uncorrected, the index read
//! most hits as holding more than the engine reported and, taking that for an eviction, forgot
//! what the endpoint had been sent before; 8-11% of those runs' predictions then fell short by
//! more than a block.
//!
//! The scale is the running median of the engine's count over the prediction, on a log scale:
//! each report moves it a fixed step towards its side. A median, not a mean, because an
//! eviction or a restart makes one request's tail the whole prompt, many times the prediction,
//! and that says nothing about how the next tail is counted; up to half the reports can be
//! such misses without moving it. Token-keyed and block indexes count exactly and keep it at 1.

/// Engine uncached tokens per predicted one (see the module documentation), as a whole number
/// of log-scale steps so that the overlaps and predictions that carry it stay comparable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TailScale {
    steps: i32,
}

impl TailScale {
    /// Log-scale step per report: 1%, so a steady 25% is learned in about 25 reports and one
    /// report moves a prediction by 1%.
    const STEP: f64 = 0.01;

    /// The scale stays within a factor of two either way (e^0.69): past that the index, not
    /// the count, is wrong.
    const LIMIT: i32 = 69;

    /// The current scale.
    pub fn scale(&self) -> f64 {
        (f64::from(self.steps) * Self::STEP).exp()
    }

    /// Of a prompt of `prompt` tokens, the `cached` an index read off its units, with the
    /// uncached rest counted as the engine will count it. Nothing cached stays nothing: the
    /// engine then computes the prompt's own count.
    pub fn cached(&self, cached: u32, prompt: u32) -> u32 {
        if self.steps == 0 || cached == 0 {
            return cached;
        }
        let rest = (f64::from(prompt.saturating_sub(cached)) * self.scale()).round();
        prompt.saturating_sub(rest.min(f64::from(prompt)) as u32)
    }

    /// One report: the engine computed `reported` uncached tokens where the index predicted
    /// `predicted`.
    pub fn learn(&mut self, reported: u32, predicted: u32) {
        let r = (f64::from(reported.max(1)) / f64::from(predicted.max(1))).ln();
        let at = f64::from(self.steps) * Self::STEP;
        let step = if r > at {
            1
        } else if r < at {
            -1
        } else {
            0
        };
        self.steps = (self.steps + step).clamp(-Self::LIMIT, Self::LIMIT);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learns_a_steady_miscount_and_ignores_misses() {
        let mut s = TailScale::default();
        for k in 0..400u32 {
            let predicted = 40 + (k % 9) * 30;
            // Every fourth report is a miss: the whole 3,000-token prompt was computed.
            let reported = if k % 4 == 0 { 3_000 } else { predicted * 5 / 4 };
            s.learn(reported, predicted);
        }
        assert!((s.scale() / 1.25 - 1.0).abs() < 0.02, "{}", s.scale());
        // 2,900 read as cached of 3,000: the engine computes about 125.
        assert!((2_873..=2_877).contains(&s.cached(2_900, 3_000)));
        assert_eq!(s.cached(0, 3_000), 0, "a miss stays a miss");
    }

    #[test]
    fn exact_counts_keep_it_at_one() {
        let mut s = TailScale::default();
        for k in 0..100u32 {
            s.learn(10 + k, 10 + k);
        }
        assert_eq!(s, TailScale::default());
        assert_eq!(s.cached(1_234, 2_000), 1_234);
    }
}
