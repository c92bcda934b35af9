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
pub(crate) fn response_id(endpoint: Endpoint, seq_id: u64, salt: u64) -> String {
    let prefix = match endpoint {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Completions => "cmpl",
    };
    let hash = xxhash_rust::xxh3::xxh3_64_with_seed(&seq_id.to_le_bytes(), salt);
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn data_events(bytes: &[u8]) -> Vec<serde_json::Value> {
        std::str::from_utf8(bytes)
            .unwrap()
            .split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| e.strip_prefix("data: ").unwrap())
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).unwrap())
            .collect()
    }

    proptest! {
        #[test]
        fn every_chunk_is_valid_json_for_any_model_name(model in "\\PC{0,24}", chat in any::<bool>(), word in 0usize..32) {
            let endpoint = if chat { Endpoint::Chat } else { Endpoint::Completions };
            let model_json = serde_json::to_string(&model).unwrap();
            let writer = ChunkWriter::new(endpoint, "id-1", 7, &model_json);
            let mut out = Vec::new();
            writer.role(&mut out);
            writer.token(&mut out, crate::tokenizer::WORDS[word], None);
            writer.token(&mut out, "", Some(FinishReason::Stop));
            writer.usage(&mut out, Usage { prompt_tokens: 3, completion_tokens: 2, cached_tokens: 0 });
            ChunkWriter::done(&mut out);
            let events = data_events(&out);
            prop_assert_eq!(events.len(), if chat { 4 } else { 3 });
            for event in &events {
                prop_assert_eq!(event["model"].as_str(), Some(model.as_str()));
            }
            prop_assert!(out.ends_with(b"data: [DONE]\n\n"));
        }
    }

    #[test]
    fn usage_totals_add_up() {
        let usage = Usage {
            prompt_tokens: 10,
            completion_tokens: 5,
            cached_tokens: 8,
        };
        let body = full_response(
            Endpoint::Chat,
            "x",
            0,
            "m",
            "hi",
            FinishReason::Length,
            usage,
        );
        assert_eq!(body["usage"]["total_tokens"], 15);
        assert_eq!(body["usage"]["prompt_tokens_details"]["cached_tokens"], 8);
        assert_eq!(body["choices"][0]["finish_reason"], "length");
    }
}
