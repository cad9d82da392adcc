//! Downlinks: what weft sends back to devices. A downlink is queued per
//! device (`/api/v1/devices/{id}/downlinks`, or an NGSI command), encoded
//! by the device type's codec when it was given as `data`, and sent by the
//! delivery worker through the integration the device's uplinks came from
//! (its [`DownlinkRoute`]). This module holds the records, the reading and
//! checking of a request body, and the pure parts of every route: which
//! URL, headers and body an HTTP route sends, which topic and payload an
//! MQTT route publishes. No I/O happens here.

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Largest LoRaWAN application payload (242 bytes at the fastest data
/// rates of most regions); a longer one could never be sent.
pub const MAX_PAYLOAD_BYTES: usize = 242;

/// The priorities The Things Stack's downlink queue knows, lowest first.
pub const PRIORITIES: [&str; 7] = [
    "LOWEST",
    "LOW",
    "BELOW_NORMAL",
    "NORMAL",
    "ABOVE_NORMAL",
    "HIGH",
    "HIGHEST",
];

/// Where a queued downlink is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DownlinkStatus {
    /// Waiting for the delivery worker (again, after a failed attempt).
    Queued,
    /// Waiting for a way to the device: weft knows no route yet, or the
    /// route needs a connection weft does not have; `reason` says which.
    /// Tried again when the device's route changes.
    Pending,
    /// Handed to the network server or the device, which accepted it.
    Sent,
    /// Every attempt failed; `reason` holds the last error.
    Failed,
    /// Its `expiresAt` passed before it could be sent.
    Expired,
}

impl DownlinkStatus {
    /// The status as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            DownlinkStatus::Queued => "queued",
            DownlinkStatus::Pending => "pending",
            DownlinkStatus::Sent => "sent",
            DownlinkStatus::Failed => "failed",
            DownlinkStatus::Expired => "expired",
        }
    }

    /// Whether the delivery worker still has work to do for it.
    pub fn is_open(self) -> bool {
        matches!(self, DownlinkStatus::Queued | DownlinkStatus::Pending)
    }
}

/// One downlink of a device's queue, as stored and as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Downlink {
    /// Unique id, given by weft.
    pub id: String,
    /// The device it is for.
    pub device_id: String,
    /// LoRaWAN port, 1–223.
    pub f_port: u32,
    /// Whether the device must acknowledge it.
    pub confirmed: bool,
    /// The Things Stack's priority name (`NORMAL` unless asked otherwise).
    pub priority: String,
    /// The payload to send.
    #[serde(with = "base64_bytes")]
    pub frm_payload: Vec<u8>,
    /// The object it was encoded from, when it was given as `data`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    /// The NGSI command that queued it, whose `<command>_status` and
    /// `<command>_info` follow it on the device's entity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// Where it is in its life.
    pub status: DownlinkStatus,
    /// Why it is pending, or the last error of a failed or retried attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Delivery attempts so far.
    #[serde(default)]
    pub attempts: u32,
    /// The route it was sent through (`ttn`, `chirpstack`, …), once sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
    /// When it was queued, epoch ms.
    pub created_at: i64,
    /// When its status last changed, epoch ms.
    pub updated_at: i64,
    /// When it was sent, epoch ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent_at: Option<i64>,
    /// After this, epoch ms, it is no longer sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<i64>,
    /// The earliest time of its next attempt, epoch ms.
    pub next_attempt_at: i64,
}

/// `Vec<u8>` as standard base64 in JSON, LoRaWAN's usual payload text.
mod base64_bytes {
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(serde::de::Error::custom)
    }
}

/// What a request asks to send: raw bytes, or an object the device type's
/// codec encodes.
#[derive(Debug, Clone, PartialEq)]
pub enum DownlinkPayload {
    /// `bytes` / `frm_payload` / `frmPayload`: base64, sent as they are.
    Raw(Vec<u8>),
    /// `data` / `decoded_payload`: encoded by `encodeDownlink`.
    Data(Value),
}

/// One downlink as a client asked for it, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct DownlinkRequest {
    /// The port asked for; required with raw bytes, optional with `data`
    /// (the codec may choose).
    pub f_port: Option<u32>,
    /// Whether the device must acknowledge it.
    pub confirmed: bool,
    /// The Things Stack's priority name.
    pub priority: String,
    /// What to send.
    pub payload: DownlinkPayload,
    /// When it stops being worth sending, epoch ms.
    pub expires_at: Option<i64>,
}

/// Reads a push/replace body: one downlink object, or The Things Stack's
/// `{"downlinks":[…]}` (an empty list is allowed: a replace with it empties
/// the queue). Every field is checked and the first problem named, so a
/// bad request changes nothing. `now` is the time expiries are checked
/// against.
pub fn parse_requests(body: &Value, now: i64) -> Result<Vec<DownlinkRequest>, String> {
    let Value::Object(object) = body else {
        return Err("body must be a JSON object: a downlink or {\"downlinks\":[…]}".into());
    };
    match object.get("downlinks") {
        Some(Value::Array(items)) => {
            if object.len() > 1 {
                return Err("next to \"downlinks\" no other field is allowed".into());
            }
            if items.len() > MAX_BATCH {
                return Err(format!("at most {MAX_BATCH} downlinks per request"));
            }
            items
                .iter()
                .enumerate()
                .map(|(i, item)| {
                    parse_request(item, now).map_err(|e| format!("downlinks[{i}]: {e}"))
                })
                .collect()
        }
        Some(_) => Err("\"downlinks\" must be an array".into()),
        None => Ok(vec![parse_request(body, now)?]),
    }
}

/// Most downlinks one request may queue; a device's queue is for a few
/// commands, not bulk data.
pub const MAX_BATCH: usize = 64;

/// The fields a downlink object may have (TTN's snake_case names and
/// weft's camelCase ones).
const FIELDS: &[&str] = &[
    "fPort",
    "f_port",
    "confirmed",
    "priority",
    "data",
    "decoded_payload",
    "bytes",
    "frm_payload",
    "frmPayload",
    "expiresAt",
    "expires_at",
];

fn parse_request(item: &Value, now: i64) -> Result<DownlinkRequest, String> {
    let Value::Object(o) = item else {
        return Err("a downlink must be a JSON object".into());
    };
    if let Some(unknown) = o.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(format!(
            "unknown field '{unknown}' (expected fPort, confirmed, priority, data or bytes, expiresAt)"
        ));
    }
    let one_of = |names: &[&str]| -> Result<Option<&Value>, String> {
        let given: Vec<&str> = names
            .iter()
            .copied()
            .filter(|n| o.contains_key(*n))
            .collect();
        if given.len() > 1 {
            return Err(format!(
                "'{}' and '{}' say the same; give one",
                given[0], given[1]
            ));
        }
        Ok(given.first().and_then(|n| o.get(*n)))
    };
    let f_port = match one_of(&["fPort", "f_port"])? {
        None | Some(Value::Null) => None,
        Some(v) => Some(check_port(v)?),
    };
    let confirmed = match o.get("confirmed") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err("confirmed must be true or false".into()),
    };
    let priority = match o.get("priority") {
        None | Some(Value::Null) => "NORMAL".to_string(),
        Some(Value::String(p)) if PRIORITIES.contains(&p.as_str()) => p.clone(),
        Some(other) => {
            return Err(format!(
                "priority {other} is not one of {}",
                PRIORITIES.join(", ")
            ))
        }
    };
    let raw = one_of(&["bytes", "frm_payload", "frmPayload"])?;
    let data = one_of(&["data", "decoded_payload"])?;
    let payload = match (raw, data) {
        (Some(_), Some(_)) => {
            return Err(
                "give either data (encoded by the codec) or bytes (base64), not both".into(),
            )
        }
        (None, None) => return Err("a downlink needs data (an object) or bytes (base64)".into()),
        (Some(Value::String(text)), None) => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(text.trim())
                .map_err(|e| format!("bytes must be base64: {e}"))?;
            check_length(&bytes)?;
            DownlinkPayload::Raw(bytes)
        }
        (Some(_), None) => return Err("bytes must be a base64 string".into()),
        (None, Some(Value::Object(data))) => DownlinkPayload::Data(Value::Object(data.clone())),
        (None, Some(_)) => return Err("data must be a JSON object".into()),
    };
    if matches!(payload, DownlinkPayload::Raw(_)) && f_port.is_none() {
        return Err("fPort is required with raw bytes".into());
    }
    let expires_at = match one_of(&["expiresAt", "expires_at"])? {
        None | Some(Value::Null) => None,
        Some(v) => {
            let at = read_time(v)?;
            if at <= now {
                return Err("expiresAt is in the past".into());
            }
            Some(at)
        }
    };
    Ok(DownlinkRequest {
        f_port,
        confirmed,
        priority,
        payload,
        expires_at,
    })
}

/// Checks an application port (1–223; 0 is MAC commands, 224+ reserved).
pub fn check_port(value: &Value) -> Result<u32, String> {
    match value.as_u64() {
        Some(p @ 1..=223) => Ok(p as u32),
        _ => Err(format!("fPort must be an integer 1-223, not {value}")),
    }
}

/// Checks a payload fits one LoRaWAN frame.
pub fn check_length(bytes: &[u8]) -> Result<(), String> {
    if bytes.len() > MAX_PAYLOAD_BYTES {
        return Err(format!(
            "the payload is {} bytes; a downlink carries at most {MAX_PAYLOAD_BYTES}",
            bytes.len()
        ));
    }
    Ok(())
}

/// An expiry as epoch ms, or an RFC 3339 time (`2026-01-02T03:04:05Z`).
fn read_time(value: &Value) -> Result<i64, String> {
    match value {
        Value::Number(n) => n
            .as_i64()
            .filter(|ms| *ms > 0)
            .ok_or_else(|| format!("expiresAt {n} is not epoch milliseconds")),
        Value::String(text) => chrono::DateTime::parse_from_rfc3339(text.trim())
            .map(|t| t.timestamp_millis())
            .map_err(|e| format!("expiresAt '{text}' is not an RFC 3339 time: {e}")),
        other => Err(format!(
            "expiresAt {other} is neither a time nor epoch milliseconds"
        )),
    }
}

/// How a device is reached, learnt from the way its uplinks come in (or
/// set on the device, for IoT Agent devices with an `endpoint`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum DownlinkRoute {
    /// The Things Stack's webhook: the downlink queue push/replace URLs and
    /// the API key its uplinks carried in `X-Downlink-Push`,
    /// `X-Downlink-Replace` and `X-Downlink-Apikey`.
    #[serde(rename = "ttn-webhook", rename_all = "camelCase")]
    TtnWebhook {
        /// `X-Downlink-Push`: appends to the device's queue.
        push_url: String,
        /// `X-Downlink-Replace`: replaces the device's queue.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        replace_url: Option<String>,
        /// `X-Downlink-Apikey`, sent as `Authorization: Bearer`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        api_key: Option<String>,
    },
    /// The Things Stack over MQTT: `v3/{app}@{tenant}/devices/{dev}/down/push`.
    #[serde(rename = "ttn-mqtt", rename_all = "camelCase")]
    TtnMqtt {
        /// The MQTT source (`[mqtt.sources.<name>]`) the uplinks came from.
        source: String,
        /// The MQTT user name, `{app}@{tenant}`.
        application: String,
        /// The device id in The Things Stack.
        device_id: String,
    },
    /// ChirpStack v4's REST API: `POST {api}/api/devices/{devEui}/queue`,
    /// with the API URL and token from weft's configuration.
    #[serde(rename = "chirpstack-rest", rename_all = "camelCase")]
    ChirpStackRest {
        /// The device's DevEUI, as ChirpStack names it.
        dev_eui: String,
    },
    /// ChirpStack v4 over MQTT: `application/{id}/device/{devEui}/command/down`.
    #[serde(rename = "chirpstack-mqtt", rename_all = "camelCase")]
    ChirpStackMqtt {
        /// The MQTT source the uplinks came from.
        source: String,
        /// ChirpStack's application id.
        application_id: String,
        /// The device's DevEUI.
        dev_eui: String,
    },
    /// Helium's (and sensae's) HTTP integration: the uplink's `downlink_url`.
    Helium {
        /// Where Helium takes downlinks for this device.
        url: String,
    },
    /// An IoT Agent HTTP device: a command POSTed to its `endpoint`.
    #[serde(rename = "iot-agent-http")]
    IotAgentHttp {
        /// The device's own HTTP endpoint.
        endpoint: String,
    },
    /// An IoT Agent MQTT device: `/{apikey}/{device}/cmd`.
    #[serde(rename = "iot-agent-mqtt", rename_all = "camelCase")]
    IotAgentMqtt {
        /// The MQTT source the device publishes on (`broker` for the
        /// embedded broker).
        source: String,
        /// The API key of the device's group.
        apikey: String,
        /// The device id in the topic.
        device_id: String,
        /// How the device reads its commands: the protocol it measures in.
        #[serde(default)]
        protocol: IotaProtocol,
    },
}

/// The FIWARE IoT Agent protocol a device speaks, which decides how its
/// commands are written (and its answers read).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IotaProtocol {
    /// IoT Agent JSON: `{"<command>": <value>}`.
    #[default]
    Json,
    /// UltraLight 2.0: `<device>@<command>|<value>`.
    Ul,
}

impl DownlinkRoute {
    /// A short name of the route, shown with sent downlinks and in metrics.
    pub fn name(&self) -> &'static str {
        match self {
            DownlinkRoute::TtnWebhook { .. } => "ttn",
            DownlinkRoute::TtnMqtt { .. } => "ttn-mqtt",
            DownlinkRoute::ChirpStackRest { .. } => "chirpstack",
            DownlinkRoute::ChirpStackMqtt { .. } => "chirpstack-mqtt",
            DownlinkRoute::Helium { .. } => "helium",
            DownlinkRoute::IotAgentHttp { .. } => "iot-agent",
            DownlinkRoute::IotAgentMqtt { .. } => "iot-agent-mqtt",
        }
    }

    /// The MQTT source the route publishes through, for MQTT routes.
    pub fn mqtt_source(&self) -> Option<&str> {
        match self {
            DownlinkRoute::TtnMqtt { source, .. }
            | DownlinkRoute::ChirpStackMqtt { source, .. }
            | DownlinkRoute::IotAgentMqtt { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// An HTTP request a route sends, built without I/O.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpDelivery {
    /// Where to POST.
    pub url: String,
    /// Extra headers (`Authorization`, ChirpStack's `Grpc-Metadata-Authorization`).
    pub headers: Vec<(String, String)>,
    /// The JSON body.
    pub body: Value,
}

/// An MQTT message a route publishes, built without I/O.
#[derive(Debug, Clone, PartialEq)]
pub struct MqttDelivery {
    /// The MQTT source (connection) to publish on.
    pub source: String,
    /// The topic.
    pub topic: String,
    /// The payload.
    pub payload: Vec<u8>,
}

/// How a downlink leaves weft on a given route.
#[derive(Debug, Clone, PartialEq)]
pub enum Delivery {
    /// An HTTP POST.
    Http(HttpDelivery),
    /// An MQTT publication.
    Mqtt(MqttDelivery),
}

/// ChirpStack's REST API, from weft's configuration.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChirpStackApi {
    /// The API's base URL (`http://chirpstack:8090`).
    pub url: String,
    /// An API token ChirpStack issued.
    pub token: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn b64(bytes: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    const NOW: i64 = 1_700_000_000_000;

    fn downlink() -> Downlink {
        Downlink {
            id: "d1".into(),
            device_id: "eui-1".into(),
            f_port: 10,
            confirmed: true,
            priority: "HIGH".into(),
            frm_payload: vec![1, 5],
            data: Some(json!({"ring": 5})),
            command: Some("ring".into()),
            status: DownlinkStatus::Queued,
            reason: None,
            attempts: 0,
            route: None,
            created_at: NOW,
            updated_at: NOW,
            sent_at: None,
            expires_at: None,
            next_attempt_at: NOW,
        }
    }

    /// A single object and TTN's `{"downlinks":[…]}` both read; raw bytes
    /// need a port, data does not; defaults are TTN's.
    #[test]
    fn requests_read_both_shapes() {
        let one = parse_requests(&json!({"fPort": 2, "bytes": "AQI="}), NOW).unwrap();
        assert_eq!(
            one,
            vec![DownlinkRequest {
                f_port: Some(2),
                confirmed: false,
                priority: "NORMAL".into(),
                payload: DownlinkPayload::Raw(vec![1, 2]),
                expires_at: None,
            }]
        );
        let many = parse_requests(
            &json!({"downlinks": [
                {"f_port": 3, "frm_payload": "AA==", "confirmed": true, "priority": "HIGHEST"},
                {"data": {"ring": 1}, "expiresAt": "2030-01-01T00:00:00Z"}
            ]}),
            NOW,
        )
        .unwrap();
        assert_eq!(many.len(), 2);
        assert_eq!(many[1].payload, DownlinkPayload::Data(json!({"ring": 1})));
        assert_eq!(many[1].expires_at, Some(1_893_456_000_000));
        assert!(parse_requests(&json!({"downlinks": []}), NOW)
            .unwrap()
            .is_empty());
    }

    /// Every bad field is a clear error naming it.
    #[test]
    fn bad_requests_are_named() {
        let err = |body: Value| parse_requests(&body, NOW).unwrap_err();
        assert!(err(json!({"bytes": "AQI="})).contains("fPort is required"));
        assert!(err(json!({"fPort": 0, "bytes": "AQI="})).contains("1-223"));
        assert!(err(json!({"fPort": 224, "bytes": "AQI="})).contains("1-223"));
        assert!(err(json!({"fPort": 1, "bytes": "%%%"})).contains("base64"));
        assert!(err(json!({"fPort": 1})).contains("needs data"));
        assert!(err(json!({"fPort": 1, "bytes": "AA==", "data": {}})).contains("not both"));
        assert!(err(json!({"data": [1]})).contains("object"));
        assert!(err(json!({"data": {}, "priority": "URGENT"})).contains("priority"));
        assert!(err(json!({"data": {}, "confirmed": "yes"})).contains("confirmed"));
        assert!(err(json!({"data": {}, "port": 1})).contains("unknown field 'port'"));
        assert!(err(json!({"data": {}, "expiresAt": 5})).contains("past"));
        assert!(err(json!({"data": {}, "expiresAt": "soon"})).contains("RFC 3339"));
        assert!(err(json!({"downlinks": [{"data": {}}, {"fPort": 1}]})).starts_with("downlinks[1]"));
        assert!(err(json!([1])).contains("JSON object"));
        let long = b64(&[0; 243]);
        assert!(err(json!({"fPort": 1, "bytes": long})).contains("at most 242"));
    }

    /// Stored routes written before the protocol existed read as JSON.
    #[test]
    fn old_iot_agent_routes_read_as_json() {
        let old: DownlinkRoute = serde_json::from_str(
            r#"{"kind":"iot-agent-mqtt","source":"s","apikey":"k","deviceId":"d"}"#,
        )
        .unwrap();
        assert!(matches!(
            old,
            DownlinkRoute::IotAgentMqtt {
                protocol: IotaProtocol::Json,
                ..
            }
        ));
    }

    /// Records and routes survive a JSON round trip (how they are stored).
    #[test]
    fn records_round_trip() {
        let d = downlink();
        let text = serde_json::to_string(&d).unwrap();
        assert!(text.contains("\"frmPayload\":\"AQU=\""));
        assert_eq!(serde_json::from_str::<Downlink>(&text).unwrap(), d);
        let route = DownlinkRoute::ChirpStackRest {
            dev_eui: "01".into(),
        };
        let text = serde_json::to_string(&route).unwrap();
        assert_eq!(text, r#"{"kind":"chirpstack-rest","devEui":"01"}"#);
        assert_eq!(serde_json::from_str::<DownlinkRoute>(&text).unwrap(), route);
    }
}
