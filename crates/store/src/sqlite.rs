//! The embedded default backend: SQLite files in WAL mode (the ingest log,
//! the history, the channels, and the rest), each written by a single
//! writer thread with group commit and read through a pool.
//!
//! Data flow: ingest endpoints `append_uplink` (answered after the batch
//! holding it commits) → the pipeline wakes on `committed_seq`, reads the
//! log, and `commit_processed`s its units, failures, new devices and
//! cursor in one go → the API reads data units, failures and
//! configuration through the read pool. History (NGSI changes and
//! `/v2/notify`) waits in the history feeds, is moved into its own file by
//! `append_history_from_feed`, and is read back through that file's pool.
//!
//! One module per domain holds the `impl` of that domain's trait and its
//! SQL, reads and writes together: `ingest`, `catalog`, `units`,
//! `context`, `history`, `alarms`, `channels`. Beside them:
//!
//! - [`writer`]: the writer thread, group-committing whatever writes are
//!   queued; it knows no domain.
//! - [`reader`]: the read pool, and the helpers reads share.
//! - [`schema`]: migrations and connection settings.
//! - `checkpointer`: the thread that keeps each file's WAL short.
//!
//! This file holds the configuration, the handle and its files (`Part`: a
//! writer thread, its queue, a read pool), which only route: writes become
//! queued jobs (`try_send`, so a full queue is an immediate `Overloaded`,
//! never a wait), reads become blocking-pool tasks.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use async_trait::async_trait;
use parking_lot::Mutex;
use rusqlite::Connection;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, oneshot, watch};

use crate::{Result, Store, StoreError};

mod alarms;
mod catalog;
mod channels;
mod checkpointer;
mod context;
mod downlinks;
mod history;
mod ingest;
mod keys;
mod outbox;
mod reader;
mod schema;
mod units;
mod writer;

#[cfg(test)]
mod tests;

use reader::ReadPool;
use writer::{Op, Writer};

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
    /// One process opens the data directory: membership and leases are
    /// this node's alone, in memory.
    cluster: crate::cluster::LocalCluster,
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
            None,
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
            // Changes queue their history rows as one feed entry per
            // transaction.
            Some(history::CHANGES_FEED_DEFERRAL),
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
            None,
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
            None,
        )?;
        Ok(SqliteStore {
            log,
            main,
            history,
            channels,
            committed,
            cluster: Default::default(),
        })
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
    #[allow(clippy::too_many_arguments)]
    fn open(
        path: &Path,
        config: &SqliteConfig,
        synchronous: Synchronous,
        page_size: i64,
        background: bool,
        name: &'static str,
        read_connections: usize,
        deferred: Option<writer::Deferred>,
    ) -> Result<(Part, watch::Receiver<u64>)> {
        let mut conn = Connection::open(path).db()?;
        // The history file (the one written in the background) keeps its
        // own, larger page cache.
        let cache_pages = if background {
            schema::HISTORY_WRITER_CACHE_PAGES
        } else {
            schema::WRITER_CACHE_PAGES
        };
        schema::configure_writer(&conn, synchronous, page_size, cache_pages).db()?;
        let version =
            schema::migrate(&mut conn).map_err(|e| StoreError::Database(e.to_string()))?;
        // The writer runs a fixed, small set of statements; keep them all.
        conn.set_prepared_statement_cache_capacity(64);
        let last_seq = ingest::highest_seq(&conn).db()?;
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
            deferred,
            name,
        );
        // The history's file is written in large batches every half
        // second: checkpointing it less often copies each hot page once per
        // pass instead of several times, at lower priority like its writer.
        let period = if background {
            checkpointer::BACKGROUND_PERIOD
        } else {
            checkpointer::PERIOD
        };
        checkpointer::spawn(path, period, background, restart_wal, stopped.clone())
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

    /// Runs a read on this file's pool.
    async fn read<T>(&self, f: impl FnOnce(&Connection) -> Result<T> + Send + 'static) -> Result<T>
    where
        T: Send + 'static,
    {
        self.reads.run(f).await
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

pub(crate) use crate::to_i64;

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

pub(crate) use crate::encode;

#[async_trait]
impl crate::ClusterStore for SqliteStore {
    async fn heartbeat(
        &self,
        node: &crate::NodeInfo,
        forget_after: std::time::Duration,
    ) -> Result<()> {
        self.cluster.heartbeat(node, forget_after).await
    }

    async fn claim_lease(
        &self,
        work: &str,
        node: &str,
        ttl: std::time::Duration,
        load: f64,
    ) -> Result<bool> {
        self.cluster.claim_lease(work, node, ttl, load).await
    }

    async fn release_lease(&self, work: &str, node: &str) -> Result<()> {
        self.cluster.release_lease(work, node).await
    }

    async fn cluster_view(&self) -> Result<crate::ClusterView> {
        self.cluster.cluster_view().await
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
