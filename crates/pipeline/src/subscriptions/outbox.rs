//! The outbox: what makes notifications at-least-once.
//!
//! Every change some subscription of its tenant may owe a notification for
//! is logged in the transaction that commits it (the change log,
//! [`weft_store::OutboxStore`]), numbered by its ticket. A subscription is
//! served in one of two ways:
//!
//! - **live** (the usual way): the matcher fires it as changes are
//!   announced and the sender's lanes carry its notifications, in order;
//!   the changes whose notifications are still on their way are its
//!   `in_flight`;
//! - **from the log**: after a notification failed or found no room, and
//!   at start for a subscription whose stored cursor is behind the log, a
//!   task of its own reads the log from the cursor, fires the subscription
//!   for each change as the matcher would, and sends each notification
//!   until the receiver answers (retrying with backoff). Changes announced
//!   meanwhile are left to it. Once it has read everything announced, the
//!   subscription goes live again.
//!
//! A subscription's cursor (every change up to it is done with) is stored
//! every second ([`Subscriptions::save_cursors`]); the log is pruned up to
//! the lowest cursor, and of whatever is older than the retention. After a
//! crash, the notifications sent since the last stored cursor are sent
//! again: duplicates, never gaps. Each carries the same
//! [`NOTIFICATION_ID_HEADER`](super::sender::NOTIFICATION_ID_HEADER) every
//! time, so a receiver can drop them.
//!
//! A subscription that becomes `inactive` (`maxFailsLimit`, a fired
//! `oneshot`) or expires owes nothing more: its cursor follows the log.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use weft_model::ngsi::subscription::{Guarantee, Status};
use weft_model::ngsi::EntityChange;
use weft_store::{NotificationCursor, CHANGE_LOG_PRUNE_CHUNK};

use super::loops::MAX_NOTIFICATION_DEPTH;
use super::sender::Outcome;
use super::{Entry, Subscriptions};
use crate::cluster::Cluster;
use tokio_util::sync::CancellationToken;

/// Changes read from the log at a time while serving from it.
const REPLAY_BATCH: usize = 256;
/// The first wait before retrying a receiver that failed; it doubles on
/// every failure, up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(250);
/// The longest wait between two tries of a failing receiver.
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// The reason an invalid URL fails with: no retry can mend it.
pub(crate) const INVALID_URL: &str = "Invalid URL parsing notification url";

/// How one subscription is being delivered, as
/// [`Subscriptions::deliveries`] reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryReport {
    /// The subscription's id.
    pub id: String,
    /// Its tenant.
    #[serde(skip)]
    pub tenant: String,
    /// Served from the change log (catching up after a failure, a full
    /// queue or a restart) rather than live.
    pub from_log: bool,
    /// Notifications owed: those on their way when live; from the log,
    /// the changes of its tenant it has still to go through (an upper
    /// bound: not every one concerns it).
    pub owed: u64,
    /// When the oldest of them was committed (epoch ms).
    pub oldest_owed: Option<i64>,
    /// Why its receiver last failed, while it does.
    pub failing: Option<String>,
    /// Changes of its tenant skipped since weft started because it fell
    /// more than `notifications.max_owed` behind.
    pub dropped: u64,
}

/// Whether a change was made by a request too many notifications deep to
/// notify anyone (see [`super::loops`]).
fn too_deep(change: &EntityChange) -> bool {
    change
        .origin
        .as_ref()
        .is_some_and(|o| o.notification_depth() >= MAX_NOTIFICATION_DEPTH)
}

/// How one replayed change went ([`Subscriptions::replay_one`]).
enum Replayed {
    /// Done with (delivered, or nothing to send): on to the next.
    Next,
    /// The subscription is gone, inactive or handed over: stop serving it.
    Stop,
    /// Its receiver failed until the subscription fell more than
    /// `max_owed` changes behind: skip ahead.
    TooFarBehind,
}

/// Who fires a subscription for a change ([`Subscriptions::fire`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Serving<'a> {
    /// The live matcher, as changes are announced.
    Live,
    /// The subscription's own task serving it from this node's log, in
    /// this delivery generation.
    Log(u64),
    /// This node serving a dead node's log (named).
    Orphan(&'a str),
}

/// How a subscription is being served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Fired as changes are announced, for changes after `from` (the
    /// changes up to it were served from the log, or came before it).
    Live {
        /// The last change not served live.
        from: u64,
    },
    /// Served from the log by its own task; every change up to `through`
    /// is done with.
    FromLog {
        /// The last change done with.
        through: u64,
    },
}

/// How the matcher fires a subscription for one change
/// ([`Subscriptions::fire`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Firing {
    /// Live: sent through the lanes.
    Live,
    /// Live while the receiver fails (for this reason): counted as sent
    /// and failed, sent later from the log.
    Behind(String),
    /// From the log; `counted`: counted already.
    Replay {
        /// Counted already (sent and failed once).
        counted: bool,
    },
}

/// A subscription's delivery state (under its entry's lock).
#[derive(Debug)]
pub(crate) struct Delivery {
    /// How it is being served.
    pub mode: Mode,
    /// Changes whose live notifications are on their way, in order, with
    /// when each was triggered (epoch ms).
    pub in_flight: VecDeque<(u64, i64)>,
    /// Bumped each time it goes to the log: live notifications of an
    /// older generation are dropped unsent.
    pub generation: u64,
    /// The cursor as last stored.
    pub saved: Option<u64>,
    /// While served from the log: why its receiver last failed, until it
    /// answers again.
    pub failing: Option<String>,
    /// The last change whose notification was counted (sent and failed)
    /// but not yet delivered: retries of these are not counted again.
    pub counted_through: u64,
    /// Changes skipped since the start because it fell more than
    /// `max_owed` behind.
    pub dropped: u64,
}

impl Delivery {
    /// Served live, from after change `from`.
    pub fn live(from: u64) -> Delivery {
        Delivery {
            mode: Mode::Live { from },
            in_flight: VecDeque::new(),
            generation: 0,
            saved: None,
            failing: None,
            counted_through: 0,
            dropped: 0,
        }
    }

    /// Served from the log, after change `through`.
    pub fn from_log(through: u64) -> Delivery {
        Delivery {
            mode: Mode::FromLog { through },
            saved: Some(through),
            ..Delivery::live(0)
        }
    }

    /// Every change up to the answer is done with; `finished` is the last
    /// change the matcher has finished with.
    fn cursor(&self, finished: u64) -> u64 {
        match self.mode {
            Mode::FromLog { through } => through,
            Mode::Live { from } => match self.in_flight.front() {
                // Live notifications are only for changes after `from`.
                Some(&(first, _)) => first.saturating_sub(1),
                None => finished.max(from),
            },
        }
    }
}

impl Entry {
    /// Whether the subscription is still in delivery generation
    /// `generation` (its queued notifications are still to be sent).
    pub(crate) fn in_generation(&self, generation: u64) -> bool {
        self.state.lock().delivery.generation == generation
    }
}

impl Subscriptions {
    /// Takes the outcome of notification `seq` of `entry`, sent live in
    /// `generation`: counted on the subscription; on a failure the
    /// subscription goes to the log from that change on.
    pub(crate) fn settled(&self, entry: &Arc<Entry>, seq: u64, generation: u64, outcome: Outcome) {
        let retry = match &outcome {
            Outcome::Failed(reason) if reason != INVALID_URL => Some(reason.clone()),
            _ => None,
        };
        self.count(entry, outcome);
        if retry.is_some() && self.to_log(entry, seq, generation, retry) {
            return;
        }
        let mut state = entry.state.lock();
        if state.delivery.generation != generation {
            return;
        }
        let in_flight = &mut state.delivery.in_flight;
        if let Some(i) = in_flight.iter().position(|&(s, _)| s == seq) {
            in_flight.remove(i);
        }
    }

    /// Takes a live notification the sender refused (`reason`): with an
    /// invalid URL, or for a subscription delivered at most once, a
    /// failure; otherwise the log sends it (and counts it then).
    pub(crate) fn refused(&self, entry: &Arc<Entry>, job: &super::sender::Job, reason: String) {
        if reason == INVALID_URL || !self.to_log(entry, job.seq, job.generation, None) {
            self.settled(entry, job.seq, job.generation, Outcome::Failed(reason));
        }
    }

    /// Hands `entry`, served live in `generation`, to the log from change
    /// `seq` on (its notification was not delivered): `failing` says why
    /// its receiver failed (that notification was counted as failed), none
    /// when it was not attempted (no room for it). Answers whether it was
    /// handed over: an inactive subscription owes nothing, one delivered
    /// at most once is never owed anything, and one handed over since is
    /// the log's already.
    pub(crate) fn to_log(
        &self,
        entry: &Arc<Entry>,
        seq: u64,
        generation: u64,
        failing: Option<String>,
    ) -> bool {
        let mut state = entry.state.lock();
        if state.sub.notification.delivery == Guarantee::AtMostOnce
            || state.sub.status == Status::Inactive
        {
            return false;
        }
        if state.delivery.generation != generation {
            return true;
        }
        let delivery = &mut state.delivery;
        delivery.generation += 1;
        delivery.in_flight.clear();
        delivery.mode = Mode::FromLog {
            through: seq.saturating_sub(1),
        };
        if failing.is_some() {
            delivery.counted_through = delivery.counted_through.max(seq);
        }
        delivery.failing = failing;
        drop(state);
        metrics::counter!("weft_notifications_to_outbox_total").increment(1);
        if let Some(me) = self.me.upgrade() {
            tokio::spawn(me.serve_from_log(entry.clone()));
        }
        true
    }

    /// Takes notification `seq` of `entry`, triggered live but left
    /// unsent because the subscription went to the log since: while its
    /// receiver fails, it counts as failed, as it would have (the log
    /// sends it later without counting it again).
    pub(crate) fn superseded(&self, entry: &Arc<Entry>, seq: u64) {
        let mut state = entry.state.lock();
        if state.sub.status == Status::Inactive {
            return;
        }
        let delivery = &mut state.delivery;
        let Some(reason) = delivery.failing.clone() else {
            return;
        };
        if seq <= delivery.counted_through {
            return;
        }
        delivery.counted_through = seq;
        drop(state);
        self.count(entry, Outcome::Failed(reason));
    }

    /// Whether `entry` is still served from the log in `generation` and
    /// owes anything (active); if it became inactive, it is served live
    /// from the changes to come (that is: not at all, while inactive).
    fn still_from_log(&self, entry: &Arc<Entry>, generation: u64) -> bool {
        let mut state = entry.state.lock();
        if state.delivery.generation != generation {
            return false;
        }
        if state.sub.status == Status::Inactive {
            let head = self.entered.load(Ordering::SeqCst);
            state.delivery.mode = Mode::Live { from: head };
            state.delivery.failing = None;
            return false;
        }
        true
    }

    /// Whether `entry` is still the subscription registered under its id.
    fn registered(&self, entry: &Arc<Entry>) -> bool {
        let id = entry.id();
        self.tenants
            .read()
            .get(&entry.tenant)
            .and_then(|t| t.by_id.get(&id))
            .is_some_and(|e| Arc::ptr_eq(e, entry))
    }

    /// Serves `entry` from the log until it has caught up with what was
    /// announced, then hands it back to the live matcher. Ends early when
    /// the subscription is deleted, becomes inactive, or is handed over
    /// again meanwhile.
    pub(crate) async fn serve_from_log(self: Arc<Self>, entry: Arc<Entry>) {
        let generation = entry.state.lock().delivery.generation;
        let mut backoff = MIN_BACKOFF;
        loop {
            if !self.registered(&entry) {
                return;
            }
            let from = {
                let state = entry.state.lock();
                match state.delivery.mode {
                    Mode::FromLog { through } if state.delivery.generation == generation => through,
                    _ => return,
                }
            };
            // Every change up to `head` has been announced, so every one of
            // them that was committed is in the log.
            let head = self.entered.load(Ordering::SeqCst);
            let from = self.cap(&entry, generation, from, head).await;
            let rows = match self
                .store
                .read_change_log(&self.node, Some(&entry.tenant), from, head, REPLAY_BATCH)
                .await
            {
                Ok(rows) => rows,
                Err(e) => {
                    tracing::warn!(error = %e, "reading the change log failed; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            let mut complete = rows.len() < REPLAY_BATCH;
            for row in rows {
                match EntityChange::from_log(&row.body) {
                    Ok(change) => {
                        match self
                            .replay_one(&entry, generation, row.seq, &change, &mut backoff)
                            .await
                        {
                            Replayed::Next => {}
                            Replayed::Stop => return,
                            // Fallen too far behind: skip to the newest.
                            Replayed::TooFarBehind => {
                                complete = false;
                                break;
                            }
                        }
                    }
                    Err(e) => {
                        tracing::error!(seq = row.seq, error = %e, "a logged change could not be read; skipped");
                    }
                }
                let mut state = entry.state.lock();
                if state.delivery.generation != generation {
                    return;
                }
                state.delivery.mode = Mode::FromLog { through: row.seq };
            }
            if complete {
                let mut state = entry.state.lock();
                if state.delivery.generation != generation {
                    return;
                }
                // Nothing announced since `head` was read: every later
                // change reaches the matcher after this, so it is live.
                if self.entered.load(Ordering::SeqCst) <= head {
                    state.delivery.mode = Mode::Live { from: head };
                    return;
                }
                state.delivery.mode = Mode::FromLog { through: head };
            }
        }
    }

    /// Keeps `entry`, served from the log after change `from`, at most
    /// [`SenderConfig::max_owed`](super::sender::SenderConfig::max_owed)
    /// changes of the log behind `head`: the older ones are skipped,
    /// counted (those of its tenant) on the subscription and in
    /// `weft_notifications_dropped_total`. Answers where to go on from.
    async fn cap(&self, entry: &Arc<Entry>, generation: u64, from: u64, head: u64) -> u64 {
        let floor = head.saturating_sub(self.sender.config().max_owed);
        if from >= floor {
            return from;
        }
        let node = &self.node;
        let skipped = match (
            self.store
                .change_log_backlog(node, &entry.tenant, from)
                .await,
            self.store
                .change_log_backlog(node, &entry.tenant, floor)
                .await,
        ) {
            (Ok(all), Ok(kept)) => all.changes.saturating_sub(kept.changes),
            _ => 0,
        };
        let mut state = entry.state.lock();
        if state.delivery.generation != generation {
            return from;
        }
        state.delivery.mode = Mode::FromLog { through: floor };
        state.delivery.dropped += skipped;
        tracing::warn!(
            subscription = %state.sub.id,
            skipped,
            "a subscription fell too far behind its receiver; its oldest owed changes were skipped"
        );
        metrics::counter!("weft_notifications_dropped_total").increment(skipped);
        floor
    }

    /// Fires `entry` for logged change `seq` and, if it fires, sends the
    /// notification until the receiver takes it, the subscription is
    /// gone, inactive or handed over (stop), or it falls more than
    /// `max_owed` changes behind (skip ahead).
    async fn replay_one(
        &self,
        entry: &Arc<Entry>,
        generation: u64,
        seq: u64,
        change: &EntityChange,
        backoff: &mut Duration,
    ) -> Replayed {
        if too_deep(change) {
            return Replayed::Next;
        }
        let now = weft_model::now_ms();
        let Some(job) = self.fire(entry, seq, change, now, &mut 0, Serving::Log(generation)) else {
            return Replayed::Next;
        };
        let counted = seq <= entry.state.lock().delivery.counted_through;
        let max_owed = self.sender.config().max_owed;
        let behind = || self.entered.load(Ordering::SeqCst).saturating_sub(seq) > max_owed;
        let delivered = self
            .deliver(
                entry,
                job,
                counted,
                backoff,
                // It may have become inactive (the live matcher counting
                // the changes behind this one), or been handed over, or
                // fallen too far behind, meanwhile.
                || self.still_from_log(entry, generation) && !behind(),
                |failing| {
                    let mut state = entry.state.lock();
                    if state.delivery.generation == generation {
                        if failing.is_none() {
                            state.delivery.failing = None;
                        } else {
                            state.delivery.failing = failing.map(str::to_string);
                            state.delivery.counted_through =
                                state.delivery.counted_through.max(seq);
                        }
                    }
                },
            )
            .await;
        if delivered {
            Replayed::Next
        } else if behind() && self.still_from_log(entry, generation) {
            Replayed::TooFarBehind
        } else {
            Replayed::Stop
        }
    }

    /// Sends `job` until its receiver takes it (answers whether it did, or
    /// the URL can never work: go on), retrying with backoff while
    /// `wanted` holds; `noted` hears of each outcome (the reason of a
    /// failure, none for a success). Its failure counts once on the
    /// subscription, and not at all when `counted` already, however often
    /// it is retried (a retry is not a notification Orion would send).
    async fn deliver(
        &self,
        entry: &Arc<Entry>,
        job: super::sender::Job,
        mut counted: bool,
        backoff: &mut Duration,
        wanted: impl Fn() -> bool,
        noted: impl Fn(Option<&str>),
    ) -> bool {
        loop {
            if !wanted() {
                return false;
            }
            let outcome = self.sender.send_now(job.request.clone(), job.timeout).await;
            let failed = match &outcome {
                Outcome::Failed(reason) => Some(reason.clone()),
                _ => None,
            };
            if failed.is_some() {
                metrics::counter!("weft_notifications_failed_total").increment(1);
            } else {
                metrics::counter!("weft_notifications_sent_total").increment(1);
            }
            if failed.is_none() || !counted {
                self.count(entry, outcome);
            }
            noted(failed.as_deref());
            match &failed {
                None => {
                    *backoff = MIN_BACKOFF;
                    return true;
                }
                Some(reason) if reason == INVALID_URL => return true,
                Some(_) => counted = true,
            }
            if !self.registered(entry) || !wanted() {
                return false;
            }
            tokio::time::sleep(*backoff).await;
            *backoff = (*backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Serves, while this node holds the outbox lease (until `stop`), what
    /// nodes that are gone still owe from their change logs: each of their
    /// subscriptions' notifications, from its cursor over the dead node's
    /// log, as the dead node would have. A node that comes back serves its
    /// log itself again, from the cursors moved here.
    pub async fn serve_orphans(self: Arc<Self>, cluster: Arc<Cluster>, stop: CancellationToken) {
        let pause = cluster.lease_ttl() / 3;
        loop {
            if let Err(e) = self.serve_orphans_once(&cluster, &stop).await {
                tracing::warn!(error = %e, "serving a dead node's notifications failed; retrying");
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// One round of [`Subscriptions::serve_orphans`].
    async fn serve_orphans_once(
        &self,
        cluster: &Cluster,
        stop: &CancellationToken,
    ) -> Result<(), weft_store::StoreError> {
        let nodes = self.store.change_log_nodes().await?;
        let alive = cluster.others_alive().await?;
        for node in nodes {
            if node == self.node || node.is_empty() || alive.contains(&node) {
                continue;
            }
            let cursors: HashMap<(String, String), u64> = self
                .store
                .load_notification_cursors(&node)
                .await?
                .into_iter()
                .map(|c| ((c.tenant, c.subscription), c.through))
                .collect();
            let mut entries: Vec<Arc<Entry>> = self
                .tenants
                .read()
                .values()
                .flat_map(|t| t.by_id.values().cloned())
                .collect();
            entries.sort_by_key(|e| e.created);
            for entry in entries {
                let id = entry.id();
                let Some(&from) = cursors.get(&(entry.tenant.clone(), id.clone())) else {
                    continue;
                };
                if !self
                    .serve_orphan(&node, &entry, from, cluster, stop)
                    .await?
                {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// Serves `entry` from dead `node`'s log after change `from`; answers
    /// whether to go on with the others (false: stopped, or the node came
    /// back).
    async fn serve_orphan(
        &self,
        node: &str,
        entry: &Arc<Entry>,
        mut from: u64,
        cluster: &Cluster,
        stop: &CancellationToken,
    ) -> Result<bool, weft_store::StoreError> {
        let mut backoff = MIN_BACKOFF;
        let wanted = || {
            !stop.is_cancelled()
                && self.registered(entry)
                && entry.state.lock().sub.status != Status::Inactive
        };
        loop {
            let rows = self
                .store
                .read_change_log(node, Some(&entry.tenant), from, u64::MAX, REPLAY_BATCH)
                .await?;
            let Some(last) = rows.last().map(|r| r.seq) else {
                return Ok(true);
            };
            let mut served = true;
            for row in &rows {
                let Ok(change) = EntityChange::from_log(&row.body) else {
                    continue;
                };
                if too_deep(&change) {
                    continue;
                }
                let now = weft_model::now_ms();
                let fired = self.fire(entry, row.seq, &change, now, &mut 0, Serving::Orphan(node));
                if let Some(job) = fired {
                    if !self
                        .deliver(entry, job, false, &mut backoff, wanted, |_| {})
                        .await
                    {
                        served = false;
                        break;
                    }
                }
                from = row.seq;
            }
            let cursor = NotificationCursor {
                tenant: entry.tenant.clone(),
                subscription: entry.id(),
                // Nothing more is owed to one gone or inactive.
                through: if served || !stop.is_cancelled() && !wanted() {
                    last.max(from)
                } else {
                    from
                },
            };
            self.store
                .save_notification_cursors(node, vec![cursor])
                .await?;
            if stop.is_cancelled() || cluster.others_alive().await?.contains(node) {
                return Ok(false);
            }
            if !served {
                return Ok(true);
            }
            from = last;
        }
    }
    /// Every subscription of `tenant` (all tenants: `None`) with how it is
    /// being delivered, in creation order: what the API and the console
    /// show, and the metrics sum up.
    pub async fn deliveries(&self, tenant: Option<&str>) -> Vec<DeliveryReport> {
        let mut entries: Vec<Arc<Entry>> = self
            .tenants
            .read()
            .iter()
            .filter(|(t, _)| tenant.is_none_or(|want| want == t.as_str()))
            .flat_map(|(_, t)| t.by_id.values().cloned())
            .collect();
        entries.sort_by_key(|e| e.created);
        let mut out = Vec::with_capacity(entries.len());
        for entry in entries {
            let (id, mode, in_flight, failing, dropped) = {
                let state = entry.state.lock();
                (
                    state.sub.id.clone(),
                    state.delivery.mode,
                    (
                        state.delivery.in_flight.len(),
                        state.delivery.in_flight.front().map(|&(_, at)| at),
                    ),
                    state.delivery.failing.clone(),
                    state.delivery.dropped,
                )
            };
            let (from_log, owed, oldest) = match mode {
                Mode::Live { .. } => (false, in_flight.0 as u64, in_flight.1),
                Mode::FromLog { through } => {
                    match self
                        .store
                        .change_log_backlog(&self.node, &entry.tenant, through)
                        .await
                    {
                        Ok(b) => (true, b.changes, b.oldest),
                        Err(e) => {
                            tracing::warn!(error = %e, "reading a subscription's backlog failed");
                            (true, 0, None)
                        }
                    }
                }
            };
            out.push(DeliveryReport {
                id,
                tenant: entry.tenant.clone(),
                from_log,
                owed,
                oldest_owed: oldest,
                failing,
                dropped,
            });
        }
        out
    }

    /// Sets the outbox's gauges from [`Subscriptions::deliveries`].
    pub(crate) async fn report_metrics(&self) {
        let all = self.deliveries(None).await;
        let now = weft_model::now_ms();
        let owed: u64 = all.iter().map(|d| d.owed).sum();
        let oldest = all
            .iter()
            .filter_map(|d| d.oldest_owed)
            .min()
            .map_or(0.0, |at| (now - at).max(0) as f64 / 1000.0);
        let from_log = all.iter().filter(|d| d.from_log).count();
        metrics::gauge!("weft_notifications_owed").set(owed as f64);
        metrics::gauge!("weft_notifications_oldest_owed_seconds").set(oldest);
        metrics::gauge!("weft_subscriptions_served_from_log").set(from_log as f64);
    }

    /// Stores the cursors that moved since they were last stored, then,
    /// every `prune_every`-th call, prunes the log up to the lowest one.
    pub(crate) async fn save_cursors(&self, prune: bool) {
        // Read before the entries: a cursor is never ahead of what the
        // matcher had finished with.
        let finished = self.finished.load(Ordering::SeqCst);
        let entries: Vec<Arc<Entry>> = self
            .tenants
            .read()
            .values()
            .flat_map(|t| t.by_id.values().cloned())
            .collect();
        let mut moved = Vec::new();
        let mut lowest = finished;
        for entry in &entries {
            let state = entry.state.lock();
            let cursor = state.delivery.cursor(finished);
            lowest = lowest.min(cursor);
            if state.delivery.saved != Some(cursor) {
                moved.push((
                    entry.clone(),
                    NotificationCursor {
                        tenant: entry.tenant.clone(),
                        subscription: state.sub.id.clone(),
                        through: cursor,
                    },
                ));
            }
        }
        if !moved.is_empty() {
            let cursors = moved.iter().map(|(_, c)| c.clone()).collect();
            match self
                .store
                .save_notification_cursors(&self.node, cursors)
                .await
            {
                Ok(()) => {
                    for (entry, cursor) in moved {
                        entry.state.lock().delivery.saved = Some(cursor.through);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "storing notification cursors failed"),
            }
        }
        if prune {
            let before = weft_model::now_ms()
                - i64::try_from(self.sender.config().retention.as_millis()).unwrap_or(i64::MAX);
            loop {
                match self
                    .store
                    .prune_change_log(&self.node, lowest, before)
                    .await
                {
                    Ok(n) if n as usize >= CHANGE_LOG_PRUNE_CHUNK => continue,
                    Ok(n) => {
                        if n > 0 {
                            metrics::counter!("weft_change_log_pruned_total").increment(n);
                        }
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "pruning the change log failed");
                        break;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_stops_before_the_first_change_in_flight() {
        let mut d = Delivery::live(10);
        assert_eq!(d.cursor(12), 12);
        assert_eq!(d.cursor(5), 10, "never behind where it went live");
        d.in_flight.extend([(14, 0), (17, 0)]);
        assert_eq!(d.cursor(20), 13);
        d.in_flight.pop_front();
        assert_eq!(d.cursor(20), 16);
        d.mode = Mode::FromLog { through: 8 };
        assert_eq!(d.cursor(20), 8);
    }
}
