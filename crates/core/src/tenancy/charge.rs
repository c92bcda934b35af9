//! What a request costs, in the units tenants are limited, queued and billed by.
//!
//! Requests per minute ignore work and plain tokens per minute ignore that input, cached input and
//! output cost the fleet very different amounts (VTC, Sheng et al., OSDI 2024), so every charge
//! here keeps the three apart. Before a request runs only its prompt length is known (and not how
//! much of it the engine will find cached), so admission charges an estimate and the end of the
//! request corrects it from the engine's `usage`.

use crate::{ReasoningEffort, Request, Usage};
use serde::{Deserialize, Serialize};

/// The relative cost of a token of each kind, for fair queueing and the input-token limit.
///
/// Defaults after VTC (Sheng et al., OSDI 2024), which weighs output twice as much as input; a
/// cached prompt token skips prefill compute and costs a tenth of an uncached one (OpenAI and
/// Anthropic bill cache reads at 10% to 50% of input).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TokenWeights {
    /// An uncached prompt token.
    pub input: f64,
    /// A prompt token the engine's prefix cache served.
    pub cached_input: f64,
    /// A generated token.
    pub output: f64,
}

impl Default for TokenWeights {
    fn default() -> Self {
        TokenWeights {
            input: 1.0,
            cached_input: 0.1,
            output: 2.0,
        }
    }
}

/// Token counts of one request, estimated or measured.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Charge {
    /// Prompt tokens not served from cache.
    pub input: f64,
    /// Prompt tokens served from cache.
    pub cached_input: f64,
    /// Output tokens.
    pub output: f64,
}

impl Charge {
    /// What the engine reported.
    pub fn from_usage(usage: &Usage) -> Self {
        let cached = usage.cached_tokens.unwrap_or(0).min(usage.prompt_tokens);
        Charge {
            input: f64::from(usage.prompt_tokens - cached),
            cached_input: f64::from(cached),
            output: f64::from(usage.output_tokens),
        }
    }

    /// Input as the input-token limit counts it: cached tokens at their weight relative to an
    /// uncached one.
    pub fn limited_input(&self, w: &TokenWeights) -> f64 {
        if w.input > 0.0 {
            self.input + self.cached_input * w.cached_input / w.input
        } else {
            self.input + self.cached_input
        }
    }

    /// The weighted service of the prompt alone (what fair queueing charges at dispatch).
    pub fn weighted_input(&self, w: &TokenWeights) -> f64 {
        self.input * w.input + self.cached_input * w.cached_input
    }

    /// The weighted service of the whole request.
    pub fn weighted(&self, w: &TokenWeights) -> f64 {
        self.weighted_input(w) + self.output * w.output
    }
}

/// How a request's charge is estimated before it runs.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ChargeModel {
    /// Expected output of a request that sets no `max_tokens` and asks for no reasoning. The
    /// median chat answer is a few hundred tokens (ShareGPT's is ~200).
    pub default_output_tokens: u32,
    /// How many times the default output a reasoning effort is expected to produce: reasoning
    /// tokens are output tokens, and effort bounds the most variable part of a request's cost
    /// (OpenAI's `reasoning.effort`). Minimal, low, medium, high.
    pub effort_multipliers: [f64; 4],
    /// Token weights.
    pub weights: TokenWeights,
}

impl Default for ChargeModel {
    fn default() -> Self {
        ChargeModel {
            default_output_tokens: 256,
            effort_multipliers: [1.0, 2.0, 4.0, 8.0],
            weights: TokenWeights::default(),
        }
    }
}

impl ChargeModel {
    /// The estimate admission charges: the whole prompt as uncached (a hit is refunded at the end)
    /// and the expected output.
    pub fn estimate(&self, request: &Request) -> Charge {
        Charge {
            input: f64::from(request.prompt_tokens),
            cached_input: 0.0,
            output: f64::from(self.expected_output(request)),
        }
    }

    /// The default output, times the effort's multiplier, plus an explicit thinking budget,
    /// capped by the request's own `max_tokens` (the engine cannot produce more).
    pub fn expected_output(&self, request: &Request) -> u32 {
        let multiplier = match request.reasoning_effort {
            None | Some(ReasoningEffort::Minimal) => self.effort_multipliers[0],
            Some(ReasoningEffort::Low) => self.effort_multipliers[1],
            Some(ReasoningEffort::Medium) => self.effort_multipliers[2],
            Some(ReasoningEffort::High) => self.effort_multipliers[3],
        };
        let base = (f64::from(self.default_output_tokens) * multiplier).min(f64::from(u32::MAX));
        let expected = (base as u32).saturating_add(request.thinking_budget.unwrap_or(0));
        request
            .max_output_tokens
            .map_or(expected, |m| m.min(expected))
    }

    /// Checks the model is usable.
    pub fn validate(&self) -> Result<(), String> {
        let w = &self.weights;
        let ok = |v: f64| v.is_finite() && v >= 0.0;
        if !(ok(w.input) && ok(w.cached_input) && ok(w.output)) {
            return Err("token weights must be finite and not negative".into());
        }
        if w.input + w.cached_input + w.output == 0.0 {
            return Err("at least one token weight must be positive".into());
        }
        if !self
            .effort_multipliers
            .iter()
            .all(|&m| m.is_finite() && m >= 0.0)
        {
            return Err("effort multipliers must be finite and not negative".into());
        }
        Ok(())
    }
}

/// A model's price in dollars per million tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    /// Per million uncached prompt tokens.
    pub input_per_mtok: f64,
    /// Per million cached prompt tokens; the input price when absent.
    #[serde(default)]
    pub cached_input_per_mtok: Option<f64>,
    /// Per million output tokens.
    pub output_per_mtok: f64,
}

impl Price {
    /// The dollar cost of `charge`.
    pub fn cost(&self, charge: &Charge) -> f64 {
        let cached = self.cached_input_per_mtok.unwrap_or(self.input_per_mtok);
        (charge.input * self.input_per_mtok
            + charge.cached_input * cached
            + charge.output * self.output_per_mtok)
            / 1e6
    }

    /// Checks every price is a finite, non-negative number.
    pub fn validate(&self) -> Result<(), String> {
        let ok = |v: f64| v.is_finite() && v >= 0.0;
        if ok(self.input_per_mtok)
            && ok(self.output_per_mtok)
            && self.cached_input_per_mtok.is_none_or(ok)
        {
            Ok(())
        } else {
            Err("prices must be finite and not negative".into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasoning_raises_the_expected_output_and_max_tokens_caps_it() {
        let model = ChargeModel::default();
        let mut r = Request::from_text(1, "x".repeat(400));
        assert_eq!(model.expected_output(&r), 256);
        r.reasoning_effort = Some(ReasoningEffort::High);
        assert_eq!(model.expected_output(&r), 2048);
        r.thinking_budget = Some(1000);
        assert_eq!(model.expected_output(&r), 3048);
        r.max_output_tokens = Some(500);
        assert_eq!(model.expected_output(&r), 500);
        let c = model.estimate(&r);
        assert_eq!((c.input, c.cached_input, c.output), (100.0, 0.0, 500.0));
    }

    #[test]
    fn usage_splits_cached_from_uncached_and_weights_apply() {
        let u = Usage {
            prompt_tokens: 1000,
            cached_tokens: Some(800),
            output_tokens: 50,
        };
        let c = Charge::from_usage(&u);
        let w = TokenWeights::default();
        assert_eq!((c.input, c.cached_input, c.output), (200.0, 800.0, 50.0));
        assert!((c.limited_input(&w) - 280.0).abs() < 1e-9);
        assert!((c.weighted(&w) - (200.0 + 80.0 + 100.0)).abs() < 1e-9);
        let p = Price {
            input_per_mtok: 1.0,
            cached_input_per_mtok: Some(0.1),
            output_per_mtok: 4.0,
        };
        assert!((p.cost(&c) - (200.0 + 80.0 + 200.0) / 1e6).abs() < 1e-15);
    }
}
