//! One resumable stream's continuation: the stream's state as the client has it, and a
//! continuation put on its way to another endpoint when the upstream breaks (the guarantees
//! are `crate::resume`'s).

use super::stage;
use crate::dispatch::{AttemptOutcome, Dispatch};
use crate::pool::Attempt;
use crate::resume::{splice, EventCut, Place, Splicer, Transcript};
use crate::state::Shared;
use crate::upstream::Sending;
use bytes::Bytes;
use kvgate_core::{EndpointId, Request, Usage};
use std::sync::Arc;

/// What a continuation needs of its request.
#[derive(Debug)]
pub(crate) struct Origin {
    pub(crate) shared: Arc<Shared>,
    pub(crate) request: Arc<Request>,
    /// The body the first attempt sent (the client's, with `include_usage` if the gateway
    /// added it).
    pub(crate) body: Bytes,
    pub(crate) sending: Sending,
    /// Endpoints the request went to; a continuation goes elsewhere.
    pub(crate) tried: Vec<EndpointId>,
}

/// One resumable stream's state: the events passed to the client so far, what they said, and
/// a continuation on its way or spliced in.
pub(crate) struct Resume {
    origin: Origin,
    cut: EventCut,
    transcript: Transcript,
    splicer: Option<Splicer>,
    left: u32,
    pending: Option<ContinuationFuture>,
    /// What broke the stream last, told to the client if no continuation follows.
    cause: String,
}

/// A continuation on its way: the attempt, once an endpoint took it, or why none did.
pub(crate) type ContinuationFuture = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<AttemptOutcome, &'static str>> + Send>,
>;

impl std::fmt::Debug for Resume {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resume")
            .field("transcript", &self.transcript)
            .field("left", &self.left)
            .field("pending", &self.pending.is_some())
            .finish_non_exhaustive()
    }
}

impl Resume {
    pub(crate) fn new(origin: Origin) -> Self {
        let config = &origin.shared.config.resume;
        Resume {
            left: config.max_resumes,
            transcript: Transcript::new(origin.sending.api, config.max_text_bytes),
            cut: EventCut::default(),
            splicer: None,
            pending: None,
            cause: String::new(),
            origin,
        }
    }

    /// Upstream bytes in, what the client gets out: whole events only (a partial one waits for
    /// its end), a continuation's events spliced; the result is recorded.
    pub(crate) fn through(&mut self, data: &Bytes) -> Bytes {
        let whole = self.cut.push(data);
        let out = match &mut self.splicer {
            Some(s) if !whole.is_empty() => s.rewrite(&whole),
            _ => whole,
        };
        self.transcript.record(&out);
        out
    }

    /// What is left when the upstream body ended normally (a last event without its blank
    /// line).
    pub(crate) fn flush(&mut self) -> Bytes {
        let rest = self.cut.take();
        let out = match &mut self.splicer {
            Some(s) if !rest.is_empty() => s.rewrite(&rest),
            _ => rest,
        };
        self.transcript.record(&out);
        out
    }

    /// When the client already has the whole answer (a `finish_reason` or `[DONE]` came), a
    /// break needs no continuation: the bytes that end the stream (`[DONE]` if it had not
    /// come).
    pub(crate) fn ending(&mut self) -> Option<Bytes> {
        self.transcript.read();
        let t = &self.transcript;
        (t.finished() || t.done()).then(|| match t.done() {
            true => Bytes::new(),
            false => Bytes::from_static(b"data: [DONE]\n\n"),
        })
    }

    /// The upstream broke (`cause`): puts the continuation on its way to another endpoint, or
    /// says why not.
    pub(crate) fn start(&mut self, cause: &str) -> Result<(), &'static str> {
        cause.clone_into(&mut self.cause);
        self.cut = EventCut::default();
        self.transcript.read();
        if let Some(reason) = self.transcript.blocked() {
            return Err(reason);
        }
        if self.left == 0 {
            return Err("exhausted");
        }
        let o = &self.origin;
        let body = splice::continuation(&o.body, o.sending.api, &self.transcript)?;
        self.left -= 1;
        let (shared, sending) = (o.shared.clone(), o.sending.clone());
        let (request, tried) = (o.request.clone(), o.tried.clone());
        let config = &o.shared.config.resume;
        let yield_until = (config.yield_ms > 0).then(|| {
            tokio::time::Instant::now() + std::time::Duration::from_millis(config.yield_ms)
        });
        self.pending = Some(Box::pin(async move {
            let waited = shared.pool.clock().now();
            let place =
                |pinned, stream| place(&shared, &request, &tried, yield_until, pinned, stream);
            let counts = stage::HeadCounts {
                warmed: &shared.metrics.resume.stream_resume_heads,
                skipped: &shared.metrics.resume.stream_resume_heads_skipped,
                held: &shared.metrics.resume.stream_resume_heads_held,
            };
            let heads = |pinned| place(pinned, false);
            let warmed = stage::staged(&shared, &body, &sending, counts, heads).await;
            // Held there until the continuation's first bytes (or its failure): its prefill
            // is done (`crate::resume::Gates`).
            let (dispatch, _place, _) = match place(warmed, true).await {
                Err(_) if warmed.is_some() => place(None, true).await?,
                placed => placed?,
            };
            let now = shared.pool.clock().now();
            shared
                .metrics
                .resume
                .stream_resume_wait
                .observe((now - waited).as_secs_f64());
            let forwarded = sending.forwarded.clone();
            Ok(dispatch.send(&sending, body, forwarded).await)
        }));
        Ok(())
    }

    /// What broke the stream last.
    pub(crate) fn cause(&self) -> &str {
        &self.cause
    }

    /// Whether a continuation is on its way.
    pub(crate) fn is_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// The continuation on its way, if any.
    pub(crate) fn pending(&mut self) -> Option<&mut ContinuationFuture> {
        self.pending.as_mut()
    }

    /// The continuation's first bytes arrived from `endpoint` (or it failed, or found no
    /// endpoint): from now on its events are spliced in, and a later continuation goes
    /// elsewhere.
    pub(crate) fn settled(&mut self, spliced: bool, endpoint: Option<EndpointId>) {
        self.pending = None;
        self.origin.tried.extend(endpoint);
        if spliced {
            self.splicer = Some(Splicer::new(&self.transcript));
        }
    }

    /// The usage the continuation's engine reported, before it was adjusted for the client:
    /// the engine's own numbers, for its calibration and cache-prediction scoring.
    pub(crate) fn engine_usage(&self) -> Option<Option<Usage>> {
        self.splicer.as_ref().map(Splicer::engine_usage)
    }
}

/// Routes a continuation, or one of its heads, when an endpoint has room (and, while it
/// yields, no request awaiting its first token), on `pinned` only when given; the attempt
/// and its place at `crate::resume::Gates`.
pub(crate) async fn place(
    shared: &Arc<Shared>,
    request: &Request,
    tried: &[EndpointId],
    yield_until: Option<tokio::time::Instant>,
    pinned: Option<EndpointId>,
    stream: bool,
) -> Result<(Dispatch, Option<Place>, Option<usize>), &'static str> {
    // A head (not streamed) warms an engine's prefix cache ahead of the requests queued there:
    // it goes only where the gateway reads an engine's metrics. A hosted API may bill every
    // head's prompt, and may not know `continue_final_message`.
    let unread = match stream {
        true => Vec::new(),
        false => shared.pool.without_engine_metrics(),
    };
    let engines_left = || {
        let ids = shared.pool.endpoint_ids();
        ids.iter()
            .any(|e| !tried.contains(e) && !unread.contains(e))
    };
    if !stream && !engines_left() {
        return Err("no_engine");
    }
    let (mut dispatch, place) = shared
        .resume_gates
        .place(yield_until, |gate, yielding| {
            let busy = match yielding {
                true => shared.pool.awaiting_first_token(),
                false => Vec::new(),
            };
            let closed = |e: &EndpointId| {
                let awaiting = u32::from(busy.contains(e));
                tried.contains(e)
                    || unread.contains(e)
                    || !gate.admits(*e, pinned, yielding, awaiting)
            };
            let refused: Vec<EndpointId> = shared
                .pool
                .endpoint_ids()
                .into_iter()
                .filter(closed)
                .collect();
            let dispatch = Dispatch::pick(shared, request, &refused, Attempt::Resume, stream);
            let dispatch = dispatch.map_err(|_| "no_endpoint")?;
            let id = dispatch.target.id;
            Ok::<_, &'static str>((dispatch, id))
        })
        .await?;
    // The predictions were for the request's prompt, not for prompt plus text so far; what
    // the endpoint holds of that prompt it holds of the continuation's too (a staged
    // continuation's heads start past it, [`stage::warm`]).
    let target = &mut dispatch.target;
    let held = target.prediction.take().and_then(|p| p.cached_text_bytes());
    target.predicted_ttft = None;
    Ok((dispatch, place, held))
}
