//! The gateway's configuration: one serde tree (YAML on disk) whose `policy` section is
//! [`kvgate_core::PolicyConfig`] and whose resilience sections are kvgate-core's own configs.
//! Command-line flags override the file through [`Config::set_policy_param`] and plain field
//! assignment; [`Config::validate`] runs after both.

use kvgate_core::resilience::{Backoff, BreakerConfig, HedgeConfig, RetryBudgetConfig};
use kvgate_core::PolicyConfig;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub use crate::endpoint_config::EndpointConfig;
mod model_names;
mod reloads;

pub(crate) use reloads::ReloadLog;

pub use crate::admission::{AdmissionConfig, QueueOrder};
pub use crate::error::ConfigError;
pub use crate::listener::{ListenerConfig, TlsConfig};
pub use crate::parse::RequestConfig;
pub use crate::watch::ScrapeConfig;

/// Everything `kvgate serve` needs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address to listen on.
    pub listen: String,
    /// The pool.
    pub endpoints: Vec<EndpointConfig>,
    /// The routing policy and its parameters.
    pub policy: PolicyConfig,
    /// Request parsing limits and identity headers.
    pub requests: RequestConfig,
    /// Retries before the first token.
    pub retry: RetryConfig,
    /// Per-endpoint circuit breaker.
    pub breaker: BreakerConfig,
    /// Hedged requests.
    pub hedge: HedgeConfig,
    /// Concurrency limit and queue.
    pub admission: AdmissionConfig,
    /// Engine metrics scraping and health checks.
    pub scrape: ScrapeConfig,
    /// How long in-flight streams may run after SIGTERM.
    pub shutdown_grace_secs: u64,
    /// Bearer token for `/admin/*`; the admin API is off without one.
    pub admin_token: Option<String>,
    /// A separate address for `/admin/*` and `/metrics` (they then leave the public listener).
    pub admin_listen: Option<String>,
    /// Connection limits and timeouts of the listeners.
    pub listener: ListenerConfig,
    /// TLS on the listeners; plain TCP without it.
    pub tls: Option<TlsConfig>,
    /// Access log and decision records.
    pub observability: crate::observe::ObservabilityConfig,
    /// API keys, tenants, rate limits, budgets and agent controls.
    pub tenancy: crate::tenancy::TenancyConfig,
    /// Per model, a directory with its `tokenizer.json` and chat template (`*` for any model):
    /// prompts are then tokenized as the engine will, for exact prefix matching.
    pub tokenizers: BTreeMap<String, std::path::PathBuf>,
    /// Bytes each tokenizer keeps of its sessions' last prompts (rendered text, token ids and
    /// messages), so that a session's next turn is tokenized from where it parts from the last
    /// one; least recently used sessions are forgotten past it (`kvgate_tokenize::PromptMemo`).
    pub tokenizer_memo_bytes: usize,
    /// Ingesting the engines' KV-cache events (each endpoint's `kv_events`).
    pub kv_events: crate::engine_state::KvEventsConfig,
    /// When a priority tier passes requests it could take to the next one.
    pub spillover: crate::endpoint_config::SpilloverConfig,
    /// Continuing streams that break after the first token on another endpoint.
    pub resume: crate::resume::ResumeConfig,
    /// Sharing routing state with other replicas over NATS.
    pub cluster: crate::cluster::ClusterConfig,
    /// Endpoints discovered from the Kubernetes API (an InferencePool's pods).
    pub discovery: crate::discovery::DiscoveryConfig,
    /// Answers served again to the same or a similar request (off by default).
    pub semantic_cache: crate::semcache::SemanticCacheConfig,
    /// LoRA adapters loaded on demand (off by default).
    pub lora: crate::lora_load::LoraConfig,
    /// Names that route each request to a cheap or a strong model by its difficulty.
    pub routing: crate::difficulty::RoutingConfig,
    /// Prefill/decode disaggregation, for a pool with `role: prefill` endpoints.
    pub disaggregation: crate::disagg::DisaggConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:8080".into(),
            endpoints: Vec::new(),
            policy: PolicyConfig::PredictedTtft(Default::default()),
            requests: RequestConfig::default(),
            retry: RetryConfig::default(),
            breaker: BreakerConfig::default(),
            hedge: HedgeConfig::default(),
            admission: AdmissionConfig::default(),
            scrape: ScrapeConfig::default(),
            shutdown_grace_secs: 30,
            admin_token: None,
            admin_listen: None,
            listener: ListenerConfig::default(),
            tls: None,
            observability: Default::default(),
            tenancy: Default::default(),
            tokenizers: BTreeMap::new(),
            tokenizer_memo_bytes: kvgate_tokenize::DEFAULT_MEMO_BYTES,
            kv_events: Default::default(),
            spillover: Default::default(),
            resume: Default::default(),
            cluster: Default::default(),
            discovery: Default::default(),
            semantic_cache: Default::default(),
            lora: Default::default(),
            routing: Default::default(),
            disaggregation: Default::default(),
        }
    }
}

/// Retries before the first token.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryConfig {
    /// Attempts per request including the first (hedges not counted).
    pub max_attempts: u32,
    /// Waits between attempts.
    pub backoff: Backoff,
    /// Cap on retries as a share of traffic.
    pub budget: RetryBudgetConfig,
    /// Longest Retry-After honoured, in seconds.
    pub max_retry_after_secs: u64,
    /// A streaming attempt without first bytes after this long fails as a timeout and may be
    /// retried; 0 waits as long as the client does (hedging is the gentler tool for stalls).
    /// Non-streaming requests are exempt: their first bytes arrive only when generation ends.
    pub first_token_timeout_ms: u64,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            max_attempts: 3,
            backoff: Backoff::default(),
            budget: RetryBudgetConfig::default(),
            max_retry_after_secs: 60,
            first_token_timeout_ms: 0,
        }
    }
}

impl Config {
    /// Parses YAML (unknown fields are errors) and validates.
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        let config: Config = yaml_serde::from_str(text).map_err(ConfigError::Yaml)?;
        config.validate()?;
        Ok(config)
    }

    /// Replaces the policy by `name` with its defaults, unless it already is that policy.
    pub fn set_policy(&mut self, name: &str) -> Result<(), ConfigError> {
        if self.policy.name() != name {
            self.policy = PolicyConfig::default_for(name)
                .ok_or_else(|| ConfigError::UnknownPolicy(name.to_string()))?;
        }
        Ok(())
    }

    /// Sets one policy parameter, `key` possibly dotted (`load.expiry_ms`). The value is read as
    /// JSON when it parses (numbers, booleans) and as a string otherwise.
    pub fn set_policy_param(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        let err = |source| ConfigError::PolicyParam {
            key: key.to_string(),
            value: value.to_string(),
            source,
        };
        let mut tree = serde_json::to_value(&self.policy).map_err(err)?;
        let parsed = serde_json::from_str(value)
            .unwrap_or_else(|_| serde_json::Value::String(value.to_string()));
        let mut node = &mut tree;
        let mut parts = key.split('.').peekable();
        while let Some(part) = parts.next() {
            let map = node
                .as_object_mut()
                .ok_or_else(|| err(serde::de::Error::custom(format!("{part} is not a section"))))?;
            if parts.peek().is_none() {
                map.insert(part.to_string(), parsed.clone());
                break;
            }
            node = map.entry(part.to_string()).or_insert(serde_json::json!({}));
        }
        self.policy = serde_json::from_value(tree).map_err(err)?;
        Ok(())
    }

    /// The pool's part of the configuration.
    pub fn pool_settings(&self) -> crate::pool::Settings {
        crate::pool::Settings {
            dispatch: kvgate_core::dispatch::DispatchConfig {
                retry_budget: self.retry.budget.clone(),
                hedge: self.hedge.clone(),
                breaker: self.breaker.clone(),
                spillover: self.spillover.clone(),
                charge: self.tenancy.charge,
                lora_gate: self.lora.gate.clone(),
            },
            policy: self.policy.clone(),
            max_event_entries: self.kv_events.max_entries_per_endpoint,
            decision_records: self.observability.decision_records,
        }
    }

    /// Checks every section.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.policy.validate()?;
        self.observability.validate()?;
        for (i, e) in self.endpoints.iter().enumerate() {
            e.check(i)?;
        }
        model_names::check(self)?;
        self.routing.validate(&model_names::declared(self))?;
        self.kv_events.validate()?;
        self.spillover
            .validate()
            .map_err(|(field, why)| ConfigError::invalid(field, why))?;
        self.cluster.validate()?;
        self.discovery.validate()?;
        self.semantic_cache.validate()?;
        self.lora.validate()?;
        self.disaggregation.validate()?;
        if self.retry.max_attempts == 0 {
            return Err(ConfigError::invalid(
                "retry.max_attempts",
                "must be at least 1",
            ));
        }
        if !(self.retry.budget.ratio.is_finite() && self.retry.budget.ratio >= 0.0) {
            return Err(ConfigError::invalid(
                "retry.budget.ratio",
                "must not be negative",
            ));
        }
        if !(0.0..=1.0).contains(&self.breaker.failure_ratio) {
            return Err(ConfigError::invalid(
                "breaker.failure_ratio",
                "must be within 0..=1",
            ));
        }
        if !(0.0..=100.0).contains(&self.hedge.percentile) {
            return Err(ConfigError::invalid(
                "hedge.percentile",
                "must be within 0..=100",
            ));
        }
        // The TTFT window is allocated when the gateway starts and sorted every 16 samples.
        if self.hedge.window > 65_536 {
            return Err(ConfigError::invalid(
                "hedge.window",
                "must be at most 65536",
            ));
        }
        self.tenancy.validate()?;
        self.requests.validate()?;
        self.scrape.validate()?;
        self.admission.validate()?;
        self.resume.validate()?;
        if self.admin_listen.is_some() && self.admin_token.is_none() {
            return Err(ConfigError::invalid(
                "admin_listen",
                "needs admin_token: the admin API is off without one",
            ));
        }
        if self
            .tls
            .as_ref()
            .is_some_and(|t| t.admin_client_ca_file.is_some())
            && self.admin_listen.is_none()
        {
            return Err(ConfigError::invalid(
                "tls.admin_client_ca_file",
                "needs admin_listen: client certificates are asked on the admin listener",
            ));
        }
        self.listener.validate()
    }
}

#[cfg(test)]
mod tests;
