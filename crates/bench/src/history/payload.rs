//! The pure parts of `history` that go on the wire: entity ids, ISO-8601
//! time stamps (written and read back), QuantumLeap notification bodies
//! and the fixed head of every `POST /v2/notify`, rendered into reusable
//! buffers so the hot path does not allocate.
//!
//! The bench crate has no date library of its own (and adds none for two
//! functions), so the UTC calendar arithmetic is Howard Hinnant's
//! `days_from_civil`/`civil_from_days`, exact for every date.

use std::io::Write as _;

/// The entity type of every entity the scenario writes (QuantumLeap's k6
/// script notifies `Room` entities).
pub const ENTITY_TYPE: &str = "Room";

/// The entity `--preload-rows` fills with a long series.
pub const BIG_ENTITY: &str = "Room:big";

/// The entity of the setup notification sent before the load, so the
/// tenant and its `Room` type exist before the clients start (see
/// `notify::setup`); it is never verified or queried.
pub const SETUP_ENTITY: &str = "Room:setup";

/// The value of `pressure` in every notification, as in QuantumLeap's k6 body.
pub const PRESSURE: u32 = 720;

/// Attributes each notified entity carries, each stored as one row:
/// `TimeInstant`, `temperature` and `pressure`.
pub const ATTRS_PER_ENTITY: u64 = 3;

/// The attributes each notified entity carries, as a QuantumLeap `attrs`
/// list (the verify phase counts the rows of each).
pub const ATTR_NAMES: [&str; 3] = ["TimeInstant", "temperature", "pressure"];

/// Milliseconds in a day.
pub const DAY_MS: i64 = 86_400_000;

/// The id of load entity `i`: `Room:<i>`.
pub fn entity_id(i: usize) -> String {
    format!("{ENTITY_TYPE}:{i}")
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date (year, month, day) of a day count since 1970-01-01.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Appends epoch milliseconds `ms` as weft writes times in NGSI:
/// `2025-01-01T00:00:00.000Z` (UTC, milliseconds).
pub fn push_iso(out: &mut Vec<u8>, ms: i64) {
    let days = ms.div_euclid(DAY_MS);
    let in_day = ms.rem_euclid(DAY_MS);
    let (y, mo, d) = civil_from_days(days);
    let (h, mi, s, milli) = (
        in_day / 3_600_000,
        in_day / 60_000 % 60,
        in_day / 1000 % 60,
        in_day % 1000,
    );
    let _ = write!(
        out,
        "{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{milli:03}Z"
    );
}

/// [`push_iso`] into a new string, for query parameters and messages.
pub fn iso(ms: i64) -> String {
    let mut out = Vec::with_capacity(24);
    push_iso(&mut out, ms);
    String::from_utf8(out).expect("ASCII digits and separators")
}

/// Reads back a time as QuantumLeap writes its `index`:
/// `YYYY-MM-DDTHH:MM:SS[.fff]` then `Z` or an offset `±HH:MM`
/// (`2025-01-01T00:00:00.000+00:00`). `None` for anything else.
pub fn parse_iso(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    let num = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = b.get(range)?;
        if part.is_empty() || !part.iter().all(u8::is_ascii_digit) {
            return None;
        }
        Some(
            part.iter()
                .fold(0i64, |acc, c| acc * 10 + i64::from(c - b'0')),
        )
    };
    if b.len() < 19
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b'T'
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut rest = &b[19..];
    let mut milli = 0;
    if let Some((b'.', after)) = rest.split_first() {
        let n = after.iter().take_while(|c| c.is_ascii_digit()).count();
        if n == 0 {
            return None;
        }
        for (i, c) in after[..n].iter().take(3).enumerate() {
            milli += i64::from(c - b'0') * [100, 10, 1][i];
        }
        rest = &after[n..];
    }
    let offset_min = match rest {
        b"Z" => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let digits = [*h1, *h2, *m1, *m2];
            if !digits.iter().all(u8::is_ascii_digit) {
                return None;
            }
            let v = i64::from(h1 - b'0') * 600
                + i64::from(h2 - b'0') * 60
                + i64::from(m1 - b'0') * 10
                + i64::from(m2 - b'0');
            if *sign == b'-' {
                -v
            } else {
                v
            }
        }
        _ => return None,
    };
    let days = days_from_civil(year, month as u32, day as u32);
    let local = days * DAY_MS + hour * 3_600_000 + minute * 60_000 + second * 1000 + milli;
    Some(local - offset_min * 60_000)
}

/// Appends one notified entity, QuantumLeap's k6 entity with a time
/// index and a temperature the verify phase can recognise:
/// `{"id":…,"type":"Room","TimeInstant":{"type":"DateTime","value":…},
/// "temperature":{"value":…,"type":"Number"},"pressure":{"value":720,"type":"Integer"}}`.
pub fn push_entity(out: &mut Vec<u8>, id: &str, time_ms: i64, temperature: u64) {
    let _ = write!(
        out,
        r#"{{"id":"{id}","type":"{ENTITY_TYPE}","TimeInstant":{{"type":"DateTime","value":""#
    );
    push_iso(out, time_ms);
    let _ = write!(
        out,
        r#""}},"temperature":{{"value":{temperature},"type":"Number"}},"pressure":{{"value":{PRESSURE},"type":"Integer"}}}}"#
    );
}

/// Renders a notification body into `out` (cleared first): `{"data":[…]}`
/// holding one entity per `(time_ms, temperature)` of `points`, all with
/// id `id`. The load sends one point per notification; the preload sends
/// many points of one entity per notification.
pub fn render_notification(
    out: &mut Vec<u8>,
    id: &str,
    points: impl IntoIterator<Item = (i64, u64)>,
) {
    out.clear();
    out.extend_from_slice(br#"{"data":["#);
    for (n, (time_ms, temperature)) in points.into_iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        push_entity(out, id, time_ms, temperature);
    }
    out.extend_from_slice(b"]}");
}

/// The fixed part of every `POST /v2/notify` of a run, rendered once.
#[derive(Debug, Clone)]
pub struct NotifyHead {
    /// Request line and headers up to `Content-Length: `.
    start: Vec<u8>,
}

impl NotifyHead {
    /// The head for a server under path `prefix`, `Host: host`, in `tenant`.
    pub fn new(prefix: &str, host: &str, tenant: &str) -> NotifyHead {
        NotifyHead {
            start: format!(
                "POST {prefix}/v2/notify HTTP/1.1\r\nHost: {host}\r\nFiware-Service: {tenant}\r\n{key}\
                 Content-Type: application/json\r\nContent-Length: ",
                key = crate::http::api_key_line(),
            )
            .into_bytes(),
        }
    }

    /// Renders the complete request carrying `body` into `out` (cleared first).
    pub fn render(&self, out: &mut Vec<u8>, body: &[u8]) {
        out.clear();
        out.extend_from_slice(&self.start);
        let _ = write!(out, "{}\r\n\r\n", body.len());
        out.extend_from_slice(body);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_iso_times() {
        assert_eq!(iso(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso(1_735_689_600_000), "2025-01-01T00:00:00.000Z");
        assert_eq!(iso(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        // A leap day, the last millisecond of a year, before 1970.
        assert_eq!(iso(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(iso(1_767_225_599_999), "2025-12-31T23:59:59.999Z");
        assert_eq!(iso(-1), "1969-12-31T23:59:59.999Z");
    }

    #[test]
    fn reads_back_what_it_writes_and_quantumleaps_form() {
        for ms in [
            0,
            -1,
            951_782_400_000,
            1_735_689_600_000,
            1_735_689_600_000 + 37 * DAY_MS + 12_345_678,
            4_102_444_800_000,
        ] {
            assert_eq!(parse_iso(&iso(ms)), Some(ms), "{}", iso(ms));
        }
        assert_eq!(
            parse_iso("2025-01-01T00:01:00.000+00:00"),
            Some(1_735_689_660_000)
        );
        assert_eq!(
            parse_iso("2025-01-01T01:00:00+01:00"),
            Some(1_735_689_600_000)
        );
        assert_eq!(
            parse_iso("2024-12-31T23:00:00.5-01:00"),
            Some(1_735_689_600_500)
        );
        for bad in [
            "",
            "2025-01-01",
            "2025-01-01T00:00:00",
            "2025-01-01T00:00:00.Z",
            "2025-13-01T00:00:00Z",
            "2025-01-01 00:00:00Z",
            "2025-01-01T00:00:00+0000",
            "x025-01-01T00:00:00Z",
        ] {
            assert_eq!(parse_iso(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn renders_quantumleaps_k6_body_with_a_time_index() {
        let mut out = b"junk".to_vec();
        render_notification(&mut out, &entity_id(7), [(1_735_689_660_000, 1)]);
        assert_eq!(
            String::from_utf8(out.clone()).unwrap(),
            r#"{"data":[{"id":"Room:7","type":"Room","TimeInstant":{"type":"DateTime","value":"2025-01-01T00:01:00.000Z"},"temperature":{"value":1,"type":"Number"},"pressure":{"value":720,"type":"Integer"}}]}"#
        );
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let e = &v["data"][0];
        assert_eq!(e.as_object().unwrap().len(), 2 + ATTR_NAMES.len());
        for name in ATTR_NAMES {
            assert!(e.get(name).is_some(), "{name}");
        }
    }

    #[test]
    fn renders_many_points_of_one_entity() {
        let mut out = Vec::new();
        render_notification(
            &mut out,
            BIG_ENTITY,
            (1..=100).map(|j| (j * 1000, j as u64)),
        );
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let data = v["data"].as_array().unwrap();
        assert_eq!(data.len(), 100);
        assert!(data.iter().all(|e| e["id"] == BIG_ENTITY));
        assert_eq!(data[99]["temperature"]["value"], 100);
        assert_eq!(data[99]["TimeInstant"]["value"], "1970-01-01T00:01:40.000Z");
        render_notification(&mut out, BIG_ENTITY, std::iter::empty());
        assert_eq!(out, br#"{"data":[]}"#);
    }

    #[test]
    fn renders_notify_requests() {
        let head = NotifyHead::new("/pre", "h:1", "benchabc");
        let mut out = b"junk".to_vec();
        head.render(&mut out, b"{}");
        assert_eq!(
            out,
            b"POST /pre/v2/notify HTTP/1.1\r\nHost: h:1\r\nFiware-Service: benchabc\r\n\
              Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
                .as_slice()
        );
    }
}
