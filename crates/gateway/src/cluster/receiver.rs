//! The receiving side of the link: peers' events applied to this replica's pool and tenancy,
//! and a warm start taken from the first peer that answers a hello.

use super::peers::PeerTable;
use super::wire::{self, WireEvent};
use super::ClusterMetrics;
use super::Sharing;
use crate::pool::PeerEnd;
use futures_util::StreamExt;
use kvgate_core::decision::FailureKind;
use kvgate_core::{EndpointId, Nanos, Request};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Applies peers' events to the pool.
pub(super) struct Receiver {
    pub(super) shared: Arc<Sharing>,
    pub(super) table: PeerTable,
    pub(super) metrics: Arc<ClusterMetrics>,
    pub(super) hello_tx: mpsc::Sender<(u64, u64)>,
    pub(super) nonce: Arc<AtomicU64>,
    /// The peer whose warm start is being taken, for the hello it answers.
    pub(super) warm_from: Option<(u64, u64)>,
}

impl Receiver {
    pub(super) async fn run(
        mut self,
        mut events: async_nats::Subscriber,
        mut warm: async_nats::Subscriber,
    ) {
        let mut stop = self.shared.stop.clone();
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        loop {
            tokio::select! {
                _ = stop.changed() => return,
                Some(m) = events.next() => self.batch(&m.payload),
                Some(m) = warm.next() => self.warm(&m.payload),
                _ = tick.tick() => self.expire(),
            }
            self.metrics.peers.set(self.table.peers() as i64);
            self.metrics.peer_inflight.set(self.table.inflight() as i64);
        }
    }

    fn now(&self) -> Nanos {
        self.shared.pool.clock().now()
    }

    fn batch(&mut self, payload: &[u8]) {
        let Some((header, events, bad)) = wire::decode(payload) else {
            self.metrics.dropped("decode_error");
            return;
        };
        for _ in 0..bad {
            self.metrics.dropped("decode_error");
        }
        self.metrics.count("received", events.len());
        if header.at_us > 0 {
            let lag = wire::now_micros().saturating_sub(header.at_us);
            self.metrics.lag.observe(lag as f64 / 1e6);
        }
        if self.table.heard(header.replica, self.now()) {
            tracing::info!("cluster: peer {:016x} joined", header.replica);
        }
        for event in events {
            self.apply(header.replica, event);
        }
    }

    fn apply(&mut self, replica: u64, event: WireEvent) {
        let now = self.now();
        match event {
            WireEvent::Dispatched {
                endpoint,
                request,
                done,
            } => self.dispatched(replica, &endpoint, request, done, now),
            WireEvent::FirstToken {
                id,
                endpoint,
                ttft_ns,
                stream,
            } => {
                let Some(ep) = self.resolve(&endpoint) else {
                    return;
                };
                if let Some(local) = self.table.local(replica, id, ep) {
                    self.shared
                        .pool
                        .peer_first_token(local, ep, Nanos(ttft_ns), stream);
                }
            }
            WireEvent::Completed {
                id, ref endpoint, ..
            }
            | WireEvent::Failed {
                id, ref endpoint, ..
            } => {
                let Some(ep) = self.resolve(endpoint) else {
                    return;
                };
                let (Some(entry), Some(end)) = (self.table.end(replica, id, ep), event.end())
                else {
                    return;
                };
                self.shared
                    .pool
                    .peer_ended(entry.local, ep, end, entry.prediction);
            }
            WireEvent::Limits {
                scopes,
                requests,
                input,
                output,
            } => {
                let amounts = (requests, input, output);
                if amounts.0.is_finite() && amounts.1.is_finite() && amounts.2.is_finite() {
                    self.shared.tenancy.peer_limits(&scopes, amounts, now);
                }
            }
            WireEvent::Spend { spent } => self.shared.tenancy.peer_spend(&spent),
            WireEvent::Fanout { event } => {
                if let Some(gate) = self.shared.tenancy.fanout() {
                    gate.peer(event);
                }
            }
            WireEvent::Hello { nonce } => {
                let _ = self.hello_tx.try_send((replica, nonce));
            }
            WireEvent::Bye => self.left(replica),
            WireEvent::CacheEntry { entry } => self.shared.semcache.apply_peer(entry),
        }
    }

    /// The pool's id of the endpoint a peer names by base URL; an unknown one is counted.
    fn resolve(&self, endpoint: &str) -> Option<EndpointId> {
        let id = self.shared.pool.id_of_base(endpoint);
        if id.is_none() {
            self.metrics.dropped("unknown_endpoint");
        }
        id
    }

    /// A peer sent `request` to `endpoint` (`done`: a warm start's replay of one that ended).
    fn dispatched(
        &mut self,
        replica: u64,
        endpoint: &str,
        mut request: Request,
        done: bool,
        now: Nanos,
    ) {
        let Some(ep) = self.resolve(endpoint) else {
            return;
        };
        let pool = &self.shared.pool;
        if done {
            pool.peer_replayed(&request, ep);
            return;
        }
        let theirs = request.id;
        let Some(local) = self.table.admit(replica, theirs, ep, now) else {
            return;
        };
        request.id = local;
        if let Some(p) = pool.peer_dispatched(&request, ep) {
            self.table.predicted(replica, theirs, ep, p);
        }
    }

    /// A peer left: what it had in flight ends, cancelled.
    fn left(&mut self, replica: u64) {
        tracing::info!("cluster: peer {replica:016x} left");
        for (ep, entry) in self.table.forget(replica) {
            let cancelled = PeerEnd::Failed(FailureKind::Cancelled);
            self.shared
                .pool
                .peer_ended(entry.local, ep, cancelled, None);
        }
    }

    /// A chunk of a warm start: taken from the first peer that answers this replica's latest
    /// hello, ignored from the others.
    fn warm(&mut self, payload: &[u8]) {
        let Some((header, events, _)) = wire::decode(payload) else {
            self.metrics.dropped("decode_error");
            return;
        };
        let nonce = self.nonce.load(Ordering::Relaxed);
        if header.hello != nonce {
            return;
        }
        match self.warm_from {
            Some((n, from)) if n == nonce && from != header.replica => return,
            Some((n, _)) if n == nonce => {}
            _ => self.warm_from = Some((nonce, header.replica)),
        }
        self.table.heard(header.replica, self.now());
        self.metrics.warm_entries.inc_by(events.len() as u64);
        for event in events {
            if matches!(event, WireEvent::Dispatched { .. }) {
                self.apply(header.replica, event);
            }
        }
        if header.last {
            tracing::info!(
                "cluster: warm start taken from peer {:016x}",
                header.replica
            );
        }
    }

    fn expire(&mut self) {
        let (gone, dropped) = self.table.expire(self.now());
        for replica in gone {
            tracing::warn!("cluster: peer {replica:016x} silent; its requests no longer count");
        }
        self.metrics.expired.inc_by(dropped.len() as u64);
        for (ep, entry) in dropped {
            self.shared.pool.peer_ended(
                entry.local,
                ep,
                PeerEnd::Failed(FailureKind::Cancelled),
                None,
            );
        }
    }
}
