//! weft's storage seam. Every durable thing goes through the [`Store`]
//! trait so that the pipeline and the API never see SQL, and a PostgreSQL
//! backend can be added without touching them.
//!
//! [`Store`] is the union of one trait per domain, each declared in its
//! own module beside that domain's types (all re-exported here):
//!
//! - [`IngestLogStore`]: the ingest log uplinks wait in for the pipeline.
//! - [`CatalogStore`]: device types and devices.
//! - [`UnitStore`]: what the pipeline made of uplinks (data units,
//!   failures, consumers' cursors).
//! - [`ContextStore`]: NGSI entities and the documents kept beside them.
//! - [`HistoryStore`]: the history feeds and the history.
//! - [`RuleStore`]: rules, rule state, alarms and alarm events.
//! - [`ChannelStore`]: durable pull channels.
//! - [`KeyStore`]: API keys (their hashes, never their secrets).
//! - [`ClusterStore`]: the nodes of a cluster and the leases on the work
//!   done once.
//! - [`DownlinkStore`]: downlink queues and the routes to devices.
//! - [`OutboxStore`]: the change log subscriptions are notified from, and
//!   how far each has been served.
//!
//! A domain's methods need its trait in scope: callers holding a
//! `dyn Store` write `use weft_store::prelude::*;`.
//!
//! - [`sqlite`]: the embedded default (bundled SQLite, WAL, one writer
//!   thread with group commit, a read pool, migrations), laid out the same
//!   way: one module per domain holding its trait's impl and its SQL.
//! - [`postgres`]: PostgreSQL (a pool, group-committing writers, migrations),
//!   laid out the same way; being completed domain by domain.
//!
//! Durability contract: a write method returns only after the transaction
//! holding it has committed. Concurrent writes are batched into one
//! transaction by the backend (group commit), so many small durable writes
//! cost one commit.
#![deny(missing_docs)]

use async_trait::async_trait;

mod alarms;
mod catalog;
mod channels;
pub mod cluster;
#[cfg(test)]
mod conformance;
mod context;
mod downlinks;
mod history;
mod ingest;
mod keys;
mod outbox;
pub mod postgres;
mod rollup;
pub mod sqlite;
mod units;

pub use alarms::{AlarmBatch, AlarmQuery, AlarmRecord, RuleStateRecord, RuleStore};
pub use catalog::{
    device_matches, record_text, search_in_json_text, CatalogStore, DeviceFilter, DevicePage,
    DevicePageQuery, DeviceSummary, DEVICE_EVENTS_KEPT, DEVICE_STATE_KINDS,
};
pub use channels::{ChannelBacklog, ChannelMessage, ChannelStore, ChannelSubscriber, WebhookCalls};
pub use cluster::{ClusterStore, ClusterView, LeaseRecord, NodeInfo, NodeRecord};
pub use context::{ContextStore, DocumentKind, DocumentMerge, EntityRecord, NgsiDocument};
pub use downlinks::{DownlinkStore, FINISHED_DOWNLINKS_KEPT};
pub use history::{
    history_partition, AggrMethod, AggrPeriod, FeedFilter, FeedMove, FeedStateRef,
    HistoryAggregate, HistoryCutoffs, HistoryDelete, HistoryEntity, HistoryFeed, HistoryQuery,
    HistoryRow, HistoryStates, HistoryStore, HISTORY_FEED_CURSOR, STATE_MARKER,
};
pub use ingest::IngestLogStore;
pub use keys::KeyStore;
pub use outbox::{Backlog, LoggedChange, NotificationCursor, OutboxStore, CHANGE_LOG_PRUNE_CHUNK};
pub use units::{
    partition_cursor, CommitOutcome, DataQuery, FailedQuery, ProcessedBatch, StoredUnit,
    UnitRecord, UnitStore, ENTITIES_CURSOR,
};

pub use postgres::{PostgresConfig, PostgresStore};
pub use sqlite::{SqliteConfig, SqliteStore, Synchronous};

/// Most rows one query returns, whatever limit it asks for (QuantumLeap's
/// cap), in every backend.
pub(crate) const MAX_QUERY_ROWS: usize = 10_000;

/// Most history rows one delete or expiry transaction removes, in every
/// backend: the caller repeats while a chunk comes back full, so a large
/// delete never holds the history's writer (and every notify waiting on
/// it) for long.
pub(crate) const HISTORY_DELETE_CHUNK: usize = 50_000;

/// A configuration value's JSON, as every backend stores it.
pub(crate) fn encode<T: serde::Serialize + ?Sized>(what: &str, value: &T) -> Result<String> {
    serde_json::to_string(value).map_err(|e| StoreError::Corrupt(format!("{what}: {e}")))
}

/// `u64` positions as database integers. Positions never come near
/// `i64::MAX`; a caller passing a larger bound ("everything") gets the
/// largest integer instead of an error.
pub(crate) fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Every store trait, for callers holding a `dyn Store`: a domain's
/// methods can only be called with its trait in scope.
pub mod prelude {
    pub use crate::{
        CatalogStore, ChannelStore, ClusterStore, ContextStore, DownlinkStore, HistoryStore,
        IngestLogStore, KeyStore, OutboxStore, RuleStore, Store, UnitStore,
    };
}

/// Errors a store reports. Callers map `Overloaded` to 503 + Retry-After
/// and everything else to 500.
#[derive(Debug, Clone, thiserror::Error)]
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

/// Durable state of weft: every domain's store in one. Implementations
/// must be safe to share between tasks and must never block the async
/// runtime (do blocking work on their own threads).
#[async_trait]
pub trait Store:
    IngestLogStore
    + CatalogStore
    + UnitStore
    + ContextStore
    + HistoryStore
    + RuleStore
    + ChannelStore
    + KeyStore
    + ClusterStore
    + DownlinkStore
    + OutboxStore
    + 'static
{
    /// Commits an empty write through the writer: `Ok` means the store is
    /// writable right now (used by `/health`).
    async fn ping(&self) -> Result<()>;

    /// Stops accepting writes, commits what is queued, and stops the
    /// writer. Later writes fail with `Closed`.
    async fn close(&self);
}
