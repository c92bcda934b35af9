//! A classifier endpoint as a difficulty scorer: vLLM's `/classify` (also SGLang's, in the same
//! shape): `POST {"model", "input"}` answered with `{"data": [{"probs": [...]}]}`, one
//! probability per class. The request waits at most the deadline for it; an outage falls back
//! to the default rules so routing never stops on it.

use crate::upstream::{self, HttpClient};
use axum::http::{header, Method, Request};
use bytes::Bytes;
use http_body_util::Full;
use kvgate_core::difficulty::Score;
use serde_json::Value;
use std::time::Duration;

/// The most bytes of a classification answer read.
const MAX_ANSWER_BYTES: usize = 1 << 20;

/// One configured classifier.
#[derive(Debug)]
pub(crate) struct Classifier {
    pub(crate) client: HttpClient,
    pub(crate) url: String,
    pub(crate) model: String,
    pub(crate) strong_class: usize,
    pub(crate) deadline: Duration,
    pub(crate) key: Option<String>,
}

/// Why a classifier gave no score: `timeout` or `error` (the metric's label), and the detail.
#[derive(Debug)]
pub(crate) struct Failed(pub(crate) &'static str, pub(crate) String);

impl Classifier {
    /// The classifier's P(strong needed) for `text`.
    pub(crate) async fn score(&self, text: &str) -> Result<Score, Failed> {
        let body = serde_json::json!({"model": self.model, "input": text}).to_string();
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(&self.url)
            .header(header::CONTENT_TYPE, "application/json");
        if let Some(k) = &self.key {
            request = request.header(header::AUTHORIZATION, format!("Bearer {k}"));
        }
        let request = request
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| Failed("error", e.to_string()))?;
        let (status, answer) =
            upstream::fetch(&self.client, request, MAX_ANSWER_BYTES, self.deadline)
                .await
                .map_err(|t| match t {
                    upstream::Trouble::Timeout { .. } => Failed("timeout", t.to_string()),
                    other => Failed("error", other.to_string()),
                })?;
        if !status.is_success() {
            return Err(Failed("error", format!("answered {status}")));
        }
        let p = strong_probability(&answer, self.strong_class)
            .ok_or_else(|| Failed("error", "no data[0].probs with the strong class".into()))?;
        Score::classifier(p).map_err(|e| Failed("error", e.to_string()))
    }
}

/// `data[0].probs[strong_class]` of a `/classify` answer.
fn strong_probability(body: &[u8], strong_class: usize) -> Option<f64> {
    let value: Value = serde_json::from_slice(body).ok()?;
    value.pointer("/data/0/probs")?.get(strong_class)?.as_f64()
}

#[cfg(test)]
mod tests {
    use super::strong_probability;

    #[test]
    fn reads_the_strong_class_of_a_classify_answer() {
        let answer = br#"{"id":"classify-1","object":"list","data":[{"index":0,"label":"Default","probs":[0.57,0.43],"num_classes":2}]}"#;
        assert_eq!(strong_probability(answer, 1), Some(0.43));
        assert_eq!(strong_probability(answer, 0), Some(0.57));
        assert_eq!(strong_probability(answer, 2), None);
        assert_eq!(strong_probability(b"{\"data\":[]}", 1), None);
        assert_eq!(strong_probability(b"not json", 1), None);
    }
}
