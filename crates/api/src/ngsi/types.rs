//! `/v2/types` and `/v2/types/{type}`: the entity types of a tenant, with
//! the names and types of their attributes and how many entities have
//! each type. Types and attribute names are listed sorted, as Orion's
//! aggregation returns them.

use std::collections::{BTreeMap, BTreeSet};

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use weft_model::ngsi::{NgsiError, EXPIRATION_ATTR};

use super::check_segment;
use super::entities::listing_response;
use super::error::Result;
use super::params::Params;
use super::tenant::{ServicePath, Tenant};
use crate::AppState;

/// What one entity type gathers: attribute name → attribute types, and
/// the number of entities.
#[derive(Default)]
struct TypeInfo {
    attrs: BTreeMap<String, BTreeSet<String>>,
    count: usize,
}

fn gather(state: &AppState, tenant: &str, sp: &ServicePath) -> BTreeMap<String, TypeInfo> {
    let mut types: BTreeMap<String, TypeInfo> = BTreeMap::new();
    for e in state.services.context.types(tenant, &sp.for_read()) {
        let info = types.entry(e.entity.entity_type.clone()).or_default();
        info.count += 1;
        // `dateExpires` is a builtin, not part of the type's shape.
        for (name, attr) in e.entity.attrs.iter().filter(|(n, _)| *n != EXPIRATION_ATTR) {
            info.attrs
                .entry(name.to_string())
                .or_default()
                .insert(attr.attr_type.clone());
        }
    }
    types
}

fn attrs_json(info: &TypeInfo, detail: bool) -> Value {
    let mut obj = Map::new();
    for (name, types) in &info.attrs {
        let list: Vec<&String> = if detail {
            types.iter().collect()
        } else {
            Vec::new()
        };
        obj.insert(name.clone(), json!({ "types": list }));
    }
    Value::Object(obj)
}

/// Orion's "List Entity Types" (`GET /v2/types`; `options=values` lists
/// only the names, `noAttrDetail` leaves out attribute types, `count`
/// adds `Fiware-Total-Count`).
pub async fn list(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    sp: ServicePath,
    params: Params,
) -> Result<Response> {
    let options = params.options()?;
    let (limit, offset) = params.paging()?;
    let types = gather(&state, &tenant, &sp);
    let total = types.len();
    let page = types.iter().skip(offset).take(limit);
    let body: Vec<Value> = if options.values {
        page.map(|(t, _)| Value::String(t.clone())).collect()
    } else {
        page.map(|(t, info)| {
            json!({"type": t, "attrs": attrs_json(info, !options.no_attr_detail), "count": info.count})
        })
        .collect()
    };
    Ok(listing_response(
        Value::Array(body),
        options.count.then_some(total),
    ))
}

/// Orion's "Retrieve entity type" (`GET /v2/types/{type}`).
pub async fn retrieve(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    sp: ServicePath,
    params: Params,
    Path(entity_type): Path<String>,
) -> Result<Response> {
    check_segment(&entity_type)?;
    let options = params.options()?;
    let types = gather(&state, &tenant, &sp);
    let info = types
        .get(&entity_type)
        .ok_or_else(|| NgsiError::new(404, "NotFound", "Entity type not found"))?;
    let body = json!({"attrs": attrs_json(info, !options.no_attr_detail), "count": info.count});
    Ok(axum::Json(body).into_response())
}
