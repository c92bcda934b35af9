//! Which leading part of a prompt is shared across sessions and in demand right now, so that
//! copying it to one more replica is not charged as load on the queue it joins.
//!
//! The externality term charges a request for the delay its prefill imposes on the queue it
//! joins, duplicated prefill included. That keeps one conversation's history where it is, but
//! it also keeps a hot system prompt on too few replicas: nothing in a greedy pick credits what
//! a copy saves the prompt's later requests (Preble replicates hot prefixes for this reason).
//! Measured in `kvgate sim`'s fan-out sweeps with twelve shared prompts or 8,000-token ones,
//! that under-replication cost `predicted_ttft` its lead over `least_outstanding`
//! (docs/routing.md, Limits).
//!
//! A copy is worth its prefill when the prefix is shared, so later requests will use it, and
//! wanted by several requests at once, so one replica cannot serve them all promptly. Both are
//! read from what the router already knows:
//! - *shared*: computed somewhere before this session began, or held by a replica other than
//!   the session's own; a session's own history is private however long it is. Without a
//!   session name, only a prefix held by two replicas is known to be shared.
//! - *in demand*: a request sharing more of this prompt than that replica had computed is
//!   being prefilled now, as a burst's siblings share its context: the shared prefix is
//!   wanted by several requests at once. Counting any request in prefill that shares only the
//!   settled prefix (sessions of one tenant, say) measured 1-2% lower on the agentic
//!   scenarios.
//!
//! Dropping the externality on every duplicated token instead moved sessions off their homes
//! and lost 4-11% of capacity on the agentic scenarios (docs/routing.md).

use crate::fasthash::IntMap;
use crate::{EndpointId, Nanos, Request};

/// A session idle this long starts afresh: agent think times are seconds, and after a minute the
/// engines may well have evicted what it left.
const IDLE: Nanos = Nanos::from_secs(60);

/// Sessions remembered at most, whatever names clients send.
const MAX_SESSIONS: usize = 1 << 18;

/// Where a session went last, and what the fleet held of its prompt before it began.
#[derive(Clone, Copy, Debug)]
pub(super) struct Home {
    pub(super) endpoint: EndpointId,
    /// Prompt tokens some replica had computed when the session's first request was sent.
    pub(super) shared: f64,
    at: Nanos,
}

/// Recent sessions' homes, keyed by a hash of tenant and session name.
#[derive(Debug, Default)]
pub(super) struct Sessions {
    homes: IntMap<u64, Home>,
    /// The map's size after the last pruning; it is pruned again when it doubles.
    pruned: usize,
}

impl Sessions {
    /// The request's session key, if it names a session.
    pub(super) fn key(request: &Request) -> Option<u64> {
        let session = request.session.as_deref()?;
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(request.tenant.as_deref().unwrap_or("").as_bytes());
        h.update(&[0]);
        h.update(session.as_bytes());
        Some(h.digest())
    }

    /// The session's home, unless it has been idle for [`IDLE`].
    pub(super) fn home(&self, key: u64, now: Nanos) -> Option<Home> {
        self.homes
            .get(&key)
            .filter(|h| now.saturating_since(h.at) < IDLE)
            .copied()
    }

    /// The session sent a request to `endpoint` at `at`; `shared` is what the fleet holds
    /// of its prompt, read only when the session is new.
    pub(super) fn record(
        &mut self,
        key: u64,
        endpoint: EndpointId,
        at: Nanos,
        shared: impl FnOnce() -> f64,
    ) {
        let shared = self.home(key, at).map_or_else(shared, |h| h.shared);
        self.homes.insert(
            key,
            Home {
                endpoint,
                shared,
                at,
            },
        );
        if self.homes.len() > 2 * self.pruned.max(1_024) {
            self.homes.retain(|_, h| at.saturating_since(h.at) < IDLE);
            if self.homes.len() > MAX_SESSIONS {
                self.homes.clear();
            }
            self.pruned = self.homes.len();
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.homes.len()
    }
}

/// What one endpoint holds of the prompt, in tokens.
#[derive(Clone, Copy, Debug)]
pub(super) struct Held {
    pub(super) endpoint: EndpointId,
    /// Leading tokens the index knows it has computed.
    pub(super) computed: f64,
    /// Leading tokens of a prompt it is prefilling now, 0 when none goes past `computed`.
    pub(super) prefilling: f64,
}

/// The leading tokens of this prompt another replica may copy free of the externality charge:
/// the shared prefix, as far as a request is prefilling it now. `home` is the request's
/// session's, `named` whether it names a session at all.
pub(super) fn replicable(held: impl Iterator<Item = Held>, home: Option<Home>, named: bool) -> f64 {
    let (mut first, mut second, mut off_home, mut prefilling) =
        (0.0_f64, 0.0_f64, 0.0_f64, 0.0_f64);
    for h in held {
        if h.computed > first {
            second = first;
            first = h.computed;
        } else if h.computed > second {
            second = h.computed;
        }
        if home.is_none_or(|home| home.endpoint != h.endpoint) {
            off_home = off_home.max(h.computed);
        }
        prefilling = prefilling.max(h.prefilling);
    }
    let shared = match home {
        Some(home) => off_home.max(home.shared),
        None if named => first,
        None => second,
    };
    shared.min(prefilling)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(endpoint: u32, computed: f64, prefilling: f64) -> Held {
        Held {
            endpoint: EndpointId(endpoint),
            computed,
            prefilling,
        }
    }

    #[test]
    fn a_shared_prefix_is_replicable_only_while_a_request_is_prefilling_it() {
        let idle = [held(0, 4_000.0, 0.0), held(1, 0.0, 0.0)];
        assert_eq!(replicable(idle.into_iter(), None, true), 0.0);
        let burst = [held(0, 4_000.0, 5_000.0), held(1, 0.0, 0.0)];
        assert_eq!(replicable(burst.into_iter(), None, true), 4_000.0);
    }

    #[test]
    fn a_sessions_own_history_is_not_replicable_but_what_it_found_shared_is() {
        let home = Home {
            endpoint: EndpointId(0),
            shared: 2_000.0,
            at: Nanos::ZERO,
        };
        // The history (9,000 tokens) lives on the home alone; another replica holds 3,000.
        let fleet = [held(0, 9_000.0, 12_000.0), held(1, 3_000.0, 0.0)];
        assert_eq!(replicable(fleet.into_iter(), Some(home), true), 3_000.0);
        let alone = [held(0, 9_000.0, 12_000.0), held(1, 0.0, 0.0)];
        assert_eq!(replicable(alone.into_iter(), Some(home), true), 2_000.0);
    }

    #[test]
    fn without_a_session_only_a_prefix_on_two_replicas_counts_as_shared() {
        let one = [held(0, 4_000.0, 5_000.0), held(1, 0.0, 0.0)];
        assert_eq!(replicable(one.into_iter(), None, false), 0.0);
        let two = [held(0, 6_000.0, 7_000.0), held(1, 4_000.0, 0.0)];
        assert_eq!(replicable(two.into_iter(), None, false), 4_000.0);
    }

    #[test]
    fn homes_expire_when_idle_and_keep_what_was_shared_when_the_session_began() {
        let mut s = Sessions::default();
        let at = Nanos::from_secs(1);
        s.record(7, EndpointId(1), at, || 4_000.0);
        s.record(7, EndpointId(2), at, || {
            unreachable!("the session is known")
        });
        let h = s.home(7, at).expect("recorded");
        assert_eq!((h.endpoint, h.shared), (EndpointId(2), 4_000.0));
        assert!(s.home(7, at + IDLE).is_none());
    }

    #[test]
    fn the_map_is_pruned_of_idle_sessions() {
        let mut s = Sessions::default();
        for k in 0..5_000 {
            s.record(k, EndpointId(0), Nanos::from_secs(k), || 0.0);
        }
        assert!(s.len() <= 2 * 1_024 + 1, "{} sessions kept", s.len());
    }
}
