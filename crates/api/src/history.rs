//! QuantumLeap's API: `POST /v2/notify` (an Orion feeding weft's history)
//! and the history queries under `/ql/v2` (QuantumLeap's own paths would
//! clash with NGSIv2's `/v2/entities`).
//!
//! Queries read the store's narrow history table (one row per entity,
//! attribute and time index) and put QuantumLeap's shapes back together:
//! an entity's attributes share one `index` (the union of their times,
//! `null` where an attribute has no value at a time); aggregations
//! (`aggrMethod`, `aggrPeriod`) are computed by the store per bucket.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use weft_model::geo::{GeoQuery, Shape};
use weft_model::history::format_index;
use weft_model::ngsi::{parse_datetime, parse_entity, Entity};
use weft_store::{
    AggrMethod, AggrPeriod, HistoryAggregate, HistoryDelete, HistoryQuery, HistoryRow, Store,
};

use crate::error::{ApiError, ApiResult};
use crate::AppState;

/// Default `limit` of QuantumLeap queries.
pub const DEFAULT_LIMIT: usize = 10_000;

/// `POST /v2/notify` and the `/ql/v2` queries.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v2/notify", post(notify))
        .nest("/ql/v2", query_routes())
}

/// QuantumLeap's API at its own paths (`/v2/notify`, `/v2/entities/…`),
/// for the second listener of `history.quantumleap_listen`.
pub fn quantumleap_router(state: AppState) -> Router {
    Router::new()
        .route("/v2/notify", post(notify))
        .nest("/v2", query_routes())
        .layer(axum::extract::DefaultBodyLimit::max(crate::MAX_BODY_BYTES))
        .with_state(state)
}

/// The query routes, relative to the API root (`/ql/v2`, or `/v2` on
/// QuantumLeap's own port).
pub fn query_routes() -> Router<AppState> {
    Router::new()
        .route("/entities", get(list_entities))
        .route("/entities/{id}", get(entity).delete(delete_entity))
        .route("/entities/{id}/value", get(entity_value))
        .route("/entities/{id}/attrs/{attr}", get(entity_attr))
        .route("/entities/{id}/attrs/{attr}/value", get(entity_attr_value))
        .route("/types/{type}", get(type_entities).delete(delete_type))
        .route("/types/{type}/value", get(type_value))
        .route("/types/{type}/attrs/{attr}", get(type_attr))
        .route("/types/{type}/attrs/{attr}/value", get(type_attr_value))
        .route("/attrs", get(attrs))
        .route("/attrs/value", get(attrs_value))
        .route("/attrs/{attr}", get(attr))
        .route("/attrs/{attr}/value", get(attr_value))
        .route("/op/query", post(op_query))
        .route("/health", get(health))
        .route("/version", get(version))
}

/// The tenant and service path of a QuantumLeap request.
struct Scope {
    tenant: String,
    service_path: Option<String>,
}

fn scope(headers: &HeaderMap) -> ApiResult<Scope> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
    };
    let tenant = header("fiware-service").unwrap_or_default();
    if tenant.len() > 50
        || !tenant
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_')
    {
        return Err(ApiError::bad_request(
            "bad character in tenant name - only underscore and alphanumeric characters are allowed",
        ));
    }
    Ok(Scope {
        tenant: tenant.to_ascii_lowercase(),
        service_path: header("fiware-servicepath").map(str::to_string),
    })
}

/// `POST /v2/notify`: stores every valid entity of a notification under
/// its time index; 200 when all were valid, 400 naming the invalid ones
/// otherwise (the valid ones are stored all the same).
async fn notify(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let scope = scope(&headers)?;
    if body.is_empty() {
        return Err(ApiError::bad_request("request body is empty"));
    }
    let value: Value = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("request body is not JSON: {e}")))?;
    let Some(data) = value.get("data").and_then(Value::as_array) else {
        return Err(ApiError::bad_request("notification has no data array"));
    };
    let mut entities: Vec<Entity> = Vec::with_capacity(data.len());
    let mut invalid: Vec<String> = Vec::new();
    for (i, item) in data.iter().enumerate() {
        match notified_entity(item) {
            Ok(e) => entities.push(e),
            Err(why) => invalid.push(format!("entity {i}: {why}")),
        }
    }
    let service_path = scope.service_path.as_deref().unwrap_or("/");
    let time_attr = headers
        .get("fiware-timeindex-attribute")
        .and_then(|v| v.to_str().ok());
    let stored = state
        .services
        .history
        .record_entities(
            &scope.tenant,
            service_path,
            &entities,
            time_attr,
            weft_model::now_ms(),
        )
        .await?;
    metrics::counter!("weft_history_notified_rows_total").increment(stored);
    if !invalid.is_empty() {
        return Err(ApiError::bad_request(format!(
            "{} of {} entities not stored: {}",
            invalid.len(),
            data.len(),
            invalid.join("; ")
        )));
    }
    Ok((StatusCode::OK, "Notification successfully processed").into_response())
}

/// One entity of a notification: normalized NGSI with id and type.
fn notified_entity(item: &Value) -> Result<Entity, String> {
    let obj = item.as_object().ok_or("not an object")?;
    if !obj.get("id").is_some_and(Value::is_string) {
        return Err("no id".into());
    }
    if !obj.get("type").is_some_and(Value::is_string) {
        return Err("no type".into());
    }
    for (name, attr) in obj {
        if name != "id" && name != "type" && !attr.is_object() {
            return Err(format!(
                "attribute {name} is not in normalized form (keyValues is not accepted)"
            ));
        }
    }
    parse_entity(item, false).map_err(|e| e.description)
}

/// The query parameters QuantumLeap takes.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Params {
    #[serde(rename = "type")]
    entity_type: Option<String>,
    id: Option<String>,
    attrs: Option<String>,
    from_date: Option<String>,
    to_date: Option<String>,
    last_n: Option<usize>,
    limit: Option<usize>,
    offset: Option<usize>,
    aggr_method: Option<String>,
    aggr_period: Option<String>,
    aggr_scope: Option<String>,
    id_pattern: Option<String>,
    georel: Option<String>,
    geometry: Option<String>,
    coords: Option<String>,
}

/// What a parsed request asks for.
struct Request {
    query: HistoryQuery,
    aggregate: Option<(AggrMethod, Option<AggrPeriod>)>,
    /// Only values at times the entity's `location` matched this.
    geo: Option<GeoQuery>,
}

fn list(s: &Option<String>) -> Vec<String> {
    s.as_deref()
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|x| !x.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

fn date(name: &str, v: &Option<String>) -> ApiResult<Option<i64>> {
    match v.as_deref() {
        None | Some("") => Ok(None),
        Some(s) => parse_datetime(s).map(Some).ok_or_else(|| {
            ApiError::bad_request(format!("{name} is not an ISO-8601 date-time: {s}"))
        }),
    }
}

impl Params {
    fn request(&self, scope: &Scope, attr_in_path: bool) -> ApiResult<Request> {
        let aggregate = match (&self.aggr_method, &self.aggr_period) {
            (None, Some(_)) => {
                return Err(ApiError::bad_request(
                    "aggrPeriod is only valid with aggrMethod",
                ))
            }
            (None, None) => None,
            (Some(m), p) => {
                let method = match m.as_str() {
                    "count" => AggrMethod::Count,
                    "sum" => AggrMethod::Sum,
                    "avg" => AggrMethod::Avg,
                    "min" => AggrMethod::Min,
                    "max" => AggrMethod::Max,
                    other => {
                        return Err(ApiError::bad_request(format!(
                            "invalid aggrMethod: {other} (count, sum, avg, min, max)"
                        )))
                    }
                };
                let period = match p.as_deref() {
                    None => None,
                    Some("year") => Some(AggrPeriod::Year),
                    Some("month") => Some(AggrPeriod::Month),
                    Some("day") => Some(AggrPeriod::Day),
                    Some("hour") => Some(AggrPeriod::Hour),
                    Some("minute") => Some(AggrPeriod::Minute),
                    Some("second") => Some(AggrPeriod::Second),
                    Some(other) => {
                        return Err(ApiError::bad_request(format!(
                            "invalid aggrPeriod: {other} (year, month, day, hour, minute, second)"
                        )))
                    }
                };
                if !attr_in_path && self.attrs.is_none() {
                    return Err(ApiError::bad_request("aggrMethod needs attrs"));
                }
                if self.aggr_scope.as_deref().is_some_and(|s| s != "entity") {
                    return Err(ApiError::bad_request("aggrScope must be entity"));
                }
                Some((method, period))
            }
        };
        let geo = GeoQuery::from_params(
            self.georel.as_deref(),
            self.geometry.as_deref(),
            self.coords.as_deref(),
        )
        .map_err(|e| ApiError::bad_request(e.description()))?;
        if geo.is_some() && aggregate.is_some() {
            return Err(ApiError::bad_request(
                "geo parameters cannot be combined with aggrMethod",
            ));
        }
        Ok(Request {
            geo,
            query: HistoryQuery {
                tenant: scope.tenant.clone(),
                service_path: scope.service_path.clone(),
                entity_ids: list(&self.id),
                entity_type: self.entity_type.clone(),
                attrs: list(&self.attrs),
                from: date("fromDate", &self.from_date)?,
                to: date("toDate", &self.to_date)?,
                last_n: self.last_n,
                offset: self.offset.unwrap_or(0),
                limit: self.limit.unwrap_or(DEFAULT_LIMIT),
            },
            aggregate,
        })
    }
}

/// One entity's series: times and values per attribute.
#[derive(Default)]
struct EntitySeries {
    entity_type: String,
    /// attr → time → value.
    attrs: BTreeMap<String, BTreeMap<i64, Value>>,
}

impl EntitySeries {
    /// The union of the attributes' times.
    fn index(&self) -> Vec<i64> {
        let all: BTreeSet<i64> = self
            .attrs
            .values()
            .flat_map(|s| s.keys().copied())
            .collect();
        all.into_iter().collect()
    }

    fn index_json(times: &[i64]) -> Value {
        Value::Array(
            times
                .iter()
                .map(|t| Value::String(format_index(*t)))
                .collect(),
        )
    }

    /// `"attributes": [{"attrName","values"}]` aligned on `times`.
    fn attributes_json(&self, times: &[i64]) -> Value {
        Value::Array(
            self.attrs
                .iter()
                .map(|(name, series)| {
                    let values: Vec<Value> = times
                        .iter()
                        .map(|t| series.get(t).cloned().unwrap_or(Value::Null))
                        .collect();
                    json!({"attrName": name, "values": values})
                })
                .collect(),
        )
    }

    /// One attribute's `index` and `values`.
    fn attr_json(&self, attr: &str) -> (Value, Value) {
        let series = self.attrs.get(attr);
        let times: Vec<i64> = series
            .map(|s| s.keys().copied().collect())
            .unwrap_or_default();
        let values: Vec<Value> = series
            .map(|s| s.values().cloned().collect())
            .unwrap_or_default();
        (Self::index_json(&times), Value::Array(values))
    }
}

/// Series per entity, keyed and ordered by (type, id).
type Found = BTreeMap<(String, String), EntitySeries>;

/// Runs a request: ((entity type, id) → series).
async fn run(state: &AppState, req: &Request) -> ApiResult<Found> {
    let store = settled_store(state).await;
    let mut out = Found::new();
    match req.aggregate {
        None => {
            let rows: Vec<HistoryRow> = match &req.geo {
                None => store.query_history(&req.query).await?,
                Some(geo) => geo_rows(store, &req.query, geo).await?,
            };
            for r in rows {
                let value = serde_json::from_str(&r.value).unwrap_or(Value::Null);
                let e = out.entry((r.entity_type.clone(), r.entity_id)).or_default();
                e.entity_type = r.entity_type;
                e.attrs.entry(r.attr).or_default().insert(r.time, value);
            }
        }
        Some((method, period)) => {
            let aggs: Vec<HistoryAggregate> =
                store.aggregate_history(&req.query, method, period).await?;
            if method != AggrMethod::Count
                && !aggs.is_empty()
                && aggs.iter().all(|a| a.value.is_none())
            {
                return Err(ApiError::new(
                    StatusCode::NOT_FOUND,
                    "AggrMethod cannot be applied",
                    "AggrMethod cannot be applied on type TEXT and BOOLEAN.",
                ));
            }
            for a in aggs {
                let e = out.entry((a.entity_type.clone(), a.entity_id)).or_default();
                e.entity_type = a.entity_type;
                let value = a.value.map(number).unwrap_or(Value::Null);
                e.attrs.entry(a.attr).or_default().insert(a.bucket, value);
            }
        }
    }
    Ok(out)
}

/// Rows of `q` at the times their entity's `location` matched `geo`
/// (QuantumLeap filters each stored state by its location). The filter
/// looks at the first 10,000 values of each series in range; `lastN`,
/// `offset` and `limit` then apply per series to what matched.
async fn geo_rows(
    store: &Arc<dyn Store>,
    q: &HistoryQuery,
    geo: &GeoQuery,
) -> ApiResult<Vec<HistoryRow>> {
    let wide = HistoryQuery {
        last_n: None,
        offset: 0,
        limit: DEFAULT_LIMIT,
        ..q.clone()
    };
    let locations = store
        .query_history(&HistoryQuery {
            attrs: vec!["location".to_string()],
            ..wide.clone()
        })
        .await?;
    let inside: std::collections::HashSet<(String, String, i64)> = locations
        .into_iter()
        .filter(|r| {
            serde_json::from_str::<Value>(&r.value)
                .ok()
                .and_then(|v| Shape::from_attribute(&r.attr_type, &v).ok().flatten())
                .is_some_and(|shape| geo.matches(&shape))
        })
        .map(|r| (r.entity_type, r.entity_id, r.time))
        .collect();
    let rows: Vec<HistoryRow> = store
        .query_history(&wide)
        .await?
        .into_iter()
        .filter(|r| inside.contains(&(r.entity_type.clone(), r.entity_id.clone(), r.time)))
        .collect();
    let mut out = Vec::with_capacity(rows.len());
    for series in rows.chunk_by(|a, b| {
        (&a.entity_type, &a.entity_id, &a.attr) == (&b.entity_type, &b.entity_id, &b.attr)
    }) {
        let start = q.last_n.map_or(0, |n| series.len().saturating_sub(n));
        out.extend(
            series[start..]
                .iter()
                .skip(q.offset)
                .take(q.limit.min(DEFAULT_LIMIT))
                .cloned(),
        );
    }
    Ok(out)
}

/// The store, once every notification acknowledged so far has been moved
/// into the history (a client reads back what it was told is stored).
async fn settled_store(state: &AppState) -> &Arc<dyn Store> {
    state.services.history.settle().await;
    &state.services.store
}

/// A float as JSON, integral values without a fraction.
fn number(n: f64) -> Value {
    if n.fract() == 0.0 && n.abs() < 9e15 {
        Value::from(n as i64)
    } else {
        Value::from(n)
    }
}

/// An empty result: QuantumLeap's clients get `[]` with 200.
fn empty() -> Response {
    Json(json!([])).into_response()
}

async fn single_entity(
    state: &AppState,
    headers: &HeaderMap,
    params: &Params,
    id: String,
    attr: Option<String>,
) -> ApiResult<Option<(String, EntitySeries)>> {
    let scope = scope(headers)?;
    let mut req = params.request(&scope, attr.is_some())?;
    req.query.entity_ids = vec![id.clone()];
    if let Some(a) = attr {
        req.query.attrs = vec![a];
    }
    let found = run(state, &req).await?;
    Ok(found
        .into_iter()
        .find(|((_, found_id), _)| *found_id == id)
        .map(|(_, s)| (id, s)))
}

/// `GET /entities/{id}`.
async fn entity(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(params): Query<Params>,
) -> ApiResult<Response> {
    let Some((id, s)) = single_entity(&state, &headers, &params, id, None).await? else {
        return Ok(empty());
    };
    let times = s.index();
    Ok(Json(json!({
        "id": id,
        "type": s.entity_type,
        "index": EntitySeries::index_json(&times),
        "attributes": s.attributes_json(&times),
    }))
    .into_response())
}

/// `GET /entities/{id}/value`.
async fn entity_value(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(params): Query<Params>,
) -> ApiResult<Response> {
    let Some((_, s)) = single_entity(&state, &headers, &params, id, None).await? else {
        return Ok(empty());
    };
    let times = s.index();
    Ok(Json(json!({
        "index": EntitySeries::index_json(&times),
        "attributes": s.attributes_json(&times),
    }))
    .into_response())
}

/// `GET /entities/{id}/attrs/{attr}`.
async fn entity_attr(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((id, attr)): Path<(String, String)>,
    Query(params): Query<Params>,
) -> ApiResult<Response> {
    let Some((id, s)) = single_entity(&state, &headers, &params, id, Some(attr.clone())).await?
    else {
        return Ok(empty());
    };
    let (index, values) = s.attr_json(&attr);
    Ok(Json(json!({
        "id": id, "type": s.entity_type, "attrName": attr, "index": index, "values": values,
    }))
    .into_response())
}

/// `GET /entities/{id}/attrs/{attr}/value`.
async fn entity_attr_value(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((id, attr)): Path<(String, String)>,
    Query(params): Query<Params>,
) -> ApiResult<Response> {
    let Some((_, s)) = single_entity(&state, &headers, &params, id, Some(attr.clone())).await?
    else {
        return Ok(empty());
    };
    let (index, values) = s.attr_json(&attr);
    Ok(Json(json!({"index": index, "values": values})).into_response())
}

/// Series of the entities of `entity_type` (`None`: of the `type`
/// parameter, or of every type), of one attribute or of the `attrs` asked.
async fn of_type(
    state: &AppState,
    headers: &HeaderMap,
    params: &Params,
    entity_type: Option<String>,
    attr: Option<String>,
) -> ApiResult<Found> {
    let scope = scope(headers)?;
    let mut req = params.request(&scope, attr.is_some())?;
    if entity_type.is_some() {
        req.query.entity_type = entity_type;
    }
    if let Some(a) = attr {
        req.query.attrs = vec![a];
    }
    if let Some(pattern) = &params.id_pattern {
        req.query.entity_ids = matching_ids(state, &req.query, pattern).await?;
        if req.query.entity_ids.is_empty() {
            return Ok(Found::new());
        }
    }
    run(state, &req).await
}

fn entities_json(all: &Found) -> Value {
    Value::Array(
        all.iter()
            .map(|((_, id), s)| {
                let times = s.index();
                json!({"id": id, "index": EntitySeries::index_json(&times),
                       "attributes": s.attributes_json(&times)})
            })
            .collect(),
    )
}

fn entities_attr_json(all: &Found, attr: &str) -> Value {
    Value::Array(
        all.iter()
            .map(|((_, id), s)| {
                let (index, values) = s.attr_json(attr);
                json!({"id": id, "index": index, "values": values})
            })
            .collect(),
    )
}

/// The ids of the entities with history (of the query's type, service
/// path and `id` list, if any) whose id matches `pattern` (`idPattern`).
async fn matching_ids(state: &AppState, q: &HistoryQuery, pattern: &str) -> ApiResult<Vec<String>> {
    let re = regex::Regex::new(pattern)
        .map_err(|e| ApiError::bad_request(format!("invalid idPattern: {e}")))?;
    let entities = settled_store(state)
        .await
        .history_entities(
            &q.tenant,
            q.entity_type.as_deref(),
            q.service_path.as_deref(),
        )
        .await?;
    Ok(entities
        .into_iter()
        .map(|e| e.entity_id)
        .filter(|id| re.is_match(id) && (q.entity_ids.is_empty() || q.entity_ids.contains(id)))
        .collect())
}

/// `GET /types/{type}`.
async fn type_entities(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(entity_type): Path<String>,
    Query(params): Query<Params>,
) -> ApiResult<Response> {
    let all = of_type(&state, &headers, &params, Some(entity_type.clone()), None).await?;
    if all.is_empty() {
        return Ok(empty());
    }
    Ok(Json(json!({"type": entity_type, "entities": entities_json(&all)})).into_response())
}

/// `GET /types/{type}/value`.
async fn type_value(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(entity_type): Path<String>,
    Query(params): Query<Params>,
) -> ApiResult<Response> {
    let all = of_type(&state, &headers, &params, Some(entity_type), None).await?;
    if all.is_empty() {
        return Ok(empty());
    }
    Ok(Json(json!({"entities": entities_json(&all)})).into_response())
}

/// `GET /types/{type}/attrs/{attr}`.
async fn type_attr(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((entity_type, attr)): Path<(String, String)>,
    Query(params): Query<Params>,
) -> ApiResult<Response> {
    let all = of_type(
        &state,
        &headers,
        &params,
        Some(entity_type.clone()),
        Some(attr.clone()),
    )
    .await?;
    if all.is_empty() {
        return Ok(empty());
    }
    Ok(Json(json!({
        "type": entity_type, "attrName": attr, "entities": entities_attr_json(&all, &attr),
    }))
    .into_response())
}

/// `GET /types/{type}/attrs/{attr}/value`.
async fn type_attr_value(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((entity_type, attr)): Path<(String, String)>,
    Query(params): Query<Params>,
) -> ApiResult<Response> {
    let all = of_type(
        &state,
        &headers,
        &params,
        Some(entity_type),
        Some(attr.clone()),
    )
    .await?;
    if all.is_empty() {
        return Ok(empty());
    }
    Ok(Json(json!({"entities": entities_attr_json(&all, &attr)})).into_response())
}

/// One attribute across types (the `/attrs` endpoints' shape):
/// `[{"entityType","entities":[{"entityId","index","values"}]}]`, types
/// and ids in order, only entities that have the attribute.
fn attr_types_json(all: &Found, attr: &str) -> Value {
    let mut types: Vec<(String, Vec<Value>)> = Vec::new();
    for ((ty, id), s) in all.iter().filter(|(_, s)| s.attrs.contains_key(attr)) {
        let (index, values) = s.attr_json(attr);
        let entity = json!({"entityId": id, "index": index, "values": values});
        match types.last_mut() {
            Some((last, entities)) if last == ty => entities.push(entity),
            _ => types.push((ty.clone(), vec![entity])),
        }
    }
    Value::Array(
        types
            .into_iter()
            .map(|(ty, entities)| json!({"entityType": ty, "entities": entities}))
            .collect(),
    )
}

/// Every attribute found, each with [`attr_types_json`].
fn attrs_json(all: &Found) -> Value {
    let names: BTreeSet<&String> = all.values().flat_map(|s| s.attrs.keys()).collect();
    Value::Array(
        names
            .into_iter()
            .map(|name| json!({"attrName": name, "types": attr_types_json(all, name)}))
            .collect(),
    )
}

/// `GET /attrs`: the asked attributes (all by default) of every entity.
async fn attrs(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(params): Query<Params>,
) -> ApiResult<Response> {
    let all = of_type(&state, &headers, &params, None, None).await?;
    if all.is_empty() {
        return Ok(empty());
    }
    Ok(Json(json!({"attrs": attrs_json(&all)})).into_response())
}

/// `GET /attrs/value`.
async fn attrs_value(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(params): Query<Params>,
) -> ApiResult<Response> {
    let all = of_type(&state, &headers, &params, None, None).await?;
    if all.is_empty() {
        return Ok(empty());
    }
    Ok(Json(json!({"values": attrs_json(&all)})).into_response())
}

/// `GET /attrs/{attr}`: one attribute of every entity that has it.
async fn attr(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(attr): Path<String>,
    Query(params): Query<Params>,
) -> ApiResult<Response> {
    let all = of_type(&state, &headers, &params, None, Some(attr.clone())).await?;
    if all.is_empty() {
        return Ok(empty());
    }
    Ok(Json(json!({"attrName": attr, "types": attr_types_json(&all, &attr)})).into_response())
}

/// `GET /attrs/{attr}/value`.
async fn attr_value(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(attr): Path<String>,
    Query(params): Query<Params>,
) -> ApiResult<Response> {
    let all = of_type(&state, &headers, &params, None, Some(attr.clone())).await?;
    if all.is_empty() {
        return Ok(empty());
    }
    Ok(Json(json!({"values": attr_types_json(&all, &attr)})).into_response())
}

/// QuantumLeap's 404 for a query or delete that matched nothing.
fn no_records() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "Not Found",
        "No records were found for such query.",
    )
}

/// A 400 whose body is a bare JSON string, as QuantumLeap's `/op/query`
/// answers bad bodies.
fn bad_query(message: &str) -> Response {
    (StatusCode::BAD_REQUEST, Json(Value::String(message.into()))).into_response()
}

/// `POST /op/query`: the latest value of the asked attributes (all by
/// default) of each listed entity, as NGSI entities with the time of that
/// value as `dateModified`; 404 when an entity has none.
async fn op_query(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let scope = scope(&headers)?;
    let Ok(Value::Object(body)) = serde_json::from_slice::<Value>(&body) else {
        return Ok(bad_query(
            "Discarding query due to lack of request body. Lost in a redirect maybe?",
        ));
    };
    let Some(entities) = body.get("entities") else {
        return Ok(bad_query(
            "Discarding query due to lack of request body content.",
        ));
    };
    if body.contains_key("expression") {
        return Ok(bad_query("expression is Not Supported"));
    }
    if body.contains_key("metadata") {
        return Ok(bad_query("metadata is Not Supported"));
    }
    let Some(entities) = entities.as_array() else {
        return Ok(bad_query("entities must be an array"));
    };
    let mut wanted = Vec::with_capacity(entities.len());
    for e in entities {
        let text = |k: &str| e.get(k).and_then(Value::as_str).map(str::to_string);
        let Some(entity_type) = text("type") else {
            return Ok(bad_query("Entity type is required"));
        };
        let Some(id) = text("id") else {
            return Ok(bad_query("Entity id is required"));
        };
        if e.get("idPattern").is_some() {
            return Ok(bad_query("idPattern is Not Supported"));
        }
        wanted.push((id, entity_type));
    }
    let attrs: Vec<String> = match body.get("attrs") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        Some(_) => return Ok(bad_query("attrs must be an array of attribute names")),
    };
    let store = settled_store(&state).await;
    let mut out = Vec::with_capacity(wanted.len());
    for (id, entity_type) in wanted {
        let rows = store
            .query_history(&HistoryQuery {
                tenant: scope.tenant.clone(),
                service_path: scope.service_path.clone(),
                entity_ids: vec![id.clone()],
                entity_type: Some(entity_type.clone()),
                attrs: attrs.clone(),
                last_n: Some(1),
                limit: 1,
                ..HistoryQuery::default()
            })
            .await?;
        let Some(latest) = rows.iter().map(|r| r.time).max() else {
            return Err(no_records());
        };
        let mut m = Map::new();
        m.insert("id".into(), id.into());
        m.insert("type".into(), entity_type.into());
        for r in rows {
            let value = serde_json::from_str(&r.value).unwrap_or(Value::Null);
            m.insert(r.attr, json!({"type": r.attr_type, "value": value}));
        }
        m.insert(
            "dateModified".into(),
            json!({"type": "DateTime", "value": format_index(latest)}),
        );
        out.push(Value::Object(m));
    }
    Ok(Json(Value::Array(out)).into_response())
}

/// `GET /entities`: the entities with history, each with the time of its
/// latest row.
async fn list_entities(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(params): Query<Params>,
) -> ApiResult<Response> {
    let scope = scope(&headers)?;
    let store = settled_store(&state).await;
    let ids = list(&params.id);
    let pattern = match &params.id_pattern {
        Some(p) => Some(
            regex::Regex::new(p)
                .map_err(|e| ApiError::bad_request(format!("invalid idPattern: {e}")))?,
        ),
        None => None,
    };
    let entities = store
        .history_entities(
            &scope.tenant,
            params.entity_type.as_deref(),
            scope.service_path.as_deref(),
        )
        .await?;
    let mut out = Vec::new();
    let (offset, limit) = (
        params.offset.unwrap_or(0),
        params.limit.unwrap_or(DEFAULT_LIMIT),
    );
    for e in entities
        .into_iter()
        .filter(|e| ids.is_empty() || ids.contains(&e.entity_id))
        .filter(|e| pattern.as_ref().is_none_or(|r| r.is_match(&e.entity_id)))
        .skip(offset)
        .take(limit)
    {
        let last = store
            .query_history(&HistoryQuery {
                tenant: scope.tenant.clone(),
                entity_ids: vec![e.entity_id.clone()],
                entity_type: Some(e.entity_type.clone()),
                last_n: Some(1),
                limit: 1,
                ..HistoryQuery::default()
            })
            .await?;
        let index: Vec<Value> = last
            .iter()
            .map(|r| Value::String(format_index(r.time)))
            .collect();
        let mut m = Map::new();
        m.insert("id".into(), e.entity_id.into());
        m.insert("index".into(), Value::Array(index));
        m.insert("type".into(), e.entity_type.into());
        out.push(Value::Object(m));
    }
    if out.is_empty() {
        return Ok(empty());
    }
    Ok(Json(Value::Array(out)).into_response())
}

/// What a QuantumLeap delete removes: the request's tenant and service
/// path, and the rows from `fromDate` to `toDate` (both inclusive, as
/// QuantumLeap's `time_index >= fromDate AND time_index <= toDate`; all
/// time without them). A malformed date is a 400 naming the parameter,
/// before anything is deleted.
fn delete_target(
    scope: Scope,
    params: &Params,
    entity_id: Option<String>,
    entity_type: Option<String>,
) -> ApiResult<HistoryDelete> {
    Ok(HistoryDelete {
        tenant: scope.tenant,
        service_path: scope.service_path,
        entity_id,
        entity_type,
        from: date("fromDate", &params.from_date)?,
        to: date("toDate", &params.to_date)?,
    })
}

/// `DELETE /entities/{id}` (QuantumLeap's `delete_entity`): the entity's
/// history (of any type, or of `type`) under the request's service path,
/// between `fromDate` and `toDate` when given; 204, 404 when nothing
/// matched.
async fn delete_entity(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(params): Query<Params>,
) -> ApiResult<Response> {
    let target = delete_target(
        scope(&headers)?,
        &params,
        Some(id),
        params.entity_type.clone(),
    )?;
    let n = settled_store(&state).await.delete_history(&target).await?;
    if n == 0 {
        return Err(no_records());
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `DELETE /types/{type}` (QuantumLeap's `delete_entities`): the history
/// of every entity of the type under the request's service path, between
/// `fromDate` and `toDate` when given; 204, 404 when nothing matched.
async fn delete_type(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(entity_type): Path<String>,
    Query(params): Query<Params>,
) -> ApiResult<Response> {
    let target = delete_target(scope(&headers)?, &params, None, Some(entity_type))?;
    let n = settled_store(&state).await.delete_history(&target).await?;
    if n == 0 {
        return Err(no_records());
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `GET /health`: QuantumLeap's health shape, from the store's health.
async fn health(State(state): State<AppState>) -> Response {
    match state.services.store.ping().await {
        Ok(()) => Json(json!({"status": "pass"})).into_response(),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "fail"})),
        )
            .into_response(),
    }
}

/// `GET /version`: the QuantumLeap release whose API this mirrors.
async fn version() -> Response {
    Json(json!({"version": "0.8.3"})).into_response()
}
