//! The Things Stack (v3): its webhook (`/api/v1/uplinks/ttn`) and its MQTT
//! server post the same messages. The device is
//! `end_device_ids.device_id`; an uplink's identity is its `as:up:`
//! correlation id, its time `received_at`, its payload
//! `uplink_message.frm_payload`/`f_port` (or the server's
//! `decoded_payload`). Every other message type (`join_accept`,
//! `downlink_ack`, `location_solved`, …) is a device event named by its
//! message field. The webhook's `X-Downlink-Push`, `X-Downlink-Replace`
//! and `X-Downlink-Apikey` headers are the way back.

use serde_json::{json, Map, Value};
use weft_model::downlink::{Delivery, HttpDelivery, MqttDelivery};
use weft_model::mapping::{get_path, value_as_id};
use weft_model::uplink::read_optional_time;
use weft_model::{Downlink, DownlinkRoute};

use super::{b64, copy_fields, is_url, Envelope, Header, NetworkServer, LOCATION_FIELDS};
use crate::decode::base64_bytes;

/// The Things Stack's downlink message (`{frm_payload, f_port, confirmed,
/// priority}`), shared by its webhook and MQTT APIs.
fn downlink_message(d: &Downlink) -> Value {
    json!({
        "frm_payload": b64(&d.frm_payload),
        "f_port": d.f_port,
        "confirmed": d.confirmed,
        "priority": d.priority,
    })
}

/// A downlink through the webhook's `X-Downlink-Push` (or, with
/// `replace`, `X-Downlink-Replace`) URL, with its API key as bearer.
pub(super) fn webhook_delivery(
    push_url: &str,
    replace_url: Option<&str>,
    api_key: Option<&str>,
    d: &Downlink,
    replace: bool,
) -> Delivery {
    let url = match (replace, replace_url) {
        (true, Some(r)) => r,
        _ => push_url,
    };
    let headers = api_key
        .iter()
        .map(|k| ("Authorization".to_string(), format!("Bearer {k}")))
        .collect();
    Delivery::Http(HttpDelivery {
        url: url.to_string(),
        headers,
        body: json!({ "downlinks": [downlink_message(d)] }),
    })
}

/// A downlink published on `v3/{application}/devices/{device}/down/push`
/// (or `…/replace`) through the MQTT source the uplinks came by.
pub(super) fn mqtt_delivery(
    source: &str,
    application: &str,
    device_id: &str,
    d: &Downlink,
    replace: bool,
) -> Delivery {
    Delivery::Mqtt(MqttDelivery {
        source: source.to_string(),
        topic: format!(
            "v3/{application}/devices/{device_id}/down/{}",
            if replace { "replace" } else { "push" }
        ),
        payload: json!({ "downlinks": [downlink_message(d)] })
            .to_string()
            .into_bytes(),
    })
}

/// The fields of a message that say which device and when, not what
/// happened: the message's kind is the other top-level object field.
const ENVELOPE_FIELDS: &[&str] = &[
    "end_device_ids",
    "correlation_ids",
    "received_at",
    "unique_id",
    "identifiers",
    "context",
    "data",
    "visibility",
    "origin",
];

/// Message fields that carry an uplink weft decodes.
const UPLINK_FIELDS: &[&str] = &["uplink_message"];

/// The Things Stack.
pub struct Ttn;

impl NetworkServer for Ttn {
    fn device(&self, body: &Value) -> Option<String> {
        get_path(body, "end_device_ids.device_id").and_then(value_as_id)
    }

    fn envelope(&self, body: &Value) -> Envelope {
        let s = |path: &str| get_path(body, path).and_then(value_as_id);
        let msg = get_path(body, "uplink_message");
        let up_id = get_path(body, "correlation_ids")
            .and_then(Value::as_array)
            .and_then(|ids| {
                ids.iter()
                    .filter_map(Value::as_str)
                    .find(|id| id.starts_with("as:up:"))
                    .map(str::to_string)
            });
        Envelope {
            data_id: up_id.or_else(|| {
                Some(format!(
                    "{}:{}:{}",
                    s("end_device_ids.device_id")?,
                    s("uplink_message.f_cnt").unwrap_or_default(),
                    s("received_at")?
                ))
            }),
            device_id: self.device(body),
            device_name: s("end_device_ids.device_id"),
            reported_at: read_optional_time("received_at", get_path(body, "received_at")),
            type_hint: s("uplink_message.version_ids.model_id"),
            channel_hint: s("end_device_ids.application_ids.application_id"),
            payload: msg.and_then(|m| {
                let raw = m.get("frm_payload")?.as_str()?;
                let port = m.get("f_port").and_then(Value::as_u64).unwrap_or(0) as u32;
                Some(base64_bytes(raw).map(|b| (b, port)))
            }),
            predecoded: msg
                .and_then(|m| m.get("decoded_payload"))
                .filter(|v| v.is_object())
                .cloned(),
        }
    }

    /// The message field of the body: `uplink_message` is an uplink; a
    /// body with no message field at all is left to the uplink path,
    /// which reports what is missing.
    fn event(&self, _named: Option<&str>, body: &Value) -> Option<String> {
        let obj = body.as_object()?;
        if UPLINK_FIELDS.iter().any(|f| obj.contains_key(*f)) {
            return None;
        }
        obj.iter()
            .find(|(k, v)| v.is_object() && !ENVELOPE_FIELDS.contains(&k.as_str()))
            .map(|(k, _)| k.clone())
    }

    fn event_time(&self, body: &Value) -> Option<String> {
        get_path(body, "received_at").and_then(value_as_id)
    }

    /// The Things Stack keeps a join's address with the device's ids, a
    /// solved location under `location_solved.location`, and a downlink's
    /// counter in its ack, nack or sent message; whether it was
    /// acknowledged is the message's name.
    fn event_fields(&self, kind: &str, event: &str, body: &Value) -> Map<String, Value> {
        let mut out = Map::new();
        match kind {
            "join" => copy_fields(
                &mut out,
                body,
                [("devAddr", "end_device_ids.dev_addr".to_string())],
            ),
            "location" => {
                copy_fields(
                    &mut out,
                    body,
                    LOCATION_FIELDS.map(|f| (f, format!("location_solved.location.{f}"))),
                );
            }
            "ack" => {
                out.insert("acknowledged".into(), (event != "downlink_nack").into());
                copy_fields(&mut out, body, [("fCntDown", format!("{event}.f_cnt"))]);
            }
            "txack" => copy_fields(
                &mut out,
                body,
                [("fCntDown", "downlink_sent.f_cnt".to_string())],
            ),
            _ => {}
        }
        out
    }

    /// `v3/{app}@{tenant}/devices/{dev}/up`, answered on `…/down/push`;
    /// the device as the pipeline names it (`end_device_ids.device_id`,
    /// the topic's when the body lacks it).
    fn mqtt_route(
        &self,
        source: &str,
        topic: &str,
        body: Option<&Value>,
    ) -> Option<(String, DownlinkRoute)> {
        let levels: Vec<&str> = topic.split('/').collect();
        let ["v3", app, "devices", dev, "up"] = levels.as_slice() else {
            return None;
        };
        if app.is_empty() || dev.is_empty() {
            return None;
        }
        let device = body
            .and_then(|b| get_path(b, "end_device_ids.device_id"))
            .and_then(Value::as_str)
            .unwrap_or(dev)
            .to_string();
        Some((
            device,
            DownlinkRoute::TtnMqtt {
                source: source.to_string(),
                application: app.to_string(),
                device_id: dev.to_string(),
            },
        ))
    }

    fn http_route(
        &self,
        _event: Option<&str>,
        header: &Header<'_>,
        body: &Value,
    ) -> Option<(String, DownlinkRoute)> {
        let push_url = header("x-downlink-push").filter(|u| is_url(u))?;
        let device = get_path(body, "end_device_ids.device_id")
            .and_then(Value::as_str)?
            .to_string();
        Some((
            device,
            DownlinkRoute::TtnWebhook {
                push_url,
                replace_url: header("x-downlink-replace").filter(|u| is_url(u)),
                api_key: header("x-downlink-apikey"),
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn envelopes_and_events() {
        let ttn = json!({"end_device_ids":{"device_id":"eui-1","dev_eui":"A1","application_ids":{"application_id":"farm"}},
            "correlation_ids":["as:up:01ABC","rpc:x"],"received_at":"2026-01-02T03:04:05.123456Z",
            "uplink_message":{"f_port":85,"f_cnt":3,"frm_payload":"AXVc","decoded_payload":{"battery":92}}});
        let e = Ttn.envelope(&ttn);
        assert_eq!(e.data_id.as_deref(), Some("as:up:01ABC"));
        assert_eq!(e.device_id.as_deref(), Some("eui-1"));
        assert_eq!(e.channel_hint.as_deref(), Some("farm"));
        assert_eq!(e.reported_at, Ok(Some(1767323045123)));
        assert_eq!(e.predecoded, Some(json!({"battery":92})));
        assert_eq!(Ttn.event(None, &ttn), None);
        let ids = json!({"device_id": "d"});
        assert_eq!(
            Ttn.event(
                None,
                &json!({"end_device_ids": ids, "correlation_ids": [], "join_accept": {}})
            )
            .as_deref(),
            Some("join_accept")
        );
        assert_eq!(
            Ttn.event(None, &json!({"end_device_ids": ids, "something_new": {}}))
                .as_deref(),
            Some("something_new")
        );
        assert_eq!(Ttn.event(None, &json!({"end_device_ids": ids})), None);
    }

    /// An uplink topic teaches the way back over MQTT; other messages do not.
    #[test]
    fn uplink_topics_teach_the_mqtt_route() {
        let body = json!({"end_device_ids":{"device_id":"dev1"}});
        assert_eq!(
            Ttn.mqtt_route("s", "v3/app@ttn/devices/dev1/up", Some(&body)),
            Some((
                "dev1".into(),
                DownlinkRoute::TtnMqtt {
                    source: "s".into(),
                    application: "app@ttn".into(),
                    device_id: "dev1".into()
                }
            ))
        );
        assert_eq!(
            Ttn.mqtt_route("s", "v3/app@ttn/devices/dev1/join", Some(&body)),
            None
        );
    }

    /// The webhook's headers are the way back, for the body's device.
    #[test]
    fn webhook_headers_teach_the_route() {
        let body = json!({"end_device_ids": {"device_id": "dev1"}});
        let none = |_: &str| None;
        assert_eq!(Ttn.http_route(None, &none, &body), None);
        let headers = |name: &str| match name {
            "x-downlink-push" => Some("https://t/push".to_string()),
            "x-downlink-apikey" => Some("NNSXS.K".to_string()),
            _ => None,
        };
        assert_eq!(
            Ttn.http_route(None, &headers, &body),
            Some((
                "dev1".to_string(),
                DownlinkRoute::TtnWebhook {
                    push_url: "https://t/push".into(),
                    replace_url: None,
                    api_key: Some("NNSXS.K".into())
                }
            ))
        );
    }

    /// TTN's events show their fields under ChirpStack's names.
    #[test]
    fn event_fields_use_chirpstacks_names() {
        let join = json!({"end_device_ids": {"device_id": "eui-1", "dev_addr": "260B1234"},
                          "join_accept": {"session_key_id": "AX"}});
        assert_eq!(
            Ttn.event_fields("join", "join_accept", &join),
            json!({"devAddr": "260B1234"}).as_object().cloned().unwrap()
        );
        let nack = json!({"end_device_ids": {"device_id": "eui-1"}, "downlink_nack": {"f_cnt": 9}});
        assert_eq!(
            Ttn.event_fields("ack", "downlink_nack", &nack),
            json!({"acknowledged": false, "fCntDown": 9})
                .as_object()
                .cloned()
                .unwrap()
        );
        let solved = json!({"location_solved": {"location": {"latitude": 41.1, "longitude": -8.6, "source": "SOURCE_GPS"}}});
        assert_eq!(
            Ttn.event_fields("location", "location_solved", &solved),
            json!({"latitude": 41.1, "longitude": -8.6, "source": "SOURCE_GPS"})
                .as_object()
                .cloned()
                .unwrap()
        );
    }
}
