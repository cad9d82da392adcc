//! The ingest log on PostgreSQL: every node appends through its own log
//! writer, with no lock between nodes, and readers read up to the log's
//! horizon (`postgres/horizon.rs`), below which a reader following `seq`s
//! finds every entry it will ever find. An append is answered once under
//! the horizon, so whoever holds its `seq` can read it.

use async_trait::async_trait;
use futures::future::BoxFuture;
use tokio::sync::watch;
use weft_model::{NewUplink, Uplink, UplinkFormat, UplinkPins};

use super::combine::{seqs_in_order, Combine};
use super::conn::Conn;
use super::horizon::{followed, Followed};
use super::schema::db;
use super::writer::param;
use super::{position, to_i64, PostgresStore};
use crate::{IngestLogStore, Result, StoreError};

/// The ingest log as its horizon follows it (any lock key unique to weft:
/// "weft_log", the key older versions took exclusively).
pub(super) const LOG: Followed = followed! {
    name: "ingest log",
    writer: "weft ingest log",
    lock: 8603115516733482855,
    tables: ["ingest_log"],
    on_demand: false
};

/// How many partitions the pipeline is split into on PostgreSQL by
/// default, where several nodes share it: enough for a few nodes to share
/// them evenly (16 is 8+8, 6+5+5, 4×4), few enough that a node's cursors
/// are one short write per batch. What a database was created with is
/// kept (see [`settle_partitions`]).
pub const DEFAULT_PARTITIONS: u16 = 16;

/// The most partitions a database may be split into.
pub const MAX_PARTITIONS: u16 = 1024;

/// How many partitions the pipeline of the database `client` is on is
/// split into: the number it was created with (`store_settings`), or, for
/// a new database, `wanted` (clamped to 1..=[`MAX_PARTITIONS`]), stored
/// now. Fixed once stored, because a device's partition must not change
/// while its uplinks are in the log; a `wanted` that differs is warned
/// about and ignored.
pub(super) async fn settle_partitions(client: &tokio_postgres::Client, wanted: u16) -> Result<u16> {
    let wanted = wanted.clamp(1, MAX_PARTITIONS);
    client
        .execute(
            "INSERT INTO store_settings (name, value) VALUES ('partitions', $1) \
             ON CONFLICT (name) DO NOTHING",
            &[&i64::from(wanted)],
        )
        .await
        .map_err(db)?;
    let stored: i64 = client
        .query_one(
            "SELECT value FROM store_settings WHERE name = 'partitions'",
            &[],
        )
        .await
        .map_err(db)?
        .get(0);
    let stored = u16::try_from(stored)
        .ok()
        .filter(|n| (1..=MAX_PARTITIONS).contains(n))
        .ok_or_else(|| StoreError::Corrupt(format!("store_settings holds {stored} partitions")))?;
    if stored != wanted {
        tracing::warn!(
            configured = wanted,
            partitions = stored,
            "the database's pipeline is split into the partitions it was created with; \
             store.partitions is ignored"
        );
    }
    Ok(stored)
}

/// An append to the ingest log, as written together with the others that
/// wait with it (`postgres/combine.rs`): one multi-row `INSERT` per
/// transaction instead of a statement and a round trip per uplink. Its
/// answer (the `seq`) waits for the log's horizon, so whoever holds a
/// `seq` can read it.
pub(super) struct Append;

impl Combine for Append {
    type Item = NewUplink;
    type Answer = u64;

    fn write_many<'c>(c: &'c Conn, items: &'c [NewUplink]) -> BoxFuture<'c, Result<Vec<u64>>> {
        Box::pin(insert_many(c, items))
    }

    fn write_one<'c>(c: &'c Conn, item: &'c NewUplink) -> BoxFuture<'c, Result<u64>> {
        Box::pin(insert_one(c, item))
    }

    fn seq(answer: &u64) -> Option<u64> {
        Some(*answer)
    }
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
    seqs_in_order(&rows)
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
        self.appends.write(&self.log, uplink).await
    }

    fn committed_seq(&self) -> watch::Receiver<u64> {
        self.committed.clone()
    }

    fn partitions(&self) -> u16 {
        self.pipeline_partitions
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
            .filter(|p| p.len() < usize::from(self.pipeline_partitions))
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
