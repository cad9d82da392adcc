//! Request payloads into the model, with Orion's validation and its exact
//! error texts (taken from Orion's functional test cases, cited in the
//! tests below).
//!
//! Attribute order follows the order of the [`Value`] object handed in.
//! serde_json keeps a document's key order only with its `preserve_order`
//! feature; without it objects iterate alphabetically.

use serde::de::{IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};
use std::fmt;

use super::{
    default_type, is_date_type, parse_datetime, AttrMap, Attribute, Entity, Metadata, MetadataMap,
    NgsiError, DEFAULT_ENTITY_TYPE, EXPIRATION_ATTR, MAX_NAME_LEN,
};
use crate::ngsi::datetime::format_datetime;

/// Deepest nesting Orion accepts in attribute and metadata values.
pub const MAX_NESTING: usize = 50;

/// Characters Orion forbids in values (unless `TextUnrestricted`) and in
/// identifiers.
pub const FORBIDDEN_CHARS: &[char] = &['<', '>', '"', '\'', '=', ';', '(', ')'];

/// What an identifier names; selects the words of the error texts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameKind {
    /// Entity id.
    EntityId,
    /// Entity type.
    EntityType,
    /// Attribute name.
    AttrName,
    /// Attribute type.
    AttrType,
    /// Metadata name.
    MetadataName,
    /// Metadata type.
    MetadataType,
}

impl NameKind {
    fn label(self) -> &'static str {
        match self {
            NameKind::EntityId => "entity id",
            NameKind::EntityType => "entity type",
            NameKind::AttrName => "attribute name",
            NameKind::AttrType => "attribute type",
            NameKind::MetadataName => "metadata name",
            NameKind::MetadataType => "metadata type",
        }
    }
}

/// Checks an identifier: 1–256 characters of printable ASCII, none of
/// `& ? / #`, none of the forbidden characters `< > " ' = ; ( )`.
/// The texts are Orion's: "entity id length: 0, min length supported: 1",
/// "entity id length: 257, max length supported: 256",
/// "Invalid characters in entity id" (and likewise for the other kinds).
pub fn check_name(kind: NameKind, s: &str) -> Result<(), NgsiError> {
    let label = kind.label();
    if s.is_empty() {
        return Err(NgsiError::bad_request(format!(
            "{label} length: 0, min length supported: 1"
        )));
    }
    if s.len() > MAX_NAME_LEN {
        return Err(NgsiError::bad_request(format!(
            "{label} length: {}, max length supported: {MAX_NAME_LEN}",
            s.len()
        )));
    }
    let valid = s.bytes().all(|b| {
        b.is_ascii_graphic()
            && !matches!(b, b'&' | b'?' | b'/' | b'#')
            && !FORBIDDEN_CHARS.contains(&(b as char))
    });
    if !valid {
        return Err(NgsiError::bad_request(format!(
            "Invalid characters in {label}"
        )));
    }
    Ok(())
}

/// Orion's check on the URLs it calls (notification endpoints, context
/// providers): absolute, with a host, no whitespace, a numeric port if
/// any; with `http_only`, the `http` or `https` scheme.
pub fn is_valid_url(text: &str, http_only: bool) -> bool {
    if text.contains(char::is_whitespace) {
        return false;
    }
    let Ok(url) = url::Url::parse(text) else {
        return false;
    };
    let scheme_ok = !http_only || matches!(url.scheme(), "http" | "https");
    scheme_ok && url.host_str().is_some_and(|h| !h.is_empty())
}

/// Parses a JSON request body. Syntax errors (including non-string keys)
/// are Orion's ParseError; a key repeated at the top level is
/// "duplicated attribute /<name>/" (`1444_err_msg_duplicate_attr`), which
/// a plain `serde_json` parse would silently resolve to the last value.
/// One pass: the top-level object is built by hand so its keys are checked
/// as they arrive; everything below it is parsed by `serde_json` as usual.
pub fn parse_body(text: &str) -> Result<Value, NgsiError> {
    match serde_json::from_str::<TopLevel>(text) {
        Ok(TopLevel::Value(value)) => Ok(value),
        Ok(TopLevel::Duplicate(name)) => Err(duplicated(&name)),
        Err(_) => Err(NgsiError::parse_error()),
    }
}

/// A body as parsed by [`parse_body`]: its value, or the first key its
/// top-level object repeats (the rest of the document still parsed, so a
/// syntax error anywhere wins, as in Orion).
enum TopLevel {
    Value(Value),
    Duplicate(String),
}

impl<'de> Deserialize<'de> for TopLevel {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = TopLevel;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<TopLevel, A::Error> {
                let mut map = Map::new();
                while let Some(key) = access.next_key::<String>()? {
                    if map.contains_key(&key) {
                        access.next_value::<IgnoredAny>()?;
                        while access.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                        return Ok(TopLevel::Duplicate(key));
                    }
                    let value = access.next_value::<Value>()?;
                    map.insert(key, value);
                }
                Ok(TopLevel::Value(Value::Object(map)))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<TopLevel, A::Error> {
                let value = Value::deserialize(serde::de::value::SeqAccessDeserializer::new(seq))?;
                Ok(TopLevel::Value(value))
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<TopLevel, E> {
                Ok(TopLevel::Value(Value::Bool(v)))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<TopLevel, E> {
                Ok(TopLevel::Value(Value::from(v)))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<TopLevel, E> {
                Ok(TopLevel::Value(Value::from(v)))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<TopLevel, E> {
                Ok(TopLevel::Value(Value::from(v)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<TopLevel, E> {
                Ok(TopLevel::Value(Value::String(v.to_string())))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<TopLevel, E> {
                Ok(TopLevel::Value(Value::String(v)))
            }
            fn visit_unit<E: serde::de::Error>(self) -> Result<TopLevel, E> {
                Ok(TopLevel::Value(Value::Null))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// Parses an entity creation payload (`POST /v2/entities`, batch
/// entities): `{"id","type",<attrs>}` in normalized form, or with
/// `key_values` the attribute values directly. The entity's dates are left
/// at 0: call [`Entity::stamp_created`] when it is stored.
pub fn parse_entity(body: &Value, key_values: bool) -> Result<Entity, NgsiError> {
    let Value::Object(obj) = body else {
        return Err(NgsiError::parse_error());
    };
    let id = match obj.get("id") {
        None => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(NgsiError::bad_request("Invalid JSON type for entity id")),
    };
    check_name(NameKind::EntityId, &id)?;
    let entity_type = match obj.get("type") {
        None => DEFAULT_ENTITY_TYPE.to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(NgsiError::bad_request("Invalid JSON type for entity type")),
    };
    check_name(NameKind::EntityType, &entity_type)?;
    let mut entity = Entity::new(id, entity_type);
    entity.attrs = parse_attr_entries(obj, key_values, true)?;
    entity.refresh_expiration();
    entity.check_locations()?;
    Ok(entity)
}

/// Parses the attributes of `/v2/entities/{id}/attrs` payloads (POST,
/// PATCH, PUT) and batch updates. `id` and `type` are refused here:
/// "entity id specified in payload", "entity type specified in payload"
/// (`1259_new_json_for_v2/putPostPatch_v2_entities_eid_with_error.test`).
pub fn parse_attrs(body: &Value, key_values: bool) -> Result<AttrMap, NgsiError> {
    let Value::Object(obj) = body else {
        return Err(NgsiError::parse_error());
    };
    refuse_entity_keys(|key| obj.contains_key(key))?;
    parse_attr_entries(obj, key_values, false)
}

/// An attributes payload naming the entity is refused, the id first
/// (`has` says whether the payload has a top-level key).
fn refuse_entity_keys(has: impl Fn(&str) -> bool) -> Result<(), NgsiError> {
    if has("id") {
        return Err(NgsiError::bad_request("entity id specified in payload"));
    }
    if has("type") {
        return Err(NgsiError::bad_request("entity type specified in payload"));
    }
    Ok(())
}

/// Orion's error for a key a payload's top level repeats.
fn duplicated(name: &str) -> NgsiError {
    NgsiError::bad_request(format!("duplicated attribute /{name}/"))
}

/// The visits of every JSON scalar (booleans, numbers, strings, null),
/// all answering `$answer`: for the visitors below, a scalar is simply
/// "not an object".
macro_rules! scalars_are {
    ($answer:expr) => {
        fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok($answer)
        }
        fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Ok($answer)
        }
        fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Ok($answer)
        }
        fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok($answer)
        }
        fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<Self::Value, E> {
            Ok($answer)
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok($answer)
        }
    };
}

/// The body of `POST`, `PATCH` and `PUT /v2/entities/{id}/attrs`, read
/// from its text straight into the attributes' parts: no JSON object is
/// built for the body or for each attribute, only for compound values.
/// It gives the errors of [`parse_body`] then [`parse_attrs`], in the same
/// order, and the same attributes.
pub struct AttrsBody {
    top: Top,
}

/// What the top level of an attributes body was.
enum Top {
    /// An object: its members in order.
    Object(Vec<(String, AttrJson)>),
    /// An object repeating this key.
    Duplicate(String),
    /// Any other JSON value.
    NotObject,
}

impl AttrsBody {
    /// Reads `text`: a syntax error anywhere is Orion's ParseError, a key
    /// repeated at the top level "duplicated attribute /<name>/".
    pub fn parse(text: &str, key_values: bool) -> Result<AttrsBody, NgsiError> {
        let mut de = serde_json::Deserializer::from_str(text);
        let top = serde::de::DeserializeSeed::deserialize(TopSeed { key_values }, &mut de)
            .and_then(|top| de.end().map(|()| top))
            .map_err(|_| NgsiError::parse_error())?;
        if let Top::Duplicate(name) = top {
            return Err(duplicated(&name));
        }
        Ok(AttrsBody { top })
    }

    /// Whether the body is the empty object `{}`.
    pub fn is_empty_object(&self) -> bool {
        matches!(&self.top, Top::Object(members) if members.is_empty())
    }

    /// The attributes, checked as [`parse_attrs`] checks them.
    pub fn into_attrs(self) -> Result<AttrMap, NgsiError> {
        let Top::Object(members) = self.top else {
            return Err(NgsiError::parse_error());
        };
        refuse_entity_keys(|key| members.iter().any(|(k, _)| k == key))?;
        attrs_from_entries(members, false)
    }
}

/// Reads the top level of an attributes body.
struct TopSeed {
    key_values: bool,
}

impl<'de> serde::de::DeserializeSeed<'de> for TopSeed {
    type Value = Top;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Top, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for TopSeed {
    type Value = Top;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Top, A::Error> {
        let mut members: Vec<(String, AttrJson)> = Vec::new();
        // Bodies hold a few attributes; a long one is checked for repeated
        // keys through a set, so no body costs quadratic time.
        let mut seen: Option<std::collections::HashSet<String>> = None;
        while let Some(key) = access.next_key::<String>()? {
            let repeated = match &mut seen {
                Some(set) => !set.insert(key.clone()),
                None => {
                    let repeated = members.iter().any(|(k, _)| *k == key);
                    if members.len() >= 32 {
                        let mut set: std::collections::HashSet<String> =
                            members.iter().map(|(k, _)| k.clone()).collect();
                        set.insert(key.clone());
                        seen = Some(set);
                    }
                    repeated
                }
            };
            if repeated {
                access.next_value::<IgnoredAny>()?;
                while access.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                return Ok(Top::Duplicate(key));
            }
            let json = if self.key_values {
                AttrJson::Raw(access.next_value()?)
            } else {
                access.next_value_seed(NormalizedSeed)?
            };
            members.push((key, json));
        }
        Ok(Top::Object(members))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Top, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Top::NotObject)
    }
    scalars_are!(Top::NotObject);
}

/// An attribute as a payload writes it, before its checks: what
/// [`AttrsBody`] reads from the text and [`parse_attrs`] takes from a
/// parsed [`Value`], so both go through [`attrs_from_entries`].
enum AttrJson {
    /// A `keyValues` value: the attribute's value itself.
    Raw(Value),
    /// A normalized attribute's object.
    Parts(AttrParts),
    /// A normalized attribute that is not an object (refused).
    NotObject,
}

impl AttrJson {
    fn from_value(v: &Value, key_values: bool) -> AttrJson {
        match v {
            _ if key_values => AttrJson::Raw(v.clone()),
            Value::Object(o) => AttrJson::Parts(AttrParts::from_object(o)),
            _ => AttrJson::NotObject,
        }
    }

    /// The attribute, with Orion's checks in Orion's order.
    fn into_attribute(self) -> Result<Attribute, NgsiError> {
        match self {
            AttrJson::Raw(v) => {
                let attr_type = default_type(&v);
                let value = check_value(attr_type, &MetadataMap::new(), v)?;
                Ok(Attribute::new(value, attr_type))
            }
            AttrJson::Parts(parts) => parts.into_attribute(),
            AttrJson::NotObject => Err(NgsiError::bad_request(
                "attribute must be a JSON object, unless keyValues option is used",
            )),
        }
    }
}

/// The members of a normalized attribute's object that Orion knows, and
/// whether there were others; a repeated member keeps its last value, as
/// in a parsed object.
#[derive(Default)]
struct AttrParts {
    value: Option<Value>,
    attr_type: Option<Value>,
    metadata: Option<Value>,
    unknown: bool,
}

impl AttrParts {
    fn from_object(o: &Map<String, Value>) -> AttrParts {
        AttrParts {
            value: o.get("value").cloned(),
            attr_type: o.get("type").cloned(),
            metadata: o.get("metadata").cloned(),
            unknown: o
                .keys()
                .any(|k| !matches!(k.as_str(), "value" | "type" | "metadata")),
        }
    }

    fn into_attribute(self) -> Result<Attribute, NgsiError> {
        if self.unknown {
            return Err(NgsiError::bad_request(
                "unrecognized property for context attribute",
            ));
        }
        let value = self.value.unwrap_or(Value::Null);
        let attr_type = match self.attr_type {
            None => default_type(&value).to_string(),
            Some(Value::String(s)) => {
                check_name(NameKind::AttrType, &s)?;
                s
            }
            Some(_) => {
                return Err(NgsiError::bad_request(
                    "invalid JSON type for attribute type",
                ))
            }
        };
        let metadata = match self.metadata {
            None | Some(Value::Null) => MetadataMap::new(),
            Some(Value::Object(m)) => parse_metadata(&m)?,
            Some(_) => return Err(NgsiError::bad_request("metadata must be a JSON object")),
        };
        let value = check_value(&attr_type, &metadata, value)?;
        let mut attr = Attribute::new(value, attr_type);
        attr.metadata = metadata;
        Ok(attr)
    }
}

/// Reads one normalized attribute: its object's members, or that it is
/// not an object (the rest of the body is still read, so a syntax error
/// later wins).
struct NormalizedSeed;

impl<'de> serde::de::DeserializeSeed<'de> for NormalizedSeed {
    type Value = AttrJson;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<AttrJson, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for NormalizedSeed {
    type Value = AttrJson;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an attribute")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<AttrJson, A::Error> {
        let mut parts = AttrParts::default();
        while let Some(key) = access.next_key::<PartName>()? {
            match key {
                PartName::Value => parts.value = Some(access.next_value()?),
                PartName::Type => parts.attr_type = Some(access.next_value()?),
                PartName::Metadata => parts.metadata = Some(access.next_value()?),
                PartName::Other => {
                    parts.unknown = true;
                    access.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(AttrJson::Parts(parts))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<AttrJson, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(AttrJson::NotObject)
    }
    scalars_are!(AttrJson::NotObject);
}

/// A member name of a normalized attribute, read without allocating.
enum PartName {
    Value,
    Type,
    Metadata,
    Other,
}

impl<'de> Deserialize<'de> for PartName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = PartName;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a member name")
            }
            fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<PartName, E> {
                Ok(match name {
                    "value" => PartName::Value,
                    "type" => PartName::Type,
                    "metadata" => PartName::Metadata,
                    _ => PartName::Other,
                })
            }
        }
        deserializer.deserialize_str(V)
    }
}

/// Parses the body of `PUT /v2/entities/{id}/attrs/{name}`: one attribute
/// in normalized form (`{"value","type","metadata"}`).
pub fn parse_attr(name: &str, body: &Value) -> Result<Attribute, NgsiError> {
    check_attr_name(name)?;
    let attr = parse_normalized_attr(body)?;
    check_expiration(name, &attr)?;
    Ok(attr)
}

/// Parses a `text/plain` body of `PUT /v2/entities/{id}/attrs/{name}/value`:
/// a number, `true`, `false`, `null` or a double-quoted string
/// (`1188_empty_attribute_value`, `2386_missing_citation_mark_error`).
pub fn parse_attr_value_text(text: &str) -> Result<Value, NgsiError> {
    let t = text.trim();
    match t {
        "true" => return Ok(Value::Bool(true)),
        "false" => return Ok(Value::Bool(false)),
        "null" => return Ok(Value::Null),
        _ => {}
    }
    if let Some(rest) = t.strip_prefix('"') {
        return match rest.strip_suffix('"') {
            Some(inner) => Ok(Value::String(inner.to_string())),
            None => Err(NgsiError::bad_request(
                "Missing citation-mark at end of string",
            )),
        };
    }
    if t.starts_with(|c: char| c.is_ascii_digit() || c == '-' || c == '.' || c == '+') {
        let numeric = t.strip_prefix('+').unwrap_or(t);
        if let Ok(v @ Value::Number(_)) = serde_json::from_str::<Value>(numeric) {
            return Ok(v);
        }
        if let Ok(f) = numeric.parse::<f64>() {
            if let Some(n) = serde_json::Number::from_f64(f) {
                return Ok(Value::Number(n));
            }
        }
    }
    Err(NgsiError::bad_request(
        "attribute value type not recognized",
    ))
}

fn check_attr_name(name: &str) -> Result<(), NgsiError> {
    check_name(NameKind::AttrName, name)?;
    if matches!(name, "id" | "type" | "geo:distance" | "*") {
        return Err(NgsiError::bad_request(
            "Invalid characters in attribute name",
        ));
    }
    Ok(())
}

fn parse_attr_entries(
    obj: &Map<String, Value>,
    key_values: bool,
    skip_entity_keys: bool,
) -> Result<AttrMap, NgsiError> {
    attrs_from_entries(
        obj.iter()
            .map(|(name, v)| (name.clone(), AttrJson::from_value(v, key_values))),
        skip_entity_keys,
    )
}

/// The one set of checks every attributes payload goes through, in
/// Orion's order: each attribute's name, then its content, then the
/// expiration rule, attribute by attribute in the payload's order.
fn attrs_from_entries(
    entries: impl IntoIterator<Item = (String, AttrJson)>,
    skip_entity_keys: bool,
) -> Result<AttrMap, NgsiError> {
    let mut attrs = AttrMap::new();
    for (name, json) in entries {
        if skip_entity_keys && (name == "id" || name == "type") {
            continue;
        }
        check_attr_name(&name)?;
        let attr = json.into_attribute()?;
        check_expiration(&name, &attr)?;
        attrs.insert(name, attr);
    }
    Ok(attrs)
}

/// A `dateExpires` attribute written by a request must be a date (Orion's
/// 400 otherwise): it sets when the entity expires.
fn check_expiration(name: &str, attr: &Attribute) -> Result<(), NgsiError> {
    if name == EXPIRATION_ATTR && !is_date_type(&attr.attr_type) {
        return Err(NgsiError::bad_request(
            "error processing date expiration attribute, see log traces",
        ));
    }
    Ok(())
}

fn parse_normalized_attr(v: &Value) -> Result<Attribute, NgsiError> {
    AttrJson::from_value(v, false).into_attribute()
}

fn parse_metadata(m: &Map<String, Value>) -> Result<MetadataMap, NgsiError> {
    let mut out = MetadataMap::new();
    for (name, md) in m {
        check_name(NameKind::MetadataName, name)?;
        let Value::Object(o) = md else {
            return Err(NgsiError::bad_request("metadata must be a JSON object"));
        };
        if o.keys().any(|k| k != "value" && k != "type") {
            return Err(NgsiError::bad_request(
                "invalid JSON field for attribute metadata",
            ));
        }
        let value = o.get("value").cloned().unwrap_or(Value::Null);
        let md_type = match o.get("type") {
            None => default_type(&value).to_string(),
            Some(Value::String(s)) => {
                check_name(NameKind::MetadataType, s)?;
                s.clone()
            }
            Some(_) => {
                return Err(NgsiError::bad_request(
                    "invalid JSON type for attribute metadata type",
                ))
            }
        };
        check_nesting(&value)?;
        let value = if is_date_type(&md_type) {
            normalise_date(value, "date has invalid format in metadata value")?
        } else {
            value
        };
        out.insert(name.clone(), Metadata { value, md_type });
    }
    Ok(out)
}

fn normalise_date(value: Value, error: &str) -> Result<Value, NgsiError> {
    match &value {
        Value::Null => Ok(value),
        Value::String(s) => match parse_datetime(s) {
            Some(ms) => Ok(Value::String(format_datetime(ms))),
            None => Err(NgsiError::bad_request(error)),
        },
        _ => Err(NgsiError::bad_request(error)),
    }
}

/// Validates (and normalises) an attribute value for its type and
/// metadata: nesting depth, forbidden characters unless the type or a
/// `TextUnrestricted: true` metadata lifts them (`4792_text_unrestricted_metadata`,
/// `3867_textUnrestricted…`), `DateTime`/`ISO8601` dates, location values ([`crate::geo`]).
pub(crate) fn check_value(
    attr_type: &str,
    metadata: &MetadataMap,
    value: Value,
) -> Result<Value, NgsiError> {
    check_nesting(&value)?;
    let unrestricted = attr_type == "TextUnrestricted"
        || matches!(
            metadata.get("TextUnrestricted").map(|m| &m.value),
            Some(Value::Bool(true))
        );
    if !unrestricted && has_forbidden_chars(&value) {
        return Err(NgsiError::bad_request(
            "Invalid characters in attribute value",
        ));
    }
    if is_date_type(attr_type) {
        // `{"$min": date}` and `{"$max": date}` compare instants (the
        // date normalised, so normalised dates compare as text); other
        // operators go as they are, as Orion takes them.
        if super::operators::is_operator(&value) {
            let Value::Object(mut op) = value else {
                return Ok(value);
            };
            for name in ["$min", "$max"] {
                if let Some(date) = op.get_mut(name) {
                    let given = std::mem::take(date);
                    *date = normalise_date(given, "date has invalid format in attribute value")?;
                }
            }
            return Ok(Value::Object(op));
        }
        return normalise_date(value, "date has invalid format in attribute value");
    }
    // A location is checked as Orion indexes it; `ignoreType` makes it
    // plain data (Orion 3.6.0).
    let ignored = matches!(
        metadata.get("ignoreType").map(|m| &m.value),
        Some(Value::Bool(true))
    );
    if !ignored {
        crate::geo::Shape::from_attribute(attr_type, &value)
            .map_err(|e| NgsiError::bad_request(e.description()))?;
    }
    Ok(value)
}

fn has_forbidden_chars(v: &Value) -> bool {
    match v {
        Value::String(s) => s.contains(FORBIDDEN_CHARS),
        Value::Array(a) => a.iter().any(has_forbidden_chars),
        Value::Object(o) => o.values().any(has_forbidden_chars),
        _ => false,
    }
}

fn check_nesting(v: &Value) -> Result<(), NgsiError> {
    fn depth(v: &Value) -> usize {
        match v {
            Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
            Value::Object(o) => 1 + o.values().map(depth).max().unwrap_or(0),
            _ => 0,
        }
    }
    if depth(v) > MAX_NESTING {
        return Err(NgsiError::bad_request(format!(
            "attribute or metadata value has overpassed maximum nesting limit: {MAX_NESTING}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn err(r: Result<impl fmt::Debug, NgsiError>) -> (u16, &'static str, String) {
        let e = r.unwrap_err();
        (e.status, e.error, e.description)
    }

    fn bad(text: &str) -> (u16, &'static str, String) {
        (400, "BadRequest", text.to_string())
    }

    fn parse_error() -> (u16, &'static str, String) {
        err(Err::<(), _>(NgsiError::parse_error()))
    }

    // 0970_create_entity/simple_creation.test, 1836_min_length_id_v2: defaults.
    #[test]
    fn normalized_entity_with_default_types() {
        let e = parse_entity(
            &json!({"id":"E","A":{"value":1},"B":{"value":"x"},"C":{"value":true},
                    "D":{"value":[1]},"F":{"value":null},"G":{}}),
            false,
        )
        .unwrap();
        assert_eq!(e.entity_type, "Thing");
        let types: Vec<_> = e.attrs.iter().map(|(_, a)| a.attr_type.as_str()).collect();
        assert_eq!(
            types,
            [
                "Number",
                "Text",
                "Boolean",
                "StructuredValue",
                "None",
                "None"
            ]
        );
    }

    // 1836_min_length_id_v2_metadata.test: metadata without type is Text.
    #[test]
    fn metadata_default_type_and_compound_values() {
        let e = parse_entity(
            &json!({"id":"E","A":{"value":1,"metadata":{"m":{"value":"x"},
                    "c":{"value":{"a":1,"b":"beee"}}}}}),
            false,
        )
        .unwrap();
        let md = &e.attrs.get("A").unwrap().metadata;
        assert_eq!(md.get("m").unwrap().md_type, "Text");
        // 1068_metadata_value_as_compound_object.test
        assert_eq!(md.get("c").unwrap().value, json!({"a":1,"b":"beee"}));
        assert_eq!(md.get("c").unwrap().md_type, "StructuredValue");
    }

    // 0970_create_entity/errors_at_creation.test
    #[test]
    fn entity_id_and_type_errors() {
        let kv = |v| parse_entity(&v, true);
        assert_eq!(
            err(kv(json!({"type":"T1","attr01":"1"}))),
            bad("entity id length: 0, min length supported: 1")
        );
        assert_eq!(
            err(kv(json!({"id":"","attr01":"1"}))),
            bad("entity id length: 0, min length supported: 1")
        );
        assert_eq!(
            err(kv(json!({"id":true}))),
            bad("Invalid JSON type for entity id")
        );
        assert_eq!(
            err(kv(json!({"id":12}))),
            bad("Invalid JSON type for entity id")
        );
        assert_eq!(
            err(kv(json!({"id":"ID","type":false}))),
            bad("Invalid JSON type for entity type")
        );
        assert_eq!(
            err(kv(json!({"id":"ID","type":"WT","":"1"}))),
            bad("attribute name length: 0, min length supported: 1")
        );
        // 1836_min_length_id_v2_entity.test
        assert_eq!(
            err(kv(json!({"id":"E","type":""}))),
            bad("entity type length: 0, min length supported: 1")
        );
    }

    // 0970_create_entity/errors_at_creation.test steps 08-09: non-string keys.
    #[test]
    fn non_string_keys_are_parse_errors() {
        let e = parse_body(r#"{"id":"ID","type":"WT",6:"1"}"#).unwrap_err();
        assert_eq!(
            e.to_json(),
            json!({"error":"ParseError","description":"Errors found in incoming JSON buffer"})
        );
    }

    // 1444_err_msg_duplicate_attr/create_entity_dup_attr.test
    #[test]
    fn duplicated_attribute() {
        let r = parse_body(r#"{"id":"E1","type":"T1","attr":"value","attr":1}"#);
        assert_eq!(err(r), bad("duplicated attribute /attr/"));
        assert!(parse_body(r#"{"a":{"x":1},"b":{"x":2}}"#).is_ok());
        // A syntax error anywhere is a parse error, even after a duplicate.
        let r = parse_body(r#"{"attr":1,"attr":2,"x":}"#);
        assert_eq!(err(r), parse_error());
        assert_eq!(err(parse_body(r#"{"a":1} x"#)), parse_error());
    }

    #[test]
    fn bodies_keep_their_values_and_key_order() {
        let v = parse_body(r#"{"z":1,"a":[true,null,"s",-2,1.5],"m":{"k":{}}}"#).unwrap();
        assert_eq!(
            v.to_string(),
            r#"{"z":1,"a":[true,null,"s",-2,1.5],"m":{"k":{}}}"#
        );
        for text in ["[1,{\"a\":1}]", "\"s\"", "12", "-1.5", "true", "null"] {
            assert_eq!(
                parse_body(text).unwrap(),
                serde_json::from_str::<Value>(text).unwrap(),
                "{text}"
            );
        }
        assert_eq!(err(parse_body("")), parse_error());
        assert_eq!(err(parse_body("{1:2}")), parse_error());
    }

    // 1601_restrict_chars_in_ids/*.test, 1728_bug_forbidden_chars/*.test
    #[test]
    fn invalid_characters_in_identifiers() {
        let n = |v| err(parse_entity(&v, false));
        assert_eq!(
            n(json!({"id":"España","A1":""})),
            bad("Invalid characters in entity id")
        );
        assert_eq!(
            n(json!({"id":"E#"})),
            bad("Invalid characters in entity id")
        );
        assert_eq!(
            n(json!({"id":"Espa>a"})),
            bad("Invalid characters in entity id")
        );
        assert_eq!(
            n(json!({"id":"E;"})),
            bad("Invalid characters in entity id")
        );
        assert_eq!(
            n(json!({"id":"E1","type":"Olé"})),
            bad("Invalid characters in entity type")
        );
        assert_eq!(
            n(json!({"id":"E1","type":"Ol("})),
            bad("Invalid characters in entity type")
        );
        assert_eq!(
            n(json!({"id":"E1","España":{"value":"06","type":"AT"}})),
            bad("Invalid characters in attribute name")
        );
        assert_eq!(
            n(json!({"id":"E1","A?":{"value":"06"}})),
            bad("Invalid characters in attribute name")
        );
        assert_eq!(
            n(json!({"id":"E1","A1":{"value":"06","type":"olé"}})),
            bad("Invalid characters in attribute type")
        );
        assert_eq!(
            n(json!({"id":"E1","A1":{"value":"06","type":"A/"}})),
            bad("Invalid characters in attribute type")
        );
        assert_eq!(
            n(json!({"id":"E1","a":{"value":"06","metadata":{"España":{"value":"m1"}}}})),
            bad("Invalid characters in metadata name")
        );
        assert_eq!(
            n(json!({"id":"E1","a":{"value":"06","metadata":{"m1":{"value":"m1","type":"ol)"}}}})),
            bad("Invalid characters in metadata type")
        );
    }

    // 1601_restrict_chars_in_ids/restrict_len_ids.test
    #[test]
    fn identifier_lengths() {
        let long = "a".repeat(257);
        let n = |v| err(parse_entity(&v, false));
        assert_eq!(
            n(json!({ "id": long })),
            bad("entity id length: 257, max length supported: 256")
        );
        assert_eq!(
            n(json!({"id":"E1","type": long})),
            bad("entity type length: 257, max length supported: 256")
        );
        let mut o = serde_json::Map::new();
        o.insert("id".into(), json!("E1"));
        o.insert(long.clone(), json!({"value":"06"}));
        assert_eq!(
            n(Value::Object(o)),
            bad("attribute name length: 257, max length supported: 256")
        );
        assert_eq!(
            n(json!({"id":"E1","A1":{"value":"06","type": long}})),
            bad("attribute type length: 257, max length supported: 256")
        );
        assert_eq!(
            n(json!({"id":"E1","A1":{"value":"06","metadata":{"m":{"value":1,"type": long}}}})),
            bad("metadata type length: 257, max length supported: 256")
        );
        assert!(parse_entity(&json!({"id": "a".repeat(256)}), false).is_ok());
    }

    // 1785_error_on_empty_attr_type, 1836_min_length_id_v2_{attr,metadata}.test
    #[test]
    fn empty_types() {
        assert_eq!(
            err(parse_attrs(&json!({"A1":{"value":"03","type":""}}), false)),
            bad("attribute type length: 0, min length supported: 1")
        );
        assert_eq!(
            err(parse_attrs(
                &json!({"A1":{"value":1,"metadata":{"m":{"value":1,"type":""}}}}),
                false
            )),
            bad("metadata type length: 0, min length supported: 1")
        );
    }

    // 1108_non_string_fields/non_string_fields.test
    #[test]
    fn non_string_fields() {
        let n = |v| err(parse_entity(&v, false));
        assert_eq!(
            n(json!({"type":"room","id":false,"temperature":{"type":"AT","value":25}})),
            bad("Invalid JSON type for entity id")
        );
        assert_eq!(
            n(json!({"type":false,"id":"E1","temperature":25})),
            bad("Invalid JSON type for entity type")
        );
        assert_eq!(
            n(json!({"type":"room","id":"E1","temperature":{"type":false,"value":25}})),
            bad("invalid JSON type for attribute type")
        );
        assert_eq!(
            n(
                json!({"type":"room","id":"E1","temperature":{"type":"AT","value":25,"metadata":{"meta":{"type":false,"value":"STRING"}}}})
            ),
            bad("invalid JSON type for attribute metadata type")
        );
        assert_eq!(
            n(
                json!({"type":"room","id":"E1","temperature":{"type":"AT","value":25,"metadata":{"meta":{"type":"md","value":3,"invalid":true}}}})
            ),
            bad("invalid JSON field for attribute metadata")
        );
        assert_eq!(
            n(
                json!({"type":"room","id":"E1","temperature":{"type":"AT","value":25,"metadata":{"meta":14}}})
            ),
            bad("metadata must be a JSON object")
        );
    }

    // 1259_new_json_for_v2/putPostPatch_v2_entities_eid_with_error.test
    #[test]
    fn attrs_payload_errors() {
        assert_eq!(
            err(parse_attrs(&json!({"id":"E1","a1":"a1"}), true)),
            bad("entity id specified in payload")
        );
        assert_eq!(
            err(parse_attrs(&json!({"type":"T1","a1":"a1"}), true)),
            bad("entity type specified in payload")
        );
        assert_eq!(
            err(parse_attrs(
                &json!({"a1":{"value":12,"type":"int","bad_tag":14}}),
                false
            )),
            bad("unrecognized property for context attribute")
        );
        // errors_at_creation / attribute given as a plain value without keyValues
        assert_eq!(
            err(parse_attrs(&json!({"a1":12}), false)),
            bad("attribute must be a JSON object, unless keyValues option is used")
        );
    }

    // 1039_ngsiv2_date_support/basic_dates_support.test, 2654_iso8601_as_alias_for_DateTime
    #[test]
    fn datetime_values() {
        for t in ["DateTime", "ISO8601"] {
            assert_eq!(
                err(parse_attrs(&json!({"d":{"value":"foo","type":t}}), false)),
                bad("date has invalid format in attribute value")
            );
        }
        let a = parse_attrs(
            &json!({"d":{"value":"2050-04-05T14:00:00.123","type":"DateTime"}}),
            false,
        )
        .unwrap();
        assert_eq!(a.get("d").unwrap().value, json!("2050-04-05T14:00:00.123Z"));
        // keyValues: a date string is just Text
        let a = parse_attrs(&json!({"d":"foo"}), true).unwrap();
        assert_eq!(a.get("d").unwrap().attr_type, "Text");
    }

    // 2681_bugfix_op_update_attr_value_checks, 4792_text_unrestricted_metadata, 3867_textUnrestricted…
    #[test]
    fn forbidden_characters_in_values() {
        assert_eq!(
            err(parse_attrs(
                &json!({"A1":{"type":"Text","value":"house<flat>"}}),
                false
            )),
            bad("Invalid characters in attribute value")
        );
        assert_eq!(
            err(parse_attrs(&json!({"A1":{"value":{"a":["(x)"]}}}), false)),
            bad("Invalid characters in attribute value")
        );
        assert_eq!(
            err(parse_attrs(&json!({"A1":"a=b"}), true)),
            bad("Invalid characters in attribute value")
        );
        let v = "Value with <forbidden> characters (like = or ;)";
        assert!(parse_attrs(
            &json!({"A":{"type":"TextUnrestricted","value":{"(A)":["(A)"]}}}),
            false
        )
        .is_ok());
        assert!(parse_attrs(
            &json!({"A":{"type":"FunnyType","value":v,
            "metadata":{"TextUnrestricted":{"value":true,"type":"Boolean"}}}}),
            false
        )
        .is_ok());
        assert_eq!(
            err(parse_attrs(
                &json!({"A":{"type":"FunnyType","value":v,
                "metadata":{"TextUnrestricted":{"value":false,"type":"Boolean"}}}}),
                false
            )),
            bad("Invalid characters in attribute value")
        );
        assert!(parse_attrs(
            &json!({"A":{"type":"TextUnrestricted","value":v,
            "metadata":{"TextUnrestricted":{"value":false,"type":"Boolean"}}}}),
            false
        )
        .is_ok());
    }

    // 3121_missing_or_empty_metadata_values/batch_operation.test: missing values are null.
    #[test]
    fn missing_values_are_null() {
        let a = parse_attrs(
            &json!({"pressure":{"type":"Integer","metadata":{"accuracy":{"type":"Float"}}}}),
            false,
        )
        .unwrap();
        let p = a.get("pressure").unwrap();
        assert_eq!(p.value, Value::Null);
        assert_eq!(p.attr_type, "Integer");
        assert_eq!(p.metadata.get("accuracy").unwrap().value, Value::Null);
    }

    // 1188_empty_attribute_value, 2386_missing_citation_mark_error
    #[test]
    fn text_plain_values() {
        assert_eq!(parse_attr_value_text("\"\"").unwrap(), json!(""));
        assert_eq!(parse_attr_value_text("5").unwrap(), json!(5));
        assert_eq!(parse_attr_value_text("-2.5").unwrap(), json!(-2.5));
        assert_eq!(parse_attr_value_text("true").unwrap(), json!(true));
        assert_eq!(parse_attr_value_text("null").unwrap(), Value::Null);
        assert_eq!(parse_attr_value_text("\"foo\"").unwrap(), json!("foo"));
        assert_eq!(
            err(parse_attr_value_text("\"foo")),
            bad("Missing citation-mark at end of string")
        );
        assert_eq!(
            err(parse_attr_value_text("foo\"")),
            bad("attribute value type not recognized")
        );
        assert_eq!(
            err(parse_attr_value_text("foo")),
            bad("attribute value type not recognized")
        );
    }

    #[test]
    fn reserved_attribute_names_and_geojson() {
        for n in ["geo:distance", "*"] {
            let mut o = serde_json::Map::new();
            o.insert(n.into(), json!(1));
            assert!(parse_attrs(&Value::Object(o), true).is_err());
        }
        assert!(parse_attrs(
            &json!({"l":{"type":"geo:json","value":{"type":"Point","coordinates":[-3.69,40.41]}}}),
            false
        )
        .is_ok());
        assert!(parse_attrs(
            &json!({"l":{"type":"geo:json","value":{"type":"Polygon",
            "coordinates":[[[0,0],[1,0],[1,1],[0,0]]]}}}),
            false
        )
        .is_ok());
        assert!(parse_attrs(
            &json!({"l":{"type":"geo:json","value":{"type":"Feature",
            "geometry":{"type":"LineString","coordinates":[[0,0],[1,1]]}}}}),
            false
        )
        .is_ok());
        for bad_geo in [
            json!("x"),
            json!({"type":"Point","coordinates":[1]}),
            json!({"type":"Polygon","coordinates":[[[0,0],[1,0],[0,0]]]}),
            json!({"type":"Circle"}),
        ] {
            let r = parse_attrs(&json!({"l":{"type":"geo:json","value":bad_geo}}), false);
            assert_eq!(r.unwrap_err().status, 400);
        }
        // two locations at creation: 413
        let r = parse_entity(
            &json!({"id":"E",
            "a":{"type":"geo:json","value":{"type":"Point","coordinates":[1,2]}},
            "b":{"type":"geo:json","value":{"type":"Point","coordinates":[1,2]}}}),
            false,
        );
        assert_eq!(r.unwrap_err().error, "NoResourcesAvailable");
    }

    #[test]
    fn nesting_limit() {
        let mut v = json!(1);
        for _ in 0..51 {
            v = json!([v]);
        }
        assert_eq!(
            err(parse_attrs(&json!({"a":{"value":v}}), false)),
            bad("attribute or metadata value has overpassed maximum nesting limit: 50")
        );
    }

    // Transient entities: a DateTime `dateExpires` sets the expiration and
    // stays an attribute; any other type is Orion's 400.
    #[test]
    fn date_expires_sets_the_expiration() {
        let e = parse_entity(
            &json!({"id":"E",
            "dateExpires":{"type":"DateTime","value":"2040-01-01T00:00:00Z","metadata":{"m":{"value":1}}},
            "dateCreated":{"type":"DateTime","value":"2050-01-01T00:00:00.666"}}),
            false,
        )
        .unwrap();
        assert_eq!(e.date_expires, parse_datetime("2040-01-01T00:00:00Z"));
        assert!(e
            .attrs
            .get("dateExpires")
            .unwrap()
            .metadata
            .contains_key("m"));
        assert_eq!(
            e.attrs.get("dateCreated").unwrap().value,
            json!("2050-01-01T00:00:00.666Z")
        );
        let refused = bad("error processing date expiration attribute, see log traces");
        assert_eq!(
            err(parse_entity(
                &json!({"id":"E","dateExpires":{"value":"2040-01-01"}}),
                false
            )),
            refused
        );
        assert_eq!(
            err(parse_attrs(&json!({"dateExpires":"2040-01-01"}), true)),
            refused
        );
        assert_eq!(
            err(parse_attr(
                "dateExpires",
                &json!({"value":1,"type":"Number"})
            )),
            refused
        );
        assert_eq!(
            err(parse_attrs(
                &json!({"dateExpires":{"value":"soon","type":"DateTime"}}),
                false
            )),
            bad("date has invalid format in attribute value")
        );
    }

    /// The old way, the reference: the body parsed into a `Value`, then
    /// its attributes taken from it.
    fn via_value(text: &str, key_values: bool) -> Result<Option<AttrMap>, NgsiError> {
        let v = parse_body(text)?;
        if v.as_object().is_some_and(|o| o.is_empty()) {
            return Ok(None);
        }
        parse_attrs(&v, key_values).map(Some)
    }

    fn straight(text: &str, key_values: bool) -> Result<Option<AttrMap>, NgsiError> {
        let body = AttrsBody::parse(text, key_values)?;
        if body.is_empty_object() {
            return Ok(None);
        }
        body.into_attrs().map(Some)
    }

    /// Reading an attributes body straight from its text gives what the
    /// body parsed as a `Value` gives: the same attributes, or the same
    /// first error, in both forms.
    #[test]
    fn attrs_read_straight_match_attrs_read_from_a_value() {
        let bodies = [
            r#"{"a":{"value":1,"type":"Number"},"b":{"value":"x","metadata":{"m":{"value":2}}}}"#,
            r#"{"a":{"value":1},"a":{"value":2}}"#,
            r#"{"a":{"value":1},"a":{"value":2},"b":"#,
            r#"{}"#,
            r#"[]"#,
            r#"[{"a":1}]"#,
            r#""text""#,
            r#"null"#,
            r#"{"id":"E","a":{"value":1}}"#,
            r#"{"a":{"value":1},"type":"T"}"#,
            r#"{"a":5}"#,
            r#"{"a":{"value":1,"other":2}}"#,
            r#"{"a":{"value":1,"type":3}}"#,
            r#"{"a":{"value":1,"metadata":[]}}"#,
            r#"{"a":{"value":1,"metadata":null}}"#,
            r#"{"a":{"value":"<"}}"#,
            r#"{"a<":{"value":1}}"#,
            r#"{"a":{"value":1,"value":2,"type":"T","type":"U"}}"#,
            r#"{"dateExpires":{"value":"2040-01-01","type":"DateTime"}}"#,
            r#"{"dateExpires":{"value":"2040-01-01"}}"#,
            r#"{"p":{"value":"1,2","type":"geo:point"},"q":{"value":{"$inc":1}}}"#,
            r#"{"a":{"value":{"x":[1,{"y":null}]}}} "#,
            r#"{"a":{"value":1}} x"#,
            r#"{"a":{"value":1}"#,
            r#"{"a\u0041":{"value":"\"q\""}}"#,
        ];
        for text in bodies {
            for kv in [false, true] {
                assert_eq!(
                    straight(text, kv),
                    via_value(text, kv),
                    "{text} keyValues={kv}"
                );
            }
        }
        // A long body with a repeated key is found through the set.
        let mut long: Vec<String> = (0..100)
            .map(|i| format!("\"a{i}\":{{\"value\":{i}}}"))
            .collect();
        long.push("\"a7\":{\"value\":0}".into());
        let text = format!("{{{}}}", long.join(","));
        assert_eq!(
            err(straight(&text, false)),
            bad("duplicated attribute /a7/")
        );
        assert_eq!(straight(&text, false), via_value(&text, false));
    }

    proptest::proptest! {
        /// The same holds for bodies built at random from the pieces that
        /// decide the checks, cut short at random to make syntax errors.
        #[test]
        fn attrs_read_straight_match_at_random(
            members in proptest::collection::vec((0usize..7, 0usize..12), 0..6),
            cut in proptest::option::of(0usize..200),
            kv in proptest::bool::ANY,
        ) {
            const KEYS: [&str; 7] = ["a", "b", "id", "type", "dateExpires", "x y", "a"];
            const VALUES: [&str; 12] = [
                r#"{"value":1}"#,
                r#"{"value":"t","type":"Text"}"#,
                r#"{"type":"Number"}"#,
                r#"{"value":1,"bogus":true}"#,
                r#"{"value":[1,{"k":"v"}],"metadata":{"m":{"value":1,"type":"N"}}}"#,
                r#"{"value":1,"metadata":7}"#,
                r#"{"value":"2040-01-01T00:00:00Z","type":"DateTime"}"#,
                r#"3"#,
                r#""(bad)""#,
                r#"[1,2]"#,
                r#"null"#,
                r#"{"value":{"$inc":2},"type":7}"#,
            ];
            let inner: Vec<String> = members
                .iter()
                .map(|&(k, v)| format!("\"{}\":{}", KEYS[k], VALUES[v]))
                .collect();
            let mut text = format!("{{{}}}", inner.join(","));
            if let Some(cut) = cut {
                text.truncate(cut.min(text.len()));
            }
            proptest::prop_assert_eq!(straight(&text, kv), via_value(&text, kv));
        }
    }
}
