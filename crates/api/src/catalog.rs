//! `/api/v1/device-types` and `/api/v1/devices`: the configuration the
//! pipeline decodes and enriches with, plus the `decode` and `encode` dry
//! runs. Changes go through the pipeline's catalog so the next uplink sees
//! them.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use std::collections::HashMap;
use weft_model::{Device, DeviceType};
use weft_pipeline::downlinks::DownlinkError;
use weft_pipeline::TypeEntry;
use weft_store::{DeviceFilter, DevicePageQuery};

use crate::routes::{get, post, Access, Routes, Scope::Own};
use crate::{ApiError, ApiResult, AppState};

/// The catalog routes: definitions are admin's; the decode and encode dry
/// runs define nothing (write).
pub fn routes() -> Routes {
    Routes::new()
        .route("/api/v1/device-types", get(Access::read(Own), list_types))
        .route(
            "/api/v1/device-types/{name}",
            get(Access::read(Own), get_type)
                .put(Access::admin(Own), put_type)
                .delete(Access::admin(Own), delete_type),
        )
        .route(
            "/api/v1/device-types/{name}/decode",
            post(Access::write(Own), decode),
        )
        .route(
            "/api/v1/device-types/{name}/encode",
            post(Access::write(Own), encode),
        )
        .route("/api/v1/devices", get(Access::read(Own), list_devices))
        .route(
            "/api/v1/devices/{id}",
            get(Access::read(Own), get_device)
                .put(Access::admin(Own), put_device)
                .delete(Access::admin(Own), delete_device),
        )
        .route(
            "/api/v1/devices/{id}/events",
            get(Access::read(Own), device_events),
        )
        .route(
            "/api/v1/devices/{id}/key",
            post(Access::admin(Own), make_device_key).delete(Access::admin(Own), delete_device_key),
        )
}

/// A device as the API shows it: its key's hash left out, `hasKey` saying
/// whether it has one.
fn device_json(device: &Device) -> Value {
    let mut out = serde_json::to_value(device).expect("devices serialise");
    if let Value::Object(map) = &mut out {
        map.remove("keyHash");
        map.insert("hasKey".into(), device.key_hash.is_some().into());
    }
    out
}

/// Parses a JSON body into `T`, answering 400 with serde's message.
pub(crate) fn parse_body<T: DeserializeOwned>(body: &[u8]) -> ApiResult<T> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
}

/// Parses a definition's JSON body into `T`, answering 400 naming the
/// field of a wrong type, missing or unknown.
pub(crate) fn parse_definition<T: DeserializeOwned>(body: &[u8]) -> ApiResult<T> {
    weft_model::validate::parse_definition(body).map_err(|e| ApiError::bad_request(e.to_string()))
}

/// A JSON value as a definition `T`, as [`parse_definition`] answers.
fn definition_from<T: DeserializeOwned>(value: Value) -> ApiResult<T> {
    weft_model::validate::from_value(value).map_err(|e| ApiError::bad_request(e.to_string()))
}

fn type_json(entry: &TypeEntry) -> Value {
    let mut v = serde_json::to_value(&entry.def).expect("device types serialise");
    if let Value::Object(map) = &mut v {
        map.insert("name".into(), json!(entry.name));
    }
    v
}

fn created_or_ok(created: bool) -> StatusCode {
    if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    }
}

/// `GET /api/v1/device-types`: every type, by name.
async fn list_types(State(state): State<AppState>) -> Json<Value> {
    let all = state.services.catalog.device_types();
    Json(Value::Array(all.iter().map(|e| type_json(e)).collect()))
}

/// `GET /api/v1/device-types/{name}`.
async fn get_type(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    let entry = state
        .services
        .catalog
        .device_type(&name)
        .ok_or_else(|| ApiError::not_found(format!("device type '{name}' does not exist")))?;
    Ok(Json(type_json(&entry)))
}

/// `PUT /api/v1/device-types/{name}`: create or replace. A decoder that
/// does not compile is refused with the engine's message and line.
async fn put_type(
    State(state): State<AppState>,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult<impl IntoResponse> {
    // What `GET` answers carries the type's `name`; sending it back is fine
    // as long as it is this type's.
    let mut body: Value = parse_body(&body)?;
    if let Some(given) = body.as_object_mut().and_then(|o| o.remove("name")) {
        if given != json!(name) {
            return Err(ApiError::bad_request(format!(
                "name {given} in the body differs from the path's '{name}'"
            )));
        }
    }
    let def: DeviceType = definition_from(body)?;
    let created = state.services.catalog.put_device_type(&name, def).await?;
    let entry = state
        .services
        .catalog
        .device_type(&name)
        .expect("just stored");
    Ok((created_or_ok(created), Json(type_json(&entry))))
}

/// `DELETE /api/v1/device-types/{name}`.
async fn delete_type(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    if state.services.catalog.delete_device_type(&name).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(format!(
            "device type '{name}' does not exist"
        )))
    }
}

/// `POST /api/v1/device-types/{name}/decode`: runs the type's decoder (or
/// processor) on a sample body and returns what it would produce, storing
/// nothing; the sample needs no device id. `?channel=` sets the units'
/// channel. A `decoder` field (`{"script", "language"}`, as a type's) is
/// not part of the sample: it is a decoder not saved yet, run instead of
/// the type's with the type's mappings (what a codec editor tests); one
/// that does not compile is a 400 `InvalidScript`, as on save. A 422
/// carries the codec's own `errors` and `warnings`.
async fn decode(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(params): Query<HashMap<String, String>>,
    body: Bytes,
) -> ApiResult<Json<Value>> {
    let Some(saved) = state.services.catalog.device_type(&name) else {
        return Err(ApiError::not_found(format!(
            "device type '{name}' does not exist"
        )));
    };
    let mut sample: Value = parse_body(&body)?;
    let Some(fields) = sample.as_object_mut() else {
        return Err(ApiError::bad_request("body must be a JSON object"));
    };
    let candidate = match fields.remove("decoder") {
        None => None,
        Some(decoder) => {
            let decoder: weft_model::device::Decoder =
                serde_json::from_value(decoder).map_err(|e| {
                    ApiError::bad_request(format!(
                        "decoder must be {{\"script\": \"<JavaScript>\"}}: {e}"
                    ))
                })?;
            let mut def = saved.def.clone();
            def.decoder = Some(decoder);
            Some(std::sync::Arc::new(
                state.services.catalog.candidate(&name, def).await?,
            ))
        }
    };
    match state
        .services
        .ingest
        .dry_run(
            &name,
            params.get("channel").cloned(),
            &sample,
            candidate.as_ref(),
        )
        .await
    {
        Ok(produced) => Ok(Json(
            json!({"units": produced.units, "warnings": produced.warnings}),
        )),
        Err((failed, report)) => {
            // The codec's own `errors` (and `warnings`) when it returned
            // them, as The Things Stack shows a failed test decode;
            // otherwise the one error weft met.
            let (errors, warnings) =
                report.unwrap_or_else(|| (vec![failed.description.clone()], Vec::new()));
            Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "DecodeFailed",
                failed.description.clone(),
            )
            .with_extra(json!({"reason": failed.reason, "errors": errors, "warnings": warnings})))
        }
    }
}

/// The fields an encode dry run's body may have.
const ENCODE_FIELDS: &[&str] = &["data", "fPort", "variables", "encoder"];

/// `POST /api/v1/device-types/{name}/encode`: runs the type's
/// `encodeDownlink` on `{"data": {…}, "fPort"?, "variables"?}` and answers
/// what a downlink queued with that `data` would carry, storing and
/// sending nothing: `{"bytes": "<base64>", "hex", "fPort", "warnings"}`
/// (`bytes` and `fPort` as `encodeDownlink` names them; base64 because
/// JSON has no bytes, as The Things Stack's and ChirpStack's APIs write
/// payloads). `variables` are the codec's `input.variables` (`{}` when
/// not given). An `encoder` (`{"script", "language"}`, as a type's
/// `decoder`) is a codec not saved yet, run instead of the type's (what
/// a codec editor tests); one that does not compile is a 400
/// `InvalidScript`, as on save. A codec that cannot encode (it returned
/// `errors`, threw, defines no encoder, or the type has none) is a 422
/// `EncodeFailed` with the codec's own `errors` and `warnings`, as the
/// decode dry run's `DecodeFailed`.
async fn encode(
    State(state): State<AppState>,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult<Json<Value>> {
    let Some(saved) = state.services.catalog.device_type(&name) else {
        return Err(ApiError::not_found(format!(
            "device type '{name}' does not exist"
        )));
    };
    let body: Value = parse_body(&body)?;
    let Value::Object(mut fields) = body else {
        return Err(ApiError::bad_request(
            "body must be a JSON object {\"data\": {…}}",
        ));
    };
    if let Some(unknown) = fields.keys().find(|k| !ENCODE_FIELDS.contains(&k.as_str())) {
        return Err(ApiError::bad_request(format!(
            "unknown field '{unknown}' (expected data, fPort, variables, encoder)"
        )));
    }
    let data = match fields.remove("data") {
        Some(Value::Object(data)) => Value::Object(data),
        None | Some(Value::Null) => {
            return Err(ApiError::bad_request(
                "data is required: the object a downlink would carry, for encodeDownlink",
            ))
        }
        Some(_) => return Err(ApiError::bad_request("data must be a JSON object")),
    };
    let f_port = match fields.remove("fPort") {
        None | Some(Value::Null) => None,
        Some(port) => Some(weft_model::downlink::check_port(&port).map_err(ApiError::bad_request)?),
    };
    let variables: weft_model::device::Variables = match fields.remove("variables") {
        None | Some(Value::Null) => Default::default(),
        Some(given) => {
            let variables = variables_from(given)?;
            weft_model::device::check_variables(&variables)
                .map_err(|e| ApiError::bad_request(e.to_string()))?;
            std::sync::Arc::new(variables)
        }
    };
    let candidate = match fields.remove("encoder") {
        None => None,
        Some(encoder) => {
            let encoder: weft_model::device::Decoder =
                serde_json::from_value(encoder).map_err(|e| {
                    ApiError::bad_request(format!(
                        "encoder must be {{\"script\": \"<JavaScript>\"}}: {e}"
                    ))
                })?;
            let mut def = saved.def.clone();
            def.decoder = Some(encoder);
            Some(state.services.catalog.candidate(&name, def).await?)
        }
    };
    let device_type = candidate.as_ref().unwrap_or(&saved);
    match state
        .services
        .downlinks
        .encode_dry_run(device_type, data, f_port, &variables)
        .await
    {
        Ok(encoded) => Ok(Json(json!({
            "bytes": base64::engine::general_purpose::STANDARD.encode(&encoded.bytes),
            "hex": hex::encode(&encoded.bytes),
            "fPort": encoded.f_port,
            "warnings": encoded.warnings,
        }))),
        Err(DownlinkError::Encode {
            description,
            errors,
            warnings,
            ..
        }) => {
            // The codec's own `errors` when it returned them; otherwise
            // the one error weft met, as the decode dry run answers.
            let errors = if errors.is_empty() {
                vec![description.clone()]
            } else {
                errors
            };
            Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "EncodeFailed",
                description,
            )
            .with_extra(json!({"errors": errors, "warnings": warnings})))
        }
        Err(other) => Err(other.into()),
    }
}

/// An encode dry run's `variables`: an object of text, as a device's; a
/// value of another type is refused naming the variable.
fn variables_from(given: Value) -> ApiResult<std::collections::BTreeMap<String, String>> {
    let Value::Object(given) = given else {
        return Err(ApiError::bad_request(format!(
            "variables must be an object of names to text, not {given}"
        )));
    };
    given
        .into_iter()
        .map(|(name, value)| match value {
            Value::String(text) => Ok((name, text)),
            other => Err(ApiError::bad_request(format!(
                "variables.{name} must be text (a JSON string), not {other}"
            ))),
        })
        .collect()
}

/// Most devices on one page of `GET /api/v1/devices?limit=`.
pub const MAX_DEVICE_PAGE: usize = 1000;

/// A page when `limit` is not given but `offset` or `q` is.
const DEFAULT_DEVICE_PAGE: usize = 50;

/// Longest search text `q` (a device id is at most 256 characters).
const MAX_DEVICE_SEARCH: usize = 256;

/// The header that carries how many devices match a listing in all.
const TOTAL_COUNT: &str = "x-total-count";

/// `GET /api/v1/devices?type=&channel=&record.<label>=` lists every
/// matching device, ordered by id. With `limit`, `offset` or `q` it is
/// paged in the database instead (what the console uses, fast with
/// 100,000 devices): `limit` (1–1000, default 50) devices from `offset`,
/// `q` a case-insensitive search of ids and names, each device with
/// `lastSeen` (epoch ms or `null`) and `state` as the device's own
/// `GET` shows it. Both answer `X-Total-Count`: how many match in all.
async fn list_devices(
    State(state): State<AppState>,
    Query(params): Query<Vec<(String, String)>>,
) -> ApiResult<Response> {
    let mut filter = DeviceFilter::default();
    let (mut limit, mut offset, mut search, mut paged) = (None, 0, None, false);
    for (k, v) in params {
        match k.as_str() {
            "type" => filter.device_type = Some(v),
            "channel" => filter.channel = Some(v),
            "limit" => {
                paged = true;
                limit = Some(
                    v.parse::<usize>()
                        .ok()
                        .filter(|n| (1..=MAX_DEVICE_PAGE).contains(n))
                        .ok_or_else(|| {
                            ApiError::bad_request(format!(
                                "limit must be an integer from 1 to {MAX_DEVICE_PAGE}, not '{v}'"
                            ))
                        })?,
                );
            }
            "offset" => {
                paged = true;
                offset = v.parse::<usize>().map_err(|_| {
                    ApiError::bad_request(format!(
                        "offset must be a non-negative integer, not '{v}'"
                    ))
                })?;
            }
            "q" => {
                paged = true;
                if v.chars().count() > MAX_DEVICE_SEARCH {
                    return Err(ApiError::bad_request(format!(
                        "q must be at most {MAX_DEVICE_SEARCH} characters"
                    )));
                }
                let v = v.trim().to_lowercase();
                search = (!v.is_empty()).then_some(v);
            }
            _ => match k.strip_prefix("record.") {
                Some(label) => filter.records.push((label.to_string(), v)),
                None => return Err(ApiError::bad_request(format!("unknown parameter '{k}'"))),
            },
        }
    }
    if !paged {
        let all = state.services.store.list_devices(&filter).await?;
        let total = all.len();
        return Ok((
            [(TOTAL_COUNT, total.to_string())],
            Json(all.iter().map(device_json).collect::<Vec<_>>()),
        )
            .into_response());
    }
    let query = DevicePageQuery {
        filter,
        search,
        limit: limit.unwrap_or(DEFAULT_DEVICE_PAGE),
        offset,
    };
    let page = state.services.store.page_devices(&query).await?;
    let items: Vec<Value> = page
        .devices
        .into_iter()
        .map(|s| {
            let mut v = device_json(&s.device);
            if let Value::Object(map) = &mut v {
                map.insert("lastSeen".into(), json!(s.last_seen));
                map.insert("state".into(), Value::Object(s.state));
            }
            v
        })
        .collect();
    Ok(([(TOTAL_COUNT, page.total.to_string())], Json(items)).into_response())
}

/// `GET /api/v1/devices/{id}`: the device, and under `state` what its
/// network server last reported of each kind of event (`join`, `status`,
/// `location`, `ack`, `txack`, …; `{}` when nothing yet), read-only.
async fn get_device(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let device = state
        .services
        .catalog
        .device(&id)
        .ok_or_else(|| ApiError::not_found(format!("device '{id}' does not exist")))?;
    let events = state.services.store.device_state(&id).await?;
    let mut out = device_json(&device);
    if let Value::Object(map) = &mut out {
        map.insert("state".into(), Value::Object(events));
    }
    Ok(Json(out))
}

/// Fields `GET /api/v1/devices/{id}` shows that a `PUT` does not set: a
/// client that reads a device and writes it back sends them, and they are
/// ignored rather than refused.
const READ_ONLY_DEVICE_FIELDS: &[&str] = &["state", "lastSeen", "hasKey", "keyHash"];

/// `PUT /api/v1/devices/{id}`: create or replace; the id comes from the path.
async fn put_device(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<impl IntoResponse> {
    let mut value: Value = parse_body(&body)?;
    if let Value::Object(map) = &mut value {
        for field in READ_ONLY_DEVICE_FIELDS {
            map.remove(*field);
        }
    }
    let mut device: Device = definition_from(value)?;
    device.id = id;
    // The key is set and removed at `/key` only; a PUT keeps it.
    device.key_hash = state
        .services
        .catalog
        .device(&device.id)
        .and_then(|d| d.key_hash.clone());
    let created = state.services.catalog.put_device(device.clone()).await?;
    Ok((created_or_ok(created), Json(device_json(&device))))
}

/// `POST /api/v1/devices/{id}/key`: makes the device a new key (its
/// password on the embedded MQTT broker), replacing any it had, and
/// answers it, once: 201 `{"key": "wdk_…"}`. Only its hash is kept.
async fn make_device_key(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let (key, hash) = weft_model::device::new_device_key();
    if state
        .services
        .catalog
        .set_device_key(&id, Some(hash))
        .await?
        .is_none()
    {
        return Err(ApiError::not_found(format!("device '{id}' does not exist")));
    }
    Ok((StatusCode::CREATED, Json(json!({ "key": key }))))
}

/// `DELETE /api/v1/devices/{id}/key`: the device has no key any more (and
/// cannot log in to the embedded broker).
async fn delete_device_key(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let has_key = state
        .services
        .catalog
        .device(&id)
        .map(|d| d.key_hash.is_some());
    match has_key {
        None => Err(ApiError::not_found(format!("device '{id}' does not exist"))),
        Some(false) => Err(ApiError::not_found(format!("device '{id}' has no key"))),
        Some(true) => {
            state.services.catalog.set_device_key(&id, None).await?;
            Ok(StatusCode::NO_CONTENT)
        }
    }
}

/// Parameters of `GET /api/v1/devices/{id}/events`.
#[derive(Debug, serde::Deserialize)]
struct EventParams {
    /// Only events of this name (`join`, `status`, `join_accept`, …).
    event: Option<String>,
    /// Most events returned: default 100, at most what is kept.
    limit: Option<usize>,
}

/// `GET /api/v1/devices/{id}/events?event=&limit=`: the device's latest
/// network-server events (`{"events":[…]}`, newest first), each with its
/// name, source, times and body as received; 404 when the device is
/// neither registered nor has events.
async fn device_events(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(params): Query<EventParams>,
) -> ApiResult<Json<Value>> {
    let limit = params
        .limit
        .unwrap_or(100)
        .min(weft_store::DEVICE_EVENTS_KEPT);
    let events = state
        .services
        .store
        .device_events(&id, params.event.as_deref(), limit)
        .await?;
    if events.is_empty() && state.services.catalog.device(&id).is_none() {
        return Err(ApiError::not_found(format!("device '{id}' does not exist")));
    }
    Ok(Json(json!({ "events": events })))
}

/// `DELETE /api/v1/devices/{id}`.
async fn delete_device(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    if state.services.catalog.delete_device(&id).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(format!("device '{id}' does not exist")))
    }
}
