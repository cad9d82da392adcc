//! Other nodes' entity changes, applied to this node's entities.
//!
//! Each node keeps every entity in memory and serves NGSI reads from it.
//! A change committed on another node reaches this one on the bus (the
//! whole entity after the change) and replaces this node's copy, so a read
//! on any node shows what any node wrote. Only memory changes here: the
//! node that made the change stored it, notified its subscriptions and
//! recorded its history.
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

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use weft_bus::{Bus, Payload, RecvError, Stream};
use weft_model::ngsi::{Alteration, Entity, EntityChange};

use super::{Context, StoredEntity, Tenant};

/// How far behind other nodes' changes a node may fall before its own
/// entity writes wait for it to catch up.
const MAX_BEHIND: Duration = Duration::from_secs(1);

/// How far behind a waiting write lets the node be when it goes on.
const CAUGHT_UP: Duration = Duration::from_millis(250);

/// Longest a write waits for the node to catch up (then it goes on).
const MAX_PACE_WAIT: Duration = Duration::from_secs(5);

/// Most of other nodes' changes applied together, under one lock.
const REMOTE_BATCH: usize = 1024;

/// An entity as changes name it: tenant, service path, id, type.
type ChangeKey<'a> = (&'a str, &'a str, &'a str, &'a str);

fn change_key(change: &EntityChange) -> ChangeKey<'_> {
    (
        &change.tenant,
        &change.service_path,
        &change.entity.id,
        &change.entity.entity_type,
    )
}

impl Context {
    /// Applies another node's committed change to this node's copy.
    pub fn apply_remote(&self, change: &EntityChange) {
        self.apply_remote_changes(&[change]);
    }

    /// Applies other nodes' committed changes, in order, under one write
    /// lock, with the same outcome as applying them one by one. Where an
    /// entity's changes in `changes` are all creations and updates, each
    /// as new as the one before, only the last can stick: it alone is
    /// applied, at the place of the entity's first change (so entities
    /// created here keep their order). A node that fell behind catches up
    /// by the entity, not by the change.
    pub fn apply_remote_changes(&self, changes: &[&EntityChange]) {
        // Per entity: its last change, and whether that one alone does.
        let mut plan: HashMap<ChangeKey<'_>, (usize, bool)> = HashMap::with_capacity(changes.len());
        for (i, c) in changes.iter().enumerate() {
            let lasting = c.alteration != Alteration::Deleted;
            plan.entry(change_key(c))
                .and_modify(|(last, alone)| {
                    let newer = c.entity.date_modified >= changes[*last].entity.date_modified;
                    *alone = *alone && lasting && newer;
                    *last = i;
                })
                .or_insert((i, lasting));
        }
        let mut tenants = self.tenants.write();
        let mut applied: HashSet<ChangeKey<'_>> = HashSet::new();
        for c in changes {
            let key = change_key(c);
            let (last, alone) = plan[&key];
            if !alone {
                self.apply_one(&mut tenants, c);
            } else if applied.insert(key) {
                self.apply_one(&mut tenants, changes[last]);
            }
        }
    }

    /// Applies one change to this node's copy (the later modification
    /// date wins, see the module's doc).
    fn apply_one(&self, tenants: &mut HashMap<String, Tenant>, change: &EntityChange) {
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
                    let created = self.next_created.fetch_add(1, Ordering::Relaxed);
                    t.insert(
                        key,
                        StoredEntity {
                            service_path: change.service_path.clone(),
                            entity: change.entity.clone(),
                            created,
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
                    held.entity = entity;
                    taken += 1;
                }
                None => {
                    t.insert(
                        key,
                        StoredEntity {
                            service_path: r.service_path,
                            entity,
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
        let Some(mut remote) = bus.subscribe_remote(Stream::Entities) else {
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
                event = remote.recv() => match event {
                    Ok(event) => {
                        // What else is buffered goes with it.
                        let mut batch = vec![event];
                        let mut ended = Ok(());
                        while batch.len() < REMOTE_BATCH {
                            match remote.try_recv() {
                                Ok(Some(event)) => batch.push(event),
                                Ok(None) => break,
                                Err(e) => {
                                    ended = Err(e);
                                    break;
                                }
                            }
                        }
                        let changes: Vec<&EntityChange> = batch
                            .iter()
                            .filter_map(|e| match &e.payload {
                                Payload::Entity(change) => Some(&**change),
                                _ => None,
                            })
                            .collect();
                        self.apply_remote_changes(&changes);
                        metrics::counter!("weft_context_remote_changes_total")
                            .increment(changes.len() as u64);
                        match ended {
                            Ok(()) => false,
                            Err(RecvError::Lagged(n)) => lagged(n),
                            Err(RecvError::Closed) => return,
                        }
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
    use serde_json::json;
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
                (e.entity.id, e.entity.date_modified, n.unwrap_or_default())
            })
            .collect()
    }

    /// A bus of other nodes that says this node is as far behind them as
    /// a test sets.
    #[derive(Default)]
    struct Behind {
        events: weft_bus::InProcessBus,
        ms: std::sync::atomic::AtomicU64,
    }

    impl weft_bus::Bus for Behind {
        fn publish(&self, event: weft_bus::Event) {
            self.events.publish(event)
        }
        fn subscribe(&self, stream: weft_bus::Stream) -> weft_bus::Subscription {
            self.events.subscribe(stream)
        }
        fn subscribe_remote(&self, stream: weft_bus::Stream) -> Option<weft_bus::Subscription> {
            Some(self.events.subscribe(stream))
        }
        fn remote_entities_behind(&self) -> std::time::Duration {
            std::time::Duration::from_millis(self.ms.load(std::sync::atomic::Ordering::Relaxed))
        }
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

    /// Changes applied together end as they do applied one by one,
    /// whatever their mix: updates in and out of date order (clocks of
    /// two nodes apart), deletions, re-creations after a deletion (which
    /// go to the end of the creation order).
    #[tokio::test]
    async fn changes_applied_together_end_as_one_by_one() {
        let one_by_one = Node::start(config()).await;
        let together = Node::start(config()).await;
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
                    let id = format!("E{}", next(3));
                    let mut entity =
                        parse_entity(&json!({"id": id, "type": "T", "n": {"value": i}}), false)
                            .unwrap();
                    entity.date_modified = (round * 100 + next(20)) as i64;
                    let alteration = match next(5) {
                        0 => Alteration::Deleted,
                        1 => Alteration::Created,
                        _ => Alteration::Updated,
                    };
                    EntityChange {
                        tenant: String::new(),
                        service_path: "/".into(),
                        entity,
                        alteration,
                        attrs: Vec::new(),
                        origin: None,
                    }
                })
                .collect();
            for c in &changes {
                one_by_one.services.context.apply_remote(c);
            }
            let refs: Vec<&EntityChange> = changes.iter().collect();
            together.services.context.apply_remote_changes(&refs);
            assert_eq!(
                held(&together),
                held(&one_by_one),
                "round {round}: {changes:?}"
            );
        }
        one_by_one.stop().await;
        together.stop().await;
    }
}
