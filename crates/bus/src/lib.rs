//! weft's event bus: the seam between the stages that produce events (the
//! pipeline's data units, the rule engine's alarm changes, the context's
//! entity changes) and the ones that consume them (live fan-out, channel
//! bridges), and the way a node tells the others that a stored definition
//! changed. Every event is published after the change it carries has been
//! committed.
//!
//! - [`Bus`] is the trait; consumers never know which backend runs.
//! - [`in_process`]: the default backend ([`InProcessBus`]), one
//!   `tokio::sync::broadcast` channel per stream, in this process.
//! - [`nats`]: the scale-out backend ([`NatsBus`]): the in-process bus for
//!   this node's own subscribers, plus NATS JetStream subjects that carry
//!   every event and every changed definition to the other nodes.
//! - [`wire`]: how events and definition changes look on NATS, and how a
//!   receiving node rebuilds them.
//! - [`definitions`]: the notices that keep every node's in-memory copies
//!   of stored definitions (device types, rules, keys, …) in step.
//!
//! Delivery is at-most-once and never blocks a publisher: a subscriber that
//! falls more than the stream's capacity behind gets [`RecvError::Lagged`]
//! and decides what to do (the live websocket disconnects it). Durable
//! consumers replay from the store, not from the bus.
#![deny(missing_docs)]

pub mod definitions;
pub mod in_process;
pub mod nats;
pub mod wire;

pub use definitions::{DefinitionChange, DefinitionFollower, DefinitionKind, Reload};
pub use in_process::InProcessBus;
pub use nats::{NatsBus, NatsConfig, NatsError};
pub use wire::RemoteEntityChange;

use std::sync::Arc;
use std::time::Duration;

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

/// The entity changes of one message from another node, in order.
pub type RemoteEntityChanges = Arc<[wire::RemoteEntityChange]>;

/// Why [`Subscription::recv`] returned no event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecvError {
    /// The subscriber fell behind and this many events were skipped.
    Lagged(u64),
    /// The bus was shut down.
    Closed,
}

/// A subscriber's handle on one stream: its events, or, for the entities
/// other nodes changed, what [`Bus::follow_remote_entities`] hands out.
pub struct Subscription<T = Arc<Event>> {
    rx: broadcast::Receiver<T>,
}

impl<T: Clone> Subscription<T> {
    /// A subscription reading from a backend's broadcast channel (public
    /// for a backend outside this crate, a test's among them).
    pub fn new(rx: broadcast::Receiver<T>) -> Subscription<T> {
        Subscription { rx }
    }

    /// The next event. Lagging is reported once, then reception continues
    /// with the oldest event still buffered.
    pub async fn recv(&mut self) -> Result<T, RecvError> {
        self.rx.recv().await.map_err(|e| match e {
            broadcast::error::RecvError::Lagged(n) => RecvError::Lagged(n),
            broadcast::error::RecvError::Closed => RecvError::Closed,
        })
    }

    /// The next event if one is buffered now, without waiting: `Ok(None)`
    /// when none is. Lagging and closing are reported as by
    /// [`Subscription::recv`].
    pub fn try_recv(&mut self) -> Result<Option<T>, RecvError> {
        match self.rx.try_recv() {
            Ok(event) => Ok(Some(event)),
            Err(broadcast::error::TryRecvError::Empty) => Ok(None),
            Err(broadcast::error::TryRecvError::Lagged(n)) => Err(RecvError::Lagged(n)),
            Err(broadcast::error::TryRecvError::Closed) => Err(RecvError::Closed),
        }
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
    /// Tells the other nodes that a stored definition changed, once the
    /// store has committed the change, so they reload it before they use
    /// it again. A backend with no other nodes does nothing.
    fn definition_changed(&self, change: DefinitionChange) {
        let _ = change;
    }
    /// The definitions other nodes changed, for a service that keeps them
    /// in memory. Never this node's own changes: it applied those itself.
    /// A backend with no other nodes hands out a follower that ends at once.
    fn follow_definitions(&self) -> DefinitionFollower {
        DefinitionFollower::none()
    }
    /// Only the events other nodes published on `stream`, for a service
    /// that keeps in memory what they change (active alarms). `None` when
    /// there are no other nodes.
    fn subscribe_remote(&self, stream: Stream) -> Option<Subscription> {
        let _ = stream;
        None
    }
    /// The entity changes other nodes published, a message's worth at a
    /// time, each read only as far as which entity it changes: for the
    /// service that keeps every entity in memory and reads a change whole
    /// only when it needs that entity. `None` when there are no other
    /// nodes.
    fn follow_remote_entities(&self) -> Option<Subscription<RemoteEntityChanges>> {
        None
    }
    /// This node's id among the others, when there are others.
    fn node(&self) -> Option<&str> {
        None
    }
    /// How far behind other nodes' entity changes this node reads: how
    /// long ago the one it handled last was published, while more wait;
    /// zero once none waits (and with no other nodes).
    fn remote_entities_behind(&self) -> Duration {
        Duration::ZERO
    }
}
