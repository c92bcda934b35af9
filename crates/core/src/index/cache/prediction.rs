//! What the index predicted for a dispatch, and how the engine's usage corrects the index
//! when that prediction turns out wrong.

use super::{Index, PrefixCache, TreeKey};
use crate::index::{as_reported, Overlaps, PrefixKey, TailScale, Unit};
use crate::{EndpointId, Nanos, Request};

/// What the index predicted one endpoint held of one request, kept until usage says what it
/// really held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prediction {
    /// The endpoint.
    pub endpoint: EndpointId,
    /// Predicted units held when this request is prefilled: what the index lists, or more
    /// when an earlier dispatch still prefilling will have cached it by then.
    pub units: u32,
    /// Units the index listed as held at the pick, without the in-flight part: only a miss
    /// of these shows an eviction. A shortfall in the in-flight part is a sibling admitted
    /// before its prefix was computed, and the entries are right.
    pub held: u32,
    /// Units in the prompt.
    pub total: u32,
    /// What the units are.
    pub unit: Unit,
    /// When the matched prefix was last sent there.
    pub touched: Nanos,
    /// The prompt's text length, when keyed by text.
    pub text_bytes: Option<usize>,
    /// Whether the token tree (not the text tree) holds it.
    pub by_tokens: bool,
    /// When the endpoint has a KV-event stream: the tokens its events alone say it holds, and
    /// whether the stream was trusted (then `units` is exactly that).
    pub engine: Option<(u32, bool)>,
    /// How the index counted uncached tails at the pick.
    pub tail: TailScale,
}

impl Prediction {
    /// Whether this prediction came from a trusted engine event stream, and so should match
    /// the engine's `cached_tokens` to the token rather than to a block.
    pub fn is_exact(&self) -> bool {
        self.engine
            .is_some_and(|(tokens, live)| live && self.unit == Unit::Tokens && tokens == self.units)
    }
}

impl Prediction {
    /// The predicted cached tokens of a prompt of `prompt_tokens` tokens.
    pub fn cached_tokens(&self, prompt_tokens: u32) -> u32 {
        self.tail.cached(
            self.unit.tokens(self.units, self.total, prompt_tokens),
            prompt_tokens,
        )
    }

    /// How many bytes of the prompt's text key the endpoint is predicted to hold: the match
    /// itself when the index is keyed by text, else the matched share of the key's length.
    /// `None` when the request had no text key.
    pub fn cached_text_bytes(&self) -> Option<usize> {
        let bytes = self.text_bytes?;
        if self.unit == Unit::Bytes {
            return Some((self.units as usize).min(bytes));
        }
        let share = f64::from(self.units) / f64::from(self.total.max(1));
        Some((share.min(1.0) * bytes as f64) as usize)
    }
}

impl PrefixCache {
    /// What this index predicted for `request` on `endpoint`, kept from the pick until the
    /// engine's usage arrives ([`Self::correct`]): what the endpoint holds, or, when more, what
    /// prompts sent there and still in prefill will have put in its cache by the time this one
    /// is prefilled (engines cache a block as they schedule it, so a request queued behind its
    /// prefix's first sender finds it).
    pub fn prediction(
        &self,
        request: &Request,
        endpoint: EndpointId,
        overlaps: &Overlaps,
    ) -> Prediction {
        let key = PrefixKey::of(request, self.share_across_tenants);
        let by_tokens = match &self.index {
            Index::Radix { key: by, .. } => {
                matches!(
                    (*by, key.tokens.is_some()),
                    (TreeKey::Tokens, _) | (TreeKey::Auto, true)
                )
            }
            Index::Blocks { .. } => true,
        };
        let overlap = overlaps.of(endpoint);
        Prediction {
            endpoint,
            units: overlap.total().max(overlap.pending),
            held: overlap.total(),
            total: overlaps.total,
            unit: overlaps.unit,
            touched: overlap.touched,
            text_bytes: key.text.map(<[u8]>::len),
            by_tokens,
            engine: overlaps
                .engine
                .iter()
                .find(|(e, _, _)| *e == endpoint)
                .map(|&(_, tokens, live)| (tokens, live)),
            tail: overlaps.tail,
        }
    }

    /// The engine's usage said `cached_tokens` of the prompt's `prompt_tokens` came from its
    /// cache, where this index predicted `predicted` at the dispatch; the engine caches in
    /// blocks of `block` tokens. When what the index listed as held, read as the engine counts
    /// (whole blocks, at most `prompt_tokens - 1`, the tail scaled), was over by more than a
    /// block, the engine evicted what this index still listed: an index that mirrors engines
    /// forgets everything that endpoint was sent at or before the missed prefix was (LRU
    /// order). Also learns the text's bytes per token and how its tails are counted.
    pub fn correct(&mut self, predicted: &Prediction, usage: (u32, u32), block: u32) {
        let (prompt_tokens, cached_tokens) = usage;
        if let (Some(engines), Some((tokens, _))) = (&mut self.engines, predicted.engine) {
            engines.verified(predicted.endpoint, tokens == cached_tokens);
        }
        let Index::Radix {
            text,
            tokens,
            mirror: true,
            bytes_per_token,
            tail,
            ..
        } = &mut self.index
        else {
            return;
        };
        if prompt_tokens == 0 {
            return;
        }
        if let Some(bytes) = predicted.text_bytes {
            let ratio = bytes as f64 / f64::from(prompt_tokens);
            if ratio.is_finite() && ratio > 0.0 {
                *bytes_per_token += (ratio - *bytes_per_token) * 0.05;
            }
        }
        let as_engine = |units: u32, tail: TailScale| {
            let read = predicted.unit.tokens(units, predicted.total, prompt_tokens);
            let read = f64::from(tail.cached(read, prompt_tokens));
            as_reported(read, f64::from(prompt_tokens), Some(block)) as u32
        };
        let by_text = predicted.unit == Unit::Bytes;
        if by_text && predicted.units > 0 {
            let read = as_engine(predicted.units, TailScale::default());
            tail.learn(
                prompt_tokens - cached_tokens.min(prompt_tokens),
                prompt_tokens - read,
            );
        }
        let scale = if by_text { *tail } else { TailScale::default() };
        if as_engine(predicted.held, scale) <= cached_tokens.saturating_add(block) {
            return;
        }
        if predicted.by_tokens {
            tokens.evict_older(predicted.endpoint, predicted.touched);
        } else {
            text.evict_older(predicted.endpoint, predicted.touched);
        }
    }
}
