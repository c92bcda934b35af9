//! The heads of a staged continuation: its prompt cut into growing prefixes, each sent as a
//! one-token warm-up before the continuation itself (`resume.stage_tokens`, 512 by default;
//! the sending is `crate::relay`'s).
//!
//! A continuation is a full prefill of the prompt and the text so far, and an engine admits
//! waiting prompts first come first served. Each head is placed like a continuation (the
//! `per_endpoint` limit, the yield to requests awaiting their first token), so new requests
//! are admitted between the heads; each head finds the one before it cached and computes only
//! its own piece. The sim measured this (`kvgate sim --scenario replica-loss --set
//! resume_stage_tokens=512`, 10 seeds, docs/routing.md, Limits): the median ratio of the TTFT
//! P95 after a lost replica to before 1.65x -> 1.42x, the continued streams' median wait
//! 1.5 -> 2.1 s.
//!
//! Heads go only to endpoints whose engine metrics the gateway reads (vLLM, SGLang): what
//! they warm is an engine's prefix cache, and a hosted API behind the gateway may bill each
//! head's prompt or refuse `continue_final_message`. With none, the continuation is not staged.
//!
//! A head is the request cut at a word's end: chat keeps the messages before the cut and the
//! one it falls in, truncated and left open (`continue_final_message`), so the head renders to
//! a prefix of the continuation's prompt with no end of turn after it; a completion keeps the
//! prompt's first bytes. Cut just before a blank, a head's last token is a whole word, as a
//! BPE tokenizer (and the emulated engine's) would cut the full text there too.

use crate::parse::Api;
use bytes::Bytes;
use kvgate_core::dispatch::head_held;
use serde_json::{Map, Value};

/// The warm-up bodies of a continuation, built one at a time as they are sent: a head is
/// about as large as the text it keeps, and a long prompt has many, so building them all at
/// once would hold the prompt's size times their number.
#[derive(Debug)]
pub(crate) struct Heads {
    fields: Map<String, Value>,
    api: Api,
    /// Where each head ends: the message and the byte offset in its text.
    cuts: std::vec::IntoIter<(usize, usize)>,
    /// Bytes of text each head adds.
    piece_bytes: usize,
}

/// One head: its fields, and the length of the prefix key the gateway gives it. Only a head
/// that is sent is serialized.
#[derive(Debug)]
pub(crate) struct Head {
    fields: Map<String, Value>,
    key_len: Option<usize>,
}

impl Head {
    /// The head as a request body.
    pub(crate) fn body(&self) -> Option<Bytes> {
        serde_json::to_vec(&self.fields).ok().map(Bytes::from)
    }
}

impl Heads {
    /// Whether there is no head to send.
    pub(crate) fn is_empty(&self) -> bool {
        self.cuts.len() == 0
    }

    /// Where the next head ends, if any is left: the message and the byte offset in its text.
    pub(crate) fn next_cut(&mut self) -> Option<(usize, usize)> {
        self.cuts.next()
    }

    /// The head that ends at `cut`.
    pub(crate) fn head(&self, (message, at): (usize, usize)) -> Option<Head> {
        let fields = head(&self.fields, self.api, message, at)?;
        Some(Head {
            key_len: crate::parse::key_len(&fields, self.api),
            fields,
        })
    }

    /// Whether `head` is predicted cached where its prompt's key is predicted held to `held`
    /// bytes, but for under a quarter of a piece: sent, it would warm nothing.
    pub(crate) fn held(&self, head: &Head, held: Option<usize>) -> bool {
        match (head.key_len, held) {
            // The head's key ends in its message's closing newline, which the prompt's has
            // further on.
            (Some(len), Some(held)) => head_held(len.saturating_sub(held + 1), self.piece_bytes),
            _ => false,
        }
    }
}

impl Iterator for Heads {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        let cut = self.cuts.next()?;
        self.head(cut)?.body()
    }
}

/// The heads of `body` (a continuation as [`super::splice::continuation`] builds it), growing
/// by about `piece_bytes` of text each; the last ends at least `piece_bytes` before the end of
/// the text, so the continuation itself still computes a piece. None when the body cannot be
/// cut (content that is not text, a token prompt) or is shorter than two pieces.
pub(crate) fn heads(body: &[u8], api: Api, piece_bytes: usize) -> Heads {
    let fields = serde_json::from_slice::<Map<String, Value>>(body).unwrap_or_default();
    let cuts = texts(&fields, api).map_or_else(Vec::new, |texts| cuts(&texts, piece_bytes));
    Heads {
        fields,
        api,
        cuts: cuts.into_iter(),
        piece_bytes: piece_bytes.max(1),
    }
}

fn cuts(texts: &[&str], piece_bytes: usize) -> Vec<(usize, usize)> {
    let total: usize = texts.iter().map(|t| t.len()).sum();
    let piece_bytes = piece_bytes.max(1);
    let mut out: Vec<(usize, usize)> = Vec::new();
    let mut goal = piece_bytes;
    while goal + piece_bytes <= total {
        let Some(end) = cut(texts, goal) else {
            break;
        };
        // A word longer than a piece gives the same cut twice.
        if out.last() != Some(&end) {
            out.push(end);
        }
        goal += piece_bytes;
    }
    out
}

/// The text of each message (chat) or of the prompt (completions), in the order rendered;
/// `None` when some part is not plain text.
fn texts(fields: &Map<String, Value>, api: Api) -> Option<Vec<&str>> {
    match api {
        Api::Chat => match fields.get("messages")? {
            Value::Array(messages) => messages
                .iter()
                .map(|m| m.get("content").and_then(Value::as_str))
                .collect(),
            _ => None,
        },
        Api::Completions => match fields.get("prompt")? {
            Value::String(p) => Some(vec![p.as_str()]),
            Value::Array(items) if items.len() == 1 => items[0].as_str().map(|p| vec![p]),
            _ => None,
        },
    }
}

/// Where the head of about `goal` bytes of text ends: the message it ends in and the byte
/// offset in that message's text, just before the last blank at or before `goal` (a head
/// with no blank to cut at before `goal` ends at the previous message's end).
fn cut(texts: &[&str], goal: usize) -> Option<(usize, usize)> {
    let mut before = 0;
    for (k, text) in texts.iter().enumerate() {
        if before + text.len() >= goal {
            let within = goal - before;
            let at = text[..floor_char_boundary(text, within)]
                .rfind(char::is_whitespace)
                .map(|b| text[..b].trim_end().len());
            return match at {
                Some(at) if at > 0 => Some((k, at)),
                _ if k > 0 => Some((k - 1, texts[k - 1].len())),
                _ => None,
            };
        }
        before += text.len();
    }
    None
}

fn floor_char_boundary(text: &str, at: usize) -> usize {
    (0..=at.min(text.len()))
        .rev()
        .find(|&b| text.is_char_boundary(b))
        .unwrap_or(0)
}

/// The warm-up body whose text ends in message `message` at byte `at`: one token, not
/// streamed, the rest of the request's fields as they are (tools and system text render as
/// in the continuation). Only the messages it keeps are copied.
fn head(
    fields: &Map<String, Value>,
    api: Api,
    message: usize,
    at: usize,
) -> Option<Map<String, Value>> {
    let text = match api {
        Api::Chat => "messages",
        Api::Completions => "prompt",
    };
    let mut out: Map<String, Value> = fields
        .iter()
        .filter(|(k, _)| *k != text)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let cut = |s: &str| Value::String(s[..at].to_owned());
    match (api, fields.get(text)?) {
        (Api::Chat, Value::Array(messages)) => {
            let mut kept = messages.get(..=message)?.to_vec();
            let last = kept.last_mut()?.as_object_mut()?;
            let content = cut(last.get("content")?.as_str()?);
            last.insert("content".into(), content);
            out.insert("messages".into(), Value::Array(kept));
            out.insert("continue_final_message".into(), Value::Bool(true));
            out.insert("add_generation_prompt".into(), Value::Bool(false));
        }
        (Api::Completions, Value::String(p)) => {
            out.insert("prompt".into(), cut(p));
        }
        (Api::Completions, Value::Array(items)) => {
            out.insert(
                "prompt".into(),
                Value::Array(vec![cut(items.first()?.as_str()?)]),
            );
        }
        _ => return None,
    }
    one_token(&mut out);
    Some(out)
}

/// Makes a request's fields ask for one token, not streamed: a warm-up.
pub(crate) fn one_token(fields: &mut Map<String, Value>) {
    for key in ["stream_options", "min_tokens", "max_completion_tokens"] {
        fields.remove(key);
    }
    fields.insert("stream".into(), Value::Bool(false));
    fields.insert("max_tokens".into(), Value::from(1));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &Bytes) -> Map<String, Value> {
        serde_json::from_slice(body).unwrap()
    }

    fn chat(messages: &[(&str, &str)]) -> Vec<u8> {
        let messages: Vec<Value> = messages
            .iter()
            .map(|(role, content)| serde_json::json!({"role": role, "content": content}))
            .collect();
        serde_json::to_vec(&serde_json::json!({
            "model": "m", "messages": messages, "stream": true,
            "stream_options": {"include_usage": true}, "max_tokens": 200,
            "continue_final_message": true, "add_generation_prompt": false,
            "tools": [{"type": "function"}],
        }))
        .unwrap()
    }

    #[test]
    fn chat_heads_are_prefixes_cut_at_word_ends_and_left_open() {
        let system = "alpha beta gamma delta";
        let user = "one two three four five six seven eight";
        let said = "nine ten eleven";
        let body = chat(&[("system", system), ("user", user), ("assistant", said)]);
        let heads: Vec<Bytes> = heads(&body, Api::Chat, 16).collect();
        // 76 bytes of text in pieces of 16: heads end near 16, 32 and 48 bytes (one at 64
        // would leave less than a piece to the continuation).
        assert_eq!(heads.len(), 3);
        let full = [system, user, said].concat();
        let mut last_len = 0;
        for h in &heads {
            let f = parse(h);
            assert_eq!(f["stream"], Value::Bool(false));
            assert_eq!(f["max_tokens"], Value::from(1));
            assert_eq!(f["continue_final_message"], Value::Bool(true));
            assert_eq!(f["add_generation_prompt"], Value::Bool(false));
            assert!(f.get("stream_options").is_none());
            assert_eq!(f["tools"], serde_json::json!([{"type": "function"}]));
            let messages = f["messages"].as_array().unwrap();
            let text: String = messages
                .iter()
                .map(|m| m["content"].as_str().unwrap())
                .collect();
            assert!(full.starts_with(&text), "{text:?} is not a prefix");
            assert!(text.len() > last_len, "heads grow");
            last_len = text.len();
            let open = messages.last().unwrap()["content"].as_str().unwrap();
            assert!(!open.ends_with(' ') && !open.is_empty());
            let next = full[text.len()..].chars().next();
            assert!(
                next.is_none_or(char::is_whitespace)
                    || open.len() == [system, user, said][messages.len() - 1].len(),
                "cut inside a word: {open:?}"
            );
        }
        assert!(last_len <= full.len() - 16);
    }

    #[test]
    fn completion_heads_cut_the_prompt_and_token_prompts_are_left_alone() {
        let body = br#"{"prompt":"the quick brown fox jumps over the lazy dog again","stream":true,"max_tokens":9}"#;
        let heads: Vec<Bytes> = heads(body, Api::Completions, 12).collect();
        let prompts: Vec<String> = heads
            .iter()
            .map(|h| parse(h)["prompt"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(
            prompts,
            [
                "the quick",
                "the quick brown fox",
                "the quick brown fox jumps over the"
            ]
        );
        assert!(super::heads(br#"{"prompt":[1,2,3,4,5,6]}"#, Api::Completions, 1).is_empty());
        let parts =
            br#"{"messages":[{"role":"user","content":[{"type":"text","text":"a b c d"}]}]}"#;
        assert!(super::heads(parts, Api::Chat, 1).is_empty());
    }

    #[test]
    fn a_prompt_shorter_than_two_pieces_is_not_staged() {
        let body = chat(&[("user", "short prompt here")]);
        assert!(heads(&body, Api::Chat, 16).is_empty());
        assert!(!heads(&body, Api::Chat, 8).is_empty());
    }

    #[test]
    fn a_word_longer_than_a_piece_ends_a_head_at_the_message_before() {
        let body = chat(&[
            ("user", "ab"),
            ("user", "abcdefghijklmnopqrstuvwxyz0123456789"),
        ]);
        let heads: Vec<Bytes> = heads(&body, Api::Chat, 10).collect();
        assert_eq!(heads.len(), 1, "one head, not one per piece");
        let f = parse(&heads[0]);
        assert_eq!(f["messages"].as_array().unwrap().len(), 1);
        assert_eq!(f["messages"][0]["content"], "ab");
    }

    #[test]
    fn cuts_respect_multibyte_characters() {
        let body = chat(&[("user", "é é é é é é é é é é é é é é é é")]);
        for h in heads(&body, Api::Chat, 5) {
            let text = parse(&h)["messages"][0]["content"]
                .as_str()
                .unwrap()
                .to_owned();
            assert!(text.ends_with('é'));
        }
    }
}
