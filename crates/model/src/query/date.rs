//! ISO-8601 date-times as the query language reads them: Orion accepts
//! partial forms (`2016-10-01`, `2016-10-01T00`, `2016-10-01T0000Z`,
//! `2016-10-01T00:00:00.000`, …; case 2631_partial_datetimes), with or
//! without a zone (no zone means UTC), with or without separators in the
//! time part.

use chrono::{NaiveDate, NaiveTime};

/// Milliseconds since the Unix epoch of an ISO-8601 date-time written in
/// one of the forms Orion accepts, or `None` when `s` is not one.
///
/// Accepted: `YYYY-MM-DD`, optionally followed by `T` and `hh`, `hh:mm`,
/// `hhmm`, `hh:mm:ss`, `hhmmss`, each optionally with a `.fraction` after
/// the seconds, then optionally `Z` or an offset `±hh`, `±hh:mm`, `±hhmm`.
/// Fractions finer than a millisecond are truncated.
pub fn parse_datetime(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 10 || b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    let year = digits(&b[0..4])? as i32;
    let month = digits(&b[5..7])?;
    let day = digits(&b[8..10])?;
    let date = NaiveDate::from_ymd_opt(year, month, day)?;
    let mut rest = &b[10..];
    let (mut h, mut m, mut sec, mut ms) = (0, 0, 0, 0);
    if let Some((&b'T', after)) = rest.split_first() {
        rest = after;
        h = take2(&mut rest)?;
        if let Some(v) = take_part(&mut rest) {
            m = v;
            if let Some(v) = take_part(&mut rest) {
                sec = v;
                if let Some((&b'.', after)) = rest.split_first() {
                    let n = after.iter().take_while(|c| c.is_ascii_digit()).count();
                    if n == 0 {
                        return None;
                    }
                    let mut frac = 0u32;
                    for (i, c) in after[..n].iter().enumerate().take(3) {
                        frac += u32::from(c - b'0') * [100, 10, 1][i];
                    }
                    ms = frac;
                    rest = &after[n..];
                }
            }
        }
    }
    let offset_min: i64 = match rest {
        [] | [b'Z'] => 0,
        [sign @ (b'+' | b'-'), tail @ ..] => {
            let mut tail = tail;
            let oh = take2(&mut tail)?;
            let om = take_part(&mut tail).unwrap_or(0);
            if !tail.is_empty() || oh > 23 || om > 59 {
                return None;
            }
            let v = i64::from(oh * 60 + om);
            if *sign == b'-' {
                -v
            } else {
                v
            }
        }
        _ => return None,
    };
    let time = NaiveTime::from_hms_milli_opt(h, m, sec, ms)?;
    let local = date.and_time(time).and_utc().timestamp_millis();
    Some(local - offset_min * 60_000)
}

fn digits(b: &[u8]) -> Option<u32> {
    b.iter().try_fold(0u32, |acc, c| {
        c.is_ascii_digit().then(|| acc * 10 + u32::from(c - b'0'))
    })
}

/// Two digits at the start of `rest`, consumed.
fn take2(rest: &mut &[u8]) -> Option<u32> {
    if rest.len() < 2 {
        return None;
    }
    let v = digits(&rest[..2])?;
    *rest = &rest[2..];
    Some(v)
}

/// The next time component: `:dd` or `dd`, consumed; `None` (nothing
/// consumed) when there is none.
fn take_part(rest: &mut &[u8]) -> Option<u32> {
    let mut probe = *rest;
    if let Some((&b':', after)) = probe.split_first() {
        probe = after;
    }
    let v = take2(&mut probe)?;
    *rest = probe;
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::parse_datetime;

    #[test]
    fn partial_forms_all_mean_the_same_instant() {
        // 2631_partial_datetimes/partial_datetime_creation.test: all these
        // are 2016-10-01T00:00:00.000Z.
        let expected = 1_475_280_000_000;
        for s in [
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
        ] {
            assert_eq!(parse_datetime(s), Some(expected), "{s}");
        }
    }

    #[test]
    fn milliseconds_and_offsets() {
        assert_eq!(
            parse_datetime("2020-05-10T01:02:03.123Z"),
            Some(1_589_072_523_123)
        );
        assert_eq!(
            parse_datetime("2020-05-10T03:02:03.123+02:00"),
            Some(1_589_072_523_123)
        );
        assert_eq!(
            parse_datetime("2020-05-09T23:02:03.1239-0200"),
            Some(1_589_072_523_123)
        );
    }

    #[test]
    fn rejects_non_dates() {
        for s in [
            "2016",
            "20161001",
            "2016-13-01",
            "2016-02-30",
            "2016-10-01T",
            "2016-10-01T25",
            "2016-10-01T00:00:00.",
            "2016-10-01Tfoo",
            "2016-10-01 00:00",
            "house",
        ] {
            assert_eq!(parse_datetime(s), None, "{s}");
        }
    }
}
