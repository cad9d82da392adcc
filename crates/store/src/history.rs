//! The history: every recorded value of every entity attribute over time
//! (what QuantumLeap's API serves), and the two feeds that rows wait in
//! before the history writer moves them in, in large batches.

use async_trait::async_trait;

use crate::Result;

/// Name of the cursor (in the history's file) recording how far the
/// history feed has been moved into the history.
pub const HISTORY_FEED_CURSOR: &str = "history_feed";

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
    /// history's own file ([`HistoryStore::queue_history`]), whose entries
    /// are deleted in the same commit that stores their rows.
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

/// What one tenant's retention expires at one moment, for
/// [`HistoryStore::expire_history`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HistoryCutoffs {
    /// Tenant.
    pub tenant: String,
    /// Rows with a time index before this (epoch ms) are deleted; `None`:
    /// rows are kept.
    pub rows_before: Option<i64>,
    /// Minute and hour rollup buckets that end by this (epoch ms) are
    /// deleted; `None`: rollups are kept. Rows going before their rollups
    /// is downsampling.
    pub rollups_before: Option<i64>,
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

/// The history and its feeds: entity changes and notifications queue their
/// rows in a feed, the history writer moves them into the history, and
/// QuantumLeap's API queries, aggregates and deletes it.
#[async_trait]
pub trait HistoryStore: Send + Sync {
    /// The entries of `feed` after `after` (exclusive), oldest first, at
    /// most about `max_rows` rows (whole entries). Entity changes queue
    /// their rows in the changes feed with the change itself
    /// ([`ContextStore::put_entity`](crate::ContextStore::put_entity),
    /// [`ProcessedBatch::history`](crate::ProcessedBatch::history)) and
    /// notifications theirs in the notifications feed
    /// ([`HistoryStore::queue_history`]); the history writer moves them into
    /// the history in big batches, so neither waits for history inserts and
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
    /// Deletes each listed tenant's history older than its cutoffs
    /// ([`HistoryCutoffs`]); tenants not listed keep everything. All
    /// tenants come in one call so that a backend storing time ranges of
    /// every tenant together (PostgreSQL's weekly partitions) can drop a
    /// range whole when no tenant with rows in it keeps them, and delete
    /// row by row only what is left. Commits in chunks so appends go on
    /// meanwhile; returns how many rows and rollup buckets were deleted.
    async fn expire_history(&self, cutoffs: &[HistoryCutoffs]) -> Result<u64>;
    /// The tenants that have history.
    async fn history_tenants(&self) -> Result<Vec<String>>;
}
