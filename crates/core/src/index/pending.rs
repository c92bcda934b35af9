//! Prompts sent to each endpoint whose prefill has not finished yet.
//!
//! An engine caches a prompt's blocks as it schedules them (vLLM v1 caches a block when it
//! allocates its slots), so a request that arrives behind one still prefilling the same prefix
//! finds that prefix cached when it is admitted, even in the iteration that computes its last
//! chunk. Until the first token says so, though, the prefix is not known to be cached (the
//! request may fail, or the engine evict it), so an index that mirrors engines keeps these
//! prompts apart from what is known to be cached, and the policy decides how to count them.
//!
//! Each held prompt is cut into chained block hashes (16 tokens, or 64 bytes of text when only
//! text is known); an endpoint's overlap is the run of a query's leading blocks that some held
//! prompt there has. Memory: the prompts in flight, and a refcount per distinct held block.

use super::blocks::{block_hashes, text_block_hashes};
use super::PrefixKey;
use crate::fasthash::IntMap;
use crate::EndpointId;

/// Tokens per block of the held prompts' hashes.
pub(crate) const BLOCK_TOKENS: usize = 16;

/// A prompt's key, owned.
#[derive(Clone, Debug)]
pub(crate) struct OwnedKey {
    pub(crate) scope: u64,
    pub(crate) text: Option<Vec<u8>>,
    pub(crate) tokens: Option<Vec<u32>>,
    pub(crate) adapter: Option<String>,
}

impl OwnedKey {
    pub(crate) fn of(key: &PrefixKey<'_>) -> Self {
        OwnedKey {
            scope: key.scope,
            text: key.text.map(<[u8]>::to_vec),
            tokens: key.tokens.map(<[u32]>::to_vec),
            adapter: key.adapter.map(str::to_owned),
        }
    }

    pub(crate) fn key(&self) -> PrefixKey<'_> {
        PrefixKey {
            scope: self.scope,
            text: self.text.as_deref(),
            tokens: self.tokens.as_deref(),
            adapter: self.adapter.as_deref(),
        }
    }
}

/// The chained block hashes of `key`: tokens when it has them, else text.
pub(crate) fn hashes(key: &PrefixKey<'_>) -> Vec<u64> {
    match (key.tokens, key.text) {
        (Some(t), _) => block_hashes(t, BLOCK_TOKENS, key.scope),
        (None, Some(t)) => text_block_hashes(t, BLOCK_TOKENS, key.scope),
        (None, None) => Vec::new(),
    }
}

#[derive(Debug)]
struct Held {
    key: OwnedKey,
    hashes: Vec<u64>,
}

/// The prompts in flight per endpoint. See the module documentation.
#[derive(Debug, Default)]
pub(crate) struct PendingPrompts {
    blocks: IntMap<EndpointId, IntMap<u64, u32>>,
    held: IntMap<(u64, EndpointId), Held>,
}

impl PendingPrompts {
    /// Request `id` with `key` was sent to `endpoint`; `hashes` are its prompt's block hashes
    /// ([`hashes`], which the lookup computed already).
    pub(crate) fn add(
        &mut self,
        id: u64,
        endpoint: EndpointId,
        key: &PrefixKey<'_>,
        hashes: &[u64],
    ) {
        self.take(id, endpoint);
        let hashes = hashes.to_vec();
        let counts = self.blocks.entry(endpoint).or_default();
        for &h in &hashes {
            *counts.entry(h).or_insert(0) += 1;
        }
        self.held.insert(
            (id, endpoint),
            Held {
                key: OwnedKey::of(key),
                hashes,
            },
        );
    }

    /// Request `id`'s prefill on `endpoint` ended (first token, failure or cancellation):
    /// returns its key.
    pub(crate) fn take(&mut self, id: u64, endpoint: EndpointId) -> Option<OwnedKey> {
        let held = self.held.remove(&(id, endpoint))?;
        // An emptied map stays (one per endpoint): the next prompt there reuses its allocation.
        if let Some(counts) = self.blocks.get_mut(&endpoint) {
            for h in &held.hashes {
                if let Some(n) = counts.get_mut(h) {
                    *n -= 1;
                    if *n == 0 {
                        counts.remove(h);
                    }
                }
            }
        }
        Some(held.key)
    }

    /// Per endpoint holding any, the leading blocks of `query` (its chained hashes) held there.
    pub(crate) fn overlaps(&self, query: &[u64]) -> Vec<(EndpointId, u32)> {
        let mut out: Vec<(EndpointId, u32)> = self
            .blocks
            .iter()
            .map(|(&e, counts)| {
                let run = query.iter().take_while(|h| counts.contains_key(h)).count();
                (e, u32::try_from(run).unwrap_or(u32::MAX))
            })
            .filter(|&(_, n)| n > 0)
            .collect();
        out.sort_unstable();
        out
    }

    /// Forgets an endpoint.
    pub(crate) fn remove_endpoint(&mut self, endpoint: EndpointId) {
        self.blocks.remove(&endpoint);
        self.held.retain(|&(_, e), _| e != endpoint);
    }

    /// Whether nothing is in flight anywhere.
    pub(crate) fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_prefix_overlaps_until_it_is_taken() {
        let mut p = PendingPrompts::default();
        let prompt: Vec<u32> = (0..100).collect();
        let key = PrefixKey {
            adapter: None,
            scope: 1,
            text: None,
            tokens: Some(&prompt),
        };
        p.add(7, EndpointId(2), &key, &hashes(&key));
        p.add(8, EndpointId(2), &key, &hashes(&key));
        let query: Vec<u32> = (0..64).chain(500..600).collect();
        let q = hashes(&PrefixKey {
            adapter: None,
            scope: 1,
            text: None,
            tokens: Some(&query),
        });
        assert_eq!(p.overlaps(&q), vec![(EndpointId(2), 4)]);
        assert!(p.take(7, EndpointId(2)).is_some());
        assert_eq!(p.overlaps(&q), vec![(EndpointId(2), 4)], "8 still holds it");
        let back = p.take(8, EndpointId(2)).unwrap();
        assert_eq!(back.tokens.as_deref(), Some(&prompt[..]));
        assert!(p.overlaps(&q).is_empty() && p.is_empty());
    }
}
