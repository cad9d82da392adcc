//! The embedded default backend: SQLite files in WAL mode (the ingest log,
//! the history, and the rest), each written by a single writer thread with
//! group commit and read through a pool.
//!
//! Data flow: ingest endpoints `append_uplink` (answered after the batch
//! holding it commits) → the pipeline wakes on `committed_seq`, reads the
//! log, and `commit_processed`s its units, failures, new devices and
//! cursor in one go → the API reads data units, failures and
//! configuration through the read pool. History (NGSI changes and
//! `/v2/notify`) goes to its own file through `append_history` and is read
//! back through that file's pool.
//!
//! - [`writer`]: the writer thread and every write's SQL.
//! - [`reader`]: the read pool and every read's SQL.
//! - [`schema`]: migrations and connection settings.
//!
//! This file holds the configuration and the handle, which only routes:
//! writes become queued operations (`try_send`, so a full queue is an
//! immediate `Overloaded`, never a wait), reads become blocking-pool tasks.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use async_trait::async_trait;
use parking_lot::Mutex;
use rusqlite::Connection;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, oneshot, watch};
use weft_model::{Device, DeviceType, FailedUplink, NewUplink, Uplink};

use crate::{
    CatalogStore, ChannelStore, CommitOutcome, ContextStore, DataQuery, DeviceFilter, FailedQuery,
    HistoryStore, IngestLogStore, ProcessedBatch, Result, RuleStore, Store, StoreError, StoredUnit,
    UnitStore,
};

mod alarms;
mod channels;
mod checkpointer;
mod reader;
mod schema;
mod writer;

#[cfg(test)]
mod tests;

use reader::ReadPool;
use writer::{in_savepoint, Op, Writer};

/// How SQLite syncs commits to disk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Synchronous {
    /// fsync the WAL on every commit: an acknowledged write survives a
    /// power cut. The default, because weft acknowledges uplinks with 202
    /// only once stored. Group commit keeps its cost per batch, not per
    /// write.
    #[default]
    Full,
    /// fsync only at checkpoints: still safe against a crash of weft
    /// itself, but the last commits can be lost on a power cut or an OS
    /// crash. For deployments that prefer throughput to that guarantee.
    Normal,
}

/// Settings of the SQLite backend. The defaults need no setup: the
/// database is created under `./weft-data/` on first start.
#[derive(Debug, Clone, PartialEq)]
pub struct SqliteConfig {
    /// The database file; its parent directory is created if missing.
    pub path: PathBuf,
    /// Read-only connections for queries. WAL readers do not block each
    /// other or the writer, so this bounds read parallelism only; a few
    /// are enough for the API's queries on small machines.
    pub read_connections: usize,
    /// fsync policy of commits.
    pub synchronous: Synchronous,
    /// Write operations that may wait for the writer. When it is full,
    /// writes fail at once with `Overloaded` (the API answers 503 with
    /// `Retry-After`) instead of queueing without bound. 65,536 covers
    /// about a second of ingest at the target rate, so short stalls
    /// (checkpoints, a slow disk) are absorbed rather than shed.
    pub queue_capacity: usize,
    /// Most operations committed in one transaction. Bounds how long one
    /// commit holds the waiters of all its operations; 4,096 is far above
    /// what one fsync needs to amortise.
    pub max_batch: usize,
    /// Shortest time between the starts of two commits. A write arriving
    /// sooner after the previous commit waits for the rest of the interval
    /// and shares the next commit with everything queued meanwhile; a write
    /// arriving after a quiet spell commits at once. This caps commits (each
    /// a WAL write and an fsync, the writer's main cost) at 1/interval per
    /// second, so batches grow with load instead of commits multiplying.
    pub commit_interval: std::time::Duration,
}

impl Default for SqliteConfig {
    fn default() -> Self {
        SqliteConfig {
            path: PathBuf::from("weft-data/weft.db"),
            read_connections: 4,
            synchronous: Synchronous::Full,
            queue_capacity: 65_536,
            max_batch: 4_096,
            commit_interval: std::time::Duration::from_millis(1),
        }
    }
}

/// The SQLite [`Store`]. Share it behind an `Arc`; dropping the last
/// handle lets the writers commit what is queued and stop on their own,
/// and [`Store::close`] does the same but waits for them.
///
/// It keeps three database files, each with its own writer thread: the
/// ingest log (`<name>-log.db` beside the configured file), the history
/// (`<name>-history.db`), and everything else. A 202 then waits only for a
/// cheap sequential append, never behind a pipeline batch's index updates,
/// and a history notify never behind either. Atomicity needs nothing
/// across the files: the pipeline's cursor lives with the data units it
/// covers, the log is only ever appended to and pruned below that cursor,
/// and history rows are idempotent by key and stand alone.
pub struct SqliteStore {
    log: Part,
    main: Part,
    history: Part,
    channels: Part,
    committed: watch::Receiver<u64>,
}

/// One database file: its writer thread, its queue and its read pool.
struct Part {
    ops: mpsc::Sender<Op>,
    stopped: watch::Receiver<bool>,
    reads: Arc<ReadPool>,
    writer: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("committed_seq", &*self.committed.borrow())
            .finish_non_exhaustive()
    }
}

/// The ingest log's file beside the main one: `weft.db` → `weft-log.db`.
fn log_path(main: &Path) -> PathBuf {
    sibling(main, "log")
}

/// The history's file beside the main one: `weft.db` → `weft-history.db`.
fn history_path(main: &Path) -> PathBuf {
    sibling(main, "history")
}

/// The channels' file beside the main one: `weft.db` → `weft-channels.db`.
fn channels_path(main: &Path) -> PathBuf {
    sibling(main, "channels")
}

/// `<stem>-<part>.db` in the main file's directory.
fn sibling(main: &Path, part: &str) -> PathBuf {
    let stem = main.file_stem().and_then(|s| s.to_str()).unwrap_or("weft");
    main.with_file_name(format!("{stem}-{part}.db"))
}

impl SqliteStore {
    /// Opens (creating if needed) and migrates the databases, then starts
    /// the writer threads. Blocking: call it at startup, before serving.
    pub fn open(config: SqliteConfig) -> Result<SqliteStore> {
        if let Some(parent) = config.path.parent() {
            if !parent.as_os_str().is_empty() {
                std::fs::create_dir_all(parent).map_err(|e| {
                    StoreError::Database(format!("cannot create {}: {e}", parent.display()))
                })?;
            }
        }
        let (log, committed) = Part::open(
            &log_path(&config.path),
            &config,
            config.synchronous,
            schema::PAGE_SIZE,
            false,
            "log",
            2,
        )?;
        // Everything in the main file can be rebuilt from the log: a commit
        // lost to a power cut takes the pipeline's cursor back with it, and
        // the pipeline processes those uplinks again (the log keeps them far
        // longer than the next checkpoint, which makes the main file
        // durable). So only the log pays an fsync per commit.
        let (main, _) = Part::open(
            &config.path,
            &config,
            Synchronous::Normal,
            schema::PAGE_SIZE,
            false,
            "main",
            config.read_connections,
        )?;
        // History: a notify's 200 and the feed's cursor need to survive a
        // crash of weft, which NORMAL gives (like the main file); its writer
        // runs at a lower priority, see `lower_thread_priority`.
        let (history, _) = Part::open(
            &history_path(&config.path),
            &config,
            Synchronous::Normal,
            schema::HISTORY_PAGE_SIZE,
            true,
            "history",
            config.read_connections,
        )?;
        // Channels: a publish's 200 promises the message survives, like an
        // uplink's 202, so this file syncs as the ingest log does.
        let (channels, _) = Part::open(
            &channels_path(&config.path),
            &config,
            config.synchronous,
            schema::PAGE_SIZE,
            false,
            "channels",
            config.read_connections,
        )?;
        Ok(SqliteStore {
            log,
            main,
            history,
            channels,
            committed,
        })
    }
}

impl SqliteStore {
    /// Runs a chunked delete of the history (`writer::delete_history`,
    /// `writer::expire_history`: at most `HISTORY_DELETE_CHUNK` rows, in a
    /// savepoint) again and again, each chunk its own transaction, until a
    /// chunk is not full; answers the total. A large delete then never
    /// holds the writer (and every notify waiting on it) for long, and
    /// appends keep flowing meanwhile. Deleting is idempotent, so a failure
    /// midway leaves a state a retry completes.
    async fn delete_history_in_chunks<F>(&self, chunk: F) -> Result<u64>
    where
        F: Fn(&Connection) -> rusqlite::Result<u64> + Clone + Send + 'static,
    {
        let mut total = 0;
        loop {
            let chunk = chunk.clone();
            let deleted = self.history.write(move |c| in_savepoint(c, chunk)).await?;
            total += deleted;
            if deleted < writer::HISTORY_DELETE_CHUNK as u64 {
                return Ok(total);
            }
        }
    }
}

/// Lowers the calling thread's scheduling priority (nice +5): the history
/// writer's big batches then give way to latency-sensitive threads (HTTP,
/// the pipeline, the other writers) when the cores are busy, and catch up
/// when they are not. On Linux `nice` applies to the calling thread only.
fn lower_thread_priority() {
    // SAFETY: `nice` only changes the calling thread's priority; its
    // failure (e.g. not permitted) leaves the priority as it was.
    let _ = unsafe { libc::nice(5) };
}

impl Part {
    /// Opens and migrates one file and starts its writer and checkpointer.
    /// Returns the part and the watch of its highest committed log `seq`.
    fn open(
        path: &Path,
        config: &SqliteConfig,
        synchronous: Synchronous,
        page_size: i64,
        background: bool,
        name: &str,
        read_connections: usize,
    ) -> Result<(Part, watch::Receiver<u64>)> {
        let mut conn = Connection::open(path).db()?;
        schema::configure_writer(&conn, synchronous, page_size).db()?;
        let version =
            schema::migrate(&mut conn).map_err(|e| StoreError::Database(e.to_string()))?;
        // The writer runs a fixed, small set of statements; keep them all.
        conn.set_prepared_statement_cache_capacity(64);
        let last_seq = highest_seq(&conn).db()?;
        let reads = Arc::new(ReadPool::open(path, read_connections)?);

        let (ops_tx, ops_rx) = mpsc::channel(config.queue_capacity.max(1));
        let (committed_tx, committed) = watch::channel(last_seq);
        let (stopped_tx, stopped) = watch::channel(false);
        let restart_wal = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = Writer::new(
            conn,
            ops_rx,
            config.max_batch,
            config.commit_interval,
            restart_wal.clone(),
            committed_tx,
            stopped_tx,
        );
        checkpointer::spawn(path, restart_wal, stopped.clone())
            .map_err(|e| StoreError::Database(format!("cannot start the checkpointer: {e}")))?;
        let handle = std::thread::Builder::new()
            .name(format!("weft-store-{name}"))
            .spawn(move || {
                if background {
                    lower_thread_priority();
                }
                writer.run()
            })
            .map_err(|e| StoreError::Database(format!("cannot start the writer thread: {e}")))?;
        tracing::info!(
            path = %path.display(),
            schema_version = version,
            last_seq,
            ?synchronous,
            "opened the SQLite store"
        );
        let part = Part {
            ops: ops_tx,
            stopped,
            reads,
            writer: Mutex::new(Some(handle)),
        };
        Ok((part, committed))
    }

    /// Queues a write and waits for its answer, which comes after the
    /// commit. `sql` runs on the writer thread, inside its transaction.
    async fn write<T, R>(&self, sql: impl FnOnce(&Connection) -> R + Send + 'static) -> Result<T>
    where
        T: Send + 'static,
        R: Db<T>,
    {
        self.queue(move |conn| sql(conn).db(), |_| None).await
    }

    /// [`Part::write`] for an append to the ingest log: the writer
    /// publishes the `seq` it answers as `committed_seq` before answering.
    async fn append(
        &self,
        sql: impl FnOnce(&Connection) -> rusqlite::Result<u64> + Send + 'static,
    ) -> Result<u64> {
        self.queue(move |conn| sql(conn).db(), |seq| Some(*seq))
            .await
    }

    /// Queues a write built around its reply channel and waits for the
    /// answer, which comes after the commit.
    async fn queue<T>(
        &self,
        sql: impl FnOnce(&Connection) -> Result<T> + Send + 'static,
        appended: fn(&T) -> Option<u64>,
    ) -> Result<T>
    where
        T: Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        match self
            .ops
            .try_send(Op::Run(writer::job(sql, reply, appended)))
        {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => return Err(StoreError::Overloaded),
            Err(TrySendError::Closed(_)) => return Err(StoreError::Closed),
        }
        // The writer drops replies only when it dies.
        answer.await.unwrap_or(Err(StoreError::Closed))
    }

    /// Round-trips through a (possibly empty) commit.
    async fn ping(&self) -> Result<()> {
        self.write(|_| Ok::<_, StoreError>(())).await
    }

    /// Stops accepting writes, lets the writer commit what is queued, and
    /// waits for its thread.
    async fn close(&self) {
        // `send`, not `try_send`: shutting down may wait for queue room.
        // It fails only if the writer already stopped accepting.
        let (reply, answer) = oneshot::channel();
        if self.ops.send(Op::Close(reply)).await.is_ok() {
            let _ = answer.await;
        }
        // A concurrent or repeated close waits for the same end. An error
        // means the writer is gone, which is the end too.
        let mut stopped = self.stopped.clone();
        let _ = stopped.wait_for(|stopped| *stopped).await;
        let handle = self.writer.lock().take();
        if let Some(handle) = handle {
            let joined = tokio::task::spawn_blocking(move || handle.join()).await;
            if !matches!(joined, Ok(Ok(()))) {
                tracing::error!("the storage writer thread panicked");
            }
        }
    }
}

/// The highest `seq` the ingest log ever handed out: SQLite's
/// `AUTOINCREMENT` counter, which survives pruning (so the value never
/// goes back after a restart), or the log's maximum.
fn highest_seq(conn: &Connection) -> rusqlite::Result<u64> {
    conn.query_row(
        "SELECT MAX(COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'ingest_log'), 0), \
                    COALESCE((SELECT MAX(seq) FROM ingest_log), 0))",
        [],
        |row| row.get::<_, i64>(0),
    )
    .map(|n| n.max(0) as u64)
}

/// `u64` positions as SQLite integers. Positions never come near
/// `i64::MAX`; a caller passing a larger bound ("everything") gets the
/// largest integer instead of an error.
fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// rusqlite errors as [`StoreError`]s, without making rusqlite part of
/// the crate's public API.
trait Db<T> {
    fn db(self) -> Result<T>;
}

impl<T> Db<T> for rusqlite::Result<T> {
    fn db(self) -> Result<T> {
        self.map_err(|e| StoreError::Database(e.to_string()))
    }
}

/// Results already in the store's terms, as they are (so [`Part::write`]
/// takes either kind).
impl<T> Db<T> for Result<T> {
    fn db(self) -> Result<T> {
        self
    }
}

fn encode<T: Serialize>(what: &str, value: &T) -> Result<String> {
    serde_json::to_string(value).map_err(|e| StoreError::Corrupt(format!("{what}: {e}")))
}

#[async_trait]
impl IngestLogStore for SqliteStore {
    async fn append_uplink(&self, uplink: NewUplink) -> Result<u64> {
        self.log.append(move |c| writer::append(c, &uplink)).await
    }

    fn committed_seq(&self) -> watch::Receiver<u64> {
        self.committed.clone()
    }

    async fn read_uplinks(&self, from_seq: u64, limit: usize) -> Result<Vec<Uplink>> {
        self.log
            .reads
            .run(move |c| reader::read_uplinks(c, from_seq, limit))
            .await
    }

    async fn prune_uplinks(&self, below_seq: u64, received_before: i64) -> Result<u64> {
        self.log
            .write(move |c| writer::prune(c, below_seq, received_before))
            .await
    }
}

#[async_trait]
impl CatalogStore for SqliteStore {
    async fn put_device_type(&self, name: &str, device_type: &DeviceType) -> Result<bool> {
        let json = encode("device type", device_type)?;
        let name = name.to_string();
        self.main
            .write(move |c| writer::put_device_type(c, &name, &json))
            .await
    }

    async fn get_device_type(&self, name: &str) -> Result<Option<DeviceType>> {
        let name = name.to_string();
        self.main
            .reads
            .run(move |c| reader::get_device_type(c, &name))
            .await
    }

    async fn list_device_types(&self) -> Result<Vec<(String, DeviceType)>> {
        self.main.reads.run(reader::list_device_types).await
    }

    async fn delete_device_type(&self, name: &str) -> Result<bool> {
        let name = name.to_string();
        self.main
            .write(move |c| writer::delete(c, "DELETE FROM device_types WHERE name = ?1", &name))
            .await
    }

    async fn put_device(&self, device: &Device) -> Result<bool> {
        let json = encode("device", device)?;
        let (id, device_type, channel) = (
            device.id.clone(),
            device.device_type.clone(),
            device.channel.clone(),
        );
        self.main
            .write(move |c| writer::put_device(c, &id, &device_type, &channel, &json))
            .await
    }

    async fn get_device(&self, id: &str) -> Result<Option<Device>> {
        let id = id.to_string();
        self.main
            .reads
            .run(move |c| reader::get_device(c, &id))
            .await
    }

    async fn list_devices(&self, filter: &DeviceFilter) -> Result<Vec<Device>> {
        let filter = filter.clone();
        self.main
            .reads
            .run(move |c| reader::list_devices(c, &filter))
            .await
    }

    async fn delete_device(&self, id: &str) -> Result<bool> {
        let id = id.to_string();
        self.main
            .write(move |c| writer::delete(c, "DELETE FROM devices WHERE id = ?1", &id))
            .await
    }
}

#[async_trait]
impl UnitStore for SqliteStore {
    async fn cursor(&self, consumer: &str) -> Result<u64> {
        let consumer = consumer.to_string();
        self.main
            .reads
            .run(move |c| reader::cursor(c, &consumer))
            .await
    }

    async fn commit_processed(&self, batch: Arc<ProcessedBatch>) -> Result<CommitOutcome> {
        self.main
            .write(move |c| in_savepoint(c, |c| writer::processed(c, &batch)))
            .await
    }

    async fn query_data(&self, query: &DataQuery) -> Result<Vec<StoredUnit>> {
        let query = query.clone();
        self.main
            .reads
            .run(move |c| reader::query_data(c, &query))
            .await
    }

    async fn get_data(&self, data_id: &str) -> Result<Option<StoredUnit>> {
        let data_id = data_id.to_string();
        self.main
            .reads
            .run(move |c| reader::get_data(c, &data_id))
            .await
    }

    async fn query_failed(&self, query: &FailedQuery) -> Result<Vec<FailedUplink>> {
        let query = query.clone();
        self.main
            .reads
            .run(move |c| reader::query_failed(c, &query))
            .await
    }

    async fn data_head(&self) -> Result<u64> {
        self.main
            .reads
            .run(|c| alarms::max_seq(c, alarms::DATA_HEAD))
            .await
    }
}

#[async_trait]
impl ContextStore for SqliteStore {
    async fn put_entity(
        &self,
        record: crate::EntityRecord,
        history: Vec<crate::HistoryRow>,
    ) -> Result<()> {
        self.main
            .write(move |c| {
                writer::put_entity(c, &record).and_then(|()| writer::queue_history(c, &history))
            })
            .await
    }

    async fn delete_entity(
        &self,
        tenant: &str,
        service_path: &str,
        id: &str,
        entity_type: &str,
    ) -> Result<bool> {
        let key = [tenant, service_path, id, entity_type].map(str::to_string);
        self.main
            .write(move |c| writer::delete_entity(c, &key))
            .await
    }

    async fn load_entities(&self) -> Result<Vec<crate::EntityRecord>> {
        self.main.reads.run(reader::load_entities).await
    }

    async fn put_document(&self, document: crate::NgsiDocument) -> Result<()> {
        self.main
            .write(move |c| writer::put_document(c, &document))
            .await
    }

    async fn delete_document(
        &self,
        kind: crate::DocumentKind,
        tenant: &str,
        id: &str,
    ) -> Result<bool> {
        let key = [kind.as_str(), tenant, id].map(str::to_string);
        self.main
            .write(move |c| writer::delete_document(c, &key))
            .await
    }

    async fn load_documents(&self, kind: crate::DocumentKind) -> Result<Vec<crate::NgsiDocument>> {
        self.main
            .reads
            .run(move |c| reader::load_documents(c, kind))
            .await
    }
}

#[async_trait]
impl HistoryStore for SqliteStore {
    async fn read_history_feed(
        &self,
        feed: crate::HistoryFeed,
        after: u64,
        max_rows: usize,
    ) -> Result<Vec<(u64, Vec<crate::HistoryRow>)>> {
        let part = match feed {
            crate::HistoryFeed::Changes => &self.main,
            crate::HistoryFeed::Notifications => &self.history,
        };
        part.reads
            .run(move |c| reader::read_history_feed(c, after, max_rows))
            .await
    }

    async fn append_history_from_feed(
        &self,
        feed: crate::HistoryFeed,
        rows: Vec<crate::HistoryRow>,
        through: Option<u64>,
    ) -> Result<u64> {
        self.history
            .write(move |c| in_savepoint(c, |c| writer::append_from_feed(c, feed, &rows, through)))
            .await
    }

    async fn history_feed_cursor(&self, feed: crate::HistoryFeed) -> Result<u64> {
        if feed == crate::HistoryFeed::Notifications {
            return Ok(0);
        }
        // Stored as the next position to read, like the pipeline's (1 when
        // nothing was consumed yet).
        let next = self
            .history
            .reads
            .run(|c| reader::cursor(c, crate::HISTORY_FEED_CURSOR))
            .await?;
        Ok(next.saturating_sub(1))
    }

    async fn prune_history_feed(&self, through: u64) -> Result<u64> {
        self.main
            .write(move |c| writer::prune_feed(c, through))
            .await
    }

    async fn queue_history(&self, rows: Vec<crate::HistoryRow>) -> Result<u64> {
        let json = serde_json::to_string(&rows)
            .map_err(|e| StoreError::Database(format!("history rows: {e}")))?;
        self.history
            .write(move |c| writer::queue_notified(c, &json))
            .await
    }

    async fn append_history(&self, rows: Vec<crate::HistoryRow>) -> Result<u64> {
        if rows.is_empty() {
            return Ok(0);
        }
        self.history
            .write(move |c| writer::append_history(c, &rows))
            .await
    }

    async fn query_history(&self, query: &crate::HistoryQuery) -> Result<Vec<crate::HistoryRow>> {
        let query = query.clone();
        self.history
            .reads
            .run(move |c| reader::query_history(c, &query))
            .await
    }

    async fn aggregate_history(
        &self,
        query: &crate::HistoryQuery,
        method: crate::AggrMethod,
        period: Option<crate::AggrPeriod>,
    ) -> Result<Vec<crate::HistoryAggregate>> {
        let query = query.clone();
        self.history
            .reads
            .run(move |c| reader::aggregate_history(c, &query, method, period))
            .await
    }

    async fn history_entities(
        &self,
        tenant: &str,
        entity_type: Option<&str>,
        service_path: Option<&str>,
    ) -> Result<Vec<crate::HistoryEntity>> {
        let tenant = tenant.to_string();
        let entity_type = entity_type.map(str::to_string);
        let service_path = service_path.map(str::to_string);
        self.history
            .reads
            .run(move |c| {
                reader::history_entities(
                    c,
                    &tenant,
                    entity_type.as_deref(),
                    service_path.as_deref(),
                )
            })
            .await
    }

    async fn delete_history(
        &self,
        tenant: &str,
        entity_id: Option<&str>,
        entity_type: Option<&str>,
    ) -> Result<u64> {
        let (tenant, entity_id, entity_type) = (
            tenant.to_string(),
            entity_id.map(str::to_string),
            entity_type.map(str::to_string),
        );
        self.delete_history_in_chunks(move |c| {
            writer::delete_history(c, &tenant, entity_id.as_deref(), entity_type.as_deref())
        })
        .await
    }

    async fn expire_history(
        &self,
        tenant: &str,
        rows_before: Option<i64>,
        rollups_before: Option<i64>,
    ) -> Result<u64> {
        let tenant = tenant.to_string();
        self.delete_history_in_chunks(move |c| {
            writer::expire_history(c, &tenant, rows_before, rollups_before)
        })
        .await
    }

    async fn history_tenants(&self) -> Result<Vec<String>> {
        self.history
            .reads
            .run(|c| {
                c.prepare_cached("SELECT DISTINCT tenant FROM history_entities ORDER BY tenant")
                    .and_then(|mut st| {
                        st.query_map([], |r| r.get(0))?
                            .collect::<rusqlite::Result<Vec<String>>>()
                    })
                    .db()
            })
            .await
    }
}

#[async_trait]
impl RuleStore for SqliteStore {
    async fn put_rule(&self, id: &str, json: String) -> Result<bool> {
        let id = id.to_string();
        self.main
            .write(move |c| alarms::put_rule(c, &id, &json))
            .await
    }

    async fn delete_rule(&self, id: &str) -> Result<bool> {
        let id = id.to_string();
        self.main.write(move |c| alarms::delete_rule(c, &id)).await
    }

    async fn load_rules(&self) -> Result<Vec<(String, String)>> {
        self.main.reads.run(alarms::load_rules).await
    }

    async fn load_rule_states(&self) -> Result<Vec<crate::RuleStateRecord>> {
        self.main.reads.run(alarms::load_rule_states).await
    }

    async fn commit_alarms(&self, batch: crate::AlarmBatch) -> Result<u64> {
        self.main
            .write(move |c| in_savepoint(c, |c| alarms::commit_alarms(c, &batch)))
            .await
    }

    async fn get_alarm(&self, id: &str) -> Result<Option<String>> {
        let id = id.to_string();
        self.main
            .reads
            .run(move |c| alarms::get_alarm(c, &id))
            .await
    }

    async fn query_alarms(&self, query: &crate::AlarmQuery) -> Result<Vec<String>> {
        let query = query.clone();
        self.main
            .reads
            .run(move |c| alarms::query_alarms(c, &query))
            .await
    }

    async fn active_alarms(&self) -> Result<Vec<String>> {
        self.main.reads.run(alarms::active_alarms).await
    }

    async fn alarm_events_head(&self) -> Result<u64> {
        self.main
            .reads
            .run(|c| alarms::max_seq(c, alarms::ALARM_EVENTS_HEAD))
            .await
    }

    async fn alarm_events(&self, after: u64, limit: usize) -> Result<Vec<(u64, String)>> {
        self.main
            .reads
            .run(move |c| alarms::alarm_events(c, after, limit))
            .await
    }
}

#[async_trait]
impl ChannelStore for SqliteStore {
    async fn publish_message(
        &self,
        channel: &str,
        message_id: &str,
        content: String,
    ) -> Result<Option<u64>> {
        let (channel, message_id) = (channel.to_string(), message_id.to_string());
        self.channels
            .write(move |c| {
                channels::publish(c, &channel, &message_id, &content, weft_model::now_ms())
            })
            .await
    }

    async fn put_channel_subscriber(
        &self,
        channel: &str,
        subscriber: &str,
        cursor: u64,
    ) -> Result<u64> {
        let (channel, subscriber) = (channel.to_string(), subscriber.to_string());
        self.channels
            .write(move |c| channels::subscribe(c, &channel, &subscriber, cursor))
            .await
    }

    async fn delete_channel_subscriber(&self, channel: &str, subscriber: &str) -> Result<bool> {
        let (channel, subscriber) = (channel.to_string(), subscriber.to_string());
        self.channels
            .write(move |c| channels::unsubscribe(c, &channel, &subscriber))
            .await
    }

    async fn ack_channel_messages(
        &self,
        channel: &str,
        subscriber: &str,
        through: u64,
    ) -> Result<()> {
        let (channel, subscriber) = (channel.to_string(), subscriber.to_string());
        self.channels
            .write(move |c| channels::ack(c, &channel, &subscriber, through))
            .await
    }

    async fn prune_channel(&self, channel: &str, through: u64) -> Result<u64> {
        let channel = channel.to_string();
        self.channels
            .write(move |c| channels::prune(c, &channel, through))
            .await
    }

    async fn channel_messages(
        &self,
        channel: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<crate::ChannelMessage>> {
        let channel = channel.to_string();
        self.channels
            .reads
            .run(move |c| channels::messages(c, &channel, after, limit))
            .await
    }

    async fn channel_subscribers(&self) -> Result<Vec<crate::ChannelSubscriber>> {
        self.channels.reads.run(channels::subscribers).await
    }

    async fn channel_heads(&self) -> Result<(Vec<(String, u64)>, u64)> {
        self.channels.reads.run(channels::heads).await
    }
}

#[async_trait]
impl Store for SqliteStore {
    async fn ping(&self) -> Result<()> {
        self.log.ping().await?;
        self.main.ping().await?;
        self.history.ping().await?;
        self.channels.ping().await
    }

    async fn close(&self) {
        self.log.close().await;
        self.main.close().await;
        self.history.close().await;
        self.channels.close().await;
    }
}
