//! What peers (other gateway replicas of one cluster) report, applied to this replica's pool, and
//! what this pool tells its [`Subscriber`] (the cluster link) of its own requests. Peers'
//! dispatches count in flight here and enter the prefix cache, their first tokens and usage feed
//! the policy's calibration, their ends free the in-flight count. None of it touches breakers,
//! cooldowns or deployment limits, which stay each replica's own (a peer's failure is that
//! peer's view of the endpoint, and its own retries already acted on it).
//!
//! Requests are named by ids this replica allocated for them (the cluster link's), never by the
//! peer's own ids, which collide with local ones.

use super::Pool;
use kvgate_core::dispatch;
use kvgate_core::index::Prediction;
use kvgate_core::{EndpointId, Nanos, Request};
use std::sync::Arc;

impl Pool {
    /// From now on, `subscriber` hears what this pool's own requests did (the first
    /// subscriber stays).
    pub(crate) fn subscribe(&self, subscriber: Arc<dyn Subscriber>) {
        let _ = self.subscriber.set(subscriber);
    }

    /// Tells the peers, in a cluster, what happened at `endpoint`: the event is built (with the
    /// endpoint's base URL, read lock-free from the snapshot) only then.
    pub(super) fn share_about(
        &self,
        endpoint: EndpointId,
        event: impl FnOnce(Arc<str>) -> Progress,
    ) {
        let Some(subscriber) = self.subscriber.get() else {
            return;
        };
        if let Some(base) = self.base_of(endpoint) {
            subscriber.notify(PoolEvent::Progress(event(base)));
        }
    }

    /// The endpoint whose base URL is `base`: replicas name endpoints by URL, since ids are
    /// assigned per process in the order endpoints were added.
    pub fn id_of_base(&self, base: &str) -> Option<EndpointId> {
        self.snapshot
            .load()
            .endpoints
            .iter()
            .find(|e| &*e.about.base == base)
            .map(|e| e.id)
    }

    /// A peer sent `request` (already renamed to a local id) to `endpoint`: the router counts
    /// it in flight and the policy learns it as a dispatch; the prefix cache inserts its
    /// prompt. Returns what the cache predicted, to be corrected when its usage arrives.
    pub fn peer_dispatched(&self, request: &Request, endpoint: EndpointId) -> Option<Prediction> {
        let now = self.clock.now();
        let overlaps = self.lookup(request, now);
        {
            let mut core = self.lock();
            if !core
                .dispatch
                .peer_dispatched(request, endpoint, &overlaps, now)
            {
                return None;
            }
            core.sync_inflight(endpoint);
        }
        let mut cache = self.cache_mut();
        Some(dispatch::record_dispatch(
            &mut cache, request, endpoint, &overlaps, now,
        ))
    }

    /// A peer's request on `endpoint` had its first bytes after `ttft` (a first token, which
    /// the policy learns the endpoint's speed from, when `stream`).
    pub fn peer_first_token(&self, request: u64, endpoint: EndpointId, ttft: Nanos, stream: bool) {
        let now = self.clock.now();
        self.lock()
            .dispatch
            .peer_first_token((request, endpoint), ttft, stream, now);
        self.cache_mut().first_token(request, endpoint, now);
    }

    /// A peer's request on `endpoint` ended: completed (with the engine's usage when it had
    /// one) or failed.
    pub fn peer_ended(
        &self,
        request: u64,
        endpoint: EndpointId,
        end: PeerEnd,
        prediction: Option<Prediction>,
    ) {
        let now = self.clock.now();
        {
            let mut core = self.lock();
            core.dispatch.peer_ended((request, endpoint), end, now);
            core.sync_inflight(endpoint);
        }
        let mut cache = self.cache_mut();
        cache.finished(request, endpoint);
        if let (PeerEnd::Completed { usage: Some(u), .. }, Some(p)) = (end, prediction) {
            self.correct(&mut cache, endpoint, u, &p);
        }
    }

    /// Warm start: a peer's recent dispatch of `request` to `endpoint`, already over, enters the
    /// prefix cache only (it is not in flight and the policy has nothing to learn from it).
    pub fn peer_replayed(&self, request: &Request, endpoint: EndpointId) {
        let now = self.clock.now();
        let overlaps = self.lookup(request, now);
        let mut cache = self.cache_mut();
        cache.dispatched(request, endpoint, now, &overlaps);
        cache.first_token(request.id, endpoint, now);
        cache.finished(request.id, endpoint);
    }
}

/// How a peer's request ended.
pub use kvgate_core::dispatch::End as PeerEnd;

/// What one of this pool's own requests did, as its subscriber hears it. Endpoints are named by
/// base URL: replicas assign ids per process, in the order endpoints were added.
#[derive(Debug)]
pub(crate) enum PoolEvent<'a> {
    /// A request went to an endpoint.
    Dispatched {
        endpoint: Arc<str>,
        request: &'a Request,
    },
    /// What became of it since.
    Progress(Progress),
}

/// A dispatched request's first bytes or end.
#[derive(Clone, Debug)]
pub(crate) enum Progress {
    /// Its first bytes (a first token only when `stream`; see [`Pool::first_token`]).
    FirstToken {
        id: u64,
        endpoint: Arc<str>,
        ttft: Nanos,
        stream: bool,
    },
    /// It ended.
    Ended {
        id: u64,
        endpoint: Arc<str>,
        end: PeerEnd,
    },
}

/// Hears what the pool's own requests did; the pool never waits on it (a subscriber queues).
pub(crate) trait Subscriber: std::fmt::Debug + Send + Sync {
    /// One event, on the request path: it must not block.
    fn notify(&self, event: PoolEvent<'_>);
}
