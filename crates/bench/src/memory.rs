//! The peak memory of the processes a run drives: the server the bench
//! spawned, and any other named with `--watch-pid` (a server started by
//! hand, a peer and its database), so a footprint beside a peer's is
//! measured in the same run rather than remembered.
//!
//! What is read is the kernel's high-water mark of a process's resident
//! set (`VmHWM` in `/proc/<pid>/status`): the most it held at once since
//! it started, warm-up and calibration included. Read just before the run
//! ends, while the processes still live; where there is no `/proc` (or the
//! process is gone) the figure is absent and the summary says so.

use serde::Serialize;

/// A process to report on, from `--watch-pid NAME=PID` (or `PID`, named
/// by its number).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watched {
    /// What the summary calls it (`orion`, `mongod`, …).
    pub name: String,
    /// Its process id.
    pub pid: u32,
}

/// Parses `NAME=PID` or `PID` (clap's value parser for `--watch-pid`).
pub fn parse_watched(value: &str) -> Result<Watched, String> {
    let (name, pid) = match value.split_once('=') {
        Some((name, pid)) => (name.trim(), pid.trim()),
        None => (value.trim(), value.trim()),
    };
    let pid = pid
        .parse::<u32>()
        .map_err(|_| format!("{value:?}: expected NAME=PID or PID (a process id)"))?;
    if name.is_empty() {
        return Err(format!("{value:?}: the name before '=' is empty"));
    }
    Ok(Watched {
        name: name.to_string(),
        pid,
    })
}

/// One process's peak resident memory, as the summary carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PeakMemory {
    /// The process's name in the summary.
    pub name: String,
    /// Its process id.
    pub pid: u32,
    /// Its resident set's high-water mark, in bytes (absent when it could
    /// not be read: no `/proc`, or the process had ended).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_rss_bytes: Option<u64>,
}

impl PeakMemory {
    /// Reads `process`'s peak now.
    pub fn of(process: &Watched) -> PeakMemory {
        let status = std::fs::read_to_string(format!("/proc/{}/status", process.pid)).ok();
        PeakMemory {
            name: process.name.clone(),
            pid: process.pid,
            peak_rss_bytes: status.as_deref().and_then(vm_hwm),
        }
    }

    /// `weft (pid 42): peak RSS 81.3 MiB`, for the text summary.
    pub fn describe(&self) -> String {
        match self.peak_rss_bytes {
            Some(bytes) => format!(
                "{} (pid {}): peak RSS {:.1} MiB",
                self.name,
                self.pid,
                bytes as f64 / (1024.0 * 1024.0)
            ),
            None => format!("{} (pid {}): peak RSS not readable", self.name, self.pid),
        }
    }
}

/// The `VmHWM:` line of a `/proc/<pid>/status`, in bytes (the kernel
/// writes it in kB).
fn vm_hwm(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let mut words = line["VmHWM:".len()..].split_whitespace();
    let kb: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") | None => Some(kb * 1024),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watched_process_is_named_or_numbered() {
        assert_eq!(
            parse_watched("orion=4242"),
            Ok(Watched {
                name: "orion".into(),
                pid: 4242
            })
        );
        assert_eq!(parse_watched("17").unwrap().name, "17");
        assert!(parse_watched("orion=").is_err());
        assert!(parse_watched("=12").is_err());
        assert!(parse_watched("orion").is_err());
    }

    #[test]
    fn the_high_water_mark_is_read_in_bytes() {
        let status = "Name:\tweft\nVmPeak:\t 900000 kB\nVmHWM:\t   81234 kB\nVmRSS:\t   70000 kB\n";
        assert_eq!(vm_hwm(status), Some(81_234 * 1024));
        assert_eq!(vm_hwm("Name:\tweft\n"), None);
    }

    #[test]
    fn this_process_has_a_peak() {
        let me = Watched {
            name: "bench".into(),
            pid: std::process::id(),
        };
        let peak = PeakMemory::of(&me).peak_rss_bytes.expect("/proc is there");
        // At least the test binary's own code and stack are resident.
        assert!(peak > 1024 * 1024, "{peak}");
        let gone = Watched {
            name: "gone".into(),
            pid: u32::MAX,
        };
        assert_eq!(PeakMemory::of(&gone).peak_rss_bytes, None);
    }
}
