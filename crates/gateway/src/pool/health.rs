//! What the health checks found: the dispatch core decides whether an endpoint takes traffic;
//! the pool keeps, beside it, what the checks failed on, so an operator reads the cause where
//! the state shows (`/admin/endpoints`, `/ui`, the 503 of a request nothing could take).

use super::{Core, Pool};
use crate::upstream::Trouble;
use kvgate_core::dispatch::Status;
use kvgate_core::{EndpointId, Nanos, Observation};
use std::sync::Arc;

/// Whether the checks keep `status` out (an operator's drain is not a failed check).
fn failing(status: &Status) -> bool {
    !status.healthy || status.reports_down
}

impl Pool {
    /// A scrape of `endpoint` sent at `sent_at` returned `observation` (`None` when the engine
    /// answered without metrics kvgate reads). The endpoint is healthy again; what its checks
    /// had failed on, when this ends its being out.
    pub(crate) fn observed(
        &self,
        endpoint: EndpointId,
        observation: Option<Observation>,
        sent_at: Nanos,
    ) -> Option<Arc<Trouble>> {
        let recovered = {
            let mut core = self.lock();
            let was_failing = core.dispatch.member(endpoint).is_some_and(failing);
            core.dispatch.observed(endpoint, observation, sent_at);
            let recovered = settle(&mut core, endpoint, was_failing);
            self.publish(&core);
            recovered
        };
        if let Some(tokens) = observation.and_then(|o| o.capacity_tokens()) {
            self.cache_mut().set_capacity(endpoint, tokens);
        }
        recovered
    }

    /// What `endpoint`'s engine said of its LoRA adapters in its last scrape (`None`: nothing).
    pub(crate) fn adapters_observed(
        &self,
        endpoint: EndpointId,
        adapters: Option<kvgate_core::lora::AdapterState>,
    ) {
        self.note_adapter_report(endpoint, adapters.clone());
        let mut core = self.lock();
        core.dispatch.adapters_observed(endpoint, adapters);
        self.wake_released(&mut core);
    }

    /// A scrape of `endpoint` failed with `trouble`; after `threshold` in a row it is
    /// unhealthy (see [`kvgate_core::dispatch::DispatchCore::scrape_failed`]). Whether this
    /// failure made it unhealthy.
    pub(crate) fn scrape_failed(
        &self,
        endpoint: EndpointId,
        threshold: u32,
        trouble: Trouble,
    ) -> bool {
        let mut core = self.lock();
        let went_down = core.dispatch.scrape_failed(endpoint, threshold);
        let noted = note(&mut core, endpoint, trouble);
        self.publish_if(&core, went_down || noted);
        went_down
    }

    /// Records what the engine's own `/health` answered: a 5xx (for example an engine draining
    /// for shutdown) keeps it out of routing until `/health` is fine again, whatever traffic it
    /// still answers. Whether this took it out.
    pub(crate) fn reported_health(&self, endpoint: EndpointId, status: u16) -> bool {
        let up = !(500..600).contains(&status);
        let mut core = self.lock();
        let was_failing = core.dispatch.member(endpoint).is_some_and(failing);
        let changed = core.dispatch.reported_health(endpoint, up);
        let noted = if up {
            settle(&mut core, endpoint, was_failing).is_some()
        } else {
            note(&mut core, endpoint, Trouble::Reports { status })
        };
        self.publish_if(&core, changed || noted);
        changed && !up
    }

    /// Records the status `/metrics` of `endpoint` answered; whether it just stopped being a
    /// success (an engine started without metrics, a hosted API, or a base URL with a path
    /// too many: the endpoint is routed without its load signals).
    pub(crate) fn metrics_answered(&self, endpoint: EndpointId, status: u16) -> bool {
        let missing = (!(200..300).contains(&status)).then_some(status);
        // Every scrape reports this and it rarely changes: the published snapshot says so
        // without the lock the pick path takes.
        let snapshot = self.snapshot.load();
        if snapshot
            .get(endpoint)
            .is_none_or(|e| e.metrics_missing == missing)
        {
            return false;
        }
        drop(snapshot);
        let mut core = self.lock();
        let Some(e) = core.endpoint_mut(endpoint) else {
            return false;
        };
        let before = std::mem::replace(&mut e.metrics_missing, missing);
        let changed = before != missing;
        self.publish_if(&core, changed);
        changed && before.is_none()
    }
}

/// Keeps `trouble` as what the checks of `endpoint` last failed on; whether it is news.
fn note(core: &mut Core, endpoint: EndpointId, trouble: Trouble) -> bool {
    let Some(e) = core.endpoint_mut(endpoint) else {
        return false;
    };
    if e.trouble.as_deref() == Some(&trouble) {
        return false;
    }
    e.trouble = Some(Arc::new(trouble));
    true
}

/// Forgets the trouble of `endpoint` once its checks pass; the trouble when they had failed
/// before (`was_failing`), which this ends.
fn settle(core: &mut Core, endpoint: EndpointId, was_failing: bool) -> Option<Arc<Trouble>> {
    if core.dispatch.member(endpoint).is_none_or(failing) {
        return None;
    }
    let trouble = core.endpoint_mut(endpoint)?.trouble.take();
    trouble.filter(|_| was_failing)
}
