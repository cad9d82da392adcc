//! The horizon of a log that several nodes append to at once: the highest
//! `seq` that, with every one below it, is committed or never will be.
//!
//! Readers of weft's logs (the pipeline on the ingest log, the history
//! mover on its feeds) read forward from a `seq`. Nodes append with no
//! lock between them, so `seq`s are handed out in order but can commit out
//! of order (node A's 9 after node B's 10), and a reader that moved past
//! 10 would never see 9. Readers read only up to the horizon, found so:
//!
//! 1. every transaction of the log's writers takes its transaction id
//!    first, before it takes any `seq` ([`Followed::opening`]);
//! 2. a look reads the log sequence's last value `L`, then, later, the
//!    transaction ids of the log's writers in flight, found by name in
//!    `pg_stat_activity` (the ingest log's connections are named,
//!    [`Followed::session`]; the notifications feed's transactions name
//!    themselves in their opening);
//! 3. a `seq` at or below `L` was taken by a transaction that had its id
//!    by then: once none of the writers seen is in flight any more (at
//!    once, when none was), every such transaction has ended, so `L` is
//!    the horizon.
//!
//! With no writer in flight, `L` is the horizon at once; under load it
//! trails the newest append by one look (a few milliseconds). Writers and
//! looks take the log's advisory lock shared: older versions of weft took
//! it exclusively to commit one transaction at a time, so their appends
//! are never in flight alongside these while a cluster is being upgraded.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::sync::{watch, Notify};
use tokio_postgres::SimpleQueryMessage;

use super::schema::db;
use crate::{Result, StoreError};

/// A log the horizon follows: the SQL its writers and looks run.
pub(super) struct Followed {
    /// Names the log in logs.
    pub name: &'static str,
    /// Opens every transaction of the log's writers before its first
    /// `seq`: the transaction's id (and the log's lock, shared, or the
    /// writer's name for this transaction).
    pub opening: &'static str,
    /// Names a writer's connection: for the ingest log, so a look finds
    /// the log's transactions in flight among every other.
    pub session: &'static str,
    /// One look, as one transaction: the sequence's last value (statement
    /// 2), then the writers in flight as `pid:xid` (statement 3).
    pub look: &'static str,
}

/// How often a log is looked at when nothing is waiting on a writer (this
/// node's own commits make it look at once).
const FOLLOW_INTERVAL: Duration = Duration::from_millis(20);

/// How soon it is looked at again while writers seen in flight may still be.
const SETTLE_INTERVAL: Duration = Duration::from_millis(2);

/// The horizon as the looks establish it.
#[derive(Debug, Default)]
pub(super) struct Horizon {
    /// The highest `seq` known final, with all below it.
    pub through: u64,
    /// A `seq` final once the writers then in flight have ended.
    waiting: Option<(u64, HashSet<String>)>,
}

impl Horizon {
    /// Takes one look: `last` the sequence's last value, then `writers`
    /// in flight. Answers whether the horizon moved.
    pub(super) fn look(&mut self, last: u64, writers: HashSet<String>) -> bool {
        let before = self.through;
        if let Some((through, seen)) = &self.waiting {
            if seen.is_disjoint(&writers) {
                self.through = self.through.max(*through);
                self.waiting = None;
            }
        }
        if writers.is_empty() {
            self.through = self.through.max(last);
            self.waiting = None;
        } else if self.waiting.is_none() && last > self.through {
            self.waiting = Some((last, writers));
        }
        self.through > before
    }

    /// Whether a look soon could move it.
    pub(super) fn waiting(&self) -> bool {
        self.waiting.is_some()
    }
}

/// One look at `log`: the sequence's last value and the writers in flight.
async fn look(client: &tokio_postgres::Client, log: &Followed) -> Result<(u64, HashSet<String>)> {
    let mut last = 0;
    let mut writers = HashSet::new();
    let mut statement = 0;
    for message in client.simple_query(log.look).await.map_err(db)? {
        match message {
            SimpleQueryMessage::CommandComplete(_) => statement += 1,
            SimpleQueryMessage::Row(row) => match statement {
                2 => {
                    last = row.get(0).and_then(|v| v.parse().ok()).ok_or_else(|| {
                        StoreError::Corrupt(format!("the {}'s sequence", log.name))
                    })?;
                }
                3 => {
                    if let Some(writer) = row.get(0) {
                        writers.insert(writer.to_string());
                    }
                }
                _ => {}
            },
            _ => {}
        }
    }
    Ok((last, writers))
}

/// The horizon when the store opens: looks until no writer seen is still
/// in flight (at once, unless other nodes are appending), for at most a
/// second, and answers what it then knows.
pub(super) async fn settle(client: &tokio_postgres::Client, log: &Followed) -> Result<Horizon> {
    let mut horizon = Horizon::default();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    loop {
        let (last, writers) = look(client, log).await?;
        horizon.look(last, writers);
        if !horizon.waiting() || tokio::time::Instant::now() >= deadline {
            return Ok(horizon);
        }
        tokio::time::sleep(SETTLE_INTERVAL).await;
    }
}

/// Moves `log`'s horizon (`through`) until the store is dropped: after each
/// of this node's commits to it (`committed`), every [`FOLLOW_INTERVAL`]
/// for other nodes' appends, and every [`SETTLE_INTERVAL`] while writers
/// seen in flight may still be.
pub(super) async fn follow(
    pool: Pool,
    log: &'static Followed,
    mut horizon: Horizon,
    through: Arc<watch::Sender<u64>>,
    committed: Arc<Notify>,
) {
    let mut failing = false;
    while !through.is_closed() {
        let wait = if horizon.waiting() {
            SETTLE_INTERVAL
        } else {
            FOLLOW_INTERVAL
        };
        tokio::select! {
            _ = committed.notified() => {}
            _ = tokio::time::sleep(wait) => {}
        }
        let looked = match pool.get().await {
            Ok(client) => look(&client, log).await,
            Err(e) => Err(StoreError::Database(e.to_string())),
        };
        match looked {
            Ok((last, writers)) => {
                failing = false;
                if horizon.look(last, writers) {
                    through.send_replace(horizon.through);
                }
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(log = log.name, error = %e, "looking at a log's horizon failed; retrying");
                }
                failing = true;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}
