//! The ingest log: every uplink an ingest endpoint accepted, appended
//! durably before it is acknowledged, and read in `seq` order by the
//! pipeline, which turns it into data units ([`UnitStore`]). Entries are
//! pruned once processed and old enough.
//!
//! [`UnitStore`]: crate::UnitStore

use async_trait::async_trait;
use weft_model::{NewUplink, Uplink};

use crate::Result;

/// The ingest log: the durable queue between the ingest endpoints and the
/// pipeline. An uplink is acknowledged only once its append has committed,
/// so nothing acknowledged is lost before it is processed.
#[async_trait]
pub trait IngestLogStore: Send + Sync {
    /// Appends an uplink to the ingest log and returns its `seq` once the
    /// append has committed. `Err(Overloaded)` when the write queue is full.
    async fn append_uplink(&self, uplink: NewUplink) -> Result<u64>;

    /// The highest committed ingest-log `seq` (0 when empty), updated after
    /// every commit; the pipeline waits on it instead of polling.
    fn committed_seq(&self) -> tokio::sync::watch::Receiver<u64>;

    /// Up to `limit` log entries with `seq >= from_seq`, in `seq` order;
    /// with `partitions`, only the entries of those partitions.
    async fn read_uplinks(
        &self,
        from_seq: u64,
        limit: usize,
        partitions: Option<&[u16]>,
    ) -> Result<Vec<Uplink>>;

    /// How many partitions the pipeline is split into: every node of a
    /// cluster sharing this store splits it alike. 1 for a store only one
    /// process opens.
    fn partitions(&self) -> u16 {
        1
    }

    /// Deletes log entries with `seq < below_seq` received before
    /// `received_before` (epoch ms); returns how many were deleted.
    async fn prune_uplinks(&self, below_seq: u64, received_before: i64) -> Result<u64>;
}
