//! Continuations and re-homing, as rules both runtimes follow: the gateway's relay and the
//! simulator's fleet keep the same records and ask the same questions here, and only the
//! sending differs.
//!
//! - [`ContinuationGate`]: a continuation of a broken stream is a full prefill, and an engine
//!   admits waiting prompts first come first served, so at most `per_endpoint` continuations
//!   await their first bytes on one endpoint; while it yields (for `resume.yield_ms` after its
//!   stream broke) a continuation goes only where no request awaits its first token.
//! - [`head_held`]: a staged head that would add under a quarter of a piece to what the
//!   endpoint is predicted to hold warms nothing, and gives way to the next.
//! - [`RehomeBook`]: each session's last turn and where it ended; when an endpoint is lost, the
//!   sessions whose last turn ended there within the window are warmed elsewhere, the most
//!   recent first, once per window per endpoint.

use crate::{EndpointId, Nanos};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Continuations sent to each endpoint and not yet at their first bytes, with a limit per
/// endpoint. Only endpoints with one in flight have an entry, so endpoints that come and go
/// leave nothing behind.
#[derive(Clone, Debug, Default)]
pub struct ContinuationGate {
    per_endpoint: u32,
    open: BTreeMap<EndpointId, u32>,
}

impl ContinuationGate {
    /// At most `per_endpoint` continuations in flight on each endpoint; 0 for no limit.
    pub fn new(per_endpoint: u32) -> Self {
        ContinuationGate {
            per_endpoint,
            open: BTreeMap::new(),
        }
    }

    /// The limit per endpoint (0: none).
    pub fn limit(&self) -> u32 {
        self.per_endpoint
    }

    /// Whether `endpoint` can take another continuation.
    pub fn has_room(&self, endpoint: EndpointId) -> bool {
        self.per_endpoint == 0 || self.open.get(&endpoint).copied().unwrap_or(0) < self.per_endpoint
    }

    /// The endpoints without room.
    pub fn full(&self) -> Vec<EndpointId> {
        self.open
            .keys()
            .copied()
            .filter(|&e| !self.has_room(e))
            .collect()
    }

    /// Whether a continuation may go to `endpoint` now: it has room, it is the endpoint the
    /// continuation is `pinned` to (a staged one follows its heads), and, while the
    /// continuation yields, none of the router's requests there (`awaiting`) awaits its first
    /// token.
    pub fn admits(
        &self,
        endpoint: EndpointId,
        pinned: Option<EndpointId>,
        yielding: bool,
        awaiting: u32,
    ) -> bool {
        self.has_room(endpoint)
            && pinned.is_none_or(|p| p == endpoint)
            && !(yielding && awaiting > 0)
    }

    /// A continuation went to `endpoint`.
    pub fn enter(&mut self, endpoint: EndpointId) {
        *self.open.entry(endpoint).or_default() += 1;
    }

    /// A continuation on `endpoint` reached its first bytes, failed, or was dropped.
    pub fn leave(&mut self, endpoint: EndpointId) {
        if let Some(n) = self.open.get_mut(&endpoint) {
            *n -= 1;
            if *n == 0 {
                self.open.remove(&endpoint);
            }
        }
    }

    /// `endpoint` is gone, and its continuations with it.
    pub fn clear(&mut self, endpoint: EndpointId) {
        self.open.remove(&endpoint);
    }
}

/// Whether a staged head that reaches `beyond` (tokens or bytes) past what its endpoint is
/// predicted to hold would warm too little to be worth a round trip and an engine iteration:
/// under a quarter of a `piece`.
pub fn head_held(beyond: usize, piece: usize) -> bool {
    beyond < piece / 4
}

/// A session's last turn, as kept.
#[derive(Clone, Debug)]
struct Kept<T> {
    /// The request that carried it.
    id: u64,
    /// Where its answer ended, and when; `None` while it is being answered.
    ended: Option<(EndpointId, Nanos)>,
    /// What it weighs against the book's bound (the gateway: its body's bytes).
    weight: usize,
    turn: T,
}

/// Each session's last turn (a `T`, what the driver needs to send it again), and which
/// endpoints re-homing started for. Sessions are kept up to `capacity` and a total `weight`;
/// the oldest give way first.
#[derive(Clone, Debug)]
pub struct RehomeBook<S, T> {
    window: Nanos,
    capacity: usize,
    max_weight: usize,
    by_session: BTreeMap<S, Kept<T>>,
    /// Sessions in the order their turns came, with the turn's request id: the oldest give
    /// way first. An entry whose session has a newer turn since is stale and skipped.
    order: VecDeque<(S, u64)>,
    /// Sessions by the request id of a turn whose answer has not ended.
    open: BTreeMap<u64, S>,
    /// When re-homing last started for an endpoint.
    started: BTreeMap<EndpointId, Nanos>,
    /// Endpoints being probed after a sign of loss.
    probing: BTreeSet<EndpointId>,
    weight: usize,
}

impl<S: Ord + Clone, T: Clone> RehomeBook<S, T> {
    /// Re-homes the sessions whose last turn ended within `window` before a loss (zero: off),
    /// keeping at most `capacity` sessions and `max_weight` of turns.
    pub fn new(window: Nanos, capacity: usize, max_weight: usize) -> Self {
        RehomeBook {
            window,
            capacity: capacity.max(1),
            max_weight,
            by_session: BTreeMap::new(),
            order: VecDeque::new(),
            open: BTreeMap::new(),
            started: BTreeMap::new(),
            probing: BTreeSet::new(),
            weight: 0,
        }
    }

    /// Whether re-homing is on.
    pub fn on(&self) -> bool {
        self.window > Nanos::ZERO
    }

    /// The window.
    pub fn window(&self) -> Nanos {
        self.window
    }

    /// Whether `at` lies within the window before `now`.
    fn recent(&self, at: Nanos, now: Nanos) -> bool {
        now.saturating_since(at) <= self.window
    }

    /// Whether `kept` ended on `endpoint` within the window before `now`.
    fn homed(&self, kept: &Kept<T>, endpoint: EndpointId, now: Nanos) -> bool {
        kept.ended
            .is_some_and(|(e, at)| e == endpoint && self.recent(at, now))
    }

    fn remove(&mut self, session: &S) {
        if let Some(old) = self.by_session.remove(session) {
            self.open.remove(&old.id);
            self.weight -= old.weight;
        }
    }

    /// Request `id` of `session` is on its way (`turn`, weighing `weight`): it is the
    /// session's last turn now, replacing the one before.
    pub fn remember(&mut self, session: S, id: u64, turn: T, weight: usize, now: Nanos) {
        if !self.on() {
            return;
        }
        self.remove(&session);
        self.weight += weight;
        self.open.insert(id, session.clone());
        self.order.push_back((session.clone(), id));
        let kept = Kept {
            id,
            ended: None,
            weight,
            turn,
        };
        self.by_session.insert(session, kept);
        self.bound();
        self.expire(now);
    }

    /// Gives way to the oldest sessions while over either bound.
    fn bound(&mut self) {
        while self.by_session.len() > self.capacity || self.weight > self.max_weight {
            let Some((oldest, id)) = self.order.pop_front() else {
                break;
            };
            if self.by_session.get(&oldest).is_some_and(|k| k.id == id) {
                self.remove(&oldest);
            }
        }
    }

    /// Lets go of the turns that ended a window ago (never warmed), so what is kept is the
    /// sessions active within the window, not the bounds' worth of old turns; and of stale
    /// entries once they outnumber the live ones.
    fn expire(&mut self, now: Nanos) {
        while let Some((front, id)) = self.order.front() {
            let expired = match self.by_session.get(front) {
                Some(k) if k.id == *id => k.ended.is_some_and(|(_, at)| !self.recent(at, now)),
                _ => true,
            };
            if !expired {
                break;
            }
            if let Some((front, id)) = self.order.pop_front() {
                if self.by_session.get(&front).is_some_and(|k| k.id == id) {
                    self.remove(&front);
                }
            }
        }
        if self.order.len() > self.capacity.saturating_mul(2) {
            let by_session = &self.by_session;
            self.order
                .retain(|(s, id)| by_session.get(s).is_some_and(|k| k.id == *id));
        }
    }

    /// Request `id`'s answer ended on `endpoint` at `now` (where a continuation finished it,
    /// when its stream broke): the session's context is cached there now.
    pub fn ended(&mut self, id: u64, endpoint: EndpointId, now: Nanos) {
        let Some(session) = self.open.remove(&id) else {
            return;
        };
        if let Some(kept) = self.by_session.get_mut(&session) {
            kept.ended = Some((endpoint, now));
        }
    }

    /// Whether request `id` is still the last turn of `session`.
    pub fn current(&self, session: &S, id: u64) -> bool {
        self.by_session.get(session).is_some_and(|k| k.id == id)
    }

    /// `endpoint` broke a stream or refused a connection: whether to ask it now whether it is
    /// gone. One probe per endpoint at a time, none while re-homing for it started within the
    /// window, and none when no session's last turn ended there within it (traffic without
    /// sessions has nothing to re-home). A `true` must be followed by [`Self::probed`].
    pub fn should_probe(&mut self, endpoint: EndpointId, now: Nanos) -> bool {
        if !self.on() {
            return false;
        }
        let started = self
            .started
            .get(&endpoint)
            .is_some_and(|&at| self.recent(at, now));
        let homed = self
            .by_session
            .values()
            .any(|k| self.homed(k, endpoint, now));
        !started && homed && self.probing.insert(endpoint)
    }

    /// The probe of `endpoint` is over.
    pub fn probed(&mut self, endpoint: EndpointId) {
        self.probing.remove(&endpoint);
    }

    /// `lost` is gone at `now`: the sessions to warm elsewhere, those whose last turn ended
    /// there within the window, the most recent first (their next turns come soonest; ties by
    /// session); with each, its turn's request id and the turn. None when re-homing is off or
    /// started for `lost` within the window already.
    pub fn displaced(&mut self, lost: EndpointId, now: Nanos) -> Vec<(S, u64, T)> {
        if !self.on()
            || self
                .started
                .get(&lost)
                .is_some_and(|&at| self.recent(at, now))
        {
            return Vec::new();
        }
        self.started.insert(lost, now);
        let mut displaced: Vec<(&S, &Kept<T>)> = self
            .by_session
            .iter()
            .filter(|(_, k)| self.homed(k, lost, now))
            .collect();
        displaced.sort_by(|a, b| {
            let ended = |k: &Kept<T>| k.ended.map(|(_, at)| at);
            ended(b.1).cmp(&ended(a.1)).then_with(|| a.0.cmp(b.0))
        });
        displaced
            .into_iter()
            .map(|(s, k)| (s.clone(), k.id, k.turn.clone()))
            .collect()
    }

    /// Sessions kept, and their total weight.
    pub fn kept(&self) -> (usize, usize) {
        (self.by_session.len(), self.weight)
    }
}

#[cfg(test)]
mod tests;
