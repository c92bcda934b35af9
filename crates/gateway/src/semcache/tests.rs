use super::*;
use crate::semcache::answer::Unstored;
use serde_json::json;

fn cache(config: SemanticCacheConfig) -> Arc<SemCache> {
    let client = crate::upstream::client(&[]).unwrap();
    let metrics = Arc::new(SemCacheMetrics::default());
    Arc::new(SemCache::new(&config, client, metrics, Clock::manual()).unwrap())
}

fn enabled() -> SemanticCacheConfig {
    SemanticCacheConfig {
        enabled: true,
        ..Default::default()
    }
}

fn body(question: &str) -> Vec<u8> {
    json!({"model": "m", "messages": [{"role": "user", "content": question}]})
        .to_string()
        .into_bytes()
}

fn answer() -> Answer {
    Answer {
        sse: false,
        body: Bytes::from_static(br#"{"choices":[{"finish_reason":"stop"}]}"#),
    }
}

use bytes::Bytes;

async fn look(c: &Arc<SemCache>, b: &[u8], scope: &str, controls: Controls) -> Lookup {
    c.lookup((Api::Chat, b, false), scope.into(), controls)
        .await
}

#[tokio::test]
async fn a_stored_answer_is_served_to_its_scope_only() {
    let c = cache(enabled());
    let q = body("hello");
    let Lookup::Miss(miss) = look(&c, &q, "a", Controls::default()).await else {
        panic!("empty cache")
    };
    miss.complete(Ok(answer()));
    assert!(matches!(
        look(&c, &q, "a", Controls::default()).await,
        Lookup::Hit {
            similarity: None,
            ..
        }
    ));
    assert!(matches!(
        look(&c, &q, "b", Controls::default()).await,
        Lookup::Miss(_)
    ));
}

#[tokio::test]
async fn controls_and_temperature_steer_the_cache() {
    let c = cache(enabled());
    let q = body("hello");
    let no_store = Controls {
        no_store: true,
        ..Default::default()
    };
    let Lookup::Miss(miss) = look(&c, &q, "a", no_store).await else {
        panic!("a miss")
    };
    assert!(!miss.stores());
    drop(miss);
    let Lookup::Miss(miss) = look(&c, &q, "a", Controls::default()).await else {
        panic!("still a miss")
    };
    miss.complete(Ok(answer()));
    let no_cache = Controls {
        no_cache: true,
        ..Default::default()
    };
    assert!(matches!(look(&c, &q, "a", no_cache).await, Lookup::Miss(_)));
    let both = Controls {
        no_cache: true,
        no_store: true,
    };
    assert!(matches!(
        look(&c, &q, "a", both).await,
        Lookup::Bypass("client")
    ));
    let hot = json!({"model": "m", "temperature": 1.5, "messages": [{"role": "user", "content": "hello"}]});
    assert!(matches!(
        look(&c, hot.to_string().as_bytes(), "a", Controls::default()).await,
        Lookup::Bypass("temperature")
    ));
}

#[tokio::test]
async fn incomplete_answers_release_their_flight_unstored() {
    let c = cache(enabled());
    let q = body("hello");
    let Lookup::Miss(miss) = look(&c, &q, "a", Controls::default()).await else {
        panic!("a miss")
    };
    assert_eq!(c.flights.len(), 1);
    miss.complete(Err(Unstored::Incomplete));
    assert_eq!(c.flights.len(), 0);
    assert!(matches!(
        look(&c, &q, "a", Controls::default()).await,
        Lookup::Miss(_)
    ));
}

#[test]
fn controls_read_both_headers() {
    let mut h = HeaderMap::new();
    h.insert("cache-control", "max-age=0, no-store".parse().unwrap());
    assert_eq!(
        Controls::of(&h),
        Controls {
            no_cache: false,
            no_store: true
        }
    );
    h.insert(CONTROL_HEADER, "bypass".parse().unwrap());
    assert_eq!(
        Controls::of(&h),
        Controls {
            no_cache: true,
            no_store: true
        }
    );
}

#[test]
fn fingerprints_survive_hex() {
    let f = Fingerprint([0xab; 32]);
    assert_eq!(parse_hex(&hex(&f)), Some(f));
    assert_eq!(parse_hex("zz"), None);
}

#[tokio::test]
async fn entries_expire_on_the_gateways_clock() {
    let c = cache(SemanticCacheConfig {
        ttl_secs: 60,
        ..enabled()
    });
    let q = body("hello");
    let Lookup::Miss(miss) = look(&c, &q, "a", Controls::default()).await else {
        panic!("a miss")
    };
    miss.complete(Ok(answer()));
    c.clock.advance(Duration::from_secs(59));
    assert!(matches!(
        look(&c, &q, "a", Controls::default()).await,
        Lookup::Hit { .. }
    ));
    c.clock.advance(Duration::from_secs(1));
    assert!(matches!(
        look(&c, &q, "a", Controls::default()).await,
        Lookup::Miss(_)
    ));
}

#[tokio::test]
async fn a_peers_entry_is_applied_in_its_own_scope_for_what_is_left_of_its_life() {
    let c = cache(enabled());
    let q = body("hello");
    let k = key::of(Api::Chat, &q, false).unwrap();
    c.apply_peer(SharedEntry {
        scope: "a".into(),
        fingerprint: hex(&k.fingerprint),
        message: k.message.clone(),
        embedding: None,
        sse: false,
        body: r#"{"choices":[{"finish_reason":"stop"}]}"#.into(),
        ttl_left_ms: 1_000,
    });
    assert!(matches!(
        look(&c, &q, "b", Controls::default()).await,
        Lookup::Miss(_)
    ));
    assert!(matches!(
        look(&c, &q, "a", Controls::default()).await,
        Lookup::Hit { .. }
    ));
    c.clock.advance(Duration::from_secs(1));
    assert!(matches!(
        look(&c, &q, "a", Controls::default()).await,
        Lookup::Miss(_)
    ));
    let bad = SharedEntry {
        scope: "a".into(),
        fingerprint: "not hex".into(),
        message: String::new(),
        embedding: None,
        sse: false,
        body: String::new(),
        ttl_left_ms: 1_000,
    };
    c.apply_peer(bad);
    let rejected = c
        .metrics
        .peer_entries
        .get_or_create(&crate::metrics::ReasonLabel { reason: "rejected" })
        .get();
    assert_eq!(rejected, 1);
}

#[tokio::test]
async fn a_recorded_body_is_stored_once_whole_and_not_when_dropped_early() {
    use http_body_util::BodyExt;
    let c = cache(enabled());
    let q = body("hello");
    let Lookup::Miss(miss) = look(&c, &q, "a", Controls::default()).await else {
        panic!("a miss")
    };
    let stream = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n";
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<http_body::Frame<Bytes>, axum::Error>>(4);
    let inner = axum::body::Body::new(http_body_util::StreamBody::new(tokio_stream_from(rx)));
    let mut recorded = axum::body::Body::new(Recording::new(inner, true, miss));
    tx.send(Ok(http_body::Frame::data(Bytes::from(stream))))
        .await
        .unwrap();
    let frame = recorded.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), stream.as_bytes());
    // Stored at [DONE], before the upstream body ends.
    let Lookup::Hit { answer, .. } = look(&c, &q, "a", Controls::default()).await else {
        panic!("stored at [DONE]")
    };
    assert!(answer.sse);
    assert_eq!(answer.body, stream.as_bytes());

    let other = body("bye");
    let Lookup::Miss(miss) = look(&c, &other, "a", Controls::default()).await else {
        panic!("a miss")
    };
    let half = axum::body::Body::from(&stream[..20]);
    drop(Recording::new(half, true, miss));
    assert!(matches!(
        look(&c, &other, "a", Controls::default()).await,
        Lookup::Miss(_)
    ));
}

/// The receiver as a stream of frames.
fn tokio_stream_from<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures_util::Stream<Item = T> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
