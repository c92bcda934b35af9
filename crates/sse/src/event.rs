//! What the reader hands out: an event's raw data and where it lay in the stream, and the
//! views of an OpenAI-style chunk parsed from it on request.

use crate::Error;
use serde::Deserialize;
use serde_json::Value;
use std::borrow::Cow;
use std::ops::Range;

/// One event of the stream. `span` is where it lay in the stream: from just after the blank
/// line of the previous event (comments and other fields included) to just after its own, so
/// a caller can drop or replace its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event<'a> {
    /// An event with data other than the `[DONE]` terminator.
    Data(Data<'a>),
    /// `data: [DONE]`, which ends an OpenAI stream (surrounding blanks allowed).
    Done(Range<u64>),
}

impl Event<'_> {
    /// Where the event lay in the stream.
    pub fn span(&self) -> Range<u64> {
        match self {
            Event::Data(d) => d.span.clone(),
            Event::Done(span) => span.clone(),
        }
    }
}

/// An event's data and fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Data<'a> {
    data: &'a [u8],
    kind: &'a [u8],
    id: &'a [u8],
    span: Range<u64>,
}

impl<'a> Data<'a> {
    pub(crate) fn new(data: &'a [u8], kind: &'a [u8], id: &'a [u8], span: Range<u64>) -> Self {
        Data {
            data,
            kind,
            id,
            span,
        }
    }

    /// The data: the values of its `data:` lines joined with `\n`.
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// The `event:` field, `None` for the default type ("message").
    pub fn event_type(&self) -> Option<&'a [u8]> {
        (!self.kind.is_empty()).then_some(self.kind)
    }

    /// The last `id:` field of the stream so far (the standard's "last event ID").
    pub fn last_event_id(&self) -> &'a [u8] {
        self.id
    }

    /// Where the event lay in the stream.
    pub fn span(&self) -> Range<u64> {
        self.span.clone()
    }

    /// The data parsed as an OpenAI-style chunk (the JSON is parsed on each call).
    pub fn chunk(&self) -> Result<Chunk, Error> {
        Chunk::parse(self.data)
    }
}

/// What callers read from a chunk of a chat or completion stream (or a whole non-streamed
/// answer, whose `choices[].message` is read as a delta is).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Chunk {
    /// The `usage` object, when it is one.
    pub usage: Option<Usage>,
    /// The first choice's `finish_reason` that is set.
    pub finish_reason: Option<String>,
    /// The `error` object of an error event.
    pub error: Option<ErrorObject>,
    /// A choice carries output: non-empty `text`, or `content` or `reasoning_content` of its
    /// `delta` or `message`. What counts for time to first token and for content chunks.
    pub has_content: bool,
}

/// Token counts of a `usage` object; each is absent when the engine did not report it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// `prompt_tokens`.
    pub prompt_tokens: Option<u64>,
    /// `completion_tokens`.
    pub completion_tokens: Option<u64>,
    /// `prompt_tokens_details.cached_tokens` (OpenAI's and vLLM's prefix-cache hits).
    pub cached_tokens: Option<u64>,
}

/// The `error` of an error event. An error that is not an object keeps its text (a string)
/// or nothing in `message`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ErrorObject {
    /// `message`.
    pub message: Option<String>,
    /// `type`.
    pub kind: Option<String>,
    /// `code`, as JSON text (OpenAI sends strings, some servers numbers).
    pub code: Option<String>,
}

#[derive(Deserialize)]
struct RawChunk<'a> {
    #[serde(default, borrow)]
    choices: Vec<RawChoice<'a>>,
    #[serde(default)]
    usage: Option<RawUsage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Deserialize)]
struct RawChoice<'a> {
    #[serde(default, borrow)]
    delta: Option<RawDelta<'a>>,
    #[serde(default, borrow)]
    message: Option<RawDelta<'a>>,
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct RawDelta<'a> {
    #[serde(default, borrow)]
    content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    reasoning_content: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct RawUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<Details>,
}

#[derive(Deserialize)]
struct Details {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

fn non_empty(s: &Option<Cow<'_, str>>) -> bool {
    s.as_deref().is_some_and(|s| !s.is_empty())
}

impl Chunk {
    /// Parses one chunk's JSON.
    pub fn parse(json: &[u8]) -> Result<Chunk, Error> {
        let raw: RawChunk<'_> = serde_json::from_slice(json)?;
        let has_content = raw.choices.iter().any(|c| {
            non_empty(&c.text)
                || [&c.delta, &c.message]
                    .into_iter()
                    .flatten()
                    .any(|d| non_empty(&d.content) || non_empty(&d.reasoning_content))
        });
        let finish_reason = raw
            .choices
            .iter()
            .find_map(|c| c.finish_reason.as_deref().map(str::to_owned));
        let usage = raw.usage.map(|u| Usage {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            cached_tokens: u.prompt_tokens_details.and_then(|d| d.cached_tokens),
        });
        let error = raw.error.filter(|e| !e.is_null()).map(|e| match e {
            Value::Object(o) => {
                let text = |k: &str| match o.get(k) {
                    Some(Value::String(s)) => Some(s.clone()),
                    Some(Value::Null) | None => None,
                    Some(other) => Some(other.to_string()),
                };
                ErrorObject {
                    message: text("message"),
                    kind: text("type"),
                    code: text("code"),
                }
            }
            Value::String(s) => ErrorObject {
                message: Some(s),
                ..ErrorObject::default()
            },
            _ => ErrorObject::default(),
        });
        Ok(Chunk {
            usage,
            finish_reason,
            error,
            has_content,
        })
    }
}
