//! Downlink queues: per device, the downlinks waiting to be sent and the
//! last ones that were (or could not be), and the route each device's
//! uplinks came through. The API queues, replaces, lists and flushes; the
//! pipeline's delivery worker claims what is due and records each
//! attempt's outcome.
//!
//! Claiming is how several weft processes share one queue: a claim moves
//! a downlink's next attempt past a lease, in the same statement that
//! reads it, so no other worker takes it while it is being sent.

use async_trait::async_trait;
use weft_model::{Downlink, DownlinkRoute};

use crate::Result;

/// Finished downlinks (sent, failed, expired) kept per device for the
/// list to show; older ones are deleted as newer ones finish, so a chatty
/// device's history cannot grow without bound.
pub const FINISHED_DOWNLINKS_KEPT: usize = 50;

/// Where downlink queues and device routes are kept.
#[async_trait]
pub trait DownlinkStore: Send + Sync {
    /// Queues `downlinks` (all for `device_id`, in order) after the
    /// device's open ones, or with `replace` instead of them: the open ones
    /// are deleted in the same transaction. Answers the open downlinks the
    /// replace deleted.
    async fn queue_downlinks(
        &self,
        device_id: &str,
        downlinks: &[Downlink],
        replace: bool,
    ) -> Result<Vec<Downlink>>;
    /// The device's downlinks, open and kept finished ones, oldest first.
    async fn list_downlinks(&self, device_id: &str) -> Result<Vec<Downlink>>;
    /// Deletes the device's open downlinks and answers them.
    async fn flush_downlinks(&self, device_id: &str) -> Result<Vec<Downlink>>;
    /// Up to `limit` open downlinks whose next attempt is due at `now`,
    /// earliest first; each is leased to the caller until `lease_until`
    /// (no other claim returns it before then).
    async fn claim_due_downlinks(
        &self,
        now: i64,
        lease_until: i64,
        limit: usize,
    ) -> Result<Vec<Downlink>>;
    /// When the earliest open downlink is due (epoch ms), if any: a read,
    /// so an idle worker polls without writing.
    async fn next_downlink_due(&self) -> Result<Option<i64>>;
    /// Stores a downlink's new state (by id) if it is still open; `false`
    /// when it was flushed or replaced meanwhile. A downlink that finishes
    /// makes room: the device's oldest finished ones beyond
    /// [`FINISHED_DOWNLINKS_KEPT`] are deleted.
    async fn update_downlink(&self, downlink: &Downlink) -> Result<bool>;
    /// Makes the device's pending downlinks due at `now` (its route
    /// changed, so they may have a way out); answers how many.
    async fn wake_pending_downlinks(&self, device_id: &str, now: i64) -> Result<u64>;
    /// Records how the device's uplinks arrive, replacing what was known.
    async fn put_downlink_route(&self, device_id: &str, route: &DownlinkRoute) -> Result<()>;
    /// How the device's uplinks last arrived, if weft has seen any.
    async fn downlink_route(&self, device_id: &str) -> Result<Option<DownlinkRoute>>;
}
