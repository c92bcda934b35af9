//! One endpoint as the gateway keeps it: what it is (URL, name, models, key, headers), its
//! in-flight counter and iteration clock. Its eligibility state (health checks, breaker,
//! Retry-After window, last scrape) is the dispatch core's member; readers get both in the
//! published snapshot ([`super::Snapshot`]).

use crate::endpoint_config::EndpointConfig;
use crate::upstream::Trouble;
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use kvgate_core::dispatch::{MemberSpec, Serving, Status};
use kvgate_core::EndpointId;
use std::sync::atomic::AtomicU32;
use std::sync::Arc;

/// What an endpoint is; replaced as a whole when its configuration or models change.
#[derive(Debug)]
pub(crate) struct About {
    pub(crate) name: Arc<str>,
    pub(crate) base: Arc<str>,
    pub(crate) config: EndpointConfig,
    pub(crate) models: Vec<String>,
    pub(crate) authorization: Option<HeaderValue>,
    /// `config.headers`, checked and ready to send.
    pub(crate) headers: Arc<HeaderMap>,
    /// `config.model`, sent upstream in place of an alias (`served_as`).
    pub(crate) upstream_model: Option<Arc<str>>,
    /// The models and aliases it answers for, as the dispatch core matches them.
    pub(crate) serving: Arc<Serving>,
}

impl About {
    pub(crate) fn new(config: EndpointConfig, models: Vec<String>) -> Self {
        let headers = config
            .headers
            .iter()
            .filter_map(|(k, v)| {
                Some((
                    HeaderName::from_bytes(k.as_bytes()).ok()?,
                    HeaderValue::from_str(v).ok()?,
                ))
            })
            .collect();
        About {
            name: config.display_name().into(),
            base: config.base_url().into(),
            authorization: authorization(&config),
            headers: Arc::new(headers),
            upstream_model: config.model.as_deref().map(Arc::from),
            serving: Arc::new(Serving {
                models: models.clone(),
                aliases: config.served_as.clone(),
            }),
            models,
            config,
        }
    }

    /// Whether it serves `model`, by name or alias (an endpoint of unknown model serves
    /// anything).
    pub(crate) fn serves(&self, model: Option<&str>) -> bool {
        self.serving.serves(model)
    }

    /// The model name to send upstream when a request names `model`: the endpoint's own
    /// name when `model` is one of its aliases, and the adapter's name alone for SGLang's
    /// `base:adapter` form where the endpoint lists the adapter (vLLM accepts only the adapter's
    /// name; SGLang takes both). Elsewhere `base:adapter` goes as the client wrote it.
    pub(crate) fn rename(&self, model: Option<&str>) -> Option<Arc<str>> {
        let model = model?;
        if let Some(adapter) = self.serving.adapter_of(model) {
            return Some(Arc::from(adapter));
        }
        self.config
            .served_as
            .iter()
            .any(|a| a == model)
            .then(|| self.upstream_model.clone())
            .flatten()
    }
}

fn authorization(config: &EndpointConfig) -> Option<HeaderValue> {
    let key = config.api_key.as_deref()?;
    let mut value = HeaderValue::from_str(&format!("Bearer {key}")).ok()?;
    value.set_sensitive(true);
    Some(value)
}

/// The published part of an endpoint: cheap to clone (no allocation). Reads through to the
/// dispatch core's [`Status`] (health, breaker, last scrape).
#[derive(Clone, Debug)]
pub(crate) struct EndpointInfo {
    pub(crate) about: Arc<About>,
    pub(crate) status: Status,
    /// Requests this gateway has in flight there, kept by the pool under its lock.
    pub(crate) inflight: Arc<AtomicU32>,
    /// Its iteration clock, ticked by the streams it sends.
    pub(crate) cadence: Arc<super::CadenceCell>,
    /// What its health checks last failed on, while they fail.
    pub(crate) trouble: Option<Arc<Trouble>>,
    /// The status its `/metrics` answered, while not a success.
    pub(crate) metrics_missing: Option<u16>,
}

impl std::ops::Deref for EndpointInfo {
    type Target = Status;

    fn deref(&self) -> &Status {
        &self.status
    }
}

/// What the gateway keeps of an endpoint beside the dispatch core's member.
#[derive(Debug)]
pub(crate) struct Endpoint {
    pub(crate) id: EndpointId,
    pub(crate) about: Arc<About>,
    pub(crate) inflight: Arc<AtomicU32>,
    pub(crate) cadence: Arc<super::CadenceCell>,
    /// Which run of the engine its last scrape that said so came from.
    pub(crate) incarnation: Option<crate::engine_state::Incarnation>,
    /// What its health checks last failed on, while they fail.
    pub(crate) trouble: Option<Arc<Trouble>>,
    /// The status its `/metrics` answered, while not a success.
    pub(crate) metrics_missing: Option<u16>,
}

impl Endpoint {
    pub(crate) fn new(id: EndpointId, config: EndpointConfig) -> Self {
        let models = config.model.iter().cloned().collect();
        Endpoint {
            id,
            about: Arc::new(About::new(config, models)),
            inflight: Arc::new(AtomicU32::new(0)),
            cadence: Arc::default(),
            incarnation: None,
            trouble: None,
            metrics_missing: None,
        }
    }

    /// What the dispatch core needs to know of it.
    pub(crate) fn spec(&self) -> MemberSpec {
        let c = &self.about.config;
        MemberSpec {
            weight: c.weight,
            tier: c.tier,
            serving: self.about.serving.clone(),
            limits: c.limits.clone(),
        }
    }
}
