//! Reading a codec's result the way TTN and ChirpStack do:
//! `decodeUplink`'s (and `decodeDownlink`'s) `{data: {...}, warnings?:
//! [...], errors?: [...]}` and `encodeDownlink`'s `{bytes: [...], fPort?,
//! warnings?, errors?}`. Kept apart from the worker so the rule "non-empty
//! `errors` fails the call" lives in one place and is testable without
//! running any JavaScript.

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

/// The `errors` and `warnings` a codec returned, as it wrote them, for
/// answers that show them to the user (a dry run's 422 carries the codec's
/// own `errors` array). `None` when the result is not an object.
pub fn reported_problems(returned: &Value) -> Option<(Vec<String>, Vec<String>)> {
    let out = returned.as_object()?;
    Some((
        texts(out.get("errors").cloned()),
        texts(out.get("warnings").cloned()),
    ))
}

/// What a successful `encodeDownlink` (or legacy `Encoder`) produced.
#[derive(Clone, Debug, PartialEq)]
pub struct Encoded {
    /// The downlink's payload.
    pub bytes: Vec<u8>,
    /// The port the codec chose, if it chose one (it wins over the
    /// caller's, as on The Things Stack).
    pub f_port: Option<u32>,
    /// Problems the codec noticed but encoded through.
    pub warnings: Vec<String>,
}

/// Turns what `encodeDownlink` returned (`{bytes, fPort?, warnings?,
/// errors?}`) into [`Encoded`], or the error that refuses the downlink.
///
/// A non-empty `errors` array gives [`CodecError::Reported`]; `bytes` that
/// is not an array of numbers, or an `fPort` outside 1–223 (the LoRaWAN
/// application ports), gives [`CodecError::InvalidOutput`].
///
/// Each number in `bytes` becomes a byte as ChirpStack makes it (it reads
/// them as 64-bit floats and casts each to `u8`, Rust's saturating
/// conversion): the fraction is dropped and the value clamped to 0–255,
/// so `256` and `1000` give 255, `-1` gives 0 and `1.9` gives 1. A
/// `Buffer` returned as `bytes` (which arrives as its `toJSON` form,
/// `{type: "Buffer", data: [...]}`) is taken as its bytes.
pub fn interpret_encode_downlink(returned: Value) -> Result<Encoded, CodecError> {
    let Value::Object(mut out) = returned else {
        return Err(no_bytes());
    };
    let errors = texts(out.remove("errors"));
    if !errors.is_empty() {
        return Err(CodecError::Reported(errors));
    }
    let warnings = texts(out.remove("warnings"));
    let bytes = match out.remove("bytes") {
        Some(Value::Array(items)) => to_bytes(&items)?,
        Some(Value::Object(buffer))
            if buffer.get("type").and_then(Value::as_str) == Some("Buffer") =>
        {
            match buffer.get("data") {
                Some(Value::Array(items)) => to_bytes(items)?,
                _ => return Err(no_bytes()),
            }
        }
        _ => return Err(no_bytes()),
    };
    let f_port = match out.remove("fPort") {
        None | Some(Value::Null) => None,
        Some(port) => match port.as_u64() {
            Some(p @ 1..=223) => Some(p as u32),
            _ => {
                return Err(CodecError::InvalidOutput(format!(
                    "encodeDownlink returned fPort {port}, which must be 1-223"
                )))
            }
        },
    };
    Ok(Encoded {
        bytes,
        f_port,
        warnings,
    })
}

/// The bytes of an encoder's `bytes` array: numbers only, each cast to a
/// byte the saturating way (see [`interpret_encode_downlink`]).
fn to_bytes(items: &[Value]) -> Result<Vec<u8>, CodecError> {
    items
        .iter()
        .map(|v| match v.as_f64() {
            // `as` from a float truncates and saturates: 256.0 → 255, -1.0 → 0.
            Some(n) => Ok(n as u8),
            None => Err(CodecError::InvalidOutput(format!(
                "encodeDownlink returned {v} in bytes, which must be numbers"
            ))),
        })
        .collect()
}

fn no_bytes() -> CodecError {
    CodecError::InvalidOutput("encodeDownlink returned no bytes array".into())
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

    /// Encoder results: bytes are checked integers, the port is optional
    /// but must be an application port, errors refuse the downlink.
    #[test]
    fn encoder_results() {
        assert_eq!(
            interpret_encode_downlink(json!({"bytes": [1, 255], "fPort": 10, "warnings": ["w"]})),
            Ok(Encoded {
                bytes: vec![1, 255],
                f_port: Some(10),
                warnings: vec!["w".into()]
            })
        );
        assert_eq!(
            interpret_encode_downlink(json!({"bytes": []}))
                .unwrap()
                .f_port,
            None
        );
        // Out-of-range numbers are clamped as ChirpStack clamps them.
        assert_eq!(
            interpret_encode_downlink(json!({"bytes": [256, 1000, -1, -300, 1.5, 254.9, 0x1FF]}))
                .unwrap()
                .bytes,
            vec![255, 255, 0, 0, 1, 254, 255]
        );
        // Non-numbers are still refused.
        for bad in [json!("1"), json!(null), json!(true), json!([1]), json!({})] {
            assert_eq!(
                interpret_encode_downlink(json!({"bytes": [1, bad]})),
                Err(CodecError::InvalidOutput(format!(
                    "encodeDownlink returned {bad} in bytes, which must be numbers"
                )))
            );
        }
        // A Buffer's toJSON form is its bytes.
        assert_eq!(
            interpret_encode_downlink(json!({"bytes": {"type": "Buffer", "data": [1, 2]}}))
                .unwrap()
                .bytes,
            vec![1, 2]
        );
        assert!(matches!(
            interpret_encode_downlink(json!({"bytes": {"type": "Other", "data": [1]}})),
            Err(CodecError::InvalidOutput(_))
        ));
        assert!(matches!(
            interpret_encode_downlink(json!({"bytes": [1], "fPort": 0})),
            Err(CodecError::InvalidOutput(_))
        ));
        assert_eq!(
            interpret_encode_downlink(json!({"errors": ["unknown command"]})),
            Err(CodecError::Reported(vec!["unknown command".into()]))
        );
        assert_eq!(
            reported_problems(&json!({"errors": ["e"], "warnings": "w"})),
            Some((vec!["e".into()], vec!["w".into()]))
        );
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
