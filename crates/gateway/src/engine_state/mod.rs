//! What the engines really hold, rather than what the gateway guesses: prompts tokenized as
//! the engine will tokenize them ([`Tokenizers`]), and the engines' own KV-cache events
//! (read by `crate::watch`, decoded by [`decode`]) laid over the prefix index by `kvgate_core::index::events`.
//!
//! The two go together: KV events name blocks of token ids, so only a request whose prompt the
//! gateway tokenized exactly can be matched against them. Requests without tokens (no tokenizer
//! for their model, or a template the gateway failed to render) fall back to the approximate
//! index, and so does an endpoint whose event stream lost messages.

mod decode;
pub mod exposition;
pub mod lora;
mod metrics;

pub(crate) use decode::decode;

pub use exposition::Incarnation;
pub use metrics::{EngineStateMetrics, StreamLabels};

use kvgate_tokenize::ChatTokenizer;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

/// Ingesting KV events.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KvEventsConfig {
    /// Entries (a block in one cache tier) kept per endpoint; an endpoint reporting more is
    /// reset and falls back to the approximate index. The default, 262,144, is 4M tokens of
    /// 16-token blocks: more than any single engine kvgate has met caches.
    pub max_entries_per_endpoint: usize,
    /// With `tcp://` (the gateway connects), reconnect after this long without a message: the
    /// ZMQ library does not reconnect by itself, and a restarted engine is a new publisher. A
    /// reconnect can lose a batch published in that instant, which the sequence number shows.
    pub idle_reconnect_ms: u64,
}

impl Default for KvEventsConfig {
    fn default() -> Self {
        KvEventsConfig {
            max_entries_per_endpoint: 262_144,
            idle_reconnect_ms: 5_000,
        }
    }
}

impl KvEventsConfig {
    pub(crate) fn validate(&self) -> Result<(), crate::error::ConfigError> {
        let bad = |field: &str, why: &str| crate::error::ConfigError::Invalid {
            field: format!("kv_events.{field}"),
            why: why.into(),
        };
        if self.max_entries_per_endpoint == 0 {
            return Err(bad("max_entries_per_endpoint", "must be at least 1"));
        }
        if self.idle_reconnect_ms < 100 {
            return Err(bad("idle_reconnect_ms", "must be at least 100"));
        }
        Ok(())
    }
}

/// Where an endpoint's events come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventSource {
    /// The engine binds (`tcp://*:PORT` in vLLM); the gateway connects here.
    Connect(String),
    /// The engine connects; the gateway binds here (one engine per address).
    Bind(String),
}

impl EventSource {
    /// Reads `tcp://HOST:PORT` or `bind:tcp://HOST:PORT`.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let (bind, address) = match spec.strip_prefix("bind:") {
            Some(rest) => (true, rest),
            None => (false, spec),
        };
        let Some(hostport) = address.strip_prefix("tcp://") else {
            return Err(format!(
                "{spec:?} must be tcp://HOST:PORT (connect) or bind:tcp://HOST:PORT"
            ));
        };
        let port_ok = hostport
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if !port_ok {
            return Err(format!("{spec:?}: the address needs a host and a port"));
        }
        Ok(if bind {
            EventSource::Bind(address.to_owned())
        } else {
            EventSource::Connect(address.to_owned())
        })
    }
}

/// The tokenizers of the configured models, loaded once at startup.
#[derive(Debug, Default)]
pub struct Tokenizers {
    by_model: BTreeMap<String, Arc<ChatTokenizer>>,
    any: Option<Arc<ChatTokenizer>>,
}

impl Tokenizers {
    /// Loads every directory of `dirs` (model name, or `*` for any model), each keeping up to
    /// `memo_bytes` of its sessions' last prompts.
    pub(crate) fn load(
        dirs: &BTreeMap<String, PathBuf>,
        memo_bytes: usize,
    ) -> Result<Self, crate::error::ConfigError> {
        let mut out = Tokenizers::default();
        for (model, dir) in dirs {
            let tokenizer = ChatTokenizer::load(dir)
                .map_err(|e| crate::error::ConfigError::Invalid {
                    field: format!("tokenizers.{model}"),
                    why: format!("{}: {e}", dir.display()),
                })?
                .with_memo_budget(memo_bytes);
            let tokenizer = Arc::new(tokenizer);
            if model == "*" {
                out.any = Some(tokenizer);
            } else {
                out.by_model.insert(model.clone(), tokenizer);
            }
        }
        Ok(out)
    }

    /// The tokenizer for `model` (or the `*` one).
    pub fn get(&self, model: Option<&str>) -> Option<&ChatTokenizer> {
        model
            .and_then(|m| self.by_model.get(m))
            .or(self.any.as_ref())
            .map(Arc::as_ref)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_parse_or_say_why_not() {
        assert_eq!(
            EventSource::parse("tcp://10.0.0.1:5557"),
            Ok(EventSource::Connect("tcp://10.0.0.1:5557".into()))
        );
        assert_eq!(
            EventSource::parse("bind:tcp://127.0.0.1:5557"),
            Ok(EventSource::Bind("tcp://127.0.0.1:5557".into()))
        );
        assert!(EventSource::parse("ipc:///tmp/x").is_err());
        assert!(EventSource::parse("tcp://host").is_err());
        assert!(EventSource::parse("tcp://:80").is_err());
    }

    #[test]
    fn a_bad_tokenizer_directory_is_a_config_error_naming_it() {
        let dirs = BTreeMap::from([("m".to_owned(), PathBuf::from("no/such/dir"))]);
        let err = Tokenizers::load(&dirs, 0).unwrap_err().to_string();
        assert!(
            err.contains("tokenizers.m") && err.contains("tokenizer.json"),
            "{err}"
        );
    }
}
