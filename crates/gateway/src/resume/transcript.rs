//! What a resumable stream has told the client: whole events only ([`EventCut`]), and from
//! them the text so far and the chunk metadata a continuation must keep ([`Transcript`]).

use crate::parse::Api;
use bytes::{Bytes, BytesMut};
use kvgate_sse::{Event, Reader};
use serde::de::IgnoredAny;
use serde::Deserialize;
use std::borrow::Cow;

/// Passes the bytes of a server-sent-events body up to the end of its last complete event
/// (a blank line) and holds the rest until its end arrives: a stream that breaks then leaves
/// the client at an event boundary, where a continuation can begin.
#[derive(Debug, Default)]
pub(crate) struct EventCut {
    reader: Reader,
    partial: BytesMut,
}

impl EventCut {
    /// The whole events `data` completes (none copied when it holds whole events only, as
    /// engines write them).
    pub(crate) fn push(&mut self, data: &Bytes) -> Bytes {
        // Engines end every write with an event's end, and with nothing held the reader is at
        // one too: LF LF then ends at a blank line whatever came before, so the bytes need no
        // reading (the reader's offsets serve only as differences).
        if self.partial.is_empty() && data.ends_with(b"\n\n") {
            return data.clone();
        }
        let from = self.reader.boundary();
        self.reader.advance(data);
        let end = usize::try_from(self.reader.boundary() - from).unwrap_or(usize::MAX);
        if self.partial.is_empty() {
            if end < data.len() {
                self.partial.extend_from_slice(&data[end..]);
            }
            return data.slice(..end);
        }
        self.partial.extend_from_slice(data);
        self.partial.split_to(end).freeze()
    }

    /// Whatever is held back.
    pub(crate) fn take(&mut self) -> Bytes {
        self.reader.finish();
        std::mem::take(&mut self.partial).freeze()
    }
}

/// A reader of whole events: the cut hands out only those, so their data is borrowed from the
/// bytes that hold them, not copied, and needs no limit of its own. Each piece read is
/// finished, so an event ended by a lone CR is not held for an LF (nor is the last bytes' event
/// left unread).
pub(crate) fn whole_events() -> Reader {
    Reader::with_limit(usize::MAX)
}

#[derive(Deserialize)]
struct Chunk<'a> {
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(default)]
    created: Option<u64>,
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    choices: Vec<Choice<'a>>,
    #[serde(default)]
    error: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(default)]
    index: u64,
    #[serde(borrow, default)]
    delta: Option<Delta<'a>>,
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(default)]
    logprobs: Option<IgnoredAny>,
    #[serde(borrow, default)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(borrow, default)]
    content: Option<Cow<'a, str>>,
    #[serde(default)]
    tool_calls: Option<Vec<IgnoredAny>>,
    #[serde(default)]
    function_call: Option<IgnoredAny>,
    #[serde(borrow, default)]
    reasoning_content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    reasoning: Option<Cow<'a, str>>,
}

/// Events recorded but not yet read are read once this many bytes wait (or when the stream
/// breaks): most answers are read only if they break, and a long one holds at most this much
/// raw.
const READ_AT: usize = 64 * 1024;

/// The stream as the client has it: chunk metadata, the text so far, chunks that carried
/// text (one token each in vLLM's default streaming), whether it finished, and why it cannot
/// be continued if it cannot. Events are kept as they came and read in batches
/// ([`Transcript::read`] before any question): parsing every chunk as it passes would cost
/// the gateway's streaming throughput a fifth (`loadgen --stream`, measured).
#[derive(Debug)]
pub(crate) struct Transcript {
    api: Api,
    limit: usize,
    reader: Reader,
    unread: Vec<Bytes>,
    unread_bytes: usize,
    pub(crate) id: Option<String>,
    pub(crate) created: Option<u64>,
    pub(crate) model: Option<String>,
    text: String,
    tokens: u32,
    finished: bool,
    done: bool,
    blocked: Option<&'static str>,
}

impl Transcript {
    /// An empty transcript keeping at most `limit` bytes of text.
    pub(crate) fn new(api: Api, limit: usize) -> Self {
        Transcript {
            api,
            limit,
            reader: whole_events(),
            unread: Vec::new(),
            unread_bytes: 0,
            id: None,
            created: None,
            model: None,
            text: String::new(),
            tokens: 0,
            finished: false,
            done: false,
            blocked: None,
        }
    }

    /// Keeps whole events the client received, to read later.
    pub(crate) fn record(&mut self, data: &Bytes) {
        if self.blocked.is_some() || data.is_empty() {
            return;
        }
        self.unread_bytes += data.len();
        self.unread.push(data.clone());
        if self.unread_bytes >= READ_AT {
            self.read();
        }
    }

    /// Reads what was recorded; the questions below answer for what has been read.
    pub(crate) fn read(&mut self) {
        self.unread_bytes = 0;
        for data in std::mem::take(&mut self.unread) {
            self.read_events(&data);
        }
    }

    fn read_events(&mut self, data: &[u8]) {
        if self.blocked.is_some() {
            return;
        }
        let mut reader = std::mem::take(&mut self.reader);
        let mut feed = reader.feed(data);
        let mut read = Ok(());
        while let Some(event) = feed.next_event() {
            read = self.event(event);
            if read.is_err() {
                break;
            }
        }
        drop(feed);
        if let (Ok(()), Some(event)) = (&read, reader.finish()) {
            read = self.event(Ok(event));
        }
        self.reader = reader;
        if let Err(why) = read {
            self.blocked = Some(why);
            self.text = String::new();
        }
    }

    fn event(&mut self, event: Result<Event<'_>, kvgate_sse::Error>) -> Result<(), &'static str> {
        match event {
            Ok(Event::Done(_)) => {
                self.done = true;
                Ok(())
            }
            Ok(Event::Data(d)) => self.chunk(d.data()),
            Err(_) => Err("too_long"),
        }
    }

    fn chunk(&mut self, value: &[u8]) -> Result<(), &'static str> {
        let chunk: Chunk<'_> = serde_json::from_slice(value).map_err(|_| "unparsed_chunk")?;
        if chunk.error.is_some() {
            return Err("error_event");
        }
        if self.id.is_none() {
            self.id = chunk.id.map(Cow::into_owned);
            self.created = chunk.created;
            self.model = chunk.model.map(Cow::into_owned);
        }
        for choice in &chunk.choices {
            if choice.index != 0 {
                return Err("n");
            }
            if choice.logprobs.is_some() {
                return Err("logprobs");
            }
            let text = match (self.api, &choice.delta) {
                (Api::Chat, Some(d)) => {
                    if d.tool_calls.as_ref().is_some_and(|t| !t.is_empty())
                        || d.function_call.is_some()
                    {
                        return Err("tool_calls");
                    }
                    let thinking = [&d.reasoning_content, &d.reasoning];
                    if thinking
                        .iter()
                        .any(|r| r.as_ref().is_some_and(|r| !r.is_empty()))
                    {
                        return Err("reasoning");
                    }
                    d.content.as_deref()
                }
                (Api::Chat, None) => None,
                (Api::Completions, _) => choice.text.as_deref(),
            };
            if let Some(text) = text.filter(|t| !t.is_empty()) {
                if self.text.len() + text.len() > self.limit {
                    return Err("too_long");
                }
                self.text.push_str(text);
                self.tokens = self.tokens.saturating_add(1);
            }
            self.finished |= choice.finish_reason.is_some();
        }
        Ok(())
    }

    /// The text streamed so far.
    pub(crate) fn text(&self) -> &str {
        &self.text
    }

    /// Chunks that carried text.
    pub(crate) fn tokens(&self) -> u32 {
        self.tokens
    }

    /// A `finish_reason` came: generation ended.
    pub(crate) fn finished(&self) -> bool {
        self.finished
    }

    /// `[DONE]` came.
    pub(crate) fn done(&self) -> bool {
        self.done
    }

    /// Why the stream cannot be continued, if it cannot.
    pub(crate) fn blocked(&self) -> Option<&'static str> {
        self.blocked
    }

    /// Which API the stream answers.
    pub(crate) fn api(&self) -> Api {
        self.api
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROLE: &str = r#"data: {"id":"c1","created":7,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}"#;

    fn token(text: &str) -> String {
        format!(
            r#"data: {{"id":"c1","created":7,"model":"m","choices":[{{"index":0,"delta":{{"content":"{text}"}},"logprobs":null,"finish_reason":null}}]}}"#
        )
    }

    #[test]
    fn only_whole_events_pass_and_the_rest_waits() {
        let mut cut = EventCut::default();
        let whole = Bytes::from(format!("{ROLE}\n\n{}\n\n", token(" a")));
        assert_eq!(cut.push(&whole), whole, "whole events pass as they are");
        let two = format!("{}\n\n{}\n\n", token(" b"), token(" c"));
        // Cut inside the second event: the first passes, the second waits for its end.
        let (head, tail) = two.split_at(token(" b").len() + 12);
        let first = cut.push(&Bytes::copy_from_slice(head.as_bytes()));
        assert_eq!(first, format!("{}\n\n", token(" b")).as_bytes());
        let second = cut.push(&Bytes::copy_from_slice(tail.as_bytes()));
        assert_eq!(second, format!("{}\n\n", token(" c")).as_bytes());
        let crlf = Bytes::from_static(b"data: x\r\n\r\ndata: y");
        assert_eq!(&cut.push(&crlf)[..], b"data: x\r\n\r\n");
        assert_eq!(&cut.take()[..], b"data: y");
    }

    #[test]
    fn the_cut_ends_at_an_event_end_whatever_the_framing() {
        let (a, b) = (token(" a"), token(" b"));
        let stream = format!("{ROLE}\r\n\r\n: ping\r\r{a}\r\r{b}\n\n");
        let role = ROLE.len() + 4;
        let ends = [0, role, role + 8, role + 8 + a.len() + 2, stream.len()];
        for size in 1..stream.len() {
            let (mut cut, mut passed) = (EventCut::default(), Vec::new());
            for piece in stream.as_bytes().chunks(size) {
                passed.extend_from_slice(&cut.push(&Bytes::copy_from_slice(piece)));
                assert!(ends.contains(&passed.len()), "frames of {size}: {passed:?}");
            }
            passed.extend_from_slice(&cut.take());
            assert_eq!(passed, stream.as_bytes(), "frames of {size}");
        }
    }

    #[test]
    fn the_transcript_collects_text_and_metadata() {
        let mut t = Transcript::new(Api::Chat, 1024);
        t.record(&Bytes::from(format!(
            "{ROLE}\n\n{}\n\n{}\n\n",
            token(" the"),
            token(" cache")
        )));
        t.read();
        assert_eq!((t.text(), t.tokens()), (" the cache", 2));
        assert_eq!(
            (t.id.as_deref(), t.created, t.model.as_deref()),
            (Some("c1"), Some(7), Some("m"))
        );
        assert!(!t.finished() && t.blocked().is_none());
        t.record(&Bytes::from_static(
            br#"data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}"#,
        ));
        t.record(&Bytes::from_static(b"\n\ndata: [DONE]\n\n"));
        t.read();
        assert!(t.finished() && t.done());
    }

    #[test]
    fn what_cannot_be_continued_exactly_blocks_it() {
        let blocked = |api, event: &str| {
            let mut t = Transcript::new(api, 16);
            t.record(&Bytes::from(format!("{event}\n\n")));
            t.read();
            t.blocked()
        };
        assert_eq!(blocked(Api::Chat, &token(" fine")), None);
        let call = r#"data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"f"}}]}}]}"#;
        assert_eq!(blocked(Api::Chat, call), Some("tool_calls"));
        let empty_calls =
            r#"data: {"choices":[{"index":0,"delta":{"content":"x","tool_calls":[]}}]}"#;
        assert_eq!(blocked(Api::Chat, empty_calls), None);
        let thinking = r#"data: {"choices":[{"index":0,"delta":{"reasoning_content":"hmm"}}]}"#;
        assert_eq!(blocked(Api::Chat, thinking), Some("reasoning"));
        let second = r#"data: {"choices":[{"index":1,"delta":{"content":"x"}}]}"#;
        assert_eq!(blocked(Api::Chat, second), Some("n"));
        assert_eq!(
            blocked(Api::Chat, r#"data: {"error":{"message":"x"}}"#),
            Some("error_event")
        );
        assert_eq!(blocked(Api::Chat, "data: {oops"), Some("unparsed_chunk"));
        assert_eq!(
            blocked(Api::Chat, &token("a long answer here")),
            Some("too_long")
        );
        let text = r#"data: {"choices":[{"index":0,"text":" once","logprobs":null,"finish_reason":null}]}"#;
        let mut t = Transcript::new(Api::Completions, 16);
        t.record(&Bytes::from(format!("{text}\n\n")));
        t.read();
        assert_eq!((t.text(), t.tokens(), t.blocked()), (" once", 1, None));
    }
}
