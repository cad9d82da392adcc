//! `/ngsi-ld/v1/jsonldContexts` (clause 5.13): the `@context`s weft keeps,
//! added, listed, served and deleted. The core context is served as
//! `core`; the others are the contexts clients gave weft to host and the
//! remote contexts requests named, fetched once and kept, both by
//! [`weft_pipeline::ld_contexts`].

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{json, Value};
use weft_model::ngsi::format_datetime;
use weft_model::ngsi_ld::context::CORE_CONTEXT_JSON;
use weft_model::ngsi_ld::{ErrorKind, LdError};
use weft_pipeline::ld_contexts::{KeptContext, Kind, MAX_DOCUMENT_BYTES, SERVED_AT};

use super::{Error, LdParams, Result, LD_JSON};
use crate::ngsi::params::content_type;
use crate::AppState;

/// The local identifier the core context is served under.
pub const CORE_ID: &str = "core";

/// "Add @context" (`POST /ngsi-ld/v1/jsonldContexts`): a JSON-LD document
/// whose `@context` defines terms, hosted from now on (kept across
/// restarts) at `/ngsi-ld/v1/jsonldContexts/{localId}`; 201 with that
/// `Location`. A request whose `Link` names that URL (with any host that
/// reaches weft) reads it without a fetch.
pub async fn add(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response> {
    match content_type(&headers).as_deref() {
        Some(LD_JSON | "application/json") => {}
        other => {
            return Err(Error(LdError::new(
                ErrorKind::UnsupportedMediaType,
                format!(
                    "a context to host is application/ld+json or application/json, not {}",
                    other.unwrap_or("nothing")
                ),
            )))
        }
    }
    if body.len() > MAX_DOCUMENT_BYTES {
        return Err(Error(LdError::bad_request(format!(
            "a context to host is {MAX_DOCUMENT_BYTES} bytes at most"
        ))));
    }
    let doc = weft_model::json::parse_within_limits(&body)
        .map_err(|e| LdError::invalid(format!("the body is not JSON: {e}")))?;
    let hosted = state.services.ld_contexts.host(doc).await?;
    Ok((StatusCode::CREATED, [(header::LOCATION, hosted.url)]).into_response())
}

/// "List @contexts" (`GET /ngsi-ld/v1/jsonldContexts`): the URLs of the
/// contexts kept (`kind=Hosted|Cached` for one kind), or with
/// `details=true` each with its local identifier, kind and the time it
/// was given or fetched.
pub async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
    params: LdParams,
) -> Result<Response> {
    let wanted = match params.get("kind") {
        None => None,
        Some("Hosted") => Some(Kind::Hosted),
        Some("Cached") => Some(Kind::Cached),
        // weft creates none implicitly.
        Some("ImplicitlyCreated") => return Ok(json_answer(json!([]))),
        Some(other) => {
            return Err(Error(LdError::bad_request(format!(
                "kind is Hosted, Cached or ImplicitlyCreated, not {other}"
            ))))
        }
    };
    let kept: Vec<KeptContext> = state
        .services
        .ld_contexts
        .kept()
        .into_iter()
        .filter(|k| wanted.is_none_or(|w| k.kind == w))
        .collect();
    let details = params.get("details") == Some("true");
    let body = Value::Array(
        kept.iter()
            .map(|k| {
                let url = Value::String(shown_url(&headers, k));
                if details {
                    describe(k, url)
                } else {
                    url
                }
            })
            .collect(),
    );
    Ok(json_answer(body))
}

/// "Serve @context" (`GET /ngsi-ld/v1/jsonldContexts/{id}`): a kept
/// context's document, `core` the built-in core context; with
/// `details=true`, what is known of it instead.
pub async fn serve(
    State(state): State<AppState>,
    headers: HeaderMap,
    params: LdParams,
    Path(id): Path<String>,
) -> Result<Response> {
    if id == CORE_ID {
        return Ok((
            [(header::CONTENT_TYPE, "application/json")],
            CORE_CONTEXT_JSON,
        )
            .into_response());
    }
    let (info, doc) = state
        .services
        .ld_contexts
        .by_local_id(&id)
        .ok_or_else(|| Error(LdError::not_found(format!("no @context {id}"))))?;
    if params.get("details") == Some("true") {
        let url = Value::String(shown_url(&headers, &info));
        return Ok(json_answer(describe(&info, url)));
    }
    Ok(json_answer((*doc).clone()))
}

/// "Delete and Reload @context" (`DELETE /ngsi-ld/v1/jsonldContexts/{id}`):
/// a kept context forgotten (a cached one is fetched again when a request
/// next names it), or with `reload=true` a cached one fetched again now;
/// the core context cannot be deleted.
pub async fn forget(
    State(state): State<AppState>,
    params: LdParams,
    Path(id): Path<String>,
) -> Result<Response> {
    if id == CORE_ID {
        return Err(Error(LdError::bad_request(
            "the core @context cannot be deleted",
        )));
    }
    let contexts = &state.services.ld_contexts;
    if params.get("reload") == Some("true") {
        return match contexts.reload(&id).await? {
            Some(()) => Ok(StatusCode::NO_CONTENT.into_response()),
            None if contexts.by_local_id(&id).is_some() => Err(Error(LdError::bad_request(
                "only a cached @context is reloaded",
            ))),
            None => Err(Error(LdError::not_found(format!("no @context {id}")))),
        };
    }
    if !contexts.forget(&id).await? {
        return Err(Error(LdError::not_found(format!("no @context {id}"))));
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// A kept context as `details=true` shows it.
fn describe(k: &KeptContext, url: Value) -> Value {
    json!({
        "URL": url,
        "localId": k.local_id,
        "kind": k.kind.as_str(),
        "createdAt": format_datetime(k.created_at),
    })
}

/// The URL a kept context is named by: a cached one's own; a hosted one
/// where this request reached weft (`X-Forwarded-Proto` says `https`
/// behind a proxy that ends TLS).
fn shown_url(headers: &HeaderMap, k: &KeptContext) -> String {
    if k.kind != Kind::Hosted {
        return k.url.clone();
    }
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let scheme = headers
        .get("x-forwarded-proto")
        .and_then(|h| h.to_str().ok())
        .filter(|p| *p == "https")
        .unwrap_or("http");
    match host {
        Some(host) => format!("{scheme}://{host}{SERVED_AT}{}", k.local_id),
        None => k.url.clone(),
    }
}

fn json_answer(body: Value) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}
