//! KV-cache events published the way vLLM publishes them (vLLM `distributed/kv_events.py`,
//! checked against a capture from a real vLLM in `test-data/vllm/kv-events.json`).
//!
//! Wire format: a ZMQ PUB socket sends one multipart message per engine iteration that changed
//! the cache: `[topic, seq, payload]`, where `seq` is an 8-byte big-endian batch counter
//! (starting at 0; a gap means lost batches) and `payload` is msgpack
//! `[ts, [event, ...], data_parallel_rank]` with `ts` in float seconds since the Unix epoch.
//! Each event is a msgpack map with a `type` key:
//!
//! - `{"type": "BlockStored", "block_hashes": [u64...], "parent_block_hash": u64|nil,
//!   "token_ids": [u32...], "block_size": int, "lora_id": nil, "medium": "GPU",
//!   "lora_name": nil, "extra_keys": [nil per block], "group_idx": 0,
//!   "kv_cache_spec_kind": "full_attention"}`
//! - `{"type": "BlockRemoved", "block_hashes": [u64...], "medium": "GPU", "group_idx": 0}`
//! - `{"type": "AllBlocksCleared"}`
//!
//! As in vLLM, an endpoint whose host is `*` is bound (subscribers connect to it); any other
//! endpoint is connected to (one subscriber binds, every engine connects). Batches published
//! while nobody is subscribed are lost, and the sequence number shows the gap.

use crate::faults::FaultState;
use kvgate_core::index::blocks::{KvEvent, Tier};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use zeromq::{Socket, SocketSend, ZmqMessage};

/// Batches the publisher may hold before it drops new ones (like a full ZMQ high-water mark).
const QUEUE_BATCHES: usize = 4096;

/// Wait before connecting again after a failed handshake (ZMQ's default reconnect interval is
/// 100 ms; a subscriber that is not up yet is already retried inside `connect`).
const RECONNECT: std::time::Duration = std::time::Duration::from_millis(100);

fn medium(tier: Tier) -> &'static str {
    match tier {
        Tier::Device => "GPU",
        Tier::Host => "CPU",
        Tier::Disk => "DISK",
    }
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    // Writing to a Vec cannot fail.
    let _ = rmp::encode::write_str(out, s);
}

fn write_u64s(out: &mut Vec<u8>, values: impl ExactSizeIterator<Item = u64>) {
    let _ = rmp::encode::write_array_len(out, values.len() as u32);
    for v in values {
        let _ = rmp::encode::write_uint(out, v);
    }
}

/// Encodes one event as vLLM's msgpack map.
fn encode_event(out: &mut Vec<u8>, event: &KvEvent) {
    match event {
        KvEvent::BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
            tier,
            lora_name,
        } => {
            let _ = rmp::encode::write_map_len(out, 11);
            write_str(out, "type");
            write_str(out, "BlockStored");
            write_str(out, "block_hashes");
            write_u64s(out, block_hashes.iter().copied());
            write_str(out, "parent_block_hash");
            match parent_block_hash {
                Some(h) => {
                    let _ = rmp::encode::write_uint(out, *h);
                }
                None => {
                    let _ = rmp::encode::write_nil(out);
                }
            }
            write_str(out, "token_ids");
            write_u64s(out, token_ids.iter().map(|&t| u64::from(t)));
            write_str(out, "block_size");
            let _ = rmp::encode::write_uint(out, u64::from(*block_size));
            write_str(out, "lora_id");
            let _ = rmp::encode::write_nil(out);
            write_str(out, "medium");
            write_str(out, medium(*tier));
            write_str(out, "lora_name");
            match lora_name {
                Some(name) => write_str(out, name),
                None => {
                    let _ = rmp::encode::write_nil(out);
                }
            }
            // Per-block extra hash keys (multimodal inputs, LoRA, salts): none here.
            write_str(out, "extra_keys");
            let _ = rmp::encode::write_array_len(out, block_hashes.len() as u32);
            for _ in block_hashes {
                let _ = rmp::encode::write_nil(out);
            }
            write_str(out, "group_idx");
            let _ = rmp::encode::write_uint(out, 0);
            write_str(out, "kv_cache_spec_kind");
            write_str(out, "full_attention");
        }
        KvEvent::BlockRemoved { block_hashes, tier } => {
            let _ = rmp::encode::write_map_len(out, 4);
            write_str(out, "type");
            write_str(out, "BlockRemoved");
            write_str(out, "block_hashes");
            write_u64s(out, block_hashes.iter().copied());
            write_str(out, "medium");
            write_str(out, medium(*tier));
            write_str(out, "group_idx");
            let _ = rmp::encode::write_uint(out, 0);
        }
        KvEvent::AllBlocksCleared => {
            let _ = rmp::encode::write_map_len(out, 1);
            write_str(out, "type");
            write_str(out, "AllBlocksCleared");
        }
    }
}

/// Encodes one batch payload `[ts, [events...], data_parallel_rank]`.
pub(crate) fn encode_batch(ts: f64, events: &[KvEvent], data_parallel_rank: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + events.len() * 64);
    let _ = rmp::encode::write_array_len(&mut out, 3);
    let _ = rmp::encode::write_f64(&mut out, ts);
    let _ = rmp::encode::write_array_len(&mut out, events.len() as u32);
    for event in events {
        encode_event(&mut out, event);
    }
    let _ = rmp::encode::write_uint(&mut out, u64::from(data_parallel_rank));
    out
}

/// The scheduler's handle for publishing; cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct KvEventSink {
    tx: mpsc::Sender<Vec<KvEvent>>,
}

impl KvEventSink {
    /// Queues one iteration's events; drops them if the publisher is far behind.
    pub(crate) fn publish(&self, events: Vec<KvEvent>) {
        let _ = self.tx.try_send(events);
    }
}

/// Why the publisher could not start.
#[derive(Debug, thiserror::Error)]
#[error("KV event endpoint `{endpoint}`: {source}")]
pub struct KvEventsError {
    endpoint: String,
    #[source]
    source: zeromq::ZmqError,
}

/// Starts the publisher task: binds now (so a bad endpoint fails at startup) or connects in the
/// background (retrying until the subscriber is up).
pub(crate) async fn start(
    endpoint: &str,
    topic: String,
    faults: Arc<FaultState>,
    shutdown: CancellationToken,
) -> Result<KvEventSink, KvEventsError> {
    let mut socket = zeromq::PubSocket::new();
    let wrap = |source| KvEventsError {
        endpoint: endpoint.to_owned(),
        source,
    };
    let bind = endpoint.contains('*');
    if bind {
        socket
            .bind(&endpoint.replace('*', "0.0.0.0"))
            .await
            .map_err(wrap)?;
    }
    let (tx, mut rx) = mpsc::channel::<Vec<KvEvent>>(QUEUE_BATCHES);
    let endpoint = endpoint.to_owned();
    tokio::spawn(async move {
        if !bind {
            socket = match connect(&endpoint, &shutdown).await {
                Some(s) => s,
                None => return,
            };
        }
        let mut seq: u64 = 0;
        loop {
            let events = tokio::select! {
                _ = shutdown.cancelled() => break,
                events = rx.recv() => match events { Some(e) => e, None => break },
            };
            let ts = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            let payload = encode_batch(ts, &events, 0);
            let mut message = ZmqMessage::from(topic.clone().into_bytes());
            message.push_back(seq.to_be_bytes().to_vec().into());
            message.push_back(payload.into());
            seq += 1;
            if faults.drop_kv_batch() {
                continue;
            }
            if socket.send(message).await.is_err() {
                break;
            }
        }
        let _ = socket.close().await;
    });
    Ok(KvEventSink { tx })
}

/// Connects a fresh socket until one completes the ZMQ handshake, or until shutdown.
///
/// The crate retries refused TCP connections itself but gives up on a failed handshake. One
/// happens whenever the TCP connection reaches something that is not the subscriber: on
/// loopback, a connect to an unbound port in the ephemeral range can pick that same port as its
/// source and connect to itself (a TCP simultaneous open), and then holds the port the
/// subscriber is trying to bind. Giving up there would leave the engine silent for its life.
async fn connect(endpoint: &str, shutdown: &CancellationToken) -> Option<zeromq::PubSocket> {
    loop {
        let mut socket = zeromq::PubSocket::new();
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            connected = socket.connect(endpoint) => if connected.is_ok() { return Some(socket) },
        }
        drop(socket);
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            _ = tokio::time::sleep(RECONNECT) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_decodes_to_vllm_shape() {
        let events = vec![
            KvEvent::BlockStored {
                lora_name: None,
                block_hashes: vec![u64::MAX, 2],
                parent_block_hash: None,
                token_ids: vec![1, 2, 3, 4],
                block_size: 2,
                tier: Tier::Device,
            },
            KvEvent::BlockRemoved {
                block_hashes: vec![7],
                tier: Tier::Device,
            },
            KvEvent::AllBlocksCleared,
        ];
        let bytes = encode_batch(1.5, &events, 0);
        let value = rmpv::decode::read_value(&mut bytes.as_slice()).unwrap();
        let top = value.as_array().unwrap();
        assert_eq!(top[0].as_f64(), Some(1.5));
        assert_eq!(top[2].as_u64(), Some(0));
        let evs = top[1].as_array().unwrap();
        let get = |e: &rmpv::Value, k: &str| {
            e.as_map()
                .unwrap()
                .iter()
                .find(|(key, _)| key.as_str() == Some(k))
                .map(|(_, v)| v.clone())
        };
        assert_eq!(get(&evs[0], "type").unwrap().as_str(), Some("BlockStored"));
        assert_eq!(
            get(&evs[0], "block_hashes").unwrap().as_array().unwrap()[0].as_u64(),
            Some(u64::MAX)
        );
        assert!(get(&evs[0], "parent_block_hash").unwrap().is_nil());
        assert_eq!(
            get(&evs[0], "token_ids").unwrap().as_array().unwrap().len(),
            4
        );
        assert_eq!(get(&evs[0], "medium").unwrap().as_str(), Some("GPU"));
        assert_eq!(get(&evs[1], "type").unwrap().as_str(), Some("BlockRemoved"));
        assert_eq!(
            get(&evs[2], "type").unwrap().as_str(),
            Some("AllBlocksCleared")
        );
    }
}
