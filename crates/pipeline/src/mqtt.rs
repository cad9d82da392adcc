//! MQTT connections weft opens as a client, as the rest of weft sees them.
//!
//! - [`BrokerUrl`] and [`client_options`]: how a broker named by a URL
//!   (`mqtt://host:1883`, `mqtts://host:8883`), credentials and TLS
//!   settings becomes a connection, the same way for ingest sources and
//!   for NGSI notifications.
//! - [`Links`]: the ingest sources that are running (`[mqtt.sources.*]`),
//!   each a [`SourceLink`] with its connection state, shown by `/health`,
//!   and a handle to publish on the connection a device's uplinks came
//!   from, so a reply to that device (a downlink) goes back the same way.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use rumqttc::{AsyncClient, MqttOptions, QoS, TlsConfiguration, Transport};
use serde::Serialize;
use tokio::sync::oneshot;
use tokio_rustls::rustls::{crypto::ring, ClientConfig, RootCertStore};

/// The default port of `mqtt://`.
pub const MQTT_PORT: u16 = 1883;
/// The default port of `mqtts://`.
pub const MQTTS_PORT: u16 = 8883;

/// A broker's address as a URL gives it: `mqtt://host[:port]` (plain TCP)
/// or `mqtts://host[:port]` (TLS).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BrokerUrl {
    /// Whether the connection is TLS (`mqtts://`).
    pub tls: bool,
    /// Host name or IP address.
    pub host: String,
    /// TCP port (1883 or 8883 when the URL names none).
    pub port: u16,
}

impl BrokerUrl {
    /// Parses `mqtt://host[:port]` or `mqtts://host[:port]`; a path other
    /// than `/` is refused (topics are configured on their own).
    pub fn parse(url: &str) -> Result<BrokerUrl, String> {
        let (tls, rest) = if let Some(rest) = url.strip_prefix("mqtts://") {
            (true, rest)
        } else if let Some(rest) = url.strip_prefix("mqtt://") {
            (false, rest)
        } else {
            return Err(format!(
                "'{url}' is not an MQTT URL (mqtt://host:port or mqtts://host:port)"
            ));
        };
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.contains(['/', '?', '#', '@']) {
            return Err(format!(
                "'{url}': an MQTT URL names only a host and a port (credentials and topics are set apart)"
            ));
        }
        let default_port = if tls { MQTTS_PORT } else { MQTT_PORT };
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (host, after) = v6
                .split_once(']')
                .ok_or_else(|| format!("'{url}': unclosed IPv6 address"))?;
            let port = match after.strip_prefix(':') {
                Some(p) => parse_port(p, url)?,
                None if after.is_empty() => default_port,
                None => return Err(format!("'{url}': bad port")),
            };
            (host.to_string(), port)
        } else {
            match authority.rsplit_once(':') {
                Some((host, port)) => (host.to_string(), parse_port(port, url)?),
                None => (authority.to_string(), default_port),
            }
        };
        if host.is_empty() {
            return Err(format!("'{url}' names no host"));
        }
        Ok(BrokerUrl { tls, host, port })
    }
}

fn parse_port(port: &str, url: &str) -> Result<u16, String> {
    port.parse::<u16>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("'{url}': '{port}' is not a port"))
}

/// Everything needed to open one client connection.
#[derive(Debug, Clone)]
pub struct ClientSettings {
    /// Where.
    pub url: BrokerUrl,
    /// The MQTT client id (a broker keeps one session per id).
    pub client_id: String,
    /// User name and password, if the broker wants them.
    pub credentials: Option<(String, String)>,
    /// PEM file of the certificate authorities to trust for `mqtts://`,
    /// instead of the system's and the web's roots.
    pub ca_file: Option<std::path::PathBuf>,
    /// Keep the session (and its unacknowledged QoS 1/2 messages) across
    /// reconnections and restarts: `clean_session = false`.
    pub persistent_session: bool,
    /// Acknowledge received QoS 1/2 messages only when told to
    /// ([`rumqttc::AsyncClient::ack`]), not on receipt.
    pub manual_acks: bool,
    /// Largest packet accepted or sent, in bytes.
    pub max_packet_size: usize,
}

/// The rumqttc options for `settings`; fails on an unreadable CA file.
pub fn client_options(settings: &ClientSettings) -> Result<MqttOptions, String> {
    let mut options = MqttOptions::new(
        settings.client_id.clone(),
        settings.url.host.clone(),
        settings.url.port,
    );
    options.set_keep_alive(Duration::from_secs(30));
    options.set_clean_session(!settings.persistent_session);
    options.set_manual_acks(settings.manual_acks);
    options.set_max_packet_size(settings.max_packet_size, settings.max_packet_size);
    if let Some((user, password)) = &settings.credentials {
        options.set_credentials(user.clone(), password.clone());
    }
    if settings.url.tls {
        let config = tls_config(settings.ca_file.as_deref())?;
        options.set_transport(Transport::Tls(TlsConfiguration::Rustls(config)));
    }
    Ok(options)
}

/// A TLS client configuration trusting `ca_file`'s certificates, or the
/// web's and the system's roots when none is given.
fn tls_config(ca_file: Option<&Path>) -> Result<Arc<ClientConfig>, String> {
    let mut roots = RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let pem = std::fs::read(path)
                .map_err(|e| format!("reading the CA file {}: {e}", path.display()))?;
            let mut added = 0;
            for cert in rustls_pemfile_certs(&pem) {
                if roots.add(cert).is_ok() {
                    added += 1;
                }
            }
            if added == 0 {
                return Err(format!("{} holds no PEM certificate", path.display()));
            }
        }
        None => {
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
        }
    }
    let config = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// The certificates of a PEM file.
fn rustls_pemfile_certs(
    pem: &[u8],
) -> Vec<tokio_rustls::rustls::pki_types::CertificateDer<'static>> {
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    tokio_rustls::rustls::pki_types::CertificateDer::pem_slice_iter(pem)
        .filter_map(Result::ok)
        .collect()
}

/// The QoS of a number (anything above 2 is 2).
pub fn qos(n: u8) -> QoS {
    match n {
        0 => QoS::AtMostOnce,
        1 => QoS::AtLeastOnce,
        _ => QoS::ExactlyOnce,
    }
}

/// What `/health` says of one source.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LinkStatus {
    /// The source's format (`ttn`, `chirpstack`, …).
    pub format: String,
    /// The broker, as configured.
    pub url: String,
    /// Whether the connection is up (CONNACK received, not lost since).
    pub connected: bool,
    /// Why the connection last failed, if it ever did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When `last_error` happened, epoch ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error_at: Option<i64>,
    /// How many times the connection was established after the first.
    pub reconnections: u64,
}

/// Who waits for the broker's PUBACK of the QoS 1 messages published on
/// a source's connection. rumqttc numbers a message (its packet id) only
/// when its event loop sends it, and reports that as
/// `Outgoing::Publish(pkid)` in the order the messages were queued: so
/// waiters queue in publish order (`unsent`), move to `by_pkid` when their
/// message goes out, and are answered by the PUBACK of that id. A message
/// resent after a reconnection keeps its id (the session is persistent)
/// and so its waiter.
#[derive(Default)]
struct Acks {
    unsent: std::collections::VecDeque<oneshot::Sender<()>>,
    by_pkid: std::collections::HashMap<u16, oneshot::Sender<()>>,
}

/// One running ingest source: its connection state and a handle to
/// publish on its connection.
pub struct SourceLink {
    name: String,
    client: AsyncClient,
    status: Mutex<LinkStatus>,
    /// Whether a connection was ever established (the next is a
    /// reconnection).
    ever_connected: Mutex<bool>,
    /// Waiters for the PUBACKs of what [`SourceLink::publish_acked`] sent.
    acks: Mutex<Acks>,
    /// QoS of what weft publishes (downlinks): 1, unless the broker takes
    /// only QoS 0 (The Things Stack's MQTT server documents QoS 0 only).
    downlink_qos: QoS,
}

impl SourceLink {
    /// A link for source `name` publishing through `client` at
    /// `downlink_qos` (0 or 1).
    pub fn new(
        name: &str,
        format: &str,
        url: &str,
        client: AsyncClient,
        downlink_qos: u8,
    ) -> SourceLink {
        SourceLink {
            name: name.to_string(),
            client,
            status: Mutex::new(LinkStatus {
                format: format.to_string(),
                url: url.to_string(),
                ..LinkStatus::default()
            }),
            ever_connected: Mutex::new(false),
            acks: Mutex::new(Acks::default()),
            downlink_qos: if downlink_qos == 0 {
                QoS::AtMostOnce
            } else {
                QoS::AtLeastOnce
            },
        }
    }

    /// The source's name (`[mqtt.sources.<name>]`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Publishes `payload` on `topic` over this source's connection: how a
    /// reply reaches a device on the broker its uplinks came from (The
    /// Things Stack's `v3/{app}@{tenant}/devices/{dev}/down/push`,
    /// ChirpStack's `application/{id}/device/{devEui}/command/down`, an
    /// IoT Agent device's `/{apikey}/{device}/cmd`). `Ok` once queued on
    /// the connection, which sends it (again after a reconnection, for
    /// QoS 1 and 2) until the broker has it; `Err` when the source is
    /// stopped or its queue is full.
    pub fn publish(
        &self,
        topic: &str,
        payload: Vec<u8>,
        qos: u8,
        retain: bool,
    ) -> Result<(), String> {
        self.client
            .try_publish(topic, self::qos(qos), retain, payload)
            .map_err(|e| format!("publishing on MQTT source '{}': {e}", self.name))
    }

    /// Publishes `payload` on `topic` at QoS 1 and waits, at most `wait`,
    /// for the broker's PUBACK: `Ok` means the broker has the message (at
    /// QoS 0, `downlink_qos = 0`: that it was written to the connection). A
    /// source that is not connected fails at once rather than queueing a
    /// message it cannot say when it will send. After a timeout the
    /// message may still reach the broker later (rumqttc resends it after
    /// a reconnection), so a caller that retries may deliver it twice:
    /// at least once, never silently lost.
    pub async fn publish_acked(
        &self,
        topic: &str,
        payload: Vec<u8>,
        wait: Duration,
    ) -> Result<(), String> {
        if !self.status.lock().connected {
            return Err(format!("MQTT source '{}' is not connected", self.name));
        }
        let (tx, rx) = oneshot::channel();
        {
            // One lock around both, so waiters queue in the order the
            // messages reach the event loop.
            let mut acks = self.acks.lock();
            acks.unsent.push_back(tx);
            if let Err(e) = self
                .client
                .try_publish(topic, self.downlink_qos, false, payload)
            {
                acks.unsent.pop_back();
                return Err(format!("publishing on MQTT source '{}': {e}", self.name));
            }
        }
        match tokio::time::timeout(wait, rx).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(format!("MQTT source '{}' stopped", self.name)),
            Err(_) => Err(format!(
                "no PUBACK from the broker of MQTT source '{}' within {wait:?}",
                self.name
            )),
        }
    }

    /// The connection's event loop sent a QoS 1 message with `pkid`: the
    /// oldest waiting publication is that one, unless `pkid` is already
    /// waited for (a resend after a reconnection).
    pub fn sent(&self, pkid: u16) {
        let mut acks = self.acks.lock();
        if pkid == 0 {
            // QoS 0 (`downlink_qos = 0`): written to the connection is all
            // the broker will ever say.
            if let Some(waiter) = acks.unsent.pop_front() {
                let _ = waiter.send(());
            }
            return;
        }
        if acks.by_pkid.contains_key(&pkid) {
            return;
        }
        if let Some(waiter) = acks.unsent.pop_front() {
            acks.by_pkid.insert(pkid, waiter);
        }
    }

    /// The broker acknowledged message `pkid`.
    pub fn acknowledged(&self, pkid: u16) {
        if let Some(waiter) = self.acks.lock().by_pkid.remove(&pkid) {
            let _ = waiter.send(());
        }
    }

    /// Records that the connection is up.
    pub fn connected(&self) {
        let mut ever = self.ever_connected.lock();
        let mut status = self.status.lock();
        if *ever {
            status.reconnections += 1;
            metrics::counter!("weft_mqtt_reconnections_total", "source" => self.name.clone())
                .increment(1);
        }
        *ever = true;
        status.connected = true;
        metrics::gauge!("weft_mqtt_connected", "source" => self.name.clone()).set(1.0);
    }

    /// Records that the connection is down, and why.
    pub fn failed(&self, error: String) {
        let mut status = self.status.lock();
        status.connected = false;
        status.last_error = Some(error);
        status.last_error_at = Some(weft_model::now_ms());
        metrics::gauge!("weft_mqtt_connected", "source" => self.name.clone()).set(0.0);
    }

    /// The current state.
    pub fn status(&self) -> LinkStatus {
        self.status.lock().clone()
    }
}

/// Publishes a command (topic, payload) to the device connected to the
/// embedded broker (`[mqtt] listen`) that the topic names: the broker
/// lives in the MQTT crate, which hands this in once it runs. `Ok` once
/// the device has it (its PUBACK when it subscribed at QoS 1, the write
/// at QoS 0) within the wait given; an `Err` (device not connected or not
/// subscribed, no PUBACK in time) leaves the downlink queued.
pub type BrokerPublish = Box<
    dyn Fn(String, Vec<u8>, Duration) -> futures::future::BoxFuture<'static, Result<(), String>>
        + Send
        + Sync,
>;

/// The running ingest sources by name, and the embedded broker's address.
#[derive(Default)]
pub struct Links {
    sources: RwLock<BTreeMap<String, Arc<SourceLink>>>,
    broker: RwLock<Option<std::net::SocketAddr>>,
    broker_publish: RwLock<Option<BrokerPublish>>,
}

/// The source name of the embedded broker, in uplinks and downlink routes;
/// no `[mqtt.sources.*]` may take it.
pub const BROKER_SOURCE: &str = "broker";

impl Links {
    /// Records how to publish on the embedded broker.
    pub fn set_broker_publish(&self, publish: BrokerPublish) {
        *self.broker_publish.write() = Some(publish);
    }

    /// Publishes a downlink on source `source` at QoS 1, `Ok` once the
    /// broker has it (its PUBACK), or on the embedded broker
    /// ([`BROKER_SOURCE`]) to the connected device, `Ok` once the device
    /// has it ([`BrokerPublish`]); within `wait`.
    pub async fn publish_acked(
        &self,
        source: &str,
        topic: &str,
        payload: Vec<u8>,
        wait: Duration,
    ) -> Result<(), String> {
        if let Some(link) = self.get(source) {
            return link.publish_acked(topic, payload, wait).await;
        }
        if source == BROKER_SOURCE {
            let sent = self
                .broker_publish
                .read()
                .as_ref()
                .map(|publish| publish(topic.to_string(), payload, wait));
            return match sent {
                Some(sent) => sent.await,
                None => Err("the embedded MQTT broker is not running".into()),
            };
        }
        Err(format!("no MQTT source '{source}' runs on this node"))
    }

    /// Records where the embedded broker listens.
    pub fn set_broker(&self, addr: std::net::SocketAddr) {
        *self.broker.write() = Some(addr);
    }

    /// Where the embedded broker listens, if it runs.
    pub fn broker(&self) -> Option<std::net::SocketAddr> {
        *self.broker.read()
    }

    /// Adds (or replaces) a source.
    pub fn register(&self, link: Arc<SourceLink>) {
        self.sources.write().insert(link.name.clone(), link);
    }

    /// The source named `name`, to publish on.
    pub fn get(&self, name: &str) -> Option<Arc<SourceLink>> {
        self.sources.read().get(name).cloned()
    }

    /// Every source's state, by name.
    pub fn statuses(&self) -> BTreeMap<String, LinkStatus> {
        self.sources
            .read()
            .iter()
            .map(|(name, link)| (name.clone(), link.status()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_urls() {
        let u = BrokerUrl::parse("mqtt://127.0.0.1:1884").unwrap();
        assert_eq!((u.tls, u.host.as_str(), u.port), (false, "127.0.0.1", 1884));
        let u = BrokerUrl::parse("mqtts://eu1.cloud.thethings.network").unwrap();
        assert_eq!((u.tls, u.port), (true, 8883));
        assert_eq!(BrokerUrl::parse("mqtt://h/").unwrap().port, 1883);
        assert_eq!(BrokerUrl::parse("mqtt://[::1]:9").unwrap().host, "::1");
        for bad in [
            "http://h:1",
            "mqtt://",
            "mqtt://h:0",
            "mqtt://h:x",
            "mqtt://h/topic",
            "mqtt://u:p@h",
        ] {
            assert!(BrokerUrl::parse(bad).is_err(), "{bad}");
        }
    }
}
