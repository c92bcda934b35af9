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

/// `system_fingerprint`: vLLM sends `vllm-VERSION-HASH`; the emulator names itself.
pub(crate) const SYSTEM_FINGERPRINT: &str = concat!("kvgate-engine-", env!("CARGO_PKG_VERSION"));

impl Usage {
    /// As vLLM writes it: chat responses also carry `created_cache_tokens` in the details, and
    /// non-streamed responses `multimodal_tokens` and `completion_tokens_details`.
    fn json(&self, endpoint: Endpoint, streamed: bool) -> serde_json::Value {
        let mut details = json!({ "cached_tokens": self.cached_tokens });
        let mut usage = json!({
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "completion_tokens": self.completion_tokens,
        });
        if !streamed {
            let created = if endpoint == Endpoint::Chat {
                json!(0)
            } else {
                json!(null)
            };
            details["created_cache_tokens"] = created;
            details["multimodal_tokens"] = json!(null);
            usage["prompt_tokens_details"] = details;
            usage["completion_tokens_details"] = json!(null);
        } else {
            if endpoint == Endpoint::Chat {
                details["created_cache_tokens"] = json!(0);
            }
            usage["prompt_tokens_details"] = details;
        }
        usage
    }
}

/// Request ids in vLLM's style: `chatcmpl-` or `cmpl-` and 16 hex digits.
pub(crate) fn response_id(endpoint: Endpoint, seq_id: u64, engine_seed: u64) -> String {
    let prefix = match endpoint {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Completions => "cmpl",
    };
    let hash = xxhash_rust::xxh3::xxh3_64_with_seed(&seq_id.to_le_bytes(), engine_seed);
    format!("{prefix}-{hash:016x}")
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
                br#"[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":null,"prompt_text":null}"#,
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
                out.push(b'"');
            }
        }
        match (self.endpoint, finish) {
            (Endpoint::Chat, None) => out.extend_from_slice(br#","token_ids":null}]}"#),
            (Endpoint::Chat, Some(_)) => {
                out.extend_from_slice(br#","stop_reason":null,"token_ids":null}]}"#)
            }
            (Endpoint::Completions, _) => out.extend_from_slice(
                br#","stop_reason":null,"prompt_token_ids":null,"token_ids":null}]}"#,
            ),
        }
        out.extend_from_slice(b"\n\n");
    }

    /// The usage chunk sent before `[DONE]` when `stream_options.include_usage` is set.
    pub(crate) fn usage(&self, out: &mut Vec<u8>, usage: Usage) {
        out.extend_from_slice(&self.prefix);
        out.extend_from_slice(b"[],\"usage\":");
        out.extend_from_slice(usage.json(self.endpoint, true).to_string().as_bytes());
        out.extend_from_slice(b",\"system_fingerprint\":\"");
        out.extend_from_slice(SYSTEM_FINGERPRINT.as_bytes());
        out.extend_from_slice(b"\"}\n\n");
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
    let mut body = match endpoint {
        Endpoint::Chat => json!({
            "id": id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [{
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": text,
                    "refusal": null,
                    "annotations": null,
                    "audio": null,
                    "function_call": null,
                    "reasoning": null,
                },
                "logprobs": null,
                "finish_reason": finish.as_str(),
                "stop_reason": null,
                "token_ids": null,
                "routed_experts": null,
            }],
            "service_tier": null,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "prompt_logprobs": null,
            "prompt_token_ids": null,
            "prompt_text": null,
            "kv_transfer_params": null,
            "ec_transfer_params": null,
            "metrics": null,
        }),
        Endpoint::Completions => json!({
            "id": id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [{
                "index": 0,
                "text": text,
                "logprobs": null,
                "finish_reason": finish.as_str(),
                "stop_reason": null,
                "token_ids": null,
                "prompt_logprobs": null,
                "prompt_token_ids": null,
                "routed_experts": null,
            }],
            "service_tier": null,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "kv_transfer_params": null,
            "ec_transfer_params": null,
            "metrics": null,
        }),
    };
    body["usage"] = usage.json(endpoint, false);
    body
}
