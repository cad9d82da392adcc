//! The scale-out bus backend: several weft nodes exchange their events and
//! their definition changes over NATS JetStream (`[bus] backend = "nats"`).
//!
//! A node's own subscribers are served exactly as by the in-process bus
//! (the node keeps one, [`InProcessBus`]), so what they see and when does
//! not change; every event is also sent to NATS, and every other node's
//! events are taken from NATS and handed to this node's subscribers. A
//! node skips its own messages there (each carries its node id), so
//! nothing reaches a subscriber twice.
//!
//! On NATS, subjects are bound to two JetStream streams per cluster
//! ([`crate::wire`] names them): the events, kept 60 s in memory, and the
//! definition changes, kept an hour in memory. Each node reads both
//! through ordered push consumers that start at the newest message: live
//! fan-out stays at-most-once, as in one process; what the streams add is
//! that a node whose connection drops briefly resumes where it was instead
//! of missing what was sent meanwhile (the consumer picks up from its last
//! sequence while the stream still holds it). Durable consumers (rules,
//! bridges, history) read the store, never the bus, so nothing depends on
//! the bus keeping anything.
//!
//! Publishing never waits for NATS: events and notices go through a
//! bounded outbox ([`OUTBOX_CAPACITY`]) to one publishing task, which
//! sends the events waiting there together, a message per stream (see
//! [`crate::wire`]); when NATS is slow or away and the outbox is full,
//! further ones are dropped and counted (`weft_bus_dropped_total`). NATS
//! unreachable at start is an error (the node refuses to start); lost
//! later, it is logged, the client reconnects on its own, the streams are
//! declared again (a restarted NATS may have lost them) and every follower
//! of definitions reloads everything, since notices may have been lost
//! meanwhile.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use futures::{FutureExt, StreamExt};
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::definitions::{DefinitionChange, DefinitionFollower, Reload, FOLLOWER_CAPACITY};
use crate::in_process::InProcessBus;
use crate::wire::{self, Outgoing, Subjects};
use crate::{Bus, Event, RemoteEntityChanges, Stream, Subscription};

/// Messages waiting for the publishing task before new ones are dropped:
/// about a second of the target ingest rate, as the in-process streams.
pub const OUTBOX_CAPACITY: usize = crate::STREAM_CAPACITY;

/// While events keep coming, how long the publishing task lets them
/// gather before it sends them as one message a stream: a node under load
/// sends a few large messages instead of many small ones (most of what an
/// event costs every node is per message), and an event reaches the other
/// nodes at most this much later.
pub const PUBLISH_LINGER: Duration = Duration::from_millis(1);

/// How long the events stream keeps a message: long enough for a node
/// whose connection dropped for a moment to catch up, short enough that
/// the stream stays small. Live fan-out needs no more.
pub const EVENTS_MAX_AGE: Duration = Duration::from_secs(60);

/// Most bytes the events stream holds (oldest dropped first).
pub const EVENTS_MAX_BYTES: i64 = 64 * 1024 * 1024;

/// How long the definitions stream keeps a notice.
pub const DEFINITIONS_MAX_AGE: Duration = Duration::from_secs(3600);

/// Most notices the definitions stream holds (oldest dropped first).
pub const DEFINITIONS_MAX_MESSAGES: i64 = 100_000;

/// How long a node waits for NATS when it starts, and for the last
/// messages to be flushed when it stops.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the NATS backend connects.
#[derive(Debug, Clone)]
pub struct NatsConfig {
    /// The server's URL (`nats://host:4222`).
    pub url: String,
    /// The cluster's name: the first token of its subjects and the prefix
    /// of its stream names, so several clusters can share one NATS.
    pub cluster: String,
}

/// Why the NATS backend could not start.
#[derive(Debug)]
pub enum NatsError {
    /// The configuration is invalid (an empty URL, a bad cluster name).
    Config(String),
    /// NATS did not answer at the URL.
    Unreachable {
        /// The URL tried.
        url: String,
        /// What the client said.
        reason: String,
    },
    /// NATS answered, but its JetStream did not set up a stream (JetStream
    /// off, or out of resources).
    JetStream {
        /// The URL.
        url: String,
        /// The stream.
        stream: String,
        /// What the server said.
        reason: String,
    },
}

impl std::fmt::Display for NatsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NatsError::Config(why) => write!(f, "{why}"),
            NatsError::Unreachable { url, reason } => write!(
                f,
                "cannot reach NATS at {url}: {reason} (bus.backend is 'nats': start \
                 nats-server with JetStream, `nats-server -js`, or set bus.backend = \"in-process\")"
            ),
            NatsError::JetStream {
                url,
                stream,
                reason,
            } => write!(
                f,
                "NATS at {url} did not set up the JetStream stream '{stream}': {reason} \
                 (is JetStream on? start nats-server with -js)"
            ),
        }
    }
}

impl std::error::Error for NatsError {}

/// The NATS JetStream backend; see the module doc.
pub struct NatsBus {
    /// This node's own subscribers.
    local: Arc<InProcessBus>,
    /// The subscribers to other nodes' events only.
    remote: InProcessBus,
    /// This node's id, sent with every message and skipped on receipt.
    node: Arc<str>,
    subjects: Subjects,
    js: jetstream::Context,
    /// To the publishing task.
    outbox: mpsc::Sender<Queued>,
    /// Definition changes made by other nodes, to this node's followers.
    definitions: broadcast::Sender<Reload>,
    client: async_nats::Client,
    /// Stops the tasks.
    stop: CancellationToken,
    tasks: TaskTracker,
    /// [`Bus::remote_entities_behind`], in milliseconds.
    entities_behind_ms: AtomicU64,
    /// Other nodes' entity changes, to [`Bus::follow_remote_entities`].
    remote_entities: broadcast::Sender<RemoteEntityChanges>,
}

/// Messages of other nodes' entity changes buffered for their follower
/// before it lags (each up to [`wire::MAX_BATCH_EVENTS`] changes).
const REMOTE_ENTITY_MESSAGES: usize = 1024;

/// What waits in the outbox for the publishing task.
enum Queued {
    /// An event, sent together with the events of its stream waiting
    /// beside it.
    Event(Event),
    /// A definition change's notice, ready to send.
    Notice(Outgoing),
}

/// What a receiving task does with one message from another node.
type Handler = fn(&NatsBus, &jetstream::Message);

impl NatsBus {
    /// Connects to NATS, declares the cluster's streams and starts
    /// receiving other nodes' events and definition changes. Fails if NATS
    /// cannot be reached or its JetStream does not set the streams up.
    pub async fn connect(config: NatsConfig) -> Result<Arc<NatsBus>, NatsError> {
        if config.url.trim().is_empty() {
            return Err(NatsError::Config(
                "bus.backend is 'nats' but bus.url is empty: set WEFT_BUS__URL=nats://host:4222"
                    .into(),
            ));
        }
        let subjects = Subjects::new(&config.cluster).map_err(|e| NatsError::Config(e.0))?;
        let node: Arc<str> = uuid::Uuid::new_v4().simple().to_string().into();
        let (definitions, _) = broadcast::channel(FOLLOWER_CAPACITY);
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let client = async_nats::ConnectOptions::new()
            .name(format!("weft {node}"))
            .connection_timeout(CONNECT_TIMEOUT)
            .max_reconnects(None)
            .event_callback(move |event| {
                let tx = events_tx.clone();
                async move {
                    let _ = tx.send(event);
                }
            })
            .connect(config.url.as_str())
            .await
            .map_err(|e| NatsError::Unreachable {
                url: config.url.clone(),
                reason: e.to_string(),
            })?;
        let js = jetstream::new(client.clone());
        let jetstream_error = |(stream, reason)| NatsError::JetStream {
            url: config.url.clone(),
            stream,
            reason,
        };
        declare_streams(&js, &subjects)
            .await
            .map_err(jetstream_error)?;
        let (outbox, outbox_rx) = mpsc::channel(OUTBOX_CAPACITY);
        let bus = Arc::new(NatsBus {
            local: Arc::new(InProcessBus::default()),
            remote: InProcessBus::default(),
            node,
            subjects,
            js,
            outbox,
            definitions,
            client,
            stop: CancellationToken::new(),
            tasks: TaskTracker::new(),
            entities_behind_ms: AtomicU64::new(0),
            remote_entities: broadcast::channel(REMOTE_ENTITY_MESSAGES).0,
        });
        // Every consumer is listening before `connect` returns, so a node
        // receives whatever is published once it serves.
        let mut readers: Vec<(String, String, Handler)> = Stream::ALL
            .iter()
            .map(|&stream| {
                let handler: Handler = match stream {
                    Stream::Data => |bus, m| bus.on_event(Stream::Data, m),
                    Stream::Alarms => |bus, m| bus.on_event(Stream::Alarms, m),
                    Stream::Entities => |bus, m| bus.on_event(Stream::Entities, m),
                };
                (
                    bus.subjects.events_stream(),
                    bus.subjects.event(stream),
                    handler,
                )
            })
            .collect();
        readers.push((
            bus.subjects.definitions_stream(),
            bus.subjects.all_definitions(),
            |bus, m| bus.on_definition(m),
        ));
        for (stream, filter, handler) in readers {
            let messages = match bus.consume(&stream, &filter).await {
                Ok(messages) => messages,
                Err(reason) => {
                    bus.stop.cancel();
                    return Err(jetstream_error((stream, reason)));
                }
            };
            bus.tasks
                .spawn(bus.clone().receive(stream, filter, messages, handler));
        }
        bus.tasks.spawn(bus.clone().publish_loop(outbox_rx));
        bus.tasks.spawn(bus.clone().watch_connection(events_rx));
        tracing::info!(url = %config.url, cluster = %config.cluster, node = %bus.node, "events and definitions cross nodes over NATS JetStream");
        Ok(bus)
    }

    /// This node's id on the bus.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Sends what the outbox still holds, flushes the connection (at most
    /// [`CONNECT_TIMEOUT`]) and stops receiving. Called once the services
    /// have stopped publishing.
    pub async fn close(&self) {
        self.stop.cancel();
        self.tasks.close();
        if tokio::time::timeout(CONNECT_TIMEOUT, self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!("the NATS bus did not stop in time; unsent events are dropped");
        }
    }

    /// An ordered push consumer of `filter` on `stream`, starting at the
    /// newest message, with its subscription made.
    async fn consume(&self, stream: &str, filter: &str) -> Result<consumer::push::Ordered, String> {
        let stream = self
            .js
            .get_stream(stream)
            .await
            .map_err(|e| e.to_string())?;
        let consumer = stream
            .create_consumer(consumer::push::OrderedConfig {
                deliver_subject: self.client.new_inbox(),
                filter_subject: filter.to_string(),
                deliver_policy: consumer::DeliverPolicy::New,
                ..Default::default()
            })
            .await
            .map_err(|e| e.to_string())?;
        consumer.messages().await.map_err(|e| e.to_string())
    }

    /// Hands every other node's message of `filter` on `stream` to
    /// `handler`. The ordered consumer makes itself again after a
    /// disconnection, from the last message it saw (or, on a NATS that
    /// restarted without the stream, from the first of the stream declared
    /// again).
    async fn receive(
        self: Arc<Self>,
        stream: String,
        filter: String,
        mut messages: consumer::push::Ordered,
        handler: Handler,
    ) {
        // How far behind the other nodes this node reads: what NATS still
        // holds for the consumer, and how long ago the message in hand was
        // published. A node that cannot keep up shows it here before its
        // readers notice stale answers.
        let pending = metrics::gauge!("weft_bus_remote_pending", "subject" => filter.clone());
        let lag = metrics::gauge!("weft_bus_remote_lag_seconds", "subject" => filter.clone());
        // For entity changes, also how far behind this node reads them
        // (`Bus::remote_entities_behind`).
        let behind =
            (filter == self.subjects.event(Stream::Entities)).then_some(&self.entities_behind_ms);
        loop {
            if self.stop.is_cancelled() {
                return;
            }
            let next = match messages.next().now_or_never() {
                Some(next) => next,
                None => {
                    // Nothing more waits here: caught up with the others.
                    if let Some(behind) = behind {
                        behind.store(0, Ordering::Relaxed);
                    }
                    tokio::select! {
                        _ = self.stop.cancelled() => return,
                        next = messages.next() => next,
                    }
                }
            };
            let message = match next {
                Some(Ok(message)) => message,
                Some(Err(e)) => {
                    // Missing heartbeats while NATS is away: the consumer
                    // recreates itself once it is back.
                    tracing::debug!(%stream, %filter, error = %e, "NATS consumer");
                    continue;
                }
                None => return,
            };
            if let Ok(info) = message.info() {
                pending.set(info.pending as f64);
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as i128);
                let age = (now - info.published.unix_timestamp_nanos()).max(0);
                lag.set(age as f64 / 1e9);
                if let Some(behind) = behind {
                    behind.store((age / 1_000_000) as u64, Ordering::Relaxed);
                }
            }
            if wire::origin(message.headers.as_ref()) != Some(&*self.node) {
                handler(&self, &message);
            }
        }
    }

    /// Hands another node's events to this node's subscribers.
    fn on_event(&self, stream: Stream, message: &jetstream::Message) {
        metrics::counter!("weft_bus_remote_events_total", "stream" => stream.as_str())
            .increment(wire::events_in(&message.payload) as u64);
        if stream == Stream::Entities && self.remote_entities.receiver_count() > 0 {
            match wire::read_entity_changes(message.headers.as_ref(), &message.payload) {
                Ok(changes) => {
                    let _ = self.remote_entities.send(changes.into());
                }
                Err(e) => {
                    metrics::counter!("weft_bus_unreadable_total", "stream" => stream.as_str())
                        .increment(1);
                    tracing::warn!(stream = stream.as_str(), error = %e, "entity changes from another node could not be read; skipped");
                }
            }
        }
        if !self.local.has_subscribers(stream) && !self.remote.has_subscribers(stream) {
            // Nobody here listens (no live socket, no bridge on this
            // stream): every node receives every event, and reading one
            // nobody wants is most of what it costs.
            return;
        }
        match wire::decode_events(stream, message.headers.as_ref(), &message.payload) {
            Ok(events) => {
                for event in events {
                    let event = Arc::new(event);
                    self.remote.deliver(event.clone());
                    self.local.deliver(event);
                }
            }
            Err(e) => {
                metrics::counter!("weft_bus_unreadable_total", "stream" => stream.as_str())
                    .increment(1);
                tracing::warn!(stream = stream.as_str(), error = %e, "events from another node could not be read; skipped");
            }
        }
    }

    /// Hands another node's definition change to this node's followers.
    fn on_definition(&self, message: &jetstream::Message) {
        let Some(kind) = self.subjects.kind_of(message.subject.as_str()) else {
            return;
        };
        match wire::decode_definition(kind, message.headers.as_ref(), &message.payload) {
            Ok(change) => {
                tracing::debug!(kind = kind.as_str(), id = %change.id, "a definition changed on another node");
                let _ = self.definitions.send(Reload::One(change));
            }
            Err(e) => {
                // A lost notice: reload everything rather than keep a
                // stale copy.
                metrics::counter!("weft_bus_unreadable_total", "stream" => "definitions")
                    .increment(1);
                tracing::warn!(error = %e, "a definition change from another node could not be read; reloading every definition");
                let _ = self.definitions.send(Reload::All);
            }
        }
    }

    /// Sends the outbox to NATS until stopped, then what is left: each
    /// time, everything waiting there (up to [`OUTBOX_CAPACITY`]), the
    /// events of a stream together. While events keep coming, at most one
    /// message a stream goes out per [`PUBLISH_LINGER`]: what comes meanwhile
    /// joins it. An event after a quiet moment goes at once.
    async fn publish_loop(self: Arc<Self>, mut outbox: mpsc::Receiver<Queued>) {
        let mut waiting = Vec::new();
        let mut last_sent = tokio::time::Instant::now() - PUBLISH_LINGER;
        loop {
            tokio::select! {
                _ = self.stop.cancelled() => break,
                n = outbox.recv_many(&mut waiting, OUTBOX_CAPACITY) => {
                    if n == 0 {
                        break;
                    }
                }
            }
            let since = last_sent.elapsed();
            if since < PUBLISH_LINGER {
                tokio::select! {
                    _ = self.stop.cancelled() => {}
                    _ = tokio::time::sleep(PUBLISH_LINGER - since) => {}
                }
                while waiting.len() < OUTBOX_CAPACITY {
                    match outbox.try_recv() {
                        Ok(queued) => waiting.push(queued),
                        Err(_) => break,
                    }
                }
            }
            self.send_waiting(&mut waiting).await;
            last_sent = tokio::time::Instant::now();
        }
        while outbox
            .recv_many(&mut waiting, OUTBOX_CAPACITY)
            .now_or_never()
            .unwrap_or(0)
            > 0
        {
            self.send_waiting(&mut waiting).await;
        }
        if let Err(e) = self.client.flush().await {
            tracing::warn!(error = %e, "flushing the last events to NATS failed");
        }
    }

    /// Sends `waiting` (emptied): notices one by one, each stream's
    /// events in their order in as few messages as [`wire::batches`]
    /// allows. Streams are separate subjects read separately, so only the
    /// order within a stream is kept.
    async fn send_waiting(&self, waiting: &mut Vec<Queued>) {
        let mut events: [Vec<Event>; Stream::ALL.len()] = Default::default();
        for queued in waiting.drain(..) {
            match queued {
                Queued::Notice(notice) => self.send(notice).await,
                Queued::Event(event) => {
                    let i = Stream::ALL
                        .iter()
                        .position(|&s| s == event.stream)
                        .expect("every stream is in Stream::ALL");
                    events[i].push(event);
                }
            }
        }
        for (stream, events) in Stream::ALL.into_iter().zip(&events) {
            for batch in wire::batches(events) {
                metrics::counter!("weft_bus_messages_total", "stream" => stream.as_str())
                    .increment(1);
                self.send(wire::encode_events(
                    &self.subjects,
                    &self.node,
                    stream,
                    batch,
                ))
                .await;
            }
        }
    }

    async fn send(&self, m: Outgoing) {
        if let Err(e) = self
            .client
            .publish_with_headers(m.subject, m.headers, m.payload)
            .await
        {
            metrics::counter!("weft_bus_dropped_total", "reason" => "publish").increment(1);
            tracing::debug!(error = %e, "publishing to NATS failed");
        }
    }

    /// Logs the connection's ups and downs. After a reconnection it
    /// declares the streams again (a restarted NATS lost them; the
    /// consumers wait for them) and has every follower reload everything
    /// (notices may have been lost).
    async fn watch_connection(
        self: Arc<Self>,
        mut events: mpsc::UnboundedReceiver<async_nats::Event>,
    ) {
        let mut lost = false;
        loop {
            let event = tokio::select! {
                _ = self.stop.cancelled() => return,
                next = events.recv() => match next {
                    Some(e) => e,
                    None => return,
                },
            };
            match event {
                async_nats::Event::Disconnected => {
                    lost = true;
                    metrics::counter!("weft_bus_disconnections_total").increment(1);
                    tracing::warn!("lost the connection to NATS: other nodes' events and definition changes wait until it is back; reconnecting");
                }
                async_nats::Event::Connected if lost => {
                    lost = false;
                    tracing::info!("reconnected to NATS; reloading every definition other nodes may have changed meanwhile");
                    let mut delay = Duration::from_millis(100);
                    loop {
                        match declare_streams(&self.js, &self.subjects).await {
                            Ok(()) => break,
                            Err((stream, reason)) => {
                                tracing::warn!(%stream, %reason, "declaring the JetStream streams again failed; retrying");
                                tokio::select! {
                                    _ = self.stop.cancelled() => return,
                                    _ = tokio::time::sleep(delay) => {}
                                }
                                delay = (delay * 2).min(Duration::from_secs(5));
                            }
                        }
                    }
                    let _ = self.definitions.send(Reload::All);
                }
                async_nats::Event::Connected => {}
                other => tracing::info!(event = %other, "NATS"),
            }
        }
    }

    fn enqueue(&self, queued: Queued) {
        if self.outbox.try_send(queued).is_err() {
            metrics::counter!("weft_bus_dropped_total", "reason" => "outbox_full").increment(1);
        }
    }
}

/// Creates the cluster's streams unless they exist; on failure, which
/// stream and why.
async fn declare_streams(
    js: &jetstream::Context,
    subjects: &Subjects,
) -> Result<(), (String, String)> {
    let events = stream::Config {
        name: subjects.events_stream(),
        subjects: vec![subjects.all_events()],
        storage: stream::StorageType::Memory,
        retention: stream::RetentionPolicy::Limits,
        discard: stream::DiscardPolicy::Old,
        max_age: EVENTS_MAX_AGE,
        max_bytes: EVENTS_MAX_BYTES,
        num_replicas: 1,
        description: Some("weft: every node's events, for live fan-out on the others".into()),
        ..Default::default()
    };
    let definitions = stream::Config {
        name: subjects.definitions_stream(),
        subjects: vec![subjects.all_definitions()],
        storage: stream::StorageType::Memory,
        retention: stream::RetentionPolicy::Limits,
        discard: stream::DiscardPolicy::Old,
        max_age: DEFINITIONS_MAX_AGE,
        max_messages: DEFINITIONS_MAX_MESSAGES,
        num_replicas: 1,
        description: Some("weft: which stored definitions changed, so nodes reload them".into()),
        ..Default::default()
    };
    for config in [events, definitions] {
        let name = config.name.clone();
        js.get_or_create_stream(config)
            .await
            .map_err(|e| (name, e.to_string()))?;
    }
    Ok(())
}

impl Bus for NatsBus {
    fn publish(&self, event: Event) {
        self.enqueue(Queued::Event(event.clone()));
        self.local.publish(event);
    }

    fn subscribe(&self, stream: Stream) -> Subscription {
        self.local.subscribe(stream)
    }

    /// Always: another node may be listening, and this one cannot tell.
    fn has_subscribers(&self, _stream: Stream) -> bool {
        true
    }

    fn definition_changed(&self, change: DefinitionChange) {
        self.enqueue(Queued::Notice(wire::encode_definition(
            &self.subjects,
            &self.node,
            &change,
        )));
    }

    fn follow_definitions(&self) -> DefinitionFollower {
        DefinitionFollower::new(self.definitions.subscribe())
    }

    fn subscribe_remote(&self, stream: Stream) -> Option<Subscription> {
        Some(self.remote.subscribe(stream))
    }

    fn follow_remote_entities(&self) -> Option<Subscription<RemoteEntityChanges>> {
        Some(Subscription::new(self.remote_entities.subscribe()))
    }

    fn node(&self) -> Option<&str> {
        Some(&self.node)
    }

    fn remote_entities_behind(&self) -> Duration {
        Duration::from_millis(self.entities_behind_ms.load(Ordering::Relaxed))
    }
}

/// These run against a real NATS with JetStream (`WEFT_TEST_NATS_URL`,
/// which `scripts/test` sets); each test uses a cluster name of its own.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::definitions::DefinitionKind;
    use crate::{Payload, RecvError};
    use bytes::Bytes;
    use weft_model::DataUnit;

    fn config() -> NatsConfig {
        let url = std::env::var("WEFT_TEST_NATS_URL").expect(
            "WEFT_TEST_NATS_URL names the test NATS server: scripts/test starts one \
             (scripts/test-services start)",
        );
        NatsConfig {
            url,
            cluster: format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..12]),
        }
    }

    fn event(id: &str) -> Event {
        let unit = DataUnit {
            data_id: id.into(),
            reported_at: 1,
            received_at: 2,
            channel: "c".into(),
            device: Default::default(),
            measures: Default::default(),
        };
        let json = Bytes::from(serde_json::to_vec(&unit).unwrap());
        Event {
            stream: Stream::Data,
            payload: Payload::Data(Arc::new(unit)),
            json,
        }
    }

    async fn next_id(sub: &mut Subscription, within: Duration) -> Option<String> {
        match tokio::time::timeout(within, sub.recv()).await {
            Ok(Ok(e)) => match &e.payload {
                Payload::Data(u) => Some(u.data_id.clone()),
                _ => panic!("a data unit"),
            },
            Ok(Err(RecvError::Lagged(n))) => panic!("lagged by {n}"),
            Ok(Err(RecvError::Closed)) | Err(_) => None,
        }
    }

    /// Each node's subscribers see every node's events exactly once: their
    /// own node's straight away, the other's through NATS, never their
    /// own node's a second time on the way back.
    #[tokio::test]
    async fn events_cross_nodes_once_and_never_come_back() {
        let config = config();
        let a = NatsBus::connect(config.clone()).await.unwrap();
        let b = NatsBus::connect(config).await.unwrap();
        assert_ne!(a.node(), b.node());
        let mut on_a = a.subscribe(Stream::Data);
        let mut on_b = b.subscribe(Stream::Data);
        let alarms_on_b = b.subscribe(Stream::Alarms);
        let wait = Duration::from_secs(5);
        a.publish(event("1"));
        assert_eq!(next_id(&mut on_a, wait).await.as_deref(), Some("1"));
        assert_eq!(next_id(&mut on_b, wait).await.as_deref(), Some("1"));
        b.publish(event("2"));
        assert_eq!(next_id(&mut on_b, wait).await.as_deref(), Some("2"));
        assert_eq!(next_id(&mut on_a, wait).await.as_deref(), Some("2"));
        let quiet = Duration::from_millis(500);
        assert_eq!(next_id(&mut on_a, quiet).await, None, "no echo on a");
        assert_eq!(next_id(&mut on_b, quiet).await, None, "no echo on b");
        assert_eq!(alarms_on_b.backlog(), 0, "events stay on their stream");
        a.close().await;
        b.close().await;
    }

    /// A definition changed on one node is announced to the others'
    /// followers, and not to its own (it applied the change itself).
    #[tokio::test]
    async fn definition_changes_reach_the_other_nodes_only() {
        let config = config();
        let a = NatsBus::connect(config.clone()).await.unwrap();
        let b = NatsBus::connect(config).await.unwrap();
        let mut follows_a = a.follow_definitions();
        let mut follows_b = b.follow_definitions();
        let change = DefinitionChange::in_tenant(DefinitionKind::ApiKey, "", "k1");
        a.definition_changed(change.clone());
        let got = tokio::time::timeout(Duration::from_secs(5), follows_b.recv())
            .await
            .expect("b hears of it");
        assert_eq!(got, Some(Reload::One(change)));
        let echo = tokio::time::timeout(Duration::from_millis(500), follows_a.recv()).await;
        assert!(echo.is_err(), "a is not told of its own change: {echo:?}");
        a.close().await;
        b.close().await;
    }

    /// A node configured for NATS that cannot reach it refuses to start,
    /// saying where it looked and what to do.
    #[tokio::test]
    async fn an_unreachable_nats_fails_the_start_clearly() {
        let err = NatsBus::connect(NatsConfig {
            url: "nats://127.0.0.1:1".into(),
            cluster: "weft".into(),
        })
        .await
        .err()
        .expect("no NATS there");
        assert!(matches!(err, NatsError::Unreachable { .. }), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("cannot reach NATS at nats://127.0.0.1:1"),
            "{text}"
        );
        let err = NatsBus::connect(NatsConfig {
            url: String::new(),
            cluster: "weft".into(),
        })
        .await
        .err()
        .expect("no URL");
        assert!(err.to_string().contains("bus.url is empty"), "{err}");
    }

    /// A free port below Linux's ephemeral range (32768-60999), so no
    /// client socket takes it while the test's NATS restarts on it.
    fn free_port() -> u16 {
        let start = 20_000 + (uuid::Uuid::new_v4().as_u128() % 10_000) as u16;
        (start..start + 1000)
            .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
            .expect("a free port")
    }

    /// A NATS of this test's own (`nats-server` from PATH, as
    /// `scripts/test-services` installs it) on `port`, JetStream's store
    /// in `dir`; killed when dropped.
    struct OwnNats(std::process::Child);

    impl OwnNats {
        fn start(port: u16, dir: &std::path::Path) -> OwnNats {
            let child = std::process::Command::new("nats-server")
                .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
                .arg(dir)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("nats-server runs (scripts/test-services installs it)");
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
                assert!(std::time::Instant::now() < deadline, "nats-server listens");
                std::thread::sleep(Duration::from_millis(20));
            }
            OwnNats(child)
        }
    }

    impl Drop for OwnNats {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// Losing NATS is survived: each node reconnects by itself, declares
    /// the streams again on a NATS that restarted without them, subscribes
    /// again, and has its followers reload every definition; events flow
    /// between the nodes again.
    #[tokio::test]
    async fn nodes_reconnect_and_resume_after_nats_restarts() {
        let port = free_port();
        let first = tempfile::tempdir().unwrap();
        let nats = OwnNats::start(port, first.path());
        let config = NatsConfig {
            url: format!("nats://127.0.0.1:{port}"),
            cluster: "weft".into(),
        };
        let a = NatsBus::connect(config.clone()).await.unwrap();
        let b = NatsBus::connect(config).await.unwrap();
        let mut follows_b = b.follow_definitions();
        let mut on_b = b.subscribe(Stream::Data);
        // Far along the old streams' sequence, so a consumer that resumed
        // from there would miss this many events after the restart.
        const BEFORE: usize = 200;
        for n in 0..BEFORE {
            a.publish(event(&format!("before-{n}")));
        }
        for n in 0..BEFORE {
            let got = next_id(&mut on_b, Duration::from_secs(5)).await;
            assert_eq!(got, Some(format!("before-{n}")));
        }

        drop(nats);
        let second = tempfile::tempdir().unwrap();
        let _nats = OwnNats::start(port, second.path());
        let reload = tokio::time::timeout(Duration::from_secs(30), follows_b.recv())
            .await
            .expect("b notices the reconnection");
        assert_eq!(reload, Some(Reload::All), "b reloads every definition");
        // The restarted NATS numbers its (new) streams from 1 again; the
        // nodes must not wait for the old sequence to come back. (The
        // first few may go while the consumers are made again.)
        let mut crossed = None;
        for n in 0..20 {
            a.publish(event(&format!("after-{n}")));
            if let Some(id) = next_id(&mut on_b, Duration::from_millis(500)).await {
                crossed = Some(id);
                break;
            }
        }
        let id = crossed.expect("events cross again soon after the restart");
        assert!(id.starts_with("after-"), "{id}");
        a.close().await;
        b.close().await;
    }
}
