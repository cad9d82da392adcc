//! ChirpStack v4: its HTTP integration (`/api/v1/uplinks/chirpstack`) and
//! its MQTT integration post the same events. The device is
//! `deviceInfo.devEui`; an uplink's identity is `deduplicationId`, its
//! time `time`, its payload `data`/`fPort` (or the codec's `object`). The
//! event is named in `?event=` (or the MQTT topic): `up` (or none) is an
//! uplink, any other a device event. Its REST API, configured in weft, is
//! the way back to a device whose uplinks came from it.

use serde_json::{json, Map, Value};
use weft_model::downlink::{ChirpStackApi, Delivery, HttpDelivery, MqttDelivery};
use weft_model::mapping::{get_path, value_as_id};
use weft_model::uplink::read_optional_time;
use weft_model::{Downlink, DownlinkRoute};

use super::{b64, copy_fields, Envelope, Header, NetworkServer, LOCATION_FIELDS};
use crate::decode::base64_bytes;

/// ChirpStack.
pub struct ChirpStack;

/// A downlink queued through ChirpStack's REST API
/// (`POST {api}/api/devices/{devEui}/queue`), which must be configured.
pub(super) fn rest_delivery(
    dev_eui: &str,
    d: &Downlink,
    api: Option<&ChirpStackApi>,
) -> Result<Delivery, String> {
    let api = api.ok_or_else(|| {
        "no ChirpStack API is configured for this device ([downlinks.chirpstack])".to_string()
    })?;
    Ok(Delivery::Http(HttpDelivery {
        url: format!(
            "{}/api/devices/{dev_eui}/queue",
            api.url.trim_end_matches('/')
        ),
        headers: vec![
            (
                "Grpc-Metadata-Authorization".to_string(),
                format!("Bearer {}", api.token),
            ),
            ("Authorization".to_string(), format!("Bearer {}", api.token)),
        ],
        body: json!({ "queueItem": {
            "confirmed": d.confirmed,
            "fPort": d.f_port,
            "data": b64(&d.frm_payload),
        }}),
    }))
}

/// A downlink published on `application/{id}/device/{devEui}/command/down`
/// through the MQTT source the uplinks came by.
pub(super) fn mqtt_delivery(
    source: &str,
    application_id: &str,
    dev_eui: &str,
    d: &Downlink,
) -> Delivery {
    Delivery::Mqtt(MqttDelivery {
        source: source.to_string(),
        topic: format!("application/{application_id}/device/{dev_eui}/command/down"),
        payload: json!({
            "devEui": dev_eui,
            "confirmed": d.confirmed,
            "fPort": d.f_port,
            "data": b64(&d.frm_payload),
        })
        .to_string()
        .into_bytes(),
    })
}

impl NetworkServer for ChirpStack {
    fn device(&self, body: &Value) -> Option<String> {
        get_path(body, "deviceInfo.devEui").and_then(value_as_id)
    }

    fn envelope(&self, body: &Value) -> Envelope {
        let s = |path: &str| get_path(body, path).and_then(value_as_id);
        Envelope {
            data_id: s("deduplicationId"),
            device_id: self.device(body),
            device_name: s("deviceInfo.deviceName"),
            reported_at: read_optional_time("time", get_path(body, "time")),
            type_hint: s("deviceInfo.deviceProfileName"),
            channel_hint: s("deviceInfo.applicationName"),
            payload: get_path(body, "data").and_then(Value::as_str).map(|raw| {
                let port = get_path(body, "fPort").and_then(Value::as_u64).unwrap_or(0) as u32;
                base64_bytes(raw).map(|b| (b, port))
            }),
            predecoded: get_path(body, "object").filter(|v| v.is_object()).cloned(),
        }
    }

    fn event(&self, named: Option<&str>, _body: &Value) -> Option<String> {
        named.filter(|e| *e != "up").map(str::to_string)
    }

    fn event_time(&self, body: &Value) -> Option<String> {
        get_path(body, "time").and_then(value_as_id)
    }

    /// ChirpStack's events carry the fields at the top of the body, under
    /// the names weft shows.
    fn event_fields(&self, kind: &str, _event: &str, body: &Value) -> Map<String, Value> {
        let names: &[&str] = match kind {
            "join" => &["devAddr"],
            "status" => &[
                "batteryLevel",
                "batteryLevelUnavailable",
                "margin",
                "externalPowerSource",
            ],
            "location" => {
                let mut out = Map::new();
                copy_fields(
                    &mut out,
                    body,
                    LOCATION_FIELDS.map(|f| (f, format!("location.{f}"))),
                );
                return out;
            }
            "ack" => &["acknowledged", "fCntDown", "queueItemId"],
            "txack" => &["fCntDown", "gatewayId", "queueItemId"],
            "log" => &["level", "code", "description"],
            _ => &[],
        };
        let mut out = Map::new();
        copy_fields(&mut out, body, names.iter().map(|f| (*f, f.to_string())));
        out
    }

    /// `application/{id}/device/{devEui}/event/up`, answered on
    /// `…/command/down`; the device as the pipeline names it
    /// (`deviceInfo.devEui`, the topic's when the body lacks it).
    fn mqtt_route(
        &self,
        source: &str,
        topic: &str,
        body: Option<&Value>,
    ) -> Option<(String, DownlinkRoute)> {
        let levels: Vec<&str> = topic.split('/').collect();
        let ["application", app, "device", eui, "event", "up"] = levels.as_slice() else {
            return None;
        };
        if app.is_empty() || eui.is_empty() {
            return None;
        }
        let dev_eui = body
            .and_then(|b| get_path(b, "deviceInfo.devEui"))
            .and_then(Value::as_str)
            .unwrap_or(eui)
            .to_string();
        Some((
            dev_eui.clone(),
            DownlinkRoute::ChirpStackMqtt {
                source: source.to_string(),
                application_id: app.to_string(),
                dev_eui,
            },
        ))
    }

    /// An uplink's DevEUI: downlinks go through the REST API configured
    /// for it.
    fn http_route(
        &self,
        event: Option<&str>,
        _header: &Header<'_>,
        body: &Value,
    ) -> Option<(String, DownlinkRoute)> {
        if event.is_some() {
            return None;
        }
        let dev_eui = get_path(body, "deviceInfo.devEui")
            .and_then(Value::as_str)?
            .to_string();
        Some((dev_eui.clone(), DownlinkRoute::ChirpStackRest { dev_eui }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn envelopes_events_and_the_way_back() {
        let cs = json!({"deduplicationId":"dd","time":"2026-01-02T03:04:05Z","fPort":85,"data":"AXVc",
            "deviceInfo":{"devEui":"0102","deviceName":"n","deviceProfileName":"em300th","applicationName":"app"}});
        let e = ChirpStack.envelope(&cs);
        assert_eq!(e.data_id.as_deref(), Some("dd"));
        assert_eq!(e.type_hint.as_deref(), Some("em300th"));
        assert_eq!(e.payload, Some(Ok((vec![0x01, 0x75, 0x5c], 85))));
        assert_eq!(ChirpStack.event(None, &cs), None);
        assert_eq!(ChirpStack.event(Some("up"), &cs), None);
        assert_eq!(ChirpStack.event(Some("join"), &cs).as_deref(), Some("join"));
        let none = |_: &str| None;
        assert_eq!(
            ChirpStack.http_route(None, &none, &cs),
            Some((
                "0102".to_string(),
                DownlinkRoute::ChirpStackRest {
                    dev_eui: "0102".into()
                }
            ))
        );
        assert_eq!(ChirpStack.http_route(Some("join"), &none, &cs), None);
        let up = ChirpStack.mqtt_route("s", "application/a1/device/0102/event/up", Some(&cs));
        assert!(matches!(up, Some((d, DownlinkRoute::ChirpStackMqtt { .. })) if d == "0102"));
        assert_eq!(
            ChirpStack.mqtt_route("s", "application/a1/device/0102/event/join", Some(&cs)),
            None
        );
    }

    /// ChirpStack's events keep their fields where weft shows them from;
    /// null ones are left out.
    #[test]
    fn event_fields_are_read_where_chirpstack_keeps_them() {
        let status = json!({"deviceInfo": {"devEui": "0101"}, "margin": 7, "batteryLevel": 75.5,
                            "externalPowerSource": false, "batteryLevelUnavailable": null});
        assert_eq!(
            ChirpStack.event_fields("status", "status", &status),
            json!({"margin": 7, "batteryLevel": 75.5, "externalPowerSource": false})
                .as_object()
                .cloned()
                .unwrap()
        );
        let location = json!({"location": {"latitude": 1.5, "longitude": 2.5}});
        assert_eq!(
            ChirpStack.event_fields("location", "location", &location),
            json!({"latitude": 1.5, "longitude": 2.5})
                .as_object()
                .cloned()
                .unwrap()
        );
        assert!(ChirpStack
            .event_fields("integration", "integration", &status)
            .is_empty());
    }
}
