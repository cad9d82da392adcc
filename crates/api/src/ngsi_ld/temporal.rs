//! `/ngsi-ld/v1/temporal/entities`: the temporal evolution of entities
//! (clauses 5.7.3, 5.7.4), read from weft's history, the same history
//! QuantumLeap's API reads. No second store, no second service: every
//! change an entity goes through (from `/v2`, `/ngsi-ld/v1` or a device)
//! is there, at the time history gives it.
//!
//! Each attribute is a list of its instances, oldest first: normalized
//! (`{"type": "Property", "value": …, "observedAt": …}` each) or, with
//! `options=temporalValues`, simplified (`{"type": "Property", "values":
//! [[value, time], …]}`).

use std::collections::BTreeMap;

use axum::extract::{Path, State};
use axum::response::Response;
use serde_json::{json, Map, Value};
use weft_model::ngsi::{format_datetime, parse_datetime};
use weft_model::ngsi_ld::entity::AttrKind;
use weft_model::ngsi_ld::LdError;
use weft_store::{HistoryQuery, HistoryRow, StoreError};

use super::{Error, LdParams, LdRequest, Result};
use crate::AppState;

/// Instances one attribute answers at most (the history's own cap).
pub const MAX_INSTANCES: usize = 10_000;

/// Entities a temporal query answers by default, and at most.
const DEFAULT_ENTITIES: usize = 20;
const MAX_ENTITIES: usize = 1000;

/// The time range and cut a temporal request asks for.
struct Range {
    from: Option<i64>,
    to: Option<i64>,
    last_n: Option<usize>,
}

impl Range {
    /// `timerel` (`before`, `after`, `between`) with `timeAt` and
    /// `endTimeAt`, and `lastN`. `before` is strictly before `timeAt`,
    /// `after` strictly after, `between` from `timeAt` (included) to
    /// `endTimeAt` (excluded).
    fn from_params(params: &LdParams) -> Result<Range> {
        let time = |key: &str| -> Result<Option<i64>> {
            params
                .get(key)
                .map(|t| {
                    parse_datetime(t).ok_or_else(|| {
                        Error(LdError::bad_request(format!(
                            "{key} is not a DateTime: {t}"
                        )))
                    })
                })
                .transpose()
        };
        let at = time("timeAt")?;
        let end = time("endTimeAt")?;
        let (from, to) = match (params.get("timerel"), at, end) {
            (None, _, _) => (None, None),
            (Some(_), None, _) => {
                return Err(Error(LdError::bad_request("timerel needs timeAt")));
            }
            (Some("before"), Some(at), _) => (None, Some(at - 1)),
            (Some("after"), Some(at), _) => (Some(at + 1), None),
            (Some("between"), Some(at), Some(end)) if end > at => (Some(at), Some(end - 1)),
            (Some("between"), Some(_), _) => {
                return Err(Error(LdError::bad_request(
                    "timerel=between needs an endTimeAt after timeAt",
                )));
            }
            (Some(other), _, _) => {
                return Err(Error(LdError::bad_request(format!(
                    "timerel is before, after or between, not {other}"
                ))));
            }
        };
        let last_n = params
            .get("lastN")
            .map(|n| {
                n.parse::<usize>().ok().filter(|n| *n > 0).ok_or_else(|| {
                    Error(LdError::bad_request(format!(
                        "lastN is a positive integer: {n}"
                    )))
                })
            })
            .transpose()?;
        Ok(Range { from, to, last_n })
    }
}

/// "Retrieve Temporal Evolution of an Entity"
/// (`GET /ngsi-ld/v1/temporal/entities/{id}`).
pub async fn retrieve(
    State(state): State<AppState>,
    req: LdRequest,
    params: LdParams,
    Path(id): Path<String>,
) -> Result<Response> {
    let range = Range::from_params(&params)?;
    let attrs = stored_attrs(&req, &params);
    let rows = history(&state, &req, vec![id.clone()], None, &attrs, &range).await?;
    if let Some(entity) = render(&req, &params, rows).pop() {
        return Ok(req.answer(entity));
    }
    // An entity with nothing recorded in the range: its id and type.
    let found = super::entities::find(&state, &req.tenant, &id)
        .ok_or_else(|| LdError::not_found(format!("no history of an entity with id {id}")))?;
    Ok(req.answer(json!({
        "id": id,
        "type": req.context.from_stored(&found.entity.entity_type),
    })))
}

/// "Query Temporal Evolution of Entities"
/// (`GET /ngsi-ld/v1/temporal/entities`): by `type`, `id` and `attrs`,
/// the entities with history, ordered by type then id, paged by `limit`
/// and `offset`.
pub async fn query(
    State(state): State<AppState>,
    req: LdRequest,
    params: LdParams,
) -> Result<Response> {
    let range = Range::from_params(&params)?;
    let attrs = stored_attrs(&req, &params);
    let types: Vec<String> = params
        .list("type")
        .unwrap_or_default()
        .iter()
        .map(|t| req.context.to_stored(t))
        .collect();
    let ids = params.list("id").unwrap_or_default();
    if types.is_empty() && ids.is_empty() && attrs.is_empty() {
        return Err(Error(LdError::bad_request(
            "a temporal query names at least one of id, type or attrs",
        )));
    }
    let limit = match params.get("limit") {
        None => DEFAULT_ENTITIES,
        Some(l) => l
            .parse::<usize>()
            .ok()
            .filter(|l| *l <= MAX_ENTITIES)
            .ok_or_else(|| {
                Error(LdError::bad_request(format!(
                    "limit is at most {MAX_ENTITIES}: {l}"
                )))
            })?,
    };
    let offset: usize = params
        .get("offset")
        .map(|o| {
            o.parse()
                .map_err(|_| Error(LdError::bad_request(format!("offset: {o}"))))
        })
        .transpose()?
        .unwrap_or(0);
    state.services.history.settle().await;
    let mut chosen = Vec::new();
    let listed = state
        .services
        .store
        .history_entities(&req.tenant, None, None)
        .await
        .map_err(store_error)?;
    for e in listed {
        let wanted = (types.is_empty() || types.contains(&e.entity_type))
            && (ids.is_empty() || ids.contains(&e.entity_id));
        if wanted && !chosen.contains(&e.entity_id) {
            chosen.push(e.entity_id);
        }
    }
    let page: Vec<String> = chosen.into_iter().skip(offset).take(limit).collect();
    if page.is_empty() {
        return Ok(req.answer(Value::Array(Vec::new())));
    }
    let rows = history(&state, &req, page, None, &attrs, &range).await?;
    Ok(req.answer(Value::Array(render(&req, &params, rows))))
}

/// `attrs` as stored names.
fn stored_attrs(req: &LdRequest, params: &LdParams) -> Vec<String> {
    params
        .list("attrs")
        .unwrap_or_default()
        .iter()
        .map(|a| req.context.to_stored(a))
        .collect()
}

/// The history rows of the entities, settled first so that what was
/// written before the request is there.
async fn history(
    state: &AppState,
    req: &LdRequest,
    entity_ids: Vec<String>,
    entity_type: Option<String>,
    attrs: &[String],
    range: &Range,
) -> Result<Vec<HistoryRow>> {
    state.services.history.settle().await;
    state
        .services
        .store
        .query_history(&HistoryQuery {
            tenant: req.tenant.clone(),
            entity_ids,
            entity_type,
            attrs: attrs.to_vec(),
            from: range.from,
            to: range.to,
            last_n: range.last_n,
            limit: MAX_INSTANCES,
            ..HistoryQuery::default()
        })
        .await
        .map_err(store_error)
}

fn store_error(e: StoreError) -> Error {
    Error(LdError::new(
        weft_model::ngsi_ld::ErrorKind::InternalError,
        format!("reading the history failed: {e}"),
    ))
}

/// The rows as temporal entities, in the order the entities first
/// appear; each attribute's instances oldest first.
fn render(req: &LdRequest, params: &LdParams, rows: Vec<HistoryRow>) -> Vec<Value> {
    let simplified = params.option("temporalValues");
    let mut order: Vec<String> = Vec::new();
    let mut by_entity: BTreeMap<String, (String, BTreeMap<String, Vec<HistoryRow>>)> =
        BTreeMap::new();
    for row in rows {
        if row.attr.is_empty() {
            continue;
        }
        if !by_entity.contains_key(&row.entity_id) {
            order.push(row.entity_id.clone());
        }
        let entry = by_entity
            .entry(row.entity_id.clone())
            .or_insert_with(|| (row.entity_type.clone(), BTreeMap::new()));
        entry.1.entry(row.attr.clone()).or_default().push(row);
    }
    order
        .into_iter()
        .filter_map(|id| {
            let (entity_type, attrs) = by_entity.remove(&id)?;
            let mut out = Map::new();
            out.insert("id".into(), Value::String(id));
            out.insert(
                "type".into(),
                Value::String(req.context.from_stored(&entity_type)),
            );
            for (name, mut instances) in attrs {
                instances.sort_by_key(|r| (r.time, r.instance));
                out.insert(
                    req.context.from_stored(&name),
                    attribute(&instances, simplified),
                );
            }
            Some(Value::Object(out))
        })
        .collect()
}

/// One attribute's instances, normalized or simplified.
fn attribute(instances: &[HistoryRow], simplified: bool) -> Value {
    let kind = AttrKind::of_stored(instances.last().map_or("", |r| r.attr_type.as_str()));
    let value_of = |r: &HistoryRow| serde_json::from_str(&r.value).unwrap_or(Value::Null);
    if simplified {
        let member = kind.values_member();
        let values: Vec<Value> = instances
            .iter()
            .map(|r| json!([value_of(r), format_datetime(r.time)]))
            .collect();
        return json!({"type": kind.name(), member: values});
    }
    let member = kind.value_member();
    Value::Array(
        instances
            .iter()
            .map(|r| {
                json!({
                    "type": kind.name(),
                    member: value_of(r),
                    "observedAt": format_datetime(r.time),
                })
            })
            .collect(),
    )
}
