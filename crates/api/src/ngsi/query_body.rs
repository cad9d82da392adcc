//! The body of `POST /v2/op/query`, read the way Orion reads it
//! (`parseBatchQuery`): fields in the order the client wrote them, each
//! checked as it comes, so a body with several mistakes gets the error of
//! the first one, with Orion's text.
//!
//! ```text
//! {
//!   "entities":   [{"id" | "idPattern", "type" | "typePattern"}, …],
//!   "attrs":      ["A", …],          what to render
//!   "attributes": ["A", …],          deprecated: attrs, and the entity must have one of them
//!   "metadata":   ["m", …],
//!   "expression": {"q", "mq", "georel", "geometry", "coords"}
//! }
//! ```

use regex::Regex;
use serde_json::{Map, Value};
use weft_model::geo::GeoQuery;
use weft_model::ngsi::{check_name, NameKind, NgsiError};
use weft_model::query::Query;

use super::entities::pattern;
use super::error::{Error, Result};

/// A parsed `op/query` body.
#[derive(Default)]
pub struct QueryBody {
    /// `entities`: which entities (empty: all).
    pub entities: Vec<EntitySelector>,
    /// `attrs`: the attributes to render.
    pub attrs: Option<Vec<String>>,
    /// `attributes` (deprecated): rendered like `attrs` when `attrs` is
    /// absent, and an entity must have at least one of them.
    pub attributes: Option<Vec<String>>,
    /// `metadata`: the metadata to render.
    pub metadata: Option<Vec<String>>,
    /// `expression`: conditions every entity must meet.
    pub expression: Expression,
}

/// One item of `entities`.
#[derive(Default)]
pub struct EntitySelector {
    /// `id`.
    pub id: Option<String>,
    /// `idPattern`.
    pub id_pattern: Option<Regex>,
    /// `type`.
    pub entity_type: Option<String>,
    /// `typePattern`.
    pub type_pattern: Option<Regex>,
}

/// `expression`: `q`, `mq` and a geo-query, all compiled.
#[derive(Default)]
pub struct Expression {
    /// `q`.
    pub q: Option<Query>,
    /// `mq`.
    pub mq: Option<Query>,
    /// `georel` + `geometry` + `coords`.
    pub geo: Option<GeoQuery>,
}

/// Reads the body with Orion's checks and 400 texts.
pub fn parse(body: &Value) -> Result<QueryBody> {
    let Value::Object(obj) = body else {
        return Err(NgsiError::parse_error().into());
    };
    if obj.is_empty() {
        return Err(Error::empty_payload());
    }
    if !["entities", "attributes", "attrs", "expression"]
        .iter()
        .any(|k| obj.contains_key(*k))
    {
        return Err(Error::bad_request(
            "Invalid JSON payload, no relevant fields found",
        ));
    }
    let mut out = QueryBody::default();
    for (name, value) in obj {
        match name.as_str() {
            "entities" => {
                let Value::Array(items) = value else {
                    return Err(Error::bad_request("not a JSON array"));
                };
                out.entities = items.iter().map(entity).collect::<Result<_>>()?;
            }
            "attributes" => out.attributes = Some(string_list(value, name)?),
            "attrs" => out.attrs = Some(string_list(value, name)?),
            "metadata" => out.metadata = Some(string_list(value, name)?),
            "expression" => out.expression = expression(value)?,
            other => {
                return Err(Error::bad_request(format!(
                    "Unrecognized field in JSON payload: /{other}/"
                )))
            }
        }
    }
    Ok(out)
}

/// A list of strings (`attrs`, `attributes`, `metadata`).
fn string_list(value: &Value, field: &str) -> Result<Vec<String>> {
    let Value::Array(items) = value else {
        return Err(Error::bad_request(format!(
            "the field /{field}/ must be a JSON array"
        )));
    };
    items
        .iter()
        .map(|v| {
            v.as_str().map(str::to_string).ok_or_else(|| {
                Error::bad_request(format!("only JSON Strings allowed in {field} list"))
            })
        })
        .collect()
}

/// One item of `entities` (Orion's `parseEntityObject`, attributes not
/// allowed).
fn entity(item: &Value) -> Result<EntitySelector> {
    let Value::Object(obj) = item else {
        return Err(Error::bad_request("entity is not a JSON object"));
    };
    if obj.contains_key("id") && obj.contains_key("idPattern") {
        return Err(Error::bad_request("both /id/ and /idPattern/ present"));
    }
    if !obj.contains_key("id") && !obj.contains_key("idPattern") {
        return Err(Error::bad_request("nor /id/ nor /idPattern/ present"));
    }
    let mut sel = EntitySelector::default();
    for (name, value) in obj {
        let text = |what: &str| {
            value
                .as_str()
                .ok_or_else(|| Error::bad_request(format!("Invalid JSON type for entity {what}")))
        };
        match name.as_str() {
            "id" => {
                let id = text("id")?;
                check_name(NameKind::EntityId, id)?;
                sel.id = Some(id.to_string());
            }
            "idPattern" => sel.id_pattern = Some(pattern(text("idPattern")?, "idPattern")?),
            "type" => {
                let t = text("type")?;
                check_name(NameKind::EntityType, t)?;
                sel.entity_type = Some(t.to_string());
            }
            "typePattern" => sel.type_pattern = Some(pattern(text("typePattern")?, "typePattern")?),
            _ => {
                return Err(Error::bad_request(
                    "no attributes allowed in Entity in this payload",
                ))
            }
        }
    }
    Ok(sel)
}

/// `expression` (Orion's `parseExpression`): `q`, then `mq`, then the
/// geo fields, which go together.
fn expression(value: &Value) -> Result<Expression> {
    let Value::Object(obj) = value else {
        return Err(Error::bad_request("expression is not an object"));
    };
    if obj.is_empty() {
        return Err(Error::bad_request("expression is empty"));
    }
    let mut out = Expression::default();
    if let Some(q) = non_empty_string(obj, "q")? {
        out.q = Some(Query::parse(q).map_err(|e| Error::bad_request(e.description()))?);
    }
    if let Some(mq) = non_empty_string(obj, "mq")? {
        out.mq = Some(Query::parse_mq(mq).map_err(|e| Error::bad_request(e.description()))?);
    }
    let geometry = non_empty_string(obj, "geometry")?;
    let coords = non_empty_string(obj, "coords")?;
    let georel = non_empty_string(obj, "georel")?;
    out.geo = GeoQuery::from_expression(georel, geometry, coords)
        .map_err(|e| Error::bad_request(e.description()))?;
    Ok(out)
}

/// An optional string field that, when given, is not empty:
/// `<field> is not a string`, `<field> is empty`.
fn non_empty_string<'a>(obj: &'a Map<String, Value>, field: &str) -> Result<Option<&'a str>> {
    match obj.get(field) {
        None => Ok(None),
        Some(Value::String(s)) if s.is_empty() => {
            Err(Error::bad_request(format!("{field} is empty")))
        }
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(Error::bad_request(format!("{field} is not a string"))),
    }
}
