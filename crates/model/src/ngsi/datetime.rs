//! The ISO 8601 forms Orion accepts for `DateTime` (and `ISO8601`) values,
//! and the one form it renders: `YYYY-MM-DDThh:mm:ss.sssZ`, UTC.
//!
//! Accepted (`2631_partial_datetimes`, `2670_milliseconds_for_DateTime_attrs`):
//! a date `YYYY-MM-DD`, optionally followed by `T` and a time `hh`,
//! `hh:mm`, `hh:mm:ss`, `hhmm` or `hhmmss`, seconds optionally followed by
//! a fraction, and an optional zone `Z`, `±hh`, `±hh:mm` or `±hhmm`.
//! A time without zone is UTC.

use chrono::{DateTime, NaiveDate, NaiveTime, TimeZone, Utc};

/// Parses an ISO 8601 date-time as Orion does, to epoch milliseconds.
/// `None` when the text is not one of the accepted forms.
pub fn parse_datetime(s: &str) -> Option<i64> {
    let (date_part, rest) = if s.len() >= 10 {
        s.split_at(10)
    } else {
        return None;
    };
    let date = parse_date(date_part)?;
    let (time, offset_secs) = if rest.is_empty() {
        (NaiveTime::from_hms_opt(0, 0, 0)?, 0)
    } else {
        let rest = rest.strip_prefix('T')?;
        let (time_text, zone) = split_zone(rest)?;
        (parse_time(time_text)?, zone)
    };
    let naive = date.and_time(time);
    let ms = Utc.from_utc_datetime(&naive).timestamp_millis();
    Some(ms - i64::from(offset_secs) * 1000)
}

/// Renders epoch milliseconds as Orion does: `YYYY-MM-DDThh:mm:ss.sssZ`.
pub fn format_datetime(ms: i64) -> String {
    match DateTime::<Utc>::from_timestamp_millis(ms) {
        Some(t) => t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
        None => "1970-01-01T00:00:00.000Z".to_string(),
    }
}

fn digits(s: &str, n: usize) -> Option<u32> {
    if s.len() == n && s.bytes().all(|b| b.is_ascii_digit()) {
        s.parse().ok()
    } else {
        None
    }
}

fn parse_date(s: &str) -> Option<NaiveDate> {
    let b = s.as_bytes();
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    let y = digits(&s[0..4], 4)?;
    let m = digits(&s[5..7], 2)?;
    let d = digits(&s[8..10], 2)?;
    NaiveDate::from_ymd_opt(y as i32, m, d)
}

/// Splits a time from its zone; returns the zone offset in seconds east.
fn split_zone(s: &str) -> Option<(&str, i32)> {
    if let Some(t) = s.strip_suffix('Z') {
        return Some((t, 0));
    }
    let Some(pos) = s.find(['+', '-']) else {
        return Some((s, 0));
    };
    let (time, zone) = s.split_at(pos);
    let sign = if zone.starts_with('-') { -1 } else { 1 };
    let z = &zone[1..];
    let (h, m) = match z.len() {
        2 => (digits(z, 2)?, 0),
        4 => (digits(&z[0..2], 2)?, digits(&z[2..4], 2)?),
        5 if z.as_bytes()[2] == b':' => (digits(&z[0..2], 2)?, digits(&z[3..5], 2)?),
        _ => return None,
    };
    if h > 23 || m > 59 {
        return None;
    }
    Some((time, sign * (h as i32 * 3600 + m as i32 * 60)))
}

fn parse_time(s: &str) -> Option<NaiveTime> {
    let (hms, frac) = match s.split_once('.') {
        Some((a, f)) => (a, Some(f)),
        None => (s, None),
    };
    let parts: Vec<u32> = if hms.contains(':') {
        hms.split(':')
            .map(|p| digits(p, 2))
            .collect::<Option<_>>()?
    } else {
        if hms.len() % 2 != 0 || hms.is_empty() {
            return None;
        }
        (0..hms.len() / 2)
            .map(|i| digits(&hms[2 * i..2 * i + 2], 2))
            .collect::<Option<_>>()?
    };
    let (h, m, sec) = match parts.as_slice() {
        [h] => (*h, 0, 0),
        [h, m] => (*h, *m, 0),
        [h, m, s] => (*h, *m, *s),
        _ => return None,
    };
    let milli = match frac {
        None => 0,
        Some(f) => {
            if f.is_empty() || parts.len() != 3 || !f.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let mut padded: String = f.chars().take(3).collect();
            while padded.len() < 3 {
                padded.push('0');
            }
            padded.parse().ok()?
        }
    };
    NaiveTime::from_hms_milli_opt(h, m, sec, milli)
}

#[cfg(test)]
mod tests {
    use super::*;

    // 2631_partial_datetimes/partial_datetimes.test: every variant means the same instant.
    #[test]
    fn partial_forms_all_mean_the_same_instant() {
        let variants = [
            "2016-10-01",
            "2016-10-01T00",
            "2016-10-01T00Z",
            "2016-10-01T00:00",
            "2016-10-01T00:00Z",
            "2016-10-01T00:00:00",
            "2016-10-01T00:00:00Z",
            "2016-10-01T00:00:00.000",
            "2016-10-01T00:00:00.000Z",
            "2016-10-01T0000",
            "2016-10-01T0000Z",
            "2016-10-01T000000",
            "2016-10-01T000000Z",
            "2016-10-01T000000.000",
            "2016-10-01T000000.000Z",
        ];
        for v in variants {
            let ms = parse_datetime(v).unwrap_or_else(|| panic!("{v}"));
            assert_eq!(format_datetime(ms), "2016-10-01T00:00:00.000Z", "{v}");
        }
    }

    // 2670_milliseconds_for_DateTime_attrs: milliseconds kept, zones converted to UTC.
    #[test]
    fn milliseconds_and_zones() {
        let f = |s| format_datetime(parse_datetime(s).unwrap());
        assert_eq!(f("2020-07-03T09:24:04.456"), "2020-07-03T09:24:04.456Z");
        assert_eq!(
            f("2020-07-03T09:24:04.456+0100"),
            "2020-07-03T08:24:04.456Z"
        );
        assert_eq!(
            f("2020-07-03T09:24:04.456-01:30"),
            "2020-07-03T10:54:04.456Z"
        );
        // 0876_entity_dates: "2050-01-01T00:00:00.666" -> "...666Z"
        assert_eq!(f("2050-01-01T00:00:00.666"), "2050-01-01T00:00:00.666Z");
    }

    // 1039_ngsiv2_date_support/basic_dates_support.test: "foo" and "bar" are invalid.
    #[test]
    fn invalid_dates() {
        for v in [
            "foo",
            "bar",
            "2016-13-01",
            "2016-10-01T25",
            "2016-10-01X",
            "2016-10-01T0",
            "",
        ] {
            assert_eq!(parse_datetime(v), None, "{v}");
        }
    }
}
