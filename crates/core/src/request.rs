//! The request as a routing policy sees it.

use serde::{Deserialize, Serialize};

/// How urgent a request is. Admission serves waiting interactive requests before batch ones
/// (with a bound on how long batch work can be passed over), lets batch work take only half the
/// queue, and sheds it first when the queue is full.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    /// A person is waiting for the first token.
    #[default]
    Interactive,
    /// Background or batch work that may wait or be shed under load.
    Batch,
}

/// A reasoning model's effort hint (`reasoning.effort`), which bounds the most variable part of a
/// request's cost: reasoning tokens are output tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReasoningEffort {
    /// Minimal or no reasoning.
    Minimal,
    /// Low effort.
    Low,
    /// Medium effort.
    Medium,
    /// High effort.
    High,
}

/// What the prefix indexes match on: the prompt's text, its token ids, or both.
///
/// The text is the serialised prefix-relevant part of the request (system prompt, tool
/// definitions, earlier turns, then the new turn) in a stable order, so that two requests that
/// share a conversation head share a text prefix.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prompt {
    /// The prompt text, if known.
    pub text: Option<String>,
    /// The prompt's token ids, if the caller tokenised it.
    pub tokens: Option<Vec<u32>>,
}

/// One request, as every policy sees it.
///
/// Owned plain data: the simulator builds millions of these, the gateway one per HTTP request.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// Unique per router; feedback events name requests by this id.
    pub id: u64,
    /// The tenant (API key or tenant header), part of every prefix key unless sharing is
    /// configured: cache hits are observable across tenants as short TTFTs.
    pub tenant: Option<String>,
    /// The conversation or agent session, if the client named one.
    pub session: Option<String>,
    /// The requested model.
    pub model: Option<String>,
    /// The prefix key.
    pub prompt: Prompt,
    /// Estimated prompt length in tokens.
    pub prompt_tokens: u32,
    /// `max_tokens` / `max_completion_tokens`, if set.
    pub max_output_tokens: Option<u32>,
    /// Reasoning effort, if the request carries one.
    pub reasoning_effort: Option<ReasoningEffort>,
    /// An explicit thinking budget in tokens (`thinking.budget_tokens`), if set.
    pub thinking_budget: Option<u32>,
    /// Priority class.
    pub priority: Priority,
    /// The LoRA adapter the request names (vLLM: `model` is the adapter's name; SGLang:
    /// `base:adapter`). Engines key their prefix caches by it, and an engine whose batch runs
    /// other adapters may stall the request, so it is part of the prefix key and of the
    /// adapter-affinity term ([`crate::lora`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapter: Option<String>,
}

impl Request {
    /// A request keyed by text alone; the token estimate is one token per four bytes.
    pub fn from_text(id: u64, text: impl Into<String>) -> Self {
        let text = text.into();
        let prompt_tokens = estimate_tokens(&text);
        Request {
            id,
            prompt: Prompt {
                text: Some(text),
                tokens: None,
            },
            prompt_tokens,
            ..Request::default()
        }
    }

    /// A request keyed by token ids.
    pub fn from_tokens(id: u64, tokens: Vec<u32>) -> Self {
        let prompt_tokens = u32::try_from(tokens.len()).unwrap_or(u32::MAX);
        Request {
            id,
            prompt: Prompt {
                text: None,
                tokens: Some(tokens),
            },
            prompt_tokens,
            ..Request::default()
        }
    }

    /// Sets the tenant.
    pub fn with_tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = Some(tenant.into());
        self
    }

    /// Sets the session.
    pub fn with_session(mut self, session: impl Into<String>) -> Self {
        self.session = Some(session.into());
        self
    }
}

/// The usual rule of thumb for English text with BPE tokenizers: about four bytes per token.
pub const BYTES_PER_TOKEN: usize = 4;

/// A prompt's length in tokens at [`BYTES_PER_TOKEN`].
pub fn estimate_tokens(text: &str) -> u32 {
    u32::try_from(text.len().div_ceil(BYTES_PER_TOKEN)).unwrap_or(u32::MAX)
}
