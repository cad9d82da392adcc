//! History: every entity change recorded as time-series rows, and
//! QuantumLeap's notifications stored the same way.
//!
//! [`History`] listens to the context: a created entity records all its
//! attributes, an update the attributes it touched, each under the
//! entity's time index ([`weft_model::history::time_index`]). The change's
//! writer waits for the rows to commit (group commit in the store's own
//! history file) before it answers, so an acknowledged change is never
//! missing from history, even across kill -9. Rows are keyed by (tenant,
//! entity, attribute, time index): recording the same state twice stores
//! it once.

use std::sync::Arc;
use std::time::Duration;

use weft_model::history::{numeric, time_index};
use weft_model::ngsi::Entity;
use weft_store::{HistoryRow, Store, StoreError};

use crate::context::{Alteration, Backpressure, ChangeListener, EntityChange};

/// How often a write the store refused as overloaded is tried again.
const OVERLOADED_RETRIES: u32 = 50;

/// The history recorder.
pub struct History {
    store: Arc<dyn Store>,
}

impl History {
    /// A recorder writing through `store`.
    pub fn new(store: Arc<dyn Store>) -> Arc<History> {
        Arc::new(History { store })
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

impl ChangeListener for History {
    fn interested(&self, _tenant: &str) -> bool {
        true
    }

    fn on_change(&self, change: &EntityChange<'_>) -> Option<Backpressure> {
        let e = change.entity;
        let time = time_index(e, None, weft_model::now_ms());
        let rows = match change.alteration {
            Alteration::Deleted => return None,
            Alteration::Created => rows_of(change.tenant, change.service_path, e, e.attrs.keys(), time),
            Alteration::Updated => rows_of(
                change.tenant,
                change.service_path,
                e,
                change.attrs.iter().map(|c| c.name.as_str()),
                time,
            ),
        };
        if rows.is_empty() {
            return None;
        }
        let store = self.store.clone();
        Some(Box::pin(async move {
            if let Err(e) = append(&*store, rows).await {
                metrics::counter!("weft_history_rows_failed_total").increment(1);
                tracing::error!(error = %e, "recording history failed");
            }
        }))
    }
}
