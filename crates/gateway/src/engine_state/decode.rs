//! vLLM's KV-event messages: ZMQ multipart `[topic, seq, payload]` (the topic frame may be
//! absent), `seq` an 8-byte big-endian batch counter, `payload` msgpack `[ts, [event...],
//! data_parallel_rank]` (vLLM `distributed/kv_events.py`; the capture in
//! `test-data/vllm/kv-events.json`). Events are maps with a `type` key, or, from vLLM versions
//! that encoded them as tagged arrays, `[type, fields...]` in declaration order.
//!
//! Block hashes are integers, or bytes when the engine hashes with SHA-256; either only names a
//! block, so bytes are folded to 64 bits. Stored blocks of a LoRA adapter (`lora_name`, or only
//! `lora_id` from versions that sent no name) are kept under the adapter's scope, so only a
//! request for that adapter matches them (an id without a name is scoped as `#lora_id=N`, which
//! no request names: the chain stays placed, nothing matches it). Blocks whose extra keys hold
//! more than the adapter's name (multimodal inputs, a `cache_salt`) are keyed by more than
//! their tokens, so a request's token hashes must not match them: they are left out.

use kvgate_core::index::blocks::{KvEvent, Tier};
use rmpv::Value;

/// One decoded batch.
#[derive(Debug, PartialEq)]
pub(crate) struct Batch {
    pub(crate) seq: u64,
    /// Engine time of the batch, Unix seconds.
    pub(crate) ts: Option<f64>,
    pub(crate) events: Vec<KvEvent>,
    /// Stored-block events left out (keyed by more than tokens).
    pub(crate) skipped: u32,
}

/// Why a message could not be read.
#[derive(Debug, thiserror::Error, PartialEq)]
pub(crate) enum DecodeError {
    #[error("expected 2 or 3 frames, got {0}")]
    Frames(usize),
    #[error("the sequence frame has {0} bytes, not 8")]
    Sequence(usize),
    #[error("payload is not msgpack: {0}")]
    Msgpack(String),
    #[error("payload is not [ts, [events], rank]")]
    Shape,
}

/// Decodes one multipart message.
pub(crate) fn decode(frames: &[&[u8]]) -> Result<Batch, DecodeError> {
    let (seq, payload) = match frames {
        [_, seq, payload] | [seq, payload] => (*seq, *payload),
        other => return Err(DecodeError::Frames(other.len())),
    };
    let seq = u64::from_be_bytes(
        seq.try_into()
            .map_err(|_| DecodeError::Sequence(seq.len()))?,
    );
    let value = rmpv::decode::read_value(&mut &payload[..])
        .map_err(|e| DecodeError::Msgpack(e.to_string()))?;
    let (ts, events) = match &value {
        Value::Array(top) if top.len() >= 2 => (top[0].as_f64(), top[1].as_array()),
        Value::Map(_) => (
            field(&value, "ts").and_then(Value::as_f64),
            field(&value, "events").and_then(Value::as_array),
        ),
        _ => return Err(DecodeError::Shape),
    };
    let events = events.ok_or(DecodeError::Shape)?;
    let mut batch = Batch {
        seq,
        ts,
        events: Vec::with_capacity(events.len()),
        skipped: 0,
    };
    for event in events {
        match read_event(event) {
            Some(Read::Event(e)) => batch.events.push(e),
            Some(Read::Skipped) => batch.skipped += 1,
            None => return Err(DecodeError::Shape),
        }
    }
    Ok(batch)
}

enum Read {
    Event(KvEvent),
    Skipped,
}

fn field<'a>(map: &'a Value, key: &str) -> Option<&'a Value> {
    map.as_map()?
        .iter()
        .find(|(k, _)| k.as_str() == Some(key))
        .map(|(_, v)| v)
}

fn hash(v: &Value) -> Option<u64> {
    match v {
        Value::Integer(i) => i.as_u64().or_else(|| i.as_i64().map(|x| x as u64)),
        Value::Binary(b) => Some(xxhash_rust::xxh3::xxh3_64(b)),
        _ => None,
    }
}

fn hashes(v: Option<&Value>) -> Option<Vec<u64>> {
    v?.as_array()?.iter().map(hash).collect()
}

fn tier(v: Option<&Value>) -> Tier {
    match v.and_then(Value::as_str) {
        None | Some("GPU") | Some("gpu") => Tier::Device,
        Some("CPU") | Some("cpu") => Tier::Host,
        Some(_) => Tier::Disk,
    }
}

/// The adapter a stored block belongs to: its `lora_name` (trimmed), else its `lora_id`.
fn adapter(name: Option<&Value>, id: Option<&Value>) -> Option<String> {
    let name = name.and_then(Value::as_str).map(str::trim);
    match (name.filter(|n| !n.is_empty()), id.filter(|v| !v.is_nil())) {
        (Some(name), _) => Some(name.to_owned()),
        (None, Some(id)) => Some(format!("#lora_id={id}")),
        (None, None) => None,
    }
}

/// Whether per-block extra keys are absent or name only the block's adapter.
fn only_adapter_keys(keys: Option<&Value>, adapter: Option<&str>) -> bool {
    let is_adapter = |v: &Value| v.is_nil() || (adapter.is_some() && v.as_str() == adapter);
    match keys {
        None | Some(Value::Nil) => true,
        Some(Value::Array(blocks)) => blocks.iter().all(|block| match block {
            Value::Array(items) => items.iter().all(is_adapter),
            other => is_adapter(other),
        }),
        Some(_) => false,
    }
}

fn read_event(event: &Value) -> Option<Read> {
    type Getter<'a> = Box<dyn Fn(&str) -> Option<&'a Value> + 'a>;
    // Tagged-array events name their fields by position: BlockStored(block_hashes,
    // parent_block_hash, token_ids, block_size, lora_id, medium), BlockRemoved(block_hashes,
    // medium), AllBlocksCleared().
    let (kind, get): (&str, Getter<'_>) = match event {
        Value::Map(_) => (
            field(event, "type")?.as_str()?,
            Box::new(move |k| field(event, k)),
        ),
        Value::Array(items) => {
            let kind = items.first()?.as_str()?;
            let names: &[&str] = match kind {
                "BlockStored" => &[
                    "block_hashes",
                    "parent_block_hash",
                    "token_ids",
                    "block_size",
                    "lora_id",
                    "medium",
                ],
                "BlockRemoved" => &["block_hashes", "medium"],
                _ => &[],
            };
            (
                kind,
                Box::new(move |k| {
                    let i = names.iter().position(|n| *n == k)?;
                    items.get(i + 1)
                }),
            )
        }
        _ => return None,
    };
    Some(match kind {
        "BlockStored" => {
            let lora_name = adapter(get("lora_name"), get("lora_id"));
            if !only_adapter_keys(get("extra_keys"), lora_name.as_deref()) {
                return Some(Read::Skipped);
            }
            let parent = match get("parent_block_hash") {
                None | Some(Value::Nil) => None,
                Some(v) => Some(hash(v)?),
            };
            let token_ids = get("token_ids")?
                .as_array()?
                .iter()
                .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
                .collect::<Option<Vec<u32>>>()?;
            Read::Event(KvEvent::BlockStored {
                lora_name,
                block_hashes: hashes(get("block_hashes"))?,
                parent_block_hash: parent,
                token_ids,
                block_size: u32::try_from(get("block_size")?.as_u64()?).ok()?,
                tier: tier(get("medium")),
            })
        }
        "BlockRemoved" => Read::Event(KvEvent::BlockRemoved {
            block_hashes: hashes(get("block_hashes"))?,
            tier: tier(get("medium")),
        }),
        "AllBlocksCleared" => Read::Event(KvEvent::AllBlocksCleared),
        // Event kinds added later (vLLM grows them) change nothing kvgate indexes.
        _ => Read::Skipped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `test-data/vllm/kv-events.bin`: messages as `[frames u32][len u32, bytes]...`, all
    /// big-endian, captured from a real vLLM (see `crates/engine/tests/kv_events.rs`).
    fn capture() -> Vec<Vec<Vec<u8>>> {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../test-data/vllm/kv-events.bin"
        );
        let bytes = std::fs::read(path).unwrap();
        let mut at = 0;
        let u32_at = |at: &mut usize| {
            let v = u32::from_be_bytes(bytes[*at..*at + 4].try_into().unwrap()) as usize;
            *at += 4;
            v
        };
        let mut messages = Vec::new();
        while at < bytes.len() {
            let n = u32_at(&mut at);
            let mut frames = Vec::new();
            for _ in 0..n {
                let len = u32_at(&mut at);
                frames.push(bytes[at..at + len].to_vec());
                at += len;
            }
            messages.push(frames);
        }
        messages
    }

    #[test]
    fn a_real_vllm_capture_decodes() {
        let messages = capture();
        assert!(!messages.is_empty());
        let mut stored = 0;
        for (i, m) in messages.iter().enumerate() {
            let frames: Vec<&[u8]> = m.iter().map(Vec::as_slice).collect();
            let batch = decode(&frames).unwrap();
            assert_eq!(batch.seq, i as u64);
            assert!(batch.ts.is_some_and(|t| t > 1.7e9));
            assert_eq!(batch.skipped, 0);
            for e in &batch.events {
                if let KvEvent::BlockStored {
                    block_hashes,
                    token_ids,
                    block_size,
                    ..
                } = e
                {
                    assert_eq!(*block_size, 32);
                    assert_eq!(token_ids.len(), block_hashes.len() * 32);
                    stored += 1;
                }
            }
        }
        assert!(stored > 0);
    }

    #[test]
    fn tagged_arrays_salted_blocks_and_bad_frames() {
        use rmpv::Value as V;
        let encode = |v: V| {
            let mut out = Vec::new();
            rmpv::encode::write_value(&mut out, &v).unwrap();
            out
        };
        let payload = encode(V::Array(vec![
            V::from(1.5),
            V::Array(vec![
                V::Array(vec![
                    V::from("BlockStored"),
                    V::Array(vec![V::Binary(vec![1, 2])]),
                    V::Nil,
                    V::Array(vec![V::from(7), V::from(8)]),
                    V::from(2),
                    V::Nil,
                    V::from("CPU"),
                ]),
                V::Map(vec![
                    (V::from("type"), V::from("BlockStored")),
                    (V::from("block_hashes"), V::Array(vec![V::from(5)])),
                    (V::from("parent_block_hash"), V::Nil),
                    (V::from("token_ids"), V::Array(vec![V::from(1), V::from(2)])),
                    (V::from("block_size"), V::from(2)),
                    (
                        V::from("extra_keys"),
                        V::Array(vec![V::Array(vec![V::from("salt")])]),
                    ),
                ]),
                V::Array(vec![V::from("AllBlocksCleared")]),
                V::Map(vec![(V::from("type"), V::from("SomethingNew"))]),
            ]),
            V::from(0),
        ]));
        let seq = 9u64.to_be_bytes();
        let batch = decode(&[b"t", &seq, &payload]).unwrap();
        assert_eq!(batch.seq, 9);
        assert_eq!(batch.skipped, 2);
        assert_eq!(batch.events.len(), 2);
        assert!(matches!(
            &batch.events[0],
            KvEvent::BlockStored {
                tier: Tier::Host,
                parent_block_hash: None,
                ..
            }
        ));
        assert_eq!(decode(&[b"x"]), Err(DecodeError::Frames(1)));
        assert_eq!(decode(&[b"abc", &payload]), Err(DecodeError::Sequence(3)));
        assert!(matches!(decode(&[&seq, b""]), Err(DecodeError::Msgpack(_))));
        assert_eq!(
            decode(&[&seq, &encode(V::from(3))]),
            Err(DecodeError::Shape)
        );
    }
}

#[cfg(test)]
mod lora_tests {
    use super::*;
    use rmpv::Value as V;

    fn stored(extra: Vec<(V, V)>) -> V {
        let mut fields = vec![
            (V::from("type"), V::from("BlockStored")),
            (V::from("block_hashes"), V::Array(vec![V::from(5)])),
            (V::from("parent_block_hash"), V::Nil),
            (V::from("token_ids"), V::Array(vec![V::from(1), V::from(2)])),
            (V::from("block_size"), V::from(2)),
        ];
        fields.extend(extra);
        V::Map(fields)
    }

    fn lora_of(event: &V) -> Option<Option<String>> {
        match read_event(event)? {
            Read::Event(KvEvent::BlockStored { lora_name, .. }) => Some(lora_name),
            _ => None,
        }
    }

    #[test]
    fn adapter_blocks_are_kept_under_their_adapter() {
        let named = stored(vec![
            (V::from("lora_id"), V::from(1)),
            (V::from("lora_name"), V::from(" sql ")),
            (
                V::from("extra_keys"),
                V::Array(vec![V::Array(vec![V::from("sql")])]),
            ),
        ]);
        assert_eq!(lora_of(&named), Some(Some("sql".to_owned())));
        let id_only = stored(vec![(V::from("lora_id"), V::from(3))]);
        assert_eq!(lora_of(&id_only), Some(Some("#lora_id=3".to_owned())));
        let base = stored(vec![
            (V::from("lora_id"), V::Nil),
            (V::from("lora_name"), V::Nil),
            (V::from("extra_keys"), V::Array(vec![V::Nil])),
        ]);
        assert_eq!(lora_of(&base), Some(None));
        let salted = stored(vec![
            (V::from("lora_name"), V::from("sql")),
            (
                V::from("extra_keys"),
                V::Array(vec![V::Array(vec![V::from("sql"), V::from("salt")])]),
            ),
        ]);
        assert!(matches!(read_event(&salted), Some(Read::Skipped)));
    }

    fn to_msgpack(v: &serde_json::Value) -> V {
        use serde_json::Value as J;
        match v {
            J::Null => V::Nil,
            J::Bool(b) => V::from(*b),
            J::Number(n) => n
                .as_u64()
                .map_or_else(|| V::from(n.as_f64().unwrap_or_default()), V::from),
            J::String(s) => V::from(s.as_str()),
            J::Array(items) => V::Array(items.iter().map(to_msgpack).collect()),
            J::Object(map) => V::Map(
                map.iter()
                    .map(|(k, v)| (V::from(k.as_str()), to_msgpack(v)))
                    .collect(),
            ),
        }
    }

    /// `test-data/vllm/kv-events-lora.jsonl`: stored-block events of an adapter's request from
    /// a real vLLM 0.32 (`scripts/real-vllm-lora.sh`; token ids cut to four).
    #[test]
    fn a_real_adapter_s_blocks_are_kept_under_its_name() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../test-data/vllm/kv-events-lora.jsonl"
        );
        let text = std::fs::read_to_string(path).unwrap();
        let mut read = 0;
        for line in text.lines() {
            let event = to_msgpack(&serde_json::from_str(line).unwrap());
            assert_eq!(lora_of(&event), Some(Some("sql".to_owned())), "{line}");
            read += 1;
        }
        assert!(read > 0);
    }
}
