//! One device's MQTT connection, on a broker thread (ntex-mqtt's MQTT
//! 3.1.1 server): CONNECT is checked against the device catalog, each
//! PUBLISH is handed to weft's runtime ([`super::uplinks`]) and
//! acknowledged only once it is committed, SUBSCRIBE records which command
//! topics the device wants, and weft's commands for the device are
//! published on its connection ([`super::commands`]).

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use ntex_bytes::Bytes;
use ntex_mqtt::v3;
use ntex_mqtt::QoS;
use tokio::sync::mpsc;

use super::commands::Command;
use super::uplinks::Verdict;
use super::Broker;

/// Why a connection is closed; ntex-mqtt closes the connection on any
/// error of a handler, without acknowledging the message at hand.
#[derive(Debug, thiserror::Error)]
pub(super) enum SessionError {
    /// The device published on another device's topic.
    #[error("published on another device's topic")]
    Denied,
    /// The message could not be committed (weft overloaded or stopping).
    #[error("the message could not be committed")]
    NotCommitted,
    /// The payload could not be read off the connection.
    #[error("reading the payload: {0}")]
    Payload(String),
    /// The broker's services are gone (weft is stopping).
    #[error("weft is stopping")]
    Stopping,
    /// ntex-mqtt's own services report errors as `()`.
    #[error("connection error")]
    Connection,
}

impl From<()> for SessionError {
    fn from(_: ()) -> Self {
        SessionError::Connection
    }
}

/// What the broker keeps about a connected device.
pub(super) struct DeviceSession {
    /// The device id it logged in as (client id and user name).
    device: String,
    /// The topic filters it subscribed to, with the QoS granted; shared
    /// with the task publishing its commands.
    subscriptions: Rc<RefCell<Vec<(v3::TopicFilter, QoS)>>>,
    /// Unregisters the device when the connection ends.
    _registration: Registration,
}

/// Forgets the device's connection in [`super::commands::Sessions`] when
/// the session is dropped (the connection ended).
struct Registration {
    broker: Arc<Broker>,
    device: String,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.broker.sessions.unregister(&self.device, self.id);
    }
}

/// CONNECT: admitted only when the client id and the user name are both a
/// registered device's id and the password is its key.
pub(super) async fn connect(
    broker: Arc<Broker>,
    connect: v3::Connect,
) -> Result<v3::ConnectAck<DeviceSession>, SessionError> {
    let packet = connect.packet();
    let client_id = packet.client_id.to_string();
    let admitted = packet.username.as_deref() == Some(client_id.as_str())
        && broker.services.catalog.device(&client_id).is_some_and(|d| {
            d.key_matches(packet.password.as_ref().map(|p| &p[..]).unwrap_or(&[]))
        });
    let outcome = if admitted { "accepted" } else { "refused" };
    metrics::counter!("weft_mqtt_broker_connections_total", "outcome" => outcome).increment(1);
    if !admitted {
        tracing::info!(client_id = %client_id.escape_default(), "MQTT broker refused a connection: bad device id or key");
        return Ok(connect.bad_username_or_pwd());
    }
    let (id, commands) = broker.sessions.register(&client_id);
    let subscriptions = Rc::new(RefCell::new(Vec::new()));
    ntex_rt::spawn(publish_commands(
        connect.sink(),
        subscriptions.clone(),
        commands,
    ));
    let session = DeviceSession {
        device: client_id.clone(),
        subscriptions,
        _registration: Registration {
            broker,
            device: client_id,
            id,
        },
    };
    // No session is kept between connections (`session_present` false):
    // a device subscribes again after it reconnects.
    Ok(connect.ack(session, false))
}

/// PUBLISH: handed to weft's runtime; returning `Ok` is what sends the
/// PUBACK (QoS 1), so it returns only once the message is committed.
pub(super) async fn publish(
    broker: Arc<Broker>,
    session: &v3::Session<DeviceSession>,
    publish: v3::Publish,
) -> Result<(), SessionError> {
    let topic = publish.packet().topic.to_string();
    let payload = publish
        .read_all()
        .await
        .map_err(|e| SessionError::Payload(format!("{e:?}")))?;
    let device = session.device.clone();
    let uplinks = broker.uplinks.clone();
    let verdict = broker
        .runtime
        .spawn(async move { uplinks.publish(&device, &topic, &payload).await })
        .await
        .map_err(|_| SessionError::Stopping)?;
    match verdict {
        Verdict::Done => Ok(()),
        Verdict::Denied => Err(SessionError::Denied),
        Verdict::NotCommitted => Err(SessionError::NotCommitted),
    }
}

/// SUBSCRIBE, UNSUBSCRIBE, PINGREQ, DISCONNECT. Every well-formed filter
/// is granted (QoS 0 or 1): only the device's own commands are ever
/// published to it, so a filter cannot reach another device's messages.
pub(super) async fn protocol(
    session: &v3::Session<DeviceSession>,
    message: v3::ProtocolMessage,
) -> Result<v3::ProtocolMessageAck, SessionError> {
    match message {
        v3::ProtocolMessage::Subscribe(mut subscribe) => {
            let mut subscriptions = session.subscriptions.borrow_mut();
            for mut s in subscribe.iter_mut() {
                match v3::TopicFilter::try_from(s.topic().clone()) {
                    Ok(filter) => {
                        let qos = s.qos().min(QoS::AtLeastOnce);
                        subscriptions.retain(|(f, _)| f.to_string() != filter.to_string());
                        subscriptions.push((filter, qos));
                        s.confirm(qos);
                    }
                    Err(_) => s.fail(),
                }
            }
            drop(subscriptions);
            Ok(subscribe.ack())
        }
        v3::ProtocolMessage::Unsubscribe(unsubscribe) => {
            let gone: Vec<String> = unsubscribe.iter().map(|t| t.to_string()).collect();
            session
                .subscriptions
                .borrow_mut()
                .retain(|(f, _)| !gone.contains(&f.to_string()));
            Ok(unsubscribe.ack())
        }
        other => Ok(other.ack()),
    }
}

/// A connection's end (and its write back-pressure): logged, nothing to
/// send back (MQTT 3.1.1 has no DISCONNECT from the server).
pub(super) async fn control(
    session: &v3::Session<DeviceSession>,
    control: ntex_mqtt::Control<SessionError>,
) -> Result<Option<v3::codec::Encoded>, SessionError> {
    match control {
        ntex_mqtt::Control::Stop(ntex_mqtt::Reason::Error(e)) => {
            tracing::info!(device = %session.device.escape_default(), "MQTT broker closed a connection: {}", e.get_ref());
        }
        ntex_mqtt::Control::Stop(ntex_mqtt::Reason::Protocol(e)) => {
            tracing::info!(device = %session.device.escape_default(), "MQTT broker closed a connection: {:?}", e.get_ref());
        }
        _ => {}
    }
    Ok(None)
}

/// Publishes weft's commands for the device on its connection, until the
/// connection ends or a newer connection of the device replaces it (the
/// channel closes; the connection is then closed too).
async fn publish_commands(
    sink: v3::MqttSink,
    subscriptions: Rc<RefCell<Vec<(v3::TopicFilter, QoS)>>>,
    mut commands: mpsc::Receiver<Command>,
) {
    while let Some(command) = commands.recv().await {
        let qos = subscriptions
            .borrow()
            .iter()
            .filter(|(f, _)| f.matches_topic(&command.topic))
            .map(|(_, q)| *q)
            .max();
        let Some(qos) = qos else {
            let _ = command.done.send(Err(format!(
                "the device has not subscribed to {}",
                command.topic
            )));
            continue;
        };
        let sink = sink.clone();
        // Each on its own task: a device slow to acknowledge one command
        // does not hold up the next (the sink bounds how many are in
        // flight).
        ntex_rt::spawn(async move {
            let publish = sink.publish(command.topic);
            let payload = Bytes::from(command.payload);
            let sent = if qos == QoS::AtMostOnce {
                publish.send_at_most_once(payload)
            } else {
                publish.send_at_least_once(payload).await
            };
            let _ = command
                .done
                .send(sent.map_err(|e| format!("publishing to the device: {e:?}")));
        });
    }
    sink.close();
}
