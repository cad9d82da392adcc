//! One ingest source: weft as an MQTT client of a broker
//! (`[mqtt.sources.<name>]`), subscribed to its format's topics.
//!
//! Two tasks share the connection. The event loop task polls it, keeps it
//! up (reconnecting with a doubling backoff up to [`MAX_BACKOFF`],
//! subscribing again after each connection, since a broker that restarted
//! may have lost the session) and hands every received message to the
//! worker. The worker reads each message ([`crate::topics::read`]),
//! appends what it holds to the ingest log, and only once that append has
//! committed acknowledges it to the broker (manual acks). The session is
//! persistent (`clean_session = false`), so a message weft received but
//! had not committed when it crashed is delivered again when it
//! reconnects; one it had committed but not acknowledged is delivered
//! again too and stored once, by its `dataId`. Up to [`IN_FLIGHT`]
//! messages are appended at once; their acknowledgements still go out in
//! the order the messages came.
//!
//! A message that cannot be an uplink (not JSON where JSON is due, an
//! unknown API key, …) is counted, logged and acknowledged, so the broker
//! does not send it again forever; it never stops the source.

use std::sync::Arc;
use std::time::Duration;

use futures::stream::{FuturesOrdered, StreamExt};
use rumqttc::{AsyncClient, Event, Packet, Publish};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use weft_pipeline::mqtt::{client_options, qos, BrokerUrl, ClientSettings, SourceLink};
use weft_pipeline::{uplink, AcceptError, Services};

use crate::config::SourceConfig;
use crate::topics::{self, Format, Message, Route};

/// Longest wait between two connection attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Largest message accepted, as the HTTP ingest paths accept bodies.
pub const MAX_MESSAGE_BYTES: usize = 1024 * 1024;

/// Messages appended to the ingest log at once, per source.
pub const IN_FLIGHT: usize = 256;

/// A source ready to run: its connection, link and how it reads messages.
pub struct Source {
    name: String,
    format: Format,
    /// The filters subscribed to: the configured topic and, for the IoT
    /// Agent formats, the command answer topics; each under
    /// `$share/<group>/` when the source is shared.
    topics: Vec<String>,
    qos: u8,
    downlink_qos: u8,
    route: Route,
    settings: ClientSettings,
    commit_delay: Option<Duration>,
}

impl Source {
    /// Checks a source's configuration. `node` is this node's id when weft
    /// runs clustered: the source then subscribes through the broker's
    /// shared subscription (`$share/<group>/<topic>`, group `shared_group`
    /// or `weft-<name>`) under a client id made unique by the node id, so
    /// each message goes to one node. A single node subscribes plainly
    /// unless `shared_group` is set.
    pub fn new(name: &str, config: &SourceConfig, node: Option<&str>) -> Result<Source, String> {
        let (format, topic, level) = config.check(name)?;
        let url = BrokerUrl::parse(&config.url)?;
        let group = config
            .shared_group
            .clone()
            .or_else(|| node.map(|_| format!("weft-{name}")));
        let topics = std::iter::once(topic.as_str())
            .map(str::to_string)
            .chain(format.command_answer_topics(&topic))
            .map(|t| match &group {
                Some(group) => format!("$share/{group}/{t}"),
                None => t.to_string(),
            })
            .collect();
        let client_id = config
            .client_id
            .clone()
            .unwrap_or_else(|| format!("weft-{name}"));
        let client_id = match node {
            Some(node) => format!("{client_id}-{node}"),
            None => client_id,
        };
        Ok(Source {
            name: name.to_string(),
            format,
            topics,
            qos: config.qos,
            downlink_qos: config.downlink_qos,
            route: Route {
                device_type: config.device_type.clone(),
                channel: config.channel.clone(),
                device_level: level.unwrap_or(0),
                channel_level: config.channel_level,
                f_port: config.f_port,
                api_keys: config.api_keys.clone(),
                unknown_keys_use_device_type: false,
                source: name.to_string(),
            },
            settings: ClientSettings {
                url,
                client_id,
                credentials: config
                    .username
                    .clone()
                    .map(|u| (u, config.password.clone().unwrap_or_default())),
                ca_file: config.ca_file.clone(),
                persistent_session: true,
                manual_acks: true,
                max_packet_size: MAX_MESSAGE_BYTES,
            },
            commit_delay: config.test_commit_delay,
        })
    }

    /// Starts the source's tasks on `tracker`; they stop when `shutdown`
    /// is cancelled. Returns its link (registered by the caller).
    pub fn start(
        self,
        url_text: &str,
        services: Arc<Services>,
        shutdown: CancellationToken,
        tracker: &TaskTracker,
    ) -> Result<Arc<SourceLink>, String> {
        let options = client_options(&self.settings)?;
        let (client, events) = AsyncClient::new(options, 1024);
        let link = Arc::new(SourceLink::new(
            &self.name,
            self.format.as_str(),
            url_text,
            client.clone(),
            self.downlink_qos,
        ));
        let (tx, rx) = mpsc::channel(IN_FLIGHT);
        let source = Arc::new(self);
        tracker.spawn(source.clone().poll(
            client.clone(),
            events,
            link.clone(),
            tx,
            shutdown.clone(),
        ));
        tracker.spawn(source.work(client, services, rx, shutdown));
        Ok(link)
    }

    /// The event loop task: keeps the connection up and hands messages to
    /// the worker.
    async fn poll(
        self: Arc<Self>,
        client: AsyncClient,
        mut events: rumqttc::EventLoop,
        link: Arc<SourceLink>,
        tx: mpsc::Sender<Publish>,
        shutdown: CancellationToken,
    ) {
        let mut delay = Duration::from_millis(200);
        loop {
            let event = tokio::select! {
                e = events.poll() => e,
                _ = shutdown.cancelled() => break,
            };
            match event {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    delay = Duration::from_millis(200);
                    link.connected();
                    tracing::info!(source = %self.name, topics = ?self.topics, "MQTT source connected");
                    let filters = self
                        .topics
                        .iter()
                        .map(|t| rumqttc::SubscribeFilter::new(t.clone(), qos(self.qos)));
                    if let Err(e) = client.try_subscribe_many(filters) {
                        tracing::warn!(source = %self.name, error = %e, "subscribing failed");
                    }
                }
                Ok(Event::Outgoing(rumqttc::Outgoing::Publish(pkid))) => link.sent(pkid),
                Ok(Event::Incoming(Packet::PubAck(ack))) => link.acknowledged(ack.pkid),
                Ok(Event::Incoming(Packet::Publish(publish))) => {
                    metrics::counter!("weft_mqtt_messages_total", "source" => self.name.clone(), "outcome" => "received")
                        .increment(1);
                    let sent = tokio::select! {
                        sent = tx.send(publish) => sent.is_ok(),
                        _ = shutdown.cancelled() => false,
                    };
                    if !sent {
                        break;
                    }
                }
                Ok(Event::Incoming(Packet::SubAck(ack))) => {
                    let refused = ack
                        .return_codes
                        .iter()
                        .any(|c| matches!(c, rumqttc::SubscribeReasonCode::Failure));
                    if refused {
                        let reason = format!(
                            "the broker refused a subscription to {}",
                            self.topics.join(", ")
                        );
                        tracing::error!(source = %self.name, "{reason}");
                        link.failed(reason);
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    let reason = e.to_string();
                    tracing::warn!(source = %self.name, error = %reason, retry_in = ?delay, "MQTT source disconnected");
                    link.failed(reason);
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = shutdown.cancelled() => break,
                    }
                    delay = (delay * 2).min(MAX_BACKOFF);
                }
            }
        }
        // Unacknowledged messages stay with the broker's session and come
        // back at the next start.
        let _ = client.try_disconnect();
    }

    /// The worker: appends messages to the ingest log and acknowledges
    /// each once committed, in arrival order.
    async fn work(
        self: Arc<Self>,
        client: AsyncClient,
        services: Arc<Services>,
        mut rx: mpsc::Receiver<Publish>,
        shutdown: CancellationToken,
    ) {
        let mut pending = FuturesOrdered::new();
        loop {
            tokio::select! {
                next = rx.recv(), if pending.len() < IN_FLIGHT => match next {
                    Some(publish) => pending.push_back(self.clone().handle(publish, services.clone(), shutdown.clone())),
                    None => break,
                },
                Some(done) = pending.next() => {
                    if let Some(publish) = done {
                        if let Err(e) = client.ack(&publish).await {
                            tracing::warn!(source = %self.name, error = %e, "acknowledging failed");
                        }
                    }
                }
                _ = shutdown.cancelled() => break,
            }
        }
    }

    /// Reads one message and appends its uplinks, then records how the
    /// device is reached back over this source (its downlink route); a
    /// command answer completes the device's commands. Returns the message
    /// to be acknowledged, or `None` when weft is stopping before it
    /// committed (not acknowledged: the broker sends it again).
    async fn handle(
        self: Arc<Self>,
        publish: Publish,
        services: Arc<Services>,
        shutdown: CancellationToken,
    ) -> Option<Publish> {
        let outcome = |o: &'static str| {
            metrics::counter!("weft_mqtt_messages_total", "source" => self.name.clone(), "outcome" => o)
                .increment(1);
        };
        let message = topics::read(
            self.format,
            &self.route,
            &publish.topic,
            &publish.payload,
            weft_model::now_ms(),
        );
        let uplinks = match message {
            Ok(Message::Uplinks(u)) => u,
            Ok(Message::Ignored) => return Some(publish),
            Ok(Message::CommandAnswer {
                device,
                answers,
                pins,
            }) => {
                match uplink::command_result(&services, &device, &answers, &pins).await {
                    Ok(answered) if !answered.is_empty() => outcome("committed"),
                    Ok(_) => {
                        outcome("refused");
                        tracing::warn!(source = %self.name, topic = %publish.topic, "command answer names no command of the device");
                    }
                    Err(e) => {
                        outcome("refused");
                        tracing::warn!(source = %self.name, topic = %publish.topic, "command answer refused: {e}");
                    }
                }
                return Some(publish);
            }
            Err(reason) => {
                outcome("refused");
                tracing::warn!(source = %self.name, topic = %publish.topic, "message refused: {reason}");
                return Some(publish);
            }
        };
        if let Some(delay) = self.commit_delay {
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = shutdown.cancelled() => return None,
            }
        }
        let arrival = uplink::Arrival {
            uplinks,
            parsed: None,
            route: topics::downlink_route(
                self.format,
                &self.name,
                &publish.topic,
                &publish.payload,
            ),
        };
        let patience = uplink::Patience::Retry {
            stop: shutdown.clone(),
            max_delay: Duration::from_secs(5),
            give_up_after: None,
        };
        match uplink::accept(&services, arrival, &patience).await {
            Ok(()) => outcome("committed"),
            Err(AcceptError::Forbidden(reason)) => {
                outcome("refused");
                tracing::warn!(source = %self.name, topic = %publish.topic, "message refused: {reason}");
            }
            // Stopping before it was committed: not acknowledged, the
            // broker sends it again.
            Err(_) => return None,
        }
        Some(publish)
    }
}
