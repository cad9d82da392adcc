//! The ingest log on PostgreSQL: appends through the log's own writer, so
//! `seq`s commit in order and the pipeline, reading forward from its
//! cursor, never passes one that commits later.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::Pool;
use tokio::sync::watch;
use weft_model::{NewUplink, Uplink, UplinkFormat, UplinkPins};

use super::schema::db;
use super::writer::param;
use super::{position, to_i64, PostgresStore};
use crate::{IngestLogStore, Result, StoreError};

/// Opens every transaction of the log's writer: a lock held until the
/// commit, taken by every node's log writer, so appends commit one
/// transaction at a time across the cluster and `seq`s become visible in
/// order (any constant unique to weft: "weft_log").
pub(super) const SERIAL_APPENDS: &str = "SELECT pg_advisory_xact_lock(8603115516733482855)";

/// How many partitions the pipeline is split into on PostgreSQL, where
/// several nodes share it: enough for a few nodes to share them evenly
/// (16 is 8+8, 6+5+5, 4×4), few enough that a node's cursors are one short
/// write per batch. Fixed, because a device's partition must not change
/// while its uplinks are in the log.
pub const PARTITIONS: u16 = 16;

/// How often [`follow_appends`] looks for other nodes' appends.
const FOLLOW_INTERVAL: Duration = Duration::from_millis(20);

/// Advances `committed` to the newest `seq` in the log, every
/// [`FOLLOW_INTERVAL`], until the store is dropped: this node's own
/// appends advance it as they commit, and this finds the other nodes'
/// (appends commit in `seq` order, see [`SERIAL_APPENDS`], so the newest
/// visible `seq` has none below it still to come).
pub(super) async fn follow_appends(pool: Pool, committed: Arc<watch::Sender<u64>>) {
    let mut failing = false;
    while !committed.is_closed() {
        tokio::time::sleep(FOLLOW_INTERVAL).await;
        let newest = match pool.get().await {
            Ok(client) => client
                .query_one("SELECT COALESCE(MAX(seq), 0) FROM ingest_log", &[])
                .await
                .map(|row| row.get::<_, i64>(0)),
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "looking for other nodes' uplinks failed; retrying");
                }
                failing = true;
                continue;
            }
        };
        match newest {
            Ok(seq) => {
                failing = false;
                let seq = u64::try_from(seq).unwrap_or(0);
                committed.send_if_modified(|current| {
                    let newer = seq > *current;
                    if newer {
                        *current = seq;
                    }
                    newer
                });
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "looking for other nodes' uplinks failed; retrying");
                }
                failing = true;
            }
        }
    }
}

/// Most log entries one prune deletes, so a prune never holds the log's
/// writer (and the 202s waiting on it) for long.
const PRUNE_CHUNK: i64 = 50_000;

#[async_trait]
impl IngestLogStore for PostgresStore {
    async fn append_uplink(&self, uplink: NewUplink) -> Result<u64> {
        self.log
            .append(move |c| {
                Box::pin(async move {
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
                })
            })
            .await
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
                 WHERE seq >= $1 AND ($3::SMALLINT[] IS NULL OR part = ANY($3)) \
                 ORDER BY seq LIMIT $2",
                &[&to_i64(from_seq), &limit, &partitions],
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
