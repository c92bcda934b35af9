//! Gateway replicas sharing routing state over NATS (`kvgate serve --cluster nats://...`).
//!
//! Each replica publishes what its pool learns from its own traffic (dispatches with their
//! prompts, first tokens, ends with the engine's usage) on one subject and applies its peers'
//! to its own pool ([`crate::pool::Pool::peer_dispatched`] and siblings), so every replica
//! counts every replica's in-flight requests, keeps every conversation in its prefix cache and
//! calibrates `predicted_ttft` from every replica's first tokens. Without it, N replicas each
//! see 1/N of the traffic: they herd onto the endpoint that looks idle to all of them, and a
//! conversation whose turns reach different replicas loses its affinity (`kvgate sim
//! --share-ms`, crates/sim/README.md).
//!
//! What is not shared, on purpose: breakers, cooldowns and Retry-After windows (each replica
//! learns an endpoint's failures from its own attempts, and a peer's retries already acted on
//! its own), and KV events, which every replica subscribes to at the engine (a ZMQ publisher
//! fans out to any number of subscribers; relaying them would only add delay). Rate limits and
//! budgets are shared with the bound stated in `crate::tenancy::shared`; concurrency caps stay
//! per replica.
//!
//! Consistency is best-effort and bounded in time: a peer's dispatch is visible here after one
//! NATS hop (sub-millisecond on a LAN) plus the publisher's batching (it sends whatever is
//! queued as soon as the previous batch is out). A peer that falls silent for
//! `peer_timeout_ms` (it died, or NATS is unreachable) has its in-flight requests dropped from
//! the ledger, so stale counts never outlive that bound; one that says goodbye is dropped at
//! once. A replica that joins (or reconnects) says hello and the first peer to answer sends
//! its recent dispatches (up to `warm_start_bytes`), which enter the prefix cache and, for
//! those still in flight, the ledger. While NATS is unreachable a replica routes on local
//! state alone (`kvgate_cluster_connected` 0, one warning) and reconnects on its own.

#[cfg(feature = "cluster")]
mod link;
mod metrics;
#[cfg(feature = "cluster")]
mod outbox;
#[cfg(feature = "cluster")]
mod peers;
#[cfg(feature = "cluster")]
mod receiver;
#[cfg(feature = "cluster")]
mod wire;

pub use metrics::ClusterMetrics;

use crate::pool::Pool;
use crate::tenancy::Tenancy;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use tokio::sync::watch;

#[cfg(feature = "cluster")]
pub(crate) use link::spawn;
#[cfg(feature = "cluster")]
use outbox::{Local, Outbox};

/// What the link shares and with what: the gateway's pool and tenancy, which it feeds with
/// the peers' news and whose own news it carries out.
#[derive(Debug)]
pub(crate) struct Sharing {
    pub(crate) config: ClusterConfig,
    pub(crate) pool: Arc<Pool>,
    pub(crate) tenancy: Arc<Tenancy>,
    /// The semantic cache, which stores the peers' answers too.
    pub(crate) semcache: Arc<crate::semcache::SemCache>,
    pub(crate) metrics: Arc<ClusterMetrics>,
    /// The gateway's seed, part of this replica's id.
    pub(crate) seed: u64,
    /// Turns true when the gateway stops.
    pub(crate) stop: watch::Receiver<bool>,
}

/// Without the `cluster` feature there is nothing to start: a configuration naming a NATS
/// server is refused when it is validated.
#[cfg(not(feature = "cluster"))]
pub(crate) fn spawn(_: Sharing) {}

/// `cluster:` in the configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// The NATS server (`nats://host:port`, comma-separated for several); sharing is off
    /// without one.
    pub url: Option<String>,
    /// Replicas with the same name share state; the subjects are `kvgate.<name>.*`.
    pub name: String,
    /// A replica with nothing to say says so this often, so peers know it lives.
    pub heartbeat_ms: u64,
    /// A peer silent this long is gone: its in-flight requests leave the ledger.
    pub peer_timeout_ms: u64,
    /// A peer's request with no end heard after this long leaves the ledger (a lost message).
    pub max_request_secs: u64,
    /// Prompt text sent per dispatch (and an eighth as many token ids, about as many bytes
    /// in JSON); longer prompts are cut, which keeps their head (the part requests share)
    /// within NATS's 1 MiB message limit.
    pub max_prompt_bytes: usize,
    /// Recent dispatches kept to warm up a replica that joins, by prompt bytes.
    pub warm_start_bytes: usize,
    /// Events waiting to be published; past it they are dropped and counted.
    pub queue: usize,
    /// How long a call that would lead a fan-out waits for rival claims from peers (see
    /// `agents.serialize_fanout`): above the NATS hop between replicas, well below a TTFT.
    pub fanout_window_ms: u64,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            url: None,
            name: "default".into(),
            heartbeat_ms: 500,
            peer_timeout_ms: 3000,
            max_request_secs: 900,
            max_prompt_bytes: 256 * 1024,
            warm_start_bytes: 8 * 1024 * 1024,
            queue: 65_536,
            fanout_window_ms: 3,
        }
    }
}

impl ClusterConfig {
    pub(crate) fn validate(&self) -> Result<(), crate::error::ConfigError> {
        let invalid = |field: &str, why: &str| crate::error::ConfigError::Invalid {
            field: format!("cluster.{field}"),
            why: why.into(),
        };
        if let Some(_url) = &self.url {
            if !cfg!(feature = "cluster") {
                return Err(invalid(
                    "url",
                    "this build has no cluster support (the gateway's `cluster` feature; the \
                     `kvgate` binary has it)",
                ));
            }
            #[cfg(feature = "cluster")]
            for server in _url.split(',') {
                server
                    .trim()
                    .parse::<async_nats::ServerAddr>()
                    .map_err(|e| invalid("url", &format!("`{server}`: {e}")))?;
            }
        }
        let subject_safe = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
        if self.name.is_empty() || !self.name.chars().all(subject_safe) {
            return Err(invalid("name", "must be letters, digits, `-` or `_`"));
        }
        if !(1..=60_000).contains(&self.heartbeat_ms) {
            return Err(invalid("heartbeat_ms", "must be between 1 and 60000"));
        }
        if self.peer_timeout_ms < 2 * self.heartbeat_ms || self.peer_timeout_ms > 3_600_000 {
            return Err(invalid(
                "peer_timeout_ms",
                "must be at least twice heartbeat_ms and at most 3600000",
            ));
        }
        if self.max_prompt_bytes < 1024 || self.max_prompt_bytes > 512 * 1024 {
            return Err(invalid(
                "max_prompt_bytes",
                "must be between 1024 and 524288 (NATS messages are 1 MiB at most by default)",
            ));
        }
        if self.fanout_window_ms > 100 {
            return Err(invalid(
                "fanout_window_ms",
                "must be at most 100 (every fan-out leader waits it)",
            ));
        }
        if self.queue == 0 || self.max_request_secs == 0 {
            return Err(invalid(
                "queue",
                "queue and max_request_secs must be above 0",
            ));
        }
        Ok(())
    }
}
