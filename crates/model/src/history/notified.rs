//! An entity of a notification to QuantumLeap's `POST /v2/notify`, read
//! as QuantumLeap 1.0 reads it before storing it: NGSIv2 or NGSI-LD
//! shaped, one typed value per attribute, plus the times its time index
//! is taken from. Nothing here refuses what QuantumLeap stores; what it
//! cannot read at all (an attribute that is not an object, a location that
//! is not one) is an error, which refuses the whole notification.
//!
//! What QuantumLeap makes of an attribute (`{"type","value",…}`):
//! - no `type`, or NGSI-LD's `Property`: the type its value has
//!   (`Integer`, `Number`, `Boolean`, `Text`, `Array`, `StructuredValue`,
//!   `DateTime` for a date text or a `{"@type":"DateTime","@value"}`
//!   object); no value is `Text` null;
//! - NGSI-LD's `Relationship`: its `object` is its value;
//! - `DateTime`/`ISO8601` whose value is not a date: null;
//! - an empty text where the type is not `Text`: null;
//! - `geo:point` texts (and the points of `geo:line`, `geo:polygon`,
//!   `geo:box`) rewritten as `"lat, lon"` with Python's floats; GeoJSON
//!   (`geo:json`, NGSI-LD's `GeoProperty`) with float coordinates, a
//!   `Feature` as null;
//! - the attribute named `location`, of any of those types, becomes a
//!   `geo:json` geometry (simple types converted, longitude first, to six
//!   decimals) and brings a `location_centroid` attribute: the mean of its
//!   points as a `geo:point` text.
//!
//! Every other key of an attribute (`metadata`, `unitCode`, `createdAt`,
//! sub-properties…) is not stored; NGSI-LD's `observedAt` and
//! `modifiedAt` keys become the metadata the time index reads
//! ([`super::time_index`]), while NGSIv2 metadata of those names is not
//! read (QuantumLeap reads `TimeInstant`, `timestamp` and `dateModified`
//! metadata only). At the entity's level, `@context` and NGSI-LD's
//! `createdAt` are dropped and its `observedAt` and `modifiedAt` are
//! times, not attributes.

use serde_json::{Map, Value};
use thiserror::Error;

use super::python::float_repr;
use crate::ngsi::{parse_datetime, Attribute, Entity, Metadata, MetadataMap};

/// The attribute QuantumLeap derives from `location`.
const CENTROID: &str = "location_centroid";

/// The types QuantumLeap reads as a location.
const GEO_TYPES: [&str; 6] = [
    "geo:json",
    "GeoProperty",
    "geo:point",
    "geo:line",
    "geo:polygon",
    "geo:box",
];

/// An entity of a notification, ready to be recorded: its attributes as
/// QuantumLeap stores them, and the entity-level NGSI-LD times that come
/// before `dateModified` in its time index.
#[derive(Debug, Clone, PartialEq)]
pub struct NotifiedEntity {
    /// The attributes to record, with the metadata the time index reads;
    /// `date_modified` is the entity's `dateModified` attribute, when it
    /// is a date.
    pub entity: Entity,
    /// NGSI-LD's entity-level `observedAt`.
    pub observed_at: Option<i64>,
    /// NGSI-LD's entity-level `modifiedAt`.
    pub modified_at: Option<i64>,
}

/// Why a notified entity cannot be read; its `Display` is the text weft
/// answers (after `Notification not processed or not updated: `) where
/// QuantumLeap fails with an internal error.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NotifiedError {
    /// An attribute that is not an object (a `keyValues` notification).
    #[error(
        "attribute {attr} of entity {entity} is not in normalized form (keyValues notifications \
         are not supported)"
    )]
    NotNormalized {
        /// The entity's id.
        entity: String,
        /// The attribute's name.
        attr: String,
    },
    /// A location whose value is not one of its type.
    #[error("attribute {attr} of entity {entity} is not a valid {attr_type} value")]
    BadLocation {
        /// The entity's id.
        entity: String,
        /// The attribute's name.
        attr: String,
        /// Its type.
        attr_type: String,
    },
}

impl NotifiedEntity {
    /// Reads the entity `id` of type `entity_type` whose keys are `obj`
    /// (`id` and `type` among them, ignored). `Ok(None)` when none of its
    /// attributes has a value (a number, a boolean, or anything not
    /// empty): QuantumLeap drops such an entity.
    pub fn read(
        id: &str,
        entity_type: &str,
        obj: &Map<String, Value>,
    ) -> Result<Option<NotifiedEntity>, NotifiedError> {
        let mut notified = NotifiedEntity {
            entity: Entity::new(id, entity_type),
            observed_at: None,
            modified_at: None,
        };
        for (name, v) in obj {
            let entity_key = match name.as_str() {
                "id" | "type" | "@context" => continue,
                "observedAt" | "modifiedAt" | "createdAt" | "deletedAt" => !v.is_object(),
                _ => false,
            };
            if entity_key {
                let time = v.as_str().and_then(parse_datetime);
                match name.as_str() {
                    "observedAt" => notified.observed_at = time,
                    "modifiedAt" => notified.modified_at = time,
                    _ => {}
                }
                continue;
            }
            let Value::Object(attr) = v else {
                return Err(NotifiedError::NotNormalized {
                    entity: id.to_string(),
                    attr: name.clone(),
                });
            };
            let (attr, centroid) =
                read_attr(name, attr).ok_or_else(|| NotifiedError::BadLocation {
                    entity: id.to_string(),
                    attr: name.clone(),
                    attr_type: attr
                        .get("type")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string(),
                })?;
            notified.entity.attrs.insert(name.clone(), attr);
            if let Some(centroid) = centroid {
                notified.entity.attrs.insert(CENTROID.to_string(), centroid);
            }
        }
        let attrs = &notified.entity.attrs;
        if !attrs.iter().any(|(_, a)| has_value(&a.value)) {
            return Ok(None);
        }
        notified.entity.date_modified = attrs
            .get("dateModified")
            .and_then(|a| a.value.as_str())
            .and_then(parse_datetime)
            .unwrap_or(0);
        Ok(Some(notified))
    }

    /// The time index the entity is filed under ([`super::time_index`]'s
    /// order): its entity-level `observedAt` and `modifiedAt` are its own
    /// times; `dateObserved`, weft's device data, means nothing here.
    pub fn time_index(&self, header_attr: Option<&str>, arrival: i64) -> i64 {
        super::filed_under(
            &self.entity,
            header_attr,
            &[self.observed_at, self.modified_at],
            arrival,
        )
    }
}

impl From<Entity> for NotifiedEntity {
    /// An NGSIv2 entity notified as it is, without NGSI-LD times.
    fn from(entity: Entity) -> Self {
        NotifiedEntity {
            entity,
            observed_at: None,
            modified_at: None,
        }
    }
}

/// Whether a value counts as one for QuantumLeap's filter: an integer or
/// a boolean, or anything truthy.
fn has_value(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(_) => true,
        Value::Number(n) => n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// One attribute as QuantumLeap stores it, and for `location` the
/// centroid it adds; `None` when a location's value is not one.
fn read_attr(name: &str, o: &Map<String, Value>) -> Option<(Attribute, Option<Attribute>)> {
    let given_type = o.get("type").and_then(Value::as_str);
    let value = match (o.get("value"), given_type) {
        (Some(v), _) => v.clone(),
        (None, Some("Relationship")) => o.get("object").cloned().unwrap_or(Value::Null),
        (None, _) => Value::Null,
    };
    let (attr_type, value) = match given_type {
        None | Some("Property") => inferred(value),
        Some(t) => (t.to_string(), value),
    };
    let mut centroid = None;
    let value = match attr_type.as_str() {
        _ if value.is_null() => value,
        "DateTime" | "ISO8601" => date_or_null(value),
        "Text" => value,
        _ if value.as_str() == Some("") => Value::Null,
        t if GEO_TYPES.contains(&t) && name == "location" => {
            let (geometry, points) = location(t, &value)?;
            centroid = mean(&points)
                .map(|p| Attribute::new(Value::String(lat_lon_text(p)), "geo:point".to_string()));
            let mut attr = Attribute::new(geometry, "geo:json".to_string());
            attr.metadata = time_metadata(o);
            return Some((attr, centroid));
        }
        t if GEO_TYPES.contains(&t) => stored_geo(t, &value)?,
        _ => value,
    };
    let mut attr = Attribute::new(value, attr_type);
    attr.metadata = time_metadata(o);
    Some((attr, centroid))
}

/// The type QuantumLeap gives a value that has none of its own (or
/// NGSI-LD's `Property`), with the value it stores.
fn inferred(value: Value) -> (String, Value) {
    let attr_type = match &value {
        Value::Null => "Text",
        Value::Bool(_) => "Boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "Integer",
        Value::Number(_) => "Number",
        Value::String(s) if parse_datetime(s).is_some() => "DateTime",
        Value::String(_) => "Text",
        Value::Array(_) => "Array",
        Value::Object(o) if o.get("@type").and_then(Value::as_str) == Some("DateTime") => {
            let date = o.get("@value").cloned().unwrap_or(Value::Null);
            return ("DateTime".to_string(), date_or_null(date));
        }
        Value::Object(_) => "StructuredValue",
    };
    (attr_type.to_string(), value)
}

/// A date text as it is, anything else null.
fn date_or_null(value: Value) -> Value {
    match value.as_str().map(parse_datetime) {
        Some(Some(_)) => value,
        _ => Value::Null,
    }
}

/// The metadata the time index reads: NGSIv2 metadata but `observedAt`
/// and `modifiedAt`, which are NGSI-LD's keys of the attribute instead.
fn time_metadata(o: &Map<String, Value>) -> MetadataMap {
    let mut metadata = MetadataMap::new();
    if let Some(Value::Object(given)) = o.get("metadata") {
        for (name, md) in given {
            if matches!(name.as_str(), "observedAt" | "modifiedAt") {
                continue;
            }
            if let Some(value) = md.get("value") {
                let md_type = md.get("type").and_then(Value::as_str).unwrap_or_default();
                metadata.insert(
                    name.clone(),
                    Metadata {
                        value: value.clone(),
                        md_type: md_type.to_string(),
                    },
                );
            }
        }
    }
    for key in ["observedAt", "modifiedAt"] {
        if let Some(value @ Value::String(_)) = o.get(key) {
            metadata.insert(
                key.to_string(),
                Metadata {
                    value: value.clone(),
                    md_type: "DateTime".to_string(),
                },
            );
        }
    }
    metadata
}

/// A point as `(lat, lon)`.
type LatLon = (f64, f64);

/// A `"lat, lon"` text's point (any finite numbers, as QuantumLeap takes
/// them).
fn lat_lon(text: &str) -> Option<LatLon> {
    let (lat, lon) = text.split_once(',')?;
    let num = |s: &str| s.trim().parse::<f64>().ok().filter(|f| f.is_finite());
    Some((num(lat)?, num(lon)?))
}

/// A point as QuantumLeap writes a `geo:point`: `"41.0, 2.5"`.
fn lat_lon_text((lat, lon): LatLon) -> String {
    format!("{}, {}", float_repr(lat), float_repr(lon))
}

/// The points of a simple location's value (one text, or an array of
/// them).
fn simple_points(attr_type: &str, value: &Value) -> Option<Vec<LatLon>> {
    match (attr_type, value) {
        ("geo:point", Value::String(s)) => Some(vec![lat_lon(s)?]),
        ("geo:point", _) => None,
        (_, Value::Array(items)) => items.iter().map(|i| lat_lon(i.as_str()?)).collect(),
        _ => None,
    }
}

/// A location attribute's value as QuantumLeap stores it under its own
/// type (not named `location`).
fn stored_geo(attr_type: &str, value: &Value) -> Option<Value> {
    if matches!(attr_type, "geo:json" | "GeoProperty") {
        return geojson_value(value);
    }
    let mut texts: Vec<Value> = simple_points(attr_type, value)?
        .into_iter()
        .map(|p| Value::String(lat_lon_text(p)))
        .collect();
    if attr_type == "geo:point" {
        return texts.pop();
    }
    Some(Value::Array(texts))
}

/// A GeoJSON value as QuantumLeap stores it: a geometry with float
/// coordinates; a `Feature` or `FeatureCollection` is null. `None` when it
/// is not an object.
fn geojson_value(value: &Value) -> Option<Value> {
    let obj = value.as_object()?;
    if matches!(
        obj.get("type").and_then(Value::as_str),
        Some("Feature" | "FeatureCollection")
    ) {
        return Some(Value::Null);
    }
    let mut geometry = obj.clone();
    if let Some(coordinates) = geometry.get_mut("coordinates") {
        as_floats(coordinates);
    }
    Some(Value::Object(geometry))
}

/// Every number in `v` made a float (`1` → `1.0`), as PostGIS gives them
/// back.
fn as_floats(v: &mut Value) {
    match v {
        Value::Number(n) => {
            if let Some(f) = n.as_f64() {
                *v = Value::from(f);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(as_floats),
        _ => {}
    }
}

/// The `location` attribute as QuantumLeap stores it: a GeoJSON geometry,
/// with the points its centroid is the mean of (those of the value as
/// given: a `geo:box`'s two corners). `None` when it is no location.
fn location(attr_type: &str, value: &Value) -> Option<(Value, Vec<LatLon>)> {
    if matches!(attr_type, "geo:json" | "GeoProperty") {
        let mut points = Vec::new();
        geojson_points(value, &mut points);
        return Some((geojson_value(value)?, points));
    }
    let points = simple_points(attr_type, value)?;
    // Converted positions are written with six decimals.
    let position = |&(lat, lon): &LatLon| Value::from(vec![six(lon), six(lat)]);
    let ring = |ps: &[LatLon]| Value::Array(ps.iter().map(position).collect());
    let (kind, coordinates) = match (attr_type, points.as_slice()) {
        ("geo:point", [p]) => ("Point", position(p)),
        ("geo:line", ps) => ("LineString", ring(ps)),
        ("geo:polygon", ps) => ("Polygon", Value::Array(vec![ring(ps)])),
        ("geo:box", [a, b]) => {
            let corners = [*b, (b.0, a.1), *a, (a.0, b.1), *b];
            ("Polygon", Value::Array(vec![ring(&corners)]))
        }
        _ => return None,
    };
    let mut geometry = Map::new();
    geometry.insert("type".into(), kind.into());
    geometry.insert("coordinates".into(), coordinates);
    Some((Value::Object(geometry), points))
}

/// A coordinate to six decimals.
fn six(f: f64) -> f64 {
    format!("{f:.6}").parse().unwrap_or(f)
}

/// Every position (`[lon, lat, …]`) under a `coordinates` key of a GeoJSON
/// value, a feature's geometry included.
fn geojson_points(v: &Value, out: &mut Vec<LatLon>) {
    fn positions(v: &Value, out: &mut Vec<LatLon>) {
        let Value::Array(items) = v else { return };
        match (
            items.first().and_then(Value::as_f64),
            items.get(1).and_then(Value::as_f64),
        ) {
            (Some(lon), Some(lat)) => out.push((lat, lon)),
            _ => items.iter().for_each(|i| positions(i, out)),
        }
    }
    match v {
        Value::Object(o) => {
            for (k, v) in o {
                if k == "coordinates" {
                    positions(v, out);
                } else {
                    geojson_points(v, out);
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|i| geojson_points(i, out)),
        _ => {}
    }
}

/// The mean of the points, summed in order.
fn mean(points: &[LatLon]) -> Option<LatLon> {
    if points.is_empty() {
        return None;
    }
    let n = points.len() as f64;
    let (lat, lon) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (lat, lon)| (a + lat, b + lon));
    Some((lat / n, lon / n))
}

#[cfg(test)]
#[path = "notified_tests.rs"]
mod tests;
