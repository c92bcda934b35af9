//! Metrics of state sharing between replicas.

use crate::metrics::{Counter, Family, Gauge, ReasonLabel};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

/// Which way events went.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirectionLabel {
    /// `sent` or `received`.
    pub direction: &'static str,
}

/// See the module documentation.
#[derive(Clone, Debug)]
pub struct ClusterMetrics {
    /// Receipt time minus the sender's publish time of peers' messages.
    pub lag: Histogram,
    /// 1 while connected to NATS, else 0 (also 0 with no cluster configured).
    pub connected: Gauge,
    /// Peers heard from within the timeout.
    pub peers: Gauge,
    /// Peers' requests counted in flight here.
    pub peer_inflight: Gauge,
    /// Events sent to and received from peers.
    pub events: Family<DirectionLabel, Counter>,
    /// Events not shared or not applied, by reason.
    pub dropped: Family<ReasonLabel, Counter>,
    /// Lost NATS connections.
    pub disconnects: Counter,
    /// Peers' requests dropped from the ledger without an end (peer gone, message lost).
    pub expired: Counter,
    /// Recent dispatches received from a peer when joining.
    pub warm_entries: Counter,
}

impl Default for ClusterMetrics {
    fn default() -> Self {
        ClusterMetrics {
            lag: Histogram::new(exponential_buckets(0.000_05, 2.0, 16)),
            connected: Gauge::default(),
            peers: Gauge::default(),
            peer_inflight: Gauge::default(),
            events: Family::default(),
            dropped: Family::default(),
            disconnects: Counter::default(),
            expired: Counter::default(),
            warm_entries: Counter::default(),
        }
    }
}

impl ClusterMetrics {
    pub(crate) fn dropped(&self, reason: &'static str) {
        self.dropped.get_or_create(&ReasonLabel { reason }).inc();
    }

    pub(crate) fn count(&self, direction: &'static str, n: usize) {
        self.events
            .get_or_create(&DirectionLabel { direction })
            .inc_by(n as u64);
    }

    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register_with_unit(
            "cluster_lag",
            "Receipt time minus the peer's publish time of its messages (wall clocks)",
            Unit::Seconds,
            self.lag.clone(),
        );
        registry.register(
            "cluster_connected",
            "1 while this replica is connected to the cluster's NATS server",
            self.connected.clone(),
        );
        registry.register(
            "cluster_peers",
            "Peer replicas heard from within the peer timeout",
            self.peers.clone(),
        );
        registry.register(
            "cluster_peer_inflight",
            "Requests of peer replicas counted in flight by this one",
            self.peer_inflight.clone(),
        );
        registry.register(
            "cluster_events",
            "Routing events shared with peers, by direction",
            self.events.clone(),
        );
        registry.register(
            "cluster_dropped",
            "Events not shared or not applied (disconnected, queue_full, unknown_endpoint, decode_error)",
            self.dropped.clone(),
        );
        registry.register(
            "cluster_disconnects",
            "Lost connections to the NATS server",
            self.disconnects.clone(),
        );
        registry.register(
            "cluster_peer_requests_expired",
            "Peer requests dropped from the ledger with no end heard (peer gone or message lost)",
            self.expired.clone(),
        );
        registry.register(
            "cluster_warm_entries",
            "Recent dispatches received from a peer when this replica joined or reconnected",
            self.warm_entries.clone(),
        );
    }
}
