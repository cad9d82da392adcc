//! The load: C closed-loop clients, each on its own keep-alive connection,
//! PATCHing random attributes of random entities among those it owns.
//!
//! Entity `e` belongs to client `e % C` only, so no two clients ever write
//! the same entity and the last value each client wrote per (entity,
//! attribute) is the entity's final state, which the verify phase checks.
//!
//! The same load drives `ngsi-notify`: the scenario picks the values
//! written ([`Plan::values`]) and reads how many updates each entity got
//! ([`Owned::updated`]) to know the notifications it is owed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::payload::{AttrRange, PatchHead};
use crate::http::{Conn, Head};
use crate::summary::micros_histogram;

/// Longest wait for one response before the request counts as failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The latency histogram's range: past the request timeout, so no
/// recorded latency is ever clamped.
const LATENCY_RANGE: Duration = Duration::from_secs(60);

/// Longest wait for a connection to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Pause after a failed connect, so a dead server is not hammered.
const CONNECT_BACKOFF: Duration = Duration::from_millis(100);

/// Chooses the value of one attribute in one update, from the time the
/// update is sent (since the load started) and the client's running count
/// of attribute writes (1, 2, 3, …). For one client, every value must
/// differ from those written before it and a later update's values must be
/// larger, so a stale write cannot pass for the last one (and, for
/// `ngsi-notify`, every write is an actual change the server notifies).
pub type ValueFn = fn(sent: Duration, seq: u64) -> u64;

/// `ngsi-update`'s values: the client's write count, unique per client and
/// increasing, so a stale write cannot pass for the last one.
pub fn sequence(_sent: Duration, seq: u64) -> u64 {
    seq
}

/// Everything the clients share, read-only.
pub struct Plan {
    /// `host:port` of every target; client `c` connects to the `c % n`-th
    /// (several nodes of a cluster, round robin).
    pub connects: Vec<String>,
    /// The fixed parts of every PATCH.
    pub head: PatchHead,
    /// Entities `0..entities` exist.
    pub entities: usize,
    /// Clients (= connections).
    pub clients: usize,
    /// Attributes per update.
    pub attrs: AttrRange,
    /// Length of the load phase.
    pub duration: Duration,
    /// The value written to each attribute.
    pub values: ValueFn,
}

/// Live totals for the progress bar.
#[derive(Debug, Default)]
pub struct Counters {
    /// Requests attempted.
    pub sent: AtomicU64,
    /// Requests answered 204.
    pub updated: AtomicU64,
    /// Requests not answered 204 (including connection errors).
    pub failed: AtomicU64,
}

/// The state one client leaves its entities in.
#[derive(Debug)]
pub struct Owned {
    /// The entity index.
    pub entity: usize,
    /// The last value written per attribute (0: the creation value).
    pub last: Vec<u64>,
    /// Updates of this entity answered 204.
    pub updated: u64,
    /// Updates of this entity answered otherwise (or not at all): whether
    /// they were applied is unknown.
    pub unsure: u64,
}

impl Owned {
    /// Whether an update may or may not have been applied, so the final
    /// state cannot be predicted.
    pub fn uncertain(&self) -> bool {
        self.unsure > 0
    }
}

/// What the load phase produced.
#[derive(Debug)]
pub struct LoadReport {
    /// Request latencies (send to full response), microseconds.
    pub latency: Histogram<u64>,
    /// Responses by status code.
    pub statuses: HashMap<u16, u64>,
    /// Requests that failed to connect.
    pub connect_errors: u64,
    /// Requests whose connection broke before a full response.
    pub io_errors: u64,
    /// Requests with no response within the request timeout.
    pub timeouts: u64,
    /// Requests attempted.
    pub sent: u64,
    /// Attributes carried by the updates answered 204.
    pub attrs_updated: u64,
    /// Times a client paused for a `Retry-After`.
    pub retry_pauses: u64,
    /// Every entity's expected final state, by entity index.
    pub owned: Vec<Owned>,
    /// From the first send to the last response.
    pub elapsed: Duration,
}

impl LoadReport {
    fn empty() -> LoadReport {
        LoadReport {
            latency: micros_histogram(LATENCY_RANGE),
            statuses: HashMap::new(),
            connect_errors: 0,
            io_errors: 0,
            timeouts: 0,
            sent: 0,
            attrs_updated: 0,
            retry_pauses: 0,
            owned: Vec::new(),
            elapsed: Duration::ZERO,
        }
    }

    fn merge(&mut self, other: LoadReport) {
        let _ = self.latency.add(&other.latency);
        for (status, n) in other.statuses {
            *self.statuses.entry(status).or_insert(0) += n;
        }
        self.connect_errors += other.connect_errors;
        self.io_errors += other.io_errors;
        self.timeouts += other.timeouts;
        self.sent += other.sent;
        self.attrs_updated += other.attrs_updated;
        self.retry_pauses += other.retry_pauses;
        self.owned.extend(other.owned);
    }

    /// Responses with this status.
    pub fn status(&self, status: u16) -> u64 {
        self.statuses.get(&status).copied().unwrap_or(0)
    }
}

/// Runs the load phase from `start` and returns the merged report, with
/// `owned` sorted by entity.
pub async fn run(plan: Arc<Plan>, counters: Arc<Counters>, start: Instant) -> LoadReport {
    let clients = plan.clients.min(plan.entities).max(1);
    let mut seeds = rand::rng();
    let handles: Vec<_> = (0..clients)
        .map(|c| {
            let owned = (c..plan.entities)
                .step_by(clients)
                .map(|entity| Owned {
                    entity,
                    last: vec![0; plan.attrs.max],
                    updated: 0,
                    unsure: 0,
                })
                .collect();
            let client = Client {
                connect: plan.connects[c % plan.connects.len()].clone(),
                plan: plan.clone(),
                counters: counters.clone(),
                conn: None,
                rng: SmallRng::seed_from_u64(seeds.random()),
                report: LoadReport::empty(),
                owned,
            };
            tokio::spawn(client.closed_loop(start))
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
    report.owned.sort_unstable_by_key(|o| o.entity);
    report
}

/// One client: a connection and the entities it alone writes.
struct Client {
    /// The target this client's connection goes to.
    connect: String,
    plan: Arc<Plan>,
    counters: Arc<Counters>,
    conn: Option<Conn>,
    rng: SmallRng,
    report: LoadReport,
    owned: Vec<Owned>,
}

impl Client {
    /// Sends updates back to back until the duration is over.
    async fn closed_loop(mut self, start: Instant) -> LoadReport {
        let end = self.plan.duration;
        let mut picked = Vec::with_capacity(self.plan.attrs.max);
        let mut values = Vec::with_capacity(self.plan.attrs.max);
        let mut body = Vec::with_capacity(64 + 40 * self.plan.attrs.max);
        let mut request = Vec::with_capacity(256 + body.capacity());
        // Counts attribute writes; the values derive from it (see ValueFn).
        let mut seq: u64 = 1;
        loop {
            let now = start.elapsed();
            if now >= end {
                break;
            }
            let slot = self.rng.random_range(0..self.owned.len());
            self.plan.attrs.draw(&mut self.rng, &mut picked);
            values.clear();
            for &a in &picked {
                values.push((a, (self.plan.values)(now, seq)));
                seq += 1;
            }
            let entity = self.owned[slot].entity;
            self.plan
                .head
                .render(&mut request, &mut body, entity, &values);
            let head = self.send(&request).await;
            let owned = &mut self.owned[slot];
            match head {
                Some(Head { status: 204, .. }) => {
                    for &(a, v) in &values {
                        owned.last[a] = v;
                    }
                    owned.updated += 1;
                    self.report.attrs_updated += values.len() as u64;
                }
                _ => owned.unsure += 1,
            }
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
        self.conn = None;
        self.report.owned = self.owned;
        self.report
    }

    /// Sends one request and records the outcome; `None` when there was
    /// no response.
    async fn send(&mut self, request: &[u8]) -> Option<Head> {
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
        let started = Instant::now();
        let outcome = tokio::time::timeout(REQUEST_TIMEOUT, conn.round_trip(request, None)).await;
        self.report.sent += 1;
        self.counters.sent.fetch_add(1, Ordering::Relaxed);
        match outcome {
            Ok(Ok(head)) => {
                let micros = started.elapsed().as_micros() as u64;
                self.report.latency.saturating_record(micros);
                *self.report.statuses.entry(head.status).or_insert(0) += 1;
                if head.status == 204 {
                    self.counters.updated.fetch_add(1, Ordering::Relaxed);
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
