//! `/ngsi-ld/v1/jsonldContexts` (clause 5.13): the `@context`s weft keeps,
//! listed, served and forgotten. The core context is served as `core`;
//! the others are the remote contexts requests named, fetched once and
//! kept by [`weft_pipeline::ld_contexts`].

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use weft_model::ngsi::format_datetime;
use weft_model::ngsi_ld::context::CORE_CONTEXT_JSON;
use weft_model::ngsi_ld::LdError;

use super::{Error, LdParams, Result, LD_JSON};
use crate::AppState;

/// The local identifier the core context is served under.
pub const CORE_ID: &str = "core";

/// "List @contexts" (`GET /ngsi-ld/v1/jsonldContexts`): the URLs of the
/// contexts kept, or with `details=true` each with its local identifier,
/// kind and the time it was fetched.
pub async fn list(State(state): State<AppState>, params: LdParams) -> Result<Response> {
    let kept = state.services.ld_contexts.kept();
    let body = if params.get("details") == Some("true") {
        Value::Array(
            kept.iter()
                .map(|k| {
                    json!({
                        "URL": k.url,
                        "localId": k.local_id,
                        "kind": "Cached",
                        "createdAt": format_datetime(k.fetched_at),
                    })
                })
                .collect(),
        )
    } else {
        json!(kept.iter().map(|k| &k.url).collect::<Vec<_>>())
    };
    Ok((
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response())
}

/// "Serve @context" (`GET /ngsi-ld/v1/jsonldContexts/{id}`): a kept
/// context's document, `core` the built-in core context.
pub async fn serve(State(state): State<AppState>, Path(id): Path<String>) -> Result<Response> {
    let text = if id == CORE_ID {
        CORE_CONTEXT_JSON.to_string()
    } else {
        let (_, doc) = state
            .services
            .ld_contexts
            .by_local_id(&id)
            .ok_or_else(|| Error(LdError::not_found(format!("no @context {id}"))))?;
        doc.to_string()
    };
    Ok(([(header::CONTENT_TYPE, LD_JSON)], text).into_response())
}

/// "Delete @context" (`DELETE /ngsi-ld/v1/jsonldContexts/{id}`): a kept
/// context forgotten (fetched again when a request next names it); the
/// core context cannot be.
pub async fn forget(State(state): State<AppState>, Path(id): Path<String>) -> Result<Response> {
    if id == CORE_ID {
        return Err(Error(LdError::bad_request(
            "the core @context cannot be deleted",
        )));
    }
    if !state.services.ld_contexts.forget(&id) {
        return Err(Error(LdError::not_found(format!("no @context {id}"))));
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}
