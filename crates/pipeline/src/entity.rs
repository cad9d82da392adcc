//! Device data as context: how a data unit becomes attributes of its
//! device's NGSI entity (docs/data-units.md, "As NGSI entities").
//!
//! Entity id = device id, type = the device type's `entityType` (the type's
//! name when unset), in the default tenant and service path `/`. A measure
//! holding one value under a unit name (`{"celsius":37}`) becomes a `Number`
//! (or `Text`, `Boolean`) attribute `37` with metadata `unit: "celsius"`; a
//! plain value stays as it is; anything else is a `StructuredValue`. A
//! static `location` `{lat, lon}` becomes a `geo:json` Point, and
//! `dateObserved` carries `reportedAt` as a `DateTime`.
//!
//! A measure whose name cannot name an NGSI attribute (`id`, `type`, an
//! empty name, control characters, `<>"'=;()`, over 256 characters) stays
//! in the data unit but does not become an attribute, so what a device
//! sends can never change an entity's id or type, nor make an entity that
//! `/v2` cannot render.

use serde_json::{json, Value};
use weft_model::ngsi::{
    check_name, default_type, format_datetime, AttrMap, Attribute, Metadata, NameKind,
};
use weft_model::unit::unit_scalar;
use weft_model::DataUnit;

/// The attributes a data unit sets on its device's entity.
pub fn unit_attributes(unit: &DataUnit) -> AttrMap {
    let mut attrs = AttrMap::new();
    for (name, measure) in &unit.measures {
        if !is_attribute_name(name) {
            metrics::counter!("weft_entity_measures_skipped_total").increment(1);
            continue;
        }
        let attr = match (measure, unit_scalar(measure)) {
            (Value::Object(map), Some(value)) => {
                let mut a = Attribute::new(value.clone(), default_type(value));
                let unit_name = map.keys().next().cloned().unwrap_or_default();
                a.metadata.insert(
                    "unit",
                    Metadata {
                        value: json!(unit_name),
                        md_type: "Text".into(),
                    },
                );
                a
            }
            (value, _) => Attribute::new(value.clone(), default_type(value)),
        };
        attrs.insert(name.clone(), attr);
    }
    if let Some(loc) = unit.device.static_data.get("location") {
        let (lat, lon) = (
            loc.get("lat").and_then(Value::as_f64),
            loc.get("lon").and_then(Value::as_f64),
        );
        if let (Some(lat), Some(lon)) = (lat, lon) {
            attrs.insert(
                "location",
                Attribute::new(
                    json!({"type": "Point", "coordinates": [lon, lat]}),
                    "geo:json",
                ),
            );
        }
    }
    attrs.insert(
        "dateObserved",
        Attribute::new(json!(format_datetime(unit.reported_at)), "DateTime"),
    );
    attrs
}

/// Whether a measure name may name an NGSI attribute.
fn is_attribute_name(name: &str) -> bool {
    name != "id" && name != "type" && check_name(NameKind::AttrName, name).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_model::DeviceInfo;

    #[test]
    fn measures_become_attributes_with_unit_metadata() {
        let unit = DataUnit {
            data_id: "d".into(),
            reported_at: 1_700_000_000_123,
            received_at: 0,
            channel: "c".into(),
            device: DeviceInfo {
                id: "dev".into(),
                static_data: serde_json::from_value(json!({"location":{"lat":41.15,"lon":-8.61}}))
                    .unwrap(),
                ..DeviceInfo::default()
            },
            measures: serde_json::from_value(json!({
                "temperature": {"celsius": 37}, "battery": 92, "gps": {"a": 1, "b": 2}
            }))
            .unwrap(),
        };
        let attrs = unit_attributes(&unit);
        let t = attrs.get("temperature").unwrap();
        assert_eq!(
            (t.value.clone(), t.attr_type.as_str()),
            (json!(37), "Number")
        );
        assert_eq!(t.metadata.get("unit").unwrap().value, json!("celsius"));
        assert_eq!(attrs.get("battery").unwrap().value, json!(92));
        assert_eq!(attrs.get("gps").unwrap().attr_type, "StructuredValue");
        let loc = attrs.get("location").unwrap();
        assert_eq!(loc.attr_type, "geo:json");
        assert_eq!(
            loc.value,
            json!({"type":"Point","coordinates":[-8.61, 41.15]})
        );
        assert_eq!(
            attrs.get("dateObserved").unwrap().value,
            json!("2023-11-14T22:13:20.123Z")
        );
    }

    /// A measure can never set the entity's id or type, nor make an
    /// attribute NGSI cannot name.
    #[test]
    fn measures_ngsi_cannot_name_are_not_attributes() {
        let unit = DataUnit {
            data_id: "d".into(),
            reported_at: 0,
            received_at: 0,
            channel: "c".into(),
            device: DeviceInfo::default(),
            measures: serde_json::from_value(json!({
                "id": "spoof", "type": "Other", "": 1, "a<b": 2, "bell\u{7}": 3,
                "x".repeat(300): 4, "ok": 5
            }))
            .unwrap(),
        };
        let attrs = unit_attributes(&unit);
        let names: Vec<&str> = attrs.iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["ok", "dateObserved"]);
    }
}
