//! The lock on the data directory: one weft per directory.
//!
//! Two processes on the same SQLite files would each believe they own the
//! single writer, the pipeline's cursor and the channels' sequence; their
//! writes would interleave and each would announce changes the other made.
//! So `weft serve` takes an exclusive lock on `<data>/weft.lock` before it
//! opens anything, and a second one on the same directory stops at start
//! with a message naming the holder. The lock is the operating system's
//! (`flock`), so it goes away with the process however it ends, kill -9
//! included; the file itself stays and is reused.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::Path;

use anyhow::Context;

/// The lock file's name inside the data directory.
pub const LOCK_FILE: &str = "weft.lock";

/// The held lock; dropping it (or the process ending) releases it.
#[derive(Debug)]
pub struct DataLock {
    _file: File,
}

impl DataLock {
    /// Locks `dir` for this process, or fails naming the process that
    /// holds it. The file records the holder's pid, for that message only.
    pub fn acquire(dir: &Path) -> anyhow::Result<DataLock> {
        let path = dir.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("opening the lock file {}", path.display()))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = match holder.trim() {
                    "" => String::new(),
                    pid => format!(" (pid {pid})"),
                };
                anyhow::bail!(
                    "the data directory {} is in use by another weft{holder}: stop that one, \
                     or give this one a directory of its own (--data or WEFT_DATA)",
                    dir.display()
                );
            }
            Err(TryLockError::Error(e)) => {
                return Err(e).with_context(|| format!("locking {}", path.display()));
            }
        }
        file.set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| writeln!(file, "{}", std::process::id()))
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(DataLock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_the_same_directory_is_refused_until_the_first_goes() {
        let dir = tempfile::tempdir().unwrap();
        let first = DataLock::acquire(dir.path()).unwrap();
        let err = DataLock::acquire(dir.path()).unwrap_err().to_string();
        assert!(err.contains("in use by another weft"), "{err}");
        assert!(
            err.contains(&format!("pid {}", std::process::id())),
            "{err}"
        );
        drop(first);
        DataLock::acquire(dir.path()).expect("free again once the holder is gone");
    }
}
