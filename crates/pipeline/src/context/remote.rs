//! Other nodes' entity changes, taken into this node's entities.
//!
//! Each node keeps every entity in memory and serves NGSI reads from it.
//! A change committed on another node reaches this one on the bus (the
//! whole entity after the change) and replaces this node's copy, so a read
//! on any node shows what any node wrote. Only memory changes here: the
//! node that made the change stored it, notified its subscriptions and
//! recorded its history.
//!
//! A change is read whole only when this node needs its entity. On
//! arrival only which entity it changes, how and when is read
//! ([`RemoteEntityChange`]), and it waits, unread, beside this node's
//! copy ([`Arrivals`]); a later change of the same entity replaces it
//! there. Whatever asks for the entity (a read, a write, a query over its
//! tenant, the expiry sweep) first reads and applies what waits for it
//! ([`Context::take_arrived`]), in the order it came. A node of a cluster
//! thus reads, of the changes other nodes make, those of the entities
//! its own clients use, once per use, not every change of every entity.
//!
//! Two nodes changing one entity at the same moment: the copy with the
//! later modification date wins in memory, as the later commit does in
//! the store (see docs/scale-out.md).
//!
//! A change may still be on its way when a client turns to this node: one
//! that holds no entity of an id reads the store before it answers 404 or
//! creates one ([`Context::catch_up`]), and one that has fallen behind the
//! others holds its own writes until it catches up
//! ([`Context::keep_pace`]).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use weft_bus::{Bus, RecvError, RemoteEntityChange};
use weft_model::ngsi::{Alteration, Entity, EntityChange};

use super::{Context, StoredEntity, Tenant};

/// How far behind other nodes' changes a node may fall before its own
/// entity writes wait for it to catch up.
const MAX_BEHIND: Duration = Duration::from_secs(1);

/// How far behind a waiting write lets the node be when it goes on.
const CAUGHT_UP: Duration = Duration::from_millis(250);

/// Longest a write waits for the node to catch up (then it goes on).
const MAX_PACE_WAIT: Duration = Duration::from_secs(5);

/// Other nodes' changes that arrived and are not read yet: by tenant, then
/// entity id, each entity's in the order they came.
#[derive(Default)]
pub(super) struct Arrivals {
    by_tenant: HashMap<String, HashMap<String, Vec<Arrived>>>,
}

/// One change waiting in [`Arrivals`].
struct Arrived {
    change: RemoteEntityChange,
    /// Its place among every change this node takes in: an entity it
    /// creates here goes there in the creation order.
    order: u64,
}

/// Which waiting changes [`Context::take_arrived`] reads.
#[derive(Clone, Copy)]
pub(super) enum Wanted<'a> {
    /// Those of one tenant's entities with one id.
    Entity { tenant: &'a str, id: &'a str },
    /// Those of one tenant.
    Tenant(&'a str),
}

impl Arrivals {
    /// Keeps `change` (whose place is `order`) until its entity is wanted.
    /// Of two creations or updates of one entity only the later can stick
    /// (the one with the later modification date; of equal dates, the one
    /// that came last), so it alone is kept, in the place of the first;
    /// a deletion, and what follows it, are kept in turn.
    fn keep(&mut self, change: &RemoteEntityChange, order: u64) {
        let ids = match self.by_tenant.get_mut(&change.tenant) {
            Some(ids) => ids,
            None => self.by_tenant.entry(change.tenant.clone()).or_default(),
        };
        let waiting = match ids.get_mut(&change.id) {
            Some(waiting) => waiting,
            None => ids.entry(change.id.clone()).or_default(),
        };
        let lasting = |c: &RemoteEntityChange| c.alteration != Alteration::Deleted;
        let same = waiting.iter_mut().rev().find(|a| {
            a.change.service_path == change.service_path
                && a.change.entity_type == change.entity_type
        });
        match same {
            Some(earlier) if lasting(&earlier.change) && lasting(change) => {
                if change.date_modified >= earlier.change.date_modified {
                    earlier.change = change.clone();
                }
            }
            _ => waiting.push(Arrived {
                change: change.clone(),
                order,
            }),
        }
    }

    /// Takes the changes `wanted` names out, each entity's in the order
    /// they came (the order among entities does not matter: each change
    /// carries its place in the creation order).
    fn take(&mut self, wanted: Wanted<'_>) -> Vec<Arrived> {
        match wanted {
            Wanted::Entity { tenant, id } => {
                let Some(ids) = self.by_tenant.get_mut(tenant) else {
                    return Vec::new();
                };
                let taken = ids.remove(id).unwrap_or_default();
                if ids.is_empty() {
                    self.by_tenant.remove(tenant);
                }
                taken
            }
            Wanted::Tenant(tenant) => self
                .by_tenant
                .remove(tenant)
                .into_iter()
                .flat_map(HashMap::into_values)
                .flatten()
                .collect(),
        }
    }

    /// Whether any change waits for what `wanted` names.
    fn any(&self, wanted: Wanted<'_>) -> bool {
        match wanted {
            Wanted::Entity { tenant, id } => self
                .by_tenant
                .get(tenant)
                .is_some_and(|ids| ids.contains_key(id)),
            Wanted::Tenant(tenant) => self.by_tenant.contains_key(tenant),
        }
    }

    /// How many changes wait.
    fn len(&self) -> usize {
        self.by_tenant
            .values()
            .flat_map(HashMap::values)
            .map(Vec::len)
            .sum()
    }
}

impl Context {
    /// Keeps other nodes' `changes` (in the order they came) until their
    /// entities are wanted.
    fn arrive(&self, changes: &[RemoteEntityChange]) {
        let mut arrivals = self.arrivals.lock();
        for change in changes {
            let order = self.next_created.fetch_add(1, Ordering::Relaxed);
            arrivals.keep(change, order);
        }
    }

    /// Reads and applies, under the caller's write lock on the entities,
    /// the changes of other nodes that wait for what `wanted` names. Every
    /// path that reads or writes entities calls this (or
    /// [`Context::take_arrived_now`]) first.
    pub(super) fn take_arrived(&self, tenants: &mut HashMap<String, Tenant>, wanted: Wanted<'_>) {
        let taken = {
            let mut arrivals = self.arrivals.lock();
            if arrivals.by_tenant.is_empty() {
                return;
            }
            arrivals.take(wanted)
        };
        if taken.is_empty() {
            return;
        }
        metrics::counter!("weft_context_remote_changes_read_total").increment(taken.len() as u64);
        for arrived in taken {
            match arrived.change.read() {
                Ok(change) => self.apply_one(tenants, &change, arrived.order),
                Err(e) => {
                    metrics::counter!("weft_bus_unreadable_total", "stream" => "entities")
                        .increment(1);
                    tracing::warn!(id = %arrived.change.id, error = %e, "an entity change from another node could not be read; skipped");
                }
            }
        }
    }

    /// [`Context::take_arrived`] for a caller that holds no lock: takes
    /// the write lock only when something waits for what `wanted` names
    /// (reads of entities nothing waits for share the read lock).
    pub(super) fn take_arrived_now(&self, wanted: Wanted<'_>) {
        if !self.arrivals.lock().any(wanted) {
            return;
        }
        let mut tenants = self.tenants.write();
        self.take_arrived(&mut tenants, wanted);
    }

    /// How many of other nodes' changes wait unread.
    pub fn arrived_unread(&self) -> usize {
        self.arrivals.lock().len()
    }

    /// Applies one change to this node's copy (the later modification
    /// date wins, see the module's doc); an entity it creates here takes
    /// `order` in the creation order.
    fn apply_one(&self, tenants: &mut HashMap<String, Tenant>, change: &EntityChange, order: u64) {
        let key = (
            change.service_path.clone(),
            change.entity.id.clone(),
            change.entity.entity_type.clone(),
        );
        let t = tenants.entry(change.tenant.clone()).or_default();
        match change.alteration {
            Alteration::Deleted => {
                if t.entities
                    .get(&key)
                    .is_some_and(|held| held.entity.date_modified <= change.entity.date_modified)
                {
                    t.remove(&key);
                    t.dirty.remove(&key);
                }
            }
            Alteration::Created | Alteration::Updated => match t.entities.get_mut(&key) {
                Some(held) if held.entity.date_modified > change.entity.date_modified => {}
                Some(held) => held.entity = change.entity.clone(),
                None => {
                    t.insert(
                        key,
                        StoredEntity {
                            service_path: change.service_path.clone(),
                            entity: change.entity.clone(),
                            created: order,
                        },
                    );
                }
            },
        }
    }

    /// Reads every stored entity again and takes those newer than this
    /// node's copies: after this node missed other nodes' changes (it fell
    /// behind, or the bus was away).
    pub async fn merge_stored(&self) -> Result<usize, weft_store::StoreError> {
        let records = self.store.load_entities().await?;
        Ok(self.merge_records(records))
    }

    /// On a node of a cluster that reads other nodes' changes more than
    /// [`MAX_BEHIND`] after they were made, waits (up to
    /// [`MAX_PACE_WAIT`]) until it is within [`CAUGHT_UP`] of them: a node
    /// whose own writes leave it too little time to apply the others'
    /// would otherwise answer from copies further and further behind.
    /// Its writes then go at the pace it can follow the cluster.
    pub async fn keep_pace(&self) {
        let Some(bus) = self.remote.get() else {
            return;
        };
        if bus.remote_entities_behind() <= MAX_BEHIND {
            return;
        }
        metrics::counter!("weft_context_paced_writes_total").increment(1);
        let started = tokio::time::Instant::now();
        while bus.remote_entities_behind() > CAUGHT_UP && started.elapsed() < MAX_PACE_WAIT {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// On a node of a cluster, when it holds no entity `id` matching
    /// (`service_paths`, `entity_type`) — about to answer 404, or to
    /// create one — reads the stored entities with that id and takes those
    /// newer than its copies: another node may have written it a moment
    /// ago, its change still on the way here. Nothing on a node alone, or
    /// when the entity is held.
    pub async fn catch_up(
        &self,
        tenant: &str,
        service_paths: &[String],
        id: &str,
        entity_type: Option<&str>,
    ) {
        if self.remote.get().is_none() {
            return;
        }
        self.take_arrived_now(Wanted::Entity { tenant, id });
        let held = self.tenants.read().get(tenant).is_some_and(|t| {
            t.find(service_paths, id, entity_type, weft_model::now_ms())
                .is_ok()
        });
        if held {
            return;
        }
        match self.store.load_entities_with_id(tenant, id).await {
            Ok(records) => {
                let taken = self.merge_records(records);
                metrics::counter!("weft_context_caught_up_total").increment(taken as u64);
            }
            Err(e) => tracing::warn!(error = %e, "reading a stored entity this node lacks failed"),
        }
    }

    /// Takes the stored `records` newer than this node's copies (or that
    /// it lacks); answers how many it took.
    fn merge_records(&self, records: Vec<weft_store::EntityRecord>) -> usize {
        let mut taken = 0;
        let mut tenants = self.tenants.write();
        for r in records {
            let Ok(entity) = Entity::from_storage(&r.json) else {
                continue;
            };
            let t = tenants.entry(r.tenant).or_default();
            let key = (r.service_path.clone(), r.id, r.entity_type);
            match t.entities.get_mut(&key) {
                Some(held) if held.entity.date_modified >= entity.date_modified => {}
                Some(held) => {
                    held.entity = Arc::new(entity);
                    taken += 1;
                }
                None => {
                    t.insert(
                        key,
                        StoredEntity {
                            service_path: r.service_path,
                            entity: Arc::new(entity),
                            created: r.created,
                        },
                    );
                    taken += 1;
                }
            }
        }
        taken
    }

    /// Applies other nodes' entity changes until `shutdown`; after
    /// missing some (falling behind, or the bus reconnecting) merges the
    /// stored entities. Ends at once with no other nodes.
    pub async fn follow_remote(self: Arc<Self>, bus: Arc<dyn Bus>, shutdown: CancellationToken) {
        let Some(mut remote) = bus.follow_remote_entities() else {
            return;
        };
        let _ = self.remote.set(bus.clone());
        let mut notices = bus.follow_definitions();
        loop {
            let missed = tokio::select! {
                _ = shutdown.cancelled() => return,
                notice = notices.recv() => match notice {
                    // Everything is reloaded after a reconnection: so are
                    // the entities.
                    Some(weft_bus::Reload::All) => true,
                    Some(_) => false,
                    None => return,
                },
                changes = remote.recv() => match changes {
                    Ok(changes) => {
                        self.arrive(&changes);
                        metrics::counter!("weft_context_remote_changes_total")
                            .increment(changes.len() as u64);
                        false
                    }
                    Err(RecvError::Lagged(n)) => lagged(n),
                    Err(RecvError::Closed) => return,
                },
            };
            if missed {
                match self.merge_stored().await {
                    Ok(n) => tracing::info!(entities = n, "took newer stored entities"),
                    Err(e) => tracing::warn!(error = %e, "merging the stored entities failed"),
                }
            }
        }
    }
}

/// Says that this node missed `n` of other nodes' changes (it then merges
/// the stored entities).
fn lagged(n: u64) -> bool {
    tracing::warn!(
        missed = n,
        "fell behind other nodes' entity changes; merging the stored entities"
    );
    true
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;
    use weft_bus::wire::{encode_events, read_entity_changes, Subjects};
    use weft_bus::{Event, Payload, RemoteEntityChange, RemoteEntityChanges, Stream};
    use weft_model::ngsi::{parse_entity, Alteration, EntityChange};

    use crate::context::EntityFilter;
    use crate::testkit::{config, Node};

    /// What a node holds: every entity in creation order, with its
    /// modification date and the number of the change it came from.
    fn held(node: &Node) -> Vec<(String, i64, serde_json::Value)> {
        node.services
            .context
            .query("", &EntityFilter::default())
            .into_iter()
            .map(|e| {
                let n = e.entity.attrs.get("n").map(|a| a.value.clone());
                (
                    e.entity.id.clone(),
                    e.entity.date_modified,
                    n.unwrap_or_default(),
                )
            })
            .collect()
    }

    /// `changes` as another node sends them and this one receives them:
    /// through the wire format, as one message.
    fn arriving(changes: &[EntityChange]) -> Vec<RemoteEntityChange> {
        let events: Vec<Event> = changes
            .iter()
            .map(|c| Event {
                stream: Stream::Entities,
                json: c.to_json_bytes().into(),
                payload: Payload::Entity(Arc::new(c.clone())),
            })
            .collect();
        let sent = encode_events(
            &Subjects::new("t").unwrap(),
            "other",
            Stream::Entities,
            &events,
        );
        read_entity_changes(Some(&sent.headers), &sent.payload).unwrap()
    }

    /// A change of entity `id` (type `T`, service path `/`) whose `n` is
    /// `n`, as of `modified`.
    fn change(id: &str, n: i64, modified: i64, alteration: Alteration) -> EntityChange {
        let mut entity =
            parse_entity(&json!({"id": id, "type": "T", "n": {"value": n}}), false).unwrap();
        entity.date_modified = modified;
        EntityChange {
            tenant: String::new(),
            service_path: "/".into(),
            entity: entity.into(),
            alteration,
            attrs: Vec::new(),
            origin: None,
        }
    }

    /// A bus of other nodes that says this node is as far behind them as
    /// a test sets.
    struct Behind {
        events: weft_bus::InProcessBus,
        remote: tokio::sync::broadcast::Sender<RemoteEntityChanges>,
        ms: std::sync::atomic::AtomicU64,
    }

    impl Default for Behind {
        fn default() -> Self {
            Behind {
                events: weft_bus::InProcessBus::default(),
                remote: tokio::sync::broadcast::channel(16).0,
                ms: std::sync::atomic::AtomicU64::new(0),
            }
        }
    }

    impl weft_bus::Bus for Behind {
        fn publish(&self, event: weft_bus::Event) {
            self.events.publish(event)
        }
        fn subscribe(&self, stream: weft_bus::Stream) -> weft_bus::Subscription {
            self.events.subscribe(stream)
        }
        fn follow_remote_entities(&self) -> Option<weft_bus::Subscription<RemoteEntityChanges>> {
            Some(weft_bus::Subscription::new(self.remote.subscribe()))
        }
        fn remote_entities_behind(&self) -> std::time::Duration {
            std::time::Duration::from_millis(self.ms.load(std::sync::atomic::Ordering::Relaxed))
        }
    }

    /// A node drops from memory the entities expired more than a minute
    /// ago (the node that sweeps deleted their rows), keeps those expired
    /// a moment ago and the live ones, and first reads a waiting change
    /// that renewed one.
    #[tokio::test]
    async fn long_expired_entities_are_forgotten() {
        let node = Node::start(config()).await;
        let context = &node.services.context;
        let now = weft_model::now_ms();
        let expiring = |id: &str, expires: i64| {
            let mut c = change(id, 1, now - 200_000, Alteration::Created);
            Arc::make_mut(&mut c.entity).date_expires = Some(expires);
            c
        };
        context.arrive(&arriving(&[
            expiring("Old", now - 120_000),
            expiring("Recent", now - 10_000),
            change("Live", 1, now, Alteration::Created),
            expiring("Renewed", now - 120_000),
        ]));
        assert_eq!(held(&node).len(), 1, "read, and only Live is live");
        let mut renewal = expiring("Renewed", now + 600_000);
        renewal.alteration = Alteration::Updated;
        Arc::make_mut(&mut renewal.entity).date_modified = now;
        context.arrive(&arriving(&[renewal]));

        assert_eq!(context.forget_expired(now), 1);
        let mut kept: Vec<String> = context.tenants.read()[""]
            .entities
            .keys()
            .map(|k| k.1.clone())
            .collect();
        kept.sort();
        assert_eq!(kept, ["Live", "Recent", "Renewed"]);
        node.stop().await;
    }

    /// A node of a cluster that reads other nodes' changes more than a
    /// second late holds its own entity writes until it is back within a
    /// quarter of a second of them.
    #[tokio::test]
    async fn writes_wait_while_the_node_is_behind_the_others() {
        use std::sync::atomic::Ordering;
        use std::sync::Arc;
        use std::time::Duration;
        let node = Node::start(config()).await;
        let bus = Arc::new(Behind::default());
        let context = node.services.context.clone();
        let stop = tokio_util::sync::CancellationToken::new();
        tokio::spawn(context.clone().follow_remote(bus.clone(), stop.clone()));
        let room = |n: i64| {
            parse_entity(
                &json!({"id": "Room1", "type": "Room", "n": {"value": n}}),
                false,
            )
            .unwrap()
        };
        // Following, on time: writes go at once.
        tokio::time::sleep(Duration::from_millis(50)).await;
        tokio::time::timeout(Duration::from_secs(1), context.create("", "/", room(1)))
            .await
            .expect("a write waited with the node on time")
            .unwrap();

        bus.ms.store(3_000, Ordering::Relaxed);
        let delete = context.delete("", &[], "Room1", None);
        tokio::pin!(delete);
        assert!(
            crate::testkit::still_waiting(&mut delete).await,
            "a write went on with the node 3 s behind"
        );
        bus.ms.store(100, Ordering::Relaxed);
        tokio::time::timeout(Duration::from_secs(1), delete)
            .await
            .expect("the write went on once the node caught up")
            .unwrap();
        stop.cancel();
        node.stop().await;
    }

    /// Changes kept unread as they arrive, some entities' read in
    /// between, end as they do read and applied one by one, whatever their
    /// mix: updates in and out of date order (clocks of two nodes apart),
    /// deletions, re-creations after a deletion (which go to the end of
    /// the creation order).
    #[tokio::test]
    async fn changes_read_when_wanted_end_as_applied_one_by_one() {
        let one_by_one = Node::start(config()).await;
        let kept = Node::start(config()).await;
        let mut seed: u64 = 0x5eed;
        let mut next = |m: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % m
        };
        for round in 0..200 {
            let changes: Vec<EntityChange> = (0..1 + next(12))
                .map(|i| {
                    let alteration = match next(5) {
                        0 => Alteration::Deleted,
                        1 => Alteration::Created,
                        _ => Alteration::Updated,
                    };
                    let modified = (round * 100 + next(20)) as i64;
                    change(&format!("E{}", next(3)), i as i64, modified, alteration)
                })
                .collect();
            let arrived = arriving(&changes);
            {
                let context = &one_by_one.services.context;
                let mut tenants = context.tenants.write();
                for c in &arrived {
                    let order = context.next_created.fetch_add(1, super::Ordering::Relaxed);
                    context.apply_one(&mut tenants, &c.read().unwrap(), order);
                }
            }
            kept.services.context.arrive(&arrived);
            // Now and then one entity is wanted before the rest.
            if next(3) == 0 {
                let id = format!("E{}", next(3));
                let _ = kept.services.context.get("", &[], &id, None);
            }
            if next(2) == 0 {
                assert_eq!(held(&kept), held(&one_by_one), "round {round}: {changes:?}");
            }
        }
        assert_eq!(held(&kept), held(&one_by_one));
        one_by_one.stop().await;
        kept.stop().await;
    }

    /// Another node's changes wait unread, the last of each entity's
    /// alone, until their entity is wanted: a read takes that entity's
    /// and no other's, an update starts from the waiting state, and a
    /// waiting deletion makes the entity gone.
    #[tokio::test]
    async fn a_change_is_read_when_its_entity_is_wanted() {
        let node = Node::start(config()).await;
        let context = &node.services.context;
        context.arrive(&arriving(&[
            change("A", 1, 100, Alteration::Created),
            change("B", 1, 100, Alteration::Created),
            change("A", 2, 200, Alteration::Updated),
            change("C", 1, 100, Alteration::Created),
            change("A", 3, 300, Alteration::Updated),
            change("B", 2, 150, Alteration::Updated),
            change("C", 1, 200, Alteration::Deleted),
        ]));
        // A's three are one; B's two are one; C's creation and deletion two.
        assert_eq!(context.arrived_unread(), 4);

        let a = context.get("", &[], "A", None).unwrap();
        assert_eq!(a.entity.attrs.get("n").unwrap().value, json!(3));
        assert_eq!(context.arrived_unread(), 3, "reading A read only A's");

        let mut before = None;
        context
            .modify("", &[], "B", None, |e| {
                before = Some(e.attrs.get("n").unwrap().value.clone());
                e.attrs.get_mut("n").unwrap().value = json!(20);
                Ok(weft_model::ngsi::UpdateOutcome::default())
            })
            .await
            .unwrap();
        assert_eq!(
            before,
            Some(json!(2)),
            "the update started from B's waiting state"
        );
        assert_eq!(
            context.get("", &[], "C", None).unwrap_err().status,
            404,
            "C's waiting deletion made it gone"
        );
        assert_eq!(context.arrived_unread(), 0);
        assert_eq!(
            held(&node),
            vec![("A".into(), 300, json!(3)), ("B".into(), 150, json!(20))]
        );
        node.stop().await;
    }
}
