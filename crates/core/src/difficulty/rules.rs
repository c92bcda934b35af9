//! The rules scorer: a logistic model over five features of the prompt whose weights are set by
//! hand, for when no labelled data or embedder is at hand.
//!
//! `p = 1 / (1 + exp(-(bias + Σ weight_i · feature_i)))`, each feature in `[0, 1]`:
//! - `length`: prompt characters over `long_chars`, capped at 1 (long prompts carry long
//!   contexts and multi-part asks);
//! - `tools`: 1 when the request offers tools (agentic turns plan and call; a weak model's
//!   malformed call costs a whole turn);
//! - `code`: 1 when the prompt holds a code fence or code keywords;
//! - `math`: numbers (a quarter per number, capped) and math words; GSM8K-style arithmetic is
//!   where RouteLLM's released data shows the widest weak/strong gap (63.8% against 85.7%);
//! - `multi_step`: wording that asks for several steps or a justification, half per phrase.
//!
//! With the defaults a short chat turn scores about 0.18 and a long tool-using coding request
//! about 0.92. The weights are priors, not fitted: `kvgate route-eval` measures how well they
//! rank on public labelled data (docs/model-routing.md), and the kNN scorer is the fitted one.

use super::{Score, Scorer};
use serde::{Deserialize, Serialize};

/// What the rules read of a request.
#[derive(Clone, Copy, Debug)]
pub struct RuleInput<'a> {
    /// The text the scorer judges (RouteLLM uses the last user message).
    pub text: &'a str,
    /// Whether the request offers tools.
    pub tools: bool,
}

/// The weights (log-odds per unit of feature).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RuleWeights {
    /// Log-odds with every feature at 0.
    pub bias: f64,
    /// Weight of `length`.
    pub length: f64,
    /// Characters at which `length` reaches 1.
    pub long_chars: usize,
    /// Weight of `tools`.
    pub tools: f64,
    /// Weight of `code`.
    pub code: f64,
    /// Weight of `math`.
    pub math: f64,
    /// Weight of `multi_step`.
    pub multi_step: f64,
}

impl Default for RuleWeights {
    fn default() -> Self {
        RuleWeights {
            bias: -1.5,
            length: 1.0,
            long_chars: 2000,
            tools: 1.0,
            code: 1.0,
            math: 1.5,
            multi_step: 1.0,
        }
    }
}

/// Log-odds a feature must add to be named as the reason (less is noise, e.g. the length of
/// a one-line question).
const MIN_REASON: f64 = 0.1;

const CODE_MARKERS: &[&str] = &[
    "```",
    "def ",
    "fn ",
    "function ",
    "class ",
    "#include",
    "import ",
    "select ",
    "=>",
    "};",
];
const MATH_WORDS: &[&str] = &[
    "solve",
    "equation",
    "integral",
    "derivative",
    "probability",
    "calculate",
    "how many",
    "how much",
    "percent",
    "sum of",
];
const STEP_WORDS: &[&str] = &[
    "step by step",
    "explain why",
    "prove",
    "derive",
    "compare",
    "analy",
    "first,",
    "then ",
    "justify",
    "trade-off",
];

impl RuleWeights {
    /// The features of `input`, named, each in `[0, 1]`.
    pub fn features(&self, input: RuleInput<'_>) -> [(&'static str, f64); 5] {
        let lower = input.text.to_lowercase();
        let count = |words: &[&str]| words.iter().filter(|w| lower.contains(*w)).count() as f64;
        let length = input.text.chars().count() as f64 / self.long_chars.max(1) as f64;
        let code = if count(CODE_MARKERS) > 0.0 { 1.0 } else { 0.0 };
        let math = 0.25 * numbers(input.text) as f64 + 0.5 * count(MATH_WORDS);
        let steps = 0.5 * count(STEP_WORDS);
        [
            ("length", length.min(1.0)),
            ("tools", if input.tools { 1.0 } else { 0.0 }),
            ("code", code),
            ("math", math.min(1.0)),
            ("multi_step", steps.min(1.0)),
        ]
    }

    /// Scores `input`; the reason names the feature that added the most log-odds.
    pub fn score(&self, input: RuleInput<'_>) -> Score {
        let weights = [
            self.length,
            self.tools,
            self.code,
            self.math,
            self.multi_step,
        ];
        let mut logit = self.bias;
        let mut top: (&str, f64) = ("bias", 0.0);
        for ((name, f), w) in self.features(input).into_iter().zip(weights) {
            let add = w * f;
            logit += add;
            if add > top.1.max(MIN_REASON) {
                top = (name, add);
            }
        }
        Score {
            p: 1.0 / (1.0 + (-logit).exp()),
            scorer: Scorer::Rules,
            reason: top.0.to_string(),
        }
    }
}

/// Maximal runs of ASCII digits.
fn numbers(text: &str) -> usize {
    let mut runs = 0;
    let mut inside = false;
    for b in text.bytes() {
        let digit = b.is_ascii_digit();
        if digit && !inside {
            runs += 1;
        }
        inside = digit;
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn score(text: &str, tools: bool) -> Score {
        RuleWeights::default().score(RuleInput { text, tools })
    }

    #[test]
    fn harder_looking_requests_score_higher() {
        let chat = score("hello, how are you?", false);
        let math = score(
            "Janet has 16 eggs and sells 3 for $2 each. How much does she make?",
            false,
        );
        let agent = score(
            &format!(
                "```rust\nfn main() {{}}\n``` Explain why it fails, step by step. {}",
                "x".repeat(2000)
            ),
            true,
        );
        assert!(chat.p < 0.2, "{chat:?}");
        assert!(math.p > chat.p && math.reason == "math", "{math:?}");
        assert!(agent.p > 0.9, "{agent:?}");
        assert_eq!(chat.reason, "bias");
    }

    #[test]
    fn numbers_counts_digit_runs() {
        assert_eq!(numbers("a 12 b 3.5 c"), 3);
        assert_eq!(numbers("none"), 0);
    }

    proptest! {
        #[test]
        fn scores_are_probabilities_and_tools_never_lower_them(text in ".{0,300}") {
            let without = score(&text, false);
            let with = score(&text, true);
            prop_assert!((0.0..=1.0).contains(&without.p));
            prop_assert!(with.p >= without.p);
        }
    }
}
