//! KV events over ZMQ: a subscriber binds (as a router would), the engine connects, and the
//! stored and removed blocks match the requests sent; the wire schema matches the capture from
//! a real vLLM (test-data/vllm/kv-events.bin).

// Each test walks one scenario end to end; splitting it would scatter the story.
#![allow(clippy::too_many_lines)]

mod common;

use common::*;
use kvgate_engine::EngineConfig;
use rmpv::Value as Mp;
use serde_json::json;
use std::time::Duration;
use zeromq::{Socket, SocketRecv};

const BLOCK: usize = 16;

struct Batch {
    topic: Vec<u8>,
    seq: u64,
    payload: Mp,
}

fn decode(frames: Vec<bytes::Bytes>) -> Batch {
    assert_eq!(frames.len(), 3, "[topic, seq, payload]");
    let seq = u64::from_be_bytes(frames[1].as_ref().try_into().expect("8-byte sequence"));
    let payload = rmpv::decode::read_value(&mut frames[2].as_ref()).unwrap();
    Batch {
        topic: frames[0].to_vec(),
        seq,
        payload,
    }
}

fn field<'a>(event: &'a Mp, key: &str) -> &'a Mp {
    event
        .as_map()
        .unwrap()
        .iter()
        .find(|(k, _)| k.as_str() == Some(key))
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no {key} in {event}"))
}

fn events(batch: &Batch) -> &[Mp] {
    batch.payload.as_array().unwrap()[1].as_array().unwrap()
}

async fn subscriber() -> (zeromq::SubSocket, String) {
    let mut socket = zeromq::SubSocket::new();
    let endpoint = socket.bind("tcp://127.0.0.1:0").await.unwrap();
    socket.subscribe("").await.unwrap();
    let port = match endpoint {
        zeromq::Endpoint::Tcp(_, port) => port,
        other => panic!("{other:?}"),
    };
    (socket, format!("tcp://127.0.0.1:{port}"))
}

async fn next_batch(socket: &mut zeromq::SubSocket) -> Option<Batch> {
    match tokio::time::timeout(Duration::from_millis(500), socket.recv()).await {
        Ok(message) => Some(decode(message.unwrap().into_vec())),
        Err(_) => None,
    }
}

/// Sends warm-up requests until the first batch arrives (a PUB drops what it publishes before
/// the subscription reaches it), then drains what is left of the warm-up.
async fn connect(engine: &TestEngine, socket: &mut zeromq::SubSocket) -> u64 {
    for i in 0..100 {
        let prompt: Vec<u32> = (0..BLOCK as u32).map(|t| 50_000 + i * 100 + t).collect();
        engine
            .post(
                "/v1/completions",
                json!({"prompt": prompt, "max_tokens": 1}),
            )
            .await
            .text()
            .await
            .unwrap();
        if let Some(mut batch) = next_batch(socket).await {
            while let Some(more) = next_batch(socket).await {
                batch = more;
            }
            return batch.seq;
        }
    }
    panic!("no KV event batch arrived");
}

fn prompt(tag: u32, blocks: usize) -> Vec<u32> {
    (0..(blocks * BLOCK + 5) as u32)
        .map(|i| tag * 10_000 + i)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_and_removed_blocks_match_the_requests() {
    let (mut socket, endpoint) = subscriber().await;
    // 24 blocks: three 8-block prompts fill the pool, so later ones evict earlier blocks.
    let config = EngineConfig {
        kv_events: Some(endpoint),
        kv_blocks: 24,
        max_model_len: 256,
        ..fast_config()
    };
    let engine = start(config).await;
    let mut last_seq = connect(&engine, &mut socket).await;

    let first = prompt(1, 5);
    engine
        .post("/v1/completions", json!({"prompt": first, "max_tokens": 2}))
        .await
        .text()
        .await
        .unwrap();
    let batch = next_batch(&mut socket)
        .await
        .expect("a batch for the first prompt");
    assert_eq!(batch.topic, b"kv-events");
    assert_eq!(batch.seq, last_seq + 1, "sequence numbers count batches");
    last_seq = batch.seq;
    let stored: Vec<&Mp> = events(&batch)
        .iter()
        .filter(|e| field(e, "type").as_str() == Some("BlockStored"))
        .collect();
    let tokens: Vec<u64> = stored
        .iter()
        .flat_map(|e| {
            field(e, "token_ids")
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap())
        })
        .collect();
    let expected: Vec<u64> = first[..5 * BLOCK].iter().map(|&t| u64::from(t)).collect();
    assert_eq!(tokens, expected, "the prompt's five full blocks, in order");
    let hashes: Vec<u64> = stored
        .iter()
        .flat_map(|e| {
            field(e, "block_hashes")
                .as_array()
                .unwrap()
                .iter()
                .map(|h| h.as_u64().unwrap())
        })
        .collect();
    assert_eq!(hashes.len(), 5);
    assert!(
        field(stored[0], "parent_block_hash").is_nil(),
        "the first block has no parent"
    );
    assert_eq!(field(stored[0], "block_size").as_u64(), Some(BLOCK as u64));

    // The same prompt again stores nothing new (all five blocks are cache hits).
    engine
        .post("/v1/completions", json!({"prompt": first, "max_tokens": 2}))
        .await
        .text()
        .await
        .unwrap();
    // Fill the pool with other prompts until the first prompt's blocks are evicted.
    let mut removed = Vec::new();
    let mut removed_event = None;
    for tag in 2..12 {
        engine
            .post(
                "/v1/completions",
                json!({"prompt": prompt(tag, 8), "max_tokens": 2}),
            )
            .await
            .text()
            .await
            .unwrap();
        while let Some(batch) = next_batch(&mut socket).await {
            assert_eq!(batch.seq, last_seq + 1);
            last_seq = batch.seq;
            for event in events(&batch) {
                let kind = field(event, "type").as_str().unwrap();
                if kind == "BlockStored" {
                    let ids = field(event, "token_ids").as_array().unwrap();
                    assert_ne!(
                        ids[0].as_u64(),
                        Some(u64::from(first[0])),
                        "the repeated prompt was a cache hit"
                    );
                }
                if kind == "BlockRemoved" {
                    removed_event.get_or_insert_with(|| event.clone());
                    removed.extend(
                        field(event, "block_hashes")
                            .as_array()
                            .unwrap()
                            .iter()
                            .map(|h| h.as_u64().unwrap()),
                    );
                }
            }
        }
        if hashes.iter().all(|h| removed.contains(h)) {
            break;
        }
    }
    assert!(
        hashes.iter().all(|h| removed.contains(h)),
        "every block of the first prompt was evicted"
    );
    let keys = |e: &Mp| -> std::collections::BTreeSet<String> {
        schema(e).into_iter().map(|(k, _)| k).collect()
    };
    assert_eq!(
        keys(removed_event.as_ref().unwrap()),
        fixture_keys("BlockRemoved")
    );
    assert_eq!(keys(stored[0]), fixture_keys("BlockStored"));
}

/// The kinds of the values in an event map, in key order.
fn schema(event: &Mp) -> Vec<(String, &'static str)> {
    event
        .as_map()
        .unwrap()
        .iter()
        .map(|(k, v)| {
            let kind = match v {
                Mp::Nil => "nil",
                Mp::Integer(_) => "int",
                Mp::F64(_) | Mp::F32(_) => "float",
                Mp::String(_) => "str",
                Mp::Array(_) => "array",
                Mp::Map(_) => "map",
                _ => "other",
            };
            (k.as_str().unwrap().to_owned(), kind)
        })
        .collect()
}

fn fixture_messages() -> Vec<Vec<bytes::Bytes>> {
    let path = format!(
        "{}/../../test-data/vllm/kv-events.bin",
        env!("CARGO_MANIFEST_DIR")
    );
    let data = std::fs::read(path).unwrap();
    let mut messages = Vec::new();
    let mut at = 0;
    let read_u32 = |at: &mut usize| {
        let n = u32::from_be_bytes(data[*at..*at + 4].try_into().unwrap()) as usize;
        *at += 4;
        n
    };
    while at < data.len() {
        let parts = read_u32(&mut at);
        let mut frames = Vec::new();
        for _ in 0..parts {
            let len = read_u32(&mut at);
            frames.push(bytes::Bytes::copy_from_slice(&data[at..at + len]));
            at += len;
        }
        messages.push(frames);
    }
    messages
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wire_schema_matches_the_real_vllm_capture() {
    let real = decode(fixture_messages().remove(0));
    let (mut socket, endpoint) = subscriber().await;
    let engine = start(EngineConfig {
        kv_events: Some(endpoint),
        ..fast_config()
    })
    .await;
    connect(&engine, &mut socket).await;
    engine
        .post(
            "/v1/completions",
            json!({"prompt": prompt(3, 2), "max_tokens": 1}),
        )
        .await
        .text()
        .await
        .unwrap();
    let ours = next_batch(&mut socket).await.unwrap();

    assert_eq!(ours.topic, real.topic);
    let (r, o) = (
        real.payload.as_array().unwrap(),
        ours.payload.as_array().unwrap(),
    );
    assert_eq!(r.len(), 3);
    assert_eq!(o.len(), 3);
    assert!(
        matches!(r[0], Mp::F64(_)) && matches!(o[0], Mp::F64(_)),
        "ts is a float64"
    );
    assert_eq!(r[2].as_u64(), o[2].as_u64(), "data_parallel_rank");
    let real_stored = events(&real)
        .iter()
        .find(|e| field(e, "type").as_str() == Some("BlockStored"))
        .unwrap();
    let our_stored = events(&ours)
        .iter()
        .find(|e| field(e, "type").as_str() == Some("BlockStored"))
        .unwrap();
    assert_eq!(schema(real_stored), schema(our_stored));
}

/// The first connection reaches something that is not a subscriber and fails its handshake (as
/// a loopback connect that picked its own target port as source does); the engine connects
/// again and its batches reach the subscriber that binds the port afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_handshake_is_retried() {
    let impostor = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = impostor.local_addr().unwrap().port();
    let endpoint = format!("tcp://127.0.0.1:{port}");
    let engine = start(EngineConfig {
        kv_events: Some(endpoint.clone()),
        ..fast_config()
    })
    .await;
    let (stream, _) = tokio::time::timeout(Duration::from_secs(10), impostor.accept())
        .await
        .expect("the engine connects")
        .unwrap();
    drop(stream);
    drop(impostor);
    let mut socket = zeromq::SubSocket::new();
    socket.bind(&endpoint).await.unwrap();
    socket.subscribe("").await.unwrap();
    connect(&engine, &mut socket).await;
}

/// Key sets of the capture's first event of `kind` (the readable JSON conversion).
fn fixture_keys(kind: &str) -> std::collections::BTreeSet<String> {
    let path = format!(
        "{}/../../test-data/vllm/kv-events.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let batches: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let event = batches
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|b| b["payload"][1].as_array().unwrap().iter())
        .find(|e| e["type"] == kind)
        .unwrap_or_else(|| panic!("the capture has no {kind}"));
    event.as_object().unwrap().keys().cloned().collect()
}
