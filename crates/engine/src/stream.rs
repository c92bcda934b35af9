//! One running sequence as its handler sees it, and its SSE response body.
//!
//! Every wake-up of the body drains all updates the scheduler has delivered so far into one
//! buffer, so a client that reads slower than the engine produces gets fewer, larger frames
//! instead of one syscall per token. Dropping the body (the client disconnected) aborts the
//! sequence in the engine so its KV blocks are freed, as vLLM does.

use crate::faults::RequestFaults;
use crate::scheduler::{Command, Update};
use crate::server::Connection;
use crate::tokenizer::output_word;
use crate::wire::{ChunkWriter, FinishReason, Usage};
use bytes::Bytes;
use std::convert::Infallible;
use std::time::Duration;
use tokio::sync::mpsc;

/// A submitted sequence; aborts it when dropped before it finished.
#[derive(Debug)]
pub(crate) struct SeqHandle {
    pub(crate) id: u64,
    pub(crate) updates: mpsc::UnboundedReceiver<Update>,
    pub(crate) commands: mpsc::UnboundedSender<Command>,
    pub(crate) finished: bool,
}

impl Drop for SeqHandle {
    fn drop(&mut self) {
        if !self.finished {
            let _ = self.commands.send(Command::Abort { id: self.id });
        }
    }
}

/// What a stream needs besides the sequence.
#[derive(Debug)]
pub(crate) struct StreamPlan {
    pub(crate) writer: ChunkWriter,
    pub(crate) text_seed: u64,
    pub(crate) prompt_tokens: u32,
    pub(crate) include_usage: bool,
    pub(crate) finish: FinishReason,
    pub(crate) faults: RequestFaults,
    pub(crate) connection: Connection,
}

#[derive(Debug)]
struct StreamState {
    seq: SeqHandle,
    plan: StreamPlan,
    produced: u32,
    cached_tokens: u32,
    started: bool,
    done: bool,
    stall_next: Option<Option<Duration>>,
    reset_next: bool,
    held: bool,
}

async fn sleep_or_forever(stall: Option<Duration>) {
    match stall {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// The SSE body for a streamed request.
pub(crate) fn body(seq: SeqHandle, plan: StreamPlan) -> axum::body::Body {
    let state = StreamState {
        seq,
        plan,
        produced: 0,
        cached_tokens: 0,
        started: false,
        done: false,
        stall_next: None,
        reset_next: false,
        held: false,
    };
    let stream = futures_util::stream::unfold(state, |mut s| async move {
        let frame = next_frame(&mut s).await?;
        Some((Ok::<Bytes, Infallible>(frame), s))
    });
    axum::body::Body::from_stream(stream)
}

async fn next_frame(s: &mut StreamState) -> Option<Bytes> {
    if s.done {
        return None;
    }
    if s.reset_next {
        // Let hyper flush the tokens already written, then cut the connection.
        tokio::time::sleep(Duration::from_millis(20)).await;
        s.plan.connection.reset();
        std::future::pending::<()>().await;
    }
    if !s.started {
        s.started = true;
        if let Some(stall) = s.plan.faults.stall_first {
            sleep_or_forever(stall).await;
        }
    }
    if let Some(stall) = s.stall_next.take() {
        sleep_or_forever(stall).await;
    }
    let mut out = Vec::with_capacity(512);
    // A token's text is held until the next update is known, so that the last token and the
    // finish reason travel in one chunk as in vLLM when they arrive together.
    let mut held = std::mem::take(&mut s.held);
    let mut update = if held {
        match s.seq.updates.try_recv() {
            Ok(u) => u,
            Err(_) => {
                flush_token(s, &mut out);
                return Some(Bytes::from(out));
            }
        }
    } else {
        s.seq.updates.recv().await?
    };
    loop {
        match update {
            Update::First { cached_tokens } => {
                // A preempted and recomputed sequence reports a first token again: ignore it.
                if s.produced == 0 && !held {
                    s.cached_tokens = cached_tokens;
                    s.plan.writer.role(&mut out);
                    held = true;
                }
            }
            Update::Token => {
                if held && flush_token(s, &mut out) {
                    // This token waits for the next frame (after the fault's pause).
                    s.held = true;
                    return Some(Bytes::from(out));
                }
                held = true;
            }
            Update::Finished { output_tokens } => {
                s.seq.finished = true;
                s.done = true;
                if held {
                    let word = output_word(s.plan.text_seed, s.produced);
                    s.plan.writer.token(&mut out, word, Some(s.plan.finish));
                    s.produced += 1;
                } else {
                    s.plan.writer.token(&mut out, "", Some(s.plan.finish));
                }
                if s.plan.include_usage {
                    let usage = Usage {
                        prompt_tokens: s.plan.prompt_tokens,
                        completion_tokens: output_tokens.max(s.produced),
                        cached_tokens: s.cached_tokens,
                    };
                    s.plan.writer.usage(&mut out, usage);
                }
                ChunkWriter::done(&mut out);
                return Some(Bytes::from(out));
            }
        }
        match s.seq.updates.try_recv() {
            Ok(next) => update = next,
            Err(_) => {
                if held {
                    flush_token(s, &mut out);
                }
                return Some(Bytes::from(out));
            }
        }
    }
}

/// Writes the held token; true when a mid-stream fault fires after it (the frame must end).
fn flush_token(s: &mut StreamState, out: &mut Vec<u8>) -> bool {
    let word = output_word(s.plan.text_seed, s.produced);
    s.plan.writer.token(out, word, None);
    s.produced += 1;
    if let Some((after, stall)) = s.plan.faults.stall_mid {
        if s.produced == after {
            s.stall_next = Some(stall);
            return true;
        }
    }
    if s.plan.faults.disconnect_after == Some(s.produced) {
        s.reset_next = true;
        return true;
    }
    false
}

/// Waits for a non-streamed sequence to finish; returns (output tokens, cached prompt tokens),
/// or `None` if the engine stopped.
///
/// Faults apply as to a stream whose bytes are held back: stalls delay the response, and
/// `disconnect_mid` resets the connection once the engine has produced that many tokens.
pub(crate) async fn collect(
    mut seq: SeqHandle,
    faults: &RequestFaults,
    connection: &Connection,
) -> Option<(u32, u32)> {
    let mut cached_tokens = 0;
    let mut produced = 0;
    let output_tokens = loop {
        match seq.updates.recv().await? {
            Update::First { cached_tokens: c } if produced == 0 => {
                cached_tokens = c;
                produced = 1;
            }
            Update::First { .. } => {}
            Update::Token => produced += 1,
            Update::Finished { output_tokens } => {
                seq.finished = true;
                break output_tokens;
            }
        }
        if faults.disconnect_after.is_some_and(|k| produced >= k) {
            connection.reset();
            std::future::pending::<()>().await;
        }
    };
    if let Some(stall) = faults.stall_first {
        sleep_or_forever(stall).await;
    }
    if let Some((after, stall)) = faults.stall_mid {
        if output_tokens > after {
            sleep_or_forever(stall).await;
        }
    }
    Some((output_tokens, cached_tokens))
}
