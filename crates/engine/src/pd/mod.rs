//! Prefill/decode disaggregation as an engine plays it: a prefill engine computes a prompt,
//! answers, and holds its KV until a decode engine reads it (or a lease expires); a decode
//! engine reads the KV of a prompt prefilled elsewhere, waits the modelled transfer time, and
//! decodes without prefilling the transferred tokens.
//!
//! Two wire protocols, as the engines speak them:
//! - vLLM's KV connector (`toy_proxy_server` in vLLM's NIXL integration tests): the prefill
//!   request carries `kv_transfer_params.do_remote_decode: true` and the answer carries a
//!   top-level `kv_transfer_params` (`do_remote_prefill: true`, `remote_block_ids`,
//!   `remote_engine_id`, `remote_request_id`, `remote_host`, `remote_port`, `tp_size`); the
//!   decode request carries those back. Invalid parameters mean a local prefill, as vLLM
//!   ("Got invalid KVTransferParams").
//! - SGLang's bootstrap (`sgl-model-gateway`'s PD router): both legs carry the same
//!   `bootstrap_host`, `bootstrap_port` and `bootstrap_room`; the decode engine waits, bounded,
//!   for the prefill of that room.
//!
//! The "transfer" between emulated engines is an HTTP read on the prefill engine
//! (`POST /kv_transfer/read`) that claims the held KV; the time a real link takes is then slept
//! on the decode side (setup plus bytes over bandwidth, the cost model's bytes per token).
//! `remote_host`/`remote_port` and `bootstrap_host`/`bootstrap_port` name the prefill engine's
//! HTTP address.

mod ask;
mod held;

pub(crate) use ask::{Ask, Source};
pub(crate) use held::{read, Held};

use crate::config::EngineConfig;
use crate::metrics::{Histogram, MetricsState};
use serde::{Deserialize, Serialize};
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Which leg of a disaggregated request an engine serves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Prefill legs (vLLM `kv_producer`, SGLang `--disaggregation-mode prefill`).
    Prefill,
    /// Decode legs (vLLM `kv_consumer`, SGLang `--disaggregation-mode decode`).
    Decode,
    /// Either, and plain requests (vLLM `kv_both`).
    #[default]
    Both,
}

impl Role {
    /// Whether it answers prefill legs.
    pub fn prefills(self) -> bool {
        self != Role::Decode
    }

    /// Whether it reads transferred KV for decode legs.
    pub fn decodes(self) -> bool {
        self != Role::Prefill
    }

    /// The role's name.
    pub fn label(self) -> &'static str {
        match self {
            Role::Prefill => "prefill",
            Role::Decode => "decode",
            Role::Both => "both",
        }
    }
}

impl FromStr for Role {
    type Err = crate::config::ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "prefill" => Ok(Role::Prefill),
            "decode" => Ok(Role::Decode),
            "both" => Ok(Role::Both),
            other => Err(crate::config::ConfigError(format!(
                "unknown role `{other}` (prefill, decode, both)"
            ))),
        }
    }
}

/// Counters and the transfer-time histogram, named after vLLM's NIXL metrics.
#[derive(Clone, Debug)]
pub(crate) struct PdMetrics {
    /// Prefill legs answered with held KV.
    pub(crate) prefills: u64,
    /// Decode legs that read their KV from a prefill engine.
    pub(crate) transfers: u64,
    pub(crate) bytes: u64,
    pub(crate) failed: u64,
    /// Held KV whose lease ran out before a decode engine read it.
    pub(crate) expired: u64,
    /// Decode legs whose parameters were invalid (prefilled locally).
    pub(crate) invalid: u64,
    /// Modelled transfer times.
    pub(crate) xfer_time: Histogram,
}

impl Default for PdMetrics {
    fn default() -> Self {
        PdMetrics {
            prefills: 0,
            transfers: 0,
            bytes: 0,
            failed: 0,
            expired: 0,
            invalid: 0,
            xfer_time: Histogram::new(crate::metrics::TRANSFER_BUCKETS),
        }
    }
}

/// The engine's disaggregation state.
#[derive(Debug)]
pub(crate) struct Pd {
    pub(crate) role: Role,
    pub(crate) engine_id: String,
    /// This engine's HTTP address, which its prefill answers name.
    pub(crate) host: String,
    pub(crate) port: u16,
    transfer: kvgate_core::disagg::Transfer,
    time_scale: f64,
    pub(crate) held: Held,
    client: reqwest::Client,
    metrics: Arc<Mutex<MetricsState>>,
    /// The longest a decode leg waits for its prefill (SGLang's bootstrap) or for the read.
    wait: Duration,
}

impl Pd {
    pub(crate) fn new(
        config: &EngineConfig,
        addr: std::net::SocketAddr,
        metrics: Arc<Mutex<MetricsState>>,
    ) -> Self {
        let lease = Duration::from_secs_f64(config.kv_lease_secs);
        if config.role != Role::Both {
            metrics.lock().unwrap_or_else(|e| e.into_inner()).pd_shown = true;
        }
        Pd {
            role: config.role,
            engine_id: config.id.clone(),
            host: addr.ip().to_string(),
            port: addr.port(),
            transfer: kvgate_core::disagg::Transfer {
                bandwidth_gbps: config.kv_bandwidth_gbps,
                setup_ms: config.kv_transfer_setup_ms,
                bytes_per_token: config.kv_bytes_per_token,
            },
            time_scale: config.time_scale,
            held: Held::new(lease),
            client: reqwest::Client::new(),
            metrics,
            wait: Duration::from_millis(config.kv_wait_ms),
        }
    }

    fn count(&self, f: impl FnOnce(&mut PdMetrics)) {
        let mut m = self.metrics.lock().unwrap_or_else(|e| e.into_inner());
        m.pd_shown = true;
        f(&mut m.pd);
    }

    /// A prefill leg finished: its KV is held under `key` (SGLang's room), or under the
    /// answer's `response_id` (vLLM), for a decode engine to read. Returns the answer's
    /// `kv_transfer_params`.
    pub(crate) fn hold(
        &self,
        key: Option<String>,
        response_id: &str,
        prompt: &[u32],
        block_size: usize,
    ) -> serde_json::Value {
        let key = key.unwrap_or_else(|| response_id.to_owned());
        let params = self.params(&key, prompt.len(), block_size);
        let expired = self.held.put(key, prompt, Instant::now());
        self.count(|m| {
            m.prefills += 1;
            m.expired += expired;
        });
        params
    }

    /// The decode leg's prompt tokens that arrive by transfer: reads the held KV from
    /// `source` and sleeps the link's time; 0 (a local prefill) when the read fails.
    pub(crate) async fn fetch(&self, source: &Source, prompt: &[u32]) -> u32 {
        let Source::Remote {
            host,
            port,
            key,
            waits,
        } = source
        else {
            self.count(|m| m.invalid += 1);
            return 0;
        };
        let url = format!("http://{}/kv_transfer/read", join_host(host, *port));
        let body = held::ReadRequest {
            key: key.clone(),
            digest: held::digest(prompt),
            wait_ms: if *waits {
                self.wait.as_millis() as u64
            } else {
                0
            },
        };
        let read = self
            .client
            .post(url)
            .timeout(self.wait + Duration::from_secs(5))
            .json(&body)
            .send()
            .await;
        let tokens = match read {
            Ok(r) if r.status().is_success() => r
                .json::<held::ReadAnswer>()
                .await
                .map(|a| a.tokens.min(prompt.len() as u32))
                .ok(),
            _ => None,
        };
        let Some(tokens) = tokens else {
            self.count(|m| m.failed += 1);
            return 0;
        };
        let seconds = self.transfer.seconds(tokens);
        if self.time_scale > 0.0 {
            tokio::time::sleep(Duration::from_secs_f64(seconds * self.time_scale)).await;
        }
        let bytes = self.transfer.bytes(tokens);
        self.count(|m| {
            m.transfers += 1;
            m.bytes += bytes;
            m.xfer_time.observe(seconds);
        });
        tokens
    }

    /// The top-level `kv_transfer_params` of a prefill answer held under `key`.
    pub(crate) fn params(
        &self,
        key: &str,
        prompt_tokens: usize,
        block_size: usize,
    ) -> serde_json::Value {
        let blocks: Vec<usize> = (0..prompt_tokens.div_ceil(block_size.max(1))).collect();
        serde_json::json!({
            "do_remote_prefill": true,
            "do_remote_decode": false,
            "remote_block_ids": blocks,
            "remote_engine_id": self.engine_id,
            "remote_request_id": key,
            "remote_host": self.host,
            "remote_port": self.port,
            "tp_size": 1,
        })
    }
}

/// `host:port`, bracketing an IPv6 host.
fn join_host(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

#[cfg(test)]
mod tests;
