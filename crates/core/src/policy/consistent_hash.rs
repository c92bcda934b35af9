//! Consistent hashing with bounded load (Mirrokni, Thorup and Zadimoghaddam, "Consistent Hashing
//! with Bounded Loads", 2016).
//!
//! The key (session by default) picks an owner on a ring of every member; an owner that may not
//! take the request (unhealthy, already tried) passes it clockwise to the next eligible member,
//! so the ring itself changes only when membership does. When the owner already carries
//! `ceil(c * m / n)` of the `m` outstanding requests of the `n` eligible members (the new one
//! included), the walk goes on to the next endpoint under capacity. With `c > 1` some endpoint
//! is always under capacity, so the walk ends; `c = 0` disables the bound. Defaults:
//! `c = 1.25` (HAProxy's `hash-balance-factor 125`, Vimeo's deployment), 160 points per unit
//! weight (nginx ketama).

use super::{check, no_route, Params, Policy, PolicyDoc, Query};
use crate::hashring::{bounded_capacity, HashRing, DEFAULT_VNODES};
use crate::index::PrefixKey;
use crate::{
    Decision, EndpointId, EndpointView, Fleet, LoadConfig, LoadView, Reason, Request, Route,
};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64_with_seed;

const DOC: PolicyDoc = PolicyDoc {
    name: "consistent_hash",
    summary: "ring of endpoints keyed by session (or tenant, prefix), bounded load ceil(c*m/n)",
    params: &[
        (
            "key",
            "what to hash: session, tenant, prefix or request (falls back down that list)",
        ),
        ("balance_factor", "c in ceil(c*m/n); 0 disables the bound"),
        (
            "min_capacity",
            "outstanding requests below which no endpoint is over capacity",
        ),
        ("vnodes", "ring points per unit weight"),
        (
            "prefix_chars",
            "bytes of prompt text hashed when key = prefix",
        ),
        ("load", "stale-signal handling for the load counts"),
    ],
};

/// What identifies requests that should land together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HashKey {
    /// The session id; falls back to tenant, then prefix.
    #[default]
    Session,
    /// The tenant; falls back to prefix.
    Tenant,
    /// The first `prefix_chars` bytes of the prompt (or 4x that many tokens' worth).
    Prefix,
    /// The request id: spreads like random, placed like a ring.
    Request,
}

/// `consistent_hash` parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// What to hash.
    pub key: HashKey,
    /// `c` in `ceil(c * m / n)`; 0 disables the bound.
    pub balance_factor: f64,
    /// Ring points per unit weight.
    pub vnodes: u32,
    /// Bytes of prompt text hashed for the prefix key.
    pub prefix_chars: usize,
    /// No endpoint counts as over capacity below this many outstanding requests: with a few
    /// requests in flight `ceil(c * m / n)` is 1 or 2, and the bound moves a session off its
    /// home (and its cached prefix) at the second concurrent request. 0 keeps the published
    /// rule: in `kvgate sim` (closed-loop sessions, one router) a floor of 8 or 16 did not
    /// raise capacity in any failure-mode scenario and lowered it in `fanout` and
    /// `replica-loss`, so it is an option, not the default.
    pub min_capacity: f64,
    /// Stale-signal handling.
    pub load: LoadConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            key: HashKey::Session,
            balance_factor: 1.25,
            vnodes: DEFAULT_VNODES,
            prefix_chars: 1024,
            min_capacity: 0.0,
            load: LoadConfig::default(),
        }
    }
}

impl Params for Config {
    const DOC: PolicyDoc = DOC;
    fn build(&self) -> Box<dyn Policy> {
        Box::new(ConsistentHash::new(self.clone()))
    }
    fn load(&self) -> Option<&LoadConfig> {
        Some(&self.load)
    }
    fn validate(&self) -> Result<(), (&'static str, &'static str)> {
        check(
            self.balance_factor == 0.0 || self.balance_factor >= 1.0,
            "balance_factor",
            "must be 0 (unbounded) or at least 1",
        )
    }
}

/// A ring over every member, rebuilt only when the members or their weights change.
#[derive(Debug, Default)]
pub(super) struct RingCache {
    members: Vec<(EndpointId, u64)>,
    ring: HashRing,
    scratch: Vec<(EndpointId, u64)>,
}

impl RingCache {
    pub(super) fn get(&mut self, fleet: &[EndpointView], vnodes: u32) -> &HashRing {
        self.scratch.clear();
        self.scratch
            .extend(fleet.iter().map(|e| (e.id, e.weight.to_bits())));
        self.scratch.sort_unstable();
        if self.scratch != self.members || self.ring.members().is_empty() {
            std::mem::swap(&mut self.members, &mut self.scratch);
            self.ring = HashRing::new(
                self.members.iter().map(|&(id, w)| (id, f64::from_bits(w))),
                vnodes,
            );
        }
        &self.ring
    }
}

/// Hashes the first `chars` bytes of the text key, or the first `chars / 4` tokens.
pub(super) fn prefix_hash_of(key: &PrefixKey<'_>, chars: usize) -> Option<u64> {
    if let Some(tokens) = key.tokens {
        let n = tokens.len().min(chars.div_ceil(4).max(1));
        let mut bytes = Vec::with_capacity(n * 4);
        for t in &tokens[..n] {
            bytes.extend_from_slice(&t.to_le_bytes());
        }
        return Some(xxh3_64_with_seed(&bytes, key.scope));
    }
    key.text
        .map(|t| xxh3_64_with_seed(&t[..t.len().min(chars)], key.scope))
}

/// Consistent hashing with bounded load.
#[derive(Debug)]
pub struct ConsistentHash {
    config: Config,
    rings: RingCache,
}

impl ConsistentHash {
    /// A new instance.
    pub fn new(config: Config) -> Self {
        ConsistentHash {
            config,
            rings: RingCache::default(),
        }
    }

    fn key_hash(&self, request: &Request) -> u64 {
        let seed = 0x6368_6173;
        let text = |s: &str| xxh3_64_with_seed(s.as_bytes(), seed);
        let by_prefix = || {
            prefix_hash_of(&PrefixKey::of(request, false), self.config.prefix_chars)
                .unwrap_or_else(|| xxh3_64_with_seed(&request.id.to_le_bytes(), seed))
        };
        match self.config.key {
            HashKey::Session => request
                .session
                .as_deref()
                .or(request.tenant.as_deref())
                .map_or_else(by_prefix, text),
            HashKey::Tenant => request.tenant.as_deref().map_or_else(by_prefix, text),
            HashKey::Prefix => by_prefix(),
            HashKey::Request => xxh3_64_with_seed(&request.id.to_le_bytes(), seed),
        }
    }
}

/// The eligible members in ring order from `hash`, with their fleet positions.
pub(super) fn eligible_walk<'r>(
    ring: &'r HashRing,
    fleet: Fleet<'r>,
    hash: u64,
) -> impl Iterator<Item = (EndpointId, usize)> + 'r {
    ring.walk(hash).filter_map(move |id| {
        let i = fleet.position(id)?;
        fleet.eligible(i).then_some((id, i))
    })
}

impl Policy for ConsistentHash {
    fn name(&self) -> &'static str {
        DOC.name
    }

    fn select(&mut self, query: &Query<'_>, rng: &mut dyn RngCore) -> Decision {
        let fleet = query.fleet;
        let hash = self.key_hash(query.request);
        let view = LoadView::new(fleet, &self.config.load, query.now);
        let (n, total) = view
            .routable()
            .fold((0usize, 0.0), |(n, t), i| (n + 1, t + view.load(i)));
        if n == 0 {
            return no_route(fleet);
        }
        let ring = self.rings.get(fleet.views(), self.config.vnodes);
        let route = |endpoint, reason| Decision::Route(Route { endpoint, reason });
        if self.config.balance_factor <= 0.0 {
            return match eligible_walk(ring, fleet, hash).next() {
                Some((id, _)) => route(id, Reason::HashOwner),
                None => no_route(fleet),
            };
        }
        let capacity = bounded_capacity(self.config.balance_factor, total + 1.0, n)
            .max(self.config.min_capacity);
        for (hops, (id, i)) in eligible_walk(ring, fleet, hash).enumerate() {
            if view.ranked_load(i) + 1.0 <= capacity {
                let reason = if hops == 0 {
                    Reason::HashOwner
                } else {
                    Reason::Overflow {
                        hops: u32::try_from(hops).unwrap_or(u32::MAX),
                    }
                };
                return route(id, reason);
            }
        }
        // Only reachable when slow start inflates every load; fall back to the least loaded.
        match view.least_loaded(rng) {
            Some((i, _)) => route(
                fleet.views()[i].id,
                Reason::Overflow {
                    hops: u32::try_from(n).unwrap_or(u32::MAX),
                },
            ),
            None => no_route(fleet),
        }
    }
}
