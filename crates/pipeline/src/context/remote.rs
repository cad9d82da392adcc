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

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use weft_bus::{Bus, Payload, RecvError, Stream};
use weft_model::ngsi::{Alteration, Entity, EntityChange};

use super::{Context, StoredEntity};

impl Context {
    /// Applies another node's committed change to this node's copy.
    pub fn apply_remote(&self, change: &EntityChange) {
        let key = (
            change.service_path.clone(),
            change.entity.id.clone(),
            change.entity.entity_type.clone(),
        );
        let mut tenants = self.tenants.write();
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
        Ok(taken)
    }

    /// Applies other nodes' entity changes until `shutdown`; after
    /// missing some (falling behind, or the bus reconnecting) merges the
    /// stored entities. Ends at once with no other nodes.
    pub async fn follow_remote(self: Arc<Self>, bus: Arc<dyn Bus>, shutdown: CancellationToken) {
        let Some(mut remote) = bus.subscribe_remote(Stream::Entities) else {
            return;
        };
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
                        if let Payload::Entity(change) = &event.payload {
                            self.apply_remote(change);
                            metrics::counter!("weft_context_remote_changes_total").increment(1);
                        }
                        false
                    }
                    Err(RecvError::Lagged(n)) => {
                        tracing::warn!(missed = n, "fell behind other nodes' entity changes; merging the stored entities");
                        true
                    }
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
