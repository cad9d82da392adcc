//! [`DownlinkStore`] on the main file: one row per downlink (its status
//! and next attempt beside the JSON record, for the worker's index), one
//! per device route.

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension};
use weft_model::{Downlink, DownlinkRoute};

use super::reader::corrupt;
use super::writer::in_savepoint;
use super::{encode, Db, SqliteStore};
use crate::downlinks::FINISHED_DOWNLINKS_KEPT;
use crate::{DownlinkStore, Result, StoreError};

/// What makes a row open, in SQL.
const OPEN: &str = "status IN ('queued', 'pending')";

#[async_trait]
impl DownlinkStore for SqliteStore {
    async fn queue_downlinks(
        &self,
        device_id: &str,
        downlinks: &[Downlink],
        replace: bool,
    ) -> Result<Vec<Downlink>> {
        let rows = rows(downlinks)?;
        let device = device_id.to_string();
        // All or nothing: a duplicate id leaves the queue as it was.
        let removed = self
            .main
            .write(move |c| {
                in_savepoint(c, |c| {
                    let removed = if replace {
                        take_open(c, &device)?
                    } else {
                        Vec::new()
                    };
                    let mut insert = c.prepare_cached(
                        "INSERT INTO downlinks (id, device_id, status, due_at, json) \
                         VALUES (?1, ?2, ?3, ?4, ?5)",
                    )?;
                    for (id, status, due, json) in &rows {
                        insert.execute((id, &device, status, due, json))?;
                    }
                    Ok(removed)
                })
            })
            .await?;
        decode_all(&removed)
    }

    async fn list_downlinks(&self, device_id: &str) -> Result<Vec<Downlink>> {
        let device = device_id.to_string();
        self.main
            .read(move |c| {
                select(
                    c,
                    "SELECT json FROM downlinks WHERE device_id = ?1 ORDER BY seq",
                    &device,
                )
            })
            .await
    }

    async fn flush_downlinks(&self, device_id: &str) -> Result<Vec<Downlink>> {
        let device = device_id.to_string();
        let removed = self
            .main
            .write(move |c| in_savepoint(c, |c| take_open(c, &device)))
            .await?;
        decode_all(&removed)
    }

    async fn claim_due_downlinks(
        &self,
        now: i64,
        lease_until: i64,
        limit: usize,
    ) -> Result<Vec<Downlink>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let claimed = self
            .main
            .write(move |c| {
                in_savepoint(c, |c| {
                    let mut stmt = c.prepare_cached(&format!(
                        "SELECT seq, json FROM downlinks WHERE {OPEN} AND due_at <= ?1 \
                         ORDER BY due_at, seq LIMIT ?2"
                    ))?;
                    let mut rows = stmt.query((now, limit))?;
                    let mut claimed = Vec::new();
                    let mut seqs = Vec::new();
                    while let Some(row) = rows.next()? {
                        seqs.push(row.get::<_, i64>(0)?);
                        claimed.push(row.get::<_, String>(1)?);
                    }
                    let mut lease =
                        c.prepare_cached("UPDATE downlinks SET due_at = ?1 WHERE seq = ?2")?;
                    for seq in seqs {
                        lease.execute((lease_until, seq))?;
                    }
                    Ok(claimed)
                })
            })
            .await?;
        decode_all(&claimed)
    }

    async fn next_downlink_due(&self) -> Result<Option<i64>> {
        self.main
            .read(|c| {
                c.prepare_cached(&format!("SELECT MIN(due_at) FROM downlinks WHERE {OPEN}"))
                    .db()?
                    .query_row([], |row| row.get(0))
                    .db()
            })
            .await
    }

    async fn update_downlink(&self, downlink: &Downlink) -> Result<bool> {
        let json = encode("downlink", downlink)?;
        let (id, device) = (downlink.id.clone(), downlink.device_id.clone());
        let (status, due) = (downlink.status.as_str(), downlink.next_attempt_at);
        let finished = !downlink.status.is_open();
        self.main
            .write(move |c| {
                in_savepoint(c, |c| {
                    let n = c
                        .prepare_cached(&format!(
                            "UPDATE downlinks SET status = ?2, due_at = ?3, json = ?4 \
                             WHERE id = ?1 AND {OPEN}"
                        ))?
                        .execute((&id, status, due, &json))?;
                    if n > 0 && finished {
                        c.prepare_cached(&format!(
                            "DELETE FROM downlinks WHERE device_id = ?1 AND NOT {OPEN} \
                             AND seq <= (SELECT seq FROM downlinks \
                               WHERE device_id = ?1 AND NOT {OPEN} \
                               ORDER BY seq DESC LIMIT 1 OFFSET ?2)"
                        ))?
                        .execute((&device, FINISHED_DOWNLINKS_KEPT as i64))?;
                    }
                    Ok(n > 0)
                })
            })
            .await
    }

    async fn wake_pending_downlinks(&self, device_id: &str, now: i64) -> Result<u64> {
        let device = device_id.to_string();
        self.main
            .write(move |c| {
                c.prepare_cached(
                    "UPDATE downlinks SET due_at = ?2 \
                     WHERE device_id = ?1 AND status = 'pending' AND due_at > ?2",
                )?
                .execute((&device, now))
                .map(|n| n as u64)
            })
            .await
    }

    async fn put_downlink_route(&self, device_id: &str, route: &DownlinkRoute) -> Result<()> {
        let json = encode("downlink route", route)?;
        let device = device_id.to_string();
        self.main
            .write(move |c| {
                c.prepare_cached(
                    "INSERT INTO downlink_routes (device_id, json) VALUES (?1, ?2) \
                     ON CONFLICT (device_id) DO UPDATE SET json = excluded.json",
                )?
                .execute((&device, &json))
                .map(|_| ())
            })
            .await
    }

    async fn downlink_route(&self, device_id: &str) -> Result<Option<DownlinkRoute>> {
        let device = device_id.to_string();
        self.main
            .read(move |c| {
                let json: Option<String> = c
                    .prepare_cached("SELECT json FROM downlink_routes WHERE device_id = ?1")
                    .db()?
                    .query_row([&device], |row| row.get(0))
                    .optional()
                    .db()?;
                json.map(|j| {
                    serde_json::from_str(&j)
                        .map_err(|e| corrupt(&format!("downlink route of {device:?}"), e))
                })
                .transpose()
            })
            .await
    }
}

/// The rows to insert: id, status, due time and JSON of each downlink.
fn rows(downlinks: &[Downlink]) -> Result<Vec<(String, &'static str, i64, String)>> {
    downlinks
        .iter()
        .map(|d| {
            Ok((
                d.id.clone(),
                d.status.as_str(),
                d.next_attempt_at,
                encode("downlink", d)?,
            ))
        })
        .collect()
}

/// Deletes the device's open downlinks and answers their JSON, oldest first.
fn take_open(c: &Connection, device: &str) -> rusqlite::Result<Vec<String>> {
    let mut stmt = c.prepare_cached(&format!(
        "SELECT json FROM downlinks WHERE device_id = ?1 AND {OPEN} ORDER BY seq"
    ))?;
    let open = stmt
        .query_map([device], |row| row.get(0))?
        .collect::<rusqlite::Result<Vec<String>>>()?;
    c.prepare_cached(&format!(
        "DELETE FROM downlinks WHERE device_id = ?1 AND {OPEN}"
    ))?
    .execute([device])?;
    Ok(open)
}

fn decode_all(jsons: &[String]) -> Result<Vec<Downlink>> {
    jsons.iter().map(|j| decode(j)).collect()
}

fn select(c: &Connection, sql: &str, device: &str) -> Result<Vec<Downlink>> {
    let mut stmt = c.prepare_cached(sql).db()?;
    let mut rows = stmt.query([device]).db()?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().db()? {
        out.push(decode(&row.get::<_, String>(0).db()?)?);
    }
    Ok(out)
}

fn decode(json: &str) -> Result<Downlink> {
    serde_json::from_str(json).map_err(|e| StoreError::Corrupt(format!("downlink: {e}")))
}
