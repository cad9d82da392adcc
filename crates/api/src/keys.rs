//! `/api/v1/keys`: API keys are made, listed, shown and revoked here (admin
//! keys only, see [`crate::auth`]). A key's secret is in the answer to its
//! creation and nowhere else, ever: the store keeps only its SHA-256.
//!
//! An admin key sees and manages the keys of its own tenant (and service
//! path) only; a global admin key (default tenant, no service path)
//! manages all of them.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::{Extension, Json};
use bytes::Bytes;
use serde_json::{json, Value};
use weft_model::apikey::{normalize_service_path, path_within, ApiKey};
use weft_pipeline::keys::{KeyError, NewKey};

use crate::auth::Principal;
use crate::routes::{get, post, Access, Routes, Scope};
use crate::{ApiError, ApiResult, AppState};

/// The keys routes: admin keys of any tenant, each managing only the
/// keys it may ([`manages`]).
pub fn routes() -> Routes {
    const ADMIN: Access = Access::admin(Scope::Keys);
    Routes::new()
        .route("/api/v1/keys", get(ADMIN, list).post(ADMIN, create))
        .route("/api/v1/keys/{id}", get(ADMIN, show).delete(ADMIN, revoke))
        .route("/api/v1/keys/{id}/revoke", post(ADMIN, revoke_post))
}

/// Whether the caller (none: authentication is off, anything goes) may
/// see and manage `key`.
fn manages(caller: Option<&Principal>, key: &ApiKey) -> bool {
    let Some(caller) = caller else { return true };
    let me = caller.key();
    if me.is_global() {
        return true;
    }
    me.tenant == key.tenant
        && match (&me.service_path, &key.service_path) {
            (None, _) => true,
            (Some(mine), Some(theirs)) => path_within(mine, theirs),
            (Some(_), None) => false,
        }
}

fn not_found(id: &str) -> ApiError {
    ApiError::not_found(format!("no API key '{id}'"))
}

/// `POST /api/v1/keys`: 201 with the record and, once, the secret in
/// `key`. A non-global admin's new key stays in its tenant and service
/// path (given its own when the body names none).
async fn create(
    State(state): State<AppState>,
    caller: Option<Extension<Principal>>,
    body: Bytes,
) -> ApiResult<impl IntoResponse> {
    let mut spec: NewKey = weft_model::validate::parse_definition(&body)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    if let Some(Extension(caller)) = &caller {
        let me = caller.key();
        if !me.is_global() {
            if spec.tenant.is_empty() {
                spec.tenant = me.tenant.clone();
            }
            if let (Some(mine), None) = (&me.service_path, &spec.service_path) {
                spec.service_path = Some(mine.clone());
            }
            let path = match spec.service_path.as_deref() {
                Some(p) => Some(normalize_service_path(p).map_err(ApiError::bad_request)?),
                None => None,
            };
            let within = spec.tenant.eq_ignore_ascii_case(&me.tenant)
                && match (&me.service_path, &path) {
                    (None, _) => true,
                    (Some(mine), Some(p)) => path_within(mine, p),
                    (Some(_), None) => false,
                };
            if !within {
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    "Forbidden",
                    "an admin key may only make keys of its own tenant and service path",
                ));
            }
        }
    }
    let (key, secret) = state.keys.create(spec).await.map_err(|e| match e {
        KeyError::Invalid(text) => ApiError::bad_request(text),
        KeyError::Store(s) => s.into(),
    })?;
    let mut body = key.public_json();
    body["key"] = json!(secret);
    Ok((StatusCode::CREATED, Json(body)))
}

/// `GET /api/v1/keys`: `{"keys":[…]}`, by id, without secrets.
async fn list(State(state): State<AppState>, caller: Option<Extension<Principal>>) -> Json<Value> {
    let caller = caller.as_ref().map(|Extension(p)| p);
    let keys: Vec<Value> = state
        .keys
        .list()
        .iter()
        .filter(|k| manages(caller, k))
        .map(ApiKey::public_json)
        .collect();
    Json(json!({ "keys": keys }))
}

/// `GET /api/v1/keys/{id}`.
async fn show(
    State(state): State<AppState>,
    caller: Option<Extension<Principal>>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let caller = caller.as_ref().map(|Extension(p)| p);
    let key = state
        .keys
        .get(&id)
        .filter(|k| manages(caller, k))
        .ok_or_else(|| not_found(&id))?;
    Ok(Json(key.public_json()))
}

/// Revokes a key the caller manages; its record.
async fn revoke_key(state: &AppState, caller: Option<&Principal>, id: &str) -> ApiResult<ApiKey> {
    if !state.keys.get(id).is_some_and(|k| manages(caller, &k)) {
        return Err(not_found(id));
    }
    state.keys.revoke(id).await?.ok_or_else(|| not_found(id))
}

/// `DELETE /api/v1/keys/{id}`: revokes it (204); it stops working at
/// once. The record stays, listed with `revokedAt`.
async fn revoke(
    State(state): State<AppState>,
    caller: Option<Extension<Principal>>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    revoke_key(&state, caller.as_ref().map(|Extension(p)| p), &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /api/v1/keys/{id}/revoke`: the same, answering the record.
async fn revoke_post(
    State(state): State<AppState>,
    caller: Option<Extension<Principal>>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let key = revoke_key(&state, caller.as_ref().map(|Extension(p)| p), &id).await?;
    Ok(Json(key.public_json()))
}
