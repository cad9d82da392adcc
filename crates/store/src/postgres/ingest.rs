//! The ingest log on PostgreSQL: appends through each node's log writer,
//! and the log's horizon, below which a reader following `seq`s finds
//! every entry it will ever find.
//!
//! Several nodes append at once, each through its own writer, with no
//! lock between them: `seq`s are handed out in order but can commit out of
//! order (node A's 9 after node B's 10), and a reader that moved past 10
//! would never see 9. So readers read only up to the horizon
//! ([`follow_appends`]), the highest `seq` whose entries, and every one
//! below, are committed or never will be:
//!
//! 1. every log transaction gets its transaction id first ([`OPENING`]),
//!    before it takes any `seq`;
//! 2. the horizon reader takes the sequence's last value `L`, then, later,
//!    the transaction ids of the log writers in flight ([`SESSION`] names
//!    their connections);
//! 3. a `seq` at or below `L` was taken by a transaction that had its id
//!    then: if none of the writers seen in step 2 is still in flight on a
//!    later look, every such transaction has ended, so `L` is the horizon.
//!
//! With no writer in flight, `L` is the horizon at once; under load it
//! trails the newest append by one look (a few milliseconds).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::Pool;
use futures::future::BoxFuture;
use parking_lot::Mutex;
use tokio::sync::{oneshot, watch, Notify};
use tokio_postgres::SimpleQueryMessage;
use weft_model::{NewUplink, Uplink, UplinkFormat, UplinkPins};

use super::conn::Conn;
use super::schema::db;
use super::writer::{param, Pending, QueuedWrite, Writer};
use super::{position, to_i64, PostgresStore};
use crate::{IngestLogStore, Result, StoreError};

/// Opens every transaction of a log writer: its transaction id, taken
/// before any `seq` (see the module's documentation), and the log's lock,
/// shared. Writers of this version do not exclude each other; the lock is
/// for nodes of an older version, which take it exclusively and so never
/// commit alongside these (any constant unique to weft: "weft_log").
pub(super) const OPENING: &str =
    "SELECT pg_advisory_xact_lock_shared(8603115516733482855), pg_current_xact_id()";

/// Names a log writer's connection, so the horizon finds the log's
/// transactions in flight among every other.
pub(super) const SESSION: &str = "SET application_name = 'weft ingest log'";

/// One look at the log: the last `seq` handed out, then the log writers'
/// transactions in flight (as `pid:xid`). Under the log's lock, shared, so
/// an older node's appends (which hold it exclusively) are never in flight
/// while it looks.
const LOOK: &str = "BEGIN; \
    SELECT pg_advisory_xact_lock_shared(8603115516733482855); \
    SELECT COALESCE(pg_sequence_last_value(pg_get_serial_sequence('ingest_log', 'seq')), 0)::TEXT; \
    SELECT pid::TEXT || ':' || backend_xid::TEXT FROM pg_stat_activity \
     WHERE datname = current_database() AND application_name = 'weft ingest log' \
       AND backend_xid IS NOT NULL; \
    COMMIT";

/// How many partitions the pipeline is split into on PostgreSQL, where
/// several nodes share it: enough for a few nodes to share them evenly
/// (16 is 8+8, 6+5+5, 4×4), few enough that a node's cursors are one short
/// write per batch. Fixed, because a device's partition must not change
/// while its uplinks are in the log.
pub const PARTITIONS: u16 = 16;

/// How often [`follow_appends`] looks when nothing is waiting on a writer
/// (this node's own commits make it look at once).
const FOLLOW_INTERVAL: Duration = Duration::from_millis(20);

/// How soon it looks again while writers seen in flight may still be.
const SETTLE_INTERVAL: Duration = Duration::from_millis(2);

/// The log's horizon as the looks establish it.
#[derive(Debug, Default)]
pub(super) struct Horizon {
    /// The highest `seq` known final, with all below it.
    pub through: u64,
    /// A `seq` final once the writers then in flight have ended.
    waiting: Option<(u64, HashSet<String>)>,
}

impl Horizon {
    /// Takes one look: `last` the sequence's last value, then `writers`
    /// in flight. Answers whether the horizon moved.
    pub(super) fn look(&mut self, last: u64, writers: HashSet<String>) -> bool {
        let before = self.through;
        if let Some((through, seen)) = &self.waiting {
            if seen.is_disjoint(&writers) {
                self.through = self.through.max(*through);
                self.waiting = None;
            }
        }
        if writers.is_empty() {
            self.through = self.through.max(last);
            self.waiting = None;
        } else if self.waiting.is_none() && last > self.through {
            self.waiting = Some((last, writers));
        }
        self.through > before
    }

    /// Whether a look soon could move it.
    pub(super) fn waiting(&self) -> bool {
        self.waiting.is_some()
    }
}

/// One look at the log (see [`LOOK`]).
async fn look(client: &tokio_postgres::Client) -> Result<(u64, HashSet<String>)> {
    let mut last = 0;
    let mut writers = HashSet::new();
    let mut statement = 0;
    for message in client.simple_query(LOOK).await.map_err(db)? {
        match message {
            SimpleQueryMessage::CommandComplete(_) => statement += 1,
            SimpleQueryMessage::Row(row) => match statement {
                2 => {
                    last = row
                        .get(0)
                        .and_then(|v| v.parse().ok())
                        .ok_or_else(|| StoreError::Corrupt("the ingest log's sequence".into()))?;
                }
                3 => {
                    if let Some(writer) = row.get(0) {
                        writers.insert(writer.to_string());
                    }
                }
                _ => {}
            },
            _ => {}
        }
    }
    Ok((last, writers))
}

/// The horizon when the store opens: looks until no writer seen is still
/// in flight (at once, unless other nodes are appending), for at most a
/// second, and answers what it then knows.
pub(super) async fn settle(client: &tokio_postgres::Client) -> Result<Horizon> {
    let mut horizon = Horizon::default();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    loop {
        let (last, writers) = look(client).await?;
        horizon.look(last, writers);
        if !horizon.waiting() || tokio::time::Instant::now() >= deadline {
            return Ok(horizon);
        }
        tokio::time::sleep(SETTLE_INTERVAL).await;
    }
}

/// Moves the horizon (`committed`) until the store is dropped: after each
/// of this node's commits of appends (`appended`), every
/// [`FOLLOW_INTERVAL`] for other nodes' appends, and every
/// [`SETTLE_INTERVAL`] while writers seen in flight may still be.
pub(super) async fn follow_appends(
    pool: Pool,
    mut horizon: Horizon,
    committed: Arc<watch::Sender<u64>>,
    appended: Arc<Notify>,
) {
    let mut failing = false;
    while !committed.is_closed() {
        let wait = if horizon.waiting() {
            SETTLE_INTERVAL
        } else {
            FOLLOW_INTERVAL
        };
        tokio::select! {
            _ = appended.notified() => {}
            _ = tokio::time::sleep(wait) => {}
        }
        let looked = match pool.get().await {
            Ok(client) => look(&client).await,
            Err(e) => Err(StoreError::Database(e.to_string())),
        };
        match looked {
            Ok((last, writers)) => {
                failing = false;
                if horizon.look(last, writers) {
                    committed.send_replace(horizon.through);
                }
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "looking at the ingest log's horizon failed; retrying");
                }
                failing = true;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// The appends waiting for the log's writer, written together: one
/// `INSERT` of many rows per transaction instead of one statement (and one
/// round trip) per uplink, which is what kept the log's transactions, and
/// the lock they hold across the cluster ([`SERIAL_APPENDS`]), long.
///
/// The first append to find the buffer empty queues one write on the
/// writer; that write takes whatever the buffer holds when the writer runs
/// it, so appends arriving while the writer is busy ride along with it.
/// Each caller is answered by the write itself, after the commit and once
/// the log's horizon has passed its `seq`, whether or not the caller that
/// queued it is still waiting.
pub(super) struct Appends {
    waiting: Arc<Mutex<Vec<Waiting>>>,
    /// The log's horizon (see the module's documentation).
    horizon: watch::Receiver<u64>,
    /// Most appends waiting; more are refused as overloaded (as a full
    /// writer queue refuses writes).
    capacity: usize,
}

/// One caller's append and where its `seq` goes.
struct Waiting {
    uplink: NewUplink,
    reply: oneshot::Sender<Result<u64>>,
}

impl Appends {
    /// Buffers of at most `capacity` waiting appends, answered once
    /// `horizon` passes them.
    pub(super) fn new(capacity: usize, horizon: watch::Receiver<u64>) -> Appends {
        Appends {
            waiting: Arc::default(),
            horizon,
            capacity: capacity.max(1),
        }
    }

    /// Appends `uplink` through `log`; its `seq`, once committed.
    pub(super) async fn append(&self, log: &Writer, uplink: NewUplink) -> Result<u64> {
        let (reply, answer) = oneshot::channel();
        let first = {
            let mut waiting = self.waiting.lock();
            if waiting.len() >= self.capacity {
                return Err(StoreError::Overloaded);
            }
            waiting.push(Waiting { uplink, reply });
            waiting.len() == 1
        };
        if first {
            let group = AppendGroup {
                waiting: self.waiting.clone(),
                horizon: self.horizon.clone(),
            };
            if let Err(e) = log.queue_job(Box::new(group)) {
                // Nobody else queues a write for what waits now.
                for w in std::mem::take(&mut *self.waiting.lock()) {
                    let _ = w.reply.send(Err(e.clone()));
                }
            }
        }
        answer.await.unwrap_or(Err(StoreError::Closed))
    }
}

/// The log writer's write for the appends waiting when it runs.
struct AppendGroup {
    waiting: Arc<Mutex<Vec<Waiting>>>,
    /// The log's horizon, which the answers wait for.
    horizon: watch::Receiver<u64>,
}

impl QueuedWrite for AppendGroup {
    fn run<'c>(self: Box<Self>, client: &'c Conn) -> BoxFuture<'c, Pending> {
        let group = std::mem::take(&mut *self.waiting.lock());
        Box::pin(async move {
            let (uplinks, replies): (Vec<_>, Vec<_>) =
                group.into_iter().map(|w| (w.uplink, w.reply)).unzip();
            let results = insert_uplinks(client, &uplinks).await;
            let failed = results.iter().all(|r| r.is_err());
            let newest = results
                .iter()
                .filter_map(|r| r.as_ref().ok())
                .max()
                .copied();
            let mut horizon = self.horizon;
            Pending::answered(
                failed,
                !failed,
                Box::new(move |error| {
                    let committed = error.is_none();
                    let error = error.map(str::to_string);
                    let answer = move || {
                        for (reply, result) in replies.into_iter().zip(results) {
                            let _ = reply.send(match &error {
                                None => result,
                                Some(e) => Err(StoreError::Database(e.clone())),
                            });
                        }
                    };
                    match newest {
                        // Committed: answered once readers can see them
                        // (whoever holds a `seq` finds `committed_seq()`
                        // at least that high), without holding the writer.
                        Some(seq) if committed => {
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
        for w in std::mem::take(&mut *self.waiting.lock()) {
            let _ = w.reply.send(Err(StoreError::Database(error.to_string())));
        }
    }
}

/// Inserts `uplinks` in order, answering each one's `seq`: all in one
/// statement, or, when that fails (a value PostgreSQL refuses, such as a
/// NUL in a text), one at a time, so only the bad ones fail.
async fn insert_uplinks(c: &Conn, uplinks: &[NewUplink]) -> Vec<Result<u64>> {
    if uplinks.len() > 1 {
        let (saved, inserted) = futures::future::join(
            c.batch_execute("SAVEPOINT appends"),
            insert_many(c, uplinks),
        )
        .await;
        match saved.map_err(db).and(inserted) {
            Ok(seqs) => {
                return seqs.into_iter().map(Ok).collect();
            }
            Err(e) => {
                tracing::debug!(error = %e, appends = uplinks.len(), "appending together failed; appending one at a time");
                if let Err(e) = c.batch_execute("ROLLBACK TO SAVEPOINT appends").await {
                    let e = db(e);
                    return uplinks.iter().map(|_| Err(e.clone())).collect();
                }
            }
        }
    }
    let mut results = Vec::with_capacity(uplinks.len());
    for uplink in uplinks {
        let (saved, inserted) =
            futures::future::join(c.batch_execute("SAVEPOINT append"), insert_one(c, uplink)).await;
        let result = saved.map_err(db).and(inserted);
        let closed = if result.is_ok() {
            c.batch_execute("RELEASE SAVEPOINT append").await
        } else {
            c.batch_execute("ROLLBACK TO SAVEPOINT append").await
        };
        results.push(closed.map_err(db).and(result));
    }
    results
}

/// Every row in one `INSERT`; the `seq`s in the order of `uplinks` (the
/// rows are inserted, and so numbered, in that order).
async fn insert_many(c: &Conn, uplinks: &[NewUplink]) -> Result<Vec<u64>> {
    let received_at: Vec<i64> = uplinks.iter().map(|u| u.received_at).collect();
    let format: Vec<&str> = uplinks.iter().map(|u| u.format.as_str()).collect();
    let channel: Vec<Option<&str>> = uplinks.iter().map(|u| u.channel.as_deref()).collect();
    let device_type: Vec<Option<&str>> = uplinks.iter().map(|u| u.device_type.as_deref()).collect();
    let body: Vec<&[u8]> = uplinks.iter().map(|u| u.body.as_slice()).collect();
    let event: Vec<Option<&str>> = uplinks.iter().map(|u| u.event.as_deref()).collect();
    let device_id: Vec<Option<&str>> = uplinks.iter().map(|u| u.device_id.as_deref()).collect();
    let source: Vec<Option<&str>> = uplinks.iter().map(|u| u.source.as_deref()).collect();
    let part: Vec<i16> = uplinks.iter().map(|u| u.partition as i16).collect();
    let pins: Vec<Option<String>> = uplinks.iter().map(|u| u.pins.to_stored()).collect();
    let rows = c
        .query(
            "INSERT INTO ingest_log \
                 (received_at, format, channel, device_type, body, event, device_id, source, part, pins) \
             SELECT r, f, c, t, b, e, d, s, p, n \
             FROM UNNEST($1::BIGINT[], $2::TEXT[], $3::TEXT[], $4::TEXT[], $5::BYTEA[], \
                         $6::TEXT[], $7::TEXT[], $8::TEXT[], $9::SMALLINT[], $10::TEXT[]) \
                  WITH ORDINALITY AS u(r, f, c, t, b, e, d, s, p, n, o) \
             ORDER BY o \
             RETURNING seq",
            &[
                &received_at,
                &format,
                &channel,
                &device_type,
                &body,
                &event,
                &device_id,
                &source,
                &part,
                &pins,
            ],
        )
        .await
        .map_err(db)?;
    let mut seqs = rows
        .iter()
        .map(|row| position(row, 0))
        .collect::<Result<Vec<u64>>>()?;
    if seqs.len() != uplinks.len() {
        return Err(StoreError::Database(format!(
            "{} uplinks appended as {} rows",
            uplinks.len(),
            seqs.len()
        )));
    }
    // Numbered in insertion order; sorted, they line up with `uplinks`
    // whatever order `RETURNING` lists them in.
    seqs.sort_unstable();
    Ok(seqs)
}

/// One row, the way every row went before appends were grouped.
async fn insert_one(c: &Conn, uplink: &NewUplink) -> Result<u64> {
    let row = c
        .query_one(
            "INSERT INTO ingest_log \
                 (received_at, format, channel, device_type, body, event, device_id, source, part, pins) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING seq",
            &[
                &uplink.received_at,
                &uplink.format.as_str(),
                &uplink.channel,
                &uplink.device_type,
                &uplink.body,
                &uplink.event,
                &uplink.device_id,
                &uplink.source,
                &(uplink.partition as i16),
                &uplink.pins.to_stored(),
            ],
        )
        .await
        .map_err(db)?;
    position(&row, 0)
}

/// Most log entries one prune deletes, so a prune never holds the log's
/// writer (and the 202s waiting on it) for long.
const PRUNE_CHUNK: i64 = 50_000;

#[async_trait]
impl IngestLogStore for PostgresStore {
    async fn append_uplink(&self, uplink: NewUplink) -> Result<u64> {
        self.appends.append(&self.log, uplink).await
    }

    fn committed_seq(&self) -> watch::Receiver<u64> {
        self.committed.clone()
    }

    fn partitions(&self) -> u16 {
        PARTITIONS
    }

    async fn read_uplinks(
        &self,
        from_seq: u64,
        limit: usize,
        partitions: Option<&[u16]>,
    ) -> Result<Vec<Uplink>> {
        // Nothing past the horizon: an entry there may still have one
        // below it to come.
        let horizon = *self.committed.borrow();
        let client = self.reader().await?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        // Every partition: no filter (the common case on one node).
        let partitions: Option<Vec<i16>> = partitions
            .filter(|p| p.len() < usize::from(PARTITIONS))
            .map(|p| p.iter().map(|&p| p as i16).collect());
        let rows = client
            .query(
                "SELECT seq, received_at, format, channel, device_type, body, event, device_id, source, part, pins \
                 FROM ingest_log \
                 WHERE seq >= $1 AND seq <= $4 AND ($3::SMALLINT[] IS NULL OR part = ANY($3)) \
                 ORDER BY seq LIMIT $2",
                &[&to_i64(from_seq), &limit, &partitions, &to_i64(horizon)],
            )
            .await
            .map_err(db)?;
        rows.iter()
            .map(|row| {
                let seq = position(row, 0)?;
                let format: String = row.get(2);
                let format = UplinkFormat::parse(&format).ok_or_else(|| {
                    StoreError::Corrupt(format!(
                        "ingest log entry {seq}: unknown format {format:?}"
                    ))
                })?;
                let pins: Option<String> = row.get(10);
                let pins = UplinkPins::from_stored(pins.as_deref())
                    .map_err(|e| StoreError::Corrupt(format!("ingest log entry {seq}: {e}")))?;
                Ok(Uplink {
                    seq,
                    uplink: NewUplink {
                        pins,
                        received_at: row.get(1),
                        format,
                        channel: row.get(3),
                        device_type: row.get(4),
                        body: row.get(5),
                        event: row.get(6),
                        device_id: row.get(7),
                        source: row.get(8),
                        partition: row.get::<_, i16>(9) as u16,
                    },
                })
            })
            .collect()
    }

    /// As the SQLite backend: the entries below `below_seq` received before
    /// the cutoff, oldest first, at most [`PRUNE_CHUNK`] per call.
    async fn prune_uplinks(&self, below_seq: u64, received_before: i64) -> Result<u64> {
        self.log
            .execute(
                "DELETE FROM ingest_log WHERE seq < LEAST($1, \
                   COALESCE((SELECT seq FROM ingest_log WHERE received_at >= $2 \
                             ORDER BY seq LIMIT 1), $1), \
                   COALESCE((SELECT MIN(seq) FROM ingest_log), 0) + $3)",
                vec![
                    param(to_i64(below_seq)),
                    param(received_before),
                    param(PRUNE_CHUNK),
                ],
            )
            .await
    }
}
