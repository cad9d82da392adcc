//! Two nodes in process sharing one store's leases (SQLite keeps them in
//! memory, with the same rules as PostgreSQL's rows): partitioned work
//! shared out and handed over, leased work run on one node at a time.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use weft_store::Store;

use super::{Cluster, ClusterConfig};
use crate::testkit::{eventually, open_store};

/// How long a lease lasts: above the heartbeat's 2 s, so a live node is
/// never taken for a dead one between two heartbeats.
const TTL: Duration = Duration::from_secs(3);

/// What ran where: which node works on each partition (or the leased
/// work) right now, and every time two nodes did at once.
#[derive(Default)]
struct Ledger {
    working: BTreeMap<u16, String>,
    overlaps: Vec<String>,
}

impl Ledger {
    fn start(&mut self, node: &str, parts: &[u16]) {
        for p in parts {
            if let Some(other) = self.working.insert(*p, node.to_string()) {
                self.overlaps
                    .push(format!("{node} started {p} while {other} had it"));
            }
        }
    }

    fn end(&mut self, node: &str, parts: &[u16]) {
        for p in parts {
            if self.working.get(p).is_some_and(|n| n == node) {
                self.working.remove(p);
            }
        }
    }
}

/// One node: its cluster membership and the tasks it runs.
struct Member {
    cluster: Arc<Cluster>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
}

impl Member {
    fn join(store: &Arc<dyn Store>, node: &str) -> Member {
        let cluster = Cluster::new(
            store.clone(),
            node.to_string(),
            ClusterConfig {
                node: Some(node.to_string()),
                lease_ttl: TTL,
                address: String::new(),
            },
        );
        let shutdown = CancellationToken::new();
        let tracker = TaskTracker::new();
        tracker.spawn(cluster.clone().heartbeat_loop(shutdown.clone()));
        Member {
            cluster,
            shutdown,
            tracker,
        }
    }

    /// Works on its share of `count` partitions of "work", noting in
    /// `ledger` what it works on while it does.
    fn run_partitioned(&self, count: u16, ledger: &Arc<Mutex<Ledger>>) {
        self.run_partitioned_busy(count, ledger, |_| 0);
    }

    /// [`Member::run_partitioned`], doing `busy(p)` units of work on each
    /// partition `p` it holds every 100 ms (counted as the pipeline counts
    /// uplinks).
    fn run_partitioned_busy(&self, count: u16, ledger: &Arc<Mutex<Ledger>>, busy: fn(u16) -> u64) {
        let node = self.cluster.node().to_string();
        let ledger = ledger.clone();
        let counts = crate::balance::WorkCounts::new(count);
        self.cluster.run_partitioned(
            "work",
            count,
            counts.clone(),
            self.shutdown.clone(),
            &self.tracker,
            move |held, stop| {
                let node = node.clone();
                let ledger = ledger.clone();
                let counts = counts.clone();
                async move {
                    ledger.lock().start(&node, &held);
                    loop {
                        for &p in held.iter() {
                            counts.add(p, busy(p));
                        }
                        tokio::select! {
                            _ = stop.cancelled() => break,
                            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                        }
                    }
                    ledger.lock().end(&node, &held);
                }
            },
        );
    }

    /// Runs the leased work "singleton", noted as partition 0 of `ledger`.
    fn run_leased(&self, ledger: &Arc<Mutex<Ledger>>) {
        let node = self.cluster.node().to_string();
        let ledger = ledger.clone();
        self.cluster.run_leased(
            "singleton",
            self.shutdown.clone(),
            &self.tracker,
            move |stop| {
                let node = node.clone();
                let ledger = ledger.clone();
                async move {
                    ledger.lock().start(&node, &[0]);
                    stop.cancelled().await;
                    ledger.lock().end(&node, &[0]);
                }
            },
        );
    }

    fn partitions(&self) -> Vec<u16> {
        self.cluster.partitions("work")
    }

    /// Leaves the cluster as a node shutting down does.
    async fn leave(self) {
        self.shutdown.cancel();
        self.tracker.close();
        tokio::time::timeout(crate::testkit::DEADLINE, self.tracker.wait())
            .await
            .expect("the node stops");
    }
}

/// A node alone takes every partition; a second node joining gets half
/// of them from it (the two sets apart, together all), and when a node
/// leaves, the other takes its partitions over. No partition is ever
/// worked on by both at once.
#[tokio::test]
async fn nodes_share_the_partitions_and_hand_them_over_when_leaving() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path());
    let ledger: Arc<Mutex<Ledger>> = Arc::default();
    let all: Vec<u16> = (0..4).collect();

    let a = Member::join(&store, "node-a");
    a.run_partitioned(4, &ledger);
    eventually("node-a holding every partition", || async {
        (a.partitions() == all).then_some(())
    })
    .await;
    assert_eq!(a.cluster.held(), ["work"]);

    let b = Member::join(&store, "node-b");
    b.run_partitioned(4, &ledger);
    eventually("the partitions shared out", || async {
        (a.partitions().len() == 2 && b.partitions().len() == 2).then_some(())
    })
    .await;
    let (pa, pb) = (a.partitions(), b.partitions());
    let mut union: Vec<u16> = pa.iter().chain(&pb).copied().collect();
    union.sort();
    assert_eq!(union, all, "{pa:?} and {pb:?}");
    eventually("each node working on what it holds", || async {
        let working = ledger.lock().working.clone();
        let of = |n: &str| -> BTreeSet<u16> {
            working
                .iter()
                .filter(|(_, w)| *w == n)
                .map(|(p, _)| *p)
                .collect()
        };
        (of("node-a") == a.partitions().into_iter().collect()
            && of("node-b") == b.partitions().into_iter().collect())
        .then_some(())
    })
    .await;

    a.leave().await;
    eventually("node-b holding every partition", || async {
        (b.partitions() == all).then_some(())
    })
    .await;
    eventually("node-b working on all of them", || async {
        let working = ledger.lock().working.clone();
        (working.len() == 4 && working.values().all(|n| n == "node-b")).then_some(())
    })
    .await;
    b.leave().await;
    let ledger = ledger.lock();
    assert!(ledger.overlaps.is_empty(), "{:?}", ledger.overlaps);
    assert!(ledger.working.is_empty(), "every run stopped");
}

/// Leased work runs on one node only; when that node leaves, the other
/// takes it over.
#[tokio::test]
async fn leased_work_runs_on_one_node_and_moves_when_it_leaves() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path());
    let ledger: Arc<Mutex<Ledger>> = Arc::default();

    let a = Member::join(&store, "node-a");
    a.run_leased(&ledger);
    eventually("node-a running the work", || async {
        (ledger.lock().working.get(&0).map(String::as_str) == Some("node-a")).then_some(())
    })
    .await;
    let b = Member::join(&store, "node-b");
    b.run_leased(&ledger);
    assert_eq!(a.cluster.held(), ["singleton"]);
    assert!(b.cluster.held().is_empty());

    a.leave().await;
    eventually("node-b running the work", || async {
        (ledger.lock().working.get(&0).map(String::as_str) == Some("node-b")).then_some(())
    })
    .await;
    assert_eq!(b.cluster.held(), ["singleton"]);
    b.leave().await;
    let ledger = ledger.lock();
    assert!(ledger.overlaps.is_empty(), "{:?}", ledger.overlaps);
}

/// A partition whose holder died (its lease is no longer renewed and it
/// sends no heartbeat) is taken over once the lease has expired, not
/// before.
#[tokio::test]
async fn a_dead_nodes_partition_is_taken_once_its_lease_expires() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path());
    let ledger: Arc<Mutex<Ledger>> = Arc::default();
    // A node that claimed partition 0 and died at once.
    let ttl = Duration::from_secs(2);
    let claimed_at = weft_model::now_ms();
    assert!(store.claim_lease("work", "ghost", ttl, 0.0).await.unwrap());
    let expired_at = claimed_at + ttl.as_millis() as i64;

    let a = Member::join(&store, "node-a");
    let started: Arc<Mutex<Option<i64>>> = Arc::default();
    {
        let started = started.clone();
        let ledger = ledger.clone();
        a.cluster.run_partitioned(
            "work",
            4,
            crate::balance::WorkCounts::new(4),
            a.shutdown.clone(),
            &a.tracker,
            move |held, stop| {
                let started = started.clone();
                let ledger = ledger.clone();
                async move {
                    if held.contains(&0) {
                        started.lock().get_or_insert(weft_model::now_ms());
                    }
                    ledger.lock().start("node-a", &held);
                    stop.cancelled().await;
                    ledger.lock().end("node-a", &held);
                }
            },
        );
    }
    eventually("node-a holding every partition", || async {
        (a.partitions() == [0, 1, 2, 3]).then_some(())
    })
    .await;
    let took = started.lock().expect("partition 0 was worked on");
    assert!(
        took > expired_at,
        "partition 0 taken at {took}, before the dead holder's lease ended at {expired_at}"
    );
    a.leave().await;
    assert!(ledger.lock().overlaps.is_empty());
}

/// Partitions go by load once there is load: the node holding a partition
/// far busier than the rest together gives its other partitions up to the
/// other node and keeps the busy one; never two nodes on one partition.
#[tokio::test]
async fn a_busy_partitions_node_gives_the_others_up() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path());
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    // 2,000 a second on partition 0, 50 on each of the others.
    let busy = |p: u16| if p == 0 { 200 } else { 5 };
    let a = Member::join(&store, "node-a");
    let b = Member::join(&store, "node-b");
    a.run_partitioned_busy(4, &ledger, busy);
    b.run_partitioned_busy(4, &ledger, busy);
    let (busy_node, other) = eventually("the busy partition's node holding it alone", || async {
        let (pa, pb) = (a.partitions(), b.partitions());
        match (pa.as_slice(), pb.as_slice()) {
            ([0], [1, 2, 3]) => Some(("node-a", "node-b")),
            ([1, 2, 3], [0]) => Some(("node-b", "node-a")),
            _ => None,
        }
    })
    .await;
    assert_ne!(busy_node, other);
    assert!(
        ledger.lock().overlaps.is_empty(),
        "{:?}",
        ledger.lock().overlaps
    );
    a.leave().await;
    b.leave().await;
}
