//! What the pipeline made of uplinks: data units, the uplinks that failed,
//! and the consumers' cursors, committed together per processed batch so
//! a crash never leaves half a batch behind.

use std::collections::HashSet;
use std::sync::Arc;

use async_trait::async_trait;
use weft_model::{DataUnit, Device, DeviceEvent, FailedUplink};

use crate::{EntityRecord, HistoryRow, Result};

/// The cursor under which a processed batch that stores entities records
/// how far they reach: one past the highest data-unit `seq` stored at that
/// point. Units after it are applied to the entities again at start. One
/// per partition of the pipeline ([`partition_cursor`]).
pub const ENTITIES_CURSOR: &str = "entities";

/// The name of consumer `base`'s cursor for partition `partition` of the
/// pipeline: `base` itself for partition 0 (the only one on one node, so
/// a single node's cursors keep their names), `base/<partition>` for the
/// others.
pub fn partition_cursor(base: &str, partition: u16) -> String {
    if partition == 0 {
        base.to_string()
    } else {
        format!("{base}/{partition}")
    }
}

/// A data unit ready to store: the struct (for indexed columns) and its
/// JSON, serialised once by the pipeline and reused for storage and
/// fan-out.
#[derive(Debug, Clone)]
pub struct UnitRecord {
    /// The unit.
    pub unit: Arc<DataUnit>,
    /// The pipeline partition of the uplink it came from (see
    /// [`weft_model::uplink::partition_of`]): the rule engine evaluating
    /// that partition reads it back by this.
    pub partition: u16,
    /// `serde_json::to_string(&unit)` as UTF-8 bytes: stored as is, and
    /// shared (not copied) with the bus event that publishes the unit.
    pub json: bytes::Bytes,
}

/// A stored data unit as read back: its storage position (the paging
/// cursor) and its JSON exactly as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredUnit {
    /// Storage position; strictly increasing in insertion order.
    pub seq: u64,
    /// The pipeline partition it was stored by (0 on one node).
    pub partition: u16,
    /// The unit's JSON.
    pub json: String,
}

/// Everything the pipeline produced from a run of ingest-log entries,
/// committed atomically together with the consumer's new cursor: after a
/// crash, either all of it and the cursor are stored, or none of it is and
/// the entries are processed again (and `dataId` uniqueness makes that
/// idempotent).
#[derive(Debug, Clone, Default)]
pub struct ProcessedBatch {
    /// Names of the cursors that move (the pipeline's, one per partition
    /// the batch was read from: see [`partition_cursor`]).
    pub consumers: Vec<String>,
    /// The consumers' cursor after this batch: the next log `seq` to read.
    pub next_seq: u64,
    /// Data units to insert; a unit whose `dataId` is already stored is skipped.
    pub units: Vec<UnitRecord>,
    /// Failed uplinks to record (keyed by their log `seq`; replays overwrite).
    pub failures: Vec<FailedUplink>,
    /// Devices seen for the first time; inserted only if absent.
    pub new_devices: Vec<Device>,
    /// Events network servers reported about devices (joins, status, …),
    /// keyed by their log `seq` (replays store them once); each also
    /// becomes its device's latest state of its kind unless a later one
    /// is stored. See [`CatalogStore::device_state`](crate::CatalogStore::device_state).
    pub events: Vec<DeviceEvent>,
    /// New states of NGSI entities changed by device data. When not empty,
    /// the `entity_cursors` move to just past the highest stored data
    /// unit, in the same transaction.
    pub entities: Vec<EntityRecord>,
    /// The [`ENTITIES_CURSOR`]s of the partitions the batch was read from
    /// ([`partition_cursor`]).
    pub entity_cursors: Vec<String>,
    /// History rows of the entity changes this batch made, queued in the
    /// history feed in the same transaction (see
    /// [`HistoryStore::read_history_feed`](crate::HistoryStore::read_history_feed)).
    pub history: Vec<HistoryRow>,
    /// The entity changes this batch made, logged for the subscriptions
    /// in the same transaction (see [`OutboxStore`](crate::OutboxStore)).
    pub changes: Vec<crate::LoggedChange>,
}

/// What [`UnitStore::commit_processed`] did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CommitOutcome {
    /// One flag per `units` entry: `true` if inserted, `false` if its
    /// `dataId` was already stored (a duplicate, not to be published again).
    pub inserted: Vec<bool>,
    /// One per `units` entry: the storage position (`seq`) of an inserted
    /// unit, 0 for a duplicate. Consumers that tail stored units (the rule
    /// engine) keep their cursor in these.
    pub seqs: Vec<u64>,
}

/// Filters of `GET /api/v1/data`. Results are in storage order (oldest
/// first), starting after `after`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DataQuery {
    /// Only this device.
    pub device: Option<String>,
    /// Only this channel.
    pub channel: Option<String>,
    /// Only this device type.
    pub device_type: Option<String>,
    /// `reportedAt >= from` (epoch ms).
    pub from: Option<i64>,
    /// `reportedAt <= to` (epoch ms).
    pub to: Option<i64>,
    /// Only units stored after this position (the paging cursor).
    pub after: Option<u64>,
    /// Only units stored by these partitions of the pipeline (the rule
    /// engine reading back what its partitions stored); `None`: all.
    pub partitions: Option<Vec<u16>>,
    /// At most this many (the backend caps it at 10,000).
    pub limit: usize,
}

/// Filters of `GET /api/v1/uplinks/failed`, oldest first after `after`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FailedQuery {
    /// Only entries with log `seq > after`.
    pub after: Option<u64>,
    /// Only this device type.
    pub device_type: Option<String>,
    /// Only this channel.
    pub channel: Option<String>,
    /// At most this many (the backend caps it at 10,000).
    pub limit: usize,
}

/// What the pipeline made of uplinks: it commits each processed batch
/// with its cursor here, the API reads data units and failures back, and
/// consumers of stored units (the rule engine, bridges) tail them by `seq`.
#[async_trait]
pub trait UnitStore: Send + Sync {
    /// The next `seq` consumer `name` has to process (1 for a new consumer).
    async fn cursor(&self, consumer: &str) -> Result<u64>;

    /// Commits a processed batch and the consumer's cursor atomically. The
    /// batch is shared so a caller can retry it, and publish its units
    /// afterwards, without copying it.
    async fn commit_processed(&self, batch: Arc<ProcessedBatch>) -> Result<CommitOutcome>;

    /// Stored data units matching `query`, oldest first.
    async fn query_data(&self, query: &DataQuery) -> Result<Vec<StoredUnit>>;
    /// One stored data unit by `dataId`.
    async fn get_data(&self, data_id: &str) -> Result<Option<StoredUnit>>;
    /// Which of `data_ids` are stored as data units: the pipeline drops a
    /// resent unit before it changes anything, not only at its insert.
    async fn stored_data_ids(&self, data_ids: Vec<String>) -> Result<HashSet<String>>;
    /// Failed uplinks matching `query`, oldest first.
    async fn query_failed(&self, query: &FailedQuery) -> Result<Vec<FailedUplink>>;

    /// The `seq` of the newest stored data unit (0: none): where a new
    /// consumer of stored units starts.
    async fn data_head(&self) -> Result<u64>;
}
