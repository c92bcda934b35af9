//! Mid-stream continuation: when an upstream breaks after the first token of a streamed
//! answer, the request is sent again to another endpoint with the text streamed so far as an
//! open assistant message (vLLM's and SGLang's `continue_final_message`; for completions, the
//! text appended to the prompt), and the new stream is spliced into the client's so the client
//! reads one well-formed SSE stream (seed section 9.4: resume instead of failing).
//!
//! What is guaranteed, for a request that allows it (see `crate::parse::Inference::unresumable`):
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
mod heads;
mod metrics;
mod rehome;
pub(crate) mod splice;
mod transcript;

use serde::{Deserialize, Serialize};

pub(crate) use gate::{Gates, Place};
pub(crate) use heads::{heads, one_token, Heads};
pub(crate) use metrics::ResumeMetrics;
pub(crate) use rehome::{Rehome, Turn};
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

impl ResumeConfig {
    pub(crate) fn validate(&self) -> Result<(), crate::error::ConfigError> {
        // A head shorter than vLLM's default block (16 tokens) would cache nothing.
        if (1..16).contains(&self.stage_tokens) {
            return Err(crate::error::ConfigError::invalid(
                "resume.stage_tokens",
                "must be 0 (off) or at least 16",
            ));
        }
        if self.rehome_s > 0 && self.rehome_sessions == 0 {
            return Err(crate::error::ConfigError::invalid(
                "resume.rehome_sessions",
                "must be at least 1 when resume.rehome_s is on",
            ));
        }
        Ok(())
    }
}
