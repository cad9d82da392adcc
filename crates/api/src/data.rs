//! `/api/v1/data` (stored data units, paged by an opaque cursor) and
//! `/api/v1/uplinks/failed` (uplinks that produced no unit, with reasons).
//! Units are returned as the JSON stored, never re-serialised.

use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::response::IntoResponse;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use weft_store::{DataQuery, FailedQuery};

use crate::routes::{get, Access, Routes, Scope::Own};
use crate::{ApiError, ApiResult, AppState};

/// Page size when `limit` is not given.
const DEFAULT_LIMIT: usize = 100;
/// Largest page a client may ask for.
const MAX_LIMIT: usize = 10_000;

/// The data routes, all reads.
pub fn routes() -> Routes {
    Routes::new()
        .route("/api/v1/data", get(Access::read(Own), list_data))
        .route("/api/v1/data/{data_id}", get(Access::read(Own), get_data))
        .route(
            "/api/v1/uplinks/failed",
            get(Access::read(Own), list_failed),
        )
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DataParams {
    device: Option<String>,
    channel: Option<String>,
    #[serde(rename = "type")]
    device_type: Option<String>,
    from: Option<i64>,
    to: Option<i64>,
    limit: Option<usize>,
    after: Option<String>,
}

fn limit(given: Option<usize>) -> ApiResult<usize> {
    match given.unwrap_or(DEFAULT_LIMIT) {
        0 => Err(ApiError::bad_request("limit must be at least 1")),
        n => Ok(n.min(MAX_LIMIT)),
    }
}

fn cursor(after: Option<&str>) -> ApiResult<Option<u64>> {
    after
        .filter(|a| !a.is_empty())
        .map(|a| {
            a.parse::<u64>()
                .map_err(|_| ApiError::bad_request("after must be a cursor returned as 'next'"))
        })
        .transpose()
}

/// `GET /api/v1/data`: `{"units":[…],"next":"<cursor>"|null}`, oldest
/// first; pass `next` as `after` for the following page.
async fn list_data(
    State(state): State<AppState>,
    params: Result<Query<DataParams>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<impl IntoResponse> {
    let Query(p) = params.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let query = DataQuery {
        device: p.device,
        channel: p.channel,
        device_type: p.device_type,
        from: p.from,
        to: p.to,
        after: cursor(p.after.as_deref())?,
        limit: limit(p.limit)?,
        partitions: None,
    };
    let rows = state.services.store.query_data(&query).await?;
    let next = match rows.last() {
        Some(last) if rows.len() == query.limit => format!("\"{}\"", last.seq),
        _ => "null".to_string(),
    };
    let mut body = String::with_capacity(rows.iter().map(|r| r.json.len() + 1).sum::<usize>() + 32);
    body.push_str("{\"units\":[");
    for (i, row) in rows.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        body.push_str(&row.json);
    }
    body.push_str("],\"next\":");
    body.push_str(&next);
    body.push('}');
    Ok(([(header::CONTENT_TYPE, "application/json")], body))
}

/// `GET /api/v1/data/{dataId}`.
async fn get_data(
    State(state): State<AppState>,
    Path(data_id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    let row = state
        .services
        .store
        .get_data(&data_id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no data unit '{data_id}'")))?;
    Ok(([(header::CONTENT_TYPE, "application/json")], row.json))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FailedParams {
    channel: Option<String>,
    #[serde(rename = "type")]
    device_type: Option<String>,
    limit: Option<usize>,
    after: Option<String>,
}

/// `GET /api/v1/uplinks/failed`: `{"failures":[…],"next":…}`, oldest first.
async fn list_failed(
    State(state): State<AppState>,
    params: Result<Query<FailedParams>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<Value>> {
    let Query(p) = params.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let query = FailedQuery {
        after: cursor(p.after.as_deref())?,
        device_type: p.device_type,
        channel: p.channel,
        limit: limit(p.limit)?,
    };
    let rows = state.services.store.query_failed(&query).await?;
    let next = match rows.last() {
        Some(last) if rows.len() == query.limit => json!(last.seq.to_string()),
        _ => Value::Null,
    };
    Ok(Json(json!({"failures": rows, "next": next})))
}
