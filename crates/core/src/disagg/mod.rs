//! Prefill/decode disaggregation: once a request's decode endpoint is chosen, whether its
//! prompt is prefilled there (locally) or on a prefill endpoint whose KV cache is then
//! transferred to the decode endpoint (remotely), and on which prefill endpoint.
//!
//! Four modes:
//! - `never`: always local (a pool without prefill endpoints behaves so whatever the mode);
//! - `always`: remote whenever a prefill endpoint can take it, as vLLM's reference proxy
//!   (`toy_proxy_server`) and SGLang's PD router do;
//! - `threshold`: remote iff the tokens the decode endpoint has not cached reach
//!   `threshold_tokens` and the best prefill endpoint is not the bottleneck (its queued prefill
//!   below `prefill_busy_tokens`). This is the rule of Dynamo's conditional disaggregation
//!   (`isl_bounding`: effective input length 2,048, and `prefill_load`) and of llm-d's
//!   prefix-based PD decider (`nonCachedTokens`);
//! - `conditional` (the default): price both with the predicted-TTFT model and take the
//!   cheaper, see [`Decider::decide`].
//!
//! The prefill endpoint is chosen cache-aware: the candidate whose remote first token is
//! predicted soonest, counting what its cache already holds of the prompt.

mod price;
#[cfg(test)]
mod tests;

pub use price::{Side, Transfer};

use crate::EndpointId;
use serde::{Deserialize, Serialize};
use std::fmt;

/// When a request's prefill goes to a prefill endpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Always prefill on the decode endpoint.
    Never,
    /// Always prefill remotely when a prefill endpoint can take it.
    Always,
    /// Remotely iff the uncached tokens reach a threshold and the prefill pool has room.
    Threshold,
    /// Whichever the predicted-TTFT model prices cheaper.
    #[default]
    Conditional,
}

impl Mode {
    /// The mode's name, for metrics and records.
    pub fn label(self) -> &'static str {
        match self {
            Mode::Never => "never",
            Mode::Always => "always",
            Mode::Threshold => "threshold",
            Mode::Conditional => "conditional",
        }
    }
}

/// The decision's settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// The rule.
    pub mode: Mode,
    /// `threshold`: the decode endpoint's uncached tokens from which the prefill goes remote.
    /// 2,048 is Dynamo's conditional-disaggregation default effective input length.
    pub threshold_tokens: u32,
    /// `threshold`: a prefill endpoint with this many prefill tokens queued is the bottleneck
    /// and the request prefills locally (Dynamo's `prefill_load` compares a worker's active
    /// tokens with its per-iteration token budget; 8,192 is one such budget).
    pub prefill_busy_tokens: u32,
    /// `conditional`: what one decoding sequence's stall counts against this request's first
    /// token. A local prefill of `n` tokens holds every sequence decoding on the endpoint for
    /// the `n` tokens' prefill time (chunked prefill shares the iterations, it does not shorten
    /// the total). No published router prices this; 0.1 is kvgate's choice, so a long prompt
    /// beside a busy decode batch goes remote even where its own TTFT would be a little shorter
    /// locally. `kvgate sim --scenario pd` measures the modes.
    pub decode_stall_weight: f64,
    /// Choosing the prefill endpoint: what one token it computes that another prefill
    /// endpoint holds costs the requests after it, in units of its prefill time. Soonest-ready
    /// alone moves a session off the prefill endpoint holding its context whenever that one is
    /// busier by more than the context's prefill, and the pool then computes the context
    /// twice (the M/M/1 delay a unit of work imposes on later arrivals is rho/(1-rho) units, 1 at
    /// rho = 0.5; `predicted_ttft` prices the same externality with measured utilisation).
    pub duplicate_prefill_weight: f64,
    /// The KV link between the pools.
    pub transfer: Transfer,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            mode: Mode::Conditional,
            threshold_tokens: 2048,
            prefill_busy_tokens: 8192,
            decode_stall_weight: 0.1,
            duplicate_prefill_weight: 1.0,
            transfer: Transfer::default(),
        }
    }
}

/// A setting that cannot be used, and why.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("disaggregation setting `{field}` {why}")]
pub struct InvalidConfig {
    /// The setting.
    pub field: &'static str,
    /// What is wrong with it.
    pub why: &'static str,
}

impl Config {
    /// Checks every setting.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        let bad = |field, why| Err(InvalidConfig { field, why });
        if !(self.decode_stall_weight.is_finite() && self.decode_stall_weight >= 0.0) {
            return bad(
                "decode_stall_weight",
                "must be a finite number, not negative",
            );
        }
        if !(self.duplicate_prefill_weight.is_finite() && self.duplicate_prefill_weight >= 0.0) {
            return bad(
                "duplicate_prefill_weight",
                "must be a finite number, not negative",
            );
        }
        if !(self.transfer.bandwidth_gbps.is_finite() && self.transfer.bandwidth_gbps > 0.0) {
            return bad("transfer.bandwidth_gbps", "must be a positive number");
        }
        if !(self.transfer.setup_ms.is_finite() && self.transfer.setup_ms >= 0.0) {
            return bad("transfer.setup_ms", "must be a finite number, not negative");
        }
        if self.transfer.bytes_per_token == 0 {
            return bad("transfer.bytes_per_token", "must be at least 1");
        }
        Ok(())
    }
}

/// Where the prefill runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prefill {
    /// On the decode endpoint.
    Local,
    /// On this prefill endpoint, then transferred.
    Remote(EndpointId),
}

/// Why the decision went the way it did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Why {
    /// The mode is `never`.
    Never,
    /// No prefill endpoint could take it.
    NoPrefillEndpoint,
    /// The mode is `always`.
    Always,
    /// `threshold`: too few uncached tokens on the decode endpoint.
    BelowThreshold,
    /// `threshold`: the best prefill endpoint has too much queued.
    PrefillBusy,
    /// `threshold`: enough uncached tokens and room on the prefill endpoint.
    AboveThreshold,
    /// `conditional`: the remote price was lower.
    RemoteCheaper,
    /// `conditional`: the local price was lower (or equal).
    LocalCheaper,
}

impl Why {
    /// The reason's name, for metrics and records.
    pub fn label(self) -> &'static str {
        match self {
            Why::Never => "never",
            Why::NoPrefillEndpoint => "no_prefill_endpoint",
            Why::Always => "always",
            Why::BelowThreshold => "below_threshold",
            Why::PrefillBusy => "prefill_busy",
            Why::AboveThreshold => "above_threshold",
            Why::RemoteCheaper => "remote_cheaper",
            Why::LocalCheaper => "local_cheaper",
        }
    }
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// The decision with the figures behind it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Verdict {
    /// Where the prefill runs.
    pub prefill: Prefill,
    /// Why.
    pub why: Why,
    /// Tokens the decode endpoint has not cached: what a local prefill computes and a remote
    /// one transfers.
    pub uncached_tokens: u32,
    /// The local price, seconds: predicted TTFT plus the weighted decode stall.
    pub local_secs: f64,
    /// The best prefill endpoint's price, seconds, when there was a candidate.
    pub remote_secs: Option<f64>,
    /// Tokens the best prefill endpoint has not cached, when there was a candidate: what a
    /// remote prefill computes there, and so what it queues there.
    pub remote_uncached_tokens: Option<u32>,
}

impl Verdict {
    /// Whether the prefill goes to a prefill endpoint.
    pub fn is_remote(&self) -> bool {
        matches!(self.prefill, Prefill::Remote(_))
    }

    /// The tokens a prefill leg of a `prompt_tokens` prompt computes on `endpoint`, and so
    /// queues there: the decision's figure for the endpoint it chose, the whole prompt on
    /// another (a retry's, whose cache it did not price). Queueing the whole prompt at the
    /// endpoint holding a session's context made it look busier than it was by the context
    /// each turn, and the session's next turn then went to a prefill endpoint that had to
    /// compute the whole context again (docs/pd.md).
    pub fn remote_tokens(&self, endpoint: EndpointId, prompt_tokens: u32) -> u32 {
        match self.remote_uncached_tokens {
            Some(uncached) if self.prefill == Prefill::Remote(endpoint) => uncached,
            _ => prompt_tokens,
        }
    }
}

/// One prefill endpoint as the decision sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    /// The endpoint.
    pub endpoint: EndpointId,
    /// Its speed, queue and cached prefix of this prompt.
    pub side: Side,
}

/// The decision for one configuration.
#[derive(Clone, Debug, Default)]
pub struct Decider {
    config: Config,
}

impl Decider {
    /// A decider with `config` (validate it first).
    pub fn new(config: Config) -> Self {
        Decider { config }
    }

    /// The settings.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Decides for a prompt of `prompt_tokens` whose decode endpoint is `decode`, with the
    /// prefill endpoints that may take it (`candidates`, any order).
    ///
    /// The prices, in seconds, with `u` the decode endpoint's uncached tokens:
    /// ```text
    /// local  = ttft_d(queued_d + u) + decode_stall_weight * decodes_d * u * spt_d
    /// remote = max(ttft_p(queued_p + uncached_p) + transfer(u), queued_d * spt_d)
    ///          + ttft_d(1)
    /// transfer(u) = setup + u * bytes_per_token / bandwidth
    /// ```
    /// `ttft_x(w)` is the predicted-TTFT model (`fixed + per_decode * decodes + w * spt`,
    /// [`crate::policy::calibration::Coefficients`]) and `spt` its seconds per prefill token
    /// beside the endpoint's decodes. The remote leg overlaps the decode endpoint's own queue
    /// (the decode request waits in the engine for the transfer while the queue drains, as
    /// vLLM's KV connector schedules it), then takes one iteration there. The prefill endpoint
    /// minimises its remote price: fewer uncached tokens there (its cache), a shorter queue
    /// or a faster engine win.
    pub fn decide(&self, prompt_tokens: u32, decode: &Side, candidates: &[Candidate]) -> Verdict {
        let uncached = decode.uncached(prompt_tokens);
        let local = decode.ttft(prompt_tokens) + self.stall(decode, uncached);
        let transfer = self.config.transfer.seconds(uncached);
        // The soonest ready (plus the duplicated prefill's charge), not the lowest price: the
        // price is flat in a prefill endpoint's speed while the decode endpoint's own queue is
        // the longer wait.
        let fewest = candidates
            .iter()
            .map(|c| c.side.uncached(prompt_tokens))
            .min()
            .unwrap_or(0);
        let best = candidates
            .iter()
            .map(|c| {
                let ready = c.side.ttft(prompt_tokens);
                let duplicated = f64::from(c.side.uncached(prompt_tokens) - fewest)
                    * c.side.coefficients.seconds_per_token(c.side.decodes);
                let cost = ready + self.config.duplicate_prefill_weight * duplicated;
                (c, ready, cost)
            })
            .min_by(|a, b| a.2.total_cmp(&b.2).then(a.0.endpoint.cmp(&b.0.endpoint)))
            .map(|(c, ready, _)| (c, self.remote(decode, ready + transfer)));
        let verdict = |prefill, why| Verdict {
            prefill,
            why,
            uncached_tokens: uncached,
            local_secs: local,
            remote_secs: best.map(|b| b.1),
            remote_uncached_tokens: best.map(|b| b.0.side.uncached(prompt_tokens)),
        };
        if self.config.mode == Mode::Never {
            return verdict(Prefill::Local, Why::Never);
        }
        let Some((best, remote)) = best else {
            return verdict(Prefill::Local, Why::NoPrefillEndpoint);
        };
        let there = Prefill::Remote(best.endpoint);
        match self.config.mode {
            Mode::Never => unreachable!("handled above"),
            Mode::Always => verdict(there, Why::Always),
            Mode::Threshold if uncached < self.config.threshold_tokens => {
                verdict(Prefill::Local, Why::BelowThreshold)
            }
            Mode::Threshold
                if best.side.queued_tokens >= f64::from(self.config.prefill_busy_tokens) =>
            {
                verdict(Prefill::Local, Why::PrefillBusy)
            }
            Mode::Threshold => verdict(there, Why::AboveThreshold),
            Mode::Conditional if remote < local => verdict(there, Why::RemoteCheaper),
            Mode::Conditional => verdict(Prefill::Local, Why::LocalCheaper),
        }
    }

    /// What a local prefill of `uncached` tokens costs the sequences decoding beside it.
    fn stall(&self, decode: &Side, uncached: u32) -> f64 {
        self.config.decode_stall_weight
            * decode.decodes
            * f64::from(uncached)
            * decode.coefficients.seconds_per_token(decode.decodes)
    }

    /// The remote price when the KV is on the decode endpoint `ready` seconds from now.
    fn remote(&self, decode: &Side, ready: f64) -> f64 {
        let spt = decode.coefficients.seconds_per_token(decode.decodes);
        let decode_queue = decode.queued_tokens * spt;
        ready.max(decode_queue) + decode.coefficients.predict(1.0, decode.decodes)
    }
}
