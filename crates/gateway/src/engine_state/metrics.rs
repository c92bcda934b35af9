//! Metrics of exact tokenization and KV-event ingestion.

use crate::metrics::{Counter, EndpointLabel, Family, Gauge, ReasonLabel};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

/// An endpoint and what happened to its event stream.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StreamLabels {
    /// The endpoint's name.
    pub endpoint: String,
    /// `gap`, `restart`, `joined_late`, `overflow`, `stale`, `decode_error` or `disconnect`.
    pub kind: &'static str,
}

/// See the module documentation.
#[derive(Clone, Debug)]
pub struct EngineStateMetrics {
    /// Prompts tokenized, by result (`ok`, `error`).
    pub tokenized: Family<ReasonLabel, Counter>,
    /// Time to render and tokenize one prompt.
    pub tokenize_seconds: Histogram,
    /// KV-event socket connections made or accepted per endpoint.
    pub connections: Family<EndpointLabel, Counter>,
    /// KV-event batches received per endpoint.
    pub batches: Family<EndpointLabel, Counter>,
    /// KV events applied per endpoint.
    pub events: Family<EndpointLabel, Counter>,
    /// Stream incidents per endpoint and kind.
    pub incidents: Family<StreamLabels, Counter>,
    /// Receipt time minus the engine's batch time.
    pub lag_seconds: Histogram,
    /// Entries the event index holds per endpoint.
    pub entries: Family<EndpointLabel, Gauge>,
    /// 1 while an endpoint's stream is complete (its entries are trusted), else 0.
    pub trusted: Family<EndpointLabel, Gauge>,
}

impl EngineStateMetrics {
    /// Empty metrics.
    pub fn new() -> Self {
        EngineStateMetrics {
            tokenized: Family::default(),
            tokenize_seconds: Histogram::new(exponential_buckets(0.000_01, 2.0, 16)),
            connections: Family::default(),
            batches: Family::default(),
            events: Family::default(),
            incidents: Family::default(),
            lag_seconds: Histogram::new(exponential_buckets(0.000_1, 2.0, 18)),
            entries: Family::default(),
            trusted: Family::default(),
        }
    }

    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "tokenized_prompts",
            "Prompts rendered and tokenized with the model's tokenizer, by result (ok, error)",
            self.tokenized.clone(),
        );
        registry.register_with_unit(
            "tokenize",
            "Time to render and tokenize one prompt",
            Unit::Seconds,
            self.tokenize_seconds.clone(),
        );
        registry.register(
            "kv_event_connections",
            "KV-event socket connections made (tcp://) or accepted (bind:) per endpoint",
            self.connections.clone(),
        );
        registry.register(
            "kv_event_batches",
            "KV-event batches received per endpoint",
            self.batches.clone(),
        );
        registry.register(
            "kv_events",
            "KV events applied per endpoint",
            self.events.clone(),
        );
        registry.register(
            "kv_event_incidents",
            "KV-event stream incidents per endpoint: gap, restart, joined_late, overflow, stale, decode_error, disconnect",
            self.incidents.clone(),
        );
        registry.register_with_unit(
            "kv_event_lag",
            "Receipt time minus the engine's batch time",
            Unit::Seconds,
            self.lag_seconds.clone(),
        );
        registry.register(
            "kv_index_entries",
            "Entries of the KV-event index per endpoint",
            self.entries.clone(),
        );
        registry.register(
            "kv_events_trusted",
            "1 while an endpoint's KV-event stream is complete and its entries are trusted",
            self.trusted.clone(),
        );
    }
}

impl Default for EngineStateMetrics {
    fn default() -> Self {
        Self::new()
    }
}
