//! [`DispatchCore`]: the router plus every eligibility rule a pick obeys, and the pick itself.

use super::member::{Member, MemberSpec, Status};
use super::tiers::{self, SessionPins};
use super::{Attempt, DispatchConfig, Picked, SpilloverConfig};
use crate::index::Overlaps;
use crate::lora::LoraGate;
use crate::resilience::{Attempts, BreakerConfig, HedgeDelay, Next, RetryBudget};
use crate::tenancy::ChargeModel;
use crate::{EndpointId, EndpointView, Nanos, PolicyConfig, Rejection, Request, Router};
use rand::RngCore;

/// The router (policy, ledger, random source) and the members' eligibility state: health
/// checks, Retry-After windows, cool-downs, breakers, deployment limits, priority tiers,
/// spillover and session pins, with the retry budget and the hedging delay every request
/// shares. Everything but the prefix cache, which a runtime may keep behind its own lock
/// ([`super::Dispatcher`] owns both for single-threaded drivers).
#[derive(Debug)]
pub struct DispatchCore {
    pub(super) router: Router,
    /// Sorted by id, the same members as the router's views.
    pub(super) members: Vec<Member>,
    pub(super) budget: RetryBudget,
    pub(super) hedge: HedgeDelay,
    breaker: BreakerConfig,
    spillover: SpilloverConfig,
    pins: SessionPins,
    charge: ChargeModel,
    pub(super) gate: LoraGate,
    /// Requests the gate released since the runtime last asked ([`DispatchCore::released`]).
    pub(super) released: Vec<u64>,
}

/// A pick chosen by the policy, not yet recorded.
pub(super) struct Choice {
    pub(super) route: crate::Route,
    tier: u32,
    spilled: Option<&'static str>,
    eligible: Vec<EndpointId>,
    charge: crate::tenancy::Charge,
}

impl DispatchCore {
    /// A core with no members.
    pub fn new(config: &DispatchConfig, policy: &PolicyConfig, seed: u64) -> Self {
        DispatchCore {
            router: Router::new(policy, seed),
            members: Vec::new(),
            budget: RetryBudget::new(config.retry_budget.clone()),
            hedge: HedgeDelay::new(config.hedge.clone()),
            breaker: config.breaker.clone(),
            spillover: config.spillover.clone(),
            pins: SessionPins::default(),
            charge: config.charge,
            gate: LoraGate::new(config.lora_gate.clone()),
            released: Vec::new(),
        }
    }

    /// The router.
    pub fn router(&self) -> &Router {
        &self.router
    }

    /// The router, for what is neither membership nor an outcome (cadences, a new policy).
    pub fn router_mut(&mut self) -> &mut Router {
        &mut self.router
    }

    /// The members, sorted by id.
    pub fn members(&self) -> impl Iterator<Item = &Status> {
        self.members.iter().map(Member::status)
    }

    /// One member.
    pub fn member(&self, id: EndpointId) -> Option<&Status> {
        self.position(id).map(|i| &self.members[i].status)
    }

    pub(super) fn position(&self, id: EndpointId) -> Option<usize> {
        self.members.binary_search_by_key(&id, |m| m.status.id).ok()
    }

    pub(super) fn member_mut(&mut self, id: EndpointId) -> Option<&mut Member> {
        let i = self.position(id)?;
        Some(&mut self.members[i])
    }

    /// Adds member `id` (ids must grow); it joins now (blackout and slow start count from
    /// here).
    pub fn add(&mut self, id: EndpointId, spec: &MemberSpec, now: Nanos) {
        debug_assert!(self.members.last().is_none_or(|m| m.status.id < id));
        self.router.add(EndpointView {
            weight: spec.weight,
            joined_at: now,
            ..EndpointView::new(id)
        });
        self.members
            .push(Member::new(id, spec, self.breaker.clone(), now));
    }

    /// Removes a member at once; whether it was one.
    pub fn remove(&mut self, id: EndpointId) -> bool {
        let Some(i) = self.position(id) else {
            return false;
        };
        self.members.remove(i);
        self.gate_event(id, super::gated::GateEvent::Removed, Nanos::ZERO);
        self.router.remove(id)
    }

    /// Applies a new spec to a member (weight, tier, models, limits).
    pub fn update(&mut self, id: EndpointId, spec: &MemberSpec, now: Nanos) {
        if let Some(m) = self.member_mut(id) {
            m.reconfigure(spec, now);
        }
        self.router.set_weight(id, spec.weight);
    }

    /// Replaces the spillover thresholds.
    pub fn set_spillover(&mut self, spillover: SpilloverConfig) {
        self.spillover = spillover;
    }

    /// The spillover thresholds in force.
    pub fn spillover(&self) -> &SpilloverConfig {
        &self.spillover
    }

    /// Sets a member's health-check state through `edit`; tells the router, and says, when its
    /// health changed.
    pub(super) fn set_checks(&mut self, id: EndpointId, edit: impl FnOnce(&mut Status)) -> bool {
        let Some(m) = self.member_mut(id) else {
            return false;
        };
        let before = m.status.checked_health();
        edit(&mut m.status);
        let after = m.status.checked_health();
        if before != after {
            self.router.set_health(id, after);
        }
        before != after
    }

    /// Chooses an endpoint for an attempt of `request` and records the dispatch (ledger,
    /// policy, breaker ticket, deployment limits, session pin). `overlaps` is what the prefix
    /// cache holds of it; the caller tells the cache of the dispatch after
    /// ([`super::record_dispatch`]). Members in `tried` are refused, except that a retry falls
    /// back to them when nothing else can take it.
    pub fn pick(
        &mut self,
        request: &Request,
        overlaps: &Overlaps,
        tried: &[EndpointId],
        attempt: Attempt,
        now: Nanos,
    ) -> Result<Picked, Rejection> {
        if attempt == Attempt::First {
            self.budget.request(now);
        }
        let choice = self.choose(request, overlaps, (tried, None), attempt, now)?;
        self.commit(request, overlaps, attempt, choice, now)
    }

    /// The policy's choice among the members eligible for this attempt, not yet recorded;
    /// `avoid` is refused too.
    pub(super) fn choose(
        &mut self,
        request: &Request,
        overlaps: &Overlaps,
        (tried, avoid): (&[EndpointId], Option<EndpointId>),
        attempt: Attempt,
        now: Nanos,
    ) -> Result<Choice, Rejection> {
        let model = request.model.as_deref();
        // Deployments at one of their own rate limits sit this request out.
        let charge = self.charge.estimate(request);
        let at_limit: Vec<EndpointId> = self
            .members
            .iter_mut()
            .filter_map(|m| {
                let admits = m.limits.as_mut()?.admits(now, &charge);
                (!admits).then_some(m.status.id)
            })
            .collect();
        let members = &self.members;
        // Preference order: members not tried and not cooling down after a failure, then not
        // tried, then (a retry with nothing else) any.
        let accept = |v: &EndpointView, fresh: bool, cool: bool| {
            members
                .binary_search_by_key(&v.id, |m| m.status.id)
                .is_ok_and(|k| members[k].admits(model, now, (fresh, cool), tried))
                && !at_limit.contains(&v.id)
                && avoid != Some(v.id)
        };
        let passes: &[(bool, bool)] = match attempt {
            Attempt::Retry => &[(true, true), (true, false), (false, false)],
            _ => &[(true, true), (true, false)],
        };
        let pin_ttl = Nanos::from_secs(self.spillover.session_pin_secs);
        let placement = tiers::place(
            tiers::Scene {
                router: &mut self.router,
                spillover: &self.spillover,
                members,
                request,
                overlaps,
                now,
                pinned: self.pins.get(request.session.as_deref(), now, pin_ttl),
            },
            passes,
            &accept,
        )?;
        let (fresh, cool, tier) = placement.pass;
        let eligible: Vec<EndpointId> = self
            .router
            .views()
            .iter()
            .filter(|v| tiers::tier_of(members, v) == tier && accept(v, fresh, cool))
            .map(|v| v.id)
            .collect();
        Ok(Choice {
            route: placement.route,
            tier,
            spilled: placement.spilled,
            eligible,
            charge,
        })
    }

    /// Records `choice` as the attempt's dispatch: the router's commit, the session pin, the
    /// breaker ticket and the deployment limits' charge.
    pub(super) fn commit(
        &mut self,
        request: &Request,
        overlaps: &Overlaps,
        attempt: Attempt,
        choice: Choice,
        now: Nanos,
    ) -> Result<Picked, Rejection> {
        let Choice {
            route,
            tier,
            spilled,
            eligible,
            charge,
        } = choice;
        self.router.commit(request, route.endpoint, overlaps, now);
        self.gate_dispatched(request, route.endpoint, now);
        let pin_ttl = Nanos::from_secs(self.spillover.session_pin_secs);
        self.pins
            .placed(request.session.as_deref(), (tier, spilled), now, pin_ttl);
        let hedge_after = match attempt {
            Attempt::First => self.hedge.delay(),
            _ => None,
        };
        let Some(m) = self.member_mut(route.endpoint) else {
            return Err(Rejection::NoRoutableEndpoint);
        };
        // The predicate let only members whose breaker admits traffic through.
        let ticket = m.breaker.acquire(now).unwrap_or_default();
        if let Some(limits) = &mut m.limits {
            limits.dispatched(request.id, now, charge);
        }
        let changed = m.sync_breaker();
        Ok(Picked {
            route,
            ticket,
            tier,
            spilled,
            eligible,
            hedge_after,
            changed,
            held: None,
        })
    }

    /// After a failed attempt: wait, retry after a backoff, or give up (the retry budget is
    /// shared by every request).
    pub fn next_after_failure(
        &mut self,
        attempts: &mut Attempts,
        now: Nanos,
        rng: &mut dyn RngCore,
    ) -> Next {
        attempts.failed(now, &mut self.budget, rng)
    }

    /// Gives back a retry withdrawn at `withdrawn_at` that was never sent.
    pub fn refund_retry(&mut self, withdrawn_at: Nanos) {
        self.budget.refund(withdrawn_at);
    }
}
