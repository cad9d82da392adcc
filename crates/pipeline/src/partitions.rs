//! The pipeline's partitions as the store keeps them: the cursors of a
//! partitioned consumer (the ingest consumer, the rule lanes, the entity
//! writes), and the device data applied again to the entities from those
//! cursors after a restart or a takeover. Below both the ingest consumer
//! and the rule engine, so neither reads the other's files for it.

use std::collections::HashMap;
use std::sync::Arc;

use weft_store::{Store, StoreError};

use crate::catalog::Catalog;
use crate::context;

/// The stored cursors of consumer `base` for `partitions`.
pub(crate) async fn partition_cursors(
    store: &dyn Store,
    base: &str,
    partitions: &[u16],
) -> Result<HashMap<u16, u64>, StoreError> {
    let mut cursors = HashMap::with_capacity(partitions.len());
    for &p in partitions {
        cursors.insert(
            p,
            store.cursor(&weft_store::partition_cursor(base, p)).await?,
        );
    }
    Ok(cursors)
}

/// Applies to the context the units `partitions` stored after their
/// entities were last stored (the store records how far they reach, per
/// partition), so a crash between two bulk entity writes loses nothing.
/// Each partition is read on its own from its own cursor, so a partition
/// that has been quiet for long does not make the others' units be read
/// again.
pub(crate) async fn replay_units_into_context(
    store: &Arc<dyn Store>,
    catalog: &Catalog,
    context: &context::Context,
    partitions: &[u16],
) -> Result<(), StoreError> {
    let split = store.partitions() > 1;
    let floors = partition_cursors(&**store, weft_store::ENTITIES_CURSOR, partitions).await?;
    let mut replayed = 0usize;
    for (partition, floor) in floors {
        let mut after = floor.saturating_sub(1);
        loop {
            let query = weft_store::DataQuery {
                after: Some(after),
                limit: 10_000,
                partitions: split.then(|| vec![partition]),
                ..Default::default()
            };
            let rows = store.query_data(&query).await?;
            let Some(last) = rows.last() else { break };
            after = last.seq;
            let units: Vec<weft_model::DataUnit> = rows
                .iter()
                .filter_map(|r| serde_json::from_str(&r.json).ok())
                .collect();
            let types: Vec<String> = units
                .iter()
                .map(|u| {
                    catalog
                        .device_type(&u.device.device_type)
                        .and_then(|t| t.def.entity_type.clone())
                        .unwrap_or_else(|| u.device.device_type.clone())
                })
                .collect();
            // Replayed changes were announced before the restart (or never
            // committed as entities): they are dropped, not announced again.
            let _ = context.apply_units(
                units.iter().zip(types.iter().map(String::as_str)),
                weft_model::now_ms(),
            );
            replayed += units.len();
        }
    }
    if replayed > 0 {
        tracing::info!(
            units = replayed,
            "applied recent data units to their entities"
        );
    }
    Ok(())
}
