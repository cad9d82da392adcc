//! QuantumLeap's `GET` endpoints and the shapes of their answers (release
//! 1.0.0: `entityId`/`entityType` keys, 404 when nothing matched). The
//! handlers are named after QuantumLeap's: 1T1E1A is one type, one
//! entity, one attribute; N is "every".

use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde_json::{json, Map, Value};
use weft_model::history::format_index;
use weft_store::HistoryQuery;

use super::params::{Attrs, Params};
use super::records::{fetch, EntityRecords, Found, Grouping, Selection};
use super::{scope, settled_store, QlError, QlResult};
use crate::AppState;

/// The raw query string's parameters.
type RawQuery = Query<HashMap<String, String>>;

/// `GET /v2/entities` (NTNE): the entities with history, each with the
/// time of its latest record in range (`index`, one time), paged by
/// `limit`/`offset` over the most recently updated first, the page ordered
/// by id.
pub(super) async fn list_entities(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(q): RawQuery,
) -> QlResult {
    let scope = scope(&headers)?;
    let params = Params::parse(&q, Attrs::FromQuery)?;
    let store = settled_store(&state).await;
    let entities = store
        .history_entities(
            &scope.tenant,
            params.entity_type.as_deref(),
            scope.service_path.as_deref(),
        )
        .await?;
    let mut latest: Vec<(i64, String, String)> = Vec::new();
    for e in entities
        .into_iter()
        .filter(|e| params.wants_id(&e.entity_id))
    {
        let last = store
            .query_history(&HistoryQuery {
                tenant: scope.tenant.clone(),
                entity_ids: vec![e.entity_id.clone()],
                entity_type: Some(e.entity_type.clone()),
                from: params.from.as_ref().map(|d| d.1),
                to: params.to.as_ref().map(|d| d.1),
                last_n: Some(1),
                limit: 1,
                ..HistoryQuery::default()
            })
            .await?;
        if let Some(time) = last.iter().map(|r| r.time).max() {
            latest.push((time, e.entity_type, e.entity_id));
        }
    }
    latest.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| (&a.1, &a.2).cmp(&(&b.1, &b.2))));
    let mut page: Vec<(i64, String, String)> = latest
        .into_iter()
        .skip(params.offset)
        .take(params.limit)
        .collect();
    if page.is_empty() {
        return Err(QlError::no_records());
    }
    page.sort_by(|a, b| (&a.2, &a.1).cmp(&(&b.2, &b.1)));
    let out: Vec<Value> = page
        .into_iter()
        .map(
            |(time, ty, id)| json!({"entityId": id, "entityType": ty, "index": format_index(time)}),
        )
        .collect();
    Ok(Json(Value::Array(out)).into_response())
}

/// One entity's records: its type is the `type` parameter, else the one
/// type it has history under (none: 404; several: QuantumLeap's 400).
async fn one_entity(
    state: &AppState,
    headers: &HeaderMap,
    q: &HashMap<String, String>,
    id: String,
    attr: Option<String>,
) -> Result<(Params, String, String, EntityRecords), QlError> {
    let scope = scope(headers)?;
    let from = if attr.is_some() {
        Attrs::InPath
    } else {
        Attrs::FromQuery
    };
    let params = Params::parse(q, from)?;
    let store = settled_store(state).await;
    let entity_type = match &params.entity_type {
        Some(ty) => ty.clone(),
        None => {
            let mut types = types_of(store, &scope, &id).await?;
            match types.len() {
                0 => return Err(QlError::no_records()),
                1 => types.remove(0),
                _ => {
                    return Err(QlError::api(
                        StatusCode::BAD_REQUEST,
                        "<class 'exceptions.exceptions.AmbiguousNGSIIdError'>",
                        format!(
                            "There are multiple entities with the given entity_id {id}. \
                             Please specify entity_type."
                        ),
                    ))
                }
            }
        }
    };
    let selection = Selection {
        entity_type: Some(entity_type.clone()),
        ids: vec![id.clone()],
        attrs: attr.map_or_else(|| params.attrs.clone(), |a| vec![a]),
        grouping: Grouping::Entity,
    };
    let found = fetch(store, &scope, &params, selection).await?;
    // The type as stored (the one asked may differ in case).
    let ((entity_type, _), records) = found
        .into_iter()
        .find(|((_, found_id), _)| *found_id == id)
        .ok_or_else(QlError::no_records)?;
    Ok((params, id, entity_type, records))
}

/// The types `id` has history under (in the request's service path),
/// from the newest row of each of its series: an index lookup per type,
/// whatever the size of the tenant (the tenant's listing only when the
/// id's rows are gone and its rollups left).
pub(super) async fn types_of(
    store: &std::sync::Arc<dyn weft_store::Store>,
    scope: &super::Scope,
    id: &str,
) -> Result<Vec<String>, QlError> {
    let mut types: Vec<String> = store
        .query_history(&HistoryQuery {
            tenant: scope.tenant.clone(),
            service_path: scope.service_path.clone(),
            entity_ids: vec![id.to_string()],
            last_n: Some(1),
            limit: 1,
            ..HistoryQuery::default()
        })
        .await?
        .into_iter()
        .map(|r| r.entity_type)
        .collect();
    if types.is_empty() {
        // Rows gone (downsampled) while rollups remain: the listing knows.
        types = store
            .history_entities(&scope.tenant, None, scope.service_path.as_deref())
            .await?
            .into_iter()
            .filter(|e| e.entity_id == id)
            .map(|e| e.entity_type)
            .collect();
    }
    types.sort_unstable();
    types.dedup();
    Ok(types)
}

/// The `index` of an entity's answer: its records' times, but `[]` for
/// one aggregate over the whole range (QuantumLeap's entity endpoints).
fn entity_index(params: &Params, e: &EntityRecords) -> Value {
    match params.aggregate {
        Some((_, None)) => json!([]),
        _ => Value::Array(e.index()),
    }
}

/// `"attributes": [{"attrName","values"}]`, by name.
fn attributes(e: &EntityRecords) -> Value {
    Value::Array(
        e.attr_names()
            .into_iter()
            .map(|name| json!({"attrName": name, "values": e.values(name)}))
            .collect(),
    )
}

/// `GET /v2/entities/{id}` (1T1ENA).
pub(super) async fn entity(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): RawQuery,
) -> QlResult {
    let (params, id, ty, e) = one_entity(&state, &headers, &q, id, None).await?;
    Ok(Json(json!({
        "entityId": id,
        "entityType": ty,
        "index": entity_index(&params, &e),
        "attributes": attributes(&e),
    }))
    .into_response())
}

/// `GET /v2/entities/{id}/value` (1T1ENA_value).
pub(super) async fn entity_value(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): RawQuery,
) -> QlResult {
    let (params, _, _, e) = one_entity(&state, &headers, &q, id, None).await?;
    Ok(
        Json(json!({"index": entity_index(&params, &e), "attributes": attributes(&e)}))
            .into_response(),
    )
}

/// `GET /v2/entities/{id}/attrs/{attr}` (1T1E1A).
pub(super) async fn entity_attr(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((id, attr)): Path<(String, String)>,
    Query(q): RawQuery,
) -> QlResult {
    let (params, id, ty, e) = one_entity(&state, &headers, &q, id, Some(attr.clone())).await?;
    Ok(Json(json!({
        "entityId": id,
        "entityType": ty,
        "attrName": attr,
        "index": entity_index(&params, &e),
        "values": e.values(&attr),
    }))
    .into_response())
}

/// `GET /v2/entities/{id}/attrs/{attr}/value` (1T1E1A_value).
pub(super) async fn entity_attr_value(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((id, attr)): Path<(String, String)>,
    Query(q): RawQuery,
) -> QlResult {
    let (params, _, _, e) = one_entity(&state, &headers, &q, id, Some(attr.clone())).await?;
    Ok(
        Json(json!({"index": entity_index(&params, &e), "values": e.values(&attr)}))
            .into_response(),
    )
}

/// The records of several entities: of `entity_type` (from the path, else
/// the `type` parameter, else every type), of one attribute or of
/// `attrs`, cut per type. Nothing found is QuantumLeap's 404.
async fn many(
    state: &AppState,
    headers: &HeaderMap,
    q: &HashMap<String, String>,
    entity_type: Option<String>,
    attr: Option<String>,
) -> Result<(Params, Found), QlError> {
    let scope = scope(headers)?;
    let from = if attr.is_some() {
        Attrs::InPath
    } else {
        Attrs::FromQuery
    };
    let params = Params::parse(q, from)?;
    let store = settled_store(state).await;
    let selection = Selection {
        entity_type: entity_type.or_else(|| params.entity_type.clone()),
        ids: params.ids.clone(),
        attrs: attr.map_or_else(|| params.attrs.clone(), |a| vec![a]),
        grouping: Grouping::Type,
    };
    let found = fetch(store, &scope, &params, selection).await?;
    if found.is_empty() {
        return Err(QlError::no_records());
    }
    Ok((params, found))
}

/// A `fromDate`/`toDate` as QuantumLeap writes it in the `index` of a
/// whole-range aggregate over several entities: the date-time given, its
/// zone replaced by UTC (`…+00:00`); `""` without one.
fn normalized_date(d: &Option<(String, i64)>) -> Value {
    let Some((raw, _)) = d else {
        return json!("");
    };
    let local = raw
        .trim_end_matches('Z')
        .split_once('+')
        .map_or(raw.trim_end_matches('Z'), |(l, _)| l);
    let local = match local.rfind('-') {
        // A negative offset after the time (`…T10:00:00-02:00`).
        Some(i) if i > 10 && local[..i].contains('T') => &local[..i],
        _ => local,
    };
    let ms = weft_model::ngsi::parse_datetime(&format!("{local}Z"))
        .or_else(|| weft_model::ngsi::parse_datetime(&format!("{local}T00:00:00Z")));
    match ms {
        Some(ms) => {
            let iso = weft_model::ngsi::format_datetime(ms);
            let (base, millis) = iso.trim_end_matches('Z').split_at(19);
            let fraction = match millis.trim_start_matches('.') {
                "000" | "" => String::new(),
                m => format!(".{m}000"),
            };
            json!(format!("{base}{fraction}+00:00"))
        }
        None => json!(""),
    }
}

/// The `index` of one entity in a type-wide or `/v2/attrs` answer: its
/// records' times, or `[fromDate, toDate]` (normalized) for one aggregate
/// over the whole range.
fn range_index(params: &Params, e: &EntityRecords) -> Value {
    match params.aggregate {
        Some((_, None)) => json!([normalized_date(&params.from), normalized_date(&params.to)]),
        _ => Value::Array(e.index()),
    }
}

/// The `entities` of a type answer, each with its `attributes`.
fn type_entities_json(params: &Params, found: &Found) -> Value {
    Value::Array(
        found
            .iter()
            .map(|((_, id), e)| {
                json!({"entityId": id, "index": range_index(params, e), "attributes": attributes(e)})
            })
            .collect(),
    )
}

/// `GET /v2/types/{type}` (1TNENA).
pub(super) async fn type_entities(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(entity_type): Path<String>,
    Query(q): RawQuery,
) -> QlResult {
    let (params, found) = many(&state, &headers, &q, Some(entity_type.clone()), None).await?;
    Ok(Json(json!({
        "entityType": entity_type,
        "entities": type_entities_json(&params, &found),
    }))
    .into_response())
}

/// `GET /v2/types/{type}/value` (1TNENA_value).
pub(super) async fn type_value(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(entity_type): Path<String>,
    Query(q): RawQuery,
) -> QlResult {
    let (params, found) = many(&state, &headers, &q, Some(entity_type), None).await?;
    Ok(Json(json!({"values": type_entities_json(&params, &found)})).into_response())
}

/// The `entities` of one attribute of a type: the ids asked with `id`
/// first, in their order, then the others by id. The `index` of one
/// aggregate over the whole range is `[]`, or with `id` the `fromDate`
/// and `toDate` as given.
fn type_attr_entities_json(params: &Params, found: &Found, attr: &str) -> Value {
    let mut entities: Vec<(&String, &EntityRecords)> =
        found.iter().map(|((_, id), e)| (id, e)).collect();
    let position = |id: &String| {
        params
            .ids
            .iter()
            .position(|i| i == id)
            .unwrap_or(usize::MAX)
    };
    entities.sort_by(|a, b| (position(a.0), a.0).cmp(&(position(b.0), b.0)));
    let whole_range = matches!(params.aggregate, Some((_, None)));
    Value::Array(
        entities
            .into_iter()
            .map(|(id, e)| {
                let index = match (whole_range, params.ids.is_empty()) {
                    (true, true) => json!([]),
                    (true, false) => json!([
                        params.from.as_ref().map_or("", |d| d.0.as_str()),
                        params.to.as_ref().map_or("", |d| d.0.as_str()),
                    ]),
                    (false, _) => Value::Array(e.index()),
                };
                json!({"entityId": id, "index": index, "values": e.values(attr)})
            })
            .collect(),
    )
}

/// `GET /v2/types/{type}/attrs/{attr}` (1TNE1A).
pub(super) async fn type_attr(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((entity_type, attr)): Path<(String, String)>,
    Query(q): RawQuery,
) -> QlResult {
    let (params, found) = many(
        &state,
        &headers,
        &q,
        Some(entity_type.clone()),
        Some(attr.clone()),
    )
    .await?;
    Ok(Json(json!({
        "entityType": entity_type,
        "attrName": attr,
        "entities": type_attr_entities_json(&params, &found, &attr),
    }))
    .into_response())
}

/// `GET /v2/types/{type}/attrs/{attr}/value` (1TNE1A_value).
pub(super) async fn type_attr_value(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((entity_type, attr)): Path<(String, String)>,
    Query(q): RawQuery,
) -> QlResult {
    let (params, found) = many(&state, &headers, &q, Some(entity_type), Some(attr.clone())).await?;
    Ok(Json(json!({"values": type_attr_entities_json(&params, &found, &attr)})).into_response())
}

/// One attribute across types (the `/v2/attrs` endpoints' `types`):
/// `[{"entityType","entities":[{"entityId","index","values"}]}]`, types
/// and ids in order, only entities that have the attribute.
fn attr_types_json(params: &Params, found: &Found, attr: &str) -> Value {
    let mut types: Map<String, Value> = Map::new();
    let mut order: Vec<String> = Vec::new();
    for ((ty, id), e) in found.iter().filter(|(_, e)| e.has(attr)) {
        let entity =
            json!({"entityId": id, "index": range_index(params, e), "values": e.values(attr)});
        if !types.contains_key(ty) {
            order.push(ty.clone());
        }
        types
            .entry(ty.clone())
            .or_insert_with(|| json!([]))
            .as_array_mut()
            .expect("an array")
            .push(entity);
    }
    Value::Array(
        order
            .into_iter()
            .map(|ty| {
                let entities = types.remove(&ty).unwrap_or_default();
                json!({"entityType": ty, "entities": entities})
            })
            .collect(),
    )
}

/// Every attribute found, each with [`attr_types_json`].
fn attrs_json(params: &Params, found: &Found) -> Value {
    let names: std::collections::BTreeSet<&str> =
        found.values().flat_map(EntityRecords::attr_names).collect();
    Value::Array(
        names
            .into_iter()
            .map(|name| json!({"attrName": name, "types": attr_types_json(params, found, name)}))
            .collect(),
    )
}

/// `GET /v2/attrs` (NTNENA): the attributes asked (every one by default)
/// of every entity, by attribute then type.
pub(super) async fn attrs(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(q): RawQuery,
) -> QlResult {
    let (params, found) = many(&state, &headers, &q, None, None).await?;
    Ok(Json(json!({"attrs": attrs_json(&params, &found)})).into_response())
}

/// `GET /v2/attrs/value` (NTNENA_value).
pub(super) async fn attrs_value(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(q): RawQuery,
) -> QlResult {
    let (params, found) = many(&state, &headers, &q, None, None).await?;
    Ok(Json(json!({"values": attrs_json(&params, &found)})).into_response())
}

/// `GET /v2/attrs/{attr}` (NTNE1A): one attribute of every entity that
/// has it, by type.
pub(super) async fn attr(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(attr): Path<String>,
    Query(q): RawQuery,
) -> QlResult {
    let (params, found) = many(&state, &headers, &q, None, Some(attr.clone())).await?;
    Ok(
        Json(json!({"attrName": attr, "types": attr_types_json(&params, &found, &attr)}))
            .into_response(),
    )
}

/// `GET /v2/attrs/{attr}/value` (NTNE1A_value).
pub(super) async fn attr_value(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(attr): Path<String>,
    Query(q): RawQuery,
) -> QlResult {
    let (params, found) = many(&state, &headers, &q, None, Some(attr.clone())).await?;
    Ok(Json(json!({"values": attr_types_json(&params, &found, &attr)})).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_range_dates_are_written_with_utc_replacing_their_zone() {
        let d = |s: &str| Some((s.to_string(), 0));
        assert_eq!(normalized_date(&None), json!(""));
        assert_eq!(
            normalized_date(&d("2026-01-02T03:04:05Z")),
            json!("2026-01-02T03:04:05+00:00")
        );
        assert_eq!(
            normalized_date(&d("2026-01-02T03:04:05.250+02:00")),
            json!("2026-01-02T03:04:05.250000+00:00")
        );
        assert_eq!(
            normalized_date(&d("2026-01-02T03:04:05-05:00")),
            json!("2026-01-02T03:04:05+00:00")
        );
    }
}
