//! One worker's side of a phase: a keep-alive [`Conn`] that reconnects
//! when it must ([`Caller`]), and the tallies of what its requests got
//! ([`Tally`]), merged across workers at the end of the phase. Every phase
//! of `history` (notify, verify, preload, queries) sends through these, so
//! latency, statuses and failures are counted the same way in all of them.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use tokio::time::Instant;

use crate::http::{Conn, Head};
use crate::summary::{micros_histogram, Metric};

/// Longest wait for a connection to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Pause after a failed connect, so a dead server is not hammered.
const CONNECT_BACKOFF: Duration = Duration::from_millis(100);

/// The latency histograms' range: past every request timeout, so no
/// recorded latency is ever clamped.
const LATENCY_RANGE: Duration = Duration::from_secs(120);

/// What the requests of one worker (or, merged, of a phase) got.
#[derive(Debug, Clone)]
pub struct Tally {
    /// Latency of the requests answered (write to full response), µs.
    pub latency: Histogram<u64>,
    /// Responses by status code.
    pub statuses: BTreeMap<u16, u64>,
    /// Requests that could not connect.
    pub connect_errors: u64,
    /// Requests whose connection broke before a full response.
    pub broken: u64,
    /// Requests with no response in time.
    pub timeouts: u64,
    /// Requests attempted.
    pub sent: u64,
    /// Times a worker paused for a `Retry-After`.
    pub retry_pauses: u64,
}

impl Default for Tally {
    fn default() -> Tally {
        Tally {
            latency: micros_histogram(LATENCY_RANGE),
            statuses: BTreeMap::new(),
            connect_errors: 0,
            broken: 0,
            timeouts: 0,
            sent: 0,
            retry_pauses: 0,
        }
    }
}

impl Tally {
    /// Adds another worker's tally to this one.
    pub fn merge(&mut self, other: &Tally) {
        let _ = self.latency.add(&other.latency);
        for (status, n) in &other.statuses {
            *self.statuses.entry(*status).or_insert(0) += n;
        }
        self.connect_errors += other.connect_errors;
        self.broken += other.broken;
        self.timeouts += other.timeouts;
        self.sent += other.sent;
        self.retry_pauses += other.retry_pauses;
    }

    /// Responses with this status.
    pub fn status(&self, status: u16) -> u64 {
        self.statuses.get(&status).copied().unwrap_or(0)
    }

    /// Responses by status, plus the requests that got none, as a metric.
    pub fn status_metric(&self) -> Metric {
        let mut values: BTreeMap<String, u64> = self
            .statuses
            .iter()
            .map(|(s, n)| (s.to_string(), *n))
            .collect();
        for (label, n) in [
            ("connect_error", self.connect_errors),
            ("broken", self.broken),
            ("timeout", self.timeouts),
        ] {
            if n > 0 {
                values.insert(label.to_string(), n);
            }
        }
        Metric::Tally { values }
    }
}

/// A worker's connection to the server: opened on first use, reopened
/// after the server closed it or a request failed.
pub struct Caller {
    connect: String,
    conn: Option<Conn>,
    timeout: Duration,
}

impl Caller {
    /// A caller of `connect` (`host:port`) that waits at most `timeout`
    /// for each response.
    pub fn new(connect: &str, timeout: Duration) -> Caller {
        Caller {
            connect: connect.to_string(),
            conn: None,
            timeout,
        }
    }

    /// Sends one complete request and records the outcome in `tally`; the
    /// response body is appended to `body` when given. `None` when there
    /// was no response (no connection, broken, timed out).
    pub async fn call(
        &mut self,
        request: &[u8],
        body: Option<&mut Vec<u8>>,
        tally: &mut Tally,
    ) -> Option<Head> {
        tally.sent += 1;
        if self.conn.is_none() {
            match tokio::time::timeout(CONNECT_TIMEOUT, Conn::connect(&self.connect)).await {
                Ok(Ok(conn)) => self.conn = Some(conn),
                Ok(Err(_)) | Err(_) => {
                    tally.connect_errors += 1;
                    tokio::time::sleep(CONNECT_BACKOFF).await;
                    return None;
                }
            }
        }
        let conn = self.conn.as_mut().expect("connected above");
        let started = Instant::now();
        match tokio::time::timeout(self.timeout, conn.round_trip(request, body)).await {
            Ok(Ok(head)) => {
                tally
                    .latency
                    .saturating_record(started.elapsed().as_micros() as u64);
                *tally.statuses.entry(head.status).or_insert(0) += 1;
                if !conn.reusable() {
                    self.conn = None;
                }
                Some(head)
            }
            Ok(Err(_)) => {
                tally.broken += 1;
                self.conn = None;
                None
            }
            Err(_) => {
                tally.timeouts += 1;
                self.conn = None;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tallies_merge_and_render() {
        let mut a = Tally {
            sent: 3,
            timeouts: 1,
            ..Tally::default()
        };
        a.statuses.insert(200, 2);
        a.latency.record(1000).unwrap();
        let mut b = Tally {
            sent: 2,
            ..Tally::default()
        };
        b.statuses.insert(200, 1);
        b.statuses.insert(503, 1);
        b.latency.record(3000).unwrap();
        a.merge(&b);
        assert_eq!(
            (a.sent, a.status(200), a.status(503), a.status(400)),
            (5, 3, 1, 0)
        );
        assert_eq!(a.latency.len(), 2);
        match a.status_metric() {
            Metric::Tally { values } => {
                assert_eq!(values["200"], 3);
                assert_eq!(values["timeout"], 1);
                assert!(!values.contains_key("broken"));
            }
            other => panic!("{other:?}"),
        }
    }
}
