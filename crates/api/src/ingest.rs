//! Uplinks in. `POST /sensor-data/{channel}/{encoded|decoded}/{type}` is
//! sensae's path, unchanged for its devices and integrations; the TTN v3
//! and ChirpStack v4 webhooks have their own paths. Every handler checks
//! the credential ([`crate::auth::admit_ingest`]), validates cheaply (names, JSON object), appends the raw body to
//! the ingest log and answers 202 only after that append has committed.
//! Decoding happens later in the pipeline, so a bad payload is recorded as
//! a failed uplink, not refused here.

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use serde::Deserialize;
use weft_model::validate::is_sensae_name;
use weft_model::{now_ms, NewUplink, UplinkFormat};

use crate::{ApiError, ApiResult, AppState};

/// The ingest routes.
pub fn router() -> Router<AppState> {
    Router::new()
        .route(
            "/sensor-data/{channel}/{info_type}/{device_type}",
            post(sensae_uplink),
        )
        .route("/api/v1/uplinks/ttn", post(ttn_uplink))
        .route("/api/v1/uplinks/chirpstack", post(chirpstack_uplink))
}

/// sensae's ingest: `Authorization` carries the raw key. 401 before
/// anything else, then 400 for bad names or a body that is not a JSON
/// object, then 202 once durably logged.
async fn sensae_uplink(
    State(state): State<AppState>,
    Path((channel, info_type, device_type)): Path<(String, String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let pins = crate::auth::admit_ingest(&state, &headers, false)?;
    let format = match info_type.as_str() {
        "encoded" => UplinkFormat::SensaeEncoded,
        "decoded" => UplinkFormat::SensaeDecoded,
        _ => {
            return Err(ApiError::bad_request(
                "infoType must be 'encoded' or 'decoded'",
            ))
        }
    };
    if !is_sensae_name(&channel) {
        return Err(ApiError::bad_request(
            "channel must match [a-zA-Z0-9]{2,15}",
        ));
    }
    if !is_sensae_name(&device_type) {
        return Err(ApiError::bad_request(
            "device type must match [a-zA-Z0-9]{2,15}",
        ));
    }
    let (mut channel, mut device_type) = (Some(channel), Some(device_type));
    pins.apply(&mut channel, &mut device_type)?;
    accept(&state, format, channel, device_type, body).await
}

/// Optional routing hints on the webhook paths, for network servers whose
/// messages do not name weft's channel or device type.
#[derive(Debug, Deserialize)]
struct WebhookParams {
    channel: Option<String>,
    #[serde(rename = "type")]
    device_type: Option<String>,
}

/// The Things Stack (v3) webhook "uplink message".
async fn ttn_uplink(
    State(state): State<AppState>,
    Query(params): Query<WebhookParams>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<StatusCode> {
    webhook(state, UplinkFormat::Ttn, params, headers, body).await
}

/// ChirpStack v4 HTTP integration, `up` event.
async fn chirpstack_uplink(
    State(state): State<AppState>,
    Query(params): Query<WebhookParams>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<StatusCode> {
    webhook(state, UplinkFormat::ChirpStack, params, headers, body).await
}

async fn webhook(
    state: AppState,
    format: UplinkFormat,
    params: WebhookParams,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let pins = crate::auth::admit_ingest(&state, &headers, true)?;
    for name in [&params.channel, &params.device_type].into_iter().flatten() {
        if !weft_model::validate::is_object_id(name) {
            return Err(ApiError::bad_request(format!("invalid name '{name}'")));
        }
    }
    let (mut channel, mut device_type) = (params.channel, params.device_type);
    pins.apply(&mut channel, &mut device_type)?;
    accept(&state, format, channel, device_type, body).await
}

async fn accept(
    state: &AppState,
    format: UplinkFormat,
    channel: Option<String>,
    device_type: Option<String>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    if !is_json_object(&body) {
        return Err(ApiError::bad_request("body must be a JSON object"));
    }
    let uplink = NewUplink {
        received_at: now_ms(),
        format,
        channel,
        device_type,
        body: body.to_vec(),
    };
    state.services.ingest.accept(uplink).await?;
    Ok(StatusCode::ACCEPTED)
}

/// Whether `body` is one well-formed JSON object, checked without building it.
fn is_json_object(body: &[u8]) -> bool {
    let starts_with_brace = body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    starts_with_brace && serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok()
}

#[cfg(test)]
mod tests {
    use super::is_json_object;

    #[test]
    fn only_well_formed_objects_pass() {
        assert!(is_json_object(br#" {"a":1}"#));
        assert!(!is_json_object(br#"[1]"#));
        assert!(!is_json_object(br#"{"a":1"#));
        assert!(!is_json_object(br#"{"a":1} x"#));
        assert!(!is_json_object(b""));
    }
}
