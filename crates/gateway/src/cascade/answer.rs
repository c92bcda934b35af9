//! Reading a cheap answer (its token logprobs) and giving it back as the client asked: the
//! JSON as it came (without the logprobs the gateway added), or replayed as Server-Sent Events
//! in OpenAI's chunk shapes when the client wanted a stream.

use crate::parse::Api;
use bytes::Bytes;
use kvgate_core::difficulty::TokenLogprob;
use serde_json::{json, Value};

/// The first choice's token logprobs, in either API's shape; empty when it has none.
pub(crate) fn token_logprobs(api: Api, answer: &Value) -> Vec<TokenLogprob> {
    let lp = &answer["choices"][0]["logprobs"];
    match api {
        Api::Chat => lp["content"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| {
                Some(TokenLogprob {
                    logprob: t["logprob"].as_f64()?,
                    top: t["top_logprobs"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|a| a["logprob"].as_f64())
                        .collect(),
                })
            })
            .collect(),
        Api::Completions => {
            let tops = lp["top_logprobs"].as_array();
            lp["token_logprobs"]
                .as_array()
                .into_iter()
                .flatten()
                .enumerate()
                .filter_map(|(i, l)| {
                    let top = tops
                        .and_then(|t| t[i].as_object())
                        .map(|m| m.values().filter_map(Value::as_f64).collect())
                        .unwrap_or_default();
                    Some(TokenLogprob {
                        logprob: l.as_f64()?,
                        top,
                    })
                })
                .collect()
        }
    }
}

/// Removes the logprobs the gateway asked for and the client did not.
pub(crate) fn strip_logprobs(answer: &mut Value) {
    if let Some(choices) = answer["choices"].as_array_mut() {
        for c in choices {
            c["logprobs"] = Value::Null;
        }
    }
}

/// A whole answer as the SSE stream the model would have sent: for chat the role, the
/// content (and tool calls), the finish reason, the usage when `include_usage`, `[DONE]`.
pub(crate) fn replay(api: Api, answer: &Value, include_usage: bool) -> Bytes {
    let mut out = String::new();
    let head = |object: &str| {
        json!({
            "id": answer["id"],
            "object": object,
            "created": answer["created"],
            "model": answer["model"],
        })
    };
    let mut emit = |mut chunk: Value, choices: Value| {
        chunk["choices"] = choices;
        out.push_str("data: ");
        out.push_str(&chunk.to_string());
        out.push_str("\n\n");
    };
    let empty = Vec::new();
    let choices = answer["choices"].as_array().unwrap_or(&empty);
    match api {
        Api::Chat => {
            for c in choices {
                let i = &c["index"];
                let m = &c["message"];
                let role = json!({"role": "assistant", "content": ""});
                emit(
                    head("chat.completion.chunk"),
                    json!([{"index": i, "delta": role, "logprobs": null, "finish_reason": null}]),
                );
                let mut delta = json!({"content": m["content"]});
                if let Some(calls) = m["tool_calls"].as_array().filter(|c| !c.is_empty()) {
                    let indexed: Vec<Value> = calls
                        .iter()
                        .enumerate()
                        .map(|(n, call)| {
                            let mut call = call.clone();
                            call["index"] = json!(n);
                            call
                        })
                        .collect();
                    delta["tool_calls"] = Value::Array(indexed);
                }
                emit(
                    head("chat.completion.chunk"),
                    json!([{"index": i, "delta": delta, "logprobs": null, "finish_reason": null}]),
                );
                emit(
                    head("chat.completion.chunk"),
                    json!([{"index": i, "delta": {}, "logprobs": null, "finish_reason": c["finish_reason"]}]),
                );
            }
            if include_usage {
                let mut chunk = head("chat.completion.chunk");
                chunk["usage"] = answer["usage"].clone();
                emit(chunk, json!([]));
            }
        }
        Api::Completions => {
            for c in choices {
                let i = &c["index"];
                emit(
                    head("text_completion"),
                    json!([{"index": i, "text": c["text"], "logprobs": null, "finish_reason": null}]),
                );
                emit(
                    head("text_completion"),
                    json!([{"index": i, "text": "", "logprobs": null, "finish_reason": c["finish_reason"]}]),
                );
            }
            if include_usage {
                let mut chunk = head("text_completion");
                chunk["usage"] = answer["usage"].clone();
                emit(chunk, json!([]));
            }
        }
    }
    out.push_str("data: [DONE]\n\n");
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(bytes: &[u8]) -> Vec<String> {
        std::str::from_utf8(bytes)
            .unwrap()
            .split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| e.strip_prefix("data: ").unwrap().to_owned())
            .collect()
    }

    #[test]
    fn a_chat_answer_replays_as_chunks_that_add_up_to_it() {
        let answer = json!({"id": "c1", "created": 5, "model": "small", "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi there"}, "finish_reason": "stop",
                "logprobs": {"content": [{"token": "hi", "logprob": -0.1, "top_logprobs": [{"token": "hi", "logprob": -0.1}, {"token": "yo", "logprob": -2.5}]}]}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}});
        let lp = token_logprobs(Api::Chat, &answer);
        assert_eq!(
            lp,
            vec![TokenLogprob {
                logprob: -0.1,
                top: vec![-0.1, -2.5]
            }]
        );
        let ev = events(&replay(Api::Chat, &answer, true));
        assert_eq!(ev.last().unwrap(), "[DONE]");
        let chunks: Vec<Value> = ev[..ev.len() - 1]
            .iter()
            .map(|e| serde_json::from_str(e).unwrap())
            .collect();
        let text: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, "hi there");
        assert_eq!(chunks[2]["choices"][0]["finish_reason"], "stop");
        assert_eq!(chunks[3]["usage"]["total_tokens"], 5);
        assert!(chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk" && c["id"] == "c1"));
    }

    #[test]
    fn completions_logprobs_and_replay() {
        let mut answer = json!({"id": "x", "choices": [{"index": 0, "text": "ab", "finish_reason": "length",
            "logprobs": {"tokens": ["a", "b"], "token_logprobs": [-0.2, -1.0], "top_logprobs": [{"a": -0.2, "c": -3.0}, {"b": -1.0}]}}]});
        let lp = token_logprobs(Api::Completions, &answer);
        assert_eq!(lp.len(), 2);
        assert_eq!(lp[0].top.len(), 2);
        strip_logprobs(&mut answer);
        assert!(answer["choices"][0]["logprobs"].is_null());
        let ev = events(&replay(Api::Completions, &answer, false));
        assert_eq!(ev.len(), 3);
        assert!(token_logprobs(Api::Chat, &json!({})).is_empty());
    }
}
