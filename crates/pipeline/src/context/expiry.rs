//! Transient entities (Orion's `dateExpires`): the sweep that deletes
//! expired entities for good.
//!
//! An entity whose `dateExpires` has passed is already gone for readers
//! and writers ([`StoredEntity::is_live`]); the sweep only reclaims its
//! memory and its stored row, every [`SWEEP_INTERVAL`], so an expired
//! entity also stays gone across a restart. As in Orion (where a MongoDB
//! TTL index deletes the document), expiry is not a client's delete: it
//! announces no change and triggers no `entityDelete` notification.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{Context, Key, StoredEntity, Wanted};

/// How often expired entities are deleted. Orion's TTL monitor wakes up
/// every 60 s; a scan of the entities in memory is cheap enough to run
/// far more often, so storage is reclaimed within seconds.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(5);

/// One expired entity found by a scan: where it is, and which incarnation
/// (`created`), so a new entity created in its place is left alone.
struct Expired {
    tenant: String,
    key: Key,
    created: u64,
}

/// How long after it expired an entity is dropped from a node's memory by
/// [`Context::forget_expired`]: long after the node that sweeps (the
/// expiry lease's) deleted its stored row.
pub const FORGET_AFTER: Duration = Duration::from_secs(60);

impl Context {
    /// On a node of a cluster, every half [`FORGET_AFTER`] until
    /// `shutdown`: [`Context::forget_expired`].
    pub async fn forget_expired_loop(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(FORGET_AFTER / 2) => {}
                _ = shutdown.cancelled() => return,
            }
            let n = self.forget_expired(weft_model::now_ms());
            if n > 0 {
                tracing::debug!(forgotten = n, "dropped long-expired entities from memory");
            }
        }
    }

    /// Drops from memory, not from the store, the entities expired more
    /// than [`FORGET_AFTER`] before `now`; returns how many. Only one node
    /// of a cluster sweeps expired entities, and expiry announces no
    /// change, so the other nodes' copies would otherwise stay in memory
    /// for good (gone for readers, but held). The sweeping node deleted
    /// their rows long before.
    pub fn forget_expired(&self, now: i64) -> usize {
        let before = now.saturating_sub(i64::try_from(FORGET_AFTER.as_millis()).unwrap_or(0));
        let found = self.find_expired(before);
        if found.is_empty() {
            return 0;
        }
        let mut tenants = self.tenants.write();
        let found = self.find_expired_in(&tenants, before);
        self.remove_expired(&mut tenants, found, before).len()
    }

    /// Deletes expired entities every [`SWEEP_INTERVAL`] until `shutdown`.
    pub async fn expiry_loop(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(SWEEP_INTERVAL) => {}
                _ = shutdown.cancelled() => return,
            }
            match self.sweep_expired(weft_model::now_ms()).await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(deleted = n, "deleted expired entities"),
                Err(e) => {
                    tracing::warn!(error = %e, "deleting expired entities failed; retrying later")
                }
            }
        }
    }

    /// Deletes, from memory and from the store, every entity expired at
    /// `now`; returns how many. Holds off [`Context::create`] meanwhile, so
    /// an entity created where an expired one lay is never deleted.
    pub async fn sweep_expired(&self, now: i64) -> Result<usize, weft_store::StoreError> {
        if self.find_expired(now).is_empty() {
            return Ok(0);
        }
        let _sweep = self.sweeping.write().await;
        let removed: Vec<(String, StoredEntity)> = {
            let mut tenants = self.tenants.write();
            let found = self.find_expired_in(&tenants, now);
            self.remove_expired(&mut tenants, found, now)
        };
        for (tenant, e) in &removed {
            self.store
                .delete_entity(
                    tenant,
                    &e.service_path,
                    &e.entity.id,
                    &e.entity.entity_type,
                    None,
                )
                .await?;
        }
        // Device data may have created a new entity at a swept key while
        // its row was being deleted (it does not wait for this lock): store
        // it again, after the delete, so the row matches memory.
        let recreated: Vec<weft_store::EntityRecord> = {
            let tenants = self.tenants.read();
            removed
                .iter()
                .filter_map(|(tenant, e)| {
                    let key = (
                        e.service_path.clone(),
                        e.entity.id.clone(),
                        e.entity.entity_type.clone(),
                    );
                    tenants
                        .get(tenant)
                        .and_then(|t| t.entities.get(&key))
                        .map(|now| super::record(tenant, now))
                })
                .collect()
        };
        for r in recreated {
            self.store.put_entity(r, Default::default(), None).await?;
        }
        if !removed.is_empty() {
            metrics::counter!("weft_ngsi_entities_expired_total").increment(removed.len() as u64);
        }
        Ok(removed.len())
    }

    /// Removes from memory the entities `found` that are still the ones
    /// found and still expired at `now`, after reading any change of them
    /// another node made (it may have renewed one); answers them.
    fn remove_expired(
        &self,
        tenants: &mut std::collections::HashMap<String, super::Tenant>,
        found: Vec<Expired>,
        now: i64,
    ) -> Vec<(String, StoredEntity)> {
        let mut removed = Vec::new();
        for found in found {
            let id = &found.key.1;
            self.take_arrived(
                tenants,
                Wanted::Entity {
                    tenant: &found.tenant,
                    id,
                },
            );
            let Some(t) = tenants.get_mut(&found.tenant) else {
                continue;
            };
            if let Some(e) = t.entities.get(&found.key) {
                if e.created == found.created && !e.is_live(now) {
                    let e = e.clone();
                    t.remove(&found.key);
                    t.dirty.remove(&found.key);
                    removed.push((found.tenant, e));
                }
            }
        }
        removed
    }

    /// The entities expired at `now`, under a read lock.
    fn find_expired(&self, now: i64) -> Vec<Expired> {
        let tenants = self.tenants.read();
        self.find_expired_in(&tenants, now)
    }

    fn find_expired_in(
        &self,
        tenants: &std::collections::HashMap<String, super::Tenant>,
        now: i64,
    ) -> Vec<Expired> {
        tenants
            .iter()
            .flat_map(|(name, t)| {
                t.entities
                    .iter()
                    .filter(|(_, e)| !e.is_live(now))
                    .map(|(key, e)| Expired {
                        tenant: name.clone(),
                        key: key.clone(),
                        created: e.created,
                    })
            })
            .collect()
    }
}
