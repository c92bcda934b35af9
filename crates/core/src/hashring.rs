//! A consistent-hash ring with virtual nodes, and the bounded-load walk.
//!
//! Each endpoint owns `vnodes * weight` points on a 64-bit ring (ketama-style, as nginx and
//! pingora-ketama); a key belongs to the first point clockwise from its hash. Adding one of `n + 1`
//! endpoints moves about `1/(n+1)` of the keys. Bounded load (Mirrokni, Thorup and Zadimoghaddam
//! 2016): when the owner is at capacity `ceil(c * m / n)` the walk continues clockwise to the next
//! distinct endpoint.

use crate::EndpointId;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Points per unit weight by default (nginx's ketama uses 160 per server).
pub const DEFAULT_VNODES: u32 = 160;

/// The most points one endpoint gets, whatever its weight: weights are ratios, and an absurd one
/// must not allocate gigabytes.
pub const MAX_POINTS_PER_ENDPOINT: f64 = 65_536.0;

/// The ring: sorted (point, endpoint) pairs.
#[derive(Clone, Debug, Default)]
pub struct HashRing {
    points: Vec<(u64, EndpointId)>,
    members: Vec<EndpointId>,
}

impl HashRing {
    /// Builds a ring over `(endpoint, weight)` with `vnodes` points per unit weight.
    pub fn new(members: impl IntoIterator<Item = (EndpointId, f64)>, vnodes: u32) -> Self {
        let mut points = Vec::new();
        let mut ids = Vec::new();
        for (id, weight) in members {
            ids.push(id);
            let share = (f64::from(vnodes) * weight).clamp(1.0, MAX_POINTS_PER_ENDPOINT);
            let count = if share.is_nan() {
                1
            } else {
                share.round() as u32
            };
            for v in 0..count {
                let mut key = [0u8; 8];
                key[..4].copy_from_slice(&id.0.to_le_bytes());
                key[4..].copy_from_slice(&v.to_le_bytes());
                points.push((xxh3_64_with_seed(&key, 0x6b76_6761_7465), id));
            }
        }
        points.sort_unstable();
        ids.sort_unstable();
        ids.dedup();
        HashRing {
            points,
            members: ids,
        }
    }

    /// The endpoints on the ring, sorted.
    pub fn members(&self) -> &[EndpointId] {
        &self.members
    }

    /// The owner of `hash`, if the ring is not empty.
    pub fn owner(&self, hash: u64) -> Option<EndpointId> {
        self.walk(hash).next()
    }

    /// Distinct endpoints in clockwise order starting at the owner of `hash`.
    pub fn walk(&self, hash: u64) -> impl Iterator<Item = EndpointId> + '_ {
        let start = self.points.partition_point(|&(p, _)| p < hash);
        let n = self.points.len();
        let mut seen: Vec<EndpointId> = Vec::with_capacity(4);
        let distinct = self.members.len();
        (0..n)
            .map(move |k| self.points[(start + k) % n].1)
            .filter(move |id| {
                if seen.len() >= distinct || seen.contains(id) {
                    false
                } else {
                    seen.push(*id);
                    true
                }
            })
    }
}

/// Capacity per endpoint under bounded load: `ceil(c * m / n)` for `m` requests (including the
/// one being placed) over `n` endpoints.
pub fn bounded_capacity(c: f64, m: f64, n: usize) -> f64 {
    if n == 0 {
        return 0.0;
    }
    (c * m / n as f64).ceil()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ring(n: u32) -> HashRing {
        HashRing::new((0..n).map(|i| (EndpointId(i), 1.0)), DEFAULT_VNODES)
    }

    #[test]
    fn absurd_weights_get_a_bounded_number_of_points() {
        let r = HashRing::new(
            [(EndpointId(0), 1e12), (EndpointId(1), f64::NAN)],
            DEFAULT_VNODES,
        );
        assert_eq!(r.points.len(), MAX_POINTS_PER_ENDPOINT as usize + 1);
    }

    #[test]
    fn walk_visits_every_member_once() {
        let r = ring(7);
        let mut seen: Vec<_> = r.walk(12345).collect();
        seen.sort();
        assert_eq!(seen, r.members());
    }

    proptest! {
        /// Adding one endpoint to n moves about 1/(n+1) of the keys, and only to the newcomer.
        #[test]
        fn adding_one_endpoint_moves_about_one_over_n_plus_one(n in 2u32..16, seed in any::<u64>()) {
            let before = ring(n);
            let after = ring(n + 1);
            let keys = 20_000u64;
            let mut moved = 0u64;
            for k in 0..keys {
                let h = xxh3_64_with_seed(&k.to_le_bytes(), seed);
                let (a, b) = (before.owner(h).unwrap(), after.owner(h).unwrap());
                if a != b {
                    prop_assert_eq!(b, EndpointId(n), "a key moved between old endpoints");
                    moved += 1;
                }
            }
            let expected = 1.0 / f64::from(n + 1);
            let share = moved as f64 / keys as f64;
            prop_assert!((share - expected).abs() < 0.45 * expected,
                "moved {share:.4}, expected about {expected:.4}");
        }
    }
}
