//! The uplink journey: what a device (or its network server) sends, from
//! the bytes a transport hands in to what the ingest log keeps, and the
//! command results devices answer with.
//!
//! The steps, in order:
//!
//! 1. **Credential.** The transport checks who sent it and says what that
//!    credential holds it to ([`UplinkPins`]: an ingest key's channel and
//!    device type; nothing for the global ingest key, an admin key, MQTT).
//! 2. **Accept.** [`crate::Ingest::accept`] finds the device the transport
//!    or the envelope names (before any decoding) and refuses an uplink
//!    whose registered device lies outside the pins; otherwise it appends
//!    the uplink, pins included, to the ingest log.
//! 3. **Decode** (the consumer, [`crate::decode`]): a registered device
//!    keeps its type (`TypeMismatch`), a device only the decoded payload
//!    names is held to the pins (`Forbidden`), a reported time that is no
//!    time fails (`InvalidUplink`) — each a failed uplink with its reason.
//!
//! Command results ([`command_result`]) are the way back of commands: a
//! device's answer lands on its entity only with a credential whose pins
//! hold that device.
//!
//! What each network server's messages look like is known once, in its
//! module behind [`NetworkServer`] ([`server`] picks it by format):
//! [`sensae`] (sensae, Helium, plain MQTT), [`ttn`] (The Things Stack),
//! [`chirpstack`], [`iota`] (the IoT Agents' devices): where the envelope
//! names the device, its identity, time and payload, which messages are
//! device events, and how a webhook or an MQTT topic tells the way back.

pub mod chirpstack;
pub mod iota;
pub mod sensae;
pub mod ttn;

use serde_json::{Map, Value};
use weft_model::downlink::{ChirpStackApi, Delivery};
use weft_model::{DeviceEvent, Downlink, DownlinkRoute, NewUplink, UplinkFormat, UplinkPins};

use crate::downlinks::DownlinkError;
use crate::{AcceptError, Services};

/// A request header by (lower-case) name, as a webhook's route reads it.
pub type Header<'a> = dyn Fn(&str) -> Option<String> + 'a;

/// What weft knows of one network server's messages, and nothing else
/// does: where its envelope names the device, its identity fields and
/// payload, which of its messages are device events, and how its webhook
/// tells the way back to the device. One module per server implements
/// it; [`server`] picks the one of a log entry's format.
pub trait NetworkServer: Sync {
    /// The device the envelope names, read without decoding anything (the
    /// accept path partitions and checks pins by it).
    fn device(&self, body: &Value) -> Option<String>;

    /// The envelope: identity fields, time and payload.
    fn envelope(&self, body: &Value) -> Envelope;

    /// The device event a message is, when it is not an uplink; `named` is
    /// the event its request or topic named (ChirpStack's `?event=`).
    fn event(&self, _named: Option<&str>, _body: &Value) -> Option<String> {
        None
    }

    /// When an event happened, as its body says (RFC 3339).
    fn event_time(&self, _body: &Value) -> Option<String> {
        None
    }

    /// The fields a user looks for in an event of `kind` (see
    /// [`DeviceEvent::kind`]; `event` is its name as sent), named as
    /// ChirpStack names them whichever server sent it: a join's
    /// `devAddr`; a status's `batteryLevel`, `batteryLevelUnavailable`,
    /// `margin`, `externalPowerSource`; a location's `latitude`,
    /// `longitude`, `altitude`, `accuracy`, `source`; an ack's
    /// `acknowledged` and `fCntDown`; a txack's `fCntDown` and
    /// `gatewayId`; a log's `level`, `code`, `description`. Fields the
    /// body lacks are left out.
    fn event_fields(&self, _kind: &str, _event: &str, _body: &Value) -> Map<String, Value> {
        Map::new()
    }

    /// The device an uplink received on MQTT `topic` (through source
    /// `source`, or the embedded broker) is from and the way back to it
    /// over the same connection; `body` is the message's JSON body, when
    /// it has one. `None` for a topic that is no uplink's.
    fn mqtt_route(
        &self,
        _source: &str,
        _topic: &str,
        _body: Option<&Value>,
    ) -> Option<(String, DownlinkRoute)> {
        None
    }

    /// The device and the way back to it that a webhook's headers and
    /// body tell (`event`: the event it named, if any).
    fn http_route(
        &self,
        _event: Option<&str>,
        _header: &Header<'_>,
        _body: &Value,
    ) -> Option<(String, DownlinkRoute)> {
        None
    }
}

/// The network server whose messages are logged as `format`.
pub fn server(format: UplinkFormat) -> &'static dyn NetworkServer {
    match format {
        UplinkFormat::SensaeEncoded | UplinkFormat::SensaeDecoded => &sensae::Sensae,
        UplinkFormat::Ttn => &ttn::Ttn,
        UplinkFormat::ChirpStack => &chirpstack::ChirpStack,
        UplinkFormat::Iota => &iota::Iota,
    }
}

/// Identity, time and payload read from an uplink's body by its network
/// server's module.
#[derive(Debug)]
pub struct Envelope {
    /// The uplink's identity (its unit's `dataId`), if the body has one.
    pub data_id: Option<String>,
    /// The device the body names.
    pub device_id: Option<String>,
    /// The device's name.
    pub device_name: Option<String>,
    /// When the reading was taken, if the envelope says; `Err` when it
    /// says something that is no time (the uplink then fails).
    pub reported_at: Result<Option<i64>, String>,
    /// The network server's device type (profile, model), used when
    /// nothing else names one.
    pub type_hint: Option<String>,
    /// The network server's application, used as channel when nothing
    /// else names one.
    pub channel_hint: Option<String>,
    /// Raw payload and port, for `decodeUplink` codecs; `Err` when the
    /// body's payload cannot be read.
    pub payload: Option<Result<(Vec<u8>, u32), String>>,
    /// A payload the network server already decoded.
    pub predecoded: Option<Value>,
}

impl Envelope {
    /// An envelope that says nothing.
    pub fn empty() -> Envelope {
        Envelope {
            data_id: None,
            device_id: None,
            device_name: None,
            reported_at: Ok(None),
            type_hint: None,
            channel_hint: None,
            payload: None,
            predecoded: None,
        }
    }
}

/// An http(s) URL, the only kind of way back weft follows.
fn is_url(url: &str) -> bool {
    url.starts_with("http://") || url.starts_with("https://")
}

/// The device event a log entry is, when its network server says it is
/// one (kept whatever its name): `Some(Err)` when it names no device to
/// keep it under.
pub(crate) fn device_event(
    uplink: &weft_model::Uplink,
    body: &Value,
) -> Option<Result<DeviceEvent, String>> {
    let u = &uplink.uplink;
    let server = server(u.format);
    let event = server.event(u.event.as_deref(), body)?;
    let made = DeviceEvent::of(
        u.format,
        &event,
        server.device(body),
        server.event_time(body),
        body.clone(),
        uplink.seq,
        u.received_at,
    );
    Some(made.map(|mut e| {
        e.fields = server.event_fields(e.kind(), &e.event, &e.body);
        e
    }))
}

/// The request or message that sends `d` back through `route`, built by
/// the module of the network server the route leads to. `chirpstack` is
/// the configured ChirpStack API for the device's type (a ChirpStack REST
/// route cannot be used without one: the error says so); `replace` asks
/// The Things Stack to replace its queue rather than append.
pub(crate) fn delivery(
    route: &DownlinkRoute,
    d: &Downlink,
    chirpstack: Option<&ChirpStackApi>,
    replace: bool,
) -> Result<Delivery, String> {
    Ok(match route {
        DownlinkRoute::TtnWebhook {
            push_url,
            replace_url,
            api_key,
        } => ttn::webhook_delivery(
            push_url,
            replace_url.as_deref(),
            api_key.as_deref(),
            d,
            replace,
        ),
        DownlinkRoute::TtnMqtt {
            source,
            application,
            device_id,
        } => ttn::mqtt_delivery(source, application, device_id, d, replace),
        DownlinkRoute::ChirpStackRest { dev_eui } => {
            chirpstack::rest_delivery(dev_eui, d, chirpstack)?
        }
        DownlinkRoute::ChirpStackMqtt {
            source,
            application_id,
            dev_eui,
        } => chirpstack::mqtt_delivery(source, application_id, dev_eui, d),
        DownlinkRoute::Helium { url } => sensae::helium_delivery(url, d),
        DownlinkRoute::IotAgentHttp { endpoint } => iota::http_delivery(endpoint, d),
        DownlinkRoute::IotAgentMqtt {
            source,
            apikey,
            device_id,
            protocol,
        } => iota::mqtt_delivery(source, apikey, device_id, *protocol, d),
    })
}

/// Bytes as standard base64, as every network server's API takes them.
fn b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The fields of a location event, under the names weft shows them by;
/// each server's module says where its messages keep them.
const LOCATION_FIELDS: [&str; 5] = ["latitude", "longitude", "altitude", "accuracy", "source"];

/// Copies the values of `body` at each (name, path) of `wanted` into
/// `out` under their names; missing and null values are left out.
fn copy_fields<'a>(
    out: &mut Map<String, Value>,
    body: &Value,
    wanted: impl IntoIterator<Item = (&'a str, String)>,
) {
    for (name, path) in wanted {
        if let Some(v) = weft_model::mapping::get_path(body, &path).filter(|v| !v.is_null()) {
            out.insert(name.to_string(), v.clone());
        }
    }
}

/// The device an uplink names before it is decoded — the one its
/// transport names, else its envelope's — which the pipeline is
/// partitioned by ([`weft_model::uplink::partition_of`]) and the pins are
/// first checked on. `body` is the uplink's body when the caller parsed
/// it already. `None` when it names none (a decoder may still find one).
pub(crate) fn device_key(uplink: &NewUplink, body: Option<&Value>) -> Option<String> {
    if let Some(id) = &uplink.device_id {
        return Some(id.clone());
    }
    let server = server(uplink.format);
    match body {
        Some(body) => server.device(body),
        None => {
            let body: Value = serde_json::from_slice(&uplink.body).ok()?;
            server.device(&body)
        }
    }
}

/// Why a command result was refused.
#[derive(Debug, thiserror::Error)]
pub enum CommandResultRefused {
    /// The device lies outside the credential's pins.
    #[error("{0}")]
    Forbidden(String),
    /// The downlink service refused it (an unknown device, the store).
    #[error(transparent)]
    Downlink(#[from] DownlinkError),
}

/// A device's answer to its commands (`{"<command>": <result>}`), sent
/// with a credential pinned to `pins`: each command of the device named
/// gets `<command>_status` `OK` and `<command>_info` the result. Answers
/// the commands answered; refused for an unknown device or one registered
/// outside the pins.
pub async fn command_result(
    services: &Services,
    device_id: &str,
    answers: &Map<String, Value>,
    pins: &UplinkPins,
) -> Result<Vec<String>, CommandResultRefused> {
    let Some(device) = services.catalog.device(device_id) else {
        return Err(DownlinkError::UnknownDevice(device_id.to_string()).into());
    };
    if let Some(why) = pins.refusal(&device) {
        metrics::counter!("weft_command_results_refused_total").increment(1);
        return Err(CommandResultRefused::Forbidden(why));
    }
    Ok(services
        .downlinks
        .command_answer(device_id, answers)
        .await?)
}

/// How long [`accept`] keeps at an ingest log that does not take an
/// uplink (overloaded, or its store failing).
#[derive(Debug, Clone)]
pub enum Patience {
    /// Not at all: the first refusal is the answer (HTTP, whose client
    /// retries on the 503).
    Once,
    /// Again and again, waiting 50 ms and doubling up to `max_delay`
    /// between tries, until committed, until `stop` is cancelled, or until
    /// `give_up_after` has passed (MQTT, whose message stays
    /// unacknowledged when it was not committed, so the broker or the
    /// device sends it again).
    Retry {
        /// Stops the retries (weft is stopping).
        stop: tokio_util::sync::CancellationToken,
        /// The longest wait between two tries.
        max_delay: std::time::Duration,
        /// How long to keep trying, if not until `stop`.
        give_up_after: Option<std::time::Duration>,
    },
}

/// What a transport hands in: the uplinks one message holds (an
/// UltraLight message may hold several measure groups), and the way back
/// to their device when the transport tells it (learnt once they are
/// committed).
#[derive(Debug, Clone)]
pub struct Arrival {
    /// The uplinks, appended in order.
    pub uplinks: Vec<NewUplink>,
    /// The body of the (single) uplink already parsed by the transport,
    /// so accept does not parse it again to find its device.
    pub parsed: Option<Value>,
    /// The device the uplinks are from and how it is reached back.
    pub route: Option<(String, DownlinkRoute)>,
}

/// Accepts what a transport received: each uplink is held to its pins
/// and appended to the ingest log ([`crate::Ingest::accept`]), with the
/// `patience` the transport has; once all are committed, the downlink
/// route the transport told is learnt ([`crate::downlinks::Downlinks::observe_route`]).
/// `Err` when one was not committed: `Forbidden` at once (nothing of the
/// message is kept), else the last refusal once the patience ran out.
pub async fn accept(
    services: &Services,
    arrival: Arrival,
    patience: &Patience,
) -> Result<(), AcceptError> {
    let started = std::time::Instant::now();
    let single = arrival.uplinks.len() == 1;
    let mut parsed = arrival.parsed.filter(|_| single);
    for uplink in arrival.uplinks {
        let mut delay = std::time::Duration::from_millis(50);
        loop {
            let tried = match parsed.take() {
                Some(body) => services.ingest.accept_parsed(uplink.clone(), &body).await,
                None => services.ingest.accept(uplink.clone()).await,
            };
            let error = match tried {
                Ok(_) => break,
                Err(e @ AcceptError::Forbidden(_)) => return Err(e),
                Err(e) => e,
            };
            let Patience::Retry {
                stop,
                max_delay,
                give_up_after,
            } = patience
            else {
                return Err(error);
            };
            if matches!(error, AcceptError::Store(_)) {
                tracing::warn!(%error, "appending to the ingest log failed; retrying");
            }
            if stop.is_cancelled() || give_up_after.is_some_and(|g| started.elapsed() >= g) {
                return Err(error);
            }
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = stop.cancelled() => return Err(error),
            }
            delay = (delay * 2).min(*max_delay);
        }
    }
    if let Some((device, route)) = arrival.route {
        services.downlinks.observe_route(&device, route).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;
    use weft_model::{Device, DeviceType, UplinkFormat};

    use super::*;
    use crate::testkit::{self, Node};

    fn uplink(format: UplinkFormat, body: Value, pins: UplinkPins) -> NewUplink {
        NewUplink {
            partition: 0,
            received_at: 1,
            format,
            channel: pins.channel.clone(),
            device_type: None,
            event: None,
            device_id: None,
            source: None,
            pins,
            body: serde_json::to_vec(&body).unwrap(),
        }
    }

    fn farm() -> UplinkPins {
        UplinkPins {
            channel: Some("farm".into()),
            device_type: None,
        }
    }

    async fn register(services: &Services, id: &str, device_type: &str, channel: &str) {
        services
            .catalog
            .put_device(Device {
                id: id.into(),
                device_type: device_type.into(),
                channel: channel.into(),
                ..Device::default()
            })
            .await
            .unwrap();
    }

    /// A device the envelope names, registered outside the pins, is
    /// refused before anything is appended and its route is not learnt;
    /// one within them (or not registered) is appended, then its route
    /// learnt. Refusals are not retried, whatever the patience.
    #[tokio::test]
    async fn accept_holds_the_named_device_to_the_pins_then_learns_the_route() {
        let node = Node::start(testkit::config()).await;
        let (services, store, shutdown) = (&node.services, &node.store, node.shutdown.clone());
        register(services, "vault", "thermo", "secret").await;
        let helium = |id: &str| json!({"id": id, "downlink_url": "https://console/down"});
        let patience = Patience::Retry {
            stop: shutdown.clone(),
            max_delay: Duration::from_millis(50),
            give_up_after: None,
        };
        let attack = Arrival {
            uplinks: vec![uplink(UplinkFormat::SensaeDecoded, helium("vault"), farm())],
            parsed: None,
            route: Some((
                "vault".into(),
                DownlinkRoute::Helium {
                    url: "https://evil/down".into(),
                },
            )),
        };
        match accept(services, attack, &patience).await {
            Err(AcceptError::Forbidden(why)) => assert!(why.contains("'secret'"), "{why}"),
            other => panic!("not refused: {other:?}"),
        }
        assert_eq!(*store.committed_seq().borrow(), 0, "nothing appended");
        assert_eq!(services.downlinks.route("vault").await.unwrap(), None);

        // A TTN message (parsed already) naming it is refused the same way.
        let ttn = json!({"end_device_ids": {"device_id": "vault"}, "uplink_message": {}});
        let arrival = Arrival {
            uplinks: vec![uplink(UplinkFormat::Ttn, ttn.clone(), farm())],
            parsed: Some(ttn),
            route: None,
        };
        assert!(matches!(
            accept(services, arrival, &Patience::Once).await,
            Err(AcceptError::Forbidden(_))
        ));

        let route = DownlinkRoute::Helium {
            url: "https://console/down".into(),
        };
        let welcome = Arrival {
            uplinks: vec![uplink(
                UplinkFormat::SensaeDecoded,
                helium("newcomer"),
                farm(),
            )],
            parsed: None,
            route: Some(("newcomer".into(), route.clone())),
        };
        accept(services, welcome, &Patience::Once).await.unwrap();
        assert_eq!(*store.committed_seq().borrow(), 1);
        assert_eq!(
            services.downlinks.route("newcomer").await.unwrap(),
            Some(route)
        );
        shutdown.cancel();
    }

    /// A command result lands only for a registered device within the
    /// credential's pins.
    #[tokio::test]
    async fn command_results_are_held_to_the_pins() {
        let node = Node::start(testkit::config()).await;
        let (services, shutdown) = (&node.services, node.shutdown.clone());
        let lamp: DeviceType = serde_json::from_value(json!({"commands": ["ring"]})).unwrap();
        services
            .catalog
            .put_device_type("lamp", lamp)
            .await
            .unwrap();
        register(services, "lamp1", "lamp", "secret").await;
        let answers = Map::from_iter([("ring".to_string(), json!("rang"))]);
        match command_result(services, "lamp1", &answers, &farm()).await {
            Err(CommandResultRefused::Forbidden(why)) => assert!(why.contains("'secret'"), "{why}"),
            other => panic!("not refused: {other:?}"),
        }
        assert!(matches!(
            command_result(services, "nobody", &answers, &UplinkPins::default()).await,
            Err(CommandResultRefused::Downlink(
                DownlinkError::UnknownDevice(_)
            ))
        ));
        let secret = UplinkPins {
            channel: Some("secret".into()),
            device_type: Some("lamp".into()),
        };
        let answered = command_result(services, "lamp1", &answers, &secret)
            .await
            .unwrap();
        assert_eq!(answered, ["ring"]);
        shutdown.cancel();
    }

    #[test]
    fn an_uplink_is_keyed_by_the_device_it_names_before_decoding() {
        let keyed = |format, device_id: Option<&str>, body: Value| {
            let mut u = uplink(format, body, UplinkPins::default());
            u.device_id = device_id.map(str::to_string);
            u
        };
        let ttn = json!({"end_device_ids": {"device_id": "eui-1"}});
        let cs = json!({"deviceInfo": {"devEui": "0102"}});
        let cases = [
            (keyed(UplinkFormat::Ttn, None, ttn.clone()), Some("eui-1")),
            (keyed(UplinkFormat::ChirpStack, None, cs), Some("0102")),
            (
                keyed(UplinkFormat::SensaeDecoded, None, json!({"id": "d1"})),
                Some("d1"),
            ),
            // The transport's device wins over the body's.
            (
                keyed(UplinkFormat::Ttn, Some("topic-dev"), ttn),
                Some("topic-dev"),
            ),
            (
                keyed(UplinkFormat::SensaeDecoded, None, json!({"x": 1})),
                None,
            ),
            (keyed(UplinkFormat::Iota, None, json!({"id": "x"})), None),
        ];
        for (u, expected) in cases {
            assert_eq!(device_key(&u, None).as_deref(), expected);
            let parsed: Value = serde_json::from_slice(&u.body).unwrap();
            assert_eq!(device_key(&u, Some(&parsed)).as_deref(), expected);
        }
    }

    /// Events are named by each server's own rule and keep the device
    /// their envelope names.
    #[test]
    fn device_events_of_each_server() {
        let entry = |format, event: Option<&str>, body: Value| weft_model::Uplink {
            seq: 7,
            uplink: NewUplink {
                event: event.map(str::to_string),
                ..uplink(format, body, UplinkPins::default())
            },
        };
        let cs = json!({"deviceInfo": {"devEui": "0102"}, "time": "2026-03-01T10:00:00Z"});
        let join = entry(UplinkFormat::ChirpStack, Some("join"), cs.clone());
        let event = device_event(&join, &cs).unwrap().unwrap();
        assert_eq!(
            (event.device_id.as_str(), event.event.as_str(), event.time),
            ("0102", "join", Some(1_772_359_200_000))
        );
        assert!(device_event(&entry(UplinkFormat::ChirpStack, None, cs.clone()), &cs).is_none());
        let ttn = json!({"end_device_ids": {"device_id": "eui-1"}, "join_accept": {}});
        let event = device_event(&entry(UplinkFormat::Ttn, None, ttn.clone()), &ttn)
            .unwrap()
            .unwrap();
        assert_eq!(event.kind(), "join");
        let nameless = json!({"join_accept": {}});
        assert!(
            device_event(&entry(UplinkFormat::Ttn, None, nameless.clone()), &nameless)
                .unwrap()
                .is_err()
        );
        let sensae = json!({"id": "d"});
        assert!(device_event(
            &entry(UplinkFormat::SensaeDecoded, None, sensae.clone()),
            &sensae
        )
        .is_none());
    }

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
            status: weft_model::DownlinkStatus::Queued,
            reason: None,
            attempts: 0,
            route: None,
            created_at: 1,
            updated_at: 1,
            sent_at: None,
            expires_at: None,
            next_attempt_at: 1,
        }
    }

    fn http(
        route: &DownlinkRoute,
        api: Option<&ChirpStackApi>,
        replace: bool,
    ) -> weft_model::downlink::HttpDelivery {
        match delivery(route, &downlink(), api, replace).unwrap() {
            Delivery::Http(http) => http,
            other => panic!("not http: {other:?}"),
        }
    }

    fn mqtt(route: &DownlinkRoute, replace: bool) -> weft_model::downlink::MqttDelivery {
        match delivery(route, &downlink(), None, replace).unwrap() {
            Delivery::Mqtt(m) => m,
            other => panic!("not mqtt: {other:?}"),
        }
    }

    /// TTN: the webhook's push (or replace) URL with the API key as
    /// bearer, or the MQTT `down/push` (`down/replace`) topic; TTN's queue
    /// body either way.
    #[test]
    fn ttn_deliveries() {
        let route = DownlinkRoute::TtnWebhook {
            push_url: "https://eu1.cloud.thethings.network/api/v3/as/applications/app/webhooks/weft/devices/dev/down/push".into(),
            replace_url: Some("https://x/down/replace".into()),
            api_key: Some("NNSXS.KEY".into()),
        };
        let push = http(&route, None, false);
        assert!(push.url.ends_with("/down/push"));
        assert_eq!(
            push.headers,
            vec![("Authorization".into(), "Bearer NNSXS.KEY".into())]
        );
        assert_eq!(
            push.body,
            json!({"downlinks": [{"frm_payload": "AQU=", "f_port": 10, "confirmed": true, "priority": "HIGH"}]})
        );
        assert_eq!(http(&route, None, true).url, "https://x/down/replace");
        let ttn = DownlinkRoute::TtnMqtt {
            source: "ttn".into(),
            application: "app@ttn".into(),
            device_id: "dev".into(),
        };
        let m = mqtt(&ttn, false);
        assert_eq!(m.topic, "v3/app@ttn/devices/dev/down/push");
        let body: Value = serde_json::from_slice(&m.payload).unwrap();
        assert_eq!(body["downlinks"][0]["frm_payload"], "AQU=");
        assert_eq!(
            mqtt(&ttn, true).topic,
            "v3/app@ttn/devices/dev/down/replace"
        );
    }

    /// ChirpStack: REST needs a configured API and takes v4's queue item;
    /// MQTT takes its command topic.
    #[test]
    fn chirpstack_deliveries() {
        let route = DownlinkRoute::ChirpStackRest {
            dev_eui: "0102030405060708".into(),
        };
        assert!(delivery(&route, &downlink(), None, false).is_err());
        let api = ChirpStackApi {
            url: "http://cs:8090/".into(),
            token: "tok".into(),
        };
        let rest = http(&route, Some(&api), false);
        assert_eq!(
            rest.url,
            "http://cs:8090/api/devices/0102030405060708/queue"
        );
        assert!(rest
            .headers
            .contains(&("Grpc-Metadata-Authorization".into(), "Bearer tok".into())));
        assert_eq!(
            rest.body,
            json!({"queueItem": {"confirmed": true, "fPort": 10, "data": "AQU="}})
        );
        let cs = DownlinkRoute::ChirpStackMqtt {
            source: "cs".into(),
            application_id: "a1".into(),
            dev_eui: "0102".into(),
        };
        let m = mqtt(&cs, false);
        assert_eq!(m.topic, "application/a1/device/0102/command/down");
        let body: Value = serde_json::from_slice(&m.payload).unwrap();
        assert_eq!(
            body,
            json!({"devEui": "0102", "confirmed": true, "fPort": 10, "data": "AQU="})
        );
    }

    /// Helium gets its HTTP integration's downlink body; IoT Agent devices
    /// their command, as JSON or UltraLight, over HTTP or MQTT.
    #[test]
    fn helium_and_iot_agent_deliveries() {
        let helium = DownlinkRoute::Helium {
            url: "https://console.helium.com/api/v1/down/x/y".into(),
        };
        assert_eq!(
            http(&helium, None, false).body,
            json!({"payload_raw": "AQU=", "port": 10, "confirmed": true})
        );
        let device = DownlinkRoute::IotAgentHttp {
            endpoint: "http://lamp/cmd".into(),
        };
        assert_eq!(http(&device, None, false).body, json!({"ring": 5}));
        let iota = |protocol| DownlinkRoute::IotAgentMqtt {
            source: "local".into(),
            apikey: "k1".into(),
            device_id: "lamp1".into(),
            protocol,
        };
        let json_route = iota(weft_model::downlink::IotaProtocol::Json);
        let m = mqtt(&json_route, false);
        assert_eq!(
            (m.topic.as_str(), m.payload.as_slice()),
            ("/k1/lamp1/cmd", &br#"{"ring":5}"#[..])
        );
        assert_eq!(json_route.mqtt_source(), Some("local"));
        let m = mqtt(&iota(weft_model::downlink::IotaProtocol::Ul), false);
        assert_eq!(
            (m.topic.as_str(), m.payload.as_slice()),
            ("/k1/lamp1/cmd", &b"lamp1@ring|5"[..])
        );
    }
}
