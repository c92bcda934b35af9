//! Difficulty routing's metric families.

use crate::metrics::{Counter, Family, FloatGauge, Gauge, Registry};
use prometheus_client::encoding::EncodeLabelSet;

/// A routed name and the tier its request got.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TierLabels {
    pub(crate) model: String,
    pub(crate) tier: &'static str,
}

/// A routed name and an escalation's result.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct EscalationLabels {
    pub(crate) model: String,
    pub(crate) result: &'static str,
}

/// A routed name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ModelLabel {
    pub(crate) model: String,
}

/// The families.
#[derive(Clone, Debug, Default)]
pub(crate) struct DifficultyMetrics {
    requests: Family<TierLabels, Counter>,
    escalations: Family<EscalationLabels, Counter>,
    inflight: Family<ModelLabel, Gauge>,
    threshold: Family<ModelLabel, FloatGauge>,
    classifier_failures: Family<EscalationLabels, Counter>,
}

impl DifficultyMetrics {
    /// Registers them.
    pub(crate) fn register(&self, r: &mut Registry) {
        r.register(
            "routed_requests",
            "Requests to a routed name by the tier that finally answered (cheap, strong); the strong share is strong over all",
            self.requests.clone(),
        );
        r.register(
            "routed_escalations",
            "Cascade escalations by result (granted, denied-budget, denied-cap, chain-exhausted)",
            self.escalations.clone(),
        );
        r.register(
            "routed_strong_inflight",
            "Requests on the strong model through a routed name now",
            self.inflight.clone(),
        );
        r.register(
            "routed_threshold",
            "The score at or above which a routed name's requests go strong",
            self.threshold.clone(),
        );
        r.register(
            "routed_classifier_failures",
            "Requests a classifier scorer did not score (timeout, error), scored by the default rules instead",
            self.classifier_failures.clone(),
        );
    }

    pub(crate) fn classifier_failure(&self, model: &str, reason: &'static str) {
        self.classifier_failures
            .get_or_create(&EscalationLabels {
                model: model.to_owned(),
                result: reason,
            })
            .inc();
    }

    pub(crate) fn request(&self, model: &str, strong: bool) {
        let tier = if strong { "strong" } else { "cheap" };
        self.requests
            .get_or_create(&TierLabels {
                model: model.to_owned(),
                tier,
            })
            .inc();
    }

    pub(crate) fn escalation(&self, model: &str, result: &'static str) {
        self.escalations
            .get_or_create(&EscalationLabels {
                model: model.to_owned(),
                result,
            })
            .inc();
    }

    pub(crate) fn inflight(&self, model: &str, n: usize) {
        self.inflight
            .get_or_create(&ModelLabel {
                model: model.to_owned(),
            })
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    pub(crate) fn threshold(&self, model: &str, t: f64) {
        self.threshold
            .get_or_create(&ModelLabel {
                model: model.to_owned(),
            })
            .set(t);
    }
}
