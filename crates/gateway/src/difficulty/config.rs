//! The `routing` section: names that route by difficulty, each over a cheap and a strong model
//! of the pool.

use crate::error::ConfigError;
use kvgate_core::difficulty::{
    ConfidenceConfig, EscalationBudgetConfig, RuleWeights, ShareControllerConfig,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Routed model names.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RoutingConfig {
    /// By the name clients ask for.
    pub models: BTreeMap<String, RoutedModelConfig>,
}

/// One routed name.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoutedModelConfig {
    /// The model (or alias) of the pool that answers easy requests.
    pub cheap: String,
    /// The model (or alias) that answers hard ones and escalations.
    pub strong: String,
    /// How a request's difficulty is scored.
    #[serde(default)]
    pub scorer: ScorerConfig,
    /// The strong share to hold and how the threshold follows it.
    #[serde(default)]
    pub share: ShareControllerConfig,
    /// Ask the cheap model first and escalate unsure answers; off when absent.
    #[serde(default)]
    pub cascade: Option<CascadeConfig>,
    /// Escalations as a share of requests, per tenant and overall.
    #[serde(default)]
    pub budget: EscalationBudgetConfig,
    /// Requests on the strong model at once through this name; past it a request stays on
    /// the cheap model (Kingman: escalated traffic is burstier and slower, so the strong
    /// tier's queue is the first to blow up in a storm).
    #[serde(default = "default_strong_cap")]
    pub strong_max_concurrency: usize,
}

fn default_strong_cap() -> usize {
    64
}

/// A scorer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ScorerConfig {
    /// Hand-set rules.
    Rules {
        /// Their weights.
        #[serde(default)]
        weights: RuleWeights,
    },
    /// Nearest labelled examples, over in-process hashed TF-IDF vectors.
    Knn {
        /// JSON lines, each `{"prompt": ..., "label": P}` or `{"prompt": ..., "weak": bool,
        /// "strong": bool}` (label: the strong model was right where the weak one was not).
        examples: PathBuf,
        /// Neighbours that vote.
        #[serde(default = "default_k")]
        k: usize,
        /// Hashed vector dimensions.
        #[serde(default = "default_dims")]
        dims: usize,
        /// A static embedding model's directory (`scripts/fetch-static-embedder.sh`): the
        /// examples and requests are compared by its embeddings instead of TF-IDF vectors.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        embedder_dir: Option<PathBuf>,
    },
    /// A classifier served over HTTP in vLLM's `/classify` shape: `POST url` with `{"model",
    /// "input"}` (the judged text), answered with `data[0].probs`, of which `strong_class`
    /// is P(strong needed). Past `deadline_ms` or on any failure the request is scored by the
    /// default rules (failing open: a classifier outage must not stop routing), counted in
    /// `kvgate_routed_classifier_failures_total`.
    Classifier {
        /// The endpoint, e.g. `http://classifier:8000/classify`.
        url: String,
        /// The classifier's model name.
        model: String,
        /// Index of the "strong needed" class in `probs`.
        #[serde(default = "default_strong_class")]
        strong_class: usize,
        /// How long a request waits for its score.
        #[serde(default = "default_classifier_deadline")]
        deadline_ms: u64,
        /// An environment variable holding a bearer key for the endpoint.
        #[serde(default)]
        api_key_env: Option<String>,
    },
}

fn default_strong_class() -> usize {
    1
}

fn default_classifier_deadline() -> u64 {
    100
}

fn default_k() -> usize {
    10
}

fn default_dims() -> usize {
    2048
}

impl Default for ScorerConfig {
    fn default() -> Self {
        ScorerConfig::Rules {
            weights: RuleWeights::default(),
        }
    }
}

/// What to do when an escalation is refused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnDenied {
    /// Return the cheap answer, flagged in `x-kvgate-escalation`.
    #[default]
    Flag,
    /// Answer 503 with `Retry-After`.
    Reject,
}

/// The cascade.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CascadeConfig {
    /// When an answer is unsure, and how long the chain may be.
    pub confidence: ConfidenceConfig,
    /// Alternatives per token asked of the cheap model (for the margin; 0 reads logprobs only).
    pub top_logprobs: u32,
    /// A refused escalation's answer.
    pub on_denied: OnDenied,
    /// `Retry-After` of a rejected one, in seconds.
    pub retry_after_secs: u64,
}

impl Default for CascadeConfig {
    fn default() -> Self {
        CascadeConfig {
            confidence: ConfidenceConfig::default(),
            top_logprobs: 5,
            on_denied: OnDenied::Flag,
            retry_after_secs: 1,
        }
    }
}

impl RoutingConfig {
    /// Checks each routed name; `served` is every model name the pool declares (empty when
    /// some are discovered at run time, and then nothing is checked against it).
    pub fn validate(&self, served: &[&str]) -> Result<(), ConfigError> {
        for (name, m) in &self.models {
            let field = |f: &str| format!("routing.models.{name}.{f}");
            let bad =
                |f: &str, e: &dyn std::fmt::Display| ConfigError::invalid(field(f), e.to_string());
            for (f, target) in [("cheap", &m.cheap), ("strong", &m.strong)] {
                if target == name {
                    return Err(bad(f, &"must name another model than the routed name"));
                }
                if !served.is_empty() && !served.contains(&target.as_str()) {
                    return Err(bad(
                        f,
                        &format!("names model {target:?}, which no endpoint serves"),
                    ));
                }
            }
            if served.contains(&name.as_str()) {
                return Err(bad(
                    "",
                    &"an endpoint already serves this name; a routed name must be free",
                ));
            }
            m.share.validate().map_err(|e| bad("share", &e))?;
            m.budget.validate().map_err(|e| bad("budget", &e))?;
            if let Some(c) = &m.cascade {
                c.confidence
                    .validate()
                    .map_err(|e| bad("cascade.confidence", &e))?;
                if c.top_logprobs > 20 {
                    return Err(bad("cascade.top_logprobs", &"must be at most 20"));
                }
            }
            if m.strong_max_concurrency == 0 {
                return Err(bad("strong_max_concurrency", &"must be at least 1"));
            }
            match &m.scorer {
                ScorerConfig::Knn { k, dims, .. } if *k == 0 || *dims == 0 => {
                    return Err(bad("scorer", &"k and dims must be at least 1"));
                }
                ScorerConfig::Classifier {
                    url, deadline_ms, ..
                } => {
                    if url
                        .parse::<axum::http::Uri>()
                        .map_or(true, |u| u.host().is_none())
                    {
                        return Err(bad("scorer.url", &"must be an absolute http(s) URL"));
                    }
                    if *deadline_ms == 0 {
                        return Err(bad("scorer.deadline_ms", &"must be at least 1"));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }
}
