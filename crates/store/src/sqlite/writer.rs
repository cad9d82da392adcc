//! The single writer: one thread that owns the write connection and turns
//! whatever operations are queued into one transaction (group commit).
//!
//! Shape (after mini-redis's `buffered_client.rs`): the store's handle
//! holds a bounded sender of [`Op`]s, each a write (a [`Job`]) carrying a
//! `oneshot` for its answer. The thread blocks for the first operation,
//! takes everything else already queued (up to `max_batch`; when the
//! previous commit started less than `commit_interval` ago, it first waits
//! out the interval so the batch grows with load instead of commits
//! multiplying), runs them in one `BEGIN IMMEDIATE … COMMIT`, and answers
//! only after `COMMIT` returned, so an answer always means "durable". One
//! fsync therefore covers the whole batch, which is what makes thousands
//! of durable appends per second affordable.
//!
//! The writer knows no domain: a write is a closure over the connection,
//! written by the domain module that owns its SQL and queued through
//! `Part::write` (or `Part::append` for the ingest log, whose `seq` the
//! writer publishes as `committed_seq`).
//!
//! Failure isolation: a single-statement operation is atomic by itself
//! (SQLite undoes a failed statement without ending the transaction);
//! operations made of several statements run inside a `SAVEPOINT`
//! ([`in_savepoint`]), so one failing operation fails alone. If SQLite
//! itself abandons the transaction (disk full, I/O error), every operation
//! of it is answered with the error and the rest of the batch starts a
//! fresh transaction.
//!
//! It does no reads for callers (the read pool does) and never decides
//! about overload (the sender's `try_send` does).

use std::time::{Duration, Instant};

use rusqlite::{Connection, OptionalExtension};
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::{mpsc, oneshot, watch};
use weft_model::NewUplink;

use super::to_i64;
use crate::{CommitOutcome, ProcessedBatch, Result, StoreError};

/// Where the writer sends an operation's answer.
pub(super) type Reply<T> = oneshot::Sender<Result<T>>;

/// One operation, as queued for the writer. Values are already serialised
/// by the caller so the writer thread, the bottleneck, only runs SQL.
pub(super) enum Op {
    /// A write, run in the next transaction; answered after its commit.
    Run(Job),
    /// Stop accepting, commit what is queued, stop; answered last.
    Close(Reply<()>),
}

/// A queued write: its SQL and its caller's reply (built by [`job`]).
pub(super) type Job = Box<dyn Write>;

/// What the writer does with a queued write: run it inside the open
/// transaction, then answer once the transaction's fate is known.
pub(super) trait Write: Send {
    /// Runs the write's SQL inside the open transaction, keeping its
    /// result for the answer. Returns the ingest-log `seq` it appended
    /// (an append that succeeded), which is published before any answer.
    fn run(&mut self, conn: &Connection) -> Option<u64>;

    /// Whether it ran and failed (its answer is an error of its own).
    fn failed(&self) -> bool;

    /// Sends the answer: its result, or `error` instead when the
    /// transaction did not commit (or the write never ran), so whatever it
    /// did is gone. A caller that gave up (dropped its receiver) is not an
    /// error: its write is committed all the same.
    fn answer(self: Box<Self>, error: Option<&str>);
}

/// A write's SQL and `reply` as a [`Job`]. `appended` picks the ingest-log
/// `seq` out of a successful result (appends only; `|_| None` otherwise).
pub(super) fn job<T, F>(sql: F, reply: Reply<T>, appended: fn(&T) -> Option<u64>) -> Job
where
    T: Send + 'static,
    F: FnOnce(&Connection) -> Result<T> + Send + 'static,
{
    Box::new(Queued {
        sql: Some(sql),
        result: None,
        reply,
        appended,
    })
}

/// The [`Write`] of [`job`]: the SQL until it runs, then its result.
struct Queued<T, F> {
    sql: Option<F>,
    result: Option<Result<T>>,
    reply: Reply<T>,
    appended: fn(&T) -> Option<u64>,
}

impl<T, F> Write for Queued<T, F>
where
    T: Send,
    F: FnOnce(&Connection) -> Result<T> + Send,
{
    fn run(&mut self, conn: &Connection) -> Option<u64> {
        let sql = self.sql.take()?;
        let result = sql(conn);
        let appended = result.as_ref().ok().and_then(self.appended);
        self.result = Some(result);
        appended
    }

    fn failed(&self) -> bool {
        matches!(self.result, Some(Err(_)))
    }

    fn answer(self: Box<Self>, error: Option<&str>) {
        let Queued { result, reply, .. } = *self;
        let result = match (error, result) {
            (None, Some(result)) => result,
            (Some(error), _) => Err(StoreError::Database(error.to_string())),
            // The writer answers without an error only what it ran.
            (None, None) => Err(StoreError::Database("the write never ran".to_string())),
        };
        let _ = reply.send(result);
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
        let mut batch: Vec<Job> = Vec::with_capacity(self.max_batch.min(4096));
        let mut done: Vec<Job> = Vec::with_capacity(batch.capacity());
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
    fn gather(&mut self, batch: &mut Vec<Job>, closers: &mut Vec<Reply<()>>) {
        while batch.len() < self.max_batch {
            match self.ops.try_recv() {
                Ok(op) => self.take(op, batch, closers),
                // Empty, or closed and drained: commit what we have.
                Err(TryRecvError::Empty) | Err(TryRecvError::Disconnected) => return,
            }
        }
    }

    /// Adds `op`'s write to the batch, or starts closing for a `Close`.
    fn take(&mut self, op: Op, batch: &mut Vec<Job>, closers: &mut Vec<Reply<()>>) {
        match op {
            Op::Close(reply) => {
                self.ops.close();
                closers.push(reply);
            }
            Op::Run(job) => batch.push(job),
        }
    }

    /// Runs `batch` in one transaction and answers every operation.
    fn run_batch(&mut self, batch: &mut Vec<Job>, done: &mut Vec<Job>) {
        let started = Instant::now();
        let size = batch.len();
        let mut appended: Option<u64> = None;
        if let Err(e) = self.begin() {
            let msg = format!("could not start a transaction: {e}");
            tracing::warn!(error = %e, ops = size, "storage batch failed");
            for job in batch.drain(..) {
                job.answer(Some(&msg));
            }
            return;
        }
        let mut jobs = batch.drain(..);
        while let Some(mut job) = jobs.next() {
            if let Some(seq) = job.run(&self.conn) {
                appended = Some(seq);
            }
            done.push(job);
            if self.conn.is_autocommit() {
                // SQLite rolled the whole transaction back (disk full, I/O
                // error…): nothing executed so far in it survives.
                // The operation that caused it keeps its own error.
                let msg = "the database abandoned the transaction after an error";
                tracing::warn!(ops = done.len(), "{msg}");
                let culprit = done.pop();
                for d in done.drain(..) {
                    d.answer(Some(msg));
                }
                if let Some(culprit) = culprit {
                    if culprit.failed() {
                        culprit.answer(None);
                    } else {
                        culprit.answer(Some(msg));
                    }
                }
                appended = None;
                if let Err(e) = self.begin() {
                    let msg = format!("could not start a transaction: {e}");
                    for job in jobs.by_ref() {
                        job.answer(Some(&msg));
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
                    d.answer(None);
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
                    d.answer(Some(&msg));
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
}

/// Runs `f` inside a savepoint: all of it, or (on error) none of it,
/// without disturbing the rest of the transaction.
pub(super) fn in_savepoint<T>(
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

// --- the writes' SQL ----------------------------------------------------
//
// Still here, called by the handle's trait impls, until each moves to the
// module of its domain.

/// Appends an uplink; answers its new `seq`.
pub(super) fn append(conn: &Connection, uplink: &NewUplink) -> rusqlite::Result<u64> {
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

/// Stores a processed batch and moves its consumer's cursor (in the
/// caller's savepoint: all of it or nothing); answers what was inserted.
pub(super) fn processed(
    conn: &Connection,
    batch: &ProcessedBatch,
) -> rusqlite::Result<CommitOutcome> {
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

/// A unit's JSON as text (it was serialised from a `String`, so this only
/// fails on a caller's bug, reported as an SQL error rather than a panic).
fn json_text(json: &[u8]) -> rusqlite::Result<&str> {
    std::str::from_utf8(json).map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))
}

/// Queues history rows in the feed (nothing for none).
pub(super) fn queue_history(conn: &Connection, rows: &[crate::HistoryRow]) -> rusqlite::Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let json = serde_json::to_string(rows)
        .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
    conn.prepare_cached("INSERT INTO history_feed (rows) VALUES (?1)")?
        .execute([json])?;
    Ok(())
}

/// Creates or replaces an entity.
pub(super) fn put_entity(conn: &Connection, r: &crate::EntityRecord) -> rusqlite::Result<()> {
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

/// Deletes the oldest processed log entries received before the cutoff.
/// `received_at` grows with `seq` (stamped just before the append), so the
/// boundary is the first entry received at or after the cutoff, found by
/// scanning from the oldest entry: the cost is proportional to what is
/// deleted, never to the size of the log. At most [`PRUNE_CHUNK`] entries
/// go per call, so one prune never holds the writer for long.
pub(super) fn prune(
    conn: &Connection,
    below_seq: u64,
    received_before: i64,
) -> rusqlite::Result<u64> {
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
pub(super) fn put_device_type(conn: &Connection, name: &str, json: &str) -> rusqlite::Result<bool> {
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

/// Creates or replaces a device, like [`put_device_type`]; answers
/// "created".
pub(super) fn put_device(
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

/// Runs a delete by key (`sql`); answers "existed".
pub(super) fn delete(conn: &Connection, sql: &str, key: &str) -> rusqlite::Result<bool> {
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
/// are large and rare, wrap it in one ([`append_from_feed`]);
/// the statements cannot fail on their values (strings, integers, optional
/// floats into columns without checks), so only an I/O error can stop an
/// append midway.
pub(super) fn append_history(
    conn: &Connection,
    rows: &[crate::HistoryRow],
) -> rusqlite::Result<u64> {
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

/// Most history rows one [`delete_history`] or [`expire_history`]
/// deletes: a few tens of milliseconds of the writer's time.
pub(super) const HISTORY_DELETE_CHUNK: usize = 50_000;

/// Deletes up to [`HISTORY_DELETE_CHUNK`] rows of the matching entities,
/// entity by entity; an entity whose rows are all gone leaves
/// `history_entities` too. With neither an id nor a type nothing matches
/// (deleting a whole tenant is not an operation of the API).
pub(super) fn delete_history(
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
pub(super) fn expire_history(
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

/// Deletes an entity (tenant, service path, id, type); answers "existed".
pub(super) fn delete_entity(
    conn: &Connection,
    [tenant, path, id, entity_type]: &[String; 4],
) -> rusqlite::Result<bool> {
    conn.prepare_cached(
        "DELETE FROM entities WHERE tenant = ?1 AND service_path = ?2 AND id = ?3 AND type = ?4",
    )
    .and_then(|mut st| st.execute((tenant, path, id, entity_type)))
    .map(|n| n > 0)
}

/// Creates or replaces a document.
pub(super) fn put_document(conn: &Connection, d: &crate::NgsiDocument) -> rusqlite::Result<()> {
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
}

/// Deletes a document (kind, tenant, id); answers "existed".
pub(super) fn delete_document(
    conn: &Connection,
    [kind, tenant, id]: &[String; 3],
) -> rusqlite::Result<bool> {
    conn.prepare_cached("DELETE FROM ngsi_documents WHERE kind = ?1 AND tenant = ?2 AND id = ?3")
        .and_then(|mut st| st.execute((kind, tenant, id)))
        .map(|n| n > 0)
}

/// Queues notified history rows (their JSON) in this file's feed; answers
/// the entry's `seq`.
pub(super) fn queue_notified(conn: &Connection, json: &str) -> rusqlite::Result<u64> {
    conn.prepare_cached("INSERT INTO history_feed (rows) VALUES (?1)")
        .and_then(|mut st| st.insert([json]))
        .map(|seq| seq as u64)
}

/// Drops consumed changes-feed entries; answers how many.
pub(super) fn prune_feed(conn: &Connection, through: u64) -> rusqlite::Result<u64> {
    conn.prepare_cached("DELETE FROM history_feed WHERE seq <= ?1")
        .and_then(|mut st| st.execute([to_i64(through)]))
        .map(|n| n as u64)
}

/// Stores history rows taken from a feed and, with `through`, marks the
/// feed consumed that far (the changes feed's cursor; the notifications
/// feed's entries are deleted, in this same file). Answers how many rows
/// were new.
pub(super) fn append_from_feed(
    conn: &Connection,
    feed: crate::HistoryFeed,
    rows: &[crate::HistoryRow],
    through: Option<u64>,
) -> rusqlite::Result<u64> {
    let n = append_history(conn, rows)?;
    let Some(through) = through else {
        return Ok(n);
    };
    match feed {
        crate::HistoryFeed::Changes => conn
            .prepare_cached(
                "INSERT INTO cursors (name, next_seq) VALUES (?1, ?2) \
                 ON CONFLICT (name) DO UPDATE SET next_seq = excluded.next_seq",
            )?
            .execute((crate::HISTORY_FEED_CURSOR, to_i64(through + 1)))?,
        crate::HistoryFeed::Notifications => conn
            .prepare_cached("DELETE FROM history_feed WHERE seq <= ?1")?
            .execute([to_i64(through)])?,
    };
    Ok(n)
}
