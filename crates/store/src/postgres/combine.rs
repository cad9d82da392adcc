//! Writes of one kind that wait together, written together: many callers'
//! writes as one write of the writer, a few statements over arrays for all
//! of them, instead of one round trip (and one savepoint) each.
//!
//! The first write to find its buffer empty queues one job on the writer;
//! that job takes whatever the buffer holds when the writer runs it, so
//! writes arriving while the writer is busy ride along with it. Each
//! caller is answered by the job itself, after the commit, whether or not
//! the caller that queued it is still waiting. When the combined write
//! fails (a value PostgreSQL refuses), the job writes them again one at a
//! time, each in a savepoint, so only the bad ones fail.

use std::sync::Arc;

use futures::future::BoxFuture;
use parking_lot::Mutex;
use tokio::sync::{oneshot, watch};

use tokio_postgres::Row;

use super::conn::Conn;
use super::position;
use super::schema::db;
use super::writer::{Pending, QueuedWrite, Writer};
use crate::{Result, StoreError};

/// A kind of write that [`Combined`] writes together.
pub(super) trait Combine: Send + Sync + 'static {
    /// One caller's write.
    type Item: Send + Sync + 'static;
    /// What one write answers.
    type Answer: Send + 'static;

    /// Writes `items`, in order, together: an answer per item, or the
    /// error that fails them all.
    fn write_many<'c>(
        c: &'c Conn,
        items: &'c [Self::Item],
    ) -> BoxFuture<'c, Result<Vec<Self::Answer>>>;

    /// Writes one item alone.
    fn write_one<'c>(c: &'c Conn, item: &'c Self::Item) -> BoxFuture<'c, Result<Self::Answer>>;

    /// The `seq` an answer holds in a log with a horizon (the ingest log,
    /// the notifications feed): answers wait until the log's horizon has
    /// passed the newest of their job's (see `postgres/horizon.rs`).
    fn seq(_answer: &Self::Answer) -> Option<u64> {
        None
    }
}

/// One caller's write and where its answer goes.
struct Waiting<W: Combine> {
    item: W::Item,
    reply: oneshot::Sender<Result<W::Answer>>,
}

/// The writes that wait to be written together.
type Buffer<W> = Arc<Mutex<Vec<Waiting<W>>>>;

/// The writes of kind `W` waiting for their writer.
pub(super) struct Combined<W: Combine> {
    /// Where new writes wait; replaced by [`Combined::seal`].
    current: Mutex<Buffer<W>>,
    /// The horizon of the log written, for kinds whose answers hold a
    /// `seq` in it.
    horizon: Option<watch::Receiver<u64>>,
    /// Most writes waiting; more are refused as overloaded (as a full
    /// writer queue refuses writes).
    capacity: usize,
}

impl<W: Combine> Combined<W> {
    /// Buffers of at most `capacity` waiting writes; answers wait for
    /// `horizon` to pass their `seq`s when given.
    pub(super) fn new(capacity: usize, horizon: Option<watch::Receiver<u64>>) -> Combined<W> {
        Combined {
            current: Mutex::new(Arc::default()),
            horizon,
            capacity: capacity.max(1),
        }
    }

    /// Writes `item` through `writer` with whatever waits with it; its
    /// answer, once committed.
    pub(super) async fn write(&self, writer: &Writer, item: W::Item) -> Result<W::Answer> {
        let (reply, answer) = oneshot::channel();
        let buffer = self.current.lock().clone();
        let first = {
            let mut waiting = buffer.lock();
            if waiting.len() >= self.capacity {
                return Err(StoreError::Overloaded);
            }
            waiting.push(Waiting { item, reply });
            waiting.len() == 1
        };
        if first {
            let job = Job::<W> {
                buffer: buffer.clone(),
                horizon: self.horizon.clone(),
            };
            if let Err(e) = writer.queue_job(Box::new(job)) {
                // Nobody else queues a write for what waits now.
                for w in std::mem::take(&mut *buffer.lock()) {
                    let _ = w.reply.send(Err(e.clone()));
                }
            }
        }
        answer.await.unwrap_or(Err(StoreError::Closed))
    }

    /// Closes the writes waiting now to later ones: a write queued on the
    /// writer after this (a delete) runs after them, and writes from now
    /// on are written after it. Without it, a later write could join a
    /// job queued before the delete and be written before it.
    pub(super) fn seal(&self) {
        let mut current = self.current.lock();
        if !current.lock().is_empty() {
            *current = Arc::default();
        }
    }
}

/// The writer's job for the writes waiting in one buffer when it runs.
struct Job<W: Combine> {
    buffer: Buffer<W>,
    horizon: Option<watch::Receiver<u64>>,
}

impl<W: Combine> QueuedWrite for Job<W> {
    fn run<'c>(self: Box<Self>, client: &'c Conn) -> BoxFuture<'c, Pending> {
        let waiting = std::mem::take(&mut *self.buffer.lock());
        Box::pin(async move {
            let (items, replies): (Vec<_>, Vec<_>) =
                waiting.into_iter().map(|w| (w.item, w.reply)).unzip();
            let results = write_together::<W>(client, &items).await;
            let failed = results.iter().all(|r| r.is_err());
            let newest = results
                .iter()
                .filter_map(|r| r.as_ref().ok().and_then(W::seq))
                .max();
            let horizon = self.horizon;
            Pending::answered(
                failed,
                newest.is_some(),
                Box::new(move |error| {
                    let error = error.map(str::to_string);
                    let committed = error.is_none();
                    let answer = move || {
                        for (reply, result) in replies.into_iter().zip(results) {
                            let _ = reply.send(match &error {
                                None => result,
                                Some(e) => Err(StoreError::Database(e.clone())),
                            });
                        }
                    };
                    match (newest, horizon) {
                        // Committed: answered once readers can see them
                        // (whoever holds a `seq` finds `committed_seq()`
                        // at least that high), without holding the writer.
                        (Some(seq), Some(mut horizon)) if committed => {
                            tokio::spawn(async move {
                                let _ = horizon.wait_for(|&through| through >= seq).await;
                                answer();
                            });
                        }
                        _ => answer(),
                    }
                }),
            )
        })
    }

    fn fail(self: Box<Self>, error: &str) {
        for w in std::mem::take(&mut *self.buffer.lock()) {
            let _ = w.reply.send(Err(StoreError::Database(error.to_string())));
        }
    }
}

/// The `seq`s a multi-row `INSERT … ORDER BY <input order> RETURNING seq`
/// answers (column 0), in the order of its input: rows are numbered in
/// insertion order, so sorted they line up with the input whatever order
/// `RETURNING` lists them in.
pub(super) fn seqs_in_order(rows: &[Row]) -> Result<Vec<u64>> {
    let mut seqs = rows
        .iter()
        .map(|row| position(row, 0))
        .collect::<Result<Vec<u64>>>()?;
    seqs.sort_unstable();
    Ok(seqs)
}

/// Writes `items` together, or, when that fails, one at a time in
/// savepoints, so only the bad ones fail.
async fn write_together<W: Combine>(c: &Conn, items: &[W::Item]) -> Vec<Result<W::Answer>> {
    if items.len() > 1 {
        let (saved, written) = futures::future::join(
            c.batch_execute("SAVEPOINT together"),
            W::write_many(c, items),
        )
        .await;
        match saved.map_err(db).and(written) {
            Ok(answers) if answers.len() == items.len() => {
                return answers.into_iter().map(Ok).collect();
            }
            Ok(answers) => {
                let e = StoreError::Database(format!(
                    "{} writes answered {} times",
                    items.len(),
                    answers.len()
                ));
                return items.iter().map(|_| Err(e.clone())).collect();
            }
            Err(e) => {
                tracing::debug!(error = %e, writes = items.len(), "writing together failed; writing one at a time");
                if let Err(e) = c.batch_execute("ROLLBACK TO SAVEPOINT together").await {
                    let e = db(e);
                    return items.iter().map(|_| Err(e.clone())).collect();
                }
            }
        }
    }
    let mut results = Vec::with_capacity(items.len());
    for item in items {
        let (saved, written) =
            futures::future::join(c.batch_execute("SAVEPOINT alone"), W::write_one(c, item)).await;
        let result = saved.map_err(db).and(written);
        let closed = if result.is_ok() {
            c.batch_execute("RELEASE SAVEPOINT alone").await
        } else {
            c.batch_execute("ROLLBACK TO SAVEPOINT alone").await
        };
        results.push(closed.map_err(db).and(result));
    }
    results
}
