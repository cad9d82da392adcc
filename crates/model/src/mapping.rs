//! The processor stage's field mappings: `{"from":"temperature","to":"temperature.celsius"}`
//! copies a body field into a data unit. Targets `dataId`, `reportedAt`,
//! `device.id` and `device.name` set the unit's identity; `measures.<path>`
//! and any other path land under `measures`.

use serde_json::{Map, Value};

use crate::Mapping;

/// What mappings (or a codec) said about a data unit before the pipeline
/// fills in defaults and device records.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PartialUnit {
    /// `dataId`, if a mapping or codec gave one.
    pub data_id: Option<String>,
    /// `reportedAt` in epoch ms, if given; `Err` when what was given is no
    /// time ([`crate::uplink::read_reported_time`] says which are).
    pub reported_at: Option<Result<i64, String>>,
    /// `device.id`, if given.
    pub device_id: Option<String>,
    /// `device.name`, if given.
    pub device_name: Option<String>,
    /// Measures gathered so far.
    pub measures: Map<String, Value>,
}

/// The value at a dotted path (`a.b.c`) inside `value`, if any. A path
/// segment that is a number also indexes arrays.
pub fn get_path<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    let mut cur = value;
    for seg in path.split('.') {
        cur = match cur {
            Value::Object(map) => map.get(seg)?,
            Value::Array(items) => items.get(seg.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(cur)
}

/// Sets `value` at dotted `path` inside `map`, creating intermediate
/// objects and replacing non-objects in the way.
pub fn set_path(map: &mut Map<String, Value>, path: &str, value: Value) {
    let mut segs = path.split('.').peekable();
    let mut cur = map;
    while let Some(seg) = segs.next() {
        if segs.peek().is_none() {
            cur.insert(seg.to_string(), value);
            return;
        }
        let slot = cur
            .entry(seg.to_string())
            .or_insert_with(|| Value::Object(Map::new()));
        if !slot.is_object() {
            *slot = Value::Object(Map::new());
        }
        cur = slot.as_object_mut().expect("just made an object");
    }
}

/// A JSON value as a string id: strings as they are, numbers printed.
pub fn value_as_id(value: &Value) -> Option<String> {
    match value {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// A JSON value as epoch milliseconds: integers, floats, numeric strings.
pub fn value_as_millis(value: &Value) -> Option<i64> {
    match value {
        Value::Number(n) => n.as_i64().or_else(|| n.as_f64().map(|f| f as i64)),
        Value::String(s) => s.trim().parse::<i64>().ok(),
        _ => None,
    }
}

/// Applies `mappings` in order to `source`, producing a partial unit. A
/// mapping whose `from` is missing in the source is skipped: a device that
/// omits a field simply has no such measure.
pub fn apply(mappings: &[Mapping], source: &Value) -> PartialUnit {
    let mut unit = PartialUnit::default();
    for m in mappings {
        let Some(v) = get_path(source, &m.from) else {
            continue;
        };
        match m.to.as_str() {
            "dataId" => unit.data_id = value_as_id(v),
            "reportedAt" => {
                unit.reported_at = crate::uplink::read_optional_time(
                    &format!("'{}' (mapped to reportedAt)", m.from),
                    Some(v),
                )
                .transpose()
            }
            "device.id" => unit.device_id = value_as_id(v),
            "device.name" => unit.device_name = value_as_id(v),
            to => {
                let path = to.strip_prefix("measures.").unwrap_or(to);
                set_path(&mut unit.measures, path, v.clone());
            }
        }
    }
    unit
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn m(from: &str, to: &str) -> Mapping {
        Mapping {
            from: from.into(),
            to: to.into(),
        }
    }

    /// The seed's processor turns the load test's Helium body into the
    /// documented data unit fields.
    #[test]
    fn seed_mappings_produce_identity_and_nested_measures() {
        let body = json!({"temperature":37,"humidity":61,"id":"dev-1","name":"P00010",
                          "reported_at":1700000000123i64,"uuid":"u-1","downlink_url":"x"});
        let maps = vec![
            m("temperature", "temperature.celsius"),
            m("humidity", "airHumidity.relativePercentage"),
            m("uuid", "dataId"),
            m("id", "device.id"),
            m("name", "device.name"),
            m("reported_at", "reportedAt"),
        ];
        let u = apply(&maps, &body);
        assert_eq!(u.data_id.as_deref(), Some("u-1"));
        assert_eq!(u.device_id.as_deref(), Some("dev-1"));
        assert_eq!(u.device_name.as_deref(), Some("P00010"));
        assert_eq!(u.reported_at, Some(Ok(1700000000123)));
        assert_eq!(
            Value::Object(u.measures),
            json!({"temperature":{"celsius":37},"airHumidity":{"relativePercentage":61}})
        );
    }

    #[test]
    fn missing_sources_are_skipped_and_explicit_measures_prefix_is_stripped() {
        let u = apply(
            &[m("a.b", "measures.x.y"), m("nope", "z")],
            &json!({"a":{"b":1.5}}),
        );
        assert_eq!(Value::Object(u.measures), json!({"x":{"y":1.5}}));
    }

    #[test]
    fn paths_index_arrays_and_millis_accept_strings() {
        let v = json!({"a":[{"b":"7"}]});
        assert_eq!(get_path(&v, "a.0.b"), Some(&json!("7")));
        assert_eq!(value_as_millis(&json!("7")), Some(7));
        assert_eq!(value_as_millis(&json!(7.9)), Some(7));
        assert_eq!(value_as_id(&json!(12)), Some("12".into()));
        assert_eq!(value_as_id(&json!("")), None);
    }
}
