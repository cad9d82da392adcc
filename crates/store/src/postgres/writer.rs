//! A PostgreSQL writer: one task that owns one connection and turns
//! whatever writes are queued into one transaction (group commit), as the
//! SQLite backend's writer thread does for its file.
//!
//! Why writers at all, when PostgreSQL takes concurrent transactions: the
//! consumers of weft's logs (the pipeline on the ingest log, the history
//! mover on its feeds, channel subscribers, alarm bridges) read forward
//! from a `seq`. With concurrent writers, a transaction holding `seq` 9
//! can commit after the one holding 10, and a reader that already moved
//! past 10 would never see 9. One writer per log commits its `seq`s in
//! order on one node; across nodes, the logs are read up to their
//! horizons (`postgres/horizon.rs`), for which every transaction of their
//! writers takes its id first ([`WriterConfig::opening`]) on a connection
//! named for the log ([`WriterConfig::session`]). Group commit then makes durable writes
//! cheap: one commit (one WAL flush) answers every write of the batch, and
//! a write is answered only after that commit returned.
//!
//! Failure isolation: every write runs inside its own `SAVEPOINT`, so a
//! failing write (a constraint, a bad value) is rolled back alone and the
//! rest of the batch commits. The savepoint statements ride along with the
//! writes' own: `BEGIN; SAVEPOINT` opens the batch, `RELEASE; SAVEPOINT`
//! goes out pipelined just ahead of the next write's first statement, and
//! `COMMIT` releases the last, so a write that succeeds waits for no
//! savepoint round trip of its own. If the connection breaks, every write
//! of the batch is answered with the error (nothing of it committed) and the
//! writer connects again before the next batch.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::conn::Conn;
use futures::future::BoxFuture;
use parking_lot::Mutex;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tokio::task::JoinHandle;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use super::schema::db;
use super::Connector;
use crate::{Result, StoreError};

/// A statement's parameters, owned, so that a queued write can carry
/// them to the writer's task ([`Writer::execute`]).
pub(super) type Params = Vec<Box<dyn ToSql + Send + Sync>>;

/// One owned statement parameter, for [`Params`].
pub(super) fn param<T: ToSql + Send + Sync + 'static>(value: T) -> Box<dyn ToSql + Send + Sync> {
    Box::new(value)
}

/// Owned parameters as the client takes them.
fn borrowed(params: &Params) -> Vec<&(dyn ToSql + Sync)> {
    params.iter().map(|p| &**p as &(dyn ToSql + Sync)).collect()
}

/// One queued write: its SQL, run on the writer's connection inside the
/// open transaction, or, when the batch never got that far, answered with
/// the reason.
pub(super) type Job = Box<dyn QueuedWrite>;

/// What the writer task does with a queued write; implemented by
/// [`Queued`] for every write's closure and answer type.
pub(super) trait QueuedWrite: Send {
    /// Runs the write; what to answer waits for the transaction.
    fn run<'c>(self: Box<Self>, client: &'c Conn) -> BoxFuture<'c, Pending>;
    /// Answers with `error` without running.
    fn fail(self: Box<Self>, error: &str);
}

/// A write's closure with its reply channel.
struct Queued<T, F> {
    write: F,
    reply: oneshot::Sender<Result<T>>,
}

impl<T, F> QueuedWrite for Queued<T, F>
where
    T: Send + 'static,
    F: for<'c> FnOnce(&'c Conn) -> BoxFuture<'c, Result<T>> + Send + 'static,
{
    fn run<'c>(self: Box<Self>, client: &'c Conn) -> BoxFuture<'c, Pending> {
        let Queued { write, reply } = *self;
        Box::pin(async move { Pending::new(write(client).await, reply) })
    }

    fn fail(self: Box<Self>, error: &str) {
        let _ = self
            .reply
            .send(Err(StoreError::Database(error.to_string())));
    }
}

/// Sends a write's result (`None`) or an error that replaced it.
pub(super) type Answer = Box<dyn FnOnce(Option<&str>) + Send>;

/// A write that ran, waiting for its transaction's outcome.
pub(super) struct Pending {
    failed: bool,
    /// Whether it appended to the ingest log (the log's horizon is looked
    /// at again once its batch commits, see `postgres/horizon.rs`).
    appended: bool,
    /// Sends the write's own result (`None`) or an error that replaced it
    /// because the transaction did not commit.
    answer: Answer,
}

impl Pending {
    /// A write that answers its callers itself, through `answer`: a write
    /// made of several callers' writes (`postgres/combine.rs`).
    /// `appended`: whether it wrote to the ingest log.
    pub(super) fn answered(failed: bool, appended: bool, answer: Answer) -> Pending {
        Pending {
            failed,
            appended,
            answer,
        }
    }

    fn new<T: Send + 'static>(result: Result<T>, reply: oneshot::Sender<Result<T>>) -> Pending {
        Pending {
            failed: result.is_err(),
            appended: false,
            answer: Box::new(move |error| {
                let _ = reply.send(match error {
                    None => result,
                    Some(e) => Err(StoreError::Database(e.to_string())),
                });
            }),
        }
    }
}

enum Op {
    Run(Job),
    Close(oneshot::Sender<()>),
}

/// The handle of one writer: its queue and its task.
pub(super) struct Writer {
    ops: mpsc::Sender<Op>,
    stopped: watch::Receiver<bool>,
    task: Mutex<Option<JoinHandle<()>>>,
}

/// What a writer needs to run.
pub(super) struct WriterConfig {
    /// Names the writer in logs and metrics (`log`, `main`, …).
    pub name: &'static str,
    /// Most writes waiting; a write finding the queue full is refused as
    /// overloaded.
    pub queue_capacity: usize,
    /// Most writes per transaction.
    pub max_batch: usize,
    /// Run at the start of every transaction, after `BEGIN`: the writers
    /// whose `seq`s readers follow take their transaction's id there (and
    /// their log's lock, shared; see `postgres/horizon.rs`).
    pub opening: Option<&'static str>,
    /// Run on every new connection before its first transaction (a log's
    /// writer names itself there, for the log's horizon).
    pub session: Option<&'static str>,
}

impl Writer {
    /// Connects and starts the writer's task. `committed`, for the ingest
    /// log's writer, is told of every commit of appends.
    pub(super) async fn start(
        connector: Arc<Connector>,
        config: WriterConfig,
        committed: Option<Arc<Notify>>,
    ) -> Result<Writer> {
        let client = connect(&connector, config.session).await?;
        let (ops_tx, ops_rx) = mpsc::channel(config.queue_capacity.max(1));
        let (stopped_tx, stopped) = watch::channel(false);
        let task = WriterTask {
            connector,
            client: Some(client),
            ops: ops_rx,
            name: config.name,
            max_batch: config.max_batch.max(1),
            opening: config.opening,
            session: config.session,
            committed,
        };
        let handle = tokio::spawn(async move {
            task.run().await;
            stopped_tx.send_replace(true);
        });
        Ok(Writer {
            ops: ops_tx,
            stopped,
            task: Mutex::new(Some(handle)),
        })
    }

    /// Queues a write and waits for its answer, which comes after the
    /// commit of the transaction that ran it.
    pub(super) async fn write<T, F>(&self, write: F) -> Result<T>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c Conn) -> BoxFuture<'c, Result<T>> + Send + 'static,
    {
        self.queue(write).await
    }

    /// One statement as a write of its own (most writes are one): the
    /// rows it changed, answered after the commit.
    pub(super) async fn execute(&self, sql: &'static str, params: Params) -> Result<u64> {
        self.write(move |c| {
            Box::pin(async move { c.execute(sql, &borrowed(&params)).await.map_err(db) })
        })
        .await
    }

    /// One statement answering one row (`RETURNING`), as a write of its
    /// own; the row is answered after the commit.
    pub(super) async fn query_one(&self, sql: &'static str, params: Params) -> Result<Row> {
        self.write(move |c| {
            Box::pin(async move { c.query_one(sql, &borrowed(&params)).await.map_err(db) })
        })
        .await
    }

    /// Queues a write that answers its callers itself (see
    /// [`Pending::answered`]); refused, without running, when the queue is
    /// full or the writer stopped.
    pub(super) fn queue_job(&self, job: Job) -> Result<()> {
        match self.ops.try_send(Op::Run(job)) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(StoreError::Overloaded),
            Err(TrySendError::Closed(_)) => Err(StoreError::Closed),
        }
    }

    async fn queue<T, F>(&self, write: F) -> Result<T>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c Conn) -> BoxFuture<'c, Result<T>> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job: Job = Box::new(Queued { write, reply });
        self.queue_job(job)?;
        answer.await.unwrap_or(Err(StoreError::Closed))
    }

    /// Stops accepting writes, lets the writer commit what is queued, and
    /// waits for its task.
    pub(super) async fn close(&self) {
        let (reply, answer) = oneshot::channel();
        if self.ops.send(Op::Close(reply)).await.is_ok() {
            let _ = answer.await;
        }
        let mut stopped = self.stopped.clone();
        let _ = stopped.wait_for(|stopped| *stopped).await;
        let handle = self.task.lock().take();
        if let Some(handle) = handle {
            if handle.await.is_err() {
                tracing::error!("a PostgreSQL writer task panicked");
            }
        }
    }
}

struct WriterTask {
    connector: Arc<Connector>,
    /// `None` after the connection broke, until the next batch reconnects.
    client: Option<Conn>,
    ops: mpsc::Receiver<Op>,
    name: &'static str,
    max_batch: usize,
    opening: Option<&'static str>,
    session: Option<&'static str>,
    committed: Option<Arc<Notify>>,
}

impl WriterTask {
    async fn run(mut self) {
        let mut closers = Vec::new();
        let mut batch = Vec::with_capacity(self.max_batch.min(4096));
        while let Some(first) = self.ops.recv().await {
            self.take(first, &mut batch, &mut closers);
            while batch.len() < self.max_batch {
                match self.ops.try_recv() {
                    Ok(op) => self.take(op, &mut batch, &mut closers),
                    Err(_) => break,
                }
            }
            if !batch.is_empty() {
                self.run_batch(&mut batch).await;
            }
        }
        tracing::debug!(writer = self.name, "PostgreSQL writer stopped");
        for reply in closers {
            let _ = reply.send(());
        }
    }

    fn take(&mut self, op: Op, batch: &mut Vec<Job>, closers: &mut Vec<oneshot::Sender<()>>) {
        match op {
            Op::Run(job) => batch.push(job),
            Op::Close(reply) => {
                self.ops.close();
                closers.push(reply);
            }
        }
    }

    /// The connection, connecting again (with a pause) after it broke.
    async fn client(&mut self) -> Result<&Conn> {
        if self.client.as_ref().is_some_and(|c| c.is_closed()) {
            self.client = None;
        }
        if self.client.is_none() {
            match connect(&self.connector, self.session).await {
                Ok(client) => self.client = Some(client),
                Err(e) => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    return Err(e);
                }
            }
        }
        Ok(self.client.as_ref().expect("connected above"))
    }

    async fn run_batch(&mut self, batch: &mut Vec<Job>) {
        let started = Instant::now();
        let size = batch.len();
        let name = self.name;
        let opening = self.opening;
        let client = match self.client().await {
            Ok(client) => client,
            Err(e) => {
                let msg = format!("no connection to PostgreSQL: {e}");
                for job in batch.drain(..) {
                    fail_unrun(job, &msg);
                }
                return;
            }
        };
        // The transaction opens with the first write's savepoint.
        let begun = match opening {
            Some(opening) => {
                client
                    .batch_execute(&format!("BEGIN; {opening}; SAVEPOINT w"))
                    .await
            }
            None => client.batch_execute("BEGIN; SAVEPOINT w").await,
        };
        if let Err(e) = begun {
            let msg = format!("could not start a transaction: {}", db(e));
            for job in batch.drain(..) {
                fail_unrun(job, &msg);
            }
            return;
        }
        let mut done = Vec::with_capacity(size);
        let mut broken = None;
        // Whether the savepoint in place holds a write that succeeded: it is
        // released, and a fresh one set, before the next write runs. (After
        // a failed write, `ROLLBACK TO` leaves the savepoint in place, empty.)
        let mut renew = false;
        for job in batch.drain(..) {
            if broken.is_some() {
                fail_unrun(job, "the transaction was abandoned");
                continue;
            }
            let pending = if renew {
                // Pipelined: the renewal goes out just ahead of the write's
                // first statement (`join` polls in order, and a query is
                // sent at its first poll), saving it a round trip.
                let (renewed, pending) = futures::future::join(
                    client.batch_execute("RELEASE SAVEPOINT w; SAVEPOINT w"),
                    job.run(client),
                )
                .await;
                if let Err(e) = renewed {
                    broken = Some(db(e).to_string());
                }
                pending
            } else {
                job.run(client).await
            };
            renew = !pending.failed;
            if pending.failed && broken.is_none() {
                if let Err(e) = client.batch_execute("ROLLBACK TO SAVEPOINT w").await {
                    broken = Some(db(e).to_string());
                }
            }
            done.push(pending);
        }
        let outcome = match broken {
            Some(e) => Err(e),
            None => client
                .batch_execute("COMMIT")
                .await
                .map_err(|e| db(e).to_string()),
        };
        match outcome {
            Ok(()) => {
                if let Some(committed) = &self.committed {
                    if done.iter().any(|p| p.appended) {
                        committed.notify_one();
                    }
                }
                for pending in done {
                    (pending.answer)(None);
                }
                metrics::counter!("weft_store_commits_total", "writer" => name).increment(1);
                metrics::histogram!("weft_store_batch_size", "writer" => name).record(size as f64);
                metrics::histogram!("weft_store_commit_seconds", "writer" => name)
                    .record(started.elapsed().as_secs_f64());
            }
            Err(e) => {
                tracing::warn!(writer = name, error = %e, ops = done.len(), "PostgreSQL batch failed");
                let msg = format!("the transaction did not commit: {e}");
                if !client.is_closed() {
                    let _ = client.batch_execute("ROLLBACK").await;
                }
                for pending in done {
                    (pending.answer)(Some(&msg));
                }
            }
        }
    }
}

/// A new connection of a writer, its session set up.
async fn connect(connector: &Connector, session: Option<&str>) -> Result<Conn> {
    let client = connector.connect().await?;
    if let Some(session) = session {
        client.batch_execute(session).await.map_err(db)?;
    }
    Ok(Conn::new(client))
}

/// Answers a write that never ran (its batch could not start, or was
/// abandoned before reaching it).
fn fail_unrun(job: Job, why: &str) {
    job.fail(why);
}
