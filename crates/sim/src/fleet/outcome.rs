//! What one fleet run produced: a record per request and counters per replica.

use kvgate_core::Nanos;
use std::collections::BTreeMap;

/// One request's life.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RequestRecord {
    /// Arrival (and dispatch) time.
    pub arrival: Nanos,
    /// When its first token was delivered.
    pub first_token: Option<Nanos>,
    /// When its last token was delivered.
    pub finished: Option<Nanos>,
    /// The replica it went to.
    pub replica: u32,
    /// The router that dispatched it.
    pub router: u32,
    /// Prompt length.
    pub prompt_tokens: u32,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: u32,
    /// Output tokens generated.
    pub output_tokens: u32,
    /// The workload's tag.
    pub tag: u64,
    /// The workload's tenant.
    pub tenant: Option<u32>,
    /// The workload's session.
    pub session: Option<u64>,
    /// Times it was sent again after its replica died before its first token.
    pub retries: u32,
    /// It failed: its replica died mid-stream, or no router could place it.
    pub failed: bool,
    /// The time to first token its router predicted, milliseconds (`predicted_ttft` and the
    /// oracle say; other policies do not predict).
    pub predicted_ttft_ms: Option<f32>,
    /// The prompt tokens its router predicted the replica had cached (`predicted_ttft` says).
    pub predicted_cached: Option<u32>,
    /// Its stream was continued on another replica after its own died mid-answer.
    pub resumed: Option<Resumption>,
}

/// A stream continued elsewhere after its replica died mid-answer, as the gateway's `resume`
/// does: the continuation carries the prompt and the text so far and asks for the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resumption {
    /// When its replica died.
    pub broken: Nanos,
    /// When the continuation left the router; `None` while it waits at the replica's gate.
    pub sent: Option<Nanos>,
    /// When the continuation's first token came: the client's wait between two tokens ends.
    pub first_token: Option<Nanos>,
    /// Output tokens the client had before the break.
    pub output_before: u32,
    /// The continuation's prompt length (the prompt and the text so far).
    pub prompt_tokens: u32,
    /// Of those, tokens served from the prefix cache.
    pub cached_tokens: u32,
}

/// Counters of one replica.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ReplicaOutcome {
    /// Requests dispatched to it.
    pub assigned: u64,
    /// Iterations run.
    pub iterations: u64,
    /// Iterations that produced no output token.
    pub zero_output_iterations: u64,
    /// Time spent in iterations.
    pub busy: Nanos,
    /// Time spent in iterations that prefilled something.
    pub prefill_busy: Nanos,
    /// Prompt tokens computed.
    pub prefill_tokens: u64,
    /// Output tokens produced.
    pub output_tokens: u64,
    /// Sum over iterations of occupied slots / slots.
    pub slot_fill_sum: f64,
    /// Prompt tokens looked up in the prefix cache.
    pub prefix_queries_tokens: u64,
    /// Prompt tokens found there.
    pub prefix_hits_tokens: u64,
    /// Preemptions.
    pub preemptions: u64,
}

/// The true load skew (max minus min outstanding across replicas) sampled over time.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SkewStats {
    /// Samples taken.
    pub samples: u64,
    /// Sum of skews.
    pub sum: f64,
    /// Largest skew.
    pub max: f64,
    /// Every sample, in time order.
    pub series: Vec<u32>,
}

impl SkewStats {
    /// Adds one sample.
    pub fn add(&mut self, skew: f64) {
        self.samples += 1;
        self.sum += skew;
        self.max = self.max.max(skew);
        self.series.push(skew as u32);
    }

    /// The series averaged into `buckets` equal slices of time (fewer when there are fewer
    /// samples): load skew over time.
    pub fn over_time(&self, buckets: usize) -> Vec<f64> {
        let n = self.series.len();
        let k = buckets.min(n).max(1);
        if n == 0 {
            return Vec::new();
        }
        (0..k)
            .map(|b| {
                let (lo, hi) = (b * n / k, ((b + 1) * n / k).max(b * n / k + 1));
                let slice = &self.series[lo..hi.min(n)];
                let mean = slice.iter().map(|&x| f64::from(x)).sum::<f64>() / slice.len() as f64;
                (mean * 100.0).round() / 100.0
            })
            .collect()
    }

    /// Mean skew (0 without samples).
    pub fn mean(&self) -> f64 {
        if self.samples == 0 {
            0.0
        } else {
            self.sum / self.samples as f64
        }
    }
}

/// Decision reasons by label, in name order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReasonCounts(pub BTreeMap<&'static str, u64>);

impl ReasonCounts {
    /// Counts one decision.
    pub fn add(&mut self, label: &'static str) {
        *self.0.entry(label).or_default() += 1;
    }
}

/// Everything a run produced.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// One record per dispatched request, indexed by request id; warm-ups (re-homing) are
    /// dropped at the end of the run, after which the index no longer matches the id.
    pub records: Vec<RequestRecord>,
    /// Per replica.
    pub replicas: Vec<ReplicaOutcome>,
    /// Requests no router could place.
    pub rejected: u64,
    /// Requests dispatched and not finished (zero at the end).
    pub in_flight: u64,
    /// Output tokens delivered.
    pub output_tokens: u64,
    /// When the last open-loop arrival came.
    pub last_arrival: Nanos,
    /// Output tokens delivered before that instant.
    pub output_before_last_arrival: u64,
    /// When the last event happened.
    pub end: Nanos,
    /// The sampled true load skew.
    pub skew: SkewStats,
    /// Decision reasons.
    pub reasons: ReasonCounts,
    /// Warm-ups queued for sessions a lost replica held (`FleetConfig::rehome`).
    pub warmups_queued: u64,
    /// Of those, the ones routed before their session's next turn arrived.
    pub warmups_sent: u64,
    /// Heads of staged continuations that gave way to the next where no request awaited a
    /// first token (`resume_stage_grow`).
    pub heads_grown: u64,
    /// Heads of staged continuations that gave way to the next because the router's index
    /// said their replica held them.
    pub heads_held: u64,
    /// Requests that waited at their router's admission gate (`FleetConfig::admission`).
    pub admission_queued: u64,
    /// Requests refused at once, the gate's queue full (the gateway's 429).
    pub admission_rejected: u64,
    /// Requests that waited out the gate's timeout (the gateway's 504).
    pub admission_expired: u64,
}

impl Outcome {
    /// An empty outcome for `replicas` replicas.
    pub fn new(replicas: usize) -> Self {
        Outcome {
            replicas: vec![ReplicaOutcome::default(); replicas],
            ..Outcome::default()
        }
    }
}
