//! A prefix other prompts share, held by one replica alone: where its second copy may go.
//!
//! A greedy pick never copies a prefix before the replica holding it is slower than a recompute
//! elsewhere, and by then that replica is full: on the classic shared-prefix benchmark each of 32
//! system prompts stayed on the replica that computed it first, the replicas' loads were set by
//! which prompts they happened to hold, and the most loaded ran out of batch slots at a rate the
//! fleet could carry (docs/routing.md, On the classic benchmarks). A copy made then lands on a
//! replica that is itself near full and costs more than it saves. A second copy made while a
//! replica has no prefill queued delays no queued request, and it gives every later request of the
//! prefix a choice of two replicas, which is what keeps the loads of many request streams level
//! (the power of two choices, Mitzenmacher 2001). So a request of a shared prefix that one replica
//! alone holds may take it to a replica with no prefill queued as if that replica held it too;
//! beyond two copies, the pick's usual cost decides.
//!
//! *Shared* is the index's: where the most stored prompts part ways with this one
//! ([`Overlaps::shared`](crate::index::Overlaps::shared)), such as the end of a system prompt
//! many questions follow. A conversation's history, which each turn extends, is not, so it
//! stays where it is. The caller allows the copy only while no cache has evicted (it then
//! displaces nothing) and only for a request that names no session or starts one.

use super::prediction::Prediction;
use super::sessions::Held;
use crate::EndpointId;

/// The shared prefix's one holder and the leading tokens of it that it holds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct SoleHolder {
    pub(super) endpoint: EndpointId,
    pub(super) tokens: f64,
}

impl SoleHolder {
    /// The one replica that has computed the `shared` leading tokens of the prompt (as far as
    /// the best holder has them), if no other has.
    pub(super) fn of(held: impl Iterator<Item = Held>, shared: f64) -> Option<SoleHolder> {
        let (mut best, mut others) = (None::<Held>, 0.0_f64);
        for h in held {
            match best {
                Some(b) if h.computed <= b.computed => others = others.max(h.computed),
                _ => {
                    others = others.max(best.map_or(0.0, |b| b.computed));
                    best = Some(h);
                }
            }
        }
        let best = best?;
        let tokens = shared.min(best.computed);
        (tokens > 0.0 && others < tokens).then_some(SoleHolder {
            endpoint: best.endpoint,
            tokens,
        })
    }

    /// Tokens of the shared prefix a copy on `to` would compute (0 on the holder).
    pub(super) fn lacking(&self, to: &Held) -> f64 {
        if to.endpoint == self.endpoint {
            0.0
        } else {
            (self.tokens - to.computed).max(0.0)
        }
    }

    /// The pick's cost of an endpoint that would make the copy: its predicted TTFT less the
    /// copied prefix's prefill, plus the externality of the rest of its own work, the fleet's
    /// `seconds_per_token` each. `None` where the pick's usual cost applies: on the holder,
    /// on an endpoint that holds the prefix too, or where prefill is queued (a copy there
    /// would delay it).
    pub(super) fn cost(&self, at: &Prediction, seconds_per_token: f64, weight: f64) -> Option<f64> {
        let lacking = self.lacking(&at.held);
        if lacking <= 0.0 || at.ahead >= 1.0 {
            return None;
        }
        let rest = (at.own - lacking).max(0.0);
        Some(
            at.ttft - lacking * seconds_per_token
                + weight * at.externality * rest * seconds_per_token,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(endpoint: u32, computed: f64) -> Held {
        Held {
            endpoint: EndpointId(endpoint),
            computed,
            prefilling: 0.0,
        }
    }

    #[test]
    fn a_shared_prefix_on_one_replica_has_a_sole_holder() {
        let fleet = [held(0, 0.0), held(1, 2_800.0), held(2, 100.0)];
        let sole = SoleHolder::of(fleet.into_iter(), 2_700.0).expect("one holder");
        assert_eq!(sole.endpoint, EndpointId(1));
        assert_eq!(sole.tokens, 2_700.0);
        assert_eq!(sole.lacking(&fleet[0]), 2_700.0);
        assert_eq!(sole.lacking(&fleet[2]), 2_600.0);
        assert_eq!(sole.lacking(&fleet[1]), 0.0);
    }

    #[test]
    fn two_copies_or_nothing_shared_have_none() {
        let two = [held(0, 2_800.0), held(1, 2_800.0)];
        assert_eq!(SoleHolder::of(two.into_iter(), 2_700.0), None);
        // The second holds the shared part, though less of the prompt than the first.
        let two = [held(0, 3_500.0), held(1, 2_700.0)];
        assert_eq!(SoleHolder::of(two.into_iter(), 2_700.0), None);
        let history = [held(0, 9_000.0), held(1, 0.0)];
        assert_eq!(SoleHolder::of(history.into_iter(), 0.0), None);
        assert_eq!(SoleHolder::of(std::iter::empty(), 2_000.0), None);
    }

    #[test]
    fn the_shared_part_counts_only_as_far_as_the_holder_has_it() {
        let fleet = [held(0, 1_000.0), held(1, 0.0)];
        let sole = SoleHolder::of(fleet.into_iter(), 2_700.0).expect("one holder");
        assert_eq!(sole.tokens, 1_000.0);
    }
}
