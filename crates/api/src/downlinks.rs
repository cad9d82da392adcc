//! `/api/v1/devices/{id}/downlinks`: a device's downlink queue — push
//! (`POST` appends), replace (`PUT`), list (`GET`), flush (`DELETE`) —
//! and `/iot/json/commands`, where IoT Agent JSON devices post their
//! command results. Everything goes through the pipeline's downlink
//! service; delivery happens after the answer, in its worker.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::{Extension, Json};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Value};
use weft_model::downlink::parse_requests;
use weft_model::now_ms;
use weft_pipeline::downlinks::DownlinkError;
use weft_pipeline::uplink::CommandResultRefused;

use crate::auth::IngestPins;
use crate::catalog::parse_body;
use crate::routes::{get, post, Access, Routes, Scope::Own};
use crate::{ApiError, ApiResult, AppState};

/// The downlink routes: a device's queue is data sent to it (write, as
/// NGSI writes are); a device's answers to commands come with an ingest
/// credential.
pub fn routes() -> Routes {
    Routes::new()
        .route(
            "/api/v1/devices/{id}/downlinks",
            get(Access::read(Own), list)
                .post(Access::write(Own), push)
                .put(Access::write(Own), replace)
                .delete(Access::write(Own), flush),
        )
        .route("/iot/json/commands", post(Access::Ingest, command_answer))
}

impl From<DownlinkError> for ApiError {
    fn from(error: DownlinkError) -> ApiError {
        match error {
            DownlinkError::UnknownDevice(_) => ApiError::not_found(error.to_string()),
            DownlinkError::Encode {
                description,
                errors,
                warnings,
                ..
            } => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "EncodeFailed",
                description,
            )
            .with_extra(json!({ "errors": errors, "warnings": warnings })),
            DownlinkError::Busy => ApiError::overloaded(),
            DownlinkError::Store(e) => e.into(),
        }
    }
}

/// `GET`: the device's downlinks, oldest first: open ones and the last
/// finished ones, raw ones with what the codec's `decodeDownlink` makes
/// of them under `decoded`.
async fn list(State(state): State<AppState>, Path(id): Path<String>) -> ApiResult<Json<Value>> {
    let downlinks = state.services.downlinks.list(&id).await?;
    Ok(Json(json!({ "downlinks": downlinks })))
}

/// `POST`: appends to the queue (The Things Stack's downlink queue push).
async fn push(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<impl IntoResponse> {
    queue(state, id, body, false).await
}

/// `PUT`: replaces the queue's open downlinks (TTN's queue replace); an
/// empty `{"downlinks":[]}` empties it.
async fn replace(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<impl IntoResponse> {
    queue(state, id, body, true).await
}

/// Checks the body, then queues: 202 with the queued downlinks; 400 for a
/// bad body, 404 for an unknown device, 422 when the codec cannot encode.
async fn queue(
    state: AppState,
    id: String,
    body: Bytes,
    replace: bool,
) -> ApiResult<impl IntoResponse> {
    if state.services.catalog.device(&id).is_none() {
        return Err(ApiError::not_found(format!("device '{id}' does not exist")));
    }
    let body: Value = parse_body(&body)?;
    let requests = parse_requests(&body, now_ms()).map_err(ApiError::bad_request)?;
    let queued = state
        .services
        .downlinks
        .queue(&id, requests, replace)
        .await?;
    Ok((StatusCode::ACCEPTED, Json(json!({ "downlinks": queued }))))
}

/// `DELETE`: deletes the open downlinks (finished ones stay listed).
async fn flush(State(state): State<AppState>, Path(id): Path<String>) -> ApiResult<Json<Value>> {
    let flushed = state.services.downlinks.flush(&id).await?;
    Ok(Json(json!({ "flushed": flushed })))
}

/// The IoT Agent JSON protocol's query: `k` the API key, `i` the device.
#[derive(Debug, Deserialize)]
struct IotAgentParams {
    /// The IoT Agent's API key: a credential, checked by the route's
    /// guard with the other ingest credentials.
    #[allow(dead_code)]
    k: Option<String>,
    i: String,
}

/// `POST /iot/json/commands?k=<apikey>&i=<device>` with `{"<command>":
/// <result>}`: the device's answer to commands it was sent (the IoT
/// Agents' `cmdexe`); each command gets `<command>_status` `OK` and
/// `<command>_info` the result. The credential (as `k`, or in
/// `Authorization`) is the global ingest key, an ingest key whose pins
/// hold the device, or a global admin key, checked by the route's guard
/// ([`crate::auth::admit_ingest`]). 200; 401 without a
/// working credential; 403 for a key whose pins the device is outside of;
/// 400 for a body naming no command of the device, 404 for an unknown
/// device.
async fn command_answer(
    State(state): State<AppState>,
    Query(params): Query<IotAgentParams>,
    Extension(pins): Extension<IngestPins>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let body: Value = parse_body(&body)?;
    let Value::Object(answers) = body else {
        return Err(ApiError::bad_request(
            "body must be a JSON object {\"<command>\": <result>}",
        ));
    };
    let answered = weft_pipeline::uplink::command_result(
        &state.services,
        &params.i,
        &answers,
        &pins.uplink_pins(),
    )
    .await
    .map_err(|refused| match refused {
        CommandResultRefused::Forbidden(why) => {
            ApiError::new(StatusCode::FORBIDDEN, "Forbidden", why)
        }
        CommandResultRefused::Downlink(e) => e.into(),
    })?;
    if answered.is_empty() {
        return Err(ApiError::bad_request(format!(
            "the body names no command of device '{}'",
            params.i
        )));
    }
    Ok(StatusCode::OK)
}
