//! A request's prompt as its engine sees it: the model's chat template rendered the way
//! Hugging Face's `apply_chat_template` renders it, then the model's `tokenizer.json`.
//!
//! Why: an engine's prefix cache and its KV events name blocks of *token ids* (vLLM's automatic
//! prefix caching hashes each full block of ids with its parent's hash). A router that wants to
//! match those events, or to predict `cached_tokens` to the token, has to produce the same ids the
//! engine will, from the same files. Everything is loaded from a local directory (a model's
//! `tokenizer.json`, `tokenizer_config.json` and, in newer exports, `chat_template.jinja`); nothing
//! is downloaded at run time.
//!
//! What matches vLLM's OpenAI server, and what does not:
//! - chat prompts are rendered with `add_generation_prompt` (default true),
//!   `continue_final_message`, `tools`, `documents` and `chat_template_kwargs` from the request,
//!   the tokenizer's special tokens as variables, Jinja with `trim_blocks` and `lstrip_blocks` as
//!   transformers compiles it, Python's `json.dumps` for `tojson`, and Python string and dict
//!   methods;
//! - then encoded without special tokens (vLLM's chat default), completions with them;
//! - message content given as parts is joined with newlines for templates that expect a string,
//!   and passed as text parts to templates that loop over it (vLLM's content-format detection);
//!   a tool call's JSON `arguments` reach the template parsed, as vLLM passes them;
//! - not reproduced: vLLM's normalisation of `tools` through its request models (fields it adds,
//!   such as nulls for absent ones), `strftime_now`, multimodal parts. A prompt rendered
//!   differently only makes the router's cache prediction wrong for that request.

// Tests spell out whole scenarios step by step; the length limit is for the code they test.
#![cfg_attr(test, allow(clippy::too_many_lines))]

mod bpe;
mod byte_level;
mod json;
mod memo;
mod pieces;
mod template;

use serde_json::{Map, Value};
use std::path::Path;
use std::sync::Arc;
use template::ChatTemplate;

pub use memo::{PromptMemo, DEFAULT_MEMO_BYTES};
pub use template::ContentFormat;

/// Why a tokenizer could not be loaded or a prompt not tokenized.
#[derive(Debug, thiserror::Error)]
pub enum TokenizeError {
    /// A file of the tokenizer directory is missing or malformed.
    #[error("{file}: {message}")]
    Load {
        /// The file, relative to the directory given.
        file: String,
        /// What was wrong.
        message: String,
    },
    /// The chat template failed to compile or to render this request.
    #[error("chat template: {0}")]
    Template(String),
    /// The request's prompt fields cannot be rendered.
    #[error("{0}")]
    Request(String),
    /// The tokenizer failed on the text.
    #[error("tokenizer: {0}")]
    Encode(String),
}

/// A model's tokenizer and chat template.
#[derive(Debug)]
pub struct ChatTokenizer {
    tokenizer: tokenizers::Tokenizer,
    template: Option<ChatTemplate>,
    /// Encodes between special tokens with long stretches remembered, when that is exact.
    pieces: Option<pieces::PieceEncoder>,
    /// The byte-level fast path, when it reproduces this tokenizer.
    fast: Option<bpe::ByteLevelBpe>,
    /// The tokenizer has no added tokens: a whole text is one stretch.
    no_added_tokens: bool,
    /// Each session's last prompt, for [`Self::chat_prompt_in`].
    memo: PromptMemo,
}

/// Token ids the piece cache keeps (16 MiB of ids): the distinct long messages and system
/// prompts of a busy gateway's recent conversations.
const REMEMBERED_IDS: usize = 1 << 22;

fn load_error(file: &str, message: impl ToString) -> TokenizeError {
    TokenizeError::Load {
        file: file.to_owned(),
        message: message.to_string(),
    }
}

fn read_json(path: &Path, file: &str) -> Result<Option<Value>, TokenizeError> {
    match std::fs::read(path.join(file)) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| load_error(file, e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(load_error(file, e)),
    }
}

/// The template a directory names: `chat_template.jinja` (transformers >= 4.43 writes it there),
/// else `tokenizer_config.json`'s `chat_template` (a string, or named templates of which
/// `default` is taken), else `chat_template.json`.
fn template_source(dir: &Path, config: Option<&Value>) -> Result<Option<String>, TokenizeError> {
    match std::fs::read_to_string(dir.join("chat_template.jinja")) {
        Ok(s) => return Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(load_error("chat_template.jinja", e)),
    }
    let from = |v: Option<&Value>| -> Option<String> {
        match v? {
            Value::String(s) => Some(s.clone()),
            Value::Array(named) => named
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                .or_else(|| named.first())
                .and_then(|t| t.get("template")?.as_str().map(str::to_owned)),
            _ => None,
        }
    };
    if let Some(s) = from(config.and_then(|c| c.get("chat_template"))) {
        return Ok(Some(s));
    }
    let separate = read_json(dir, "chat_template.json")?;
    Ok(from(separate.as_ref().and_then(|c| c.get("chat_template"))))
}

/// The special tokens a template sees as variables (`bos_token`, `eos_token`, ...), as
/// `tokenizer_config.json` spells them (a string or an `AddedToken` map with `content`).
fn special_tokens(config: Option<&Value>) -> Vec<(String, String)> {
    let Some(Value::Object(config)) = config else {
        return Vec::new();
    };
    ["bos_token", "eos_token", "unk_token", "pad_token"]
        .iter()
        .filter_map(|name| {
            let token = match config.get(*name)? {
                Value::String(s) => s.clone(),
                Value::Object(t) => t.get("content")?.as_str()?.to_owned(),
                _ => return None,
            };
            Some(((*name).to_owned(), token))
        })
        .collect()
}

impl ChatTokenizer {
    /// Loads `dir/tokenizer.json` and the chat template the directory holds, if any.
    pub fn load(dir: &Path) -> Result<Self, TokenizeError> {
        let mut tokenizer = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json"))
            .map_err(|e| load_error("tokenizer.json", e))?;
        // transformers' fast tokenizers neither truncate nor pad unless a call asks.
        tokenizer
            .with_truncation(None)
            .map_err(|e| load_error("tokenizer.json", e))?;
        tokenizer.with_padding(None);
        let pieces = pieces::PieceEncoder::new(&tokenizer, REMEMBERED_IDS);
        let fast = read_json(dir, "tokenizer.json")?
            .as_ref()
            .and_then(bpe::ByteLevelBpe::from_json);
        let no_added_tokens = tokenizer.get_added_tokens_decoder().is_empty();
        let config = read_json(dir, "tokenizer_config.json")?;
        let template = match template_source(dir, config.as_ref())? {
            Some(source) => Some(ChatTemplate::new(source, special_tokens(config.as_ref()))?),
            None => None,
        };
        Ok(ChatTokenizer {
            tokenizer,
            template,
            pieces,
            fast,
            no_added_tokens,
            memo: PromptMemo::new(DEFAULT_MEMO_BYTES),
        })
    }

    /// The same tokenizer keeping at most `bytes` of sessions' last prompts (see
    /// [`Self::chat_prompt_in`]).
    #[must_use]
    pub fn with_memo_budget(mut self, bytes: usize) -> Self {
        self.memo = PromptMemo::new(bytes);
        self
    }

    /// The sessions' last prompts.
    pub fn memo(&self) -> &PromptMemo {
        &self.memo
    }

    /// Whether the directory had a chat template (without one, chat requests cannot be
    /// tokenized, as in vLLM).
    pub fn has_chat_template(&self) -> bool {
        self.template.is_some()
    }

    /// How the template wants message content, when there is a template.
    pub fn content_format(&self) -> Option<ContentFormat> {
        self.template.as_ref().map(ChatTemplate::format)
    }

    /// The ids of `text`, with the tokenizer's post-processing (BOS and the like) when
    /// `add_special_tokens`.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizeError> {
        self.encode_with(text, add_special_tokens, true)
    }

    /// [`Self::encode`] without looking up or keeping long stretches (what a never-seen prompt
    /// costs).
    pub fn encode_whole(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, TokenizeError> {
        self.encode_with(text, add_special_tokens, false)
    }

    /// Forgets the remembered stretches and words, so the next prompt costs what a first one
    /// does.
    pub fn forget(&self) {
        if let Some(pieces) = &self.pieces {
            pieces.forget();
        }
        if let Some(fast) = &self.fast {
            fast.forget();
        }
    }

    fn encode_with(
        &self,
        text: &str,
        add_special_tokens: bool,
        remember: bool,
    ) -> Result<Vec<u32>, TokenizeError> {
        if !add_special_tokens {
            let stretch = |s: &str, out: &mut Vec<u32>| self.encode_stretch(s, out);
            if let Some(pieces) = &self.pieces {
                return pieces.encode(text, remember, &stretch);
            }
            if self.no_added_tokens {
                let mut out = Vec::with_capacity(text.len() / 3 + 8);
                stretch(text, &mut out)?;
                return Ok(out);
            }
        }
        self.encode_reference(text, add_special_tokens)
    }

    /// One stretch of text between added tokens: the fast path where it applies.
    fn encode_stretch(&self, text: &str, out: &mut Vec<u32>) -> Result<(), TokenizeError> {
        if self.fast.as_ref().is_some_and(|f| f.encode(text, out)) {
            return Ok(());
        }
        out.extend_from_slice(&self.encode_reference(text, false)?);
        Ok(())
    }

    /// The tokenizers crate on the whole text.
    fn encode_reference(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, TokenizeError> {
        self.tokenizer
            .encode_fast(text, add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| TokenizeError::Encode(e.to_string()))
    }

    /// The text of a chat request's prompt: `body` is the request's JSON object.
    pub fn render_chat(&self, body: &Map<String, Value>) -> Result<String, TokenizeError> {
        let template = self.template.as_ref().ok_or_else(|| {
            TokenizeError::Template("the tokenizer directory has no chat template".into())
        })?;
        template.render(body)
    }

    /// The token ids of a chat request's prompt, as vLLM computes them: the rendered template,
    /// encoded without special tokens unless the request sets `add_special_tokens`.
    pub fn chat_prompt(&self, body: &Map<String, Value>) -> Result<Vec<u32>, TokenizeError> {
        let text = self.render_chat(body)?;
        let special = body
            .get("add_special_tokens")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        self.encode(&text, special)
    }

    /// [`Self::chat_prompt`] for a turn of `session` (any key: the caller's hash of whatever
    /// names the conversation), encoding only what follows the part of the rendered text it
    /// shares with the session's previous prompt (see `memo.rs` for why the ids are the same);
    /// also how many leading ids were taken from that prompt. Whole texts are encoded when the
    /// tokenizer's cut depends on position, or the request adds special tokens.
    pub fn chat_prompt_in(
        &self,
        body: &Map<String, Value>,
        session: u64,
    ) -> Result<(Vec<u32>, usize), TokenizeError> {
        let special = body
            .get("add_special_tokens")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let (Some(pieces), Some(template), false) = (&self.pieces, &self.template, special) else {
            return Ok((self.chat_prompt(body)?, 0));
        };
        let prior = self.memo.get(session);
        let (text, messages) =
            template.render_reusing(body, prior.as_ref().map_or(&[], |p| &p.messages))?;
        let stretch = |s: &str, out: &mut Vec<u32>| self.encode_stretch(s, out);
        let (ids, cuts, reused) = pieces.encode_after(prior.as_ref(), &text, &stretch)?;
        drop(prior);
        if text.len() + 4 * ids.len() > self.memo.budget() {
            return Ok((ids, reused));
        }
        let entry = memo::Entry {
            text: Arc::new(text),
            ids: ids.as_slice().into(),
            cuts: cuts.into(),
            messages: messages.into(),
        };
        self.memo.put(session, entry);
        Ok((ids, reused))
    }

    /// The token ids of a completion request's `prompt` (a string, a list of one string, or
    /// token ids as they are), with special tokens unless `add_special_tokens` is false.
    pub fn completion_prompt(&self, body: &Map<String, Value>) -> Result<Vec<u32>, TokenizeError> {
        let special = body
            .get("add_special_tokens")
            .and_then(Value::as_bool)
            .unwrap_or(true);
        match body.get("prompt") {
            Some(Value::String(s)) => self.encode(s, special),
            Some(Value::Array(items)) if items.len() == 1 && items[0].is_string() => {
                self.encode(items[0].as_str().unwrap_or_default(), special)
            }
            Some(Value::Array(items)) if !items.is_empty() => items
                .iter()
                .map(|v| v.as_u64().and_then(|t| u32::try_from(t).ok()))
                .collect::<Option<Vec<u32>>>()
                .ok_or_else(|| {
                    TokenizeError::Request(
                        "prompt must be a string, a list of one string, or token ids".into(),
                    )
                }),
            _ => Err(TokenizeError::Request(
                "prompt must be a string, a list of one string, or token ids".into(),
            )),
        }
    }
}

#[cfg(test)]
mod tests;
