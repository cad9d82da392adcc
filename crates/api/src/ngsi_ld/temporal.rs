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
use weft_model::geo::Shape;
use weft_model::history::notified::NotifiedEntity;
use weft_model::ngsi::{parse_datetime, Entity};
use weft_model::ngsi_ld::entity;
use weft_model::ngsi_ld::entity::{instant, AttrKind};
use weft_model::ngsi_ld::projection::{Mode, Projection};
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
    /// Where aggregation periods start: `timeAt` of `after` and
    /// `between`; without one, each entity's first instance.
    origin: Option<i64>,
}

impl Range {
    /// The newest instance of each series, whenever.
    fn last() -> Range {
        Range {
            from: None,
            to: None,
            last_n: Some(1),
            origin: None,
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
        let origin = match params.get("timerel") {
            Some("after" | "between") => at,
            _ => None,
        };
        Ok(Range {
            from,
            to,
            last_n,
            origin,
        })
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
    super::entities::check_id(&id)?;
    let range = Range::from_params(&params)?;
    let attrs = stored_attrs(&req, &params);
    let projection = params.projection()?;
    let found = if let Some(aggregation) = Aggregation::from_params(&params)? {
        aggregation
            .run(&state, &req, vec![id.clone()], &attrs, &range)
            .await?
            .pop()
    } else {
        let rows = history(&state, &req, vec![id.clone()], None, &attrs, &range).await?;
        render(&req, &params, rows).pop()
    };
    // An entity with nothing recorded in the range: its id and type.
    let entity = match found {
        Some(entity) => entity,
        None => {
            let found = super::entities::find(&state, &req.tenant, &id).ok_or_else(|| {
                LdError::not_found(format!("no history of an entity with id {id}"))
            })?;
            json!({
                "id": id,
                "type": req.context.from_stored(&found.entity.entity_type),
            })
        }
    };
    let entity = projected(entity, projection.as_ref());
    if entity.as_object().is_none_or(Map::is_empty) {
        return Err(Error(LdError::not_found(format!(
            "nothing of entity {id} is left to show"
        ))));
    }
    if let Some(p) = projection.as_ref().filter(|p| p.mode() == Mode::Pick) {
        let named = |k: &String| p.names().any(|n| n == k);
        if !entity.as_object().is_some_and(|m| m.keys().any(named)) {
            return Err(Error(LdError::not_found(format!(
                "entity {id} has none of the members picked"
            ))));
        }
    }
    Ok(req.answer(entity))
}

/// A temporal entity as `pick` or `omit` project it.
fn projected(mut entity: Value, projection: Option<&Projection>) -> Value {
    if let (Some(p), Value::Object(map)) = (projection, &mut entity) {
        p.apply(map);
    }
    entity
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
    let geo = weft_model::ngsi_ld::geo::geo_query(
        params.get("georel"),
        params.get("geometry"),
        params.get("coordinates"),
    )?;
    // As for Query Entities, ids alone do not make a query (5.7.4).
    let unfiltered = types.is_empty()
        && attrs.is_empty()
        && geo.is_none()
        && params.get("q").is_none()
        && params.get("local") != Some("true");
    if unfiltered {
        return Err(Error(LdError::bad_request(
            "a temporal query names at least one of type, attrs, q or a geo-query",
        )));
    }
    let projection = params.projection()?;
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
    if let Some(geo) = &geo {
        // An entity is chosen when one of its GeoProperty's instances in
        // the range stands in the relation asked.
        let geoproperty = req
            .context
            .to_stored(params.get("geoproperty").unwrap_or("location"));
        let rows = history(&state, &req, chosen.clone(), None, &[geoproperty], &range).await?;
        let matching: std::collections::HashSet<&str> = rows
            .iter()
            .filter(|r| {
                serde_json::from_str::<Value>(&r.value)
                    .ok()
                    .and_then(|v| Shape::of_stored_attribute("geo:json", &v))
                    .is_some_and(|shape| geo.matches(&shape))
            })
            .map(|r| r.entity_id.as_str())
            .collect();
        chosen.retain(|id| matching.contains(id.as_str()));
    }
    let page: Vec<String> = chosen.into_iter().skip(offset).take(limit).collect();
    if page.is_empty() {
        return Ok(req.answer(Value::Array(Vec::new())));
    }
    let found = if let Some(aggregation) = Aggregation::from_params(&params)? {
        aggregation.run(&state, &req, page, &attrs, &range).await?
    } else {
        let rows = history(&state, &req, page, None, &attrs, &range).await?;
        render(&req, &params, rows)
    };
    let found = found
        .into_iter()
        .map(|e| projected(e, projection.as_ref()))
        .collect();
    Ok(req.answer(Value::Array(found)))
}

/// "Query Temporal Evolution of Entities" by POST (`POST
/// /ngsi-ld/v1/temporal/entityOperations/query`, 5.7.4): a `Query` in
/// the body (its `temporalQ` the time range), answered as the GET is.
pub async fn query_by_post(
    State(state): State<AppState>,
    mut req: LdRequest,
    params: LdParams,
    body: Bytes,
) -> Result<Response> {
    let value = req.body(&body).await?;
    let params = params.extended(super::entities::query_params(&value)?)?;
    query(State(state), req, params).await
}

/// An aggregated temporal request (`aggrMethods`, `aggrPeriodDuration`).
/// Totals, sums, means, minima and maxima over one calendar unit (or the
/// whole range) come from the history's rollups, which QuantumLeap's API
/// answers from too; `distinctCount`, `stddev`, `sumsq` and any other
/// duration are computed here from the instances.
struct Aggregation {
    /// Each method asked, with its NGSI-LD name.
    methods: Vec<(&'static str, Method)>,
    /// The buckets.
    period: Period,
}

/// One aggregation method (clause 4.5.19).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Method {
    /// One the history's rollups keep.
    Rollup(AggrMethod),
    /// How many distinct values.
    DistinctCount,
    /// The sample standard deviation of the numbers.
    Stddev,
    /// The sum of the numbers' squares.
    Sumsq,
}

/// How instances are bucketed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Period {
    /// The whole range as one (`P0D`, or none given).
    Whole,
    /// One calendar unit: answered from the rollups when the periods
    /// start on one (`timeAt` on a unit's start).
    Calendar(AggrPeriod),
    /// Any other duration: so many months, or so many milliseconds.
    Every { months: u32, millis: i64 },
}

impl Period {
    /// The period as so many months and milliseconds; `None` for the
    /// whole range.
    fn step(self) -> Option<(u32, i64)> {
        match self {
            Period::Whole => None,
            Period::Calendar(AggrPeriod::Year) => Some((12, 0)),
            Period::Calendar(AggrPeriod::Month) => Some((1, 0)),
            Period::Calendar(AggrPeriod::Day) => Some((0, 86_400_000)),
            Period::Calendar(AggrPeriod::Hour) => Some((0, 3_600_000)),
            Period::Calendar(AggrPeriod::Minute) => Some((0, 60_000)),
            Period::Calendar(AggrPeriod::Second) => Some((0, 1_000)),
            Period::Every { months, millis } => Some((months, millis)),
        }
    }
}

/// One aggregated value of one series.
struct Aggregate {
    entity_id: String,
    entity_type: String,
    attr: String,
    start: i64,
    end: i64,
    value: Value,
}

impl Aggregation {
    /// The aggregation asked for, if any.
    fn from_params(params: &LdParams) -> Result<Option<Aggregation>> {
        let Some(names) = params.list("aggrMethods") else {
            return Ok(None);
        };
        // `format` names the representation over `options`.
        if params
            .get("format")
            .is_some_and(|f| f != "aggregatedValues")
        {
            return Ok(None);
        }
        let mut methods = Vec::new();
        for name in &names {
            let method = match name.as_str() {
                "totalCount" => ("totalCount", Method::Rollup(AggrMethod::Count)),
                "sum" => ("sum", Method::Rollup(AggrMethod::Sum)),
                "avg" => ("avg", Method::Rollup(AggrMethod::Avg)),
                "min" => ("min", Method::Rollup(AggrMethod::Min)),
                "max" => ("max", Method::Rollup(AggrMethod::Max)),
                "distinctCount" => ("distinctCount", Method::DistinctCount),
                "stddev" => ("stddev", Method::Stddev),
                "sumsq" => ("sumsq", Method::Sumsq),
                other => {
                    return Err(Error(LdError::bad_request(format!(
                        "aggrMethods: unknown method {other}"
                    ))))
                }
            };
            if !methods.contains(&method) {
                methods.push(method);
            }
        }
        let period = match params.get("aggrPeriodDuration") {
            None => Period::Whole,
            Some(text) => period(text)?,
        };
        Ok(Some(Aggregation { methods, period }))
    }

    /// The aggregated temporal entities: each attribute with, per method,
    /// `[value, startAt, endAt]` per bucket that has instances.
    async fn run(
        &self,
        state: &AppState,
        req: &LdRequest,
        entity_ids: Vec<String>,
        attrs: &[String],
        range: &Range,
    ) -> Result<Vec<Value>> {
        let from_rollups = self
            .methods
            .iter()
            .all(|(_, m)| matches!(m, Method::Rollup(_)))
            && match self.period {
                Period::Whole => true,
                // The rollups' buckets start on calendar units: they
                // answer when the periods asked start on one too.
                Period::Calendar(p) => range.origin.is_some_and(|o| aligned(o, p)),
                Period::Every { .. } => false,
            };
        let found = if from_rollups {
            self.read_rollups(state, req, entity_ids, attrs, range)
                .await?
        } else {
            let rows = history(state, req, entity_ids, None, attrs, range).await?;
            self.compute_rows(rows, range)
        };
        let mut order: Vec<String> = Vec::new();
        let mut entities: BTreeMap<String, Map<String, Value>> = BTreeMap::new();
        for (name, aggregates) in found {
            for a in aggregates {
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
                if let Some(list) = attr
                    .as_object_mut()
                    .map(|m| m.entry(name).or_insert_with(|| json!([])))
                    .and_then(Value::as_array_mut)
                {
                    list.push(json!([a.value, instant(a.start), instant(a.end)]));
                }
            }
        }
        Ok(order
            .into_iter()
            .filter_map(|id| entities.remove(&id).map(Value::Object))
            .collect())
    }

    /// Each method's aggregates from the history's rollups.
    async fn read_rollups(
        &self,
        state: &AppState,
        req: &LdRequest,
        entity_ids: Vec<String>,
        attrs: &[String],
        range: &Range,
    ) -> Result<Vec<(&'static str, Vec<Aggregate>)>> {
        state.services.history.settle().await;
        let query = HistoryQuery {
            tenant: req.tenant.clone(),
            entity_ids,
            attrs: attrs.to_vec(),
            from: range.from,
            to: range.to,
            ..HistoryQuery::default()
        };
        let unit = match self.period {
            Period::Calendar(p) => Some(p),
            _ => None,
        };
        let mut out = Vec::new();
        for (name, method) in &self.methods {
            let Method::Rollup(method) = method else {
                continue;
            };
            let found = state
                .services
                .store
                .aggregate_history(&query, *method, unit)
                .await
                .map_err(store_error)?;
            let aggregates = found
                .into_iter()
                .map(|a| Aggregate {
                    end: match unit {
                        Some(p) => p.bucket_end(a.bucket),
                        None => whole_range_end(range),
                    },
                    start: a.bucket,
                    value: match (a.value, method) {
                        (None, _) => Value::Null,
                        (Some(n), AggrMethod::Count) => json!(n as i64),
                        (Some(v), _) => json!(v),
                    },
                    entity_id: a.entity_id,
                    entity_type: a.entity_type,
                    attr: a.attr,
                })
                .collect();
            out.push((*name, aggregates));
        }
        Ok(out)
    }

    /// Each method's aggregates computed from the instances.
    fn compute_rows(
        &self,
        mut rows: Vec<HistoryRow>,
        range: &Range,
    ) -> Vec<(&'static str, Vec<Aggregate>)> {
        rows.retain(|r| !r.attr.is_empty());
        // Series by series (first seen first), each oldest first.
        let mut order: Vec<(String, String)> = Vec::new();
        let mut series: BTreeMap<(String, String), Vec<HistoryRow>> = BTreeMap::new();
        for row in rows {
            let key = (row.entity_id.clone(), row.attr.clone());
            if !series.contains_key(&key) {
                order.push(key.clone());
            }
            series.entry(key).or_default().push(row);
        }
        // Without timeAt, an entity's periods start at its first instance.
        let mut first: BTreeMap<&str, i64> = BTreeMap::new();
        for ((entity, _), instances) in &series {
            for r in instances {
                let t = first.entry(entity.as_str()).or_insert(r.time);
                *t = (*t).min(r.time);
            }
        }
        let first: BTreeMap<String, i64> =
            first.into_iter().map(|(e, t)| (e.to_string(), t)).collect();
        let mut out: Vec<(&'static str, Vec<Aggregate>)> =
            self.methods.iter().map(|(n, _)| (*n, Vec::new())).collect();
        for key in order {
            let Some(mut instances) = series.remove(&key) else {
                continue;
            };
            instances.sort_by_key(|r| (r.time, r.instance));
            let origin = range.origin.or_else(|| first.get(&key.0).copied());
            for (start, end, bucket) in self.buckets(&instances, origin, range) {
                for ((_, method), (_, list)) in self.methods.iter().zip(out.iter_mut()) {
                    list.push(Aggregate {
                        entity_id: bucket[0].entity_id.clone(),
                        entity_type: bucket[0].entity_type.clone(),
                        attr: bucket[0].attr.clone(),
                        start,
                        end,
                        value: compute(*method, bucket),
                    });
                }
            }
        }
        out
    }

    /// A series' instances (oldest first) cut into the periods from
    /// `origin` (its first instance if `None`) that hold some: (start,
    /// end, instances).
    fn buckets<'r>(
        &self,
        instances: &'r [HistoryRow],
        origin: Option<i64>,
        range: &Range,
    ) -> Vec<(i64, i64, &'r [HistoryRow])> {
        let Some(first) = instances.first() else {
            return Vec::new();
        };
        let origin = origin.unwrap_or(first.time).min(first.time);
        let Some((months, millis)) = self.period.step() else {
            return vec![(first.time, whole_range_end(range), instances)];
        };
        // Fixed steps jump to the period holding the first instance.
        let origin = if months == 0 && millis > 0 {
            origin + (first.time - origin) / millis * millis
        } else {
            origin
        };
        let next = |start: i64| add_months(start, months) + millis;
        let mut out = Vec::new();
        let (mut start, mut i) = (origin, 0);
        while i < instances.len() {
            let end = next(start);
            if end <= start {
                break;
            }
            let j = i + instances[i..].iter().take_while(|r| r.time < end).count();
            if j > i {
                out.push((start, end, &instances[i..j]));
            }
            i = j;
            start = end;
        }
        out
    }
}

/// One method over one bucket's instances.
fn compute(method: Method, rows: &[HistoryRow]) -> Value {
    let numbers: Vec<f64> = rows.iter().filter_map(|r| r.number).collect();
    let n = numbers.len() as f64;
    let number = |v: f64| if v.is_finite() { json!(v) } else { Value::Null };
    match method {
        Method::Rollup(AggrMethod::Count) => json!(rows.len()),
        Method::DistinctCount => {
            let distinct: std::collections::HashSet<&str> =
                rows.iter().map(|r| r.value.as_str()).collect();
            json!(distinct.len())
        }
        _ if numbers.is_empty() => Value::Null,
        Method::Rollup(AggrMethod::Sum) => number(numbers.iter().sum()),
        Method::Rollup(AggrMethod::Avg) => number(numbers.iter().sum::<f64>() / n),
        Method::Rollup(AggrMethod::Min) => {
            number(numbers.iter().copied().fold(f64::INFINITY, f64::min))
        }
        Method::Rollup(AggrMethod::Max) => {
            number(numbers.iter().copied().fold(f64::NEG_INFINITY, f64::max))
        }
        Method::Sumsq => number(numbers.iter().map(|v| v * v).sum()),
        Method::Stddev => {
            if numbers.len() < 2 {
                return json!(0.0);
            }
            let mean = numbers.iter().sum::<f64>() / n;
            let squares: f64 = numbers.iter().map(|v| (v - mean) * (v - mean)).sum();
            number((squares / (n - 1.0)).sqrt())
        }
    }
}

/// `aggrPeriodDuration`: an ISO 8601 duration (`P1D`, `PT15M`,
/// `P1Y2M`, `P2W`). One calendar unit is bucketed as the rollups are;
/// others from the range's start; months with days or times together are
/// not supported.
fn period(text: &str) -> Result<Period> {
    let bad = || {
        Error(LdError::bad_request(format!(
            "aggrPeriodDuration is an ISO 8601 duration: {text}"
        )))
    };
    let rest = text
        .strip_prefix('P')
        .filter(|r| !r.is_empty())
        .ok_or_else(bad)?;
    let (date, time) = match rest.split_once('T') {
        Some((d, t)) if !t.is_empty() => (d, t),
        Some(_) => return Err(bad()),
        None => (rest, ""),
    };
    let (mut months, mut millis) = (0u32, 0i64);
    let mut read = |part: &str, units: &[(char, i64, bool)]| -> Result<()> {
        let mut number = String::new();
        for c in part.chars() {
            if c.is_ascii_digit() || c == '.' {
                number.push(c);
                continue;
            }
            let (_, scale, is_months) = units.iter().find(|(u, _, _)| *u == c).ok_or_else(bad)?;
            let n: f64 = number.parse().map_err(|_| bad())?;
            number.clear();
            if *is_months {
                months = months.saturating_add((n * *scale as f64) as u32);
            } else {
                millis = millis.saturating_add((n * *scale as f64) as i64);
            }
        }
        if number.is_empty() {
            Ok(())
        } else {
            Err(bad())
        }
    };
    read(
        date,
        &[
            ('Y', 12, true),
            ('M', 1, true),
            ('W', 604_800_000, false),
            ('D', 86_400_000, false),
        ],
    )?;
    read(
        time,
        &[
            ('H', 3_600_000, false),
            ('M', 60_000, false),
            ('S', 1_000, false),
        ],
    )?;
    Ok(match (months, millis) {
        (0, 0) => Period::Whole,
        (12, 0) => Period::Calendar(AggrPeriod::Year),
        (1, 0) => Period::Calendar(AggrPeriod::Month),
        (0, 86_400_000) => Period::Calendar(AggrPeriod::Day),
        (0, 3_600_000) => Period::Calendar(AggrPeriod::Hour),
        (0, 60_000) => Period::Calendar(AggrPeriod::Minute),
        (0, 1_000) => Period::Calendar(AggrPeriod::Second),
        (m, 0) => Period::Every {
            months: m,
            millis: 0,
        },
        (0, ms) => Period::Every {
            months: 0,
            millis: ms,
        },
        _ => {
            return Err(Error(LdError::new(
                ErrorKind::OperationNotSupported,
                format!(
                "aggrPeriodDuration {text}: months together with days or times are not supported"
            ),
            )))
        }
    })
}

/// Whether `time` starts a bucket of `unit`.
fn aligned(time: i64, unit: AggrPeriod) -> bool {
    use chrono::{DateTime, Datelike, Timelike, Utc};
    let Some(t) = DateTime::<Utc>::from_timestamp_millis(time) else {
        return false;
    };
    let midnight = t.num_seconds_from_midnight() == 0 && t.timestamp_subsec_millis() == 0;
    match unit {
        AggrPeriod::Second => time.rem_euclid(1_000) == 0,
        AggrPeriod::Minute => time.rem_euclid(60_000) == 0,
        AggrPeriod::Hour => time.rem_euclid(3_600_000) == 0,
        AggrPeriod::Day => midnight,
        AggrPeriod::Month => midnight && t.day() == 1,
        AggrPeriod::Year => midnight && t.day() == 1 && t.month() == 1,
    }
}

/// `time` plus `months` calendar months (UTC).
fn add_months(time: i64, months: u32) -> i64 {
    use chrono::{DateTime, Months, Utc};
    if months == 0 {
        return time;
    }
    DateTime::<Utc>::from_timestamp_millis(time)
        .and_then(|t| t.checked_add_months(Months::new(months)))
        .map_or(i64::MAX, |t| t.timestamp_millis())
}

/// Where the whole range ends: after its last instant, or now when it
/// has none.
fn whole_range_end(range: &Range) -> i64 {
    range.to.map_or_else(weft_model::now_ms, |to| to + 1)
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
    if existed {
        replace_instances(&state, &req, id, map).await?;
    }
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
    super::entities::check_id(&id)?;
    delete_history(&state, &req, &id, Vec::new()).await
}

/// "Delete Attribute from Temporal Representation"
/// (`DELETE /ngsi-ld/v1/temporal/entities/{id}/attrs/{attrId}`): every
/// instance of the attribute leaves the history; the entity's other
/// attributes and its current state stay.
pub async fn delete_attr(
    State(state): State<AppState>,
    req: LdRequest,
    Path((id, attr)): Path<(String, String)>,
) -> Result<Response> {
    let stored = req.context.to_stored(&attr);
    delete_history(&state, &req, &id, vec![stored]).await
}

/// Deletes entity `id`'s history, of `attrs` only when some are named:
/// 204, or 404 when there was none.
async fn delete_history(
    state: &AppState,
    req: &LdRequest,
    id: &str,
    attrs: Vec<String>,
) -> Result<Response> {
    state.services.history.settle().await;
    let deleted = state
        .services
        .store
        .delete_history(&HistoryDelete {
            tenant: req.tenant.clone(),
            entity_id: Some(id.to_string()),
            attrs,
            ..HistoryDelete::default()
        })
        .await
        .map_err(store_error)?;
    if deleted == 0 {
        return Err(Error(LdError::not_found(format!(
            "no such history of an entity with id {id}"
        ))));
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Deletes the instances of entity `id`'s history that those of `map`
/// replace: of the same attribute and dataset, observed at the same
/// time (an upsert of a temporal representation sends them again).
async fn replace_instances(
    state: &AppState,
    req: &LdRequest,
    id: &str,
    map: &Map<String, Value>,
) -> Result<()> {
    state.services.history.settle().await;
    for (name, instance) in instances(map) {
        let Some(at) = instance
            .get(entity::OBSERVED_AT)
            .and_then(Value::as_str)
            .and_then(parse_datetime)
        else {
            continue;
        };
        let dataset = entity::dataset_of(instance)?;
        let stored = req.context.to_stored(name);
        state
            .services
            .store
            .delete_history(&HistoryDelete {
                tenant: req.tenant.clone(),
                entity_id: Some(id.to_string()),
                attrs: vec![entity::instance_name(&stored, dataset.as_deref())],
                from: Some(at),
                to: Some(at),
                ..HistoryDelete::default()
            })
            .await
            .map_err(store_error)?;
    }
    Ok(())
}

/// The attribute instances of a temporal representation: each member
/// but the id, the type and the context, one per instance of an array.
fn instances(map: &Map<String, Value>) -> impl Iterator<Item = (&String, &Value)> {
    map.iter()
        .filter(|(name, _)| !matches!(name.as_str(), "id" | "@id" | "type" | "@type" | "@context"))
        .flat_map(|(name, value)| {
            let items: Vec<&Value> = match value {
                Value::Array(items) => items.iter().collect(),
                one => vec![one],
            };
            items.into_iter().map(move |instance| (name, instance))
        })
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
    for (name, instance) in instances(map) {
        let dataset = entity::dataset_of(instance)?;
        let attr = entity::parse_attribute(name, instance, &req.context)?;
        let stored = req.context.to_stored(name);
        let mut state_of = Entity::new(id, entity_type);
        state_of
            .attrs
            .insert(entity::instance_name(&stored, dataset.as_deref()), attr);
        states.push(NotifiedEntity::from(state_of));
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
    // An attribute's instances (`datasetId`) are series of their own,
    // named after it: all are read, those of other attributes dropped.
    let mut rows = state
        .services
        .store
        .query_history(&HistoryQuery {
            tenant: req.tenant.clone(),
            entity_ids,
            entity_type,
            from: range.from,
            to: range.to,
            last_n: range.last_n,
            limit: MAX_INSTANCES,
            ..HistoryQuery::default()
        })
        .await
        .map_err(store_error)?;
    if !attrs.is_empty() {
        rows.retain(|r| {
            r.attr.is_empty() || attrs.iter().any(|a| a == entity::split_instance(&r.attr).0)
        });
    }
    Ok(rows)
}

fn store_error(e: StoreError) -> Error {
    Error(LdError::new(
        weft_model::ngsi_ld::ErrorKind::InternalError,
        format!("reading the history failed: {e}"),
    ))
}

/// The rows as temporal entities, in the order the entities first
/// appear; each attribute's instances oldest first.
fn render(req: &LdRequest, params: &LdParams, mut rows: Vec<HistoryRow>) -> Vec<Value> {
    let simplified = params.option("temporalValues");
    if let Some(datasets) = params.list("datasetId") {
        // Only the instances of the datasets named (`@none`: the default).
        rows.retain(|r| {
            let dataset = entity::split_instance(&r.attr)
                .1
                .unwrap_or(entity::NO_DATASET);
            r.attr.is_empty() || datasets.iter().any(|d| d == dataset)
        });
    }
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
                let (base, dataset) = entity::split_instance(&name);
                let mut shown = attribute(&instances, simplified);
                if let Some(dataset) = dataset {
                    mark_dataset(&mut shown, dataset);
                }
                let key = req.context.from_stored(base);
                // The instances of every datasetId of one attribute
                // together: one list of instances, or one simplified
                // object per datasetId.
                match (out.remove(&key), shown) {
                    (None, shown) => {
                        out.insert(key, shown);
                    }
                    (Some(Value::Array(mut before)), Value::Array(more)) => {
                        before.extend(more);
                        out.insert(key, Value::Array(before));
                    }
                    (Some(Value::Array(mut before)), one) => {
                        before.push(one);
                        out.insert(key, Value::Array(before));
                    }
                    (Some(before), one) => {
                        out.insert(key, Value::Array(vec![before, one]));
                    }
                }
            }
            Some(Value::Object(out))
        })
        .collect()
}

/// Marks an attribute's temporal rendering (a list of instances, or a
/// simplified object) with its `datasetId`.
fn mark_dataset(shown: &mut Value, dataset: &str) {
    let mark = |v: &mut Value| {
        if let Value::Object(m) = v {
            m.insert("datasetId".into(), Value::String(dataset.to_string()));
        }
    };
    match shown {
        Value::Array(items) => items.iter_mut().for_each(mark),
        one => mark(one),
    }
}

/// One attribute's instances, normalized or simplified.
fn attribute(instances: &[HistoryRow], simplified: bool) -> Value {
    let kind = AttrKind::of_stored(instances.last().map_or("", |r| r.attr_type.as_str()));
    let value_of = |r: &HistoryRow| serde_json::from_str(&r.value).unwrap_or(Value::Null);
    if simplified {
        let member = kind.values_member();
        // A value that is not a bare value or object id is named by its
        // member (`[{"languageMap": {…}}, time]`).
        let wrapped = !matches!(
            kind,
            AttrKind::Property | AttrKind::Relationship | AttrKind::GeoProperty
        );
        let values: Vec<Value> = instances
            .iter()
            .map(|r| {
                let value = if wrapped {
                    json!({kind.value_member(): value_of(r)})
                } else {
                    value_of(r)
                };
                json!([value, instant(r.time)])
            })
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
                    "observedAt": instant(r.time),
                })
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_calendar_units_or_fixed_steps() {
        let p = |t: &str| period(t).map_err(|e| e.0.kind);
        assert_eq!(p("P1D"), Ok(Period::Calendar(AggrPeriod::Day)));
        assert_eq!(p("PT1M"), Ok(Period::Calendar(AggrPeriod::Minute)));
        assert_eq!(p("P1Y"), Ok(Period::Calendar(AggrPeriod::Year)));
        assert_eq!(p("P0D"), Ok(Period::Whole));
        assert_eq!(
            p("PT15M"),
            Ok(Period::Every {
                months: 0,
                millis: 900_000
            })
        );
        assert_eq!(
            p("P1W"),
            Ok(Period::Every {
                months: 0,
                millis: 604_800_000
            })
        );
        assert_eq!(
            p("P1Y6M"),
            Ok(Period::Every {
                months: 18,
                millis: 0
            })
        );
        assert_eq!(p("P1MT1H"), Err(ErrorKind::OperationNotSupported));
        for bad in ["1D", "P", "PT", "P1X", "PT1", "P1DT"] {
            assert_eq!(p(bad), Err(ErrorKind::BadRequestData), "{bad}");
        }
    }

    #[test]
    fn periods_start_at_their_origin_and_skip_empty_ones() {
        let hour = 3_600_000;
        let row = |time: i64| HistoryRow {
            tenant: String::new(),
            service_path: "/".into(),
            entity_id: "urn:a:1".into(),
            entity_type: "T".into(),
            attr: "x".into(),
            attr_type: "Property".into(),
            time,
            instance: 0,
            value: "1".into(),
            number: Some(1.0),
        };
        let aggregation = Aggregation {
            methods: vec![("max", Method::Rollup(AggrMethod::Max))],
            period: Period::Calendar(AggrPeriod::Hour),
        };
        let range = Range {
            from: None,
            to: None,
            last_n: None,
            origin: None,
        };
        // 00:03, 00:30, 03:10: hours from 00:03; the empty ones left out.
        let rows = [row(180_000), row(1_800_000), row(3 * hour + 600_000)];
        let spans: Vec<(i64, i64, usize)> = aggregation
            .buckets(&rows, None, &range)
            .into_iter()
            .map(|(start, end, b)| (start, end, b.len()))
            .collect();
        assert_eq!(
            spans,
            [
                (180_000, hour + 180_000, 2),
                (3 * hour + 180_000, 4 * hour + 180_000, 1)
            ]
        );
        // From a timeAt long before: the step lands on the first period.
        let from_origin = aggregation.buckets(&rows, Some(180_000 - 1000 * hour), &range);
        assert_eq!(from_origin[0].0, 180_000);
    }

    #[test]
    fn calendar_alignment() {
        let t = |s: &str| parse_datetime(s).unwrap();
        assert!(aligned(t("2024-05-01T00:00:00Z"), AggrPeriod::Month));
        assert!(!aligned(t("2024-05-02T00:00:00Z"), AggrPeriod::Month));
        assert!(aligned(t("2024-05-02T00:00:00Z"), AggrPeriod::Day));
        assert!(!aligned(t("2024-05-02T00:00:01Z"), AggrPeriod::Minute));
        assert!(aligned(t("2024-01-01T00:00:00Z"), AggrPeriod::Year));
    }

    #[test]
    fn methods_over_instances() {
        let row = |value: &str, number: Option<f64>| HistoryRow {
            tenant: String::new(),
            service_path: "/".into(),
            entity_id: "urn:a:1".into(),
            entity_type: "T".into(),
            attr: "x".into(),
            attr_type: "Property".into(),
            time: 0,
            instance: 0,
            value: value.into(),
            number,
        };
        let rows = [
            row("1", Some(1.0)),
            row("1", Some(1.0)),
            row("4", Some(4.0)),
            row("\"a\"", None),
        ];
        assert_eq!(compute(Method::Rollup(AggrMethod::Count), &rows), json!(4));
        assert_eq!(compute(Method::DistinctCount, &rows), json!(3));
        assert_eq!(compute(Method::Sumsq, &rows), json!(18.0));
        assert_eq!(compute(Method::Rollup(AggrMethod::Max), &rows), json!(4.0));
        assert_eq!(compute(Method::Stddev, &rows[..2]), json!(0.0));
        assert_eq!(compute(Method::Sumsq, &rows[3..]), Value::Null);
    }
}
