//! Token logprobs for non-streamed answers, deterministic per request, so that a cascade in
//! front of the engine has a confidence to read and a test can script it.
//!
//! Each output token's probability comes from a hash of the request's text seed and the
//! position: `p = 0.75 + 0.24 u` normally (a sure answer), `p = 0.05 + 0.25 u` under the
//! `low_confidence` fault (a degraded model hesitating on every token). The `k` alternatives
//! share the rest of the mass, halving each time (`(1 - p) / 2`, `(1 - p) / 4`, ...), so their
//! logprobs are valid and the margin between the best two tells the same story as `p`.
//!
//! The shapes are OpenAI's as vLLM returns them: chat answers carry
//! `{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}`, completions
//! `{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}`.

use crate::request::Endpoint;
use crate::tokenizer::{output_word, WORDS};
use serde_json::{json, Map, Value};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// The most alternatives a request may ask for (OpenAI's and vLLM's default bound).
pub(crate) const MAX_TOP_LOGPROBS: u32 = 20;

/// P(token) at `position` of the request with `seed`.
fn probability(seed: u64, position: u32, low: bool) -> f64 {
    let h = xxh3_64_with_seed(&position.to_le_bytes(), seed ^ 0x6c70_726f_6273);
    let u = (h >> 11) as f64 / (1u64 << 53) as f64;
    if low {
        0.05 + 0.25 * u
    } else {
        0.75 + 0.24 * u
    }
}

/// The chosen token and its `top` alternatives, as (word, logprob), chosen first.
fn position(seed: u64, i: u32, top: u32, low: bool) -> Vec<(&'static str, f64)> {
    let word = output_word(seed, i);
    let p = probability(seed, i, low);
    let mut out = vec![(word, p.ln())];
    let start = WORDS.iter().position(|w| *w == word).unwrap_or(0);
    let mut rest = 1.0 - p;
    for j in 0..top.min(WORDS.len() as u32 - 1) {
        rest /= 2.0;
        let alt = WORDS[(start + 1 + j as usize) % WORDS.len()];
        out.push((alt, rest.ln()));
    }
    out
}

/// The `logprobs` object of an answer of `tokens` tokens with `top` alternatives each.
pub(crate) fn json(endpoint: Endpoint, seed: u64, tokens: u32, top: u32, low: bool) -> Value {
    let positions = (0..tokens).map(|i| position(seed, i, top, low));
    match endpoint {
        Endpoint::Chat => {
            let entry =
                |(w, lp): (&str, f64)| json!({"token": w, "logprob": lp, "bytes": w.as_bytes()});
            let content: Vec<Value> = positions
                .map(|pos| {
                    let mut e = entry(pos[0]);
                    // The chosen token heads `top_logprobs` only when it is among the best
                    // `top`; the list is sorted by logprob as the API returns it.
                    let mut alts: Vec<_> = pos.to_vec();
                    alts.sort_by(|a, b| b.1.total_cmp(&a.1));
                    alts.truncate(top as usize);
                    e["top_logprobs"] = alts.into_iter().map(entry).collect();
                    e
                })
                .collect();
            json!({ "content": content })
        }
        Endpoint::Completions => {
            let (mut words, mut lps, mut tops, mut offsets) = (vec![], vec![], vec![], vec![]);
            let mut offset = 0;
            for pos in positions {
                words.push(pos[0].0);
                lps.push(pos[0].1);
                offsets.push(offset);
                offset += pos[0].0.len();
                let mut alts: Vec<_> = pos.clone();
                alts.sort_by(|a, b| b.1.total_cmp(&a.1));
                alts.truncate(top as usize);
                let map: Map<String, Value> = alts
                    .into_iter()
                    .map(|(w, lp)| (w.to_owned(), json!(lp)))
                    .collect();
                tops.push(Value::Object(map));
            }
            json!({"tokens": words, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_deterministic_valid_and_low_under_the_fault() {
        let sure = json(Endpoint::Chat, 9, 8, 2, false);
        assert_eq!(sure, json(Endpoint::Chat, 9, 8, 2, false));
        let content = sure["content"].as_array().unwrap();
        assert_eq!(content.len(), 8);
        for (i, t) in content.iter().enumerate() {
            assert_eq!(t["token"], output_word(9, i as u32));
            let lp = t["logprob"].as_f64().unwrap();
            assert!((0.75f64.ln()..=0.0).contains(&lp), "{lp}");
            let tops = t["top_logprobs"].as_array().unwrap();
            assert_eq!(tops.len(), 2);
            assert_eq!(tops[0]["token"], t["token"], "the sure token leads");
            let mass: f64 = tops
                .iter()
                .map(|x| x["logprob"].as_f64().unwrap().exp())
                .sum();
            assert!(mass <= 1.0 + 1e-9);
        }
        let low = json(Endpoint::Chat, 9, 8, 0, true);
        for t in low["content"].as_array().unwrap() {
            assert!(t["logprob"].as_f64().unwrap() < 0.3f64.ln() + 1e-9);
            assert!(t["top_logprobs"].as_array().unwrap().is_empty());
        }
        let text = json(Endpoint::Completions, 9, 3, 1, false);
        assert_eq!(text["tokens"].as_array().unwrap().len(), 3);
        assert_eq!(text["text_offset"][1], output_word(9, 0).len());
    }
}
