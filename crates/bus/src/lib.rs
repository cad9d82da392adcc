//! weft's event bus: the seam between the stages that produce events (the
//! pipeline's data units, the rule engine's alarm changes, the context's
//! entity changes) and the ones that consume them (live fan-out, channel
//! bridges). Every event is published after the change it carries has
//! been committed.
//!
//! [`Bus`] is the trait; [`InProcessBus`] is the default backend, built on
//! `tokio::sync::broadcast`. A scale-out backend (NATS JetStream) bridges
//! its subjects into the same [`Subscription`] type, so consumers never
//! know which backend runs.
//!
//! Delivery is at-most-once and never blocks a publisher: a subscriber that
//! falls more than the stream's capacity behind gets [`RecvError::Lagged`]
//! and decides what to do (the live websocket disconnects it). Durable
//! consumers replay from the store, not from the bus.
#![deny(missing_docs)]

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::broadcast;
use weft_model::ngsi::EntityChange;
use weft_model::{AlarmEvent, DataUnit};

/// How many events each stream buffers for its slowest subscriber before
/// that subscriber lags. 16k events of ~300 bytes bound a stream at ~5 MB
/// and absorb about a second of the target ingest rate.
pub const STREAM_CAPACITY: usize = 16 * 1024;

/// The named event streams, as the live API calls them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stream {
    /// Data units, as stored.
    Data,
    /// Alarm raised/updated/cleared/acked.
    Alarms,
    /// NGSI entity changes.
    Entities,
}

impl Stream {
    /// Every stream, for backends that set them all up at once.
    pub const ALL: [Stream; 3] = [Stream::Data, Stream::Alarms, Stream::Entities];

    /// The stream's name in the live API (`data`, `alarms`, `entities`).
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Data => "data",
            Stream::Alarms => "alarms",
            Stream::Entities => "entities",
        }
    }

    /// Inverse of [`Stream::as_str`].
    pub fn parse(s: &str) -> Option<Stream> {
        Stream::ALL.into_iter().find(|st| st.as_str() == s)
    }
}

/// What an event carries, typed, so in-process consumers can filter
/// without parsing JSON.
#[derive(Debug, Clone)]
pub enum Payload {
    /// A stored data unit.
    Data(Arc<DataUnit>),
    /// A stored alarm change.
    Alarm(Arc<AlarmEvent>),
    /// A committed entity change.
    Entity(Arc<EntityChange>),
}

/// One event: its typed payload and its JSON, serialised once by the
/// producer and reused by every consumer that forwards it.
#[derive(Debug, Clone)]
pub struct Event {
    /// Which stream it belongs to.
    pub stream: Stream,
    /// The typed payload.
    pub payload: Payload,
    /// The payload's JSON.
    pub json: Bytes,
}

/// Why [`Subscription::recv`] returned no event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecvError {
    /// The subscriber fell behind and this many events were skipped.
    Lagged(u64),
    /// The bus was shut down.
    Closed,
}

/// A subscriber's handle on one stream.
pub struct Subscription {
    rx: broadcast::Receiver<Arc<Event>>,
}

impl Subscription {
    /// The next event. Lagging is reported once, then reception continues
    /// with the oldest event still buffered.
    pub async fn recv(&mut self) -> Result<Arc<Event>, RecvError> {
        self.rx.recv().await.map_err(|e| match e {
            broadcast::error::RecvError::Lagged(n) => RecvError::Lagged(n),
            broadcast::error::RecvError::Closed => RecvError::Closed,
        })
    }

    /// How many events are buffered for this subscriber right now; lets a
    /// consumer notice it is falling behind before it lags.
    pub fn backlog(&self) -> usize {
        self.rx.len()
    }
}

/// Publishes events to whoever subscribed. Implementations must not block
/// or fail a publisher because of a slow subscriber.
pub trait Bus: Send + Sync + 'static {
    /// Delivers `event` to the current subscribers of its stream.
    fn publish(&self, event: Event);
    /// A new subscription to `stream`, receiving events published after now.
    fn subscribe(&self, stream: Stream) -> Subscription;
    /// Whether publishing on `stream` can reach anyone, so a producer whose
    /// events cost work to build (an entity change's JSON) skips them when
    /// nobody listens. A backend that cannot tell answers `true`.
    fn has_subscribers(&self, stream: Stream) -> bool {
        let _ = stream;
        true
    }
}

/// The default backend: one broadcast channel per stream, in this process.
pub struct InProcessBus {
    data: broadcast::Sender<Arc<Event>>,
    alarms: broadcast::Sender<Arc<Event>>,
    entities: broadcast::Sender<Arc<Event>>,
}

impl Default for InProcessBus {
    fn default() -> Self {
        Self::with_capacity(STREAM_CAPACITY)
    }
}

impl InProcessBus {
    /// A bus whose streams buffer `capacity` events each.
    pub fn with_capacity(capacity: usize) -> Self {
        InProcessBus {
            data: broadcast::channel(capacity).0,
            alarms: broadcast::channel(capacity).0,
            entities: broadcast::channel(capacity).0,
        }
    }

    fn sender(&self, stream: Stream) -> &broadcast::Sender<Arc<Event>> {
        match stream {
            Stream::Data => &self.data,
            Stream::Alarms => &self.alarms,
            Stream::Entities => &self.entities,
        }
    }
}

impl Bus for InProcessBus {
    fn publish(&self, event: Event) {
        let stream = event.stream;
        // No receivers is not an error: nobody is listening right now.
        let _ = self.sender(stream).send(Arc::new(event));
        metrics::counter!("weft_bus_events_total", "stream" => stream.as_str()).increment(1);
    }

    fn subscribe(&self, stream: Stream) -> Subscription {
        Subscription {
            rx: self.sender(stream).subscribe(),
        }
    }

    fn has_subscribers(&self, stream: Stream) -> bool {
        self.sender(stream).receiver_count() > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(n: i64) -> Event {
        let unit = DataUnit {
            data_id: n.to_string(),
            reported_at: n,
            received_at: n,
            channel: "c".into(),
            device: Default::default(),
            measures: Default::default(),
        };
        Event {
            stream: Stream::Data,
            payload: Payload::Data(Arc::new(unit)),
            json: Bytes::new(),
        }
    }

    #[tokio::test]
    async fn subscribers_receive_events_published_after_subscribing() {
        let bus = InProcessBus::default();
        bus.publish(event(0));
        let mut sub = bus.subscribe(Stream::Data);
        let other = bus.subscribe(Stream::Alarms);
        bus.publish(event(1));
        let got = sub.recv().await.unwrap();
        assert!(matches!(&got.payload, Payload::Data(u) if u.data_id == "1"));
        assert_eq!(other.backlog(), 0);
    }

    /// A slow subscriber lags instead of blocking the publisher or growing
    /// memory: the publisher never waits, the subscriber learns how much it missed.
    #[tokio::test]
    async fn a_slow_subscriber_lags_without_blocking_the_publisher() {
        let bus = InProcessBus::with_capacity(4);
        let mut sub = bus.subscribe(Stream::Data);
        for n in 0..10 {
            bus.publish(event(n));
        }
        assert_eq!(sub.recv().await.unwrap_err(), RecvError::Lagged(6));
        assert!(matches!(&sub.recv().await.unwrap().payload, Payload::Data(u) if u.data_id == "6"));
    }
}
