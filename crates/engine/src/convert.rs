//! Moving values across the sandbox wall: JSON into JavaScript for a call's
//! arguments, JavaScript back to JSON for its result, and a thrown value
//! into a [`CodecError`] a user can read.
//!
//! Arguments are built as JS values directly (no text in between). Results
//! go through QuickJS's own `JSON.stringify` and serde_json, which gives
//! exactly JSON's rules (`toJSON`, dropped `undefined`, `NaN` as `null`,
//! cycles rejected) for free.

use rquickjs::function::Constructor;
use rquickjs::{Array, Ctx, Object, Value};

use crate::worker::Fault;
use crate::CodecError;

/// Builds TTN's `{bytes: number[], fPort: number, recvTime: Date}`.
pub(crate) fn uplink_input<'js>(
    ctx: &Ctx<'js>,
    bytes: &[u8],
    f_port: u32,
    recv_time_ms: i64,
    date: &Constructor<'js>,
) -> rquickjs::Result<Object<'js>> {
    let array = Array::new(ctx.clone())?;
    for (index, byte) in bytes.iter().enumerate() {
        array.set(index, i32::from(*byte))?;
    }
    let input = Object::new(ctx.clone())?;
    input.set("bytes", array)?;
    input.set("fPort", f_port)?;
    input.set("recvTime", date.construct::<_, Value>((recv_time_ms as f64,))?)?;
    Ok(input)
}

/// Builds the JS value of a JSON value.
pub(crate) fn to_js<'js>(ctx: &Ctx<'js>, json: &serde_json::Value) -> rquickjs::Result<Value<'js>> {
    use serde_json::Value as Json;
    Ok(match json {
        Json::Null => Value::new_null(ctx.clone()),
        Json::Bool(b) => Value::new_bool(ctx.clone(), *b),
        Json::Number(n) => match n.as_i64().and_then(|i| i32::try_from(i).ok()) {
            Some(i) => Value::new_int(ctx.clone(), i),
            None => Value::new_number(ctx.clone(), n.as_f64().unwrap_or(f64::NAN)),
        },
        Json::String(s) => rquickjs::String::from_str(ctx.clone(), s)?.into_value(),
        Json::Array(items) => {
            let array = Array::new(ctx.clone())?;
            for (index, item) in items.iter().enumerate() {
                array.set(index, to_js(ctx, item)?)?;
            }
            array.into_value()
        }
        Json::Object(map) => {
            let object = Object::new(ctx.clone())?;
            for (key, value) in map {
                object.set(key.as_str(), to_js(ctx, value)?)?;
            }
            object.into_value()
        }
    })
}

/// Converts a returned value to JSON. `undefined` (a function that returns
/// nothing) becomes `null`.
pub(crate) fn to_json<'js>(ctx: &Ctx<'js>, value: Value<'js>) -> Result<serde_json::Value, Fault> {
    let Some(text) = ctx.json_stringify(value)? else {
        return Ok(serde_json::Value::Null);
    };
    let text = text.to_string()?;
    serde_json::from_str(&text).map_err(|error| {
        Fault::Codec(CodecError::InvalidOutput(format!(
            "the returned value is not valid JSON: {error}"
        )))
    })
}

/// Describes a thrown value: an `Error` as `Name: message` plus its stack,
/// anything else as its text. QuickJS's "out of memory" becomes
/// [`CodecError::OutOfMemory`] whatever form it arrives in.
pub(crate) fn describe_thrown<'js>(ctx: &Ctx<'js>, thrown: Value<'js>) -> CodecError {
    if thrown.is_null() || thrown.type_of() == rquickjs::Type::Uninitialized {
        // QuickJS throws `null` when it cannot even allocate the error
        // object for "out of memory". (A script's own `throw null` reads the
        // same; it carries no message to show anyway.)
        return CodecError::OutOfMemory;
    }
    let (message, stack) = match thrown.as_exception() {
        Some(exception) => {
            let name: Option<String> = exception.get("name").ok();
            let text = exception.message().unwrap_or_default();
            let message = match name {
                Some(name) if !name.is_empty() && !text.is_empty() => format!("{name}: {text}"),
                Some(name) if !name.is_empty() => name,
                _ => text,
            };
            let stack = exception.stack().filter(|s| !s.trim().is_empty());
            (message, stack)
        }
        None => (thrown_text(ctx, thrown), None),
    };
    if message.contains("out of memory") {
        return CodecError::OutOfMemory;
    }
    CodecError::Exception { message, stack }
}

/// The text of a thrown non-Error: a string as itself, anything else as JSON
/// (so `throw {code: 1}` reads `{"code":1}`, not `[object Object]`).
fn thrown_text<'js>(ctx: &Ctx<'js>, thrown: Value<'js>) -> String {
    if let Some(text) = thrown.as_string().and_then(|s| s.to_string().ok()) {
        return text;
    }
    let type_name = thrown.type_name();
    match ctx.json_stringify(thrown) {
        Ok(Some(json)) => json.to_string().unwrap_or_else(|_| type_name.to_string()),
        _ => {
            // Clear whatever stringify threw.
            let _ = ctx.catch();
            type_name.to_string()
        }
    }
}
