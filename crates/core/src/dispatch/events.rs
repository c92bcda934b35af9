//! What the dispatch core learns: scrapes and health checks, each attempt's outcome (first
//! token, refusal, completion, failure), peers' news and engines' KV events. Each method says
//! whether a member's published [`super::Status`] changed, so a runtime republishes only then.

use super::core::DispatchCore;
use super::gated::GateEvent;
use super::member::Serving;
use crate::decision::FailureKind;
use crate::index::blocks::KvEvent;
use crate::policy::EndpointModel;
use crate::resilience::Ticket;
use crate::{EndpointId, Nanos, Observation, Request, Usage};
use std::sync::Arc;

/// How a request on an endpoint ended, as the router learns it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum End {
    /// It completed.
    Completed {
        /// Dispatch to end.
        latency: Nanos,
        /// Output tokens streamed.
        output_tokens: u32,
        /// The engine's usage, when the answer carried one.
        usage: Option<Usage>,
    },
    /// It failed (or its client went away).
    Failed(FailureKind),
}

impl DispatchCore {
    /// Stops (or resumes) sending new requests to a member; `None` for an unknown one.
    pub fn set_draining(&mut self, id: EndpointId, draining: bool) -> Option<bool> {
        self.member(id)?;
        Some(self.set_checks(id, |s| s.draining = draining))
    }

    /// Records the models a member reported.
    pub fn set_serving(&mut self, id: EndpointId, serving: Arc<Serving>) {
        if let Some(m) = self.member_mut(id) {
            m.status.serving = serving;
        }
    }

    /// What `id`'s engine said of its LoRA adapters in its last scrape.
    pub fn adapters_observed(
        &mut self,
        id: EndpointId,
        adapters: Option<crate::lora::AdapterState>,
    ) {
        self.router.set_adapters(id, adapters);
        self.gate_event(id, GateEvent::Observed, Nanos::ZERO);
    }

    /// A scrape of `id` sent at `sent_at` returned `observation` (`None` when the engine
    /// answered without metrics kvgate reads). The member is healthy again.
    pub fn observed(&mut self, id: EndpointId, observation: Option<Observation>, sent_at: Nanos) {
        self.set_checks(id, |s| s.healthy = true);
        let Some(m) = self.member_mut(id) else {
            return;
        };
        m.scrape_failures = 0;
        m.served_since_scrape = false;
        if let Some(obs) = observation {
            let s = &mut m.status;
            s.observation = Some(obs);
            if obs.waiting > 0 && obs.running > 0 {
                s.slots = Some(s.slots.map_or(obs.running, |n| n.max(obs.running)));
            }
            self.router.observed(id, obs, sent_at);
        }
    }

    /// A scrape of `id` failed; after `threshold` in a row it is unhealthy. A failed scrape
    /// does not count while the member answered requests since the previous scrape: an engine
    /// too busy to answer `/metrics` in time is not a dead engine, and taking the last member
    /// out of a pool for it would turn load into errors. Whether this failure made it
    /// unhealthy.
    pub fn scrape_failed(&mut self, id: EndpointId, threshold: u32) -> bool {
        let Some(m) = self.member_mut(id) else {
            return false;
        };
        if std::mem::take(&mut m.served_since_scrape) {
            return false;
        }
        m.scrape_failures += 1;
        let down = m.scrape_failures >= threshold;
        down && self.set_checks(id, |s| s.healthy = false)
    }

    /// What the engine's own `/health` said: a failure (for example an engine draining for
    /// shutdown) keeps it out of routing until it is fine again, whatever traffic it still
    /// answers. Whether its health changed.
    pub fn reported_health(&mut self, id: EndpointId, up: bool) -> bool {
        self.set_checks(id, |s| s.reports_down = !up)
    }

    /// The member's engine restarted: the batch size learned from its scrapes goes (a restart
    /// is how an operator changes it). The caller empties its prefix cache's entries there.
    pub fn engine_restarted(&mut self, id: EndpointId) {
        if let Some(m) = self.member_mut(id) {
            m.status.slots = None;
        }
    }

    /// The first bytes of a 2xx answer to `request` arrived from `endpoint` after `ttft`.
    ///
    /// Only a stream's first bytes are a first token: a non-streaming answer's first bytes come
    /// when generation ends, so its `ttft` is the end-to-end time, and a policy learning from it
    /// (peak EWMA) would learn output lengths rather than endpoint speed. For those the policy
    /// hears only the end, and the hedging delay gets no sample; both kinds count as a breaker
    /// success and as proof of life (passive health checking).
    pub fn first_token(
        &mut self,
        (request, endpoint): (u64, EndpointId),
        ticket: Ticket,
        (ttft, stream): (Nanos, bool),
        now: Nanos,
    ) -> bool {
        let mut changed = self.set_checks(endpoint, |s| s.healthy = true);
        if let Some(m) = self.member_mut(endpoint) {
            m.answered();
            m.breaker.record(ticket, true, now);
            changed |= m.sync_breaker();
        }
        if stream {
            self.hedge.record(ttft);
            self.router.first_token(request, endpoint, now, ttft);
            self.gate_event(endpoint, GateEvent::FirstToken(request), now);
        }
        changed
    }

    /// `endpoint` answered with a status other than 2xx, 5xx or 429 (those are attempt
    /// failures): the answer goes to the client as it is, but it is neither a first token nor
    /// proof of life. 401, 403, 404 and 408 say the endpoint cannot serve (a wrong key, a model
    /// or route it lacks, a request it gave up on) and count as breaker failures, as LiteLLM
    /// cools such deployments down; any other status (400, 413, 422) is the client's own fault
    /// and only frees a half-open probe slot.
    pub fn refused(
        &mut self,
        endpoint: EndpointId,
        ticket: Ticket,
        status: u16,
        now: Nanos,
    ) -> bool {
        let Some(m) = self.member_mut(endpoint) else {
            return false;
        };
        if matches!(status, 401 | 403 | 404 | 408) {
            m.breaker.record(ticket, false, now);
        } else {
            m.breaker.release(ticket);
        }
        m.sync_breaker()
    }

    /// `request` on `endpoint` ended as `end`: the router learns it and the deployment's
    /// limits settle its charge.
    pub fn ended(&mut self, (request, endpoint): (u64, EndpointId), end: End, now: Nanos) {
        self.peer_ended((request, endpoint), end, now);
        let completed = matches!(end, End::Completed { .. });
        self.gate_event(endpoint, GateEvent::Ended(request, completed), now);
        if let Some(limits) = self.member_mut(endpoint).and_then(|m| m.limits.as_mut()) {
            let usage = match &end {
                End::Completed { usage, .. } => usage.as_ref(),
                End::Failed(_) => None,
            };
            limits.ended(request, now, usage);
        }
    }

    /// `request` failed on `endpoint`. Connection errors, 5xx and timeouts count against the
    /// breaker and cool the member down; a Retry-After keeps it out of routing for its
    /// duration. Whether its published status changed.
    pub fn failed(
        &mut self,
        (request, endpoint): (u64, EndpointId),
        ticket: Ticket,
        (kind, retry_after): (FailureKind, Option<Nanos>),
        now: Nanos,
    ) -> bool {
        self.ended((request, endpoint), End::Failed(kind), now);
        let Some(m) = self.member_mut(endpoint) else {
            return false;
        };
        let mut changed = false;
        if let Some(wait) = retry_after {
            let until = now + wait;
            changed |= until > m.status.avoid_until;
            m.status.avoid_until = m.status.avoid_until.max(until);
        }
        match kind {
            // A 429 is no fault of health (the breaker does not count it) but says "not now":
            // the member cools down at once, so a lower tier or a peer takes the next request
            // (LiteLLM cools a deployment down on its first 429).
            FailureKind::Overloaded => {
                m.breaker.release(ticket);
                m.cool_down(now);
                changed = true;
            }
            FailureKind::Cancelled => m.breaker.release(ticket),
            _ => {
                m.breaker.record(ticket, false, now);
                m.cool_down(now);
                changed = true;
            }
        }
        changed | m.sync_breaker()
    }

    /// A peer (another router sharing its decisions) sent `request` to `endpoint`: it counts in
    /// flight here and the policy learns it as a dispatch. Breakers, cool-downs and limits stay
    /// each router's own. Whether `endpoint` is a member.
    pub fn peer_dispatched(
        &mut self,
        request: &Request,
        endpoint: EndpointId,
        overlaps: &crate::index::Overlaps,
        now: Nanos,
    ) -> bool {
        if self.router.view(endpoint).is_none() {
            return false;
        }
        self.router.commit(request, endpoint, overlaps, now);
        true
    }

    /// A peer's request had its first bytes after `ttft` (a first token when `stream`).
    pub fn peer_first_token(
        &mut self,
        (request, endpoint): (u64, EndpointId),
        ttft: Nanos,
        stream: bool,
        now: Nanos,
    ) {
        if stream {
            self.router.first_token(request, endpoint, now, ttft);
        }
    }

    /// A peer's request ended (the router's part of [`Self::ended`]).
    pub fn peer_ended(&mut self, (request, endpoint): (u64, EndpointId), end: End, now: Nanos) {
        match end {
            End::Completed {
                latency,
                output_tokens,
                usage,
            } => {
                if let Some(usage) = usage {
                    self.router.usage(request, endpoint, now, usage);
                }
                self.router
                    .completed(request, endpoint, now, latency, output_tokens);
            }
            End::Failed(kind) => self.router.failed(request, endpoint, now, kind),
        }
    }

    /// An engine's KV events reach the policy.
    pub fn kv_events(&mut self, endpoint: EndpointId, events: &[KvEvent], now: Nanos) {
        for event in events {
            self.router.kv_event(endpoint, event, now);
        }
    }

    /// Periodic upkeep of the policy; what it learned of each member, for policies that learn.
    pub fn maintain(&mut self, now: Nanos) -> Vec<(EndpointId, EndpointModel)> {
        self.router.maintain(now);
        self.router.models(now)
    }
}
