//! From an MQTT message (topic and payload) to the uplinks the ingest log
//! keeps. Each format reads its topics the way its network server or
//! agent writes them, and hands the pipeline the same envelope the HTTP
//! paths do: a TTN message is the TTN webhook's body, a ChirpStack event
//! the ChirpStack integration's body with the event named by the topic.
//! The IoT-Agent formats and `plain` name the device in the topic; that
//! id travels beside the body ([`NewUplink::device_id`]).
//!
//! Nothing here decodes a payload: that is the pipeline's job, so a
//! message weft can read at all is logged and a codec failure shows up as
//! a failed uplink, as on HTTP.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde_json::{Map, Number, Value};
use weft_model::device_event::is_event_name;
use weft_model::json::{parse_within_limits, JsonLimitError};
use weft_model::{DownlinkRoute, NewUplink, UplinkFormat, UplinkPins};

/// How a source's messages are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The Things Stack v3: `v3/{app}@{tenant}/devices/{dev}/{message}`.
    Ttn,
    /// ChirpStack v4: `application/{id}/device/{devEui}/event/{event}`.
    ChirpStack,
    /// FIWARE IoT Agent JSON: `/json/{apikey}/{device}/attrs[/{attr}]`.
    IotaJson,
    /// FIWARE IoT Agent UltraLight 2.0: `/ul/{apikey}/{device}/attrs[/{attr}]`.
    IotaUl,
    /// A topic of the user's choosing bound to one device type.
    Plain,
}

impl Format {
    /// Reads the configured name.
    pub fn parse(name: &str) -> Option<Format> {
        Some(match name {
            "ttn" => Format::Ttn,
            "chirpstack" => Format::ChirpStack,
            "iota-json" => Format::IotaJson,
            "iota-ul" => Format::IotaUl,
            "plain" => Format::Plain,
            _ => return None,
        })
    }

    /// The configured name.
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Ttn => "ttn",
            Format::ChirpStack => "chirpstack",
            Format::IotaJson => "iota-json",
            Format::IotaUl => "iota-ul",
            Format::Plain => "plain",
        }
    }

    /// The topic filter subscribed to when the configuration names none:
    /// every message type of every device (TTN, ChirpStack), every
    /// measure topic (IoT Agents); `plain` has no default.
    pub fn default_topic(self) -> Option<&'static str> {
        match self {
            Format::Ttn => Some("v3/+/devices/+/#"),
            Format::ChirpStack => Some("application/+/device/+/event/+"),
            Format::IotaJson => Some("/json/+/+/attrs/#"),
            Format::IotaUl => Some("/ul/+/+/attrs/#"),
            Format::Plain => None,
        }
    }

    /// The topic filters an IoT Agent source subscribes to besides its
    /// measures (`topic`): where its devices answer their commands, for
    /// the same API key and device levels as the measure topic
    /// (`/json/{key}/+/attrs/#` → `/json/{key}/+/cmdexe` and the older
    /// `/{key}/+/cmdexe`), so a source never hears other keys' answers.
    /// A measure topic of another shape gets the answers of every key.
    pub fn command_answer_topics(self, topic: &str) -> Vec<String> {
        let prefix = match self {
            Format::IotaJson => "json",
            Format::IotaUl => "ul",
            _ => return Vec::new(),
        };
        let levels: Vec<&str> = topic
            .strip_prefix('/')
            .unwrap_or(topic)
            .split('/')
            .collect();
        let (slash, key, device) = match levels.as_slice() {
            [p, key, device, "attrs", ..] if *p == prefix && *key != "#" && *device != "#" => {
                let slash = if topic.starts_with('/') { "/" } else { "" };
                (slash, *key, *device)
            }
            _ => ("/", "+", "+"),
        };
        vec![
            format!("{slash}{prefix}/{key}/{device}/cmdexe"),
            format!("{slash}{key}/{device}/cmdexe"),
        ]
    }
}

/// What a source (or the embedded broker) knows beyond the topic.
#[derive(Debug, Clone, Default)]
pub struct Route {
    /// Device type of every message, if configured.
    pub device_type: Option<String>,
    /// Channel of every message, if configured.
    pub channel: Option<String>,
    /// `plain`: the topic level holding the device id.
    pub device_level: usize,
    /// `plain`: the topic level holding the channel, if one does.
    pub channel_level: Option<usize>,
    /// `plain`: fPort for binary payloads.
    pub f_port: u32,
    /// IoT-Agent API keys → device types.
    pub api_keys: BTreeMap<String, String>,
    /// Whether an API key missing from `api_keys` is refused (a source:
    /// yes, since nothing else says the type) or left to the registered
    /// device's type (the embedded broker, whose devices are registered).
    pub unknown_keys_use_device_type: bool,
    /// Recorded as the uplinks' source.
    pub source: String,
}

/// What a message is.
#[derive(Debug, PartialEq)]
pub enum Message {
    /// Uplinks (or device events) to append to the ingest log, in order
    /// (an UltraLight message can carry several measure groups).
    Uplinks(Vec<NewUplink>),
    /// A message weft itself sends on the subscribed topics (a TTN
    /// `down/push`): not an uplink, dropped without counting as refused.
    Ignored,
    /// An IoT Agent device's answer to its commands (`…/cmdexe`): each
    /// command named, with its result.
    CommandAnswer {
        /// The device answering.
        device: String,
        /// `<command>` → result.
        answers: Map<String, Value>,
        /// What the topic's API key holds the device to: the source's
        /// channel, and the device type the key names (`api_keys`) or the
        /// source's; the answer counts only for a device within them.
        pins: UplinkPins,
    },
}

/// Reads one message. `Err` says why it cannot be an uplink; the caller
/// counts and logs it, and acknowledges it so it is not sent again.
pub fn read(
    format: Format,
    route: &Route,
    topic: &str,
    payload: &[u8],
    received_at: i64,
) -> Result<Message, String> {
    let uplink = |format: UplinkFormat,
                  device_id: Option<String>,
                  device_type: Option<String>,
                  event: Option<String>,
                  body: Vec<u8>| NewUplink {
        partition: 0,
        received_at,
        format,
        channel: route.channel.clone(),
        device_type: route.device_type.clone().or(device_type),
        event,
        device_id,
        source: Some(route.source.clone()),
        pins: UplinkPins::default(),
        body,
    };
    match format {
        Format::Ttn => {
            if topic.ends_with("/down/push") || topic.ends_with("/down/replace") {
                return Ok(Message::Ignored);
            }
            json_object(payload)?;
            Ok(Message::Uplinks(vec![uplink(
                UplinkFormat::Ttn,
                None,
                None,
                None,
                payload.to_vec(),
            )]))
        }
        Format::ChirpStack => {
            let levels: Vec<&str> = topic.split('/').collect();
            let event = match levels.as_slice() {
                ["application", _, "device", _, "event", event] => *event,
                ["application", _, "device", _, "command", _] => return Ok(Message::Ignored),
                _ => return Err(format!("'{topic}' is not a ChirpStack event topic")),
            };
            if !is_event_name(event) {
                return Err(format!("'{event}' is not an event name"));
            }
            json_object(payload)?;
            let event = (event != "up").then(|| event.to_string());
            Ok(Message::Uplinks(vec![uplink(
                UplinkFormat::ChirpStack,
                None,
                None,
                event,
                payload.to_vec(),
            )]))
        }
        Format::IotaJson | Format::IotaUl => {
            if let Some((key, device)) = command_answer_topic(format, topic) {
                let pins = answer_pins(route, key)?;
                return command_answer(format, device, payload, pins);
            }
            let (device, device_type, attr) = iota_topic(format, route, topic)?;
            let groups = match (format, attr) {
                (Format::IotaJson, None) => vec![json_object(payload)?],
                (Format::IotaJson, Some(attr)) => {
                    let value = match parse_within_limits(payload) {
                        Ok(v) => v,
                        Err(JsonLimitError::Syntax(_)) => Value::String(text(payload)?.into()),
                        Err(limit) => return Err(limit.to_string()),
                    };
                    vec![Map::from_iter([(attr, value)])]
                }
                (_, None) => ultralight(text(payload)?)?,
                (_, Some(attr)) => {
                    vec![Map::from_iter([(attr, ul_value(text(payload)?.trim()))])]
                }
            };
            Ok(Message::Uplinks(
                groups
                    .into_iter()
                    .map(|group| {
                        uplink(
                            UplinkFormat::Iota,
                            Some(device.clone()),
                            device_type.clone(),
                            None,
                            Value::Object(group).to_string().into_bytes(),
                        )
                    })
                    .collect(),
            ))
        }
        Format::Plain => {
            let device = topic
                .split('/')
                .nth(route.device_level)
                .filter(|d| !d.is_empty())
                .ok_or_else(|| {
                    format!(
                        "topic '{topic}' has no device id at level {}",
                        route.device_level
                    )
                })?;
            let mut up = plain(route, device, payload, uplink);
            if let Some(level) = route.channel_level {
                let channel = topic.split('/').nth(level).unwrap_or_default();
                if !weft_model::validate::is_object_id(channel) {
                    return Err(format!(
                        "topic '{topic}' has no valid channel at level {level}"
                    ));
                }
                up.channel = Some(channel.to_string());
            }
            Ok(Message::Uplinks(vec![up]))
        }
    }
}

/// A `plain` message (also the embedded broker's `devices/{id}/up`): a
/// JSON object is a decoded uplink (its fields are the measures, mapped
/// by the type's processor), unless it carries a raw payload (`payload`
/// in base64 or `bytes`, as sensae's encoded bodies do, the same rule as
/// the decode dry run); anything else is a binary payload for the type's
/// decoder, logged as `{"bytes": <base64>, "fPort": …}`.
pub fn plain(
    route: &Route,
    device: &str,
    payload: &[u8],
    uplink: impl Fn(UplinkFormat, Option<String>, Option<String>, Option<String>, Vec<u8>) -> NewUplink,
) -> NewUplink {
    match json_object(payload) {
        Ok(body) => uplink(
            if body.contains_key("payload") || body.contains_key("bytes") {
                UplinkFormat::SensaeEncoded
            } else {
                UplinkFormat::SensaeDecoded
            },
            Some(device.to_string()),
            None,
            None,
            payload.to_vec(),
        ),
        Err(_) => {
            let body = serde_json::json!({
                "bytes": base64::engine::general_purpose::STANDARD.encode(payload),
                "fPort": route.f_port,
            });
            uplink(
                UplinkFormat::SensaeEncoded,
                Some(device.to_string()),
                None,
                None,
                body.to_string().into_bytes(),
            )
        }
    }
}

/// The API key and device of an IoT Agent command answer topic:
/// `/json/{apikey}/{device}/cmdexe` (`/ul/…` for UltraLight), or the older
/// `/{apikey}/{device}/cmdexe`.
pub fn command_answer_topic(format: Format, topic: &str) -> Option<(&str, &str)> {
    let prefix = if format == Format::IotaJson {
        "json"
    } else {
        "ul"
    };
    let levels: Vec<&str> = topic
        .strip_prefix('/')
        .unwrap_or(topic)
        .split('/')
        .collect();
    let (key, device) = match levels.as_slice() {
        [p, key, device, "cmdexe"] if *p == prefix => (*key, *device),
        [key, device, "cmdexe"] if topic.starts_with('/') => (*key, *device),
        _ => return None,
    };
    (!device.is_empty()).then_some((key, device))
}

/// What a command answer's API key holds its device to, as the key's
/// measures are held: the source's channel, and the source's device type
/// or the one `api_keys` gives the key. A key that names no type is
/// refused on a source (as its measures are), and pins no type on the
/// embedded broker, whose devices logged in as themselves.
fn answer_pins(route: &Route, key: &str) -> Result<UplinkPins, String> {
    let device_type = route
        .device_type
        .clone()
        .or_else(|| route.api_keys.get(key).cloned());
    if device_type.is_none() && !route.unknown_keys_use_device_type {
        return Err(format!("unknown API key '{key}'"));
    }
    Ok(UplinkPins {
        channel: route.channel.clone(),
        device_type,
    })
}

/// Reads a command answer: IoT Agent JSON's `{"<command>": <result>}`, or
/// UltraLight's `<device>@<command>|<result>` (several joined by `#`;
/// the result kept as text).
fn command_answer(
    format: Format,
    device: &str,
    payload: &[u8],
    pins: UplinkPins,
) -> Result<Message, String> {
    let answers = match format {
        Format::IotaJson => json_object(payload)?,
        _ => {
            let mut answers = Map::new();
            for answer in text(payload)?.trim().split('#').filter(|a| !a.is_empty()) {
                let (named, rest) = answer.split_once('@').ok_or_else(|| {
                    format!(
                        "UltraLight command answer '{answer}' is not <device>@<command>|<result>"
                    )
                })?;
                if named != device {
                    return Err(format!(
                        "UltraLight command answer names device '{named}' on device '{device}''s topic"
                    ));
                }
                let (command, result) = rest.split_once('|').unwrap_or((rest, ""));
                answers.insert(command.to_string(), Value::String(result.to_string()));
            }
            answers
        }
    };
    if answers.is_empty() {
        return Err("a command answer names no command".into());
    }
    Ok(Message::CommandAnswer {
        device: device.to_string(),
        answers,
        pins,
    })
}

/// The device an uplink message is from and the way back to it over the
/// same connection (`source`), when the message is an uplink: each
/// network server's module in the pipeline reads its own topics
/// ([`weft_pipeline::uplink::NetworkServer::mqtt_route`]): The Things
/// Stack's `…/up` (answered on `down/push`), ChirpStack's `…/event/up`
/// (answered on `command/down`), an IoT Agent device's
/// `/{json|ul}/{apikey}/{device}/attrs…` (answered on `/{apikey}/{device}/cmd`).
pub fn downlink_route(
    format: Format,
    source: &str,
    topic: &str,
    payload: &[u8],
) -> Option<(String, DownlinkRoute)> {
    let server = match format {
        Format::Ttn => UplinkFormat::Ttn,
        Format::ChirpStack => UplinkFormat::ChirpStack,
        Format::IotaJson | Format::IotaUl => UplinkFormat::Iota,
        Format::Plain => return None,
    };
    let body = match format {
        Format::Ttn | Format::ChirpStack => parse_within_limits(payload).ok(),
        _ => None,
    };
    weft_pipeline::uplink::server(server).mqtt_route(source, topic, body.as_ref())
}

/// `/json/{apikey}/{device}/attrs[/{attr}]` (the leading `/` optional, as
/// the IoT Agents accept both): the device, its type and the attribute of
/// a single-attribute topic.
fn iota_topic(
    format: Format,
    route: &Route,
    topic: &str,
) -> Result<(String, Option<String>, Option<String>), String> {
    let prefix = if format == Format::IotaJson {
        "json"
    } else {
        "ul"
    };
    let levels: Vec<&str> = topic
        .strip_prefix('/')
        .unwrap_or(topic)
        .split('/')
        .collect();
    let (key, device, attr) = match levels.as_slice() {
        [p, key, device, "attrs"] if *p == prefix => (*key, *device, None),
        [p, key, device, "attrs", attr] if *p == prefix && !attr.is_empty() => {
            (*key, *device, Some(attr.to_string()))
        }
        _ => {
            return Err(format!(
            "'{topic}' is not an IoT Agent measure topic (/{prefix}/{{apikey}}/{{device}}/attrs)"
        ))
        }
    };
    if device.is_empty() {
        return Err(format!("'{topic}' names no device"));
    }
    let device_type = match route.api_keys.get(key) {
        Some(t) => Some(t.clone()),
        None if route.device_type.is_some() || route.unknown_keys_use_device_type => None,
        None => return Err(format!("unknown API key '{key}'")),
    };
    Ok((device.to_string(), device_type, attr))
}

/// UltraLight 2.0 measures: `k|v|k|v`, several groups separated by `#`,
/// each group optionally led by its ISO 8601 time (`2026-01-02T03:04:05Z|t|21`).
fn ultralight(text: &str) -> Result<Vec<Map<String, Value>>, String> {
    let mut groups = Vec::new();
    for group in text.trim().split('#') {
        let group = group.trim();
        if group.is_empty() {
            continue;
        }
        let mut fields: Vec<&str> = group.split('|').collect();
        let mut map = Map::new();
        if fields.len() % 2 == 1 {
            let time = fields.remove(0).trim();
            if chrono::DateTime::parse_from_rfc3339(time).is_err() {
                return Err(format!(
                    "UltraLight group '{group}' is not key|value pairs (nor led by a time)"
                ));
            }
            map.insert("TimeInstant".into(), Value::String(time.into()));
        }
        for pair in fields.chunks(2) {
            let key = pair[0].trim();
            if key.is_empty() {
                return Err(format!("UltraLight group '{group}' has an empty key"));
            }
            map.insert(key.to_string(), ul_value(pair[1].trim()));
        }
        if !map.is_empty() {
            groups.push(map);
        }
    }
    if groups.is_empty() {
        return Err("empty UltraLight payload".into());
    }
    Ok(groups)
}

/// An UltraLight value: a number when it reads as one (so it can be
/// charted and aggregated), the text otherwise.
fn ul_value(text: &str) -> Value {
    text.parse::<f64>()
        .ok()
        .filter(|n| n.is_finite() && !text.starts_with('+') && !text.ends_with('.'))
        .and_then(|_| serde_json::from_str::<Number>(text).ok())
        .map(Value::Number)
        .unwrap_or_else(|| Value::String(text.to_string()))
}

fn text(payload: &[u8]) -> Result<&str, String> {
    std::str::from_utf8(payload).map_err(|_| "payload is not UTF-8 text".to_string())
}

/// The payload as a JSON object within the JSON limits, as the HTTP paths
/// require of a body.
fn json_object(payload: &[u8]) -> Result<Map<String, Value>, String> {
    match parse_within_limits(payload) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) | Err(JsonLimitError::Syntax(_)) => Err("payload is not a JSON object".into()),
        Err(limit) => Err(limit.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route() -> Route {
        Route {
            api_keys: BTreeMap::from([("k1".into(), "thermo".into())]),
            source: "src".into(),
            device_level: 1,
            f_port: 2,
            ..Route::default()
        }
    }

    fn uplinks(m: Message) -> Vec<NewUplink> {
        match m {
            Message::Uplinks(u) => u,
            other => panic!("not uplinks: {other:?}"),
        }
    }

    /// Command answers on both topics, in JSON and UltraLight; a UL answer
    /// naming another device is refused.
    #[test]
    fn command_answers_name_device_and_results() {
        let r = route();
        let answer =
            |format, topic: &str, payload: &str| read(format, &r, topic, payload.as_bytes(), 0);
        let expected = |result: Value| Message::CommandAnswer {
            device: "lamp1".into(),
            answers: Map::from_iter([("ring".to_string(), result)]),
            pins: UplinkPins {
                channel: None,
                device_type: Some("thermo".into()),
            },
        };
        assert_eq!(
            answer(
                Format::IotaJson,
                "/json/k1/lamp1/cmdexe",
                r#"{"ring":"done"}"#
            ),
            Ok(expected(Value::String("done".into())))
        );
        assert_eq!(
            answer(Format::IotaJson, "/k1/lamp1/cmdexe", r#"{"ring":3}"#),
            Ok(expected(serde_json::json!(3)))
        );
        assert_eq!(
            answer(
                Format::IotaUl,
                "/ul/k1/lamp1/cmdexe",
                "lamp1@ring|rang|twice"
            ),
            Ok(expected(Value::String("rang|twice".into())))
        );
        assert!(answer(Format::IotaUl, "/ul/k1/lamp1/cmdexe", "other@ring|x").is_err());
        assert!(answer(Format::IotaJson, "/json/k1/lamp1/cmdexe", "{}").is_err());
        // A key the source does not know answers for no device.
        assert!(
            answer(Format::IotaJson, "/json/k/lamp1/cmdexe", r#"{"ring":1}"#)
                .unwrap_err()
                .contains("unknown API key")
        );
        // Not an answer topic: still a measure topic or an error.
        assert!(answer(Format::IotaJson, "json/k/lamp1/cmdexe/x", "{}").is_err());
    }

    /// Command answers are heard for the measure topic's API key only.
    #[test]
    fn answer_topics_follow_the_measure_topic() {
        assert_eq!(
            Format::IotaJson.command_answer_topics("/json/k1/+/attrs/#"),
            ["/json/k1/+/cmdexe", "/k1/+/cmdexe"]
        );
        assert_eq!(
            Format::IotaUl.command_answer_topics("ul/+/+/attrs"),
            ["ul/+/+/cmdexe", "+/+/cmdexe"]
        );
        assert_eq!(
            Format::IotaJson.command_answer_topics("#"),
            ["/json/+/+/cmdexe", "/+/+/cmdexe"]
        );
        assert!(Format::Ttn.command_answer_topics("v3/#").is_empty());
    }

    /// What an uplink topic teaches about the way back, by format (the
    /// topics themselves are the network servers' modules' to read).
    #[test]
    fn uplink_topics_teach_mqtt_downlink_routes() {
        let ttn = downlink_route(
            Format::Ttn,
            "s",
            "v3/app@ttn/devices/dev1/up",
            br#"{"end_device_ids":{"device_id":"dev1"}}"#,
        );
        assert!(matches!(ttn, Some((d, DownlinkRoute::TtnMqtt { .. })) if d == "dev1"));
        let ul = downlink_route(Format::IotaUl, "s", "ul/k/lamp/attrs/t", b"1");
        assert!(matches!(ul, Some((d, DownlinkRoute::IotAgentMqtt { .. })) if d == "lamp"));
        assert_eq!(downlink_route(Format::Plain, "s", "a/b", b"{}"), None);
    }

    fn body(u: &NewUplink) -> Value {
        serde_json::from_slice(&u.body).unwrap()
    }

    #[test]
    fn ttn_messages_pass_as_the_webhook_body_and_own_downlinks_are_ignored() {
        let r = route();
        let u = uplinks(
            read(
                Format::Ttn,
                &r,
                "v3/app@ttn/devices/d1/up",
                br#"{"a":1}"#,
                5,
            )
            .unwrap(),
        );
        assert_eq!(u[0].format, UplinkFormat::Ttn);
        assert_eq!(u[0].source.as_deref(), Some("src"));
        assert_eq!(u[0].received_at, 5);
        assert_eq!(
            read(Format::Ttn, &r, "v3/app@ttn/devices/d1/down/push", b"{}", 5).unwrap(),
            Message::Ignored
        );
        assert!(read(Format::Ttn, &r, "v3/app@ttn/devices/d1/up", b"[1]", 5).is_err());
    }

    #[test]
    fn chirpstack_events_are_named_by_the_topic() {
        let r = route();
        let t = "application/42/device/0102030405060708/event/";
        let up = uplinks(read(Format::ChirpStack, &r, &format!("{t}up"), b"{}", 1).unwrap());
        assert_eq!(up[0].event, None);
        let join = uplinks(read(Format::ChirpStack, &r, &format!("{t}join"), b"{}", 1).unwrap());
        assert_eq!(join[0].event.as_deref(), Some("join"));
        assert!(read(Format::ChirpStack, &r, "application/42/x", b"{}", 1).is_err());
    }

    #[test]
    fn iota_json_names_device_and_type_from_topic_and_key() {
        let r = route();
        let u = uplinks(
            read(
                Format::IotaJson,
                &r,
                "/json/k1/dev1/attrs",
                br#"{"t":21}"#,
                1,
            )
            .unwrap(),
        );
        assert_eq!(u[0].format, UplinkFormat::Iota);
        assert_eq!(u[0].device_id.as_deref(), Some("dev1"));
        assert_eq!(u[0].device_type.as_deref(), Some("thermo"));
        let one = uplinks(read(Format::IotaJson, &r, "json/k1/dev1/attrs/h", b"55", 1).unwrap());
        assert_eq!(body(&one[0]), serde_json::json!({"h": 55}));
        let text = uplinks(read(Format::IotaJson, &r, "/json/k1/dev1/attrs/s", b"on", 1).unwrap());
        assert_eq!(body(&text[0]), serde_json::json!({"s": "on"}));
        assert!(
            read(Format::IotaJson, &r, "/json/nope/dev1/attrs", b"{}", 1)
                .unwrap_err()
                .contains("unknown API key")
        );
        assert!(read(Format::IotaJson, &r, "/json/k1/dev1/attrs", b"{", 1).is_err());
    }

    #[test]
    fn ultralight_groups_are_one_uplink_each() {
        let r = route();
        let u = uplinks(
            read(
                Format::IotaUl,
                &r,
                "/ul/k1/dev1/attrs",
                b"t|21.5|s|on#2026-01-02T03:04:05Z|t|22",
                1,
            )
            .unwrap(),
        );
        assert_eq!(u.len(), 2);
        assert_eq!(body(&u[0]), serde_json::json!({"t": 21.5, "s": "on"}));
        assert_eq!(
            body(&u[1]),
            serde_json::json!({"TimeInstant": "2026-01-02T03:04:05Z", "t": 22})
        );
        assert!(read(Format::IotaUl, &r, "/ul/k1/dev1/attrs", b"t|1|x", 1).is_err());
        assert!(read(Format::IotaUl, &r, "/ul/k1/dev1/attrs", b"", 1).is_err());
        let one = uplinks(read(Format::IotaUl, &r, "/ul/k1/dev1/attrs/t", b"7", 1).unwrap());
        assert_eq!(body(&one[0]), serde_json::json!({"t": 7}));
    }

    #[test]
    fn plain_json_is_decoded_and_binary_goes_to_the_decoder() {
        let r = route();
        let j = uplinks(read(Format::Plain, &r, "site/d9/data", br#"{"t":1}"#, 1).unwrap());
        assert_eq!(
            (j[0].format, j[0].device_id.as_deref()),
            (UplinkFormat::SensaeDecoded, Some("d9"))
        );
        let b = uplinks(read(Format::Plain, &r, "site/d9/data", &[1, 2, 0xff], 1).unwrap());
        assert_eq!(b[0].format, UplinkFormat::SensaeEncoded);
        assert_eq!(
            body(&b[0]),
            serde_json::json!({"bytes": "AQL/", "fPort": 2})
        );
        assert!(read(Format::Plain, &r, "site", b"{}", 1).is_err());
    }
}
