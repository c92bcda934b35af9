//! The dispatch core: everything between "this request needs an endpoint" and "it went there",
//! shared by the simulator's fleet and the gateway's pool so that both make the same decisions
//! from the same events.
//!
//! It owns the [`Router`](crate::Router) (policy, in-flight ledger, random source) and every
//! rule that decides which members the policy may choose among ([`DispatchCore`]): health
//! checks, Retry-After windows, cool-downs after failures, circuit breakers and their tickets,
//! deployment rate limits, priority tiers with spillover and session pins, the retry budget and
//! the hedging delay. The prefix cache the policy consults is kept apart, so a runtime can look
//! a long prompt up under a read lock and pick under a short exclusive one; the steps that
//! touch it are functions here ([`record_dispatch`], [`correct`]), called in the same order by
//! every driver. [`Dispatcher`] owns both, for single-threaded drivers (the simulator).
//!
//! A pick is `cache.overlaps(request)` → [`DispatchCore::pick`] → [`record_dispatch`]; the
//! outcome of the attempt comes back as events ([`DispatchCore::first_token`],
//! [`DispatchCore::refused`], [`DispatchCore::ended`], [`DispatchCore::failed`]), with the
//! cache told of the first token and the end, and its prediction scored by [`correct`].
//!
//! The rules for continuing a broken stream elsewhere and re-homing a lost endpoint's sessions
//! are here too ([`ContinuationGate`], [`head_held`], [`RehomeBook`]), so the simulator's
//! continuations and warm-ups follow the gateway's.

mod continuation;
mod core;
mod dispatcher;
mod events;
mod gated;
mod limits;
mod member;
mod tiers;
pub mod trace;

pub use self::core::DispatchCore;
pub use continuation::{head_held, ContinuationGate, RehomeBook};
pub use dispatcher::Dispatcher;
pub use events::End;
pub use gated::Gated;
pub use limits::DeploymentLimits;
pub use member::{MemberSpec, Serving, Status};
pub use tiers::SpilloverConfig;

use crate::index::blocks::KvEvent;
use crate::index::events::BatchOutcome;
use crate::index::{as_reported, IndexSpec, Overlaps, Prediction, PrefixCache, TreeKey};
use crate::resilience::{BreakerConfig, HedgeConfig, RetryBudgetConfig, Ticket};
use crate::tenancy::ChargeModel;
use crate::{EndpointId, Nanos, PolicyConfig, Request, Route, Usage};

/// The dispatch core's parameters besides the policy's.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DispatchConfig {
    /// The retry budget every request shares.
    pub retry_budget: RetryBudgetConfig,
    /// When a first attempt is hedged.
    pub hedge: HedgeConfig,
    /// Each member's circuit breaker.
    pub breaker: BreakerConfig,
    /// When a tier passes a request on.
    pub spillover: SpilloverConfig,
    /// How a request is charged against deployment limits before it runs (the tenancy
    /// configuration's, so limits and tenants count alike).
    pub charge: ChargeModel,
    /// The LoRA gate ([`crate::lora::LoraGate`]).
    pub lora_gate: crate::lora::GateConfig,
}

/// Which attempt of a request a pick is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// The first: counts towards the retry budget's request total and arms the hedge.
    First,
    /// A retry: prefers endpoints not tried yet, else takes any.
    Retry,
    /// A hedge: only an endpoint not tried yet.
    Hedge,
    /// A stream's continuation after it broke: only an endpoint not tried yet; outside the
    /// retry budget (a continuation replaces work lost, it adds none).
    Resume,
}

impl Attempt {
    /// `first`, `retry`, `hedge` or `resume`.
    pub fn label(self) -> &'static str {
        match self {
            Attempt::First => "first",
            Attempt::Retry => "retry",
            Attempt::Hedge => "hedge",
            Attempt::Resume => "resume",
        }
    }
}

/// A pick, committed: where the attempt goes and what its outcome must hand back.
#[derive(Clone, Debug, PartialEq)]
pub struct Picked {
    /// The endpoint and the policy's reason.
    pub route: Route,
    /// The breaker's permission for this dispatch, handed back with its outcome.
    pub ticket: Ticket,
    /// The endpoint's priority tier.
    pub tier: u32,
    /// Why a higher tier was passed over although it could take the request (`ttft`,
    /// `queue`, `session`); `None` when it could not.
    pub spilled: Option<&'static str>,
    /// The members the policy chose among in the pass that decided, sorted by id.
    pub eligible: Vec<EndpointId>,
    /// For a first attempt: how long to wait before hedging, if hedging is on.
    pub hedge_after: Option<Nanos>,
    /// Whether the chosen member's published status changed (its breaker).
    pub changed: bool,
    /// When the LoRA gate held the request before this pick: why it went and the hold.
    pub held: Option<(crate::lora::Pass, crate::lora::Hold)>,
}

/// The prefix cache for `policy` in a gateway: its own index, or, for a policy that consults
/// none, one mirroring the engines, so every request's cached tokens are predicted and scored
/// whatever the policy. Every such cache also takes the engines' KV events, laid over its index
/// for endpoints that publish them (inert for those that do not).
pub fn cache_for(policy: &PolicyConfig, max_event_entries: usize) -> PrefixCache {
    let spec = policy.index().unwrap_or(IndexSpec::Radix {
        key: TreeKey::Auto,
        max_size: 67_108_864,
        eviction_interval: Nanos::from_secs(60),
        share_across_tenants: false,
        mirror_engines: true,
    });
    PrefixCache::new(&spec).with_engine_events(max_event_entries)
}

/// The cache's half of a pick: what it predicts `endpoint` holds of `request` (kept until the
/// usage arrives), and the dispatch inserted.
pub fn record_dispatch(
    cache: &mut PrefixCache,
    request: &Request,
    endpoint: EndpointId,
    overlaps: &Overlaps,
    now: Nanos,
) -> Prediction {
    let prediction = cache.prediction(request, endpoint, overlaps);
    cache.dispatched(request, endpoint, now, overlaps);
    prediction
}

/// The cache's half of batch `seq` of `endpoint`'s KV-event stream: into the engine layer
/// laid over the index, and each event into an index fed by events (a block index that is not
/// approximate). The policy's half is [`DispatchCore::kv_events`].
pub fn record_kv_batch(
    cache: &mut PrefixCache,
    endpoint: EndpointId,
    seq: u64,
    events: &[KvEvent],
    now: Nanos,
) -> Option<BatchOutcome> {
    let outcome = cache.kv_batch(endpoint, seq, events, now);
    for event in events {
        cache.kv_event(endpoint, event, now);
    }
    outcome
}

/// Tokens of slack before a predicted hit counts as missed when the engine reports no block
/// size: one KV block of the usual size (vLLM's default block is 16 tokens).
pub const DEFAULT_BLOCK_TOKENS: u32 = 16;

/// How a prediction compared with the engine's usage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PredictionResult {
    /// Within a block (to the token, for a prediction from a complete KV-event stream).
    Exact,
    /// More cached than the engine reported.
    Over,
    /// Less cached than the engine reported.
    Under,
}

impl PredictionResult {
    /// `exact`, `over` or `under`.
    pub fn label(self) -> &'static str {
        match self {
            PredictionResult::Exact => "exact",
            PredictionResult::Over => "over",
            PredictionResult::Under => "under",
        }
    }
}

/// Corrects the cache from `usage` when it reports cached tokens, and says how `prediction`
/// compared. `block` is the block size the endpoint reports, if any.
pub fn correct(
    cache: &mut PrefixCache,
    usage: Usage,
    prediction: &Prediction,
    block: Option<u32>,
) -> Option<PredictionResult> {
    let cached = usage.cached_tokens?;
    let slack_block = block.unwrap_or(DEFAULT_BLOCK_TOKENS);
    cache.correct(prediction, (usage.prompt_tokens, cached), slack_block);
    let predicted = reported_cached(prediction, usage.prompt_tokens, block);
    let slack = if prediction.is_exact() {
        0
    } else {
        slack_block
    };
    Some(if predicted.abs_diff(cached) <= slack {
        PredictionResult::Exact
    } else if predicted > cached {
        PredictionResult::Over
    } else {
        PredictionResult::Under
    })
}

/// The cached tokens `prediction` says its endpoint will report for a prompt of
/// `prompt_tokens`: the index's figure in whole blocks once the engine reports its block size,
/// as engines count cache hits and as `predicted_ttft` prices them ([`as_reported`]). A
/// prediction from a trusted KV-event stream counts to the token already.
pub fn reported_cached(prediction: &Prediction, prompt_tokens: u32, block: Option<u32>) -> u32 {
    let predicted = prediction.cached_tokens(prompt_tokens);
    if prediction.is_exact() || prompt_tokens == 0 {
        return predicted;
    }
    as_reported(f64::from(predicted), f64::from(prompt_tokens), block) as u32
}

#[cfg(test)]
mod tests;
