//! Membership and leases on PostgreSQL: one statement each, on a pooled
//! connection of its own (never queued behind a writer's batch), timed by
//! the database's clock so every node judges expiry alike.

use std::time::Duration;

use async_trait::async_trait;

use super::schema::db;
use super::PostgresStore;
use crate::cluster::{ClusterStore, ClusterView, LeaseRecord, NodeInfo, NodeRecord};
use crate::Result;

/// The database's clock in epoch ms.
const NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[async_trait]
impl ClusterStore for PostgresStore {
    async fn heartbeat(&self, node: &NodeInfo, forget_after: Duration) -> Result<()> {
        let client = self.reader().await?;
        client
            .execute(
                &format!(
                    "INSERT INTO cluster_nodes (node, address, version, started_at, last_seen) \
                     VALUES ($1, $2, $3, $4, {NOW_MS}) \
                     ON CONFLICT (node) DO UPDATE SET address = EXCLUDED.address, \
                       version = EXCLUDED.version, last_seen = EXCLUDED.last_seen"
                ),
                &[&node.node, &node.address, &node.version, &node.started_at],
            )
            .await
            .map_err(db)?;
        client
            .execute(
                &format!("DELETE FROM cluster_nodes WHERE last_seen < {NOW_MS} - $1"),
                &[&ms(forget_after)],
            )
            .await
            .map_err(db)?;
        Ok(())
    }

    async fn claim_lease(&self, work: &str, node: &str, ttl: Duration, load: f64) -> Result<bool> {
        let client = self.reader().await?;
        // One statement: the row lock of the upsert orders concurrent
        // claims, and the loser's `WHERE` sees the winner's row.
        let row = client
            .query_opt(
                &format!(
                    "INSERT INTO cluster_leases AS l (work, holder, expires_at, load) \
                     VALUES ($1, $2, {NOW_MS} + $3, $4) \
                     ON CONFLICT (work) DO UPDATE SET holder = EXCLUDED.holder, \
                       expires_at = EXCLUDED.expires_at, load = EXCLUDED.load \
                     WHERE l.holder = EXCLUDED.holder OR l.expires_at < {NOW_MS} \
                     RETURNING holder"
                ),
                &[&work, &node, &ms(ttl), &load],
            )
            .await
            .map_err(db)?;
        Ok(row.is_some())
    }

    async fn release_lease(&self, work: &str, node: &str) -> Result<()> {
        let client = self.reader().await?;
        client
            .execute(
                "DELETE FROM cluster_leases WHERE work = $1 AND holder = $2",
                &[&work, &node],
            )
            .await
            .map_err(db)?;
        Ok(())
    }

    async fn cluster_view(&self) -> Result<ClusterView> {
        let client = self.reader().await?;
        let now: i64 = client
            .query_one(&format!("SELECT {NOW_MS}"), &[])
            .await
            .map_err(db)?
            .get(0);
        let nodes = client
            .query(
                "SELECT node, address, version, started_at, last_seen FROM cluster_nodes \
                 ORDER BY started_at, node",
                &[],
            )
            .await
            .map_err(db)?
            .iter()
            .map(|r| NodeRecord {
                info: NodeInfo {
                    node: r.get(0),
                    address: r.get(1),
                    version: r.get(2),
                    started_at: r.get(3),
                },
                last_seen: r.get(4),
            })
            .collect();
        let leases = client
            .query(
                "SELECT work, holder, expires_at, load FROM cluster_leases ORDER BY work",
                &[],
            )
            .await
            .map_err(db)?
            .iter()
            .map(|r| LeaseRecord {
                work: r.get(0),
                holder: r.get(1),
                expires_at: r.get(2),
                load: r.get(3),
            })
            .collect();
        Ok(ClusterView { now, nodes, leases })
    }
}
