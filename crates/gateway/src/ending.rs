//! How a request ended, recorded once: an [`Ending`] travels with the request from the moment
//! it arrives (through admission, attempts and the response body) and writes
//! `kvgate_requests_total{outcome, policy, endpoint}` when it is dropped. A request whose future
//! or body is dropped before anyone set an outcome (the client went away) ends as `cancelled`.

use crate::state::Shared;
use kvgate_core::resilience::Outcome;
use std::sync::Arc;

/// The request's outcome so far. See the module documentation.
#[derive(Debug)]
pub(crate) struct Ending {
    shared: Arc<Shared>,
    outcome: Outcome,
    endpoint: Option<Arc<str>>,
    armed: bool,
}

impl Ending {
    /// A request that just arrived.
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Ending {
            shared,
            outcome: Outcome::Cancelled,
            endpoint: None,
            armed: true,
        }
    }

    /// Sets the outcome recorded at the end.
    pub(crate) fn set(&mut self, outcome: Outcome) {
        self.outcome = outcome;
    }

    /// Names the endpoint that answered (or last failed).
    pub(crate) fn at(&mut self, endpoint: Arc<str>) {
        self.endpoint = Some(endpoint);
    }

    /// Moves the record into a new owner (the response body); this one records nothing.
    pub(crate) fn take(&mut self) -> Ending {
        self.armed = false;
        Ending {
            shared: self.shared.clone(),
            outcome: self.outcome,
            endpoint: self.endpoint.take(),
            armed: true,
        }
    }
}

impl Drop for Ending {
    fn drop(&mut self) {
        if self.armed {
            self.shared.metrics.request(
                self.outcome.label(),
                self.shared.pool.policy_name(),
                self.endpoint.as_deref().unwrap_or("none"),
            );
        }
    }
}
