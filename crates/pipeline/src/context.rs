//! The context: every tenant's NGSIv2 entities, kept in memory for queries
//! and persisted through the store before a write is acknowledged.
//!
//! Entities are keyed by (service path, id, type), as Orion keys them, and
//! kept in creation order (Orion's default order for listings). Reads
//! (`get`, `query`) never touch the database; writes change the in-memory
//! entity under a short lock, then wait for the store to commit the new
//! state, so a 201/204 means durable. Filtering (`q`, `mq`, geo, ids,
//! types, service paths) happens here; representation, ordering and paging
//! belong to the HTTP layer.

mod expiry;
mod remote;

pub use expiry::SWEEP_INTERVAL;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;
use regex::Regex;
use std::borrow::Cow;
use weft_model::geo::{GeoQuery, Shape};
use weft_model::ngsi::{AttrChange, AttrMap, ChangeKind, Entity, NgsiError, UpdateOutcome};

use serde_json::Value;
use weft_model::query::{descend, parse_datetime, Operand, Query, Resolver};
use weft_store::{EntityRecord, HistoryRow, HistoryStates, LoggedChange, Store};

tokio::task_local! {
    /// Where the request being served came from, so the changes it makes
    /// carry its correlator, service and token to the notifications they
    /// trigger (as Orion propagates them). Set by the HTTP layer around
    /// each request.
    pub static ORIGIN: Origin;
}

pub use crate::changes::{Backpressure, ChangeListener};
use crate::changes::{Changes, Ticket};
use remote::Wanted;
pub use weft_model::ngsi::{Alteration, EntityChange, Origin};

fn current_origin() -> Option<Origin> {
    ORIGIN.try_with(|o| o.clone()).ok()
}

/// What an operation passed to [`Context::modify`] reports about the
/// attributes it touched.
pub trait Touched {
    /// The attributes touched, in request order.
    fn touched(&self) -> &[AttrChange];
}

impl Touched for UpdateOutcome {
    fn touched(&self) -> &[AttrChange] {
        &self.changes
    }
}

impl Touched for AttrChange {
    fn touched(&self) -> &[AttrChange] {
        std::slice::from_ref(self)
    }
}

/// Where an NGSI request looks, and what a forward of it repeats: its
/// tenant and its service paths.
#[derive(Debug, Clone, Default)]
pub struct Tenancy {
    /// The tenant (`Fiware-Service`, lowercased; empty for the default).
    pub tenant: String,
    /// `Fiware-ServicePath` as received (its paths, normalized, joined by
    /// `,`), which forwarded requests repeat; `None` when absent.
    pub received: Option<String>,
    /// The service paths a read covers (`/x/#` a subtree; empty: all).
    pub read_paths: Vec<String>,
}

/// The entity a write addresses: where it looks (its tenancy), the one
/// service path written (`/` when the request named none: only entities
/// and registrations there are reached), its id and, when the request
/// gave it, its type.
#[derive(Debug, Clone, Default)]
pub struct Target {
    /// The tenant and the service paths as received.
    pub tenancy: Tenancy,
    /// The one service path written to.
    pub path: String,
    /// The entity id.
    pub id: String,
    /// The entity type, when the request gave it.
    pub entity_type: Option<String>,
}

/// What [`Context::upsert`] did.
#[derive(Debug)]
pub enum Upserted<T> {
    /// There was no such entity: the new one was stored.
    Created,
    /// The entity existed: the change was applied, with this result.
    Modified(T),
}

/// An entity with where it lives and when it was created (its position in
/// listings).
#[derive(Debug, Clone)]
pub struct StoredEntity {
    /// Service path (`/` when none was given).
    pub service_path: String,
    /// The entity, shared: a write replaces it with a changed copy, so
    /// readers and announced changes hold it without copying.
    pub entity: Arc<Entity>,
    /// Creation order within the tenant.
    pub created: u64,
}

impl StoredEntity {
    /// Whether the entity is still there at `now`: a transient entity
    /// whose `dateExpires` has passed is gone for every reader and writer
    /// at once, whatever the sweep has done yet.
    pub fn is_live(&self, now: i64) -> bool {
        !self.entity.is_expired(now)
    }
}

/// Which entities a query or a lookup covers. Empty lists match all.
#[derive(Debug, Default)]
pub struct EntityFilter {
    /// Service-path patterns: `/a/b` (exactly) or `/a/#` (the subtree).
    /// Empty: every path.
    pub service_paths: Vec<String>,
    /// Entity ids (any of).
    pub ids: Vec<String>,
    /// Id regex.
    pub id_pattern: Option<Regex>,
    /// Entity types (any of).
    pub types: Vec<String>,
    /// Type regex.
    pub type_pattern: Option<Regex>,
    /// `q` over attributes.
    pub q: Option<Query>,
    /// `mq` over metadata.
    pub mq: Option<Query>,
    /// Geo-query over the entity's location attribute.
    pub geo: Option<GeoQuery>,
}

impl EntityFilter {
    /// Whether `e` passes every condition.
    pub fn matches(&self, e: &StoredEntity) -> bool {
        let entity = &e.entity;
        path_matches(&self.service_paths, &e.service_path)
            && (self.ids.is_empty() || self.ids.iter().any(|i| i == &entity.id))
            && self
                .id_pattern
                .as_ref()
                .is_none_or(|r| r.is_match(&entity.id))
            && (self.types.is_empty() || self.types.iter().any(|t| t == &entity.entity_type))
            && self
                .type_pattern
                .as_ref()
                .is_none_or(|r| r.is_match(&entity.entity_type))
            && self
                .q
                .as_ref()
                .is_none_or(|q| q.matches_with(&EntityResolver(entity, &e.service_path)))
            && self
                .mq
                .as_ref()
                .is_none_or(|q| q.matches_with(&EntityResolver(entity, &e.service_path)))
            && self
                .geo
                .as_ref()
                .is_none_or(|g| location(entity).is_some_and(|s| g.matches(&s)))
    }
}

/// The entity's location shape, if it has a location attribute.
pub fn location(entity: &Entity) -> Option<Shape> {
    entity
        .attrs
        .iter()
        .find(|(_, a)| a.is_location())
        .and_then(|(_, a)| Shape::of_stored_attribute(&a.attr_type, &a.value))
}

/// Whether a service path matches the patterns (`/#` and `/x/#` are subtrees).
pub fn path_matches(patterns: &[String], path: &str) -> bool {
    patterns.is_empty()
        || patterns.iter().any(|p| match p.strip_suffix("/#") {
            Some("") => true,
            Some(prefix) => path == prefix || path.starts_with(&format!("{prefix}/")),
            None => p == path,
        })
}

/// Resolves `q`/`mq` paths against an entity in its service path:
/// attribute values (typed by their NGSI type: `DateTime` compares as a
/// date), metadata values, and the builtins.
///
/// The builtin attributes `dateCreated`, `dateModified`, `dateExpires`
/// and `servicePath`, and the builtin metadata `dateCreated` and
/// `dateModified`, always mean the builtin, even when the entity has a
/// user attribute (or metadata) of that name: rendering shows the user's
/// item, filtering reads the builtin, as in Orion
/// (`0876_entity_dates/entity_dates_overridden_by_user.test`).
pub struct EntityResolver<'a>(
    /// The entity filtered.
    pub &'a Entity,
    /// Its service path (builtin `servicePath`).
    pub &'a str,
);

impl Resolver for EntityResolver<'_> {
    fn attribute(&self, attr: &str, path: &[String]) -> Option<Operand<'_>> {
        let EntityResolver(e, service_path) = *self;
        if path.is_empty() {
            match attr {
                "dateCreated" => return Some(Operand::DateTime(e.date_created)),
                "dateModified" => return Some(Operand::DateTime(e.date_modified)),
                "dateExpires" => {
                    if let Some(at) = e.date_expires {
                        return Some(Operand::DateTime(at));
                    }
                }
                "servicePath" => {
                    return Some(Operand::Json(Cow::Owned(Value::String(
                        service_path.to_string(),
                    ))))
                }
                _ => {}
            }
        }
        let a = e.attrs.get(attr)?;
        typed(&a.value, &a.attr_type, path)
    }

    fn metadata(&self, attr: &str, md: &str, path: &[String]) -> Option<Operand<'_>> {
        let a = self.0.attrs.get(attr)?;
        if path.is_empty() {
            match md {
                "dateCreated" => return Some(Operand::DateTime(a.date_created)),
                "dateModified" => return Some(Operand::DateTime(a.date_modified)),
                _ => {}
            }
        }
        let m = a.metadata.get(md)?;
        typed(&m.value, &m.md_type, path)
    }
}

/// A value as a query operand: a `DateTime` value compares as an instant,
/// anything else (a null `DateTime` too: it exists, equals `null` and
/// compares with no date) as typed JSON; `path` reaches inside structured
/// values.
fn typed<'v>(value: &'v Value, ngsi_type: &str, path: &[String]) -> Option<Operand<'v>> {
    if !path.is_empty() {
        return descend(value, path).map(|v| Operand::Json(Cow::Borrowed(v)));
    }
    if ngsi_type == "DateTime" || ngsi_type == "ISO8601" {
        if let Some(ms) = value.as_str().and_then(parse_datetime) {
            return Some(Operand::DateTime(ms));
        }
    }
    Some(Operand::Json(Cow::Borrowed(value)))
}

/// One tenant's entities.
#[derive(Default)]
struct Tenant {
    /// (service path, id, type) → entity.
    entities: HashMap<Key, StoredEntity>,
    /// Entity id → the keys with that id, so lookups by id (every
    /// `/v2/entities/{id}` request) don't scan the tenant.
    by_id: HashMap<String, Vec<Key>>,
    /// Entities changed by device data and not yet stored.
    dirty: std::collections::HashSet<Key>,
}

/// An entity's identity: (service path, id, type).
type Key = (String, String, String);

impl Tenant {
    fn insert(&mut self, key: Key, entity: StoredEntity) {
        if self.entities.insert(key.clone(), entity).is_none() {
            self.by_id.entry(key.1.clone()).or_default().push(key);
        }
    }

    /// The key of the one live entity with `id` (and `entity_type`, if
    /// given) in the service paths: 404 if none, 409 if several. Expired
    /// entities are not there any more, even before the sweep removes
    /// them. Looks only at the entities with that id and copies nothing
    /// but the key found.
    fn find(
        &self,
        service_paths: &[String],
        id: &str,
        entity_type: Option<&str>,
        now: i64,
    ) -> Result<&Key, NgsiError> {
        let mut found = self.by_id.get(id).into_iter().flatten().filter(|k| {
            path_matches(service_paths, &k.0)
                && entity_type.is_none_or(|t| t == k.2)
                && self.entities.get(*k).is_some_and(|e| e.is_live(now))
        });
        let key = found.next().ok_or_else(NgsiError::entity_not_found)?;
        if found.next().is_some() {
            return Err(NgsiError::too_many_results());
        }
        Ok(key)
    }

    fn remove(&mut self, key: &Key) {
        if self.entities.remove(key).is_some() {
            if let Some(keys) = self.by_id.get_mut(&key.1) {
                keys.retain(|k| k != key);
                if keys.is_empty() {
                    self.by_id.remove(&key.1);
                }
            }
        }
    }
}

/// Every tenant's entities, in memory, backed by the store.
pub struct Context {
    store: Arc<dyn Store>,
    tenants: RwLock<HashMap<String, Tenant>>,
    next_created: AtomicU64,
    /// Whether changes queue history rows (`history.record_changes`).
    record_history: std::sync::atomic::AtomicBool,
    /// Where committed changes are announced.
    changes: Arc<Changes>,
    /// Taken exclusively by the expiry sweep while it deletes expired
    /// entities, and shared by [`Context::create`] until its entity is
    /// stored: a create may put a new entity where an expired one still
    /// lies, and its row must not be deleted by a sweep under way. Creates
    /// share it, so they never wait for each other.
    sweeping: tokio::sync::RwLock<()>,
    /// The bus other nodes' changes come on, set once this node follows
    /// them (see `context/remote.rs`): whether other nodes write entities
    /// too, and how far behind them this node is, which paces its own
    /// writes.
    remote: std::sync::OnceLock<Arc<dyn weft_bus::Bus>>,
    /// Other nodes' changes not read yet (see `context/remote.rs`).
    arrivals: parking_lot::Mutex<remote::Arrivals>,
}

/// The tenant name of requests without `Fiware-Service`.
pub const DEFAULT_TENANT: &str = "";

impl Context {
    /// Loads every stored entity; committed changes will be announced
    /// through `changes`.
    pub async fn load(
        store: Arc<dyn Store>,
        changes: Arc<Changes>,
    ) -> Result<Context, weft_store::StoreError> {
        let records = store.load_entities().await?;
        let mut tenants: HashMap<String, Tenant> = HashMap::new();
        let mut max = 0;
        for r in records {
            let entity = match Entity::from_storage(&r.json) {
                Ok(e) => e,
                Err(e) => {
                    tracing::error!(id = %r.id, error = %e, "stored entity could not be read; skipped");
                    continue;
                }
            };
            max = max.max(r.created);
            tenants.entry(r.tenant).or_default().insert(
                (r.service_path.clone(), r.id, r.entity_type),
                StoredEntity {
                    service_path: r.service_path,
                    entity: Arc::new(entity),
                    created: r.created,
                },
            );
        }
        Ok(Context {
            store,
            tenants: RwLock::new(tenants),
            next_created: AtomicU64::new(max + 1),
            record_history: std::sync::atomic::AtomicBool::new(false),
            changes,
            sweeping: tokio::sync::RwLock::new(()),
            remote: std::sync::OnceLock::new(),
            arrivals: parking_lot::Mutex::default(),
        })
    }

    /// Turns the recording of history for changes on or off (off by
    /// default, see `history.record_changes`).
    pub fn set_record_history(&self, on: bool) {
        self.record_history.store(on, Ordering::Relaxed);
    }

    /// The history state of a change (its attributes `names`), if history
    /// is recorded, in the feed's form (no rows are built).
    fn history_states<'a>(
        &self,
        tenant: &str,
        e: &StoredEntity,
        names: impl IntoIterator<Item = &'a str>,
    ) -> HistoryStates {
        let mut states = HistoryStates::default();
        if !self.record_history.load(Ordering::Relaxed) {
            return states;
        }
        let time = weft_model::history::time_index(&e.entity, None, weft_model::now_ms());
        crate::history::push_entity_state(
            &mut states,
            tenant,
            &e.service_path,
            &e.entity,
            names,
            time,
        );
        states
    }

    /// The history rows of a change, if history is recorded.
    fn history_rows<'a>(
        &self,
        tenant: &str,
        e: &StoredEntity,
        names: impl IntoIterator<Item = &'a str>,
    ) -> Vec<HistoryRow> {
        if !self.record_history.load(Ordering::Relaxed) {
            return Vec::new();
        }
        let time = weft_model::history::time_index(&e.entity, None, weft_model::now_ms());
        crate::history::rows_of(tenant, &e.service_path, &e.entity, names, time)
    }

    /// Where committed changes are announced (to add listeners).
    pub fn changes(&self) -> &Arc<Changes> {
        &self.changes
    }

    /// A place in the order of changes, if anyone wants changes in
    /// `tenant`. Take it under the tenants' lock, with the change.
    fn ticket(&self, tenant: &str) -> Option<Ticket> {
        self.changes.wanted(tenant).then(|| self.changes.ticket())
    }

    /// Stores an entity's new state with its history and (when its ticket
    /// is wanted) its log entry, in one transaction, then announces the
    /// change through its ticket and waits as long as the listeners ask.
    async fn commit(
        &self,
        tenant: &str,
        stored: StoredEntity,
        history: HistoryStates,
        ticket: Option<Ticket>,
        alteration: Alteration,
        attrs: Vec<AttrChange>,
    ) -> Result<(), NgsiError> {
        let record = record(tenant, &stored);
        let pending =
            ticket.map(|ticket| PendingChange::new(ticket, tenant, stored, alteration, attrs));
        self.store
            .put_entity(
                record,
                history,
                pending.as_ref().and_then(PendingChange::log),
            )
            .await
            .map_err(internal)?;
        PendingChange::announce_and_wait(pending).await;
        Ok(())
    }

    /// Whether `tenant` has had an entity on any node (a tenant comes to
    /// be with its first entity, and stays).
    pub fn has_tenant(&self, tenant: &str) -> bool {
        self.take_arrived_now(Wanted::Tenant(tenant));
        self.tenants.read().contains_key(tenant)
    }

    /// Entities of `tenant` passing `filter`, in creation order.
    pub fn query(&self, tenant: &str, filter: &EntityFilter) -> Vec<StoredEntity> {
        if filter.ids.is_empty() {
            self.take_arrived_now(Wanted::Tenant(tenant));
        } else {
            for id in &filter.ids {
                self.take_arrived_now(Wanted::Entity { tenant, id });
            }
        }
        let now = weft_model::now_ms();
        let tenants = self.tenants.read();
        let Some(t) = tenants.get(tenant) else {
            return Vec::new();
        };
        let mut out: Vec<StoredEntity> = if filter.ids.is_empty() {
            t.entities
                .values()
                .filter(|e| e.is_live(now) && filter.matches(e))
                .cloned()
                .collect()
        } else {
            filter
                .ids
                .iter()
                .filter_map(|id| t.by_id.get(id))
                .flatten()
                .filter_map(|key| t.entities.get(key))
                .filter(|e| e.is_live(now) && filter.matches(e))
                .cloned()
                .collect()
        };
        out.sort_by_key(|e| e.created);
        // `ids` may name an entity twice; creation order is unique per entity.
        out.dedup_by_key(|e| e.created);
        out
    }

    /// The one entity with `id` (and `entity_type`, if given) in the
    /// service paths: 404 if none, 409 if several.
    pub fn get(
        &self,
        tenant: &str,
        service_paths: &[String],
        id: &str,
        entity_type: Option<&str>,
    ) -> Result<StoredEntity, NgsiError> {
        self.take_arrived_now(Wanted::Entity { tenant, id });
        let tenants = self.tenants.read();
        let t = tenants
            .get(tenant)
            .ok_or_else(NgsiError::entity_not_found)?;
        let key = t.find(service_paths, id, entity_type, weft_model::now_ms())?;
        t.entities
            .get(key)
            .cloned()
            .ok_or_else(NgsiError::entity_not_found)
    }

    /// All entity types of `tenant` in the service paths.
    pub fn types(&self, tenant: &str, service_paths: &[String]) -> Vec<StoredEntity> {
        self.query(
            tenant,
            &EntityFilter {
                service_paths: service_paths.to_vec(),
                ..EntityFilter::default()
            },
        )
    }

    /// Creates an entity; 422 `Already Exists` if one with the same id,
    /// type and service path exists (an expired one does not: the new
    /// entity takes its place).
    pub async fn create(
        &self,
        tenant: &str,
        service_path: &str,
        entity: Entity,
    ) -> Result<(), NgsiError> {
        self.create_with(tenant, service_path, entity, false).await
    }

    /// [`Context::create`]; with `unique_id`, also 422 `Already Exists`
    /// when the tenant has an entity of that id of any type in any
    /// service path (NGSI-LD's identity), checked under the same lock.
    pub async fn create_with(
        &self,
        tenant: &str,
        service_path: &str,
        entity: Entity,
        unique_id: bool,
    ) -> Result<(), NgsiError> {
        self.keep_pace().await;
        let paths = [service_path.to_string()];
        self.catch_up(tenant, &paths, &entity.id, Some(&entity.entity_type))
            .await;
        // Not while the sweep deletes expired entities: it could delete
        // this one's row after it is stored (see `expiry`).
        let sweep = self.sweeping.read().await;
        let (stored, ticket) = {
            let mut tenants = self.tenants.write();
            self.take_arrived(
                &mut tenants,
                Wanted::Entity {
                    tenant,
                    id: &entity.id,
                },
            );
            let t = tenants.entry(tenant.to_string()).or_default();
            self.insert_new(t, tenant, service_path, entity, unique_id)?
        };
        self.commit_created(tenant, stored, ticket).await?;
        drop(sweep);
        Ok(())
    }

    /// The key of the one entity matching (`id`, `entity_type`) in the
    /// service paths, looked up under the caller's lock; `None` when there
    /// is none but the store may have it: on a node of a cluster that has
    /// not yet read the store for it ([`Context::catch_up`], which the
    /// caller runs before looking again). Otherwise what finding it fails
    /// with (404 among them). The common case, an entity held, costs one
    /// lookup.
    fn held_key(
        &self,
        tenants: &HashMap<String, Tenant>,
        tenant: &str,
        service_paths: &[String],
        id: &str,
        entity_type: Option<&str>,
        caught_up: bool,
    ) -> Result<Option<Key>, NgsiError> {
        let may_be_behind = !caught_up && self.remote.get().is_some();
        let found = tenants
            .get(tenant)
            .ok_or_else(NgsiError::entity_not_found)
            .and_then(|t| {
                t.find(service_paths, id, entity_type, weft_model::now_ms())
                    .cloned()
            });
        match found {
            Ok(key) => Ok(Some(key)),
            Err(e) if e.status == 404 && may_be_behind => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Applies `change` to the one entity matching (`id`, `entity_type`)
    /// in the service paths, then persists it. `change` runs under the
    /// lock on a copy; an error leaves the entity untouched.
    pub async fn modify<T: Touched>(
        &self,
        tenant: &str,
        service_paths: &[String],
        id: &str,
        entity_type: Option<&str>,
        change: impl FnOnce(&mut Entity) -> Result<T, NgsiError>,
    ) -> Result<T, NgsiError> {
        self.keep_pace().await;
        let mut change = Some(change);
        let mut caught_up = false;
        let (result, stored, ticket) = loop {
            {
                let mut tenants = self.tenants.write();
                self.take_arrived(&mut tenants, Wanted::Entity { tenant, id });
                if let Some(key) =
                    self.held_key(&tenants, tenant, service_paths, id, entity_type, caught_up)?
                {
                    let t = tenants.get_mut(tenant).expect("the tenant holds the key");
                    let change = change.take().expect("changed once, when found");
                    break self.change_existing(t, tenant, &key, change)?;
                }
            }
            self.catch_up(tenant, service_paths, id, entity_type).await;
            caught_up = true;
        };
        self.commit_modified(tenant, &result, stored, ticket)
            .await?;
        Ok(result)
    }

    /// Merges `new` into the one entity matching (its id, `entity_type`)
    /// in `service_path`, or, when there is none, stores `new` itself
    /// there after `create` has prepared it — under one lock, so a
    /// concurrent create or delete cannot come between the lookup and the
    /// write (an upsert never answers 404 or 422 `Already Exists`).
    /// `merge` gets the existing entity (a copy, kept if it succeeds) and
    /// `new`'s attributes. Errors are `modify`'s and `create`'s.
    pub async fn upsert<T: Touched>(
        &self,
        tenant: &str,
        service_path: &str,
        entity_type: Option<&str>,
        mut new: Entity,
        create: impl FnOnce(&mut Entity) -> Result<(), NgsiError>,
        merge: impl FnOnce(&mut Entity, AttrMap) -> Result<T, NgsiError>,
    ) -> Result<Upserted<T>, NgsiError> {
        self.keep_pace().await;
        let paths = [service_path.to_string()];
        self.catch_up(tenant, &paths, &new.id, entity_type).await;
        let sweep = self.sweeping.read().await;
        let done = {
            let mut tenants = self.tenants.write();
            self.take_arrived(
                &mut tenants,
                Wanted::Entity {
                    tenant,
                    id: &new.id,
                },
            );
            let t = tenants.entry(tenant.to_string()).or_default();
            match t.find(&paths, &new.id, entity_type, weft_model::now_ms()) {
                Ok(key) => {
                    let key = key.clone();
                    let attrs = std::mem::take(&mut new.attrs);
                    Ok(self.change_existing(t, tenant, &key, |e| merge(e, attrs))?)
                }
                Err(e) if e.status == 404 => {
                    create(&mut new)?;
                    Err(self.insert_new(t, tenant, service_path, new, false)?)
                }
                Err(e) => return Err(e),
            }
        };
        match done {
            Ok((result, stored, ticket)) => {
                drop(sweep);
                self.commit_modified(tenant, &result, stored, ticket)
                    .await?;
                Ok(Upserted::Modified(result))
            }
            Err((stored, ticket)) => {
                self.commit_created(tenant, stored, ticket).await?;
                drop(sweep);
                Ok(Upserted::Created)
            }
        }
    }

    /// Puts a new entity in `t` (under the tenants' lock): 422 if a live
    /// one has its key.
    fn insert_new(
        &self,
        t: &mut Tenant,
        tenant: &str,
        service_path: &str,
        mut entity: Entity,
        unique_id: bool,
    ) -> Result<(StoredEntity, Option<Ticket>), NgsiError> {
        entity.check_locations()?;
        entity.refresh_expiration();
        let now = weft_model::now_ms();
        let id_taken = || {
            t.by_id
                .get(&entity.id)
                .into_iter()
                .flatten()
                .filter_map(|k| t.entities.get(k))
                .any(|e| e.is_live(now))
        };
        if unique_id && id_taken() {
            return Err(NgsiError::already_exists());
        }
        let key = (
            service_path.to_string(),
            entity.id.clone(),
            entity.entity_type.clone(),
        );
        if t.entities
            .get(&key)
            .is_some_and(|e| e.is_live(weft_model::now_ms()))
        {
            return Err(NgsiError::already_exists());
        }
        let stored = StoredEntity {
            service_path: service_path.to_string(),
            entity: Arc::new(entity),
            created: self.next_created.fetch_add(1, Ordering::Relaxed),
        };
        t.insert(key, stored.clone());
        Ok((stored, self.ticket(tenant)))
    }

    /// Stores a new entity and announces it.
    async fn commit_created(
        &self,
        tenant: &str,
        stored: StoredEntity,
        ticket: Option<Ticket>,
    ) -> Result<(), NgsiError> {
        let history = self.history_states(tenant, &stored, stored.entity.attrs.keys());
        let attrs = created_attrs(&stored.entity);
        self.commit(tenant, stored, history, ticket, Alteration::Created, attrs)
            .await
    }

    /// Runs `change` on a copy of the entity at `key` (under the tenants'
    /// lock) and keeps the copy if it succeeds and passes the checks.
    fn change_existing<T: Touched>(
        &self,
        t: &mut Tenant,
        tenant: &str,
        key: &Key,
        change: impl FnOnce(&mut Entity) -> Result<T, NgsiError>,
    ) -> Result<(T, StoredEntity, Option<Ticket>), NgsiError> {
        let slot = t
            .entities
            .get_mut(key)
            .ok_or_else(NgsiError::entity_not_found)?;
        let mut next = Entity::clone(&slot.entity);
        let result = change(&mut next)?;
        next.check_locations()?;
        slot.entity = Arc::new(next);
        let ticket = if result.touched().is_empty() {
            None
        } else {
            self.ticket(tenant)
        };
        Ok((result, slot.clone(), ticket))
    }

    /// Stores a changed entity and announces the change.
    async fn commit_modified<T: Touched>(
        &self,
        tenant: &str,
        result: &T,
        stored: StoredEntity,
        ticket: Option<Ticket>,
    ) -> Result<(), NgsiError> {
        let history = self.history_states(
            tenant,
            &stored,
            result.touched().iter().map(|c| c.name.as_str()),
        );
        let touched = result.touched().to_vec();
        self.commit(
            tenant,
            stored,
            history,
            ticket,
            Alteration::Updated,
            touched,
        )
        .await
    }

    /// Deletes the one entity matching (`id`, `entity_type`): found and
    /// removed under one lock.
    pub async fn delete(
        &self,
        tenant: &str,
        service_paths: &[String],
        id: &str,
        entity_type: Option<&str>,
    ) -> Result<StoredEntity, NgsiError> {
        self.keep_pace().await;
        let mut caught_up = false;
        let (current, ticket) = loop {
            {
                let mut tenants = self.tenants.write();
                self.take_arrived(&mut tenants, Wanted::Entity { tenant, id });
                if let Some(key) =
                    self.held_key(&tenants, tenant, service_paths, id, entity_type, caught_up)?
                {
                    let t = tenants.get_mut(tenant).expect("the tenant holds the key");
                    let current = t
                        .entities
                        .get(&key)
                        .cloned()
                        .ok_or_else(NgsiError::entity_not_found)?;
                    t.remove(&key);
                    break (current, self.ticket(tenant));
                }
            }
            self.catch_up(tenant, service_paths, id, entity_type).await;
            caught_up = true;
        };
        let pending = ticket.map(|ticket| {
            PendingChange::new(
                ticket,
                tenant,
                current.clone(),
                Alteration::Deleted,
                Vec::new(),
            )
        });
        self.store
            .delete_entity(
                tenant,
                &current.service_path,
                &current.entity.id,
                &current.entity.entity_type,
                pending.as_ref().and_then(PendingChange::log),
            )
            .await
            .map_err(internal)?;
        PendingChange::announce_and_wait(pending).await;
        Ok(current)
    }

    /// Applies data units to their devices' entities (creating them on
    /// first sight) in the default tenant and service path `/`. `units`
    /// pairs each unit with its entity type. The entities are only marked
    /// dirty: the pipeline stores them in bulk ([`Context::take_dirty`])
    /// every so often, and after a crash the units stored since the last
    /// bulk write are applied again at start, so device data never costs an
    /// entity write per unit. Returns the history rows of the changes (for
    /// the caller to store with the units) and the changes themselves, for
    /// the caller to announce once the units are committed.
    pub fn apply_units<'a>(
        &self,
        units: impl IntoIterator<Item = (&'a weft_model::DataUnit, &'a str)>,
        now: i64,
    ) -> Applied {
        let wanted = self.changes.wanted(DEFAULT_TENANT);
        let mut changes = Vec::new();
        let mut history = Vec::new();
        let mut tenants = self.tenants.write();
        for (unit, entity_type) in units {
            let id = &unit.device.id;
            self.take_arrived(
                &mut tenants,
                Wanted::Entity {
                    tenant: DEFAULT_TENANT,
                    id,
                },
            );
            let t = match tenants.get_mut(DEFAULT_TENANT) {
                Some(t) => t,
                None => tenants.entry(DEFAULT_TENANT.to_string()).or_default(),
            };
            let key = (
                "/".to_string(),
                unit.device.id.clone(),
                entity_type.to_string(),
            );
            let created = t.entities.get(&key).is_none_or(|e| !e.is_live(now));
            if created {
                let mut entity = Entity::new(unit.device.id.clone(), entity_type);
                entity.stamp_created(now);
                let created = self.next_created.fetch_add(1, Ordering::Relaxed);
                t.insert(
                    key.clone(),
                    StoredEntity {
                        service_path: "/".to_string(),
                        entity: Arc::new(entity),
                        created,
                    },
                );
            }
            let slot = t.entities.get_mut(&key).expect("inserted above");
            let attrs = crate::entity::unit_attributes(unit);
            let outcome = weft_model::ngsi::append(
                Arc::make_mut(&mut slot.entity),
                attrs,
                Default::default(),
                now,
            );
            // The measures make the time series; `dateObserved` is the time
            // index itself and the static location matters only when it moves.
            history.extend(
                self.history_rows(
                    DEFAULT_TENANT,
                    slot,
                    outcome
                        .changes
                        .iter()
                        .filter(|c| {
                            unit.measures.contains_key(&c.name)
                                || (c.modified && c.name == "location")
                        })
                        .map(|c| c.name.as_str()),
                ),
            );
            if wanted {
                let alteration = if created {
                    Alteration::Created
                } else {
                    Alteration::Updated
                };
                changes.push(PendingChange {
                    ticket: self.changes.ticket(),
                    change: EntityChange {
                        tenant: DEFAULT_TENANT.to_string(),
                        service_path: slot.service_path.clone(),
                        entity: slot.entity.clone(),
                        alteration,
                        attrs: outcome.changes,
                        origin: None,
                    },
                });
            }
            t.dirty.insert(key);
        }
        Applied { changes, history }
    }

    /// The current state of every entity changed by [`Context::apply_units`]
    /// since the last call, for the caller to store.
    pub fn take_dirty(&self) -> Vec<EntityRecord> {
        let mut tenants = self.tenants.write();
        let Some(t) = tenants.get_mut(DEFAULT_TENANT) else {
            return Vec::new();
        };
        let dirty = std::mem::take(&mut t.dirty);
        dirty
            .iter()
            .filter_map(|key| t.entities.get(key))
            .map(|e| record(DEFAULT_TENANT, e))
            .collect()
    }
}

/// What [`Context::apply_units`] leaves the caller to do.
pub struct Applied {
    /// The entity changes, to announce once the units are committed.
    pub changes: Vec<PendingChange>,
    /// History rows of the changes, to store with the units.
    pub history: Vec<HistoryRow>,
}

/// A change made in memory whose commit is still to come: announce it
/// once committed, or drop it (and it is skipped).
#[derive(Debug)]
pub struct PendingChange {
    ticket: Ticket,
    change: EntityChange,
}

impl PendingChange {
    /// The change a write is making to `stored` (the entity after it),
    /// with the origin of the request being served.
    fn new(
        ticket: Ticket,
        tenant: &str,
        stored: StoredEntity,
        alteration: Alteration,
        attrs: Vec<AttrChange>,
    ) -> PendingChange {
        PendingChange {
            ticket,
            change: EntityChange {
                tenant: tenant.to_string(),
                service_path: stored.service_path,
                entity: stored.entity,
                alteration,
                attrs,
                origin: current_origin(),
            },
        }
    }

    /// The change's log entry, to commit with it, if a listener may come
    /// back to it ([`Ticket::log`]).
    pub fn log(&self) -> Option<LoggedChange> {
        self.ticket.log(&self.change)
    }

    /// Announces `pending` (if any), which the store has now committed,
    /// and waits as long as the listeners ask.
    async fn announce_and_wait(pending: Option<PendingChange>) {
        if let Some(pending) = pending {
            for wait in pending.announce() {
                wait.await;
            }
        }
    }

    /// Announces the change, which the store has now committed; returns
    /// the waits the listeners ask for.
    pub fn announce(self) -> Vec<Backpressure> {
        self.ticket.announce(self.change)
    }
}

/// Every attribute of a new entity, as created.
fn created_attrs(entity: &Entity) -> Vec<AttrChange> {
    entity
        .attrs
        .keys()
        .map(|name| AttrChange {
            name: name.to_string(),
            kind: ChangeKind::Created,
            previous: None,
            modified: true,
        })
        .collect()
}

/// The store's form of an entity.
fn record(tenant: &str, e: &StoredEntity) -> EntityRecord {
    EntityRecord {
        tenant: tenant.to_string(),
        service_path: e.service_path.clone(),
        id: e.entity.id.clone(),
        entity_type: e.entity.entity_type.clone(),
        created: e.created,
        json: e.entity.to_storage(),
    }
}

fn internal(e: weft_store::StoreError) -> NgsiError {
    tracing::error!(error = %e, "storing an entity failed");
    match e {
        weft_store::StoreError::Overloaded => NgsiError::new(
            503,
            "ServiceUnavailable",
            "the store is overloaded; retry later",
        ),
        _ => NgsiError::new(500, "InternalServerError", "internal error"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `q` and `mq` read the builtins even when a user attribute or
    /// metadata has their name (`0876_entity_dates`); `servicePath` is the
    /// entity's path.
    #[test]
    fn builtins_win_in_filters() {
        let mut e = weft_model::ngsi::parse_entity(
            &serde_json::json!({"id":"E","type":"T",
                "dateCreated":{"value":"2050-01-01","type":"DateTime"},
                "A":{"value":1,"metadata":{"dateModified":{"value":"2050-01-01","type":"DateTime"}}},
                "dateExpires":{"value":"2040-01-01","type":"DateTime"}}),
            false,
        )
        .unwrap();
        e.stamp_created(1_000);
        let r = EntityResolver(&e, "/a/b");
        let q = |text: &str| Query::parse(text).unwrap().matches_with(&r);
        let mq = |text: &str| Query::parse_mq(text).unwrap().matches_with(&r);
        assert!(q("dateCreated<2049-01-01"));
        assert!(!q("dateCreated>2049-01-01"));
        assert!(q("dateExpires==2040-01-01"));
        assert!(q("servicePath==/a/b"));
        assert!(!q("servicePath==/a"));
        assert!(mq("A.dateModified<2049-01-01"));
        assert!(mq("A.dateCreated==1970-01-01T00:00:01Z"));
    }

    /// A transient entity is live until its `dateExpires`, not from then on.
    #[test]
    fn expired_entities_are_not_live() {
        let mut entity = Entity::new("E", "T");
        entity.date_expires = Some(5_000);
        let stored = StoredEntity {
            service_path: "/".into(),
            entity: Arc::new(entity),
            created: 1,
        };
        assert!(stored.is_live(4_999));
        assert!(!stored.is_live(5_000));
    }

    #[test]
    fn service_path_patterns() {
        let p = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(path_matches(&[], "/a"));
        assert!(path_matches(&p(&["/#"]), "/a/b"));
        assert!(path_matches(&p(&["/a/#"]), "/a"));
        assert!(path_matches(&p(&["/a/#"]), "/a/b"));
        assert!(!path_matches(&p(&["/a/#"]), "/ab"));
        assert!(path_matches(&p(&["/a"]), "/a"));
        assert!(!path_matches(&p(&["/a"]), "/a/b"));
        assert!(path_matches(&p(&["/x", "/a"]), "/a"));
    }
}
