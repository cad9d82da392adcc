//! FIWARE IoT Agent devices (JSON and UltraLight 2.0, over MQTT): the
//! topic names the device and the API key its type, so the body is only
//! attributes, but for `TimeInstant`, when the measure was taken.

use serde_json::Value;
use weft_model::downlink::IotaProtocol;
use weft_model::mapping::get_path;
use weft_model::uplink::read_optional_time;
use weft_model::DownlinkRoute;

use super::{Envelope, NetworkServer};

/// The attribute saying when a measure was taken (ISO 8601); it becomes
/// `reportedAt`, not a measure.
pub const TIME_FIELD: &str = "TimeInstant";

/// The IoT Agents' devices.
pub struct Iota;

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
