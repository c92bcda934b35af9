//! What a routed request is scored on, and the scorers built from the configuration.

use super::classifier::{Classifier, Failed};
use super::config::ScorerConfig;
use crate::error::ConfigError;
use crate::semcache::StaticModel;
use crate::upstream::HttpClient;
use kvgate_core::difficulty::{HashedTfIdf, KnnScorer, RuleInput, RuleWeights, Score};
use serde::Deserialize;
use serde_json::Value;
use std::path::Path;

/// One labelled example.
#[derive(Clone, Debug, PartialEq)]
pub struct Example {
    /// The prompt.
    pub prompt: String,
    /// P(strong needed).
    pub label: f64,
}

#[derive(Deserialize)]
struct Line {
    prompt: String,
    label: Option<f64>,
    weak: Option<bool>,
    strong: Option<bool>,
}

/// Reads labelled examples, one JSON object a line: `{"prompt", "label"}` or `{"prompt",
/// "weak", "strong"}` (correctness of each model; the label is 1 where only the strong one was
/// right, RouteLLM's "strong wins").
pub fn load_examples(path: &Path) -> Result<Vec<Example>, ConfigError> {
    let err = |why: String| ConfigError::invalid(format!("examples file {}", path.display()), why);
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    parse_examples(&text).map_err(err)
}

/// [`load_examples`] on text.
pub fn parse_examples(text: &str) -> Result<Vec<Example>, String> {
    let mut out = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let at = |why: String| format!("line {}: {why}", i + 1);
        let l: Line = serde_json::from_str(line).map_err(|e| at(e.to_string()))?;
        let label = match (l.label, l.weak, l.strong) {
            (Some(p), None, None) if (0.0..=1.0).contains(&p) => p,
            (None, Some(weak), Some(strong)) => f64::from(u8::from(strong && !weak)),
            _ => return Err(at("needs a label in 0..=1, or weak and strong".into())),
        };
        out.push(Example {
            prompt: l.prompt,
            label,
        });
    }
    if out.is_empty() {
        return Err("holds no examples".into());
    }
    Ok(out)
}

/// A built scorer.
#[derive(Debug)]
pub(crate) enum Scorer {
    Rules(RuleWeights),
    Knn { vectors: Vectors, knn: KnnScorer },
    Classifier(Box<Classifier>),
}

/// How a kNN scorer turns text into a vector.
#[derive(Debug)]
pub(crate) enum Vectors {
    Lexical(HashedTfIdf),
    Embedded(Box<StaticModel>),
}

impl Vectors {
    fn of(&self, text: &str) -> Vec<f32> {
        match self {
            Vectors::Lexical(v) => v.vector(text),
            Vectors::Embedded(model) => crate::semcache::normalised(model.embed(text)),
        }
    }
}

impl Scorer {
    pub(crate) fn build(
        config: &ScorerConfig,
        field: &str,
        client: &HttpClient,
    ) -> Result<Scorer, ConfigError> {
        Ok(match config {
            ScorerConfig::Classifier {
                url,
                model,
                strong_class,
                deadline_ms,
                api_key_env,
            } => Scorer::Classifier(Box::new(Classifier {
                client: client.clone(),
                url: url.clone(),
                model: model.clone(),
                strong_class: *strong_class,
                deadline: std::time::Duration::from_millis(*deadline_ms),
                key: api_key_env.as_ref().and_then(|v| std::env::var(v).ok()),
            })),
            ScorerConfig::Rules { weights } => Scorer::Rules(weights.clone()),
            ScorerConfig::Knn {
                examples,
                k,
                dims,
                embedder_dir,
            } => {
                let examples = load_examples(examples)?;
                let bad = |e: kvgate_core::difficulty::DifficultyError| {
                    ConfigError::invalid(field, e.to_string())
                };
                let vectors = match embedder_dir {
                    Some(dir) => Vectors::Embedded(Box::new(
                        StaticModel::load(dir)
                            .map_err(|e| ConfigError::invalid(field, e.to_string()))?,
                    )),
                    None => Vectors::Lexical(
                        HashedTfIdf::fit(*dims, examples.iter().map(|e| e.prompt.as_str()))
                            .map_err(bad)?,
                    ),
                };
                // An example without a word has no direction; it cannot be a neighbour.
                let labelled = examples.iter().filter_map(|e| {
                    let v = vectors.of(&e.prompt);
                    v.iter().any(|x| *x != 0.0).then_some((v, e.label))
                });
                let knn = KnnScorer::new(*k, labelled.collect::<Vec<_>>()).map_err(bad)?;
                Scorer::Knn { vectors, knn }
            }
        })
    }

    /// Scores a request; kNN falls back to the default rules for a prompt without a word, a
    /// classifier for one it did not score in time (returned with the failure).
    pub(crate) async fn score(&self, input: RuleInput<'_>) -> (Score, Option<Failed>) {
        match self {
            Scorer::Rules(w) => (w.score(input), None),
            Scorer::Knn { vectors, knn } => (
                knn.score(&vectors.of(input.text))
                    .unwrap_or_else(|_| RuleWeights::default().score(input)),
                None,
            ),
            Scorer::Classifier(c) => match c.score(input.text).await {
                Ok(score) => (score, None),
                Err(failed) => (RuleWeights::default().score(input), Some(failed)),
            },
        }
    }
}

/// The text a request is judged on: the last user message of a chat (RouteLLM scores only
/// it), the prompt of a completion; and whether tools are offered.
pub(crate) fn judged(body: &Value) -> (String, bool) {
    let tools = body["tools"].as_array().is_some_and(|t| !t.is_empty());
    if let Some(messages) = body["messages"].as_array() {
        let last = messages.iter().rev().find(|m| m["role"] == "user");
        return (
            last.map(|m| content_text(&m["content"]))
                .unwrap_or_default(),
            tools,
        );
    }
    let prompt = match &body["prompt"] {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    };
    (prompt, tools)
}

fn content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_last_user_message_is_judged() {
        let body = json!({"messages": [
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "reply"},
            {"role": "user", "content": [{"type": "text", "text": "second"}]},
        ], "tools": [{"type": "function"}]});
        assert_eq!(judged(&body), ("second".into(), true));
        assert_eq!(judged(&json!({"prompt": "p"})), ("p".into(), false));
    }

    #[test]
    fn examples_in_both_shapes_and_errors_by_line() {
        let ex = parse_examples(
            "{\"prompt\":\"a\",\"label\":0.5}\n\n{\"prompt\":\"b\",\"weak\":false,\"strong\":true}\n{\"prompt\":\"c\",\"weak\":true,\"strong\":true}",
        )
        .unwrap();
        assert_eq!(
            ex.iter().map(|e| e.label).collect::<Vec<_>>(),
            [0.5, 1.0, 0.0]
        );
        let err = parse_examples("{\"prompt\":\"a\",\"label\":2}").unwrap_err();
        assert!(err.starts_with("line 1"), "{err}");
        assert!(parse_examples("").is_err());
        assert!(parse_examples("{\"prompt\":\"a\",\"label\":1,\"weak\":true}").is_err());
    }

    #[tokio::test]
    async fn knn_over_a_static_models_embeddings() {
        let model = crate::semcache::static_model::tests::tiny_model("knn", false);
        let examples = model.join("examples.jsonl");
        std::fs::write(
            &examples,
            "{\"prompt\":\"hello hello\",\"label\":1}\n{\"prompt\":\"world\",\"label\":0}\n",
        )
        .unwrap();
        let config = ScorerConfig::Knn {
            examples,
            k: 1,
            dims: 64,
            embedder_dir: Some(model.clone()),
        };
        let client = crate::upstream::client(&[]).unwrap();
        let scorer = Scorer::build(&config, "scorer", &client).unwrap();
        let score = |text| RuleInput { text, tools: false };
        // "hello" embeds as [1, 0]: its one neighbour is "hello hello" (label 1).
        assert_eq!(scorer.score(score("hello")).await.0.p, 1.0);
        assert_eq!(scorer.score(score("world world")).await.0.p, 0.0);
        let missing = ScorerConfig::Knn {
            examples: model.join("examples.jsonl"),
            k: 1,
            dims: 64,
            embedder_dir: Some(model.join("nowhere")),
        };
        let err = Scorer::build(&missing, "scorer", &client)
            .unwrap_err()
            .to_string();
        assert!(err.contains("nowhere"), "{err}");
    }
}
