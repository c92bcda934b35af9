//! One upstream endpoint's configuration: where it is, how to reach it (TLS, keys, headers),
//! which model names it answers to, and its priority tier.

use crate::error::ConfigError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// One upstream engine.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EndpointConfig {
    /// Base URL, `http://host:port` or `https://host[:port]` (a trailing `/v1` is accepted and
    /// ignored). HTTPS upstreams speak HTTP/2 when they offer it.
    pub url: String,
    /// Display name for metrics and the `x-kvgate-endpoint` response header; the URL's
    /// authority when absent.
    pub name: Option<String>,
    /// Relative capacity (1.0 nominal).
    pub weight: f64,
    /// The model it serves; discovered from its `/v1/models` when absent.
    pub model: Option<String>,
    /// Free-form labels, reported by the admin API.
    pub labels: BTreeMap<String, String>,
    /// A key sent to this endpoint as `Authorization: Bearer KEY` in place of the client's own
    /// (for engines started with `--api-key`, as vLLM and SGLang allow); never reported by the
    /// admin API.
    pub api_key: Option<String>,
    /// The engine's KV-event publisher: `tcp://HOST:PORT` to connect to an engine that binds
    /// (vLLM `"endpoint": "tcp://*:PORT"`), or `bind:tcp://HOST:PORT` to listen for an engine
    /// that connects.
    pub kv_events: Option<String>,
    /// A PEM file of CA certificates trusted for `https://` upstreams besides the system's
    /// (a self-signed or private CA). Read at start: every endpoint's CAs join one trust store.
    pub ca_file: Option<PathBuf>,
    /// Headers sent upstream with every request to this endpoint (a provider's
    /// organisation or project header, say). `Authorization` belongs in `api_key`.
    pub headers: BTreeMap<String, String>,
    /// Priority tier, 0 first: a request goes to tier `n + 1` only when no endpoint of tiers up
    /// to `n` that serves its model can take it (down, breaker open, cooling down after a
    /// failure or a 429, or inside a Retry-After window).
    pub tier: u32,
    /// Public model names (aliases) this endpoint answers to besides `model`: a request for one
    /// is sent with its `model` field replaced by `model`, which must then be set.
    pub served_as: Vec<String>,
    /// What this deployment's tokens cost (a hosted provider's list price): the access log's
    /// `cost_usd` and `kvgate_cost_usd_total`; `tenancy.prices` for the model when absent.
    pub price: Option<kvgate_core::tenancy::Price>,
    /// Send the request's session as OpenAI's `prompt_cache_key` when the client set none,
    /// so a hosted provider's prompt cache keeps one conversation on one cache.
    pub prompt_cache_key: bool,
    /// The deployment's own rate limits (a provider account's RPM/TPM): at any of them it is
    /// left out of picks until it refills. A reload that changes them starts them afresh.
    pub limits: Option<kvgate_core::tenancy::LimitsConfig>,
    /// Which legs of a disaggregated request it serves (`disaggregation`): `prefill`
    /// endpoints only prefill, `decode` and `both` take the decode leg (and every request of
    /// a pool without prefill endpoints).
    pub role: EndpointRole,
    /// SGLang's bootstrap port of a prefill engine (its `--disaggregation-bootstrap-port`),
    /// sent as `bootstrap_port`; null when absent.
    pub bootstrap_port: Option<u16>,
}

/// An endpoint's part in prefill/decode disaggregation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndpointRole {
    /// Prefill legs only.
    Prefill,
    /// Decode legs.
    Decode,
    /// Either, and whole requests.
    #[default]
    Both,
}

impl Default for EndpointConfig {
    fn default() -> Self {
        EndpointConfig {
            url: String::new(),
            name: None,
            weight: 1.0,
            model: None,
            labels: BTreeMap::new(),
            api_key: None,
            kv_events: None,
            ca_file: None,
            headers: BTreeMap::new(),
            tier: 0,
            served_as: Vec::new(),
            price: None,
            prompt_cache_key: false,
            limits: None,
            role: EndpointRole::Both,
            bootstrap_port: None,
        }
    }
}

fn invalid(field: String, why: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field,
        why: why.into(),
    }
}

impl EndpointConfig {
    /// Checks this endpoint, the `i`th of the list (for the messages).
    pub(crate) fn check(&self, i: usize) -> Result<(), ConfigError> {
        let field = |name: &str| format!("endpoints[{i}].{name}");
        let base = self.base_url();
        let scheme_ok = ["http://", "https://"]
            .iter()
            .any(|s| base.starts_with(s) && base.len() > s.len());
        if !scheme_ok {
            return Err(invalid(
                field("url"),
                format!("{:?} must be an http:// or https:// URL", self.url),
            ));
        }
        if self
            .api_key
            .as_deref()
            .is_some_and(|k| k.is_empty() || !k.bytes().all(|b| b.is_ascii_graphic()))
        {
            return Err(invalid(
                field("api_key"),
                "must be non-empty printable ASCII without spaces",
            ));
        }
        if !(self.weight.is_finite() && self.weight > 0.0) {
            return Err(invalid(field("weight"), "must be positive"));
        }
        if let Some(Err(why)) = self
            .kv_events
            .as_deref()
            .map(crate::engine_state::EventSource::parse)
        {
            return Err(invalid(field("kv_events"), why));
        }
        for (name, value) in &self.headers {
            let ok = axum::http::HeaderName::from_bytes(name.as_bytes()).is_ok()
                && axum::http::HeaderValue::from_str(value).is_ok();
            if !ok {
                return Err(invalid(
                    field("headers"),
                    format!("{name:?}: {value:?} is not a valid HTTP header"),
                ));
            }
            if name.eq_ignore_ascii_case("authorization") || name.eq_ignore_ascii_case("host") {
                return Err(invalid(
                    field("headers"),
                    format!("{name:?} cannot be set here (use api_key for Authorization)"),
                ));
            }
        }
        if let Some(Err(why)) = self
            .price
            .as_ref()
            .map(kvgate_core::tenancy::Price::validate)
        {
            return Err(invalid(field("price"), why));
        }
        if let Some(Err(why)) = self
            .limits
            .as_ref()
            .map(kvgate_core::tenancy::LimitsConfig::validate)
        {
            return Err(invalid(field("limits"), why));
        }
        if !self.served_as.is_empty() && self.model.is_none() {
            return Err(invalid(
                field("served_as"),
                "needs `model`: the name a request for an alias is sent upstream with",
            ));
        }
        if let Some(alias) = self
            .served_as
            .iter()
            .find(|a| a.is_empty() || Some(a.as_str()) == self.model.as_deref())
        {
            return Err(invalid(
                field("served_as"),
                format!("{alias:?} is empty or the endpoint's own model name"),
            ));
        }
        Ok(())
    }

    /// An endpoint at `url` with default settings.
    pub fn from_url(url: impl Into<String>) -> Self {
        EndpointConfig {
            url: url.into(),
            ..EndpointConfig::default()
        }
    }

    /// The base URL without trailing `/` or `/v1`.
    pub fn base_url(&self) -> &str {
        let url = self.url.trim_end_matches('/');
        url.strip_suffix("/v1").unwrap_or(url)
    }

    /// The name used in metrics and headers.
    pub fn display_name(&self) -> String {
        self.name.clone().unwrap_or_else(|| {
            let base = self.base_url();
            base.split_once("://")
                .map_or(base, |(_, rest)| rest)
                .to_string()
        })
    }
}

/// When a tier passes a request on to the next (kvgate-core's dispatch core owns the rule).
pub use kvgate_core::dispatch::SpilloverConfig;
