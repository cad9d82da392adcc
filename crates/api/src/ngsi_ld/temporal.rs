//! `/ngsi-ld/v1/temporal/entities`: the temporal evolution of entities
//! (clauses 5.7.3, 5.7.4), read from weft's history, the same history
//! QuantumLeap's API reads. No second store, no second service: every
//! change an entity goes through (from `/v2`, `/ngsi-ld/v1` or a device)
//! is there, at the time history gives it.
//!
//! Each attribute is a list of its instances, oldest first: normalized
//! (`{"type": "Property", "value": …, "observedAt": …}` each) or, with
//! `options=temporalValues`, simplified (`{"type": "Property", "values":
//! [[value, time], …]}`). With `aggrMethods`, the aggregated form
//! (`{"type": "Property", "avg": [[value, startAt, endAt], …]}`), from the
//! history's rollups.

use std::collections::BTreeMap;

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{json, Map, Value};
use weft_model::history::notified::NotifiedEntity;
use weft_model::ngsi::{format_datetime, parse_datetime, Entity};
use weft_model::ngsi_ld::entity;
use weft_model::ngsi_ld::entity::AttrKind;
use weft_model::ngsi_ld::{ErrorKind, LdError};
use weft_store::{AggrMethod, AggrPeriod, HistoryDelete, HistoryQuery, HistoryRow, StoreError};

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
    /// The newest instance of each series, whenever.
    fn last() -> Range {
        Range {
            from: None,
            to: None,
            last_n: Some(1),
        }
    }

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
    if let Some(aggregation) = Aggregation::from_params(&params)? {
        let mut found = aggregation
            .run(&state, &req, vec![id.clone()], &attrs, &range)
            .await?;
        if let Some(entity) = found.pop() {
            return Ok(req.answer(entity));
        }
    } else {
        let rows = history(&state, &req, vec![id.clone()], None, &attrs, &range).await?;
        if let Some(entity) = render(&req, &params, rows).pop() {
            return Ok(req.answer(entity));
        }
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
    if let Some(aggregation) = Aggregation::from_params(&params)? {
        let found = aggregation.run(&state, &req, page, &attrs, &range).await?;
        return Ok(req.answer(Value::Array(found)));
    }
    let rows = history(&state, &req, page, None, &attrs, &range).await?;
    Ok(req.answer(Value::Array(render(&req, &params, rows))))
}

/// An aggregated temporal request (`aggrMethods`, `aggrPeriodDuration`):
/// the history's own aggregations, which QuantumLeap's API answers from
/// too.
struct Aggregation {
    /// Each method asked, with its NGSI-LD name.
    methods: Vec<(&'static str, AggrMethod)>,
    /// The buckets; `None`: the whole range as one.
    period: Option<AggrPeriod>,
}

impl Aggregation {
    /// The aggregation asked for, if any. The methods the history keeps
    /// are `totalCount`, `sum`, `avg`, `min` and `max`; the periods one
    /// calendar unit (`PT1S`, `PT1M`, `PT1H`, `P1D`, `P1M`, `P1Y`).
    fn from_params(params: &LdParams) -> Result<Option<Aggregation>> {
        let Some(names) = params.list("aggrMethods") else {
            return Ok(None);
        };
        let mut methods = Vec::new();
        for name in &names {
            let method = match name.as_str() {
                "totalCount" => ("totalCount", AggrMethod::Count),
                "sum" => ("sum", AggrMethod::Sum),
                "avg" => ("avg", AggrMethod::Avg),
                "min" => ("min", AggrMethod::Min),
                "max" => ("max", AggrMethod::Max),
                "distinctCount" | "stddev" | "sumsq" => {
                    return Err(Error(LdError::new(
                        ErrorKind::OperationNotSupported,
                        format!("aggrMethods {name} is not supported"),
                    )))
                }
                other => {
                    return Err(Error(LdError::bad_request(format!(
                        "aggrMethods: unknown method {other}"
                    ))))
                }
            };
            methods.push(method);
        }
        let period = match params.get("aggrPeriodDuration") {
            None | Some("P0D" | "PT0S") => None,
            Some("PT1S") => Some(AggrPeriod::Second),
            Some("PT1M") => Some(AggrPeriod::Minute),
            Some("PT1H") => Some(AggrPeriod::Hour),
            Some("P1D") => Some(AggrPeriod::Day),
            Some("P1M") => Some(AggrPeriod::Month),
            Some("P1Y") => Some(AggrPeriod::Year),
            Some(other) => {
                return Err(Error(LdError::new(
                    ErrorKind::OperationNotSupported,
                    format!("aggrPeriodDuration {other}: one calendar unit (PT1S, PT1M, PT1H, P1D, P1M, P1Y) is supported"),
                )))
            }
        };
        Ok(Some(Aggregation { methods, period }))
    }

    /// The aggregated temporal entities: each attribute with, per method,
    /// `[value, startAt, endAt]` per bucket.
    async fn run(
        &self,
        state: &AppState,
        req: &LdRequest,
        entity_ids: Vec<String>,
        attrs: &[String],
        range: &Range,
    ) -> Result<Vec<Value>> {
        state.services.history.settle().await;
        let query = HistoryQuery {
            tenant: req.tenant.clone(),
            entity_ids,
            attrs: attrs.to_vec(),
            from: range.from,
            to: range.to,
            ..HistoryQuery::default()
        };
        let mut order: Vec<String> = Vec::new();
        let mut entities: BTreeMap<String, Map<String, Value>> = BTreeMap::new();
        for (name, method) in &self.methods {
            let found = state
                .services
                .store
                .aggregate_history(&query, *method, self.period)
                .await
                .map_err(store_error)?;
            for a in found {
                if !entities.contains_key(&a.entity_id) {
                    order.push(a.entity_id.clone());
                }
                let entity = entities.entry(a.entity_id.clone()).or_insert_with(|| {
                    let mut e = Map::new();
                    e.insert("id".into(), Value::String(a.entity_id.clone()));
                    e.insert(
                        "type".into(),
                        Value::String(req.context.from_stored(&a.entity_type)),
                    );
                    e
                });
                let attr = entity
                    .entry(req.context.from_stored(&a.attr))
                    .or_insert_with(|| json!({"type": "Property"}));
                let end = bucket_end(a.bucket, self.period, range);
                let value = match (a.value, method) {
                    (None, _) => Value::Null,
                    (Some(n), AggrMethod::Count) => json!(n as i64),
                    (Some(v), _) => json!(v),
                };
                if let Some(list) = attr
                    .as_object_mut()
                    .map(|m| m.entry(*name).or_insert_with(|| json!([])))
                    .and_then(Value::as_array_mut)
                {
                    list.push(json!([
                        value,
                        format_datetime(a.bucket),
                        format_datetime(end)
                    ]));
                }
            }
        }
        Ok(order
            .into_iter()
            .filter_map(|id| entities.remove(&id).map(Value::Object))
            .collect())
    }
}

/// Where a bucket starting at `start` ends: the next bucket's start, or,
/// for the whole range, its end (now when it has none).
fn bucket_end(start: i64, period: Option<AggrPeriod>, range: &Range) -> i64 {
    match period {
        Some(period) => period.bucket_end(start),
        None => range.to.map_or_else(weft_model::now_ms, |to| to + 1),
    }
}

/// "Create or Update Temporal Representation of an Entity"
/// (`POST /ngsi-ld/v1/temporal/entities`): each attribute's instances
/// (a list, or one) recorded in the history at their `observedAt` (at
/// their arrival without one). 201 when the entity had no history yet,
/// else 204. The current entity is not changed: this writes history.
pub async fn create(
    State(state): State<AppState>,
    mut req: LdRequest,
    body: Bytes,
) -> Result<Response> {
    let value = req.body(&body).await?;
    let Value::Object(map) = &value else {
        return Err(Error(LdError::invalid("an entity is a JSON object")));
    };
    let (id, entity_type) = entity::parse_id_and_type(map, &req.context)?;
    let id = id.as_str();
    let existed = has_history(&state, &req, id).await?;
    record(&state, &req, id, &entity_type, map).await?;
    if existed {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    let location = format!("/ngsi-ld/v1/temporal/entities/{id}");
    Ok((StatusCode::CREATED, [(header::LOCATION, location)]).into_response())
}

/// "Add Attributes to Temporal Representation of an Entity"
/// (`POST /ngsi-ld/v1/temporal/entities/{id}/attrs`): the instances
/// recorded, as [`create`] records them; 404 for an entity with neither
/// history nor current state.
pub async fn append(
    State(state): State<AppState>,
    mut req: LdRequest,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response> {
    let value = req.body(&body).await?;
    let Value::Object(map) = &value else {
        return Err(Error(LdError::invalid("the attributes are a JSON object")));
    };
    let entity_type = match history(&state, &req, vec![id.clone()], None, &[], &Range::last())
        .await?
        .first()
    {
        Some(row) => row.entity_type.clone(),
        None => super::entities::find(&state, &req.tenant, &id)
            .map(|e| e.entity.entity_type.clone())
            .ok_or_else(|| Error(LdError::not_found(format!("no entity with id {id}"))))?,
    };
    record(&state, &req, &id, &entity_type, map).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// "Delete Temporal Representation of an Entity"
/// (`DELETE /ngsi-ld/v1/temporal/entities/{id}`): the entity's history,
/// as QuantumLeap's delete removes it; its current state stays.
pub async fn delete(
    State(state): State<AppState>,
    req: LdRequest,
    Path(id): Path<String>,
) -> Result<Response> {
    state.services.history.settle().await;
    let deleted = state
        .services
        .store
        .delete_history(&HistoryDelete {
            tenant: req.tenant.clone(),
            service_path: None,
            entity_id: Some(id.clone()),
            entity_type: None,
            from: None,
            to: None,
        })
        .await
        .map_err(store_error)?;
    if deleted == 0 {
        return Err(Error(LdError::not_found(format!(
            "no history of an entity with id {id}"
        ))));
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Whether entity `id` has any history.
async fn has_history(state: &AppState, req: &LdRequest, id: &str) -> Result<bool> {
    let rows = history(state, req, vec![id.to_string()], None, &[], &Range::last()).await?;
    Ok(!rows.is_empty())
}

/// Records the attribute instances of `map` (every member but the id, the
/// type and the context) as history of entity `id`: each instance its
/// own state, filed at its `observedAt`.
async fn record(
    state: &AppState,
    req: &LdRequest,
    id: &str,
    entity_type: &str,
    map: &Map<String, Value>,
) -> Result<()> {
    let mut states = Vec::new();
    for (name, value) in map {
        if matches!(name.as_str(), "id" | "@id" | "type" | "@type" | "@context") {
            continue;
        }
        let stored = req.context.to_stored(name);
        let instances = match value {
            Value::Array(items) => items.iter().collect(),
            one => vec![one],
        };
        for instance in instances {
            let attr = entity::parse_attribute(name, instance, &req.context)?;
            let mut state_of = Entity::new(id, entity_type);
            state_of.attrs.insert(stored.clone(), attr);
            states.push(NotifiedEntity::from(state_of));
        }
    }
    if states.is_empty() {
        return Err(Error(LdError::bad_request("no attribute instance given")));
    }
    state
        .services
        .history
        .record_entities(
            &req.tenant,
            super::LD_SERVICE_PATH,
            &states,
            None,
            weft_model::now_ms(),
        )
        .await
        .map_err(store_error)?;
    Ok(())
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
