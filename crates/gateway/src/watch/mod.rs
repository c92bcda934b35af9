//! The loops that watch each engine and feed the pool: its `/health` and `/metrics` on an
//! interval ([`scrape`]) and, when configured, its KV-cache events ([`kv_events`]). Both start
//! when an endpoint joins (at start, on a reload, from discovery or the admin API) and end when
//! it leaves or the gateway stops.
//!
//! A watch is where an engine's loss is seen first (a new process, or no answer once it turned
//! unhealthy); an attempt sees the other signs (a refused connection, a broken stream). Both
//! raise them on one [`LossSignal`], and the request path re-homes the sessions the engine
//! served (`crate::relay`): the watch never reaches into the request path.

mod kv_events;
mod metrics;
pub(crate) mod scrape;

pub(crate) use metrics::WatchMetrics;
pub use scrape::ScrapeConfig;

use crate::engine_state::{EngineStateMetrics, KvEventsConfig};
use crate::pool::Pool;
use crate::upstream::HttpClient;
use kvgate_core::EndpointId;
use std::sync::Arc;
use tokio::sync::{mpsc, watch};

/// A sign that an engine's cached prefixes are gone or may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Loss {
    /// It broke a stream or refused a connection: a crash, or only a flaky link.
    Suspected(EndpointId),
    /// It is gone: its scrape showed a new process, or it turned unhealthy without answering.
    Lost(EndpointId),
}

/// Where signs of loss go. Unbounded: signs come per failure, not per request, and whoever
/// raises one (a scrape loop, an attempt) must not wait.
#[derive(Clone, Debug)]
pub(crate) struct LossSignal(mpsc::UnboundedSender<Loss>);

impl LossSignal {
    /// A signal and the receiving end the request path listens on.
    pub(crate) fn channel() -> (Self, mpsc::UnboundedReceiver<Loss>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (LossSignal(tx), rx)
    }

    /// `endpoint` broke a stream or refused a connection.
    pub(crate) fn suspect(&self, endpoint: EndpointId) {
        let _ = self.0.send(Loss::Suspected(endpoint));
    }

    /// `endpoint` is gone.
    pub(crate) fn lost(&self, endpoint: EndpointId) {
        let _ = self.0.send(Loss::Lost(endpoint));
    }
}

/// What the loops of every endpoint need, cheap to clone into each.
#[derive(Clone, Debug)]
pub(crate) struct EngineWatch {
    pub(crate) pool: Arc<Pool>,
    pub(crate) client: HttpClient,
    pub(crate) metrics: WatchMetrics,
    pub(crate) engine_state: EngineStateMetrics,
    pub(crate) scrape: ScrapeConfig,
    pub(crate) kv_events: KvEventsConfig,
    pub(crate) losses: LossSignal,
    /// Turns true when the gateway stops.
    pub(crate) stop: watch::Receiver<bool>,
}

impl EngineWatch {
    /// Starts the loops of endpoint `id`: its scrape, and its KV-event subscriber when its
    /// configuration names a source.
    pub(crate) fn start(&self, id: EndpointId) {
        scrape::spawn(self.clone(), id);
        kv_events::spawn(self.clone(), id);
    }

    /// Scrapes `id` once now: whether its engine answered, `None` when it left the pool.
    pub(crate) async fn probe(&self, id: EndpointId) -> Option<bool> {
        scrape::scrape_once(self, id).await
    }
}
