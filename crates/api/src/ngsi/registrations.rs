//! Orion's registrations (`/v2/registrations`, `/v2/registrations/{id}`):
//! stored and listed as Orion 3.10 does, with the counters of what was
//! forwarded to their providers (`forwardingInformation`; forwarding
//! itself is [`super::forward`]).
//!
//! Like Orion 3.10, the item route serves GET and DELETE only (Orion never
//! implemented `PATCH /v2/registrations/{id}`; it answers 405), and an id
//! is looked up in the tenant alone, whatever the service path. Listings
//! honour the first `Fiware-ServicePath` (a path or a `/#` subtree).

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::Value;
use weft_model::ngsi::registration::{is_id, new_id, Registration};

use super::entities::listing_response;
use super::error::{Error, Result};
use super::params::{content_type, Params};
use super::tenant::{ServicePath, Tenant, WriteOp};
use crate::AppState;

/// Orion's "List Registrations" (`GET /v2/registrations`), with `limit`,
/// `offset` and `options=count` (`Fiware-Total-Count`).
pub async fn list(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    sp: ServicePath,
    params: Params,
) -> Result<Response> {
    let (limit, offset) = params.paging()?;
    let options = params.options()?;
    // Orion filters registrations by the first service path only.
    let paths: Vec<String> = sp.for_read().into_iter().take(1).collect();
    let registrations = &state.services.registrations;
    let found = registrations.list(&tenant, &paths);
    let page: Vec<Value> = found
        .iter()
        .skip(offset)
        .take(limit)
        .map(|r| {
            let info = registrations.forwarding_info(&tenant, &r.registration.id);
            r.registration.render_with(info.as_ref())
        })
        .collect();
    Ok(listing_response(
        Value::Array(page),
        options.count.then_some(found.len()),
    ))
}

/// Orion's "Create Registration" (`POST /v2/registrations`): 201 with
/// `Location: /v2/registrations/{id}` and no body.
pub async fn create(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    sp: ServicePath,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response> {
    let path = sp.for_write(WriteOp::Update)?;
    if let Some(ct) = content_type(&headers) {
        if ct != "application/json" {
            return Err(Error::unsupported_media_type(&ct));
        }
    }
    let registration = Registration::parse_text(&body, new_id())?;
    let location = format!("/v2/registrations/{}", registration.id);
    state
        .services
        .registrations
        .create(&tenant, &path, registration)
        .await?;
    Ok((StatusCode::CREATED, [("location", location)]).into_response())
}

/// Orion's "Retrieve Registration" (`GET /v2/registrations/{id}`).
pub async fn retrieve(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    _sp: ServicePath,
    _params: Params,
    Path(id): Path<String>,
) -> Result<Response> {
    let registrations = &state.services.registrations;
    let found = registrations.get(&tenant, &normalize(id))?;
    let info = registrations.forwarding_info(&tenant, &found.registration.id);
    Ok(axum::Json(found.registration.render_with(info.as_ref())).into_response())
}

/// Orion's "Delete Registration" (`DELETE /v2/registrations/{id}`): 204.
pub async fn remove(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    _sp: ServicePath,
    Path(id): Path<String>,
) -> Result<Response> {
    state
        .services
        .registrations
        .delete(&tenant, &normalize(id))
        .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Orion reads ids as Mongo ObjectIds, whose hex digits are
/// case-insensitive; anything else matches no registration (404).
fn normalize(id: String) -> String {
    if is_id(&id) {
        id.to_ascii_lowercase()
    } else {
        id
    }
}
