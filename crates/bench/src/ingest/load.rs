//! The load itself: a fixed set of connection workers posting uplinks on
//! the schedule of [`super::schedule`], each recording latencies, statuses
//! and accepted dataIds locally (no shared lock on the hot path) and
//! handing them back when the load phase ends.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::live::now_ms;
use super::payload::{uplink_id, Device, Heads, Reading, Renderer};
use super::schedule::{device_phase, next_due, OpenClock};
use crate::http::{Conn, Head};
use crate::summary::micros_histogram;

/// Longest wait for one response before the request counts as failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The latency histograms' range: past the request timeout, so no
/// recorded latency is ever clamped.
const LATENCY_RANGE: Duration = Duration::from_secs(60);

/// Longest wait for a connection to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Pause after a failed connect, so a dead server is not hammered in a
/// tight loop (and the generator does not spin).
const CONNECT_BACKOFF: Duration = Duration::from_millis(100);

/// Open loop: how late a slot may be sent before it counts as dropped.
/// Long enough to absorb timer granularity (1ms) and scheduling delays on
/// a loaded 2-core machine, short enough that a saturated run shows up as
/// drops rather than as a quietly lower rate.
pub const SEND_GRACE: Duration = Duration::from_millis(10);

/// How uplinks are timed.
pub enum Model {
    /// Each device sends once per interval, at most one uplink in flight.
    Closed {
        /// Time between a device's uplinks.
        interval: Duration,
    },
    /// A fixed clock shared by all connections.
    Open {
        /// The shared schedule position.
        clock: OpenClock,
    },
}

/// Everything the workers share, read-only.
pub struct Plan {
    /// `host:port` of every target; worker `w` connects to the
    /// `w % n`-th (several nodes of a cluster, round robin).
    pub connects: Vec<String>,
    /// Request heads per ingest path.
    pub heads: Heads,
    /// The simulated fleet.
    pub devices: Vec<Device>,
    /// How sends are timed.
    pub model: Model,
    /// Connections (= workers, = most requests in flight).
    pub connections: usize,
    /// Length of the load phase.
    pub duration: Duration,
    /// Accepted uplinks hotter than this (°C) are also listed in
    /// [`LoadReport::marked`]: the ones an alarm rule must fire on.
    pub mark_above: Option<f64>,
}

/// Live totals for the progress bar (relaxed atomics: exact at the end,
/// approximately current meanwhile).
#[derive(Debug, Default)]
pub struct Counters {
    /// Requests attempted.
    pub sent: AtomicU64,
    /// Requests answered 202.
    pub accepted: AtomicU64,
    /// Requests not answered 202 (including connection errors).
    pub failed: AtomicU64,
    /// Open-loop slots dropped for want of a free connection.
    pub dropped: AtomicU64,
}

/// What the load phase produced.
#[derive(Debug)]
pub struct LoadReport {
    /// Request latencies (send to full response), microseconds.
    pub latency: Histogram<u64>,
    /// dataIds of the uplinks answered 202.
    pub accepted: Vec<u128>,
    /// dataIds of the accepted uplinks above [`Plan::mark_above`].
    pub marked: Vec<u128>,
    /// Responses by status code.
    pub statuses: HashMap<u16, u64>,
    /// Requests that failed to connect.
    pub connect_errors: u64,
    /// Requests whose connection broke before a full response.
    pub io_errors: u64,
    /// Requests with no response within the request timeout.
    pub timeouts: u64,
    /// Requests attempted (responses + failures).
    pub sent: u64,
    /// Open-loop slots dropped by the generator.
    pub dropped: u64,
    /// Times a worker paused for a `Retry-After`.
    pub retry_pauses: u64,
    /// From the first send to the last response.
    pub elapsed: Duration,
}

impl LoadReport {
    fn empty() -> LoadReport {
        LoadReport {
            latency: micros_histogram(LATENCY_RANGE),
            accepted: Vec::new(),
            marked: Vec::new(),
            statuses: HashMap::new(),
            connect_errors: 0,
            io_errors: 0,
            timeouts: 0,
            sent: 0,
            dropped: 0,
            retry_pauses: 0,
            elapsed: Duration::ZERO,
        }
    }

    fn merge(&mut self, other: LoadReport) {
        let _ = self.latency.add(&other.latency);
        self.accepted.extend(other.accepted);
        self.marked.extend(other.marked);
        for (status, n) in other.statuses {
            *self.statuses.entry(status).or_insert(0) += n;
        }
        self.connect_errors += other.connect_errors;
        self.io_errors += other.io_errors;
        self.timeouts += other.timeouts;
        self.sent += other.sent;
        self.dropped += other.dropped;
        self.retry_pauses += other.retry_pauses;
    }

    /// Responses with this status.
    pub fn status(&self, status: u16) -> u64 {
        self.statuses.get(&status).copied().unwrap_or(0)
    }
}

/// Runs the load phase from `start` and returns the merged report.
pub async fn run(plan: Arc<Plan>, counters: Arc<Counters>, start: Instant) -> LoadReport {
    let workers = match plan.model {
        Model::Closed { .. } => plan.connections.min(plan.devices.len()),
        Model::Open { .. } => plan.connections,
    };
    let mut seeds = rand::rng();
    let handles: Vec<_> = (0..workers)
        .map(|w| {
            let worker = Worker {
                connect: plan.connects[w % plan.connects.len()].clone(),
                plan: plan.clone(),
                counters: counters.clone(),
                conn: None,
                renderer: Renderer::default(),
                rng: SmallRng::seed_from_u64(seeds.random()),
                report: LoadReport::empty(),
            };
            match plan.model {
                Model::Closed { interval } => {
                    // Device d belongs to worker d % workers: each worker's
                    // devices are spread across the whole interval.
                    let mine: Vec<usize> = (w..plan.devices.len()).step_by(workers).collect();
                    tokio::spawn(worker.closed_loop(mine, interval, start))
                }
                Model::Open { .. } => tokio::spawn(worker.open_loop(start)),
            }
        })
        .collect();
    let mut report = LoadReport::empty();
    for handle in handles {
        match handle.await {
            Ok(r) => report.merge(r),
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
    report.elapsed = start.elapsed();
    report
}

/// One connection and the uplinks it sends.
struct Worker {
    /// The target this worker's connection goes to.
    connect: String,
    plan: Arc<Plan>,
    counters: Arc<Counters>,
    conn: Option<Conn>,
    renderer: Renderer,
    rng: SmallRng,
    report: LoadReport,
}

impl Worker {
    /// Closed loop over `devices`: always send the device due soonest.
    async fn closed_loop(
        mut self,
        devices: Vec<usize>,
        interval: Duration,
        start: Instant,
    ) -> LoadReport {
        let end = self.plan.duration;
        let total = self.plan.devices.len();
        let mut due: BinaryHeap<Reverse<(Duration, usize)>> = devices
            .iter()
            .map(|&d| Reverse((device_phase(d, total, interval), d)))
            .collect();
        while let Some(Reverse((at, device))) = due.pop() {
            if at >= end {
                break; // the soonest is past the end, so are all others
            }
            tokio::time::sleep_until(start + at).await;
            let started = start.elapsed();
            if started >= end {
                break;
            }
            let head = self.send(device).await;
            due.push(Reverse((next_due(at, started, interval), device)));
            // An overloaded server asked for a pause: a closed-loop client
            // honours it (every device of this connection waits).
            if let Some(Head {
                status: 429 | 503,
                retry_after: Some(pause),
            }) = head
            {
                self.report.retry_pauses += 1;
                let remaining = end.saturating_sub(start.elapsed());
                tokio::time::sleep(pause.min(remaining)).await;
            }
        }
        self.finish().await
    }

    /// Open loop: claim the next slot of the shared clock, send it when due.
    async fn open_loop(mut self, start: Instant) -> LoadReport {
        let plan = self.plan.clone();
        let Model::Open { clock } = &plan.model else {
            unreachable!("open_loop runs only for the open model")
        };
        let devices = plan.devices.len() as u64;
        loop {
            let claim = clock.claim(start.elapsed(), SEND_GRACE);
            if claim.dropped > 0 {
                self.report.dropped += claim.dropped;
                self.counters
                    .dropped
                    .fetch_add(claim.dropped, Ordering::Relaxed);
            }
            let Some((slot, at)) = claim.slot else { break };
            tokio::time::sleep_until(start + at).await;
            self.send((slot % devices) as usize).await;
        }
        self.finish().await
    }

    async fn finish(mut self) -> LoadReport {
        self.conn = None;
        self.report
    }

    /// Sends one uplink of `device` and records the outcome. Returns the
    /// response head, or `None` when there was no response.
    async fn send(&mut self, device: usize) -> Option<Head> {
        if self.conn.is_none() {
            match tokio::time::timeout(CONNECT_TIMEOUT, Conn::connect(&self.connect)).await {
                Ok(Ok(conn)) => self.conn = Some(conn),
                Ok(Err(_)) | Err(_) => {
                    self.report.sent += 1;
                    self.report.connect_errors += 1;
                    self.counters.sent.fetch_add(1, Ordering::Relaxed);
                    self.counters.failed.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(CONNECT_BACKOFF).await;
                    return None;
                }
            }
        }
        let conn = self.conn.as_mut().expect("connected above");
        let reading = Reading::random(&mut self.rng);
        let id = uplink_id(&mut self.rng);
        // Stamped just before sending, as the seed's k6 script did.
        let reported_at = now_ms() as u64;
        let request = self.renderer.render(
            &self.plan.heads,
            &self.plan.devices[device],
            &reading,
            reported_at,
            id,
        );
        let started = Instant::now();
        let outcome = tokio::time::timeout(REQUEST_TIMEOUT, conn.round_trip(request, None)).await;
        self.report.sent += 1;
        self.counters.sent.fetch_add(1, Ordering::Relaxed);
        match outcome {
            Ok(Ok(head)) => {
                let micros = started.elapsed().as_micros() as u64;
                self.report.latency.saturating_record(micros);
                *self.report.statuses.entry(head.status).or_insert(0) += 1;
                if head.status == 202 {
                    self.report.accepted.push(id.as_u128());
                    if self
                        .plan
                        .mark_above
                        .is_some_and(|t| reading.temperature > t)
                    {
                        self.report.marked.push(id.as_u128());
                    }
                    self.counters.accepted.fetch_add(1, Ordering::Relaxed);
                } else {
                    self.counters.failed.fetch_add(1, Ordering::Relaxed);
                }
                if !conn.reusable() {
                    self.conn = None;
                }
                Some(head)
            }
            Ok(Err(_)) => {
                self.report.io_errors += 1;
                self.counters.failed.fetch_add(1, Ordering::Relaxed);
                self.conn = None;
                None
            }
            Err(_) => {
                self.report.timeouts += 1;
                self.counters.failed.fetch_add(1, Ordering::Relaxed);
                self.conn = None;
                None
            }
        }
    }
}
