//! Answers on QuantumLeap's own listener rendered byte for byte as
//! QuantumLeap renders them: its JSON is Python's (`indent=2`, keys
//! sorted, non-ASCII escaped, floats in Python's `repr`, a final newline)
//! and its status lines carry werkzeug's upper-case reason phrases
//! (`404 NOT FOUND`). Clients that compare answers as text, or print them
//! (the FIWARE command-line client shows them as they come), see what
//! QuantumLeap would have sent. Under `/ql` on weft's own listener answers
//! stay compact, as the rest of weft's API.

use std::fmt::Write as _;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use serde_json::Value;
use weft_model::history::python;

/// Largest JSON answer re-rendered (a query answers at most 10,000 records
/// per series); a bigger one passes through compact.
const MAX_RENDERED_BYTES: usize = 64 * 1024 * 1024;

/// Re-renders a JSON answer as QuantumLeap's (see the module) and sets
/// werkzeug's reason phrase on every answer.
pub(crate) async fn as_quantumleap(req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.starts_with("application/json") || v.starts_with("application/problem+json")
        });
    let mut resp = if is_json {
        let (mut parts, body) = resp.into_parts();
        match axum::body::to_bytes(body, MAX_RENDERED_BYTES).await {
            Ok(bytes) => match serde_json::from_slice::<Value>(&bytes) {
                Ok(value) => {
                    let text = python_json(&value);
                    parts.headers.remove(header::CONTENT_LENGTH);
                    parts
                        .headers
                        .insert(header::CONTENT_LENGTH, HeaderValue::from(text.len()));
                    Response::from_parts(parts, Body::from(text))
                }
                Err(_) => Response::from_parts(parts, Body::from(bytes)),
            },
            Err(_) => {
                return Response::builder()
                    .status(StatusCode::INTERNAL_SERVER_ERROR)
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(Body::from("\"answer too large\"\n"))
                    .unwrap_or_default()
            }
        }
    } else {
        resp
    };
    if let Some(reason) = reason_phrase(status) {
        resp.extensions_mut()
            .insert(hyper::ext::ReasonPhrase::from_static(reason));
    }
    resp
}

/// werkzeug's reason phrase of a status, upper-cased as its server writes
/// it; `None` leaves hyper's.
fn reason_phrase(status: StatusCode) -> Option<&'static [u8]> {
    Some(match status.as_u16() {
        200 => b"OK",
        201 => b"CREATED",
        204 => b"NO CONTENT",
        207 => b"MULTI-STATUS",
        308 => b"PERMANENT REDIRECT",
        400 => b"BAD REQUEST",
        401 => b"UNAUTHORIZED",
        403 => b"FORBIDDEN",
        404 => b"NOT FOUND",
        405 => b"METHOD NOT ALLOWED",
        406 => b"NOT ACCEPTABLE",
        409 => b"CONFLICT",
        411 => b"LENGTH REQUIRED",
        413 => b"REQUEST ENTITY TOO LARGE",
        415 => b"UNSUPPORTED MEDIA TYPE",
        422 => b"UNPROCESSABLE ENTITY",
        424 => b"FAILED DEPENDENCY",
        429 => b"TOO MANY REQUESTS",
        500 => b"INTERNAL SERVER ERROR",
        501 => b"NOT IMPLEMENTED",
        503 => b"SERVICE UNAVAILABLE",
        _ => return None,
    })
}

/// `value` as Python's `json.dumps(value, indent=2, sort_keys=True)`
/// writes it, plus the newline QuantumLeap's framework appends.
pub(crate) fn python_json(value: &Value) -> String {
    let mut out = String::with_capacity(256);
    write_value(&mut out, value, 0);
    out.push('\n');
    out
}

fn write_value(out: &mut String, value: &Value, depth: usize) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => {
                let _ = write!(out, "{i}");
            }
            (None, Some(u), _) => {
                let _ = write!(out, "{u}");
            }
            (None, None, Some(f)) => write_float(out, f),
            _ => out.push_str(&n.to_string()),
        },
        Value::String(s) => write_string(out, s),
        Value::Array(items) if items.is_empty() => out.push_str("[]"),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                newline(out, depth + 1);
                write_value(out, item, depth + 1);
            }
            newline(out, depth);
            out.push(']');
        }
        Value::Object(map) if map.is_empty() => out.push_str("{}"),
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                newline(out, depth + 1);
                write_string(out, key);
                out.push_str(": ");
                write_value(out, &map[key], depth + 1);
            }
            newline(out, depth);
            out.push('}');
        }
    }
}

fn newline(out: &mut String, depth: usize) {
    out.push('\n');
    for _ in 0..depth {
        out.push_str("  ");
    }
}

/// A string as Python's `ensure_ascii` JSON: everything outside printable
/// ASCII escaped, characters beyond the BMP as surrogate pairs.
fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
        }
    }
    out.push('"');
}

/// A float as Python's JSON writes it: its `repr` (one home:
/// [`python::float_repr`]), infinities and NaN as Python's `json` spells
/// them (QuantumLeap never stores them).
fn write_float(out: &mut String, f: f64) {
    if f.is_nan() {
        out.push_str("NaN");
    } else if f.is_infinite() {
        out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
    } else {
        out.push_str(&python::float_repr(f));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn renders_as_python_json_dumps_with_indent_and_sorted_keys() {
        let v = json!({"values": [20.0, null, true], "attrName": "t", "e": {}, "l": [], "n": {"b": 1, "a": "h\u{e9}\u{1F600}"}});
        assert_eq!(
            python_json(&v),
            "{\n  \"attrName\": \"t\",\n  \"e\": {},\n  \"l\": [],\n  \"n\": {\n    \"a\": \"h\\u00e9\\ud83d\\ude00\",\n    \"b\": 1\n  },\n  \"values\": [\n    20.0,\n    null,\n    true\n  ]\n}\n"
        );
        assert_eq!(python_json(&json!("x\u{7f}")), "\"x\\u007f\"\n");
    }

    #[test]
    fn floats_as_python_repr() {
        let cases = [
            (20.0, "20.0"),
            (0.1, "0.1"),
            (-1.5, "-1.5"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (123456789012345678.0, "1.2345678901234568e+17"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (-2.5e-7, "-2.5e-07"),
            (1.5e300, "1.5e+300"),
            (0.0, "0.0"),
            (21.3, "21.3"),
        ];
        for (f, want) in cases {
            let mut out = String::new();
            write_float(&mut out, f);
            assert_eq!(out, want, "{f}");
        }
    }
}
