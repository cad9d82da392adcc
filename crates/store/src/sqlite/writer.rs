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

use rusqlite::Connection;
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::{mpsc, oneshot, watch};

use crate::{Result, StoreError};

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

/// Work a part's writes defer to the end of their transaction, done once
/// for all of them just before `COMMIT` (the main file's history feed: one
/// entry per transaction instead of one per change). The writes leave
/// their share on the writer thread ([`thread_local!`] state of the
/// module that owns the SQL); the writer drops the share of a write that
/// fails and of a transaction SQLite abandons, and flushes the rest.
#[derive(Clone, Copy)]
pub(super) struct Deferred {
    /// Where the next write's share starts.
    pub mark: fn() -> usize,
    /// Drops what was deferred since `mark`.
    pub truncate: fn(usize),
    /// Writes what was deferred, inside the open transaction, and forgets
    /// it (also on failure).
    pub flush: fn(&Connection) -> rusqlite::Result<()>,
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
    /// What this part's writes defer to the end of their transaction.
    deferred: Option<Deferred>,
    /// The file's name in metrics (`writer` label): `log`, `main`, …
    name: &'static str,
}

impl Writer {
    /// A writer over an open, migrated connection.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        conn: Connection,
        ops: mpsc::Receiver<Op>,
        max_batch: usize,
        commit_interval: Duration,
        restart_wal: std::sync::Arc<std::sync::atomic::AtomicBool>,
        committed: watch::Sender<u64>,
        stopped: watch::Sender<bool>,
        deferred: Option<Deferred>,
        name: &'static str,
    ) -> Writer {
        Writer {
            conn,
            ops,
            max_batch: max_batch.max(1),
            commit_interval,
            restart_wal,
            committed,
            stopped,
            deferred,
            name,
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
            let mark = self.deferred.map(|d| (d.mark)());
            if let Some(seq) = job.run(&self.conn) {
                appended = Some(seq);
            }
            if let (Some(d), Some(mark)) = (self.deferred, mark) {
                if job.failed() {
                    (d.truncate)(mark);
                }
            }
            done.push(job);
            if self.conn.is_autocommit() {
                if let Some(d) = self.deferred {
                    (d.truncate)(0);
                }
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
        let flushed = match self.deferred {
            Some(d) => (d.flush)(&self.conn),
            None => Ok(()),
        };
        let syncing = Instant::now();
        match flushed.and_then(|()| self.commit()) {
            Ok(()) => {
                // The COMMIT statement alone: the WAL's write and fsync.
                metrics::histogram!("weft_store_sync_seconds", "writer" => self.name)
                    .record(syncing.elapsed().as_secs_f64());
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
                let name = self.name;
                metrics::counter!("weft_store_commits_total", "writer" => name).increment(1);
                metrics::histogram!("weft_store_batch_size", "writer" => name).record(size as f64);
                metrics::histogram!("weft_store_commit_seconds", "writer" => name)
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
        metrics::histogram!("weft_store_wal_restart_seconds", "writer" => self.name)
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
