//! The read side: a small pool of read-only connections, and the helpers
//! the domains' reads share (each domain's queries live in its module).
//!
//! In WAL mode readers see the last committed state and never wait for
//! the writer, so reads scale with the pool instead of queueing behind
//! group commits. Each read runs on tokio's blocking pool, holding one
//! connection; a semaphore with one permit per connection makes a burst
//! of reads wait for a free connection (asynchronously) instead of
//! opening more. Nothing here writes.

use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;
use rusqlite::{Connection, OpenFlags, Row};
use tokio::sync::Semaphore;

use super::{schema, Db};
use crate::{Result, StoreError};

pub(super) use crate::MAX_QUERY_ROWS;

/// Prepared statements kept per read connection. `query_data` builds one
/// statement per combination of filters (64 at most); they are all worth
/// keeping.
const STATEMENT_CACHE: usize = 128;

/// Read-only connections shared by all reads.
pub(super) struct ReadPool {
    conns: Mutex<Vec<Connection>>,
    permits: Arc<Semaphore>,
}

impl ReadPool {
    /// Opens `size` read-only connections on an existing database.
    pub(super) fn open(path: &Path, size: usize) -> Result<ReadPool> {
        let size = size.max(1);
        let mut conns = Vec::with_capacity(size);
        for _ in 0..size {
            let conn = Connection::open_with_flags(
                path,
                OpenFlags::SQLITE_OPEN_READ_ONLY
                    | OpenFlags::SQLITE_OPEN_NO_MUTEX
                    | OpenFlags::SQLITE_OPEN_URI,
            )
            .db()?;
            schema::configure_reader(&conn).db()?;
            conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
            conns.push(conn);
        }
        Ok(ReadPool {
            conns: Mutex::new(conns),
            permits: Arc::new(Semaphore::new(size)),
        })
    }

    /// Runs `f` with a connection on the blocking pool.
    pub(super) async fn run<T, F>(self: &Arc<Self>, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| StoreError::Closed)?;
        let pool = Arc::clone(self);
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            // The permit guarantees a free connection.
            let conn = pool.conns.lock().pop().ok_or_else(|| {
                StoreError::Database("no read connection free despite a permit".to_string())
            })?;
            // A panicking read must not cost the pool its connection.
            let result = std::panic::catch_unwind(AssertUnwindSafe(|| f(&conn)));
            pool.conns.lock().push(conn);
            result.unwrap_or_else(|_| Err(StoreError::Database("a read panicked".to_string())))
        })
        .await
        .map_err(|e| StoreError::Database(format!("a read task failed: {e}")))?
    }
}

/// A query's row limit, capped at [`MAX_QUERY_ROWS`].
pub(super) fn limit(n: usize) -> i64 {
    n.min(MAX_QUERY_ROWS) as i64
}

/// A stored position (`seq`, cursor) as `u64`; they are never negative.
pub(super) fn position(row: &Row<'_>, index: usize) -> Result<u64> {
    let n: i64 = row.get(index).db()?;
    u64::try_from(n).map_err(|_| corrupt("position", format!("negative value {n}")))
}

/// A stored value that could not be decoded.
pub(super) fn corrupt(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("{what}: {e}"))
}

/// The next `seq` consumer `consumer` has to process (1 for a new one).
/// Cursors are shared by the domains that consume something: the
/// pipeline's and the rule engine's in the main file, the history feed's
/// in the history's file.
pub(super) fn cursor(conn: &Connection, consumer: &str) -> Result<u64> {
    let mut stmt = conn
        .prepare_cached("SELECT next_seq FROM cursors WHERE name = ?1")
        .db()?;
    let mut rows = stmt.query([consumer]).db()?;
    match rows.next().db()? {
        Some(row) => position(row, 0),
        None => Ok(1),
    }
}

/// The single number `sql` selects: the head (newest `seq`) of a log that
/// consumers tail, such as the data units or the alarm events.
pub(super) fn max_seq(conn: &Connection, sql: &'static str) -> Result<u64> {
    conn.prepare_cached(sql)
        .db()?
        .query_row([], |r| r.get::<_, i64>(0))
        .map(|n| n as u64)
        .db()
}
