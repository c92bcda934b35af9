//! Which peer requests this replica counts in flight, under which local ids.
//!
//! A peer's request ids are its own counter and collide with this replica's, so every peer
//! request gets a fresh local id from a range local requests never reach (they count up from
//! 1). Entries leave when the peer reports the end, when the peer falls silent past the
//! timeout or says goodbye, or when no end came within the age bound (a lost message); the
//! caller then frees them in the pool.

use kvgate_core::index::Prediction;
use kvgate_core::{EndpointId, Nanos};
use std::collections::HashMap;

/// Local ids of peer requests start here; a replica's own ids would need 2^62 requests to
/// reach it.
pub(crate) const PEER_IDS: u64 = 1 << 62;

/// One peer request counted here.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Entry {
    /// Its id in this replica's pool.
    pub(crate) local: u64,
    /// What this replica's cache predicted for it.
    pub(crate) prediction: Option<Prediction>,
    /// When it was dispatched (as heard).
    pub(crate) since: Nanos,
}

#[derive(Debug, Default)]
struct Peer {
    seen: Nanos,
    requests: HashMap<(u64, EndpointId), Entry>,
}

/// The table (see the module documentation).
#[derive(Debug)]
pub(crate) struct PeerTable {
    peers: HashMap<u64, Peer>,
    next: u64,
    timeout: Nanos,
    max_age: Nanos,
}

impl PeerTable {
    pub(crate) fn new(timeout: Nanos, max_age: Nanos) -> Self {
        PeerTable {
            peers: HashMap::new(),
            next: PEER_IDS,
            timeout,
            max_age,
        }
    }

    /// `replica` spoke at `now`; true when it is new (or back after timing out).
    pub(crate) fn heard(&mut self, replica: u64, now: Nanos) -> bool {
        let mut new = false;
        self.peers
            .entry(replica)
            .or_insert_with(|| {
                new = true;
                Peer::default()
            })
            .seen = now;
        new
    }

    /// A local id for `replica`'s request `id` on `endpoint`, or `None` when it is already
    /// counted (a dispatch heard twice: live and in a warm start).
    pub(crate) fn admit(
        &mut self,
        replica: u64,
        id: u64,
        endpoint: EndpointId,
        now: Nanos,
    ) -> Option<u64> {
        let peer = self.peers.entry(replica).or_default();
        if peer.requests.contains_key(&(id, endpoint)) {
            return None;
        }
        let local = self.next;
        self.next += 1;
        peer.requests.insert(
            (id, endpoint),
            Entry {
                local,
                prediction: None,
                since: now,
            },
        );
        Some(local)
    }

    /// Keeps the cache's prediction for the request, to correct it from usage.
    pub(crate) fn predicted(&mut self, replica: u64, id: u64, endpoint: EndpointId, p: Prediction) {
        if let Some(e) = self.entry_mut(replica, id, endpoint) {
            e.prediction = Some(p);
        }
    }

    fn entry_mut(&mut self, replica: u64, id: u64, endpoint: EndpointId) -> Option<&mut Entry> {
        self.peers
            .get_mut(&replica)?
            .requests
            .get_mut(&(id, endpoint))
    }

    /// The local id of a request still counted.
    pub(crate) fn local(&mut self, replica: u64, id: u64, endpoint: EndpointId) -> Option<u64> {
        self.entry_mut(replica, id, endpoint).map(|e| e.local)
    }

    /// The request ended: it leaves the table.
    pub(crate) fn end(&mut self, replica: u64, id: u64, endpoint: EndpointId) -> Option<Entry> {
        self.peers
            .get_mut(&replica)?
            .requests
            .remove(&(id, endpoint))
    }

    /// `replica` left: all of its requests leave with it.
    pub(crate) fn forget(&mut self, replica: u64) -> Vec<(EndpointId, Entry)> {
        self.peers.remove(&replica).map_or_else(Vec::new, |p| {
            p.requests.into_iter().map(|((_, ep), e)| (ep, e)).collect()
        })
    }

    /// Peers silent past the timeout leave with their requests, and requests older than the
    /// age bound leave alone; returns the peers gone and every request dropped.
    pub(crate) fn expire(&mut self, now: Nanos) -> (Vec<u64>, Vec<(EndpointId, Entry)>) {
        let gone: Vec<u64> = self
            .peers
            .iter()
            .filter(|(_, p)| now.saturating_since(p.seen) > self.timeout)
            .map(|(&r, _)| r)
            .collect();
        let mut dropped: Vec<(EndpointId, Entry)> =
            gone.iter().flat_map(|&r| self.forget(r)).collect();
        for peer in self.peers.values_mut() {
            peer.requests.retain(|&(_, ep), e| {
                let keep = now.saturating_since(e.since) <= self.max_age;
                if !keep {
                    dropped.push((ep, *e));
                }
                keep
            });
        }
        (gone, dropped)
    }

    /// Peers known.
    pub(crate) fn peers(&self) -> usize {
        self.peers.len()
    }

    /// Peer requests counted.
    pub(crate) fn inflight(&self) -> usize {
        self.peers.values().map(|p| p.requests.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn peer_ids_are_disjoint_from_local_ones_and_from_each_other() {
        let mut t = PeerTable::new(Nanos(3 * S), Nanos(900 * S));
        let a = t.admit(1, 7, EndpointId(0), Nanos(0)).unwrap();
        let b = t.admit(2, 7, EndpointId(0), Nanos(0)).unwrap();
        assert!(a >= PEER_IDS && b >= PEER_IDS && a != b);
        assert_eq!(t.admit(1, 7, EndpointId(0), Nanos(1)), None, "heard twice");
        assert!(
            t.admit(1, 7, EndpointId(1), Nanos(1)).is_some(),
            "a hedge elsewhere"
        );
        assert_eq!(t.local(1, 7, EndpointId(0)), Some(a));
        assert_eq!(t.end(1, 7, EndpointId(0)).map(|e| e.local), Some(a));
        assert_eq!(t.end(1, 7, EndpointId(0)), None);
    }

    #[test]
    fn silent_peers_and_old_requests_expire() {
        let mut t = PeerTable::new(Nanos(3 * S), Nanos(10 * S));
        t.heard(1, Nanos(0));
        t.heard(2, Nanos(0));
        t.admit(1, 1, EndpointId(0), Nanos(0));
        t.admit(2, 1, EndpointId(0), Nanos(0));
        t.heard(2, Nanos(3 * S));
        let (gone, dropped) = t.expire(Nanos(3 * S + 1));
        assert_eq!(gone, vec![1]);
        assert_eq!(dropped.len(), 1);
        assert_eq!((t.peers(), t.inflight()), (1, 1));
        t.heard(2, Nanos(11 * S));
        let (gone, dropped) = t.expire(Nanos(11 * S));
        assert!(gone.is_empty());
        assert_eq!(dropped.len(), 1, "no end heard within the age bound");
        assert_eq!(t.inflight(), 0);
    }

    proptest! {
        /// Whatever the order of dispatches, ends and expiries, every entry admitted leaves
        /// exactly once (by end, forget or expiry), so the pool's ledger is freed exactly once.
        #[test]
        fn every_admitted_request_leaves_exactly_once(
            ops in proptest::collection::vec((0u8..4, 0u64..3, 0u64..6, 0u32..2), 1..200)
        ) {
            let mut t = PeerTable::new(Nanos(3 * S), Nanos(20 * S));
            let mut admitted = std::collections::HashSet::new();
            let mut left = Vec::new();
            for (step, (op, replica, id, ep)) in ops.into_iter().enumerate() {
                let now = Nanos(step as u64 * S / 2);
                let ep = EndpointId(ep);
                match op {
                    0 => {
                        t.heard(replica, now);
                        if let Some(l) = t.admit(replica, id, ep, now) {
                            admitted.insert(l);
                        }
                    }
                    1 => left.extend(t.end(replica, id, ep).map(|e| e.local)),
                    2 => left.extend(t.forget(replica).into_iter().map(|(_, e)| e.local)),
                    _ => left.extend(t.expire(now).1.into_iter().map(|(_, e)| e.local)),
                }
            }
            left.extend(t.expire(Nanos(u64::MAX / 2)).1.into_iter().map(|(_, e)| e.local));
            left.extend((0..3).flat_map(|r| t.forget(r)).map(|(_, e)| e.local));
            let unique: std::collections::HashSet<u64> = left.iter().copied().collect();
            prop_assert_eq!(unique.len(), left.len());
            prop_assert_eq!(unique, admitted);
        }
    }
}
