//! History: every entity change recorded as time-series rows, and
//! QuantumLeap's notifications stored the same way.
//!
//! Rows never go straight into the history. Entity changes queue theirs in
//! the changes feed in the same transaction as the change itself (a
//! created entity all its attributes, an update the attributes it touched,
//! under the entity's time index, [`weft_model::history::time_index`]);
//! notifications queue theirs in the notifications feed of the history's
//! own file, and their 200 waits only for that sequential append. One
//! [`History::feed_loop`] per feed moves the rows into the history (and
//! its minute/hour rollups) in large key-ordered batches: a batch dirties
//! each series' last page once however many rows it adds, which is what
//! makes tens of thousands of rows per second cheap. A restart resumes
//! from what is left in the feeds; rows are keyed by (tenant, entity,
//! attribute, time index, instance), the instance fixed when the rows are
//! queued, so moving an entry again stores nothing twice, while every
//! notification is a row of its own (as in QuantumLeap), even two of one
//! entity filed under the same time index.
//!
//! Queries call [`History::settle`] first: it moves what was notified
//! before them, so a client that got its 200 reads its rows back.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify};
use weft_bus::{Bus, DefinitionChange, DefinitionKind};
use weft_model::history::notified::NotifiedEntity;
use weft_model::history::numeric;
use weft_model::ngsi::Entity;
use weft_store::{
    FeedStateRef, HistoryCutoffs, HistoryFeed, HistoryRow, HistoryStates, Store, StoreError,
};

use tokio_util::sync::CancellationToken;

/// How often a write the store refused as overloaded is tried again.
const OVERLOADED_RETRIES: u32 = 50;

/// Most rows one move takes from a feed (what the mover holds in memory
/// at once); the store decides how they are committed.
const FEED_BATCH_ROWS: usize = 200_000;

/// Most notification feed positions a node that moves the feed
/// acknowledges ahead of its mover (about two seconds of notifications at
/// full speed): past them, new notifications wait for the mover before
/// they are queued, so a backend that queues them apart from the moves
/// (PostgreSQL) does not let the feed, and the time until a query sees
/// them, grow without bound.
const MAX_UNMOVED: u64 = 50_000;

/// Longest a notification waits for the mover to catch up before it is
/// queued anyway (reached only when moves keep failing).
const UNMOVED_WAIT: Duration = Duration::from_secs(10);

/// How long a feed loop sleeps when its feed is empty.
const FEED_IDLE: Duration = Duration::from_millis(20);

/// Consumed changes-feed entries are pruned once this many have piled up.
const FEED_PRUNE_EVERY: u64 = 1_000;

/// How long [`History::settle`] waits for the feed loop before reading
/// anyway (only reached when the history writer is failing).
const SETTLE_TIMEOUT: Duration = Duration::from_secs(10);

/// How a node that does not move a feed waits for the node that does:
/// asks the store (`moved`) every [`FEED_IDLE`] until it answers yes, an
/// error, or [`SETTLE_TIMEOUT`] (then the query answers without them).
/// `what` names the feed's entries in the warnings.
async fn wait_in_store<F, Fut>(what: &str, mut moved: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool, StoreError>>,
{
    let deadline = tokio::time::Instant::now() + SETTLE_TIMEOUT;
    loop {
        match moved().await {
            Ok(true) => return,
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(error = %e, "asking the store whether history {what} are moved failed; answering without them");
                return;
            }
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!("history {what} not moved in time; answering without them");
            return;
        }
        tokio::time::sleep(FEED_IDLE).await;
    }
}

/// How long one tenant's history is kept.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retention {
    /// Rows and rollups older than this are deleted. `None`: kept.
    pub keep: Option<Duration>,
    /// Rows older than this are deleted while their minute and hour
    /// rollups stay (until `keep`): aggregates still answer for old
    /// ranges, raw values do not. `None`: rows are kept as long as
    /// rollups.
    pub downsample_after: Option<Duration>,
}

impl Retention {
    /// The cutoffs at `now` (epoch ms): rows before the first, rollup
    /// buckets ending by the second, are expired.
    pub fn cutoffs(&self, now: i64) -> (Option<i64>, Option<i64>) {
        let before =
            |d: Duration| now.saturating_sub(i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let rollups = self.keep.map(before);
        let rows = match (self.downsample_after.map(before), rollups) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        (rows, rollups)
    }
}

/// Retention of every tenant: its own, or the default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetentionPolicy {
    /// For tenants without their own (the default tenant included).
    pub default: Retention,
    /// Per tenant (lower-case name, as `Fiware-Service` selects it).
    pub tenants: std::collections::HashMap<String, Retention>,
    /// How often expired history is deleted.
    pub interval: Duration,
}

impl RetentionPolicy {
    /// The retention of `tenant`.
    pub fn of(&self, tenant: &str) -> Retention {
        self.tenants.get(tenant).copied().unwrap_or(self.default)
    }

    /// Whether any tenant's history ever expires.
    fn expires(&self) -> bool {
        self.default != Retention::default()
            || self.tenants.values().any(|r| *r != Retention::default())
    }
}

/// The history recorder.
pub struct History {
    store: Arc<dyn Store>,
    /// What expires when.
    retention: RetentionPolicy,
    /// Position of the last notification entry acknowledged as queued.
    notified: AtomicU64,
    /// Position through which the notifications feed has been moved.
    moved: watch::Sender<u64>,
    /// Wakes the notifications feed loop before its interval is over.
    wake: Notify,
    /// Position through which the changes feed has been moved, every
    /// partition of it, as far as this node's loop knows: kept only while
    /// this node moves every partition ([`History::move_changes`]).
    changes_moved: watch::Sender<u64>,
    /// Wakes the changes feed loop before its interval is over.
    wake_changes: Notify,
    /// Whether this node moves every partition of the changes feed now:
    /// then [`History::settle`] waits on [`History::changes_moved`], else
    /// it asks the store.
    moving_all_changes: std::sync::atomic::AtomicBool,
    /// Set by a query waiting on [`History::changes_moved`]: the next move
    /// first reads the newest queued change, so entries moved before this
    /// node took every partition (by another node, or before a restart)
    /// count as moved once the move finds nothing older waiting.
    changes_probe: std::sync::atomic::AtomicBool,
    /// Whether the notifications left in the feed by the previous run
    /// (queued, acknowledged, not yet moved when it stopped) are moved.
    recovered: watch::Sender<bool>,
    /// Whether this node moves the feeds now (it holds history's lease);
    /// when not, [`History::settle`] asks the store instead.
    moving: std::sync::atomic::AtomicBool,
    /// Whether other nodes may queue notifications too: then
    /// [`History::settle`] always asks the store.
    clustered: std::sync::atomic::AtomicBool,
    /// Where a query that waits for other nodes' movers rings them
    /// ([`DefinitionKind::HistoryWanted`]); unset on one node.
    movers: std::sync::OnceLock<Arc<dyn Bus>>,
    /// When this node last rang the other nodes' movers (epoch ms).
    rang_at: AtomicI64,
}

impl History {
    /// A recorder writing through `store`, expiring per `retention`.
    pub fn new(store: Arc<dyn Store>, retention: RetentionPolicy) -> Arc<History> {
        Arc::new(History {
            store,
            retention,
            notified: AtomicU64::new(0),
            moved: watch::Sender::new(0),
            wake: Notify::new(),
            changes_moved: watch::Sender::new(0),
            wake_changes: Notify::new(),
            moving_all_changes: std::sync::atomic::AtomicBool::new(false),
            changes_probe: std::sync::atomic::AtomicBool::new(false),
            recovered: watch::Sender::new(false),
            moving: std::sync::atomic::AtomicBool::new(false),
            clustered: std::sync::atomic::AtomicBool::new(false),
            movers: std::sync::OnceLock::new(),
            rang_at: AtomicI64::new(0),
        })
    }

    /// Lets queries on this node ring the other nodes' movers through
    /// `bus` when they wait for changes those nodes move.
    pub fn ring_movers_through(&self, bus: Arc<dyn Bus>) {
        let _ = self.movers.set(bus);
    }

    /// Asks the nodes moving partitions of the changes feed to move now
    /// (at most once per [`FEED_IDLE`] from this node: queries waiting at
    /// once share the ring).
    fn ring_movers(&self) {
        let Some(bus) = self.movers.get() else {
            return;
        };
        let now = weft_model::now_ms();
        let idle = FEED_IDLE.as_millis() as i64;
        let last = self.rang_at.load(Ordering::Acquire);
        if now - last < idle
            || self
                .rang_at
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            return;
        }
        bus.definition_changed(DefinitionChange::new(DefinitionKind::HistoryWanted, ""));
    }

    /// Says whether other nodes share the store (and queue notifications
    /// this node does not count).
    pub fn set_clustered(&self, clustered: bool) {
        self.clustered.store(clustered, Ordering::Relaxed);
    }

    /// Moves `feed` (of the changes feed, partitions `parts`) into the
    /// history until `shutdown`: one store move after another
    /// ([`HistoryStore::move_history_feed`], which decides how a move is
    /// committed and how long to wait before the next), pruning consumed
    /// changes-feed entries now and then.
    ///
    /// [`HistoryStore::move_history_feed`]: weft_store::HistoryStore::move_history_feed
    async fn feed_loop(
        self: Arc<Self>,
        feed: HistoryFeed,
        parts: &[u16],
        shutdown: CancellationToken,
    ) {
        let mut pruned = 0;
        // Changes-feed partitions moved since the last pruning, and how far.
        let mut unpruned: std::collections::BTreeMap<u16, u64> = Default::default();
        let expires = self.retention.expires();
        let all_changes =
            feed == HistoryFeed::Changes && self.moving_all_changes.load(Ordering::Acquire);
        loop {
            if shutdown.is_cancelled() {
                return;
            }
            // Asked for by a query: the newest change queued before this
            // move reads the feed (`None`: not asked, or nothing queued).
            let newest_before = if all_changes && self.changes_probe.swap(false, Ordering::AcqRel) {
                match self.store.newest_queued_change().await {
                    Ok(newest) => newest,
                    Err(e) => {
                        tracing::warn!(error = %e, "asking the store for queued changes failed");
                        None
                    }
                }
            } else {
                None
            };
            // Rows already past their tenant's raw retention would be
            // deleted at once, and a replay of them would count twice in
            // the rollups: they are consumed, not stored.
            let now = weft_model::now_ms();
            let keep = |r: &FeedStateRef<'_>| {
                !expires || {
                    let (rows_before, _) = self.retention.of(r.tenant).cutoffs(now);
                    rows_before.is_none_or(|cutoff| r.time >= cutoff)
                }
            };
            let moved = match self
                .store
                .move_history_feed(feed, parts, FEED_BATCH_ROWS, &keep)
                .await
            {
                Ok(moved) => moved,
                Err(e) => {
                    tracing::warn!(error = %e, "moving the history feed failed; retrying");
                    let wait = match e {
                        StoreError::Overloaded => Duration::from_millis(50),
                        _ => Duration::from_secs(1),
                    };
                    if self.pause(feed, &shutdown, wait).await {
                        return;
                    }
                    continue;
                }
            };
            if all_changes && !moved.more {
                // Everything queued before the move was read has been moved.
                let through = moved.through.max(newest_before);
                if let Some(through) = through {
                    self.changes_moved.send_if_modified(|m| {
                        let newer = through > *m;
                        *m = (*m).max(through);
                        newer
                    });
                }
            }
            let Some(through) = moved.through else {
                if feed == HistoryFeed::Notifications {
                    self.recovered.send_replace(true);
                }
                if self.pause(feed, &shutdown, FEED_IDLE).await {
                    return;
                }
                continue;
            };
            metrics::counter!("weft_history_rows_recorded_total").increment(moved.rows);
            for (part, seq) in &moved.consumed {
                unpruned.insert(*part, *seq);
            }
            if feed == HistoryFeed::Notifications {
                self.moved.send_replace(through);
                if !moved.more {
                    self.recovered.send_replace(true);
                }
            }
            if feed == HistoryFeed::Changes && through.saturating_sub(pruned) >= FEED_PRUNE_EVERY {
                let consumed: Vec<(u16, u64)> = unpruned.iter().map(|(p, s)| (*p, *s)).collect();
                match self.store.prune_history_feed(&consumed).await {
                    Ok(_) => {
                        pruned = through;
                        unpruned.clear();
                    }
                    Err(e) => tracing::warn!(error = %e, "pruning the history feed failed"),
                }
            }
            if !moved.pause.is_zero() && self.pause(feed, &shutdown, moved.pause).await {
                return;
            }
        }
    }

    /// Deletes expired history every [`RetentionPolicy::interval`] until
    /// `shutdown` (nothing to do, and no loop, when nothing expires).
    pub async fn retention_loop(self: Arc<Self>, shutdown: CancellationToken) {
        if !self.retention.expires() {
            return;
        }
        loop {
            if let Err(e) = self.expire_once().await {
                tracing::warn!(error = %e, "expiring history failed; retrying later");
            }
            tokio::select! {
                _ = tokio::time::sleep(self.retention.interval) => {}
                _ = shutdown.cancelled() => return,
            }
        }
    }

    /// One pass of [`History::retention_loop`]: every tenant's cutoffs in
    /// one call, so the store can drop time ranges no tenant keeps whole.
    async fn expire_once(&self) -> Result<(), StoreError> {
        let now = weft_model::now_ms();
        let cutoffs: Vec<HistoryCutoffs> = self
            .store
            .history_tenants()
            .await?
            .into_iter()
            .filter_map(|tenant| {
                let (rows_before, rollups_before) = self.retention.of(&tenant).cutoffs(now);
                (rows_before.is_some() || rollups_before.is_some()).then_some(HistoryCutoffs {
                    tenant,
                    rows_before,
                    rollups_before,
                })
            })
            .collect();
        if cutoffs.is_empty() {
            return Ok(());
        }
        let n = self.store.expire_history(&cutoffs).await?;
        if n > 0 {
            metrics::counter!("weft_history_expired_total").increment(n);
            tracing::debug!(tenants = cutoffs.len(), deleted = n, "expired history");
        }
        Ok(())
    }

    /// Sleeps `d` (a feed's loop wakes early when a query settles);
    /// `true` if `shutdown` came first.
    async fn pause(&self, feed: HistoryFeed, shutdown: &CancellationToken, d: Duration) -> bool {
        let woken = async {
            match feed {
                HistoryFeed::Notifications => self.wake.notified().await,
                HistoryFeed::Changes => self.wake_changes.notified().await,
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(d) => false,
            _ = woken => false,
            _ = shutdown.cancelled() => true,
        }
    }

    /// Waits until every notification acknowledged so far, and every
    /// entity change committed so far, is in the history, so a query sees
    /// what its client was told is stored.
    pub async fn settle(&self) {
        tokio::join!(self.settle_notifications(), self.settle_changes());
    }

    /// Waits until the changes feed is moved through its newest entry
    /// (queued by any node), every partition of it: the changes mover
    /// pauses between moves to make them large, and a query wakes it
    /// instead of waiting the pause out.
    async fn settle_changes(&self) {
        let newest = match self.store.newest_queued_change().await {
            Ok(Some(seq)) => seq,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(error = %e, "asking the store for queued changes failed; answering without them");
                return;
            }
        };
        let all_here = self.moving_all_changes.load(Ordering::Acquire);
        if all_here && *self.changes_moved.borrow() >= newest {
            return;
        }
        if all_here {
            self.changes_probe.store(true, Ordering::Release);
        }
        self.wake_changes.notify_one();
        if all_here {
            let mut moved = self.changes_moved.subscribe();
            let settled = moved.wait_for(|m| *m >= newest);
            if tokio::time::timeout(SETTLE_TIMEOUT, settled).await.is_err() {
                tracing::warn!("history changes not moved in time; answering without them");
            }
            return;
        }
        // Other nodes move (some of) the partitions: their cursors in the
        // store say how far; unless that is far enough already, they are
        // rung to move now rather than after their pause.
        match self.store.changes_moved_through(newest).await {
            Ok(true) => return,
            Ok(false) => self.ring_movers(),
            Err(_) => {}
        }
        wait_in_store("changes", || async {
            self.store.changes_moved_through(newest).await
        })
        .await;
    }

    /// Waits until every notification acknowledged so far is in the
    /// history.
    async fn settle_notifications(&self) {
        let target = self.notified.load(Ordering::Acquire);
        if !self.moving.load(Ordering::Acquire) || self.clustered.load(Ordering::Relaxed) {
            return self.settle_in_store().await;
        }
        if *self.moved.borrow() >= target && *self.recovered.borrow() {
            return;
        }
        let mut moved = self.moved.subscribe();
        let mut recovered = self.recovered.subscribe();
        self.wake.notify_one();
        let settled = async {
            let _ = recovered.wait_for(|r| *r).await;
            let _ = moved.wait_for(|m| *m >= target).await;
        };
        if tokio::time::timeout(SETTLE_TIMEOUT, settled).await.is_err() {
            tracing::warn!("history notifications not moved in time; answering without them");
        }
    }

    /// [`History::settle`] through the store, on a node that does not move
    /// the feeds or shares them with other nodes: waits until every
    /// notification queued when it was called (by any node, by this node
    /// before a restart) has been moved.
    async fn settle_in_store(&self) {
        let newest = match self.store.newest_queued_notification().await {
            Ok(Some(seq)) => seq,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(error = %e, "asking the store for queued notifications failed; answering without them");
                return;
            }
        };
        self.wake.notify_one();
        wait_in_store("notifications", || async {
            Ok(!self.store.notifications_queued_through(newest).await?)
        })
        .await;
    }

    /// Runs what history's lease holder does until `stop`: moving the
    /// notifications feed into the history, and retention.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        self.moving.store(true, Ordering::Release);
        tokio::join!(
            self.clone().retention_loop(stop.clone()),
            self.clone()
                .feed_loop(HistoryFeed::Notifications, &[], stop),
        );
        self.moving.store(false, Ordering::Release);
    }

    /// Moves partitions `parts` of the changes feed into the history until
    /// `stop`: what a node does with the changes-feed partitions it holds
    /// (each partition's entities are no other node's, so nodes move
    /// theirs side by side). Holding every partition (one node, or the
    /// only one left), it follows how far the whole feed is moved itself,
    /// and queries wait on it without asking the store.
    pub async fn move_changes(self: Arc<Self>, parts: Arc<[u16]>, stop: CancellationToken) {
        let all = parts.len() >= usize::from(self.store.change_feed_partitions().max(1));
        self.moving_all_changes.store(all, Ordering::Release);
        if all {
            // What was moved before is known again only from the store.
            self.changes_probe.store(true, Ordering::Release);
        }
        self.clone()
            .feed_loop(HistoryFeed::Changes, &parts, stop)
            .await;
        self.moving_all_changes.store(false, Ordering::Release);
    }

    /// On the node that moves the notifications feed, waits while it holds
    /// more than [`MAX_UNMOVED`] positions not yet moved (waking the
    /// mover): acknowledgements go no faster than the history takes them,
    /// give or take that much.
    async fn keep_up(&self) {
        if !self.moving.load(Ordering::Acquire) {
            return;
        }
        let caught_up = |moved: &u64| {
            self.notified.load(Ordering::Acquire).saturating_sub(*moved) <= MAX_UNMOVED
        };
        if caught_up(&self.moved.borrow()) {
            return;
        }
        self.wake.notify_one();
        let mut moved = self.moved.subscribe();
        if tokio::time::timeout(UNMOVED_WAIT, moved.wait_for(caught_up))
            .await
            .is_err()
        {
            tracing::warn!("the history mover is behind; queueing a notification anyway");
        }
    }

    /// Stores the entities of a notification (QuantumLeap's `/v2/notify`),
    /// read as QuantumLeap reads them, each under its own time index
    /// ([`NotifiedEntity::time_index`]): durable in the notifications feed on
    /// return, in the history at the feed loop's next move (within the
    /// store's pacing, [`weft_store::FeedMove::pause`], or at the next
    /// query). Returns how many rows were queued.
    pub async fn record_entities(
        &self,
        tenant: &str,
        service_path: &str,
        entities: &[NotifiedEntity],
        time_index_attr: Option<&str>,
        arrival: i64,
    ) -> Result<u64, StoreError> {
        // Encoded here, on the request's task, straight from the entities
        // (as a change's states are): no row per attribute is built, and
        // a retry resends the same bytes.
        let mut states = HistoryStates::default();
        let mut count = 0;
        for n in entities {
            let time = n.time_index(time_index_attr, arrival);
            let e = &n.entity;
            count += e.attrs.len() as u64;
            push_entity_state(&mut states, tenant, service_path, e, e.attrs.keys(), time);
        }
        if count == 0 {
            return Ok(0);
        }
        self.keep_up().await;
        let seq = retry_overloaded(|| self.store.queue_history(&states)).await?;
        self.notified.fetch_max(seq, Ordering::AcqRel);
        Ok(count)
    }
}

impl crate::definitions::Follower for History {
    const KINDS: &'static [DefinitionKind] = &[DefinitionKind::HistoryWanted];

    /// A query on another node waits for the changes feed: the loop moving
    /// this node's partitions of it (if any) moves now.
    async fn reload(&self, _: &crate::definitions::Reload) -> Result<(), StoreError> {
        self.wake_changes.notify_one();
        Ok(())
    }
}

/// The rows recording attributes `names` of `entity` at `time`: one
/// recorded state, its own [`HistoryRow::instance`] shared by its rows.
pub fn rows_of<'a>(
    tenant: &str,
    service_path: &str,
    entity: &Entity,
    names: impl IntoIterator<Item = &'a str>,
    time: i64,
) -> Vec<HistoryRow> {
    let instance = next_instance();
    names
        .into_iter()
        .filter_map(|name| {
            let a = entity.attrs.get(name)?;
            Some(HistoryRow {
                tenant: tenant.to_string(),
                service_path: service_path.to_string(),
                entity_id: entity.id.clone(),
                entity_type: entity.entity_type.clone(),
                attr: name.to_string(),
                attr_type: a.attr_type.clone(),
                time,
                instance,
                value: a.value.to_string(),
                number: numeric(&a.value),
            })
        })
        .collect()
}

/// Adds `entity`'s state of its attributes `names` (those it holds) to
/// `states`, at `time`, under a new instance: the feed's form of an
/// entity change and of a notified entity alike, written once on the
/// caller's task.
pub fn push_entity_state<'n>(
    states: &mut HistoryStates,
    tenant: &str,
    service_path: &str,
    entity: &Entity,
    names: impl IntoIterator<Item = &'n str>,
    time: i64,
) {
    states.push_state(
        tenant,
        service_path,
        &entity.id,
        &entity.entity_type,
        time,
        next_instance(),
        names.into_iter().filter_map(|name| {
            let a = entity.attrs.get(name)?;
            Some((name, a.attr_type.as_str(), &a.value))
        }),
    );
}

/// The last [`next_instance`] handed out.
static LAST_INSTANCE: AtomicI64 = AtomicI64::new(0);

/// A new recorded-state identity ([`HistoryRow::instance`]): the wall clock
/// in nanoseconds, made strictly increasing within the process, so states
/// of one entity filed under the same time index (notifications arriving
/// in the same millisecond) are distinct rows, ordered by arrival. Another
/// process could only repeat a value for a state of the same entity in the
/// same nanosecond.
pub fn next_instance() -> i64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
    let previous = LAST_INSTANCE
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |last| {
            Some(now.max(last + 1))
        })
        .unwrap_or_else(|last| last);
    now.max(previous + 1)
}

/// Runs a store write, retrying while the store is overloaded (the
/// history writer catches up within milliseconds; the caller waits, it is
/// never told "done" for rows that are not stored).
async fn retry_overloaded<F, Fut>(mut write: F) -> Result<u64, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<u64, StoreError>>,
{
    let mut tries = 0;
    loop {
        match write().await {
            Err(StoreError::Overloaded) if tries < OVERLOADED_RETRIES => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            other => return other,
        }
    }
}

#[cfg(test)]
#[path = "history_tests.rs"]
mod tests;
