//! The continuation request, and the rewriting of its stream into the client's.

use super::transcript::{whole_events, Transcript};
use crate::parse::Api;
use bytes::{Bytes, BytesMut};
use kvgate_core::Usage;
use kvgate_sse::{Event, Reader};
use serde_json::{Map, Value};

/// The body that continues `body` (the request as first sent) after the text of
/// `transcript`: chat gets the text as an open assistant message (`continue_final_message`;
/// appended to the client's own open assistant message if it sent one), a completion gets it
/// appended to its prompt; output limits shrink by the tokens already streamed (at least one
/// is left).
pub(crate) fn continuation(
    body: &[u8],
    api: Api,
    transcript: &Transcript,
) -> Result<Bytes, &'static str> {
    let mut fields: Map<String, Value> = serde_json::from_slice(body).map_err(|_| "body")?;
    let text = transcript.text();
    if !text.is_empty() {
        match api {
            Api::Chat => {
                let continuing = fields.get("continue_final_message") == Some(&Value::Bool(true));
                let Some(Value::Array(messages)) = fields.get_mut("messages") else {
                    return Err("body");
                };
                match messages.last_mut() {
                    Some(Value::Object(last))
                        if continuing
                            && last.get("role").and_then(Value::as_str) == Some("assistant")
                            && last.get("content").is_some_and(Value::is_string) =>
                    {
                        if let Some(Value::String(content)) = last.get_mut("content") {
                            content.push_str(text);
                        }
                    }
                    _ => messages.push(serde_json::json!({"role": "assistant", "content": text})),
                }
                fields.insert("continue_final_message".into(), Value::Bool(true));
                fields.insert("add_generation_prompt".into(), Value::Bool(false));
            }
            Api::Completions => match fields.get_mut("prompt") {
                Some(Value::String(prompt)) => prompt.push_str(text),
                Some(Value::Array(items)) if items.len() == 1 => match &mut items[0] {
                    Value::String(prompt) => prompt.push_str(text),
                    _ => return Err("token_prompt"),
                },
                _ => return Err("token_prompt"),
            },
        }
    }
    let spent = u64::from(transcript.tokens());
    for key in ["max_tokens", "max_completion_tokens"] {
        if let Some(limit) = fields.get(key).and_then(Value::as_u64) {
            fields.insert(key.into(), Value::from(limit.saturating_sub(spent).max(1)));
        }
    }
    if let Some(least) = fields.get("min_tokens").and_then(Value::as_u64) {
        fields.insert(
            "min_tokens".into(),
            Value::from(least.saturating_sub(spent)),
        );
    }
    serde_json::to_vec(&fields)
        .map(Bytes::from)
        .map_err(|_| "body")
}

/// Rewrites a continuation's events as part of the first stream: the first stream's `id`,
/// `created` and `model`; no second `role` delta (nor the empty chunk it came in); usage moved
/// by the tokens streamed before the break.
#[derive(Debug)]
pub(crate) struct Splicer {
    api: Api,
    id: Option<Value>,
    created: Option<Value>,
    model: Option<Value>,
    before: u32,
    engine_usage: Option<Usage>,
    reader: Reader,
}

impl Splicer {
    /// Splices after what `transcript` holds.
    pub(crate) fn new(transcript: &Transcript) -> Self {
        Splicer {
            api: transcript.api(),
            id: transcript.id.clone().map(Value::String),
            created: transcript.created.map(Value::from),
            model: transcript.model.clone().map(Value::String),
            before: transcript.tokens(),
            engine_usage: None,
            reader: whole_events(),
        }
    }

    /// The usage the continuation's engine reported, as it reported it.
    pub(crate) fn engine_usage(&self) -> Option<Usage> {
        self.engine_usage
    }

    /// Whole events of the continuation in (or the last bytes of its stream), the client's
    /// events out. Events that are not one JSON object, and the bytes between events, pass as
    /// they are.
    pub(crate) fn rewrite(&mut self, data: &[u8]) -> Bytes {
        let mut out = BytesMut::with_capacity(data.len());
        let base = self.reader.position();
        let mut reader = std::mem::take(&mut self.reader);
        let mut passed = 0;
        let mut feed = reader.feed(data);
        while let Some(event) = feed.next_event() {
            if let Ok(Event::Data(d)) = event {
                passed = self.splice(&mut out, data, passed, base, (d.span(), d.data()));
            }
        }
        drop(feed);
        // Whole events: one ended by a lone CR is not held for an LF.
        if let Some(Event::Data(d)) = reader.finish() {
            passed = self.splice(&mut out, data, passed, base, (d.span(), d.data()));
        }
        self.reader = reader;
        out.extend_from_slice(&data[passed..]);
        out.freeze()
    }

    /// Writes `data` from `passed` up to the event at `span` (stream offsets from `base`) and
    /// the event rewritten, when its data is a JSON object; returns how far `data` is written.
    fn splice(
        &mut self,
        out: &mut BytesMut,
        data: &[u8],
        passed: usize,
        base: u64,
        (span, value): (std::ops::Range<u64>, &[u8]),
    ) -> usize {
        let Ok(Value::Object(chunk)) = serde_json::from_slice::<Value>(value) else {
            return passed;
        };
        let at = |offset: u64| usize::try_from(offset - base).unwrap_or(data.len());
        out.extend_from_slice(&data[passed..at(span.start)]);
        if let Some(chunk) = self.chunk(chunk, value) {
            out.extend_from_slice(b"data: ");
            out.extend_from_slice(&serde_json::to_vec(&chunk).unwrap_or_default());
            out.extend_from_slice(b"\n\n");
        }
        at(span.end)
    }

    /// The client's version of one chunk, or `None` when nothing is left of it.
    fn chunk(&mut self, mut chunk: Map<String, Value>, raw: &[u8]) -> Option<Map<String, Value>> {
        for (key, value) in [
            ("id", &self.id),
            ("created", &self.created),
            ("model", &self.model),
        ] {
            if let (Some(slot), Some(v)) = (chunk.get_mut(key), value) {
                slot.clone_from(v);
            }
        }
        let has_usage = chunk.get("usage").is_some_and(Value::is_object);
        if has_usage {
            self.engine_usage = crate::usage::parse(raw);
            if let Some(Value::Object(usage)) = chunk.get_mut("usage") {
                let count = |u: &Map<String, Value>, k: &str| u.get(k).and_then(Value::as_u64);
                let before = u64::from(self.before);
                let prompt = count(usage, "prompt_tokens").map(|p| p.saturating_sub(before));
                let completion = count(usage, "completion_tokens").map(|c| c + before);
                if let (Some(p), Some(c)) = (prompt, completion) {
                    usage.insert("prompt_tokens".into(), p.into());
                    usage.insert("completion_tokens".into(), c.into());
                    if usage.contains_key("total_tokens") {
                        usage.insert("total_tokens".into(), (p + c).into());
                    }
                }
            }
        }
        if self.api == Api::Chat {
            if let Some(Value::Array(choices)) = chunk.get_mut("choices") {
                let before = choices.len();
                for choice in choices.iter_mut() {
                    if let Some(Value::Object(delta)) = choice.get_mut("delta") {
                        delta.remove("role");
                        if delta.get("content") == Some(&Value::String(String::new())) {
                            delta.remove("content");
                        }
                    }
                }
                choices.retain(|c| {
                    let empty = c
                        .get("delta")
                        .is_none_or(|d| d.as_object().is_some_and(Map::is_empty));
                    let finished = c.get("finish_reason").is_some_and(|f| !f.is_null());
                    !empty || finished
                });
                if before > 0 && choices.is_empty() && !has_usage {
                    return None;
                }
            }
        }
        Some(chunk)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transcript(api: Api, events: &str) -> Transcript {
        let mut t = Transcript::new(api, 1 << 16);
        t.record(&Bytes::copy_from_slice(events.as_bytes()));
        t.read();
        t
    }

    const FIRST: &str = concat!(
        r#"data: {"id":"c1","created":7,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#,
        "\n\n",
        r#"data: {"id":"c1","created":7,"model":"m","choices":[{"index":0,"delta":{"content":" the"},"finish_reason":null}]}"#,
        "\n\n",
        r#"data: {"id":"c1","created":7,"model":"m","choices":[{"index":0,"delta":{"content":" cache"},"finish_reason":null}]}"#,
        "\n\n"
    );

    #[test]
    fn a_chat_continues_in_an_open_assistant_message_with_smaller_limits() {
        let t = transcript(Api::Chat, FIRST);
        let body = br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":10,"min_tokens":1,"stream":true}"#;
        let next: Value =
            serde_json::from_slice(&continuation(body, Api::Chat, &t).unwrap()).unwrap();
        assert_eq!(
            next["messages"][1],
            serde_json::json!({"role": "assistant", "content": " the cache"})
        );
        assert_eq!(next["continue_final_message"], true);
        assert_eq!(next["add_generation_prompt"], false);
        assert_eq!(
            (next["max_tokens"].as_u64(), next["min_tokens"].as_u64()),
            (Some(8), Some(0))
        );
        // The client's own open assistant message grows instead.
        let own = br#"{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Sure:"}],"continue_final_message":true,"add_generation_prompt":false,"max_completion_tokens":2}"#;
        let next: Value =
            serde_json::from_slice(&continuation(own, Api::Chat, &t).unwrap()).unwrap();
        assert_eq!(next["messages"].as_array().unwrap().len(), 2);
        assert_eq!(next["messages"][1]["content"], "Sure: the cache");
        assert_eq!(next["max_completion_tokens"], 1, "one token is always left");
    }

    #[test]
    fn a_completion_continues_its_prompt_and_nothing_streamed_sends_the_request_again() {
        let events =
            r#"data: {"id":"x","choices":[{"index":0,"text":" upon","finish_reason":null}]}"#;
        let t = transcript(Api::Completions, &format!("{events}\n\n"));
        let next = continuation(
            br#"{"prompt":["Once"],"max_tokens":4}"#,
            Api::Completions,
            &t,
        )
        .unwrap();
        assert_eq!(&next[..], br#"{"prompt":["Once upon"],"max_tokens":3}"#);
        let empty = transcript(Api::Chat, "");
        let body = br#"{"messages":[{"role":"user","content":"hi"}]}"#;
        assert_eq!(
            &continuation(body, Api::Chat, &empty).unwrap()[..],
            &body[..]
        );
    }

    #[test]
    fn the_continuation_takes_the_first_streams_identity_and_usage_counts_both() {
        let t = transcript(Api::Chat, FIRST);
        let mut splicer = Splicer::new(&t);
        let second = concat!(
            r#"data: {"id":"c2","created":9,"model":"m2","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#,
            "\n\n",
            r#"data: {"id":"c2","created":9,"model":"m2","choices":[{"index":0,"delta":{"content":" is"},"finish_reason":"length"}]}"#,
            "\n\n",
            r#"data: {"id":"c2","created":9,"model":"m2","choices":[],"usage":{"prompt_tokens":12,"total_tokens":13,"completion_tokens":1}}"#,
            "\n\n",
            "data: [DONE]\n\n"
        );
        let out = splicer.rewrite(second.as_bytes());
        let text = String::from_utf8(out.to_vec()).unwrap();
        let chunks: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
        assert_eq!(chunks.len(), 3, "the role chunk is gone: {text}");
        let first: Value = serde_json::from_str(&chunks[0]["data: ".len()..]).unwrap();
        assert_eq!(
            (
                first["id"].as_str(),
                first["created"].as_u64(),
                first["model"].as_str()
            ),
            (Some("c1"), Some(7), Some("m"))
        );
        assert_eq!(
            first["choices"][0]["delta"],
            serde_json::json!({"content": " is"})
        );
        let usage: Value = serde_json::from_str(&chunks[1]["data: ".len()..]).unwrap();
        assert_eq!(
            usage["usage"],
            serde_json::json!({"prompt_tokens": 10, "total_tokens": 13, "completion_tokens": 3})
        );
        assert_eq!(chunks[2], "data: [DONE]");
        let engine = splicer.engine_usage().unwrap();
        assert_eq!((engine.prompt_tokens, engine.output_tokens), (12, 1));
    }

    #[test]
    fn events_ended_by_a_lone_cr_are_rewritten_as_they_come() {
        let t = transcript(Api::Chat, FIRST);
        let mut splicer = Splicer::new(&t);
        let token = |text: &str| {
            format!(
                r#"data: {{"id":"c2","choices":[{{"index":0,"delta":{{"content":"{text}"}}}}]}}"#
            )
        };
        let mut out = Vec::new();
        for piece in [token(" is"), token(" it")] {
            out.extend_from_slice(&splicer.rewrite(format!("{piece}\r\r").as_bytes()));
        }
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.matches(r#""id":"c1""#).count(), 2, "{text}");
        assert!(!text.contains("c2"), "{text}");
    }
}
