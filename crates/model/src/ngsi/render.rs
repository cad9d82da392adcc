//! The model into Orion's representations.
//!
//! Order, as Orion renders (asked of the real Orion 4.7.0; also
//! `1049_values_mode/attrs_order.test`, compared byte for byte): `id`,
//! `type`, then the attributes sorted by name whatever order they were
//! created in, or in the order of the `attrs` filter when one without `*`
//! is given; each attribute renders `type`, `value`, `metadata`, and its
//! metadata sorted by name the same way — but in notifications, which
//! list their attributes themselves, the metadata keep their own order. Object key order reaches
//! the wire only if serde_json keeps insertion order (its
//! `preserve_order` feature); `values`/`unique` arrays are ordered anyway.
//!
//! Builtins (`0876_entity_dates`): the attributes `dateCreated`,
//! `dateModified`, `dateExpires` and `servicePath` appear only when named
//! in `attrs`, and a user attribute of the same name wins over the builtin; the metadata
//! `dateCreated`, `dateModified`, `previousValue`, `actionType` appear only
//! when named in `metadata`. `*` in either list means all user items.

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::collections::HashSet;

use super::update::json_eq;
use super::{format_datetime, AttrChange, Attribute, Entity, EXPIRATION_ATTR};

/// A representation of entities (`options=` / `attrsFormat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `{"id","type","A":{"type","value","metadata"}}`.
    Normalized,
    /// `{"id","type","A":value}` (`options=keyValues`).
    KeyValues,
    /// `[value, …]` in `attrs` order (`options=values`).
    Values,
    /// Like `Values` without repeated values (`options=unique`).
    Unique,
    /// Notification format: the entity as in `Normalized`, without the
    /// `subscriptionId`/`data` envelope (the notifier omits it).
    SimplifiedNormalized,
    /// Notification format: the entity as in `KeyValues`, no envelope.
    SimplifiedKeyValues,
}

impl Format {
    /// The format named by an `options` word or an `attrsFormat` value.
    pub fn from_name(name: &str) -> Option<Format> {
        Some(match name {
            "normalized" => Format::Normalized,
            "keyValues" => Format::KeyValues,
            "values" => Format::Values,
            "unique" => Format::Unique,
            "simplifiedNormalized" => Format::SimplifiedNormalized,
            "simplifiedKeyValues" => Format::SimplifiedKeyValues,
            _ => return None,
        })
    }
}

/// What notifications add to a rendering: the attributes before the
/// update (builtin metadata `previousValue`) and the kind of update
/// (builtin metadata `actionType`: `update`, `append` or `delete`).
#[derive(Debug, Clone, Copy, Default)]
pub struct RenderContext<'a> {
    /// The attributes the update touched, with their state before it.
    /// An attribute it created has no `previousValue`; one it did not touch
    /// has its current value as `previousValue`. `None`: nothing touched.
    pub previous: Option<&'a [AttrChange]>,
    /// The `actionType` of the update.
    pub action_type: Option<&'a str>,
    /// The entity's service path, for the builtin attribute
    /// `servicePath`; `None` leaves it out.
    pub service_path: Option<&'a str>,
}

/// Renders an entity; see [`render_with`].
pub fn render(
    entity: &Entity,
    format: Format,
    attrs_filter: Option<&[String]>,
    metadata_filter: Option<&[String]>,
) -> Value {
    render_with(
        entity,
        format,
        attrs_filter,
        metadata_filter,
        &RenderContext::default(),
    )
}

/// Renders an entity in `format`, limited to `attrs_filter` (None or
/// empty: all user attributes) with metadata limited to `metadata_filter`
/// (None or empty: all user metadata).
pub fn render_with(
    entity: &Entity,
    format: Format,
    attrs_filter: Option<&[String]>,
    metadata_filter: Option<&[String]>,
    ctx: &RenderContext,
) -> Value {
    let selected = select_attrs(entity, attrs_filter, ctx.service_path);
    match format {
        Format::Values | Format::Unique => {
            let mut out: Vec<Value> = Vec::with_capacity(selected.len());
            for (_, attr) in &selected {
                let v = attr.value.clone();
                // Orion keeps numbers as doubles: `3` and `3.0` are one value.
                if format == Format::Unique && out.iter().any(|o| json_eq(o, &v)) {
                    continue;
                }
                out.push(v);
            }
            Value::Array(out)
        }
        Format::KeyValues | Format::SimplifiedKeyValues => {
            let mut obj = entity_head(entity);
            for (name, attr) in selected {
                obj.insert(name.to_string(), attr.value.clone());
            }
            Value::Object(obj)
        }
        Format::Normalized | Format::SimplifiedNormalized => {
            let mut obj = entity_head(entity);
            for (name, attr) in selected {
                let change = ctx.previous.and_then(|p| p.iter().find(|c| c.name == name));
                let touched = ctx.previous.is_none() || change.is_some();
                // `previousValue` exists only in notifications (`previous`
                // given): GET never renders it.
                let previous = match (ctx.previous, change) {
                    (None, _) => None,
                    (Some(_), Some(c)) => c.previous.as_ref().map(|p| (&p.attr_type, &p.value)),
                    (Some(_), None) => Some((&attr.attr_type, &attr.value)),
                };
                let action = if touched { ctx.action_type } else { None };
                // A builtin attribute has no metadata, builtin ones
                // included: no filter shows its (empty) user metadata.
                let md_filter = match attr {
                    Cow::Owned(_) => None,
                    Cow::Borrowed(_) => metadata_filter,
                };
                obj.insert(
                    name.to_string(),
                    // Notifications keep the metadata's own order, as
                    // Orion's do; responses sort them.
                    attr_object(&attr, md_filter, previous, action, ctx.previous.is_none()),
                );
            }
            Value::Object(obj)
        }
    }
}

/// An entity in its default normalized rendering (no filter, no
/// builtins: what `render(entity, Format::Normalized, None, None)` makes),
/// serialised straight from the entity without a tree of values: the
/// form every entity change takes on the live stream and between nodes,
/// made once per change. Tested against [`render`], the one definition of
/// the rendering.
pub struct Normalized<'a>(pub &'a Entity);

impl Serialize for Normalized<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let entity = self.0;
        let mut attrs: Vec<(&str, &Attribute)> = entity
            .attrs
            .iter()
            .filter(|(n, _)| *n != EXPIRATION_ATTR)
            .collect();
        attrs.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let mut map = serializer.serialize_map(Some(2 + attrs.len()))?;
        map.serialize_entry("id", &entity.id)?;
        map.serialize_entry("type", &entity.entity_type)?;
        for (name, attr) in attrs {
            map.serialize_entry(name, &NormalizedAttr(attr))?;
        }
        map.end()
    }
}

/// An attribute as [`Normalized`] renders it: `type`, `value`, and its
/// user metadata sorted by name.
struct NormalizedAttr<'a>(&'a Attribute);

impl Serialize for NormalizedAttr<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let attr = self.0;
        let mut map = serializer.serialize_map(Some(3))?;
        map.serialize_entry("type", &attr.attr_type)?;
        map.serialize_entry("value", &attr.value)?;
        map.serialize_entry("metadata", &SortedMetadata(attr))?;
        map.end()
    }
}

/// An attribute's user metadata, sorted by name, each `{"type","value"}`.
struct SortedMetadata<'a>(&'a Attribute);

impl Serialize for SortedMetadata<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut items: Vec<(&str, &super::Metadata)> = self.0.metadata.iter().collect();
        items.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let mut map = serializer.serialize_map(Some(items.len()))?;
        for (name, md) in items {
            map.serialize_entry(name, &TypedValue(&md.md_type, &md.value))?;
        }
        map.end()
    }
}

/// `{"type","value"}`.
struct TypedValue<'a>(&'a str, &'a Value);

impl Serialize for TypedValue<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(2))?;
        map.serialize_entry("type", self.0)?;
        map.serialize_entry("value", self.1)?;
        map.end()
    }
}

/// Renders one attribute in normalized form (`GET
/// /v2/entities/{id}/attrs/{name}`): `{"type","value","metadata"}`.
pub fn render_attr(attr: &Attribute, metadata_filter: Option<&[String]>) -> Value {
    attr_object(attr, metadata_filter, None, None, true)
}

fn entity_head(entity: &Entity) -> Map<String, Value> {
    let mut obj = Map::new();
    obj.insert("id".into(), Value::String(entity.id.clone()));
    obj.insert("type".into(), Value::String(entity.entity_type.clone()));
    obj
}

/// An attribute to render: a user attribute, or a builtin made up for the
/// occasion.
type Selected<'a> = (&'a str, std::borrow::Cow<'a, Attribute>);

/// The builtin attribute `name` of `entity` (`dateCreated`,
/// `dateModified`, `dateExpires` when set, `servicePath` when known).
fn builtin_attr(entity: &Entity, name: &str, service_path: Option<&str>) -> Option<Attribute> {
    let ms = match name {
        "dateCreated" => entity.date_created,
        "dateModified" => entity.date_modified,
        "dateExpires" => entity.date_expires?,
        "servicePath" => {
            return service_path.map(|p| Attribute::new(Value::String(p.to_string()), "Text"))
        }
        _ => return None,
    };
    Some(Attribute::new(
        Value::String(format_datetime(ms)),
        "DateTime",
    ))
}

/// The attributes to render, in order: every user attribute, sorted by
/// name (as Orion renders them, whatever order they were created in), when
/// there is no filter or the filter has `*` (then followed by the builtins
/// it names); otherwise the named ones in the filter's order (a user
/// attribute, or the builtin when no user attribute has the name).
/// `dateExpires` is a builtin even though it is kept as an attribute: only
/// its name brings it, never the default or `*`.
fn select_attrs<'a>(
    entity: &'a Entity,
    filter: Option<&'a [String]>,
    service_path: Option<&str>,
) -> Vec<Selected<'a>> {
    let all_sorted = || {
        let mut all: Vec<Selected<'a>> = entity
            .attrs
            .iter()
            .filter(|(n, _)| *n != EXPIRATION_ATTR)
            .map(|(n, a)| (n, Cow::Borrowed(a)))
            .collect();
        all.sort_by(|a, b| a.0.cmp(b.0));
        all
    };
    let Some(list) = filter.filter(|l| !l.is_empty()) else {
        return all_sorted();
    };
    let star = list.iter().any(|n| n == "*");
    let mut out = if star { all_sorted() } else { Vec::new() };
    let mut seen: HashSet<&str> = out.iter().map(|(n, _)| *n).collect();
    for name in list {
        if name == "*" || (star && entity.attrs.contains_key(name) && name != EXPIRATION_ATTR) {
            continue;
        }
        if let Some(a) = entity.attrs.get(name) {
            if seen.insert(name) {
                out.push((name.as_str(), Cow::Borrowed(a)));
            }
        } else if let Some(b) = builtin_attr(entity, name, service_path) {
            if seen.insert(name) {
                out.push((name.as_str(), Cow::Owned(b)));
            }
        }
    }
    out
}

fn attr_object(
    attr: &Attribute,
    metadata_filter: Option<&[String]>,
    previous: Option<(&String, &Value)>,
    action_type: Option<&str>,
    sorted: bool,
) -> Value {
    let mut md = Map::new();
    let datetime = |ms: i64| serde_json::json!({"type": "DateTime", "value": format_datetime(ms)});
    // User metadata are rendered sorted by name, as Orion renders them,
    // unless a list without `*` orders them.
    let all_sorted = |md: &mut Map<String, Value>| {
        let mut names: Vec<&str> = attr.metadata.iter().map(|(n, _)| n).collect();
        if sorted {
            names.sort_unstable();
        }
        for n in names {
            if let Some(m) = attr.metadata.get(n) {
                md.insert(n.to_string(), md_object(&m.md_type, &m.value));
            }
        }
    };
    match metadata_filter.filter(|l| !l.is_empty()) {
        None => all_sorted(&mut md),
        Some(list) => {
            if list.iter().any(|n| n == "*") {
                all_sorted(&mut md);
            }
            for name in list {
                if name == "*" || md.contains_key(name) {
                    continue;
                }
                let item = if let Some(m) = attr.metadata.get(name) {
                    md_object(&m.md_type, &m.value)
                } else {
                    match name.as_str() {
                        "dateCreated" => datetime(attr.date_created),
                        "dateModified" => datetime(attr.date_modified),
                        "previousValue" => match previous {
                            Some((t, v)) => md_object(t, v),
                            None => continue,
                        },
                        "actionType" => match action_type {
                            Some(a) => md_object("Text", &Value::String(a.to_string())),
                            None => continue,
                        },
                        _ => continue,
                    }
                };
                md.insert(name.clone(), item);
            }
        }
    }
    let mut obj = Map::new();
    obj.insert("type".into(), Value::String(attr.attr_type.clone()));
    obj.insert("value".into(), attr.value.clone());
    obj.insert("metadata".into(), Value::Object(md));
    Value::Object(obj)
}

fn md_object(t: &str, v: &Value) -> Value {
    let mut obj = Map::new();
    obj.insert("type".into(), Value::String(t.to_string()));
    obj.insert("value".into(), v.clone());
    Value::Object(obj)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ngsi::parse_entity;
    use serde_json::json;

    fn abcd() -> Entity {
        // 1049_values_mode/attrs_order.test step 01 (built in order, as the
        // request body lists them)
        let mut e = Entity::new("E", "T");
        for (n, t, v) in [
            ("A", "AT", 1),
            ("B", "BT", 2),
            ("C", "CT", 3),
            ("D", "DT", 4),
        ] {
            e.attrs.insert(n, Attribute::new(json!(v), t));
        }
        e
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    // 1049_values_mode/attrs_order.test steps 02-05
    #[test]
    fn normalized_and_key_values_follow_attrs_order() {
        let e = abcd();
        assert_eq!(
            render(&e, Format::Normalized, None, None),
            json!({"id":"E","type":"T","A":{"type":"AT","value":1,"metadata":{}},"B":{"type":"BT","value":2,"metadata":{}},"C":{"type":"CT","value":3,"metadata":{}},"D":{"type":"DT","value":4,"metadata":{}}})
        );
        assert_eq!(
            render(&e, Format::KeyValues, None, None),
            json!({"id":"E","type":"T","A":1,"B":2,"C":3,"D":4})
        );
        let bdc = s(&["B", "D", "C"]);
        assert_eq!(
            render(&e, Format::KeyValues, Some(&bdc), None),
            json!({"id":"E","type":"T","B":2,"D":4,"C":3})
        );
    }

    // 1049_values_mode/values_mode.test
    #[test]
    fn values_in_attrs_order() {
        let mut e = abcd();
        e.attrs.get_mut("B").unwrap().value = json!({"x":1,"y":2});
        assert_eq!(
            render(&e, Format::Values, None, None),
            json!([1, {"x":1,"y":2}, 3, 4])
        );
        assert_eq!(
            render(&e, Format::Values, Some(&s(&["B", "D", "C"])), None),
            json!([{"x":1,"y":2}, 4, 3])
        );
    }

    #[test]
    fn unique_drops_repeated_values() {
        let mut e = abcd();
        e.attrs.get_mut("C").unwrap().value = json!(1);
        e.attrs.get_mut("D").unwrap().value = json!(2.0);
        assert_eq!(render(&e, Format::Unique, None, None), json!([1, 2]));
    }

    // Transient entities: `dateExpires` is a builtin though kept as an
    // attribute; `servicePath` is rendered when named and known.
    #[test]
    fn date_expires_and_service_path_only_when_named() {
        let mut e = parse_entity(
            &json!({"id":"E","type":"T","A":{"value":1},
                    "dateExpires":{"value":"2040-01-01","type":"DateTime"}}),
            false,
        )
        .unwrap();
        e.stamp_created(0);
        assert_eq!(
            render(&e, Format::KeyValues, None, None),
            json!({"id":"E","type":"T","A":1})
        );
        assert_eq!(
            render(&e, Format::KeyValues, Some(&s(&["*"])), None),
            json!({"id":"E","type":"T","A":1})
        );
        let ctx = RenderContext {
            service_path: Some("/a"),
            ..RenderContext::default()
        };
        assert_eq!(
            render_with(
                &e,
                Format::Normalized,
                Some(&s(&["dateExpires", "servicePath"])),
                Some(&s(&["dateCreated"])),
                &ctx
            ),
            json!({"id":"E","type":"T",
                "dateExpires":{"type":"DateTime","value":"2040-01-01T00:00:00.000Z",
                    "metadata":{"dateCreated":{"type":"DateTime","value":"1970-01-01T00:00:00.000Z"}}},
                "servicePath":{"type":"Text","value":"/a","metadata":{}}})
        );
    }

    // 0876_entity_dates/get_entity_dates.test steps 02a-02c, get_entity_dates_with_attr.test
    #[test]
    fn builtin_dates_only_when_asked() {
        let mut e = parse_entity(&json!({"id":"E","type":"T","A":{"value":"foo"}}), false).unwrap();
        e.stamp_created(1_500_000_000_123);
        assert_eq!(
            render(&e, Format::KeyValues, None, None),
            json!({"id":"E","type":"T","A":"foo"})
        );
        let f = s(&["dateCreated", "dateModified", "*"]);
        assert_eq!(
            render(&e, Format::Normalized, Some(&f), None),
            json!({"id":"E","type":"T","A":{"type":"Text","value":"foo","metadata":{}},
                "dateCreated":{"type":"DateTime","value":"2017-07-14T02:40:00.123Z","metadata":{}},
                "dateModified":{"type":"DateTime","value":"2017-07-14T02:40:00.123Z","metadata":{}}})
        );
        // With `*`, the user attributes first (as the real Orion 4.7.0
        // answers); without it, the list's order (step 02c).
        assert_eq!(
            render(&e, Format::Values, Some(&f), None),
            json!([
                "foo",
                "2017-07-14T02:40:00.123Z",
                "2017-07-14T02:40:00.123Z"
            ])
        );
        let listed = s(&["dateCreated", "dateModified", "A"]);
        assert_eq!(
            render(&e, Format::Values, Some(&listed), None),
            json!([
                "2017-07-14T02:40:00.123Z",
                "2017-07-14T02:40:00.123Z",
                "foo"
            ])
        );
        // attrs=B (non-existing): only id and type
        assert_eq!(
            render(&e, Format::Normalized, Some(&s(&["B"])), None),
            json!({"id":"E","type":"T"})
        );
    }

    // 0876_entity_dates/entity_dates_overridden_by_user.test steps 02-03
    #[test]
    fn user_date_attributes_win_over_builtins() {
        let mut e = parse_entity(
            &json!({"id":"E1","type":"T",
            "dateCreated":{"value":"2050-01-01T00:00:00.666","type":"DateTime"},
            "dateModified":{"value":"2051-01-01T00:00:00.777","type":"DateTime"}}),
            false,
        )
        .unwrap();
        e.stamp_created(0);
        let expected = json!({"id":"E1","type":"T",
            "dateCreated":{"metadata":{},"type":"DateTime","value":"2050-01-01T00:00:00.666Z"},
            "dateModified":{"metadata":{},"type":"DateTime","value":"2051-01-01T00:00:00.777Z"}});
        assert_eq!(render(&e, Format::Normalized, None, None), expected);
        assert_eq!(
            render(
                &e,
                Format::Normalized,
                Some(&s(&["dateModified", "dateCreated"])),
                None
            ),
            expected
        );
    }

    // 2544_metadata_filtering_in_retrieve_operations: metadata filter, builtin metadata.
    #[test]
    fn metadata_filter_and_builtin_metadata() {
        let mut e = parse_entity(
            &json!({"id":"E","A":{"value":1,"metadata":{"m1":{"value":1},"m2":{"value":"x"}}}}),
            false,
        )
        .unwrap();
        e.stamp_created(0);
        let r = render(&e, Format::Normalized, None, Some(&s(&["m2"])));
        assert_eq!(
            r["A"]["metadata"],
            json!({"m2":{"type":"Text","value":"x"}})
        );
        let r = render(
            &e,
            Format::Normalized,
            None,
            Some(&s(&["dateModified", "*"])),
        );
        assert_eq!(
            r["A"]["metadata"],
            json!({"m1":{"type":"Number","value":1},"m2":{"type":"Text","value":"x"},
                   "dateModified":{"type":"DateTime","value":"1970-01-01T00:00:00.000Z"}})
        );
        let prev = [crate::ngsi::AttrChange {
            name: "A".into(),
            kind: crate::ngsi::ChangeKind::Updated,
            previous: Some(Attribute::new(json!(0), "Number")),
            modified: true,
        }];
        let ctx = RenderContext {
            previous: Some(&prev),
            action_type: Some("update"),
            service_path: None,
        };
        let r = render_with(
            &e,
            Format::Normalized,
            None,
            Some(&s(&["previousValue", "actionType"])),
            &ctx,
        );
        assert_eq!(
            r["A"]["metadata"],
            json!({"previousValue":{"type":"Number","value":0},"actionType":{"type":"Text","value":"update"}})
        );
        assert_eq!(
            render_attr(e.attrs.get("A").unwrap(), Some(&s(&["nope"]))),
            json!({"type":"Number","value":1,"metadata":{}})
        );
        // Outside notifications there is no previousValue nor actionType.
        let r = render(
            &e,
            Format::Normalized,
            None,
            Some(&s(&["previousValue", "actionType"])),
        );
        assert_eq!(r["A"]["metadata"], json!({}));
    }

    #[test]
    fn format_names() {
        assert_eq!(Format::from_name("keyValues"), Some(Format::KeyValues));
        assert_eq!(
            Format::from_name("simplifiedNormalized"),
            Some(Format::SimplifiedNormalized)
        );
        assert_eq!(Format::from_name("x"), None);
    }

    /// Attributes and metadata come sorted by name, as Orion renders them,
    /// unless a list without `*` orders them; builtins named beside `*`
    /// follow the user attributes.
    #[test]
    fn attributes_and_metadata_are_sorted_by_name() {
        let e = parse_entity(
            &json!({"id": "Z", "type": "T", "zeta": {"value": 1}, "B": {"value": 2},
                    "_c": {"value": 3},
                    "alpha": {"value": 4, "metadata": {"zz": {"value": 1}, "aa": {"value": 2}}}}),
            false,
        )
        .unwrap();
        let keys = |v: Value| -> Vec<String> { v.as_object().unwrap().keys().cloned().collect() };
        assert_eq!(
            keys(render(&e, Format::KeyValues, None, None)),
            ["id", "type", "B", "_c", "alpha", "zeta"]
        );
        assert_eq!(
            keys(render(
                &e,
                Format::KeyValues,
                Some(&s(&["zeta", "alpha"])),
                None
            )),
            ["id", "type", "zeta", "alpha"]
        );
        assert_eq!(
            keys(render(
                &e,
                Format::KeyValues,
                Some(&s(&["dateModified", "zeta", "*"])),
                None
            )),
            ["id", "type", "B", "_c", "alpha", "zeta", "dateModified"]
        );
        assert_eq!(render(&e, Format::Values, None, None), json!([2, 3, 4, 1]));
        let alpha = |md: Option<&[String]>| {
            keys(render(&e, Format::Normalized, None, md)["alpha"]["metadata"].clone())
        };
        assert_eq!(alpha(None), ["aa", "zz"]);
        // A notification keeps them as created, as Orion's do.
        let notified = render_with(
            &e,
            Format::Normalized,
            Some(&s(&["alpha"])),
            None,
            &RenderContext {
                previous: Some(&[]),
                ..RenderContext::default()
            },
        );
        assert_eq!(keys(notified["alpha"]["metadata"].clone()), ["zz", "aa"]);
        assert_eq!(alpha(Some(&s(&["zz", "aa"]))), ["zz", "aa"]);
        assert_eq!(alpha(Some(&s(&["*", "zz"]))), ["aa", "zz"]);
    }
}
