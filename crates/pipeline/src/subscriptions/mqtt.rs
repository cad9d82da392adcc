//! MQTT notifications (`mqtt` / `mqttCustom` subscriptions): one publish
//! per notification on a connection kept per broker URL and credentials.
//!
//! A connection is opened on the first notification to its broker and
//! kept while it is used: one idle for [`MAX_IDLE`] is closed (Orion's
//! `-mqttMaxAge`, an hour by default). Publishes on one connection go one
//! at a time: a QoS 0 publish succeeds once it is written to the
//! connection, a QoS 1 or 2 one once the broker has acknowledged it
//! (PUBACK, PUBCOMP), so a notification counts as delivered only when the
//! broker has it. A broker that cannot be reached, or does not
//! acknowledge, within the notification timeout fails the notification,
//! with the connection error as its reason, like an HTTP endpoint that
//! does not answer; the connection is then dropped (a new one is opened
//! for the next publish, so nothing retransmitted on the old one is taken
//! for a later publish's acknowledgement), and the outbox sends it again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rumqttc::{AsyncClient, Event, Packet};
use tokio::sync::watch;

use crate::mqtt::{client_options, qos, BrokerUrl, ClientSettings};

/// A connection unused this long is closed.
pub const MAX_IDLE: Duration = Duration::from_secs(3600);

/// What to publish, besides the payload.
#[derive(Debug, Clone, PartialEq)]
pub struct Publish {
    /// The topic, macros replaced.
    pub topic: String,
    /// 0, 1 or 2.
    pub qos: u8,
    /// Retained on the broker.
    pub retain: bool,
    /// User name and password on the broker.
    pub credentials: Option<(String, String)>,
}

/// The state of one pooled connection, as its event loop reports it.
#[derive(Debug, Clone, PartialEq)]
enum State {
    Connecting,
    Up,
    Down(String),
}

/// What the event loop reports of publishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ack {
    /// A publish was written, with this packet id (0 for QoS 0).
    Sent(u16),
    /// The broker acknowledged packet id (PUBACK for QoS 1, PUBCOMP for 2).
    Acked(u16),
}

/// One broker connection.
struct Connection {
    client: AsyncClient,
    state: watch::Receiver<State>,
    last_used: Mutex<Instant>,
    /// The event loop's reports; the lock makes publishes go one at a
    /// time, so the reports after a publish are its own.
    acks: tokio::sync::Mutex<tokio::sync::mpsc::UnboundedReceiver<Ack>>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        // Ends the event loop task (its next request is the disconnect).
        let _ = self.client.try_disconnect();
    }
}

/// What a pooled connection is kept under: the broker's URL and the
/// credentials it logged in with.
type PoolKey = (String, Option<(String, String)>);

/// The pooled connections, keyed by URL and credentials.
#[derive(Default)]
pub struct Pool {
    connections: Mutex<HashMap<PoolKey, Arc<Connection>>>,
}

impl Pool {
    /// Publishes `payload` to the broker at `url` as `publish` says,
    /// waiting up to `timeout` for the connection; `Err` carries the reason
    /// recorded on the subscription.
    pub async fn publish(
        &self,
        url: &str,
        publish: &Publish,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> Result<(), String> {
        let connection = self.connection(url, &publish.credentials)?;
        *connection.last_used.lock() = Instant::now();
        let mut state = connection.state.clone();
        let up = tokio::time::timeout(timeout, async {
            loop {
                if *state.borrow_and_update() == State::Up {
                    return true;
                }
                if state.changed().await.is_err() {
                    return false;
                }
            }
        })
        .await;
        if up != Ok(true) {
            let reason = match &*state.borrow() {
                State::Down(e) => e.clone(),
                _ => "Timeout was reached".to_string(),
            };
            return Err(reason);
        }
        let outcome = tokio::time::timeout(timeout, async {
            let mut acks = connection.acks.lock().await;
            while acks.try_recv().is_ok() {}
            connection
                .client
                .publish(
                    publish.topic.clone(),
                    qos(publish.qos),
                    publish.retain,
                    payload,
                )
                .await
                .map_err(|e| e.to_string())?;
            let mut sent = None;
            loop {
                match acks.recv().await {
                    Some(Ack::Sent(pkid)) if sent.is_none() => {
                        if publish.qos == 0 {
                            return Ok(());
                        }
                        sent = Some(pkid);
                    }
                    Some(Ack::Acked(pkid)) if sent == Some(pkid) => return Ok(()),
                    Some(_) => {}
                    None => return Err("the connection to the broker closed".to_string()),
                }
            }
        })
        .await
        .unwrap_or_else(|_| Err("Timeout was reached".to_string()));
        if outcome.is_err() {
            self.forget(url, &publish.credentials, &connection);
        }
        outcome
    }

    /// Drops `connection` from the pool (if it is still the one there).
    fn forget(
        &self,
        url: &str,
        credentials: &Option<(String, String)>,
        connection: &Arc<Connection>,
    ) {
        let key = (url.to_string(), credentials.clone());
        let mut connections = self.connections.lock();
        if connections
            .get(&key)
            .is_some_and(|c| Arc::ptr_eq(c, connection))
        {
            connections.remove(&key);
        }
    }

    /// The connection for a URL and credentials, opened on first use;
    /// connections idle past [`MAX_IDLE`] are dropped on the way.
    fn connection(
        &self,
        url: &str,
        credentials: &Option<(String, String)>,
    ) -> Result<Arc<Connection>, String> {
        let mut connections = self.connections.lock();
        connections.retain(|_, c| c.last_used.lock().elapsed() < MAX_IDLE);
        let key = (url.to_string(), credentials.clone());
        if let Some(c) = connections.get(&key) {
            return Ok(c.clone());
        }
        let broker = BrokerUrl::parse(url).map_err(|_| "Invalid URL parsing notification url")?;
        let settings = ClientSettings {
            url: broker,
            client_id: format!("weft-notify-{}", uuid::Uuid::new_v4().simple()),
            credentials: credentials.clone(),
            ca_file: None,
            persistent_session: false,
            manual_acks: false,
            max_packet_size: 16 * 1024 * 1024,
        };
        let options = client_options(&settings)?;
        let (client, mut events) = AsyncClient::new(options, 256);
        let (tx, rx) = watch::channel(State::Connecting);
        let (acks_tx, acks_rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut delay = Duration::from_millis(100);
            loop {
                match events.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        delay = Duration::from_millis(100);
                        let _ = tx.send(State::Up);
                    }
                    Ok(Event::Outgoing(rumqttc::Outgoing::Publish(pkid))) => {
                        let _ = acks_tx.send(Ack::Sent(pkid));
                    }
                    Ok(Event::Incoming(Packet::PubAck(ack))) => {
                        let _ = acks_tx.send(Ack::Acked(ack.pkid));
                    }
                    Ok(Event::Incoming(Packet::PubComp(comp))) => {
                        let _ = acks_tx.send(Ack::Acked(comp.pkid));
                    }
                    Ok(Event::Outgoing(rumqttc::Outgoing::Disconnect)) => break,
                    Ok(_) => {}
                    Err(rumqttc::ConnectionError::RequestsDone) => break,
                    Err(e) => {
                        if tx.send(State::Down(e.to_string())).is_err() {
                            break;
                        }
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_secs(10));
                    }
                }
            }
        });
        let connection = Arc::new(Connection {
            client,
            state: rx,
            last_used: Mutex::new(Instant::now()),
            acks: tokio::sync::Mutex::new(acks_rx),
        });
        connections.insert(key, connection.clone());
        Ok(connection)
    }
}
