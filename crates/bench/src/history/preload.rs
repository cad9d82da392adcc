//! The preload phase (`--preload-rows N`): fills one entity, `Room:big`,
//! with a long series as fast as the server takes it, so the query phase
//! can measure `lastN` and a day of hourly averages over millions of rows
//! (the target: 10 million stored rows, p99 under 10 ms).
//!
//! A notification's `data` may hold many entities; here each holds
//! [`BATCH`] copies of `Room:big` at consecutive time indexes one second
//! apart, and the server stores every one of them (one row per attribute
//! each). N rows are `ceil(N / 3)` notified states of the three
//! attributes. A few connections send the batches in parallel; a batch
//! refused as overloaded (429/503) is sent again after its `Retry-After`
//! (a refused notification stored nothing, so the resend stores it once).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::client::{Caller, Tally};
use super::payload::{render_notification, NotifyHead, ATTRS_PER_ENTITY, BIG_ENTITY};
use super::series::Series;
use crate::common::Session;
use crate::http::Head;
use crate::progress;

/// Entity states per notification: about 180 KB of body, well under the
/// server's 1 MiB limit, and one write transaction of 3000 rows.
pub const BATCH: u64 = 1000;

/// Connections sending batches at once: enough to keep the server's
/// single history writer busy (it commits one batch while the next is
/// parsed), few enough to leave the 2 cores to the server.
pub const PARALLEL: usize = 4;

/// Time between consecutive states of `Room:big`, ms.
pub const STEP_MS: i64 = 1000;

/// Longest wait for one batch.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Times a refused batch is sent again before it counts as failed.
const MAX_RETRIES: u32 = 20;

/// Pause before resending a refused batch without `Retry-After`.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// What the preload produced.
#[derive(Debug)]
pub struct PreloadReport {
    /// `Room:big`'s series as written.
    pub series: Series,
    /// The notifications (batches) sent, retries included.
    pub tally: Tally,
    /// Rows the server acknowledged (200s × batch size × 3).
    pub rows_ok: u64,
    /// Batches answered 200 (after any resends).
    pub batches_ok: u64,
    /// Batches never answered 200.
    pub batches_failed: u64,
    /// From the first batch to the last response.
    pub elapsed: Duration,
}

/// The states needed for `rows` rows: each state stores one row per attribute.
pub fn states_for(rows: u64) -> u64 {
    rows.div_ceil(ATTRS_PER_ENTITY)
}

/// The states `lo..=hi` carried by batch `b` of a preload of `states`.
pub fn batch_range(b: u64, states: u64) -> Option<(u64, u64)> {
    let lo = b.checked_mul(BATCH)? + 1;
    (lo <= states).then(|| (lo, (lo + BATCH - 1).min(states)))
}

/// Sends `ceil(rows / 3)` states of `Room:big` on the grid
/// `origin + seq × 1 s`, `temperature = seq`.
pub async fn preload(session: &Session, tenant: &str, rows: u64, origin: i64) -> PreloadReport {
    let states = states_for(rows);
    let mut series = Series::new(origin, STEP_MS);
    series.set_sent(states);
    let head = Arc::new(NotifyHead::new(
        &session.base.prefix,
        &session.base.host,
        tenant,
    ));
    let next = Arc::new(AtomicU64::new(0));
    let stored = Arc::new(AtomicU64::new(0));
    let bar = progress::spinner(session.show_progress, "preload");
    let start = Instant::now();
    let workers: Vec<_> = (0..PARALLEL)
        .map(|_| {
            let (head, next, stored) = (head.clone(), next.clone(), stored.clone());
            let connect = session.base.connect.clone();
            let template = series.clone();
            tokio::spawn(async move {
                let mut caller = Caller::new(&connect, REQUEST_TIMEOUT);
                let mut tally = Tally::default();
                let mut failed = Vec::new();
                let (mut body, mut request) = (Vec::new(), Vec::new());
                while let Some((lo, hi)) = batch_range(next.fetch_add(1, Ordering::Relaxed), states)
                {
                    let points = (lo..=hi).map(|seq| (template.time(seq), seq));
                    render_notification(&mut body, BIG_ENTITY, points);
                    head.render(&mut request, &body);
                    if send_batch(&mut caller, &mut tally, &request).await {
                        stored.fetch_add(hi - lo + 1, Ordering::Relaxed);
                    } else {
                        failed.push((lo, hi));
                    }
                }
                (tally, failed)
            })
        })
        .collect();
    let all = futures::future::join_all(workers);
    tokio::pin!(all);
    let mut tick = tokio::time::interval(progress::REFRESH);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let results = loop {
        tokio::select! {
            results = &mut all => break results,
            _ = tick.tick(), if !bar.is_hidden() => {
                let rows = stored.load(Ordering::Relaxed) * ATTRS_PER_ENTITY;
                bar.set_message(format!(
                    "{rows} of {} rows ({:.0} rows/s)",
                    states * ATTRS_PER_ENTITY,
                    rows as f64 / start.elapsed().as_secs_f64().max(1e-3)
                ));
            }
        }
    };
    let elapsed = start.elapsed();
    bar.finish_and_clear();
    let mut tally = Tally::default();
    let mut batches_failed = 0;
    for result in results {
        let (t, failed) = match result {
            Ok(r) => r,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        };
        tally.merge(&t);
        for (lo, hi) in failed {
            series.mark_unsure(lo, hi);
            batches_failed += 1;
        }
    }
    PreloadReport {
        batches_ok: states.div_ceil(BATCH) - batches_failed,
        batches_failed,
        rows_ok: series.certain() * ATTRS_PER_ENTITY,
        series,
        tally,
        elapsed,
    }
}

/// Sends one batch until it is answered 200, resending it while the
/// server says it is overloaded; false when it never was.
async fn send_batch(caller: &mut Caller, tally: &mut Tally, request: &[u8]) -> bool {
    for _ in 0..=MAX_RETRIES {
        match caller.call(request, None, tally).await {
            Some(Head { status: 200, .. }) => return true,
            Some(Head {
                status: 429 | 503,
                retry_after,
            }) => {
                tally.retry_pauses += 1;
                tokio::time::sleep(retry_after.unwrap_or(RETRY_PAUSE)).await;
            }
            _ => return false,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_become_states_in_batches() {
        assert_eq!(states_for(0), 0);
        assert_eq!(states_for(1), 1);
        assert_eq!(states_for(3), 1);
        assert_eq!(states_for(10_000_000), 3_333_334);
        assert_eq!(batch_range(0, 0), None);
        assert_eq!(batch_range(0, 1), Some((1, 1)));
        assert_eq!(batch_range(0, 2500), Some((1, 1000)));
        assert_eq!(batch_range(2, 2500), Some((2001, 2500)));
        assert_eq!(batch_range(3, 2500), None);
        assert_eq!(batch_range(u64::MAX, 2500), None);
        // Every state is in exactly one batch.
        let states = 3_333_334;
        let covered: u64 = (0..)
            .map_while(|b| batch_range(b, states))
            .map(|(lo, hi)| hi - lo + 1)
            .sum();
        assert_eq!(covered, states);
    }
}
