//! Uplinks in. `POST /sensor-data/{channel}/{encoded|decoded}/{type}` is
//! sensae's path, unchanged for its devices and integrations; the TTN v3
//! and ChirpStack v4 webhooks have their own paths. Every handler checks
//! the key, validates cheaply (names, JSON object), appends the raw body to
//! the ingest log and answers 202 only after that append has committed.
//! Decoding happens later in the pipeline, so a bad payload is recorded as
//! a failed uplink, not refused here.

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Extension;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::Value;
use weft_model::device_event::is_event_name;
use weft_model::validate::is_sensae_name;
use weft_model::{now_ms, NewUplink, UplinkFormat};

use crate::auth::IngestPins;
use crate::routes::{post, Access, Routes};
use crate::{ApiError, ApiResult, AppState};

/// The ingest routes: each wants an ingest credential.
pub fn routes() -> Routes {
    Routes::new()
        .route(
            "/sensor-data/{channel}/{info_type}/{device_type}",
            post(Access::Ingest, sensae_uplink),
        )
        .route("/api/v1/uplinks/ttn", post(Access::Ingest, ttn_uplink))
        .route(
            "/api/v1/uplinks/chirpstack",
            post(Access::Ingest, chirpstack_uplink),
        )
}

/// sensae's ingest: `Authorization` carries the raw key. 401 before
/// anything else, then 400 for bad names or a body that is not a JSON
/// object, then 202 once durably logged.
async fn sensae_uplink(
    State(state): State<AppState>,
    Path((channel, info_type, device_type)): Path<(String, String, String)>,
    Extension(pins): Extension<IngestPins>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<StatusCode> {
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
    let uplink = NewUplink {
        partition: 0,
        received_at: now_ms(),
        format,
        channel,
        device_type,
        event: None,
        device_id: None,
        source: None,
        pins: pins.uplink_pins(),
        body: body.to_vec(),
    };
    accept_uplink(&state, uplink, &headers).await
}

/// Optional routing hints on the webhook paths, for network servers whose
/// messages do not name weft's channel or device type.
#[derive(Debug, Deserialize)]
struct WebhookParams {
    channel: Option<String>,
    #[serde(rename = "type")]
    device_type: Option<String>,
    /// ChirpStack's event name (`up`, `join`, `status`, …): every event is
    /// posted to the one URL, named here.
    event: Option<String>,
}

/// The Things Stack (v3) webhook: an uplink message, or any other message
/// type (`join_accept`, `downlink_ack`, `location_solved`, …), told apart
/// by the pipeline from the body's message field and kept as the device's
/// event.
async fn ttn_uplink(
    State(state): State<AppState>,
    Query(params): Query<WebhookParams>,
    Extension(pins): Extension<IngestPins>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<StatusCode> {
    webhook(state, pins, UplinkFormat::Ttn, params, headers, body).await
}

/// ChirpStack v4 HTTP integration: `?event=up` (or no `event`) is an
/// uplink; any other event (`join`, `status`, `ack`, `txack`, `log`,
/// `location`, `integration`, or one weft does not know) is logged the
/// same way and kept as the device's event (docs/data-units.md).
async fn chirpstack_uplink(
    State(state): State<AppState>,
    Query(params): Query<WebhookParams>,
    Extension(pins): Extension<IngestPins>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<StatusCode> {
    webhook(state, pins, UplinkFormat::ChirpStack, params, headers, body).await
}

async fn webhook(
    state: AppState,
    pins: IngestPins,
    format: UplinkFormat,
    params: WebhookParams,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<StatusCode> {
    for name in [&params.channel, &params.device_type].into_iter().flatten() {
        if !weft_model::validate::is_object_id(name) {
            return Err(ApiError::bad_request(format!("invalid name '{name}'")));
        }
    }
    let event = match params.event {
        Some(e) if format != UplinkFormat::ChirpStack => {
            return Err(ApiError::bad_request(format!(
                "unknown parameter 'event' ({e}): only ChirpStack names its events in the URL"
            )))
        }
        Some(e) if !is_event_name(&e) => {
            return Err(ApiError::bad_request(
                "event must be 1-64 characters of [A-Za-z0-9_.-]",
            ))
        }
        Some(e) if e == "up" => None,
        other => other,
    };
    let (mut channel, mut device_type) = (params.channel, params.device_type);
    pins.apply(&mut channel, &mut device_type)?;
    let uplink = NewUplink {
        partition: 0,
        received_at: now_ms(),
        format,
        channel,
        device_type,
        event,
        device_id: None,
        source: None,
        pins: pins.uplink_pins(),
        body: body.to_vec(),
    };
    accept_uplink(&state, uplink, &headers).await
}

/// Checks that the body is a JSON object within the JSON limits and hands
/// it to the uplink journey ([`weft_pipeline::uplink::accept`]): held to
/// the key's pins, appended to the ingest log, 202 once committed, and
/// the way back to the device learnt.
async fn accept_uplink(
    state: &AppState,
    uplink: NewUplink,
    headers: &HeaderMap,
) -> ApiResult<StatusCode> {
    let body = check_body(&uplink.body).map_err(ApiError::bad_request)?;
    // The network server's module knows how its webhook tells the way
    // back (TTN's `X-Downlink-*` headers, ChirpStack's DevEUI, Helium's
    // `downlink_url`).
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let route = weft_pipeline::uplink::server(uplink.format).http_route(
        uplink.event.as_deref(),
        &header,
        &body,
    );
    let arrival = weft_pipeline::uplink::Arrival {
        uplinks: vec![uplink],
        parsed: Some(body),
        route,
    };
    weft_pipeline::uplink::accept(
        &state.services,
        arrival,
        &weft_pipeline::uplink::Patience::Once,
    )
    .await?;
    Ok(StatusCode::ACCEPTED)
}

/// Checks `body` is one JSON object within the JSON limits: it is kept
/// as sent and shown again with failed uplinks, so it must be JSON any
/// client can read back (no 10,000-deep nesting, no `1e400`).
fn check_body(body: &[u8]) -> Result<Value, String> {
    use weft_model::json::{parse_within_limits, JsonLimitError};
    match parse_within_limits(body) {
        Ok(value) if value.is_object() => Ok(value),
        Ok(_) | Err(JsonLimitError::Syntax(_)) => Err("body must be a JSON object".into()),
        Err(limit) => Err(limit.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_well_formed_objects_within_limits_pass() {
        assert!(check_body(br#" {"a":1}"#).is_ok());
        for bad in [&br#"[1]"#[..], br#"{"a":1"#, br#"{"a":1} x"#, b""] {
            assert_eq!(
                check_body(bad).unwrap_err(),
                "body must be a JSON object".to_string()
            );
        }
        let deep = format!("{{\"a\":{}{}}}", "[".repeat(5_000), "]".repeat(5_000));
        assert!(check_body(deep.as_bytes()).unwrap_err().contains("deeper"));
        assert!(check_body(br#"{"a":1e400}"#)
            .unwrap_err()
            .contains("out of range"));
    }
}
