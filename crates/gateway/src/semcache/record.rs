//! The body of a miss's answer on its way to the client, recorded as it passes: once the
//! stream's `[DONE]` or the body's end goes by, a complete answer is stored. A client that
//! goes away earlier drops it unstored.

use super::answer::Recorder;
use super::Miss;
use axum::body::Body;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Recording {
    inner: Body,
    recording: Option<(Recorder, Miss)>,
}

impl Recording {
    /// Records `inner` (an event stream when `sse`) for `miss`.
    pub(crate) fn new(inner: Body, sse: bool, miss: Miss) -> Self {
        let recorder = Recorder::new(sse, miss.max_entry_bytes());
        Recording {
            inner,
            recording: Some((recorder, miss)),
        }
    }

    fn complete(&mut self) {
        if let Some((recorder, miss)) = self.recording.take() {
            miss.complete(recorder.finish());
        }
    }
}

impl http_body::Body for Recording {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                let done = match (frame.data_ref(), &mut this.recording) {
                    (Some(data), Some((recorder, _))) => recorder.feed(data),
                    _ => false,
                };
                if done || this.inner.is_end_stream() {
                    this.complete();
                }
            }
            // A broken body is not an answer.
            Poll::Ready(Some(Err(_))) => this.recording = None,
            Poll::Ready(None) => this.complete(),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
