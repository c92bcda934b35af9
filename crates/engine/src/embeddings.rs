//! `POST /v1/embeddings`: deterministic vectors for tests of embedding clients (the gateway's
//! semantic cache). A text's vector is a hashed bag of its lower-cased words (the hashing
//! trick: each word adds ±1 at a coordinate its hash picks), normalised, so texts sharing most
//! of their words are close, texts sharing none are near orthogonal, and every run gives the
//! same numbers. The `stall_embed` fault delays the answer.

use crate::error::ApiError;
use crate::state::Shared;
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::Value;
use std::sync::Arc;
use xxhash_rust::xxh3::xxh3_64;

/// The vectors' dimension.
pub(crate) const DIM: usize = 256;

/// Largest request body accepted.
const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

pub(crate) async fn embeddings(State(shared): State<Arc<Shared>>, body: Body) -> Response {
    let inputs = match read(body).await {
        Ok(inputs) => inputs,
        Err(e) => return e.into_response(),
    };
    match shared.faults.embed_stall() {
        Some(Some(stall)) => tokio::time::sleep(stall).await,
        Some(None) => std::future::pending::<()>().await,
        None => {}
    }
    let mut tokens = 0;
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(index, text)| {
            tokens += words(text).count();
            serde_json::json!({"object": "embedding", "index": index, "embedding": embed(text)})
        })
        .collect();
    Json(serde_json::json!({
        "object": "list",
        "data": data,
        "model": shared.config.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
    .into_response()
}

/// The texts of `input`: one string or an array of strings.
async fn read(body: Body) -> Result<Vec<String>, ApiError> {
    let bytes = axum::body::to_bytes(body, MAX_BODY_BYTES)
        .await
        .map_err(|_| ApiError::bad_request("Request body too large or unreadable."))?;
    let value: Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("The body is not valid JSON: {e}")))?;
    let bad = || ApiError::bad_param("input", "`input` must be a string or an array of strings");
    match value.get("input") {
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(items)) if !items.is_empty() => items
            .iter()
            .map(|i| i.as_str().map(str::to_owned).ok_or_else(bad))
            .collect(),
        _ => Err(bad()),
    }
}

fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
}

/// See the module documentation.
pub(crate) fn embed(text: &str) -> Vec<f32> {
    let mut v = vec![0.0f32; DIM];
    for word in words(text) {
        let h = xxh3_64(word.as_bytes());
        let sign = if h >> 63 == 1 { -1.0 } else { 1.0 };
        v[(h % DIM as u64) as usize] += sign;
    }
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cosine(a: &str, b: &str) -> f32 {
        embed(a).iter().zip(embed(b)).map(|(x, y)| x * y).sum()
    }

    #[test]
    fn shared_words_are_close_and_vectors_are_unit() {
        let n: f32 = embed("hello world").iter().map(|x| x * x).sum();
        assert!((n - 1.0).abs() < 1e-5);
        assert!(
            cosine(
                "What is the capital of France",
                "what is the capital of france?"
            ) > 0.999
        );
        assert!(
            cosine(
                "What is the capital of France",
                "Tell me the capital of France"
            ) > 0.6
        );
        assert!(cosine("What is the capital of France", "bake bread quickly") < 0.3);
        assert_eq!(embed(""), vec![0.0; DIM]);
    }
}
