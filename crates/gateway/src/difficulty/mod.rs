//! Difficulty routing's state: per routed name, its scorer, the controller that holds the
//! strong share, the escalation budgets and the strong tier's concurrency. The decisions are
//! `kvgate_core::difficulty`'s; this module keeps their state on the pool's clock and counts
//! them. The request path (`crate::cascade`) asks it what to do with each request.

mod classifier;
mod config;
mod metrics;
mod scoring;

pub use config::{CascadeConfig, OnDenied, RoutedModelConfig, RoutingConfig, ScorerConfig};
pub(crate) use metrics::DifficultyMetrics;
pub(crate) use scoring::judged;
pub use scoring::{load_examples, parse_examples, Example};

use crate::error::ConfigError;
use kvgate_core::difficulty::{BudgetDenied, EscalationBudget, RuleInput, Score, ShareController};
use kvgate_core::Nanos;
use scoring::Scorer;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// A tier's request of a routed name carries this to the proxy's access-log line: the tier and
/// why, as the response headers say it.
#[derive(Clone, Debug)]
pub(crate) struct RouteNote(pub(crate) Arc<str>);

/// Every routed name's state.
#[derive(Debug, Default)]
pub(crate) struct Difficulty {
    models: BTreeMap<String, Routed>,
}

/// One routed name.
#[derive(Debug)]
pub(crate) struct Routed {
    pub(crate) name: String,
    pub(crate) config: RoutedModelConfig,
    scorer: Scorer,
    state: Mutex<State>,
    strong: Arc<StrongTier>,
    metrics: DifficultyMetrics,
}

#[derive(Debug)]
struct State {
    controller: ShareController,
    budget: EscalationBudget,
}

/// Requests on the strong model through one routed name, against its cap.
#[derive(Debug)]
struct StrongTier {
    inflight: AtomicUsize,
    cap: usize,
    model: String,
    metrics: DifficultyMetrics,
}

/// A place on the strong tier, given back when dropped (with the response body).
#[derive(Debug)]
pub(crate) struct StrongSlot(Arc<StrongTier>);

impl Drop for StrongSlot {
    fn drop(&mut self) {
        let now = self.0.inflight.fetch_sub(1, Ordering::AcqRel) - 1;
        self.0.metrics.inflight(&self.0.model, now);
    }
}

/// The upfront decision for one request.
#[derive(Clone, Debug)]
pub(crate) struct Verdict {
    pub(crate) score: Score,
    pub(crate) threshold: f64,
    pub(crate) strong: bool,
}

/// Why an escalation did not happen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    Budget(BudgetDenied),
    Cap,
}

impl Refusal {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Refusal::Budget(_) => "denied-budget",
            Refusal::Cap => "denied-cap",
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Difficulty {
    /// Builds every routed name's state (reading kNN examples files).
    pub(crate) fn new(
        config: &RoutingConfig,
        metrics: &DifficultyMetrics,
        client: &crate::upstream::HttpClient,
    ) -> Result<Self, ConfigError> {
        let mut models = BTreeMap::new();
        for (name, m) in &config.models {
            let field = format!("routing.models.{name}");
            let invalid = |e: kvgate_core::difficulty::DifficultyError| {
                ConfigError::invalid(&field, e.to_string())
            };
            let state = State {
                controller: ShareController::new(m.share.clone()).map_err(invalid)?,
                budget: EscalationBudget::new(m.budget.clone()).map_err(invalid)?,
            };
            let routed = Routed {
                name: name.clone(),
                scorer: Scorer::build(&m.scorer, &format!("{field}.scorer"), client)?,
                state: Mutex::new(state),
                strong: Arc::new(StrongTier {
                    inflight: AtomicUsize::new(0),
                    cap: m.strong_max_concurrency,
                    model: name.clone(),
                    metrics: metrics.clone(),
                }),
                metrics: metrics.clone(),
                config: m.clone(),
            };
            metrics.inflight(name, 0);
            models.insert(name.clone(), routed);
        }
        Ok(Difficulty { models })
    }

    /// Whether any name routes by difficulty (otherwise requests skip this stage unread).
    pub(crate) fn any(&self) -> bool {
        !self.models.is_empty()
    }

    /// The routed names (`/v1/models` lists them beside the pool's).
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.models.keys().map(String::as_str)
    }

    /// The routed name `model`, if it is one.
    pub(crate) fn get(&self, model: &str) -> Option<&Routed> {
        self.models.get(model)
    }
}

impl Routed {
    /// Scores a request of `tenant` and decides its first tier.
    pub(crate) async fn decide(
        &self,
        text: &str,
        tools: bool,
        tenant: &str,
        now: Nanos,
    ) -> Verdict {
        let (score, failed) = self.scorer.score(RuleInput { text, tools }).await;
        if let Some(classifier::Failed(reason, detail)) = failed {
            tracing::debug!(model = %self.name, reason, %detail, "classifier gave no score; scored by the rules");
            self.metrics.classifier_failure(&self.name, reason);
        }
        let mut state = lock(&self.state);
        state.controller.observe(score.p);
        let threshold = state.controller.threshold();
        state.budget.request(tenant, now);
        drop(state);
        self.metrics.threshold(&self.name, threshold);
        Verdict {
            strong: score.p >= threshold,
            score,
            threshold,
        }
    }

    /// Records the tier a request finally got.
    pub(crate) fn settled(&self, strong: bool) {
        lock(&self.state).controller.decided(strong);
        self.metrics.request(&self.name, strong);
    }

    /// A place on the strong tier, if one is free.
    pub(crate) fn strong_slot(&self) -> Option<StrongSlot> {
        let tier = &self.strong;
        let mut now = tier.inflight.load(Ordering::Acquire);
        loop {
            if now >= tier.cap {
                return None;
            }
            match tier
                .inflight
                .compare_exchange(now, now + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(seen) => now = seen,
            }
        }
        self.metrics.inflight(&self.name, now + 1);
        Some(StrongSlot(tier.clone()))
    }

    /// Asks to escalate: the budget first (a withdrawal), then a strong slot (the withdrawal
    /// stays spent when the cap refuses: the storm the budget meters is the same).
    pub(crate) fn escalate(&self, tenant: &str, now: Nanos) -> Result<StrongSlot, Refusal> {
        let granted = lock(&self.state).budget.try_escalate(tenant, now);
        let result = granted
            .map_err(Refusal::Budget)
            .and_then(|()| self.strong_slot().ok_or(Refusal::Cap));
        self.metrics.escalation(
            &self.name,
            result.as_ref().map_or_else(|r| r.label(), |_| "granted"),
        );
        result
    }

    /// Counts a low-confidence answer the chain's bound kept.
    pub(crate) fn chain_exhausted(&self) {
        self.metrics.escalation(&self.name, "chain-exhausted");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routed(cap: usize) -> Difficulty {
        let yaml = format!(
            "models:\n  auto:\n    cheap: small\n    strong: big\n    strong_max_concurrency: {cap}\n    budget: {{global: {{ratio: 0.5, min_per_sec: 0, window_ms: 10000}}}}\n"
        );
        let config: RoutingConfig = yaml_serde::from_str(&yaml).unwrap();
        config.validate(&["small", "big"]).unwrap();
        let client = crate::upstream::client(&[]).unwrap();
        Difficulty::new(&config, &DifficultyMetrics::default(), &client).unwrap()
    }

    #[test]
    fn the_strong_cap_holds_and_slots_come_back() {
        let d = routed(2);
        let r = d.get("auto").unwrap();
        let a = r.strong_slot().unwrap();
        let _b = r.strong_slot().unwrap();
        assert!(r.strong_slot().is_none());
        drop(a);
        assert!(r.strong_slot().is_some());
    }

    #[tokio::test]
    async fn escalations_meet_the_budget_then_the_cap() {
        let d = routed(1);
        let r = d.get("auto").unwrap();
        let now = Nanos::from_secs(1);
        for _ in 0..4 {
            r.decide("hello", false, "t", now).await;
        }
        let slot = r.escalate("t", now).unwrap();
        assert_eq!(r.escalate("t", now).unwrap_err(), Refusal::Cap);
        drop(slot);
        // Global: half of 4 = 2 withdrawn; the tenant's 20% + 0.5/s floor allows more.
        assert_eq!(
            r.escalate("t", now).unwrap_err(),
            Refusal::Budget(BudgetDenied::Global)
        );
    }

    #[test]
    fn bad_routes_are_refused() {
        let parse = |y: &str| yaml_serde::from_str::<RoutingConfig>(y).unwrap();
        let same = parse("models:\n  auto: {cheap: auto, strong: big}\n");
        assert!(same.validate(&[]).is_err());
        let unknown = parse("models:\n  auto: {cheap: small, strong: huge}\n");
        let err = unknown.validate(&["small", "big"]).unwrap_err().to_string();
        assert!(err.contains("routing.models.auto.strong"), "{err}");
        let taken = parse("models:\n  small: {cheap: tiny, strong: big}\n");
        assert!(taken.validate(&["small", "tiny", "big"]).is_err());
        assert!(yaml_serde::from_str::<RoutingConfig>(
            "models:\n  a: {cheap: x, strong: y, extra: 1}\n"
        )
        .is_err());
    }
}
