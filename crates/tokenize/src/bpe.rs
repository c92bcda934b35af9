//! A byte-level BPE encoder for GPT-2-style `tokenizer.json` files, giving the ids the
//! tokenizers crate gives, several times faster (the module docs of [`crate::byte_level`] say
//! where the time went).
//!
//! It takes over only when the file is one it reproduces exactly: a `BPE` model without
//! dropout, subword prefix or suffix, every byte in its vocabulary; a `ByteLevel`
//! pre-tokenizer with `use_regex` and no prefix space; no normalizer or NFC. Text that is not
//! already in NFC goes to the tokenizers crate, as does every file
//! of another shape. Merging follows the tokenizers crate's rule: the pair of lowest merge rank
//! first, the leftmost among equals; with `ignore_merges`, a piece that is itself in the
//! vocabulary is that one token.

use crate::byte_level::{byte_chars, split};
use ahash::AHashMap;
use serde_json::Value;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Mutex;
use unicode_normalization_alignments::is_nfc;

/// Pieces remembered with their ids; the cache is emptied when it reaches this many.
const CACHED_WORDS: usize = 1 << 16;
/// Longer pieces (runs of spaces, long numbers) are merged every time.
const CACHED_WORD_BYTES: usize = 64;

/// Pieces' bytes to their ids.
type WordCache = AHashMap<Box<[u8]>, Box<[u32]>>;

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct ByteLevelBpe {
    /// The id of each byte's single-character token.
    byte_ids: [u32; 256],
    /// (left, right) -> (rank, merged id).
    merges: AHashMap<(u32, u32), (u32, u32)>,
    /// With `ignore_merges`: every vocabulary entry, by the bytes it spells.
    whole_words: Option<AHashMap<Box<[u8]>, u32>>,
    nfc: bool,
    cache: Mutex<WordCache>,
}

impl ByteLevelBpe {
    /// The encoder for `tokenizer.json`, or `None` when the file is not of the shape it
    /// reproduces (see the module documentation).
    pub(crate) fn from_json(json: &Value) -> Option<Self> {
        let nfc = match json.get("normalizer") {
            None | Some(Value::Null) => false,
            Some(n) if n["type"] == "NFC" => true,
            Some(_) => return None,
        };
        let pre = json.get("pre_tokenizer")?;
        let byte_level = pre["type"] == "ByteLevel"
            && pre["add_prefix_space"] == false
            && pre.get("use_regex").is_none_or(|u| *u == true);
        let model = json.get("model")?;
        let empty = |key: &str| match model.get(key) {
            None | Some(Value::Null) => true,
            Some(Value::String(s)) => s.is_empty(),
            _ => false,
        };
        let plain_bpe = model["type"] == "BPE"
            && empty("dropout")
            && empty("continuing_subword_prefix")
            && empty("end_of_word_suffix");
        if !byte_level || !plain_bpe || model.get("byte_fallback") == Some(&Value::Bool(true)) {
            return None;
        }
        let vocab: AHashMap<&str, u32> = model
            .get("vocab")?
            .as_object()?
            .iter()
            .map(|(token, id)| Some((token.as_str(), u32::try_from(id.as_u64()?).ok()?)))
            .collect::<Option<_>>()?;
        let chars = byte_chars();
        let mut byte_ids = [0u32; 256];
        for (id, c) in byte_ids.iter_mut().zip(chars) {
            *id = *vocab.get(c.encode_utf8(&mut [0; 4]) as &str)?;
        }
        let mut merges = AHashMap::new();
        for (rank, merge) in model.get("merges")?.as_array()?.iter().enumerate() {
            let (left, right) = match merge {
                Value::String(s) => s.split_once(' ')?,
                Value::Array(pair) if pair.len() == 2 => (pair[0].as_str()?, pair[1].as_str()?),
                _ => return None,
            };
            let merged = vocab.get(format!("{left}{right}").as_str())?;
            let pair = (*vocab.get(left)?, *vocab.get(right)?);
            merges.insert(pair, (u32::try_from(rank).ok()?, *merged));
        }
        let whole_words = (model.get("ignore_merges") == Some(&Value::Bool(true))).then(|| {
            let byte_of: AHashMap<char, u8> = (0..=255u8).map(|b| (chars[b as usize], b)).collect();
            vocab
                .iter()
                .filter_map(|(token, &id)| {
                    let bytes: Option<Box<[u8]>> =
                        token.chars().map(|c| byte_of.get(&c).copied()).collect();
                    Some((bytes?, id))
                })
                .collect()
        });
        Some(ByteLevelBpe {
            byte_ids,
            merges,
            whole_words,
            nfc,
            cache: Mutex::default(),
        })
    }

    /// Appends the ids of `text` (a stretch between added tokens) to `out`; `false`, with `out`
    /// untouched, when the text needs a normalizer this encoder does not run.
    pub(crate) fn encode(&self, text: &str, out: &mut Vec<u32>) -> bool {
        if self.nfc && !text.is_ascii() && !is_nfc(text) {
            return false;
        }
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let mut scratch = Scratch::default();
        split(text, |piece| {
            let bytes = piece.as_bytes();
            if let Some(id) = self.whole_words.as_ref().and_then(|w| w.get(bytes)) {
                out.push(*id);
                return;
            }
            if let Some(ids) = cache.get(bytes) {
                out.extend_from_slice(ids);
                return;
            }
            let from = out.len();
            self.merge(bytes, &mut scratch, out);
            if bytes.len() <= CACHED_WORD_BYTES {
                if cache.len() >= CACHED_WORDS {
                    cache.clear();
                }
                cache.insert(bytes.into(), out[from..].into());
            }
        });
        true
    }

    /// Forgets the remembered words.
    pub(crate) fn forget(&self) {
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// Byte-pair merges of one piece, appended to `out`.
    fn merge(&self, bytes: &[u8], scratch: &mut Scratch, out: &mut Vec<u32>) {
        let n = bytes.len();
        if n == 1 {
            out.push(self.byte_ids[bytes[0] as usize]);
            return;
        }
        // A linked list over the byte positions; a merged symbol keeps its left position, and
        // a merged-away one is marked by `next == DEAD`.
        let Scratch {
            ids,
            next,
            prev,
            heap,
        } = scratch;
        ids.clear();
        ids.extend(bytes.iter().map(|&b| self.byte_ids[b as usize]));
        next.clear();
        next.extend(1..=n);
        prev.clear();
        prev.extend((0..n).map(|i| i.wrapping_sub(1)));
        heap.clear();
        for i in 0..n - 1 {
            if let Some(&(rank, _)) = self.merges.get(&(ids[i], ids[i + 1])) {
                heap.push(Reverse((rank, i)));
            }
        }
        while let Some(Reverse((rank, i))) = heap.pop() {
            let j = next[i];
            if j >= n {
                continue;
            }
            // An entry whose pair has changed since it was pushed is stale.
            let Some(&(now_rank, merged)) = self.merges.get(&(ids[i], ids[j])) else {
                continue;
            };
            if now_rank != rank {
                continue;
            }
            ids[i] = merged;
            next[i] = next[j];
            next[j] = DEAD;
            if next[i] < n {
                prev[next[i]] = i;
            }
            let p = prev[i];
            if p < n {
                if let Some(&(r, _)) = self.merges.get(&(ids[p], ids[i])) {
                    heap.push(Reverse((r, p)));
                }
            }
            if next[i] < n {
                if let Some(&(r, _)) = self.merges.get(&(ids[i], ids[next[i]])) {
                    heap.push(Reverse((r, i)));
                }
            }
        }
        let mut i = 0;
        while i < n {
            out.push(ids[i]);
            i = next[i];
        }
    }
}

/// Marks a merged-away position (beyond any piece's length).
const DEAD: usize = usize::MAX;

/// Buffers for [`ByteLevelBpe::merge`], kept across the pieces of one text.
#[derive(Default)]
struct Scratch {
    ids: Vec<u32>,
    next: Vec<usize>,
    prev: Vec<usize>,
    heap: BinaryHeap<Reverse<(u32, usize)>>,
}

#[cfg(test)]
#[path = "bpe_tests.rs"]
mod tests;
