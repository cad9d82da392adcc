//! `weft cluster status`: the nodes of a cluster and the work each does,
//! read from the store they share.

use anyhow::Context as _;
use weft_store::{ClusterView, LeaseRecord};

use crate::config::Config;

/// A node is shown as up while its last heartbeat is this recent.
const UP_WITHIN_MS: i64 = 10_000;

/// Prints the cluster sharing `config`'s store; answers whether every
/// node heard of is up.
pub async fn print(config: &Config) -> anyhow::Result<bool> {
    if config.store.backend != "postgres" {
        println!(
            "one node: the {} store belongs to one weft process (its /health says what it runs); \
             a cluster shares a PostgreSQL store (docs/scale-out.md)",
            config.store.backend
        );
        return Ok(true);
    }
    let store = crate::server::open_store(config).await?;
    let view = store
        .cluster_view()
        .await
        .context("reading the cluster's nodes and leases")?;
    print!("{}", render(&view));
    Ok(view
        .nodes
        .iter()
        .all(|n| view.now - n.last_seen <= UP_WITHIN_MS))
}

/// A node's leases, read: the pipeline's partitions (`pipeline` is
/// partition 0, `pipeline/<n>` the others) as one entry with their
/// numbers, `pipeline[0-3,8]`, the other work by name.
fn work_of<'a>(leases: impl Iterator<Item = &'a str>) -> Vec<String> {
    let pipeline = weft_pipeline::cluster::work::PIPELINE;
    let mut work = Vec::new();
    let mut partitions = Vec::new();
    for lease in leases {
        match lease.strip_prefix(pipeline) {
            Some("") => partitions.push(0),
            Some(n) => match n.strip_prefix('/').and_then(|n| n.parse::<u16>().ok()) {
                Some(n) => partitions.push(n),
                None => work.push(lease.to_string()),
            },
            None => work.push(lease.to_string()),
        }
    }
    if !partitions.is_empty() {
        partitions.sort_unstable();
        let mut ranges: Vec<String> = Vec::new();
        let mut start = partitions[0];
        let mut end = start;
        for &p in &partitions[1..] {
            if p == end + 1 {
                end = p;
                continue;
            }
            ranges.push(range(start, end));
            (start, end) = (p, p);
        }
        ranges.push(range(start, end));
        work.push(format!("{pipeline}[{}]", ranges.join(",")));
    }
    work.sort();
    work
}

fn range(start: u16, end: u16) -> String {
    if start == end {
        start.to_string()
    } else {
        format!("{start}-{end}")
    }
}

/// The cluster as a table of nodes, then the leases.
fn render(view: &ClusterView) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<34} {:<22} {:<8} {:<6} {:>9}  WORK",
        "NODE", "ADDRESS", "VERSION", "STATE", "SEEN"
    );
    for n in &view.nodes {
        let ago = view.now - n.last_seen;
        let state = if ago <= UP_WITHIN_MS { "up" } else { "silent" };
        let work = work_of(
            view.leases
                .iter()
                .filter(|l| l.holder == n.info.node && l.expires_at >= view.now)
                .map(|l| l.work.as_str()),
        );
        let _ = writeln!(
            out,
            "{:<34} {:<22} {:<8} {:<6} {:>8.1}s  {}",
            n.info.node,
            n.info.address,
            n.info.version,
            state,
            ago as f64 / 1000.0,
            if work.is_empty() {
                "-".to_string()
            } else {
                work.join(",")
            }
        );
    }
    let orphans: Vec<&LeaseRecord> = view
        .leases
        .iter()
        .filter(|l| l.expires_at < view.now)
        .collect();
    for l in orphans {
        let _ = writeln!(
            out,
            "lease {} of {} expired {:.1}s ago: the next node to claim it takes it over",
            l.work,
            l.holder,
            (view.now - l.expires_at) as f64 / 1000.0
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_store::{NodeInfo, NodeRecord};

    #[test]
    fn the_table_shows_each_node_its_state_and_its_live_leases() {
        let node = |id: &str, seen| NodeRecord {
            info: NodeInfo {
                node: id.into(),
                address: "127.0.0.1:8080".into(),
                version: "0.1.0".into(),
                started_at: 0,
            },
            last_seen: seen,
        };
        let view = ClusterView {
            now: 100_000,
            nodes: vec![node("a", 99_000), node("b", 50_000)],
            leases: vec![
                LeaseRecord {
                    work: "pipeline".into(),
                    holder: "a".into(),
                    expires_at: 104_000,
                    load: 0.0,
                },
                LeaseRecord {
                    work: "history".into(),
                    holder: "b".into(),
                    expires_at: 60_000,
                    load: 0.0,
                },
            ]
            .into_iter()
            .chain([1, 2, 3, 7].map(|p| LeaseRecord {
                work: format!("pipeline/{p}"),
                holder: "a".into(),
                expires_at: 104_000,
                load: 0.0,
            }))
            .chain([LeaseRecord {
                work: "expiry".into(),
                holder: "a".into(),
                expires_at: 104_000,
                load: 0.0,
            }])
            .collect(),
        };
        let text = render(&view);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[1].starts_with("a ")
                && lines[1].contains(" up ")
                && lines[1].ends_with("expiry,pipeline[0-3,7]"),
            "{text}"
        );
        assert!(
            lines[2].starts_with("b ") && lines[2].contains(" silent ") && lines[2].ends_with('-'),
            "{text}"
        );
        assert!(
            lines[3].contains("lease history of b expired 40.0s ago"),
            "{text}"
        );
    }
}
