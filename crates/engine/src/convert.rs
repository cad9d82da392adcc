//! Moving values across the sandbox wall: JSON into JavaScript for a call's
//! arguments, JavaScript back to JSON for its result, and a thrown value
//! into a [`CodecError`] a user can read.
//!
//! Both directions build values directly, with no JSON text in between:
//! measured on the em300th codec, `JSON.stringify` plus serde_json took
//! about 40% of a decode. Results keep JSON's rules (`toJSON`, dropped
//! `undefined`, `NaN` as `null`, cycles rejected) by handing anything but
//! plain data to QuickJS's own `JSON.stringify`.

use rquickjs::function::This;
use rquickjs::{Array, Ctx, Function, Object, Type, Value};
use serde_json::Value as Json;

use crate::worker::Fault;
use crate::CodecError;

/// Builds TTN's `{bytes: number[], fPort: number, recvTime: Date}` plus
/// ChirpStack's `variables`; the object itself is made by the context's
/// `make_input` helper.
pub(crate) fn uplink_input<'js>(
    ctx: &Ctx<'js>,
    bytes: &[u8],
    f_port: u32,
    recv_time_ms: i64,
    variables: Value<'js>,
    make_input: &Function<'js>,
) -> rquickjs::Result<Value<'js>> {
    let array = Array::new(ctx.clone())?;
    for (index, byte) in bytes.iter().enumerate() {
        array.set(index, i32::from(*byte))?;
    }
    make_input.call((array, f_port, recv_time_ms as f64, variables))
}

/// Builds the JS value of a JSON value.
pub(crate) fn to_js<'js>(ctx: &Ctx<'js>, json: &Json) -> rquickjs::Result<Value<'js>> {
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

/// How deep the direct walk goes before leaving the value to
/// `JSON.stringify`, which reports cycles with a proper `TypeError`.
const MAX_DEPTH: usize = 64;

/// Converts a returned value to JSON, with `JSON.stringify`'s meaning.
/// `undefined` (a function that returns nothing) becomes `null`.
///
/// Plain objects, arrays and primitives — what codecs return — are read
/// directly, which is several times faster than stringifying and parsing
/// text. `toJSON` methods are called as `JSON.stringify` calls them; other
/// objects with JSON rules of their own (boxed primitives, anything whose
/// prototype is not `Object.prototype`) and values nested deeper than
/// [`MAX_DEPTH`] (perhaps a cycle) go through QuickJS's `JSON.stringify`,
/// so the result is the same either way. `object_prototype` is the
/// context's own `Object.prototype`.
///
/// `undefined` says what an object property holding `undefined` becomes:
/// JSON leaves it out ([`Undefined::Omit`], for rules); The Things Stack's
/// codec engine renders it as `null` ([`Undefined::Null`], for codecs), so
/// a decoder's `{temperature: undefined}` keeps its key.
pub(crate) fn to_json<'js>(
    ctx: &Ctx<'js>,
    value: Value<'js>,
    object_prototype: &Object<'js>,
    undefined: Undefined,
) -> Result<Json, Fault> {
    let walker = Walker {
        object_prototype,
        undefined,
    };
    match walker.walk(ctx, &value, Key::Name(""), 0) {
        Ok(json) => Ok(json.unwrap_or(Json::Null)),
        Err(Walk::Js(error)) => Err(Fault::Js(error)),
        Err(Walk::Bail) => stringify(ctx, value),
    }
}

/// What an object property holding `undefined` becomes in a result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Undefined {
    /// Left out, as `JSON.stringify` does.
    Omit,
    /// `null`, as The Things Stack renders a codec's output.
    Null,
}

/// The fixed parts of one conversion.
struct Walker<'a, 'js> {
    /// The context's own `Object.prototype`, which tells plain objects.
    object_prototype: &'a Object<'js>,
    /// What `undefined` properties become.
    undefined: Undefined,
}

/// Why the direct walk stopped.
enum Walk {
    /// A getter or `toJSON` threw, or the script was interrupted.
    Js(rquickjs::Error),
    /// The value is deeper than [`MAX_DEPTH`] or holds text that is not
    /// valid Unicode; `JSON.stringify` decides.
    Bail,
}

impl From<rquickjs::Error> for Walk {
    fn from(error: rquickjs::Error) -> Walk {
        match error {
            rquickjs::Error::Exception => Walk::Js(error),
            _ => Walk::Bail,
        }
    }
}

impl From<Fault> for Walk {
    fn from(fault: Fault) -> Walk {
        match fault {
            Fault::Js(error) => Walk::Js(error),
            _ => Walk::Bail,
        }
    }
}

/// The key a value sits under, passed to its `toJSON` as JSON.stringify does.
#[derive(Clone, Copy)]
enum Key<'a> {
    Name(&'a str),
    Index(usize),
}

impl<'js> Walker<'_, 'js> {
    /// One step of the direct conversion; `None` is a value JSON leaves out
    /// (`undefined`, a function, a symbol).
    fn walk(
        &self,
        ctx: &Ctx<'js>,
        value: &Value<'js>,
        key: Key<'_>,
        depth: usize,
    ) -> Result<Option<Json>, Walk> {
        let object_prototype = self.object_prototype;
        if depth > MAX_DEPTH {
            return Err(Walk::Bail);
        }
        let mut value = value.clone();
        if let Some(object) = value.as_object() {
            let to_json: Value = object.get("toJSON")?;
            if let Some(to_json) = to_json.as_function() {
                let key = match key {
                    Key::Name(name) => name.to_string(),
                    Key::Index(index) => index.to_string(),
                };
                value = to_json.call((This(object.clone()), key))?;
            }
        }
        let json = match value.type_of() {
            Type::Undefined | Type::Symbol | Type::Function | Type::Constructor => return Ok(None),
            Type::Null => Json::Null,
            Type::Bool => Json::Bool(value.as_bool().unwrap_or(false)),
            Type::Int => Json::from(value.as_int().unwrap_or(0)),
            Type::Float => number(value.as_float().unwrap_or(f64::NAN)),
            Type::String => Json::String(value.get::<String>()?),
            Type::Array => {
                let array = value.as_array().ok_or(Walk::Bail)?;
                let mut items = Vec::with_capacity(array.len());
                for index in 0..array.len() {
                    let item: Value = array.get(index)?;
                    let json = self.walk(ctx, &item, Key::Index(index), depth + 1)?;
                    items.push(json.unwrap_or(Json::Null));
                }
                Json::Array(items)
            }
            Type::Object if is_plain(value.as_object().ok_or(Walk::Bail)?, object_prototype) => {
                let object = value.as_object().ok_or(Walk::Bail)?;
                let mut map = serde_json::Map::new();
                for property in object.props::<String, Value>() {
                    let (name, item) = property?;
                    match self.walk(ctx, &item, Key::Name(&name), depth + 1)? {
                        Some(json) => {
                            map.insert(name, json);
                        }
                        None if self.undefined == Undefined::Null && item.is_undefined() => {
                            map.insert(name, Json::Null);
                        }
                        None => {}
                    }
                }
                Json::Object(map)
            }
            // Boxed primitives, class instances, errors, BigInts, proxies:
            // JSON.stringify knows best.
            _ => return stringify_omittable(ctx, value).map_err(Walk::from),
        };
        Ok(Some(json))
    }
}

/// Whether `object` is a plain `{...}`, serialised as its own enumerable
/// properties and nothing else.
fn is_plain<'js>(object: &Object<'js>, object_prototype: &Object<'js>) -> bool {
    match object.get_prototype() {
        None => true,
        Some(prototype) => prototype == *object_prototype,
    }
}

/// A JS number as serde_json reads what JSON.stringify writes: integral
/// values below 1e21 are written without exponent (`-10`, not `-10.0`) and
/// read as integers where they fit; non-finite ones are `null`.
fn number(n: f64) -> Json {
    const TWO_POW_63: f64 = 9_223_372_036_854_775_808.0;
    const TWO_POW_64: f64 = 18_446_744_073_709_551_616.0;
    if n.is_finite() && n.fract() == 0.0 && n.abs() < 1e21 {
        if (-TWO_POW_63..TWO_POW_63).contains(&n) {
            return Json::from(n as i64);
        }
        if (0.0..TWO_POW_64).contains(&n) {
            return Json::from(n as u64);
        }
    }
    serde_json::Number::from_f64(n).map_or(Json::Null, Json::Number)
}

fn stringify_omittable<'js>(ctx: &Ctx<'js>, value: Value<'js>) -> Result<Option<Json>, Fault> {
    let Some(text) = ctx.json_stringify(value)? else {
        return Ok(None);
    };
    parse(&text.to_string()?).map(Some)
}

/// `JSON.stringify` then serde_json: the slow path with exact semantics.
fn stringify<'js>(ctx: &Ctx<'js>, value: Value<'js>) -> Result<Json, Fault> {
    Ok(stringify_omittable(ctx, value)?.unwrap_or(Json::Null))
}

fn parse(text: &str) -> Result<Json, Fault> {
    serde_json::from_str(text).map_err(|error| {
        Fault::Codec(CodecError::InvalidOutput(format!(
            "the returned value is not valid JSON: {error}"
        )))
    })
}

/// Describes a thrown value: an `Error` as `Name: message` plus its stack,
/// anything else as its text. QuickJS's "out of memory" becomes
/// [`CodecError::OutOfMemory`] whatever form it arrives in.
pub(crate) fn describe_thrown<'js>(
    ctx: &Ctx<'js>,
    thrown: Value<'js>,
    exhausted: bool,
) -> CodecError {
    // QuickJS throws `null` when it cannot even allocate the error object
    // for "out of memory", which happens only near the memory limit
    // (`exhausted`); anywhere else a `null` is the script's own `throw null`.
    if thrown.type_of() == rquickjs::Type::Uninitialized || (thrown.is_null() && exhausted) {
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
    // Reading `name` or `message` may itself have thrown (a hostile
    // getter); leave no exception pending for the next call.
    if ctx.has_exception() {
        let _ = ctx.catch();
    }
    // QuickJS's own texts ("out of memory", "out of memory in regexp
    // execution"), not any error that mentions memory.
    if message.starts_with("InternalError: out of memory") {
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
