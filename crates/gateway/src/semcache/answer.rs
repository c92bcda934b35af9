//! Answers as the cache keeps them: the bytes the client was sent (a JSON completion, or a
//! whole event stream through `data: [DONE]`), recorded only when complete.
//!
//! A stored stream is replayed as it was recorded: its `chat.completion.chunk` frames, its
//! usage chunk when the client asked for one (whether it did is part of the fingerprint),
//! and `[DONE]`. A request and its replay therefore differ in nothing but timing.

use bytes::{Bytes, BytesMut};
use serde_json::Value;
use std::collections::BTreeMap;

/// A complete answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Answer {
    /// A server-sent-events stream, else a JSON body.
    pub(crate) sse: bool,
    /// The bytes.
    pub(crate) body: Bytes,
}

impl Answer {
    /// The content type to replay it with.
    pub(crate) fn content_type(&self) -> &'static str {
        if self.sse {
            "text/event-stream"
        } else {
            "application/json"
        }
    }
}

/// Why an answer was not stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unstored {
    /// Longer than `max_entry_bytes`.
    TooLarge,
    /// An error, a stream without `[DONE]`, a choice that did not finish with `stop` or
    /// `length` (a tool call, a content filter), or not a completion at all.
    Incomplete,
}

impl Unstored {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Unstored::TooLarge => "too_large",
            Unstored::Incomplete => "incomplete",
        }
    }
}

/// Watches the bytes a client is sent and keeps them while they may become an entry.
#[derive(Debug)]
pub(crate) struct Recorder {
    sse: bool,
    limit: usize,
    bytes: BytesMut,
    over: bool,
    reader: kvgate_sse::Reader,
    finish: BTreeMap<u64, Option<String>>,
    error: bool,
    done: bool,
}

impl Recorder {
    pub(crate) fn new(sse: bool, limit: usize) -> Self {
        Recorder {
            sse,
            limit,
            bytes: BytesMut::new(),
            over: false,
            reader: kvgate_sse::Reader::new(),
            finish: BTreeMap::new(),
            error: false,
            done: false,
        }
    }

    /// Takes the next bytes sent; true once a stream's `[DONE]` went by (the answer is
    /// whole: a client may close without reading further).
    pub(crate) fn feed(&mut self, data: &[u8]) -> bool {
        if self.over || self.bytes.len() + data.len() > self.limit {
            self.over = true;
            self.bytes = BytesMut::new();
            return false;
        }
        self.bytes.extend_from_slice(data);
        if self.sse {
            let mut feed = self.reader.feed(data);
            while let Some(event) = feed.next_event() {
                match event {
                    Ok(kvgate_sse::Event::Done(_)) => self.done = true,
                    Ok(kvgate_sse::Event::Data(d)) => match serde_json::from_slice(d.data()) {
                        Ok(chunk) => note(&chunk, &mut self.finish, &mut self.error),
                        Err(_) => self.error = true,
                    },
                    Err(_) => self.error = true,
                }
            }
        }
        self.done
    }

    /// The answer, if the bytes seen make a complete one.
    pub(crate) fn finish(self) -> Result<Answer, Unstored> {
        if self.over {
            return Err(Unstored::TooLarge);
        }
        let mut finish = self.finish;
        let mut error = self.error;
        if !self.sse {
            match serde_json::from_slice::<Value>(&self.bytes) {
                Ok(body) => note(&body, &mut finish, &mut error),
                Err(_) => error = true,
            }
        } else if !self.done {
            return Err(Unstored::Incomplete);
        }
        let finished = |r: &Option<String>| matches!(r.as_deref(), Some("stop" | "length"));
        if error || finish.is_empty() || !finish.values().all(finished) {
            return Err(Unstored::Incomplete);
        }
        Ok(Answer {
            sse: self.sse,
            body: self.bytes.freeze(),
        })
    }
}

/// Notes each choice's `finish_reason` of a chunk or completion, and any error in it.
fn note(value: &Value, finish: &mut BTreeMap<u64, Option<String>>, error: &mut bool) {
    if value.get("error").is_some_and(|e| !e.is_null()) {
        *error = true;
    }
    let Some(choices) = value.get("choices").and_then(Value::as_array) else {
        if value.get("usage").is_none() {
            *error = true;
        }
        return;
    };
    for choice in choices {
        let index = choice.get("index").and_then(Value::as_u64).unwrap_or(0);
        let reason = choice
            .get("finish_reason")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let slot = finish.entry(index).or_default();
        if reason.is_some() {
            *slot = reason;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(content: &str, finish: Option<&str>) -> String {
        let finish = finish.map_or("null".to_string(), |f| format!("\"{f}\""));
        format!(
            "data: {{\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{content}\"}},\"finish_reason\":{finish}}}]}}\n\n"
        )
    }

    #[test]
    fn a_whole_stream_is_kept_as_sent() {
        let mut r = Recorder::new(true, 1 << 20);
        let stream = format!(
            "{}{}data: [DONE]\n\n",
            chunk("Hel", None),
            chunk("lo", Some("stop"))
        );
        let (a, b) = stream.split_at(20);
        assert!(!r.feed(a.as_bytes()));
        assert!(r.feed(b.as_bytes()), "done once [DONE] went by");
        let answer = r.finish().unwrap();
        assert_eq!(answer.body, stream.as_bytes());
    }

    #[test]
    fn incomplete_answers_are_not_kept() {
        let mut cut = Recorder::new(true, 1 << 20);
        cut.feed(chunk("Hel", None).as_bytes());
        assert_eq!(cut.finish(), Err(Unstored::Incomplete));
        let mut tool = Recorder::new(true, 1 << 20);
        tool.feed(format!("{}data: [DONE]\n\n", chunk("", Some("tool_calls"))).as_bytes());
        assert_eq!(tool.finish(), Err(Unstored::Incomplete));
        let mut broken = Recorder::new(true, 1 << 20);
        broken.feed(b"data: {\"error\":{\"message\":\"boom\"}}\n\ndata: [DONE]\n\n");
        assert_eq!(broken.finish(), Err(Unstored::Incomplete));
        let mut big = Recorder::new(false, 10);
        big.feed(b"{\"choices\":[{\"finish_reason\":\"stop\"}]}");
        assert_eq!(big.finish(), Err(Unstored::TooLarge));
    }

    #[test]
    fn a_json_completion_is_kept_when_every_choice_finished() {
        let body = br#"{"object":"chat.completion","choices":[
            {"index":0,"message":{"content":"a"},"finish_reason":"stop"},
            {"index":1,"message":{"content":"b"},"finish_reason":"length"}]}"#;
        let mut r = Recorder::new(false, 1 << 20);
        r.feed(body);
        assert!(r.finish().is_ok());
        let mut filtered = Recorder::new(false, 1 << 20);
        filtered.feed(br#"{"choices":[{"finish_reason":"content_filter"}]}"#);
        assert_eq!(filtered.finish(), Err(Unstored::Incomplete));
    }
}
