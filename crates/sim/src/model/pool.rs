//! The KV block pool and its prefix cache (PagedAttention blocks, vLLM's automatic prefix caching).
//!
//! Every block is in exactly one of three states:
//! - *free*: holds nothing, on the free list;
//! - *in use*: referenced by one or more sequences (`refs > 0`), possibly also cached;
//! - *idle cached*: a full block whose hash is still in the cache but that no sequence references;
//!   it counts as free capacity and is evicted least-recently-released first when an allocation
//!   finds the free list empty (as the routing lab has it: cached blocks do not consume KV
//!   capacity, docs/background.md#routing-lab).
//!
//! The cache maps a chained block hash to the block holding it. Lookups never iterate the map,
//! so its order cannot leak into decisions.

use kvgate_core::fasthash::IntMap;

/// Index of a block in the pool.
pub(crate) type BlockId = u32;

const NIL: BlockId = BlockId::MAX;

#[derive(Clone, Copy, Debug)]
struct Block {
    refs: u32,
    /// The chained hash, when the block is in the prefix cache.
    hash: Option<u64>,
    /// Whether the block is on the idle list.
    idle: bool,
    /// Idle-list neighbours (older, newer).
    prev: BlockId,
    next: BlockId,
}

impl Default for Block {
    fn default() -> Self {
        Block {
            refs: 0,
            hash: None,
            idle: false,
            prev: NIL,
            next: NIL,
        }
    }
}

/// The pool. See the module documentation.
///
/// Idle cached blocks form an intrusive doubly linked list from the least to the most recently
/// released, so reviving, releasing and evicting are O(1).
#[derive(Clone, Debug)]
pub(crate) struct BlockPool {
    blocks: Vec<Block>,
    free: Vec<BlockId>,
    idle_head: BlockId,
    idle_tail: BlockId,
    idle_len: usize,
    cached: IntMap<u64, BlockId>,
    caching: bool,
}

impl BlockPool {
    /// A pool of `total` free blocks; with `caching` false nothing is ever cached.
    pub(crate) fn new(total: usize, caching: bool) -> Self {
        let total = u32::try_from(total).unwrap_or(u32::MAX - 1);
        BlockPool {
            blocks: vec![Block::default(); total as usize],
            // Pop from the back: hand out low ids first.
            free: (0..total).rev().collect(),
            idle_head: NIL,
            idle_tail: NIL,
            idle_len: 0,
            cached: IntMap::default(),
            caching,
        }
    }

    /// Total blocks.
    pub(crate) fn total(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks an allocation could obtain: free plus idle cached.
    pub(crate) fn available(&self) -> usize {
        self.free.len() + self.idle_len
    }

    /// Blocks referenced by at least one sequence.
    pub(crate) fn in_use(&self) -> usize {
        self.total() - self.available()
    }

    fn unlink(&mut self, id: BlockId) {
        let Block { prev, next, .. } = self.blocks[id as usize];
        if prev == NIL {
            self.idle_head = next;
        } else {
            self.blocks[prev as usize].next = next;
        }
        if next == NIL {
            self.idle_tail = prev;
        } else {
            self.blocks[next as usize].prev = prev;
        }
        let b = &mut self.blocks[id as usize];
        b.prev = NIL;
        b.next = NIL;
        b.idle = false;
        self.idle_len -= 1;
    }

    fn push_idle(&mut self, id: BlockId) {
        let tail = self.idle_tail;
        {
            let b = &mut self.blocks[id as usize];
            b.prev = tail;
            b.next = NIL;
            b.idle = true;
        }
        if tail == NIL {
            self.idle_head = id;
        } else {
            self.blocks[tail as usize].next = id;
        }
        self.idle_tail = id;
        self.idle_len += 1;
    }

    /// The cached block holding `hash`, taking a reference to it (reviving it if idle).
    #[cfg(test)]
    pub(crate) fn acquire_cached(&mut self, hash: u64) -> Option<BlockId> {
        let id = *self.cached.get(&hash)?;
        self.acquire(id);
        Some(id)
    }

    /// Takes a reference to cached block `id` (reviving it if idle).
    pub(crate) fn acquire(&mut self, id: BlockId) {
        debug_assert!(self.blocks[id as usize].hash.is_some());
        if self.blocks[id as usize].idle {
            self.unlink(id);
        }
        self.blocks[id as usize].refs += 1;
    }

    /// The block caching `hash` and whether it is idle.
    pub(crate) fn lookup(&self, hash: u64) -> Option<(BlockId, bool)> {
        self.cached
            .get(&hash)
            .map(|&id| (id, self.blocks[id as usize].refs == 0))
    }

    /// Whether `hash` is in the cache (in use or idle).
    #[cfg(test)]
    pub(crate) fn is_cached(&self, hash: u64) -> bool {
        self.cached.contains_key(&hash)
    }

    /// A fresh block with one reference. When the free list is empty the least recently
    /// released idle cached block is evicted; its hash is returned alongside so the caller can
    /// report the removal. `None` when every block is in use.
    pub(crate) fn allocate(&mut self) -> Option<(BlockId, Option<u64>)> {
        let (id, evicted) = if let Some(id) = self.free.pop() {
            (id, None)
        } else {
            let id = self.idle_head;
            if id == NIL {
                return None;
            }
            self.unlink(id);
            let hash = self.blocks[id as usize].hash.take();
            if let Some(h) = hash {
                self.cached.remove(&h);
            }
            (id, hash)
        };
        self.blocks[id as usize].refs = 1;
        Some((id, evicted))
    }

    /// Enters a full, in-use block into the cache under `hash`. Returns false (and leaves the
    /// block uncached) when caching is off or another block already holds that hash.
    pub(crate) fn register(&mut self, id: BlockId, hash: u64) -> bool {
        if !self.caching || self.cached.contains_key(&hash) {
            return false;
        }
        let block = &mut self.blocks[id as usize];
        debug_assert!(block.refs > 0 && block.hash.is_none());
        block.hash = Some(hash);
        self.cached.insert(hash, id);
        true
    }

    /// Drops one reference to each block, last block first, so that a sequence's tail blocks
    /// become the oldest idle entries and are evicted before its head (vLLM frees in reverse
    /// order for the same reason: heads are the shared prefixes).
    pub(crate) fn release(&mut self, ids: &[BlockId]) {
        for &id in ids.iter().rev() {
            let block = &mut self.blocks[id as usize];
            debug_assert!(block.refs > 0);
            block.refs -= 1;
            if block.refs > 0 {
                continue;
            }
            if block.hash.is_some() {
                self.push_idle(id);
            } else {
                self.free.push(id);
            }
        }
    }

    /// Drops every cached hash (vLLM `reset_prefix_cache`); idle cached blocks become free.
    /// Returns whether anything was cached.
    pub(crate) fn clear_cache(&mut self) -> bool {
        let any = !self.cached.is_empty();
        while self.idle_head != NIL {
            let id = self.idle_head;
            self.unlink(id);
            self.free.push(id);
        }
        for block in &mut self.blocks {
            block.hash = None;
        }
        self.cached.clear();
        any
    }

    /// Debug check of the state invariants; returns a description of the first violation.
    #[cfg(test)]
    pub(crate) fn check(&self) -> Result<(), String> {
        let mut seen = vec![0u8; self.blocks.len()];
        for &id in &self.free {
            seen[id as usize] += 1;
            let b = self.blocks[id as usize];
            if b.refs != 0 || b.hash.is_some() {
                return Err(format!("free block {id} is {b:?}"));
            }
        }
        let mut id = self.idle_head;
        let mut prev = NIL;
        let mut n = 0;
        while id != NIL {
            seen[id as usize] += 1;
            let b = self.blocks[id as usize];
            if b.refs != 0 || b.hash.is_none() || !b.idle || b.prev != prev {
                return Err(format!("idle block {id} is {b:?}"));
            }
            n += 1;
            prev = id;
            id = b.next;
        }
        if prev != self.idle_tail || n != self.idle_len {
            return Err("idle list ends disagree".into());
        }
        for (i, b) in self.blocks.iter().enumerate() {
            if b.refs > 0 {
                seen[i] += 1;
            }
            if seen[i] != 1 {
                return Err(format!("block {i} is in {} states", seen[i]));
            }
            if let Some(h) = b.hash {
                if self.cached.get(&h) != Some(&(i as BlockId)) {
                    return Err(format!("block {i} hash not mapped"));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_cached_blocks_are_revived_or_evicted_lru() {
        let mut pool = BlockPool::new(3, true);
        let (a, _) = pool.allocate().unwrap();
        let (b, _) = pool.allocate().unwrap();
        assert!(pool.register(a, 10));
        assert!(pool.register(b, 20));
        pool.release(&[a, b]); // b released first, so b is the older idle entry
        assert_eq!(pool.available(), 3);
        assert_eq!(pool.acquire_cached(10), Some(a));
        let (c, evicted) = pool.allocate().unwrap();
        assert_eq!(evicted, None); // the never-used block first
        let (d, evicted) = pool.allocate().unwrap();
        assert_eq!((d, evicted), (b, Some(20)));
        assert!(pool.allocate().is_none());
        assert!(!pool.is_cached(20) && pool.is_cached(10));
        pool.release(&[c, d, a]);
        pool.check().unwrap();
        assert!(pool.clear_cache());
        assert_eq!(pool.available(), 3);
        pool.check().unwrap();
    }

    #[test]
    fn duplicate_hashes_and_disabled_caching_are_not_registered() {
        let mut pool = BlockPool::new(2, true);
        let (a, _) = pool.allocate().unwrap();
        let (b, _) = pool.allocate().unwrap();
        assert!(pool.register(a, 1));
        assert!(!pool.register(b, 1));
        pool.release(&[a, b]);
        pool.check().unwrap();
        let mut off = BlockPool::new(1, false);
        let (x, _) = off.allocate().unwrap();
        assert!(!off.register(x, 1));
    }
}
