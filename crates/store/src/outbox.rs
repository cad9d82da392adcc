//! The notification outbox: every committed entity change that some
//! subscription may owe a notification for, kept (in the same transaction
//! as the change) until every subscription has been served past it, and
//! how far each subscription has been served.
//!
//! The change log is kept per node: each node logs the changes it makes,
//! numbered by its own order of changes (`seq`, strictly increasing per
//! node, with gaps where a change was never committed), and serves its
//! subscriptions from its own log. A cursor `(node, tenant, subscription)`
//! says that every change of that node's log up to `through` has been
//! delivered to the subscription, or never concerned it.

use async_trait::async_trait;

use crate::Result;

/// One committed entity change, as the change log keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedChange {
    /// The node whose log it is in (empty alone).
    pub node: String,
    /// Its place in the node's order of changes.
    pub seq: u64,
    /// Tenant of the entity (empty for the default tenant).
    pub tenant: String,
    /// When it was committed, epoch milliseconds.
    pub at: i64,
    /// The change itself, in the model's log form (opaque bytes to the
    /// store: compressed, so the log costs the writer few pages).
    pub body: Vec<u8>,
}

/// How far one subscription has been served from one node's change log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotificationCursor {
    /// Tenant of the subscription.
    pub tenant: String,
    /// The subscription's id.
    pub subscription: String,
    /// Every change of the log up to this `seq` is done with.
    pub through: u64,
}

/// What [`OutboxStore::change_log_backlog`] answers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Changes still to go through.
    pub changes: u64,
    /// When the oldest of them was committed, epoch ms.
    pub oldest: Option<i64>,
}

/// Most rows one [`OutboxStore::prune_change_log`] deletes, in every
/// backend: the caller repeats while a chunk comes back full, so the
/// writer is never held for long.
pub const CHANGE_LOG_PRUNE_CHUNK: usize = 20_000;

/// The change log and the subscriptions' cursors over it. Changes are
/// appended by the writes that make them
/// ([`ContextStore::put_entity`](crate::ContextStore::put_entity),
/// [`ContextStore::delete_entity`](crate::ContextStore::delete_entity),
/// [`UnitStore::commit_processed`](crate::UnitStore::commit_processed)),
/// in the same transaction.
#[async_trait]
pub trait OutboxStore: Send + Sync {
    /// The highest `seq` in `node`'s log (0 when it is empty), so a
    /// restarted node numbers its changes after those it logged before.
    /// Pruning never removes the last change, so the head survives it.
    async fn change_log_head(&self, node: &str) -> Result<u64>;
    /// Changes of `node`'s log with `after < seq <= through`, of `tenant`
    /// only when given, in `seq` order, at most `limit`.
    async fn read_change_log(
        &self,
        node: &str,
        tenant: Option<&str>,
        after: u64,
        through: u64,
        limit: usize,
    ) -> Result<Vec<LoggedChange>>;
    /// Every node with changes in the log (a dead node's log is served by
    /// another until it comes back).
    async fn change_log_nodes(&self) -> Result<Vec<String>>;
    /// How many changes of `tenant` in `node`'s log come after `after`, and
    /// when the first of them was committed: what a subscription served
    /// from the log has still to go through.
    async fn change_log_backlog(&self, node: &str, tenant: &str, after: u64) -> Result<Backlog>;
    /// Deletes changes of `node`'s log with `seq <= through`, or committed
    /// before `before` (epoch ms: the retention), except the log's last
    /// change; at most [`CHANGE_LOG_PRUNE_CHUNK`] per call. Answers how
    /// many were deleted.
    async fn prune_change_log(&self, node: &str, through: u64, before: i64) -> Result<u64>;
    /// Every cursor over `node`'s log.
    async fn load_notification_cursors(&self, node: &str) -> Result<Vec<NotificationCursor>>;
    /// Creates or moves cursors over `node`'s log, in one transaction.
    async fn save_notification_cursors(
        &self,
        node: &str,
        cursors: Vec<NotificationCursor>,
    ) -> Result<()>;
    /// Forgets a subscription's cursors over every node's log (it was
    /// deleted).
    async fn forget_notification_cursors(&self, tenant: &str, subscription: &str) -> Result<()>;
}
