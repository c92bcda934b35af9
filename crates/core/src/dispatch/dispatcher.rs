//! [`Dispatcher`]: the dispatch core and the prefix cache owned together, for single-threaded
//! drivers. The gateway's pool makes the same calls in the same order with each half behind its
//! own lock.

use super::core::DispatchCore;
use super::events::End;
use super::member::MemberSpec;
use super::trace::{Stamped, Trace, TraceEvent};
use super::{correct, record_dispatch, record_kv_batch, Attempt, DispatchConfig, Picked};
use crate::decision::FailureKind;
use crate::fasthash::IntMap;
use crate::index::blocks::KvEvent;
use crate::index::{Prediction, PrefixCache};
use crate::resilience::Ticket;
use crate::{EndpointId, Nanos, Observation, PolicyConfig, Rejection, Request, Usage};

/// See the module documentation.
#[derive(Debug)]
pub struct Dispatcher {
    core: DispatchCore,
    cache: Option<PrefixCache>,
    /// Per dispatch awaiting its end: what the cache predicted and the breaker's ticket.
    open: IntMap<(u64, EndpointId), (Option<Prediction>, Ticket)>,
    /// Everything fed to it, when recording.
    trace: Option<Box<Trace>>,
}

impl Dispatcher {
    /// A dispatcher for `policy` seeded by `seed`, with the index the policy asks for (none for
    /// a policy that consults none).
    pub fn new(config: &DispatchConfig, policy: &PolicyConfig, seed: u64) -> Self {
        Dispatcher {
            core: DispatchCore::new(config, policy, seed),
            cache: policy.index().map(|spec| PrefixCache::new(&spec)),
            open: IntMap::default(),
            trace: None,
        }
    }

    /// From now on, records every event and decision ([`Self::take_trace`]), starting with
    /// the members it has (as joins when they joined); `seed` and `policy` are what it was
    /// built with.
    pub fn record(
        &mut self,
        policy: &PolicyConfig,
        seed: u64,
        engine_event_entries: Option<usize>,
    ) {
        let joins = self.core.router().views().iter().map(|v| Stamped {
            at: v.joined_at,
            event: TraceEvent::Join {
                endpoint: v.id,
                weight: v.weight,
            },
        });
        self.trace = Some(Box::new(Trace {
            policy: policy.clone(),
            seed,
            engine_event_entries,
            events: joins.collect(),
        }));
    }

    /// What was recorded since [`Self::record`].
    pub fn take_trace(&mut self) -> Option<Trace> {
        self.trace.take().map(|t| *t)
    }

    fn log(&mut self, at: Nanos, event: impl FnOnce() -> TraceEvent) {
        if let Some(trace) = &mut self.trace {
            trace.events.push(Stamped { at, event: event() });
        }
    }

    /// Also lays the engines' KV-event streams over the policy's index ([`Self::kv_batch`]),
    /// at most `max_entries` per endpoint.
    pub fn with_engine_events(mut self, max_entries: usize) -> Self {
        self.cache = self.cache.map(|c| c.with_engine_events(max_entries));
        self
    }

    /// The dispatch core.
    pub fn core(&self) -> &DispatchCore {
        &self.core
    }

    /// The dispatch core, for membership and health.
    pub fn core_mut(&mut self) -> &mut DispatchCore {
        &mut self.core
    }

    /// The prefix cache, if the policy uses one.
    pub fn cache(&self) -> Option<&PrefixCache> {
        self.cache.as_ref()
    }

    /// Adds member `id` at `now`.
    pub fn add(&mut self, id: EndpointId, spec: &MemberSpec, now: Nanos) {
        self.log(now, || TraceEvent::Join {
            endpoint: id,
            weight: spec.weight,
        });
        self.core.add(id, spec, now);
    }

    /// A member leaves the core and the index.
    pub fn remove(&mut self, id: EndpointId, now: Nanos) -> bool {
        self.log(now, || TraceEvent::Leave { endpoint: id });
        if let Some(cache) = &mut self.cache {
            cache.remove_endpoint(id);
        }
        self.open.retain(|&(_, e), _| e != id);
        self.core.remove(id)
    }

    /// Looks `request` up in the prefix cache, picks, and records the dispatch in both.
    pub fn pick(
        &mut self,
        request: &Request,
        tried: &[EndpointId],
        attempt: Attempt,
        now: Nanos,
    ) -> Result<Picked, Rejection> {
        let overlaps = self
            .cache
            .as_ref()
            .map(|c| c.overlaps(request, now))
            .unwrap_or_default();
        let picked = self.core.pick(request, &overlaps, tried, attempt, now);
        self.log(now, || TraceEvent::Pick {
            request: Box::new(request.clone()),
            tried: tried.to_vec(),
            attempt: attempt.label().to_owned(),
            decision: picked
                .as_ref()
                .ok()
                .map(|p| (p.route.endpoint, p.route.reason.label().to_owned())),
        });
        let picked = picked?;
        let endpoint = picked.route.endpoint;
        let prediction = self
            .cache
            .as_mut()
            .map(|c| record_dispatch(c, request, endpoint, &overlaps, now));
        self.open
            .insert((request.id, endpoint), (prediction, picked.ticket));
        Ok(picked)
    }

    /// A peer sent `request` to `endpoint` at `now` (see [`DispatchCore::peer_dispatched`]);
    /// the cache learns it as if it were this router's own dispatch, and its prediction is
    /// corrected by the usage the peer reports at the end.
    pub fn peer_dispatched(&mut self, request: &Request, endpoint: EndpointId, now: Nanos) {
        self.log(now, || TraceEvent::PeerDispatched {
            request: Box::new(request.clone()),
            endpoint,
        });
        let overlaps = self
            .cache
            .as_ref()
            .map(|c| c.overlaps(request, now))
            .unwrap_or_default();
        if !self.core.peer_dispatched(request, endpoint, &overlaps, now) {
            return;
        }
        let prediction = self
            .cache
            .as_mut()
            .map(|c| record_dispatch(c, request, endpoint, &overlaps, now));
        self.open
            .insert((request.id, endpoint), (prediction, Ticket::default()));
    }

    /// A scrape of `id` taken at `at`: the core's view, and the cache's bound for an engine that
    /// reports its KV capacity.
    pub fn observed(&mut self, id: EndpointId, observation: Observation, at: Nanos) {
        self.log(at, || TraceEvent::Scrape {
            endpoint: id,
            observation,
        });
        self.core.observed(id, Some(observation), at);
        if let (Some(cache), Some(tokens)) = (&mut self.cache, observation.capacity_tokens()) {
            cache.set_capacity(id, tokens);
        }
    }

    /// See [`crate::Router::tokens`].
    pub fn tokens(&mut self, id: EndpointId, at: Nanos) {
        self.log(at, || TraceEvent::Tokens { endpoint: id });
        self.core.router_mut().tokens(id, at);
    }

    /// A streamed first token of `request` on `endpoint` after `ttft`.
    pub fn first_token(&mut self, request: u64, endpoint: EndpointId, now: Nanos, ttft: Nanos) {
        self.log(now, || TraceEvent::FirstToken {
            request,
            endpoint,
            ttft,
        });
        let ticket = self
            .open
            .get(&(request, endpoint))
            .map_or_else(Ticket::default, |o| o.1);
        self.core
            .first_token((request, endpoint), ticket, (ttft, true), now);
        if let Some(cache) = &mut self.cache {
            cache.first_token(request, endpoint, now);
        }
    }

    /// `request` completed on `endpoint`; `usage` scores and corrects the cache's prediction.
    pub fn completed(
        &mut self,
        (request, endpoint): (u64, EndpointId),
        now: Nanos,
        (latency, output_tokens): (Nanos, u32),
        usage: Option<Usage>,
    ) {
        self.log(now, || TraceEvent::Completed {
            request,
            endpoint,
            latency,
            output_tokens,
            usage,
        });
        let end = End::Completed {
            latency,
            output_tokens,
            usage,
        };
        self.core.ended((request, endpoint), end, now);
        self.settle((request, endpoint), end);
    }

    /// `request` failed on `endpoint`.
    pub fn failed(&mut self, request: u64, endpoint: EndpointId, now: Nanos, kind: FailureKind) {
        self.log(now, || TraceEvent::Failed {
            request,
            endpoint,
            kind,
        });
        let ticket = self
            .open
            .remove(&(request, endpoint))
            .map_or_else(Ticket::default, |o| o.1);
        if let Some(cache) = &mut self.cache {
            cache.finished(request, endpoint);
        }
        self.core
            .failed((request, endpoint), ticket, (kind, None), now);
    }

    /// A peer's request had its first token.
    pub fn peer_first_token(
        &mut self,
        request: u64,
        endpoint: EndpointId,
        now: Nanos,
        ttft: Nanos,
    ) {
        self.log(now, || TraceEvent::PeerFirstToken {
            request,
            endpoint,
            ttft,
        });
        self.core
            .peer_first_token((request, endpoint), ttft, true, now);
        if let Some(cache) = &mut self.cache {
            cache.first_token(request, endpoint, now);
        }
    }

    /// A peer's request ended.
    pub fn peer_ended(&mut self, (request, endpoint): (u64, EndpointId), end: End, now: Nanos) {
        self.log(now, || match end {
            End::Completed {
                latency,
                output_tokens,
                usage,
            } => TraceEvent::PeerCompleted {
                request,
                endpoint,
                latency,
                output_tokens,
                usage,
            },
            End::Failed(kind) => TraceEvent::PeerFailed {
                request,
                endpoint,
                kind,
            },
        });
        self.core.peer_ended((request, endpoint), end, now);
        self.settle((request, endpoint), end);
    }

    /// The cache's half of an end: the dispatch is over, and a completion's usage scores and
    /// corrects what the cache predicted.
    fn settle(&mut self, (request, endpoint): (u64, EndpointId), end: End) {
        let open = self.open.remove(&(request, endpoint));
        let Some(cache) = &mut self.cache else {
            return;
        };
        cache.finished(request, endpoint);
        if let (End::Completed { usage: Some(u), .. }, Some((Some(p), _))) = (end, open) {
            let block = self.core.member(endpoint).and_then(|s| s.block_size());
            correct(cache, u, &p, block);
        }
    }

    /// Batch `seq` of `endpoint`'s KV-event stream: into the index's engine layer, and each
    /// event to the policy.
    pub fn kv_batch(&mut self, endpoint: EndpointId, seq: u64, events: &[KvEvent], now: Nanos) {
        self.log(now, || TraceEvent::KvBatch {
            endpoint,
            seq,
            events: events.to_vec(),
        });
        if let Some(cache) = &mut self.cache {
            record_kv_batch(cache, endpoint, seq, events, now);
        }
        self.core.kv_events(endpoint, events, now);
    }

    /// Periodic upkeep of the policy and the index.
    pub fn maintain(&mut self, now: Nanos) {
        self.log(now, || TraceEvent::Maintain);
        self.core.maintain(now);
        if let Some(cache) = &mut self.cache {
            cache.maintain(now);
        }
    }
}
