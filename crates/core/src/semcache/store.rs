//! The store: answers by scope, fingerprint and last message, with their embeddings; bounded
//! by a time to live and by least-recently-used eviction on entries and bytes, on the caller's
//! clock.
//!
//! Similar messages are searched by a linear scan of one (scope, fingerprint) group: groups
//! are small (one conversation context), and a flat scan is exact and beats graph indexes below
//! about ten thousand vectors (as vLLM Semantic Router's cache notes).

use super::guards::{self, Guard, Guards};
use super::Fingerprint;
use crate::Nanos;
use std::collections::{BTreeMap, HashMap};

/// Where an answer is kept and found: only a request with the same scope (its tenant, or its
/// key), the same fingerprint (every field of the request but its last user message) and,
/// for an exact hit, the same last message finds it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    /// The tenant or key the answer belongs to; never shared across scopes.
    pub scope: String,
    /// The rest of the request.
    pub fingerprint: Fingerprint,
    /// The last user message.
    pub message: String,
}

/// The store's bounds and similarity rule.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limits {
    /// How long an entry lives after it is stored.
    pub ttl: Nanos,
    /// At most this many entries.
    pub max_entries: usize,
    /// At most this many bytes of answers, messages and embeddings.
    pub max_bytes: usize,
    /// The least cosine similarity of a semantic hit.
    pub threshold: f32,
    /// The textual checks a semantic hit must also pass.
    pub guards: Guards,
}

/// A semantic hit.
#[derive(Clone, Debug, PartialEq)]
pub struct Similar<A> {
    /// The stored answer.
    pub answer: A,
    /// Its message's cosine similarity to the asked one.
    pub similarity: f32,
}

/// What a semantic search found, and which candidates above the threshold a guard stopped.
#[derive(Clone, Debug, PartialEq)]
pub struct Search<A> {
    /// The most similar candidate that passed the guards.
    pub hit: Option<Similar<A>>,
    /// The guards that stopped candidates above the threshold, one per candidate.
    pub stopped: Vec<Guard>,
}

#[derive(Debug)]
struct Slot<A> {
    key: Key,
    embedding: Option<Vec<f32>>,
    answer: A,
    bytes: usize,
    expires: Nanos,
    used: u64,
}

/// The entries of one tenant-scoped cache; `A` is the answer (cheap to clone, e.g. an `Arc`).
#[derive(Debug)]
pub struct Store<A> {
    limits: Limits,
    slots: HashMap<u64, Slot<A>>,
    exact: HashMap<Key, u64>,
    groups: HashMap<(String, Fingerprint), Vec<u64>>,
    by_use: BTreeMap<u64, u64>,
    by_expiry: BTreeMap<(Nanos, u64), ()>,
    next_id: u64,
    tick: u64,
    bytes: usize,
}

impl<A: Clone> Store<A> {
    /// An empty store.
    pub fn new(limits: Limits) -> Self {
        Store {
            limits,
            slots: HashMap::new(),
            exact: HashMap::new(),
            groups: HashMap::new(),
            by_use: BTreeMap::new(),
            by_expiry: BTreeMap::new(),
            next_id: 0,
            tick: 0,
            bytes: 0,
        }
    }

    /// The bounds.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Bytes held (answers, messages, embeddings, as [`Store::insert`] was told).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The answer stored under exactly `key`, if it has not expired at `now`.
    pub fn exact(&mut self, key: &Key, now: Nanos) -> Option<A> {
        let id = *self.exact.get(key)?;
        if self.slots[&id].expires <= now {
            self.remove(id);
            return None;
        }
        self.touch(id);
        Some(self.slots[&id].answer.clone())
    }

    /// The most similar live answer of `key`'s scope and fingerprint whose message embeds
    /// within the threshold of `embedding` (normalised) and passes the guards against
    /// `key.message`.
    pub fn similar(&mut self, key: &Key, embedding: &[f32], now: Nanos) -> Search<A> {
        let group = (key.scope.clone(), key.fingerprint);
        let mut candidates: Vec<(f32, u64)> = Vec::new();
        let mut expired = Vec::new();
        for &id in self.groups.get(&group).map_or(&[][..], Vec::as_slice) {
            let slot = &self.slots[&id];
            if slot.expires <= now {
                expired.push(id);
                continue;
            }
            let Some(e) = slot
                .embedding
                .as_deref()
                .filter(|e| e.len() == embedding.len())
            else {
                continue;
            };
            let similarity = dot(e, embedding);
            if similarity >= self.limits.threshold {
                candidates.push((similarity, id));
            }
        }
        for id in expired {
            self.remove(id);
        }
        // Most similar first; ties by age of entry, so the result never depends on hashing.
        candidates.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut stopped = Vec::new();
        for (similarity, id) in candidates {
            let slot = &self.slots[&id];
            match guards::check(&key.message, &slot.key.message, self.limits.guards) {
                Ok(()) => {
                    self.touch(id);
                    let answer = self.slots[&id].answer.clone();
                    return Search {
                        hit: Some(Similar { answer, similarity }),
                        stopped,
                    };
                }
                Err(guard) => stopped.push(guard),
            }
        }
        Search { hit: None, stopped }
    }

    /// Stores `answer` under `key` (replacing what was there) until `expires` (at most the
    /// time to live from `now`); `bytes` is the answer's size. Returns how many entries were
    /// evicted to make room (an entry larger than the byte bound is not stored and counts as
    /// none).
    pub fn insert(
        &mut self,
        key: Key,
        embedding: Option<Vec<f32>>,
        (answer, bytes): (A, usize),
        now: Nanos,
        expires: Option<Nanos>,
    ) -> usize {
        let bytes = bytes
            + key.message.len()
            + key.scope.len()
            + embedding.as_ref().map_or(0, |e| e.len() * 4);
        if bytes > self.limits.max_bytes || self.limits.max_entries == 0 {
            return 0;
        }
        if let Some(&old) = self.exact.get(&key) {
            self.remove(old);
        }
        self.expire(now);
        let mut evicted = 0;
        while self.slots.len() >= self.limits.max_entries
            || self.bytes + bytes > self.limits.max_bytes
        {
            let Some((_, &id)) = self.by_use.iter().next() else {
                break;
            };
            self.remove(id);
            evicted += 1;
        }
        let ttl_end = now + self.limits.ttl;
        let expires = expires.map_or(ttl_end, |e| e.min(ttl_end));
        let id = self.next_id;
        self.next_id += 1;
        self.tick += 1;
        self.exact.insert(key.clone(), id);
        self.groups
            .entry((key.scope.clone(), key.fingerprint))
            .or_default()
            .push(id);
        self.by_use.insert(self.tick, id);
        self.by_expiry.insert((expires, id), ());
        self.bytes += bytes;
        self.slots.insert(
            id,
            Slot {
                key,
                embedding,
                answer,
                bytes,
                expires,
                used: self.tick,
            },
        );
        evicted
    }

    /// Drops every entry expired at `now`; returns how many.
    pub fn expire(&mut self, now: Nanos) -> usize {
        let mut n = 0;
        while let Some((&(expires, id), ())) = self.by_expiry.iter().next() {
            if expires > now {
                break;
            }
            self.remove(id);
            n += 1;
        }
        n
    }

    /// Drops every entry of `scope`, or every entry when `scope` is `None` (an operator's
    /// flush after a model or prompt change made the answers wrong); returns how many.
    pub fn clear(&mut self, scope: Option<&str>) -> usize {
        let ids: Vec<u64> = self
            .slots
            .iter()
            .filter(|(_, slot)| scope.is_none_or(|s| slot.key.scope == s))
            .map(|(&id, _)| id)
            .collect();
        for &id in &ids {
            self.remove(id);
        }
        ids.len()
    }

    fn touch(&mut self, id: u64) {
        self.tick += 1;
        let slot = self.slots.get_mut(&id).expect("a live id");
        self.by_use.remove(&slot.used);
        slot.used = self.tick;
        self.by_use.insert(self.tick, id);
    }

    fn remove(&mut self, id: u64) {
        let Some(slot) = self.slots.remove(&id) else {
            return;
        };
        self.exact.remove(&slot.key);
        let group = (slot.key.scope, slot.key.fingerprint);
        if let Some(ids) = self.groups.get_mut(&group) {
            ids.retain(|&i| i != id);
            if ids.is_empty() {
                self.groups.remove(&group);
            }
        }
        self.by_use.remove(&slot.used);
        self.by_expiry.remove(&(slot.expires, id));
        self.bytes -= slot.bytes;
    }
}

/// The dot product: the cosine similarity of two normalised vectors.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}
