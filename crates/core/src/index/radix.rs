//! An approximate radix tree of the prompts the router sent to each endpoint (SGLang's cache-aware
//! router).
//!
//! Edges are compressed (one node per branching point), endpoints are *tenants* of the nodes
//! on the paths they were sent, and each tenant's presence is prefix-closed: if an endpoint
//! holds a node it holds every ancestor. Matching walks the query once, so it costs
//! O(prompt length + tenants on the path). Each endpoint's stored size (the symbols on its
//! paths) is bounded by `max_size`; when an insert goes over, that endpoint's least recently
//! used leaves are evicted down to 90% of the bound, so the bound holds after every call and
//! the eviction scan is amortised over many inserts. Recency only grows towards the root (an
//! insert refreshes the whole path), so evicting leaves in timestamp order is exact LRU.
//!
//! The tree is keyed by bytes (`RadixTree<u8>`, SGLang's raw-text matching) or token ids
//! (`RadixTree<u32>`). Each key scope (model, tenant) has its own root.

use super::{Overlap, Overlaps, PrefixIndex, PrefixKey, Unit};
use crate::{EndpointId, Nanos};
use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap};
use std::fmt;
use std::mem::size_of;

/// A symbol the tree can be keyed by, and where to find it in a [`PrefixKey`].
pub trait Symbol: Copy + Ord + fmt::Debug + Send + Sync + 'static {
    /// What one symbol is.
    const UNIT: Unit;
    /// The key's symbols of this kind, if it has them.
    fn of<'k>(key: &PrefixKey<'k>) -> Option<&'k [Self]>;
}

impl Symbol for u8 {
    const UNIT: Unit = Unit::Bytes;
    fn of<'k>(key: &PrefixKey<'k>) -> Option<&'k [u8]> {
        key.text
    }
}

impl Symbol for u32 {
    const UNIT: Unit = Unit::Tokens;
    fn of<'k>(key: &PrefixKey<'k>) -> Option<&'k [u32]> {
        key.tokens
    }
}

/// Ways on a point needs before [`RadixTree::match_shared`] counts it shared: the query and
/// two other prompts. One other prompt may be this one's own earlier version: a client that
/// edits or extends its last message, or retries with a changed tail, parts ways with its
/// previous request just before that message's end (kvgate's text key ends every message with
/// a newline), which says nothing of other requests.
pub const MIN_WAYS: usize = 3;

type NodeId = u32;
const NONE: NodeId = u32::MAX;

#[derive(Clone, Debug)]
struct Node<K> {
    edge: Vec<K>,
    parent: NodeId,
    children: Vec<(K, NodeId)>,
    tenants: Vec<(EndpointId, Nanos)>,
}

impl<K: Symbol> Node<K> {
    fn child(&self, first: K) -> Option<NodeId> {
        self.children
            .binary_search_by_key(&first, |&(k, _)| k)
            .ok()
            .map(|i| self.children[i].1)
    }

    fn tenant(&self, t: EndpointId) -> Option<Nanos> {
        self.tenants
            .iter()
            .find(|(e, _)| *e == t)
            .map(|&(_, at)| at)
    }
}

/// The tree. See the module documentation.
#[derive(Clone, Debug)]
pub struct RadixTree<K> {
    nodes: Vec<Node<K>>,
    free: Vec<NodeId>,
    roots: HashMap<u64, NodeId>,
    sizes: HashMap<EndpointId, usize>,
    bounds: HashMap<EndpointId, usize>,
    stored: usize,
    max_size: usize,
    /// Endpoints whose entries had to go since they joined, for want of room under their
    /// bound or because usage showed the engine evicted them ([`Self::evict_older`]).
    evicted: BTreeSet<EndpointId>,
}

impl<K: Symbol> RadixTree<K> {
    /// An empty tree bounding each endpoint to `max_size` stored symbols.
    pub fn new(max_size: usize) -> Self {
        RadixTree {
            nodes: Vec::new(),
            free: Vec::new(),
            roots: HashMap::new(),
            sizes: HashMap::new(),
            bounds: HashMap::new(),
            stored: 0,
            max_size: max_size.max(1),
            evicted: BTreeSet::new(),
        }
    }

    /// Symbols stored in the tree (each edge counted once, however many tenants share it).
    pub fn stored(&self) -> usize {
        self.stored
    }

    /// Symbols on `endpoint`'s paths: what its bound applies to.
    pub fn size_of(&self, endpoint: EndpointId) -> usize {
        self.sizes.get(&endpoint).copied().unwrap_or(0)
    }

    /// The per-endpoint bound.
    pub fn max_size(&self) -> usize {
        self.max_size
    }

    /// Approximate heap bytes used, for the memory benchmark.
    pub fn heap_bytes(&self) -> usize {
        let nodes: usize = self
            .nodes
            .iter()
            .map(|n| {
                n.edge.capacity() * size_of::<K>()
                    + n.children.capacity() * size_of::<(K, NodeId)>()
                    + n.tenants.capacity() * size_of::<(EndpointId, Nanos)>()
            })
            .sum();
        nodes
            + self.nodes.capacity() * size_of::<Node<K>>()
            + self.free.capacity() * size_of::<NodeId>()
            + self.roots.capacity() * size_of::<(u64, NodeId)>() * 2
    }

    /// For each endpoint, how many leading symbols of `key` (in `scope`) it holds, sorted by
    /// endpoint. Takes `&self`, so matches may run concurrently under a read lock.
    ///
    /// Presence is prefix-closed, so the tenants of each node on the path are a subset of its
    /// parent's: the first matched node fixes the set and deeper nodes only raise its counts.
    pub fn match_prefix(&self, scope: u64, key: &[K]) -> Vec<(EndpointId, u32)> {
        self.match_touched(scope, key)
            .into_iter()
            .map(|(e, m, _)| (e, m))
            .collect()
    }

    /// [`Self::match_prefix`] with, per endpoint, when its deepest matched node was last sent
    /// there.
    pub fn match_touched(&self, scope: u64, key: &[K]) -> Vec<(EndpointId, u32, Nanos)> {
        self.match_shared(scope, key).0
    }

    /// [`Self::match_touched`], and how many leading symbols of `key` it shares with other
    /// stored keys at the point where the most of them part ways with it (the deeper of
    /// equals): the end of a system prompt that many questions follow, not a conversation's
    /// history, which each turn extends, nor the few branches an agent's fan-out left in it.
    /// The query counts as one way on where it leaves the tree or ends inside it; a stored key
    /// that the query merely extends counts for nothing. A point needs [`MIN_WAYS`]; 0 when
    /// none has them. It says what other prompts begin with, whichever endpoints they were
    /// sent to.
    pub fn match_shared(&self, scope: u64, key: &[K]) -> (Vec<(EndpointId, u32, Nanos)>, u32) {
        let Some(&root) = self.roots.get(&scope) else {
            return (Vec::new(), 0);
        };
        let at = |pos: usize| u32::try_from(pos).unwrap_or(u32::MAX);
        let mut out: Vec<(EndpointId, u32, Nanos)> = Vec::new();
        // The branching point with the most ways on, the deeper of equals: (ways, depth).
        let mut best = (2usize, 0usize);
        let mut branch = |ways: usize, depth: usize| {
            if ways >= MIN_WAYS && (ways, depth) >= best {
                best = (ways, depth);
            }
        };
        let (mut node, mut pos) = (root, 0usize);
        loop {
            let here = &self.nodes[node as usize];
            let ways = here.children.len();
            if pos == key.len() {
                // Stored keys go on past this one: it is one more way on.
                if ways > 0 {
                    branch(ways + 1, pos);
                }
                break;
            }
            let Some(c) = here.child(key[pos]) else {
                if ways > 0 {
                    branch(ways + 1, pos);
                }
                break;
            };
            if pos > 0 {
                branch(ways, pos);
            }
            let edge = &self.nodes[c as usize].edge;
            let common = lcp(edge, &key[pos..]);
            let matched = at(pos + common);
            let first = out.is_empty();
            for &(t, touched) in &self.nodes[c as usize].tenants {
                match out.binary_search_by_key(&t, |&(e, _, _)| e) {
                    Ok(k) => out[k] = (t, matched, touched),
                    Err(k) => {
                        debug_assert!(first, "a deeper node has a tenant its parent lacks");
                        out.insert(k, (t, matched, touched));
                    }
                }
            }
            if common < edge.len() {
                branch(2, pos + common);
                break;
            }
            pos += common;
            node = c;
        }
        (out, at(best.1))
    }

    /// Records that `endpoint` was sent `key` (in `scope`) at `now`, then enforces the bound.
    pub fn insert_key(&mut self, scope: u64, key: &[K], endpoint: EndpointId, now: Nanos) {
        if key.is_empty() {
            return;
        }
        let root = match self.roots.get(&scope) {
            Some(&r) => r,
            None => {
                let r = self.alloc(Vec::new(), NONE);
                self.roots.insert(scope, r);
                r
            }
        };
        let (mut node, mut pos) = (root, 0usize);
        while pos < key.len() {
            match self.nodes[node as usize].child(key[pos]) {
                None => {
                    let leaf = self.alloc(key[pos..].to_vec(), node);
                    self.link(node, leaf);
                    self.touch(leaf, endpoint, now);
                    break;
                }
                Some(mut c) => {
                    let common = lcp(&self.nodes[c as usize].edge, &key[pos..]);
                    if common < self.nodes[c as usize].edge.len() {
                        c = self.split(c, common);
                    }
                    self.touch(c, endpoint, now);
                    pos += common;
                    node = c;
                }
            }
        }
        let bound = self.bound_of(endpoint);
        if self.size_of(endpoint) > bound {
            self.evicted.insert(endpoint);
            self.evict_endpoint_to(endpoint, bound - bound / 10);
        }
    }

    /// Evicts `endpoint`'s least recently used leaves until its size is at most `target`.
    pub fn evict_endpoint_to(&mut self, endpoint: EndpointId, target: usize) {
        self.evict_lru(endpoint, |size, _| size > target);
    }

    /// Forgets everything `endpoint` was last sent at or before `at`: what an LRU cache that
    /// evicted a prefix last used then has evicted too (recency only grows towards the root,
    /// so this removes a suffix of the endpoint's LRU order).
    pub fn evict_older(&mut self, endpoint: EndpointId, at: Nanos) {
        self.evicted.insert(endpoint);
        self.evict_lru(endpoint, |_, oldest| oldest <= at);
    }

    /// Evicts `endpoint`'s least recently used leaves while `go(size, oldest leaf's time)`.
    fn evict_lru(&mut self, endpoint: EndpointId, go: impl Fn(usize, Nanos) -> bool) {
        let mut heap: BinaryHeap<Reverse<(Nanos, NodeId)>> = BinaryHeap::new();
        for (id, node) in self.nodes.iter().enumerate() {
            if node.parent == NONE && node.edge.is_empty() {
                continue;
            }
            if let Some(at) = node.tenant(endpoint) {
                if !self.child_has(id as NodeId, endpoint) {
                    heap.push(Reverse((at, id as NodeId)));
                }
            }
        }
        while let Some(&Reverse((at, id))) = heap.peek() {
            if !go(self.size_of(endpoint), at) {
                break;
            }
            heap.pop();
            let parent = self.nodes[id as usize].parent;
            self.drop_tenant(id, endpoint);
            let p = &self.nodes[parent as usize];
            if p.parent != NONE || !p.edge.is_empty() {
                if let Some(at) = p.tenant(endpoint) {
                    if !self.child_has(parent, endpoint) {
                        heap.push(Reverse((at, parent)));
                    }
                }
            }
        }
    }

    /// Bounds `endpoint`'s stored size to `max` symbols (instead of the tree-wide bound), for
    /// an index that mirrors what each engine's cache can hold; trims at once if over.
    pub fn set_bound(&mut self, endpoint: EndpointId, max: usize) {
        let max = max.max(1);
        self.bounds.insert(endpoint, max);
        if self.size_of(endpoint) > max {
            self.evicted.insert(endpoint);
            self.evict_endpoint_to(endpoint, max - max / 10);
        }
    }

    /// The endpoints whose entries had to go since they joined, in id order.
    pub fn evicted(&self) -> impl Iterator<Item = EndpointId> + '_ {
        self.evicted.iter().copied()
    }

    /// The bound of `endpoint`'s stored size.
    pub fn bound_of(&self, endpoint: EndpointId) -> usize {
        self.bounds.get(&endpoint).copied().unwrap_or(self.max_size)
    }

    fn child_has(&self, id: NodeId, endpoint: EndpointId) -> bool {
        self.nodes[id as usize]
            .children
            .iter()
            .any(|&(_, c)| self.nodes[c as usize].tenant(endpoint).is_some())
    }

    fn drop_tenant(&mut self, id: NodeId, endpoint: EndpointId) {
        let node = &mut self.nodes[id as usize];
        let Some(i) = node.tenants.iter().position(|(e, _)| *e == endpoint) else {
            return;
        };
        node.tenants.swap_remove(i);
        let len = node.edge.len();
        if let Some(size) = self.sizes.get_mut(&endpoint) {
            *size -= len;
            if *size == 0 {
                self.sizes.remove(&endpoint);
            }
        }
        if node.tenants.is_empty() {
            debug_assert!(
                node.children.is_empty(),
                "a tenantless node has tenantless children"
            );
            let first = node.edge[0];
            let parent = node.parent;
            self.stored -= len;
            let siblings = &mut self.nodes[parent as usize].children;
            if let Ok(pos) = siblings.binary_search_by_key(&first, |&(k, _)| k) {
                siblings.remove(pos);
            }
            let node = &mut self.nodes[id as usize];
            node.edge = Vec::new();
            node.children = Vec::new();
            node.tenants = Vec::new();
            node.parent = NONE;
            self.free.push(id);
        }
    }

    fn alloc(&mut self, edge: Vec<K>, parent: NodeId) -> NodeId {
        self.stored += edge.len();
        let node = Node {
            edge,
            parent,
            children: Vec::new(),
            tenants: Vec::new(),
        };
        if let Some(id) = self.free.pop() {
            self.nodes[id as usize] = node;
            id
        } else {
            self.nodes.push(node);
            (self.nodes.len() - 1) as NodeId
        }
    }

    fn link(&mut self, parent: NodeId, child: NodeId) {
        let first = self.nodes[child as usize].edge[0];
        let children = &mut self.nodes[parent as usize].children;
        let at = children.partition_point(|&(k, _)| k < first);
        children.insert(at, (first, child));
    }

    /// Splits `c`'s edge after `at` symbols; returns the new upper node.
    fn split(&mut self, c: NodeId, at: usize) -> NodeId {
        let parent = self.nodes[c as usize].parent;
        let lower_edge = self.nodes[c as usize].edge.split_off(at);
        let upper_edge = std::mem::take(&mut self.nodes[c as usize].edge);
        let tenants = self.nodes[c as usize].tenants.clone();
        let first = upper_edge[0];
        self.stored -= upper_edge.len() + lower_edge.len();
        let upper = self.alloc(upper_edge, parent);
        self.stored += lower_edge.len();
        self.nodes[upper as usize].tenants = tenants;
        self.nodes[upper as usize].children = vec![(lower_edge[0], c)];
        let node = &mut self.nodes[c as usize];
        node.edge = lower_edge;
        node.parent = upper;
        let siblings = &mut self.nodes[parent as usize].children;
        if let Ok(pos) = siblings.binary_search_by_key(&first, |&(k, _)| k) {
            siblings[pos].1 = upper;
        }
        upper
    }

    fn touch(&mut self, id: NodeId, endpoint: EndpointId, now: Nanos) {
        let node = &mut self.nodes[id as usize];
        match node.tenants.iter_mut().find(|(e, _)| *e == endpoint) {
            Some(entry) => entry.1 = entry.1.max(now),
            None => {
                node.tenants.push((endpoint, now));
                *self.sizes.entry(endpoint).or_insert(0) += node.edge.len();
            }
        }
    }
}

/// Leading symbols `a` and `b` share, compared 64 at a time first (slice equality of bytes and
/// integers is a `memcmp`): a long conversation's walk is mostly one long edge.
fn lcp<K: PartialEq>(a: &[K], b: &[K]) -> usize {
    const CHUNK: usize = 64;
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + CHUNK <= n && a[i..i + CHUNK] == b[i..i + CHUNK] {
        i += CHUNK;
    }
    i + a[i..n]
        .iter()
        .zip(&b[i..n])
        .take_while(|(x, y)| x == y)
        .count()
}

impl<K: Symbol> PrefixIndex for RadixTree<K> {
    fn overlaps(&self, key: &PrefixKey<'_>, _now: Nanos) -> Overlaps {
        let Some(symbols) = K::of(key) else {
            return Overlaps::default();
        };
        let (matched, shared) = self.match_shared(key.scope, symbols);
        let endpoints = matched
            .into_iter()
            .map(|(endpoint, device, touched)| Overlap {
                endpoint,
                device,
                host: 0,
                disk: 0,
                touched,
                pending: 0,
            })
            .collect();
        Overlaps {
            total: u32::try_from(symbols.len()).unwrap_or(u32::MAX),
            unit: K::UNIT,
            endpoints,
            shared,
            evicted: !self.evicted.is_empty(),
            block_hashes: Vec::new(),
            engine: Vec::new(),
            tail: Default::default(),
        }
    }

    fn insert(&mut self, key: &PrefixKey<'_>, endpoint: EndpointId, now: Nanos) {
        if let Some(symbols) = K::of(key) {
            self.insert_key(key.scope, symbols, endpoint, now);
        }
    }

    fn remove_endpoint(&mut self, endpoint: EndpointId) {
        self.evict_endpoint_to(endpoint, 0);
        self.bounds.remove(&endpoint);
        self.evicted.remove(&endpoint);
    }

    fn evict(&mut self, _now: Nanos) {
        let over: Vec<(EndpointId, usize)> = self
            .sizes
            .iter()
            .map(|(&e, &s)| (e, s, self.bound_of(e)))
            .filter(|&(_, s, bound)| s > bound)
            .map(|(e, _, bound)| (e, bound))
            .collect();
        for (e, bound) in over {
            self.evicted.insert(e);
            self.evict_endpoint_to(e, bound);
        }
    }
}

#[cfg(test)]
mod tests;
