//! `semantic_cache:` in the configuration.

use crate::error::ConfigError;
use kvgate_core::semcache::{Guards, Limits};
use kvgate_core::Nanos;
use serde::{Deserialize, Serialize};

/// The semantic cache: off unless `enabled`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SemanticCacheConfig {
    /// Answers are looked up and stored only when true.
    pub enabled: bool,
    /// Whose answers a request may receive: its tenant's, or only its own key's.
    pub scope: CacheScope,
    /// The least cosine similarity of a semantic hit. It depends on the embedder and must be
    /// calibrated for it (values in use range from 0.8 to 0.95).
    pub threshold: f32,
    /// How long an answer is served after it was stored, in seconds.
    pub ttl_secs: u64,
    /// At most this many answers are kept; the least recently used go first.
    pub max_entries: usize,
    /// At most this many bytes of answers (with their messages and embeddings).
    pub max_bytes: usize,
    /// A longer answer is passed on but not stored.
    pub max_entry_bytes: usize,
    /// Requests sampled above this temperature are neither served from nor stored in the
    /// cache (a request without one samples at 1, the OpenAI API's default).
    pub max_temperature: f64,
    /// How the last user message is embedded; exact matches only without one.
    pub embedder: Option<EmbedderConfig>,
    /// The longest an embedding may take; past it the request is a miss and goes upstream.
    pub embed_deadline_ms: u64,
    /// The textual checks a similarity hit must pass.
    pub guards: Guards,
    /// How long identical requests wait for the first of them to be answered (one upstream
    /// call for them all) before each makes its own; 0 turns the wait off.
    pub singleflight_wait_ms: u64,
    /// Stored answers are published to the other replicas (`cluster:`) and theirs applied.
    pub share: bool,
}

/// See [`SemanticCacheConfig::scope`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheScope {
    /// Answers are shared among the keys of one tenant.
    Tenant,
    /// Answers are shared only among requests with the same key (the tenant without keys).
    Key,
}

/// Where embeddings come from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum EmbedderConfig {
    /// An OpenAI-compatible `POST {url}/v1/embeddings` (vLLM's pooling runner, the emulated
    /// engine, a hosted API).
    Openai {
        /// The server's base URL.
        url: String,
        /// The `model` field sent.
        model: String,
        /// The environment variable holding a bearer key, if the server wants one.
        #[serde(default)]
        api_key_env: Option<String>,
    },
    /// A static embedding model in process: a directory with `tokenizer.json` and the
    /// embedding matrix as safetensors (WordLlama's files; `scripts/fetch-static-embedder.sh`).
    Static {
        /// The directory.
        dir: std::path::PathBuf,
    },
}

impl Default for SemanticCacheConfig {
    fn default() -> Self {
        SemanticCacheConfig {
            enabled: false,
            scope: CacheScope::Tenant,
            threshold: 0.9,
            ttl_secs: 300,
            max_entries: 10_000,
            max_bytes: 64 << 20,
            max_entry_bytes: 1 << 20,
            max_temperature: 1.0,
            embedder: None,
            embed_deadline_ms: 200,
            guards: Guards::default(),
            singleflight_wait_ms: 10_000,
            share: true,
        }
    }
}

impl SemanticCacheConfig {
    /// Checks the section.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |field: &str, why: &str| ConfigError::Invalid {
            field: format!("semantic_cache.{field}"),
            why: why.into(),
        };
        if !(self.threshold.is_finite() && (0.0..=1.0).contains(&self.threshold)) {
            return Err(invalid("threshold", "must be within 0..=1"));
        }
        if self.ttl_secs == 0 {
            return Err(invalid("ttl_secs", "must be above 0"));
        }
        if self.max_entries == 0 || self.max_bytes == 0 || self.max_entry_bytes == 0 {
            return Err(invalid(
                "max_entries",
                "max_entries, max_bytes and max_entry_bytes must be above 0",
            ));
        }
        if self.max_entry_bytes > self.max_bytes {
            return Err(invalid("max_entry_bytes", "must not exceed max_bytes"));
        }
        if !(self.max_temperature.is_finite() && self.max_temperature >= 0.0) {
            return Err(invalid("max_temperature", "must not be negative"));
        }
        if !(1..=60_000).contains(&self.embed_deadline_ms) {
            return Err(invalid("embed_deadline_ms", "must be between 1 and 60000"));
        }
        if self.singleflight_wait_ms > 600_000 {
            return Err(invalid("singleflight_wait_ms", "must be at most 600000"));
        }
        match &self.embedder {
            Some(EmbedderConfig::Openai { url, model, .. }) => {
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(invalid(
                        "embedder.url",
                        "must start with http:// or https://",
                    ));
                }
                if model.is_empty() {
                    return Err(invalid("embedder.model", "must not be empty"));
                }
            }
            Some(EmbedderConfig::Static { dir }) if dir.as_os_str().is_empty() => {
                return Err(invalid("embedder.dir", "must not be empty"));
            }
            _ => {}
        }
        Ok(())
    }

    /// The store's bounds.
    pub(crate) fn limits(&self) -> Limits {
        Limits {
            ttl: Nanos::from_secs(self.ttl_secs),
            max_entries: self.max_entries,
            max_bytes: self.max_bytes,
            threshold: self.threshold,
            guards: self.guards,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    #[test]
    fn off_by_default_and_every_bad_value_is_named() {
        let config = Config::from_yaml("{}").unwrap();
        assert!(!config.semantic_cache.enabled);
        let refused = |yaml: &str| Config::from_yaml(yaml).unwrap_err().to_string();
        for (yaml, field) in [
            (
                "semantic_cache: {threshold: 1.5}",
                "semantic_cache.threshold",
            ),
            ("semantic_cache: {ttl_secs: 0}", "semantic_cache.ttl_secs"),
            (
                "semantic_cache: {max_entries: 0}",
                "semantic_cache.max_entries",
            ),
            (
                "semantic_cache: {max_bytes: 10, max_entry_bytes: 20}",
                "semantic_cache.max_entry_bytes",
            ),
            (
                "semantic_cache: {max_temperature: -1}",
                "semantic_cache.max_temperature",
            ),
            (
                "semantic_cache: {embed_deadline_ms: 0}",
                "semantic_cache.embed_deadline_ms",
            ),
            (
                "semantic_cache: {embedder: {type: openai, url: x, model: m}}",
                "semantic_cache.embedder.url",
            ),
            (
                "semantic_cache: {embedder: {type: openai, url: 'http://e', model: ''}}",
                "semantic_cache.embedder.model",
            ),
        ] {
            assert!(refused(yaml).contains(field), "{yaml}: {}", refused(yaml));
        }
        assert!(refused("semantic_cache: {enabled: true, thresold: 0.8}").contains("thresold"));
        let yaml = "semantic_cache: {enabled: true, scope: key, guards: {order: false},
            embedder: {type: static, dir: /models/w}}";
        let config = Config::from_yaml(yaml).unwrap();
        assert!(!config.semantic_cache.guards.order);
    }
}
