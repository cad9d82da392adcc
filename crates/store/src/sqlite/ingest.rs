//! [`IngestLogStore`] on the log's own file: appends (the only writes an
//! uplink's 202 waits for), reads in `seq` order, and pruning.

use async_trait::async_trait;
use rusqlite::Connection;
use tokio::sync::watch;
use weft_model::{NewUplink, Uplink, UplinkFormat, UplinkPins};

use super::reader::{corrupt, position};
use super::{to_i64, Db, SqliteStore};
use crate::{IngestLogStore, Result};

#[async_trait]
impl IngestLogStore for SqliteStore {
    async fn append_uplink(&self, uplink: NewUplink) -> Result<u64> {
        self.log.append(move |c| append(c, &uplink)).await
    }

    fn committed_seq(&self) -> watch::Receiver<u64> {
        self.committed.clone()
    }

    async fn read_uplinks(
        &self,
        from_seq: u64,
        limit: usize,
        partitions: Option<&[u16]>,
    ) -> Result<Vec<Uplink>> {
        // One process, one partition (0): every entry is partition 0's.
        if partitions.is_some_and(|p| !p.contains(&0)) {
            return Ok(Vec::new());
        }
        self.log
            .read(move |c| read_uplinks(c, from_seq, limit))
            .await
    }

    async fn prune_uplinks(&self, below_seq: u64, received_before: i64) -> Result<u64> {
        self.log
            .write(move |c| prune(c, below_seq, received_before))
            .await
    }
}

/// Appends an uplink; answers its new `seq`.
fn append(conn: &Connection, uplink: &NewUplink) -> rusqlite::Result<u64> {
    let mut stmt = conn.prepare_cached(
        "INSERT INTO ingest_log \
         (received_at, format, channel, device_type, body, event, device_id, source, pins) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
    )?;
    let seq = stmt.insert((
        uplink.received_at,
        uplink.format.as_str(),
        uplink.channel.as_deref(),
        uplink.device_type.as_deref(),
        uplink.body.as_slice(),
        uplink.event.as_deref(),
        uplink.device_id.as_deref(),
        uplink.source.as_deref(),
        uplink.pins.to_stored(),
    ))?;
    Ok(seq as u64)
}

/// Deletes the oldest processed log entries received before the cutoff.
/// `received_at` grows with `seq` (stamped just before the append), so the
/// boundary is the first entry received at or after the cutoff, found by
/// scanning from the oldest entry: the cost is proportional to what is
/// deleted, never to the size of the log. At most [`PRUNE_CHUNK`] entries
/// go per call, so one prune never holds the writer for long.
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

/// Up to `max` entries from `from_seq` on, in `seq` order.
fn read_uplinks(conn: &Connection, from_seq: u64, max: usize) -> Result<Vec<Uplink>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT seq, received_at, format, channel, device_type, body, event, device_id, source, pins \
             FROM ingest_log \
             WHERE seq >= ?1 ORDER BY seq LIMIT ?2",
        )
        .db()?;
    let mut rows = stmt
        .query((to_i64(from_seq), i64::try_from(max).unwrap_or(i64::MAX)))
        .db()?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().db()? {
        let seq = position(row, 0)?;
        let format: String = row.get(2).db()?;
        let format = UplinkFormat::parse(&format).ok_or_else(|| {
            corrupt(
                &format!("ingest log entry {seq}"),
                format!("unknown format {format:?}"),
            )
        })?;
        let pins: Option<String> = row.get(9).db()?;
        let pins = UplinkPins::from_stored(pins.as_deref())
            .map_err(|e| corrupt(&format!("ingest log entry {seq}"), e))?;
        out.push(Uplink {
            seq,
            uplink: NewUplink {
                pins,
                partition: 0,
                received_at: row.get(1).db()?,
                format,
                channel: row.get(3).db()?,
                device_type: row.get(4).db()?,
                body: row.get(5).db()?,
                event: row.get(6).db()?,
                device_id: row.get(7).db()?,
                source: row.get(8).db()?,
            },
        });
    }
    Ok(out)
}

/// The highest `seq` the ingest log ever handed out: SQLite's
/// `AUTOINCREMENT` counter, which survives pruning (so the value never
/// goes back after a restart), or the log's maximum.
pub(super) fn highest_seq(conn: &Connection) -> rusqlite::Result<u64> {
    conn.query_row(
        "SELECT MAX(COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'ingest_log'), 0), \
                    COALESCE((SELECT MAX(seq) FROM ingest_log), 0))",
        [],
        |row| row.get::<_, i64>(0),
    )
    .map(|n| n.max(0) as u64)
}
