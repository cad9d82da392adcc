//! The one path by which entity changes reach their consumers: committed
//! first, announced second, in the order they were made.
//!
//! A writer of the context takes a [`Ticket`] under the context's lock, at
//! the moment it changes the entity, so tickets are ordered as the changes
//! are. It announces the change through the ticket only once the store has
//! committed it ([`Ticket::announce`]); a ticket dropped unannounced (the
//! write failed, the batch was never committed) is skipped. [`Changes`]
//! delivers announced changes strictly in ticket order: a change waits for
//! every earlier ticket to be announced or dropped. So a change nobody
//! committed is never seen, and two changes to one entity are never seen
//! the wrong way round, even when their commits finish out of order.
//!
//! Consumers: every [`ChangeListener`] (NGSI subscriptions) sees each
//! change synchronously and may ask its writer to slow down; the bus's
//! `entities` stream (the live socket, later other nodes) gets each change
//! with its JSON, built only while someone subscribes.
//!
//! A ticket's number is the change's place in this node's change log
//! ([`weft_store::OutboxStore`]): when a listener must be able to come
//! back to a change later ([`ChangeListener::durable`], subscriptions),
//! the writer logs it ([`Ticket::log`]) in the transaction that commits
//! it. Numbers go on from the log's head after a restart
//! ([`Changes::resume_after`]), so they never repeat on one node.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::{Mutex, RwLock};
use weft_bus::{Bus, Event, Payload, Stream};
use weft_model::ngsi::EntityChange;
use weft_store::LoggedChange;

/// A wait a [`ChangeListener`] asks of the writer of a change it could
/// not take in at once (its queues are full), so writers slow down to
/// what the listener can carry instead of it dropping work.
pub type Backpressure = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Something that wants to see every committed entity change (NGSI
/// subscriptions). Called in change order, never under the context's
/// lock; must not block.
pub trait ChangeListener: Send + Sync {
    /// Whether `tenant` has anyone listening, so changes nobody watches
    /// cost nothing.
    fn interested(&self, tenant: &str) -> bool;
    /// Whether changes in `tenant` must be logged for this listener, so
    /// it can come back to them after a restart or an outage (the log is
    /// read by the listener itself).
    fn durable(&self, _tenant: &str) -> bool {
        false
    }
    /// Sees change number `seq` (its ticket); may ask the writer to wait
    /// before going on.
    fn on_change(&self, seq: u64, change: &EntityChange) -> Option<Backpressure>;
}

/// Orders committed entity changes and hands them to their consumers.
pub struct Changes {
    bus: Arc<dyn Bus>,
    /// The node whose change log the tickets number (empty alone).
    node: String,
    listeners: RwLock<Vec<Arc<dyn ChangeListener>>>,
    order: Mutex<Order>,
}

/// Tickets handed out and changes waiting for an earlier ticket.
#[derive(Default)]
struct Order {
    /// The next ticket to hand out.
    next_ticket: u64,
    /// The next ticket to deliver.
    next_delivery: u64,
    /// Tickets announced (`Some`) or dropped (`None`) out of order.
    settled: BTreeMap<u64, Option<Announced>>,
    /// Whether a writer is delivering right now; the others leave their
    /// change to it, so delivery stays in order without holding the lock.
    delivering: bool,
}

/// A change with its bus JSON, built before delivery (outside any lock).
struct Announced {
    seq: u64,
    change: Arc<EntityChange>,
    json: Option<Bytes>,
}

impl Changes {
    /// Announces on `bus`; listeners are added with [`Changes::add_listener`].
    /// Tickets number `node`'s change log (empty alone), from 1 until
    /// [`Changes::resume_after`].
    pub fn new(bus: Arc<dyn Bus>, node: impl Into<String>) -> Arc<Changes> {
        Arc::new(Changes {
            bus,
            node: node.into(),
            listeners: RwLock::new(Vec::new()),
            order: Mutex::new(Order {
                next_ticket: 1,
                next_delivery: 1,
                ..Order::default()
            }),
        })
    }

    /// Numbers the next tickets after `head`, the last change of this
    /// node's log, before any ticket is taken.
    pub fn resume_after(&self, head: u64) {
        let mut order = self.order.lock();
        if order.next_ticket <= head {
            order.next_ticket = head + 1;
            order.next_delivery = head + 1;
        }
    }

    /// The node whose change log the tickets number.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Whether a change in `tenant` must be logged: a listener may come
    /// back to it.
    pub fn logged(&self, tenant: &str) -> bool {
        self.listeners.read().iter().any(|l| l.durable(tenant))
    }

    /// Adds a listener that sees every change delivered from now on.
    pub fn add_listener(&self, listener: Arc<dyn ChangeListener>) {
        self.listeners.write().push(listener);
    }

    /// Whether a change in `tenant` would reach anyone: a listener
    /// interested in the tenant, or a subscriber of the `entities` stream.
    /// A writer takes no ticket for a change nobody wants.
    pub fn wanted(&self, tenant: &str) -> bool {
        self.bus.has_subscribers(Stream::Entities)
            || self.listeners.read().iter().any(|l| l.interested(tenant))
    }

    /// A place in the order of changes. Take it under the lock that makes
    /// the change, so tickets follow the order of changes to each entity.
    pub fn ticket(self: &Arc<Self>) -> Ticket {
        let mut order = self.order.lock();
        let seq = order.next_ticket;
        order.next_ticket += 1;
        Ticket {
            seq,
            changes: Some(self.clone()),
        }
    }

    /// Records the outcome of ticket `seq` and, unless another writer is
    /// already delivering, delivers every change that is next in order.
    fn settle(&self, seq: u64, announced: Option<Announced>) -> Vec<Backpressure> {
        let mut waits = Vec::new();
        let mut order = self.order.lock();
        order.settled.insert(seq, announced);
        if order.delivering {
            return waits;
        }
        order.delivering = true;
        loop {
            let mut ready = Vec::new();
            let order_now = &mut *order;
            while let Some(entry) = order_now.settled.first_entry() {
                if *entry.key() != order_now.next_delivery {
                    break;
                }
                order_now.next_delivery += 1;
                if let Some(announced) = entry.remove() {
                    ready.push(announced);
                }
            }
            if ready.is_empty() {
                order.delivering = false;
                return waits;
            }
            drop(order);
            self.deliver(ready, &mut waits);
            order = self.order.lock();
        }
    }

    /// Hands changes, in order, to the listeners and the bus.
    fn deliver(&self, ready: Vec<Announced>, waits: &mut Vec<Backpressure>) {
        let listeners = self.listeners.read().clone();
        for Announced { seq, change, json } in ready {
            for listener in &listeners {
                if listener.interested(&change.tenant) {
                    waits.extend(listener.on_change(seq, &change));
                }
            }
            if let Some(json) = json {
                self.bus.publish(Event {
                    stream: Stream::Entities,
                    payload: Payload::Entity(change),
                    json,
                });
            }
        }
    }
}

/// A change's place in the order of changes, held from the moment the
/// change is made in memory until it is committed (then announced) or
/// abandoned (dropped).
pub struct Ticket {
    seq: u64,
    /// `None` once announced.
    changes: Option<Arc<Changes>>,
}

impl Ticket {
    /// The change's place in the order of changes (and in the log).
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The log entry of `change` (to commit with it) if a listener may
    /// come back to it, stamped with the time now.
    pub fn log(&self, change: &EntityChange) -> Option<LoggedChange> {
        let changes = self.changes.as_ref()?;
        changes.logged(&change.tenant).then(|| LoggedChange {
            node: changes.node.clone(),
            seq: self.seq,
            tenant: change.tenant.clone(),
            at: weft_model::now_ms(),
            body: change.to_log(),
        })
    }

    /// Announces `change`, which the store has committed. It reaches the
    /// consumers once every earlier ticket is settled; the returned waits
    /// are what listeners ask of this writer (await them).
    pub fn announce(mut self, change: EntityChange) -> Vec<Backpressure> {
        let changes = self.changes.take().expect("a ticket announces once");
        let json = changes
            .bus
            .has_subscribers(Stream::Entities)
            .then(|| Bytes::from(change.to_json_bytes()));
        changes.settle(
            self.seq,
            Some(Announced {
                seq: self.seq,
                change: Arc::new(change),
                json,
            }),
        )
    }
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket").field("seq", &self.seq).finish()
    }
}

impl Drop for Ticket {
    /// An unannounced ticket is skipped, so later changes are not held
    /// back by a write that never committed.
    fn drop(&mut self) {
        if let Some(changes) = self.changes.take() {
            // Nobody can wait here; the next writer feels the backpressure.
            drop(changes.settle(self.seq, None));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_bus::InProcessBus;
    use weft_model::ngsi::{Alteration, Entity};

    fn change(id: &str) -> EntityChange {
        EntityChange {
            tenant: String::new(),
            service_path: "/".into(),
            entity: Entity::new(id, "T").into(),
            alteration: Alteration::Created,
            attrs: Vec::new(),
            origin: None,
        }
    }

    /// Records the ids it sees.
    #[derive(Default)]
    struct Seen(Mutex<Vec<String>>);

    impl ChangeListener for Seen {
        fn interested(&self, tenant: &str) -> bool {
            tenant.is_empty()
        }
        fn on_change(&self, _seq: u64, change: &EntityChange) -> Option<Backpressure> {
            self.0.lock().push(change.entity.id.clone());
            None
        }
    }

    fn setup() -> (Arc<Changes>, Arc<Seen>, weft_bus::Subscription) {
        let bus = Arc::new(InProcessBus::default());
        let sub = bus.subscribe(Stream::Entities);
        let changes = Changes::new(bus, "");
        let seen = Arc::new(Seen::default());
        changes.add_listener(seen.clone());
        (changes, seen, sub)
    }

    #[tokio::test]
    async fn a_change_waits_for_every_earlier_ticket() {
        let (changes, seen, mut sub) = setup();
        let first = changes.ticket();
        let second = changes.ticket();
        let third = changes.ticket();
        second.announce(change("b"));
        assert!(seen.0.lock().is_empty(), "b must wait for a");
        drop(third);
        first.announce(change("a"));
        assert_eq!(*seen.0.lock(), ["a", "b"]);
        for id in ["a", "b"] {
            let event = sub.recv().await.unwrap();
            assert!(matches!(&event.payload, Payload::Entity(c) if c.entity.id == id));
            let json: serde_json::Value = serde_json::from_slice(&event.json).unwrap();
            assert_eq!(json["id"], id);
        }
        assert_eq!(sub.backlog(), 0, "the dropped ticket announces nothing");
    }

    #[tokio::test]
    async fn a_dropped_ticket_releases_the_changes_behind_it() {
        let (changes, seen, _sub) = setup();
        let abandoned = changes.ticket();
        changes.ticket().announce(change("x"));
        assert!(seen.0.lock().is_empty());
        drop(abandoned);
        assert_eq!(*seen.0.lock(), ["x"]);
    }

    #[test]
    fn nobody_listening_means_no_change_is_wanted() {
        let bus = Arc::new(InProcessBus::default());
        let changes = Changes::new(bus.clone(), "");
        assert!(!changes.wanted(""));
        let _sub = bus.subscribe(Stream::Entities);
        assert!(changes.wanted(""));
        drop(_sub);
        changes.add_listener(Arc::new(Seen::default()));
        assert!(changes.wanted(""));
        assert!(!changes.wanted("other"));
    }

    /// Writers on many threads announcing out of order: every change is
    /// delivered exactly once and in ticket order.
    #[test]
    fn concurrent_announcements_arrive_once_in_ticket_order() {
        let (changes, seen, _sub) = setup();
        let tickets: Vec<Ticket> = (0..400).map(|_| changes.ticket()).collect();
        let mut lanes: Vec<Vec<(usize, Ticket)>> = (0..4).map(|_| Vec::new()).collect();
        for (i, t) in tickets.into_iter().enumerate() {
            lanes[(i * 7) % 4].push((i, t));
        }
        std::thread::scope(|s| {
            for lane in lanes {
                s.spawn(move || {
                    for (i, t) in lane.into_iter().rev() {
                        t.announce(change(&format!("{i:04}")));
                    }
                });
            }
        });
        let seen = seen.0.lock();
        let expected: Vec<String> = (0..400).map(|i| format!("{i:04}")).collect();
        assert_eq!(*seen, expected);
    }
}
