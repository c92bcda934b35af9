//! One endpoint as the dispatch core keeps it: what it serves, whether its health checks pass,
//! its breaker, Retry-After window and cool-down, its deployment limits and its last scrape.
//! [`Status`] is the part a runtime publishes to readers (cheap to clone).

use super::limits::DeploymentLimits;
use crate::resilience::{Breaker, BreakerConfig, BreakerView};
use crate::tenancy::LimitsConfig;
use crate::{EndpointId, Health, Nanos, Observation};
use std::sync::Arc;

/// The models an endpoint answers for: its own names and the aliases it is served as.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Serving {
    /// Models it serves (configured or discovered); empty while unknown.
    pub models: Vec<String>,
    /// Other names a request may use for them.
    pub aliases: Vec<String>,
}

impl Serving {
    /// Whether it serves `model`, by name or alias (an endpoint of unknown model serves
    /// anything, and a request naming no model goes anywhere).
    pub fn serves(&self, model: Option<&str>) -> bool {
        match model {
            Some(m) => self.models.is_empty() || self.names(m) || self.adapter_of(m).is_some(),
            None => true,
        }
    }

    fn names(&self, m: &str) -> bool {
        self.models.iter().any(|x| x == m) || self.aliases.iter().any(|x| x == m)
    }

    /// The adapter a request for `model` in SGLang's `base:adapter` form runs here, when this
    /// endpoint serves `base` and lists `adapter` among its models (as vLLM and SGLang list
    /// loaded adapters in `/v1/models`). The name is split at its first `:` as SGLang splits
    /// it; a model whose own name holds a `:` and is listed as such is not an adapter request.
    pub fn adapter_of<'m>(&self, model: &'m str) -> Option<&'m str> {
        if self.names(model) {
            return None;
        }
        let (base, adapter) = model.split_once(':')?;
        (self.names(base) && self.models.iter().any(|x| x == adapter)).then_some(adapter)
    }
}

/// What a runtime tells the core about a new or reconfigured member.
#[derive(Clone, Debug)]
pub struct MemberSpec {
    /// Relative weight for weighted policies.
    pub weight: f64,
    /// Priority tier: lower numbers are tried first.
    pub tier: u32,
    /// What it serves.
    pub serving: Arc<Serving>,
    /// The deployment's own rate limits.
    pub limits: Option<LimitsConfig>,
}

impl Default for MemberSpec {
    fn default() -> Self {
        MemberSpec {
            weight: 1.0,
            tier: 0,
            serving: Arc::default(),
            limits: None,
        }
    }
}

/// The published part of a member: everything readiness, the admin API and the decision
/// records read, without the core's lock.
#[derive(Clone, Debug)]
pub struct Status {
    /// Identity.
    pub id: EndpointId,
    /// Priority tier.
    pub tier: u32,
    /// What it serves.
    pub serving: Arc<Serving>,
    /// Taken out of routing by an operator.
    pub draining: bool,
    /// Its scrapes (or answers) show it alive.
    pub healthy: bool,
    /// Its engine's own `/health` says it is down (draining for shutdown, for example).
    pub reports_down: bool,
    /// Until when a Retry-After keeps it out.
    pub avoid_until: Nanos,
    /// Until when recent failures make it the last choice ([`Member::cool_down`]).
    pub cool_until: Nanos,
    /// Its breaker.
    pub breaker: BreakerView,
    /// Its last scrape.
    pub observation: Option<Observation>,
    /// Requests the engine runs at once, learned from scrapes that showed it full (running
    /// with others waiting): past this, what this router sends there queues.
    pub slots: Option<u32>,
}

impl Status {
    /// Not draining, answering its health checks and not reporting itself down: what
    /// readiness looks at, whatever Retry-After window or open breaker keeps it out for now.
    pub fn passes_health_checks(&self) -> bool {
        !self.draining && self.healthy && !self.reports_down
    }

    /// Health as the router's views carry it: draining, failing checks, or healthy.
    pub fn checked_health(&self) -> Health {
        if self.draining {
            Health::Draining
        } else if !self.healthy || self.reports_down {
            Health::Unhealthy
        } else {
            Health::Healthy
        }
    }

    /// Whether a Retry-After window or the breaker keeps it out at `now` (health checks aside).
    pub fn held_back(&self, now: Nanos) -> bool {
        now < self.avoid_until || !self.breaker.is_available(now)
    }

    /// Health at `now` as an operator sees it.
    pub fn health(&self, now: Nanos) -> Health {
        match self.checked_health() {
            Health::Healthy if self.held_back(now) => Health::Unhealthy,
            h => h,
        }
    }

    /// When a member that passes its health checks but is kept out by a Retry-After window or
    /// an open breaker takes traffic again; `None` when it is routable now or when nothing but
    /// a health check can bring it back.
    pub fn routable_again_at(&self, now: Nanos) -> Option<Nanos> {
        if !self.passes_health_checks() {
            return None;
        }
        let avoid = (now < self.avoid_until).then_some(self.avoid_until);
        match (avoid, self.breaker.open_until(now)) {
            (None, None) => None,
            (a, b) => a.max(b),
        }
    }

    /// Block size its engine reports (vLLM's `cache_config_info`).
    pub fn block_size(&self) -> Option<u32> {
        self.observation?.block_size
    }
}

/// The first cool-down after a failure, doubled per further failure in a row up to
/// [`COOL_DOWN_MAX`].
const COOL_DOWN_BASE: Nanos = Nanos(500_000_000);
const COOL_DOWN_MAX: Nanos = Nanos(8_000_000_000);

/// One member under the core's lock.
#[derive(Debug)]
pub(super) struct Member {
    pub(super) status: Status,
    pub(super) breaker: Breaker,
    pub(super) scrape_failures: u32,
    pub(super) served_since_scrape: bool,
    /// Attempts failed in a row (5xx, resets, connect errors, timeouts).
    failure_streak: u32,
    pub(super) limits: Option<DeploymentLimits>,
    pub(super) limits_config: Option<LimitsConfig>,
}

impl Member {
    pub(super) fn new(
        id: EndpointId,
        spec: &MemberSpec,
        breaker: BreakerConfig,
        now: Nanos,
    ) -> Self {
        let breaker = Breaker::new(breaker);
        Member {
            status: Status {
                id,
                tier: spec.tier,
                serving: spec.serving.clone(),
                draining: false,
                healthy: true,
                reports_down: false,
                avoid_until: Nanos::ZERO,
                cool_until: Nanos::ZERO,
                breaker: breaker.view(),
                observation: None,
                slots: None,
            },
            breaker,
            scrape_failures: 0,
            served_since_scrape: false,
            failure_streak: 0,
            limits: spec.limits.as_ref().map(|l| DeploymentLimits::new(l, now)),
            limits_config: spec.limits.clone(),
        }
    }

    /// The published part.
    pub(super) fn status(&self) -> &Status {
        &self.status
    }

    /// Applies a new spec (tier, models, limits); changed limits start afresh, their windows
    /// and in-flight charges included.
    pub(super) fn reconfigure(&mut self, spec: &MemberSpec, now: Nanos) {
        if self.limits_config != spec.limits {
            self.limits = spec.limits.as_ref().map(|l| DeploymentLimits::new(l, now));
            self.limits_config = spec.limits.clone();
        }
        self.status.tier = spec.tier;
        self.status.serving = spec.serving.clone();
    }

    /// An attempt failed here: keep it out of the first choice for a while. A failing endpoint
    /// answers fast and so looks idle to every load-reading policy, which would send it more
    /// (the black hole of least-loaded balancing); the breaker needs a window of failures to
    /// open and a 50% error rate may never trip it. So each failure cools the endpoint down
    /// for 0.5 s, doubling per failure in a row up to 8 s, ended by an answer; it stays
    /// routable whenever no other endpoint can take a request. Envoy's outlier detection
    /// ejects after 5 consecutive 5xx for 30 s; this is shorter and softer, because one error
    /// is weak evidence.
    pub(super) fn cool_down(&mut self, now: Nanos) {
        self.failure_streak = self.failure_streak.saturating_add(1);
        let doublings = (self.failure_streak - 1).min(16);
        let wait = Nanos(COOL_DOWN_BASE.0.saturating_mul(1 << doublings)).min(COOL_DOWN_MAX);
        self.status.cool_until = self.status.cool_until.max(now + wait);
    }

    /// It answered: proof of life, and the end of its failure streak.
    pub(super) fn answered(&mut self) {
        self.served_since_scrape = true;
        self.scrape_failures = 0;
        self.failure_streak = 0;
    }

    /// Copies the breaker's state into the published part; whether it changed.
    pub(super) fn sync_breaker(&mut self) -> bool {
        let view = self.breaker.view();
        let changed = view != self.status.breaker;
        self.status.breaker = view;
        changed
    }

    /// Whether it may take an attempt at `now` in a pass that skips the `tried` ones (`fresh`)
    /// and those cooling down (`cool`).
    pub(super) fn admits(
        &self,
        model: Option<&str>,
        now: Nanos,
        (fresh, cool): (bool, bool),
        tried: &[EndpointId],
    ) -> bool {
        let s = &self.status;
        let cooling = cool && now < s.cool_until;
        let was_tried = fresh && tried.contains(&s.id);
        s.serving.serves(model) && !s.held_back(now) && !cooling && !was_tried
    }
}

#[cfg(test)]
mod serving_tests {
    use super::Serving;

    #[test]
    fn base_colon_adapter_is_served_where_the_base_lists_the_adapter() {
        let vllm = Serving {
            models: vec!["base".into(), "sql".into(), "odd:name".into()],
            aliases: vec!["b".into()],
        };
        assert!(vllm.serves(Some("base:sql")));
        assert_eq!(vllm.adapter_of("base:sql"), Some("sql"));
        assert_eq!(
            vllm.adapter_of("b:sql"),
            Some("sql"),
            "the base by its alias"
        );
        assert!(
            !vllm.serves(Some("base:chat")),
            "an adapter it does not list"
        );
        assert!(!vllm.serves(Some("other:sql")), "another base model");
        assert_eq!(vllm.adapter_of("odd:name"), None, "a listed name is itself");
        assert!(vllm.serves(Some("odd:name")));
        assert!(
            Serving::default().serves(Some("base:sql")),
            "unknown models serve anything"
        );
        assert_eq!(Serving::default().adapter_of("base:sql"), None);
    }
}
