//! An NGSI-LD entity read into the [`Entity`] weft stores, and a stored
//! entity shown as NGSI-LD.
//!
//! The mapping (docs/ngsi-ld.md has the table):
//!
//! - names (the entity type, attributes, sub-attributes) are stored as
//!   [`Context::to_stored`] gives them and shown as
//!   [`Context::from_stored`] gives them;
//! - a `Property` is an attribute of type `Property` with its value; a
//!   `Relationship` one of type `Relationship` whose value is its
//!   `object` (the type NGSIv2 clients already give references); a
//!   `GeoProperty` one of type `GeoProperty` whose value is the GeoJSON
//!   geometry; a `LanguageProperty` one of type `LanguageProperty` whose
//!   value is the language map;
//! - `observedAt` and `unitCode` are metadata of those names (`DateTime`,
//!   `Text`); every other sub-attribute is a metadata item whose type is
//!   its NGSI-LD type and whose value is its value (or object);
//! - `createdAt` and `modifiedAt` are the entity's and the attributes'
//!   creation and modification times, which weft keeps anyway.
//!
//! Shown the other way, an NGSIv2 attribute of type `Relationship` is a
//! Relationship, of type `geo:json` or `GeoProperty` a GeoProperty, of
//! type `LanguageProperty` a LanguageProperty, and any other a Property
//! (its NGSIv2 type is not shown); its metadata are sub-Properties.

use serde_json::{Map, Value};

use super::context::Context;
use super::{ErrorKind, LdError};
use crate::geo::Shape;
use crate::ngsi::{
    format_datetime, parse_datetime, AttrMap, Attribute, Entity, Metadata, MetadataMap,
    EXPIRATION_ATTR,
};

/// The metadata name `observedAt` is kept under.
pub const OBSERVED_AT: &str = "observedAt";
/// The metadata name `unitCode` is kept under.
pub const UNIT_CODE: &str = "unitCode";

/// The value that deletes an attribute in a merge or a partial update
/// (NGSI-LD's `urn:ngsi-ld:null`).
pub const NULL_URI: &str = "urn:ngsi-ld:null";

/// The longest name (of an entity type, attribute or sub-attribute, as
/// stored) weft accepts: IRIs are longer than NGSIv2 names.
pub const MAX_NAME_LEN: usize = 1024;

/// The four kinds of NGSI-LD attribute weft keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttrKind {
    /// A value.
    Property,
    /// A link to another entity (`object`).
    Relationship,
    /// A GeoJSON geometry.
    GeoProperty,
    /// A string per language (`languageMap`).
    LanguageProperty,
    /// A JSON value kept as it is, never expanded (`json`).
    JsonProperty,
    /// A term of a vocabulary, or several (`vocab`).
    VocabProperty,
    /// An ordered list of values (`valueList`).
    ListProperty,
    /// An ordered list of links to entities (`objectList`).
    ListRelationship,
}

/// Every kind, for lookups by name.
const KINDS: [AttrKind; 8] = [
    AttrKind::Property,
    AttrKind::Relationship,
    AttrKind::GeoProperty,
    AttrKind::LanguageProperty,
    AttrKind::JsonProperty,
    AttrKind::VocabProperty,
    AttrKind::ListProperty,
    AttrKind::ListRelationship,
];

impl AttrKind {
    /// The kind's name: the NGSI-LD `type` and the stored attribute type.
    pub fn name(self) -> &'static str {
        match self {
            AttrKind::Property => "Property",
            AttrKind::Relationship => "Relationship",
            AttrKind::GeoProperty => "GeoProperty",
            AttrKind::LanguageProperty => "LanguageProperty",
            AttrKind::JsonProperty => "JsonProperty",
            AttrKind::VocabProperty => "VocabProperty",
            AttrKind::ListProperty => "ListProperty",
            AttrKind::ListRelationship => "ListRelationship",
        }
    }

    /// The kind an attribute of the stored type `t` is shown as: its own
    /// name, `geo:json` a GeoProperty, anything else a Property.
    pub fn of_stored(t: &str) -> AttrKind {
        if t == "geo:json" {
            return AttrKind::GeoProperty;
        }
        KINDS
            .into_iter()
            .find(|k| k.name() == t)
            .unwrap_or(AttrKind::Property)
    }

    /// The kind a `type` member names, read with `ctx` (so `Property` and
    /// its IRI are the same); `None` for anything else.
    fn named(t: &str, ctx: &Context) -> Option<AttrKind> {
        let iri = ctx.expand(t);
        let name = iri.strip_prefix("https://uri.etsi.org/ngsi-ld/")?;
        KINDS.into_iter().find(|k| k.name() == name)
    }

    /// The member holding the attribute's value in the normalized form.
    pub fn value_member(self) -> &'static str {
        match self {
            AttrKind::Relationship => "object",
            AttrKind::LanguageProperty => "languageMap",
            AttrKind::Property | AttrKind::GeoProperty => "value",
            AttrKind::JsonProperty => "json",
            AttrKind::VocabProperty => "vocab",
            AttrKind::ListProperty => "valueList",
            AttrKind::ListRelationship => "objectList",
        }
    }

    /// The member holding the attribute's values over time in the
    /// simplified temporal form (`temporalValues`).
    pub fn values_member(self) -> &'static str {
        match self {
            AttrKind::Relationship => "objects",
            AttrKind::LanguageProperty => "languageMaps",
            AttrKind::Property | AttrKind::GeoProperty => "values",
            AttrKind::JsonProperty => "jsons",
            AttrKind::VocabProperty => "vocabs",
            AttrKind::ListProperty => "valueLists",
            AttrKind::ListRelationship => "objectLists",
        }
    }
}

/// Members of an attribute that are not sub-attributes.
const ATTR_MEMBERS: &[&str] = &[
    "type",
    "value",
    "object",
    "languageMap",
    "json",
    "vocab",
    "valueList",
    "objectList",
    "observedAt",
    "unitCode",
    "datasetId",
    "createdAt",
    "modifiedAt",
    "instanceId",
    "objectType",
    "@context",
];

/// Members of an entity that are not attributes.
const ENTITY_MEMBERS: &[&str] = &[
    "id",
    "@id",
    "type",
    "@type",
    "@context",
    "createdAt",
    "modifiedAt",
    "deletedAt",
];

/// GeoJSON geometry types: an object whose `type` is one of them is a
/// GeoProperty's value written without its wrapper (the concise form).
const GEOMETRY_TYPES: &[&str] = &[
    "Point",
    "MultiPoint",
    "LineString",
    "MultiLineString",
    "Polygon",
    "MultiPolygon",
];

/// Whether `id` can name an NGSI-LD entity: a URI (a scheme, `:`, and
/// no spaces or characters URIs cannot hold).
pub fn is_uri(id: &str) -> bool {
    let Some((scheme, rest)) = id.split_once(':') else {
        return false;
    };
    let mut chars = scheme.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        && !rest.is_empty()
        && id.len() <= MAX_NAME_LEN
        && !id
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || "<>\"{}|\\^`".contains(c))
}

/// Checks a name (entity type, attribute, sub-attribute) as a client
/// wrote it.
fn check_name(name: &str, what: &str) -> Result<(), LdError> {
    let valid = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && !name
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || "<>\"'=;()".contains(c));
    if valid {
        Ok(())
    } else {
        Err(LdError::bad_request(format!(
            "invalid {what} name: {name:?}"
        )))
    }
}

/// Checks an attribute's name as a client wrote it in a path: a name,
/// not a JSON-LD keyword (`@id`, `@invalid`).
pub fn check_attribute_name(name: &str) -> Result<(), LdError> {
    if name.starts_with('@') {
        return Err(LdError::bad_request(format!(
            "invalid attribute name: {name:?}"
        )));
    }
    check_name(name, "attribute")
}

/// Whether an attribute body asks for the attribute's deletion: its
/// value (in any of the kinds' value members, or bare) is
/// [`NULL_URI`], or its language map's `@none` is.
pub fn is_null_attribute(body: &Value) -> bool {
    let null = |v: &Value| v.as_str() == Some(NULL_URI);
    match body {
        Value::String(_) => null(body),
        Value::Object(map) => {
            KINDS
                .iter()
                .any(|k| map.get(k.value_member()).is_some_and(null))
                || map
                    .get("languageMap")
                    .and_then(|m| m.get("@none"))
                    .is_some_and(null)
        }
        _ => false,
    }
}

/// Whether an attribute fragment gives a value (in any kind's value
/// member).
pub fn has_value_member(map: &Map<String, Value>) -> bool {
    KINDS.iter().any(|k| map.contains_key(k.value_member()))
}

/// Reads an NGSI-LD entity (normalized or concise) with `ctx`: its id,
/// its type and its attributes, as weft stores them. The creation stamps
/// are the writer's.
pub fn parse_entity(body: &Value, ctx: &Context) -> Result<Entity, LdError> {
    let Value::Object(map) = body else {
        return Err(LdError::invalid("an entity is a JSON object"));
    };
    let (id, entity_type) = parse_id_and_type(map, ctx)?;
    let mut entity = Entity::new(id, entity_type);
    entity.attrs = parse_attrs(map, ctx)?;
    Ok(entity)
}

/// The id (a URI) and the type (as stored, read with `ctx`) of an entity
/// body.
pub fn parse_id_and_type(
    map: &Map<String, Value>,
    ctx: &Context,
) -> Result<(String, String), LdError> {
    let id = match map.get("id").or_else(|| map.get("@id")) {
        Some(Value::String(id)) => id,
        Some(_) => return Err(LdError::bad_request("the entity id is not a string")),
        None => return Err(LdError::bad_request("the entity has no id")),
    };
    if !is_uri(id) {
        return Err(LdError::bad_request(format!(
            "the entity id is not a URI: {id:?}"
        )));
    }
    let entity_type = match map.get("type").or_else(|| map.get("@type")) {
        Some(t) => parse_type(t, ctx)?,
        None => return Err(LdError::bad_request("the entity has no type")),
    };
    Ok((id.clone(), entity_type))
}

/// Reads an entity type (a name, or an array of one name) with `ctx`,
/// as stored.
pub fn parse_type(t: &Value, ctx: &Context) -> Result<String, LdError> {
    let name = match t {
        Value::String(t) => t,
        Value::Array(items) => match items.as_slice() {
            [Value::String(t)] => t,
            [] => return Err(LdError::bad_request("the entity type is empty")),
            _ => {
                return Err(LdError::new(
                    ErrorKind::OperationNotSupported,
                    "an entity of several types is not supported",
                ))
            }
        },
        _ => return Err(LdError::bad_request("the entity type is not a string")),
    };
    check_name(name, "entity type")?;
    if ctx.expand(name).starts_with('@') {
        return Err(LdError::bad_request(format!(
            "the entity type {name} is a JSON-LD keyword"
        )));
    }
    Ok(ctx.to_stored(name))
}

/// Reads the attributes of an entity fragment (every member that is not
/// the id, the type, the context or a system attribute) with `ctx`.
pub fn parse_attrs(map: &Map<String, Value>, ctx: &Context) -> Result<AttrMap, LdError> {
    let mut attrs = AttrMap::new();
    for (name, value) in map {
        if ENTITY_MEMBERS.contains(&name.as_str()) {
            continue;
        }
        check_name(name, "attribute")?;
        let stored = ctx.to_stored(name);
        if stored == EXPIRATION_ATTR {
            return Err(LdError::bad_request(format!(
                "{EXPIRATION_ATTR} is reserved by the NGSIv2 API"
            )));
        }
        if stored == SCOPE {
            attrs.insert(stored, parse_scope(value)?);
            continue;
        }
        let instances: Vec<&Value> = match value {
            Value::Array(items) if items.iter().any(is_attribute_instance) => {
                items.iter().collect()
            }
            one => vec![one],
        };
        let mut seen: Vec<Option<String>> = Vec::new();
        for instance in instances {
            let dataset = dataset_of(instance)?;
            if seen.contains(&dataset) {
                return Err(LdError::bad_request(format!(
                    "attribute {name}: two instances of one datasetId"
                )));
            }
            let attr = parse_attribute(name, instance, ctx)?;
            attrs.insert(instance_name(&stored, dataset.as_deref()), attr);
            seen.push(dataset);
        }
    }
    Ok(attrs)
}

/// The entity member naming the scopes an entity is in (clause 4.18):
/// kept as an attribute of type [`SCOPE_TYPE`], shown as its bare value.
pub const SCOPE: &str = "scope";

/// The stored type of an entity's [`SCOPE`].
pub const SCOPE_TYPE: &str = "Scope";

/// `scope`: a scope (`/Madrid/Gardens`) or a list of them.
fn parse_scope(value: &Value) -> Result<Attribute, LdError> {
    let valid = |v: &Value| {
        v.as_str().is_some_and(|s| {
            s.starts_with('/')
                && s.len() > 1
                && s[1..].split('/').all(|part| !part.is_empty())
                && !s.contains(|c: char| c.is_whitespace() || c == '#' || c == '+')
        })
    };
    let ok = match value {
        Value::Array(items) => !items.is_empty() && items.iter().all(valid),
        other => valid(other),
    };
    if !ok {
        return Err(LdError::bad_request(
            "scope is a scope (/a/b) or a list of them",
        ));
    }
    Ok(Attribute::new(value.clone(), SCOPE_TYPE.to_string()))
}

/// Reads one attribute, normalized (`{"type": "Property", "value": …}`)
/// or concise (a bare value, `{"value": …}`, `{"object": …}`,
/// `{"languageMap": …}`, a GeoJSON geometry).
pub fn parse_attribute(name: &str, value: &Value, ctx: &Context) -> Result<Attribute, LdError> {
    let map = match value {
        Value::Object(map) => map,
        Value::Null => {
            return Err(LdError::bad_request(format!("attribute {name} is null")));
        }
        Value::Array(items) if items.iter().any(is_attribute_instance) => {
            return Err(LdError::bad_request(format!(
                "attribute {name}: one instance is written at a time here"
            )));
        }
        // A concise Property.
        other => return Ok(Attribute::new(other.clone(), AttrKind::Property.name())),
    };
    let kind = match map.get("type") {
        Some(Value::String(t)) => match AttrKind::named(t, ctx) {
            Some(kind) => kind,
            None if GEOMETRY_TYPES.contains(&t.as_str()) => {
                // A concise GeoProperty: the geometry itself.
                return geo_attribute(name, value.clone(), MetadataMap::new());
            }
            None => {
                return Err(LdError::bad_request(format!(
                    "attribute {name}: unknown attribute type {t:?}"
                )))
            }
        },
        Some(_) => {
            return Err(LdError::bad_request(format!(
                "attribute {name}: its type is not a string"
            )))
        }
        None if map.contains_key("object") => AttrKind::Relationship,
        None if map.contains_key("languageMap") => AttrKind::LanguageProperty,
        None if map.contains_key("json") => AttrKind::JsonProperty,
        None if map.contains_key("vocab") => AttrKind::VocabProperty,
        None if map.contains_key("valueList") => AttrKind::ListProperty,
        None if map.contains_key("objectList") => AttrKind::ListRelationship,
        None if map.contains_key("value") => match map.get("value") {
            Some(Value::Object(v))
                if v.get("type")
                    .and_then(Value::as_str)
                    .is_some_and(|t| GEOMETRY_TYPES.contains(&t)) =>
            {
                AttrKind::GeoProperty
            }
            _ => AttrKind::Property,
        },
        // A concise Property whose value is an object.
        None => return Ok(Attribute::new(value.clone(), AttrKind::Property.name())),
    };
    let member = kind.value_member();
    let content = match map.get(member) {
        None | Some(Value::Null) => {
            return Err(LdError::bad_request(format!(
                "attribute {name}: a {} needs a {member}",
                kind.name()
            )))
        }
        Some(v) => v.clone(),
    };
    let metadata = parse_sub_attributes(name, map, ctx)?;
    match kind {
        AttrKind::GeoProperty => geo_attribute(name, content, metadata),
        AttrKind::Relationship => {
            let valid = match &content {
                Value::String(s) => is_uri(s),
                Value::Array(items) => {
                    !items.is_empty() && items.iter().all(|i| i.as_str().is_some_and(is_uri))
                }
                _ => false,
            };
            if !valid {
                return Err(LdError::bad_request(format!(
                    "attribute {name}: a Relationship's object is a URI"
                )));
            }
            Ok(with_metadata(content, kind, metadata))
        }
        AttrKind::LanguageProperty => {
            if !content.is_object() {
                return Err(LdError::bad_request(format!(
                    "attribute {name}: a languageMap is an object"
                )));
            }
            Ok(with_metadata(content, kind, metadata))
        }
        AttrKind::ListProperty | AttrKind::ListRelationship if !content.is_array() => {
            Err(LdError::bad_request(format!(
                "attribute {name}: a {} is a list",
                kind.value_member()
            )))
        }
        AttrKind::VocabProperty
            if !(content.is_string()
                || content
                    .as_array()
                    .is_some_and(|terms| terms.iter().all(Value::is_string))) =>
        {
            Err(LdError::bad_request(format!(
                "attribute {name}: a vocab is a term or a list of terms"
            )))
        }
        AttrKind::Property
        | AttrKind::JsonProperty
        | AttrKind::VocabProperty
        | AttrKind::ListProperty
        | AttrKind::ListRelationship => Ok(with_metadata(content, kind, metadata)),
    }
}

/// Whether an array item is an attribute instance (`{"type":
/// "Property", …}`), which makes the array a multi-attribute.
fn is_attribute_instance(item: &Value) -> bool {
    item.get("type")
        .and_then(Value::as_str)
        .is_some_and(|t| KINDS.iter().any(|k| k.name() == t))
}

fn with_metadata(value: Value, kind: AttrKind, metadata: MetadataMap) -> Attribute {
    let mut attr = Attribute::new(value, kind.name());
    attr.metadata = metadata;
    attr
}

/// A GeoProperty, its geometry checked as GeoJSON (RFC 7946) has it:
/// positions in range, rings of four positions or more, closed. A ring
/// whose edges cross on the sphere, which NGSIv2's `geo:json` refuses as
/// MongoDB would, is taken: GeoJSON does not forbid it, and NGSI-LD
/// clients (ETSI's test suite among them) send such rings.
fn geo_attribute(name: &str, geometry: Value, metadata: MetadataMap) -> Result<Attribute, LdError> {
    let closed = |ring: &Value| {
        ring.as_array()
            .is_some_and(|r| r.len() >= 4 && r.first() == r.last())
    };
    let rings_closed = match (
        geometry.get("type").and_then(Value::as_str),
        geometry.get("coordinates"),
    ) {
        (Some("Polygon"), Some(Value::Array(rings))) => rings.iter().all(closed),
        (Some("MultiPolygon"), Some(Value::Array(polygons))) => polygons
            .iter()
            .all(|p| p.as_array().is_some_and(|rings| rings.iter().all(closed))),
        _ => true,
    };
    if !rings_closed || Shape::of_stored_attribute("geo:json", &geometry).is_none() {
        return Err(LdError::bad_request(format!(
            "attribute {name}: not a GeoJSON geometry"
        )));
    }
    Ok(with_metadata(geometry, AttrKind::GeoProperty, metadata))
}

/// The sub-attributes of an attribute, as its metadata: `observedAt`
/// (checked), `unitCode`, and every member that is not
/// one of the attribute's own.
fn parse_sub_attributes(
    name: &str,
    map: &Map<String, Value>,
    ctx: &Context,
) -> Result<MetadataMap, LdError> {
    let mut metadata = MetadataMap::new();
    if let Some(at) = map.get(OBSERVED_AT) {
        // Kept as written (`…T12:00:04Z` reads back so, not as
        // `…T12:00:04.000Z`), once it reads as a DateTime.
        if at.as_str().is_none_or(|t| parse_datetime(t).is_none()) {
            return Err(LdError::bad_request(format!(
                "attribute {name}: observedAt is not a DateTime"
            )));
        }
        metadata.insert(
            OBSERVED_AT,
            Metadata {
                value: at.clone(),
                md_type: "DateTime".to_string(),
            },
        );
    }
    if let Some(unit) = map.get(UNIT_CODE) {
        if !unit.is_string() {
            return Err(LdError::bad_request(format!(
                "attribute {name}: unitCode is not a string"
            )));
        }
        metadata.insert(
            UNIT_CODE,
            Metadata {
                value: unit.clone(),
                md_type: "Text".to_string(),
            },
        );
    }
    for (sub, value) in map {
        if ATTR_MEMBERS.contains(&sub.as_str()) {
            continue;
        }
        check_name(sub, "sub-attribute")?;
        let attr = parse_attribute(sub, value, ctx)?;
        metadata.insert(
            ctx.to_stored(sub),
            Metadata {
                value: attr.value,
                md_type: attr.attr_type,
            },
        );
    }
    Ok(metadata)
}

/// How an entity is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// Every attribute with its `type` and members.
    #[default]
    Normalized,
    /// As short as can be read back unambiguously.
    Concise,
    /// Attribute values only (`options=keyValues` or `simplified`).
    KeyValues,
}

/// What [`render_entity`] shows.
#[derive(Debug, Clone, Copy)]
pub struct Render<'a> {
    /// The context names are compacted with.
    pub context: &'a Context,
    /// The representation.
    pub format: Format,
    /// Whether `createdAt` and `modifiedAt` are shown.
    pub sys_attrs: bool,
    /// Only these attributes (stored names); `None`: all.
    pub attrs: Option<&'a [String]>,
    /// `lang`: LanguageProperties shown as Properties holding the string
    /// of this language (else of `@none`, else the first), with a `lang`
    /// member naming the one chosen.
    pub lang: Option<&'a str>,
    /// `datasetId`: only the instances of these datasets (`@none`: the
    /// default instance); `None`: all.
    pub datasets: Option<&'a [String]>,
}

/// A stored entity as NGSI-LD (without `@context`: the surface adds it or
/// a `Link` header).
pub fn render_entity(entity: &Entity, how: &Render) -> Map<String, Value> {
    let ctx = how.context;
    let mut out = Map::new();
    out.insert("id".into(), Value::String(entity.id.clone()));
    out.insert(
        "type".into(),
        Value::String(ctx.from_stored(&entity.entity_type)),
    );
    // The entity's own times show in every representation (its
    // attributes' only where they have members to hold them).
    if how.sys_attrs {
        out.insert(
            "createdAt".into(),
            Value::String(format_datetime(entity.date_created)),
        );
        out.insert(
            "modifiedAt".into(),
            Value::String(format_datetime(entity.date_modified)),
        );
    }
    let instances = entity.attrs.keys().any(|n| n.contains(DATASET_SEPARATOR));
    if !instances && how.datasets.is_none() {
        // The common case: one instance of each attribute, shown in order.
        for (name, attr) in entity.attrs.iter() {
            if name == EXPIRATION_ATTR || how.attrs.is_some_and(|a| !a.iter().any(|n| n == name)) {
                continue;
            }
            out.insert(ctx.from_stored(name), render_member(name, attr, how));
        }
        return out;
    }
    // Instances of one attribute (datasetId) are shown together: one
    // alone as it is, several as an array.
    let mut shown: Vec<(String, Vec<Value>)> = Vec::new();
    for (name, attr) in entity.attrs.iter() {
        let (base, dataset) = split_instance(name);
        if name == EXPIRATION_ATTR || how.attrs.is_some_and(|a| !a.iter().any(|n| n == base)) {
            continue;
        }
        let wanted = how
            .datasets
            .is_none_or(|d| d.iter().any(|w| *w == dataset.unwrap_or(NO_DATASET)));
        if !wanted {
            continue;
        }
        let mut value = render_member(name, attr, how);
        if let Some(dataset) = dataset {
            with_dataset(&mut value, dataset, how.format);
        }
        let key = ctx.from_stored(base);
        match shown.iter_mut().find(|(k, _)| *k == key) {
            Some((_, values)) => values.push(value),
            None => shown.push((key, vec![value])),
        }
    }
    for (key, mut values) in shown {
        let value = if values.len() == 1 {
            values.remove(0)
        } else {
            Value::Array(values)
        };
        out.insert(key, value);
    }
    out
}

/// A rendered entity as `pick` (only the members named, `id` and `type`
/// included) or `omit` (all but those named) project it (clause 4.21);
/// neither given (`None`, or empty): as it is.
pub fn project(entity: &mut Map<String, Value>, pick: Option<&[String]>, omit: Option<&[String]>) {
    use super::projection::{Mode, Projection};
    match (pick, omit) {
        (Some(pick), _) if !pick.is_empty() => Projection::of_names(Mode::Pick, pick).apply(entity),
        (_, Some(omit)) if !omit.is_empty() => Projection::of_names(Mode::Omit, omit).apply(entity),
        _ => {}
    }
}

/// One stored attribute as an entity member: the `scope` bare, any other
/// as an NGSI-LD attribute.
fn render_member(name: &str, attr: &Attribute, how: &Render) -> Value {
    if attr.attr_type == SCOPE_TYPE && name == SCOPE {
        attr.value.clone()
    } else {
        render_attribute(attr, how)
    }
}

/// Marks a rendered instance with its `datasetId` (a bare concise value
/// becomes `{"value": …}` to carry it; keyValues shows values only).
fn with_dataset(value: &mut Value, dataset: &str, format: Format) {
    if format == Format::KeyValues {
        return;
    }
    if !value.is_object()
        || GEOMETRY_TYPES.contains(&value.get("type").and_then(Value::as_str).unwrap_or(""))
    {
        let inner = std::mem::take(value);
        *value = Value::Object(Map::from_iter([("value".to_string(), inner)]));
    }
    if let Value::Object(map) = value {
        map.insert("datasetId".into(), Value::String(dataset.to_string()));
    }
}

/// A time as NGSI-LD answers show it (`observedAt`, the temporal API's
/// instants): as it is usually written, with milliseconds only when
/// there are some (`2020-08-01T14:07:00Z`, `2020-08-01T14:07:00.250Z`).
pub fn instant(ms: i64) -> String {
    let text = format_datetime(ms);
    match text.strip_suffix(".000Z") {
        Some(head) => format!("{head}Z"),
        None => text,
    }
}

/// What `datasetId` names the default instance (the one without a
/// `datasetId`) by.
pub const NO_DATASET: &str = "@none";

/// What separates an attribute's name from an instance's `datasetId` in
/// the name the instance is stored under: neither names nor URIs hold a
/// space.
pub const DATASET_SEPARATOR: char = ' ';

/// The stored name of the instance `dataset` of attribute `base` (the
/// default instance, without one, is stored under the attribute's name).
pub fn instance_name(base: &str, dataset: Option<&str>) -> String {
    match dataset {
        Some(d) => format!("{base}{DATASET_SEPARATOR}{d}"),
        None => base.to_string(),
    }
}

/// A stored name's attribute and `datasetId` (none: the default
/// instance).
pub fn split_instance(name: &str) -> (&str, Option<&str>) {
    match name.split_once(DATASET_SEPARATOR) {
        Some((base, dataset)) => (base, Some(dataset)),
        None => (name, None),
    }
}

/// The `datasetId` of an attribute instance body, checked: a URI, or none.
pub fn dataset_of(body: &Value) -> Result<Option<String>, LdError> {
    match body.get("datasetId") {
        None => Ok(None),
        Some(Value::String(d)) if is_uri(d) => Ok(Some(d.clone())),
        Some(other) => Err(LdError::bad_request(format!(
            "a datasetId is a URI, not {other}"
        ))),
    }
}

/// An entity as a GeoJSON Feature: its geometry the value of attribute
/// `geometry_property` (normalized or not), its properties everything
/// but its id.
pub fn feature(entity: Value, geometry_property: &str) -> Value {
    let Value::Object(mut map) = entity else {
        return entity;
    };
    let id = map.remove("id").unwrap_or(Value::Null);
    let geometry = map
        .get(geometry_property)
        .map(|a| match a.get("value") {
            Some(v)
                if a.get("type").is_some_and(|t| t == "GeoProperty") || a.get("type").is_none() =>
            {
                v.clone()
            }
            _ => a.clone(),
        })
        .unwrap_or(Value::Null);
    serde_json::json!({"id": id, "type": "Feature", "geometry": geometry, "properties": map})
}

/// The string of `lang` in a language map (else of `@none`, else the
/// first), and the language it is in.
fn pick_language<'v>(map: &'v Value, lang: &str) -> Option<(&'v str, &'v Value)> {
    let map = map.as_object()?;
    map.get_key_value(lang)
        .or_else(|| map.get_key_value("@none"))
        .or_else(|| map.iter().next())
        .map(|(k, v)| (k.as_str(), v))
}

/// One stored attribute as NGSI-LD.
pub fn render_attribute(attr: &Attribute, how: &Render) -> Value {
    let kind = AttrKind::of_stored(&attr.attr_type);
    if let (AttrKind::LanguageProperty, Some(lang)) = (kind, how.lang) {
        if let Some((chosen, text)) = pick_language(&attr.value, lang) {
            if how.format == Format::KeyValues {
                return text.clone();
            }
            let mut out = Map::new();
            if how.format == Format::Normalized {
                out.insert("type".into(), Value::String("Property".into()));
            }
            out.insert("value".into(), text.clone());
            out.insert("lang".into(), Value::String(chosen.to_string()));
            return Value::Object(out);
        }
    }
    match how.format {
        Format::KeyValues => return attr.value.clone(),
        Format::Concise if attr.metadata.is_empty() && !how.sys_attrs => {
            return match kind {
                AttrKind::Property if !attr.value.is_object() => attr.value.clone(),
                AttrKind::GeoProperty => attr.value.clone(),
                _ => Value::Object(Map::from_iter([(
                    kind.value_member().to_string(),
                    attr.value.clone(),
                )])),
            };
        }
        _ => {}
    }
    let mut out = Map::new();
    if how.format == Format::Normalized {
        out.insert("type".into(), Value::String(kind.name().into()));
    }
    out.insert(kind.value_member().into(), attr.value.clone());
    for (name, md) in attr.metadata.iter() {
        let shown = match name {
            OBSERVED_AT | UNIT_CODE => md.value.clone(),
            _ => {
                let sub = Attribute::new(md.value.clone(), md.md_type.clone());
                let mut sub_how = *how;
                sub_how.sys_attrs = false;
                render_attribute(&sub, &sub_how)
            }
        };
        out.insert(how.context.from_stored(name), shown);
    }
    if how.sys_attrs {
        out.insert(
            "createdAt".into(),
            Value::String(format_datetime(attr.date_created)),
        );
        out.insert(
            "modifiedAt".into(),
            Value::String(format_datetime(attr.date_modified)),
        );
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn core() -> std::sync::Arc<Context> {
        Context::core()
    }

    fn normalized(ctx: &Context) -> Render<'_> {
        Render {
            context: ctx,
            format: Format::Normalized,
            sys_attrs: false,
            attrs: None,
            lang: None,
            datasets: None,
        }
    }

    #[test]
    fn a_normalized_entity_round_trips() {
        let body = json!({
            "id": "urn:ngsi-ld:Vehicle:A4567",
            "type": "Vehicle",
            "brandName": {"type": "Property", "value": "Mercedes"},
            "speed": {"type": "Property", "value": 55, "observedAt": "2018-08-07T12:00:00Z",
                      "unitCode": "KMH",
                      "providedBy": {"type": "Relationship", "object": "urn:ngsi-ld:Person:Bob"}},
            "isParked": {"type": "Relationship", "object": "urn:ngsi-ld:OffStreetParking:Downtown1"},
            "location": {"type": "GeoProperty", "value": {"type": "Point", "coordinates": [-8.5, 41.2]}},
            "name": {"type": "LanguageProperty", "languageMap": {"en": "car", "fr": "voiture"}}
        });
        let ctx = core();
        let entity = parse_entity(&body, &ctx).unwrap();
        assert_eq!(entity.entity_type, "Vehicle");
        assert_eq!(entity.attrs.get("speed").unwrap().attr_type, "Property");
        assert_eq!(
            entity.attrs.get("isParked").unwrap().attr_type,
            "Relationship"
        );
        let expected = body.clone();
        assert_eq!(
            Value::Object(render_entity(&entity, &normalized(&ctx))),
            expected
        );
    }

    #[test]
    fn the_concise_form_reads_as_the_normalized_one() {
        let ctx = core();
        let concise = json!({
            "id": "urn:ngsi-ld:Vehicle:A1", "type": "Vehicle",
            "brandName": "Mercedes",
            "speed": {"value": 55, "unitCode": "KMH"},
            "isParked": {"object": "urn:ngsi-ld:OffStreetParking:Downtown1"},
            "location": {"type": "Point", "coordinates": [-8.5, 41.2]}
        });
        let entity = parse_entity(&concise, &ctx).unwrap();
        assert_eq!(
            entity.attrs.get("location").unwrap().attr_type,
            "GeoProperty"
        );
        let shown = render_entity(
            &entity,
            &Render {
                format: Format::Concise,
                ..normalized(&ctx)
            },
        );
        assert_eq!(Value::Object(shown), concise);
        let kv = render_entity(
            &entity,
            &Render {
                format: Format::KeyValues,
                ..normalized(&ctx)
            },
        );
        assert_eq!(kv["speed"], json!(55));
        assert_eq!(
            kv["isParked"],
            json!("urn:ngsi-ld:OffStreetParking:Downtown1")
        );
    }

    #[test]
    fn json_vocab_and_list_attributes_round_trip() {
        let ctx = core();
        let body = json!({"id": "urn:a:1", "type": "T",
            "config": {"type": "JsonProperty", "json": {"type": "kept", "@id": "as is"}},
            "category": {"type": "VocabProperty", "vocab": ["commercial", "office"]},
            "readings": {"type": "ListProperty", "valueList": [1, 2, 3]},
            "neighbours": {"type": "ListRelationship", "objectList": [{"object": "urn:a:2"}]}});
        let entity = parse_entity(&body, &ctx).unwrap();
        assert_eq!(
            entity.attrs.get("config").unwrap().attr_type,
            "JsonProperty"
        );
        assert_eq!(
            Value::Object(render_entity(&entity, &normalized(&ctx))),
            body
        );
        let concise = render_entity(
            &entity,
            &Render {
                format: Format::Concise,
                ..normalized(&ctx)
            },
        );
        assert_eq!(concise["readings"], json!({"valueList": [1, 2, 3]}));
        let again = parse_entity(&Value::Object(concise), &ctx).unwrap();
        assert_eq!(again.attrs, entity.attrs);
        for bad in [
            json!({"type": "ListProperty", "valueList": 3}),
            json!({"type": "VocabProperty", "vocab": 3}),
            json!({"type": "JsonProperty"}),
        ] {
            let e = json!({"id": "urn:a:1", "type": "T", "a": bad});
            assert!(parse_entity(&e, &ctx).is_err(), "{e}");
        }
    }

    #[test]
    fn lang_picks_one_string_of_a_language_property() {
        let ctx = core();
        let body = json!({"id": "urn:a:1", "type": "T",
            "name": {"type": "LanguageProperty", "languageMap": {"en": "car", "fr": "voiture"}}});
        let entity = parse_entity(&body, &ctx).unwrap();
        let shown = |lang, format| {
            render_entity(
                &entity,
                &Render {
                    lang: Some(lang),
                    format,
                    ..normalized(&ctx)
                },
            )["name"]
                .clone()
        };
        assert_eq!(
            shown("fr", Format::Normalized),
            json!({"type": "Property", "value": "voiture", "lang": "fr"})
        );
        assert_eq!(shown("de", Format::Normalized)["lang"], "en");
        assert_eq!(shown("fr", Format::KeyValues), json!("voiture"));
    }

    #[test]
    fn an_ngsiv2_entity_shows_as_properties_and_relationships() {
        let mut entity = Entity::new("urn:ngsi-ld:Room:1", "Room");
        let mut temp = Attribute::new(json!(21.5), "Number");
        temp.metadata.insert(
            "accuracy",
            Metadata {
                value: json!(0.1),
                md_type: "Number".into(),
            },
        );
        entity.attrs.insert("temperature", temp);
        entity.attrs.insert(
            "refBuilding",
            Attribute::new(json!("urn:ngsi-ld:Building:1"), "Relationship"),
        );
        let ctx = core();
        assert_eq!(
            Value::Object(render_entity(&entity, &normalized(&ctx))),
            json!({
                "id": "urn:ngsi-ld:Room:1", "type": "Room",
                "temperature": {"type": "Property", "value": 21.5,
                                "accuracy": {"type": "Property", "value": 0.1}},
                "refBuilding": {"type": "Relationship", "object": "urn:ngsi-ld:Building:1"}
            })
        );
    }

    #[test]
    fn names_follow_the_clients_context() {
        let ctx = Context::build(
            &json!({"Vehicle": "http://example.org/Vehicle", "speed": "http://example.org/speed"}),
            &|_: &str| None,
        )
        .unwrap();
        let entity = parse_entity(
            &json!({"id": "urn:ngsi-ld:Vehicle:1", "type": "Vehicle", "speed": 3}),
            &ctx,
        )
        .unwrap();
        assert_eq!(entity.entity_type, "http://example.org/Vehicle");
        assert!(entity.attrs.contains_key("http://example.org/speed"));
        let mine = render_entity(&entity, &normalized(&ctx));
        assert_eq!(mine["type"], json!("Vehicle"));
        assert!(mine.contains_key("speed"));
        let core = core();
        let theirs = render_entity(&entity, &normalized(&core));
        assert_eq!(theirs["type"], json!("http://example.org/Vehicle"));
    }

    #[test]
    fn bad_entities_are_refused_with_bad_request_data() {
        let ctx = core();
        for (body, why) in [
            (json!({"type": "T"}), "no id"),
            (json!({"id": "not a uri", "type": "T"}), "id not a URI"),
            (json!({"id": "urn:a:b"}), "no type"),
            (
                json!({"id": "urn:a:b", "type": "T", "a": {"type": "Property"}}),
                "no value",
            ),
            (
                json!({"id": "urn:a:b", "type": "T", "a": {"type": "Relationship", "object": 3}}),
                "object not a URI",
            ),
            (
                json!({"id": "urn:a:b", "type": "T", "a": {"type": "Foo", "value": 3}}),
                "unknown type",
            ),
            (
                json!({"id": "urn:a:b", "type": "T", "a": {"type": "GeoProperty", "value": {"type": "Point"}}}),
                "bad geometry",
            ),
            (
                json!({"id": "urn:a:b", "type": "T", "a": {"type": "Property", "value": 1, "observedAt": "yesterday"}}),
                "bad observedAt",
            ),
            (json!({"id": "urn:a:b", "type": "T", "a(b)": 1}), "bad name"),
            (json!({"id": "urn:a:b", "type": "T", "a": null}), "null"),
        ] {
            let err = parse_entity(&body, &ctx).unwrap_err();
            assert_eq!(err.kind, ErrorKind::BadRequestData, "{why}: {err}");
        }
        let err = parse_entity(&json!([1]), &ctx).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidRequest);
    }

    #[test]
    fn an_entity_is_a_feature_with_its_geometry() {
        let point = serde_json::json!({"type": "Point", "coordinates": [1, 2]});
        let normalized = serde_json::json!({"id": "urn:a:1", "type": "T",
            "location": {"type": "GeoProperty", "value": point}});
        let f = feature(normalized, "location");
        assert_eq!(f["type"], "Feature");
        assert_eq!(f["id"], "urn:a:1");
        assert_eq!(f["geometry"], point);
        assert_eq!(f["properties"]["type"], "T");
        let key_values = serde_json::json!({"id": "urn:a:1", "type": "T", "location": point});
        assert_eq!(feature(key_values, "location")["geometry"], point);
        let none = serde_json::json!({"id": "urn:a:1", "type": "T"});
        assert_eq!(feature(none, "location")["geometry"], Value::Null);
    }
}
