//! Turning a target strong share into a threshold, once (RouteLLM's calibration) and online.
//!
//! RouteLLM's `calibrate_threshold` sets the threshold to the `1 - p` quantile of the router's
//! scores on representative prompts (numpy's linear interpolation), and sends a request to the
//! strong model iff its score is at least the threshold, so about a share `p` goes strong.
//!
//! Offline calibration drifts with the traffic: a new client whose prompts all score high
//! sends most of them strong. [`ShareController`] recalibrates on the last `window` scores and
//! corrects what the quantile cannot see (escalations a cascade adds, denials that hold some
//! back) with a bounded integral term on the realised share:
//! `level = clamp(1 - p - i, 0, 1)`, `threshold = quantile(level)` of the window, and after
//! each decision `i += gain · (p - strong)` clamped to `±max_offset` (anti-windup). The window
//! and the offset are bounded, so the threshold follows a drift within `window` requests and a
//! storm cannot wind it up without limit.

use super::{check_unit, DifficultyError};
use crate::stats::percentile;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// The `1 - share` quantile of `scores` (linear interpolation, as numpy's default), so that a
/// share `share` of them is at or above it.
pub fn threshold_for_share(scores: &[f64], share: f64) -> Result<f64, DifficultyError> {
    check_unit("strong share", share)?;
    if scores.is_empty() {
        return Err(DifficultyError::Empty("scores"));
    }
    if let Some(&bad) = scores.iter().find(|s| !s.is_finite()) {
        return Err(DifficultyError::OutOfRange {
            what: "score",
            value: bad,
        });
    }
    let mut sorted = scores.to_vec();
    sorted.sort_by(f64::total_cmp);
    Ok(percentile(&sorted, 1.0 - share).unwrap_or(sorted[0]))
}

/// The online controller's parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShareControllerConfig {
    /// The strong share to hold, in `[0, 1]`.
    pub target: f64,
    /// Scores the quantile is taken over (the most recent).
    pub window: usize,
    /// Scores needed before the window's quantile replaces `initial_threshold`.
    pub min_samples: usize,
    /// The threshold before then (an offline calibration).
    pub initial_threshold: f64,
    /// Quantile level moved per decision of error.
    pub gain: f64,
    /// Bound on the integral term's magnitude.
    pub max_offset: f64,
}

impl Default for ShareControllerConfig {
    fn default() -> Self {
        ShareControllerConfig {
            target: 0.3,
            window: 1000,
            min_samples: 50,
            initial_threshold: 0.5,
            gain: 0.002,
            max_offset: 0.2,
        }
    }
}

impl ShareControllerConfig {
    /// Checks the ranges.
    pub fn validate(&self) -> Result<(), DifficultyError> {
        check_unit("target", self.target)?;
        check_unit("initial_threshold", self.initial_threshold)?;
        check_unit("gain", self.gain)?;
        check_unit("max_offset", self.max_offset)?;
        if self.window == 0 {
            return Err(DifficultyError::Zero("window"));
        }
        Ok(())
    }
}

/// Holds the realised strong share at its target while scores drift.
#[derive(Clone, Debug)]
pub struct ShareController {
    config: ShareControllerConfig,
    scores: VecDeque<f64>,
    sorted: Vec<f64>,
    stale: bool,
    offset: f64,
}

impl ShareController {
    /// A controller with nothing seen.
    pub fn new(config: ShareControllerConfig) -> Result<ShareController, DifficultyError> {
        config.validate()?;
        Ok(ShareController {
            scores: VecDeque::with_capacity(config.window),
            sorted: Vec::with_capacity(config.window),
            stale: false,
            offset: 0.0,
            config,
        })
    }

    /// Records a score as it arrives (before the decision it feeds).
    pub fn observe(&mut self, score: f64) {
        if !score.is_finite() {
            return;
        }
        if self.scores.len() == self.config.window {
            self.scores.pop_front();
        }
        self.scores.push_back(score);
        self.stale = true;
    }

    /// Records the tier a request finally went to (after any escalation).
    pub fn decided(&mut self, strong: bool) {
        let error = self.config.target - if strong { 1.0 } else { 0.0 };
        let bound = self.config.max_offset;
        self.offset = (self.offset + self.config.gain * error).clamp(-bound, bound);
    }

    /// The current threshold: a score at or above it goes strong.
    pub fn threshold(&mut self) -> f64 {
        if self.scores.len() < self.config.min_samples.max(1) {
            return self.config.initial_threshold;
        }
        if self.stale {
            self.sorted.clear();
            self.sorted.extend(self.scores.iter().copied());
            self.sorted.sort_by(f64::total_cmp);
            self.stale = false;
        }
        let level = (1.0 - self.config.target - self.offset).clamp(0.0, 1.0);
        percentile(&self.sorted, level).unwrap_or(self.config.initial_threshold)
    }

    /// Scores `score` and returns whether it goes strong, recording it first: the whole
    /// per-request step when nothing later changes the tier.
    pub fn route(&mut self, score: f64) -> bool {
        self.observe(score);
        score >= self.threshold()
    }

    /// The integral term (quantile levels), for the decision record and tests.
    pub fn offset(&self) -> f64 {
        self.offset
    }

    /// The target share.
    pub fn target(&self) -> f64 {
        self.config.target
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn the_threshold_is_the_upper_quantile() {
        let scores: Vec<f64> = (0..=100).map(|i| f64::from(i) / 100.0).collect();
        let t = threshold_for_share(&scores, 0.3).unwrap();
        assert!((t - 0.7).abs() < 1e-9);
        let strong = scores.iter().filter(|&&s| s >= t).count();
        assert_eq!(strong, 31);
        assert!(threshold_for_share(&[], 0.3).is_err());
        assert!(threshold_for_share(&[0.5], 1.5).is_err());
        assert!(threshold_for_share(&[f64::NAN], 0.5).is_err());
    }

    /// Scores drift from uniform on [0, 0.5] to uniform on [0.5, 1] over 20,000 requests; a
    /// fixed threshold calibrated at the start would send everything strong by the end, the
    /// controller holds every block of 1,000 decisions within 5 points of the target.
    #[test]
    fn holds_the_share_on_a_drifting_distribution() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut c = ShareController::new(ShareControllerConfig::default()).unwrap();
        let n = 20_000;
        let mut block = 0;
        for i in 0..n {
            let shift = 0.5 * f64::from(i) / f64::from(n);
            let score = shift + rng.random::<f64>() * 0.5;
            let strong = c.route(score);
            c.decided(strong);
            block += usize::from(strong);
            if (i + 1) % 1000 == 0 {
                let share = block as f64 / 1000.0;
                assert!(
                    i < 1000 || (share - 0.3).abs() < 0.05,
                    "block ending {i}: {share}"
                );
                block = 0;
            }
        }
        assert!(c.offset().abs() <= 0.2);
    }

    /// A cascade escalates a fifth of the requests it kept cheap: the integral term lowers the
    /// upfront share so the realised one returns to the target.
    #[test]
    fn corrects_for_escalations_the_quantile_cannot_see() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut c = ShareController::new(ShareControllerConfig::default()).unwrap();
        let mut strong_late = 0;
        for i in 0..20_000 {
            let mut strong = c.route(rng.random::<f64>());
            if !strong && rng.random::<f64>() < 0.2 {
                strong = true;
            }
            c.decided(strong);
            if i >= 10_000 {
                strong_late += usize::from(strong);
            }
        }
        let share = strong_late as f64 / 10_000.0;
        assert!((share - 0.3).abs() < 0.02, "{share}");
        assert!(c.offset() < -0.05, "{}", c.offset());
    }

    proptest::proptest! {
        /// Whatever arrives, the offset stays within its bound and the threshold within the
        /// window's scores (or is the initial one), and the same inputs give the same outputs.
        #[test]
        fn bounded_and_deterministic(
            steps in proptest::collection::vec((0.0f64..=1.0, proptest::bool::ANY), 1..400),
            target in 0.0f64..=1.0,
        ) {
            let config = ShareControllerConfig { target, window: 50, min_samples: 5, ..Default::default() };
            let run = || {
                let mut c = ShareController::new(config.clone()).unwrap();
                let mut out = Vec::new();
                for &(score, strong) in &steps {
                    c.observe(score);
                    out.push(c.threshold());
                    c.decided(strong);
                    proptest::prop_assert!(c.offset().abs() <= config.max_offset + 1e-12);
                }
                Ok(out)
            };
            let thresholds = run()?;
            proptest::prop_assert_eq!(&thresholds, &run()?);
            for (i, t) in thresholds.iter().enumerate() {
                let window = &steps[(i + 1).saturating_sub(50)..=i];
                let lo = window.iter().map(|s| s.0).fold(1.0, f64::min);
                let hi = window.iter().map(|s| s.0).fold(0.0, f64::max);
                proptest::prop_assert!(*t == config.initial_threshold || (lo..=hi).contains(t));
            }
        }
    }

    #[test]
    fn the_offset_is_bounded_when_the_target_is_unreachable() {
        let mut c = ShareController::new(ShareControllerConfig::default()).unwrap();
        for _ in 0..10_000 {
            c.observe(0.5);
            c.decided(true);
        }
        assert_eq!(c.offset(), -0.2);
        assert!(ShareController::new(ShareControllerConfig {
            window: 0,
            ..Default::default()
        })
        .is_err());
    }
}
