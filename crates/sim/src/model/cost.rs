//! How long one engine iteration takes.
//!
//! An iteration's time is a linear function of its work (prefill is compute-bound and scales with
//! the tokens computed; decode is bandwidth-bound and scales with the weights read once per step
//! plus every decoding sequence's KV context):
//!
//! ```text
//! raw = step_overhead + prefill_tokens * prefill_token + decode_seqs * decode_seq
//!     + context_tokens * context_token
//! duration = raw, or with a quantum q > 0: max(1, ceil(raw / q)) * q
//! ```
//!
//! The quantum makes the reference labs' unit model ("1 tick = one engine iteration budget",
//! docs/background.md#routing-lab) exact: a decode step is one tick and a prefill takes one tick
//! per [`CostModel::UNIT_PREFILL_TOKENS_PER_TICK`] tokens.

use kvgate_core::Nanos;
use serde::{Deserialize, Serialize};

/// Nanoseconds in one simulated tick of the reference labs' unit model: 1 tick = 1 ms.
///
/// The factor only matters where ticks meet [`Nanos`] (policy clocks, TTL); every lab reports
/// in ticks.
pub const TICK_NANOS: u64 = 1_000_000;

/// The named parameters of the iteration-time model. All costs are nanoseconds (fractional
/// values are allowed so per-token costs can be small).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostModel {
    /// Fixed time per iteration: reading the weights once, kernel launches, scheduling.
    pub step_overhead_ns: f64,
    /// Time per prompt token prefilled (uncached tokens only).
    pub prefill_token_ns: f64,
    /// Time per sequence that decodes one token in the iteration (sampling, per-sequence
    /// kernels).
    pub decode_seq_ns: f64,
    /// Time per context token attended by decoding sequences (KV reads).
    pub context_token_ns: f64,
    /// When non-zero, iteration times are rounded up to a whole, non-zero number of quanta.
    pub quantum_ns: u64,
}

impl CostModel {
    /// Prompt tokens one unit-model tick can prefill (the lab's per-iteration token budget).
    pub const UNIT_PREFILL_TOKENS_PER_TICK: u32 = 512;

    /// The reference labs' unit model: every iteration lasts a whole number of ticks
    /// ([`TICK_NANOS`]); a decode-only iteration is one tick, a prefill one tick per
    /// [`Self::UNIT_PREFILL_TOKENS_PER_TICK`] uncached tokens (rounded up).
    pub fn unit() -> Self {
        CostModel {
            step_overhead_ns: 0.0,
            prefill_token_ns: TICK_NANOS as f64 / f64::from(Self::UNIT_PREFILL_TOKENS_PER_TICK),
            decode_seq_ns: 0.0,
            context_token_ns: 0.0,
            quantum_ns: TICK_NANOS,
        }
    }

    /// The time of one iteration with this work.
    pub fn iteration(&self, prefill_tokens: u64, decode_seqs: u64, context_tokens: u64) -> Nanos {
        let raw = self.step_overhead_ns
            + prefill_tokens as f64 * self.prefill_token_ns
            + decode_seqs as f64 * self.decode_seq_ns
            + context_tokens as f64 * self.context_token_ns;
        let raw = if raw.is_finite() && raw > 0.0 {
            raw
        } else {
            0.0
        };
        if self.quantum_ns == 0 {
            return Nanos(raw.round() as u64);
        }
        let q = self.quantum_ns as f64;
        // Subtract a hair so exact multiples are not pushed up by rounding error.
        let quanta = ((raw / q) - 1e-9).ceil().max(1.0);
        Nanos((quanta * q) as u64)
    }
}

impl Default for CostModel {
    /// A mid-size model on one GPU, roughly an 8B dense model in 16-bit weights on an H100:
    /// a 12 ms floor per step (16 GB of weights read at ~3 TB/s plus launch overhead), about
    /// 8,300 prefill tokens/s, 0.15 ms per decoding sequence and 40 ns per context token
    /// (128 KiB of KV per token read at ~3 TB/s). A decode step at batch 32 with 2,000-token
    /// contexts takes about 19 ms.
    fn default() -> Self {
        CostModel {
            step_overhead_ns: 12_000_000.0,
            prefill_token_ns: 120_000.0,
            decode_seq_ns: 150_000.0,
            context_token_ns: 40.0,
            quantum_ns: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_decode_is_one_tick_and_prefill_one_tick_per_budget() {
        let unit = CostModel::unit();
        assert_eq!(unit.iteration(0, 5, 10_000), Nanos(TICK_NANOS));
        assert_eq!(unit.iteration(0, 0, 0), Nanos(TICK_NANOS));
        assert_eq!(unit.iteration(512, 3, 0), Nanos(TICK_NANOS));
        assert_eq!(unit.iteration(513, 0, 0), Nanos(2 * TICK_NANOS));
        assert_eq!(unit.iteration(3079, 0, 0), Nanos(7 * TICK_NANOS));
    }

    #[test]
    fn default_decode_step_is_in_the_documented_range() {
        let d = CostModel::default();
        let step = d.iteration(0, 32, 32 * 2_000).as_millis_f64();
        assert!((15.0..=25.0).contains(&step), "{step}");
        // Prefill throughput between 5k and 10k tokens per second.
        let per_s = 8_000.0 / d.iteration(8_000, 0, 0).as_secs_f64();
        assert!((5_000.0..=10_000.0).contains(&per_s), "{per_s}");
    }
}
