//! The pick behind the LoRA gate ([`crate::lora::LoraGate`]): a request's first attempt for an
//! adapter is priced with what the gate would do at each endpoint (the policy sees it in each
//! view's `lora_outlook`), and when the policy's choice is an endpoint where another adapter
//! waits behind the batch this one runs, the request is held instead of sent. The runtime
//! picks again when the gate releases it ([`DispatchCore::released`]) or at the hold's bound.

use super::core::DispatchCore;
use super::{Attempt, Picked};
use crate::index::Overlaps;
use crate::lora::{GateConfig, Hold, Verdict};
use crate::{EndpointId, Nanos, Rejection, Request};

/// A gated pick's outcome.
#[derive(Clone, Debug, PartialEq)]
pub enum Gated {
    /// The attempt goes, recorded as dispatched.
    Picked(Picked),
    /// The gate holds the request: nothing was recorded; pick again once
    /// [`DispatchCore::released`] names it, or at `until`.
    Held(Hold),
}

impl DispatchCore {
    /// [`DispatchCore::pick`] through the LoRA gate: only a first attempt naming an adapter
    /// may be held, and only while the gate is on.
    pub fn pick_gated(
        &mut self,
        request: &Request,
        overlaps: &Overlaps,
        tried: &[EndpointId],
        attempt: Attempt,
        now: Nanos,
    ) -> Result<Gated, Rejection> {
        let adapter = match request.adapter.as_deref() {
            Some(a) if attempt == Attempt::First && self.gate.enabled() => a,
            _ => {
                return self
                    .pick(request, overlaps, tried, attempt, now)
                    .map(Gated::Picked)
            }
        };
        // A held request picks again: it counts once towards the retry budget's total.
        if !self.gate.seen(request.id) {
            self.budget.request(now);
        }
        self.gate.arrived(request.id, adapter, now);
        let gate = &self.gate;
        self.router
            .set_lora_outlooks(|v| gate.outlook(adapter, v.id, v.adapter_report(), now));
        let avoid = self.gate.avoid(request.id, now);
        let choice = match self.choose(request, overlaps, (tried, avoid), attempt, now) {
            Err(_) if avoid.is_some() => {
                self.choose(request, overlaps, (tried, None), attempt, now)
            }
            chosen => chosen,
        };
        self.router.set_lora_outlooks(|_| None);
        let choice = choice?;
        let endpoint = choice.route.endpoint;
        let report = self.router.view(endpoint).and_then(|v| v.adapter_report());
        match self.gate.check(request.id, adapter, endpoint, report, now) {
            Verdict::Hold(hold) => Ok(Gated::Held(hold)),
            Verdict::Send { pass, held } => {
                let mut picked = self.commit(request, overlaps, attempt, choice, now)?;
                picked.held = held.map(|h| (pass, h));
                Ok(Gated::Picked(picked))
            }
        }
    }

    /// The requests the gate released since the last call, in arrival order: each picks again.
    pub fn released(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.released)
    }

    /// A held request's client went away.
    pub fn forget_held(&mut self, request: u64) {
        self.gate.forget(request);
    }

    /// Requests the gate holds now.
    pub fn held(&self) -> usize {
        self.gate.held()
    }

    /// New gate settings (turning it off releases every held request).
    pub fn set_lora_gate(&mut self, config: GateConfig) {
        let released = self.gate.set_config(config);
        self.released.extend(released);
    }

    /// The gate's settings.
    pub fn lora_gate(&self) -> &GateConfig {
        self.gate.config()
    }

    /// Tells the gate of a dispatch (any attempt of a request naming an adapter).
    pub(super) fn gate_dispatched(&mut self, request: &Request, endpoint: EndpointId, now: Nanos) {
        if let (Some(adapter), true) = (request.adapter.as_deref(), self.gate.enabled()) {
            self.gate.dispatched(request.id, adapter, endpoint, now);
        }
    }

    /// Tells the gate of a stream's first token, an end or a report at `endpoint`.
    pub(super) fn gate_event(&mut self, endpoint: EndpointId, event: GateEvent, now: Nanos) {
        let report = self.router.view(endpoint).and_then(|v| v.adapter_report());
        let released = match event {
            GateEvent::FirstToken(request) => self.gate.first_token(request, endpoint, report, now),
            GateEvent::Ended(request, completed) => {
                self.gate.ended(request, endpoint, (completed, report), now)
            }
            GateEvent::Observed => self.gate.observed(endpoint, report),
            GateEvent::Removed => self.gate.remove(endpoint),
        };
        self.released.extend(released);
    }
}

/// What the gate hears of an endpoint.
pub(super) enum GateEvent {
    FirstToken(u64),
    Ended(u64, bool),
    Observed,
    Removed,
}
