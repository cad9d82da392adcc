//! sensae's own path (`/sensor-data/{channel}/{encoded|decoded}/{type}`),
//! the Helium-style bodies it takes, and the plain MQTT topics and the
//! embedded broker's `devices/{id}/up`, which log their messages in the
//! same formats: `uuid`/`dataId`, `id`/`device.id`/`dev_eui`, `name`,
//! `reported_at`, and the payload as `payload` (base64) or `bytes` (an
//! array, hex or base64) with its port in `port`/`fPort`/`f_port`.
//! Helium's `downlink_url` is the way back.

use serde_json::{json, Value};
use weft_model::downlink::{Delivery, HttpDelivery};
use weft_model::mapping::{get_path, value_as_id};
use weft_model::uplink::read_optional_time;
use weft_model::{Downlink, DownlinkRoute};

use super::{b64, is_url, Envelope, Header, NetworkServer};
use crate::decode::{base64_bytes, hex_or_base64};

/// A downlink POSTed to the `downlink_url` a Helium uplink gave, in the
/// body Helium's HTTP integration takes.
pub(super) fn helium_delivery(url: &str, d: &Downlink) -> Delivery {
    Delivery::Http(HttpDelivery {
        url: url.to_string(),
        headers: Vec::new(),
        body: json!({
            "payload_raw": b64(&d.frm_payload),
            "port": d.f_port,
            "confirmed": d.confirmed,
        }),
    })
}

/// Body fields that identify a sensae/Helium uplink rather than measure
/// anything; left out of `measures` when no processor says otherwise.
pub const ENVELOPE_FIELDS: &[&str] = &[
    "uuid",
    "id",
    "name",
    "reported_at",
    "reportedAt",
    "dataId",
    "device",
    "downlink_url",
    "payload",
    "port",
    "fPort",
    "f_port",
    "bytes",
];

/// sensae and Helium.
pub struct Sensae;

impl NetworkServer for Sensae {
    fn device(&self, body: &Value) -> Option<String> {
        let s = |path: &str| get_path(body, path).and_then(value_as_id);
        s("id").or_else(|| s("device.id")).or_else(|| s("dev_eui"))
    }

    fn envelope(&self, body: &Value) -> Envelope {
        let s = |path: &str| get_path(body, path).and_then(value_as_id);
        Envelope {
            data_id: s("uuid").or_else(|| s("dataId")),
            device_id: self.device(body),
            device_name: s("name").or_else(|| s("device.name")),
            reported_at: match get_path(body, "reported_at") {
                Some(at) => read_optional_time("reported_at", Some(at)),
                None => read_optional_time("reportedAt", get_path(body, "reportedAt")),
            },
            payload: payload(body),
            ..Envelope::empty()
        }
    }

    /// Helium's `downlink_url` (http(s) only).
    fn http_route(
        &self,
        _event: Option<&str>,
        _header: &Header<'_>,
        body: &Value,
    ) -> Option<(String, DownlinkRoute)> {
        let url = get_path(body, "downlink_url")
            .and_then(Value::as_str)
            .filter(|u| is_url(u))?
            .to_string();
        let device = self.device(body)?;
        Some((device, DownlinkRoute::Helium { url }))
    }
}

/// The payload of a sensae/Helium body: `payload` (base64), or `bytes` as
/// an array of numbers, hex or base64; the port from `port`/`fPort`/`f_port`.
pub(crate) fn payload(body: &Value) -> Option<Result<(Vec<u8>, u32), String>> {
    let port = ["port", "fPort", "f_port"]
        .iter()
        .find_map(|k| body.get(*k).and_then(Value::as_u64))
        .unwrap_or(0) as u32;
    let bytes = if let Some(raw) = body.get("payload").and_then(Value::as_str) {
        base64_bytes(raw)
    } else {
        match body.get("bytes")? {
            Value::Array(items) => items
                .iter()
                .map(|v| v.as_u64().filter(|n| *n < 256).map(|n| n as u8))
                .collect::<Option<Vec<u8>>>()
                .ok_or_else(|| "`bytes` must be an array of numbers 0-255".to_string()),
            Value::String(s) => hex_or_base64(s),
            _ => Err("`bytes` must be an array, hex or base64".to_string()),
        }
    };
    Some(bytes.map(|b| (b, port)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn helium_bodies_give_identity_payload_and_the_way_back() {
        let body = json!({"uuid":"u1","id":"d1","name":"P1","reported_at":5,"port":85,
                          "payload":"AXVc","downlink_url":"https://console/down"});
        let e = Sensae.envelope(&body);
        assert_eq!(e.data_id.as_deref(), Some("u1"));
        assert_eq!(e.device_id.as_deref(), Some("d1"));
        assert_eq!(e.reported_at, Ok(Some(5)));
        assert_eq!(e.payload, Some(Ok((vec![0x01, 0x75, 0x5c], 85))));
        let none = |_: &str| None;
        assert_eq!(
            Sensae.http_route(None, &none, &body),
            Some((
                "d1".into(),
                DownlinkRoute::Helium {
                    url: "https://console/down".into()
                }
            ))
        );
        let bad = json!({"id": "h1", "downlink_url": "file:///etc/passwd"});
        assert_eq!(Sensae.http_route(None, &none, &bad), None);
        assert!(Sensae
            .envelope(&json!({"reported_at": "2026-01-01"}))
            .reported_at
            .is_err());
    }

    #[test]
    fn bytes_accept_arrays_hex_and_base64() {
        assert_eq!(payload(&json!({"bytes":[1,2]})), Some(Ok((vec![1, 2], 0))));
        assert_eq!(
            payload(&json!({"bytes":"01 75 5C","fPort":85})),
            Some(Ok((vec![1, 0x75, 0x5c], 85)))
        );
        assert_eq!(
            payload(&json!({"bytes":"AXVc"})),
            Some(Ok((vec![1, 0x75, 0x5c], 0)))
        );
        assert!(matches!(payload(&json!({"bytes":[300]})), Some(Err(_))));
        assert_eq!(payload(&json!({"temperature":1})), None);
    }
}
