//! NGSI subscriptions at work: the registry behind `/v2/subscriptions`,
//! the matcher that sees every entity change, and the notifier.
//!
//! Flow: the [`Context`](crate::context::Context) announces each committed
//! change, in order, through [`Changes`](crate::changes::Changes)
//! ([`ChangeListener`]) → [`Subscriptions::on_change`] finds the
//! candidate subscriptions of the tenant (indexed by entity id; pattern
//! subscriptions are checked one by one), checks status, expiry, service
//! path, selectors, alteration type, condition attributes, expression and
//! throttling, renders the request ([`payload`]) and hands it to the
//! [`sender`], which never blocks the change: each endpoint has its own
//! bounded lanes, so one slow or dead endpoint delays only itself.
//! Outcomes come back as counters on the subscription (`timesSent`,
//! `lastSuccess`, `failsCounter`, …), which are stored every second.
//!
//! Subscriptions live in memory per tenant and in the store
//! (`ngsi_documents`), loaded at start. One created, changed or deleted
//! through another node is reloaded from the store as soon as that node
//! announces it ([`Follower`]). Each node notifies for the changes it
//! makes and counts its own notifications; every second it adds what it
//! counted to the stored counters in one transaction
//! ([`NotificationStats::merged`]), so the counters of every node add up
//! and an edit made meanwhile on another node is kept.
//!
//! A change made by a notification weft (or another broker) sent can
//! trigger notifications in turn; [`loops`] stops that from becoming a
//! loop, as Orion does.

pub mod expressions;
pub mod ld;
pub mod loops;
pub mod mqtt;
pub mod outbox;
pub mod payload;
pub mod sender;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use weft_bus::Bus;
use weft_model::ngsi::subscription::{
    AlterationType, Guarantee, NotificationStats, Status, Subscription,
};
use weft_model::ngsi::{new_document_id, NgsiError};
use weft_store::{DocumentKind, NgsiDocument, Store, StoreError};

use crate::context::{
    path_matches, Alteration, Backpressure, ChangeListener, EntityChange, EntityResolver,
};
use crate::definitions::{DefinitionChange, DefinitionKind, Follower, Reload};
use sender::{Enqueued, Outcome, Sender};

/// How often moved cursors are stored: what a crash may send again is
/// what was delivered since.
const CURSOR_INTERVAL: Duration = Duration::from_millis(200);
/// Every how many cursor saves changed counters are stored (every second).
const FLUSH_EVERY: u64 = 5;
/// Every how many cursor saves the change log is pruned (every 10 s).
const PRUNE_EVERY: u64 = 50;

/// Which API a subscription belongs to: each lists, reads, changes and
/// deletes only its own, though one registry matches and notifies both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `/v2/subscriptions`.
    NgsiV2,
    /// `/ngsi-ld/v1/subscriptions`.
    NgsiLd,
}

impl Api {
    /// Whether `sub` is this API's.
    pub fn owns(self, sub: &Subscription) -> bool {
        sub.is_ld() == (self == Api::NgsiLd)
    }
}

/// One subscription with where it belongs and what the notifier keeps.
pub struct Entry {
    tenant: String,
    /// Service-path patterns of the request that created it
    /// (`/#`-style; empty: every path).
    service_paths: Vec<String>,
    created: u64,
    state: Mutex<EntryState>,
    /// The counters as this node last read them from the store or stored
    /// them: what it counted since is the difference to the live ones,
    /// added to the stored counters by the next flush.
    stored: Mutex<NotificationStats>,
    /// Notifications waiting for room on the subscription's full lane, in
    /// order; later ones wait behind them ([`Sender::drain`]).
    parked: Mutex<std::collections::VecDeque<sender::Job>>,
    /// Held while the parked notifications are moved onto the lane.
    draining: tokio::sync::Mutex<()>,
}

struct EntryState {
    sub: Subscription,
    /// When it last notified, for throttling.
    last_fired: Option<Instant>,
    /// How its notifications are being delivered ([`outbox`]).
    delivery: outbox::Delivery,
}

impl Entry {
    /// An entry for `sub`, delivered as `delivery` says.
    fn new(
        tenant: String,
        service_paths: Vec<String>,
        created: u64,
        last_fired: Option<Instant>,
        sub: Subscription,
        delivery: outbox::Delivery,
    ) -> Arc<Entry> {
        Arc::new(Entry {
            tenant,
            service_paths,
            created,
            stored: Mutex::new(sub.notification.stats.clone()),
            state: Mutex::new(EntryState {
                sub,
                last_fired,
                delivery,
            }),
            parked: Mutex::default(),
            draining: tokio::sync::Mutex::new(()),
        })
    }

    fn id(&self) -> String {
        self.state.lock().sub.id.clone()
    }

    /// Records the outcome of one notification; returns the key to mark
    /// dirty.
    pub(crate) fn record(&self, outcome: Outcome) -> (String, String) {
        let now = weft_model::now_ms();
        let mut state = self.state.lock();
        let sub = &mut state.sub;
        let stats = &mut sub.notification.stats;
        match outcome {
            Outcome::Answered(code) => {
                stats.last_success = Some(now);
                stats.last_success_code = Some(code);
                stats.fails_counter = 0;
            }
            Outcome::Published => {
                stats.last_success = Some(now);
                stats.fails_counter = 0;
            }
            Outcome::Failed(reason) => {
                stats.last_failure = Some(now);
                stats.last_failure_reason = Some(reason);
                stats.fails_counter += 1;
                if sub
                    .notification
                    .max_fails_limit
                    .is_some_and(|limit| stats.fails_counter >= limit)
                {
                    sub.status = Status::Inactive;
                }
            }
        }
        (self.tenant.clone(), sub.id.clone())
    }
}

/// One tenant's subscriptions, indexed for matching.
#[derive(Default)]
struct TenantSubs {
    /// Id → entry.
    by_id: HashMap<String, Arc<Entry>>,
    /// Entity id → entries whose every selector names exact ids.
    by_entity: HashMap<String, Vec<Arc<Entry>>>,
    /// Entries with an `idPattern` selector: checked on every change.
    patterned: Vec<Arc<Entry>>,
}

impl TenantSubs {
    fn index(&mut self, entry: &Arc<Entry>) {
        let state = entry.state.lock();
        let ids: Option<Vec<String>> = state
            .sub
            .subject
            .entities
            .iter()
            .map(|s| s.id.clone())
            .collect();
        match ids {
            Some(ids) => {
                let mut seen = HashSet::new();
                for id in ids {
                    if seen.insert(id.clone()) {
                        self.by_entity.entry(id).or_default().push(entry.clone());
                    }
                }
            }
            None => self.patterned.push(entry.clone()),
        }
    }

    fn unindex(&mut self, entry: &Arc<Entry>) {
        self.patterned.retain(|e| !Arc::ptr_eq(e, entry));
        self.by_entity.retain(|_, list| {
            list.retain(|e| !Arc::ptr_eq(e, entry));
            !list.is_empty()
        });
    }

    fn candidates(&self, entity_id: &str) -> Vec<Arc<Entry>> {
        let mut out: Vec<Arc<Entry>> = self.patterned.clone();
        if let Some(list) = self.by_entity.get(entity_id) {
            out.extend(list.iter().cloned());
        }
        out.sort_by_key(|e| e.created);
        out
    }
}

/// Every tenant's subscriptions.
pub struct Subscriptions {
    store: Arc<dyn Store>,
    /// Where changes made through the API are announced to the other nodes.
    bus: Arc<dyn Bus>,
    tenants: RwLock<HashMap<String, TenantSubs>>,
    next_created: AtomicU64,
    sender: Arc<Sender>,
    /// Entries whose counters or status changed since the last flush.
    dirty: Dirty,
    /// Self-notification loop protection ([`loops`]).
    loops: loops::LoopGuard,
    /// The node whose change log this node serves its subscriptions from.
    node: String,
    /// The last change the matcher started on (every change up to it has
    /// been announced).
    entered: AtomicU64,
    /// The last change the matcher finished with.
    finished: AtomicU64,
    /// Itself, for the tasks it starts.
    me: std::sync::Weak<Subscriptions>,
}

/// (tenant, subscription id) of the entries whose counters or status
/// changed since they were last stored.
pub(crate) type Dirty = Mutex<HashSet<(String, String)>>;

impl Subscriptions {
    /// Records `outcome` on `entry`'s counters and marks them to be
    /// stored by the next flush: the one way a notification is counted.
    pub(crate) fn count(&self, entry: &Entry, outcome: Outcome) {
        let key = entry.record(outcome);
        self.dirty.lock().insert(key);
    }

    /// Loads the stored subscriptions and their cursors over `node`'s
    /// change log, whose last change is `head`; a subscription whose cursor
    /// is behind is served from the log first. Notifications go out on the
    /// current runtime.
    pub async fn load(
        store: Arc<dyn Store>,
        config: sender::SenderConfig,
        bus: Arc<dyn Bus>,
        node: &str,
        head: u64,
    ) -> Result<Arc<Subscriptions>, weft_store::StoreError> {
        let docs = store.load_documents(DocumentKind::Subscription).await?;
        let cursors: HashMap<(String, String), u64> = store
            .load_notification_cursors(node)
            .await?
            .into_iter()
            .map(|c| ((c.tenant, c.subscription), c.through))
            .collect();
        let mut behind = Vec::new();
        let mut tenants: HashMap<String, TenantSubs> = HashMap::new();
        let mut max = 0;
        for d in docs {
            let sub = match Subscription::from_storage(&d.json) {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(id = %d.id, error = %e, "stored subscription could not be read; skipped");
                    continue;
                }
            };
            max = max.max(d.created);
            let cursor = cursors.get(&(d.tenant.clone(), d.id.clone())).copied();
            let delivery = match cursor {
                Some(through)
                    if through < head && sub.notification.delivery == Guarantee::AtLeastOnce =>
                {
                    outbox::Delivery::from_log(through)
                }
                // Stored before the outbox existed: nothing is known owed.
                _ => outbox::Delivery::live(head),
            };
            let from_log = matches!(delivery.mode, outbox::Mode::FromLog { .. });
            let entry = Entry::new(
                d.tenant.clone(),
                split_paths(&d.service_path),
                d.created,
                fired_at(&sub.notification.stats),
                sub,
                delivery,
            );
            if from_log {
                behind.push(entry.clone());
            }
            let t = tenants.entry(d.tenant).or_default();
            t.by_id.insert(d.id, entry.clone());
            t.index(&entry);
        }
        let subscriptions = Arc::new_cyclic(|me| Subscriptions {
            store,
            bus,
            tenants: RwLock::new(tenants),
            next_created: AtomicU64::new(max + 1),
            sender: Arc::new(Sender::new(config, me.clone())),
            dirty: Dirty::default(),
            loops: loops::LoopGuard::default(),
            node: node.to_string(),
            entered: AtomicU64::new(head),
            finished: AtomicU64::new(head),
            me: me.clone(),
        });
        if !behind.is_empty() {
            tracing::info!(
                subscriptions = behind.len(),
                "serving subscriptions the notifications they are owed from the change log"
            );
        }
        for entry in behind {
            tokio::spawn(subscriptions.clone().serve_from_log(entry));
        }
        Ok(subscriptions)
    }

    /// Stores moved cursors every [`CURSOR_INTERVAL`] and changed
    /// counters every second until `shutdown`, then once more; prunes the
    /// change log every 10 s.
    pub async fn flush_loop(self: Arc<Self>, shutdown: CancellationToken) {
        let mut ticks = 0u64;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(CURSOR_INTERVAL) => {}
                _ = shutdown.cancelled() => {
                    self.save_cursors(false).await;
                    self.flush().await;
                    return;
                }
            }
            ticks += 1;
            self.save_cursors(ticks.is_multiple_of(PRUNE_EVERY)).await;
            if ticks.is_multiple_of(FLUSH_EVERY) {
                self.flush().await;
                self.report_metrics().await;
            }
        }
    }

    async fn flush(&self) {
        let dirty: Vec<(String, String)> = self.dirty.lock().drain().collect();
        for (tenant, id) in dirty {
            let entry = self
                .tenants
                .read()
                .get(&tenant)
                .and_then(|t| t.by_id.get(&id).cloned());
            if let Some(entry) = entry {
                if let Err(e) = self.persist(&entry, false).await {
                    tracing::warn!(error = %e, "storing subscription counters failed");
                }
            }
        }
    }

    /// Stores `entry`: its definition as this node holds it (`definition`:
    /// after a create or a patch) or as stored (a flush of counters), with
    /// the stored counters plus what this node counted since it last read
    /// them, in one transaction no other node's write comes between. The
    /// counters in memory become the merged ones (plus whatever was
    /// counted meanwhile). A flush of a subscription deleted meanwhile
    /// stores nothing.
    async fn persist(&self, entry: &Entry, definition: bool) -> Result<(), NgsiError> {
        let (local_sub, base) = {
            let s = entry.state.lock();
            (s.sub.clone(), entry.stored.lock().clone())
        };
        let local = local_sub.notification.stats.clone();
        // A `oneshot` that fired here became inactive in memory only.
        let went_inactive = local_sub.status == Status::Inactive;
        let id = local_sub.id.clone();
        let tenant = entry.tenant.clone();
        let service_path = entry.service_paths.join(",");
        let created = entry.created;
        let merge_base = base.clone();
        let merge_local = local.clone();
        let doc_tenant = tenant.clone();
        let merged = self
            .store
            .merge_document(
                DocumentKind::Subscription,
                &tenant,
                &id,
                Box::new(move |current| {
                    let stored_sub = current
                        .as_ref()
                        .and_then(|d| Subscription::from_storage(&d.json).ok());
                    let mut sub = if definition {
                        local_sub
                    } else {
                        stored_sub.clone()?
                    };
                    // The stored definition is kept, but a stored `oneshot`
                    // that fired here is inactive from then on, also after
                    // a restart (one re-armed since was reloaded here, so
                    // is `oneshot` in memory again).
                    if went_inactive && sub.status == Status::Oneshot {
                        sub.status = Status::Inactive;
                    }
                    let now = stored_sub.map(|s| s.notification.stats).unwrap_or_default();
                    sub.notification.stats = now.merged(&merge_base, &merge_local);
                    if sub
                        .notification
                        .max_fails_limit
                        .is_some_and(|limit| sub.notification.stats.fails_counter >= limit)
                    {
                        sub.status = Status::Inactive;
                    }
                    Some(NgsiDocument {
                        kind: DocumentKind::Subscription,
                        tenant: doc_tenant,
                        id: sub.id.clone(),
                        service_path: current.map_or(service_path, |d| d.service_path),
                        created,
                        json: sub.to_storage(),
                    })
                }),
            )
            .await
            .map_err(store_error)?;
        if let Some(doc) = merged {
            if let Ok(sub) = Subscription::from_storage(&doc.json) {
                let stats = sub.notification.stats;
                let mut state = entry.state.lock();
                // What was counted while this was stored stays counted.
                state.sub.notification.stats = stats.merged(&local, &state.sub.notification.stats);
                if sub.status == Status::Inactive {
                    state.sub.status = Status::Inactive;
                }
                *entry.stored.lock() = stats;
            }
        }
        Ok(())
    }

    /// Creates a subscription from a `POST /v2/subscriptions` body;
    /// `service_paths` are the request's (read-style) patterns. Returns
    /// the new id once stored.
    pub async fn create(
        &self,
        tenant: &str,
        service_paths: Vec<String>,
        body: &Value,
    ) -> Result<String, NgsiError> {
        let sub = Subscription::parse(body, new_document_id())?;
        self.insert(tenant, service_paths, sub).await
    }

    /// Adds `sub`, read by either API, to `tenant`: stored, then matched
    /// against every change from now on. An id the tenant has already is
    /// refused (409), checked and taken at once on this node.
    pub async fn insert(
        &self,
        tenant: &str,
        service_paths: Vec<String>,
        sub: Subscription,
    ) -> Result<String, NgsiError> {
        let id = sub.id.clone();
        // Owed every change announced from now on, also across a crash
        // before its cursor is first stored.
        let from = self.entered.load(Ordering::SeqCst);
        let mut delivery = outbox::Delivery::live(from);
        delivery.saved = Some(from);
        let entry = Entry::new(
            tenant.to_string(),
            service_paths,
            self.next_created.fetch_add(1, Ordering::Relaxed),
            None,
            sub,
            delivery,
        );
        {
            // Taken before it is stored; matched only once indexed.
            let mut tenants = self.tenants.write();
            let t = tenants.entry(tenant.to_string()).or_default();
            if t.by_id.contains_key(&id) {
                return Err(NgsiError::new(409, "AlreadyExists", "Already Exists"));
            }
            t.by_id.insert(id.clone(), entry.clone());
        }
        let stored = async {
            self.store
                .save_notification_cursors(
                    &self.node,
                    vec![weft_store::NotificationCursor {
                        tenant: tenant.to_string(),
                        subscription: id.clone(),
                        through: from,
                    }],
                )
                .await
                .map_err(store_error)?;
            self.persist(&entry, true).await
        };
        if let Err(e) = stored.await {
            if let Some(t) = self.tenants.write().get_mut(tenant) {
                t.by_id.remove(&id);
            }
            return Err(e);
        }
        if let Some(t) = self.tenants.write().get_mut(tenant) {
            t.index(&entry);
        }
        self.announce(tenant, &id);
        Ok(id)
    }

    /// With other nodes, takes the counters they stored for `tenant`'s
    /// subscriptions (plus what this node counted and has not stored), so
    /// a listing on any node shows what every node counted, up to their
    /// last flush (a second). Alone, the counters in memory are complete.
    pub async fn sync_counters(&self, tenant: &str) {
        if self.bus.node().is_none() {
            return;
        }
        let docs = match self.store.load_documents(DocumentKind::Subscription).await {
            Ok(docs) => docs,
            Err(e) => {
                tracing::warn!(error = %e, "reading other nodes' subscription counters failed");
                return;
            }
        };
        for d in docs.iter().filter(|d| d.tenant == tenant) {
            let Ok(sub) = Subscription::from_storage(&d.json) else {
                continue;
            };
            let Some(entry) = self.held(tenant, &d.id) else {
                continue;
            };
            let fresh = sub.notification.stats;
            let mut state = entry.state.lock();
            let mut stored = entry.stored.lock();
            state.sub.notification.stats = fresh.merged(&stored, &state.sub.notification.stats);
            *stored = fresh;
        }
    }

    /// Whether `tenant` has a subscription of either API.
    pub fn has_tenant(&self, tenant: &str) -> bool {
        self.tenants
            .read()
            .get(tenant)
            .is_some_and(|t| !t.by_id.is_empty())
    }

    /// Every NGSIv2 subscription of `tenant`, rendered, in creation
    /// order.
    pub fn list(&self, tenant: &str) -> Vec<Value> {
        let now = weft_model::now_ms();
        self.collect(tenant, Api::NgsiV2, |sub| Some(sub.render(now)))
    }

    /// What `view` makes of each subscription of `tenant` that `api`
    /// owns, in creation order (`None`s left out).
    pub fn collect<T>(
        &self,
        tenant: &str,
        api: Api,
        view: impl Fn(&Subscription) -> Option<T>,
    ) -> Vec<T> {
        let mut entries: Vec<Arc<Entry>> = self
            .tenants
            .read()
            .get(tenant)
            .map(|t| t.by_id.values().cloned().collect())
            .unwrap_or_default();
        entries.sort_by_key(|e| e.created);
        entries
            .iter()
            .filter_map(|e| {
                let state = e.state.lock();
                api.owns(&state.sub).then(|| view(&state.sub)).flatten()
            })
            .collect()
    }

    /// The subscription `id` of `tenant`, whichever API's.
    fn held(&self, tenant: &str, id: &str) -> Option<Arc<Entry>> {
        self.tenants
            .read()
            .get(tenant)
            .and_then(|t| t.by_id.get(id).cloned())
    }

    /// The subscription `id` of `tenant`, if `api` owns it.
    fn entry(&self, tenant: &str, id: &str, api: Api) -> Result<Arc<Entry>, NgsiError> {
        self.held(tenant, id)
            .filter(|e| api.owns(&e.state.lock().sub))
            .ok_or_else(not_found)
    }

    /// One NGSIv2 subscription, rendered.
    pub fn get(&self, tenant: &str, id: &str) -> Result<Value, NgsiError> {
        let now = weft_model::now_ms();
        self.read(tenant, id, Api::NgsiV2, |sub| sub.render(now))
    }

    /// What `view` makes of subscription `id` of `tenant`, if `api` owns
    /// it.
    pub fn read<T>(
        &self,
        tenant: &str,
        id: &str,
        api: Api,
        view: impl FnOnce(&Subscription) -> T,
    ) -> Result<T, NgsiError> {
        let entry = self.entry(tenant, id, api)?;
        let state = entry.state.lock();
        Ok(view(&state.sub))
    }

    /// Applies an NGSIv2 `PATCH` body; nothing changes if it is invalid.
    pub async fn patch(&self, tenant: &str, id: &str, body: &Value) -> Result<(), NgsiError> {
        self.update(tenant, id, Api::NgsiV2, |sub| {
            let mut next = sub.clone();
            next.patch(body)?;
            Ok(next)
        })
        .await
    }

    /// Replaces subscription `id` of `tenant`, if `api` owns it, by what
    /// `change` makes of it (its counters as they are then); nothing
    /// changes when `change` fails. Stored, re-indexed and announced.
    pub async fn update<E: From<NgsiError>>(
        &self,
        tenant: &str,
        id: &str,
        api: Api,
        change: impl FnOnce(&Subscription) -> Result<Subscription, E>,
    ) -> Result<(), E> {
        let entry = self.entry(tenant, id, api)?;
        {
            let mut state = entry.state.lock();
            let mut next = change(&state.sub)?;
            next.notification.stats = state.sub.notification.stats.clone();
            state.sub = next;
            state.last_fired = None;
        }
        {
            let mut tenants = self.tenants.write();
            if let Some(t) = tenants.get_mut(tenant) {
                t.unindex(&entry);
                t.index(&entry);
            }
        }
        self.persist(&entry, true).await?;
        self.announce(tenant, id);
        Ok(())
    }

    /// Deletes subscription `id` of `tenant`, if `api` owns it.
    pub async fn delete(&self, tenant: &str, id: &str, api: Api) -> Result<(), NgsiError> {
        let entry = {
            let mut tenants = self.tenants.write();
            let t = tenants.get_mut(tenant).ok_or_else(not_found)?;
            let owned = t
                .by_id
                .get(id)
                .is_some_and(|e| api.owns(&e.state.lock().sub));
            if !owned {
                return Err(not_found());
            }
            let entry = t.by_id.remove(id).ok_or_else(not_found)?;
            t.unindex(&entry);
            entry
        };
        self.dirty.lock().remove(&(tenant.to_string(), entry.id()));
        self.store
            .delete_document(DocumentKind::Subscription, tenant, id)
            .await
            .map_err(store_error)?;
        if let Err(e) = self.store.forget_notification_cursors(tenant, id).await {
            tracing::warn!(error = %e, "forgetting a deleted subscription's cursors failed");
        }
        self.announce(tenant, id);
        Ok(())
    }

    /// Tells the other nodes that subscription `id` of `tenant` changed.
    fn announce(&self, tenant: &str, id: &str) {
        self.bus.definition_changed(DefinitionChange::in_tenant(
            DefinitionKind::Subscription,
            tenant,
            id,
        ));
    }

    /// Decides whether `entry` fires for change `seq`; if so, updates its
    /// counters and returns the request to send.
    ///
    /// Live (`replay` `None`), a subscription served live fires for the
    /// changes after those it was served from the log. One served from
    /// the log while its receiver fails sends nothing live, but each
    /// change it would fire for counts as sent and failed, as each would
    /// on Orion (so `maxFailsLimit` means what it means there); the log
    /// sends it later without counting it again.
    ///
    /// Replaying in generation `Some(g)`, only a subscription still served
    /// from the log in that generation fires; a change counted already
    /// (it failed live, or was counted while the receiver failed) is not
    /// counted again, nor held back by throttling.
    fn fire(
        &self,
        entry: &Arc<Entry>,
        seq: u64,
        change: &EntityChange,
        now: i64,
        sequence: &mut u32,
        serving: outbox::Serving<'_>,
    ) -> Option<sender::Job> {
        if !path_matches(&entry.service_paths, &change.service_path) {
            return None;
        }
        let mut state = entry.state.lock();
        let delivery = &state.delivery;
        let counted = seq <= delivery.counted_through;
        let firing = match (serving, delivery.mode) {
            // Another node's log: as that node would have fired it.
            (outbox::Serving::Orphan(_), _) => outbox::Firing::Replay { counted: false },
            (outbox::Serving::Live, outbox::Mode::Live { from }) if seq > from => {
                outbox::Firing::Live
            }
            (outbox::Serving::Live, outbox::Mode::FromLog { .. }) => match &delivery.failing {
                Some(reason) if !counted => outbox::Firing::Behind(reason.clone()),
                _ => return None,
            },
            (outbox::Serving::Log(g), outbox::Mode::FromLog { .. }) if g == delivery.generation => {
                outbox::Firing::Replay { counted }
            }
            _ => return None,
        };
        let sub = &state.sub;
        if sub.status == Status::Inactive || sub.expired(now) {
            return None;
        }
        let entity = &change.entity;
        if !sub
            .subject
            .entities
            .iter()
            .any(|s| s.matches(&entity.id, &entity.entity_type))
        {
            return None;
        }
        let condition = &sub.subject.condition;
        let kind = match &sub.ld {
            Some(ld) => ld::fires(sub, ld, change)?,
            None => v2_fires(sub, change)?,
        };
        if let Some(e) = &condition.expression {
            let resolver = EntityResolver(entity, &change.service_path);
            if e.q.as_ref().is_some_and(|q| !q.matches_with(&resolver))
                || e.mq.as_ref().is_some_and(|q| !q.matches_with(&resolver))
                || e.geo.as_ref().is_some_and(|g| {
                    !crate::context::location(entity).is_some_and(|s| g.matches(&s))
                })
            {
                return None;
            }
        }
        let trigger = payload::Trigger {
            sub,
            tenant: &change.tenant,
            service_path: &change.service_path,
            entity,
            touched: &change.attrs,
            alteration: kind,
            origin: change.origin.as_ref(),
            sequence: *sequence + 1,
        };
        if let Some(e) = &condition.jexl_expression {
            if !weft_model::jexl::holds(e, &trigger.source().context()) {
                return None;
            }
        }
        let counted = matches!(firing, outbox::Firing::Replay { counted: true });
        if let (Some(t), Some(last), false) = (sub.throttling, state.last_fired, counted) {
            if t > 0.0 && last.elapsed() < Duration::from_secs_f64(t) {
                return None;
            }
        }
        if let outbox::Firing::Behind(reason) = firing {
            *sequence += 1;
            state.last_fired = Some(Instant::now());
            state.delivery.counted_through = seq;
            let stats = &mut state.sub.notification.stats;
            stats.times_sent += 1;
            stats.last_notification = Some(now);
            drop(state);
            self.count(entry, Outcome::Failed(reason));
            return None;
        }
        let request = match payload::build(&trigger) {
            Err(payload::NotSent::Skipped) => return None,
            Err(payload::NotSent::Failed(reason)) => Err(reason),
            Ok(mut request) => {
                if self.sender.config().id_header && request.mqtt.is_none() {
                    let node = match serving {
                        outbox::Serving::Orphan(node) => node,
                        _ => self.node.as_str(),
                    };
                    request.headers.push((
                        sender::NOTIFICATION_ID_HEADER.to_string(),
                        notification_id(&sub.id, node, seq),
                    ));
                }
                Ok(request)
            }
        };
        *sequence += 1;
        if !counted {
            state.last_fired = Some(Instant::now());
            let sub = &mut state.sub;
            sub.notification.stats.times_sent += 1;
            sub.notification.stats.last_notification = Some(now);
            if sub.status == Status::Oneshot {
                sub.status = Status::Inactive;
            }
        }
        let sub = &state.sub;
        let timeout = sub.notification.endpoint.timeout();
        let lane_key = sub.id.clone();
        let generation = state.delivery.generation;
        // At most once, nothing is tracked: a failure is only counted.
        if request.is_ok()
            && serving == outbox::Serving::Live
            && sub.notification.delivery == Guarantee::AtLeastOnce
        {
            state.delivery.in_flight.push_back((seq, now));
        }
        drop(state);
        match request {
            Ok(request) => Some(sender::Job {
                request,
                timeout,
                lane_key,
                entry: entry.clone(),
                seq,
                generation,
            }),
            Err(reason) => {
                self.count(entry, Outcome::Failed(reason));
                None
            }
        }
    }
}

impl Subscriptions {
    /// Fires the candidates of change `seq` and queues their
    /// notifications; answers the subscriptions whose notifications wait
    /// for room.
    fn match_change(&self, seq: u64, change: &EntityChange) -> Vec<Arc<Entry>> {
        let candidates = match self.tenants.read().get(change.tenant.as_str()) {
            Some(t) => t.candidates(&change.entity.id),
            None => return Vec::new(),
        };
        // Every change is noted (the entity's last correlator), also
        // those no subscription is about.
        if self.loops.check(change).is_some() {
            return Vec::new();
        }
        let now = weft_model::now_ms();
        let mut sequence = 0;
        let mut parked = Vec::new();
        for entry in &candidates {
            let Some(job) = self.fire(
                entry,
                seq,
                change,
                now,
                &mut sequence,
                outbox::Serving::Live,
            ) else {
                continue;
            };
            let key = (entry.tenant.clone(), job.lane_key.clone());
            match self.sender.enqueue(job) {
                Enqueued::Queued => {}
                Enqueued::Parked => parked.push(entry.clone()),
                Enqueued::Refused(job, reason) => self.refused(entry, &job, reason),
            }
            self.dirty.lock().insert(key);
        }
        parked
    }
}

impl ChangeListener for Subscriptions {
    fn interested(&self, tenant: &str) -> bool {
        self.tenants
            .read()
            .get(tenant)
            .is_some_and(|t| !t.by_id.is_empty())
    }

    fn durable(&self, tenant: &str) -> bool {
        self.interested(tenant)
    }

    fn on_change(&self, seq: u64, change: &EntityChange) -> Option<Backpressure> {
        self.entered.fetch_max(seq, Ordering::SeqCst);
        let full = self.match_change(seq, change);
        self.finished.fetch_max(seq, Ordering::SeqCst);
        if full.is_empty() {
            return None;
        }
        let sender = self.sender.clone();
        Some(Box::pin(async move {
            for entry in full {
                sender.drain(&entry).await;
            }
        }))
    }
}

impl Follower for Subscriptions {
    const KINDS: &'static [DefinitionKind] = &[DefinitionKind::Subscription];

    /// Takes the stored definition of each subscription named (re-indexed,
    /// throttling restarted), keeping this node's unstored counters;
    /// drops those the store no longer has. An unchanged one (this node's
    /// own counters coming back) is left alone.
    async fn reload(&self, what: &Reload) -> Result<(), StoreError> {
        // Entries created here from now on are not in the listing below.
        let horizon = self.next_created.load(Ordering::Relaxed);
        let docs = self
            .store
            .load_documents(DocumentKind::Subscription)
            .await?;
        let mut seen = HashSet::new();
        for d in docs {
            if !what.covers(DefinitionKind::Subscription, &d.tenant, &d.id) {
                continue;
            }
            seen.insert((d.tenant.clone(), d.id.clone()));
            let sub = match Subscription::from_storage(&d.json) {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(id = %d.id, error = %e, "stored subscription could not be read; skipped");
                    continue;
                }
            };
            self.next_created
                .fetch_max(d.created + 1, Ordering::Relaxed);
            let existing = self
                .tenants
                .read()
                .get(&d.tenant)
                .and_then(|t| t.by_id.get(&d.id).cloned());
            let entry = match existing {
                Some(entry) => {
                    let mut state = entry.state.lock();
                    if state.sub.to_storage() == d.json {
                        continue;
                    }
                    // The stored counters, plus what this node counted and
                    // has not stored yet.
                    let mut sub = sub;
                    let fresh = sub.notification.stats.clone();
                    let mut stored = entry.stored.lock();
                    sub.notification.stats = fresh.merged(&stored, &state.sub.notification.stats);
                    *stored = fresh;
                    drop(stored);
                    let definition_changed = {
                        let mut a = state.sub.clone();
                        a.notification.stats = sub.notification.stats.clone();
                        a.to_storage() != sub.to_storage()
                    };
                    state.sub = sub;
                    if definition_changed {
                        state.last_fired = None;
                    }
                    drop(state);
                    entry
                }
                None => Entry::new(
                    d.tenant.clone(),
                    split_paths(&d.service_path),
                    d.created,
                    fired_at(&sub.notification.stats),
                    sub,
                    outbox::Delivery::live(self.entered.load(Ordering::SeqCst)),
                ),
            };
            let mut tenants = self.tenants.write();
            let t = tenants.entry(d.tenant).or_default();
            t.unindex(&entry);
            t.by_id.insert(d.id, entry.clone());
            t.index(&entry);
        }
        let mut tenants = self.tenants.write();
        for (tenant, t) in tenants.iter_mut() {
            let gone: Vec<String> = t
                .by_id
                .iter()
                .filter(|(id, e)| {
                    what.covers(DefinitionKind::Subscription, tenant, id)
                        && e.created < horizon
                        && !seen.contains(&(tenant.clone(), (*id).clone()))
                })
                .map(|(id, _)| id.clone())
                .collect();
            for id in gone {
                if let Some(entry) = t.by_id.remove(&id) {
                    t.unindex(&entry);
                }
                self.dirty.lock().remove(&(tenant.clone(), id));
            }
        }
        Ok(())
    }
}

/// Whether `change` fires the NGSIv2 subscription `sub`, and as what
/// kind of change: its `alterationTypes` (entity created, updated or
/// changed, deleted) and `condition.attrs`.
fn v2_fires(sub: &Subscription, change: &EntityChange) -> Option<AlterationType> {
    let condition = &sub.subject.condition;
    let entity = &change.entity;
    // `condition.attrs` (empty: any) must name one of `names`.
    let attrs_match = |names: &[&str]| {
        condition.attrs.is_empty() || names.iter().any(|n| condition.attrs.iter().any(|a| a == n))
    };
    match change.alteration {
        Alteration::Created => {
            let names: Vec<&str> = entity.attrs.keys().collect();
            (condition.wants(AlterationType::EntityCreate) && attrs_match(&names))
                .then_some(AlterationType::EntityCreate)
        }
        // `condition.attrs` does not apply to deletions.
        Alteration::Deleted => condition
            .wants(AlterationType::EntityDelete)
            .then_some(AlterationType::EntityDelete),
        Alteration::Updated => {
            let changed: Vec<&str> = change
                .attrs
                .iter()
                .filter(|c| {
                    c.modified
                        && (condition.notify_on_metadata_change
                            || c.value_changed(entity.attrs.get(&c.name)))
                })
                .map(|c| c.name.as_str())
                .collect();
            let all: Vec<&str> = change.attrs.iter().map(|c| c.name.as_str()).collect();
            // What happened: a change if anything changed.
            let happened = if changed.is_empty() {
                AlterationType::EntityUpdate
            } else {
                AlterationType::EntityChange
            };
            // `entityChange` looks at the changed attributes;
            // `entityUpdate` at every attribute of the update.
            let as_change = happened == AlterationType::EntityChange
                && condition.wants(AlterationType::EntityChange)
                && attrs_match(&changed);
            let as_update = condition.wants(AlterationType::EntityUpdate) && attrs_match(&all);
            (as_change || as_update).then_some(happened)
        }
    }
}

/// The id of the notification of change `seq` of `node`'s log for
/// subscription `id` ([`sender::NOTIFICATION_ID_HEADER`]).
fn notification_id(id: &str, node: &str, seq: u64) -> String {
    if node.is_empty() {
        format!("{id}-{seq}")
    } else {
        format!("{id}-{node}-{seq}")
    }
}

/// When a stored subscription last notified (its `lastNotification`), as
/// the `Instant` throttling counts from, so a restart (or another node's
/// notification, on a node loading it anew) does not reopen the window.
fn fired_at(stats: &NotificationStats) -> Option<Instant> {
    let last = stats.last_notification?;
    let ago = weft_model::now_ms().saturating_sub(last).max(0);
    Instant::now().checked_sub(Duration::from_millis(u64::try_from(ago).ok()?))
}

fn split_paths(s: &str) -> Vec<String> {
    s.split(',')
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect()
}

fn not_found() -> NgsiError {
    NgsiError::new(
        404,
        "NotFound",
        "The requested subscription has not been found. Check id",
    )
}

fn store_error(e: weft_store::StoreError) -> NgsiError {
    tracing::error!(error = %e, "storing a subscription failed");
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
mod tests;
