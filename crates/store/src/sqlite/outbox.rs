//! [`OutboxStore`] on the main file (where the entities are, so a change
//! and its log entry commit together): the change log and the
//! subscriptions' cursors over it.

use async_trait::async_trait;
use rusqlite::Connection;

use super::reader::{corrupt, position};
use super::{to_i64, Db, SqliteStore};
use crate::{
    Backlog, LoggedChange, NotificationCursor, OutboxStore, Result, CHANGE_LOG_PRUNE_CHUNK,
};

#[async_trait]
impl OutboxStore for SqliteStore {
    async fn change_log_head(&self, node: &str) -> Result<u64> {
        let node = node.to_string();
        self.main
            .read(move |c| {
                c.prepare_cached("SELECT COALESCE(MAX(seq), 0) FROM change_log WHERE node = ?1")
                    .db()?
                    .query_row([&node], |r| r.get::<_, i64>(0))
                    .db()
                    .and_then(|n| u64::try_from(n).map_err(|e| corrupt("change_log.seq", e)))
            })
            .await
    }

    async fn read_change_log(
        &self,
        node: &str,
        tenant: Option<&str>,
        after: u64,
        through: u64,
        limit: usize,
    ) -> Result<Vec<LoggedChange>> {
        let node = node.to_string();
        let tenant = tenant.map(str::to_string);
        self.main
            .read(move |c| read_change_log(c, &node, tenant.as_deref(), after, through, limit))
            .await
    }

    async fn change_log_nodes(&self) -> Result<Vec<String>> {
        self.main
            .read(|c| {
                let mut stmt = c
                    .prepare_cached("SELECT DISTINCT node FROM change_log")
                    .db()?;
                let mut rows = stmt.query([]).db()?;
                let mut out = Vec::new();
                while let Some(row) = rows.next().db()? {
                    out.push(row.get(0).db()?);
                }
                Ok(out)
            })
            .await
    }

    async fn change_log_backlog(&self, node: &str, tenant: &str, after: u64) -> Result<Backlog> {
        let (node, tenant) = (node.to_string(), tenant.to_string());
        self.main
            .read(move |c| {
                c.prepare_cached(
                    "SELECT COUNT(*), MIN(at) FROM change_log                      WHERE node = ?1 AND seq > ?2 AND tenant = ?3",
                )
                .db()?
                .query_row((&node, to_i64(after), &tenant), |r| {
                    Ok(Backlog {
                        changes: r.get::<_, i64>(0)?.max(0) as u64,
                        oldest: r.get(1)?,
                    })
                })
                .db()
            })
            .await
    }

    async fn prune_change_log(&self, node: &str, through: u64, before: i64) -> Result<u64> {
        let node = node.to_string();
        self.main
            .write(move |c| {
                c.prepare_cached(
                    "DELETE FROM change_log WHERE node = ?1 AND seq IN ( \
                       SELECT seq FROM change_log WHERE node = ?1 \
                         AND seq < (SELECT MAX(seq) FROM change_log WHERE node = ?1) \
                         AND (seq <= ?2 OR at < ?3) \
                       ORDER BY seq LIMIT ?4)",
                )
                .and_then(|mut st| {
                    st.execute((
                        &node,
                        to_i64(through),
                        before,
                        CHANGE_LOG_PRUNE_CHUNK as i64,
                    ))
                })
                .map(|n| n as u64)
            })
            .await
    }

    async fn load_notification_cursors(&self, node: &str) -> Result<Vec<NotificationCursor>> {
        let node = node.to_string();
        self.main
            .read(move |c| {
                let mut stmt = c
                    .prepare_cached(
                        "SELECT tenant, subscription, through FROM notification_cursors \
                         WHERE node = ?1",
                    )
                    .db()?;
                let mut rows = stmt.query([&node]).db()?;
                let mut out = Vec::new();
                while let Some(row) = rows.next().db()? {
                    out.push(NotificationCursor {
                        tenant: row.get(0).db()?,
                        subscription: row.get(1).db()?,
                        through: position(row, 2)?,
                    });
                }
                Ok(out)
            })
            .await
    }

    async fn save_notification_cursors(
        &self,
        node: &str,
        cursors: Vec<NotificationCursor>,
    ) -> Result<()> {
        if cursors.is_empty() {
            return Ok(());
        }
        let node = node.to_string();
        self.main
            .write(move |c| {
                let mut stmt = c.prepare_cached(
                    "INSERT INTO notification_cursors (node, tenant, subscription, through) \
                     VALUES (?1, ?2, ?3, ?4) \
                     ON CONFLICT (node, tenant, subscription) \
                     DO UPDATE SET through = excluded.through",
                )?;
                for cursor in &cursors {
                    stmt.execute((
                        &node,
                        &cursor.tenant,
                        &cursor.subscription,
                        to_i64(cursor.through),
                    ))?;
                }
                Ok::<(), rusqlite::Error>(())
            })
            .await
    }

    async fn forget_notification_cursors(&self, tenant: &str, subscription: &str) -> Result<()> {
        let key = [tenant, subscription].map(str::to_string);
        self.main
            .write(move |c| {
                c.prepare_cached(
                    "DELETE FROM notification_cursors WHERE tenant = ?1 AND subscription = ?2",
                )
                .and_then(|mut st| st.execute((&key[0], &key[1])))
                .map(|_| ())
            })
            .await
    }
}

fn read_change_log(
    conn: &Connection,
    node: &str,
    tenant: Option<&str>,
    after: u64,
    through: u64,
    limit: usize,
) -> Result<Vec<LoggedChange>> {
    // One statement per filter, so neither has to plan for the other.
    let sql = if tenant.is_some() {
        "SELECT seq, tenant, at, body FROM change_log \
         WHERE node = ?1 AND seq > ?2 AND seq <= ?3 AND tenant = ?5 ORDER BY seq LIMIT ?4"
    } else {
        "SELECT seq, tenant, at, body FROM change_log \
         WHERE node = ?1 AND seq > ?2 AND seq <= ?3 ORDER BY seq LIMIT ?4"
    };
    let mut stmt = conn.prepare_cached(sql).db()?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut rows = match tenant {
        Some(t) => stmt.query((node, to_i64(after), to_i64(through), limit, t)),
        None => stmt.query((node, to_i64(after), to_i64(through), limit)),
    }
    .db()?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().db()? {
        out.push(LoggedChange {
            node: node.to_string(),
            seq: position(row, 0)?,
            tenant: row.get(1).db()?,
            at: row.get(2).db()?,
            body: row.get(3).db()?,
        });
    }
    Ok(out)
}

/// Logs changes in the caller's transaction.
pub(super) fn log_changes<'a>(
    conn: &Connection,
    changes: impl IntoIterator<Item = &'a LoggedChange>,
) -> rusqlite::Result<()> {
    let mut stmt = None;
    for change in changes {
        if stmt.is_none() {
            stmt = Some(conn.prepare_cached(
                "INSERT OR REPLACE INTO change_log (node, seq, tenant, at, body) \
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )?);
        }
        if let Some(stmt) = stmt.as_mut() {
            stmt.execute((
                &change.node,
                to_i64(change.seq),
                &change.tenant,
                change.at,
                &change.body,
            ))?;
        }
    }
    Ok(())
}
