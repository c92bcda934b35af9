//! One endpoint as the gateway keeps it: what it is (URL, name, models, key), whether its health
//! checks pass, its breaker and Retry-After window, its last scrape, and the scrape loop's
//! bookkeeping. The pool's lock guards the live copy; readers get a cheap clone in the
//! published snapshot ([`super::Snapshot`]).

use crate::config::EndpointConfig;
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use kvgate_core::resilience::{Breaker, BreakerConfig, BreakerView};
use kvgate_core::{EndpointId, Health, Nanos, Observation};
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
            models,
            config,
        }
    }

    /// Whether it serves `model`, by name or alias (an endpoint of unknown model serves
    /// anything).
    pub(crate) fn serves(&self, model: Option<&str>) -> bool {
        match model {
            Some(m) => {
                self.models.is_empty()
                    || self.models.iter().any(|x| x == m)
                    || self.config.served_as.iter().any(|x| x == m)
            }
            None => true,
        }
    }

    /// The model name to send upstream when a request names `model`: the endpoint's own
    /// name when `model` is one of its aliases.
    pub(crate) fn rename(&self, model: Option<&str>) -> Option<Arc<str>> {
        let model = model?;
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

/// The published part of an endpoint: cheap to clone (no allocation).
#[derive(Clone, Debug)]
pub(crate) struct EndpointInfo {
    pub(crate) id: EndpointId,
    pub(crate) about: Arc<About>,
    pub(crate) draining: bool,
    pub(crate) healthy: bool,
    pub(crate) reports_down: bool,
    pub(crate) avoid_until: Nanos,
    /// Until when recent failures make it the last choice ([`Endpoint::cool_down`]).
    pub(crate) cool_until: Nanos,
    pub(crate) breaker: BreakerView,
    pub(crate) observation: Option<Observation>,
    /// Requests the engine runs at once, learned from scrapes that showed it full (running
    /// with others waiting): past this, what this gateway sends there queues.
    pub(crate) slots: Option<u32>,
    /// Requests this gateway has in flight there, kept by the pool under its lock.
    pub(crate) inflight: Arc<AtomicU32>,
    /// Its iteration clock, ticked by the streams it sends.
    pub(crate) cadence: Arc<super::CadenceCell>,
}

impl EndpointInfo {
    /// Not draining, answering its health checks and not reporting itself down: what
    /// readiness looks at, whatever Retry-After window or open breaker keeps it out for now.
    pub(crate) fn passes_health_checks(&self) -> bool {
        !self.draining && self.healthy && !self.reports_down
    }

    /// Health as the router's views carry it: draining, failing checks, or healthy.
    pub(crate) fn checked_health(&self) -> Health {
        if self.draining {
            Health::Draining
        } else if !self.healthy || self.reports_down {
            Health::Unhealthy
        } else {
            Health::Healthy
        }
    }

    /// Whether a Retry-After window or the breaker keeps it out at `now` (health checks aside).
    pub(crate) fn held_back(&self, now: Nanos) -> bool {
        now < self.avoid_until || !self.breaker.is_available(now)
    }

    /// Health at `now` as the admin API reports it.
    pub(crate) fn health(&self, now: Nanos) -> Health {
        match self.checked_health() {
            Health::Healthy if self.held_back(now) => Health::Unhealthy,
            h => h,
        }
    }

    /// When an endpoint that passes its health checks but is kept out by a Retry-After window
    /// or an open breaker takes traffic again; `None` when it is routable now or when nothing
    /// but a health check can bring it back.
    pub(crate) fn routable_again_at(&self, now: Nanos) -> Option<Nanos> {
        if !self.passes_health_checks() {
            return None;
        }
        let avoid = (now < self.avoid_until).then_some(self.avoid_until);
        match (avoid, self.breaker.open_until(now)) {
            (None, None) => None,
            (a, b) => a.max(b),
        }
    }
}

/// The live endpoint under the pool's lock.
#[derive(Debug)]
pub(crate) struct Endpoint {
    pub(crate) info: EndpointInfo,
    pub(crate) breaker: Breaker,
    pub(crate) scrape_failures: u32,
    pub(crate) served_since_scrape: bool,
    /// Which run of the engine its last scrape that said so came from.
    pub(crate) incarnation: Option<crate::scrape::Incarnation>,
    /// Attempts failed in a row (5xx, resets, connect errors, timeouts).
    pub(crate) failure_streak: u32,
    /// The deployment's own rate limits, when configured.
    pub(crate) limits: Option<super::limits::DeploymentLimits>,
}

/// The first cool-down after a failure, doubled per further failure in a row up to
/// [`COOL_DOWN_MAX`].
const COOL_DOWN_BASE: Nanos = Nanos(500_000_000);
const COOL_DOWN_MAX: Nanos = Nanos(8_000_000_000);

impl Endpoint {
    pub(crate) fn new(
        id: EndpointId,
        config: EndpointConfig,
        breaker: BreakerConfig,
        now: Nanos,
    ) -> Self {
        let models = config.model.iter().cloned().collect();
        let limits = config
            .limits
            .as_ref()
            .map(|l| super::limits::DeploymentLimits::new(l, now));
        let breaker = Breaker::new(breaker);
        Endpoint {
            info: EndpointInfo {
                id,
                about: Arc::new(About::new(config, models)),
                draining: false,
                healthy: true,
                reports_down: false,
                avoid_until: Nanos::ZERO,
                cool_until: Nanos::ZERO,
                breaker: breaker.view(),
                observation: None,
                slots: None,
                inflight: Arc::new(AtomicU32::new(0)),
                cadence: Arc::default(),
            },
            breaker,
            scrape_failures: 0,
            served_since_scrape: false,
            incarnation: None,
            failure_streak: 0,
            limits,
        }
    }

    /// An attempt failed here: keep it out of the first choice for a while. A failing endpoint
    /// answers fast and so looks idle to every load-reading policy, which would send it more
    /// (the black hole of least-loaded balancing); the breaker needs a window of failures to
    /// open and a 50% error rate may never trip it. So each failure cools the endpoint down
    /// for 0.5 s, doubling per failure in a row up to 8 s, ended by an answer; it stays
    /// routable whenever no other endpoint can take a request. Envoy's outlier detection
    /// ejects after 5 consecutive 5xx for 30 s; this is shorter and softer, because one error
    /// is weak evidence.
    pub(crate) fn cool_down(&mut self, now: Nanos) {
        self.failure_streak = self.failure_streak.saturating_add(1);
        let doublings = (self.failure_streak - 1).min(16);
        let wait = Nanos(COOL_DOWN_BASE.0.saturating_mul(1 << doublings)).min(COOL_DOWN_MAX);
        self.info.cool_until = self.info.cool_until.max(now + wait);
    }

    /// Copies the breaker's state into the published part; whether it changed.
    pub(crate) fn sync_breaker(&mut self) -> bool {
        let view = self.breaker.view();
        let changed = view != self.info.breaker;
        self.info.breaker = view;
        changed
    }
}
