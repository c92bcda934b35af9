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

/// The definition of [`RadixTree::match_shared`]'s count, by brute force: at each depth `p`
/// of the query, the distinct ways on among stored keys that begin with its first `p`
/// symbols, the query's own way (or its end) included; the depth with the most, the deeper
/// of equals, when there are at least [`MIN_WAYS`].
fn naive_shared(keys: &[Vec<u8>], q: &[u8]) -> u32 {
    let mut best = (2usize, 0usize);
    for p in 1..=q.len() {
        let along: Vec<&Vec<u8>> = keys
            .iter()
            .filter(|s| s.len() >= p && s[..p] == q[..p])
            .collect();
        if along.is_empty() {
            break;
        }
        let mut ways: std::collections::BTreeSet<Option<u8>> = along
            .iter()
            .filter(|s| s.len() > p)
            .map(|s| Some(s[p]))
            .collect();
        ways.insert(q.get(p).copied());
        if ways.len() >= MIN_WAYS && (ways.len(), p) >= best {
            best = (ways.len(), p);
        }
    }
    best.1 as u32
}

proptest! {
    /// The tree's shared count is the brute-force one, whichever endpoints the keys went to.
    #[test]
    fn shared_equals_the_most_branched_point(inserted in strings(), queries in prop::collection::vec(prop::collection::vec(b'a'..b'd', 0..24), 1..10)) {
        let mut tree = RadixTree::<u8>::new(usize::MAX);
        for (i, (t, s)) in inserted.iter().enumerate() {
            tree.insert_key(1, s, EndpointId(*t), Nanos(i as u64));
        }
        let keys: Vec<Vec<u8>> = inserted.iter().map(|(_, s)| s.clone()).collect();
        for q in queries.iter().chain(keys.iter()) {
            let (matched, shared) = tree.match_shared(1, q);
            prop_assert_eq!(shared, naive_shared(&keys, q), "query {:?}", q);
            let plain: Vec<(EndpointId, u32)> = matched.into_iter().map(|(e, m, _)| (e, m)).collect();
            prop_assert_eq!(plain, tree.match_prefix(1, q));
        }
    }
}

#[test]
fn a_system_prompt_many_questions_follow_is_shared_and_a_conversation_is_not() {
    let mut tree = RadixTree::<u8>::new(1 << 20);
    let system = "You are a helpful assistant. ";
    for (i, q) in ["apples?", "bananas?", "cherries?"].iter().enumerate() {
        tree.insert_key(
            0,
            format!("{system}{q}").as_bytes(),
            EndpointId(i as u32 % 2),
            Nanos(1),
        );
    }
    let (_, shared) = tree.match_shared(0, format!("{system}dates?").as_bytes());
    assert_eq!(shared as usize, system.len());
    // "bread?" parts ways with "bananas?" one byte deeper: two ways there against three at
    // the end of the system prompt.
    let (_, shared) = tree.match_shared(0, format!("{system}bread?").as_bytes());
    assert_eq!(shared as usize, system.len());
    // A conversation's next turn extends its last one: nothing beyond the system prompt is
    // shared, however long the history.
    let turn1 = format!("{system}apples?");
    let turn2 = format!("{turn1} A language. <user> and cargo?");
    tree.insert_key(0, turn2.as_bytes(), EndpointId(0), Nanos(2));
    let turn3 = format!("{turn2} A build tool. <user> thanks");
    let (matched, shared) = tree.match_shared(0, turn3.as_bytes());
    assert_eq!(matched[0], (EndpointId(0), turn2.len() as u32, Nanos(2)));
    assert_eq!(shared as usize, system.len());
    // A client extending its own last message parts ways with its previous request there:
    // two ways, not a prefix other requests share.
    let (_, shared) = tree.match_shared(0, format!("{system}apples? and pears").as_bytes());
    assert_eq!(shared as usize, system.len());
    assert_eq!(tree.match_shared(0, b"unrelated").1, 0);
}

#[test]
fn an_endpoint_that_had_to_evict_is_listed_until_it_leaves() {
    let mut tree = RadixTree::<u8>::new(16);
    let key = |text: &'static [u8]| PrefixKey {
        adapter: None,
        scope: 0,
        text: Some(text),
        tokens: None,
    };
    tree.insert_key(0, b"0123456789", EndpointId(0), Nanos(1));
    tree.insert_key(0, b"abcdef", EndpointId(1), Nanos(1));
    let listed = |tree: &RadixTree<u8>| tree.evicted().collect::<Vec<_>>();
    assert!(!tree.overlaps(&key(b"0123"), Nanos(2)).evicted);
    assert_eq!(listed(&tree), []);
    // Past the bound: endpoint 0's cache has no room left.
    tree.insert_key(0, b"ABCDEFGHIJ", EndpointId(0), Nanos(3));
    assert!(tree.overlaps(&key(b"0123"), Nanos(4)).evicted);
    assert_eq!(listed(&tree), [EndpointId(0)]);
    // A miss the engine reported is an eviction too.
    tree.evict_older(EndpointId(1), Nanos(1));
    assert!(tree.overlaps(&key(b"0123"), Nanos(5)).evicted);
    assert_eq!(listed(&tree), [EndpointId(0), EndpointId(1)]);
    tree.remove_endpoint(EndpointId(0));
    assert!(tree.overlaps(&key(b"0123"), Nanos(6)).evicted);
    assert_eq!(listed(&tree), [EndpointId(1)]);
    tree.remove_endpoint(EndpointId(1));
    assert!(!tree.overlaps(&key(b"0123"), Nanos(7)).evicted);
}

/// Matches of long keys end where they part, on either side of the 64-symbol comparisons.
#[test]
fn long_keys_match_to_the_symbol() {
    let base: Vec<u32> = (0..300).collect();
    let mut tree = RadixTree::<u32>::new(usize::MAX);
    tree.insert_key(0, &base, EndpointId(1), Nanos(1));
    for part in [0, 1, 63, 64, 65, 127, 128, 200, 299] {
        let mut query = base.clone();
        query[part] = 9999;
        assert_eq!(
            tree.match_prefix(0, &query),
            if part == 0 {
                vec![]
            } else {
                vec![(EndpointId(1), part as u32)]
            },
            "parting at {part}"
        );
    }
    assert_eq!(
        tree.match_prefix(0, &base[..130]),
        vec![(EndpointId(1), 130)]
    );
}
