//! NGSI registrations (`/v2/registrations`): context providers announced
//! to the broker, kept per tenant and persisted through the store.
//!
//! They live in memory per tenant, in creation order (Orion lists them by
//! id, which grows with time), and every create or delete is committed to
//! the store before it is acknowledged. Queries and updates look up the
//! registrations covering an entity ([`Registrations::providers`]) to
//! forward to them (see [`crate::forwarding`]); what each forward did is
//! counted here ([`Registrations::record_forward`]), in memory only: the
//! counters start again at zero after a restart. A registration created
//! or deleted through another node is reloaded from the store as soon as
//! that node announces it ([`Follower`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;
use weft_bus::Bus;
use weft_model::ngsi::registration::{not_found, ForwardingInfo, Registration};
use weft_model::ngsi::NgsiError;
use weft_store::{DocumentKind, NgsiDocument, Store, StoreError};

use crate::context::path_matches;
use crate::definitions::{DefinitionChange, DefinitionKind, Follower, Reload};

/// Registrations by tenant, each list sorted by creation.
type ByTenant = HashMap<String, Vec<StoredRegistration>>;

/// A registration with where it was created and its position in listings.
#[derive(Debug, Clone)]
pub struct StoredRegistration {
    /// Service path of the request that created it (`/` when none).
    pub service_path: String,
    /// The registration.
    pub registration: Registration,
    /// Creation order within the tenant, kept across restarts.
    pub created: u64,
}

/// Every tenant's registrations.
pub struct Registrations {
    store: Arc<dyn Store>,
    /// Where creations and deletions are announced to the other nodes.
    bus: Arc<dyn Bus>,
    /// Tenant → its registrations, sorted by `created`.
    tenants: RwLock<HashMap<String, Vec<StoredRegistration>>>,
    next_created: AtomicU64,
    /// (tenant, registration id) → what forwarding to it did. Kept apart
    /// from the registrations so a forward never takes their write lock.
    forwarding: parking_lot::Mutex<HashMap<(String, String), ForwardingInfo>>,
}

/// Which kind of request is being forwarded: a registration may accept
/// one and not the other (`supportedForwardingMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardKind {
    /// A query (`POST <provider>/op/query`).
    Query,
    /// An update (`POST <provider>/op/update`).
    Update,
}

impl Registrations {
    /// Loads the stored registrations. A stored document that no longer
    /// parses is logged and skipped rather than failing the start.
    pub async fn load(
        store: Arc<dyn Store>,
        bus: Arc<dyn Bus>,
    ) -> Result<Registrations, StoreError> {
        let (tenants, max) = read_stored(&store).await?;
        Ok(Registrations {
            store,
            bus,
            tenants: RwLock::new(tenants),
            next_created: AtomicU64::new(max + 1),
            forwarding: parking_lot::Mutex::new(HashMap::new()),
        })
    }

    /// Stores a new registration of `tenant` made under `service_path`;
    /// it is listed once the store has committed it.
    pub async fn create(
        &self,
        tenant: &str,
        service_path: &str,
        registration: Registration,
    ) -> Result<(), NgsiError> {
        let stored = StoredRegistration {
            service_path: service_path.to_string(),
            registration,
            created: self.next_created.fetch_add(1, Ordering::Relaxed),
        };
        self.store
            .put_document(NgsiDocument {
                kind: DocumentKind::Registration,
                tenant: tenant.to_string(),
                id: stored.registration.id.clone(),
                service_path: stored.service_path.clone(),
                created: stored.created,
                json: stored.registration.to_storage(),
            })
            .await
            .map_err(internal)?;
        let id = stored.registration.id.clone();
        {
            let mut tenants = self.tenants.write();
            let list = tenants.entry(tenant.to_string()).or_default();
            // Concurrent creations may commit out of order; keep the list sorted.
            let at = list.partition_point(|r| r.created < stored.created);
            list.insert(at, stored);
        }
        self.announce(tenant, &id);
        Ok(())
    }

    /// The registrations of `tenant` made under the service paths
    /// (`/a`, or `/a/#` for the subtree; empty means every path), in
    /// creation order.
    pub fn list(&self, tenant: &str, service_paths: &[String]) -> Vec<StoredRegistration> {
        self.tenants
            .read()
            .get(tenant)
            .map(|list| {
                list.iter()
                    .filter(|r| path_matches(service_paths, &r.service_path))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The registration of `tenant` with `id`, whatever its service path
    /// (Orion looks registrations up by id alone); 404 if none.
    pub fn get(&self, tenant: &str, id: &str) -> Result<StoredRegistration, NgsiError> {
        self.tenants
            .read()
            .get(tenant)
            .and_then(|list| list.iter().find(|r| r.registration.id == id))
            .cloned()
            .ok_or_else(not_found)
    }

    /// The registrations of `tenant` reached by a request under
    /// `service_paths` (as [`Registrations::list`] reads them) about the
    /// entity `id` (of `entity_type`, when known) that accept `kind`, in
    /// creation order. Expired registrations are left out; inactive ones
    /// are not, as in Orion.
    pub fn providers(
        &self,
        tenant: &str,
        service_paths: &[String],
        id: &str,
        entity_type: Option<&str>,
        kind: ForwardKind,
        now: i64,
    ) -> Vec<Registration> {
        let tenants = self.tenants.read();
        let Some(list) = tenants.get(tenant) else {
            return Vec::new();
        };
        list.iter()
            .filter(|r| path_matches(service_paths, &r.service_path))
            .map(|r| &r.registration)
            .filter(|r| r.expires.is_none_or(|e| e > now))
            .filter(|r| match kind {
                ForwardKind::Query => r.forwards_queries(),
                ForwardKind::Update => r.forwards_updates(),
            })
            .filter(|r| r.covers(id, entity_type))
            .cloned()
            .collect()
    }

    /// The registrations of `tenant` under `service_paths` that accept
    /// queries and have not expired, whatever entities they cover: what a
    /// listing may forward to. Only those are cloned.
    pub fn query_providers(
        &self,
        tenant: &str,
        service_paths: &[String],
        now: i64,
    ) -> Vec<Registration> {
        let tenants = self.tenants.read();
        let Some(list) = tenants.get(tenant) else {
            return Vec::new();
        };
        list.iter()
            .filter(|r| path_matches(service_paths, &r.service_path))
            .map(|r| &r.registration)
            .filter(|r| r.forwards_queries() && r.expires.is_none_or(|e| e > now))
            .cloned()
            .collect()
    }

    /// Counts one request forwarded to the provider of registration `id`.
    pub fn record_forward(&self, tenant: &str, id: &str, ok: bool, now: i64) {
        self.forwarding
            .lock()
            .entry((tenant.to_string(), id.to_string()))
            .or_default()
            .record(ok, now);
    }

    /// What forwarding to registration `id` of `tenant` did so far.
    pub fn forwarding_info(&self, tenant: &str, id: &str) -> Option<ForwardingInfo> {
        self.forwarding
            .lock()
            .get(&(tenant.to_string(), id.to_string()))
            .cloned()
    }

    /// Deletes the registration of `tenant` with `id`, whatever its
    /// service path; 404 if none. Answered once the store has committed.
    pub async fn delete(&self, tenant: &str, id: &str) -> Result<(), NgsiError> {
        self.get(tenant, id)?;
        let existed = self
            .store
            .delete_document(DocumentKind::Registration, tenant, id)
            .await
            .map_err(internal)?;
        let removed = {
            let mut tenants = self.tenants.write();
            tenants.get_mut(tenant).is_some_and(|list| {
                let before = list.len();
                list.retain(|r| r.registration.id != id);
                list.len() < before
            })
        };
        self.forwarding
            .lock()
            .remove(&(tenant.to_string(), id.to_string()));
        self.announce(tenant, id);
        if existed || removed {
            Ok(())
        } else {
            Err(not_found())
        }
    }
}

fn internal(e: StoreError) -> NgsiError {
    tracing::error!(error = %e, "storing a registration failed");
    match e {
        StoreError::Overloaded => NgsiError::new(
            503,
            "ServiceUnavailable",
            "the store is overloaded; retry later",
        ),
        _ => NgsiError::new(500, "InternalServerError", "internal error"),
    }
}

impl Registrations {
    /// Tells the other nodes that registration `id` of `tenant` changed.
    fn announce(&self, tenant: &str, id: &str) {
        self.bus.definition_changed(DefinitionChange::in_tenant(
            DefinitionKind::Registration,
            tenant,
            id,
        ));
    }
}

impl Follower for Registrations {
    const KINDS: &'static [DefinitionKind] = &[DefinitionKind::Registration];

    /// Reads every registration again (they are few and never edited in
    /// place), keeping those this node created while the store was read.
    async fn reload(&self, _what: &Reload) -> Result<(), StoreError> {
        let horizon = self.next_created.load(Ordering::Relaxed);
        let (mut fresh, max) = read_stored(&self.store).await?;
        self.next_created.fetch_max(max + 1, Ordering::Relaxed);
        let mut tenants = self.tenants.write();
        for (tenant, list) in tenants.iter() {
            for r in list.iter().filter(|r| r.created >= horizon) {
                let kept = fresh.entry(tenant.clone()).or_default();
                if !kept.iter().any(|k| k.registration.id == r.registration.id) {
                    kept.push(r.clone());
                }
            }
        }
        for list in fresh.values_mut() {
            list.sort_by_key(|r| r.created);
        }
        *tenants = fresh;
        Ok(())
    }
}

/// The stored registrations by tenant, in creation order, and the highest
/// creation number. A stored document that no longer parses is logged and
/// skipped rather than failing the start.
async fn read_stored(store: &Arc<dyn Store>) -> Result<(ByTenant, u64), StoreError> {
    let documents = store.load_documents(DocumentKind::Registration).await?;
    let mut tenants: ByTenant = HashMap::new();
    let mut max = 0;
    for d in documents {
        let registration = match Registration::from_storage(&d.json) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(id = %d.id, error = %e, "stored registration could not be read; skipped");
                continue;
            }
        };
        max = max.max(d.created);
        tenants
            .entry(d.tenant)
            .or_default()
            .push(StoredRegistration {
                service_path: d.service_path,
                registration,
                created: d.created,
            });
    }
    for list in tenants.values_mut() {
        list.sort_by_key(|r| r.created);
    }
    Ok((tenants, max))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use weft_model::ngsi::registration::new_id;

    fn registration() -> Registration {
        let body = json!({
            "dataProvided": {"entities": [{"id": "E1", "type": "T1"}], "attrs": ["A1"]},
            "provider": {"http": {"url": "http://localhost:1028/v2"}}
        });
        Registration::parse(&body, new_id()).unwrap()
    }

    #[tokio::test]
    async fn providers_are_found_by_entity_path_mode_and_expiry() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(
            weft_store::sqlite::SqliteStore::open(weft_store::sqlite::SqliteConfig {
                path: dir.path().join("weft.db"),
                ..Default::default()
            })
            .unwrap(),
        );
        let regs = Registrations::load(store, Arc::new(weft_bus::InProcessBus::default()))
            .await
            .unwrap();
        let with = |mode: &str, expires: Option<&str>| {
            let mut body = json!({
                "dataProvided": {"entities": [{"id": "E1", "type": "T1"}]},
                "provider": {"http": {"url": "http://cp"}, "supportedForwardingMode": mode}
            });
            if let Some(e) = expires {
                body["expires"] = json!(e);
            }
            Registration::parse(&body, new_id()).unwrap()
        };
        let query = with("query", None);
        let update = with("update", None);
        let expired = with("all", Some("2001-01-01T00:00:00Z"));
        regs.create("", "/a", query.clone()).await.unwrap();
        regs.create("", "/", update.clone()).await.unwrap();
        regs.create("", "/", expired).await.unwrap();
        let now = 1_700_000_000_000;
        let ids = |kind, paths: &[&str], t: Option<&str>| -> Vec<String> {
            let paths: Vec<String> = paths.iter().map(|p| p.to_string()).collect();
            regs.providers("", &paths, "E1", t, kind, now)
                .into_iter()
                .map(|r| r.id)
                .collect()
        };
        assert_eq!(ids(ForwardKind::Query, &[], None), vec![query.id.clone()]);
        assert_eq!(ids(ForwardKind::Query, &["/b"], None), Vec::<String>::new());
        assert_eq!(
            ids(ForwardKind::Query, &["/a"], Some("T2")),
            Vec::<String>::new()
        );
        assert_eq!(
            ids(ForwardKind::Update, &["/"], Some("T1")),
            vec![update.id.clone()]
        );
        assert!(regs
            .providers("other", &[], "E1", None, ForwardKind::Query, now)
            .is_empty());

        assert_eq!(regs.forwarding_info("", &query.id), None);
        regs.record_forward("", &query.id, true, 5);
        regs.record_forward("", &query.id, false, 6);
        let info = regs.forwarding_info("", &query.id).unwrap();
        assert_eq!((info.times_sent, info.times_failed), (2, 1));
        assert_eq!((info.last_success, info.last_failure), (Some(5), Some(6)));
        regs.delete("", &query.id).await.unwrap();
        assert_eq!(regs.forwarding_info("", &query.id), None);
    }

    #[tokio::test]
    async fn created_listed_deleted_and_reloaded() {
        let dir = tempfile::tempdir().unwrap();
        let open = || -> Arc<dyn Store> {
            Arc::new(
                weft_store::sqlite::SqliteStore::open(weft_store::sqlite::SqliteConfig {
                    path: dir.path().join("weft.db"),
                    ..Default::default()
                })
                .unwrap(),
            )
        };
        let store = open();
        let regs = Registrations::load(store.clone(), Arc::new(weft_bus::InProcessBus::default()))
            .await
            .unwrap();
        let (a, b, c) = (registration(), registration(), registration());
        regs.create("", "/", a.clone()).await.unwrap();
        regs.create("", "/x", b.clone()).await.unwrap();
        regs.create("t2", "/", c.clone()).await.unwrap();

        let ids = |list: Vec<StoredRegistration>| -> Vec<String> {
            list.into_iter().map(|r| r.registration.id).collect()
        };
        assert_eq!(ids(regs.list("", &[])), [a.id.as_str(), b.id.as_str()]);
        assert_eq!(ids(regs.list("", &["/x".into()])), [b.id.as_str()]);
        assert_eq!(ids(regs.list("", &["/#".into()])).len(), 2);
        assert_eq!(ids(regs.list("t2", &[])), [c.id.as_str()]);
        assert_eq!(regs.get("", &b.id).unwrap().service_path, "/x");
        assert_eq!(regs.get("t2", &a.id).unwrap_err().status, 404);

        regs.delete("", &a.id).await.unwrap();
        assert_eq!(regs.delete("", &a.id).await.unwrap_err().status, 404);

        store.close().await;
        drop(store);
        let reloaded = Registrations::load(open(), Arc::new(weft_bus::InProcessBus::default()))
            .await
            .unwrap();
        assert_eq!(ids(reloaded.list("", &[])), [b.id.as_str()]);
        assert_eq!(reloaded.get("t2", &c.id).unwrap().registration, c);
        let next = registration();
        reloaded.create("", "/", next.clone()).await.unwrap();
        assert_eq!(
            ids(reloaded.list("", &[])),
            [b.id.as_str(), next.id.as_str()]
        );
    }
}
