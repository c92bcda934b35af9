//! The watch's own families.

use crate::metrics::{Counter, EndpointLabel, Family, Registry, ScrapeLabels};

/// The engines' scrapes.
#[derive(Clone, Debug)]
pub(crate) struct WatchMetrics {
    /// Engine metric scrapes.
    pub(crate) scrapes: Family<ScrapeLabels, Counter>,
    /// Engines found restarted by their scrapes (their cache gone).
    pub(crate) restarts: Family<EndpointLabel, Counter>,
}

impl WatchMetrics {
    /// Every family, registered in `registry`.
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let metrics = WatchMetrics {
            scrapes: Family::default(),
            restarts: Family::default(),
        };
        registry.register(
            "scrapes",
            "Engine metric scrapes by result",
            metrics.scrapes.clone(),
        );
        registry.register(
            "endpoint_restarts",
            "Engines whose scrape showed a new process (start time changed or counters went back): the index forgot what they held",
            metrics.restarts.clone(),
        );
        metrics
    }
}
