//! [`OutboxStore`] on PostgreSQL: not there yet (the change log is kept
//! on SQLite only); every read answers nothing.

use async_trait::async_trait;

use super::PostgresStore;
use crate::{LoggedChange, NotificationCursor, OutboxStore, Result};

#[async_trait]
impl OutboxStore for PostgresStore {
    async fn change_log_head(&self, _node: &str) -> Result<u64> {
        Ok(0)
    }

    async fn read_change_log(
        &self,
        _node: &str,
        _tenant: Option<&str>,
        _after: u64,
        _through: u64,
        _limit: usize,
    ) -> Result<Vec<LoggedChange>> {
        Ok(Vec::new())
    }

    async fn prune_change_log(&self, _node: &str, _through: u64, _before: i64) -> Result<u64> {
        Ok(0)
    }

    async fn load_notification_cursors(&self, _node: &str) -> Result<Vec<NotificationCursor>> {
        Ok(Vec::new())
    }

    async fn save_notification_cursors(
        &self,
        _node: &str,
        _cursors: Vec<NotificationCursor>,
    ) -> Result<()> {
        Ok(())
    }

    async fn forget_notification_cursors(&self, _tenant: &str, _subscription: &str) -> Result<()> {
        Ok(())
    }
}
