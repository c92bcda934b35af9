//! The relay of an answer to the client: the upstream body passed through frame by frame (no
//! buffering, [`Tracked`]), with the end of the request accounted when the stream ends; a stream
//! that breaks continued on another endpoint ([`continuation`], with staged heads, [`stage`]);
//! and the sessions of a lost endpoint re-homed ([`rehome`]). The rules and records these
//! follow are `crate::resume`'s; this is where their requests are sent.
//!
//! After the first token nothing is retried (docs/background.md#the-commit-point). If the upstream
//! connection breaks mid-stream, a server-sent-events response is continued on another endpoint
//! when the request allows it (`crate::resume`); otherwise, or when that fails too, it gets one
//! final `data: {"error": ...}` event and ends. Any other response is aborted so the client sees a
//! truncated body, never a silent success.

mod continuation;
pub(crate) mod rehome;
mod stage;

pub(crate) use continuation::{Origin, Resume};

use crate::admission::Permit;
use crate::dispatch::Dispatch;
use crate::ending::Ending;
use crate::upstream::error_chain;
use crate::usage::{UsageStripper, UsageTail};
use bytes::{Bytes, BytesMut};
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
    /// Continues the stream elsewhere if it breaks; `Err` says why it cannot.
    resume: Result<Box<Resume>, &'static str>,
}

impl Tracked {
    /// Wraps an upstream body whose first frame was already read; `ending` records how the
    /// request ends (cancelled until the body completes or breaks).
    pub(crate) fn new(
        first: Option<Bytes>,
        rest: Option<Incoming>,
        dispatch: Dispatch,
        (permit, mut ending): (Permit, Ending),
        (sse, ok, strip_usage): (bool, bool, bool),
        resume: Result<Box<Resume>, &'static str>,
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
            resume: if sse && ok {
                resume
            } else {
                Err("not_streamed")
            },
        };
        body.begin(first);
        body
    }

    /// The first bytes of an upstream body (the first attempt's or a continuation's) are in.
    fn begin(&mut self, first: Option<Bytes>) {
        let mut out = first.map(|f| self.pass(&f)).unwrap_or_default();
        if self.upstream_done() {
            out = join(out, self.end());
        } else {
            self.finish_at_done();
        }
        self.first = Some(out);
    }

    /// A stream whose `[DONE]` the client has been handed is complete: it is accounted now
    /// (the engine's usage reaches the policy and the limits), not when the upstream's end of
    /// body arrives, which a client that closes on `[DONE]` (the OpenAI SDK, most benchmarks)
    /// may not wait for; the rest of the upstream body is still read if the client stays.
    fn finish_at_done(&mut self) {
        if self.sse && self.events.done {
            self.finish();
        }
    }

    /// Reads upstream `data` and returns what the client gets of it.
    fn pass(&mut self, data: &Bytes) -> Bytes {
        let data = match &mut self.resume {
            Ok(r) => r.through(data),
            Err(_) => data.clone(),
        };
        self.account(&data)
    }

    /// Counts what the client is sent (events, usage) and strips what it did not ask for.
    fn account(&mut self, data: &Bytes) -> Bytes {
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
    /// `content-length` response drops the body then without polling it again: it is over
    /// without another poll.
    fn upstream_done(&self) -> bool {
        self.rest.as_ref().is_none_or(Body::is_end_stream)
    }

    /// The upstream body ended normally: accounts the request and returns what is left for
    /// the client (an event held back for its blank line, the stripper's tail).
    fn end(&mut self) -> Bytes {
        self.rest = None;
        let mut out = Bytes::new();
        if let Ok(r) = &mut self.resume {
            let held = r.flush();
            if !held.is_empty() {
                out = self.account(&held);
            }
        }
        if let Some(s) = &mut self.strip {
            out = join(out, s.finish());
        }
        self.finish();
        out
    }

    fn finish(&mut self) {
        if let Some(d) = self.dispatch.take() {
            let usage = self.usage.usage();
            // A continuation's engine is told of its own usage, not the client's sum.
            let engine = match &self.resume {
                Ok(r) => r.engine_usage().unwrap_or(usage),
                Err(_) => usage,
            };
            let tokens = match engine {
                Some(u) => u.output_tokens,
                None => self.events.finish(),
            };
            d.complete(tokens, engine);
            self.ending.answered(self.ok, usage, tokens);
        }
        self._permit = None;
    }

    /// The upstream stream broke, or a continuation failed before its first bytes: starts a
    /// continuation, or ends the client's stream (with `[DONE]` when it already had the whole
    /// answer, else with an error event).
    fn broken(&mut self, message: &str) {
        if let Some(d) = &self.dispatch {
            d.suspect();
        }
        let reason = match &mut self.resume {
            Ok(r) => match r.ending() {
                Some(tail) => {
                    self.resumes("finished");
                    self.first = Some(self.account(&tail));
                    self.ending.set(Outcome::Ok);
                    self._permit = None;
                    return;
                }
                None => match r.start(message) {
                    Ok(()) => return,
                    Err(reason) => reason,
                },
            },
            Err(reason) => reason,
        };
        self.unresumed(reason, message);
    }

    /// The stream broke and is not continued, for `reason`: it ends with an error event.
    fn unresumed(&mut self, reason: &'static str, message: &str) {
        self.resumes(reason);
        self.ending.set(Outcome::StreamError);
        self._permit = None;
        let event = serde_json::json!({"error": {
            "message": format!("upstream stream broke after the first token: {message}"),
            "type": "server_error", "param": null, "code": "upstream_stream_error"}});
        self.first = Some(Bytes::from(format!("data: {event}\n\n")));
    }

    fn resumes(&self, result: &'static str) {
        let m = &self.ending.shared().metrics;
        m.resume
            .stream_resumes
            .get_or_create(&crate::metrics::reason(result))
            .inc();
    }

    /// Drives a continuation on its way; `None` when there is none.
    fn poll_continuation(&mut self, cx: &mut Context<'_>) -> Option<Poll<()>> {
        let Ok(r) = &mut self.resume else {
            return None;
        };
        let (dispatch, result) = match r.pending()?.as_mut().poll(cx) {
            Poll::Pending => return Some(Poll::Pending),
            Poll::Ready(Ok(done)) => done,
            Poll::Ready(Err(reason)) => {
                r.settled(false, None);
                let cause = r.cause().to_owned();
                self.unresumed(reason, &cause);
                return Some(Poll::Ready(()));
            }
        };
        let spliced = matches!(&result, Ok(ready) if ready.head.status.is_success());
        r.settled(spliced, Some(dispatch.target.id));
        let facts = self.ending.facts();
        facts.attempts += 1;
        self.ending.at(dispatch.target.name.clone());
        match result {
            Ok(ready) if spliced => {
                self.resumes("resumed");
                self.ending.facts().resumes += 1;
                self.dispatch = Some(dispatch);
                self.rest = ready.rest;
                self.begin(ready.first);
            }
            Ok(ready) => {
                // Passed on as an answer, not a failure of the endpoint (as in `proxy`).
                dispatch.complete(0, None);
                self.resumes("attempt_failed");
                self.broken(&format!(
                    "the continuation was answered {}",
                    ready.head.status
                ));
            }
            Err(error) => {
                dispatch.fail(error.kind(), error.retry_after());
                self.resumes("attempt_failed");
                self.broken(&error.to_string());
            }
        }
        Some(Poll::Ready(()))
    }
}

impl Tracked {
    /// A continuation is on its way.
    fn resumable(&self) -> bool {
        self.resume.as_ref().is_ok_and(|r| r.is_pending())
    }
}

fn join(head: Bytes, tail: Bytes) -> Bytes {
    match (head.is_empty(), tail.is_empty()) {
        (_, true) => head,
        (true, false) => tail,
        (false, false) => {
            let mut all = BytesMut::from(&head[..]);
            all.extend_from_slice(&tail);
            all.freeze()
        }
    }
}

impl Body for Tracked {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            if let Some(first) = this.first.take() {
                if first.is_empty() {
                    continue;
                }
                return Poll::Ready(Some(Ok(Frame::data(first))));
            }
            match this.poll_continuation(cx) {
                Some(Poll::Pending) => return Poll::Pending,
                Some(Poll::Ready(())) => continue,
                None => {}
            }
            let Some(rest) = this.rest.as_mut() else {
                return Poll::Ready(None);
            };
            match Pin::new(rest).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(frame))) => {
                    let data = match frame.into_data() {
                        Ok(data) => data,
                        Err(trailers) => return Poll::Ready(Some(Ok(trailers))),
                    };
                    if let Some(d) = this.dispatch.as_ref().filter(|_| this.sse) {
                        d.tokens();
                    }
                    let mut out = this.pass(&data);
                    if this.upstream_done() {
                        out = join(out, this.end());
                    } else {
                        this.finish_at_done();
                    }
                    this.first = Some(out);
                }
                Poll::Ready(None) => this.first = Some(this.end()),
                // After `[DONE]` the answer is whole: a connection lost before the upstream's
                // end of body ends nothing.
                Poll::Ready(Some(Err(_))) if this.sse && this.events.done => {
                    this.first = Some(this.end());
                }
                Poll::Ready(Some(Err(e))) => {
                    this.rest = None;
                    if let Some(d) = this.dispatch.take() {
                        d.fail(FailureKind::Connect, None);
                        this.ending.set(Outcome::StreamError);
                    }
                    if !this.sse {
                        this._permit = None;
                        return Poll::Ready(Some(Err(e.into())));
                    }
                    this.broken(&error_chain(&e));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.rest.is_none() && !self.resumable()
    }

    fn size_hint(&self) -> SizeHint {
        let first = self.first.as_ref().map_or(0, |b| b.len() as u64);
        match &self.rest {
            None if !self.resumable() => SizeHint::with_exact(first),
            None => {
                let mut hint = SizeHint::new();
                hint.set_lower(first);
                hint
            }
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

/// Counts the data events of a server-sent-events body other than the `data: [DONE]`
/// terminator, across frames: a frame may end inside an event, and a model may write `[DONE]`
/// in its own text, so counting substrings per frame can go wrong (even below zero). An event
/// over the reader's limit still counts (it was sent); so does one the body ended inside.
#[derive(Debug, Default)]
pub(crate) struct SseEvents {
    reader: kvgate_sse::Reader,
    events: u32,
    /// The `data: [DONE]` terminator went by.
    pub(crate) done: bool,
}

impl SseEvents {
    pub(crate) fn feed(&mut self, data: &[u8]) {
        let mut feed = self.reader.feed(data);
        while let Some(event) = feed.next_event() {
            match event {
                Ok(kvgate_sse::Event::Done(_)) => self.done = true,
                Ok(kvgate_sse::Event::Data(_)) | Err(_) => {
                    self.events = self.events.saturating_add(1);
                }
            }
        }
    }

    /// The count, including an event the body ended inside.
    pub(crate) fn finish(&mut self) -> u32 {
        match self.reader.finish() {
            Some(kvgate_sse::Event::Done(_)) => self.done = true,
            Some(kvgate_sse::Event::Data(_)) => self.events = self.events.saturating_add(1),
            None => {}
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
