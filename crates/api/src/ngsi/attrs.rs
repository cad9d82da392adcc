//! `/v2/entities/{id}/attrs`, `/attrs/{attr}` and `/attrs/{attr}/value`:
//! reading and changing the attributes of one entity.
//!
//! Writes are parsed here and made by the NGSI write
//! ([`weft_pipeline::ngsi_write`]), which answers with Orion's texts.

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::Value;
use weft_model::ngsi::{self, render_attr, NgsiError};

use super::entities::render_entity;
use weft_pipeline::ngsi_write::Write;

use super::error::{Error, Result};
use super::params::{attrs_body, content_type, json_body, Params};
use super::tenant::{ServicePath, Tenant, WriteOp};
use super::{check_segment, json_response};
use crate::AppState;

/// Orion's "Retrieve Entity Attributes" (`GET /v2/entities/{id}/attrs`):
/// the entity without `id` and `type`.
pub async fn get_attrs(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    sp: ServicePath,
    params: Params,
    Path(id): Path<String>,
) -> Result<Response> {
    check_segment(&id)?;
    let options = params.options()?;
    let attrs = params.list("attrs");
    let metadata = params.list("metadata");
    let entity = state
        .services
        .providers
        .retrieve(
            &sp.tenancy(tenant),
            &id,
            params.get("type"),
            attrs.as_deref(),
            options.skip_forwarding,
        )
        .await?;
    let mut body = render_entity(
        &entity,
        options.format(),
        options.attrs_with_dates(attrs).as_deref(),
        metadata.as_deref(),
    );
    if let Value::Object(obj) = &mut body {
        obj.shift_remove("id");
        obj.shift_remove("type");
    }
    Ok(json_response(&body))
}

/// The shared body of POST, PATCH and PUT `/v2/entities/{id}/attrs`:
/// validate, parse the attributes, and hand them to the NGSI write as
/// `write` makes them.
#[allow(clippy::too_many_arguments)]
async fn write_attrs(
    state: AppState,
    tenant: String,
    sp: ServicePath,
    params: Params,
    id: String,
    headers: HeaderMap,
    body: Bytes,
    op: WriteOp,
    write: fn(ngsi::AttrMap) -> Write,
) -> Result<Response> {
    check_segment(&id)?;
    let target = sp.target(tenant, op, id, params.get("type"))?;
    let options = params.options()?;
    let attrs = attrs_body(&headers, &body, options.key_values)?;
    state
        .services
        .ngsi_writer
        .write(&target, write(attrs), options.update())
        .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Orion's "Update or Append Entity Attributes" (`POST
/// /v2/entities/{id}/attrs`; with `options=append` "Append" strictly).
pub async fn append_attrs(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    sp: ServicePath,
    params: Params,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response> {
    write_attrs(
        state,
        tenant,
        sp,
        params,
        id,
        headers,
        body,
        WriteOp::Update,
        Write::Append,
    )
    .await
}

/// Orion's "Update Existing Entity Attributes" (`PATCH
/// /v2/entities/{id}/attrs`).
pub async fn update_attrs(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    sp: ServicePath,
    params: Params,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response> {
    write_attrs(
        state,
        tenant,
        sp,
        params,
        id,
        headers,
        body,
        WriteOp::Patch,
        Write::Update,
    )
    .await
}

/// Orion's "Replace all entity attributes" (`PUT /v2/entities/{id}/attrs`).
pub async fn replace_attrs(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    sp: ServicePath,
    params: Params,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response> {
    write_attrs(
        state,
        tenant,
        sp,
        params,
        id,
        headers,
        body,
        WriteOp::Update,
        Write::Replace,
    )
    .await
}

/// Orion's "Get attribute data" (`GET /v2/entities/{id}/attrs/{attr}`).
pub async fn get_attr(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    sp: ServicePath,
    params: Params,
    Path((id, name)): Path<(String, String)>,
) -> Result<Response> {
    check_segment(&id)?;
    check_segment(&name)?;
    let options = params.options()?;
    let entity = state
        .services
        .providers
        .retrieve(
            &sp.tenancy(tenant),
            &id,
            params.get("type"),
            Some(std::slice::from_ref(&name)),
            options.skip_forwarding,
        )
        .await?;
    let attr = entity
        .entity
        .attrs
        .get(&name)
        .ok_or_else(NgsiError::attribute_not_found)?;
    let metadata = params.list("metadata");
    Ok(json_response(&render_attr(attr, metadata.as_deref())))
}

/// Orion's "Update Attribute Data" (`PUT /v2/entities/{id}/attrs/{attr}`).
pub async fn put_attr(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    sp: ServicePath,
    params: Params,
    Path((id, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response> {
    check_segment(&id)?;
    check_segment(&name)?;
    let target = sp.target(tenant, WriteOp::Update, id, params.get("type"))?;
    let options = params.options()?;
    let value = json_body(&headers, &body)?;
    let attr = ngsi::parse_attr(&name, &value)?;
    state
        .services
        .ngsi_writer
        .write(&target, Write::UpdateAttr { name, attr }, options.update())
        .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Orion's "Remove a Single Attribute" (`DELETE
/// /v2/entities/{id}/attrs/{attr}`).
pub async fn delete_attr(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    sp: ServicePath,
    params: Params,
    Path((id, name)): Path<(String, String)>,
) -> Result<Response> {
    check_segment(&id)?;
    check_segment(&name)?;
    let target = sp.target(tenant, WriteOp::Delete, id, params.get("type"))?;
    state
        .services
        .ngsi_writer
        .write(&target, Write::DeleteAttr(name), Default::default())
        .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Orion's "Get Attribute Value" (`GET
/// /v2/entities/{id}/attrs/{attr}/value`): objects and arrays as JSON or
/// text, other values as `text/plain` only (406 otherwise).
pub async fn get_value(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    sp: ServicePath,
    params: Params,
    Path((id, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response> {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("*/*");
    let text_only = preferred(accept, true) == Some(Media::Text);
    let lookup = async {
        check_segment(&id)?;
        check_segment(&name)?;
        let options = params.options()?;
        let entity = state
            .services
            .providers
            .retrieve(
                &sp.tenancy(tenant.clone()),
                &id,
                params.get("type"),
                Some(std::slice::from_ref(&name)),
                options.skip_forwarding,
            )
            .await?;
        let attr = entity.entity.attrs.get(&name).cloned();
        Ok::<_, Error>(attr.ok_or_else(NgsiError::attribute_not_found)?)
    };
    let attr = match lookup.await {
        Ok(a) => a,
        // Orion labels its (JSON) error text/plain when the client only
        // takes text.
        Err(e) if text_only => {
            let mut resp = e.into_response();
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("text/plain"),
            );
            return Ok(resp);
        }
        Err(e) => return Err(e),
    };
    let structured = attr.value.is_object() || attr.value.is_array();
    let text = match (&attr.value, media_is_text(accept, structured)) {
        // Dates go out bare in text (`2035-06-15T07:21:24.238Z`), as
        // Orion keeps them as numbers and formats them on the way out.
        (Value::String(s), true) if attr.attr_type == "DateTime" => s.clone(),
        (v, _) => weft_model::ngsi::number::to_string(v),
    };
    match preferred(accept, structured) {
        Some(Media::Json) => {
            Ok(([(header::CONTENT_TYPE, "application/json")], text).into_response())
        }
        Some(Media::Text) => Ok(([(header::CONTENT_TYPE, "text/plain")], text).into_response()),
        None if structured => Err(Error::not_acceptable("application/json, text/plain")),
        None => Err(Error::not_acceptable("text/plain")),
    }
}

fn media_is_text(accept: &str, structured: bool) -> bool {
    preferred(accept, structured) == Some(Media::Text)
}

#[derive(Debug, PartialEq)]
enum Media {
    Json,
    Text,
}

/// The media type to answer with, from `Accept`: the entry with the
/// highest `q` (the first among equals) that the value can take.
fn preferred(accept: &str, structured: bool) -> Option<Media> {
    let mut best: Option<(f32, Media)> = None;
    for entry in accept.split(',') {
        let mut parts = entry.split(';');
        let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        let q = parts
            .filter_map(|p| p.trim().strip_prefix("q="))
            .find_map(|q| q.parse::<f32>().ok())
            .unwrap_or(1.0);
        let m = match media.as_str() {
            "application/json" | "application/*" if structured => Media::Json,
            "*/*" if structured => Media::Json,
            "text/plain" | "text/*" | "*/*" => Media::Text,
            _ => continue,
        };
        if best.as_ref().is_none_or(|(bq, _)| q > *bq) {
            best = Some((q, m));
        }
    }
    best.map(|(_, m)| m)
}

/// Orion's "Update Attribute Value" (`PUT
/// /v2/entities/{id}/attrs/{attr}/value`), JSON or `text/plain`.
pub async fn put_value(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    sp: ServicePath,
    params: Params,
    Path((id, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response> {
    check_segment(&id)?;
    check_segment(&name)?;
    let target = sp.target(tenant, WriteOp::Update, id, params.get("type"))?;
    let options = params.options()?;
    let value = match content_type(&headers).as_deref() {
        Some("text/plain") => {
            let text = std::str::from_utf8(&body).map_err(|_| NgsiError::parse_error())?;
            let t = text.trim();
            let word = ["true", "false", "null"]
                .into_iter()
                .find(|w| t.eq_ignore_ascii_case(w));
            integral(ngsi::parse_attr_value_text(word.unwrap_or(text))?)
        }
        _ => json_body(&headers, &body)?,
    };
    state
        .services
        .ngsi_writer
        .write(&target, Write::SetValue { name, value }, options.update())
        .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// A float without a fractional part as an integer (`3.2e2` is `320`,
/// as Orion renders it), when it fits exactly.
fn integral(v: Value) -> Value {
    match v.as_f64() {
        Some(f) if v.is_f64() && f.fract() == 0.0 && f.abs() < 9.0e15 => Value::from(f as i64),
        _ => v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_negotiation_follows_the_cases() {
        assert_eq!(preferred("*/*", true), Some(Media::Json));
        assert_eq!(preferred("*/*", false), Some(Media::Text));
        assert_eq!(
            preferred("text/*, application/json", true),
            Some(Media::Text)
        );
        assert_eq!(
            preferred("application/json, text/plain", true),
            Some(Media::Json)
        );
        assert_eq!(
            preferred("text/*;q=0.3,application/json;q=0.8", true),
            Some(Media::Json)
        );
        assert_eq!(
            preferred("text/*;q=0.3,application/json;q=0.8", false),
            Some(Media::Text)
        );
        assert_eq!(preferred("application/json", false), None);
    }
}
