//! What the engines themselves report of their KV caches (vLLM KV events), laid over the
//! router's own approximate index.
//!
//! Each endpoint with an event stream has a [`Trust`]:
//! - `Live`: every batch since the engine's cache was empty has been seen (the stream started at
//!   sequence 0, or the engine cleared its cache since), so the event index is the engine's cache
//!   and its overlap replaces the approximate one: predictions are exact to the token.
//! - `Unknown`: batches were lost (a sequence gap, a stream first seen mid-way, an entry bound
//!   reached), so blocks stored meanwhile are missing. The endpoint's event entries are dropped
//!   at once and the router uses, per request, the larger of the approximate and the event
//!   overlap. Trust returns when the engine's cache is known empty again (a restart, whose
//!   stream starts over at 0, or `AllBlocksCleared`), or when [`VERIFY_STREAK`] requests in a row
//!   got exactly the cached tokens the event index alone predicted (usage is the check).
//!
//! Memory is bounded per endpoint: at most `max_entries` (block, tier) entries, each held in the
//! block map and the engine-hash map. An endpoint over the bound has more
//! blocks than any engine it could be (or missed removals): its entries are dropped and it
//! becomes `Unknown`.

use super::blocks::{block_hashes, BlockIndex, KvEvent};
use super::{Overlap, Overlaps, Unit};
use crate::{EndpointId, Nanos};
use serde::Serialize;
use std::collections::HashMap;

/// Consecutive exact event-only predictions that restore trust in an `Unknown` stream.
pub const VERIFY_STREAK: u32 = 8;

/// Whether an endpoint's event stream is complete.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Trust {
    /// Complete since the engine's cache was last empty.
    Live,
    /// Batches were missed; the approximate index fills in.
    Unknown,
}

/// What one batch did to its endpoint's stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchOutcome {
    /// The next batch in sequence (or the first, at 0).
    InOrder,
    /// A stream seen first in the middle (batches before it are unknown).
    JoinedLate,
    /// Batches `expected..got` were lost.
    Gap {
        /// The sequence number expected.
        expected: u64,
        /// The one received.
        got: u64,
    },
    /// The sequence went back: a new publisher, so the engine restarted.
    Restarted,
    /// The endpoint's entries passed the bound and were dropped.
    Overflow,
    /// An already received batch (duplicate or reordered): ignored.
    Stale,
}

#[derive(Clone, Copy, Debug)]
struct Stream {
    trust: Trust,
    next_seq: u64,
    streak: u32,
}

/// The engines' KV events and each stream's trust. See the module documentation.
#[derive(Debug)]
pub struct EngineCaches {
    /// Created with the block size of the first stored blocks.
    index: Option<BlockIndex>,
    streams: HashMap<EndpointId, Stream>,
    max_entries: usize,
}

/// One endpoint's event-fed state, for status pages and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct StreamStatus {
    /// Whether its entries are trusted.
    pub trust: Trust,
    /// Entries held.
    pub entries: usize,
    /// The next sequence number expected.
    pub next_seq: u64,
}

impl EngineCaches {
    /// No streams yet; at most `max_entries` entries per endpoint.
    pub fn new(max_entries: usize) -> Self {
        EngineCaches {
            index: None,
            streams: HashMap::new(),
            max_entries: max_entries.max(1),
        }
    }

    /// Tokens per block, once a stored batch has said.
    pub fn block_size(&self) -> Option<usize> {
        self.index.as_ref().map(BlockIndex::block_size)
    }

    /// `endpoint`'s stream, if it has one.
    pub fn status(&self, endpoint: EndpointId) -> Option<StreamStatus> {
        let s = self.streams.get(&endpoint)?;
        Some(StreamStatus {
            trust: s.trust,
            entries: self.index.as_ref().map_or(0, |i| i.held_by(endpoint)),
            next_seq: s.next_seq,
        })
    }

    /// Forgets the blocks `endpoint` held; its stream's place stays.
    pub(crate) fn forget(&mut self, endpoint: EndpointId) {
        if let Some(index) = &mut self.index {
            use super::PrefixIndex;
            index.remove_endpoint(endpoint);
        }
    }

    /// Applies batch `seq` of `endpoint`'s stream.
    pub fn batch(
        &mut self,
        endpoint: EndpointId,
        seq: u64,
        events: &[KvEvent],
        now: Nanos,
    ) -> BatchOutcome {
        let (outcome, trust) = match self.streams.get(&endpoint) {
            None if seq == 0 => (BatchOutcome::InOrder, Trust::Live),
            None => (BatchOutcome::JoinedLate, Trust::Unknown),
            Some(s) if seq == s.next_seq => (BatchOutcome::InOrder, s.trust),
            Some(s) if seq == 0 || seq + 1 < s.next_seq.saturating_sub(1024) => {
                // A restarted engine's publisher counts from 0 again (the second test allows a
                // restart noticed late, after its stream has gone some way).
                let trust = if seq == 0 {
                    Trust::Live
                } else {
                    Trust::Unknown
                };
                (BatchOutcome::Restarted, trust)
            }
            Some(s) if seq < s.next_seq => return BatchOutcome::Stale,
            Some(s) => (
                BatchOutcome::Gap {
                    expected: s.next_seq,
                    got: seq,
                },
                Trust::Unknown,
            ),
        };
        if !matches!(outcome, BatchOutcome::InOrder) {
            self.forget(endpoint);
        }
        let mut stream = Stream {
            trust,
            next_seq: seq + 1,
            streak: 0,
        };
        if let Some(old) = self.streams.get(&endpoint) {
            if outcome == BatchOutcome::InOrder {
                stream.streak = old.streak;
            }
        }
        for event in events {
            if let KvEvent::AllBlocksCleared = event {
                // The engine's cache is empty now: whatever was missed no longer matters.
                self.forget(endpoint);
                stream.trust = Trust::Live;
                continue;
            }
            if let KvEvent::BlockStored { block_size, .. } = event {
                let size = (*block_size as usize).max(1);
                let index = self
                    .index
                    .get_or_insert_with(|| BlockIndex::new(size, None));
                if index.block_size() != size {
                    // Engines with another block size cannot be matched on this index.
                    stream.trust = Trust::Unknown;
                    continue;
                }
            }
            if let Some(index) = &mut self.index {
                index.apply(endpoint, event, now);
            }
        }
        let outcome = match &self.index {
            Some(index) if index.held_by(endpoint) > self.max_entries => {
                self.forget(endpoint);
                stream.trust = Trust::Unknown;
                BatchOutcome::Overflow
            }
            _ => outcome,
        };
        self.streams.insert(endpoint, stream);
        outcome
    }

    /// Usage showed whether the event index alone predicted `endpoint`'s cached tokens exactly;
    /// enough exact predictions in a row restore an `Unknown` stream.
    pub fn verified(&mut self, endpoint: EndpointId, exact: bool) {
        if let Some(s) = self.streams.get_mut(&endpoint) {
            s.streak = if exact { s.streak + 1 } else { 0 };
            if s.trust == Trust::Unknown && s.streak >= VERIFY_STREAK {
                s.trust = Trust::Live;
            }
        }
    }

    /// The endpoint left the pool.
    pub fn remove_endpoint(&mut self, endpoint: EndpointId) {
        self.forget(endpoint);
        self.streams.remove(&endpoint);
    }

    /// Lays the engines' own account of `tokens` over `approx`, the router's index answer:
    /// everything in tokens, `Live` endpoints exact, `Unknown` ones the larger of the two, the
    /// rest as the router believes. Pending (in-flight) overlap stays the router's. `scope`
    /// seeds the chain: the engine's scope, or a LoRA adapter's.
    pub fn overlay(&self, approx: Overlaps, tokens: &[u32], scope: u64, now: Nanos) -> Overlaps {
        let Some(index) = self.index.as_ref().filter(|_| !self.streams.is_empty()) else {
            return approx;
        };
        let n = u32::try_from(tokens.len()).unwrap_or(u32::MAX);
        let bs = u32::try_from(index.block_size()).unwrap_or(u32::MAX);
        let hashes = block_hashes(tokens, index.block_size(), scope);
        let exact = index.overlaps_of(&hashes, now);
        // An engine recomputes at least the prompt's last token (vLLM caps a hit at whole
        // blocks of the first n - 1 tokens).
        let reusable = n.saturating_sub(1) / bs * bs;
        let in_tokens = |o: &Overlap| Overlap {
            device: approx.tokens(o.device, n),
            host: approx.tokens(o.host, n),
            disk: approx.tokens(o.disk, n),
            pending: approx.tokens(o.pending, n),
            ..*o
        };
        let engine_tokens = |o: &Overlap| {
            let mut left = reusable;
            let mut take = |blocks: u32| {
                let t = blocks.saturating_mul(bs).min(left);
                left -= t;
                t
            };
            Overlap {
                device: take(o.device),
                host: take(o.host),
                disk: take(o.disk),
                ..*o
            }
        };
        let mut ids: Vec<EndpointId> = approx
            .endpoints
            .iter()
            .chain(&exact.endpoints)
            .map(|o| o.endpoint)
            .chain(self.streams.keys().copied())
            .collect();
        ids.sort_unstable();
        ids.dedup();
        let mut out = Overlaps {
            total: n,
            unit: Unit::Tokens,
            endpoints: Vec::with_capacity(ids.len()),
            shared: approx.tokens(approx.shared, n),
            evicted: approx.evicted || exact.evicted,
            block_hashes: approx.block_hashes.clone(),
            engine: Vec::new(),
            tail: Default::default(),
        };
        for id in ids {
            let a = in_tokens(&approx.of(id));
            let chosen = match self.streams.get(&id) {
                None => a,
                Some(stream) => {
                    let x = engine_tokens(&exact.of(id));
                    out.engine
                        .push((id, x.total(), stream.trust == Trust::Live));
                    let x = Overlap {
                        pending: a.pending,
                        ..x
                    };
                    match stream.trust {
                        Trust::Live => x,
                        Trust::Unknown if x.total() >= a.total() => x,
                        Trust::Unknown => a,
                    }
                }
            };
            if chosen.total() > 0 || chosen.pending > 0 {
                out.endpoints.push(chosen);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests;
