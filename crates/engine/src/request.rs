//! Parsing and validating OpenAI-style request bodies.
//!
//! Bodies are lenient like vLLM's: unknown fields (tools, response_format, logit_bias,
//! presence_penalty, ...) are accepted and have no effect on the emulation; fields that are
//! present are type-checked and range-checked with vLLM's messages and a 400.

use crate::error::ApiError;
use crate::tokenizer;
use kvgate_tokenize::ChatTokenizer;
use serde::Deserialize;
use serde_json::Value;

/// Which endpoint a request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Endpoint {
    /// `/v1/chat/completions`
    Chat,
    /// `/v1/completions`
    Completions,
}

#[derive(Debug, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

/// Fields both endpoints share.
#[derive(Debug, Deserialize)]
struct Common {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    max_tokens: Option<i64>,
    #[serde(default)]
    max_completion_tokens: Option<i64>,
    #[serde(default)]
    min_tokens: Option<i64>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    n: Option<i64>,
    #[serde(default)]
    temperature: Option<f64>,
    #[serde(default)]
    top_p: Option<f64>,
    #[serde(default)]
    ignore_eos: Option<bool>,
    #[serde(default)]
    echo: Option<bool>,
    #[serde(default)]
    messages: Option<Vec<Value>>,
    #[serde(default)]
    add_generation_prompt: Option<bool>,
    #[serde(default)]
    continue_final_message: Option<bool>,
    #[serde(default)]
    prompt: Option<Value>,
    /// Chat: `true` asks for logprobs; completions: how many alternatives.
    #[serde(default)]
    logprobs: Option<Value>,
    #[serde(default)]
    top_logprobs: Option<i64>,
}

/// A validated request, ready to run.
#[derive(Debug, Clone)]
pub(crate) struct Parsed {
    pub(crate) model: Option<String>,
    pub(crate) prompt: Vec<u32>,
    /// The requested output cap, if any.
    pub(crate) max_tokens: Option<u32>,
    pub(crate) min_tokens: u32,
    pub(crate) ignore_eos: bool,
    pub(crate) stream: bool,
    pub(crate) include_usage: bool,
    /// Token logprobs asked for, with this many alternatives each.
    pub(crate) logprobs: Option<u32>,
}

/// Parses and validates a body for `endpoint`.
///
/// With the model's `tokenizer` the prompt is rendered and tokenized as vLLM would; without one,
/// with the stand-in of [`tokenizer`].
pub(crate) fn parse(
    endpoint: Endpoint,
    body: &[u8],
    tokenizer: Option<&ChatTokenizer>,
) -> Result<Parsed, ApiError> {
    let common: Common = serde_json::from_slice(body).map_err(|e| ApiError {
        kind: Some("Bad Request"),
        ..ApiError::bad_request(format!("JSON decode error: {e}"))
    })?;
    let prompt = match (endpoint, tokenizer) {
        (Endpoint::Chat, None) => chat_prompt(common.messages.as_deref(), chat_end(&common)?)?,
        (Endpoint::Completions, None) => completion_prompt(common.prompt.as_ref())?,
        (_, Some(tokenizer)) => model_prompt(endpoint, body, tokenizer)?,
    };
    unsupported(&common)?;
    if let Some(t) = common.temperature {
        if !(t >= 0.0 && t.is_finite()) {
            return Err(ApiError::bad_param(
                "temperature",
                format!("temperature must be non-negative, got {t:?}. (parameter=temperature, value={t:?})"),
            ));
        }
    }
    if let Some(p) = common.top_p {
        if !(p > 0.0 && p <= 1.0) {
            return Err(ApiError::bad_param(
                "top_p",
                format!("top_p must be in (0, 1], got {p:?}. (parameter=top_p, value={p:?})"),
            ));
        }
    }
    let max_tokens = match common.max_completion_tokens.or(common.max_tokens) {
        None => None,
        Some(m) if m >= 1 && m <= i64::from(u32::MAX) => Some(m as u32),
        Some(m) => {
            return Err(ApiError::bad_param(
                "max_tokens",
                format!("max_tokens must be at least 1, got {m}."),
            ))
        }
    };
    let min_tokens = match common.min_tokens {
        None => 0,
        Some(m) if m >= 0 && max_tokens.is_none_or(|mx| m <= i64::from(mx)) => m as u32,
        Some(m) => {
            return Err(ApiError::bad_param(
                "min_tokens",
                format!("min_tokens must be in [0, max_tokens], got {m}."),
            ))
        }
    };
    let stream = common.stream.unwrap_or(false);
    let include_usage = common
        .stream_options
        .as_ref()
        .and_then(|o| o.include_usage)
        .unwrap_or(false);
    if common.stream_options.is_some() && !stream {
        return Err(ApiError::bad_param(
            "stream_options",
            "Stream options can only be defined when `stream=True`.",
        ));
    }
    Ok(Parsed {
        logprobs: logprobs(endpoint, &common)?,
        model: common.model,
        prompt,
        max_tokens,
        min_tokens,
        ignore_eos: common.ignore_eos.unwrap_or(false),
        stream,
        include_usage,
    })
}

/// Refuses what the emulated engine does not do: several choices, echoing the prompt.
fn unsupported(common: &Common) -> Result<(), ApiError> {
    if let Some(n) = common.n {
        if n != 1 {
            return Err(ApiError::bad_param(
                "n",
                "n must be 1: the emulated engine returns one choice",
            ));
        }
    }
    if common.echo == Some(true) {
        return Err(ApiError::bad_param(
            "echo",
            "echo is not supported by the emulated engine",
        ));
    }
    Ok(())
}

/// The alternatives asked for per token, when logprobs are: chat says `logprobs: true` and
/// `top_logprobs: N`, completions `logprobs: N` (OpenAI's two shapes).
fn logprobs(endpoint: Endpoint, common: &Common) -> Result<Option<u32>, ApiError> {
    let max = crate::logprobs::MAX_TOP_LOGPROBS;
    let count = |param: &'static str, n: Option<i64>| match n {
        Some(n) if (0..=i64::from(max)).contains(&n) => Ok(n as u32),
        _ => Err(ApiError::bad_param(
            param,
            format!("{param} must be an integer in [0, {max}]"),
        )),
    };
    let wanted = match (endpoint, &common.logprobs) {
        (_, None | Some(Value::Null)) | (Endpoint::Chat, Some(Value::Bool(false))) => None,
        (Endpoint::Chat, Some(Value::Bool(true))) => {
            Some(count("top_logprobs", common.top_logprobs.or(Some(0)))?)
        }
        (Endpoint::Completions, Some(n)) => Some(count("logprobs", n.as_i64())?),
        (Endpoint::Chat, Some(_)) => {
            return Err(ApiError::bad_param(
                "logprobs",
                "logprobs must be a boolean",
            ))
        }
    };
    if wanted.is_none() && common.top_logprobs.is_some_and(|n| n > 0) {
        return Err(ApiError::bad_param(
            "top_logprobs",
            "top_logprobs needs logprobs set to true",
        ));
    }
    Ok(wanted)
}

/// The text of a message's `content`: a string, an array of `{"type": "text", "text"}` parts,
/// or null (an assistant message carrying only tool calls).
fn content_text(content: Option<&Value>) -> Result<String, ApiError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for part in parts {
                match part.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        text.push_str(part.get("text").and_then(Value::as_str).unwrap_or(""))
                    }
                    Some(other) => {
                        return Err(ApiError::bad_param(
                            "messages",
                            format!(
                            "content part type `{other}` is not supported by the emulated engine"
                        ),
                        ))
                    }
                    None => {
                        return Err(ApiError::bad_param(
                            "messages",
                            "content part without a type",
                        ))
                    }
                }
            }
            Ok(text)
        }
        Some(_) => Err(ApiError::bad_param(
            "messages",
            "message content must be a string or an array of parts",
        )),
    }
}

/// vLLM's chat flags: `add_generation_prompt` (default true) and `continue_final_message`
/// (default false) cannot both be true.
fn chat_end(common: &Common) -> Result<tokenizer::ChatEnd, ApiError> {
    let generation = common.add_generation_prompt.unwrap_or(true);
    match (common.continue_final_message.unwrap_or(false), generation) {
        (true, true) => Err(ApiError::bad_request(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
        )),
        (true, false) => Ok(tokenizer::ChatEnd::ContinueFinal),
        (false, true) => Ok(tokenizer::ChatEnd::GenerationPrompt),
        (false, false) => Ok(tokenizer::ChatEnd::Closed),
    }
}

fn chat_prompt(messages: Option<&[Value]>, end: tokenizer::ChatEnd) -> Result<Vec<u32>, ApiError> {
    let messages =
        messages.ok_or_else(|| ApiError::bad_param("messages", "Field required: messages"))?;
    if messages.is_empty() {
        return Err(ApiError::bad_param(
            "messages",
            "messages must not be empty",
        ));
    }
    let mut rendered: Vec<(String, String)> = Vec::with_capacity(messages.len());
    for message in messages {
        let role = message.get("role").and_then(Value::as_str).ok_or_else(|| {
            ApiError::bad_param("messages", "every message needs a string `role`")
        })?;
        let mut text = content_text(message.get("content"))?;
        // Tool calls and results take part in the prompt as their JSON text.
        if let Some(calls) = message.get("tool_calls").filter(|v| !v.is_null()) {
            text.push_str(&calls.to_string());
        }
        rendered.push((role.to_owned(), text));
    }
    Ok(tokenizer::tokenize_chat(
        rendered.iter().map(|(r, c)| (r.as_str(), c.as_str())),
        end,
    ))
}

/// The prompt's ids from the model's own tokenizer and chat template.
fn model_prompt(
    endpoint: Endpoint,
    body: &[u8],
    tokenizer: &ChatTokenizer,
) -> Result<Vec<u32>, ApiError> {
    let fields: serde_json::Map<String, Value> = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("JSON decode error: {e}")))?;
    let (param, tokens) = match endpoint {
        Endpoint::Chat => ("messages", tokenizer.chat_prompt(&fields)),
        Endpoint::Completions => ("prompt", tokenizer.completion_prompt(&fields)),
    };
    let tokens = tokens.map_err(|e| ApiError::bad_param(param, e.to_string()))?;
    if tokens.is_empty() {
        return Err(ApiError::bad_param(param, "Prompt cannot be empty"));
    }
    Ok(tokens)
}

fn completion_prompt(prompt: Option<&Value>) -> Result<Vec<u32>, ApiError> {
    let bad = || {
        ApiError::bad_param(
            "prompt",
            "prompt must be a string, a list of one string, or a list of token ids",
        )
    };
    let tokens =
        match prompt.ok_or_else(|| ApiError::bad_param("prompt", "Field required: prompt"))? {
            Value::String(s) => tokenizer::tokenize(s),
            Value::Array(items) if items.len() == 1 && items[0].is_string() => {
                tokenizer::tokenize(items[0].as_str().unwrap_or_default())
            }
            Value::Array(items) if items.iter().all(Value::is_u64) => items
                .iter()
                .map(|v| {
                    v.as_u64()
                        .and_then(|t| u32::try_from(t).ok())
                        .ok_or_else(bad)
                })
                .collect::<Result<_, _>>()?,
            Value::Array(items) if items.len() > 1 => {
                return Err(ApiError::bad_param(
                    "prompt",
                    "batched prompts are not supported: send one prompt per request",
                ))
            }
            _ => return Err(bad()),
        };
    if tokens.is_empty() {
        return Err(ApiError::bad_param("prompt", "Prompt cannot be empty"));
    }
    Ok(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typical_sdk_chat_body_parses() {
        let body = br#"{"model":"m","messages":[{"role":"system","content":"be brief"},
            {"role":"user","content":[{"type":"text","text":"hi"}]}],"max_completion_tokens":5,
            "temperature":0.7,"top_p":0.9,"n":1,"stop":["\n"],"user":"u1","stream":true,
            "stream_options":{"include_usage":true},"tools":[{"type":"function","function":{"name":"f"}}],
            "tool_choice":"auto","seed":3}"#;
        let parsed = parse(Endpoint::Chat, body, None).unwrap();
        assert_eq!(parsed.max_tokens, Some(5));
        assert!(parsed.stream && parsed.include_usage);
        assert!(!parsed.prompt.is_empty());
    }

    #[test]
    fn logprobs_in_both_shapes() {
        let chat = |extra: &str| {
            let body = format!(r#"{{"messages":[{{"role":"user","content":"x"}}]{extra}}}"#);
            parse(Endpoint::Chat, body.as_bytes(), None)
                .unwrap()
                .logprobs
        };
        assert_eq!(chat(""), None);
        assert_eq!(chat(r#","logprobs":false"#), None);
        assert_eq!(chat(r#","logprobs":true"#), Some(0));
        assert_eq!(chat(r#","logprobs":true,"top_logprobs":5"#), Some(5));
        let text = parse(
            Endpoint::Completions,
            br#"{"prompt":"x","logprobs":2}"#,
            None,
        )
        .unwrap();
        assert_eq!(text.logprobs, Some(2));
    }

    #[test]
    fn completion_prompts_in_every_accepted_shape() {
        assert_eq!(
            parse(Endpoint::Completions, br#"{"prompt":[5,6,7]}"#, None)
                .unwrap()
                .prompt,
            vec![5, 6, 7]
        );
        let a = parse(Endpoint::Completions, br#"{"prompt":"hello there"}"#, None)
            .unwrap()
            .prompt;
        let b = parse(
            Endpoint::Completions,
            br#"{"prompt":["hello there"]}"#,
            None,
        )
        .unwrap()
        .prompt;
        assert_eq!(a, b);
    }

    #[test]
    fn bad_bodies_get_400_with_the_param() {
        for (endpoint, body, param) in [
            (Endpoint::Chat, &br#"{"messages":[]}"#[..], Some("messages")),
            (Endpoint::Chat, br#"{"messages":[{"role":"user","content":"x"}],"n":2}"#, Some("n")),
            (Endpoint::Chat, br#"{"messages":[{"role":"user","content":"x"}],"temperature":-1}"#, Some("temperature")),
            (Endpoint::Chat, br#"{"messages":[{"role":"user","content":"x"}],"max_tokens":0}"#, Some("max_tokens")),
            (Endpoint::Chat, br#"{"messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true}}"#, Some("stream_options")),
            (Endpoint::Completions, br#"{"prompt":""}"#, Some("prompt")),
            (Endpoint::Completions, br#"{"prompt":["a","b"]}"#, Some("prompt")),
            (Endpoint::Completions, br#"{"max_tokens":3}"#, Some("prompt")),
            (Endpoint::Chat, b"{not json", None),
            (Endpoint::Chat, br#"{"messages":[{"role":"user","content":"x"}],"top_p":0}"#, Some("top_p")),
            (Endpoint::Chat, br#"{"messages":"hi"}"#, None),
            (Endpoint::Chat, br#"{"messages":[{"role":"user","content":"x"}],"continue_final_message":true}"#, None),
            (Endpoint::Chat, br#"{"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21}"#, Some("top_logprobs")),
            (Endpoint::Chat, br#"{"messages":[{"role":"user","content":"x"}],"top_logprobs":2}"#, Some("top_logprobs")),
            (Endpoint::Chat, br#"{"messages":[{"role":"user","content":"x"}],"logprobs":3}"#, Some("logprobs")),
            (Endpoint::Completions, br#"{"prompt":"x","logprobs":true}"#, Some("logprobs")),
        ] {
            let err = parse(endpoint, body, None).unwrap_err();
            assert_eq!(err.status, axum::http::StatusCode::BAD_REQUEST);
            assert_eq!(err.param, param, "{}", String::from_utf8_lossy(body));
        }
    }
}
