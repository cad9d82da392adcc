//! This node in a cluster: its heartbeat, and the work it does only while
//! it holds that work's lease.
//!
//! Work that must be done once across the cluster — the pipeline (the
//! ingest consumer with the rule engine it feeds), history's moves and
//! retention, the expiry of transient entities, the channel bridges — runs
//! through
//! [`Cluster::run_leased`]: the node claims the work's lease in the store
//! and runs the work while it keeps renewing it; another node, claiming
//! the same lease all along, takes over once it expires (a dead node) or
//! is released (a node shutting down). On one node with SQLite the lease is
//! always granted at once, so nothing changes there.
//!
//! Why leases in the store rather than JetStream consumers: the work reads
//! and writes PostgreSQL anyway (the ingest log, the units, the cursors),
//! so a lease row there adds no new way of failing, the database's clock
//! judges expiry for every node alike, and a node that cannot reach the
//! database could not do the work anyway.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use weft_store::{NodeInfo, Store};

/// The leases: each names one piece of work done once across the cluster.
pub mod work {
    /// The ingest consumer (decode, store, entities) and the rule engine.
    pub const PIPELINE: &str = "pipeline";
    /// History: moving the feeds into the history and retention.
    pub const HISTORY: &str = "history";
    /// Deleting transient entities once they expire.
    pub const EXPIRY: &str = "expiry";
    /// The channel bridges (weft's events published into channels).
    pub const BRIDGES: &str = "bridges";
}

/// How leases and heartbeats are timed.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// This node's id, kept across restarts (the binary keeps it in the
    /// data directory); `None`: the bus's node id, or a random one.
    pub node: Option<String>,
    /// How long a claimed lease lasts unless renewed: how long a dead
    /// node's work waits before another node takes it over. Renewed every
    /// third of it.
    pub lease_ttl: Duration,
    /// Where this node's API listens, as the other nodes and operators
    /// should reach it (shown by `weft cluster status`).
    pub address: String,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            node: None,
            lease_ttl: Duration::from_secs(6),
            address: String::new(),
        }
    }
}

/// How often a node's heartbeat is written.
const HEARTBEAT: Duration = Duration::from_secs(2);
/// Nodes silent this long are dropped from the membership.
const FORGET_AFTER: Duration = Duration::from_secs(60);

/// This node: its identity, the leases it holds now and the loops that
/// claim them.
pub struct Cluster {
    store: Arc<dyn Store>,
    info: NodeInfo,
    config: ClusterConfig,
    held: parking_lot::Mutex<BTreeSet<&'static str>>,
}

impl Cluster {
    /// This node, identified as `node`.
    pub fn new(store: Arc<dyn Store>, node: String, config: ClusterConfig) -> Arc<Cluster> {
        Arc::new(Cluster {
            store,
            info: NodeInfo {
                node,
                address: config.address.clone(),
                version: env!("CARGO_PKG_VERSION").to_string(),
                started_at: weft_model::now_ms(),
            },
            config,
            held: parking_lot::Mutex::new(BTreeSet::new()),
        })
    }

    /// This node's id.
    pub fn node(&self) -> &str {
        &self.info.node
    }

    /// The work this node does right now (the leases it holds).
    pub fn held(&self) -> Vec<&'static str> {
        self.held.lock().iter().copied().collect()
    }

    /// Writes this node's heartbeat every couple of seconds until
    /// `shutdown`.
    pub async fn heartbeat_loop(self: Arc<Self>, shutdown: CancellationToken) {
        metrics::gauge!(
            "weft_cluster_node_info",
            "node" => self.info.node.clone(),
            "version" => self.info.version.clone()
        )
        .set(1.0);
        loop {
            if let Err(e) = self.store.heartbeat(&self.info, FORGET_AFTER).await {
                tracing::warn!(error = %e, "writing this node's heartbeat failed");
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(HEARTBEAT) => {}
            }
        }
    }

    /// Runs `run` on `tracker` while this node holds lease `work`, until
    /// `shutdown`. `run` gets a token that is cancelled when the lease is
    /// lost (or at shutdown) and must return soon after; it is started
    /// again whenever the lease is taken again. At shutdown the lease is
    /// released once `run` returned, so another node takes over at once.
    pub fn run_leased<F, Fut>(
        self: &Arc<Self>,
        work: &'static str,
        shutdown: CancellationToken,
        tracker: &TaskTracker,
        run: F,
    ) where
        F: Fn(CancellationToken) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let cluster = self.clone();
        tracker.spawn(async move {
            let renew = cluster.config.lease_ttl / 3;
            loop {
                if shutdown.is_cancelled() {
                    return;
                }
                if !cluster.claim(work).await {
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(renew) => continue,
                    }
                }
                cluster.held.lock().insert(work);
                metrics::gauge!("weft_cluster_lease_held", "work" => work).set(1.0);
                tracing::info!(work, node = %cluster.info.node, "took this work's lease: this node does it now");
                let stop = shutdown.child_token();
                let mut running = tokio::spawn(run(stop.clone()));
                let mut renewed = Instant::now();
                loop {
                    tokio::select! {
                        _ = &mut running => break,
                        _ = tokio::time::sleep(renew), if !stop.is_cancelled() => {
                            if cluster.claim(work).await {
                                renewed = Instant::now();
                            } else if renewed.elapsed() >= renew * 2 {
                                // Stop before the lease can have expired
                                // for the others (a third of it to spare).
                                tracing::warn!(work, "lost this work's lease (or could not renew it); stopping it here");
                                stop.cancel();
                            }
                        }
                    }
                }
                cluster.held.lock().remove(work);
                metrics::gauge!("weft_cluster_lease_held", "work" => work).set(0.0);
                if shutdown.is_cancelled() {
                    if let Err(e) = cluster.store.release_lease(work, &cluster.info.node).await {
                        tracing::debug!(work, error = %e, "releasing a lease at shutdown failed; it expires by itself");
                    }
                    return;
                }
            }
        });
    }

    /// Claims or renews `work`; a store error counts as not held.
    async fn claim(&self, work: &str) -> bool {
        match self
            .store
            .claim_lease(work, &self.info.node, self.config.lease_ttl)
            .await
        {
            Ok(held) => held,
            Err(e) => {
                tracing::warn!(work, error = %e, "claiming a lease failed");
                false
            }
        }
    }
}
