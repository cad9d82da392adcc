//! Which partitions of split work a node holds: shared by load once there
//! is load to share, by count otherwise.
//!
//! Each holder measures the work a second on each partition it holds and
//! records it with the partition's lease each time it renews it
//! ([`weft_store::LeaseRecord::load`]), so every node sees every held
//! partition's load in the cluster's view. A node then decides alone,
//! once a renewal round ([`plan`]):
//!
//! - **Idle cluster** (less than [`MIN_LOAD`] in all): by count, as
//!   before loads were measured: each node holds its share, the count
//!   divided by the nodes alive, rounded up.
//! - **Giving up**: a node more than [`TOLERANCE`] above the fair load
//!   (the cluster's load divided by the nodes alive), whose partitions
//!   have not changed for [`STEADY_ROUNDS`], gives up one partition: the
//!   heaviest with which the least loaded other node, taking it, still
//!   ends [`MARGIN`] below where the giver was. A node holding one
//!   partition keeps it.
//! - **Taking**: a node at or below the fair load takes free partitions up
//!   to its share by count; beyond that, only the least loaded node takes
//!   one a round.
//!
//! Every move takes load from a node to one that ends less loaded than
//! the giver was, so the sum of the squares of the nodes' loads falls with
//! each: partitions do not go back and forth. A partition with one very
//! busy device stays where it is and its node holds fewer of the others.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Below this much work a second across every partition, loads say too
/// little to share by: partitions are shared by count.
pub const MIN_LOAD: f64 = 20.0;

/// How far above the fair load (as a share of it) a node may be before it
/// gives a partition up. Loads measured while a partition's backlog is
/// worked off, or a moment apart, differ by tens of percent, and a
/// partition moved costs its consumer a stop and a start (and its new
/// holder the backlog): only a clear imbalance is worth a move.
pub const TOLERANCE: f64 = 0.5;

/// How much less loaded than the giver (as a share of the giver's load)
/// the least loaded other node must end, having taken the partition, for
/// a move to be worth it.
pub const MARGIN: f64 = 0.2;

/// Renewal rounds a node's partitions must stay the same before it gives
/// one up: its measures then cover what it holds now, past the backlog a
/// partition it just took comes with (30 s at the default lease time).
pub const STEADY_ROUNDS: u32 = 15;

/// Work done on each partition on this node, counted by the work as it
/// goes (the pipeline: uplinks read) and read as a rate by the node's
/// lease renewals ([`Meter`]).
pub struct WorkCounts {
    counts: Vec<AtomicU64>,
}

impl WorkCounts {
    /// Counters for `partitions` partitions, at zero.
    pub fn new(partitions: u16) -> Arc<WorkCounts> {
        Arc::new(WorkCounts {
            counts: (0..partitions.max(1)).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    /// Counts `n` more done on `partition` (past the last partition: not
    /// counted).
    pub fn add(&self, partition: u16, n: u64) {
        if let Some(c) = self.counts.get(usize::from(partition)) {
            c.fetch_add(n, Ordering::Relaxed);
        }
    }

    fn get(&self, partition: u16) -> u64 {
        self.counts
            .get(usize::from(partition))
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }
}

/// The rate of work on each partition a node holds, from its
/// [`WorkCounts`], smoothed over the renewal rounds (each round's rate
/// weighs a quarter).
#[derive(Default)]
pub struct Meter {
    /// Partition → (count and time at the last reading, rate so far;
    /// `None` until a whole round was measured).
    partitions: BTreeMap<u16, (u64, Instant, Option<f64>)>,
}

impl Meter {
    /// Reads `counts` for the partitions `held` (forgetting the others)
    /// and answers each one's load: work a second, 0 until measured over
    /// a round.
    pub fn read(
        &mut self,
        counts: &WorkCounts,
        held: impl Iterator<Item = u16>,
    ) -> BTreeMap<u16, f64> {
        let now = Instant::now();
        let mut kept = BTreeMap::new();
        let mut loads = BTreeMap::new();
        for p in held {
            let count = counts.get(p);
            let entry = match self.partitions.remove(&p) {
                Some((last, at, rate)) => {
                    let secs = now.duration_since(at).as_secs_f64();
                    if secs <= 0.0 {
                        (last, at, rate)
                    } else {
                        let now_rate = count.saturating_sub(last) as f64 / secs;
                        let rate = rate.map_or(now_rate, |r| 0.75 * r + 0.25 * now_rate);
                        (count, now, Some(rate))
                    }
                }
                None => (count, now, None),
            };
            loads.insert(p, entry.2.unwrap_or(0.0));
            kept.insert(p, entry);
        }
        self.partitions = kept;
        loads
    }
}

/// What a node sees of the cluster when it decides.
pub struct View<'a> {
    /// This node.
    pub me: &'a str,
    /// The other nodes alive.
    pub others: &'a BTreeSet<String>,
    /// How many partitions the work is split into.
    pub count: u16,
    /// The partitions other nodes alive hold now (unexpired leases): its
    /// holder and its load.
    pub held_by_others: &'a BTreeMap<u16, (String, f64)>,
    /// The partitions this node holds, with the load it measured on each.
    pub mine: &'a BTreeMap<u16, f64>,
    /// Whether this node's partitions have stayed the same for
    /// [`STEADY_ROUNDS`]: only then may it give one up.
    pub steady: bool,
}

/// What a node does with its partitions this round.
#[derive(Debug, Default, PartialEq)]
pub struct Moves {
    /// Partitions to give up.
    pub give_up: Vec<u16>,
    /// Free partitions to try to take (lowest first).
    pub take: Vec<u16>,
}

/// This round's moves for the node `view` is of (see the module's doc).
pub fn plan(view: &View<'_>) -> Moves {
    let alive = 1 + view.others.len();
    let share = usize::from(view.count).div_ceil(alive);
    let free: Vec<u16> = (0..view.count)
        .filter(|p| !view.mine.contains_key(p) && !view.held_by_others.contains_key(p))
        .collect();
    let mine_count = view.mine.len();
    let my_load: f64 = view.mine.values().sum();
    let mut loads: BTreeMap<&str, f64> = view.others.iter().map(|n| (n.as_str(), 0.0)).collect();
    for (holder, load) in view.held_by_others.values() {
        if let Some(l) = loads.get_mut(holder.as_str()) {
            *l += load;
        }
    }
    let total = my_load + loads.values().sum::<f64>();
    if total < MIN_LOAD {
        return Moves {
            give_up: view
                .mine
                .keys()
                .rev()
                .take(mine_count.saturating_sub(share))
                .copied()
                .collect(),
            take: free
                .into_iter()
                .take(share.saturating_sub(mine_count))
                .collect(),
        };
    }
    let fair = total / alive as f64;
    let least_other = loads.values().copied().fold(f64::INFINITY, f64::min);
    if view.steady
        && my_load > fair * (1.0 + TOLERANCE)
        && mine_count > 1
        && least_other.is_finite()
    {
        let give = view
            .mine
            .iter()
            .filter(|(_, &load)| load > 0.0 && least_other + load < my_load * (1.0 - MARGIN))
            .max_by(|a, b| a.1.total_cmp(b.1).then(a.0.cmp(b.0)));
        return Moves {
            give_up: give.map(|(&p, _)| p).into_iter().collect(),
            take: Vec::new(),
        };
    }
    if my_load > fair {
        return Moves::default();
    }
    let least = loads
        .iter()
        .all(|(&node, &load)| (my_load, view.me) <= (load, node));
    let wanted = if mine_count < share {
        share - mine_count
    } else {
        usize::from(least)
    };
    Moves {
        give_up: Vec::new(),
        take: free.into_iter().take(wanted).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nodes deciding in turns, each round, until no node moves: who
    /// holds each partition at the end, and how many rounds it took.
    /// `load` is each partition's work a second, whoever holds it.
    fn settle(
        nodes: &[&str],
        load: &[f64],
        start: &BTreeMap<u16, &str>,
    ) -> (BTreeMap<u16, String>, usize) {
        let mut holder: BTreeMap<u16, String> =
            start.iter().map(|(&p, &n)| (p, n.to_string())).collect();
        for round in 1..=200 {
            let mut moved = false;
            for &me in nodes {
                let others: BTreeSet<String> = nodes
                    .iter()
                    .filter(|&&n| n != me)
                    .map(|n| n.to_string())
                    .collect();
                let mine: BTreeMap<u16, f64> = holder
                    .iter()
                    .filter(|(_, h)| *h == me)
                    .map(|(&p, _)| (p, load[usize::from(p)]))
                    .collect();
                let held_by_others: BTreeMap<u16, (String, f64)> = holder
                    .iter()
                    .filter(|(_, h)| *h != me)
                    .map(|(&p, h)| (p, (h.clone(), load[usize::from(p)])))
                    .collect();
                let moves = plan(&View {
                    me,
                    others: &others,
                    count: load.len() as u16,
                    held_by_others: &held_by_others,
                    mine: &mine,
                    steady: true,
                });
                for p in moves.give_up {
                    assert_eq!(
                        holder.remove(&p).as_deref(),
                        Some(me),
                        "gave up what it held"
                    );
                    moved = true;
                }
                for p in moves.take {
                    assert!(!holder.contains_key(&p), "took a held partition");
                    holder.insert(p, me.to_string());
                    moved = true;
                }
            }
            if !moved {
                return (holder, round);
            }
        }
        panic!("partitions still moving after 200 rounds: {holder:?}");
    }

    fn load_of(holder: &BTreeMap<u16, String>, load: &[f64], node: &str) -> f64 {
        holder
            .iter()
            .filter(|(_, h)| *h == node)
            .map(|(&p, _)| load[usize::from(p)])
            .sum()
    }

    /// Idle, partitions go by count, every one held, as before loads.
    #[test]
    fn an_idle_cluster_shares_by_count() {
        let (holder, _) = settle(&["a", "b", "c"], &[0.0; 16], &BTreeMap::new());
        assert_eq!(holder.len(), 16, "every partition held");
        for n in ["a", "b", "c"] {
            let held = holder.values().filter(|h| *h == n).count();
            assert!((4..=6).contains(&held), "{n} holds {held}");
        }
    }

    /// One partition with a very busy device: its node keeps it and
    /// holds fewer of the others, and the loads end within the tolerance
    /// of fair (or the busy partition's node holds it alone).
    #[test]
    fn a_busy_partition_leaves_its_node_fewer_others() {
        let mut load = vec![100.0; 16];
        load[3] = 2_000.0;
        // Shared by count first (as an idle cluster left them).
        let start: BTreeMap<u16, &str> = (0..16u16)
            .map(|p| (p, ["a", "b"][usize::from(p) / 8]))
            .collect();
        let (holder, rounds) = settle(&["a", "b"], &load, &start);
        assert_eq!(holder.len(), 16, "every partition held");
        assert_eq!(holder[&3], "a", "the busy partition stayed");
        let (a, b) = (load_of(&holder, &load, "a"), load_of(&holder, &load, "b"));
        let fair = (a + b) / 2.0;
        assert!(
            a <= fair * (1.0 + TOLERANCE) && b <= fair * (1.0 + TOLERANCE),
            "a {a}, b {b}"
        );
        assert!(
            holder.values().filter(|h| *h == "a").count() < 8,
            "a holds fewer than its count share"
        );
        assert!(rounds < 20, "{rounds} rounds");
    }

    /// A node that joins a busy cluster gets partitions; a node alone
    /// with them all keeps them (it is the fair share).
    #[test]
    fn a_joining_node_takes_load_and_a_lone_node_keeps_all() {
        let load: Vec<f64> = (0..16).map(|p| 10.0 + 7.0 * f64::from(p)).collect();
        let all_a: BTreeMap<u16, &str> = (0..16).map(|p| (p, "a")).collect();
        let (alone, _) = settle(&["a"], &load, &all_a);
        assert_eq!(alone.len(), 16);
        assert!(alone.values().all(|h| h == "a"));
        let (holder, _) = settle(&["a", "b", "c"], &load, &all_a);
        assert_eq!(holder.len(), 16, "every partition held");
        let total: f64 = load.iter().sum();
        for n in ["a", "b", "c"] {
            let l = load_of(&holder, &load, n);
            assert!(l <= total / 3.0 * (1.0 + TOLERANCE), "{n}: {l} of {total}");
            assert!(l > 0.0, "{n} got nothing");
        }
    }

    /// Equally busy partitions stay as shared by count (16 on three nodes:
    /// 6, 6 and 4, within the tolerance), however each round's measures
    /// wander.
    #[test]
    fn equal_partitions_stay_put_while_measures_wander() {
        let count_shares: BTreeMap<u16, &str> = (0..16u16)
            .map(|p| (p, ["a", "b", "c"][usize::from(p) / 6]))
            .collect();
        let noisy: Vec<f64> = (0..16).map(|p| 100.0 + f64::from(p % 5) * 8.0).collect();
        let (holder, rounds) = settle(&["a", "b", "c"], &noisy, &count_shares);
        let start: BTreeMap<u16, String> = count_shares
            .iter()
            .map(|(&p, h)| (p, h.to_string()))
            .collect();
        assert_eq!(holder, start, "a partition moved");
        assert_eq!(rounds, 1);
    }

    /// A dead node's partitions (free) are taken at once by a node below
    /// its share.
    #[test]
    fn a_dead_nodes_partitions_are_taken() {
        let load = vec![50.0; 8];
        let start: BTreeMap<u16, &str> = (0..4).map(|p| (p, "a")).collect();
        let (holder, rounds) = settle(&["a"], &load, &start);
        assert_eq!(holder.len(), 8);
        assert_eq!(rounds, 2, "taken in one round");
    }
}
