//! The gateway's configuration: one serde tree (YAML on disk) whose `policy` section is
//! [`kvgate_core::PolicyConfig`] and whose resilience sections are kvgate-core's own configs.
//! Command-line flags override the file through [`Config::set_policy_param`] and plain field
//! assignment; [`Config::validate`] runs after both.

use kvgate_core::resilience::{Backoff, BreakerConfig, HedgeConfig, RetryBudgetConfig};
use kvgate_core::PolicyConfig;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub use crate::endpoint_config::EndpointConfig;

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
}

/// TLS on the listeners. The files are PEM and are re-read when they change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// The certificate chain, leaf first.
    pub cert_file: std::path::PathBuf,
    /// Its private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: std::path::PathBuf,
    /// When set, the admin listener requires client certificates signed by these CAs (mTLS).
    #[serde(default)]
    pub admin_client_ca_file: Option<std::path::PathBuf>,
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
            kv_events: Default::default(),
            spillover: Default::default(),
            resume: Default::default(),
            cluster: Default::default(),
            discovery: Default::default(),
        }
    }
}

/// Request parsing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RequestConfig {
    /// Largest accepted body.
    pub max_body_bytes: usize,
    /// Largest accepted `max_tokens` / `max_completion_tokens`.
    pub max_tokens_limit: u64,
    /// Header naming the tenant; else the hashed API key.
    pub tenant_header: String,
    /// Header naming the session.
    pub session_header: String,
    /// Further headers read as the session when `session_header` is absent, in order (the
    /// conventions of other gateways and SDKs).
    pub session_fallback_headers: Vec<String>,
    /// Top-level body fields read as the session when no header names one (OpenAI's `user`
    /// identifies the end user, whose conversations share a prefix).
    pub session_body_fields: Vec<String>,
    /// Ask streaming upstreams for a final usage chunk (`stream_options.include_usage`) when the
    /// client did not, and strip that chunk from what the client receives: usage's
    /// `cached_tokens` is how kvgate learns whether its cache prediction held.
    pub stream_usage: bool,
    /// Header carrying the request's deadline in milliseconds from arrival.
    pub deadline_header: String,
    /// Header carrying the priority (`interactive` or `batch`).
    pub priority_header: String,
}

impl Default for RequestConfig {
    fn default() -> Self {
        RequestConfig {
            max_body_bytes: 8 * 1024 * 1024,
            max_tokens_limit: 1 << 20,
            tenant_header: "x-kvgate-tenant".into(),
            session_header: "x-kvgate-session".into(),
            session_fallback_headers: vec!["x-session-id".into(), "session_id".into()],
            session_body_fields: vec!["user".into()],
            stream_usage: true,
            deadline_header: "x-kvgate-deadline-ms".into(),
            priority_header: "x-kvgate-priority".into(),
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

/// The pool's concurrency limit and queue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdmissionConfig {
    /// Requests in flight upstream at once.
    pub max_concurrency: usize,
    /// Requests waiting for a slot; beyond it the gateway answers 429.
    pub max_queue: usize,
    /// Longest wait in the queue when the request carries no deadline.
    pub queue_timeout_ms: u64,
    /// The Retry-After sent with a 429 from a full queue.
    pub retry_after_secs: u64,
    /// Who gets a freed slot: the tenant with the least weighted service (`fair`) or the
    /// oldest request (`fifo`).
    pub order: QueueOrder,
    /// A waiting batch request goes before interactive ones once it has waited this long.
    pub batch_max_wait_ms: u64,
    /// Slots beyond `max_concurrency` that an interactive request of a tenant with nothing
    /// waiting and no more service than any waiting tenant may take at once (`order: fair`);
    /// `max_concurrency / 8` (at least 1) when absent, 0 turns it off.
    pub fair_headroom: Option<usize>,
    /// While requests wait, one leaves the queue only if fewer than this many requests sent
    /// are without their first bytes (queued or prefilling in an engine); headroom admissions
    /// skip it. Fewer than the endpoints keeps an engine free of backlogged tenants' long
    /// prefills for the others (`crate::admission`). Off when absent. A non-streamed request
    /// counts until its answer: the gateway cannot see its first token.
    pub max_prefills: Option<usize>,
}

/// The order of the admission queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueOrder {
    /// Virtual token counter per tenant (Sheng et al., OSDI 2024).
    #[default]
    Fair,
    /// Arrival order.
    Fifo,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            max_concurrency: 4096,
            max_queue: 4096,
            queue_timeout_ms: 30_000,
            retry_after_secs: 1,
            order: QueueOrder::Fair,
            batch_max_wait_ms: 10_000,
            fair_headroom: None,
            max_prefills: None,
        }
    }
}

/// How the listeners treat client connections: the bounds an exposed server needs so that slow
/// or idle clients cannot hold its file descriptors (a slowloris client sends half a header and
/// waits). Read once at start; a reload does not change them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ListenerConfig {
    /// Time a client has to send a request's headers, from the moment the connection starts
    /// waiting for them. On HTTP/1 this also bounds an idle keep-alive connection (hyper starts
    /// the clock when it waits for the next request). nginx uses 60 s, hyper 30 s; an API
    /// client sends its headers in one write.
    pub header_read_timeout_secs: f64,
    /// A connection with no request in flight for this long is closed (HTTP/2 mainly; see
    /// `header_read_timeout_secs` for HTTP/1). nginx's keep-alive timeout is 75 s.
    pub idle_timeout_secs: f64,
    /// Client connections open at once, admin listener included. At the cap a new connection
    /// closes the oldest one with no request in flight, or is refused when every one is busy,
    /// so half-open connections cannot lock out real clients.
    pub max_connections: usize,
    /// Largest request head (request line and headers); larger gets 431. Envoy allows 60 KiB.
    pub max_header_bytes: usize,
    /// Most header fields in one request; more gets 431 (Envoy's and hyper's default, 100).
    pub max_headers: usize,
    /// Serve HTTP/2 (prior knowledge on plain TCP) beside HTTP/1.1.
    pub http2: bool,
    /// Concurrent streams per HTTP/2 connection (nginx: 128).
    pub http2_max_concurrent_streams: u32,
}

impl Default for ListenerConfig {
    fn default() -> Self {
        ListenerConfig {
            header_read_timeout_secs: 20.0,
            idle_timeout_secs: 120.0,
            max_connections: 10_000,
            max_header_bytes: 64 * 1024,
            max_headers: 100,
            http2: true,
            http2_max_concurrent_streams: 256,
        }
    }
}

impl ListenerConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        // Both become `Duration`s, which cannot hold more than about 1.8e19 seconds, and the
        // connection sweep ticks at a quarter of the header timeout, which must not round to 0.
        const SECS: &str = "must be between 0.001 and 1e9 seconds";
        let seconds = |v: f64| (0.001..=1e9).contains(&v);
        if !seconds(self.header_read_timeout_secs) {
            return Err(invalid("listener.header_read_timeout_secs", SECS));
        }
        if !seconds(self.idle_timeout_secs) {
            return Err(invalid("listener.idle_timeout_secs", SECS));
        }
        if self.max_connections == 0 {
            return Err(invalid("listener.max_connections", "must be at least 1"));
        }
        // hyper's read buffer, which bounds the head, cannot be smaller than 8 KiB.
        if self.max_header_bytes < 8192 {
            return Err(invalid(
                "listener.max_header_bytes",
                "must be at least 8192",
            ));
        }
        if self.max_headers == 0 {
            return Err(invalid("listener.max_headers", "must be at least 1"));
        }
        if self.http2_max_concurrent_streams == 0 {
            return Err(invalid(
                "listener.http2_max_concurrent_streams",
                "must be at least 1",
            ));
        }
        Ok(())
    }
}

/// Engine metrics scraping.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScrapeConfig {
    /// Period of each endpoint's scrape; each loop starts at a random phase within it.
    pub interval_ms: u64,
    /// Timeout of one scrape.
    pub timeout_ms: u64,
    /// Consecutive failed scrapes after which an endpoint is unhealthy.
    pub unhealthy_after: u32,
}

impl Default for ScrapeConfig {
    fn default() -> Self {
        ScrapeConfig {
            interval_ms: 500,
            timeout_ms: 1_000,
            unhealthy_after: 2,
        }
    }
}

/// A configuration that cannot run.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The YAML did not parse or had unknown fields.
    #[error("configuration file: {0}")]
    Yaml(#[source] yaml_serde::Error),
    /// A policy parameter is out of range.
    #[error(transparent)]
    Policy(#[from] kvgate_core::policy::ConfigError),
    /// No policy has that name.
    #[error("unknown policy {0:?}; `kvgate policies` lists them")]
    UnknownPolicy(String),
    /// `--policy-set` named a parameter the policy does not have or gave a bad value.
    #[error("policy parameter {key}={value}: {source}")]
    PolicyParam {
        /// The parameter.
        key: String,
        /// The value given.
        value: String,
        /// Why it was refused.
        #[source]
        source: serde_json::Error,
    },
    /// The TLS files cannot be used.
    #[error(transparent)]
    Tls(#[from] crate::listener::tls::TlsError),
    /// The access log file could not be opened.
    #[error("observability.access_log: cannot open {path}: {source}")]
    AccessLog {
        /// The path.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Some other field is invalid.
    #[error("{field}: {why}")]
    Invalid {
        /// The field.
        field: String,
        /// What is wrong.
        why: String,
    },
}

fn invalid(field: impl Into<String>, why: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        why: why.into(),
    }
}

/// More slots or queue places than this is a typo, not a plan.
const MAX_SLOTS: usize = 1 << 24;

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

    /// Checks every section.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.policy.validate()?;
        self.observability.validate()?;
        for (i, e) in self.endpoints.iter().enumerate() {
            e.check(i)?;
        }
        crate::model_names::check(self)?;
        self.kv_events.validate()?;
        self.spillover
            .validate()
            .map_err(|(field, why)| invalid(field, why))?;
        self.cluster.validate()?;
        self.discovery.validate()?;
        if self.retry.max_attempts == 0 {
            return Err(invalid("retry.max_attempts", "must be at least 1"));
        }
        // A head shorter than vLLM's default block (16 tokens) would cache nothing.
        if (1..16).contains(&self.resume.stage_tokens) {
            return Err(invalid(
                "resume.stage_tokens",
                "must be 0 (off) or at least 16",
            ));
        }
        if self.resume.rehome_s > 0 && self.resume.rehome_sessions == 0 {
            return Err(invalid(
                "resume.rehome_sessions",
                "must be at least 1 when resume.rehome_s is on",
            ));
        }
        if !(self.retry.budget.ratio.is_finite() && self.retry.budget.ratio >= 0.0) {
            return Err(invalid("retry.budget.ratio", "must not be negative"));
        }
        if !(0.0..=1.0).contains(&self.breaker.failure_ratio) {
            return Err(invalid("breaker.failure_ratio", "must be within 0..=1"));
        }
        if !(0.0..=100.0).contains(&self.hedge.percentile) {
            return Err(invalid("hedge.percentile", "must be within 0..=100"));
        }
        // The TTFT window is allocated when the gateway starts and sorted every 16 samples.
        if self.hedge.window > 65_536 {
            return Err(invalid("hedge.window", "must be at most 65536"));
        }
        if !(1..=MAX_SLOTS).contains(&self.admission.max_concurrency) {
            return Err(invalid(
                "admission.max_concurrency",
                format!("must be from 1 to {MAX_SLOTS}"),
            ));
        }
        if self.admission.max_queue > MAX_SLOTS
            || self.admission.fair_headroom.is_some_and(|h| h > MAX_SLOTS)
        {
            return Err(invalid(
                "admission.max_queue",
                format!("and admission.fair_headroom must be at most {MAX_SLOTS}"),
            ));
        }
        if self
            .admission
            .max_prefills
            .is_some_and(|m| !(1..=MAX_SLOTS).contains(&m))
        {
            return Err(invalid(
                "admission.max_prefills",
                format!("must be from 1 to {MAX_SLOTS}"),
            ));
        }
        self.tenancy.validate()?;
        if self.requests.max_body_bytes == 0 {
            return Err(invalid("requests.max_body_bytes", "must be positive"));
        }
        // Both are added to `Instant`s, which overflow far below u64::MAX milliseconds; a day
        // is beyond any useful period or timeout.
        const DAY_MS: u64 = 86_400_000;
        if !(1..=DAY_MS).contains(&self.scrape.interval_ms) {
            return Err(invalid(
                "scrape.interval_ms",
                "must be between 1 and 86400000",
            ));
        }
        if !(1..=DAY_MS).contains(&self.scrape.timeout_ms) {
            return Err(invalid(
                "scrape.timeout_ms",
                "must be between 1 and 86400000",
            ));
        }
        if self.admin_listen.is_some() && self.admin_token.is_none() {
            return Err(invalid(
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
            return Err(invalid(
                "tls.admin_client_ca_file",
                "needs admin_listen: client certificates are asked on the admin listener",
            ));
        }
        self.listener.validate()
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
