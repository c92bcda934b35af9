//! How sure the cheap model was of its answer, from its token logprobs, and whether a cascade
//! escalates.
//!
//! The mean logprob is length-biased: one wrong number in a long, fluent answer barely moves
//! it. Quantiles of per-token uncertainty detect such answers better (arXiv 2404.10136), so the
//! confidence is the probability at a low quantile of the per-token logprobs,
//! `exp(quantile_q(logprob_t))` (the lower order statistic, not interpolated). When the engine returns `top_logprobs`, the margin between the
//! chosen token and its best alternative (`p1 - p2`, vLLM semantic router's "margin" signal)
//! is taken at the same quantile, and the confidence is the smaller of the two: either kind of
//! hesitation escalates. Answers without logprobs have no confidence (`None`), never a made-up
//! one; the cascade's configuration says what to do then.

use super::{check_unit, DifficultyError};
use serde::{Deserialize, Serialize};

/// One generated token: its logprob and, when returned, its alternatives' (the chosen token
/// may be among them).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TokenLogprob {
    /// ln P(token).
    pub logprob: f64,
    /// ln P of the top alternatives at this position.
    pub top: Vec<f64>,
}

/// The confidence rule and the cascade's chain.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConfidenceConfig {
    /// The low quantile of per-token values that stands for the answer.
    pub quantile: f64,
    /// Escalate below this confidence.
    pub threshold: f64,
    /// Escalate an answer that came without logprobs (otherwise it is accepted and flagged).
    pub escalate_without_logprobs: bool,
    /// Most escalations one request may take (the chain's length minus one).
    pub max_escalations: u32,
}

impl Default for ConfidenceConfig {
    fn default() -> Self {
        ConfidenceConfig {
            quantile: 0.1,
            threshold: 0.3,
            escalate_without_logprobs: false,
            max_escalations: 1,
        }
    }
}

impl ConfidenceConfig {
    /// Checks the ranges.
    pub fn validate(&self) -> Result<(), DifficultyError> {
        check_unit("confidence quantile", self.quantile)?;
        check_unit("confidence threshold", self.threshold)
    }
}

/// An answer's confidence and what it was made of.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Confidence {
    /// In `[0, 1]`: the smaller of `exp(low_logprob)` and `margin`.
    pub value: f64,
    /// The quantile of per-token logprobs.
    pub low_logprob: f64,
    /// The quantile of per-token margins, when alternatives were returned.
    pub margin: Option<f64>,
    /// The mean logprob, for comparison only.
    pub mean_logprob: f64,
    /// Tokens read.
    pub tokens: usize,
}

/// The confidence of an answer made of `tokens`; `None` without any.
pub fn confidence(tokens: &[TokenLogprob], quantile: f64) -> Option<Confidence> {
    let q = quantile.clamp(0.0, 1.0);
    let mut lps: Vec<f64> = tokens
        .iter()
        .map(|t| t.logprob.min(0.0))
        .filter(|l| !l.is_nan())
        .collect();
    if lps.is_empty() {
        return None;
    }
    let mean_logprob = lps.iter().sum::<f64>() / lps.len() as f64;
    lps.sort_by(f64::total_cmp);
    let low_logprob = lower(&lps, q)?;
    let mut margins: Vec<f64> = tokens
        .iter()
        .filter(|t| !t.top.is_empty())
        .map(margin)
        .collect();
    margins.sort_by(f64::total_cmp);
    let margin = lower(&margins, q);
    let value = margin.map_or(low_logprob.exp(), |m| m.min(low_logprob.exp()));
    Some(Confidence {
        value: value.clamp(0.0, 1.0),
        low_logprob,
        margin,
        mean_logprob,
        tokens: lps.len(),
    })
}

/// The order statistic at or below quantile `q` of `sorted` (no interpolation: in a ten-token
/// answer the 0.1 quantile is its least likely token, not a blend with the next).
fn lower(sorted: &[f64], q: f64) -> Option<f64> {
    let at = (q * (sorted.len().checked_sub(1)? as f64)).floor() as usize;
    sorted.get(at).copied()
}

/// `p1 - p2` at one position: the best two of the alternatives and the chosen token.
fn margin(t: &TokenLogprob) -> f64 {
    let (mut p1, mut p2) = (t.logprob.exp(), 0.0f64);
    let mut chosen_seen = false;
    for &lp in &t.top {
        let p = lp.exp();
        if !chosen_seen && (lp - t.logprob).abs() < 1e-9 {
            chosen_seen = true;
            continue;
        }
        if p > p1 {
            p2 = p1;
            p1 = p;
        } else if p > p2 {
            p2 = p;
        }
    }
    (p1 - p2).clamp(0.0, 1.0)
}

/// What a cascade does with an answer from tier `escalations` (0 for the cheap tier).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Return it.
    Accept,
    /// Return it, though it came without logprobs.
    AcceptUnscored,
    /// Confidence is low: ask the next tier.
    Escalate,
    /// Confidence is low but the chain is at its bound: return it.
    ChainExhausted,
}

impl ConfidenceConfig {
    /// The next step for an answer of `confidence` after `escalations` escalations.
    pub fn step(&self, confidence: Option<&Confidence>, escalations: u32) -> Step {
        let low = match confidence {
            None if !self.escalate_without_logprobs => return Step::AcceptUnscored,
            None => true,
            Some(c) => c.value < self.threshold,
        };
        match (low, escalations < self.max_escalations) {
            (false, _) => Step::Accept,
            (true, true) => Step::Escalate,
            (true, false) => Step::ChainExhausted,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tok(p: f64) -> TokenLogprob {
        TokenLogprob {
            logprob: p.ln(),
            top: Vec::new(),
        }
    }

    #[test]
    fn one_unsure_token_in_a_long_answer_lowers_the_confidence() {
        let mut answer: Vec<_> = (0..9).map(|_| tok(0.99)).collect();
        answer.push(tok(0.05));
        let c = confidence(&answer, 0.1).unwrap();
        assert!(c.mean_logprob.exp() > 0.7, "the mean hides it: {c:?}");
        assert!(c.value < 0.2, "{c:?}");
        assert!(confidence(&[], 0.1).is_none());
    }

    #[test]
    fn a_close_alternative_lowers_the_confidence() {
        let sure = TokenLogprob {
            logprob: 0.5f64.ln(),
            top: vec![0.5f64.ln(), 0.45f64.ln()],
        };
        let c = confidence(&[sure], 0.1).unwrap();
        assert!((c.margin.unwrap() - 0.05).abs() < 1e-9, "{c:?}");
        assert!((c.value - 0.05).abs() < 1e-9);
    }

    #[test]
    fn the_chain_is_bounded() {
        let cfg = ConfidenceConfig::default();
        let low = confidence(&[tok(0.1)], 0.1).unwrap();
        let high = confidence(&[tok(0.9)], 0.1).unwrap();
        assert_eq!(cfg.step(Some(&high), 0), Step::Accept);
        assert_eq!(cfg.step(Some(&low), 0), Step::Escalate);
        assert_eq!(cfg.step(Some(&low), 1), Step::ChainExhausted);
        assert_eq!(cfg.step(None, 0), Step::AcceptUnscored);
        let strict = ConfidenceConfig {
            escalate_without_logprobs: true,
            ..cfg
        };
        assert_eq!(strict.step(None, 0), Step::Escalate);
    }

    proptest! {
        #[test]
        fn confidence_is_a_probability(tokens in proptest::collection::vec((-20.0f64..0.0, proptest::collection::vec(-20.0f64..0.0, 0..4)), 1..50), q in 0.0f64..=1.0) {
            let tokens: Vec<_> = tokens.into_iter().map(|(logprob, top)| TokenLogprob { logprob, top }).collect();
            let c = confidence(&tokens, q).unwrap();
            prop_assert!((0.0..=1.0).contains(&c.value));
            prop_assert!(c.low_logprob <= 0.0 && c.tokens == tokens.len());
        }
    }
}
