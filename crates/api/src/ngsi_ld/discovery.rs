//! `/ngsi-ld/v1/types` and `/ngsi-ld/v1/attributes`: which entity types
//! and attributes a tenant holds (clauses 5.7.5–5.7.10), counted over the
//! entities the context keeps, NGSIv2's among them.

use std::collections::{BTreeMap, BTreeSet};

use axum::extract::{Path, State};
use axum::response::Response;
use serde_json::{json, Value};
use weft_model::ngsi::EXPIRATION_ATTR;
use weft_model::ngsi_ld::entity::AttrKind;
use weft_model::ngsi_ld::{Context, LdError};
use weft_pipeline::context::EntityFilter;

use super::{Error, LdParams, LdRequest, Result};
use crate::AppState;

/// What the tenant holds of one entity type.
#[derive(Default)]
struct TypeInfo {
    entities: usize,
    /// Attribute (stored name) → its NGSI-LD kinds.
    attrs: BTreeMap<String, BTreeSet<&'static str>>,
}

/// What the tenant holds of one attribute.
#[derive(Default)]
struct AttrInfo {
    count: usize,
    kinds: BTreeSet<&'static str>,
    types: BTreeSet<String>,
}

/// Every entity of the tenant, by type and by attribute.
fn survey(
    state: &AppState,
    tenant: &str,
) -> (BTreeMap<String, TypeInfo>, BTreeMap<String, AttrInfo>) {
    let mut types: BTreeMap<String, TypeInfo> = BTreeMap::new();
    let mut attrs: BTreeMap<String, AttrInfo> = BTreeMap::new();
    for e in state
        .services
        .context
        .query(tenant, &EntityFilter::default())
    {
        let info = types.entry(e.entity.entity_type.clone()).or_default();
        info.entities += 1;
        for (name, attr) in e.entity.attrs.iter() {
            if name == EXPIRATION_ATTR {
                continue;
            }
            let kind = AttrKind::of_stored(&attr.attr_type).name();
            info.attrs.entry(name.to_string()).or_default().insert(kind);
            let a = attrs.entry(name.to_string()).or_default();
            a.count += 1;
            a.kinds.insert(kind);
            a.types.insert(e.entity.entity_type.clone());
        }
    }
    (types, attrs)
}

/// "Retrieve Available Entity Types" (`GET /ngsi-ld/v1/types`): the
/// type names, or with `details=true` each type with its attributes.
pub async fn types(
    State(state): State<AppState>,
    req: LdRequest,
    params: LdParams,
) -> Result<Response> {
    let (types, _) = survey(&state, &req.tenant);
    let ctx = &req.context;
    if params.get("details") == Some("true") {
        let list: Vec<Value> = types
            .iter()
            .map(|(t, info)| {
                json!({
                    "id": Context::iri_of_stored(t),
                    "type": "EntityType",
                    "typeName": ctx.from_stored(t),
                    "attributeNames": info.attrs.keys().map(|a| ctx.from_stored(a)).collect::<Vec<_>>(),
                })
            })
            .collect();
        return Ok(req.answer(Value::Array(list)));
    }
    let names: Vec<String> = types.keys().map(|t| ctx.from_stored(t)).collect();
    Ok(req.answer(json!({
        "id": format!("urn:ngsi-ld:EntityTypeList:{}", uuid::Uuid::new_v4()),
        "type": "EntityTypeList",
        "typeList": names,
    })))
}

/// "Retrieve Entity Type Information" (`GET /ngsi-ld/v1/types/{type}`).
pub async fn type_info(
    State(state): State<AppState>,
    req: LdRequest,
    Path(name): Path<String>,
) -> Result<Response> {
    let ctx = &req.context;
    let stored = ctx.to_stored(&name);
    let (mut types, _) = survey(&state, &req.tenant);
    let info = types
        .remove(&stored)
        .ok_or_else(|| Error(LdError::not_found(format!("no entity of type {name}"))))?;
    let details: Vec<Value> = info
        .attrs
        .iter()
        .map(|(a, kinds)| {
            json!({
                "id": Context::iri_of_stored(a),
                "type": "Attribute",
                "attributeName": ctx.from_stored(a),
                "attributeTypes": kinds,
            })
        })
        .collect();
    Ok(req.answer(json!({
        "id": Context::iri_of_stored(&stored),
        "type": "EntityTypeInfo",
        "typeName": ctx.from_stored(&stored),
        "entityCount": info.entities,
        "attributeDetails": details,
    })))
}

/// "Retrieve Available Attributes" (`GET /ngsi-ld/v1/attributes`): the
/// attribute names, or with `details=true` each attribute's counts.
pub async fn attributes(
    State(state): State<AppState>,
    req: LdRequest,
    params: LdParams,
) -> Result<Response> {
    let (_, attrs) = survey(&state, &req.tenant);
    let ctx = &req.context;
    if params.get("details") == Some("true") {
        let list: Vec<Value> = attrs
            .iter()
            .map(|(a, info)| attribute_info(&req, a, info))
            .collect();
        return Ok(req.answer(Value::Array(list)));
    }
    let names: Vec<String> = attrs.keys().map(|a| ctx.from_stored(a)).collect();
    Ok(req.answer(json!({
        "id": format!("urn:ngsi-ld:AttributeList:{}", uuid::Uuid::new_v4()),
        "type": "AttributeList",
        "attributeList": names,
    })))
}

/// "Retrieve Attribute Information" (`GET /ngsi-ld/v1/attributes/{attr}`).
pub async fn attribute(
    State(state): State<AppState>,
    req: LdRequest,
    Path(name): Path<String>,
) -> Result<Response> {
    let stored = req.context.to_stored(&name);
    let (_, mut attrs) = survey(&state, &req.tenant);
    let info = attrs.remove(&stored).ok_or_else(|| {
        Error(LdError::not_found(format!(
            "no entity has attribute {name}"
        )))
    })?;
    Ok(req.answer(attribute_info(&req, &stored, &info)))
}

/// One attribute's details: how many entities have it, its kinds, the
/// types of those entities.
fn attribute_info(req: &LdRequest, stored: &str, info: &AttrInfo) -> Value {
    let ctx = &req.context;
    json!({
        "id": Context::iri_of_stored(stored),
        "type": "Attribute",
        "attributeName": ctx.from_stored(stored),
        "attributeCount": info.count,
        "attributeTypes": info.kinds,
        "typeNames": info.types.iter().map(|t| ctx.from_stored(t)).collect::<Vec<_>>(),
    })
}
