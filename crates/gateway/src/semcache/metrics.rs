//! Metrics of the semantic cache.

use crate::metrics::{Counter, Family, Gauge, ReasonLabel, Registry, Unit};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};

/// How a lookup went.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct LookupLabel {
    /// `hit_exact`, `hit_semantic`, `miss` or `bypass`.
    pub(crate) result: &'static str,
}

/// See the module documentation.
#[derive(Debug, Default)]
pub(crate) struct SemCacheMetrics {
    /// Lookups by result.
    pub(crate) lookups: Family<LookupLabel, Counter>,
    /// Bypasses by reason.
    pub(crate) bypasses: Family<ReasonLabel, Counter>,
    /// Candidates above the threshold a guard stopped, by guard.
    pub(crate) guard_stops: Family<ReasonLabel, Counter>,
    /// Answers stored, and answers not stored by reason.
    pub(crate) stores: Family<ReasonLabel, Counter>,
    /// Entries evicted to make room (least recently used).
    pub(crate) evictions: Counter,
    /// Entries held.
    pub(crate) entries: Gauge,
    /// Bytes held.
    pub(crate) bytes: Gauge,
    /// Embedding latency.
    pub(crate) embed_seconds: Option<Histogram>,
    /// Embeddings that failed (`timeout`, `error`): the request went upstream.
    pub(crate) embed_failures: Family<ReasonLabel, Counter>,
    /// Identical requests that waited for a leader, by result (`answered`, `missed`,
    /// `timed_out`).
    pub(crate) singleflight: Family<ReasonLabel, Counter>,
    /// Peers' entries received, by result (`applied`, `rejected`).
    pub(crate) peer_entries: Family<ReasonLabel, Counter>,
}

impl SemCacheMetrics {
    /// The families, registered in `registry`.
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let m = SemCacheMetrics {
            embed_seconds: Some(Histogram::new(exponential_buckets(0.000_1, 2.0, 16))),
            ..Default::default()
        };
        let r = registry;
        r.register(
            "semantic_cache_lookups",
            "Semantic cache lookups by result (hit_exact, hit_semantic, miss, bypass)",
            m.lookups.clone(),
        );
        r.register(
            "semantic_cache_bypasses",
            "Requests the semantic cache let by, by reason",
            m.bypasses.clone(),
        );
        r.register(
            "semantic_cache_guard_stops",
            "Similar entries above the threshold refused by a guard (numbers, negation, order)",
            m.guard_stops.clone(),
        );
        r.register(
            "semantic_cache_stores",
            "Answers stored (stored) or not stored (too_large, incomplete)",
            m.stores.clone(),
        );
        r.register(
            "semantic_cache_evictions",
            "Semantic cache entries evicted to make room",
            m.evictions.clone(),
        );
        r.register(
            "semantic_cache_entries",
            "Semantic cache entries held",
            m.entries.clone(),
        );
        r.register_with_unit(
            "semantic_cache",
            "Bytes the semantic cache holds",
            Unit::Bytes,
            m.bytes.clone(),
        );
        if let Some(h) = &m.embed_seconds {
            r.register_with_unit(
                "semantic_cache_embed",
                "Time to embed a last user message",
                Unit::Seconds,
                h.clone(),
            );
        }
        r.register(
            "semantic_cache_embed_failures",
            "Embeddings that failed or ran past the deadline (timeout, error); the request \
             went upstream",
            m.embed_failures.clone(),
        );
        r.register(
            "semantic_cache_singleflight",
            "Requests that waited for an identical one in flight, by result (answered, \
             missed, timed_out)",
            m.singleflight.clone(),
        );
        r.register(
            "semantic_cache_peer_entries",
            "Entries received from other replicas, by result (applied, rejected)",
            m.peer_entries.clone(),
        );
        m
    }

    pub(crate) fn count(family: &Family<ReasonLabel, Counter>, reason: &'static str) {
        family.get_or_create(&ReasonLabel { reason }).inc();
    }
}
