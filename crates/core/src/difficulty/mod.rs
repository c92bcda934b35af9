//! Difficulty routing: deciding per request whether the cheap model will do or the strong one is
//! needed, and keeping that decision from costing more than it saves.
//!
//! The shape follows RouteLLM (lm-sys/RouteLLM): a scorer returns P(strong needed) in `[0, 1]`;
//! a request goes to the strong model iff its score is at least a threshold; the threshold is
//! the `1 - p` quantile of the scores for a target strong share `p`, so an operator sets a
//! share, not a raw score. Three scorers: hand-set [`rules`], [`knn`] over labelled example
//! vectors (from an embedder or the in-process [`lexical`] vectors), and a classifier endpoint's
//! score passed in ([`Score::classifier`]).
//!
//! A cascade (FrugalGPT) asks the cheap model first and escalates when its answer's
//! [`confidence`] is low. Escalations are retries by another name, so they get a retry-style
//! [`budget`] (a ratio of requests plus a floor per second, per tenant and overall), and the
//! [`calibrate::ShareController`] holds the realised strong share at its target while the score
//! distribution drifts. Without these guards a degraded cheap tier makes every request pay
//! twice (an escalation storm, a metastable failure in the sense of Bronson et al., HotOS'21).

pub mod budget;
pub mod calibrate;
pub mod confidence;
pub mod eval;
pub mod knn;
pub mod lexical;
pub mod rules;

pub use budget::{BudgetDenied, EscalationBudget, EscalationBudgetConfig};
pub use calibrate::{threshold_for_share, ShareController, ShareControllerConfig};
pub use confidence::{Confidence, ConfidenceConfig, TokenLogprob};
pub use knn::KnnScorer;
pub use lexical::HashedTfIdf;
pub use rules::{RuleInput, RuleWeights};

/// Why a difficulty input was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DifficultyError {
    /// A probability or share outside `[0, 1]` (or not a number).
    #[error("{what} must be within 0..=1, got {value}")]
    OutOfRange {
        /// What the value was.
        what: &'static str,
        /// The value.
        value: f64,
    },
    /// A vector whose length differs from the examples'.
    #[error("vector has {got} dimensions, the examples have {want}")]
    Dimensions {
        /// The examples' dimension.
        want: usize,
        /// The vector's.
        got: usize,
    },
    /// A vector of zeros or with a non-finite component: it has no direction to compare.
    #[error("vector {0} is zero or not finite")]
    BadVector(usize),
    /// Nothing to compute from.
    #[error("{0} is empty")]
    Empty(&'static str),
    /// A count that must be positive was zero.
    #[error("{0} must be at least 1")]
    Zero(&'static str),
}

/// Where a score came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scorer {
    /// The hand-set [`rules`].
    Rules,
    /// Nearest labelled examples ([`knn`]).
    Knn,
    /// A classifier endpoint's probability.
    Classifier,
}

impl Scorer {
    /// The name used in configuration, headers and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Scorer::Rules => "rules",
            Scorer::Knn => "knn",
            Scorer::Classifier => "classifier",
        }
    }
}

/// P(strong needed) for one request, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Score {
    /// The probability, in `[0, 1]`.
    pub p: f64,
    /// Which scorer produced it.
    pub scorer: Scorer,
    /// The largest contribution to it (a rule's feature, or the nearest example's index), for
    /// the decision record.
    pub reason: String,
}

impl Score {
    /// A classifier endpoint's probability, checked: RouteLLM's routers return the win rate of
    /// the strong model in `[0, 1]`, and anything else is a fault of the classifier.
    pub fn classifier(p: f64) -> Result<Score, DifficultyError> {
        check_unit("classifier score", p)?;
        Ok(Score {
            p,
            scorer: Scorer::Classifier,
            reason: "classifier".into(),
        })
    }
}

pub(crate) fn check_unit(what: &'static str, value: f64) -> Result<(), DifficultyError> {
    if (0.0..=1.0).contains(&value) {
        Ok(())
    } else {
        Err(DifficultyError::OutOfRange { what, value })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_classifier_score_must_be_a_probability() {
        assert_eq!(Score::classifier(0.3).unwrap().p, 0.3);
        assert!(Score::classifier(1.2).is_err());
        assert!(Score::classifier(f64::NAN).is_err());
        assert!(Score::classifier(-0.0).is_ok());
    }
}
