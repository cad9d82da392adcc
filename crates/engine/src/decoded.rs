//! Reading a `decodeUplink` result the way TTN and ChirpStack do:
//! `{data: {...}, warnings?: [...], errors?: [...]}`. Kept apart from the
//! worker so the rule "non-empty `errors` fails the uplink" lives in one
//! place and is testable without running any JavaScript.

use serde_json::{Map, Value};

use crate::CodecError;

/// The useful part of a successful `decodeUplink` result.
#[derive(Clone, Debug, PartialEq)]
pub struct Decoded {
    /// The decoded fields, handed to the processor's mappings.
    pub data: Map<String, Value>,
    /// Problems the codec noticed but decoded through; kept with the data
    /// unit so users can see them, never a reason to drop the uplink.
    pub warnings: Vec<String>,
}

/// Turns what `decodeUplink` returned into [`Decoded`], or the error that
/// marks the uplink failed.
///
/// A non-empty `errors` array gives [`CodecError::Reported`] (even if `data`
/// is present, as in ChirpStack); a missing or non-object `data` gives
/// [`CodecError::InvalidOutput`].
pub fn interpret_decode_uplink(returned: Value) -> Result<Decoded, CodecError> {
    let Value::Object(mut out) = returned else {
        return Err(no_data());
    };
    let errors = texts(out.remove("errors"));
    if !errors.is_empty() {
        return Err(CodecError::Reported(errors));
    }
    let warnings = texts(out.remove("warnings"));
    match out.remove("data") {
        Some(Value::Object(data)) => Ok(Decoded { data, warnings }),
        _ => Err(no_data()),
    }
}

fn no_data() -> CodecError {
    CodecError::InvalidOutput("decodeUplink returned no data object".into())
}

/// Reads `errors`/`warnings`: an array of strings in well-behaved codecs,
/// but a lone string or non-string entries are accepted rather than lost.
fn texts(value: Option<Value>) -> Vec<String> {
    let text = |v: Value| match v {
        Value::String(s) => s,
        other => other.to_string(),
    };
    match value {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items.into_iter().map(text).collect(),
        Some(Value::String(s)) if s.is_empty() => Vec::new(),
        Some(other) => vec![text(other)],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// `data` and `warnings` come through as they were returned.
    #[test]
    fn data_and_warnings() {
        let d = interpret_decode_uplink(json!({"data": {"a": 1}, "warnings": ["low battery"]}))
            .unwrap();
        assert_eq!(d.data, json!({"a": 1}).as_object().unwrap().clone());
        assert_eq!(d.warnings, vec!["low battery".to_string()]);
    }

    /// Non-empty `errors` wins over `data`; an empty array is no error.
    #[test]
    fn errors_fail_the_uplink() {
        assert_eq!(
            interpret_decode_uplink(json!({"data": {}, "errors": ["bad", 7]})),
            Err(CodecError::Reported(vec!["bad".into(), "7".into()]))
        );
        assert!(interpret_decode_uplink(json!({"data": {}, "errors": []})).is_ok());
    }

    /// No `data` object, or no object at all, is invalid output with a fixed text.
    #[test]
    fn missing_data() {
        let error = CodecError::InvalidOutput("decodeUplink returned no data object".into());
        let want = Err(error.clone());
        assert_eq!(interpret_decode_uplink(json!({"warnings": []})), want);
        assert_eq!(interpret_decode_uplink(json!({"data": 5})), want);
        assert_eq!(interpret_decode_uplink(Value::Null), want);
        assert_eq!(error.to_string(), "decodeUplink returned no data object");
    }
}
