//! The single writer: one thread that owns the write connection and turns
//! whatever operations are queued into one transaction (group commit).
//!
//! Shape (after mini-redis's `buffered_client.rs`): the store's handle
//! holds a bounded sender of [`Op`]s, each carrying a `oneshot` for its
//! answer. The thread blocks for the first operation, takes everything
//! else already queued (up to `max_batch`; when the previous commit started
//! less than `commit_interval` ago, it first waits out the interval so the
//! batch grows with load instead of commits multiplying), runs them in one
//! `BEGIN IMMEDIATE … COMMIT`, and answers only after `COMMIT` returned,
//! so an answer always means "durable". One fsync therefore covers the
//! whole batch, which is what makes thousands of durable appends per
//! second affordable.
//!
//! Failure isolation: a single-statement operation is atomic by itself
//! (SQLite undoes a failed statement without ending the transaction);
//! operations made of several statements run inside a `SAVEPOINT`, so one
//! failing operation fails alone. If SQLite itself abandons the
//! transaction (disk full, I/O error), every operation of it is answered
//! with the error and the rest of the batch starts a fresh transaction.
//!
//! It does no reads for callers (the read pool does) and never decides
//! about overload (the sender's `try_send` does).

use std::sync::Arc;
use std::time::{Duration, Instant};

use rusqlite::{Connection, OptionalExtension};
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::{mpsc, oneshot, watch};
use weft_model::NewUplink;

use super::{to_i64, Db};
use crate::{CommitOutcome, ProcessedBatch, Result, StoreError};

/// Where the writer sends an operation's answer.
pub(super) type Reply<T> = oneshot::Sender<Result<T>>;

/// One write, as queued for the writer. Values are already serialised by
/// the caller so the writer thread, the bottleneck, only runs SQL.
pub(super) enum Op {
    /// Append to the ingest log; answers the new `seq`.
    Append(NewUplink, Reply<u64>),
    /// A pipeline batch and its cursor, atomically.
    Processed(Arc<ProcessedBatch>, Reply<CommitOutcome>),
    /// Delete old log entries; answers how many.
    Prune {
        /// Only entries with `seq` below this.
        below_seq: u64,
        /// Only entries received before this (epoch ms).
        received_before: i64,
        /// The answer.
        reply: Reply<u64>,
    },
    /// Create or replace a device type; answers "created".
    PutDeviceType {
        /// Its name (the key).
        name: String,
        /// Its JSON.
        json: String,
        /// The answer.
        reply: Reply<bool>,
    },
    /// Delete a device type; answers "existed".
    DeleteDeviceType(String, Reply<bool>),
    /// Create or replace a device; answers "created".
    PutDevice {
        /// Device id (the key).
        id: String,
        /// Its type, kept as a column for filtering.
        device_type: String,
        /// Its channel, kept as a column for filtering.
        channel: String,
        /// Its JSON.
        json: String,
        /// The answer.
        reply: Reply<bool>,
    },
    /// Delete a device; answers "existed".
    DeleteDevice(String, Reply<bool>),
    /// Create or replace an NGSI entity and queue its history rows.
    PutEntity(crate::EntityRecord, Vec<crate::HistoryRow>, Reply<()>),
    /// Store history rows taken from a feed through `seq` and mark the
    /// feed consumed that far (the changes feed's cursor; the notifications
    /// feed's entries are deleted, in this same file).
    AppendHistoryFromFeed(
        Vec<crate::HistoryRow>,
        Option<u64>,
        crate::HistoryFeed,
        Reply<u64>,
    ),
    /// Queue notified history rows (JSON) in this file's feed; answers the
    /// entry's `seq`.
    QueueHistory(String, Reply<u64>),
    /// Drop consumed feed entries.
    PruneHistoryFeed(u64, Reply<u64>),
    /// Delete an NGSI entity (tenant, service path, id, type); answers "existed".
    DeleteEntity([String; 4], Reply<bool>),
    /// Create or replace an NGSI subscription or registration.
    PutDocument(crate::NgsiDocument, Reply<()>),
    /// Delete one (kind, tenant, id); answers "existed".
    DeleteDocument([String; 3], Reply<bool>),
    /// Store history rows, skipping those whose key is already stored, and
    /// record their entities; all of it or (on error) none. Answers how
    /// many rows were new.
    AppendHistory(Vec<crate::HistoryRow>, Reply<u64>),
    /// Delete at most [`HISTORY_DELETE_CHUNK`] history rows of the entities
    /// matching the filter, and forget the entities left without rows.
    /// Answers how many rows went; the caller repeats while that is a full
    /// chunk, so a large delete never holds the writer (and every notify
    /// waiting on it) for long.
    DeleteHistory {
        /// Tenant.
        tenant: String,
        /// Only this entity id; `None`: every id (of `entity_type`).
        entity_id: Option<String>,
        /// Only this entity type; `None`: every type (of `entity_id`).
        entity_type: Option<String>,
        /// The answer.
        reply: Reply<u64>,
    },
    /// Delete up to [`HISTORY_DELETE_CHUNK`] of a tenant's rows older than
    /// `rows_before` and rollup buckets ending by `rollups_before`; answers
    /// how many went (the caller repeats while that is a full chunk).
    ExpireHistory {
        /// Tenant.
        tenant: String,
        /// Rows with a time index before this go.
        rows_before: Option<i64>,
        /// Rollup buckets ending at or before this go.
        rollups_before: Option<i64>,
        /// The answer.
        reply: Reply<u64>,
    },
    /// Create or replace a rule (id, JSON); answers "created".
    PutRule(String, String, Reply<bool>),
    /// Delete a rule and its state; answers "existed".
    DeleteRule(String, Reply<bool>),
    /// The rule engine's alarms, events, state and cursor, atomically;
    /// answers the last event's `seq`.
    CommitAlarms(crate::AlarmBatch, Reply<u64>),
    /// Store a channel message (channel, message id, content) unless a
    /// duplicate; answers its `seq` (0 for a duplicate).
    Publish([String; 3], Reply<u64>),
    /// Create a channel subscriber (channel, subscriber) at a cursor unless
    /// it exists; answers its cursor.
    Subscribe([String; 2], u64, Reply<u64>),
    /// Delete a channel subscriber; answers "existed".
    Unsubscribe([String; 2], Reply<bool>),
    /// Move a subscriber's cursor forward.
    AckChannel([String; 2], u64, Reply<()>),
    /// Delete a channel's messages up to a `seq`; answers how many.
    PruneChannel(String, u64, Reply<u64>),
    /// Round-trip through a (possibly empty) commit.
    Ping(Reply<()>),
    /// Stop accepting, commit what is queued, stop; answered last.
    Close(Reply<()>),
}

/// An executed operation waiting for its transaction to commit before its
/// answer may be sent.
enum Done {
    U64(Reply<u64>, Result<u64>),
    Bool(Reply<bool>, Result<bool>),
    Outcome(Reply<CommitOutcome>, Result<CommitOutcome>),
    Unit(Reply<()>, Result<()>),
}

impl Done {
    /// Sends the answer. A caller that gave up (dropped its receiver)
    /// is not an error: its write is committed all the same.
    fn send(self) {
        match self {
            Done::U64(reply, result) => drop(reply.send(result)),
            Done::Bool(reply, result) => drop(reply.send(result)),
            Done::Outcome(reply, result) => drop(reply.send(result)),
            Done::Unit(reply, result) => drop(reply.send(result)),
        }
    }

    fn is_err(&self) -> bool {
        match self {
            Done::U64(_, result) => result.is_err(),
            Done::Bool(_, result) => result.is_err(),
            Done::Outcome(_, result) => result.is_err(),
            Done::Unit(_, result) => result.is_err(),
        }
    }

    /// Answers with `error` instead of the result: the transaction did
    /// not commit, so whatever the operation did is gone.
    fn fail(self, error: &str) {
        fn err<T>(error: &str) -> Result<T> {
            Err(StoreError::Database(error.to_string()))
        }
        match self {
            Done::U64(reply, _) => drop(reply.send(err(error))),
            Done::Bool(reply, _) => drop(reply.send(err(error))),
            Done::Outcome(reply, _) => drop(reply.send(err(error))),
            Done::Unit(reply, _) => drop(reply.send(err(error))),
        }
    }
}

/// The writer thread's state.
pub(super) struct Writer {
    conn: Connection,
    ops: mpsc::Receiver<Op>,
    max_batch: usize,
    /// Shortest time between commit starts (see `SqliteConfig::commit_interval`).
    commit_interval: Duration,
    /// Set by the checkpointer when the WAL has grown past its bound.
    restart_wal: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Highest committed ingest-log `seq`, published after each commit.
    committed: watch::Sender<u64>,
    /// Set once the thread has committed its last batch and let go of the
    /// connection; `close()` waits on it.
    stopped: watch::Sender<bool>,
}

impl Writer {
    /// A writer over an open, migrated connection.
    pub(super) fn new(
        conn: Connection,
        ops: mpsc::Receiver<Op>,
        max_batch: usize,
        commit_interval: Duration,
        restart_wal: std::sync::Arc<std::sync::atomic::AtomicBool>,
        committed: watch::Sender<u64>,
        stopped: watch::Sender<bool>,
    ) -> Writer {
        Writer {
            conn,
            ops,
            max_batch: max_batch.max(1),
            commit_interval,
            restart_wal,
            committed,
            stopped,
        }
    }

    /// The thread's body: batches until every sender is gone or a `Close`
    /// arrives, then drains what is still queued and stops.
    pub(super) fn run(mut self) {
        let mut batch: Vec<Op> = Vec::with_capacity(self.max_batch.min(4096));
        let mut done: Vec<Done> = Vec::with_capacity(batch.capacity());
        let mut closers: Vec<Reply<()>> = Vec::new();
        // After `close()`, `blocking_recv` still yields what was queued
        // before and then `None`, so the loop ends with the queue drained.
        let mut last_commit: Option<Instant> = None;
        while let Some(first) = self.ops.blocking_recv() {
            self.take(first, &mut batch, &mut closers);
            if let Some(wait) =
                last_commit.and_then(|at| self.commit_interval.checked_sub(at.elapsed()))
            {
                std::thread::sleep(wait);
            }
            self.gather(&mut batch, &mut closers);
            last_commit = Some(Instant::now());
            if !batch.is_empty() {
                self.run_batch(&mut batch, &mut done);
            }
        }
        let Writer { conn, stopped, .. } = self;
        if let Err((_, e)) = conn.close() {
            tracing::warn!(error = %e, "closing the write connection failed");
        }
        tracing::debug!("storage writer stopped");
        stopped.send_replace(true);
        for reply in closers {
            let _ = reply.send(Ok(()));
        }
    }

    /// Fills `batch` with what is queued, up to `max_batch`.
    fn gather(&mut self, batch: &mut Vec<Op>, closers: &mut Vec<Reply<()>>) {
        while batch.len() < self.max_batch {
            match self.ops.try_recv() {
                Ok(op) => self.take(op, batch, closers),
                // Empty, or closed and drained: commit what we have.
                Err(TryRecvError::Empty) | Err(TryRecvError::Disconnected) => return,
            }
        }
    }

    /// Adds `op` to the batch, or starts closing for a `Close`.
    fn take(&mut self, op: Op, batch: &mut Vec<Op>, closers: &mut Vec<Reply<()>>) {
        match op {
            Op::Close(reply) => {
                self.ops.close();
                closers.push(reply);
            }
            op => batch.push(op),
        }
    }

    /// Runs `batch` in one transaction and answers every operation.
    fn run_batch(&mut self, batch: &mut Vec<Op>, done: &mut Vec<Done>) {
        let started = Instant::now();
        let size = batch.len();
        let mut appended: Option<u64> = None;
        if let Err(e) = self.begin() {
            let msg = format!("could not start a transaction: {e}");
            tracing::warn!(error = %e, ops = size, "storage batch failed");
            for op in batch.drain(..) {
                not_run(op).fail(&msg);
            }
            return;
        }
        let mut ops = batch.drain(..);
        while let Some(op) = ops.next() {
            done.push(self.execute(op, &mut appended));
            if self.conn.is_autocommit() {
                // SQLite rolled the whole transaction back (disk full, I/O
                // error…): nothing executed so far in it survives.
                // The operation that caused it keeps its own error.
                let msg = "the database abandoned the transaction after an error";
                tracing::warn!(ops = done.len(), "{msg}");
                let culprit = done.pop();
                for d in done.drain(..) {
                    d.fail(msg);
                }
                if let Some(culprit) = culprit {
                    if culprit.is_err() {
                        culprit.send();
                    } else {
                        culprit.fail(msg);
                    }
                }
                appended = None;
                if let Err(e) = self.begin() {
                    let msg = format!("could not start a transaction: {e}");
                    for op in ops.by_ref() {
                        not_run(op).fail(&msg);
                    }
                    return;
                }
            }
        }
        match self.commit() {
            Ok(()) => {
                // Publish before answering, so that whoever holds a `seq`
                // answer finds `committed_seq()` at least that high.
                if let Some(seq) = appended {
                    self.committed.send_if_modified(|current| {
                        let newer = seq > *current;
                        if newer {
                            *current = seq;
                        }
                        newer
                    });
                }
                for d in done.drain(..) {
                    d.send();
                }
                metrics::counter!("weft_store_commits_total").increment(1);
                metrics::histogram!("weft_store_batch_size").record(size as f64);
                metrics::histogram!("weft_store_commit_seconds")
                    .record(started.elapsed().as_secs_f64());
                self.restart_wal_if_asked();
            }
            Err(e) => {
                let msg = format!("commit failed: {e}");
                tracing::warn!(error = %e, ops = done.len(), "storage commit failed");
                if !self.conn.is_autocommit() {
                    if let Err(e) = self.conn.execute_batch("ROLLBACK") {
                        tracing::warn!(error = %e, "rollback after a failed commit failed");
                    }
                }
                for d in done.drain(..) {
                    d.fail(&msg);
                }
            }
        }
    }

    /// Lets the WAL start over when the checkpointer asks. SQLite rewinds
    /// the WAL at the start of a write once every frame has been copied
    /// back and no reader needs it; under steady load the checkpointer
    /// never catches up with the last frames, because the writer keeps
    /// adding some while it copies. So the writer copies the rest itself,
    /// between two of its commits, while nothing new arrives: a passive
    /// checkpoint of only what came since the checkpointer's last pass,
    /// never waiting on a lock. The next write then rewinds the WAL.
    fn restart_wal_if_asked(&self) {
        if !self.restart_wal.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let started = Instant::now();
        let result = self
            .conn
            .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get::<_, i64>(0));
        self.restart_wal
            .store(false, std::sync::atomic::Ordering::Relaxed);
        metrics::histogram!("weft_store_wal_restart_seconds")
            .record(started.elapsed().as_secs_f64());
        match result {
            Ok(_) => tracing::debug!(took = ?started.elapsed(), "caught up the WAL for a restart"),
            Err(e) => tracing::warn!(error = %e, "checkpointing for a WAL restart failed"),
        }
    }

    fn begin(&self) -> rusqlite::Result<()> {
        self.conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        Ok(())
    }

    fn commit(&self) -> rusqlite::Result<()> {
        self.conn.prepare_cached("COMMIT")?.execute([])?;
        Ok(())
    }

    /// Runs one operation inside the open transaction.
    fn execute(&self, op: Op, appended: &mut Option<u64>) -> Done {
        let conn = &self.conn;
        match op {
            Op::Append(uplink, reply) => {
                let result = append(conn, &uplink).db();
                if let Ok(seq) = result {
                    *appended = Some(seq);
                }
                Done::U64(reply, result)
            }
            Op::Processed(batch, reply) => {
                Done::Outcome(reply, in_savepoint(conn, |c| processed(c, &batch)).db())
            }
            Op::Prune {
                below_seq,
                received_before,
                reply,
            } => Done::U64(reply, prune(conn, below_seq, received_before).db()),
            Op::PutDeviceType { name, json, reply } => {
                Done::Bool(reply, put_device_type(conn, &name, &json).db())
            }
            Op::DeleteDeviceType(name, reply) => Done::Bool(
                reply,
                delete(conn, "DELETE FROM device_types WHERE name = ?1", &name).db(),
            ),
            Op::PutDevice {
                id,
                device_type,
                channel,
                json,
                reply,
            } => Done::Bool(
                reply,
                put_device(conn, &id, &device_type, &channel, &json).db(),
            ),
            Op::DeleteDevice(id, reply) => Done::Bool(
                reply,
                delete(conn, "DELETE FROM devices WHERE id = ?1", &id).db(),
            ),
            Op::PutEntity(record, history, reply) => Done::Unit(
                reply,
                put_entity(conn, &record)
                    .and_then(|()| queue_history(conn, &history))
                    .db(),
            ),
            Op::AppendHistoryFromFeed(rows, through, feed, reply) => Done::U64(
                reply,
                in_savepoint(conn, |c| {
                    let n = append_history(c, &rows)?;
                    let Some(through) = through else {
                        return Ok(n);
                    };
                    match feed {
                        crate::HistoryFeed::Changes => c
                            .prepare_cached(
                                "INSERT INTO cursors (name, next_seq) VALUES (?1, ?2) \
                                 ON CONFLICT (name) DO UPDATE SET next_seq = excluded.next_seq",
                            )?
                            .execute((crate::HISTORY_FEED_CURSOR, to_i64(through + 1)))?,
                        crate::HistoryFeed::Notifications => c
                            .prepare_cached("DELETE FROM history_feed WHERE seq <= ?1")?
                            .execute([to_i64(through)])?,
                    };
                    Ok(n)
                })
                .db(),
            ),
            Op::QueueHistory(json, reply) => Done::U64(
                reply,
                conn.prepare_cached("INSERT INTO history_feed (rows) VALUES (?1)")
                    .and_then(|mut st| st.insert([&json]))
                    .map(|seq| seq as u64)
                    .db(),
            ),
            Op::PruneHistoryFeed(through, reply) => Done::U64(
                reply,
                conn.prepare_cached("DELETE FROM history_feed WHERE seq <= ?1")
                    .and_then(|mut st| st.execute([to_i64(through)]))
                    .map(|n| n as u64)
                    .db(),
            ),
            Op::DeleteEntity([tenant, path, id, entity_type], reply) => Done::Bool(
                reply,
                conn.prepare_cached(
                    "DELETE FROM entities WHERE tenant = ?1 AND service_path = ?2 AND id = ?3 AND type = ?4",
                )
                .and_then(|mut st| st.execute((&tenant, &path, &id, &entity_type)))
                .map(|n| n > 0)
                .db(),
            ),
            Op::PutDocument(d, reply) => Done::Unit(
                reply,
                conn.prepare_cached(
                    "INSERT OR REPLACE INTO ngsi_documents (kind, tenant, id, service_path, created, json) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                )
                .and_then(|mut st| {
                    st.execute((
                        d.kind.as_str(),
                        &d.tenant,
                        &d.id,
                        &d.service_path,
                        d.created as i64,
                        &d.json,
                    ))
                })
                .map(|_| ())
                .db(),
            ),
            Op::DeleteDocument([kind, tenant, id], reply) => Done::Bool(
                reply,
                conn.prepare_cached(
                    "DELETE FROM ngsi_documents WHERE kind = ?1 AND tenant = ?2 AND id = ?3",
                )
                .and_then(|mut st| st.execute((&kind, &tenant, &id)))
                .map(|n| n > 0)
                .db(),
            ),
            Op::AppendHistory(rows, reply) => Done::U64(
                reply,
                append_history(conn, &rows).db(),
            ),
            Op::DeleteHistory {
                tenant,
                entity_id,
                entity_type,
                reply,
            } => Done::U64(
                reply,
                in_savepoint(conn, |c| {
                    delete_history(
                        c,
                        &tenant,
                        entity_id.as_deref(),
                        entity_type.as_deref(),
                    )
                })
                .db(),
            ),
            Op::ExpireHistory {
                tenant,
                rows_before,
                rollups_before,
                reply,
            } => Done::U64(
                reply,
                in_savepoint(conn, |c| expire_history(c, &tenant, rows_before, rollups_before))
                    .db(),
            ),
            Op::PutRule(id, json, reply) => {
                Done::Bool(reply, super::alarms::put_rule(conn, &id, &json).db())
            }
            Op::DeleteRule(id, reply) => Done::Bool(reply, super::alarms::delete_rule(conn, &id).db()),
            Op::CommitAlarms(batch, reply) => Done::U64(
                reply,
                in_savepoint(conn, |c| super::alarms::commit_alarms(c, &batch)).db(),
            ),
            Op::Publish([channel, id, content], reply) => Done::U64(
                reply,
                super::channels::publish(conn, &channel, &id, &content, weft_model::now_ms())
                    .map(|seq| seq.unwrap_or(0))
                    .db(),
            ),
            Op::Subscribe([channel, sub], cursor, reply) => Done::U64(
                reply,
                super::channels::subscribe(conn, &channel, &sub, cursor).db(),
            ),
            Op::Unsubscribe([channel, sub], reply) => Done::Bool(
                reply,
                super::channels::unsubscribe(conn, &channel, &sub).db(),
            ),
            Op::AckChannel([channel, sub], through, reply) => Done::Unit(
                reply,
                super::channels::ack(conn, &channel, &sub, through).db(),
            ),
            Op::PruneChannel(channel, through, reply) => Done::U64(
                reply,
                super::channels::prune(conn, &channel, through).db(),
            ),
            Op::Ping(reply) => Done::Unit(reply, Ok(())),
            // `take` keeps `Close` out of batches; answer it anyway.
            Op::Close(reply) => Done::Unit(reply, Ok(())),
        }
    }
}

/// An operation that will not run, holding its reply so it can be failed.
fn not_run(op: Op) -> Done {
    match op {
        Op::Append(_, reply)
        | Op::Prune { reply, .. }
        | Op::AppendHistory(_, reply)
        | Op::AppendHistoryFromFeed(_, _, _, reply)
        | Op::QueueHistory(_, reply)
        | Op::PruneHistoryFeed(_, reply)
        | Op::DeleteHistory { reply, .. }
        | Op::ExpireHistory { reply, .. }
        | Op::CommitAlarms(_, reply)
        | Op::Publish(_, reply)
        | Op::Subscribe(_, _, reply)
        | Op::PruneChannel(_, _, reply) => Done::U64(reply, Ok(0)),
        Op::Processed(_, reply) => Done::Outcome(reply, Ok(CommitOutcome::default())),
        Op::PutDeviceType { reply, .. }
        | Op::DeleteDeviceType(_, reply)
        | Op::PutDevice { reply, .. }
        | Op::DeleteDevice(_, reply)
        | Op::DeleteEntity(_, reply)
        | Op::DeleteDocument(_, reply)
        | Op::PutRule(_, _, reply)
        | Op::DeleteRule(_, reply)
        | Op::Unsubscribe(_, reply) => Done::Bool(reply, Ok(false)),
        Op::Ping(reply)
        | Op::Close(reply)
        | Op::PutEntity(_, _, reply)
        | Op::PutDocument(_, reply)
        | Op::AckChannel(_, _, reply) => Done::Unit(reply, Ok(())),
    }
}

/// Runs `f` inside a savepoint: all of it, or (on error) none of it,
/// without disturbing the rest of the transaction.
fn in_savepoint<T>(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    conn.prepare_cached("SAVEPOINT op")?.execute([])?;
    match f(conn) {
        Ok(value) => {
            conn.prepare_cached("RELEASE op")?.execute([])?;
            Ok(value)
        }
        Err(e) => {
            // If SQLite already abandoned the whole transaction there is
            // no savepoint left to roll back to; the caller notices.
            if !conn.is_autocommit() {
                conn.prepare_cached("ROLLBACK TO op")?.execute([])?;
                conn.prepare_cached("RELEASE op")?.execute([])?;
            }
            Err(e)
        }
    }
}

fn append(conn: &Connection, uplink: &NewUplink) -> rusqlite::Result<u64> {
    let mut stmt = conn.prepare_cached(
        "INSERT INTO ingest_log (received_at, format, channel, device_type, body) \
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )?;
    let seq = stmt.insert((
        uplink.received_at,
        uplink.format.as_str(),
        uplink.channel.as_deref(),
        uplink.device_type.as_deref(),
        uplink.body.as_slice(),
    ))?;
    Ok(seq as u64)
}

fn processed(conn: &Connection, batch: &ProcessedBatch) -> rusqlite::Result<CommitOutcome> {
    let mut inserted = Vec::with_capacity(batch.units.len());
    let mut seqs = Vec::with_capacity(batch.units.len());
    if !batch.units.is_empty() {
        let mut stmt = conn.prepare_cached(
            "INSERT OR IGNORE INTO data_units \
             (data_id, device_id, channel, device_type, reported_at, json) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )?;
        for record in &batch.units {
            let unit = &record.unit;
            let changed = stmt.execute((
                &unit.data_id,
                &unit.device.id,
                &unit.channel,
                &unit.device.device_type,
                unit.reported_at,
                json_text(&record.json)?,
            ))?;
            inserted.push(changed == 1);
            seqs.push(if changed == 1 {
                conn.last_insert_rowid() as u64
            } else {
                0
            });
        }
    }
    if !batch.failures.is_empty() {
        let mut stmt = conn.prepare_cached(
            "INSERT OR REPLACE INTO failed_uplinks \
             (seq, received_at, format, channel, device_type, reason, description, body) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        )?;
        for failure in &batch.failures {
            stmt.execute((
                to_i64(failure.seq),
                failure.received_at,
                &failure.format,
                failure.channel.as_deref(),
                failure.device_type.as_deref(),
                failure.reason.as_str(),
                &failure.description,
                failure.body.to_string(),
            ))?;
        }
    }
    if !batch.new_devices.is_empty() {
        let mut stmt = conn.prepare_cached(
            "INSERT OR IGNORE INTO devices (id, device_type, channel, json) \
             VALUES (?1, ?2, ?3, ?4)",
        )?;
        for device in &batch.new_devices {
            let json = serde_json::to_string(device)
                .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
            stmt.execute((&device.id, &device.device_type, &device.channel, json))?;
        }
    }
    conn.prepare_cached(
        "INSERT INTO cursors (name, next_seq) VALUES (?1, ?2) \
         ON CONFLICT (name) DO UPDATE SET next_seq = excluded.next_seq",
    )?
    .execute((&batch.consumer, to_i64(batch.next_seq)))?;
    queue_history(conn, &batch.history)?;
    if !batch.entities.is_empty() {
        for record in &batch.entities {
            put_entity(conn, record)?;
        }
        conn.prepare_cached(
            "INSERT INTO cursors (name, next_seq) \
             VALUES (?1, COALESCE((SELECT MAX(seq) FROM data_units), 0) + 1) \
             ON CONFLICT (name) DO UPDATE SET next_seq = excluded.next_seq",
        )?
        .execute([crate::ENTITIES_CURSOR])?;
    }
    Ok(CommitOutcome { inserted, seqs })
}

/// Deletes the oldest processed log entries received before the cutoff.
/// `received_at` grows with `seq` (stamped just before the append), so the
/// boundary is the first entry received at or after the cutoff, found by
/// scanning from the oldest entry: the cost is proportional to what is
/// deleted, never to the size of the log. At most [`PRUNE_CHUNK`] entries
/// go per call, so one prune never holds the writer for long.
/// A unit's JSON as text (it was serialised from a `String`, so this only
/// fails on a caller's bug, reported as an SQL error rather than a panic).
fn json_text(json: &[u8]) -> rusqlite::Result<&str> {
    std::str::from_utf8(json).map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))
}

/// Queues history rows in the feed (nothing for none).
fn queue_history(conn: &Connection, rows: &[crate::HistoryRow]) -> rusqlite::Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let json = serde_json::to_string(rows)
        .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
    conn.prepare_cached("INSERT INTO history_feed (rows) VALUES (?1)")?
        .execute([json])?;
    Ok(())
}

fn put_entity(conn: &Connection, r: &crate::EntityRecord) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT OR REPLACE INTO entities (tenant, service_path, id, type, created, json) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute((
        &r.tenant,
        &r.service_path,
        &r.id,
        &r.entity_type,
        to_i64(r.created),
        &r.json,
    ))?;
    Ok(())
}

fn prune(conn: &Connection, below_seq: u64, received_before: i64) -> rusqlite::Result<u64> {
    let deleted = conn
        .prepare_cached(
            "DELETE FROM ingest_log WHERE seq < MIN(?1, \
               COALESCE((SELECT seq FROM ingest_log WHERE received_at >= ?2 ORDER BY seq LIMIT 1), ?1), \
               COALESCE((SELECT MIN(seq) FROM ingest_log), 0) + ?3)",
        )?
        .execute((to_i64(below_seq), received_before, PRUNE_CHUNK))?;
    Ok(deleted as u64)
}

/// Most log entries one prune deletes.
const PRUNE_CHUNK: i64 = 50_000;

/// Insert-if-absent, else update: two single statements, so "created" is
/// known without a read, and the single writer makes the pair atomic.
fn put_device_type(conn: &Connection, name: &str, json: &str) -> rusqlite::Result<bool> {
    let created = conn
        .prepare_cached("INSERT OR IGNORE INTO device_types (name, json) VALUES (?1, ?2)")?
        .execute((name, json))?
        == 1;
    if !created {
        conn.prepare_cached("UPDATE device_types SET json = ?2 WHERE name = ?1")?
            .execute((name, json))?;
    }
    Ok(created)
}

fn put_device(
    conn: &Connection,
    id: &str,
    device_type: &str,
    channel: &str,
    json: &str,
) -> rusqlite::Result<bool> {
    let created = conn
        .prepare_cached(
            "INSERT OR IGNORE INTO devices (id, device_type, channel, json) \
             VALUES (?1, ?2, ?3, ?4)",
        )?
        .execute((id, device_type, channel, json))?
        == 1;
    if !created {
        conn.prepare_cached(
            "UPDATE devices SET device_type = ?2, channel = ?3, json = ?4 WHERE id = ?1",
        )?
        .execute((id, device_type, channel, json))?;
    }
    Ok(created)
}

fn delete(conn: &Connection, sql: &str, key: &str) -> rusqlite::Result<bool> {
    Ok(conn.prepare_cached(sql)?.execute([key])? > 0)
}

/// Inserts the rows that are new (the primary key makes a replayed row a
/// no-op) and the entities seen for the first time (keeping the service
/// path they first came with), then adds the new rows to their series'
/// minute and hour rollups (one upsert per bucket, not per row). Rows
/// usually come grouped by entity, so the entity insert runs once per run
/// of rows of the same entity, before them.
///
/// It runs without a savepoint of its own: inside one, SQLite copies every
/// page the operation touches to a sub-journal first, and an append
/// touches one page per series (its last leaf). The feed's moves, which
/// are large and rare, wrap it in one ([`Op::AppendHistoryFromFeed`]);
/// the statements cannot fail on their values (strings, integers, optional
/// floats into columns without checks), so only an I/O error can stop an
/// append midway.
fn append_history(conn: &Connection, rows: &[crate::HistoryRow]) -> rusqlite::Result<u64> {
    let mut insert = conn.prepare_cached(
        "INSERT OR IGNORE INTO history \
         (tenant, entity_id, entity_type, attr, time, service_path, attr_type, value, number) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
    )?;
    let mut entity = conn.prepare_cached(
        "INSERT OR IGNORE INTO history_entities (tenant, entity_type, entity_id, service_path) \
         VALUES (?1, ?2, ?3, ?4)",
    )?;
    let mut rollups = Rollups::default();
    let mut new = 0u64;
    let mut previous: Option<&crate::HistoryRow> = None;
    for row in rows {
        let same_entity = previous.is_some_and(|p| {
            p.entity_id == row.entity_id
                && p.entity_type == row.entity_type
                && p.tenant == row.tenant
        });
        if !same_entity {
            entity.execute((
                &row.tenant,
                &row.entity_type,
                &row.entity_id,
                &row.service_path,
            ))?;
        }
        previous = Some(row);
        let inserted = insert.execute((
            &row.tenant,
            &row.entity_id,
            &row.entity_type,
            &row.attr,
            row.time,
            &row.service_path,
            &row.attr_type,
            &row.value,
            row.number,
        ))?;
        if inserted > 0 {
            new += 1;
            rollups.add(row);
        }
    }
    rollups.store(conn)?;
    Ok(new)
}

/// The rollup buckets an append adds to, keyed like `history_rollups`.
#[derive(Default)]
struct Rollups<'a> {
    buckets: std::collections::BTreeMap<RollupKey<'a>, crate::rollup::RollupPartial>,
}

/// (tenant, entity id, entity type, attribute, period, bucket start).
type RollupKey<'a> = (&'a str, &'a str, &'a str, &'a str, i64, i64);

impl<'a> Rollups<'a> {
    fn add(&mut self, row: &'a crate::HistoryRow) {
        for period in crate::rollup::ROLLUP_PERIODS {
            let key = (
                row.tenant.as_str(),
                row.entity_id.as_str(),
                row.entity_type.as_str(),
                row.attr.as_str(),
                period,
                crate::rollup::floor_to(row.time, period),
            );
            self.buckets.entry(key).or_default().add(row.number);
        }
    }

    fn store(self, conn: &Connection) -> rusqlite::Result<()> {
        if self.buckets.is_empty() {
            return Ok(());
        }
        let mut upsert = conn.prepare_cached(
            "INSERT INTO history_rollups (tenant, entity_id, entity_type, attr, period, bucket, \
                 rows, numbers, sum_value, min_value, max_value) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11) \
             ON CONFLICT DO UPDATE SET \
                 rows = rows + excluded.rows, \
                 numbers = numbers + excluded.numbers, \
                 sum_value = CASE WHEN sum_value IS NULL THEN excluded.sum_value \
                     WHEN excluded.sum_value IS NULL THEN sum_value \
                     ELSE sum_value + excluded.sum_value END, \
                 min_value = min(coalesce(min_value, excluded.min_value), \
                                 coalesce(excluded.min_value, min_value)), \
                 max_value = max(coalesce(max_value, excluded.max_value), \
                                 coalesce(excluded.max_value, max_value))",
        )?;
        for ((tenant, id, ty, attr, period, bucket), p) in self.buckets {
            upsert.execute((
                tenant,
                id,
                ty,
                attr,
                period,
                bucket,
                p.rows as i64,
                p.numbers as i64,
                p.sum(),
                p.min,
                p.max,
            ))?;
        }
        Ok(())
    }
}

/// Most history rows one [`Op::DeleteHistory`] deletes: a few tens of
/// milliseconds of the writer's time.
pub(super) const HISTORY_DELETE_CHUNK: usize = 50_000;

/// Deletes up to [`HISTORY_DELETE_CHUNK`] rows of the matching entities,
/// entity by entity; an entity whose rows are all gone leaves
/// `history_entities` too. With neither an id nor a type nothing matches
/// (deleting a whole tenant is not an operation of the API).
fn delete_history(
    conn: &Connection,
    tenant: &str,
    entity_id: Option<&str>,
    entity_type: Option<&str>,
) -> rusqlite::Result<u64> {
    let entities: Vec<(String, String)> = match (entity_id, entity_type) {
        (None, None) => return Ok(0),
        (Some(id), Some(ty)) => vec![(id.to_string(), ty.to_string())],
        (Some(id), None) => conn
            .prepare_cached(
                "SELECT entity_id, entity_type FROM history_entities \
                 WHERE tenant = ?1 AND entity_id = ?2",
            )?
            .query_map((tenant, id), |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?,
        (None, Some(ty)) => conn
            .prepare_cached(
                "SELECT entity_id, entity_type FROM history_entities \
                 WHERE tenant = ?1 AND entity_type = ?2",
            )?
            .query_map((tenant, ty), |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?,
    };
    let mut budget = HISTORY_DELETE_CHUNK;
    let mut deleted = 0u64;
    for (id, ty) in &entities {
        if budget == 0 {
            break;
        }
        // The first row to keep: the one after the budget, in key order.
        let boundary: Option<(String, i64)> = conn
            .prepare_cached(
                "SELECT attr, time FROM history \
                 WHERE tenant = ?1 AND entity_id = ?2 AND entity_type = ?3 \
                 ORDER BY attr, time LIMIT 1 OFFSET ?4",
            )?
            .query_row((tenant, id, ty, budget as i64), |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()?;
        let n = match &boundary {
            None => {
                let n = conn
                    .prepare_cached(
                        "DELETE FROM history \
                         WHERE tenant = ?1 AND entity_id = ?2 AND entity_type = ?3",
                    )?
                    .execute((tenant, id, ty))?;
                conn.prepare_cached(
                    "DELETE FROM history_entities \
                     WHERE tenant = ?1 AND entity_type = ?2 AND entity_id = ?3",
                )?
                .execute((tenant, ty, id))?;
                conn.prepare_cached(
                    "DELETE FROM history_rollups \
                     WHERE tenant = ?1 AND entity_id = ?2 AND entity_type = ?3",
                )?
                .execute((tenant, id, ty))?;
                n
            }
            Some((attr, time)) => conn
                .prepare_cached(
                    "DELETE FROM history \
                     WHERE tenant = ?1 AND entity_id = ?2 AND entity_type = ?3 \
                     AND (attr, time) < (?4, ?5)",
                )?
                .execute((tenant, id, ty, attr, time))?,
        };
        deleted += n as u64;
        budget = budget.saturating_sub(n);
        if boundary.is_some() {
            break;
        }
    }
    Ok(deleted)
}

/// Deletes a tenant's expired history, series by series, up to
/// [`HISTORY_DELETE_CHUNK`] rows and buckets: rows before `rows_before`,
/// minute and hour buckets that end by `rollups_before`; an entity left
/// with neither rows nor rollups leaves `history_entities`. Every delete
/// is a primary-key range (series, then time), so expiring old data costs
/// what it deletes plus a few seeks per series.
fn expire_history(
    conn: &Connection,
    tenant: &str,
    rows_before: Option<i64>,
    rollups_before: Option<i64>,
) -> rusqlite::Result<u64> {
    let entities: Vec<(String, String)> = conn
        .prepare_cached("SELECT entity_id, entity_type FROM history_entities WHERE tenant = ?1")?
        .query_map([tenant], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let mut budget = HISTORY_DELETE_CHUNK;
    let mut deleted = 0u64;
    for (id, ty) in &entities {
        for attr in super::reader::entity_attrs(conn, tenant, id, ty)? {
            if budget == 0 {
                return Ok(deleted);
            }
            if let Some(before) = rows_before {
                // Never more than the budget: stop at the budget-th row.
                let boundary: Option<i64> = conn
                    .prepare_cached(
                        "SELECT time FROM history WHERE tenant = ?1 AND entity_id = ?2 \
                         AND entity_type = ?3 AND attr = ?4 AND time < ?5 \
                         ORDER BY time LIMIT 1 OFFSET ?6",
                    )?
                    .query_row((tenant, id, ty, &attr, before, budget as i64), |r| r.get(0))
                    .optional()?;
                let n = conn
                    .prepare_cached(
                        "DELETE FROM history WHERE tenant = ?1 AND entity_id = ?2 \
                         AND entity_type = ?3 AND attr = ?4 AND time < ?5",
                    )?
                    .execute((tenant, id, ty, &attr, boundary.unwrap_or(before)))?;
                deleted += n as u64;
                budget = budget.saturating_sub(n);
            }
            if let Some(before) = rollups_before {
                for period in crate::rollup::ROLLUP_PERIODS {
                    let n = conn
                        .prepare_cached(
                            "DELETE FROM history_rollups WHERE tenant = ?1 AND entity_id = ?2 \
                             AND entity_type = ?3 AND attr = ?4 AND period = ?5 AND bucket <= ?6",
                        )?
                        .execute((tenant, id, ty, &attr, period, before - period))?;
                    deleted += n as u64;
                    budget = budget.saturating_sub(n);
                }
            }
        }
        let left: bool = conn
            .prepare_cached(
                "SELECT EXISTS (SELECT 1 FROM history \
                     WHERE tenant = ?1 AND entity_id = ?2 AND entity_type = ?3) \
                 OR EXISTS (SELECT 1 FROM history_rollups \
                     WHERE tenant = ?1 AND entity_id = ?2 AND entity_type = ?3)",
            )?
            .query_row((tenant, id, ty), |r| r.get(0))?;
        if !left {
            conn.prepare_cached(
                "DELETE FROM history_entities \
                 WHERE tenant = ?1 AND entity_type = ?2 AND entity_id = ?3",
            )?
            .execute((tenant, ty, id))?;
        }
    }
    Ok(deleted)
}
