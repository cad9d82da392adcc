//! The values `ngsi-notify` writes: each one says when its update was sent,
//! so the sink can tell a notification's delay from the notification alone,
//! with no table of sent updates to look up.
//!
//! `value = (sent_µs + 1) × 1000 + (seq mod 1000)`, where `sent_µs` is the
//! time since the load started and `seq` the client's running count of
//! attribute writes; the `+ 1` keeps every value above 0, the value
//! entities are created with. A client sends one update per round trip (always longer than a
//! microsecond), so its values grow from one update to the next: every
//! write differs from the one before it, as Orion needs to see an actual
//! change and notify, and the newest update of an entity holds its largest
//! values. Within one update the sequence keeps the (at most 1000)
//! attributes' values distinct.
//!
//! Values stay below 2^53, so they survive a server that keeps numbers as
//! `f64`, for runs of up to about 100 days.

use std::time::Duration;

/// How many sequence numbers share one microsecond (the multiplier).
const SEQ_SPAN: u64 = 1000;

/// Largest integer an `f64` holds exactly (2^53).
const F64_EXACT: f64 = 9_007_199_254_740_992.0;

/// The value to write: a [`crate::ngsi_update::load::ValueFn`] that stamps
/// the send time `sent` (since the load started) and the write count `seq`.
pub fn encode(sent: Duration, seq: u64) -> u64 {
    (sent.as_micros() as u64 + 1) * SEQ_SPAN + seq % SEQ_SPAN
}

/// The send time, in microseconds since the load started, of a value
/// written by [`encode`]; `None` for anything smaller, such as 0, the value
/// entities are created with (an attribute never updated).
pub fn sent_micros(value: u64) -> Option<u64> {
    (value / SEQ_SPAN).checked_sub(1)
}

/// A JSON number as the value it was written as: a non-negative integer
/// below 2^53, whether rendered as `123`, `123.0` or `1.23e2` (a server
/// keeping numbers as `f64` may render any of these). `None` otherwise.
pub fn from_json(n: &serde_json::Number) -> Option<u64> {
    if let Some(v) = n.as_u64() {
        return Some(v);
    }
    let f = n.as_f64()?;
    ((0.0..F64_EXACT).contains(&f) && f.fract() == 0.0).then_some(f as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn number(text: &str) -> serde_json::Number {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn encodes_the_send_time_and_decodes_it_back() {
        let v = encode(Duration::from_micros(1_234_567), 42);
        assert_eq!(v, 1_234_568_042);
        assert_eq!(sent_micros(v), Some(1_234_567));
        // The sequence wraps within a microsecond, the time does not.
        assert_eq!(sent_micros(encode(Duration::from_micros(9), 1999)), Some(9));
        // Even the very first write, at time 0, is not the creation value.
        assert_ne!(encode(Duration::ZERO, 1), 0);
        assert_eq!(sent_micros(encode(Duration::ZERO, 1)), Some(0));
        assert_eq!(sent_micros(0), None);
        assert_eq!(sent_micros(999), None);
        // Even a sequence multiple of 1000 at time 0 is not 0.
        assert_eq!(encode(Duration::ZERO, 1000), 1000);
    }

    #[test]
    fn later_updates_write_larger_values() {
        // A client's next update is sent at least a microsecond later, so
        // every one of its values is larger, whatever the sequence did.
        let mut seq = 1;
        let mut last_max = 0;
        for t in [0u64, 1, 2, 50, 51, 1_000_000] {
            let values: Vec<u64> = (0..1000)
                .map(|_| {
                    seq += 1;
                    encode(Duration::from_micros(t), seq)
                })
                .collect();
            assert!(values.iter().all(|&v| v > last_max), "at {t}µs");
            let mut distinct = values.clone();
            distinct.sort_unstable();
            distinct.dedup();
            assert_eq!(distinct.len(), values.len(), "within one update");
            last_max = *values.iter().max().unwrap();
            assert_eq!(sent_micros(last_max), Some(t));
        }
    }

    #[test]
    fn stays_exact_as_f64_for_long_runs() {
        let hundred_days = Duration::from_secs(100 * 86_400);
        let v = encode(hundred_days, 999);
        assert!((v as f64) < F64_EXACT);
        assert_eq!(v as f64 as u64, v);
    }

    #[test]
    fn reads_numbers_however_they_are_rendered() {
        assert_eq!(from_json(&number("3600000000123")), Some(3_600_000_000_123));
        assert_eq!(
            from_json(&number("3600000000123.0")),
            Some(3_600_000_000_123)
        );
        assert_eq!(from_json(&number("1.5e3")), Some(1500));
        assert_eq!(from_json(&number("0")), Some(0));
        assert_eq!(from_json(&number("12.5")), None);
        assert_eq!(from_json(&number("-3")), None);
        assert_eq!(from_json(&number("1e300")), None);
    }
}
