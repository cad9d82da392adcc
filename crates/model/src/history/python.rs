//! Python's `repr()` of JSON values, as QuantumLeap (a Python program)
//! writes them where clients see them: in the texts of its request
//! validation (`'x' is not of type 'array' - 'data'`) and in the
//! `"lat, lon"` texts of the `geo:point` values it stores
//! (`"41.0, 2.5"`, floats as Python prints them).

use serde_json::{Number, Value};

/// Python's `repr()` of the value Python's `json` module reads from
/// `value`: `None`, `True`, `1`, `1.5`, `'text'`, `[1, 'a']`,
/// `{'k': None}` (keys in the order given).
pub fn repr(value: &Value) -> String {
    let mut out = String::new();
    write_repr(&mut out, value);
    out
}

fn write_repr(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("None"),
        Value::Bool(true) => out.push_str("True"),
        Value::Bool(false) => out.push_str("False"),
        Value::Number(n) => out.push_str(&number_repr(n)),
        Value::String(s) => out.push_str(&str_repr(s)),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, item);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&str_repr(k));
                out.push_str(": ");
                write_repr(out, v);
            }
            out.push('}');
        }
    }
}

/// A JSON number as Python reads it: an integer when written without a
/// fraction or exponent, else a float.
fn number_repr(n: &Number) -> String {
    if n.is_i64() || n.is_u64() {
        n.to_string()
    } else {
        float_repr(n.as_f64().unwrap_or(f64::NAN))
    }
}

/// Python's `repr()` of a float: the shortest text that reads back as
/// the same float, with `.0` on whole numbers (`20.0`) and an exponent
/// below 1e-4 and from 1e16 on (`1e-07`, `1e+16`).
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.into();
    }
    // Rust's `{:e}` gives the same shortest digits: `-1.2345e-7`.
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    if !(-4..16).contains(&exp) {
        let (first, rest) = digits.split_at(1);
        let fraction = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let exp_sign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{first}{fraction}e{exp_sign}{:02}", exp.abs());
    }
    // Fixed notation: the point goes after `exp + 1` digits.
    let point = exp + 1;
    let text = if point <= 0 {
        format!("0.{}{digits}", "0".repeat(point.unsigned_abs() as usize))
    } else {
        let point = point as usize;
        if digits.len() <= point {
            format!("{digits}{}.0", "0".repeat(point - digits.len()))
        } else {
            format!("{}.{}", &digits[..point], &digits[point..])
        }
    };
    format!("{sign}{text}")
}

/// Python's `repr()` of a string: single quotes unless the text holds a
/// single quote and no double one; backslashes, the quote, control and
/// invisible characters escaped (`\n`, `\x01`, `\u2028`).
pub fn str_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if !printable(c) => {
                let code = c as u32;
                if code < 0x100 {
                    out.push_str(&format!("\\x{code:02x}"));
                } else if code < 0x10000 {
                    out.push_str(&format!("\\u{code:04x}"));
                } else {
                    out.push_str(&format!("\\U{code:08x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// Whether Python prints `c` as it is in a `repr()`: not a control, format
/// or separator character (but the space), nor private use. Unassigned
/// code points, which Python escapes too, are not known here and print
/// as they are.
fn printable(c: char) -> bool {
    let code = c as u32;
    !(c.is_control()
        || matches!(
            code,
            0xA0 | 0xAD
                | 0x600..=0x605
                | 0x61C
                | 0x6DD
                | 0x70F
                | 0x1680
                | 0x180E
                | 0x2000..=0x200F
                | 0x2028..=0x202F
                | 0x205F..=0x2064
                | 0x2066..=0x206F
                | 0x3000
                | 0xFEFF
                | 0xFFF9..=0xFFFB
                | 0xE000..=0xF8FF
                | 0xF0000..=0x10FFFF
        ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn floats_print_as_python_prints_them() {
        for (f, text) in [
            (1.0, "1.0"),
            (-0.0, "-0.0"),
            (0.0, "0.0"),
            (1.5, "1.5"),
            (0.25, "0.25"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1e-7, "1e-07"),
            (1.2345e-7, "1.2345e-07"),
            (1234567890123456.0, "1234567890123456.0"),
            (1e16, "1e+16"),
            (12345678901234567.0, "1.2345678901234568e+16"),
            (2.0617283945000002, "2.0617283945000002"),
            (-3.70379, "-3.70379"),
            (1e100, "1e+100"),
        ] {
            assert_eq!(float_repr(f), text, "{f}");
        }
    }

    #[test]
    fn strings_take_the_quote_python_takes() {
        assert_eq!(str_repr("x"), "'x'");
        assert_eq!(str_repr("it's"), "\"it's\"");
        assert_eq!(str_repr("it's \"q\""), "'it\\'s \"q\"'");
        assert_eq!(str_repr("a\\b\n\u{1}é\u{2028}"), "'a\\\\b\\n\\x01é\\u2028'");
    }

    #[test]
    fn values_print_as_python_prints_them() {
        assert_eq!(repr(&json!(null)), "None");
        assert_eq!(repr(&json!([1, "a", true, 1.0])), "[1, 'a', True, 1.0]");
        assert_eq!(
            repr(&json!({"k": "v", "n": null, "b": false})),
            "{'k': 'v', 'n': None, 'b': False}"
        );
        assert_eq!(repr(&json!(10000000000000000_u64)), "10000000000000000");
        let big: Value = serde_json::from_str("1e16").unwrap();
        assert_eq!(repr(&big), "1e+16");
    }
}
