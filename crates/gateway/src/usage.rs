//! The engine's `usage` in a response, and the usage chunk the gateway asked for on the
//! client's behalf.
//!
//! Usage (prompt, cached and output tokens) is the one exact signal of whether a routing guess
//! hit the cache, so the gateway reads it from every answer: the last `"usage":{...}` object of
//! a non-streaming body, or of a stream's final chunk. Only the tail of a body is kept (usage
//! comes last in vLLM's and OpenAI's answers), so a long answer costs no memory.
//!
//! When the client did not ask for usage on a stream, the gateway asked for it
//! (`stream_options.include_usage`) and [`UsageStripper`] removes that chunk, the event whose
//! data has `"choices":[]` and a `"usage"` object, so the client sees the stream it asked for.

use bytes::{Bytes, BytesMut};
use kvgate_core::Usage;
use kvgate_sse::{Event, Reader};

/// Bytes of a body's tail kept for its usage.
const TAIL: usize = 16 * 1024;

/// The last [`TAIL`] bytes of a body.
#[derive(Debug, Default)]
pub(crate) struct UsageTail {
    tail: Vec<u8>,
}

impl UsageTail {
    /// Records the next bytes of the body.
    pub(crate) fn feed(&mut self, data: &[u8]) {
        if data.len() >= TAIL {
            self.tail.clear();
            self.tail.extend_from_slice(&data[data.len() - TAIL..]);
            return;
        }
        let overflow = (self.tail.len() + data.len()).saturating_sub(TAIL);
        self.tail.drain(..overflow);
        self.tail.extend_from_slice(data);
    }

    /// The last usage object seen, if any.
    pub(crate) fn usage(&self) -> Option<Usage> {
        parse(&self.tail)
    }
}

/// The numbers of the last non-null `"usage"` object in `data`.
pub(crate) fn parse(data: &[u8]) -> Option<Usage> {
    const KEY: &[u8] = b"\"usage\"";
    let mut at = data.len();
    loop {
        let start = find_last(&data[..at], KEY)?;
        let rest = skip_blanks_and_colon(&data[start + KEY.len()..]);
        if rest.first() == Some(&b'{') {
            let object = &rest[..object_len(rest)];
            let number = |key: &[u8]| field(object, key);
            return Some(Usage {
                prompt_tokens: number(b"\"prompt_tokens\"")?,
                // OpenAI and vLLM: prompt_tokens_details.cached_tokens; Anthropic-style
                // providers: cache_read_input_tokens.
                cached_tokens: number(b"\"cached_tokens\"")
                    .or_else(|| number(b"\"cache_read_input_tokens\"")),
                output_tokens: number(b"\"completion_tokens\"").unwrap_or(0),
            });
        }
        at = start;
    }
}

fn find_last(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).rposition(|w| w == needle)
}

fn skip_blanks_and_colon(s: &[u8]) -> &[u8] {
    let n = s
        .iter()
        .take_while(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r' | b':'))
        .count();
    &s[n..]
}

/// The length of the JSON object at the start of `s` (up to the end when it is cut off).
fn object_len(s: &[u8]) -> usize {
    let (mut depth, mut in_string, mut escaped) = (0i32, false, false);
    for (i, &b) in s.iter().enumerate() {
        match (in_string, b) {
            (true, _) if escaped => escaped = false,
            (true, b'\\') => escaped = true,
            (true, b'"') => in_string = false,
            (true, _) => {}
            (false, b'"') => in_string = true,
            (false, b'{') => depth += 1,
            (false, b'}') => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
    }
    s.len()
}

/// The unsigned integer after `"key":` in `object`.
fn field(object: &[u8], key: &[u8]) -> Option<u32> {
    let at = object.windows(key.len()).position(|w| w == key)? + key.len();
    let rest = skip_blanks_and_colon(&object[at..]);
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()
}

/// An unfinished event held back longer than this cannot be the usage chunk (a few hundred
/// bytes): it is passed on as it comes, so a huge event, or an upstream that never ends one,
/// costs bounded memory.
const MAX_HELD: usize = 64 * 1024;

/// Passes a server-sent-events stream through event by event, minus the usage-only chunk.
#[derive(Debug)]
pub(crate) struct UsageStripper {
    /// Over [`MAX_HELD`], an event is skipped by the reader and passed on by the stripper.
    reader: Reader,
    /// What is not passed on yet: the stream from offset `held_from`, an unfinished event.
    pending: BytesMut,
    held_from: u64,
}

impl Default for UsageStripper {
    fn default() -> Self {
        UsageStripper {
            reader: Reader::with_limit(MAX_HELD),
            pending: BytesMut::new(),
            held_from: 0,
        }
    }
}

impl UsageStripper {
    /// The complete events of `data` (with what was held back before), minus a usage-only
    /// chunk; an incomplete last event is held back until its end arrives, up to [`MAX_HELD`].
    pub(crate) fn filter(&mut self, data: &[u8]) -> Bytes {
        self.pending.extend_from_slice(data);
        let mut out = BytesMut::new();
        let mut feed = self.reader.feed(data);
        while let Some(event) = feed.next_event() {
            if let Ok(Event::Data(d)) = event {
                if is_usage_chunk(d.data()) {
                    let span = d.span();
                    let before = self.pending.split_to(offset(span.start - self.held_from));
                    out.extend_from_slice(&before);
                    drop(self.pending.split_to(offset(span.end - span.start)));
                    self.held_from = span.end;
                }
            }
        }
        drop(feed);
        let upto = if self.reader.skipping() {
            self.reader.position()
        } else {
            self.reader.boundary()
        };
        out.extend_from_slice(&self.pending.split_to(offset(upto - self.held_from)));
        self.held_from = upto;
        out.freeze()
    }

    /// What is left at the end of the stream.
    pub(crate) fn finish(&mut self) -> Bytes {
        let usage =
            matches!(self.reader.finish(), Some(Event::Data(d)) if is_usage_chunk(d.data()));
        self.held_from = self.reader.position();
        let rest = self.pending.split().freeze();
        if usage {
            Bytes::new()
        } else {
            rest
        }
    }
}

fn offset(bytes: u64) -> usize {
    usize::try_from(bytes).unwrap_or(usize::MAX)
}

/// The usage-only chunk: no choices, a usage object.
fn is_usage_chunk(data: &[u8]) -> bool {
    const EMPTY: &[u8] = b"\"choices\":[]";
    data.windows(EMPTY.len()).any(|w| w == EMPTY) && parse(data).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: &[u8] = b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n\
data: {\"id\":\"x\",\"choices\":[],\"usage\":{\"prompt_tokens\":332,\"total_tokens\":340,\"completion_tokens\":8,\"prompt_tokens_details\":{\"cached_tokens\":320}}}\n\n\
data: [DONE]\n\n";

    #[test]
    fn reads_the_last_usage_object_of_a_body_or_stream() {
        let want = Usage {
            prompt_tokens: 332,
            cached_tokens: Some(320),
            output_tokens: 8,
        };
        assert_eq!(parse(STREAM), Some(want));
        let fixture = include_bytes!("../../../test-data/vllm/chat-completion.json");
        assert_eq!(parse(fixture), Some(want));
        let mut tail = UsageTail::default();
        for chunk in STREAM.chunks(7) {
            tail.feed(chunk);
        }
        assert_eq!(tail.usage(), Some(want));
        assert_eq!(
            parse(br#"{"usage":{"prompt_tokens":3,"completion_tokens":1}}"#),
            Some(Usage {
                prompt_tokens: 3,
                cached_tokens: None,
                output_tokens: 1
            }),
            "an engine without prompt_tokens_details reports no cached tokens"
        );
        assert_eq!(parse(b"data: {\"usage\":null}\n\n"), None);
    }

    #[test]
    fn strips_only_the_usage_chunk_whatever_the_framing() {
        let expected: &[u8] = b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\ndata: [DONE]\n\n";
        for size in [1, 5, 64, STREAM.len()] {
            let mut s = UsageStripper::default();
            let mut out = Vec::new();
            for chunk in STREAM.chunks(size) {
                out.extend_from_slice(&s.filter(chunk));
            }
            out.extend_from_slice(&s.finish());
            assert_eq!(out, expected, "frames of {size}");
        }
        let fixture = include_bytes!("../../../test-data/vllm/chat-completion-stream.txt");
        let mut s = UsageStripper::default();
        let mut out = s.filter(fixture).to_vec();
        out.extend_from_slice(&s.finish());
        assert!(parse(&out).is_none() && out.ends_with(b"data: [DONE]\n\n"));
        assert!(out.len() < fixture.len());
    }

    #[test]
    fn strips_a_crlf_usage_chunk_after_a_comment_wherever_the_frames_end() {
        let stream: &[u8] = b": keep-alive\r\n\r\ndata: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\r\n\r\n\
data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\r\n\r\ndata: [DONE]\r\n\r\n";
        let expected: &[u8] = b": keep-alive\r\n\r\ndata: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\r\n\r\ndata: [DONE]\r\n\r\n";
        for size in 1..stream.len() {
            let mut s = UsageStripper::default();
            let mut out = Vec::new();
            for chunk in stream.chunks(size) {
                out.extend_from_slice(&s.filter(chunk));
            }
            out.extend_from_slice(&s.finish());
            assert_eq!(out, expected, "frames of {size}");
        }
    }

    #[test]
    fn a_huge_event_passes_through_with_bounded_memory() {
        let big = format!(
            "data: {{\"choices\":[{{\"delta\":{{\"content\":\"{}\"}}}}]}}\n\n",
            "x".repeat(300_000)
        );
        let mut stream = big.clone().into_bytes();
        stream.extend_from_slice(STREAM);
        let mut expected = big.into_bytes();
        expected.extend_from_slice(b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\ndata: [DONE]\n\n");
        for size in [1000, 4096, 100_000] {
            let mut s = UsageStripper::default();
            let mut out = Vec::new();
            for chunk in stream.chunks(size) {
                out.extend_from_slice(&s.filter(chunk));
                assert!(
                    s.pending.len() <= MAX_HELD + size,
                    "held {}",
                    s.pending.len()
                );
            }
            out.extend_from_slice(&s.finish());
            assert_eq!(out, expected, "frames of {size}");
        }
        // An upstream that never ends its event is passed on, not buffered.
        let mut s = UsageStripper::default();
        let mut passed = 0;
        for _ in 0..100 {
            passed += s.filter(&[b'y'; 10_000]).len();
        }
        assert!(passed >= 1_000_000 - MAX_HELD - 10_000);
    }

    #[test]
    fn anthropic_style_cache_reads_count_as_cached_tokens() {
        let body = br#"{"usage":{"prompt_tokens":100,"completion_tokens":5,"cache_read_input_tokens":64}}"#;
        let u = parse(body).unwrap();
        assert_eq!(
            (u.prompt_tokens, u.cached_tokens, u.output_tokens),
            (100, Some(64), 5)
        );
    }
}
