//! Orion's subscriptions (`/v2/subscriptions`): create, list, retrieve,
//! update and delete. The subscriptions themselves (matching, sending,
//! counters) live in the pipeline; this module parses, checks ids and
//! renders.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use bytes::Bytes;
use serde_json::Value;

use super::entities::listing_response;
use super::error::{Error, Result};
use super::params::{json_body, Params};
use super::tenant::{ServicePath, Tenant};
use crate::auth::{sees_secrets, Principal};
use crate::AppState;
use weft_model::secret;
use weft_pipeline::subscriptions::Api;

/// Checks a subscription id in a URL: Orion answers 400 for anything but
/// 24 characters, and 404 for 24 characters that name nothing.
fn check_id(id: &str) -> Result<()> {
    if id.len() != 24 {
        return Err(Error::bad_request(
            "Invalid subscription ID: bad length - 24 chars expected",
        ));
    }
    Ok(())
}

/// `POST /v2/subscriptions`: 201 with `Location: /v2/subscriptions/{id}`.
pub async fn create(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    sp: ServicePath,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response> {
    let value = json_body(&headers, &body)?;
    let paths = match sp.for_read() {
        p if p.is_empty() => vec!["/#".to_string()],
        p => p,
    };
    let id = state
        .services
        .subscriptions
        .create(&tenant, paths, &value)
        .await?;
    Ok((
        StatusCode::CREATED,
        [("location", format!("/v2/subscriptions/{id}"))],
    )
        .into_response())
}

/// `GET /v2/subscriptions`: creation order, `limit`/`offset`,
/// `options=count`.
pub async fn list(
    State(state): State<AppState>,
    caller: Option<Extension<Principal>>,
    Tenant(tenant): Tenant,
    params: Params,
) -> Result<Response> {
    let options = params.options()?;
    let (limit, offset) = params.paging()?;
    state.services.subscriptions.sync_counters(&tenant).await;
    let mut all = state.services.subscriptions.list(&tenant);
    if !sees_secrets(&state, caller.as_deref()) {
        all.iter_mut().for_each(secret::mask_subscription);
    }
    let total = all.len();
    let page: Vec<Value> = all.into_iter().skip(offset).take(limit).collect();
    Ok(listing_response(
        Value::Array(page),
        options.count.then_some(total),
    ))
}

/// `GET /api/v1/subscriptions/delivery`: how each subscription of the
/// tenant is being delivered (weft's own: Orion has no such thing), in
/// creation order: `{"id", "fromLog", "owed", "oldestOwed", "failing"}`
/// (the last two only when there is something to say).
pub async fn deliveries(State(state): State<AppState>, Tenant(tenant): Tenant) -> Result<Response> {
    let reports = state.services.subscriptions.deliveries(Some(&tenant)).await;
    let body: Vec<Value> = reports
        .into_iter()
        .map(|d| {
            let mut v = serde_json::json!({"id": d.id, "fromLog": d.from_log, "owed": d.owed});
            if let Some(at) = d.oldest_owed {
                v["oldestOwed"] = weft_model::ngsi::format_datetime(at).into();
            }
            if let Some(reason) = d.failing {
                v["failing"] = reason.into();
            }
            if d.dropped > 0 {
                v["dropped"] = d.dropped.into();
            }
            v
        })
        .collect();
    Ok(axum::Json(body).into_response())
}

/// `GET /v2/subscriptions/{id}`.
pub async fn retrieve(
    State(state): State<AppState>,
    caller: Option<Extension<Principal>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> Result<Response> {
    check_id(&id)?;
    state.services.subscriptions.sync_counters(&tenant).await;
    let mut json = state.services.subscriptions.get(&tenant, &id)?;
    if !sees_secrets(&state, caller.as_deref()) {
        secret::mask_subscription(&mut json);
    }
    Ok(axum::Json(json).into_response())
}

/// `PATCH /v2/subscriptions/{id}`: replaces the fields given.
pub async fn update(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response> {
    check_id(&id)?;
    let value = json_body(&headers, &body)?;
    state
        .services
        .subscriptions
        .patch(&tenant, &id, &value)
        .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `DELETE /v2/subscriptions/{id}`.
pub async fn remove(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> Result<Response> {
    check_id(&id)?;
    state
        .services
        .subscriptions
        .delete(&tenant, &id, Api::NgsiV2)
        .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
