//! Orion's JEXL transformations (`value|name(args)`), as its manual lists
//! them (section "Available Transformations").
//!
//! Each transformation gets the subject first and its arguments after.
//! Where the manual says a transformation gives `null` (`indexOf` of a
//! missing string, `substring` with bad bounds, `mapper` without a match,
//! `arrSum` of a non-numeric array, …) it returns `null`; an input of the
//! wrong kind (`uppercase` of a number) is an error, which makes the whole
//! expression `null` through the fail-safe of [`super::evaluate`].

use std::sync::OnceLock;

use jexl_eval::Evaluator;
use regex::Regex;
use serde_json::{Number, Value};

/// Why a transformation could not apply (the expression becomes `null`).
#[derive(Debug, thiserror::Error)]
#[error("transformation {name}: {reason}")]
pub struct TransformError {
    name: &'static str,
    reason: &'static str,
}

type Outcome = Result<Value, TransformError>;

/// A transformation: its name in expressions and its function.
type Transform = (&'static str, fn(&[Value]) -> Outcome);

/// Every transformation Orion documents.
const TRANSFORMS: &[Transform] = &[
    ("uppercase", uppercase),
    ("lowercase", lowercase),
    ("split", split),
    ("indexOf", index_of),
    ("len", len),
    ("trim", trim),
    ("substring", substring),
    ("includes", includes),
    ("isNaN", is_nan),
    ("parseInt", parse_int),
    ("parseFloat", parse_float),
    ("typeOf", type_of),
    ("toString", to_string),
    ("toJson", to_json),
    ("floor", floor),
    ("ceil", ceil),
    ("round", round),
    ("toFixed", to_fixed),
    ("log", log),
    ("log10", log10),
    ("log2", log2),
    ("sqrt", sqrt),
    ("replaceStr", replace_str),
    ("replaceRegex", replace_regex),
    ("matchRegex", match_regex),
    ("mapper", mapper),
    ("thMapper", th_mapper),
    ("nMapper", n_mapper),
    ("values", values),
    ("keys", keys),
    ("arrSum", arr_sum),
    ("arrAvg", arr_avg),
    ("arrMax", arr_max),
    ("arrMin", arr_min),
    ("arrMed", arr_med),
    ("arrSort", arr_sort),
    ("arrReverse", arr_reverse),
    ("now", now),
    ("toIsoString", to_iso_string),
    ("getTime", get_time),
];

/// The names of every transformation, for documentation and tests.
pub fn names() -> impl Iterator<Item = &'static str> {
    TRANSFORMS.iter().map(|(name, _)| *name)
}

/// The evaluator with Orion's transformations, built once: registering
/// forty closures per notification would cost more than evaluating.
pub fn evaluator() -> &'static Evaluator<'static> {
    static EVALUATOR: OnceLock<Evaluator<'static>> = OnceLock::new();
    EVALUATOR.get_or_init(|| {
        TRANSFORMS
            .iter()
            .fold(Evaluator::new(), |evaluator, (name, f)| {
                let f = *f;
                evaluator.with_transform(name, move |args: &[Value]| f(args).map_err(Into::into))
            })
    })
}

fn fail(name: &'static str, reason: &'static str) -> TransformError {
    TransformError { name, reason }
}

fn subject(args: &[Value]) -> &Value {
    args.first().unwrap_or(&Value::Null)
}

fn arg(args: &[Value], i: usize) -> &Value {
    args.get(i).unwrap_or(&Value::Null)
}

fn text<'a>(name: &'static str, v: &'a Value) -> Result<&'a str, TransformError> {
    v.as_str().ok_or_else(|| fail(name, "expects a string"))
}

fn number(name: &'static str, v: &Value) -> Result<f64, TransformError> {
    v.as_f64().ok_or_else(|| fail(name, "expects a number"))
}

fn float(f: f64) -> Value {
    Number::from_f64(f)
        .map(Value::Number)
        .unwrap_or(Value::Null)
}

fn uppercase(args: &[Value]) -> Outcome {
    Ok(text("uppercase", subject(args))?.to_uppercase().into())
}

fn lowercase(args: &[Value]) -> Outcome {
    Ok(text("lowercase", subject(args))?.to_lowercase().into())
}

fn split(args: &[Value]) -> Outcome {
    let s = text("split", subject(args))?;
    let sep = text("split", arg(args, 1))?;
    Ok(Value::Array(
        s.split(sep).map(|p| Value::String(p.into())).collect(),
    ))
}

fn index_of(args: &[Value]) -> Outcome {
    let s = text("indexOf", subject(args))?;
    let needle = text("indexOf", arg(args, 1))?;
    Ok(match s.find(needle) {
        Some(byte) => Value::from(s[..byte].chars().count()),
        None => Value::Null,
    })
}

fn len(args: &[Value]) -> Outcome {
    Ok(Value::from(text("len", subject(args))?.chars().count()))
}

fn trim(args: &[Value]) -> Outcome {
    Ok(text("trim", subject(args))?.trim().into())
}

fn substring(args: &[Value]) -> Outcome {
    let s = text("substring", subject(args))?;
    let (Some(from), Some(to)) = (arg(args, 1).as_f64(), arg(args, 2).as_f64()) else {
        return Ok(Value::Null);
    };
    let chars: Vec<char> = s.chars().collect();
    if !(from.is_finite() && to.is_finite()) || from < 0.0 || to < from || to > chars.len() as f64 {
        return Ok(Value::Null);
    }
    Ok(chars[from as usize..to as usize]
        .iter()
        .collect::<String>()
        .into())
}

fn includes(args: &[Value]) -> Outcome {
    let s = text("includes", subject(args))?;
    let needle = text("includes", arg(args, 1))?;
    Ok(s.contains(needle).into())
}

/// JavaScript's `isNaN`: numbers and numeric strings are numbers.
fn is_nan(args: &[Value]) -> Outcome {
    let numeric = match subject(args) {
        Value::Number(_) => true,
        Value::String(s) => s.trim().parse::<f64>().is_ok_and(f64::is_finite),
        _ => false,
    };
    Ok((!numeric).into())
}

/// The longest numeric prefix of `s` (after leading blanks), as
/// JavaScript's `parseInt`/`parseFloat` read it.
fn numeric_prefix(s: &str, fraction: bool) -> Option<f64> {
    let s = s.trim_start();
    let bytes = s.as_bytes();
    let mut end = 0;
    if matches!(bytes.first(), Some(b'+' | b'-')) {
        end = 1;
    }
    let digits_start = end;
    while end < bytes.len() && bytes[end].is_ascii_digit() {
        end += 1;
    }
    let mut has_digits = end > digits_start;
    if fraction && end < bytes.len() && bytes[end] == b'.' {
        let mut e = end + 1;
        while e < bytes.len() && bytes[e].is_ascii_digit() {
            e += 1;
        }
        if e > end + 1 {
            has_digits = true;
        }
        end = e;
        if has_digits && e < bytes.len() && matches!(bytes[e], b'e' | b'E') {
            let mut x = e + 1;
            if x < bytes.len() && matches!(bytes[x], b'+' | b'-') {
                x += 1;
            }
            let exp_start = x;
            while x < bytes.len() && bytes[x].is_ascii_digit() {
                x += 1;
            }
            if x > exp_start {
                end = x;
            }
        }
    }
    if !has_digits {
        return None;
    }
    s[..end].parse::<f64>().ok()
}

fn parse_int(args: &[Value]) -> Outcome {
    Ok(match subject(args) {
        Value::Number(n) => float(n.as_f64().unwrap_or(0.0).trunc()),
        Value::String(s) => numeric_prefix(s, false).map(float).unwrap_or(Value::Null),
        _ => return Err(fail("parseInt", "expects a string")),
    })
}

fn parse_float(args: &[Value]) -> Outcome {
    Ok(match subject(args) {
        Value::Number(n) => Value::Number(n.clone()),
        Value::String(s) => numeric_prefix(s, true).map(float).unwrap_or(Value::Null),
        _ => return Err(fail("parseFloat", "expects a string")),
    })
}

fn type_of(args: &[Value]) -> Outcome {
    Ok(match subject(args) {
        Value::Null => "Null",
        Value::Bool(_) => "Boolean",
        Value::Number(_) => "Number",
        Value::String(_) => "String",
        Value::Array(_) => "Array",
        Value::Object(_) => "Object",
    }
    .into())
}

fn to_string(args: &[Value]) -> Outcome {
    Ok(super::as_text(subject(args)).into())
}

fn to_json(args: &[Value]) -> Outcome {
    let s = text("toJson", subject(args))?;
    Ok(serde_json::from_str(s).unwrap_or(Value::Null))
}

fn unary(name: &'static str, args: &[Value], f: fn(f64) -> f64) -> Outcome {
    Ok(float(f(number(name, subject(args))?)))
}

fn floor(args: &[Value]) -> Outcome {
    unary("floor", args, f64::floor)
}

fn ceil(args: &[Value]) -> Outcome {
    unary("ceil", args, f64::ceil)
}

fn round(args: &[Value]) -> Outcome {
    unary("round", args, f64::round)
}

fn log(args: &[Value]) -> Outcome {
    unary("log", args, f64::ln)
}

fn log10(args: &[Value]) -> Outcome {
    unary("log10", args, f64::log10)
}

fn log2(args: &[Value]) -> Outcome {
    unary("log2", args, f64::log2)
}

fn sqrt(args: &[Value]) -> Outcome {
    unary("sqrt", args, f64::sqrt)
}

fn to_fixed(args: &[Value]) -> Outcome {
    let x = number("toFixed", subject(args))?;
    let digits = number("toFixed", arg(args, 1))?.clamp(0.0, 15.0) as i32;
    let scale = 10f64.powi(digits);
    Ok(float((x * scale).round() / scale))
}

fn replace_str(args: &[Value]) -> Outcome {
    let s = text("replaceStr", subject(args))?;
    let from = text("replaceStr", arg(args, 1))?;
    let to = text("replaceStr", arg(args, 2))?;
    Ok(s.replace(from, to).into())
}

fn replace_regex(args: &[Value]) -> Outcome {
    let s = text("replaceRegex", subject(args))?;
    let Ok(re) = Regex::new(text("replaceRegex", arg(args, 1))?) else {
        return Ok(Value::Null);
    };
    let to = text("replaceRegex", arg(args, 2))?;
    Ok(re.replace_all(s, regex::NoExpand(to)).into_owned().into())
}

fn match_regex(args: &[Value]) -> Outcome {
    let s = text("matchRegex", subject(args))?;
    let Ok(re) = Regex::new(text("matchRegex", arg(args, 1))?) else {
        return Ok(Value::Null);
    };
    Ok(Value::Array(
        re.find_iter(s)
            .map(|m| Value::String(m.as_str().into()))
            .collect(),
    ))
}

/// `mapper(values, choices)`: the choice at the position of the subject
/// among the values (equal lengths, string subject).
fn mapper(args: &[Value]) -> Outcome {
    let (Value::String(_), Some(values), Some(choices)) = (
        subject(args),
        arg(args, 1).as_array(),
        arg(args, 2).as_array(),
    ) else {
        return Ok(Value::Null);
    };
    if values.len() != choices.len() {
        return Ok(Value::Null);
    }
    Ok(values
        .iter()
        .position(|v| v == subject(args))
        .map(|i| choices[i].clone())
        .unwrap_or(Value::Null))
}

/// `thMapper(thresholds, choices)`: with thresholds `t1 < t2 < …`, the
/// first choice below `t1`, the second in `[t1, t2)`, …, the last at or
/// above the last threshold (one more choice than thresholds).
fn th_mapper(args: &[Value]) -> Outcome {
    let (Some(x), Some(thresholds), Some(choices)) = (
        subject(args).as_f64(),
        arg(args, 1).as_array(),
        arg(args, 2).as_array(),
    ) else {
        return Ok(Value::Null);
    };
    if choices.len() != thresholds.len() + 1 {
        return Ok(Value::Null);
    }
    let Some(thresholds) = thresholds
        .iter()
        .map(Value::as_f64)
        .collect::<Option<Vec<f64>>>()
    else {
        return Ok(Value::Null);
    };
    let i = thresholds.iter().take_while(|t| x >= **t).count();
    Ok(choices[i].clone())
}

/// `nMapper(choices)`: the choice at the (integral) position given by the
/// subject.
fn n_mapper(args: &[Value]) -> Outcome {
    let (Some(x), Some(choices)) = (subject(args).as_f64(), arg(args, 1).as_array()) else {
        return Ok(Value::Null);
    };
    if x < 0.0 || x.fract() != 0.0 {
        return Ok(Value::Null);
    }
    Ok(choices.get(x as usize).cloned().unwrap_or(Value::Null))
}

fn values(args: &[Value]) -> Outcome {
    Ok(match subject(args) {
        Value::Object(m) => Value::Array(m.values().cloned().collect()),
        _ => Value::Null,
    })
}

fn keys(args: &[Value]) -> Outcome {
    Ok(match subject(args) {
        Value::Object(m) => Value::Array(m.keys().map(|k| Value::String(k.clone())).collect()),
        _ => Value::Null,
    })
}

/// The numbers of a non-empty numeric array (`None` otherwise).
fn numbers(v: &Value) -> Option<Vec<f64>> {
    let items = v.as_array().filter(|a| !a.is_empty())?;
    items.iter().map(Value::as_f64).collect()
}

fn arr_sum(args: &[Value]) -> Outcome {
    Ok(numbers(subject(args))
        .map(|n| float(n.iter().sum()))
        .unwrap_or(Value::Null))
}

fn arr_avg(args: &[Value]) -> Outcome {
    Ok(numbers(subject(args))
        .map(|n| float(n.iter().sum::<f64>() / n.len() as f64))
        .unwrap_or(Value::Null))
}

fn arr_max(args: &[Value]) -> Outcome {
    Ok(numbers(subject(args))
        .map(|n| float(n.into_iter().fold(f64::NEG_INFINITY, f64::max)))
        .unwrap_or(Value::Null))
}

fn arr_min(args: &[Value]) -> Outcome {
    Ok(numbers(subject(args))
        .map(|n| float(n.into_iter().fold(f64::INFINITY, f64::min)))
        .unwrap_or(Value::Null))
}

/// The median: the middle item, or the mean of the two middle ones.
fn arr_med(args: &[Value]) -> Outcome {
    Ok(numbers(subject(args))
        .map(|mut n| {
            n.sort_by(f64::total_cmp);
            let mid = n.len() / 2;
            if n.len() % 2 == 0 {
                float((n[mid - 1] + n[mid]) / 2.0)
            } else {
                float(n[mid])
            }
        })
        .unwrap_or(Value::Null))
}

/// Sorts an array of numbers or of strings (a mixed one is `null`).
fn arr_sort(args: &[Value]) -> Outcome {
    let Some(items) = subject(args).as_array() else {
        return Ok(Value::Null);
    };
    if let Some(mut n) = items
        .iter()
        .map(Value::as_f64)
        .collect::<Option<Vec<f64>>>()
    {
        n.sort_by(f64::total_cmp);
        return Ok(Value::Array(n.into_iter().map(float).collect()));
    }
    if let Some(mut s) = items.iter().map(Value::as_str).collect::<Option<Vec<_>>>() {
        s.sort_unstable();
        return Ok(Value::Array(
            s.into_iter().map(|x| Value::String(x.into())).collect(),
        ));
    }
    Ok(Value::Null)
}

fn arr_reverse(args: &[Value]) -> Outcome {
    Ok(match subject(args) {
        Value::Array(items) => Value::Array(items.iter().rev().cloned().collect()),
        _ => Value::Null,
    })
}

/// Seconds since the epoch, plus the subject (an offset in seconds).
fn now(args: &[Value]) -> Outcome {
    let offset = number("now", subject(args))?;
    let now = crate::now_ms() as f64 / 1000.0;
    Ok(float(now.floor() + offset))
}

/// Epoch seconds to ISO 8601 (`2024-07-10T10:22:29+00:00`).
fn to_iso_string(args: &[Value]) -> Outcome {
    let secs = number("toIsoString", subject(args))?;
    let ms = (secs * 1000.0).round() as i64;
    let Some(t) = chrono::DateTime::from_timestamp_millis(ms) else {
        return Ok(Value::Null);
    };
    Ok(t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, false)
        .into())
}

/// ISO 8601 to epoch seconds.
fn get_time(args: &[Value]) -> Outcome {
    let s = text("getTime", subject(args))?;
    Ok(crate::ngsi::parse_datetime(s)
        .map(|ms| float(ms as f64 / 1000.0))
        .unwrap_or(Value::Null))
}

#[cfg(test)]
mod tests {
    use crate::jexl::evaluate;
    use serde_json::{json, Map, Value};

    fn eval(expr: &str, context: Value) -> Value {
        let ctx: Map<String, Value> = context.as_object().cloned().unwrap();
        evaluate(expr, &ctx)
    }

    /// The examples of Orion's manual, one per transformation (its inputs
    /// include 3.14, which is not meant as π).
    #[test]
    #[allow(clippy::approx_constant)]
    fn orion_manual_examples() {
        let cases: &[(&str, Value, Value)] = &[
            ("c|uppercase", json!({"c": "fooBAR"}), json!("FOOBAR")),
            ("c|lowercase", json!({"c": "fooBAR"}), json!("foobar")),
            (
                "c|split(',')",
                json!({"c": "foo,bar,zzz"}),
                json!(["foo", "bar", "zzz"]),
            ),
            ("c|indexOf('xy')", json!({"c": "fooxybar"}), json!(3)),
            ("c|len", json!({"c": "foobar"}), json!(6)),
            ("c|trim", json!({"c": "  foo  bar  "}), json!("foo  bar")),
            ("c|substring(3,5)", json!({"c": "foobar"}), json!("ba")),
            ("c|includes('ba')", json!({"c": "foobar"}), json!(true)),
            ("c|isNaN", json!({"c": "foobar"}), json!(true)),
            ("c|parseInt", json!({"c": "25"}), json!(25)),
            ("c|parseFloat", json!({"c": "25.33"}), json!(25.33)),
            ("c|typeOf", json!({"c": 23}), json!("Number")),
            ("c|toString", json!({"c": 23}), json!("23")),
            ("c|toJson", json!({"c": "[1,2]"}), json!([1, 2])),
            ("c|floor", json!({"c": 3.14}), json!(3)),
            ("c|ceil", json!({"c": 3.14}), json!(4)),
            ("c|round", json!({"c": 3.14}), json!(3)),
            ("c|toFixed(1)", json!({"c": 3.18}), json!(3.2)),
            ("c|log", json!({"c": 3.14}), json!(1.1442228)),
            ("c|log10", json!({"c": 3.14}), json!(0.496929648)),
            ("c|log2", json!({"c": 3.14}), json!(1.650764559)),
            ("c|sqrt", json!({"c": 3.14}), json!(1.772004515)),
            (
                "c|replaceStr('o','u')",
                json!({"c": "foobar"}),
                json!("fuubar"),
            ),
            (
                "c|replaceRegex('\\d+','X')",
                json!({"c": "aba1234aba786aba"}),
                json!("abaXabaXaba"),
            ),
            (
                "c|matchRegex('\\d+')",
                json!({"c": "abc1234fgh897hyt"}),
                json!(["1234", "897"]),
            ),
            (
                "c|mapper(values,choices)",
                json!({"c": "fr", "values": ["es", "fr", "de"], "choices": ["Spain", "France", "Germany"]}),
                json!("France"),
            ),
            (
                "c|thMapper(values,choices)",
                json!({"c": 0.5, "values": [-1, 1], "choices": ["low", "medium", "high"]}),
                json!("medium"),
            ),
            (
                "c|values",
                json!({"c": {"x": 1, "y": "foo"}}),
                json!([1, "foo"]),
            ),
            (
                "c|keys",
                json!({"c": {"x": 1, "y": "foo"}}),
                json!(["x", "y"]),
            ),
            ("c|arrSum", json!({"c": [1, 5]}), json!(6)),
            ("c|arrAvg", json!({"c": [1, 5]}), json!(3)),
            (
                "c|toIsoString",
                json!({"c": 1720606949}),
                json!("2024-07-10T10:22:29+00:00"),
            ),
            (
                "c|getTime",
                json!({"c": "2024-07-10T10:22:29+00:00"}),
                json!(1720606949),
            ),
        ];
        for (expr, ctx, want) in cases {
            assert_eq!(&eval(expr, ctx.clone()), want, "{expr}");
        }
    }

    #[test]
    fn null_results_the_manual_documents() {
        assert_eq!(eval("c|indexOf('zz')", json!({"c": "foo"})), json!(null));
        assert_eq!(eval("c|substring(3,10)", json!({"c": "foo"})), json!(null));
        assert_eq!(eval("c|substring(2,1)", json!({"c": "foo"})), json!(null));
        assert_eq!(eval("c|toJson", json!({"c": "[1,"})), json!(null));
        assert_eq!(eval("c|matchRegex('[')", json!({"c": "a"})), json!(null));
        assert_eq!(eval("c|matchRegex('z')", json!({"c": "a"})), json!([]));
        assert_eq!(
            eval("c|mapper(['a'],['x','y'])", json!({"c": "a"})),
            json!(null)
        );
        assert_eq!(
            eval("c|mapper(['a'],['x'])", json!({"c": "b"})),
            json!(null)
        );
        assert_eq!(eval("c|thMapper([1],['x'])", json!({"c": 2})), json!(null));
        assert_eq!(
            eval("c|thMapper(['a'],['x','y'])", json!({"c": 2})),
            json!(null)
        );
        assert_eq!(eval("c|keys", json!({"c": 1})), json!(null));
        assert_eq!(eval("c|values", json!({"c": "x"})), json!(null));
        assert_eq!(eval("c|arrSum", json!({"c": [1, "a"]})), json!(null));
        assert_eq!(eval("c|arrAvg", json!({"c": []})), json!(null));
        assert_eq!(eval("c|arrSum", json!({"c": 3})), json!(null));
    }

    #[test]
    fn wrong_input_fails_the_expression() {
        assert_eq!(eval("c|uppercase", json!({"c": 1})), json!(null));
        assert_eq!(eval("c|floor", json!({"c": "x"})), json!(null));
        // `||` takes a failed left side as false.
        // `||` takes a failed left side as false.
        assert_eq!(
            eval("(c|uppercase)||'fallback'", json!({"c": 1})),
            json!("fallback")
        );
    }

    #[test]
    fn more_transformations() {
        // No unary minus in literals: `0-1`.
        assert_eq!(
            eval("c|thMapper([0-1,1],['l','m','h'])", json!({"c": -5})),
            json!("l")
        );
        assert_eq!(
            eval("c|thMapper([0-1,1],['l','m','h'])", json!({"c": 1})),
            json!("h")
        );
        assert_eq!(eval("c|nMapper(['a','b'])", json!({"c": 1})), json!("b"));
        assert_eq!(eval("c|nMapper(['a','b'])", json!({"c": 2})), json!(null));
        assert_eq!(eval("c|arrMax", json!({"c": [3, 9, 1]})), json!(9));
        assert_eq!(eval("c|arrMin", json!({"c": [3, 9, 1]})), json!(1));
        assert_eq!(eval("c|arrMed", json!({"c": [3, 9, 1]})), json!(3));
        assert_eq!(eval("c|arrMed", json!({"c": [3, 9, 1, 5]})), json!(4));
        assert_eq!(eval("c|arrSort", json!({"c": [3, 9, 1]})), json!([1, 3, 9]));
        assert_eq!(
            eval("c|arrSort", json!({"c": ["b", "a"]})),
            json!(["a", "b"])
        );
        assert_eq!(eval("c|arrSort", json!({"c": ["b", 1]})), json!(null));
        assert_eq!(
            eval("c|arrReverse", json!({"c": [1, "a"]})),
            json!(["a", 1])
        );
        assert_eq!(eval("c|parseInt", json!({"c": "10 m/s"})), json!(10));
        assert_eq!(eval("c|parseFloat", json!({"c": "-2.5e2x"})), json!(-250));
        assert_eq!(eval("c|parseInt", json!({"c": "abc"})), json!(null));
        assert_eq!(eval("c|isNaN", json!({"c": "12"})), json!(false));
        assert_eq!(eval("c|isNaN", json!({"c": 12})), json!(false));
        assert_eq!(eval("c|typeOf", json!({"c": "x"})), json!("String"));
        assert_eq!(eval("c|typeOf", json!({"c": [1]})), json!("Array"));
        assert_eq!(eval("c|typeOf", json!({"c": {}})), json!("Object"));
        assert_eq!(eval("c|typeOf", json!({"c": true})), json!("Boolean"));
        assert_eq!(
            eval("c|toString", json!({"c": {"a": 1}})),
            json!("{\"a\":1}")
        );
        assert_eq!(eval("(1+1)|toString", json!({})), json!("2"));
        assert_eq!(
            eval("c|replaceRegex('o','$1')", json!({"c": "foo"})),
            json!("f$1$1")
        );
        assert_eq!(
            eval("c|toIsoString", json!({"c": 0.5})),
            json!("1970-01-01T00:00:00.500+00:00")
        );
        assert_eq!(eval("c|getTime", json!({"c": "not a date"})), json!(null));
    }

    #[test]
    fn now_adds_the_offset_to_the_current_time() {
        let before = crate::now_ms() / 1000;
        let got = eval("60|now", json!({})).as_i64().unwrap();
        let after = crate::now_ms() / 1000;
        assert!(got >= before + 60 && got <= after + 60, "{got}");
    }

    #[test]
    fn every_transformation_is_registered() {
        for name in super::names() {
            // An unknown transformation fails before its input is looked at;
            // a known one given `null` fails (or not) inside itself.
            let expr = format!("null|{name}");
            let e = super::evaluator().eval(&expr);
            let unknown = matches!(
                e,
                Err(jexl_eval::error::EvaluationError::UnknownTransform(_))
            );
            assert!(!unknown, "{name} is not registered");
        }
    }
}
