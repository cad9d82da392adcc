//! The notify phase: C closed-loop clients, each on its own keep-alive
//! connection, POSTing QuantumLeap's k6 notification to `/v2/notify` back
//! to back, as an Orion subscription (or QuantumLeap's load test) would.
//!
//! Entity `e` belongs to client `e % C` only, and each client cycles
//! through its entities, so the notifications of one entity are numbered
//! densely by the one client writing them ([`Series`]): the `seq`-th has
//! its own time index and `temperature = seq`, so every notification adds
//! distinct rows and the verify phase can tell exactly which are stored.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::client::{Caller, Tally};
use super::payload::{entity_id, render_notification, NotifyHead, SETUP_ENTITY};
use super::series::Series;
use crate::http::Head;
use crate::progress;

/// Longest wait for one response before the notification counts as failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Everything the clients share, read-only.
pub struct Plan {
    /// `host:port` to connect to.
    pub connect: String,
    /// The fixed part of every request.
    pub head: NotifyHead,
    /// Entities `Room:0..Room:{entities-1}` are notified.
    pub entities: usize,
    /// Clients (= connections), at most one per entity.
    pub clients: usize,
    /// Length of the phase.
    pub duration: Duration,
    /// Time index of notification 0 of every entity, epoch ms.
    pub origin: i64,
    /// Time between an entity's consecutive notifications, ms.
    pub step: i64,
}

/// Live totals for the progress bar.
#[derive(Debug, Default)]
pub struct Counters {
    /// Notifications sent.
    pub sent: AtomicU64,
    /// Notifications answered 200.
    pub stored: AtomicU64,
    /// Notifications answered otherwise, or not at all.
    pub failed: AtomicU64,
}

/// What the notify phase produced.
#[derive(Debug)]
pub struct NotifyReport {
    /// Requests, statuses and latencies.
    pub tally: Tally,
    /// Notifications answered 200.
    pub ok: u64,
    /// Every entity's series as written, by entity index.
    pub series: Vec<Series>,
    /// From the first send to the last response.
    pub elapsed: Duration,
}

/// Sends one notification of [`SETUP_ENTITY`] (time index `origin`) and
/// waits for its answer, before the clients start. A history creates what
/// a new tenant and entity type need on first use: QuantumLeap makes a
/// schema per tenant and a table per entity type, and when its two
/// workers both do so for the load's first notifications one of them fails,
/// logs an ERROR, and may still answer 200 without storing the
/// notification (seen on QuantumLeap 1.0.0 with Timescale). A deployment's
/// tables exist before its sensors report; so do the run's. Returns the
/// status, `None` when there was no answer.
pub async fn setup(connect: &str, head: &NotifyHead, origin: i64) -> Option<u16> {
    let mut caller = Caller::new(connect, REQUEST_TIMEOUT);
    let (mut body, mut request) = (Vec::new(), Vec::new());
    render_notification(&mut body, SETUP_ENTITY, [(origin, 0)]);
    head.render(&mut request, &body);
    let head = caller.call(&request, None, &mut Tally::default()).await;
    head.map(|h| h.status)
}

/// Runs the phase with a progress bar fed from the clients' counters.
pub async fn generate(plan: Plan, show_progress: bool) -> NotifyReport {
    let duration = plan.duration;
    let counters = Arc::new(Counters::default());
    let bar = progress::timed_bar(show_progress, "notify", duration);
    let start = Instant::now();
    let load = run(Arc::new(plan), counters.clone(), start);
    tokio::pin!(load);
    let mut tick = tokio::time::interval(progress::REFRESH);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let report = loop {
        tokio::select! {
            report = &mut load => break report,
            _ = tick.tick(), if !bar.is_hidden() => {
                let elapsed = start.elapsed();
                bar.set_position(elapsed.as_millis() as u64);
                let stored = counters.stored.load(Ordering::Relaxed);
                bar.set_message(format!(
                    "{} sent, {stored} stored ({:.0}/s), {} failed",
                    counters.sent.load(Ordering::Relaxed),
                    stored as f64 / elapsed.as_secs_f64().max(1e-3),
                    counters.failed.load(Ordering::Relaxed),
                ));
            }
        }
    };
    bar.finish_and_clear();
    report
}

/// Runs the clients from `start` until the duration is over and merges
/// what they report.
async fn run(plan: Arc<Plan>, counters: Arc<Counters>, start: Instant) -> NotifyReport {
    let clients = plan.clients.clamp(1, plan.entities.max(1));
    let handles: Vec<_> = (0..clients)
        .map(|c| {
            let owned = (c..plan.entities)
                .step_by(clients)
                .map(|e| (e, entity_id(e), Series::new(plan.origin, plan.step)))
                .collect();
            tokio::spawn(closed_loop(plan.clone(), counters.clone(), owned, start))
        })
        .collect();
    let mut report = NotifyReport {
        tally: Tally::default(),
        ok: 0,
        series: vec![Series::new(plan.origin, plan.step); plan.entities],
        elapsed: Duration::ZERO,
    };
    for handle in handles {
        match handle.await {
            Ok((tally, ok, owned)) => {
                report.tally.merge(&tally);
                report.ok += ok;
                for (e, series) in owned {
                    report.series[e] = series;
                }
            }
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
    report.elapsed = start.elapsed();
    report
}

/// One client: notifies its entities in turn until the duration is over.
/// Returns its tally, its 200s and its entities' series.
async fn closed_loop(
    plan: Arc<Plan>,
    counters: Arc<Counters>,
    mut owned: Vec<(usize, String, Series)>,
    start: Instant,
) -> (Tally, u64, Vec<(usize, Series)>) {
    let mut caller = Caller::new(&plan.connect, REQUEST_TIMEOUT);
    let mut tally = Tally::default();
    let mut ok = 0;
    let mut body = Vec::with_capacity(256);
    let mut request = Vec::with_capacity(512);
    let mut slot = 0;
    while !owned.is_empty() && start.elapsed() < plan.duration {
        let here = slot;
        slot = (slot + 1) % owned.len();
        let (_, id, series) = &mut owned[here];
        let seq = series.next_seq();
        render_notification(&mut body, id, [(series.time(seq), seq)]);
        plan.head.render(&mut request, &body);
        counters.sent.fetch_add(1, Ordering::Relaxed);
        let head = caller.call(&request, None, &mut tally).await;
        if let Some(Head { status: 200, .. }) = head {
            ok += 1;
            counters.stored.fetch_add(1, Ordering::Relaxed);
        } else {
            // Maybe stored, maybe not: the verify phase allows either.
            series.mark_unsure(seq, seq);
            counters.failed.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(Head {
            status: 429 | 503,
            retry_after: Some(pause),
        }) = head
        {
            tally.retry_pauses += 1;
            let remaining = plan.duration.saturating_sub(start.elapsed());
            tokio::time::sleep(pause.min(remaining)).await;
        }
    }
    let owned = owned.into_iter().map(|(e, _, s)| (e, s)).collect();
    (tally, ok, owned)
}
