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
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
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
    /// One look, as one transaction: the last value of each of the log's
    /// sequences, as one row (statement 2), then the writers in flight as
    /// `pid:xid` (statement 3).
    pub look: &'static str,
    /// Looked at only while a reader waits ([`Tracked::caught_up`]), not
    /// on an interval: for a log nobody follows closely, so its looks cost
    /// the database nothing while nobody reads it.
    pub on_demand: bool,
}

/// A [`Followed`] log from what tells it apart, so every log's SQL has
/// one shape: `name`, the `writer` its writers' connections are named
/// (in `pg_stat_activity`), the advisory `lock` its writers and looks
/// take shared (`none` for a log no older version locked), the `tables`
/// whose `seq` sequences it follows (in the order of the horizon's
/// `seq`s), and whether it is looked at `on_demand`.
macro_rules! followed {
    (name: $name:literal, writer: $writer:literal, lock: none,
     tables: [$($table:literal),+], on_demand: $on_demand:expr) => {
        $crate::postgres::horizon::followed!(@build $name, $writer,
            "SELECT pg_current_xact_id()", "SELECT 1", [$($table),+], $on_demand)
    };
    (name: $name:literal, writer: $writer:literal, lock: $lock:literal,
     tables: [$($table:literal),+], on_demand: $on_demand:expr) => {
        $crate::postgres::horizon::followed!(@build $name, $writer,
            concat!("SELECT pg_advisory_xact_lock_shared(", $lock, "), pg_current_xact_id()"),
            concat!("SELECT pg_advisory_xact_lock_shared(", $lock, ")"),
            [$($table),+], $on_demand)
    };
    // The one shape: `opening` starts a writer's transaction, `guard` is
    // the look's first statement.
    (@build $name:literal, $writer:literal, $opening:expr, $guard:expr,
     [$first:literal $(, $rest:literal)*], $on_demand:expr) => {
        $crate::postgres::horizon::Followed {
            name: $name,
            opening: $opening,
            session: concat!("SET application_name = '", $writer, "'"),
            look: concat!(
                "BEGIN; ", $guard, "; SELECT ",
                "COALESCE(pg_sequence_last_value(pg_get_serial_sequence('", $first, "', 'seq')), 0)::TEXT",
                $(", COALESCE(pg_sequence_last_value(pg_get_serial_sequence('", $rest, "', 'seq')), 0)::TEXT",)*
                "; SELECT pid::TEXT || ':' || backend_xid::TEXT FROM pg_stat_activity \
                 WHERE datname = current_database() AND application_name = '", $writer, "' \
                 AND backend_xid IS NOT NULL; COMMIT"
            ),
            on_demand: $on_demand,
        }
    };
}
pub(super) use followed;

/// How often a log is looked at when nothing is waiting on a writer (this
/// node's own commits make it look at once).
const FOLLOW_INTERVAL: Duration = Duration::from_millis(20);

/// How soon it is looked at again while writers seen in flight may still be.
const SETTLE_INTERVAL: Duration = Duration::from_millis(2);

/// Longest [`Tracked::caught_up`] waits for writers in flight to end (a
/// writer stuck longer holds the horizon back; the read then stops below
/// its entries, which a later read finds).
const CAUGHT_UP_WAIT: Duration = Duration::from_secs(1);

/// The horizon as the looks establish it, one `seq` per sequence of the
/// log.
#[derive(Debug, Default)]
pub(super) struct Horizon {
    /// The highest `seq` of each sequence known final, with all below it.
    pub through: Vec<u64>,
    /// `seq`s final once the writers then in flight have ended.
    waiting: Option<(Vec<u64>, HashSet<String>)>,
}

impl Horizon {
    /// Takes one look: `last` the sequences' last values, then `writers`
    /// in flight. Answers whether the horizon moved.
    pub(super) fn look(&mut self, last: Vec<u64>, writers: HashSet<String>) -> bool {
        let before = self.through.clone();
        if self.through.len() < last.len() {
            self.through.resize(last.len(), 0);
        }
        if let Some((through, seen)) = &self.waiting {
            if seen.is_disjoint(&writers) {
                raise(&mut self.through, through);
                self.waiting = None;
            }
        }
        if writers.is_empty() {
            raise(&mut self.through, &last);
            self.waiting = None;
        } else if self.waiting.is_none() && !covers(&self.through, &last) {
            self.waiting = Some((last, writers));
        }
        self.through != before
    }

    /// Whether a look soon could move it.
    pub(super) fn waiting(&self) -> bool {
        self.waiting.is_some()
    }
}

/// Raises each of `through` to the matching `to`, if higher.
fn raise(through: &mut [u64], to: &[u64]) {
    for (t, to) in through.iter_mut().zip(to) {
        *t = (*t).max(*to);
    }
}

/// Whether `through` has reached every one of `last`.
fn covers(through: &[u64], last: &[u64]) -> bool {
    last.iter()
        .enumerate()
        .all(|(i, l)| through.get(i).is_some_and(|t| t >= l))
}

/// What the looks at a log have found, as its readers see it.
#[derive(Debug, Clone, Default)]
struct Seen {
    /// How many looks had begun when this one did (its number).
    look: u64,
    /// The sequences' last values at this look.
    last: Vec<u64>,
    /// The horizon after it.
    through: Vec<u64>,
}

/// One look at `log`: the sequences' last values and the writers in flight.
async fn look(
    client: &tokio_postgres::Client,
    log: &Followed,
) -> Result<(Vec<u64>, HashSet<String>)> {
    let mut last = Vec::new();
    let mut writers = HashSet::new();
    let mut statement = 0;
    for message in client.simple_query(log.look).await.map_err(db)? {
        match message {
            SimpleQueryMessage::CommandComplete(_) => statement += 1,
            SimpleQueryMessage::Row(row) => match statement {
                2 => {
                    for i in 0..row.len() {
                        last.push(row.get(i).and_then(|v| v.parse().ok()).ok_or_else(|| {
                            StoreError::Corrupt(format!("the {}'s sequence", log.name))
                        })?);
                    }
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
    if last.is_empty() {
        return Err(StoreError::Corrupt(format!("the {}'s sequence", log.name)));
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

/// A log's horizon as its readers use it, moved by a task of its own
/// ([`Tracked::start`]) until the store is dropped.
pub(super) struct Tracked {
    seen: watch::Receiver<Seen>,
    /// Rings the task to look now.
    wake: Arc<Notify>,
    /// How many looks have begun.
    begun: Arc<AtomicU64>,
    /// How many readers wait in [`Tracked::caught_up`].
    waiters: Arc<AtomicUsize>,
}

impl Tracked {
    /// Starts following `log` from `horizon` (as [`settle`] found it).
    /// `wake` rings a look at once (this node's writer rings it after each
    /// commit, for the ingest log); `mirror`, if given, receives the first
    /// sequence's horizon whenever it moves.
    pub(super) fn start(
        pool: Pool,
        log: &'static Followed,
        horizon: Horizon,
        wake: Arc<Notify>,
        mirror: Option<watch::Sender<u64>>,
    ) -> Tracked {
        let (seen_tx, seen) = watch::channel(Seen {
            look: 0,
            last: horizon.through.clone(),
            through: horizon.through.clone(),
        });
        let tracked = Tracked {
            seen,
            wake,
            begun: Arc::new(AtomicU64::new(0)),
            waiters: Arc::new(AtomicUsize::new(0)),
        };
        tokio::spawn(follow(
            pool,
            log,
            horizon,
            Follow {
                seen: seen_tx,
                mirror,
                wake: tracked.wake.clone(),
                begun: tracked.begun.clone(),
                waiters: tracked.waiters.clone(),
            },
        ));
        tracked
    }

    /// The horizon, once it has passed every `seq` handed out before this
    /// call (so a read up to it finds everything committed before the
    /// read began, and nothing can commit below it later), or after
    /// [`CAUGHT_UP_WAIT`] if a writer seen in flight has not ended by then.
    pub(super) async fn caught_up(&self) -> Vec<u64> {
        let _waiting = WaiterGuard::new(&self.waiters);
        let asked = self.begun.load(Ordering::Acquire);
        self.wake.notify_one();
        let mut seen = self.seen.clone();
        let caught_up = async {
            let target = seen
                .wait_for(|s| s.look > asked)
                .await
                .map(|s| s.last.clone())
                .ok()?;
            seen.wait_for(|s| covers(&s.through, &target)).await.ok()?;
            Some(())
        };
        let _ = tokio::time::timeout(CAUGHT_UP_WAIT, caught_up).await;
        let through = self.seen.borrow().through.clone();
        through
    }
}

/// Counts a reader waiting while it lives.
struct WaiterGuard<'a>(&'a AtomicUsize);

impl<'a> WaiterGuard<'a> {
    fn new(waiters: &'a AtomicUsize) -> Self {
        waiters.fetch_add(1, Ordering::AcqRel);
        WaiterGuard(waiters)
    }
}

impl Drop for WaiterGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What the following task shares with [`Tracked`].
struct Follow {
    seen: watch::Sender<Seen>,
    mirror: Option<watch::Sender<u64>>,
    wake: Arc<Notify>,
    begun: Arc<AtomicU64>,
    waiters: Arc<AtomicUsize>,
}

/// Moves `log`'s horizon until the store is dropped: when rung (this
/// node's commits to it, a reader waiting), every [`FOLLOW_INTERVAL`] for
/// other nodes' appends (unless the log is looked at on demand), and every
/// [`SETTLE_INTERVAL`] while writers seen in flight may still be (and, on
/// demand, a reader waits).
async fn follow(pool: Pool, log: &'static Followed, mut horizon: Horizon, to: Follow) {
    let mut failing = false;
    while !to.seen.is_closed() {
        let demanded = !log.on_demand || to.waiters.load(Ordering::Acquire) > 0;
        let wait = match (horizon.waiting() && demanded, log.on_demand) {
            (true, _) => Some(SETTLE_INTERVAL),
            (false, false) => Some(FOLLOW_INTERVAL),
            (false, true) => None,
        };
        match wait {
            Some(wait) => {
                tokio::select! {
                    _ = to.wake.notified() => {}
                    _ = tokio::time::sleep(wait) => {}
                }
            }
            None => {
                // Rechecked now and then: the store's drop closes `seen`.
                tokio::select! {
                    _ = to.wake.notified() => {}
                    _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                }
            }
        }
        let number = to.begun.fetch_add(1, Ordering::AcqRel) + 1;
        let looked = match pool.get().await {
            Ok(client) => look(&client, log).await,
            Err(e) => Err(StoreError::Database(e.to_string())),
        };
        match looked {
            Ok((last, writers)) => {
                failing = false;
                if horizon.look(last.clone(), writers) {
                    if let (Some(mirror), Some(first)) = (&to.mirror, horizon.through.first()) {
                        mirror.send_replace(*first);
                    }
                }
                to.seen.send_replace(Seen {
                    look: number,
                    last,
                    through: horizon.through.clone(),
                });
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
