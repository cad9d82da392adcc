//! This node in a cluster: its heartbeat, and the work it does only while
//! it holds that work's lease.
//!
//! Work that must be done once across the cluster — history's moves and
//! retention, the expiry of transient entities, the channel bridges — runs
//! through
//! [`Cluster::run_leased`]: the node claims the work's lease in the store
//! and runs the work while it keeps renewing it; another node, claiming
//! the same lease all along, takes over once it expires (a dead node) or
//! is released (a node shutting down). On one node with SQLite the lease is
//! always granted at once, so nothing changes there.
//!
//! The pipeline (the ingest consumer with the rule engine it feeds) is
//! split by device into partitions, a lease each, shared out among the
//! nodes ([`Cluster::run_partitioned`]), so decoding and rules grow with
//! the nodes.
//!
//! Why leases in the store rather than JetStream consumers: the work reads
//! and writes PostgreSQL anyway (the ingest log, the units, the cursors),
//! so a lease row there adds no new way of failing, the database's clock
//! judges expiry for every node alike, and a node that cannot reach the
//! database could not do the work anyway.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use weft_store::{NodeInfo, Store};

use crate::balance::{self, Meter, WorkCounts};

/// The leases: each names one piece of work done once across the cluster.
pub mod work {
    /// The ingest consumer (decode, store, entities) and the rule engine,
    /// split into partitions by device ([`Cluster::run_partitioned`]).
    ///
    /// [`Cluster::run_partitioned`]: super::Cluster::run_partitioned
    pub const PIPELINE: &str = "pipeline";
    /// History: moving the notifications feed into the history, and
    /// retention.
    pub const HISTORY: &str = "history";
    /// History: moving the entity changes feed into the history, split
    /// into partitions by entity ([`weft_store::history_partition`]).
    pub const HISTORY_CHANGES: &str = "history-changes";
    /// Deleting transient entities once they expire.
    pub const EXPIRY: &str = "expiry";
    /// The channel bridges (weft's events published into channels).
    pub const BRIDGES: &str = "bridges";
    /// Serving the notifications a dead node owed from its change log.
    pub const OUTBOX: &str = "outbox";
    /// The notifications of periodic NGSI-LD subscriptions.
    pub const PERIODIC: &str = "periodic-notifications";
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

/// `d` in milliseconds, as the store's clock counts.
fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
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
    /// The partitions of partitioned work this node holds now, by work.
    partitions: parking_lot::Mutex<BTreeMap<&'static str, Vec<u16>>>,
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
            partitions: parking_lot::Mutex::new(BTreeMap::new()),
        })
    }

    /// This node's id.
    pub fn node(&self) -> &str {
        &self.info.node
    }

    /// The other nodes heard from within a lease's time: a node missing
    /// from the answer is dead (or gone), and its work is free.
    pub async fn others_alive(&self) -> Result<HashSet<String>, weft_store::StoreError> {
        let view = self.store.cluster_view().await?;
        Ok(view
            .nodes
            .into_iter()
            .filter(|n| {
                n.info.node != self.info.node && view.now - n.last_seen <= ms(self.config.lease_ttl)
            })
            .map(|n| n.info.node)
            .collect())
    }

    /// How long a claimed lease lasts unless renewed.
    pub fn lease_ttl(&self) -> Duration {
        self.config.lease_ttl
    }

    /// The work this node does right now (the leases it holds): a piece
    /// of partitioned work is listed when the node holds any of its
    /// partitions ([`Cluster::partitions`] says which).
    pub fn held(&self) -> Vec<&'static str> {
        let mut held = self.held.lock().clone();
        held.extend(
            self.partitions
                .lock()
                .iter()
                .filter(|(_, p)| !p.is_empty())
                .map(|(w, _)| *w),
        );
        held.into_iter().collect()
    }

    /// The partitions of `work` this node holds now (see
    /// [`Cluster::run_partitioned`]).
    pub fn partitions(&self, work: &str) -> Vec<u16> {
        self.partitions
            .lock()
            .get(work)
            .cloned()
            .unwrap_or_default()
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
                if !cluster.claim(work, 0.0).await {
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
                            if cluster.claim(work, 0.0).await {
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

    /// Runs `run` on `tracker` with the partitions of `work` this node
    /// holds, until `shutdown`. The work is split into `count` partitions,
    /// each a lease of its own (`work` for partition 0, `work/<n>` for the
    /// others); every node takes its share, by the load each partition's
    /// holder measures (`counts`, recorded with each lease's renewal) once
    /// there is load, by count when idle (`count` divided by the nodes
    /// alive, rounded up, so two idle nodes hold 8 of 16 each); see
    /// [`crate::balance`]. A node above its share (another node joined,
    /// or its partitions got busier) gives partitions up; a node below it
    /// takes free or expired ones (a node left or died). Each
    /// time the partitions held change, `run` is stopped (its token is
    /// cancelled; it must return soon after, having committed what it
    /// did) and started again with the new set, and only then are given-up
    /// partitions released, so no partition is ever worked on by two
    /// nodes. On one node every partition is its own.
    pub fn run_partitioned<F, Fut>(
        self: &Arc<Self>,
        work: &'static str,
        count: u16,
        counts: Arc<WorkCounts>,
        shutdown: CancellationToken,
        tracker: &TaskTracker,
        run: F,
    ) where
        F: Fn(Arc<[u16]>, CancellationToken) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let cluster = self.clone();
        let count = count.max(1);
        tracker.spawn(async move {
            let renew = cluster.config.lease_ttl / 3;
            let lease = |p: u16| weft_store::partition_cursor(work, p);
            // Partition → when it was last renewed.
            let mut held: BTreeMap<u16, Instant> = BTreeMap::new();
            let mut meter = Meter::default();
            // Rounds the held partitions have stayed the same.
            let mut steady_rounds = 0;
            let mut running: Option<(CancellationToken, tokio::task::JoinHandle<()>)> = None;
            let mut release: Vec<u16> = Vec::new();
            loop {
                // Renew what is held; drop what could not be renewed in
                // time (another node may take it once it expires).
                let mut changed = false;
                let loads = meter.read(&counts, held.keys().copied());
                for (p, renewed) in held.iter_mut() {
                    if cluster.claim(&lease(*p), loads[p]).await {
                        *renewed = Instant::now();
                    }
                }
                let before = held.len();
                held.retain(|p, renewed| {
                    let kept = renewed.elapsed() < renew * 2;
                    if !kept {
                        tracing::warn!(work, partition = p, "lost a partition's lease (or could not renew it); stopping it here");
                    }
                    kept
                });
                changed |= held.len() != before;
                if !shutdown.is_cancelled() {
                    if let Ok(view) = cluster.store.cluster_view().await {
                        // The other nodes heard from within a lease's time
                        // (a dead node's partitions are free by then).
                        let others: BTreeSet<String> = view
                            .nodes
                            .iter()
                            .filter(|n| {
                                n.info.node != cluster.info.node
                                    && view.now - n.last_seen <= ms(cluster.config.lease_ttl)
                            })
                            .map(|n| n.info.node.clone())
                            .collect();
                        let partition_of: BTreeMap<String, u16> =
                            (0..count).map(|p| (lease(p), p)).collect();
                        let held_by_others: BTreeMap<u16, (String, f64)> = view
                            .leases
                            .iter()
                            .filter(|l| l.holder != cluster.info.node && l.expires_at >= view.now)
                            .filter_map(|l| {
                                let p = *partition_of.get(&l.work)?;
                                Some((p, (l.holder.clone(), l.load)))
                            })
                            .collect();
                        let mine: BTreeMap<u16, f64> =
                            held.keys().map(|p| (*p, loads.get(p).copied().unwrap_or(0.0))).collect();
                        let moves = balance::plan(&balance::View {
                            me: &cluster.info.node,
                            others: &others,
                            count,
                            held_by_others: &held_by_others,
                            mine: &mine,
                            steady: steady_rounds >= balance::STEADY_ROUNDS,
                        });
                        for p in moves.give_up {
                            held.remove(&p);
                            release.push(p);
                            changed = true;
                        }
                        for p in moves.take {
                            if !release.contains(&p) && cluster.claim(&lease(p), 0.0).await {
                                held.insert(p, Instant::now());
                                changed = true;
                            }
                        }
                    }
                }
                steady_rounds = if changed { 0 } else { steady_rounds.saturating_add(1) };
                let finished = running.as_ref().is_some_and(|(_, task)| task.is_finished());
                if changed || finished || shutdown.is_cancelled() {
                    if let Some((stop, task)) = running.take() {
                        stop.cancel();
                        let _ = task.await;
                    }
                    for p in release.drain(..) {
                        if let Err(e) = cluster.store.release_lease(&lease(p), &cluster.info.node).await {
                            tracing::debug!(work, partition = p, error = %e, "releasing a partition failed; it expires by itself");
                        }
                    }
                    if shutdown.is_cancelled() {
                        for p in std::mem::take(&mut held).into_keys() {
                            let _ = cluster.store.release_lease(&lease(p), &cluster.info.node).await;
                        }
                    }
                    let set: Vec<u16> = held.keys().copied().collect();
                    for p in 0..count {
                        let on = set.contains(&p);
                        metrics::gauge!("weft_cluster_lease_held", "work" => lease(p)).set(if on { 1.0 } else { 0.0 });
                    }
                    cluster.partitions.lock().insert(work, set.clone());
                    if shutdown.is_cancelled() {
                        return;
                    }
                    if !set.is_empty() {
                        tracing::info!(work, partitions = ?set, node = %cluster.info.node, "this node works on these partitions now");
                        let stop = shutdown.child_token();
                        let task = tokio::spawn(run(set.into(), stop.clone()));
                        running = Some((stop, task));
                    }
                }
                tokio::select! {
                    _ = shutdown.cancelled() => {}
                    _ = tokio::time::sleep(renew) => {}
                }
            }
        });
    }

    /// Claims or renews `work`, with the `load` measured on it; a store
    /// error counts as not held.
    async fn claim(&self, work: &str, load: f64) -> bool {
        match self
            .store
            .claim_lease(work, &self.info.node, self.config.lease_ttl, load)
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

#[cfg(test)]
#[path = "cluster_tests.rs"]
mod tests;
