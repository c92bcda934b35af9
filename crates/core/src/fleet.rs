//! The fleet as a policy sees it: per endpoint, what the router was last told and what it did
//! itself since.

use crate::{Cadence, Nanos};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fmt;

/// A replica's identity within one router. Dense small integers, assigned by the runtime.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct EndpointId(pub u32);

impl fmt::Display for EndpointId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "e{}", self.0)
    }
}

/// Whether an endpoint may receive new requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Health {
    /// Accepting traffic.
    #[default]
    Healthy,
    /// Finishing in-flight work; gets no new requests.
    Draining,
    /// Failing health checks, tripped breaker or steered away by Retry-After.
    Unhealthy,
}

/// One scrape of an endpoint's engine metrics (vLLM `num_requests_running`, `num_requests_waiting`,
/// `kv_cache_usage_perc`; vLLM docs, "Production metrics").
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// Sequences in the running batch.
    pub running: u32,
    /// Sequences queued in the engine, including those that hold no KV blocks yet.
    pub waiting: u32,
    /// KV cache usage, 0..=1.
    pub kv_usage: f64,
    /// Free KV blocks, if the engine reports them.
    pub free_blocks: Option<u64>,
    /// Total KV blocks, if the engine reports them.
    pub total_blocks: Option<u64>,
    /// Tokens per KV block, if the engine reports it (vLLM's `cache_config_info`).
    #[serde(default)]
    pub block_size: Option<u32>,
}

impl Observation {
    /// Accepted-but-unfinished work as the engine reported it: waiting plus running (the load
    /// signal must count queued requests too: they hold no KV blocks yet but will).
    pub fn outstanding(&self) -> u32 {
        self.running.saturating_add(self.waiting)
    }

    /// Tokens of KV the engine can hold: its blocks times their size, when it reports both.
    pub fn capacity_tokens(&self) -> Option<u64> {
        let (blocks, size) = (self.total_blocks?, self.block_size?);
        Some(blocks.saturating_mul(u64::from(size)))
    }

    /// KV blocks in use, from the block counts when reported, else from the usage ratio.
    pub fn used_blocks(&self) -> Option<u64> {
        match (self.free_blocks, self.total_blocks) {
            (Some(free), Some(total)) => Some(total.saturating_sub(free)),
            (None, Some(total)) => Some((self.kv_usage.clamp(0.0, 1.0) * total as f64) as u64),
            _ => None,
        }
    }
}

/// One endpoint in the snapshot handed to a policy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EndpointView {
    /// Identity.
    pub id: EndpointId,
    /// Static capacity weight (1.0 = nominal).
    pub weight: f64,
    /// Routable or not.
    pub health: Health,
    /// The last observation, if any.
    pub observation: Option<Observation>,
    /// When `observation` was taken.
    pub observed_at: Nanos,
    /// Requests this router dispatched after `observed_at` and that have not finished: the
    /// self-accounting correction for a stale scrape (docs/background.md#stale-signals-and-herding,
    /// mitigation 1). With no observation at all this is every unfinished request of ours.
    pub own_since_observation: u32,
    /// Every unfinished request this router dispatched to the endpoint.
    pub own_inflight: u32,
    /// When the endpoint joined the pool; drives blackout and slow start.
    pub joined_at: Nanos,
    /// Its iteration clock, from the streams this router relays; `None` until it has seen
    /// tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cadence: Option<Cadence>,
    /// Its LoRA adapters as its engine last reported them; `None` when it reports none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapters: Option<crate::lora::AdapterState>,
    /// For the adapter request being placed, what it would meet here by the LoRA gate's
    /// account (set by the dispatch core for that pick only; `None` otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora_outlook: Option<crate::lora::Outlook>,
}

impl EndpointView {
    /// A healthy endpoint of weight 1 with no observation, joined at the epoch.
    pub fn new(id: EndpointId) -> Self {
        EndpointView {
            id,
            weight: 1.0,
            health: Health::Healthy,
            observation: None,
            observed_at: Nanos::ZERO,
            own_since_observation: 0,
            own_inflight: 0,
            joined_at: Nanos::ZERO,
            cadence: None,
            adapters: None,
            lora_outlook: None,
        }
    }

    /// Its adapter report with the time it was taken, as the LoRA gate reads it.
    pub fn adapter_report(&self) -> crate::lora::Report<'_> {
        self.adapters.as_ref().map(|a| (a, self.observed_at))
    }

    /// Sets the observation and when it was taken.
    pub fn observed(mut self, observation: Observation, at: Nanos) -> Self {
        self.observation = Some(observation);
        self.observed_at = at;
        self
    }

    /// Whether a policy may route to this endpoint.
    pub fn is_routable(&self) -> bool {
        self.health == Health::Healthy
    }
}

/// The fleet for one pick: every member's view, and which members may take this request.
///
/// Membership (the views) changes only when endpoints join or leave, so rings and trees keyed
/// by it stay put; eligibility (health, a model the endpoint lacks, an endpoint this request
/// already tried) is the caller's `accept` predicate, as in pingora's `select_with(key, max,
/// accept)`. A retry asks the same policy again with the tried endpoints refused and gets the
/// next candidate of the same ranking.
#[derive(Clone, Copy)]
pub struct Fleet<'a> {
    views: &'a [EndpointView],
    accept: &'a dyn Fn(&EndpointView) -> bool,
}

fn accept_all(_: &EndpointView) -> bool {
    true
}

impl fmt::Debug for Fleet<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fleet")
            .field("members", &self.views.len())
            .field(
                "eligible",
                &(0..self.views.len()).filter(|&i| self.eligible(i)).count(),
            )
            .finish()
    }
}

impl<'a> Fleet<'a> {
    /// `views` (sorted by id), of which those that are healthy and `accept`ed may be chosen.
    pub fn new(views: &'a [EndpointView], accept: &'a dyn Fn(&EndpointView) -> bool) -> Self {
        debug_assert!(
            views.windows(2).all(|w| w[0].id < w[1].id),
            "fleet views must be sorted by id"
        );
        Fleet { views, accept }
    }

    /// Every healthy member of `views` is eligible.
    pub fn of(views: &'a [EndpointView]) -> Self {
        Fleet::new(views, &accept_all)
    }

    /// Every member, eligible or not, in id order.
    pub fn views(&self) -> &'a [EndpointView] {
        self.views
    }

    /// Members, eligible or not.
    pub fn len(&self) -> usize {
        self.views.len()
    }

    /// Whether the fleet has no members at all.
    pub fn is_empty(&self) -> bool {
        self.views.is_empty()
    }

    /// Whether member `i` may take this request: healthy and accepted by the caller.
    pub fn eligible(&self, i: usize) -> bool {
        let view = &self.views[i];
        view.is_routable() && (self.accept)(view)
    }

    /// Positions of the eligible members, in id order.
    pub fn eligible_positions(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.views.len()).filter(move |&i| self.eligible(i))
    }

    /// The position of member `id`.
    pub fn position(&self, id: EndpointId) -> Option<usize> {
        self.views.binary_search_by_key(&id, |v| v.id).ok()
    }
}

/// The router's own bookkeeping of requests it dispatched and that have not finished, per
/// endpoint, so it can say how many were sent after any given observation.
///
/// The simulator and the gateway both keep one and copy its counts into [`EndpointView`]s.
#[derive(Clone, Debug, Default)]
pub struct InflightLedger {
    endpoints: HashMap<EndpointId, EndpointLedger>,
}

#[derive(Clone, Debug, Default)]
struct EndpointLedger {
    /// Each unfinished request: when it was sent, and whether its first token came.
    inflight: HashMap<u64, (Nanos, bool)>,
    observed_at: Option<Nanos>,
    since_observation: u32,
}

impl InflightLedger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that `request` was sent to `endpoint` at `at`.
    pub fn dispatched(&mut self, endpoint: EndpointId, request: u64, at: Nanos) {
        let ledger = self.endpoints.entry(endpoint).or_default();
        if ledger.inflight.insert(request, (at, false)).is_none() {
            ledger.since_observation += 1;
        }
    }

    /// Records that `request`'s first token came from `endpoint`. Unknown ids are ignored.
    pub fn first_token(&mut self, endpoint: EndpointId, request: u64) {
        if let Some(ledger) = self.endpoints.get_mut(&endpoint) {
            if let Some((_, answered)) = ledger.inflight.get_mut(&request) {
                *answered = true;
            }
        }
    }

    /// Records that `request` finished (completed, failed or cancelled). Unknown ids are ignored.
    pub fn finished(&mut self, endpoint: EndpointId, request: u64) {
        if let Some(ledger) = self.endpoints.get_mut(&endpoint) {
            if let Some((sent, _)) = ledger.inflight.remove(&request) {
                if ledger.observed_at.is_none_or(|obs| sent > obs) {
                    ledger.since_observation = ledger.since_observation.saturating_sub(1);
                }
            }
        }
    }

    /// Records that an observation of `endpoint` was taken at `at`: our requests sent at or
    /// before `at` are now part of what the engine reported.
    pub fn observed(&mut self, endpoint: EndpointId, at: Nanos) {
        let ledger = self.endpoints.entry(endpoint).or_default();
        ledger.observed_at = Some(at);
        ledger.since_observation =
            count_u32(ledger.inflight.values().filter(|&&(sent, _)| sent > at));
    }

    /// Forgets an endpoint that left the pool.
    pub fn remove(&mut self, endpoint: EndpointId) {
        self.endpoints.remove(&endpoint);
    }

    /// Unfinished requests sent after the last observation of `endpoint`.
    pub fn since_observation(&self, endpoint: EndpointId) -> u32 {
        self.endpoints
            .get(&endpoint)
            .map_or(0, |l| l.since_observation)
    }

    /// Every unfinished request sent to `endpoint`.
    pub fn inflight(&self, endpoint: EndpointId) -> u32 {
        self.endpoints
            .get(&endpoint)
            .map_or(0, |l| u32::try_from(l.inflight.len()).unwrap_or(u32::MAX))
    }

    /// Unfinished requests sent to `endpoint` whose first token has not come. A request whose
    /// first bytes are not a first token (a non-streamed answer) counts until it finishes.
    pub fn awaiting_first_token(&self, endpoint: EndpointId) -> u32 {
        self.endpoints.get(&endpoint).map_or(0, |l| {
            count_u32(l.inflight.values().filter(|&&(_, answered)| !answered))
        })
    }

    /// Copies this ledger's counts into a view of the same endpoint.
    pub fn annotate(&self, view: &mut EndpointView) {
        view.own_since_observation = self.since_observation(view.id);
        view.own_inflight = self.inflight(view.id);
    }
}

fn count_u32<I: Iterator>(iter: I) -> u32 {
    u32::try_from(iter.count()).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ledger_counts_only_dispatches_after_the_observation() {
        let e = EndpointId(3);
        let mut ledger = InflightLedger::new();
        ledger.dispatched(e, 1, Nanos(10));
        ledger.dispatched(e, 2, Nanos(20));
        assert_eq!(ledger.since_observation(e), 2);
        ledger.observed(e, Nanos(15));
        assert_eq!(ledger.since_observation(e), 1);
        assert_eq!(ledger.inflight(e), 2);
        ledger.finished(e, 1);
        assert_eq!(
            ledger.since_observation(e),
            1,
            "request 1 was already in the scrape"
        );
        ledger.finished(e, 2);
        assert_eq!(ledger.since_observation(e), 0);
        ledger.finished(e, 2);
        assert_eq!(ledger.inflight(e), 0);
    }

    #[test]
    fn ledger_counts_requests_awaiting_their_first_token() {
        let (e, other) = (EndpointId(1), EndpointId(2));
        let mut ledger = InflightLedger::new();
        for id in 1..=3 {
            ledger.dispatched(e, id, Nanos(id));
        }
        assert_eq!(ledger.awaiting_first_token(e), 3);
        ledger.first_token(e, 1);
        ledger.first_token(e, 1);
        ledger.first_token(other, 2);
        ledger.first_token(e, 9);
        assert_eq!(
            ledger.awaiting_first_token(e),
            2,
            "once per request, on its endpoint"
        );
        ledger.finished(e, 1);
        assert_eq!(ledger.awaiting_first_token(e), 2, "1 had its first token");
        ledger.finished(e, 2);
        assert_eq!(ledger.awaiting_first_token(e), 1, "2 ended without one");
        ledger.dispatched(e, 3, Nanos(5));
        assert_eq!(
            ledger.awaiting_first_token(e),
            1,
            "3 sent again, still awaiting"
        );
        ledger.first_token(e, 3);
        assert_eq!(ledger.awaiting_first_token(e), 0);
        ledger.finished(e, 3);
        assert_eq!((ledger.awaiting_first_token(e), ledger.inflight(e)), (0, 0));
    }

    #[test]
    fn used_blocks_prefers_counts() {
        let obs = Observation {
            kv_usage: 0.5,
            free_blocks: Some(30),
            total_blocks: Some(100),
            ..Observation::default()
        };
        assert_eq!(obs.used_blocks(), Some(70));
        let ratio_only = Observation {
            free_blocks: None,
            ..obs
        };
        assert_eq!(ratio_only.used_blocks(), Some(50));
    }
}
