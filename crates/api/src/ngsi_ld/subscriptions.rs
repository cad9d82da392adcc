//! NGSI-LD subscriptions (`/ngsi-ld/v1/subscriptions`, clause 5.8):
//! create, query, retrieve, update and delete. A subscription is read by
//! the model ([`weft_model::ngsi_ld::subscription`]) into the registry
//! NGSIv2's subscriptions live in, which matches and notifies both
//! ([`weft_pipeline::subscriptions`]); each API sees only its own.

use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::Value;
use weft_model::ngsi_ld::subscription as ld;
use weft_pipeline::subscriptions::Api;

use super::entities::{check_id, encode_segment, paging};
use super::{Error, LdParams, LdRequest, Result};
use crate::AppState;

/// "Create Subscription" (`POST /ngsi-ld/v1/subscriptions`): 201 with
/// its `Location`; an id the tenant has is `AlreadyExists`.
pub async fn create(
    State(state): State<AppState>,
    mut req: LdRequest,
    body: Bytes,
) -> Result<Response> {
    let value = req.body(&body).await?;
    let id = format!("urn:ngsi-ld:Subscription:{}", uuid::Uuid::new_v4());
    let sub = ld::parse(&value, req.context.clone(), id, weft_model::now_ms())?;
    if let Some(url) = sub.ld.as_ref().and_then(|ld| ld.jsonld_context.as_deref()) {
        context_available(&state, url).await?;
    }
    let id = state
        .services
        .subscriptions
        .insert(&req.tenant, Vec::new(), sub)
        .await?;
    let location = format!("/ngsi-ld/v1/subscriptions/{}", encode_segment(&id));
    Ok((StatusCode::CREATED, [(header::LOCATION, location)]).into_response())
}

/// "Query Subscriptions" (`GET /ngsi-ld/v1/subscriptions`): the tenant's
/// NGSI-LD subscriptions in creation order, paged by `limit` and
/// `offset`, counted with `count=true`.
pub async fn query(
    State(state): State<AppState>,
    req: LdRequest,
    params: LdParams,
) -> Result<Response> {
    let (limit, offset) = paging(&params)?;
    let subscriptions = &state.services.subscriptions;
    subscriptions.sync_counters(&req.tenant).await;
    let now = weft_model::now_ms();
    let sys_attrs = params.option("sysAttrs");
    let all = subscriptions.collect(&req.tenant, Api::NgsiLd, |sub| {
        ld::render(sub, &req.context, now, sys_attrs)
    });
    let total = all.len();
    let page: Vec<Value> = all.into_iter().skip(offset).take(limit).collect();
    let mut resp = req.answer(Value::Array(page));
    if params.get("count") == Some("true") {
        resp.headers_mut()
            .insert("ngsild-results-count", total.into());
    }
    // The pages before and after (NGSI-LD's pagination links), beside
    // any context link.
    let page_link = |offset: usize, rel: &str| {
        format!(
            "</ngsi-ld/v1/subscriptions?limit={limit}&offset={offset}>;rel=\"{rel}\";type=\"application/ld+json\""
        )
    };
    let mut links: Vec<String> = resp
        .headers()
        .get_all(header::LINK)
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_string))
        .collect();
    if offset > 0 && limit > 0 {
        links.push(page_link(offset.saturating_sub(limit), "prev"));
    }
    if offset + limit < total && limit > 0 {
        links.push(page_link(offset + limit, "next"));
    }
    if let Ok(value) = HeaderValue::from_str(&links.join(", ")) {
        if !links.is_empty() {
            resp.headers_mut().insert(header::LINK, value);
        }
    }
    Ok(resp)
}

/// "Retrieve Subscription" (`GET /ngsi-ld/v1/subscriptions/{id}`).
pub async fn retrieve(
    State(state): State<AppState>,
    req: LdRequest,
    params: LdParams,
    Path(id): Path<String>,
) -> Result<Response> {
    check_id(&id)?;
    let subscriptions = &state.services.subscriptions;
    subscriptions.sync_counters(&req.tenant).await;
    let now = weft_model::now_ms();
    let sys_attrs = params.option("sysAttrs");
    let shown = subscriptions.read(&req.tenant, &id, Api::NgsiLd, |sub| {
        ld::render(sub, &req.context, now, sys_attrs)
    })?;
    Ok(req.answer(shown.unwrap_or(Value::Null)))
}

/// "Update Subscription" (`PATCH /ngsi-ld/v1/subscriptions/{id}`): the
/// fragment's members replace the subscription's; 204.
pub async fn update(
    State(state): State<AppState>,
    mut req: LdRequest,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response> {
    check_id(&id)?;
    let value = req.body(&body).await?;
    if let Some(Value::String(url)) = value.get("jsonldContext") {
        context_available(&state, url).await?;
    }
    let ctx = req.context.clone();
    let now = weft_model::now_ms();
    state
        .services
        .subscriptions
        .update(&req.tenant, &id, Api::NgsiLd, |sub| {
            ld::patch(sub, &value, ctx, now).map_err(Error)
        })
        .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// "Delete Subscription" (`DELETE /ngsi-ld/v1/subscriptions/{id}`): 204.
pub async fn remove(
    State(state): State<AppState>,
    req: LdRequest,
    Path(id): Path<String>,
) -> Result<Response> {
    check_id(&id)?;
    state
        .services
        .subscriptions
        .delete(&req.tenant, &id, Api::NgsiLd)
        .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Whether the context a subscription names for its notifications
/// (`jsonldContext`) can be read: fetched (and kept) now, so that a
/// subscription is not taken with a context its receivers cannot read
/// (503 `LdContextNotAvailable` otherwise).
async fn context_available(state: &AppState, url: &str) -> Result<()> {
    state
        .services
        .ld_contexts
        .resolve(Some(&Value::String(url.to_string())))
        .await?;
    Ok(())
}
