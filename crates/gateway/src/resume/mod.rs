//! Mid-stream continuation: when an upstream breaks after the first token of a streamed
//! answer, the request is sent again to another endpoint with the text streamed so far as an
//! open assistant message (vLLM's and SGLang's `continue_final_message`; for completions, the
//! text appended to the prompt), and the new stream is spliced into the client's so the client
//! reads one well-formed SSE stream (seed section 9.4: resume instead of failing).
//!
//! What is guaranteed, for a request that allows it (see [`unresumable`]):
//! - the client receives only whole events: an event cut by the break was never sent, and the
//!   continuation starts at an event boundary;
//! - the text is the first stream's text followed by the continuation's, nothing lost or
//!   repeated; every chunk keeps the first stream's `id`, `created` and `model`; the
//!   continuation's opening `role` delta is dropped; one `[DONE]` ends the stream;
//! - at most `resume.max_resumes` continuations per request, each to an endpoint the request
//!   has not tried, and only while the text so far fits in `resume.max_text_bytes`; otherwise
//!   (and when a continuation fails before its first token) the stream ends with the error
//!   event it ended with before.
//!
//! Not guaranteed: the continuation is what the second engine generates from the text so far,
//! not what the first would have (sampling differs; greedy decoding on the same model gives the
//! same tokens up to numerics); a stop string straddling the break is not seen by either
//! engine; the usage chunk reports the continuation's numbers moved by the tokens streamed
//! before the break (`completion_tokens` plus them, `prompt_tokens` minus them), which is exact
//! when each chunk carried one token (vLLM's default) and the text re-tokenizes to as many
//! tokens. A continuation needs an upstream that accepts `continue_final_message` (vLLM,
//! SGLang, kvgate's emulated engine); one that rejects it answers 400 and the stream ends with
//! the error event.

mod gate;
mod rehome;
mod splice;
mod stage;
mod transcript;

use crate::dispatch::{AttemptOutcome, Dispatch, Sending};
use crate::parse::Api;
use crate::pool::Attempt;
use crate::state::Shared;
use bytes::Bytes;
use kvgate_core::{EndpointId, Request, Usage};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::sync::Arc;

pub(crate) use gate::Gates;
pub(crate) use rehome::Rehome;
pub(crate) use splice::Splicer;
pub(crate) use transcript::{EventCut, Transcript};

/// `resume:` in the configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ResumeConfig {
    /// Continue broken streams on another endpoint (on by default).
    pub enabled: bool,
    /// Continuations per request.
    pub max_resumes: u32,
    /// Text kept per stream to continue from; a longer answer that breaks ends with an error
    /// event.
    pub max_text_bytes: usize,
    /// Continuations sent to one endpoint and not yet answered (0: no limit). A continuation
    /// is a full prefill; held at the gateway, a wave of them (a lost replica's streams) does
    /// not queue on the engines ahead of new requests ([`gate`]).
    pub per_endpoint: u32,
    /// For this long after its stream broke, a continuation yields to new requests: it goes
    /// only to an endpoint where none of the gateway's requests awaits its first token, so its
    /// full prefill does not hold theirs up (0: it never yields). Measured in the sim
    /// (`kvgate sim --scenario replica-loss`, 10 seeds, docs/routing.md): the TTFT P95 of the
    /// 30 s after a lost replica 328 -> 288 ms at 1 s, capacity unchanged.
    pub yield_ms: u64,
    /// A continuation's prompt goes first in heads this many tokens longer each, one-token
    /// warm-ups sent one after another to one endpoint, so a request arriving there waits
    /// behind one head's prefill, not the whole prompt's (0: off; [`stage`]). 512 by default:
    /// through the gateway, four emulated engines losing one at 3 and 4.5 sessions/s, it put
    /// the TTFT P95 of the 30 s after the loss lower than no staging in most runs, and under
    /// 1.5x the P95 before in 11 of 12 runs at 1.5-2.25 sessions/s, for a continued stream's
    /// pause ~1 s longer (docs/routing.md, "Heads the endpoint holds already").
    pub stage_tokens: u32,
    /// A head placed where no other request awaits its first token grows by two pieces, not
    /// one: nobody is queued there for a small piece to spare ([`stage::warm`]).
    pub stage_grow: bool,
    /// When an endpoint is gone (it broke a stream or failed a connection and then did not
    /// answer, or its scrape showed a restart or made it unhealthy), the sessions whose last
    /// turn ended there at most this many seconds before are warmed on another endpoint: the turn's
    /// prompt is sent again for one token (staged as a continuation is), so the session's next
    /// turn finds its context cached instead of recomputing it ([`rehome`]). 0: off. The sim
    /// measured 10, the default (`kvgate sim --scenario replica-loss`, 40 seeds,
    /// docs/routing.md): the TTFT P95 of the 30 s after a loss within 1.5x of before in 122 of
    /// 160 runs against 110 with it off; through the gateway it was lower or level in every
    /// interleaved pair. Only sessions' turns are kept (a request with a session key), so
    /// traffic without sessions pays nothing for it.
    pub rehome_s: u64,
    /// Sessions whose last turn is kept for re-homing; the oldest give way.
    pub rehome_sessions: usize,
    /// Bytes of request bodies kept for re-homing; the oldest sessions give way.
    pub rehome_bytes: usize,
}

impl Default for ResumeConfig {
    fn default() -> Self {
        ResumeConfig {
            enabled: true,
            max_resumes: 2,
            max_text_bytes: 256 * 1024,
            per_endpoint: 1,
            yield_ms: 1_000,
            stage_tokens: 512,
            stage_grow: true,
            rehome_s: 10,
            rehome_sessions: 4_096,
            rehome_bytes: 256 << 20,
        }
    }
}

/// Why a request's stream could not be continued exactly, or `None` when it can: only
/// streams; one choice (`n`, `best_of`); no `logprobs` (the first engine's cannot be
/// re-created); no structured output (a grammar would restart at the continuation); a
/// completion prompt that is text (token ids cannot be extended with text) and no `echo`.
pub(crate) fn unresumable(
    api: Api,
    stream: bool,
    fields: &Map<String, Value>,
) -> Option<&'static str> {
    let set = |name: &str| {
        fields
            .get(name)
            .is_some_and(|v| !v.is_null() && *v != Value::Bool(false))
    };
    let above_one = |name: &str| {
        fields
            .get(name)
            .and_then(Value::as_u64)
            .is_some_and(|n| n > 1)
    };
    if !stream {
        return Some("not_streamed");
    }
    if above_one("n") || above_one("best_of") {
        return Some("n");
    }
    if set("logprobs") || set("top_logprobs") {
        return Some("logprobs");
    }
    let structured = [
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
        "structured_outputs",
    ];
    let format = fields
        .get("response_format")
        .and_then(|f| f.get("type"))
        .and_then(Value::as_str)
        .is_some_and(|t| t != "text");
    if format || structured.iter().any(|k| set(k)) {
        return Some("structured_output");
    }
    if api == Api::Completions {
        if set("echo") {
            return Some("echo");
        }
        let text = match fields.get("prompt") {
            Some(Value::String(_)) => true,
            Some(Value::Array(items)) => items.len() == 1 && items[0].is_string(),
            _ => false,
        };
        if !text {
            return Some("token_prompt");
        }
    }
    None
}

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
                warmed: &shared.metrics.stream_resume_heads,
                skipped: &shared.metrics.stream_resume_heads_skipped,
                held: &shared.metrics.stream_resume_heads_held,
            };
            let heads = |pinned| place(pinned, false);
            let warmed = stage::staged(&shared, &body, &sending, counts, heads).await;
            // Held there until the continuation's first bytes (or its failure): its prefill
            // is done ([`gate`]).
            let (dispatch, _place, _) = match place(warmed, true).await {
                Err(_) if warmed.is_some() => place(None, true).await?,
                placed => placed?,
            };
            let now = shared.pool.clock().now();
            shared
                .metrics
                .stream_resume_wait
                .observe((now - waited).as_secs_f64());
            let forwarded = sending.forwarded.clone();
            Ok(sending.send(dispatch, body, forwarded).await)
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
/// and its place at the [`gate`].
async fn place(
    shared: &Arc<Shared>,
    request: &Request,
    tried: &[EndpointId],
    yield_until: Option<tokio::time::Instant>,
    pinned: Option<EndpointId>,
    stream: bool,
) -> Result<(Dispatch, Option<gate::Place>, Option<usize>), &'static str> {
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
    let (mut target, place) = shared
        .resume_gates
        .place(yield_until, |full, yielding| {
            let mut refused: Vec<EndpointId> =
                tried.iter().chain(full).chain(&unread).copied().collect();
            if yielding {
                refused.extend(shared.pool.awaiting_first_token());
            }
            if let Some(pinned) = pinned {
                let others = shared.pool.endpoint_ids().into_iter();
                refused.extend(others.filter(|&e| e != pinned));
            }
            let target = shared.pool.pick(request, &refused, Attempt::Resume);
            let target = target.map_err(|_| "no_endpoint")?;
            let id = target.id;
            Ok::<_, &'static str>((target, id))
        })
        .await?;
    // The predictions were for the request's prompt, not for prompt plus text so far; what
    // the endpoint holds of that prompt it holds of the continuation's too (a staged
    // continuation's heads start past it, [`stage::warm`]).
    let held = target.prediction.take().and_then(|p| p.cached_text_bytes());
    target.predicted_ttft = None;
    Ok((
        Dispatch::new(shared.clone(), request.id, target, stream),
        place,
        held,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(json: &str) -> Map<String, Value> {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn only_requests_a_continuation_can_keep_exact_are_resumable() {
        let chat = |extra: &str| {
            let json = format!(r#"{{"messages":[{{"role":"user","content":"hi"}}]{extra}}}"#);
            unresumable(Api::Chat, true, &fields(&json))
        };
        assert_eq!(chat(""), None);
        assert_eq!(chat(r#","n":1,"logprobs":false,"tools":[]"#), None);
        assert_eq!(chat(r#","response_format":{"type":"text"}"#), None);
        assert_eq!(chat(r#","n":2"#), Some("n"));
        assert_eq!(chat(r#","logprobs":true"#), Some("logprobs"));
        assert_eq!(chat(r#","top_logprobs":3"#), Some("logprobs"));
        assert_eq!(
            chat(r#","response_format":{"type":"json_object"}"#),
            Some("structured_output")
        );
        assert_eq!(chat(r#","guided_regex":"a+""#), Some("structured_output"));
        let body = fields(r#"{"messages":[]}"#);
        assert_eq!(unresumable(Api::Chat, false, &body), Some("not_streamed"));
        let completion = |json: &str| unresumable(Api::Completions, true, &fields(json));
        assert_eq!(completion(r#"{"prompt":"once"}"#), None);
        assert_eq!(completion(r#"{"prompt":["once"]}"#), None);
        assert_eq!(completion(r#"{"prompt":[1,2,3]}"#), Some("token_prompt"));
        assert_eq!(completion(r#"{"prompt":"once","echo":true}"#), Some("echo"));
        assert_eq!(
            completion(r#"{"prompt":"once","logprobs":2}"#),
            Some("logprobs")
        );
        assert_eq!(completion(r#"{"prompt":"once","best_of":3}"#), Some("n"));
    }
}
