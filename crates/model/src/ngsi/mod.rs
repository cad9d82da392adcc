//! NGSIv2 context entities: the pure model behind weft's `/v2` surface.
//!
//! An [`Entity`] holds [`Attribute`]s, which hold [`Metadata`]; both maps
//! keep insertion order ([`OrderedMap`]), because Orion renders attributes
//! in the order they were created (`1049_values_mode/attrs_order.test`
//! checks the raw body `{"id":"E","type":"T","A":…,"B":…}`) and, when an
//! `attrs` filter is given, in the order of that filter.
//!
//! The submodules follow the life of a request:
//! - [`parse`]: request payloads (normalized and `keyValues`) into the model,
//!   with Orion's validation and its exact error texts;
//! - [`update`]: append, update, replace, delete and set-value as pure
//!   functions that report what changed (for subscriptions);
//! - [`render`]: the model into Orion's representations (normalized,
//!   keyValues, values, unique, simplified*);
//! - [`subscription`]: subscriptions, parsed and rendered as Orion does;
//! - [`change`]: a committed change to an entity, as its consumers take it;
//! - [`operators`]: update operators (`$inc`, `$push`, `$set`, …) resolved
//!   against the current value;
//! - [`datetime`]: the ISO 8601 forms Orion accepts for `DateTime` values;
//! - [`number`]: numbers written as Orion writes them, in every JSON body.
//!
//! Errors are [`NgsiError`]s carrying Orion's status, name and text, so the
//! HTTP layer only serialises them.

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{json, Value};
use std::fmt;
use std::marker::PhantomData;

pub mod change;
pub mod datetime;
pub mod number;
pub mod operators;
pub mod parse;
pub mod registration;
pub mod render;
pub mod subscription;
pub mod tenancy;
pub mod update;

pub use change::{Alteration, EntityChange, Origin};
pub use datetime::{format_datetime, parse_datetime};
pub use parse::{
    check_name, parse_attr, parse_attr_value_text, parse_attrs, parse_body, parse_entity,
    AttrsBody, NameKind,
};
pub use render::{render, render_attr, render_with, Format, RenderContext};
pub use update::{
    append, delete_attr, replace, set_attr_value, update, update_attr, AttrChange, ChangeKind,
    UpdateOptions, UpdateOutcome,
};

/// Entity type used when a request does not give one.
pub const DEFAULT_ENTITY_TYPE: &str = "Thing";

/// The attribute that makes an entity transient (Orion's "Transient
/// entities"): a `DateTime` value is the instant the entity expires.
pub const EXPIRATION_ATTR: &str = "dateExpires";

/// Whether `t` is a date type (`DateTime` or its alias `ISO8601`).
pub fn is_date_type(t: &str) -> bool {
    t == "DateTime" || t == "ISO8601"
}

/// Maximum length of identifiers (ids, types, names).
pub const MAX_NAME_LEN: usize = 256;

/// The error of an NGSIv2 operation, as Orion reports it: the HTTP status,
/// the error name and the human text. Orion's functional tests compare the
/// texts literally, so they are built only by the constructors below.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{error}: {description}")]
pub struct NgsiError {
    /// HTTP status code.
    pub status: u16,
    /// Orion's error name (`BadRequest`, `NotFound`, ...).
    pub error: &'static str,
    /// Orion's description text.
    pub description: String,
}

impl NgsiError {
    /// Any error with its three parts.
    pub fn new(status: u16, error: &'static str, description: impl Into<String>) -> Self {
        NgsiError {
            status,
            error,
            description: description.into(),
        }
    }

    /// 400 BadRequest with the given text.
    pub fn bad_request(description: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", description)
    }

    /// 400 ParseError: the body is not JSON Orion accepts.
    pub fn parse_error() -> Self {
        Self::new(400, "ParseError", "Errors found in incoming JSON buffer")
    }

    /// 404 NotFound for an entity that does not exist.
    pub fn entity_not_found() -> Self {
        Self::new(
            404,
            "NotFound",
            "The requested entity has not been found. Check type and id",
        )
    }

    /// 404 NotFound for an attribute the entity does not have
    /// (`0993_DELETE_v2_entity_attr/delete_not_exist_attr.test`).
    pub fn attribute_not_found() -> Self {
        Self::new(
            404,
            "NotFound",
            "The entity does not have such an attribute",
        )
    }

    /// 409 TooManyResults: an id without type matches several entities.
    pub fn too_many_results() -> Self {
        Self::new(
            409,
            "TooManyResults",
            "More than one matching entity. Please refine your query",
        )
    }

    /// 422 Unprocessable with the given text.
    pub fn unprocessable(description: impl Into<String>) -> Self {
        Self::new(422, "Unprocessable", description)
    }

    /// 422 PartialUpdate: part of the request was applied, part was not.
    pub fn partial_update(description: impl Into<String>) -> Self {
        Self::new(422, "PartialUpdate", description)
    }

    /// 422 "Already Exists": creating an entity that exists
    /// (`1187_empty_attribute_in_create`).
    pub fn already_exists() -> Self {
        Self::unprocessable("Already Exists")
    }

    /// 413 NoResourcesAvailable: a second location attribute.
    pub fn too_many_locations() -> Self {
        Self::new(
            413,
            "NoResourcesAvailable",
            "You cannot use more than one geo location attribute when creating an entity. \
             Use ignoreType metadata if you want to add additional informative locations.",
        )
    }

    /// The response body `{"error":…,"description":…}`.
    pub fn to_json(&self) -> Value {
        json!({"error": self.error, "description": self.description})
    }
}

/// A string-keyed map that keeps insertion order, for attributes and
/// metadata. Entities have few attributes, so a vector with linear lookup
/// is both the simplest and the fastest structure here. Serialises as a
/// JSON object in order.
#[derive(Debug, Clone, PartialEq)]
pub struct OrderedMap<V> {
    entries: Vec<(String, V)>,
}

impl<V> Default for OrderedMap<V> {
    fn default() -> Self {
        OrderedMap {
            entries: Vec::new(),
        }
    }
}

impl<V> OrderedMap<V> {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the map has no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The value under `key`.
    pub fn get(&self, key: &str) -> Option<&V> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The value under `key`, mutably.
    pub fn get_mut(&mut self, key: &str) -> Option<&mut V> {
        self.entries
            .iter_mut()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }

    /// Whether `key` is present.
    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// Inserts or replaces; a replaced entry keeps its position. Returns
    /// the previous value.
    pub fn insert(&mut self, key: impl Into<String>, value: V) -> Option<V> {
        let key = key.into();
        match self.get_mut(&key) {
            Some(slot) => Some(std::mem::replace(slot, value)),
            None => {
                self.entries.push((key, value));
                None
            }
        }
    }

    /// Removes `key`, keeping the order of the others.
    pub fn remove(&mut self, key: &str) -> Option<V> {
        let pos = self.entries.iter().position(|(k, _)| k == key)?;
        Some(self.entries.remove(pos).1)
    }

    /// Entries in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &V)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Entries in order, values mutable (keys stay as they are).
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&str, &mut V)> {
        self.entries.iter_mut().map(|(k, v)| (k.as_str(), v))
    }

    /// Keys in order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(k, _)| k.as_str())
    }
}

impl<V> IntoIterator for OrderedMap<V> {
    type Item = (String, V);
    type IntoIter = std::vec::IntoIter<(String, V)>;
    fn into_iter(self) -> Self::IntoIter {
        self.entries.into_iter()
    }
}

impl<V> FromIterator<(String, V)> for OrderedMap<V> {
    fn from_iter<I: IntoIterator<Item = (String, V)>>(iter: I) -> Self {
        let mut map = OrderedMap::new();
        for (k, v) in iter {
            map.insert(k, v);
        }
        map
    }
}

impl<V: Serialize> Serialize for OrderedMap<V> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.entries.len()))?;
        for (k, v) in &self.entries {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for OrderedMap<V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct OrderedVisitor<V>(PhantomData<V>);
        impl<'de, V: Deserialize<'de>> Visitor<'de> for OrderedVisitor<V> {
            type Value = OrderedMap<V>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
                let mut map = OrderedMap::new();
                while let Some((k, v)) = access.next_entry::<String, V>()? {
                    map.insert(k, v);
                }
                Ok(map)
            }
        }
        deserializer.deserialize_map(OrderedVisitor(PhantomData))
    }
}

/// One metadata item of an attribute (`{"value":…,"type":…}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metadata {
    /// The value: any JSON (compound values are allowed, see
    /// `1068_metadata_value_as_compound`).
    #[serde(rename = "v")]
    pub value: Value,
    /// The type; defaults by JSON type like attribute types.
    #[serde(rename = "t")]
    pub md_type: String,
}

/// The metadata of an attribute, in insertion order.
pub type MetadataMap = OrderedMap<Metadata>;

/// An attribute of an entity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attribute {
    /// The value: any JSON. `DateTime` values are kept normalised
    /// (`YYYY-MM-DDThh:mm:ss.sssZ`).
    #[serde(rename = "v")]
    pub value: Value,
    /// The type (`Number`, `Text`, `DateTime`, `geo:json`, user types...).
    #[serde(rename = "t")]
    pub attr_type: String,
    /// User metadata.
    #[serde(rename = "m", default, skip_serializing_if = "OrderedMap::is_empty")]
    pub metadata: MetadataMap,
    /// Creation time, epoch milliseconds (builtin metadata `dateCreated`).
    #[serde(rename = "c", default)]
    pub date_created: i64,
    /// Last modification time, epoch milliseconds (builtin metadata
    /// `dateModified`).
    #[serde(rename = "u", default)]
    pub date_modified: i64,
}

impl Attribute {
    /// An attribute with the given value and type, no metadata, no dates.
    pub fn new(value: Value, attr_type: impl Into<String>) -> Self {
        Attribute {
            value,
            attr_type: attr_type.into(),
            metadata: MetadataMap::new(),
            date_created: 0,
            date_modified: 0,
        }
    }

    /// Whether this attribute is a location that counts towards the
    /// one-location-per-entity limit (a geo type without `ignoreType`
    /// metadata set to true, and not null: Orion 3.1.0).
    pub fn is_location(&self) -> bool {
        is_geo_type(&self.attr_type)
            && !self.value.is_null()
            && !matches!(
                self.metadata.get("ignoreType").map(|m| &m.value),
                Some(Value::Bool(true))
            )
    }
}

/// The attributes of an entity, in insertion order.
pub type AttrMap = OrderedMap<Attribute>;

/// An NGSIv2 context entity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entity {
    /// Entity id.
    pub id: String,
    /// Entity type (`Thing` when the creator gave none).
    #[serde(rename = "type")]
    pub entity_type: String,
    /// User attributes, in creation order.
    #[serde(default)]
    pub attrs: AttrMap,
    /// Creation time, epoch milliseconds (builtin attribute `dateCreated`).
    #[serde(rename = "c", default)]
    pub date_created: i64,
    /// Last modification time, epoch milliseconds (builtin `dateModified`).
    #[serde(rename = "u", default)]
    pub date_modified: i64,
    /// Expiration time, epoch milliseconds: the value of the `dateExpires`
    /// attribute when it is a `DateTime` (a transient entity), kept in step
    /// by [`Entity::refresh_expiration`] so that queries and the expiry
    /// sweep need not parse dates. The attribute itself stays in `attrs`,
    /// with its metadata, hidden unless asked for by name.
    #[serde(rename = "x", default, skip_serializing_if = "Option::is_none")]
    pub date_expires: Option<i64>,
}

impl Entity {
    /// An entity without attributes.
    pub fn new(id: impl Into<String>, entity_type: impl Into<String>) -> Self {
        Entity {
            id: id.into(),
            entity_type: entity_type.into(),
            attrs: AttrMap::new(),
            date_created: 0,
            date_modified: 0,
            date_expires: None,
        }
    }

    /// Stamps a freshly parsed entity as created at `now` (epoch ms): the
    /// entity and every attribute get `dateCreated = dateModified = now`.
    pub fn stamp_created(&mut self, now: i64) {
        self.date_created = now;
        self.date_modified = now;
        for (_, attr) in self.attrs.entries.iter_mut() {
            attr.date_created = now;
            attr.date_modified = now;
        }
    }

    /// Recomputes [`Entity::date_expires`] from the `dateExpires`
    /// attribute; every operation that writes attributes ends with it.
    pub fn refresh_expiration(&mut self) {
        self.date_expires = self
            .attrs
            .get(EXPIRATION_ATTR)
            .filter(|a| is_date_type(&a.attr_type))
            .and_then(|a| a.value.as_str())
            .and_then(parse_datetime);
    }

    /// Whether the entity is transient and its time has come: from then on
    /// it is gone for every reader, and the expiry sweep deletes it.
    pub fn is_expired(&self, now: i64) -> bool {
        self.date_expires.is_some_and(|at| at <= now)
    }

    /// Orion allows one location attribute per entity; this is the check,
    /// to run on the entity that an operation would store (413 otherwise).
    pub fn check_locations(&self) -> Result<(), NgsiError> {
        if self.attrs.iter().filter(|(_, a)| a.is_location()).count() > 1 {
            return Err(NgsiError::too_many_locations());
        }
        Ok(())
    }

    /// Serialises the entity for storage (compact JSON).
    pub fn to_storage(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads an entity written by [`Entity::to_storage`]. Entities stored
    /// before the `dateExpires` attribute was kept in `attrs` get it back
    /// from the expiration date.
    pub fn from_storage(s: &str) -> Result<Self, serde_json::Error> {
        let mut entity: Entity = serde_json::from_str(s)?;
        if let (Some(at), false) = (
            entity.date_expires,
            entity.attrs.contains_key(EXPIRATION_ATTR),
        ) {
            let mut attr = Attribute::new(Value::String(format_datetime(at)), "DateTime");
            attr.date_created = entity.date_modified;
            attr.date_modified = entity.date_modified;
            entity.attrs.insert(EXPIRATION_ATTR, attr);
        }
        Ok(entity)
    }
}

/// Whether `t` names a geo attribute type (`geo:json` and the legacy
/// `geo:point`, `geo:line`, `geo:box`, `geo:polygon`).
pub fn is_geo_type(t: &str) -> bool {
    matches!(
        t,
        "geo:json" | "geo:point" | "geo:line" | "geo:box" | "geo:polygon"
    )
}

/// The type Orion gives a value that came without one: `Text`, `Number`,
/// `Boolean`, `StructuredValue` (objects and arrays) or `None` (null).
pub fn default_type(value: &Value) -> &'static str {
    match value {
        Value::String(_) => "Text",
        Value::Number(_) => "Number",
        Value::Bool(_) => "Boolean",
        Value::Object(_) | Value::Array(_) => "StructuredValue",
        Value::Null => "None",
    }
}

/// A new 24-hex-digit id for a subscription or registration, shaped like
/// the Mongo ObjectIds Orion hands out (clients and Orion's tests expect
/// exactly 24 lowercase hex digits): seconds since the epoch, a per-process
/// random part and a counter, so ids are unique and roughly time-ordered.
pub fn new_document_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static PROCESS: OnceLock<u64> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let process = *PROCESS.get_or_init(|| {
        std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish()
    });
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!(
        "{:08x}{:010x}{:06x}",
        secs as u32,
        process & 0xff_ffff_ffff,
        count & 0xff_ffff
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordered_map_keeps_insertion_order_and_position_on_replace() {
        let mut m = OrderedMap::new();
        m.insert("b", 1);
        m.insert("a", 2);
        m.insert("b", 3);
        assert_eq!(m.keys().collect::<Vec<_>>(), ["b", "a"]);
        assert_eq!(m.get("b"), Some(&3));
        assert_eq!(m.remove("b"), Some(3));
        assert_eq!(m.keys().collect::<Vec<_>>(), ["a"]);
    }

    #[test]
    fn storage_round_trip_keeps_everything_in_order() {
        let mut e = Entity::new("E", "T");
        let mut a = Attribute::new(json!(1), "Number");
        a.metadata.insert(
            "m",
            Metadata {
                value: json!({"x": [1, 2]}),
                md_type: "StructuredValue".into(),
            },
        );
        e.attrs.insert("Z", a);
        e.attrs.insert("A", Attribute::new(json!("x"), "Text"));
        e.attrs.insert(
            EXPIRATION_ATTR,
            Attribute::new(json!("2040-01-01T00:00:00.000Z"), "DateTime"),
        );
        e.stamp_created(1234);
        e.refresh_expiration();
        assert!(e.date_expires.is_some());
        let s = e.to_storage();
        let back = Entity::from_storage(&s).unwrap();
        assert_eq!(back, e);
        assert_eq!(
            back.attrs.keys().collect::<Vec<_>>(),
            ["Z", "A", EXPIRATION_ATTR]
        );
    }

    /// Entities stored when the expiration lived outside `attrs` get their
    /// `dateExpires` attribute back.
    #[test]
    fn stored_expiration_without_attribute_is_restored() {
        let back =
            Entity::from_storage(r#"{"id":"E","type":"T","attrs":{},"c":5,"u":6,"x":99}"#).unwrap();
        let attr = back.attrs.get(EXPIRATION_ATTR).unwrap();
        assert_eq!(attr.value, json!("1970-01-01T00:00:00.099Z"));
        assert_eq!(attr.attr_type, "DateTime");
        assert!(back.is_expired(99) && !back.is_expired(98));
    }

    #[test]
    fn errors_render_as_orion_bodies() {
        assert_eq!(
            NgsiError::entity_not_found().to_json(),
            json!({"error":"NotFound","description":"The requested entity has not been found. Check type and id"})
        );
        assert_eq!(NgsiError::parse_error().status, 400);
    }

    #[test]
    fn second_location_is_rejected_unless_ignore_type() {
        let mut e = Entity::new("E", "T");
        let p = json!({"type":"Point","coordinates":[1,2]});
        e.attrs.insert("l1", Attribute::new(p.clone(), "geo:json"));
        assert!(e.check_locations().is_ok());
        e.attrs.insert("l2", Attribute::new(p.clone(), "geo:json"));
        assert_eq!(e.check_locations().unwrap_err().status, 413);
        let mut ignored = Attribute::new(p, "geo:json");
        ignored.metadata.insert(
            "ignoreType",
            Metadata {
                value: json!(true),
                md_type: "Boolean".into(),
            },
        );
        e.attrs.insert("l2", ignored);
        assert!(e.check_locations().is_ok());
        // A null location is no location (Orion 3.1.0).
        e.attrs
            .insert("l3", Attribute::new(Value::Null, "geo:point"));
        assert!(e.check_locations().is_ok());
    }
}
