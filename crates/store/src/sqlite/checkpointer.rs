//! The checkpointer: a thread with its own connection that copies the WAL
//! back into the database file, so the writer never does it. SQLite's
//! automatic checkpoint runs inside the commit that crosses the threshold,
//! which under load stalled the writer — and every caller waiting on its
//! commit — for ~20 ms at a time. Here checkpoints run beside the writer
//! (WAL allows it), on the other core.
//!
//! Passive checkpoints never block anyone, but only a checkpoint that can
//! take the write lock lets the WAL start over. When the WAL has grown past
//! [`RESTART_BYTES`], the checkpointer asks the writer (through a flag) to
//! run that restart between two of its commits; a large WAL makes every
//! page lookup slower, so it must stay bounded.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::Connection;
use tokio::sync::watch;

use super::schema;

/// Time between passive checkpoints. Longer periods copy a page that
/// changed many times (a hot index leaf, an entity updated again and
/// again) once instead of many times, at the price of a longer WAL; half a
/// second keeps the WAL to a few MB at the target ingest rate.
pub(super) const PERIOD: Duration = Duration::from_millis(500);

/// Time between passive checkpoints of a file written in large, rare
/// batches (the history's): its writer commits at most every half
/// second, so a pass per commit or so is enough.
pub(super) const BACKGROUND_PERIOD: Duration = Duration::from_millis(3_000);

/// WAL size in bytes beyond which the writer is asked to start the WAL
/// over; a longer WAL slows every page lookup.
const RESTART_BYTES: i64 = 64 * 1024 * 1024;

/// Starts the checkpointer; it stops once `stopped` becomes true (the
/// writer has finished), after a last full checkpoint.
pub(super) fn spawn(
    path: &Path,
    period: Duration,
    background: bool,
    restart_wal: Arc<AtomicBool>,
    mut stopped: watch::Receiver<bool>,
) -> std::io::Result<JoinHandle<()>> {
    let path = path.to_path_buf();
    std::thread::Builder::new().name("weft-store-checkpoint".to_string()).spawn(move || {
        if background {
            super::lower_thread_priority();
        }
        let conn = match Connection::open(&path).and_then(|c| schema::configure_reader(&c).map(|_| c)) {
            Ok(conn) => conn,
            Err(e) => {
                tracing::error!(error = %e, "the checkpointer could not open the database; the WAL will grow");
                return;
            }
        };
        // Passive checkpoints that do not reach the end of the WAL leave the
        // pages they copied unsynced; SQLite syncs the database file only
        // when a checkpoint completes, which would make that one (run by the
        // writer, see `restart_wal_if_asked`) pay for seconds of copying.
        // Syncing after every pass, here, keeps that final sync small.
        let file = std::fs::File::open(&path).ok();
        let page_size: i64 = conn.query_row("PRAGMA page_size", [], |r| r.get(0)).unwrap_or(4096);
        loop {
            if *stopped.borrow_and_update() {
                let _ = checkpoint(&conn, "TRUNCATE");
                return;
            }
            // While the writer has a restart to do, stay out of its way: a
            // checkpoint running here would make it wait for the lock.
            if restart_wal.load(Ordering::Relaxed) {
                std::thread::sleep(period);
                continue;
            }
            let result = checkpoint(&conn, "PASSIVE");
            if let Some(file) = &file {
                if let Err(e) = file.sync_data() {
                    tracing::warn!(error = %e, "syncing the database file failed");
                }
            }
            match result {
                Ok(frames) if frames * page_size > RESTART_BYTES => restart_wal.store(true, Ordering::Relaxed),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "checkpoint failed"),
            }
            std::thread::sleep(period);
        }
    })
}

/// Runs one checkpoint; returns the WAL's size in frames.
fn checkpoint(conn: &Connection, mode: &str) -> rusqlite::Result<i64> {
    conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |row| {
        row.get::<_, i64>(1)
    })
}
