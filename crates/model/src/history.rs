//! The time-series rules of history (QuantumLeap's): which time a
//! recorded entity state is filed under, and how times are written in
//! answers.
//!
//! Time index of an entity, the first found (QuantumLeap's order, with
//! weft's device data in it):
//! 1. the attribute named by the `Fiware-TimeIndex-Attribute` header;
//! 2. the attribute `TimeInstant`;
//! 3. the attribute `timestamp`;
//! 4. the metadata `observedAt`, then `modifiedAt`, of any attribute (the
//!    latest);
//! 5. the attribute `dateObserved` (what a device's data unit carries:
//!    when the device measured, see data-units.md);
//! 6. the entity's `dateModified`;
//! 7. the arrival time.
//!
//! Values that are not ISO-8601 date-times are skipped.

use serde_json::Value;

use crate::ngsi::{parse_datetime, Entity};

/// The time index of `entity` in epoch milliseconds; `header_attr` is the
/// `Fiware-TimeIndex-Attribute` header, `arrival` the time it came in.
pub fn time_index(entity: &Entity, header_attr: Option<&str>, arrival: i64) -> i64 {
    let attr_time = |name: &str| {
        entity
            .attrs
            .get(name)
            .and_then(|a| a.value.as_str())
            .and_then(parse_datetime)
    };
    if let Some(t) = header_attr.and_then(attr_time) {
        return t;
    }
    if let Some(t) = attr_time("TimeInstant").or_else(|| attr_time("timestamp")) {
        return t;
    }
    for md in ["observedAt", "modifiedAt"] {
        let latest = entity
            .attrs
            .iter()
            .filter_map(|(_, a)| a.metadata.get(md))
            .filter_map(|m| m.value.as_str().and_then(parse_datetime))
            .max();
        if let Some(t) = latest {
            return t;
        }
    }
    if let Some(t) = attr_time("dateObserved") {
        return t;
    }
    if entity.date_modified > 0 {
        return entity.date_modified;
    }
    arrival
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
