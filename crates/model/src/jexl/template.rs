//! `${…}` macros in the templates of custom notifications (`url`,
//! `headers`, `qs`, `payload`, `json`, `ngsi`), replaced the way Orion's
//! manual describes ("Macro substitution", "JSON payloads"):
//!
//! - a macro that is the whole of a JSON string keeps the JSON type of its
//!   result (`"${temperature}"` becomes `23.4`, `"${count}"` an object);
//! - a macro inside a longer string is spliced in as text: strings bare,
//!   numbers as Orion writes them, everything else as JSON text;
//! - a `null` result (an expression that failed, an attribute the entity
//!   lacks) is `null` inside a JSON string but nothing in a text template
//!   (`url`, `headers`, `qs`, `payload`), where an emptied header or query
//!   parameter is then left out;
//! - object keys are never templates.
//!
//! A macro ends at the `}` that closes it, so expressions may hold object
//! literals (`${{a: A+1}}`) and strings with braces (`${A||'}'}`).

use serde_json::{Map, Value};

use super::{as_text, evaluate};

/// One piece of a template: literal text or a macro's expression.
#[derive(Debug, PartialEq, Eq)]
enum Piece<'a> {
    Text(&'a str),
    Macro(&'a str),
}

/// Splits a template into text and macros. An unterminated `${` is text.
fn pieces(template: &str) -> Vec<Piece<'_>> {
    let mut out = Vec::new();
    let mut rest = template;
    while let Some(start) = rest.find("${") {
        let body = &rest[start + 2..];
        let Some(len) = macro_len(body) else {
            break;
        };
        if start > 0 {
            out.push(Piece::Text(&rest[..start]));
        }
        out.push(Piece::Macro(&body[..len]));
        rest = &body[len + 1..];
    }
    if !rest.is_empty() {
        out.push(Piece::Text(rest));
    }
    out
}

/// The length of a macro's expression: up to the `}` that closes the
/// macro, skipping braces nested in the expression and inside quoted
/// strings. `None` when it is never closed.
fn macro_len(body: &str) -> Option<usize> {
    let mut depth = 0usize;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (i, c) in body.char_indices() {
        if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '\'' | '"' => quote = Some(c),
            '{' => depth += 1,
            '}' if depth == 0 => return Some(i),
            '}' => depth -= 1,
            _ => {}
        }
    }
    None
}

/// The expression of a string that is exactly one macro (`"${A+1}"`).
pub fn whole_macro(s: &str) -> Option<&str> {
    match pieces(s).as_slice() {
        [Piece::Macro(expr)] if s.starts_with("${") && s.ends_with('}') => Some(expr),
        _ => None,
    }
}

/// Whether a string holds at least one macro.
pub fn has_macros(s: &str) -> bool {
    pieces(s).iter().any(|p| matches!(p, Piece::Macro(_)))
}

/// Replaces every macro in a text template (`url`, `headers`, `qs`,
/// `payload`) by its result as text; `null` is left out.
pub fn render_text(template: &str, context: &Map<String, Value>) -> String {
    splice(template, context, "")
}

/// Replaces every macro by its result as text, `null` as `null_text`.
fn splice(template: &str, context: &Map<String, Value>, null_text: &str) -> String {
    let mut out = String::with_capacity(template.len());
    for piece in pieces(template) {
        match piece {
            Piece::Text(t) => out.push_str(t),
            Piece::Macro(expr) => match evaluate(expr, context) {
                Value::Null => out.push_str(null_text),
                v => out.push_str(&as_text(&v)),
            },
        }
    }
    out
}

/// Replaces macros inside a JSON template: a string that is exactly one
/// macro becomes the result's JSON value; other strings are rendered as
/// text; keys stay as they are.
pub fn render_json(template: &Value, context: &Map<String, Value>) -> Value {
    match template {
        Value::String(s) => render_string_value(s, context),
        Value::Array(items) => {
            Value::Array(items.iter().map(|i| render_json(i, context)).collect())
        }
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| (k.clone(), render_json(v, context)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// One JSON string of a template: a whole macro keeps its result's type.
pub fn render_string_value(s: &str, context: &Map<String, Value>) -> Value {
    match whole_macro(s) {
        Some(expr) => evaluate(expr, context),
        None => Value::String(splice(s, context, "null")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ctx() -> Map<String, Value> {
        json!({"id": "E1", "A": 10, "S": "foo", "O": {"x": [1]}, "N": null})
            .as_object()
            .cloned()
            .unwrap()
    }

    #[test]
    fn splits_macros_with_nested_braces_and_quotes() {
        assert_eq!(
            pieces("a${x}b"),
            vec![Piece::Text("a"), Piece::Macro("x"), Piece::Text("b")]
        );
        assert_eq!(pieces("${{a: 1}}"), vec![Piece::Macro("{a: 1}")]);
        assert_eq!(
            pieces("${A||'}'}!"),
            vec![Piece::Macro("A||'}'"), Piece::Text("!")]
        );
        assert_eq!(pieces("${A||\"{\"}"), vec![Piece::Macro("A||\"{\"")]);
        assert_eq!(pieces("${open"), vec![Piece::Text("${open")]);
        assert_eq!(whole_macro("${A}"), Some("A"));
        assert_eq!(whole_macro("${A}${B}"), None);
        assert_eq!(whole_macro("x${A}"), None);
        assert!(has_macros("x${A}"));
        assert!(!has_macros("plain"));
    }

    #[test]
    fn text_rendering_splices_values() {
        let c = ctx();
        assert_eq!(render_text("id=${id} a=${A*2}", &c), "id=E1 a=20");
        assert_eq!(render_text("${O}", &c), "{\"x\":[1]}");
        assert_eq!(render_text("${missing}|${N}|", &c), "||");
        assert_eq!(
            render_json(&json!("${missing}|${N}"), &c),
            json!("null|null")
        );
        assert_eq!(render_text("${S|uppercase}!", &c), "FOO!");
        assert_eq!(render_text("no macros", &c), "no macros");
    }

    #[test]
    fn json_rendering_keeps_types_of_whole_macros() {
        let c = ctx();
        let t = json!({"a": "${A}", "o": "${O}", "t": "A is ${A}", "m": "${missing}",
                       "${A}": ["${S}", 3, {"n": "${A/4}"}]});
        assert_eq!(
            render_json(&t, &c),
            json!({"a": 10, "o": {"x": [1]}, "t": "A is 10", "m": null,
                   "${A}": ["foo", 3, {"n": 2.5}]})
        );
        assert_eq!(render_json(&json!("${{a: A}}"), &c), json!({"a": 10}));
    }
}
