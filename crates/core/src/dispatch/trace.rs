//! A recorded dispatch trace: every event a [`super::Dispatcher`] was fed, in order, with its
//! time, and the decision each pick made. The simulator records one; the gateway's tests replay
//! it through the pool and check that the pool decides exactly as the simulated router did.

use crate::decision::FailureKind;
use crate::index::blocks::KvEvent;
use crate::{EndpointId, Nanos, Observation, PolicyConfig, Request, Usage};
use serde::{Deserialize, Serialize};

/// A whole trace: how its router was built, and what it saw.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Trace {
    /// The router's policy.
    pub policy: PolicyConfig,
    /// The router's random seed.
    pub seed: u64,
    /// The engine-event index's bound per endpoint, when engine KV events were on.
    pub engine_event_entries: Option<usize>,
    /// The events, in the order they were fed.
    pub events: Vec<Stamped>,
}

/// One event and when it happened.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stamped {
    /// When.
    pub at: Nanos,
    /// What.
    #[serde(flatten)]
    pub event: TraceEvent,
}

/// What a router is told, and what it answered to a pick.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum TraceEvent {
    /// A member joined.
    Join {
        /// Its id.
        endpoint: EndpointId,
        /// Its weight.
        weight: f64,
    },
    /// A member left.
    Leave {
        /// Its id.
        endpoint: EndpointId,
    },
    /// A scrape taken at the event's time.
    Scrape {
        /// Of whom.
        endpoint: EndpointId,
        /// What it said.
        observation: Observation,
    },
    /// A stream from the member delivered tokens.
    Tokens {
        /// From whom.
        endpoint: EndpointId,
    },
    /// A pick, and what it decided.
    Pick {
        /// The request.
        request: Box<Request>,
        /// Members the request already tried.
        tried: Vec<EndpointId>,
        /// `first`, `retry`, `hedge` or `resume`.
        attempt: String,
        /// The decision: the endpoint and the reason's label, or `None` for a rejection.
        decision: Option<(EndpointId, String)>,
    },
    /// A streamed first token.
    FirstToken {
        /// Which request.
        request: u64,
        /// Where.
        endpoint: EndpointId,
        /// After how long.
        ttft: Nanos,
    },
    /// A request completed.
    Completed {
        /// Which request.
        request: u64,
        /// Where.
        endpoint: EndpointId,
        /// Dispatch to end.
        latency: Nanos,
        /// Output tokens.
        output_tokens: u32,
        /// The engine's usage.
        usage: Option<Usage>,
    },
    /// A request failed.
    Failed {
        /// Which request.
        request: u64,
        /// Where.
        endpoint: EndpointId,
        /// How.
        kind: FailureKind,
    },
    /// A batch of an engine's KV events.
    KvBatch {
        /// Whose.
        endpoint: EndpointId,
        /// Its sequence number.
        seq: u64,
        /// The events.
        events: Vec<KvEvent>,
    },
    /// Periodic upkeep.
    Maintain,
    /// A peer dispatched a request.
    PeerDispatched {
        /// The request.
        request: Box<Request>,
        /// Where.
        endpoint: EndpointId,
    },
    /// A peer's request had its first token.
    PeerFirstToken {
        /// Which request.
        request: u64,
        /// Where.
        endpoint: EndpointId,
        /// After how long.
        ttft: Nanos,
    },
    /// A peer's request completed.
    PeerCompleted {
        /// Which request.
        request: u64,
        /// Where.
        endpoint: EndpointId,
        /// Dispatch to end.
        latency: Nanos,
        /// Output tokens.
        output_tokens: u32,
        /// The engine's usage.
        usage: Option<Usage>,
    },
    /// A peer's request failed.
    PeerFailed {
        /// Which request.
        request: u64,
        /// Where.
        endpoint: EndpointId,
        /// How.
        kind: FailureKind,
    },
}

/// Parses an attempt's label back.
pub fn attempt_of(label: &str) -> Option<super::Attempt> {
    use super::Attempt;
    [
        Attempt::First,
        Attempt::Retry,
        Attempt::Hedge,
        Attempt::Resume,
    ]
    .into_iter()
    .find(|a| a.label() == label)
}
