//! The chat template, compiled once and rendered per request the way transformers'
//! `apply_chat_template` and vLLM's chat renderer do (see the crate documentation).

use crate::json::{dumps, Layout};
use crate::TokenizeError;
use minijinja::value::{Kwargs, Value as JValue};
use minijinja::{Environment, Error, ErrorKind};
use serde_json::{Map, Value};

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
        let messages = match body.get("messages") {
            Some(Value::Array(m)) if !m.is_empty() => m
                .iter()
                .map(|m| self.message(m))
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
        let mut vars = Map::new();
        for (name, token) in &self.specials {
            vars.insert(name.clone(), Value::String(token.clone()));
        }
        vars.insert("messages".into(), Value::Array(messages));
        let tools = body.get("tools").filter(|t| !t.is_null()).cloned();
        vars.insert("tools".into(), tools.unwrap_or(Value::Null));
        if let Some(docs) = body.get("documents").filter(|d| !d.is_null()) {
            vars.insert("documents".into(), docs.clone());
        }
        vars.insert(
            "add_generation_prompt".into(),
            Value::Bool(flag("add_generation_prompt", true) && !continue_final),
        );
        if let Some(Value::Object(kwargs)) = body.get("chat_template_kwargs") {
            for (k, v) in kwargs {
                vars.insert(k.clone(), v.clone());
            }
        }
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| TokenizeError::Template(e.to_string()))?;
        let mut text = template
            .render(JValue::from(minijinja::value::Serde(&vars)))
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
        Ok(text)
    }

    /// One message as the template sees it: content in the template's format, tool-call
    /// arguments parsed from their JSON text.
    fn message(&self, message: &Value) -> Result<Value, TokenizeError> {
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
        Ok(Value::Object(out))
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
