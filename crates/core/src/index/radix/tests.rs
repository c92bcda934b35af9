use super::*;
use proptest::prelude::*;

fn naive(inserted: &[(u32, Vec<u8>)], key: &[u8]) -> Vec<(EndpointId, u32)> {
    let mut best: HashMap<u32, u32> = HashMap::new();
    for (t, s) in inserted {
        let l = lcp(s, key) as u32;
        if l > 0 {
            let e = best.entry(*t).or_insert(0);
            *e = (*e).max(l);
        }
    }
    let mut v: Vec<_> = best.into_iter().map(|(t, l)| (EndpointId(t), l)).collect();
    v.sort();
    v
}

fn strings() -> impl Strategy<Value = Vec<(u32, Vec<u8>)>> {
    prop::collection::vec((0u32..4, prop::collection::vec(b'a'..b'd', 1..24)), 1..40)
}

proptest! {
    /// Without eviction the tree reports exactly the longest common prefix with what each
    /// endpoint was sent.
    #[test]
    fn match_equals_naive_longest_common_prefix(inserted in strings(), queries in prop::collection::vec(prop::collection::vec(b'a'..b'd', 0..24), 1..10)) {
        let mut tree = RadixTree::<u8>::new(usize::MAX);
        for (i, (t, s)) in inserted.iter().enumerate() {
            tree.insert_key(1, s, EndpointId(*t), Nanos(i as u64));
        }
        for q in &queries {
            prop_assert_eq!(tree.match_prefix(1, q), naive(&inserted, q));
        }
        prop_assert!(tree.match_prefix(2, &queries[0]).is_empty(), "scopes are separate");
    }

    /// With a bound, every endpoint stays within it, the tree never claims more than was sent,
    /// and what it claims is exactly what survived: the naive scan over the strings that are
    /// still fully present.
    #[test]
    fn bounded_tree_stays_bounded_and_never_over_reports(inserted in strings(), bound in 4usize..60) {
        let mut tree = RadixTree::<u8>::new(bound);
        for (i, (t, s)) in inserted.iter().enumerate() {
            tree.insert_key(0, s, EndpointId(*t), Nanos(i as u64));
            for e in 0..4 {
                prop_assert!(tree.size_of(EndpointId(e)) <= bound);
            }
            let edges: usize = tree.nodes.iter().map(|n| n.edge.len()).sum();
            prop_assert_eq!(edges, tree.stored());
            let sizes: usize = (0..4).map(|e| tree.size_of(EndpointId(e))).sum();
            prop_assert!(tree.stored() <= sizes);
        }
        for (_, q) in &inserted {
            let got = tree.match_prefix(0, q);
            let limit = naive(&inserted, q);
            for (e, m) in got {
                let l = limit.iter().find(|(x, _)| *x == e).map_or(0, |&(_, l)| l);
                prop_assert!(m <= l, "{e} claims {m} > {l}");
            }
        }
    }

    /// Strings that share no first symbol are evicted whole, least recently used first.
    #[test]
    fn eviction_removes_the_least_recently_used(lens in prop::collection::vec(1usize..20, 2..30), bound in 20usize..80) {
        let mut tree = RadixTree::<u32>::new(bound);
        let e = EndpointId(0);
        let keys: Vec<Vec<u32>> = lens.iter().enumerate()
            .map(|(i, &n)| (0..n as u32).map(|k| (i as u32) << 16 | k).collect())
            .collect();
        for (i, k) in keys.iter().enumerate() {
            tree.insert_key(0, k, e, Nanos(i as u64));
        }
        // Touch an old key again: it becomes the most recent.
        tree.insert_key(0, &keys[0], e, Nanos(1_000));
        let mut order: Vec<usize> = (1..keys.len()).collect();
        order.push(0);
        let present: Vec<bool> = order.iter()
            .map(|&i| tree.match_prefix(0, &keys[i]).first().map(|&(_, m)| m as usize) == Some(keys[i].len()))
            .collect();
        // Survivors form a suffix of the recency order.
        if let Some(first) = present.iter().position(|&p| p) {
            prop_assert!(present[first..].iter().all(|&p| p), "{present:?}");
        }
        prop_assert!(tree.size_of(e) <= bound);
    }
}

#[test]
fn split_and_branch_report_partial_matches() {
    let mut tree = RadixTree::<u8>::new(1 << 20);
    tree.insert_key(0, b"hello world", EndpointId(0), Nanos(1));
    tree.insert_key(0, b"hello there", EndpointId(1), Nanos(2));
    assert_eq!(
        tree.match_prefix(0, b"hello wonder"),
        vec![(EndpointId(0), 8), (EndpointId(1), 6)]
    );
    assert_eq!(tree.stored(), "hello world".len() + "there".len());
    tree.remove_endpoint(EndpointId(0));
    assert_eq!(
        tree.match_prefix(0, b"hello world"),
        vec![(EndpointId(1), 6)]
    );
    assert_eq!(tree.stored(), "hello there".len());
}

#[test]
fn evicting_older_entries_drops_an_lru_suffix_and_keeps_shared_recent_prefixes() {
    let mut tree = RadixTree::<u8>::new(usize::MAX);
    let e = EndpointId(0);
    tree.insert_key(0, b"system prompt: old question", e, Nanos(1));
    tree.insert_key(0, b"system prompt: new question", e, Nanos(5));
    tree.insert_key(0, b"other tenant text", e, Nanos(2));
    tree.insert_key(0, b"system prompt: old question", EndpointId(1), Nanos(1));
    tree.evict_older(e, Nanos(2));
    // The shared head was refreshed at 5 by the newer prompt and stays; the old branch and
    // the other text (last used at 1 and 2) are gone, for endpoint 0 only.
    assert_eq!(
        tree.match_prefix(0, b"system prompt: old question"),
        vec![(e, 15), (EndpointId(1), 27)]
    );
    assert!(tree.match_prefix(0, b"other tenant text").is_empty());
    assert_eq!(
        tree.match_prefix(0, b"system prompt: new question"),
        vec![(e, 27), (EndpointId(1), 15)]
    );
    tree.set_bound(e, 10);
    assert!(tree.size_of(e) <= 10);
    assert_eq!(tree.bound_of(e), 10);
}
