//! Encoding a rendered chat prompt piece by piece, with the long pieces' ids remembered.
//!
//! Why this is exact: a tokenizer first cuts the text at its added (special) tokens and encodes
//! every stretch between them on its own (Hugging Face `AddedVocabulary::extract_and_normalize`),
//! so `encode(text)` is the concatenation of the stretches' encodings and the added tokens' ids.
//! A chat template puts special tokens around every message, so a conversation's earlier
//! messages are the same stretches turn after turn, and a shared system prompt the same stretch
//! request after request: only the new message needs the tokenizer (`cargo bench -p
//! kvgate-tokenize`: 369 µs for a never-seen 8,414-token chat prompt, 195 µs for the next turn
//! of the same conversation).
//!
//! It holds only when the cut is position-independent: every added token matches its raw text
//! (not `normalized`) without `lstrip`, `rstrip` or `single_word`, and no pre-tokenizer treats
//! the first stretch differently (Metaspace `prepend_scheme: first`). [`PieceEncoder::new`]
//! checks that and returns `None` otherwise; the caller then encodes whole texts.

use crate::memo::{Cut, Entry};
use crate::TokenizeError;
use daachorse::{DoubleArrayAhoCorasick, DoubleArrayAhoCorasickBuilder, MatchKind};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokenizers::Tokenizer;
use xxhash_rust::xxh3::xxh3_64;

/// Stretches shorter than this are encoded every time: hashing and locking would cost about as
/// much as the tokenizer.
const MIN_CACHED_BYTES: usize = 256;

/// Remembered ids, in two generations: a lookup that hits the older one moves the entry to the
/// newer; when the newer holds half the capacity, the older is dropped. Memory stays under
/// `capacity` ids (4 bytes each) plus the maps' overhead.
#[derive(Debug, Default)]
struct Generations {
    current: HashMap<(u64, usize), Arc<[u32]>>,
    previous: HashMap<(u64, usize), Arc<[u32]>>,
    current_ids: usize,
}

/// See the module documentation.
pub(crate) struct PieceEncoder {
    matcher: DoubleArrayAhoCorasick<u32>,
    /// Bytes of the longest added token: how far past a match's start its finding looks.
    longest: usize,
    cache: Mutex<Generations>,
    capacity: usize,
}

impl std::fmt::Debug for PieceEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PieceEncoder")
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

impl PieceEncoder {
    /// `None` when `tokenizer` cuts text in a way that depends on position (see the module
    /// documentation); otherwise remembers up to `capacity` ids.
    pub(crate) fn new(tokenizer: &Tokenizer, capacity: usize) -> Option<Self> {
        let added = tokenizer.get_added_tokens_decoder();
        if added
            .values()
            .any(|t| t.normalized || t.lstrip || t.rstrip || t.single_word)
        {
            return None;
        }
        let pre = serde_json::to_string(&tokenizer.get_pre_tokenizer()).ok()?;
        if pre.contains("\"prepend_scheme\":\"first\"") {
            return None;
        }
        let patterns: Vec<(String, u32)> = added
            .iter()
            .filter(|(_, t)| !t.content.is_empty())
            .map(|(&id, t)| (t.content.clone(), id))
            .collect();
        if patterns.is_empty() {
            return None;
        }
        let longest = patterns.iter().map(|(p, _)| p.len()).max().unwrap_or(0);
        let matcher = DoubleArrayAhoCorasickBuilder::new()
            .match_kind(MatchKind::LeftmostLongest)
            .build_with_values(patterns)
            .ok()?;
        Some(PieceEncoder {
            matcher,
            longest,
            cache: Mutex::default(),
            capacity,
        })
    }

    /// The ids of `text` without special tokens added around it: what
    /// `tokenizer.encode(text, false)` gives, when `encode` encodes a stretch as the tokenizer
    /// does.
    /// `encode` appends the ids of one stretch between added tokens; `remember` says whether
    /// long stretches are looked up and kept.
    pub(crate) fn encode(
        &self,
        text: &str,
        remember: bool,
        encode: &impl Fn(&str, &mut Vec<u32>) -> Result<(), TokenizeError>,
    ) -> Result<Vec<u32>, TokenizeError> {
        let mut out = Vec::with_capacity(text.len() / 3 + 8);
        self.encode_into(text, 0, remember, encode, &mut out, &mut Vec::new())?;
        Ok(out)
    }

    /// The ids and cuts of `text`, resuming from `prior`'s last cut that holds for it (see
    /// [`crate::memo`]); and how many ids were kept from `prior`.
    pub(crate) fn encode_after(
        &self,
        prior: Option<&Entry>,
        text: &str,
        encode: &impl Fn(&str, &mut Vec<u32>) -> Result<(), TokenizeError>,
    ) -> Result<(Vec<u32>, Vec<Cut>, usize), TokenizeError> {
        let mut out = Vec::with_capacity(text.len() / 3 + 8);
        let mut cuts = Vec::new();
        let from = match prior.and_then(|p| Some((p, p.resume_point(text)?))) {
            Some((p, cut)) => {
                out.extend_from_slice(&p.ids[..cut.ids]);
                let kept = p.cuts.partition_point(|c| c.text <= cut.text);
                cuts.extend_from_slice(&p.cuts[..kept]);
                cut.text
            }
            None => 0,
        };
        let reused = out.len();
        self.encode_into(&text[from..], from, true, encode, &mut out, &mut cuts)?;
        Ok((out, cuts, reused))
    }

    /// Appends the ids of `text` (which starts at byte `offset` of the prompt, right after an
    /// added token or at its start) to `out` and, after every added token, a [`Cut`].
    fn encode_into(
        &self,
        text: &str,
        offset: usize,
        remember: bool,
        encode: &impl Fn(&str, &mut Vec<u32>) -> Result<(), TokenizeError>,
        out: &mut Vec<u32>,
        cuts: &mut Vec<Cut>,
    ) -> Result<(), TokenizeError> {
        let mut at = 0;
        for m in self.matcher.leftmost_find_iter(text) {
            self.stretch(&text[at..m.start()], remember, encode, out)?;
            out.push(m.value());
            at = m.end();
            cuts.push(Cut {
                text: offset + at,
                ids: out.len(),
                safe: offset + m.start() + self.longest,
            });
        }
        self.stretch(&text[at..], remember, encode, out)
    }

    fn stretch(
        &self,
        piece: &str,
        remember: bool,
        encode: &impl Fn(&str, &mut Vec<u32>) -> Result<(), TokenizeError>,
        out: &mut Vec<u32>,
    ) -> Result<(), TokenizeError> {
        if piece.is_empty() {
            return Ok(());
        }
        if !remember || piece.len() < MIN_CACHED_BYTES {
            return encode(piece, out);
        }
        let key = (xxh3_64(piece.as_bytes()), piece.len());
        if let Some(ids) = self.lookup(key) {
            out.extend_from_slice(&ids);
            return Ok(());
        }
        let from = out.len();
        encode(piece, out)?;
        self.remember(key, out[from..].into());
        Ok(())
    }

    /// Forgets every remembered stretch.
    pub(crate) fn forget(&self) {
        *self.cache.lock().unwrap_or_else(|p| p.into_inner()) = Generations::default();
    }

    fn lookup(&self, key: (u64, usize)) -> Option<Arc<[u32]>> {
        let mut g = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(ids) = g.current.get(&key) {
            return Some(ids.clone());
        }
        let ids = g.previous.remove(&key)?;
        g.current_ids += ids.len();
        g.current.insert(key, ids.clone());
        Some(ids)
    }

    fn remember(&self, key: (u64, usize), ids: Arc<[u32]>) {
        let mut g = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if g.current_ids + ids.len() > self.capacity / 2 {
            g.previous = std::mem::take(&mut g.current);
            g.current_ids = 0;
        }
        g.current_ids += ids.len();
        g.current.insert(key, ids);
    }

    /// Ids remembered now.
    #[cfg(test)]
    pub(crate) fn remembered(&self) -> usize {
        let g = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        g.current
            .values()
            .chain(g.previous.values())
            .map(|v| v.len())
            .sum()
    }
}
