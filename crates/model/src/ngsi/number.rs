//! Numbers as Orion writes them, and JSON serialisation that uses that
//! form everywhere NGSI renders a value (responses and notifications).
//!
//! Orion keeps every number as an IEEE double and prints it with its own
//! routine rather than the shortest round-trip form serde_json uses, so
//! clients see `8` for `7.999999999536117`
//! (`4346_ensure_rounding_is_done_correctly`), `0.0000001` for `1e-7`
//! and `1.79e+308` for `1.79e308` (`4642_large_float_numbers`):
//!
//! - a value within 1e-9 of an integer, or whose fraction exceeds
//!   0.9999999998, prints as that integer, without decimals;
//! - any other value inside the 64-bit integer range prints with nine
//!   decimals, trailing zeros (and a trailing `.`) removed;
//! - a magnitude beyond the 64-bit integer range prints with 17
//!   significant digits in exponent form (`1.7976931348623157e+308`).
//!
//! Integers that arrived as JSON integers keep every digit (Orion would
//! round those beyond 2^53 to the nearest double); see `docs/ngsi.md`.
//! Parsing is unchanged: only the text written differs.

use serde::Serialize;
use serde_json::ser::Formatter;
use serde_json::Value;
use std::io;

/// The smallest magnitude (2^63) that no longer fits a 64-bit integer:
/// from here on Orion switches to exponent form.
const INTEGER_RANGE_LIMIT: f64 = 9_223_372_036_854_775_808.0;

/// A fraction closer than this to zero counts as an integer.
const INTEGER_TOLERANCE: f64 = 0.000_000_001;

/// A fraction above this rounds up to the next integer.
const ROUND_UP_FRACTION: f64 = 0.999_999_999_8;

/// Writes `value` as Orion writes numbers (see the module doc).
pub fn format_number(value: f64) -> String {
    if !value.is_finite() {
        // JSON has no infinities; serde_json never hands one over.
        return "null".to_string();
    }
    if value.abs() >= INTEGER_RANGE_LIMIT {
        return exponent_form(value);
    }
    let whole = value.trunc();
    let fraction = (value - whole).abs();
    if fraction < INTEGER_TOLERANCE {
        return format!("{}", whole as i64);
    }
    if fraction > ROUND_UP_FRACTION {
        return format!("{}", (whole + value.signum()) as i64);
    }
    let fixed = format!("{value:.9}");
    let trimmed = fixed.trim_end_matches('0').trim_end_matches('.');
    match trimmed {
        // `-0.000000000` trimmed: a tiny negative rounds to plain zero.
        "-0" => "0".to_string(),
        t => t.to_string(),
    }
}

/// C's `%.17g` for magnitudes of 1e17 and beyond: a mantissa with up to
/// 17 significant digits, trailing zeros removed, and a signed exponent
/// of at least two digits (`1.79e+308`).
fn exponent_form(value: f64) -> String {
    let text = format!("{value:.16e}");
    let (mantissa, exponent) = text.split_once('e').unwrap_or((&text, "0"));
    let mantissa = if mantissa.contains('.') {
        mantissa.trim_end_matches('0').trim_end_matches('.')
    } else {
        mantissa
    };
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let sign = if exponent < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exponent.unsigned_abs())
}

/// serde_json's compact output with Orion's numbers: floating-point values
/// go through [`format_number`]; integers beyond the 64-bit signed range
/// take Orion's exponent form.
#[derive(Debug, Clone, Copy, Default)]
pub struct OrionFormatter;

impl Formatter for OrionFormatter {
    fn write_f64<W: ?Sized + io::Write>(&mut self, writer: &mut W, value: f64) -> io::Result<()> {
        writer.write_all(format_number(value).as_bytes())
    }

    fn write_f32<W: ?Sized + io::Write>(&mut self, writer: &mut W, value: f32) -> io::Result<()> {
        self.write_f64(writer, f64::from(value))
    }

    fn write_u64<W: ?Sized + io::Write>(&mut self, writer: &mut W, value: u64) -> io::Result<()> {
        if value > i64::MAX as u64 {
            return writer.write_all(exponent_form(value as f64).as_bytes());
        }
        writer.write_all(value.to_string().as_bytes())
    }
}

/// Serialises `value` as compact JSON with Orion's numbers; the body of
/// every NGSI response and notification.
pub fn to_vec(value: &impl Serialize) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, OrionFormatter);
    // Serialising a `Value` (or plain data) into a Vec cannot fail.
    if value.serialize(&mut serializer).is_err() {
        out.clear();
        out.extend_from_slice(b"null");
    }
    out
}

/// [`to_vec`] as a `String`.
pub fn to_string(value: &impl Serialize) -> String {
    String::from_utf8(to_vec(value)).unwrap_or_default()
}

/// A value as Orion writes it inside text (a `text/plain` attribute value,
/// a macro in a custom payload): strings bare, numbers in Orion's form,
/// anything else as compact JSON.
pub fn value_as_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => to_string(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn integral_values_print_without_decimals() {
        assert_eq!(format_number(3.0), "3");
        assert_eq!(format_number(-3.0), "-3");
        assert_eq!(format_number(0.0), "0");
        assert_eq!(format_number(2.9999999999), "3");
        assert_eq!(format_number(-2.9999999999), "-3");
        assert_eq!(format_number(1e15), "1000000000000000");
    }

    // 4346_ensure_rounding_is_done_correctly: 7.999999999536117 -> 8.
    #[test]
    fn nine_decimals_then_trailing_zeros_go() {
        assert_eq!(format_number(7.999999999536117), "8");
        assert_eq!(format_number(0.1), "0.1");
        assert_eq!(format_number(-0.5), "-0.5");
        assert_eq!(format_number(1e-7), "0.0000001");
        assert_eq!(format_number(40.4167754), "40.4167754");
        assert_eq!(format_number(0.1234567891234), "0.123456789");
        assert_eq!(format_number(123456789012.5), "123456789012.5");
    }

    // 4642_large_float_numbers: exponent form beyond 64 bits, tiny values are 0.
    #[test]
    fn large_and_tiny_magnitudes() {
        assert_eq!(format_number(1.79e308), "1.79e+308");
        assert_eq!(
            format_number(1.797_693_134_862_315_7e308),
            "1.7976931348623157e+308"
        );
        assert_eq!(
            format_number(-1.797_693_134_862_315_7e308),
            "-1.7976931348623157e+308"
        );
        assert_eq!(format_number(1e20), "1e+20");
        assert_eq!(format_number(f64::from_bits(1)), "0");
        assert_eq!(format_number(-f64::from_bits(1)), "0");
        assert_eq!(format_number(9.3e18), "9.3e+18");
        assert_eq!(format_number(9.2e18), "9200000000000000000");
    }

    #[test]
    fn documents_serialise_with_orion_numbers() {
        let v = json!({"a": 7.999999999536117, "b": [1.5, 2.0, 3], "c": "x", "d": 1e20,
                       "e": u64::MAX, "f": -4});
        assert_eq!(
            to_string(&v),
            r#"{"a":8,"b":[1.5,2,3],"c":"x","d":1e+20,"e":1.8446744073709552e+19,"f":-4}"#
        );
        assert_eq!(value_as_text(&json!(2.50)), "2.5");
        assert_eq!(value_as_text(&json!("s")), "s");
    }
}
