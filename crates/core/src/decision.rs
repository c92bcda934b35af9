//! What a policy returns and what it is told afterwards.

use crate::index::blocks::KvEvent;
use crate::index::Overlaps;
use crate::{EndpointId, Nanos, Request};
use serde::Serialize;
use std::fmt;

/// A policy's answer for one request.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum Decision {
    /// Send the request to `endpoint`.
    Route(Route),
    /// No endpoint can take it.
    Reject(Rejection),
}

impl Decision {
    /// The chosen endpoint, if any.
    pub fn endpoint(&self) -> Option<EndpointId> {
        match self {
            Decision::Route(r) => Some(r.endpoint),
            Decision::Reject(_) => None,
        }
    }
}

/// A routing choice and why it was made.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Route {
    /// The chosen endpoint.
    pub endpoint: EndpointId,
    /// Why, for logs, metrics and the simulator's explanations.
    pub reason: Reason,
}

/// Why a policy chose an endpoint.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Reason {
    /// Uniformly random.
    Random,
    /// Next in turn.
    RoundRobin,
    /// Next in the smooth weighted turn, with the weight it had.
    WeightedTurn {
        /// Effective weight at the time of the pick.
        weight: f64,
    },
    /// The least loaded of all candidates.
    LeastLoaded {
        /// Its load signal.
        load: f64,
    },
    /// The less loaded of `d` random candidates.
    PowerOfChoices {
        /// How many were sampled.
        sampled: usize,
        /// The chosen one's load.
        load: f64,
    },
    /// The lowest KV cache usage.
    LeastKv {
        /// Its usage, 0..=1.
        usage: f64,
    },
    /// The consistent-hash owner of the key.
    HashOwner,
    /// The owner was over capacity; the ring walk moved `hops` endpoints on.
    Overflow {
        /// Endpoints skipped.
        hops: u32,
    },
    /// The prefix index matched enough of the prompt here.
    PrefixAffinity {
        /// Matched units (characters, tokens or blocks).
        matched: u32,
        /// Units in the prompt.
        total: u32,
    },
    /// The best match was too short; went to the least loaded.
    LowMatch {
        /// Best matched units.
        matched: u32,
        /// Units in the prompt.
        total: u32,
    },
    /// The fleet was imbalanced, or the preferred endpoint overloaded; went to the least loaded.
    BalanceEscape {
        /// The load that triggered the escape.
        max_load: f64,
        /// The chosen endpoint's load.
        min_load: f64,
    },
    /// Lowest cost (argmin).
    LeastCost {
        /// The chosen endpoint's cost.
        cost: f64,
    },
    /// Sampled from a softmax over costs.
    SampledCost {
        /// The chosen endpoint's cost.
        cost: f64,
    },
    /// Highest dynamic weight (`weight / (active + 1)^bias`).
    WeightedLeastRequest {
        /// The chosen endpoint's dynamic weight.
        weight: f64,
    },
    /// Lowest peak-EWMA latency cost.
    LowestLatency {
        /// The chosen endpoint's cost in milliseconds.
        cost_ms: f64,
    },
    /// The earliest predicted first token.
    PredictedTtft {
        /// The prediction for the chosen endpoint, milliseconds.
        ttft_ms: f64,
        /// Prompt tokens it is predicted to hold.
        cached_tokens: u32,
    },
}

impl Reason {
    /// A short stable label for metrics and logs, one per kind of reason, so a cold miss and
    /// an imbalance escape (both "least loaded" in SGLang's router) stay apart.
    pub fn label(&self) -> &'static str {
        match self {
            Reason::Random => "random",
            Reason::RoundRobin => "turn",
            Reason::WeightedTurn { .. } => "weighted_turn",
            Reason::LeastLoaded { .. } => "least_loaded",
            Reason::PowerOfChoices { .. } => "power_of_choices",
            Reason::LeastKv { .. } => "least_kv",
            Reason::WeightedLeastRequest { .. } => "weighted_least_request",
            Reason::HashOwner => "hash_owner",
            Reason::Overflow { .. } => "overflow",
            Reason::PrefixAffinity { .. } => "affinity",
            Reason::LowMatch { .. } => "miss",
            Reason::BalanceEscape { .. } => "escape",
            Reason::LeastCost { .. } => "least_cost",
            Reason::SampledCost { .. } => "sampled_cost",
            Reason::LowestLatency { .. } => "latency",
            Reason::PredictedTtft { .. } => "predicted",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Random => write!(f, "random"),
            Reason::RoundRobin => write!(f, "round robin turn"),
            Reason::WeightedTurn { weight } => write!(f, "weighted turn (weight {weight:.2})"),
            Reason::LeastLoaded { load } => write!(f, "least loaded (load {load:.1})"),
            Reason::PowerOfChoices { sampled, load } => {
                write!(f, "least loaded of {sampled} sampled (load {load:.1})")
            }
            Reason::LeastKv { usage } => write!(f, "least KV usage ({:.0}%)", usage * 100.0),
            Reason::HashOwner => write!(f, "hash owner"),
            Reason::Overflow { hops } => {
                write!(f, "owner over capacity, {hops} hop(s) on the ring")
            }
            Reason::PrefixAffinity { matched, total } => {
                write!(f, "prefix affinity ({matched}/{total} matched)")
            }
            Reason::LowMatch { matched, total } => {
                write!(f, "low match ({matched}/{total}), least loaded")
            }
            Reason::BalanceEscape { max_load, min_load } => {
                write!(f, "balance escape (load {max_load:.1} vs {min_load:.1})")
            }
            Reason::LeastCost { cost } => write!(f, "least cost ({cost:.2})"),
            Reason::SampledCost { cost } => write!(f, "softmax sample (cost {cost:.2})"),
            Reason::WeightedLeastRequest { weight } => {
                write!(f, "weighted least request (weight {weight:.3})")
            }
            Reason::LowestLatency { cost_ms } => write!(f, "lowest latency cost ({cost_ms:.2} ms)"),
            Reason::PredictedTtft {
                ttft_ms,
                cached_tokens,
            } => write!(
                f,
                "earliest predicted first token ({ttft_ms:.0} ms, {cached_tokens} tokens cached)"
            ),
        }
    }
}

/// Why no endpoint was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Rejection {
    /// The fleet is empty.
    NoEndpoints,
    /// Every endpoint is draining or unhealthy.
    NoRoutableEndpoint,
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rejection::NoEndpoints => write!(f, "no endpoints"),
            Rejection::NoRoutableEndpoint => write!(f, "no routable endpoint"),
        }
    }
}

/// How a request ended badly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// Could not connect or the connection dropped before a response.
    Connect,
    /// The endpoint answered 5xx.
    ServerError,
    /// The endpoint answered 429.
    Overloaded,
    /// No first token in time.
    Timeout,
    /// The client went away.
    Cancelled,
}

impl FailureKind {
    /// A short stable label: `connect`, `server_error`, `overloaded`, `timeout`, `cancelled`.
    pub fn label(self) -> &'static str {
        match self {
            FailureKind::Connect => "connect",
            FailureKind::ServerError => "server_error",
            FailureKind::Overloaded => "overloaded",
            FailureKind::Timeout => "timeout",
            FailureKind::Cancelled => "cancelled",
        }
    }
}

/// Token counts an engine reported for one request (`usage` with
/// `prompt_tokens_details.cached_tokens`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Usage {
    /// Prompt tokens as the engine tokenised them.
    pub prompt_tokens: u32,
    /// Prompt tokens its prefix cache served; `None` when the engine does not say (vLLM
    /// without `--enable-prompt-tokens-details`).
    pub cached_tokens: Option<u32>,
    /// Output tokens generated.
    pub output_tokens: u32,
}

/// What a policy is told after it decided: the simulator and the gateway emit the same events.
#[derive(Clone, Copy, Debug)]
pub enum Event<'a> {
    /// The request was sent to `endpoint`.
    Dispatched {
        /// The request.
        request: &'a Request,
        /// Where it went.
        endpoint: EndpointId,
        /// When.
        at: Nanos,
        /// What the prefix cache believed every endpoint held when the pick was made (empty
        /// when the policy consults no index).
        overlaps: &'a Overlaps,
    },
    /// The first token arrived after `ttft`.
    FirstToken {
        /// The request id.
        request: u64,
        /// Its endpoint.
        endpoint: EndpointId,
        /// When.
        at: Nanos,
        /// Time from dispatch to first token.
        ttft: Nanos,
    },
    /// The request finished normally.
    Completed {
        /// The request id.
        request: u64,
        /// Its endpoint.
        endpoint: EndpointId,
        /// When.
        at: Nanos,
        /// Time from dispatch to the end of the stream.
        latency: Nanos,
        /// Output tokens produced.
        output_tokens: u32,
    },
    /// The engine's account of a finished request (OpenAI `usage`): the one exact signal of
    /// how much of the prompt its prefix cache served.
    Usage {
        /// The request id.
        request: u64,
        /// Its endpoint.
        endpoint: EndpointId,
        /// When.
        at: Nanos,
        /// What the engine reported.
        usage: Usage,
    },
    /// The request failed on `endpoint`.
    Failed {
        /// The request id.
        request: u64,
        /// Its endpoint.
        endpoint: EndpointId,
        /// When.
        at: Nanos,
        /// How.
        kind: FailureKind,
    },
    /// The endpoint left the pool: forget everything about it.
    EndpointRemoved {
        /// The endpoint.
        endpoint: EndpointId,
    },
    /// An engine reported KV cache changes (vLLM KV events).
    Kv {
        /// The reporting endpoint.
        endpoint: EndpointId,
        /// What changed.
        event: &'a KvEvent,
        /// When it was received.
        at: Nanos,
    },
}
