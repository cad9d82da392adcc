//! weft's storage seam. Every durable thing goes through the [`Store`]
//! trait so that the pipeline and the API never see SQL, and a PostgreSQL
//! backend can be added without touching them.
//!
//! - [`sqlite`]: the embedded default (bundled SQLite, WAL, one writer
//!   thread with group commit, a read pool, migrations).
//!
//! Durability contract: a write method returns only after the transaction
//! holding it has committed. Concurrent writes are batched into one
//! transaction by the backend (group commit), so many small durable writes
//! cost one commit.
#![deny(missing_docs)]

use std::collections::HashSet;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Map, Value};
use weft_model::{DataUnit, Device, DeviceType, FailedUplink, NewUplink, Uplink};

mod alarms;
mod channels;
pub mod postgres;
mod rollup;
pub mod sqlite;

pub use alarms::{AlarmBatch, AlarmQuery, AlarmRecord, RuleStateRecord};
pub use channels::{ChannelMessage, ChannelSubscriber};

pub use postgres::{PostgresConfig, PostgresStore};
pub use sqlite::{SqliteConfig, SqliteStore, Synchronous};

/// The cursor under which a processed batch that stores entities records
/// how far they reach: one past the highest data-unit `seq` stored at that
/// point. Units after it are applied to the entities again at start.
pub const ENTITIES_CURSOR: &str = "entities";

/// Name of the cursor (in the history's file) recording how far the
/// history feed has been moved into the history.
pub const HISTORY_FEED_CURSOR: &str = "history_feed";

/// Errors a store reports. Callers map `Overloaded` to 503 + Retry-After
/// and everything else to 500.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The writer's queue is full: the caller should shed load, not wait.
    #[error("the store's write queue is full")]
    Overloaded,
    /// The store has been shut down.
    #[error("the store is closed")]
    Closed,
    /// The database reported an error.
    #[error("database error: {0}")]
    Database(String),
    /// A stored value could not be decoded (corruption or a schema bug).
    #[error("stored value could not be decoded: {0}")]
    Corrupt(String),
}

/// Result alias for store operations.
pub type Result<T> = std::result::Result<T, StoreError>;

/// A data unit ready to store: the struct (for indexed columns) and its
/// JSON, serialised once by the pipeline and reused for storage and
/// fan-out.
#[derive(Debug, Clone)]
pub struct UnitRecord {
    /// The unit.
    pub unit: Arc<DataUnit>,
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
    /// Name of the consumer whose cursor moves (e.g. `"pipeline"`).
    pub consumer: String,
    /// The consumer's cursor after this batch: the next log `seq` to read.
    pub next_seq: u64,
    /// Data units to insert; a unit whose `dataId` is already stored is skipped.
    pub units: Vec<UnitRecord>,
    /// Failed uplinks to record (keyed by their log `seq`; replays overwrite).
    pub failures: Vec<FailedUplink>,
    /// Devices seen for the first time; inserted only if absent.
    pub new_devices: Vec<Device>,
    /// New states of NGSI entities changed by device data. When not empty,
    /// the [`ENTITIES_CURSOR`] moves to just past the highest stored data
    /// unit, in the same transaction.
    pub entities: Vec<EntityRecord>,
    /// History rows of the entity changes this batch made, queued in the
    /// history feed in the same transaction (see [`Store::read_history_feed`]).
    pub history: Vec<HistoryRow>,
}

/// What [`Store::commit_processed`] did.
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

/// Filters of `GET /api/v1/devices`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceFilter {
    /// Only devices of this type.
    pub device_type: Option<String>,
    /// Only devices on this channel.
    pub channel: Option<String>,
    /// Only devices whose records hold all these label values
    /// (compared as strings; numbers and booleans by their JSON text).
    pub records: Vec<(String, String)>,
}

/// An NGSI entity as stored: where it lives, its key, its creation order
/// and its JSON (the model's storage form, opaque to the store).
#[derive(Debug, Clone, PartialEq)]
pub struct EntityRecord {
    /// Tenant (`Fiware-Service`, lowercased; empty for the default tenant).
    pub tenant: String,
    /// Service path.
    pub service_path: String,
    /// Entity id.
    pub id: String,
    /// Entity type.
    pub entity_type: String,
    /// Creation order within the tenant, kept across restarts.
    pub created: u64,
    /// The entity.
    pub json: String,
}

/// What an [`NgsiDocument`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DocumentKind {
    /// An NGSI subscription (`/v2/subscriptions`).
    Subscription,
    /// An NGSI registration (`/v2/registrations`).
    Registration,
    /// A channel bridge (`/api/v1/bridges`), kept with tenant "".
    Bridge,
    /// A revoked JWT id (`PUT /admin/jwt/revoke`), kept with tenant "".
    RevokedJwt,
    /// A page template (`/api/v1/pages`), kept with tenant "".
    Page,
    /// A page service (`/api/v1/page-services`), kept with tenant "".
    PageService,
}

impl DocumentKind {
    /// The name kept in the store.
    pub fn as_str(self) -> &'static str {
        match self {
            DocumentKind::Subscription => "subscription",
            DocumentKind::Registration => "registration",
            DocumentKind::Bridge => "bridge",
            DocumentKind::RevokedJwt => "revoked-jwt",
            DocumentKind::Page => "page",
            DocumentKind::PageService => "page-service",
        }
    }
}

/// An NGSI subscription or registration as stored: opaque JSON keyed by
/// kind, tenant and id, with the service path it belongs to and its
/// creation order (listings are in creation order).
#[derive(Debug, Clone, PartialEq)]
pub struct NgsiDocument {
    /// Subscription or registration.
    pub kind: DocumentKind,
    /// Tenant (empty for the default tenant).
    pub tenant: String,
    /// The 24-hex id.
    pub id: String,
    /// Service path of the request that created it.
    pub service_path: String,
    /// Creation order, kept across restarts.
    pub created: u64,
    /// The document (the model's storage form).
    pub json: String,
}

/// One recorded value of one attribute of one entity at one time index:
/// a row of the history (QuantumLeap's table, narrowed).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HistoryRow {
    /// Tenant (empty for the default tenant).
    pub tenant: String,
    /// Service path of the entity.
    pub service_path: String,
    /// Entity id.
    pub entity_id: String,
    /// Entity type.
    pub entity_type: String,
    /// Attribute name.
    pub attr: String,
    /// Attribute type (`Number`, `Text`, …).
    pub attr_type: String,
    /// The time index, epoch milliseconds.
    pub time: i64,
    /// The value as JSON text.
    pub value: String,
    /// The value as a number when it is one (what aggregations use).
    pub number: Option<f64>,
}

/// The two queues history rows wait in before the history writer moves
/// them into the history in large, key-ordered batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HistoryFeed {
    /// Entity changes (`history.record_changes`): queued in the main
    /// file with the change itself; consumption is a cursor in the
    /// history's file, and consumed entries are pruned later.
    Changes,
    /// QuantumLeap notifications (`POST /v2/notify`): queued in the
    /// history's own file ([`Store::queue_history`]), whose entries are
    /// deleted in the same commit that stores their rows.
    Notifications,
}

/// Which history rows a query wants. Rows come back ordered by entity
/// (id, type), then attribute, then time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HistoryQuery {
    /// Tenant.
    pub tenant: String,
    /// Only entities under this service path: the path itself or a
    /// sub-path, segment-wise (`/a` matches `/a` and `/a/b`, not `/ab`; `/`
    /// matches all), compared exactly. An entity's path is the one its
    /// first stored row came with. `None`: every path.
    pub service_path: Option<String>,
    /// Only these entity ids (any of); empty: all.
    pub entity_ids: Vec<String>,
    /// Only this entity type.
    pub entity_type: Option<String>,
    /// Only these attributes (any of); empty: all.
    pub attrs: Vec<String>,
    /// Only rows at or after this time (epoch ms).
    pub from: Option<i64>,
    /// Only rows at or before this time (epoch ms).
    pub to: Option<i64>,
    /// Only the last N rows (by time) of each (entity, attribute) series,
    /// still returned in ascending time.
    pub last_n: Option<usize>,
    /// Rows skipped per (entity, attribute) series, after `last_n`.
    pub offset: usize,
    /// Most rows returned per (entity, attribute) series (0: none). The
    /// backend caps it at 10,000, QuantumLeap's maximum; the API passes its
    /// `limit` (default 10,000).
    pub limit: usize,
}

/// How values are aggregated (`aggrMethod`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AggrMethod {
    /// Number of rows (any value type).
    Count,
    /// Sum of numeric values.
    Sum,
    /// Mean of numeric values.
    Avg,
    /// Smallest numeric value.
    Min,
    /// Largest numeric value.
    Max,
}

/// The buckets of an aggregation (`aggrPeriod`), in UTC calendar units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AggrPeriod {
    /// Calendar year.
    Year,
    /// Calendar month.
    Month,
    /// Day.
    Day,
    /// Hour.
    Hour,
    /// Minute.
    Minute,
    /// Second.
    Second,
}

/// One aggregated value: a series' rows in one bucket (or the whole
/// range when no period was asked).
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryAggregate {
    /// Entity id.
    pub entity_id: String,
    /// Entity type.
    pub entity_type: String,
    /// Attribute name.
    pub attr: String,
    /// Start of the bucket (epoch ms); with no period, the time of the
    /// series' first row in range.
    pub bucket: i64,
    /// The aggregate (`None` when no row had a numeric value).
    pub value: Option<f64>,
}

/// An entity that has history: what `GET /entities` lists.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryEntity {
    /// Entity id.
    pub entity_id: String,
    /// Entity type.
    pub entity_type: String,
    /// Service path.
    pub service_path: String,
}

/// Durable state of weft. Implementations must be safe to share between
/// tasks and must never block the async runtime (do blocking work on their
/// own threads).
#[async_trait]
pub trait Store: Send + Sync + 'static {
    // --- ingest log -------------------------------------------------------

    /// Appends an uplink to the ingest log and returns its `seq` once the
    /// append has committed. `Err(Overloaded)` when the write queue is full.
    async fn append_uplink(&self, uplink: NewUplink) -> Result<u64>;

    /// The highest committed ingest-log `seq` (0 when empty), updated after
    /// every commit; the pipeline waits on it instead of polling.
    fn committed_seq(&self) -> tokio::sync::watch::Receiver<u64>;

    /// Up to `limit` log entries with `seq >= from_seq`, in `seq` order.
    async fn read_uplinks(&self, from_seq: u64, limit: usize) -> Result<Vec<Uplink>>;

    /// The next `seq` consumer `name` has to process (1 for a new consumer).
    async fn cursor(&self, consumer: &str) -> Result<u64>;

    /// Commits a processed batch and the consumer's cursor atomically. The
    /// batch is shared so a caller can retry it, and publish its units
    /// afterwards, without copying it.
    async fn commit_processed(&self, batch: Arc<ProcessedBatch>) -> Result<CommitOutcome>;

    /// Deletes log entries with `seq < below_seq` received before
    /// `received_before` (epoch ms); returns how many were deleted.
    async fn prune_uplinks(&self, below_seq: u64, received_before: i64) -> Result<u64>;

    // --- device types -----------------------------------------------------

    /// Creates or replaces a device type; `true` if it was created.
    async fn put_device_type(&self, name: &str, device_type: &DeviceType) -> Result<bool>;
    /// One device type.
    async fn get_device_type(&self, name: &str) -> Result<Option<DeviceType>>;
    /// All device types, by name.
    async fn list_device_types(&self) -> Result<Vec<(String, DeviceType)>>;
    /// Deletes a device type; `true` if it existed.
    async fn delete_device_type(&self, name: &str) -> Result<bool>;

    // --- devices ----------------------------------------------------------

    /// Creates or replaces a device (`device.id` is the key); `true` if created.
    async fn put_device(&self, device: &Device) -> Result<bool>;
    /// One device.
    async fn get_device(&self, id: &str) -> Result<Option<Device>>;
    /// Devices matching `filter`, ordered by id.
    async fn list_devices(&self, filter: &DeviceFilter) -> Result<Vec<Device>>;
    /// Deletes a device; `true` if it existed.
    async fn delete_device(&self, id: &str) -> Result<bool>;

    // --- data units -------------------------------------------------------

    /// Stored data units matching `query`, oldest first.
    async fn query_data(&self, query: &DataQuery) -> Result<Vec<StoredUnit>>;
    /// One stored data unit by `dataId`.
    async fn get_data(&self, data_id: &str) -> Result<Option<StoredUnit>>;
    /// Which of `data_ids` are stored as data units: the pipeline drops a
    /// resent unit before it changes anything, not only at its insert.
    async fn stored_data_ids(&self, data_ids: Vec<String>) -> Result<HashSet<String>>;
    /// Failed uplinks matching `query`, oldest first.
    async fn query_failed(&self, query: &FailedQuery) -> Result<Vec<FailedUplink>>;

    // --- NGSI entities -----------------------------------------------------

    /// Creates or replaces an entity (keyed by tenant, service path, id,
    /// type) and queues the history rows of the change in the history feed,
    /// in one transaction: a change is never stored without its history.
    async fn put_entity(&self, record: EntityRecord, history: Vec<HistoryRow>) -> Result<()>;
    /// Deletes an entity; `true` if it existed.
    async fn delete_entity(
        &self,
        tenant: &str,
        service_path: &str,
        id: &str,
        entity_type: &str,
    ) -> Result<bool>;
    /// Every stored entity of every tenant, in creation order (loaded once
    /// at start into the in-memory context).
    async fn load_entities(&self) -> Result<Vec<EntityRecord>>;

    // --- NGSI subscriptions and registrations -------------------------------

    /// Creates or replaces a document (keyed by kind, tenant, id).
    async fn put_document(&self, document: NgsiDocument) -> Result<()>;
    /// Deletes a document; `true` if it existed.
    async fn delete_document(&self, kind: DocumentKind, tenant: &str, id: &str) -> Result<bool>;
    /// Every stored document of `kind`, in creation order.
    async fn load_documents(&self, kind: DocumentKind) -> Result<Vec<NgsiDocument>>;

    // --- history ------------------------------------------------------------

    /// The entries of `feed` after `after` (exclusive), oldest first, at
    /// most about `max_rows` rows (whole entries). Entity changes queue
    /// their rows in the changes feed with the change itself
    /// ([`Store::put_entity`], [`ProcessedBatch::history`]) and
    /// notifications theirs in the notifications feed
    /// ([`Store::queue_history`]); the history writer moves them into the
    /// history in big batches, so neither waits for history inserts and
    /// nothing queued is lost.
    async fn read_history_feed(
        &self,
        feed: HistoryFeed,
        after: u64,
        max_rows: usize,
    ) -> Result<Vec<(u64, Vec<HistoryRow>)>>;
    /// Stores history rows taken from `feed` and, with `through`, marks the
    /// feed consumed that far, in one commit of the history's file. A large
    /// move goes in several calls (only the last with `through`), so
    /// notifications waiting for the same writer are not held up behind it;
    /// a crash between them only repeats idempotent inserts. Answers how
    /// many rows were new.
    async fn append_history_from_feed(
        &self,
        feed: HistoryFeed,
        rows: Vec<HistoryRow>,
        through: Option<u64>,
    ) -> Result<u64>;
    /// How far `feed` has been moved into the history (0: nothing yet, or,
    /// for the notifications feed, whose moved entries are deleted, always).
    async fn history_feed_cursor(&self, feed: HistoryFeed) -> Result<u64>;
    /// Drops changes-feed entries up to `through` (already moved).
    async fn prune_history_feed(&self, through: u64) -> Result<u64>;
    /// Queues notified history rows in the notifications feed; answers the
    /// entry's position once it is durable.
    async fn queue_history(&self, rows: Vec<HistoryRow>) -> Result<u64>;
    /// Stores history rows, ignoring rows already stored with the same
    /// (tenant, entity id, entity type, attribute, time); answered after
    /// the commit. Returns how many rows were new.
    async fn append_history(&self, rows: Vec<HistoryRow>) -> Result<u64>;
    /// Rows matching `query`, ordered by entity, attribute, time.
    async fn query_history(&self, query: &HistoryQuery) -> Result<Vec<HistoryRow>>;
    /// Aggregates of the rows matching `query` (`last_n`, `limit`,
    /// `offset` ignored) per (entity, attribute) and bucket, ordered by
    /// entity, attribute, bucket.
    async fn aggregate_history(
        &self,
        query: &HistoryQuery,
        method: AggrMethod,
        period: Option<AggrPeriod>,
    ) -> Result<Vec<HistoryAggregate>>;
    /// The entities of `tenant` with history (optionally of one type and
    /// under a service-path prefix), ordered by type then id.
    async fn history_entities(
        &self,
        tenant: &str,
        entity_type: Option<&str>,
        service_path: Option<&str>,
    ) -> Result<Vec<HistoryEntity>>;
    /// Deletes the history of one entity (of any type, or of `entity_type`)
    /// or, when `entity_id` is `None`, of every entity of `entity_type`, in
    /// `tenant`; with neither, nothing. Returns the rows deleted. A large
    /// delete may commit in several transactions (appends go on meanwhile);
    /// a failure midway leaves part of it done, which a retry completes.
    async fn delete_history(
        &self,
        tenant: &str,
        entity_id: Option<&str>,
        entity_type: Option<&str>,
    ) -> Result<u64>;
    /// Deletes `tenant`'s history older than the cutoffs (epoch ms): rows
    /// with a time index before `rows_before`, and minute/hour rollup
    /// buckets that end by `rollups_before` (a tenant's retention; rows
    /// going before their rollups is downsampling). Commits in chunks so
    /// appends go on meanwhile; returns what was deleted.
    async fn expire_history(
        &self,
        tenant: &str,
        rows_before: Option<i64>,
        rollups_before: Option<i64>,
    ) -> Result<u64>;
    /// The tenants that have history.
    async fn history_tenants(&self) -> Result<Vec<String>>;

    // --- rules and alarms ---------------------------------------------------

    /// Creates or replaces a rule (its JSON); `true` if it was created.
    async fn put_rule(&self, id: &str, json: String) -> Result<bool>;
    /// Deletes a rule and its per-device state; `true` if it existed.
    async fn delete_rule(&self, id: &str) -> Result<bool>;
    /// Every rule as `(id, json)`, by id.
    async fn load_rules(&self) -> Result<Vec<(String, String)>>;
    /// Every stored per-device rule state.
    async fn load_rule_states(&self) -> Result<Vec<RuleStateRecord>>;
    /// Commits alarms, their events, rule state and the rule engine's
    /// cursor atomically; answers the `seq` of the batch's last event.
    async fn commit_alarms(&self, batch: AlarmBatch) -> Result<u64>;
    /// One alarm's JSON.
    async fn get_alarm(&self, id: &str) -> Result<Option<String>>;
    /// Alarms matching `query`, newest first (JSON).
    async fn query_alarms(&self, query: &AlarmQuery) -> Result<Vec<String>>;
    /// Every active alarm (JSON): loaded once at start by the rule engine.
    async fn active_alarms(&self) -> Result<Vec<String>>;
    /// The `seq` of the newest alarm event (0: none): where a new consumer
    /// of [`Store::alarm_events`] starts.
    async fn alarm_events_head(&self) -> Result<u64>;
    /// The `seq` of the newest stored data unit (0: none): where a new
    /// consumer of stored units starts.
    async fn data_head(&self) -> Result<u64>;
    /// The alarm events stored after `after` (their `seq`, exclusive),
    /// oldest first: a durable feed for consumers that must see every
    /// alarm change (channel bridges).
    async fn alarm_events(&self, after: u64, limit: usize) -> Result<Vec<(u64, String)>>;

    // --- durable channels ---------------------------------------------------

    /// Stores a message in a channel unless its id is already there;
    /// answers its `seq` once committed, or `None` for a duplicate (the
    /// first content is kept).
    async fn publish_message(
        &self,
        channel: &str,
        message_id: &str,
        content: String,
    ) -> Result<Option<u64>>;
    /// Creates a polling subscriber at `cursor` (it receives messages after
    /// it) unless it exists; answers its stored cursor.
    async fn put_channel_subscriber(
        &self,
        channel: &str,
        subscriber: &str,
        cursor: u64,
    ) -> Result<u64>;
    /// Deletes a subscriber; `true` if it existed.
    async fn delete_channel_subscriber(&self, channel: &str, subscriber: &str) -> Result<bool>;
    /// Acknowledges a subscriber's messages up to `through`.
    async fn ack_channel_messages(
        &self,
        channel: &str,
        subscriber: &str,
        through: u64,
    ) -> Result<()>;
    /// Deletes a channel's messages up to `through` (acknowledged by all).
    async fn prune_channel(&self, channel: &str, through: u64) -> Result<u64>;
    /// A channel's messages after `after`, oldest first, at most `limit`.
    async fn channel_messages(
        &self,
        channel: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<ChannelMessage>>;
    /// Every stored subscriber (loaded at start).
    async fn channel_subscribers(&self) -> Result<Vec<ChannelSubscriber>>;
    /// Each channel's highest stored message `seq`, and the highest `seq`
    /// ever handed out (loaded at start).
    async fn channel_heads(&self) -> Result<(Vec<(String, u64)>, u64)>;

    // --- operations -------------------------------------------------------

    /// Commits an empty write through the writer: `Ok` means the store is
    /// writable right now (used by `/health`).
    async fn ping(&self) -> Result<()>;

    /// Stops accepting writes, commits what is queued, and stops the
    /// writer. Later writes fail with `Closed`.
    async fn close(&self);
}

/// Helper for backends: a device's records as the `(label, text)` pairs a
/// [`DeviceFilter`] compares against.
pub fn record_text(records: &Map<String, Value>, label: &str) -> Option<String> {
    records.get(label).map(|v| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    })
}
