//! The response body handed to the client: the upstream body passed through frame by frame
//! (no buffering), with the end of the request accounted when the stream ends.
//!
//! After the first token nothing is retried (DOMAIN.md §7): if the upstream connection breaks
//! mid-stream, a server-sent-events response gets one final `data: {"error": ...}` event and
//! ends; any other response is aborted so the client sees a truncated body, never a silent
//! success.

use crate::admission::Permit;
use crate::dispatch::Dispatch;
use crate::ending::Ending;
use crate::upstream::error_chain;
use crate::usage::{UsageStripper, UsageTail};
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use kvgate_core::decision::FailureKind;
use kvgate_core::resilience::Outcome;
use std::pin::Pin;
use std::task::{Context, Poll};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The pass-through body.
#[derive(Debug)]
pub(crate) struct Tracked {
    first: Option<Bytes>,
    rest: Option<Incoming>,
    dispatch: Option<Dispatch>,
    ending: Ending,
    _permit: Option<Permit>,
    sse: bool,
    ok: bool,
    events: SseEvents,
    usage: UsageTail,
    /// Removes the usage chunk the gateway asked for on the client's behalf.
    strip: Option<UsageStripper>,
}

impl Tracked {
    /// Wraps an upstream body whose first frame was already read; `ending` records how the
    /// request ends (cancelled until the body completes or breaks).
    pub(crate) fn new(
        first: Option<Bytes>,
        rest: Option<Incoming>,
        dispatch: Dispatch,
        (permit, mut ending): (Permit, Ending),
        sse: bool,
        (ok, strip_usage): (bool, bool),
    ) -> Self {
        ending.at(dispatch.target.name.clone());
        let mut body = Tracked {
            first: None,
            rest,
            dispatch: Some(dispatch),
            ending,
            _permit: Some(permit),
            sse,
            ok,
            events: SseEvents::default(),
            usage: UsageTail::default(),
            strip: (sse && strip_usage).then(UsageStripper::default),
        };
        body.first = first.map(|f| body.pass(&f));
        body.finish_if_ended();
        if body.rest.is_none() {
            if let Some(tail) = body.strip.as_mut().map(UsageStripper::finish) {
                let mut all = bytes::BytesMut::from(body.first.as_deref().unwrap_or_default());
                all.extend_from_slice(&tail);
                body.first = Some(all.freeze());
            }
        }
        body
    }

    /// Reads `data` (events, usage) and returns what the client gets of it.
    fn pass(&mut self, data: &Bytes) -> Bytes {
        if self.sse {
            self.events.feed(data);
            self.ending.streamed(self.events.events);
        }
        self.usage.feed(data);
        match &mut self.strip {
            Some(s) => s.filter(data),
            None => data.clone(),
        }
    }

    /// A body of known length is complete once its last byte is read, and a server writing a
    /// `content-length` response drops the body then without polling it again: account now.
    fn finish_if_ended(&mut self) {
        if self.rest.as_ref().is_none_or(Body::is_end_stream) {
            self.rest = None;
            self.finish();
        }
    }

    fn finish(&mut self) {
        if let Some(d) = self.dispatch.take() {
            let usage = self.usage.usage();
            let tokens = match usage {
                Some(u) => u.output_tokens,
                None => self.events.finish(),
            };
            d.complete(tokens, usage);
            if self.ok {
                // An error body's "tokens" are not output.
                let facts = self.ending.facts();
                facts.usage = usage;
                facts.output_tokens = Some(tokens);
            }
            self.ending.set(if self.ok {
                Outcome::Ok
            } else {
                Outcome::UpstreamError
            });
        }
        self._permit = None;
    }
}

impl Body for Tracked {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(first) = self.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        let Some(rest) = self.rest.as_mut() else {
            return Poll::Ready(None);
        };
        match Pin::new(rest).poll_frame(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Ok(frame))) => {
                let frame = match frame.into_data() {
                    Ok(data) => Frame::data(self.pass(&data)),
                    Err(frame) => frame,
                };
                self.finish_if_ended();
                let ended = self.rest.is_none();
                let tail = match (&mut self.strip, ended) {
                    (Some(s), true) => s.finish(),
                    _ => Bytes::new(),
                };
                match frame.into_data() {
                    Ok(mut data) if !tail.is_empty() => {
                        let mut joined = bytes::BytesMut::from(&data[..]);
                        joined.extend_from_slice(&tail);
                        data = joined.freeze();
                        Poll::Ready(Some(Ok(Frame::data(data))))
                    }
                    Ok(data) => Poll::Ready(Some(Ok(Frame::data(data)))),
                    Err(frame) => Poll::Ready(Some(Ok(frame))),
                }
            }
            Poll::Ready(None) => {
                self.rest = None;
                self.finish();
                match self.strip.as_mut().map(UsageStripper::finish) {
                    Some(tail) if !tail.is_empty() => Poll::Ready(Some(Ok(Frame::data(tail)))),
                    _ => Poll::Ready(None),
                }
            }
            Poll::Ready(Some(Err(e))) => {
                self.rest = None;
                let message = error_chain(&e);
                if let Some(d) = self.dispatch.take() {
                    d.fail(FailureKind::Connect, None);
                    self.ending.set(Outcome::StreamError);
                }
                self._permit = None;
                if self.sse {
                    let event = serde_json::json!({"error": {
                        "message": format!("upstream stream broke after the first token: {message}"),
                        "type": "server_error", "param": null, "code": "upstream_stream_error"}});
                    Poll::Ready(Some(Ok(Frame::data(Bytes::from(format!(
                        "data: {event}\n\n"
                    ))))))
                } else {
                    Poll::Ready(Some(Err(e.into())))
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.rest.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        let first = self.first.as_ref().map_or(0, |b| b.len() as u64);
        match &self.rest {
            None => SizeHint::with_exact(first),
            Some(rest) => {
                let inner = rest.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(inner.lower() + first);
                if let Some(upper) = inner.upper() {
                    hint.set_upper(upper + first);
                }
                hint
            }
        }
    }
}

/// Counts the `data:` lines of a server-sent-events body other than the `data: [DONE]`
/// terminator, line by line across frames: a frame may end inside a line, and a model may write
/// `[DONE]` in its own text, so counting substrings per frame can go wrong (even below zero).
#[derive(Debug, Default)]
struct SseEvents {
    /// The start of the current line (enough to tell `data: [DONE]` apart).
    line: Vec<u8>,
    /// The current line is longer than `line` holds.
    long: bool,
    events: u32,
}

impl SseEvents {
    const KEEP: usize = 32;

    fn feed(&mut self, data: &[u8]) {
        for part in data.split_inclusive(|b| *b == b'\n') {
            let (text, ends) = match part.split_last() {
                Some((b'\n', text)) => (text, true),
                _ => (part, false),
            };
            let room = Self::KEEP.saturating_sub(self.line.len());
            self.line.extend_from_slice(&text[..text.len().min(room)]);
            self.long |= text.len() > room;
            if ends {
                self.end_line();
            }
        }
    }

    fn end_line(&mut self) {
        if let Some(value) = self.line.strip_prefix(b"data:") {
            let done = !self.long && value.trim_ascii() == b"[DONE]";
            if !done {
                self.events = self.events.saturating_add(1);
            }
        }
        self.line.clear();
        self.long = false;
    }

    /// The count, including a last line the stream ended without a newline.
    fn finish(&mut self) -> u32 {
        if !self.line.is_empty() {
            self.end_line();
        }
        self.events
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_events() {
        let mut events = SseEvents::default();
        events.feed(b"data: a\n\ndata: b\n\ndata: [DONE]\n\n");
        assert_eq!(events.finish(), 2);
    }

    #[test]
    fn sse_events_survive_split_frames_and_done_in_the_text() {
        let mut events = SseEvents::default();
        // A frame ending inside `data: [DONE]`, and a model writing "[DONE]" in its output.
        events.feed(b"data: {\"content\":\"[DONE] [DONE]\"}\r\n\r\nda");
        events.feed(b"ta: {\"content\":\"x\"}\n\ndata: ");
        events.feed(b"[DONE]\n\n");
        assert_eq!(events.finish(), 2);
        let mut tail = SseEvents::default();
        tail.feed(b"data: a\n\ndata: b");
        assert_eq!(tail.finish(), 2, "a last line without a newline counts");
    }

    #[test]
    fn sse_event_count_never_underflows() {
        let mut events = SseEvents::default();
        for frame in [&b"[DONE]"[..], b"[DONE]\n", b"\n[DONE][DONE]"] {
            events.feed(frame);
        }
        assert_eq!(events.finish(), 0);
    }
}
