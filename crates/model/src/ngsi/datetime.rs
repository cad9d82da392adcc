//! The ISO 8601 forms Orion accepts for `DateTime` (and `ISO8601`) values,
//! and the one form it renders: `YYYY-MM-DDThh:mm:ss.sssZ`, UTC.
//!
//! Accepted (`2631_partial_datetimes`, `2670_milliseconds_for_DateTime_attrs`):
//! a date `YYYY-MM-DD`, optionally followed by `T` and a time `hh`,
//! `hh:mm`, `hh:mm:ss`, `hhmm` or `hhmmss`, seconds optionally followed by
//! a fraction, and an optional zone `Z`, `±hh`, `±hh:mm` or `±hhmm`.
//! A time without zone is UTC.

use chrono::{DateTime, Utc};

/// Parses an ISO 8601 date-time as Orion does, to epoch milliseconds;
/// `None` when the text is not one of the accepted forms. The same parser
/// serves `q` comparisons, so a value and a filter read dates alike.
pub use crate::query::parse_datetime;

/// Renders epoch milliseconds as Orion does: `YYYY-MM-DDThh:mm:ss.sssZ`.
pub fn format_datetime(ms: i64) -> String {
    match DateTime::<Utc>::from_timestamp_millis(ms) {
        Some(t) => t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
        None => "1970-01-01T00:00:00.000Z".to_string(),
    }
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
