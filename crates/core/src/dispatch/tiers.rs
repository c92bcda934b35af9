//! Priority tiers and spillover in a pick: within each preference pass (endpoints not tried
//! and not cooling down first), the tiers serving the request's model are tried highest
//! priority first, so a healthy endpoint of a lower tier wins over a higher tier's endpoint
//! that is cooling down after a failure or a 429 (as LiteLLM's cooldowns move traffic to the
//! next deployment group). A tier's choice may also be passed on when the spillover thresholds
//! say it would answer late; it is kept as the fallback should no later tier take the request.
//! Only the final choice is recorded as a dispatch.

use super::member::Member;
use crate::index::Overlaps;
use crate::{Decision, EndpointView, Nanos, Reason, Rejection, Request, Route, Router};
use serde::{Deserialize, Serialize};

/// When a tier that could take a request passes it to the next tier anyway (Azure OpenAI's
/// spillover from provisioned to pay-as-you-go capacity): the self-hosted tier is up but would
/// answer late. Off unless a threshold is set; the last tier never spills.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SpilloverConfig {
    /// Spill when the policy predicts a time to first token above this (policies that
    /// predict one: `predicted_ttft`).
    pub ttft_ms: Option<f64>,
    /// Spill when the chosen endpoint's queue would hold at least this many requests
    /// (see [`Self::reason`]).
    pub queue: Option<u32>,
    /// A session's requests go first to the tier that served its previous one, for this many
    /// seconds after it (0: off), so a conversation spilled to a hosted provider keeps that
    /// provider's prompt cache, and one on the self-hosted tier stays there, unless that tier
    /// fails, is out, or spills again.
    pub session_pin_secs: u64,
}

impl Default for SpilloverConfig {
    fn default() -> Self {
        SpilloverConfig {
            ttft_ms: None,
            queue: None,
            session_pin_secs: 300,
        }
    }
}

impl SpilloverConfig {
    /// Why `route` (to the endpoint seen as `view`) should go to the next tier instead, if it
    /// should.
    ///
    /// The queue is the larger of two estimates: the scraped queue plus this router's
    /// dispatches since the scrape once it shows one (a scrape is stale by up to its
    /// interval, so what was sent since counts on top), and this router's requests in flight
    /// there beyond the engine's `slots`, learned from scrapes that showed it full (exact when
    /// this router is the engine's only client, and not a scrape interval late).
    pub fn reason(
        &self,
        route: &Route,
        view: Option<&EndpointView>,
        slots: Option<u32>,
    ) -> Option<&'static str> {
        if let (Some(limit), Reason::PredictedTtft { ttft_ms, .. }) = (self.ttft_ms, &route.reason)
        {
            if *ttft_ms > limit {
                return Some("ttft");
            }
        }
        let waiting = view.and_then(|v| {
            let o = v.observation?;
            let scraped = match o.waiting {
                0 => 0,
                w => w.saturating_add(v.own_since_observation),
            };
            let own = slots.map_or(0, |s| v.own_inflight.saturating_sub(s));
            Some(scraped.max(own))
        });
        match (self.queue, waiting) {
            (Some(limit), Some(waiting)) if waiting >= limit => Some("queue"),
            _ => None,
        }
    }

    /// Checks the thresholds; the error names the field and what is wrong.
    pub fn validate(&self) -> Result<(), (&'static str, &'static str)> {
        if self.ttft_ms.is_some_and(|t| !(t.is_finite() && t > 0.0)) {
            return Err(("spillover.ttft_ms", "must be positive"));
        }
        if self.queue == Some(0) {
            return Err(("spillover.queue", "must be at least 1"));
        }
        Ok(())
    }
}

/// What a placement needs from the dispatch core.
pub(super) struct Scene<'a> {
    pub(super) router: &'a mut Router,
    pub(super) spillover: &'a SpilloverConfig,
    pub(super) members: &'a [Member],
    pub(super) request: &'a Request,
    pub(super) overlaps: &'a Overlaps,
    pub(super) now: Nanos,
    /// The tier that served this request's session last, if it is still pinned there.
    pub(super) pinned: Option<u32>,
}

/// Sessions and the tier that served each last ([`SpilloverConfig::session_pin_secs`]).
/// Bounded: past [`MAX_PINS`] sessions the expired ones go, and if none has expired, all.
#[derive(Debug, Default)]
pub(super) struct SessionPins {
    pins: std::collections::HashMap<String, (u32, Nanos)>,
}

const MAX_PINS: usize = 65_536;

impl SessionPins {
    /// The tier `session` is pinned to at `now`, if it was served within `ttl`.
    pub(super) fn get(&self, session: Option<&str>, now: Nanos, ttl: Nanos) -> Option<u32> {
        let (tier, at) = self.pins.get(session?)?;
        (now.saturating_since(*at) <= ttl).then_some(*tier)
    }

    /// `session` was just placed as `placement` says: a spill pins it to its new tier, a
    /// placement on its pinned tier renews the pin, anything else (its tier failed or was out)
    /// ends it, so a session follows failover and comes back with its first tier.
    pub(super) fn placed(
        &mut self,
        session: Option<&str>,
        placement: (u32, Option<&str>),
        now: Nanos,
        ttl: Nanos,
    ) {
        let Some(session) = session else { return };
        if ttl == Nanos::ZERO {
            return;
        }
        let (tier, reason) = placement;
        match reason {
            Some("ttft" | "queue" | "session") => self.set(session, tier, now),
            _ => {
                self.pins.remove(session);
            }
        }
    }

    fn set(&mut self, session: &str, tier: u32, now: Nanos) {
        if self.pins.len() >= MAX_PINS && !self.pins.contains_key(session) {
            // Pins older than the longest useful pin are the first to go.
            let horizon = Nanos::from_secs(24 * 3600);
            self.pins
                .retain(|_, (_, at)| now.saturating_since(*at) <= horizon);
            if self.pins.len() >= MAX_PINS {
                self.pins.clear();
            }
        }
        self.pins.insert(session.to_owned(), (tier, now));
    }
}

/// The pass a choice was made in: (not tried, not cooling, tier).
pub(super) type Pass = (bool, bool, u32);

/// The chosen route, not yet committed.
pub(super) struct Placement {
    pub(super) route: Route,
    pub(super) pass: Pass,
    /// Why a higher tier that could take the request passed it on.
    pub(super) spilled: Option<&'static str>,
}

/// The tier of the endpoint `v` (`u32::MAX` for one no longer in the pool).
pub(super) fn tier_of(endpoints: &[Member], v: &EndpointView) -> u32 {
    endpoints
        .binary_search_by_key(&v.id, |e| e.status.id)
        .map_or(u32::MAX, |k| endpoints[k].status.tier)
}

/// The priority tiers of the endpoints serving `model`, highest priority (lowest number)
/// first; `[0]` when none does (the pick then rejects as before).
fn tiers_serving(endpoints: &[Member], model: Option<&str>) -> Vec<u32> {
    let mut tiers: Vec<u32> = endpoints
        .iter()
        .filter(|e| e.status.serving.serves(model))
        .map(|e| e.status.tier)
        .collect();
    tiers.sort_unstable();
    tiers.dedup();
    if tiers.is_empty() {
        tiers.push(0);
    }
    tiers
}

/// Chooses across `passes` and tiers; `accept(view, fresh, cool)` is the core's eligibility.
pub(super) fn place(
    scene: Scene<'_>,
    passes: &[(bool, bool)],
    accept: &dyn Fn(&EndpointView, bool, bool) -> bool,
) -> Result<Placement, Rejection> {
    let Scene {
        router,
        spillover,
        members: endpoints,
        request,
        overlaps,
        now,
        pinned,
    } = scene;
    let mut tiers = tiers_serving(endpoints, request.model.as_deref());
    let first_priority = tiers.first().copied();
    // A pinned session tries its tier first, then the others in priority order.
    if let Some(i) = pinned.and_then(|p| tiers.iter().position(|&t| t == p)) {
        let tier = tiers.remove(i);
        tiers.insert(0, tier);
    }
    let mut rejection = Rejection::NoRoutableEndpoint;
    let mut spilled: Option<(Route, Pass, &'static str)> = None;
    for &(fresh, cool) in passes {
        for (k, &tier) in tiers.iter().enumerate() {
            let eligible =
                |v: &EndpointView| tier_of(endpoints, v) == tier && accept(v, fresh, cool);
            let route = match router.choose(request, overlaps, now, &eligible) {
                Decision::Route(route) => route,
                Decision::Reject(r) => {
                    rejection = r;
                    continue;
                }
            };
            let slots = endpoints
                .binary_search_by_key(&route.endpoint, |e| e.status.id)
                .ok()
                .and_then(|k| endpoints[k].status.slots);
            let reason = (k + 1 < tiers.len())
                .then(|| spillover.reason(&route, router.view(route.endpoint), slots))
                .flatten();
            if let Some(reason) = reason {
                spilled.get_or_insert((route, (fresh, cool, tier), reason));
                continue;
            }
            let kept = pinned == Some(tier) && k == 0 && Some(&tier) != first_priority.as_ref();
            return Ok(Placement {
                route,
                pass: (fresh, cool, tier),
                spilled: spilled.map(|s| s.2).or(kept.then_some("session")),
            });
        }
    }
    match spilled {
        Some((route, pass, _)) => Ok(Placement {
            route,
            pass,
            spilled: None,
        }),
        None => Err(rejection),
    }
}
