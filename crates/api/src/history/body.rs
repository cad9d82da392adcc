//! The JSON bodies of QuantumLeap's `POST` endpoints (`/v2/notify`,
//! `/v2/op/query`), checked as QuantumLeap's request validation checks
//! them against its OpenAPI specification before its own code runs: a
//! JSON content type, a body that parses, then the schema's rules, each
//! refused with a problem JSON whose detail names the value as Python
//! prints it (`'x' is not of type 'array' - 'data'`).

use axum::http::{HeaderMap, StatusCode};
use serde_json::Value;
use weft_model::history::python;

use super::QlError;

/// The body as JSON: an empty body is `null` (whatever its content type),
/// a content type that is not JSON's is 415, a body that does not parse
/// is 400.
pub(super) fn json_body(headers: &HeaderMap, body: &[u8]) -> Result<Value, QlError> {
    if body.is_empty() {
        return Ok(Value::Null);
    }
    let content_type = headers
        .get(axum::http::header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default();
    if !is_json(&content_type) {
        return Err(QlError::Problem {
            status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
            title: "Unsupported Media Type",
            detail: format!("Invalid Content-type ({content_type}), expected JSON data"),
        });
    }
    serde_json::from_slice(body)
        .map_err(|_| QlError::bad_parameter("Request body is not valid JSON"))
}

/// Whether a content type is JSON's: `application/json` or
/// `application/…+json`, any case, any parameters.
fn is_json(content_type: &str) -> bool {
    let mime = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    mime.strip_prefix("application/")
        .is_some_and(|sub| sub == "json" || sub.ends_with("+json"))
}

/// `value` breaks the schema's `type` at `path` (dot-separated, `data.0`;
/// empty: the body itself).
pub(super) fn not_of_type(value: &Value, json_type: &str, path: &str) -> QlError {
    QlError::bad_parameter(format!(
        "{} is not of type '{json_type}'{}",
        python::repr(value),
        at(path)
    ))
}

/// The object at `path` lacks a property the schema requires.
pub(super) fn required(property: &str, path: &str) -> QlError {
    QlError::bad_parameter(format!(
        "{} is a required property{}",
        python::str_repr(property),
        at(path)
    ))
}

/// The ` - 'path'` suffix of a detail, none for the body itself.
fn at(path: &str) -> String {
    if path.is_empty() {
        String::new()
    } else {
        format!(" - {}", python::str_repr(path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn detail(e: QlError) -> (u16, String) {
        match e {
            QlError::Problem { status, detail, .. } => (status.as_u16(), detail),
            other => panic!("{other:?}"),
        }
    }

    fn headers(content_type: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("content-type", content_type.parse().unwrap());
        h
    }

    #[test]
    fn bodies_are_read_as_quantumleap_reads_them() {
        assert_eq!(json_body(&headers("text/plain"), b"").unwrap(), Value::Null);
        assert_eq!(
            detail(json_body(&headers("text/plain; charset=utf-8"), b"{}").unwrap_err()),
            (
                415,
                "Invalid Content-type (text/plain; charset=utf-8), expected JSON data".into()
            )
        );
        assert_eq!(
            detail(json_body(&HeaderMap::new(), b"{}").unwrap_err()),
            (415, "Invalid Content-type (), expected JSON data".into())
        );
        for ok in [
            "application/json",
            "Application/JSON",
            "application/ld+json",
            "application/json; charset=utf-8",
        ] {
            assert_eq!(json_body(&headers(ok), b"[1]").unwrap(), json!([1]), "{ok}");
        }
        assert_eq!(
            detail(json_body(&headers("application/json"), b"  ").unwrap_err()),
            (400, "Request body is not valid JSON".into())
        );
    }

    #[test]
    fn details_print_values_as_python_does() {
        assert_eq!(
            detail(not_of_type(&json!("x"), "array", "data")).1,
            "'x' is not of type 'array' - 'data'"
        );
        assert_eq!(
            detail(not_of_type(&json!("it's"), "array", "data")).1,
            "\"it's\" is not of type 'array' - 'data'"
        );
        assert_eq!(
            detail(not_of_type(&json!([1]), "object", "")).1,
            "[1] is not of type 'object'"
        );
        assert_eq!(
            detail(required("type", "data.0")).1,
            "'type' is a required property - 'data.0'"
        );
    }
}
