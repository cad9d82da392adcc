//! History: every entity change recorded as time-series rows, and
//! QuantumLeap's notifications stored the same way.
//!
//! Entity changes queue their rows in the store's history feed in the same
//! transaction as the change itself (a created entity all its attributes,
//! an update the attributes it touched, under the entity's time index,
//! [`weft_model::history::time_index`]): the update never waits for
//! history inserts, and nothing acknowledged can be missing from history.
//! [`History::feed_loop`] moves the feed into the history (its own SQLite
//! file) in large batches, recording how far it got with the rows, and
//! picks up from there after a restart. Rows are keyed by (tenant, entity,
//! attribute, time index), so a replay stores nothing twice.
//!
//! QuantumLeap's notifications ([`History::record_entities`]) are written
//! straight into the history: their 200 means stored.

use std::sync::Arc;
use std::time::Duration;

use weft_model::history::{numeric, time_index};
use weft_model::ngsi::Entity;
use weft_store::{HistoryRow, Store, StoreError};

use tokio_util::sync::CancellationToken;

/// How often a write the store refused as overloaded is tried again.
const OVERLOADED_RETRIES: u32 = 50;

/// Most rows moved from the feed per history commit.
const FEED_BATCH_ROWS: usize = 200_000;

/// How long the feed loop sleeps when the feed is empty.
const FEED_IDLE: Duration = Duration::from_millis(20);

/// Shortest time between two history commits from the feed. A commit
/// writes every page it dirtied once, and rows of many series dirty a page
/// each; waiting lets more rows share those pages (measured: the WAL
/// writes of frequent small commits took most of the history writer's
/// time). History then lags changes by up to this much.
const FEED_INTERVAL: Duration = Duration::from_millis(500);

/// Consumed feed entries are pruned once this many have piled up.
const FEED_PRUNE_EVERY: u64 = 1_000;

/// The history recorder.
pub struct History {
    store: Arc<dyn Store>,
}

impl History {
    /// A recorder writing through `store`.
    pub fn new(store: Arc<dyn Store>) -> Arc<History> {
        Arc::new(History { store })
    }

    /// Moves the history feed into the history until `shutdown`: reads a
    /// batch after the stored cursor, stores its rows with the new cursor
    /// in one commit, prunes consumed entries now and then.
    pub async fn feed_loop(self: Arc<Self>, shutdown: CancellationToken) {
        let mut cursor = loop {
            match self.store.history_feed_cursor().await {
                Ok(c) => break c,
                Err(e) => {
                    tracing::error!(error = %e, "reading the history feed cursor failed; retrying");
                    if sleep_or_stop(&shutdown, Duration::from_secs(1)).await {
                        return;
                    }
                }
            }
        };
        let mut pruned = cursor;
        loop {
            if shutdown.is_cancelled() {
                return;
            }
            let feed = match self.store.read_history_feed(cursor, FEED_BATCH_ROWS).await {
                Ok(f) => f,
                Err(e) => {
                    tracing::error!(error = %e, "reading the history feed failed; retrying");
                    if sleep_or_stop(&shutdown, Duration::from_secs(1)).await {
                        return;
                    }
                    continue;
                }
            };
            let started = tokio::time::Instant::now();
            let Some(&(through, _)) = feed.last() else {
                if sleep_or_stop(&shutdown, FEED_IDLE).await {
                    return;
                }
                continue;
            };
            let mut rows: Vec<HistoryRow> = feed.into_iter().flat_map(|(_, r)| r).collect();
            // In key order, consecutive inserts land on the same b-tree
            // pages: far fewer page visits per batch than arrival order.
            rows.sort_unstable_by(|a, b| {
                (&a.tenant, &a.entity_id, &a.entity_type, &a.attr, a.time).cmp(&(
                    &b.tenant,
                    &b.entity_id,
                    &b.entity_type,
                    &b.attr,
                    b.time,
                ))
            });
            let count = rows.len() as u64;
            match self.store.append_history_from_feed(rows, through).await {
                Ok(_) => {
                    cursor = through;
                    metrics::counter!("weft_history_rows_recorded_total").increment(count);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "storing history from the feed failed; retrying");
                    if sleep_or_stop(&shutdown, Duration::from_millis(50)).await {
                        return;
                    }
                    continue;
                }
            }
            let rest = FEED_INTERVAL.saturating_sub(started.elapsed());
            if !rest.is_zero() && sleep_or_stop(&shutdown, rest).await {
                return;
            }
            if cursor - pruned >= FEED_PRUNE_EVERY {
                match self.store.prune_history_feed(cursor).await {
                    Ok(_) => pruned = cursor,
                    Err(e) => tracing::warn!(error = %e, "pruning the history feed failed"),
                }
            }
        }
    }

    /// Stores the entities of a notification (QuantumLeap's `/v2/notify`),
    /// each under its own time index. Returns the rows that were new.
    pub async fn record_entities(
        &self,
        tenant: &str,
        service_path: &str,
        entities: &[Entity],
        time_index_attr: Option<&str>,
        arrival: i64,
    ) -> Result<u64, StoreError> {
        let mut rows = Vec::new();
        for e in entities {
            let time = time_index(e, time_index_attr, arrival);
            rows.extend(rows_of(tenant, service_path, e, e.attrs.keys(), time));
        }
        append(&*self.store, rows).await
    }
}

/// The rows recording attributes `names` of `entity` at `time`.
pub fn rows_of<'a>(
    tenant: &str,
    service_path: &str,
    entity: &Entity,
    names: impl IntoIterator<Item = &'a str>,
    time: i64,
) -> Vec<HistoryRow> {
    names
        .into_iter()
        .filter_map(|name| {
            let a = entity.attrs.get(name)?;
            Some(HistoryRow {
                tenant: tenant.to_string(),
                service_path: service_path.to_string(),
                entity_id: entity.id.clone(),
                entity_type: entity.entity_type.clone(),
                attr: name.to_string(),
                attr_type: a.attr_type.clone(),
                time,
                value: a.value.to_string(),
                number: numeric(&a.value),
            })
        })
        .collect()
}

/// Sleeps `d`; `true` if `shutdown` came first.
async fn sleep_or_stop(shutdown: &CancellationToken, d: Duration) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => false,
        _ = shutdown.cancelled() => true,
    }
}

/// Appends rows, retrying while the store is overloaded (the history
/// writer catches up within milliseconds; the caller waits, it is never
/// told "done" for rows that are not stored).
async fn append(store: &dyn Store, rows: Vec<HistoryRow>) -> Result<u64, StoreError> {
    if rows.is_empty() {
        return Ok(0);
    }
    let mut tries = 0;
    loop {
        match store.append_history(rows.clone()).await {
            Err(StoreError::Overloaded) if tries < OVERLOADED_RETRIES => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            other => return other,
        }
    }
}
