//! FIWARE IoT Agent devices (JSON and UltraLight 2.0, over MQTT): the
//! topic names the device and the API key its type, so the body is only
//! attributes, but for `TimeInstant`, when the measure was taken.

use serde_json::{json, Map, Value};
use weft_model::downlink::{Delivery, HttpDelivery, IotaProtocol, MqttDelivery};
use weft_model::mapping::get_path;
use weft_model::uplink::read_optional_time;
use weft_model::{Downlink, DownlinkRoute};

use super::{b64, Envelope, NetworkServer};

/// The attribute saying when a measure was taken (ISO 8601); it becomes
/// `reportedAt`, not a measure.
pub const TIME_FIELD: &str = "TimeInstant";

/// The IoT Agents' devices.
pub struct Iota;

/// What an IoT Agent device is sent for a command: `{"<command>": value}`,
/// the value being what the command attribute was set to (the downlink's
/// `data` under the command's name); a downlink that is no command sends
/// its `data`, or its bytes as base64 under `payload`.
pub fn iot_agent_command(d: &Downlink) -> Value {
    match (&d.command, &d.data) {
        (Some(command), Some(Value::Object(data))) => {
            let value = data.get(command).cloned().unwrap_or(Value::Null);
            let mut out = Map::new();
            out.insert(command.clone(), value);
            Value::Object(out)
        }
        (_, Some(data)) => data.clone(),
        _ => json!({ "payload": b64(&d.frm_payload), "fPort": d.f_port }),
    }
}

/// What an UltraLight 2.0 device is sent for a command:
/// `<device>@<command>|<value>`, the value as text (a string as it is, an
/// object as `key=value` pairs joined by `|`, anything else its JSON); a
/// downlink that is no command sends each field of its `data` the same
/// way, or its bytes as base64 under the command name `payload`.
pub fn ultralight_command(device_id: &str, d: &Downlink) -> String {
    let text = |value: &Value| match value {
        Value::String(s) => s.clone(),
        Value::Object(fields) => fields
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => format!("{k}={s}"),
                other => format!("{k}={other}"),
            })
            .collect::<Vec<_>>()
            .join("|"),
        other => other.to_string(),
    };
    if d.data.is_none() {
        return format!("{device_id}@payload|{}", b64(&d.frm_payload));
    }
    match iot_agent_command(d) {
        Value::Object(commands) if !commands.is_empty() => commands
            .iter()
            .map(|(command, value)| format!("{device_id}@{command}|{}", text(value)))
            .collect::<Vec<_>>()
            .join("#"),
        _ => format!("{device_id}@payload|{}", b64(&d.frm_payload)),
    }
}

/// A command POSTed to an HTTP device's endpoint, as IoT Agent JSON
/// sends it.
pub(super) fn http_delivery(endpoint: &str, d: &Downlink) -> Delivery {
    Delivery::Http(HttpDelivery {
        url: endpoint.to_string(),
        headers: Vec::new(),
        body: iot_agent_command(d),
    })
}

/// A command published on `/{apikey}/{device}/cmd`, in the device's
/// protocol, as the IoT Agents publish commands.
pub(super) fn mqtt_delivery(
    source: &str,
    apikey: &str,
    device_id: &str,
    protocol: IotaProtocol,
    d: &Downlink,
) -> Delivery {
    Delivery::Mqtt(MqttDelivery {
        source: source.to_string(),
        topic: format!("/{apikey}/{device_id}/cmd"),
        payload: match protocol {
            IotaProtocol::Json => iot_agent_command(d).to_string().into_bytes(),
            IotaProtocol::Ul => ultralight_command(device_id, d).into_bytes(),
        },
    })
}

impl NetworkServer for Iota {
    fn device(&self, _body: &Value) -> Option<String> {
        None
    }

    fn envelope(&self, body: &Value) -> Envelope {
        Envelope {
            reported_at: read_optional_time(TIME_FIELD, get_path(body, TIME_FIELD)),
            ..Envelope::empty()
        }
    }

    /// A measure topic, `/{json|ul}/{apikey}/{device}/attrs[/…]` (the
    /// leading `/` optional), is answered on `/{apikey}/{device}/cmd` in
    /// the topic's protocol.
    fn mqtt_route(
        &self,
        source: &str,
        topic: &str,
        _body: Option<&Value>,
    ) -> Option<(String, DownlinkRoute)> {
        let levels: Vec<&str> = topic
            .strip_prefix('/')
            .unwrap_or(topic)
            .split('/')
            .collect();
        let [protocol, key, device, "attrs", ..] = levels.as_slice() else {
            return None;
        };
        let protocol = match *protocol {
            "json" => IotaProtocol::Json,
            "ul" => IotaProtocol::Ul,
            _ => return None,
        };
        if key.is_empty() || device.is_empty() {
            return None;
        }
        Some((
            device.to_string(),
            DownlinkRoute::IotAgentMqtt {
                source: source.to_string(),
                apikey: key.to_string(),
                device_id: device.to_string(),
                protocol,
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measure_topics_teach_the_mqtt_route() {
        assert_eq!(
            Iota.mqtt_route("s", "ul/k/lamp/attrs/t", None),
            Some((
                "lamp".into(),
                DownlinkRoute::IotAgentMqtt {
                    source: "s".into(),
                    apikey: "k".into(),
                    device_id: "lamp".into(),
                    protocol: IotaProtocol::Ul
                }
            ))
        );
        assert!(matches!(
            Iota.mqtt_route("s", "/json/k/lamp/attrs", None),
            Some((
                _,
                DownlinkRoute::IotAgentMqtt {
                    protocol: IotaProtocol::Json,
                    ..
                }
            ))
        ));
        assert_eq!(Iota.mqtt_route("s", "/json/k/lamp/cmdexe", None), None);
    }
}
