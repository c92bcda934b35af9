//! The listeners' own families.

use crate::metrics::{Counter, Family, Gauge, ReasonLabel, Registry};

/// Client connections of the listeners.
#[derive(Clone, Debug, Default)]
pub(crate) struct ConnectionMetrics {
    /// Open now.
    pub(crate) open: Gauge,
    /// Accepted.
    pub(crate) accepted: Counter,
    /// Closed by the gateway, by reason (`header_timeout`, `idle`, `evicted`, `refused`,
    /// `tls_handshake`).
    pub(crate) closed: Family<ReasonLabel, Counter>,
    /// Failed accepts (out of file descriptors, mostly).
    pub(crate) accept_errors: Counter,
}

impl ConnectionMetrics {
    /// Registers every family in `registry`.
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "connections_open",
            "Client connections open",
            self.open.clone(),
        );
        registry.register(
            "connections_accepted",
            "Client connections accepted",
            self.accepted.clone(),
        );
        registry.register(
            "connections_closed",
            "Client connections the gateway closed: header_timeout, idle, evicted (at the cap, oldest without a request), refused (at the cap, all busy), tls_handshake (failed or too slow)",
            self.closed.clone(),
        );
        registry.register(
            "connections_accept_errors",
            "Failed accepts, mostly out of file descriptors",
            self.accept_errors.clone(),
        );
    }
}
