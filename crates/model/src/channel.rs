//! Durable pull channels (the DSPS API): the Go-style durations of its
//! `timeout` parameter. The rule for the ids in its paths is
//! [`crate::validate::is_dsps_id`].

use std::time::Duration;

/// Parses a Go `time.ParseDuration` string (`"3s"`, `"1h30m"`, `"1.5s"`,
/// `"300ms"`, `"0"`), the syntax DSPS clients send. Negative durations
/// are refused.
pub fn parse_go_duration(text: &str) -> Option<Duration> {
    let s = text.strip_prefix('+').unwrap_or(text);
    if s == "0" {
        return Some(Duration::ZERO);
    }
    if s.is_empty() {
        return None;
    }
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, tail) = rest.split_at(number_len);
        if number.is_empty() || number == "." {
            return None;
        }
        let value: f64 = number.parse().ok()?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let nanos = match unit {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        total += value * nanos;
        rest = tail;
    }
    (total.is_finite() && total < 1e19).then(|| Duration::from_nanos(total as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Go's duration syntax, including fractions and compound units.
    #[test]
    fn go_durations() {
        let ms = |n| Some(Duration::from_millis(n));
        assert_eq!(parse_go_duration("3s"), ms(3000));
        assert_eq!(parse_go_duration("0"), ms(0));
        assert_eq!(parse_go_duration("1.5s"), ms(1500));
        assert_eq!(parse_go_duration("1h30m"), ms(5_400_000));
        assert_eq!(parse_go_duration("300ms"), ms(300));
        assert_eq!(parse_go_duration("2m3s"), ms(123_000));
        for bad in ["", "3", "s", "-1s", "3x", "1..2s", "abc"] {
            assert_eq!(parse_go_duration(bad), None, "{bad}");
        }
    }
}
