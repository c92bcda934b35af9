//! What this replica tells its peers, queued for the link: the pool's own requests
//! (`pool::Subscriber`) and tenancy's announcements (`tenancy::Announcer`).

use super::wire;
use super::{ClusterConfig, ClusterMetrics};
use crate::tenancy::{Announcement, Announcer};
use kvgate_core::Request;
use std::sync::Arc;
use tokio::sync::mpsc;

/// One thing this replica's pool learned, on its way to the peers. Endpoints are named by
/// base URL, requests by this replica's own id.
#[derive(Debug)]
pub(crate) enum Local {
    /// A request went to an endpoint.
    Dispatched {
        endpoint: Arc<str>,
        request: Request,
    },
    /// What became of one of this replica's own requests since.
    Progress(crate::pool::Progress),
    /// Tenancy's news: fan-out claims, limits taken, spend.
    Tenancy(Announcement),
    /// An answer the semantic cache stored.
    Cache(crate::semcache::SharedEntry),
}

/// Where the pool drops what peers should hear; never blocks the request path.
#[derive(Debug, Clone)]
pub(crate) struct Outbox {
    tx: mpsc::Sender<Local>,
    metrics: Arc<ClusterMetrics>,
    max_prompt_bytes: usize,
}

/// The link hears the pool's own requests and queues them for the peers.
impl crate::pool::Subscriber for Outbox {
    fn notify(&self, event: crate::pool::PoolEvent<'_>) {
        use crate::pool::PoolEvent;
        match event {
            PoolEvent::Dispatched { endpoint, request } => self.dispatched(endpoint, request),
            PoolEvent::Progress(progress) => self.send(Local::Progress(progress)),
        }
    }
}

/// The link carries tenancy's announcements to the peers.
impl Announcer for Outbox {
    fn announce(&self, what: Announcement) {
        self.send(Local::Tenancy(what));
    }

    fn peers(&self) -> i64 {
        self.metrics.peers.get()
    }
}

/// The link carries the semantic cache's stored answers to the peers.
impl crate::semcache::Publisher for Outbox {
    fn publish(&self, entry: crate::semcache::SharedEntry) {
        self.send(Local::Cache(entry));
    }
}

impl Outbox {
    pub(crate) fn new(
        config: &ClusterConfig,
        metrics: Arc<ClusterMetrics>,
    ) -> (Self, mpsc::Receiver<Local>) {
        let (tx, rx) = mpsc::channel(config.queue);
        let outbox = Outbox {
            tx,
            metrics,
            max_prompt_bytes: config.max_prompt_bytes,
        };
        (outbox, rx)
    }

    /// Queues `request`'s dispatch to `endpoint`, its prompt cut to `max_prompt_bytes` as it is
    /// copied (a prompt of megabytes is never copied whole on the request path).
    pub(crate) fn dispatched(&self, endpoint: Arc<str>, request: &Request) {
        self.send(Local::Dispatched {
            endpoint,
            request: wire::capped(request, self.max_prompt_bytes),
        });
    }

    /// Queues `event`; a full queue (NATS slower than the traffic) drops it, counted.
    pub(crate) fn send(&self, event: Local) {
        if self.tx.try_send(event).is_err() {
            self.metrics.dropped("queue_full");
        }
    }
}
