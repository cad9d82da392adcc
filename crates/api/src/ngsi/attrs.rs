//! `/v2/entities/{id}/attrs`, `/attrs/{attr}` and `/attrs/{attr}/value`:
//! reading and changing the attributes of one entity.
//!
//! Writes run inside [`Context::modify`](weft_pipeline::context::Context::modify):
//! the model's update functions change a copy of the entity, and the
//! outcome (which attributes failed) is turned into Orion's 422 texts
//! after the successful part was stored, as Orion does.

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::Value;
use weft_model::ngsi::{self, render_attr, NgsiError};

use super::entities::render_entity;
use super::forward::Target;

use super::error::{Error, Result};
use super::params::{content_type, json_attrs_body, json_body, Params};
use super::tenant::{ServicePath, Tenant, WriteOp};
use super::{check_segment, json_response, now_ms};
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
    let entity = super::forward::retrieve(
        &state,
        &tenant,
        &sp,
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

/// One of the three whole-attribute-set writes.
type AttrsWrite =
    fn(&mut ngsi::Entity, ngsi::AttrMap, ngsi::UpdateOptions, i64) -> ngsi::UpdateOutcome;

/// What update operators (`{"$inc": 1}`) in a write are resolved against:
/// the attributes' current values (append, update), or the reference
/// values of a creation (replace: the entity's attributes start afresh).
#[derive(Clone, Copy, PartialEq)]
enum Operands {
    Current,
    Reference,
}

/// What makes an attribute-set write fail as a whole (attributes that
/// already exist for a strict append, missing ones for an update).
type AttrsCheck = fn(&ngsi::UpdateOutcome, &str, Option<&str>) -> Option<NgsiError>;

/// The shared body of POST, PATCH and PUT `/v2/entities/{id}/attrs`:
/// validate, parse the attributes, apply `write` to the entity (stored
/// before the 204), and answer `check`'s error if it has one.
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
    write: AttrsWrite,
    operands: Operands,
    check: Option<AttrsCheck>,
) -> Result<Response> {
    check_segment(&id)?;
    let path = sp.for_write(op)?;
    let options = params.options()?;
    let value = json_attrs_body(&headers, &body)?;
    let mut attrs = ngsi::parse_attrs(&value, options.key_values)?;
    let opts = options.update();
    let now = now_ms();
    let etype = params.get("type");
    // Command attributes of a device's entity (the IoT Agents' command
    // pattern) become downlinks rather than attribute values; a replace
    // of all attributes is no command.
    let commands = if operands == Operands::Current {
        state
            .services
            .downlinks
            .take_commands(&tenant, &path, &id, etype, &mut attrs)
    } else {
        Vec::new()
    };
    if !commands.is_empty() && attrs.is_empty() {
        local_entity(&state, &tenant, &path, &id, etype)?
            .ok_or_else(NgsiError::entity_not_found)?;
        send_commands(&state, &id, commands).await?;
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    // An update (not an append or a replace) of attributes the entity
    // lacks goes to the providers registered for them.
    let target = Target {
        tenant: &tenant,
        sp: &sp,
        path: &path,
        id: &id,
        entity_type: etype,
    };
    let forwarded = if op == WriteOp::Patch && super::forward::may_forward_update(&state, &target) {
        let local = local_entity(&state, &tenant, &path, &id, etype)?;
        let fwd = super::forward::update(&state, &target, &mut attrs, local.as_ref()).await;
        if fwd.any() && attrs.is_empty() {
            return match fwd.error(&id, etype, false) {
                Some(e) => Err(e.into()),
                None => Ok(StatusCode::NO_CONTENT.into_response()),
            };
        }
        fwd
    } else {
        super::forward::ForwardedUpdate::default()
    };
    let outcome = state
        .services
        .context
        .modify(&tenant, &[path], &id, etype, move |e| {
            let current = (operands == Operands::Current).then_some(&*e);
            ngsi::operators::resolve_operators(current, &mut attrs)?;
            Ok(write(e, attrs, opts, now))
        })
        .await?;
    if let Some(err) = check.and_then(|check| check(&outcome, &id, etype)) {
        return Err(err.into());
    }
    if !commands.is_empty() {
        send_commands(&state, &id, commands).await?;
    }
    if let Some(err) = forwarded.error(&id, etype, true) {
        return Err(err.into());
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Queues the commands taken from an update as downlinks to the device
/// (`<command>_status` becomes `PENDING`); a command the device type's
/// codec cannot encode is a 422 with the codec's words.
async fn send_commands(
    state: &AppState,
    device_id: &str,
    commands: Vec<(String, Value)>,
) -> Result<()> {
    use weft_pipeline::downlinks::DownlinkError;
    state
        .services
        .downlinks
        .send_commands(device_id, commands)
        .await
        .map_err(|e| {
            let error = match e {
                DownlinkError::UnknownDevice(_) => NgsiError::entity_not_found(),
                DownlinkError::Encode { description, .. } => {
                    NgsiError::new(422, "Unprocessable", description)
                }
                DownlinkError::Busy => NgsiError::new(
                    503,
                    "ServiceUnavailable",
                    "the script engine is busy, retry later",
                ),
                DownlinkError::Store(e) => {
                    NgsiError::new(500, "InternalServerError", e.to_string())
                }
            };
            error.into()
        })
}

/// The entity an update addresses, if it exists locally (409 and other
/// errors than 404 are returned as they are).
fn local_entity(
    state: &AppState,
    tenant: &str,
    path: &str,
    id: &str,
    etype: Option<&str>,
) -> Result<Option<ngsi::Entity>> {
    match state
        .services
        .context
        .get(tenant, &[path.to_string()], id, etype)
    {
        Ok(found) => Ok(Some(found.entity)),
        Err(e) if e.status == 404 => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Forwards a single-attribute write (`PUT …/attrs/{a}`, `…/value`) when
/// the attribute is not local and a registration provides it: `Some` with
/// the answer to give, `None` to apply it locally.
async fn forward_single(
    state: &AppState,
    at: &Target<'_>,
    name: &str,
    attr: ngsi::Attribute,
) -> Result<Option<Response>> {
    if !super::forward::may_forward_update(state, at) {
        return Ok(None);
    }
    let (tenant, path, id, etype) = (at.tenant, at.path, at.id, at.entity_type);
    let local = local_entity(state, tenant, path, id, etype)?;
    if local.as_ref().is_some_and(|e| e.attrs.contains_key(name)) {
        return Ok(None);
    }
    let mut attrs = ngsi::AttrMap::new();
    attrs.insert(name, attr);
    let fwd = super::forward::update(state, at, &mut attrs, local.as_ref()).await;
    if !fwd.any() {
        return Ok(None);
    }
    match fwd.error(id, etype, false) {
        Some(e) => Err(e.into()),
        None => Ok(Some(StatusCode::NO_CONTENT.into_response())),
    }
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
    let check: AttrsCheck = |o, id, t| o.existing_error(id, t);
    write_attrs(
        state,
        tenant,
        sp,
        params,
        id,
        headers,
        body,
        WriteOp::Update,
        ngsi::append,
        Operands::Current,
        Some(check),
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
    let check: AttrsCheck = |o, id, t| o.missing_error(id, t);
    write_attrs(
        state,
        tenant,
        sp,
        params,
        id,
        headers,
        body,
        WriteOp::Patch,
        ngsi::update,
        Operands::Current,
        Some(check),
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
        ngsi::replace,
        Operands::Reference,
        None,
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
    let entity = super::forward::retrieve(
        &state,
        &tenant,
        &sp,
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
    let path = sp.for_write(WriteOp::Update)?;
    let options = params.options()?;
    let value = json_body(&headers, &body)?;
    let mut attr = ngsi::parse_attr(&name, &value)?;
    let etype = params.get("type");
    if let Some(answer) = forward_single(
        &state,
        &Target {
            tenant: &tenant,
            sp: &sp,
            path: &path,
            id: &id,
            entity_type: etype,
        },
        &name,
        attr.clone(),
    )
    .await?
    {
        return Ok(answer);
    }
    let opts = options.update();
    let now = now_ms();
    state
        .services
        .context
        .modify(&tenant, &[path], &id, params.get("type"), move |e| {
            if !ngsi::operators::resolve_attr(e.attrs.get(&name), &mut attr)? {
                return Err(NgsiError::attribute_not_found());
            }
            ngsi::update_attr(e, &name, attr, opts, now)
        })
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
    let path = sp.for_write(WriteOp::Delete)?;
    let now = now_ms();
    state
        .services
        .context
        .modify(&tenant, &[path], &id, params.get("type"), move |e| {
            ngsi::delete_attr(e, &name, now)
        })
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
        let entity = super::forward::retrieve(
            &state,
            &tenant,
            &sp,
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
    let path = sp.for_write(WriteOp::Update)?;
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
    let etype = params.get("type");
    // The provider gets the value with the type a new attribute of it
    // would have.
    let as_attr = ngsi::parse_attr(&name, &serde_json::json!({ "value": value.clone() }))?;
    if let Some(answer) = forward_single(
        &state,
        &Target {
            tenant: &tenant,
            sp: &sp,
            path: &path,
            id: &id,
            entity_type: etype,
        },
        &name,
        as_attr,
    )
    .await?
    {
        return Ok(answer);
    }
    let opts = options.update();
    let now = now_ms();
    state
        .services
        .context
        .modify(&tenant, &[path], &id, params.get("type"), move |e| {
            let value = if ngsi::operators::is_operator(&value) {
                let current = e.attrs.get(&name).map(|a| &a.value);
                match ngsi::operators::apply(current, &value)? {
                    ngsi::operators::Resolved::Value(v) => v,
                    ngsi::operators::Resolved::Skip => return Err(NgsiError::attribute_not_found()),
                }
            } else {
                value
            };
            ngsi::set_attr_value(e, &name, value, opts, now)
        })
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
