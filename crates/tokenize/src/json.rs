//! `tojson` as transformers defines it for chat templates: Python's `json.dumps` with
//! `ensure_ascii=False` by default, `", "` and `": "` separators (`","` between items when
//! indenting), optional `indent`, `sort_keys` and `separators`. Jinja's own `tojson` (compact,
//! HTML-escaped) would put different bytes into the prompt.

use serde_json::Value;
use std::fmt::Write as _;

/// How to lay out the JSON text.
#[derive(Clone, Debug)]
pub(crate) struct Layout {
    pub(crate) indent: Option<String>,
    pub(crate) item_separator: String,
    pub(crate) key_separator: String,
    pub(crate) sort_keys: bool,
    pub(crate) ensure_ascii: bool,
}

impl Layout {
    /// Python's defaults for the given indent.
    pub(crate) fn python(indent: Option<String>) -> Self {
        Layout {
            item_separator: if indent.is_some() { "," } else { ", " }.to_owned(),
            key_separator: ": ".to_owned(),
            indent,
            sort_keys: false,
            ensure_ascii: false,
        }
    }
}

/// `value` as Python's `json.dumps` would write it.
pub(crate) fn dumps(value: &Value, layout: &Layout) -> String {
    let mut out = String::new();
    write_value(&mut out, value, layout, 0);
    out
}

fn newline(out: &mut String, layout: &Layout, level: usize) {
    if let Some(indent) = &layout.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(indent);
        }
    }
}

fn write_string(out: &mut String, s: &str, ensure_ascii: bool) {
    // serde_json escapes exactly what Python escapes: quotes, backslashes and control
    // characters (\b \f \n \r \t by name, the rest as lower-case \u00xx).
    let escaped = serde_json::to_string(s).unwrap_or_default();
    if !ensure_ascii {
        out.push_str(&escaped);
        return;
    }
    for c in escaped.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                let _ = write!(out, "\\u{unit:04x}");
            }
        }
    }
}

fn write_value(out: &mut String, value: &Value, layout: &Layout, level: usize) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => write_number(out, n),
        Value::String(s) => write_string(out, s, layout.ensure_ascii),
        Value::Array(items) if items.is_empty() => out.push_str("[]"),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&layout.item_separator);
                }
                newline(out, layout, level + 1);
                write_value(out, item, layout, level + 1);
            }
            newline(out, layout, level);
            out.push(']');
        }
        Value::Object(map) if map.is_empty() => out.push_str("{}"),
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            if layout.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(&layout.item_separator);
                }
                newline(out, layout, level + 1);
                write_string(out, key, layout.ensure_ascii);
                out.push_str(&layout.key_separator);
                write_value(out, item, layout, level + 1);
            }
            newline(out, layout, level);
            out.push('}');
        }
    }
}

/// Python writes floats with `repr` (`1.0`, `1e+20`, `1.5e-07`) and integers as they are.
fn write_number(out: &mut String, n: &serde_json::Number) {
    if n.is_f64() {
        let f = n.as_f64().unwrap_or_default();
        if f.is_finite() && f.fract() == 0.0 && f.abs() < 1e16 {
            let _ = write!(out, "{f:.1}");
            return;
        }
        let text = n.to_string();
        // Rust writes `1e20` / `1e-7`, Python `1e+20` / `1e-07`.
        match text.split_once('e') {
            Some((mantissa, exp)) => {
                let (sign, digits) = match exp.strip_prefix('-') {
                    Some(d) => ('-', d),
                    None => ('+', exp.trim_start_matches('+')),
                };
                let _ = write!(out, "{mantissa}e{sign}{digits:0>2}");
            }
            None => out.push_str(&text),
        }
    } else {
        let _ = write!(out, "{n}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn matches_python_json_dumps() {
        let v: Value = serde_json::from_str(
            r#"{"b": [1, 2.5, "x\ny", null, true], "a": {"é": "ü\u0001"}, "c": 3.0, "d": []}"#,
        )
        .unwrap();
        // json.dumps(v, ensure_ascii=False)
        assert_eq!(
            dumps(&v, &Layout::python(None)),
            r#"{"b": [1, 2.5, "x\ny", null, true], "a": {"é": "ü\u0001"}, "c": 3.0, "d": []}"#
        );
        // json.dumps(v, indent=2)
        let mut l = Layout::python(Some("  ".into()));
        l.ensure_ascii = true;
        l.sort_keys = true;
        assert_eq!(
            dumps(&v, &l),
            "{\n  \"a\": {\n    \"\\u00e9\": \"\\u00fc\\u0001\"\n  },\n  \"b\": [\n    1,\n    2.5,\n    \"x\\ny\",\n    null,\n    true\n  ],\n  \"c\": 3.0,\n  \"d\": []\n}"
        );
        assert_eq!(dumps(&json!(1e20), &Layout::python(None)), "1e+20");
        assert_eq!(dumps(&json!("😀"), &l), "\"\\ud83d\\ude00\"");
    }
}
