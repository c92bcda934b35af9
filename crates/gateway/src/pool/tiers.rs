//! Priority tiers and spillover in a pick: within each preference pass (endpoints not tried
//! and not cooling down first), the tiers serving the request's model are tried highest
//! priority first, so a healthy endpoint of a lower tier wins over a higher tier's endpoint
//! that is cooling down after a failure or a 429 (as LiteLLM's cooldowns move traffic to the
//! next deployment group). A tier's choice may also be passed on when the spillover thresholds
//! say it would answer late; it is kept as the fallback should no later tier take the request.
//! Only the final choice is recorded as a dispatch.

use super::endpoint::Endpoint;
use crate::endpoint_config::SpilloverConfig;
use kvgate_core::index::Overlaps;
use kvgate_core::{Decision, EndpointView, Nanos, Rejection, Request, Route, Router};

/// What a placement needs from the pool.
pub(super) struct Scene<'a> {
    pub(super) router: &'a mut Router,
    pub(super) spillover: &'a SpilloverConfig,
    pub(super) endpoints: &'a [Endpoint],
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
pub(super) fn tier_of(endpoints: &[Endpoint], v: &EndpointView) -> u32 {
    endpoints
        .binary_search_by_key(&v.id, |e| e.info.id)
        .map_or(u32::MAX, |k| endpoints[k].info.about.config.tier)
}

/// The priority tiers of the endpoints serving `model`, highest priority (lowest number)
/// first; `[0]` when none does (the pick then rejects as before).
fn tiers_serving(endpoints: &[Endpoint], model: Option<&str>) -> Vec<u32> {
    let mut tiers: Vec<u32> = endpoints
        .iter()
        .filter(|e| e.info.about.serves(model))
        .map(|e| e.info.about.config.tier)
        .collect();
    tiers.sort_unstable();
    tiers.dedup();
    if tiers.is_empty() {
        tiers.push(0);
    }
    tiers
}

/// Chooses across `passes` and tiers; `accept(view, fresh, cool)` is the pool's eligibility.
pub(super) fn place(
    scene: Scene<'_>,
    passes: &[(bool, bool)],
    accept: &dyn Fn(&EndpointView, bool, bool) -> bool,
) -> Result<Placement, Rejection> {
    let Scene {
        router,
        spillover,
        endpoints,
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
                .binary_search_by_key(&route.endpoint, |e| e.info.id)
                .ok()
                .and_then(|k| endpoints[k].info.slots);
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
