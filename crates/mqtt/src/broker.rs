//! The embedded broker (`[mqtt] listen`): devices publish to weft
//! directly, without a broker of their own to run.
//!
//! Each device connects with its device id as user name *and* client id,
//! and its device key (`POST /api/v1/devices/{id}/key`) as password;
//! anything else is refused at CONNECT (rumqttd closes the connection
//! without admitting it). Devices publish on:
//!
//! - `/json/{apikey}/{device}/attrs` and `/json/{apikey}/{device}/attrs/{attr}`
//!   (IoT Agent JSON), `/ul/{apikey}/{device}/attrs[/{attr}]` (UltraLight
//!   2.0); the API key names the device type through `[mqtt.api_keys]`,
//!   or, when it is not listed there, the registered device's type is used;
//! - `devices/{device}/up`: a JSON object of measures, or a binary payload
//!   for the device type's decoder.
//!
//! The broker is rumqttd, run on threads of its own; weft reads what
//! devices publish through a local link subscribed to every topic, and
//! appends it to the ingest log. rumqttd acknowledges a QoS 1 message once
//! it holds it in memory, a moment before weft commits it: a crash in that
//! moment loses it (docs/mqtt.md). A payload weft cannot read is counted
//! (`weft_mqtt_messages_total{source="broker",outcome="refused"}`) and
//! logged. It forwards messages between clients as any broker does, so a
//! device can also subscribe to its own topics.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rumqttd::{Broker, Config, ConnectionSettings, Notification, RouterConfig, ServerSettings};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use weft_pipeline::Services;

use crate::config::MqttConfig;
use crate::topics::{self, Format, Message, Route};

/// The source name the broker's uplinks carry, and its metrics label.
pub const SOURCE: &str = weft_pipeline::mqtt::BROKER_SOURCE;

/// Client id of weft's own link into the broker.
const LINK_ID: &str = "weft-ingest";

/// Client id of the link weft publishes commands to devices through.
const DOWNLINK_LINK_ID: &str = "weft-downlinks";

/// Starts the broker on `addr`; weft's link stops reading when `shutdown`
/// is cancelled. Fails when the address cannot be bound.
pub async fn start(
    addr: SocketAddr,
    config: &MqttConfig,
    services: Arc<Services>,
    shutdown: CancellationToken,
    tracker: &TaskTracker,
) -> Result<SocketAddr, String> {
    // rumqttd binds on its own thread and reports a failure only in its
    // log: check the address is free first, for a clear error at start.
    drop(
        std::net::TcpListener::bind(addr)
            .map_err(|e| format!("binding the MQTT broker on {addr}: {e}"))?,
    );
    let catalog = services.catalog.clone();
    let mut connections = ConnectionSettings {
        connection_timeout_ms: 10_000,
        max_payload_size: crate::source::MAX_MESSAGE_BYTES,
        max_inflight_count: 100,
        auth: None,
        external_auth: None,
        dynamic_filters: true,
    };
    connections.set_auth_handler(move |client_id: String, user: String, password: String| {
        let catalog = catalog.clone();
        async move {
            let admitted = client_id == user
                && catalog
                    .device(&user)
                    .is_some_and(|d| d.key_matches(password.as_bytes()));
            let outcome = if admitted { "accepted" } else { "refused" };
            metrics::counter!("weft_mqtt_broker_connections_total", "outcome" => outcome)
                .increment(1);
            if !admitted {
                tracing::info!(client_id = %client_id.escape_default(), "MQTT broker refused a connection: bad device id or key");
            }
            admitted
        }
    });
    let server = ServerSettings {
        name: "weft".into(),
        listen: addr,
        tls: None,
        next_connection_delay_ms: 1,
        connections,
    };
    let broker_config = Config {
        id: 0,
        router: RouterConfig {
            max_connections: 10_010,
            max_outgoing_packet_count: 200,
            max_segment_size: 16 * 1024 * 1024,
            max_segment_count: 10,
            custom_segment: None,
            initialized_filters: None,
            shared_subscriptions_strategy: Default::default(),
        },
        v4: Some([("weft".to_string(), server)].into_iter().collect()),
        ..Config::default()
    };
    let mut broker = Broker::new(broker_config);
    let (mut link_tx, mut link_rx) = broker
        .link(LINK_ID)
        .map_err(|e| format!("linking to the MQTT broker: {e}"))?;
    link_tx
        .subscribe("#")
        .map_err(|e| format!("subscribing to the MQTT broker: {e}"))?;
    // Commands to devices connected here (`/{apikey}/{device}/cmd`) go
    // through a link of their own. rumqttd's local links publish at QoS 0:
    // the router has the message once `publish` returns, and hands it to
    // the devices subscribed at that moment.
    let (down_tx, mut down_rx) = broker
        .link(DOWNLINK_LINK_ID)
        .map_err(|e| format!("linking to the MQTT broker: {e}"))?;
    let down_tx = parking_lot::Mutex::new(down_tx);
    services
        .mqtt
        .set_broker_publish(Box::new(move |topic: &str, payload: Vec<u8>| {
            down_tx
                .lock()
                .publish(topic.to_string(), payload)
                .map(|_| ())
                .map_err(|e| format!("publishing on the embedded MQTT broker: {e}"))
        }));
    {
        let shutdown = shutdown.clone();
        tracker.spawn(async move {
            // Nothing is expected back; drained so the router never waits.
            loop {
                tokio::select! {
                    n = down_rx.next() => if n.is_err() { break },
                    _ = shutdown.cancelled() => break,
                }
            }
        });
    }
    std::thread::Builder::new()
        .name("weft-mqtt-broker".into())
        .spawn(move || {
            if let Err(e) = broker.start() {
                tracing::error!(error = %e, "the MQTT broker stopped");
            }
        })
        .map_err(|e| format!("starting the MQTT broker's thread: {e}"))?;
    let shared = Arc::new(Shared {
        services,
        route: Route {
            api_keys: config.api_keys.clone(),
            unknown_keys_use_device_type: true,
            source: SOURCE.to_string(),
            f_port: 1,
            ..Route::default()
        },
        shutdown: shutdown.clone(),
    });
    tracker.spawn(async move {
        loop {
            let next = tokio::select! {
                n = link_rx.next() => n,
                _ = shutdown.cancelled() => break,
            };
            match next {
                Ok(Some(Notification::Forward(forward))) => {
                    let topic = String::from_utf8_lossy(&forward.publish.topic).into_owned();
                    shared.publish(&topic, &forward.publish.payload).await;
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::error!(error = %e, "the MQTT broker's link closed");
                    break;
                }
            }
        }
    });
    tracing::info!(addr = %addr, "embedded MQTT broker listening");
    Ok(addr)
}

/// What the link needs to append messages.
struct Shared {
    services: Arc<Services>,
    route: Route,
    shutdown: CancellationToken,
}

impl Shared {
    /// One message: read it and append its uplinks.
    async fn publish(&self, topic: &str, payload: &[u8]) {
        let count = |o: &'static str| {
            metrics::counter!("weft_mqtt_messages_total", "source" => SOURCE, "outcome" => o)
                .increment(1);
        };
        count("received");
        let Some((format, device)) = route_of(topic) else {
            // Another topic: a device talking to another client, not to weft.
            return;
        };
        let legacy_answer = topic.ends_with("/cmdexe")
            && !topic.trim_start_matches('/').starts_with("json/")
            && !topic.trim_start_matches('/').starts_with("ul/");
        let format = if legacy_answer && !payload.trim_ascii_start().starts_with(b"{") {
            Format::IotaUl
        } else {
            format
        };
        let route = Route {
            device_level: 1,
            ..self.route.clone()
        };
        let uplinks = match topics::read(format, &route, topic, payload, weft_model::now_ms()) {
            Ok(Message::Uplinks(u)) => u,
            Ok(Message::Ignored) => return,
            Ok(Message::CommandAnswer { device, answers }) => {
                match self
                    .services
                    .downlinks
                    .command_answer(&device, &answers)
                    .await
                {
                    Ok(answered) if !answered.is_empty() => count("committed"),
                    _ => {
                        count("refused");
                        tracing::warn!(%device, %topic, "MQTT broker: command answer names no command of the device");
                    }
                }
                return;
            }
            Err(reason) => {
                count("refused");
                tracing::warn!(%device, %topic, "MQTT broker: message refused: {reason}");
                return;
            }
        };
        for uplink in uplinks {
            let mut delay = Duration::from_millis(50);
            loop {
                if self.shutdown.is_cancelled() {
                    return;
                }
                match self.services.ingest.accept(uplink.clone()).await {
                    Ok(_) => break,
                    Err(e) => {
                        tracing::debug!(error = %e, "MQTT broker: ingest log append failed; retrying");
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_secs(5));
                    }
                }
            }
        }
        count("committed");
        if let Some((device, route)) = topics::downlink_route(format, SOURCE, topic, payload) {
            self.services.downlinks.observe_route(&device, route).await;
        }
    }
}

/// The format of a broker topic and the device it names.
fn route_of(topic: &str) -> Option<(Format, &str)> {
    let levels: Vec<&str> = topic
        .strip_prefix('/')
        .unwrap_or(topic)
        .split('/')
        .collect();
    match levels.as_slice() {
        ["json", _, device, "attrs", ..] => Some((Format::IotaJson, device)),
        ["ul", _, device, "attrs", ..] => Some((Format::IotaUl, device)),
        ["json", _, device, "cmdexe"] => Some((Format::IotaJson, device)),
        ["ul", _, device, "cmdexe"] => Some((Format::IotaUl, device)),
        // The older answer topic, `/{apikey}/{device}/cmdexe`, says no
        // protocol: a JSON object is IoT Agent JSON's, anything else
        // UltraLight's.
        [_, device, "cmdexe"] if topic.starts_with('/') => Some((Format::IotaJson, device)),
        ["devices", device, "up"] if !topic.starts_with('/') => Some((Format::Plain, device)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_name_their_device() {
        assert_eq!(route_of("/json/k/d1/attrs"), Some((Format::IotaJson, "d1")));
        assert_eq!(
            route_of("json/k/d1/attrs/t"),
            Some((Format::IotaJson, "d1"))
        );
        assert_eq!(route_of("/ul/k/d2/attrs"), Some((Format::IotaUl, "d2")));
        assert_eq!(route_of("devices/d3/up"), Some((Format::Plain, "d3")));
        assert_eq!(route_of("devices/d3/down"), None);
        assert_eq!(route_of("/devices/d3/up"), None);
    }
}
