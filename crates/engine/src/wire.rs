//! Response bodies in vLLM's exact JSON shapes (compared with `test-data/vllm/`).
//!
//! Streamed chunks are written straight into a byte buffer from a prefix formatted once per
//! request (`{"id":…,"object":…,"created":…,"model":…,"choices":`), so a token costs one
//! `extend_from_slice` of constant pieces: no per-token allocation or serde tree.

use crate::request::Endpoint;
use serde_json::json;

/// Why a sequence ended (`finish_reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FinishReason {
    /// A sampled end of sequence.
    Stop,
    /// `max_tokens` (or the context) was reached.
    Length,
}

impl FinishReason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// Token counts reported in `usage`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Usage {
    pub(crate) prompt_tokens: u32,
    pub(crate) completion_tokens: u32,
    pub(crate) cached_tokens: u32,
}

impl Usage {
    fn json(&self) -> serde_json::Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "completion_tokens": self.completion_tokens,
            "prompt_tokens_details": { "cached_tokens": self.cached_tokens },
        })
    }
}

/// Request ids in vLLM's style: `chatcmpl-` or `cmpl-` and 32 hex digits.
pub(crate) fn response_id(endpoint: Endpoint, seq_id: u64, engine_seed: u64) -> String {
    let prefix = match endpoint {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Completions => "cmpl",
    };
    let hi = xxhash_rust::xxh3::xxh3_64_with_seed(&seq_id.to_le_bytes(), engine_seed);
    format!("{prefix}-{hi:016x}{seq_id:016x}")
}

/// Writes SSE chunks for one streamed request.
#[derive(Debug)]
pub(crate) struct ChunkWriter {
    endpoint: Endpoint,
    prefix: Vec<u8>,
}

impl ChunkWriter {
    pub(crate) fn new(endpoint: Endpoint, id: &str, created: u64, model_json: &str) -> Self {
        let object = match endpoint {
            Endpoint::Chat => "chat.completion.chunk",
            Endpoint::Completions => "text_completion",
        };
        let prefix = format!(
            "data: {{\"id\":\"{id}\",\"object\":\"{object}\",\"created\":{created},\"model\":{model_json},\"choices\":"
        );
        ChunkWriter {
            endpoint,
            prefix: prefix.into_bytes(),
        }
    }

    /// The chat stream's opening chunk announcing the assistant role.
    pub(crate) fn role(&self, out: &mut Vec<u8>) {
        if self.endpoint == Endpoint::Chat {
            out.extend_from_slice(&self.prefix);
            out.extend_from_slice(
                br#"[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}"#,
            );
            out.extend_from_slice(b"\n\n");
        }
    }

    /// One token's text; `finish` on the sequence's last token.
    pub(crate) fn token(&self, out: &mut Vec<u8>, word: &str, finish: Option<FinishReason>) {
        debug_assert!(
            !word.contains(['"', '\\']),
            "output words need no JSON escaping"
        );
        out.extend_from_slice(&self.prefix);
        match self.endpoint {
            Endpoint::Chat => out.extend_from_slice(br#"[{"index":0,"delta":{"content":""#),
            Endpoint::Completions => out.extend_from_slice(br#"[{"index":0,"text":""#),
        }
        out.extend_from_slice(word.as_bytes());
        match self.endpoint {
            Endpoint::Chat => out.extend_from_slice(br#""},"logprobs":null,"finish_reason":"#),
            Endpoint::Completions => {
                out.extend_from_slice(br#"","logprobs":null,"finish_reason":"#)
            }
        }
        match finish {
            None => out.extend_from_slice(b"null"),
            Some(reason) => {
                out.push(b'"');
                out.extend_from_slice(reason.as_str().as_bytes());
                out.extend_from_slice(br#"","stop_reason":null"#);
            }
        }
        out.extend_from_slice(b"}]}\n\n");
    }

    /// The usage chunk sent before `[DONE]` when `stream_options.include_usage` is set.
    pub(crate) fn usage(&self, out: &mut Vec<u8>, usage: Usage) {
        out.extend_from_slice(&self.prefix);
        out.extend_from_slice(b"[],\"usage\":");
        out.extend_from_slice(usage.json().to_string().as_bytes());
        out.extend_from_slice(b"}\n\n");
    }

    /// The stream terminator.
    pub(crate) fn done(out: &mut Vec<u8>) {
        out.extend_from_slice(b"data: [DONE]\n\n");
    }
}

/// A whole non-streamed response.
pub(crate) fn full_response(
    endpoint: Endpoint,
    id: &str,
    created: u64,
    model: &str,
    text: &str,
    finish: FinishReason,
    usage: Usage,
) -> serde_json::Value {
    let choice = match endpoint {
        Endpoint::Chat => json!({
            "index": 0,
            "message": {
                "role": "assistant",
                "content": text,
                "refusal": null,
                "annotations": null,
                "audio": null,
                "function_call": null,
                "tool_calls": [],
                "reasoning_content": null,
            },
            "logprobs": null,
            "finish_reason": finish.as_str(),
            "stop_reason": null,
        }),
        Endpoint::Completions => json!({
            "index": 0,
            "text": text,
            "logprobs": null,
            "finish_reason": finish.as_str(),
            "stop_reason": null,
            "prompt_logprobs": null,
        }),
    };
    let object = match endpoint {
        Endpoint::Chat => "chat.completion",
        Endpoint::Completions => "text_completion",
    };
    json!({
        "id": id,
        "object": object,
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage.json(),
    })
}
