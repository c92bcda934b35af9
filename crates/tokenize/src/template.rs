//! The chat template, compiled once and rendered per request the way transformers'
//! `apply_chat_template` and vLLM's chat renderer do (see the crate documentation).

use crate::json::{dumps, Layout};
use crate::TokenizeError;
use minijinja::value::{Kwargs, Serde, Value as JValue};
use minijinja::{Environment, Error, ErrorKind};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::sync::Arc;

const NAME: &str = "chat";

/// How a template wants each message's `content` (vLLM's `ChatTemplateContentFormat`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContentFormat {
    /// A string: text parts are joined with newlines.
    String,
    /// A list of parts (`{"type": "text", "text": ...}`) the template loops over.
    OpenAi,
}

/// A compiled chat template and the variables every render passes.
pub(crate) struct ChatTemplate {
    env: Environment<'static>,
    format: ContentFormat,
    specials: Vec<(String, String)>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("format", &self.format)
            .field("specials", &self.specials)
            .finish_non_exhaustive()
    }
}

/// Whether the template loops over a message's content (a `{% for x in ...content... %}`
/// statement): then it expects a list of parts. vLLM decides the same from the template's
/// syntax tree; a textual scan of the `for` statements finds the same loops.
fn detect_format(source: &str) -> ContentFormat {
    let loops_over_content = source.split("{%").skip(1).any(|tag| {
        let statement = tag.split("%}").next().unwrap_or_default();
        let statement = statement.trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        statement.strip_prefix("for ").is_some_and(|rest| {
            rest.split_once(" in ")
                .is_some_and(|(_, iterable)| iterable.contains("content"))
        })
    });
    if loops_over_content {
        ContentFormat::OpenAi
    } else {
        ContentFormat::String
    }
}

fn tojson(value: JValue, kwargs: Kwargs) -> Result<String, Error> {
    let indent: Option<JValue> = kwargs.get("indent")?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match v.as_str() {
            Some(s) => Some(s.to_owned()),
            None => Some(" ".repeat(usize::try_from(v).unwrap_or(0))),
        },
    };
    let mut layout = Layout::python(indent);
    if let Some(b) = kwargs.get::<Option<bool>>("ensure_ascii")? {
        layout.ensure_ascii = b;
    }
    if let Some(b) = kwargs.get::<Option<bool>>("sort_keys")? {
        layout.sort_keys = b;
    }
    if let Some(seps) = kwargs.get::<Option<Vec<String>>>("separators")? {
        if let [item, key] = seps.as_slice() {
            layout.item_separator = item.clone();
            layout.key_separator = key.clone();
        }
    }
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    Ok(dumps(&json, &layout))
}

fn raise_exception(message: String) -> Result<JValue, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

impl ChatTemplate {
    pub(crate) fn new(
        source: String,
        specials: Vec<(String, String)>,
    ) -> Result<Self, TokenizeError> {
        let format = detect_format(&source);
        let mut env = Environment::new();
        // transformers compiles templates with trim_blocks and lstrip_blocks (and jinja2's
        // default of dropping one trailing newline, minijinja's default too).
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| TokenizeError::Template(e.to_string()))?;
        env.set_syntax(syntax);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned(NAME, source)
            .map_err(|e| TokenizeError::Template(e.to_string()))?;
        Ok(ChatTemplate {
            env,
            format,
            specials,
        })
    }

    pub(crate) fn format(&self) -> ContentFormat {
        self.format
    }

    /// Renders `body`'s `messages` (with its `tools`, `documents`, generation flags and
    /// `chat_template_kwargs`).
    pub(crate) fn render(&self, body: &Map<String, Value>) -> Result<String, TokenizeError> {
        self.render_with(body, None).map(|(text, _)| text)
    }

    /// [`Self::render`], taking each message's template value from `prior` (the same session's
    /// previous request) when the message there is equal, and the messages' values for the next
    /// call. Converting a message costs two copies of it; comparing one, a `memcmp`.
    pub(crate) fn render_reusing(
        &self,
        body: &Map<String, Value>,
        prior: &[Arc<Converted>],
    ) -> Result<(String, Vec<Arc<Converted>>), TokenizeError> {
        self.render_with(body, Some(prior))
    }

    /// Renders, reusing `prior`'s messages when given (and then keeping each message as given,
    /// for the next comparison).
    fn render_with(
        &self,
        body: &Map<String, Value>,
        prior: Option<&[Arc<Converted>]>,
    ) -> Result<(String, Vec<Arc<Converted>>), TokenizeError> {
        let converted = match body.get("messages") {
            Some(Value::Array(m)) if !m.is_empty() => m
                .iter()
                .enumerate()
                .map(|(i, m)| match prior.map(|p| p.get(i)) {
                    Some(Some(p)) if same(&p.raw, m) => Ok(p.clone()),
                    _ => self.message(m, prior.is_some()).map(Arc::new),
                })
                .collect::<Result<Vec<_>, _>>()?,
            _ => {
                return Err(TokenizeError::Request(
                    "`messages` must be a non-empty array".into(),
                ))
            }
        };
        let flag =
            |name: &str, default: bool| body.get(name).and_then(Value::as_bool).unwrap_or(default);
        let continue_final = flag("continue_final_message", false);
        let mut vars: BTreeMap<String, JValue> = BTreeMap::new();
        for (name, token) in &self.specials {
            vars.insert(name.clone(), JValue::from(token.as_str()));
        }
        let views: Vec<JValue> = converted.iter().map(|c| c.view.clone()).collect();
        vars.insert("messages".into(), JValue::from(views));
        let tools = body.get("tools").filter(|t| !t.is_null());
        vars.insert(
            "tools".into(),
            tools.map_or(JValue::from(()), |t| JValue::from(Serde(t))),
        );
        if let Some(docs) = body.get("documents").filter(|d| !d.is_null()) {
            vars.insert("documents".into(), JValue::from(Serde(docs)));
        }
        vars.insert(
            "add_generation_prompt".into(),
            JValue::from(flag("add_generation_prompt", true) && !continue_final),
        );
        if let Some(Value::Object(kwargs)) = body.get("chat_template_kwargs") {
            for (k, v) in kwargs {
                vars.insert(k.clone(), JValue::from(Serde(v)));
            }
        }
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| TokenizeError::Template(e.to_string()))?;
        let mut text = template
            .render(JValue::from(vars))
            .map_err(|e| TokenizeError::Template(e.to_string()))?;
        if continue_final {
            // transformers cuts the render after the final message's content, so generation
            // continues it rather than starting a new turn.
            let last = body["messages"]
                .as_array()
                .and_then(|m| m.last())
                .map(|m| content_text(m.get("content")))
                .unwrap_or_default();
            let last = last.trim();
            if !last.is_empty() {
                if let Some(at) = text.rfind(last) {
                    text.truncate(at + last.len());
                }
            }
        }
        Ok((text, converted))
    }

    /// One message as the template sees it: content in the template's format, tool-call
    /// arguments parsed from their JSON text.
    /// `keep`: the message as given is kept too (else `Null`).
    fn message(&self, message: &Value, keep: bool) -> Result<Converted, TokenizeError> {
        let Value::Object(fields) = message else {
            return Err(TokenizeError::Request(
                "every message must be an object".into(),
            ));
        };
        let mut out = fields.clone();
        let content = match (fields.get("content"), self.format) {
            (Some(Value::Array(parts)), ContentFormat::OpenAi) => Value::Array(
                text_parts(parts)
                    .map(|t| serde_json::json!({"type": "text", "text": t}))
                    .collect(),
            ),
            (Some(Value::String(s)), ContentFormat::OpenAi) => {
                serde_json::json!([{"type": "text", "text": s}])
            }
            (Some(Value::Null) | None, ContentFormat::OpenAi) => Value::Array(Vec::new()),
            (Some(other), ContentFormat::OpenAi) => other.clone(),
            (content, ContentFormat::String) => Value::String(content_text(content)),
        };
        out.insert("content".into(), content);
        if let Some(Value::Array(calls)) = out.get_mut("tool_calls") {
            for call in calls {
                let Some(Value::Object(function)) = call.get_mut("function") else {
                    continue;
                };
                if let Some(Value::String(args)) = function.get("arguments") {
                    if let Ok(parsed @ Value::Object(_)) = serde_json::from_str::<Value>(args) {
                        function.insert("arguments".into(), parsed);
                    }
                }
            }
        }
        let view = JValue::from(Serde(&out));
        Ok(Converted {
            bytes: 2 * json_bytes(message),
            raw: if keep { message.clone() } else { Value::Null },
            view,
        })
    }
}

/// A message as the request gave it, and as the template sees it.
#[derive(Debug)]
pub(crate) struct Converted {
    raw: Value,
    view: JValue,
    /// About what the two hold.
    pub(crate) bytes: usize,
}

/// Whether two JSON values are equal with their objects' keys in the same order: `==` on
/// `serde_json` maps ignores the order, which a template sees (`tojson`, `items()`).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .zip(y)
                    .all(|((kx, vx), (ky, vy))| kx == ky && same(vx, vy))
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(vx, vy)| same(vx, vy))
        }
        _ => a == b,
    }
}

/// About the bytes a JSON value holds in memory: its strings and a word or four per node.
fn json_bytes(v: &Value) -> usize {
    match v {
        Value::String(s) => 32 + s.len(),
        Value::Array(items) => 32 + items.iter().map(json_bytes).sum::<usize>(),
        Value::Object(m) => {
            32 + m
                .iter()
                .map(|(k, v)| 32 + k.len() + json_bytes(v))
                .sum::<usize>()
        }
        _ => 32,
    }
}

fn text_parts(parts: &[Value]) -> impl Iterator<Item = &str> {
    parts.iter().filter_map(|p| match p {
        Value::String(s) => Some(s.as_str()),
        Value::Object(part) => part.get("text").and_then(Value::as_str),
        _ => None,
    })
}

/// Content as a string: text parts joined with newlines, as vLLM does for string templates.
fn content_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => text_parts(parts).collect::<Vec<_>>().join("\n"),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sameness_sees_the_order_of_keys() {
        let a = serde_json::json!({"f": {"x": 1, "y": [1, {"p": 2, "q": 3}]}});
        let b = serde_json::json!({"f": {"y": [1, {"p": 2, "q": 3}], "x": 1}});
        let c = serde_json::json!({"f": {"x": 1, "y": [1, {"q": 3, "p": 2}]}});
        assert!(same(&a, &a.clone()));
        assert!(a == b && !same(&a, &b));
        assert!(a == c && !same(&a, &c));
    }

    #[test]
    fn content_loops_are_detected() {
        assert_eq!(
            detect_format("{% for m in messages %}{{ m['content'] }}{% endfor %}"),
            ContentFormat::String
        );
        assert_eq!(
            detect_format("{%- for part in message['content'] -%}{{ part.text }}{% endfor %}"),
            ContentFormat::OpenAi
        );
    }
}
