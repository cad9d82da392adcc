//! The checkpointer: a thread with its own connection that copies the WAL
//! back into the database file, so the writer never does it. SQLite's
//! automatic checkpoint runs inside the commit that crosses the threshold,
//! which under load stalled the writer — and every caller waiting on its
//! commit — for ~20 ms at a time. Here checkpoints run beside the writer
//! (WAL allows it), on the other core.
//!
//! Passive checkpoints never block anyone. If the WAL still grows past
//! [`RESTART_FRAMES`] (the writer outpaces passive copying), one RESTART
//! checkpoint briefly waits for the writer so the WAL starts over and
//! stays bounded.

use std::path::Path;
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::Connection;
use tokio::sync::watch;

use super::schema;

/// Time between passive checkpoints.
const PERIOD: Duration = Duration::from_millis(100);

/// WAL size (in pages of 4 KiB: 64 MiB) beyond which a RESTART checkpoint
/// makes the next write start the WAL over.
const RESTART_FRAMES: i64 = 16 * 1024;

/// Starts the checkpointer; it stops once `stopped` becomes true (the
/// writer has finished), after a last full checkpoint.
pub(super) fn spawn(path: &Path, mut stopped: watch::Receiver<bool>) -> std::io::Result<JoinHandle<()>> {
    let path = path.to_path_buf();
    std::thread::Builder::new().name("weft-store-checkpoint".to_string()).spawn(move || {
        let conn = match Connection::open(&path).and_then(|c| schema::configure_reader(&c).map(|_| c)) {
            Ok(conn) => conn,
            Err(e) => {
                tracing::error!(error = %e, "the checkpointer could not open the database; the WAL will grow");
                return;
            }
        };
        loop {
            if *stopped.borrow_and_update() {
                let _ = checkpoint(&conn, "TRUNCATE");
                return;
            }
            match checkpoint(&conn, "PASSIVE") {
                Ok(frames) if frames > RESTART_FRAMES => {
                    if let Err(e) = checkpoint(&conn, "RESTART") {
                        tracing::warn!(error = %e, "restart checkpoint failed");
                    }
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "checkpoint failed"),
            }
            std::thread::sleep(PERIOD);
        }
    })
}

/// Runs one checkpoint; returns the WAL's size in frames.
fn checkpoint(conn: &Connection, mode: &str) -> rusqlite::Result<i64> {
    conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |row| row.get::<_, i64>(1))
}
