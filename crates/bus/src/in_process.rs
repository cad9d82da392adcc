//! The default bus backend: one `tokio::sync::broadcast` channel per
//! stream, in this process. Nothing to install or run; events reach only
//! this process's subscribers, which is all a single node has. The NATS
//! backend ([`crate::nats`]) keeps one of these for its own node's
//! subscribers.

use std::sync::Arc;

use tokio::sync::broadcast;

use crate::{Bus, Event, Stream, Subscription, STREAM_CAPACITY};

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

    /// Hands `event` to this process's subscribers without counting it as
    /// published here: the NATS backend delivers other nodes' events so.
    pub(crate) fn deliver(&self, event: Arc<Event>) {
        // No receivers is not an error: nobody is listening right now.
        let _ = self.sender(event.stream).send(event);
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
        Subscription::new(self.sender(stream).subscribe())
    }

    fn has_subscribers(&self, stream: Stream) -> bool {
        self.sender(stream).receiver_count() > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Payload, RecvError};
    use bytes::Bytes;
    use weft_model::DataUnit;

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
