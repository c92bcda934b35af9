use super::*;
use crate::Nanos;
use proptest::prelude::*;

fn limits() -> Limits {
    Limits {
        ttl: Nanos::from_secs(60),
        max_entries: 100,
        max_bytes: 1 << 20,
        threshold: 0.9,
        guards: Guards::default(),
    }
}

fn key(scope: &str, fp: u8, message: &str) -> Key {
    Key {
        scope: scope.to_string(),
        fingerprint: Fingerprint([fp; 32]),
        message: message.to_string(),
    }
}

fn unit(v: &[f32]) -> Vec<f32> {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.iter().map(|x| x / norm).collect()
}

#[test]
fn clear_drops_one_scope_or_all_and_their_bytes() {
    let mut store = Store::new(limits());
    let now = Nanos::ZERO;
    store.insert(key("t1", 1, "a"), None, ("A", 10), now, None);
    store.insert(key("t1", 2, "b"), None, ("B", 20), now, None);
    store.insert(key("t2", 1, "a"), None, ("C", 30), now, None);
    assert_eq!(store.clear(Some("t1")), 2);
    assert_eq!(
        (store.len(), store.bytes()),
        (1, 30 + "a".len() + "t2".len())
    );
    assert_eq!(store.exact(&key("t1", 1, "a"), now), None);
    assert_eq!(store.exact(&key("t2", 1, "a"), now), Some("C"));
    assert_eq!(store.clear(Some("t1")), 0);
    assert_eq!(store.clear(None), 1);
    assert!(store.is_empty());
    assert_eq!(store.bytes(), 0);
}

#[test]
fn exact_then_similar_within_scope_and_fingerprint() {
    let mut store = Store::new(limits());
    let now = Nanos::ZERO;
    let k = key("t1", 1, "What is the capital of France?");
    store.insert(k.clone(), Some(unit(&[1.0, 0.0])), ("Paris", 5), now, None);
    assert_eq!(store.exact(&k, now), Some("Paris"));
    let asked = key("t1", 1, "Tell me the capital of France");
    let found = store.similar(&asked, &unit(&[1.0, 0.1]), now);
    let hit = found.hit.expect("a close paraphrase");
    assert_eq!(hit.answer, "Paris");
    assert!(hit.similarity > 0.99);
    assert!(store.similar(&asked, &unit(&[0.0, 1.0]), now).hit.is_none());
    let other_fp = key("t1", 2, "Tell me the capital of France");
    assert!(store
        .similar(&other_fp, &unit(&[1.0, 0.1]), now)
        .hit
        .is_none());
}

#[test]
fn guards_stop_close_vectors_with_different_meaning() {
    let mut store = Store::new(limits());
    let v = unit(&[1.0, 1.0]);
    store.insert(
        key("t", 1, "5 km to miles"),
        Some(v.clone()),
        ("3.1", 3),
        Nanos::ZERO,
        None,
    );
    let found = store.similar(&key("t", 1, "5 miles to km"), &v, Nanos::ZERO);
    assert!(found.hit.is_none());
    assert_eq!(found.stopped, vec![Guard::Order]);
}

#[test]
fn entries_expire_on_the_given_clock() {
    let mut store = Store::new(limits());
    let k = key("t", 1, "hi");
    store.insert(k.clone(), None, ("a", 1), Nanos::from_secs(10), None);
    assert_eq!(store.exact(&k, Nanos::from_secs(69)), Some("a"));
    assert_eq!(store.exact(&k, Nanos::from_secs(70)), None);
    assert!(store.is_empty());
    // A peer's shorter remaining life wins over the local time to live.
    store.insert(
        k.clone(),
        None,
        ("b", 1),
        Nanos::ZERO,
        Some(Nanos::from_secs(5)),
    );
    assert_eq!(store.expire(Nanos::from_secs(4)), 0);
    assert_eq!(store.expire(Nanos::from_secs(5)), 1);
    assert_eq!(store.bytes(), 0);
}

#[test]
fn least_recently_used_goes_first_by_entries_and_bytes() {
    let mut store = Store::new(Limits {
        max_entries: 2,
        ..limits()
    });
    let (a, b, c) = (key("t", 1, "a"), key("t", 1, "b"), key("t", 1, "c"));
    store.insert(a.clone(), None, ("A", 1), Nanos::ZERO, None);
    store.insert(b.clone(), None, ("B", 1), Nanos::ZERO, None);
    assert!(
        store.exact(&a, Nanos::ZERO).is_some(),
        "a is now the most recent"
    );
    assert_eq!(
        store.insert(c.clone(), None, ("C", 1), Nanos::ZERO, None),
        1
    );
    assert!(
        store.exact(&b, Nanos::ZERO).is_none(),
        "b was least recently used"
    );
    assert!(store.exact(&a, Nanos::ZERO).is_some());

    // Each entry weighs 10 + 1 (message) + 1 (scope) bytes: two fit in 30.
    let mut store = Store::new(Limits {
        max_bytes: 30,
        ..limits()
    });
    store.insert(a.clone(), None, ("A", 10), Nanos::ZERO, None);
    store.insert(b.clone(), None, ("B", 10), Nanos::ZERO, None);
    assert_eq!(
        store.insert(c.clone(), None, ("C", 10), Nanos::ZERO, None),
        1
    );
    assert_eq!(store.len(), 2);
    assert!(store.bytes() <= 30);
    assert_eq!(
        store.insert(key("t", 1, "d"), None, ("D", 40), Nanos::ZERO, None),
        0
    );
    assert_eq!(
        store.len(),
        2,
        "an entry over the whole bound is not stored"
    );
}

proptest! {
    /// Whatever is stored, a lookup in one scope only ever returns that scope's answers,
    /// exact or similar.
    #[test]
    fn a_scope_never_sees_another_scopes_answers(
        inserts in prop::collection::vec((0u8..3, 0u8..2, 0u8..4, -1.0f32..1.0), 1..40),
        asks in prop::collection::vec((0u8..3, 0u8..2, 0u8..4, -1.0f32..1.0), 1..40),
    ) {
        let mut store = Store::new(Limits { threshold: -1.0, max_entries: 16, ..limits() });
        let words = ["one", "two", "three", "four"];
        for (i, (scope, fp, word, x)) in inserts.iter().enumerate() {
            let k = key(&format!("s{scope}"), *fp, words[*word as usize]);
            let answer = format!("s{scope}");
            store.insert(k, Some(unit(&[*x, 0.5])), (answer, 2), Nanos(i as u64), None);
        }
        for (scope, fp, word, x) in asks {
            let k = key(&format!("s{scope}"), fp, words[word as usize]);
            if let Some(a) = store.exact(&k, Nanos(100)) {
                prop_assert_eq!(&a, &k.scope);
            }
            if let Some(hit) = store.similar(&k, &unit(&[x, 0.5]), Nanos(100)).hit {
                prop_assert_eq!(&hit.answer, &k.scope);
            }
        }
    }
}
