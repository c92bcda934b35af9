//! Continuations' and re-homing's own families.

use crate::metrics::{latency_histogram, Counter, Family, Histogram, ReasonLabel, Registry};

/// Broken streams continued, and sessions re-homed from a lost endpoint.
#[derive(Clone, Debug)]
pub(crate) struct ResumeMetrics {
    /// Streams broken after the first token, by what became of them.
    pub(crate) stream_resumes: Family<ReasonLabel, Counter>,
    /// Time a continuation waited at the gateway for its endpoint's previous one.
    pub(crate) stream_resume_wait: Histogram,
    /// Warm-up heads of staged continuations that ended with their prefix computed.
    pub(crate) stream_resume_heads: Counter,
    /// Heads of staged continuations skipped, the next sent in their place (`stage_grow`).
    pub(crate) stream_resume_heads_skipped: Counter,
    /// Heads of staged continuations not sent because the endpoint was predicted to hold them.
    pub(crate) stream_resume_heads_held: Counter,
    /// Re-homing warm-ups of sessions a lost endpoint served (`resume.rehome_s`): `sent`, or
    /// why not (`superseded`: the session's next turn came first; `no_endpoint`, `failed`).
    pub(crate) rehome_warmups: Family<ReasonLabel, Counter>,
    /// Heads of staged re-homing warm-ups that ended with their prefix computed.
    pub(crate) rehome_heads: Counter,
    /// Probes of an endpoint after a sign of loss, by what they found.
    pub(crate) rehome_probes: Family<ReasonLabel, Counter>,
}

impl ResumeMetrics {
    /// Every family, registered in `registry`.
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let metrics = ResumeMetrics {
            stream_resumes: Family::default(),
            stream_resume_wait: latency_histogram(),
            stream_resume_heads: Counter::default(),
            stream_resume_heads_skipped: Counter::default(),
            stream_resume_heads_held: Counter::default(),
            rehome_warmups: Family::default(),
            rehome_heads: Counter::default(),
            rehome_probes: Family::default(),
        };
        registry.register(
            "stream_resumes",
            "Streams that broke after the first token: resumed on another endpoint, finished, or why not",
            metrics.stream_resumes.clone(),
        );
        registry.register(
            "stream_resume_wait_seconds",
            "Time a mid-stream continuation waited at the gateway for its endpoint's previous one to reach its first token",
            metrics.stream_resume_wait.clone(),
        );
        registry.register(
            "stream_resume_heads",
            "Warm-up heads of staged mid-stream continuations that ended with their prefix computed (resume.stage_tokens)",
            metrics.stream_resume_heads.clone(),
        );
        registry.register(
            "stream_resume_heads_skipped",
            "Heads of staged mid-stream continuations skipped where no other request awaited a first token, the next head sent in their place (resume.stage_grow)",
            metrics.stream_resume_heads_skipped.clone(),
        );
        registry.register(
            "stream_resume_heads_held",
            "Heads of staged mid-stream continuations not sent because the prefix index said the endpoint already held them (resume.stage_tokens)",
            metrics.stream_resume_heads_held.clone(),
        );
        registry.register(
            "rehome_warmups",
            "Warm-ups of the sessions whose last turn ran on an endpoint that broke a stream or refused a connection, sent to another (resume.rehome_s): sent, or why not",
            metrics.rehome_warmups.clone(),
        );
        registry.register(
            "rehome_heads",
            "Heads of staged re-homing warm-ups that ended with their prefix computed (resume.rehome_s, resume.stage_tokens)",
            metrics.rehome_heads.clone(),
        );
        registry.register(
            "rehome_probes",
            "Endpoints asked after a broken stream or failed connection when re-homing is on: answered (no re-homing) or lost",
            metrics.rehome_probes.clone(),
        );
        metrics
    }
}
