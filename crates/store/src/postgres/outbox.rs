//! [`OutboxStore`] on PostgreSQL: the change log and the subscriptions'
//! cursors over it. Changes are logged by the main writer's writes that
//! make them ([`log_changes`], in the same transaction as the entity
//! write); pruning and the cursors are writes of the main writer too, and
//! reads go through the pool.

use async_trait::async_trait;

use super::conn::Conn;
use super::schema::db;
use super::writer::param;
use super::{position, to_i64, PostgresStore};
use crate::{
    Backlog, LoggedChange, NotificationCursor, OutboxStore, Result, CHANGE_LOG_PRUNE_CHUNK,
};

#[async_trait]
impl OutboxStore for PostgresStore {
    async fn change_log_head(&self, node: &str) -> Result<u64> {
        let client = self.reader().await?;
        let row = client
            .query_one(
                "SELECT COALESCE(MAX(seq), 0) FROM change_log WHERE node = $1",
                &[&node],
            )
            .await
            .map_err(db)?;
        position(&row, 0)
    }

    async fn read_change_log(
        &self,
        node: &str,
        tenant: Option<&str>,
        after: u64,
        through: u64,
        limit: usize,
    ) -> Result<Vec<LoggedChange>> {
        let client = self.reader().await?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = client
            .query(
                "SELECT seq, tenant, at, body FROM change_log \
                 WHERE node = $1 AND seq > $2 AND seq <= $3 \
                   AND ($5::TEXT IS NULL OR tenant = $5) \
                 ORDER BY seq LIMIT $4",
                &[&node, &to_i64(after), &to_i64(through), &limit, &tenant],
            )
            .await
            .map_err(db)?;
        rows.iter()
            .map(|row| {
                Ok(LoggedChange {
                    node: node.to_string(),
                    seq: position(row, 0)?,
                    tenant: row.get(1),
                    at: row.get(2),
                    body: row.get(3),
                })
            })
            .collect()
    }

    async fn change_log_nodes(&self) -> Result<Vec<String>> {
        let client = self.reader().await?;
        let rows = client
            .query("SELECT DISTINCT node FROM change_log", &[])
            .await
            .map_err(db)?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    async fn change_log_backlog(&self, node: &str, tenant: &str, after: u64) -> Result<Backlog> {
        let client = self.reader().await?;
        let row = client
            .query_one(
                "SELECT COUNT(*), MIN(at) FROM change_log \
                 WHERE node = $1 AND seq > $2 AND tenant = $3",
                &[&node, &to_i64(after), &tenant],
            )
            .await
            .map_err(db)?;
        Ok(Backlog {
            changes: row.get::<_, i64>(0).max(0) as u64,
            oldest: row.get(1),
        })
    }

    async fn prune_change_log(&self, node: &str, through: u64, before: i64) -> Result<u64> {
        // The node's last change stays (`seq <` its highest), so its head
        // survives; the oldest go first, a chunk at a time.
        self.main
            .execute(
                "DELETE FROM change_log WHERE node = $1 AND seq IN ( \
                   SELECT seq FROM change_log WHERE node = $1 \
                     AND seq < (SELECT MAX(seq) FROM change_log WHERE node = $1) \
                     AND (seq <= $2 OR at < $3) \
                   ORDER BY seq LIMIT $4)",
                vec![
                    param(node.to_string()),
                    param(to_i64(through)),
                    param(before),
                    param(CHANGE_LOG_PRUNE_CHUNK as i64),
                ],
            )
            .await
    }

    async fn load_notification_cursors(&self, node: &str) -> Result<Vec<NotificationCursor>> {
        let client = self.reader().await?;
        let rows = client
            .query(
                "SELECT tenant, subscription, through FROM notification_cursors \
                 WHERE node = $1",
                &[&node],
            )
            .await
            .map_err(db)?;
        rows.iter()
            .map(|row| {
                Ok(NotificationCursor {
                    tenant: row.get(0),
                    subscription: row.get(1),
                    through: position(row, 2)?,
                })
            })
            .collect()
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
                Box::pin(async move {
                    let tenants: Vec<&str> = cursors.iter().map(|k| k.tenant.as_str()).collect();
                    let subscriptions: Vec<&str> =
                        cursors.iter().map(|k| k.subscription.as_str()).collect();
                    let throughs: Vec<i64> = cursors.iter().map(|k| to_i64(k.through)).collect();
                    // One statement over arrays; of a subscription given
                    // twice the later cursor is kept, as a row per cursor
                    // written in turn would.
                    c.execute(
                        "INSERT INTO notification_cursors (node, tenant, subscription, through) \
                         SELECT DISTINCT ON (tenant, subscription) $1::TEXT, tenant, subscription, \
                                through \
                         FROM UNNEST($2::TEXT[], $3::TEXT[], $4::BIGINT[]) WITH ORDINALITY \
                              AS u(tenant, subscription, through, i) \
                         ORDER BY tenant, subscription, i DESC \
                         ON CONFLICT (node, tenant, subscription) \
                         DO UPDATE SET through = excluded.through",
                        &[&node, &tenants, &subscriptions, &throughs],
                    )
                    .await
                    .map_err(db)?;
                    Ok(())
                })
            })
            .await
    }

    async fn forget_notification_cursors(&self, tenant: &str, subscription: &str) -> Result<()> {
        self.main
            .execute(
                "DELETE FROM notification_cursors WHERE tenant = $1 AND subscription = $2",
                vec![param(tenant.to_string()), param(subscription.to_string())],
            )
            .await?;
        Ok(())
    }
}

/// Logs changes in the caller's transaction of the main writer (nothing
/// for none), as one statement over arrays. A change whose `(node, seq)`
/// is logged already replaces it; of one given twice the later is kept,
/// as SQLite's insert-or-replace row by row does.
pub(super) async fn log_changes(c: &Conn, changes: &[LoggedChange]) -> Result<()> {
    if changes.is_empty() {
        return Ok(());
    }
    let column = |f: fn(&LoggedChange) -> &str| changes.iter().map(f).collect::<Vec<&str>>();
    let bodies: Vec<&[u8]> = changes.iter().map(|k| k.body.as_slice()).collect();
    let seqs: Vec<i64> = changes.iter().map(|k| to_i64(k.seq)).collect();
    let ats: Vec<i64> = changes.iter().map(|k| k.at).collect();
    c.execute(
        "INSERT INTO change_log (node, seq, tenant, at, body) \
         SELECT DISTINCT ON (node, seq) node, seq, tenant, at, body \
         FROM UNNEST($1::TEXT[], $2::BIGINT[], $3::TEXT[], $4::BIGINT[], $5::BYTEA[]) \
              WITH ORDINALITY AS u(node, seq, tenant, at, body, i) \
         ORDER BY node, seq, i DESC \
         ON CONFLICT (node, seq) DO UPDATE SET \
           tenant = excluded.tenant, at = excluded.at, body = excluded.body",
        &[
            &column(|k| &k.node),
            &seqs,
            &column(|k| &k.tenant),
            &ats,
            &bodies,
        ],
    )
    .await
    .map_err(db)?;
    Ok(())
}
