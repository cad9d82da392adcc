//! The time-series rules of history (QuantumLeap's): which time a
//! recorded entity state is filed under, and how times are written in
//! answers.
//!
//! Time index of an entity, the first candidate that is an ISO-8601
//! date-time (QuantumLeap's order, with weft's device data in it):
//! 1. the attribute named by the `Fiware-TimeIndex-Attribute` header, then
//!    the newest metadata of that name across the attributes;
//! 2. the attribute `TimeInstant`, then the newest `TimeInstant` metadata;
//! 3. the attribute `timestamp`, then the newest `timestamp` metadata;
//! 4. the newest `observedAt` metadata, then the newest `modifiedAt`
//!    (where a notified NGSI-LD attribute's `observedAt` and `modifiedAt`
//!    go, [`notified`]);
//! 5. the entity's own observation and modification times: the attributes
//!    `observedAt`, then `modifiedAt`, then `dateObserved` (what a
//!    device's data unit carries: when the device measured, see
//!    data-units.md); for a notified entity, its NGSI-LD `observedAt` and
//!    `modifiedAt` keys instead ([`notified::NotifiedEntity::time_index`]);
//! 6. the entity's `dateModified`, then the newest `dateModified`
//!    metadata;
//! 7. the arrival time.

use serde_json::Value;

use crate::ngsi::{parse_datetime, Entity};

pub mod notified;
pub mod python;

/// The time index of `entity` in epoch milliseconds; `header_attr` is the
/// `Fiware-TimeIndex-Attribute` header, `arrival` the time it came in.
pub fn time_index(entity: &Entity, header_attr: Option<&str>, arrival: i64) -> i64 {
    let attr_time = |name: &str| attr_time(entity, name);
    let own = [
        attr_time("observedAt"),
        attr_time("modifiedAt"),
        attr_time("dateObserved"),
    ];
    filed_under(entity, header_attr, &own, arrival)
}

/// The date-time of attribute `name` of `entity`, if it holds one.
fn attr_time(entity: &Entity, name: &str) -> Option<i64> {
    entity
        .attrs
        .get(name)
        .and_then(|a| a.value.as_str())
        .and_then(parse_datetime)
}

/// The order of the module's doc, with `own` (rule 5) the entity's own
/// observation and modification times, first found first taken.
fn filed_under(
    entity: &Entity,
    header_attr: Option<&str>,
    own: &[Option<i64>],
    arrival: i64,
) -> i64 {
    let attr_time = |name: &str| attr_time(entity, name);
    let newest_metadata = |name: &str| {
        entity
            .attrs
            .iter()
            .filter_map(|(_, a)| a.metadata.get(name))
            .filter_map(|m| m.value.as_str().and_then(parse_datetime))
            .max()
    };
    let named = |name: &str| attr_time(name).or_else(|| newest_metadata(name));
    header_attr
        .and_then(named)
        .or_else(|| named("TimeInstant"))
        .or_else(|| named("timestamp"))
        .or_else(|| newest_metadata("observedAt"))
        .or_else(|| newest_metadata("modifiedAt"))
        .or_else(|| own.iter().flatten().next().copied())
        .or_else(|| (entity.date_modified > 0).then_some(entity.date_modified))
        .or_else(|| newest_metadata("dateModified"))
        .unwrap_or(arrival)
}

/// A time index as QuantumLeap writes it: `2026-01-02T03:04:05.000+00:00`.
pub fn format_index(ms: i64) -> String {
    let iso = crate::ngsi::format_datetime(ms);
    match iso.strip_suffix('Z') {
        Some(base) => format!("{base}+00:00"),
        None => iso,
    }
}

/// The number a value aggregates as: JSON numbers only.
pub fn numeric(value: &Value) -> Option<f64> {
    value.as_f64()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ngsi::{Attribute, Metadata};
    use serde_json::json;

    fn entity(attrs: &[(&str, Value, &str)]) -> Entity {
        let mut e = Entity::new("E", "T");
        for (n, v, t) in attrs {
            e.attrs.insert(n.to_string(), Attribute::new(v.clone(), *t));
        }
        e
    }

    #[test]
    fn time_index_follows_quantumleaps_order() {
        let t1 = "2026-01-01T00:00:01.000Z";
        let t2 = "2026-01-01T00:00:02.000Z";
        let e = entity(&[
            ("my", json!(t1), "DateTime"),
            ("TimeInstant", json!(t2), "DateTime"),
        ]);
        assert_eq!(time_index(&e, Some("my"), 7), parse_datetime(t1).unwrap());
        assert_eq!(time_index(&e, None, 7), parse_datetime(t2).unwrap());
        assert_eq!(time_index(&e, Some("nope"), 7), parse_datetime(t2).unwrap());

        let mut e = entity(&[("temperature", json!(20), "Number")]);
        assert_eq!(time_index(&e, None, 7), 7, "nothing: arrival");
        e.date_modified = 5;
        assert_eq!(time_index(&e, None, 7), 5);
        e.attrs.get_mut("temperature").unwrap().metadata.insert(
            "observedAt",
            Metadata {
                value: json!(t1),
                md_type: "DateTime".into(),
            },
        );
        assert_eq!(time_index(&e, None, 7), parse_datetime(t1).unwrap());
        let e = entity(&[("timestamp", json!("not a date"), "Text")]);
        assert_eq!(time_index(&e, None, 7), 7, "not a date: skipped");

        // Metadata named by the header, or TimeInstant metadata, before
        // the attributes further down the order.
        let md = |t: &str| Metadata {
            value: json!(t),
            md_type: "DateTime".into(),
        };
        let mut e = entity(&[
            ("temperature", json!(20), "Number"),
            ("timestamp", json!(t2), "DateTime"),
        ]);
        let temperature = e.attrs.get_mut("temperature").unwrap();
        temperature.metadata.insert("TimeInstant", md(t1));
        temperature.metadata.insert("when", md(t2));
        assert_eq!(time_index(&e, None, 7), parse_datetime(t1).unwrap());
        assert_eq!(time_index(&e, Some("when"), 7), parse_datetime(t2).unwrap());
    }

    #[test]
    fn index_format_is_quantumleaps() {
        assert_eq!(format_index(0), "1970-01-01T00:00:00.000+00:00");
        assert_eq!(
            format_index(1_700_000_000_123),
            "2023-11-14T22:13:20.123+00:00"
        );
    }
}
