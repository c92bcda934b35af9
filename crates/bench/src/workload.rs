//! Workload generators: what each arrival sends.
//!
//! An arrival produces a *unit of work*: one request for `random`, `prefix-repetition` and
//! replayed files, and a whole session for `agentic`. Each request of a unit carries an offset from
//! the arrival, so the schedule stays open loop (nothing waits for a response).
//!
//! - `random`: prompts of random words, lengths uniform in `len * [1 - r, 1 + r]` (vLLM's
//!   `--random-range-ratio`). Random prompts defeat prefix caching by design.
//! - `prefix-repetition`: `num_prefixes` fixed prefixes; every request is one of them (uniform)
//!   followed by a fresh random suffix (vLLM's `prefix_repetition` dataset).
//! - `agentic` and `fanout` are closed-loop and come from the simulator's own models (see
//!   `crate::sessions`).
//! - a JSONL file: one request per line, `{"prompt": "..."}` or `{"messages": [...]}`, with an
//!   optional `max_tokens` (or `output_len`), `user` and `model` (which overrides the run's, so
//!   a file can mix LoRA adapters); lines are replayed in order and cycled.
//!
//! One "token" is one word from a small vocabulary of common short English words, each a single
//! token in common BPE vocabularies, so prompt lengths are close to the requested token counts.

use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Deserialize;

use crate::error::BenchError;

const VOCAB: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by",
    "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an",
    "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
    "been", "if", "more", "when", "will", "would", "who", "so", "no", "time", "out", "up", "into",
    "some", "than", "them", "two", "may", "then", "do", "first", "any", "my", "now", "such",
];

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
pub struct Message {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// Text content.
    pub content: String,
}

/// One request to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestSpec {
    /// The conversation (a completions request joins the contents with newlines).
    pub messages: Vec<Message>,
    /// `max_tokens` to send.
    pub max_tokens: u32,
    /// The conversation it belongs to, sent as OpenAI's `user` field (which kvgate and other
    /// gateways read as a session for affinity).
    pub user: Option<String>,
    /// The model to name instead of the run's (a replayed line's `model`: a LoRA adapter's name
    /// makes an adapter mix).
    pub model: Option<String>,
}

impl RequestSpec {
    /// The prompt as one string (for the completions API).
    pub fn prompt_text(&self) -> String {
        let mut s = String::new();
        for (i, m) in self.messages.iter().enumerate() {
            if i > 0 {
                s.push('\n');
            }
            s.push_str(&m.content);
        }
        s
    }
}

/// A request and its delay after the arrival that produced it, in seconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Timed {
    /// Seconds after the unit's arrival.
    pub offset_s: f64,
    /// The request.
    pub spec: RequestSpec,
}

/// Parameters of the `random` workload.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RandomConfig {
    /// Mean input length in tokens.
    pub input_len: u32,
    /// Mean output length in tokens.
    pub output_len: u32,
    /// Lengths are uniform in `len * [1 - r, 1 + r]`.
    pub range_ratio: f64,
}

/// Parameters of the `prefix-repetition` workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixConfig {
    /// Shared prefix length in tokens.
    pub prefix_len: u32,
    /// Unique suffix length in tokens.
    pub suffix_len: u32,
    /// Number of distinct prefixes.
    pub num_prefixes: u32,
    /// Output length in tokens.
    pub output_len: u32,
}

/// Which generator to use.
#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    /// Random prompts.
    Random(RandomConfig),
    /// Shared prefixes plus random suffixes.
    PrefixRepetition(PrefixConfig),
    /// Replay of a JSONL file.
    Replay(Vec<RequestSpec>),
}

/// A seeded workload generator.
#[derive(Debug, Clone)]
pub struct Workload {
    kind: Kind,
    rng: ChaCha8Rng,
    prefixes: Vec<String>,
    next_line: usize,
    output_override: Option<u32>,
}

/// `n` random words joined by spaces.
fn words<R: Rng>(rng: &mut R, n: u32) -> String {
    let mut s = String::with_capacity(n as usize * 5);
    for i in 0..n {
        if i > 0 {
            s.push(' ');
        }
        s.push_str(VOCAB[rng.random_range(0..VOCAB.len())]);
    }
    s
}

fn spread<R: Rng>(rng: &mut R, len: u32, ratio: f64) -> u32 {
    if ratio <= 0.0 {
        return len;
    }
    let lo = (f64::from(len) * (1.0 - ratio)).round().max(1.0) as u32;
    let hi = (f64::from(len) * (1.0 + ratio)).round().max(f64::from(lo)) as u32;
    rng.random_range(lo..=hi)
}

fn user(content: String) -> Message {
    Message {
        role: "user".into(),
        content,
    }
}

impl Workload {
    /// Creates a generator. `output_override` replaces every output length when set.
    pub fn new(kind: Kind, seed: u64, output_override: Option<u32>) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15);
        let prefixes = match &kind {
            Kind::PrefixRepetition(c) => (0..c.num_prefixes.max(1))
                .map(|i| format!("prefix {i}: {}", words(&mut rng, c.prefix_len)))
                .collect(),
            _ => Vec::new(),
        };
        Self {
            kind,
            rng,
            prefixes,
            next_line: 0,
            output_override,
        }
    }

    /// Loads a JSONL replay file.
    pub fn load_jsonl(path: &Path) -> Result<Vec<RequestSpec>, BenchError> {
        #[derive(Deserialize)]
        struct Line {
            prompt: Option<String>,
            messages: Option<Vec<Message>>,
            max_tokens: Option<u32>,
            output_len: Option<u32>,
            user: Option<String>,
            model: Option<String>,
        }
        let text = std::fs::read_to_string(path).map_err(|source| BenchError::Io {
            path: path.to_owned(),
            source,
        })?;
        let mut out = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            if raw.trim().is_empty() {
                continue;
            }
            let line: Line = serde_json::from_str(raw).map_err(|source| BenchError::Replay {
                path: path.to_owned(),
                line: i + 1,
                source,
            })?;
            let messages = match (line.messages, line.prompt) {
                (Some(m), _) => m,
                (None, Some(p)) => vec![user(p)],
                (None, None) => {
                    return Err(BenchError::Config(format!(
                        "{}:{}: a line needs `prompt` or `messages`",
                        path.display(),
                        i + 1
                    )))
                }
            };
            let max_tokens = line.max_tokens.or(line.output_len).unwrap_or(128);
            out.push(RequestSpec {
                messages,
                max_tokens,
                user: line.user,
                model: line.model,
            });
        }
        if out.is_empty() {
            return Err(BenchError::Config(format!(
                "{} holds no requests",
                path.display()
            )));
        }
        Ok(out)
    }

    /// Number of requests one arrival produces.
    pub fn requests_per_unit(&self) -> u64 {
        1
    }

    fn out_len(&self, len: u32) -> u32 {
        self.output_override.unwrap_or(len).max(1)
    }

    /// Discards the next `units` arrivals' requests (the ones a warm-up sent).
    pub fn skip_units(&mut self, units: u64) {
        for _ in 0..units {
            self.next_unit();
        }
    }

    /// The requests of the next arrival, in non-decreasing offset order.
    pub fn next_unit(&mut self) -> Vec<Timed> {
        match self.kind.clone() {
            Kind::Random(c) => {
                let input = spread(&mut self.rng, c.input_len, c.range_ratio);
                let output = spread(&mut self.rng, c.output_len, c.range_ratio);
                let spec = RequestSpec {
                    model: None,
                    messages: vec![user(words(&mut self.rng, input))],
                    max_tokens: self.out_len(output),
                    user: None,
                };
                vec![Timed {
                    offset_s: 0.0,
                    spec,
                }]
            }
            Kind::PrefixRepetition(c) => {
                let p = self.rng.random_range(0..self.prefixes.len());
                let mut content = self.prefixes[p].clone();
                content.push(' ');
                content.push_str(&words(&mut self.rng, c.suffix_len));
                let spec = RequestSpec {
                    model: None,
                    messages: vec![user(content)],
                    max_tokens: self.out_len(c.output_len),
                    user: None,
                };
                vec![Timed {
                    offset_s: 0.0,
                    spec,
                }]
            }
            Kind::Replay(lines) => {
                let mut spec = lines[self.next_line % lines.len()].clone();
                self.next_line += 1;
                spec.max_tokens = self.out_len(spec.max_tokens);
                vec![Timed {
                    offset_s: 0.0,
                    spec,
                }]
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefix_cfg() -> PrefixConfig {
        PrefixConfig {
            prefix_len: 50,
            suffix_len: 10,
            num_prefixes: 3,
            output_len: 16,
        }
    }

    #[test]
    fn random_lengths_stay_in_range() {
        let cfg = RandomConfig {
            input_len: 100,
            output_len: 20,
            range_ratio: 0.5,
        };
        let mut w = Workload::new(Kind::Random(cfg), 1, None);
        for _ in 0..200 {
            let u = w.next_unit();
            assert_eq!(u.len(), 1);
            let n = u[0].spec.messages[0].content.split(' ').count();
            assert!((50..=150).contains(&n), "{n}");
            assert!((10..=30).contains(&u[0].spec.max_tokens));
        }
    }

    #[test]
    fn prefix_repetition_repeats_exactly_num_prefixes() {
        let mut w = Workload::new(Kind::PrefixRepetition(prefix_cfg()), 3, None);
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..100 {
            let text = w.next_unit().remove(0).spec.messages.remove(0).content;
            let words: Vec<&str> = text.split(' ').collect();
            // "prefix", "i:", then 50 words, then the 10-word suffix.
            assert_eq!(words.len(), 2 + 50 + 10);
            seen.insert(words[..52].join(" "));
        }
        assert_eq!(seen.len(), 3, "every prefix is reused, no others appear");
    }

    #[test]
    fn same_seed_same_requests() {
        let mut a = Workload::new(Kind::PrefixRepetition(prefix_cfg()), 5, None);
        let mut b = Workload::new(Kind::PrefixRepetition(prefix_cfg()), 5, None);
        for _ in 0..20 {
            assert_eq!(a.next_unit(), b.next_unit());
        }
    }

    #[test]
    fn output_override_applies() {
        let cfg = RandomConfig {
            input_len: 5,
            output_len: 20,
            range_ratio: 0.0,
        };
        let mut w = Workload::new(Kind::Random(cfg), 1, Some(3));
        assert_eq!(w.next_unit()[0].spec.max_tokens, 3);
    }

    #[test]
    fn replay_reads_prompt_and_messages_lines() {
        let dir = std::env::temp_dir().join(format!("kvgate-bench-replay-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("w.jsonl");
        std::fs::write(
            &path,
            "{\"prompt\": \"hello\", \"max_tokens\": 4}\n\n{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n",
        )
        .unwrap();
        let lines = Workload::load_jsonl(&path).unwrap();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].max_tokens, 4);
        let mut w = Workload::new(Kind::Replay(lines), 0, None);
        let texts: Vec<String> = (0..3)
            .map(|_| w.next_unit()[0].spec.prompt_text())
            .collect();
        assert_eq!(texts, ["hello", "hi", "hello"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
