//! Embedding a last user message: over HTTP from an OpenAI-compatible `/v1/embeddings`
//! (vLLM's pooling runner, the emulated engine), within a deadline. A failure or a stall is a
//! miss, never an error for the client: the request goes upstream as if there were no cache,
//! and the failure is counted.

use super::config::EmbedderConfig;
use crate::upstream::{self, HttpClient};
use axum::http::{header, Method, Request};
use bytes::Bytes;
use http_body_util::Full;
use serde_json::Value;
use std::time::Duration;

/// Why no embedding came back.
#[derive(Debug, thiserror::Error)]
pub(crate) enum EmbedError {
    /// Past the deadline.
    #[error("the embedder took longer than {0:?}")]
    Timeout(Duration),
    /// The exchange failed or its answer was not an embedding.
    #[error("embedder: {0}")]
    Failed(String),
}

impl EmbedError {
    pub(crate) fn label(&self) -> &'static str {
        match self {
            EmbedError::Timeout(_) => "timeout",
            EmbedError::Failed(_) => "error",
        }
    }
}

/// Where embeddings come from.
#[derive(Debug)]
pub(crate) enum Embedder {
    /// `POST {url}/v1/embeddings`.
    Http(Box<Remote>),
    /// A static model in process.
    Static(Box<super::static_model::StaticModel>),
}

/// An OpenAI-compatible embeddings server.
#[derive(Debug)]
pub(crate) struct Remote {
    client: HttpClient,
    url: String,
    model: String,
    key: Option<String>,
}

/// The most bytes of an embeddings answer read (a 4,096-dimension vector in JSON is about
/// 90 KB).
const MAX_ANSWER_BYTES: usize = 4 << 20;

impl Embedder {
    /// The embedder `config` names; a static model is loaded now.
    pub(crate) fn new(
        config: &EmbedderConfig,
        client: HttpClient,
    ) -> Result<Self, crate::error::ConfigError> {
        Ok(match config {
            EmbedderConfig::Openai {
                url,
                model,
                api_key_env,
            } => Embedder::Http(Box::new(Remote {
                client,
                url: format!("{}/v1/embeddings", url.trim_end_matches('/')),
                model: model.clone(),
                key: api_key_env.as_ref().and_then(|v| std::env::var(v).ok()),
            })),
            EmbedderConfig::Static { dir } => {
                let model = super::static_model::StaticModel::load(dir).map_err(|e| {
                    crate::error::ConfigError::invalid("semantic_cache.embedder.dir", e.to_string())
                })?;
                Embedder::Static(Box::new(model))
            }
        })
    }

    /// `text`'s embedding, normalised to unit length, within `deadline`.
    pub(crate) async fn embed(
        &self,
        text: &str,
        deadline: Duration,
    ) -> Result<Vec<f32>, EmbedError> {
        match self {
            Embedder::Http(remote) => {
                let Remote {
                    client,
                    url,
                    model,
                    key,
                } = &**remote;
                let body = serde_json::json!({"model": model, "input": text}).to_string();
                let mut request = Request::builder()
                    .method(Method::POST)
                    .uri(url)
                    .header(header::CONTENT_TYPE, "application/json");
                if let Some(k) = key {
                    request = request.header(header::AUTHORIZATION, format!("Bearer {k}"));
                }
                let request = request
                    .body(Full::new(Bytes::from(body)))
                    .map_err(|e| EmbedError::Failed(e.to_string()))?;
                let (status, answer) = upstream::fetch(client, request, MAX_ANSWER_BYTES, deadline)
                    .await
                    .map_err(|t| match t {
                        upstream::Trouble::Timeout { .. } => EmbedError::Timeout(deadline),
                        other => EmbedError::Failed(other.to_string()),
                    })?;
                if !status.is_success() {
                    return Err(EmbedError::Failed(format!("answered {status}")));
                }
                parse_answer(&answer).map(normalised)
            }
            Embedder::Static(model) => Ok(normalised(model.embed(text))),
        }
    }
}

/// `data[0].embedding` of an embeddings answer.
fn parse_answer(body: &[u8]) -> Result<Vec<f32>, EmbedError> {
    let bad = || EmbedError::Failed("the answer has no data[0].embedding of numbers".into());
    let value: Value = serde_json::from_slice(body).map_err(|_| bad())?;
    let vector = value
        .pointer("/data/0/embedding")
        .and_then(Value::as_array)
        .ok_or_else(bad)?;
    let vector: Option<Vec<f32>> = vector
        .iter()
        .map(|x| x.as_f64().map(|x| x as f32))
        .collect();
    vector.filter(|v| !v.is_empty()).ok_or_else(bad)
}

/// `v` scaled to unit length (a zero vector stays zero: it is similar to nothing).
pub(crate) fn normalised(mut v: Vec<f32>) -> Vec<f32> {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 && norm.is_finite() {
        v.iter_mut().for_each(|x| *x /= norm);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_first_embedding() {
        let v = parse_answer(br#"{"data":[{"embedding":[3.0,4.0],"index":0}]}"#).unwrap();
        assert_eq!(normalised(v), vec![0.6, 0.8]);
        assert!(parse_answer(br#"{"data":[]}"#).is_err());
        assert!(parse_answer(br#"{"data":[{"embedding":["x"]}]}"#).is_err());
    }
}
