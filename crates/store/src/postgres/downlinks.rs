//! [`DownlinkStore`] on PostgreSQL: the same rows as SQLite's, written
//! through the main writer, read from the pool. A claim is one `UPDATE …
//! RETURNING` over rows locked with `SKIP LOCKED`, so workers of several
//! processes never take the same downlink.

use async_trait::async_trait;
use tokio_postgres::Row;
use weft_model::{Downlink, DownlinkRoute};

use super::conn::Conn;
use super::schema::db;
use super::PostgresStore;
use crate::downlinks::FINISHED_DOWNLINKS_KEPT;
use crate::{encode, DownlinkStore, Result, StoreError};

#[async_trait]
impl DownlinkStore for PostgresStore {
    async fn queue_downlinks(
        &self,
        device_id: &str,
        downlinks: &[Downlink],
        replace: bool,
    ) -> Result<Vec<Downlink>> {
        let rows = downlinks
            .iter()
            .map(|d| {
                Ok((
                    d.id.clone(),
                    d.status.as_str(),
                    d.next_attempt_at,
                    encode("downlink", d)?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let device = device_id.to_string();
        self.main
            .write(move |c| {
                Box::pin(async move {
                    let removed = if replace {
                        take_open(c, &device).await?
                    } else {
                        Vec::new()
                    };
                    for (id, status, due, json) in &rows {
                        c.execute(
                            "INSERT INTO downlinks (id, device_id, status, due_at, json) \
                             VALUES ($1, $2, $3, $4, $5)",
                            &[id, &device, status, due, json],
                        )
                        .await
                        .map_err(db)?;
                    }
                    Ok(removed)
                })
            })
            .await
    }

    async fn list_downlinks(&self, device_id: &str) -> Result<Vec<Downlink>> {
        let client = self.reader().await?;
        let rows = client
            .query(
                "SELECT json FROM downlinks WHERE device_id = $1 ORDER BY seq",
                &[&device_id],
            )
            .await
            .map_err(db)?;
        decode_all(&rows)
    }

    async fn flush_downlinks(&self, device_id: &str) -> Result<Vec<Downlink>> {
        let device = device_id.to_string();
        self.main
            .write(move |c| Box::pin(async move { take_open(c, &device).await }))
            .await
    }

    async fn claim_due_downlinks(
        &self,
        now: i64,
        lease_until: i64,
        limit: usize,
    ) -> Result<Vec<Downlink>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.main
            .write(move |c| {
                Box::pin(async move {
                    let rows = c
                        .query(
                            "UPDATE downlinks SET due_at = $2 WHERE seq IN ( \
                               SELECT seq FROM downlinks \
                               WHERE status IN ('queued', 'pending') AND due_at <= $1 \
                               ORDER BY due_at, seq LIMIT $3 FOR UPDATE SKIP LOCKED) \
                             RETURNING seq, json",
                            &[&now, &lease_until, &limit],
                        )
                        .await
                        .map_err(db)?;
                    let mut claimed = rows
                        .iter()
                        .map(|row| Ok((row.get::<_, i64>(0), decode(row.get(1))?)))
                        .collect::<Result<Vec<_>>>()?;
                    claimed.sort_by_key(|(seq, d)| (d.next_attempt_at, *seq));
                    Ok(claimed.into_iter().map(|(_, d)| d).collect())
                })
            })
            .await
    }

    async fn next_downlink_due(&self) -> Result<Option<i64>> {
        let client = self.reader().await?;
        let row = client
            .query_one(
                "SELECT MIN(due_at) FROM downlinks WHERE status IN ('queued', 'pending')",
                &[],
            )
            .await
            .map_err(db)?;
        Ok(row.get(0))
    }

    async fn update_downlink(&self, downlink: &Downlink) -> Result<bool> {
        let json = encode("downlink", downlink)?;
        let (id, device) = (downlink.id.clone(), downlink.device_id.clone());
        let (status, due) = (downlink.status.as_str(), downlink.next_attempt_at);
        let finished = !downlink.status.is_open();
        self.main
            .write(move |c| {
                Box::pin(async move {
                    let n = c
                        .execute(
                            "UPDATE downlinks SET status = $2, due_at = $3, json = $4 \
                             WHERE id = $1 AND status IN ('queued', 'pending')",
                            &[&id, &status, &due, &json],
                        )
                        .await
                        .map_err(db)?;
                    if n > 0 && finished {
                        c.execute(
                            "DELETE FROM downlinks WHERE device_id = $1 \
                               AND status NOT IN ('queued', 'pending') AND seq <= \
                               (SELECT seq FROM downlinks WHERE device_id = $1 \
                                  AND status NOT IN ('queued', 'pending') \
                                ORDER BY seq DESC LIMIT 1 OFFSET $2)",
                            &[&device, &(FINISHED_DOWNLINKS_KEPT as i64)],
                        )
                        .await
                        .map_err(db)?;
                    }
                    Ok(n > 0)
                })
            })
            .await
    }

    /// One statement committed on its own (not in a batch of the main
    /// writer), as [`put_downlink_route`](DownlinkStore::put_downlink_route).
    async fn wake_pending_downlinks(&self, device_id: &str, now: i64) -> Result<u64> {
        let client = self.reader().await?;
        client
            .execute(
                "UPDATE downlinks SET due_at = $2 \
                 WHERE device_id = $1 AND status = 'pending' AND due_at > $2",
                &[&device_id, &now],
            )
            .await
            .map_err(db)
    }

    /// One statement committed on its own, not in a batch of the main
    /// writer: a route is written by whichever node an uplink came
    /// through, so two nodes write the same devices' routes at once, and
    /// in batches, each holding some routes' rows until its commit, they
    /// would deadlock (one row a transaction cannot). Last write wins.
    async fn put_downlink_route(&self, device_id: &str, route: &DownlinkRoute) -> Result<()> {
        let json = encode("downlink route", route)?;
        let client = self.reader().await?;
        client
            .execute(
                "INSERT INTO downlink_routes (device_id, json) VALUES ($1, $2) \
                 ON CONFLICT (device_id) DO UPDATE SET json = excluded.json",
                &[&device_id, &json],
            )
            .await
            .map(|_| ())
            .map_err(db)
    }

    async fn downlink_route(&self, device_id: &str) -> Result<Option<DownlinkRoute>> {
        let client = self.reader().await?;
        let row = client
            .query_opt(
                "SELECT json FROM downlink_routes WHERE device_id = $1",
                &[&device_id],
            )
            .await
            .map_err(db)?;
        row.map(|row| {
            serde_json::from_str(row.get(0))
                .map_err(|e| StoreError::Corrupt(format!("downlink route of {device_id:?}: {e}")))
        })
        .transpose()
    }
}

/// Deletes the device's open downlinks and answers them, oldest first.
async fn take_open(c: &Conn, device: &str) -> Result<Vec<Downlink>> {
    let rows = c
        .query(
            "DELETE FROM downlinks WHERE device_id = $1 AND status IN ('queued', 'pending') \
             RETURNING seq, json",
            &[&device],
        )
        .await
        .map_err(db)?;
    let mut open = rows
        .iter()
        .map(|row| Ok((row.get::<_, i64>(0), decode(row.get(1))?)))
        .collect::<Result<Vec<_>>>()?;
    open.sort_by_key(|(seq, _)| *seq);
    Ok(open.into_iter().map(|(_, d)| d).collect())
}

fn decode_all(rows: &[Row]) -> Result<Vec<Downlink>> {
    rows.iter().map(|row| decode(row.get(0))).collect()
}

fn decode(json: &str) -> Result<Downlink> {
    serde_json::from_str(json).map_err(|e| StoreError::Corrupt(format!("downlink: {e}")))
}
