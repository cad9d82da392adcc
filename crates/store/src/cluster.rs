//! Who is in the cluster and who does which singular piece of work.
//!
//! Several weft nodes on one PostgreSQL database share the work that must
//! be done once (the ingest consumer, the rule engine, history's moves and
//! retention, the expiry of transient entities) through *leases*: a row per
//! piece of work naming the node doing it and until when. A node renews
//! its leases well before they expire; a node that dies stops renewing, and
//! another takes the lease over once it has expired. The database's clock
//! decides expiry, so nodes with drifting clocks agree.
//!
//! The same rows record membership: every node writes a heartbeat, and a
//! node silent for long is forgotten.
//!
//! SQLite runs one node (the data directory is locked to one process), so
//! its leases and membership live in memory ([`LocalCluster`]): the node
//! is always granted everything, through the same calls.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use serde::Serialize;

use crate::Result;

/// What a node says of itself in its heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeInfo {
    /// The node's id (random at each start).
    pub node: String,
    /// Where its HTTP API listens, as configured (for `weft cluster status`).
    pub address: String,
    /// weft's version on that node.
    pub version: String,
    /// When the node started (epoch ms).
    pub started_at: i64,
}

/// A node as the store last heard of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeRecord {
    /// What the node said of itself.
    #[serde(flatten)]
    pub info: NodeInfo,
    /// Its last heartbeat (epoch ms, the store's clock).
    pub last_seen: i64,
}

/// One lease: a piece of work done by one node at a time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LeaseRecord {
    /// The work's name (`ingest`, `rules`, …).
    pub work: String,
    /// The node holding it.
    pub holder: String,
    /// Until when (epoch ms, the store's clock); past that, any node may
    /// take it.
    pub expires_at: i64,
    /// How much work a second the holder measured on it when it last
    /// renewed it (0: not measured), so the nodes share split work by
    /// load (`weft_pipeline::balance`).
    pub load: f64,
}

/// The cluster as the store sees it, for `/health` and `weft cluster status`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ClusterView {
    /// The store's clock when read (epoch ms), to judge `last_seen` and
    /// `expires_at` against.
    pub now: i64,
    /// Nodes heard of recently, oldest first.
    pub nodes: Vec<NodeRecord>,
    /// Every lease, by work.
    pub leases: Vec<LeaseRecord>,
}

/// Membership and leases. Kept apart from the data so that a lease is
/// claimed on its own, never behind a batch of writes.
#[async_trait]
pub trait ClusterStore: Send + Sync {
    /// Records that `node` is alive now and forgets nodes silent for more
    /// than `forget_after`.
    async fn heartbeat(&self, node: &NodeInfo, forget_after: Duration) -> Result<()>;

    /// Takes lease `work` for `node` (if free, expired or already
    /// `node`'s) until `ttl` from now, recording the `load` (work a
    /// second) `node` measured on it; answers whether `node` holds it
    /// afterwards.
    async fn claim_lease(&self, work: &str, node: &str, ttl: Duration, load: f64) -> Result<bool>;

    /// Gives up lease `work` if `node` holds it, so another node takes it
    /// at once rather than when it expires.
    async fn release_lease(&self, work: &str, node: &str) -> Result<()>;

    /// Every node heard of and every lease.
    async fn cluster_view(&self) -> Result<ClusterView>;
}

/// Membership and leases of a store only one process can open: in memory,
/// with the same rules as the shared ones.
#[derive(Debug, Default)]
pub struct LocalCluster {
    state: parking_lot::Mutex<LocalState>,
}

#[derive(Debug, Default)]
struct LocalState {
    nodes: HashMap<String, NodeRecord>,
    leases: HashMap<String, LeaseRecord>,
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[async_trait]
impl ClusterStore for LocalCluster {
    async fn heartbeat(&self, node: &NodeInfo, forget_after: Duration) -> Result<()> {
        let now = weft_model::now_ms();
        let mut s = self.state.lock();
        s.nodes.insert(
            node.node.clone(),
            NodeRecord {
                info: node.clone(),
                last_seen: now,
            },
        );
        s.nodes
            .retain(|_, n| n.last_seen >= now.saturating_sub(ms(forget_after)));
        Ok(())
    }

    async fn claim_lease(&self, work: &str, node: &str, ttl: Duration, load: f64) -> Result<bool> {
        let now = weft_model::now_ms();
        let mut s = self.state.lock();
        let lease = s
            .leases
            .entry(work.to_string())
            .or_insert_with(|| LeaseRecord {
                work: work.to_string(),
                holder: node.to_string(),
                expires_at: 0,
                load: 0.0,
            });
        if lease.holder == node || lease.expires_at < now {
            lease.holder = node.to_string();
            lease.expires_at = now.saturating_add(ms(ttl));
            lease.load = load;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    async fn release_lease(&self, work: &str, node: &str) -> Result<()> {
        let mut s = self.state.lock();
        if s.leases.get(work).is_some_and(|l| l.holder == node) {
            s.leases.remove(work);
        }
        Ok(())
    }

    async fn cluster_view(&self) -> Result<ClusterView> {
        let s = self.state.lock();
        let mut nodes: Vec<NodeRecord> = s.nodes.values().cloned().collect();
        nodes.sort_by(|a, b| {
            (a.info.started_at, &a.info.node).cmp(&(b.info.started_at, &b.info.node))
        });
        let mut leases: Vec<LeaseRecord> = s.leases.values().cloned().collect();
        leases.sort_by(|a, b| a.work.cmp(&b.work));
        Ok(ClusterView {
            now: weft_model::now_ms(),
            nodes,
            leases,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str) -> NodeInfo {
        NodeInfo {
            node: id.into(),
            address: "127.0.0.1:8080".into(),
            version: "test".into(),
            started_at: 1,
        }
    }

    /// A lease is one node's until it expires or is released; then the
    /// other node takes it.
    #[tokio::test]
    async fn a_lease_is_held_by_one_node_until_it_expires_or_is_released() {
        let c = LocalCluster::default();
        assert!(c
            .claim_lease("ingest", "a", Duration::from_millis(80), 0.0)
            .await
            .unwrap());
        assert!(!c
            .claim_lease("ingest", "b", Duration::from_secs(5), 0.0)
            .await
            .unwrap());
        assert!(c
            .claim_lease("ingest", "a", Duration::from_millis(80), 0.0)
            .await
            .unwrap());
        tokio::time::sleep(Duration::from_millis(120)).await;
        assert!(c
            .claim_lease("ingest", "b", Duration::from_secs(5), 0.0)
            .await
            .unwrap());
        assert!(!c
            .claim_lease("ingest", "a", Duration::from_secs(5), 0.0)
            .await
            .unwrap());
        c.release_lease("ingest", "a").await.unwrap();
        assert!(!c
            .claim_lease("ingest", "a", Duration::from_secs(5), 0.0)
            .await
            .unwrap());
        c.release_lease("ingest", "b").await.unwrap();
        assert!(c
            .claim_lease("ingest", "a", Duration::from_secs(5), 0.0)
            .await
            .unwrap());
        c.heartbeat(&node("a"), Duration::from_secs(60))
            .await
            .unwrap();
        let view = c.cluster_view().await.unwrap();
        assert_eq!(view.nodes.len(), 1);
        assert_eq!(view.leases[0].holder, "a");
    }
}
