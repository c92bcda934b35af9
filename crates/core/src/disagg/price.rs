//! The two inputs the prices are made of: an endpoint as the predicted-TTFT model sees it, and
//! the KV link between the pools.

use crate::policy::calibration::Coefficients;
use serde::{Deserialize, Serialize};

/// One endpoint for one prompt.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Side {
    /// Its predicted-TTFT coefficients (learned, or the prior).
    pub coefficients: Coefficients,
    /// Uncached prefill tokens queued there ahead of this request.
    pub queued_tokens: f64,
    /// Sequences decoding there.
    pub decodes: f64,
    /// Tokens of this prompt its cache holds.
    pub cached_tokens: u32,
}

impl Side {
    /// Tokens of a `prompt_tokens` prompt it would compute.
    pub fn uncached(&self, prompt_tokens: u32) -> u32 {
        prompt_tokens.saturating_sub(self.cached_tokens)
    }

    /// Predicted seconds to the first token of a prefill of this prompt here.
    pub fn ttft(&self, prompt_tokens: u32) -> f64 {
        let work = self.queued_tokens.max(0.0) + f64::from(self.uncached(prompt_tokens));
        self.coefficients.predict(work, self.decodes)
    }
}

/// The KV link between prefill and decode endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Transfer {
    /// Link bandwidth, gigabytes (10^9 bytes) per second. 40 is an InfiniBand NDR link's
    /// effective rate (NVLink is ~450), the range Dynamo's mocker and llm-d's inference
    /// simulator model.
    pub bandwidth_gbps: f64,
    /// Fixed time per transfer, milliseconds (0.5-2 ms over RDMA, 2-10 ms over TCP).
    pub setup_ms: f64,
    /// KV bytes per token: layers x 2 (K and V) x KV heads x head dimension x bytes per value.
    /// 131,072 (128 KiB) is an 8B model with 32 layers, 8 KV heads of 128 in 16-bit values,
    /// the model `kvgate sim`'s default cost model stands for.
    pub bytes_per_token: u64,
}

impl Default for Transfer {
    fn default() -> Self {
        Transfer {
            bandwidth_gbps: 40.0,
            setup_ms: 1.0,
            bytes_per_token: 131_072,
        }
    }
}

impl Transfer {
    /// Seconds to move `tokens` tokens' KV.
    pub fn seconds(&self, tokens: u32) -> f64 {
        let bytes = f64::from(tokens) * self.bytes_per_token as f64;
        self.setup_ms / 1e3 + bytes / (self.bandwidth_gbps * 1e9)
    }

    /// Bytes of `tokens` tokens' KV.
    pub fn bytes(&self, tokens: u32) -> u64 {
        u64::from(tokens) * self.bytes_per_token
    }
}
