//! Durable pull channels on PostgreSQL: the SQLite backend's
//! `sqlite/channels.rs` in PostgreSQL's dialect. Writes go through the
//! channels writer, the one that hands out message `seq`s, so a node's
//! messages commit in `seq` order; every node's channels writer publishes
//! side by side, and subscribers read up to the messages' horizon
//! ([`PUBLISHED`]), so one acknowledging up to a `seq` never skips one
//! another node commits later.

use async_trait::async_trait;

use super::horizon::{followed, Followed};

/// The channel messages as every node's channels writer appends them
/// (`postgres/horizon.rs`): a subscriber reads only up to their horizon,
/// once past every `seq` handed out before it read, so a message published
/// through one node before a fetch through another is in that fetch.
/// Writers and looks take, shared, the lock older versions of weft took
/// exclusively around each publish ("weft_chn"), so an older node's
/// publishes are never in flight beside a look during an upgrade. Looked
/// at only when a subscriber reads.
pub(super) const PUBLISHED: Followed = followed! {
    name: "channel messages",
    writer: "weft channels writer",
    lock: 8603115516229119598,
    tables: ["channel_messages"],
    on_demand: true
};

use super::schema::db;
use super::writer::param;
use super::{to_i64, PostgresStore};
use crate::{
    ChannelBacklog, ChannelMessage, ChannelStore, ChannelSubscriber, Result, WebhookCalls,
};

#[async_trait]
impl ChannelStore for PostgresStore {
    async fn publish_message(
        &self,
        channel: &str,
        message_id: &str,
        content: String,
        webhooks: WebhookCalls,
    ) -> Result<Option<u64>> {
        let (channel, message_id) = (channel.to_string(), message_id.to_string());
        let now = weft_model::now_ms();
        self.channels
            .write(move |c| {
                Box::pin(async move {
                    // The `NOT EXISTS` keeps a duplicate from drawing a
                    // `seq` (`ON CONFLICT` alone would burn one), as
                    // SQLite's insert does; one published through two
                    // nodes at once may burn one, which no reader misses.
                    let row = c
                        .query_opt(
                            "INSERT INTO channel_messages \
                                 (channel, message_id, content, published_at) \
                             SELECT $1, $2, $3, $4 WHERE NOT EXISTS (SELECT 1 \
                                 FROM channel_messages WHERE channel = $1 AND message_id = $2) \
                             ON CONFLICT (channel, message_id) DO NOTHING RETURNING seq",
                            &[&channel, &message_id, &content, &now],
                        )
                        .await
                        .map_err(db)?;
                    let seq = row.map(|r| r.get::<_, i64>(0) as u64);
                    if seq.is_some() && !webhooks.calls.is_empty() {
                        c.execute(
                            "INSERT INTO channel_webhooks (node, call) \
                             SELECT $1, call FROM UNNEST($2::TEXT[]) WITH ORDINALITY AS u(call, i) \
                             ORDER BY i",
                            &[&webhooks.node, &webhooks.calls],
                        )
                        .await
                        .map_err(db)?;
                    }
                    Ok(seq)
                })
            })
            .await
    }

    async fn pending_webhook_calls(
        &self,
        node: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(u64, String)>> {
        let client = self.reader().await?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = client
            .query(
                "SELECT seq, call FROM channel_webhooks WHERE node = $1 AND seq > $2 \
                 ORDER BY seq LIMIT $3",
                &[&node, &to_i64(after), &limit],
            )
            .await
            .map_err(db)?;
        Ok(rows
            .iter()
            .map(|r| (r.get::<_, i64>(0) as u64, r.get(1)))
            .collect())
    }

    async fn finish_webhook_call(&self, seq: u64) -> Result<()> {
        self.channels
            .execute(
                "DELETE FROM channel_webhooks WHERE seq = $1",
                vec![param(to_i64(seq))],
            )
            .await
            .map(|_| ())
    }

    async fn put_channel_subscriber(
        &self,
        channel: &str,
        subscriber: &str,
        cursor: u64,
    ) -> Result<u64> {
        let (channel, subscriber) = (channel.to_string(), subscriber.to_string());
        let cursor = to_i64(cursor);
        self.channels
            .write(move |c| {
                Box::pin(async move {
                    c.execute(
                        "INSERT INTO channel_subscribers (channel, subscriber, cursor, active_at) \
                         VALUES ($1, $2, $3, $4) ON CONFLICT (channel, subscriber) \
                         DO UPDATE SET active_at = excluded.active_at",
                        &[&channel, &subscriber, &cursor, &weft_model::now_ms()],
                    )
                    .await
                    .map_err(db)?;
                    let row = c
                        .query_one(
                            "SELECT cursor FROM channel_subscribers \
                             WHERE channel = $1 AND subscriber = $2",
                            &[&channel, &subscriber],
                        )
                        .await
                        .map_err(db)?;
                    Ok(row.get::<_, i64>(0) as u64)
                })
            })
            .await
    }

    async fn delete_channel_subscriber(&self, channel: &str, subscriber: &str) -> Result<bool> {
        let n = self
            .channels
            .execute(
                "DELETE FROM channel_subscribers WHERE channel = $1 AND subscriber = $2",
                vec![param(channel.to_string()), param(subscriber.to_string())],
            )
            .await?;
        Ok(n > 0)
    }

    async fn ack_channel_messages(
        &self,
        channel: &str,
        subscriber: &str,
        through: u64,
    ) -> Result<()> {
        // Forward only: a late, smaller ack never moves it back.
        self.channels
            .execute(
                "UPDATE channel_subscribers SET cursor = GREATEST(cursor, $3) \
                 WHERE channel = $1 AND subscriber = $2",
                vec![
                    param(channel.to_string()),
                    param(subscriber.to_string()),
                    param(to_i64(through)),
                ],
            )
            .await?;
        Ok(())
    }

    async fn prune_channel(&self, channel: &str, through: u64) -> Result<u64> {
        self.channels
            .execute(
                "DELETE FROM channel_messages WHERE channel = $1 AND seq <= $2",
                vec![param(channel.to_string()), param(to_i64(through))],
            )
            .await
    }

    async fn channel_messages(
        &self,
        channel: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<ChannelMessage>> {
        let through = self.published_horizon().await;
        let client = self.reader().await?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = client
            .query(
                "SELECT seq, message_id, content FROM channel_messages \
                 WHERE channel = $1 AND seq > $2 AND seq <= $4 ORDER BY seq LIMIT $3",
                &[&channel, &to_i64(after), &limit, &to_i64(through)],
            )
            .await
            .map_err(db)?;
        Ok(rows
            .iter()
            .map(|r| ChannelMessage {
                seq: r.get::<_, i64>(0) as u64,
                message_id: r.get(1),
                content: r.get(2),
            })
            .collect())
    }

    async fn channel_backlog(&self, channel: &str, after: u64) -> Result<ChannelBacklog> {
        // Two ranges of the (channel, seq) index in one round trip: a
        // count (index-only once the table is vacuumed) and the first
        // entry's row for its time.
        let client = self.reader().await?;
        let row = client
            .query_one(
                "SELECT (SELECT COUNT(*) FROM channel_messages WHERE channel = $1 AND seq > $2), \
                        (SELECT published_at FROM channel_messages \
                         WHERE channel = $1 AND seq > $2 ORDER BY seq LIMIT 1)",
                &[&channel, &to_i64(after)],
            )
            .await
            .map_err(db)?;
        Ok(ChannelBacklog {
            messages: row.get::<_, i64>(0) as u64,
            oldest_published_at: row.get(1),
        })
    }

    async fn channel_subscribers(&self) -> Result<Vec<ChannelSubscriber>> {
        let client = self.reader().await?;
        let rows = client
            .query(
                "SELECT channel, subscriber, cursor FROM channel_subscribers",
                &[],
            )
            .await
            .map_err(db)?;
        Ok(rows
            .iter()
            .map(|r| ChannelSubscriber {
                channel: r.get(0),
                subscriber: r.get(1),
                cursor: r.get::<_, i64>(2) as u64,
            })
            .collect())
    }

    async fn channel_heads(&self) -> Result<(Vec<(String, u64)>, u64)> {
        let through = self.published_horizon().await;
        let client = self.reader().await?;
        let heads = client
            .query(
                "SELECT channel, MAX(seq) FROM channel_messages WHERE seq <= $1 GROUP BY channel",
                &[&to_i64(through)],
            )
            .await
            .map_err(db)?
            .iter()
            .map(|r| (r.get(0), r.get::<_, i64>(1) as u64))
            .collect();
        // The identity's sequence survives deletes, like SQLite's
        // AUTOINCREMENT counter (NULL until it handed out a first value).
        // It can be ahead of every stored `seq` when a transaction that
        // drew one rolled back: that `seq` was handed out, to no message.
        let top: i64 = client
            .query_one(
                "SELECT COALESCE(pg_sequence_last_value( \
                     pg_get_serial_sequence('channel_messages', 'seq')::regclass), 0)",
                &[],
            )
            .await
            .map_err(db)?
            .get(0);
        Ok((heads, top as u64))
    }

    async fn channel_subscriber(&self, channel: &str, subscriber: &str) -> Result<Option<u64>> {
        let client = self.reader().await?;
        let row = client
            .query_opt(
                "SELECT cursor FROM channel_subscribers WHERE channel = $1 AND subscriber = $2",
                &[&channel, &subscriber],
            )
            .await
            .map_err(db)?;
        Ok(row.map(|r| r.get::<_, i64>(0) as u64))
    }

    async fn channel_head(&self, channel: &str) -> Result<u64> {
        let through = self.published_horizon().await;
        let client = self.reader().await?;
        let row = client
            .query_one(
                "SELECT COALESCE(MAX(seq), 0) FROM channel_messages \
                 WHERE channel = $1 AND seq <= $2",
                &[&channel, &to_i64(through)],
            )
            .await
            .map_err(db)?;
        Ok(row.get::<_, i64>(0) as u64)
    }

    async fn channel_floor(&self, channel: &str) -> Result<Option<u64>> {
        let client = self.reader().await?;
        let row = client
            .query_one(
                "SELECT MIN(cursor) FROM channel_subscribers WHERE channel = $1",
                &[&channel],
            )
            .await
            .map_err(db)?;
        Ok(row.get::<_, Option<i64>>(0).map(|f| f as u64))
    }

    async fn touch_channel_subscribers(
        &self,
        active: Vec<(String, String)>,
        at: i64,
    ) -> Result<()> {
        if active.is_empty() {
            return Ok(());
        }
        // In one order on every node: two nodes' sweepers touching the
        // same subscribers lock their rows alike, and never deadlock.
        let mut active = active;
        active.sort_unstable();
        let (channels, subscribers): (Vec<String>, Vec<String>) = active.into_iter().unzip();
        self.channels
            .execute(
                "UPDATE channel_subscribers s SET active_at = GREATEST(s.active_at, $3) \
                 FROM UNNEST($1::TEXT[], $2::TEXT[]) AS t(channel, subscriber) \
                 WHERE s.channel = t.channel AND s.subscriber = t.subscriber",
                vec![param(channels), param(subscribers), param(at)],
            )
            .await?;
        Ok(())
    }

    async fn expire_channel_subscribers(&self, idle_before: i64) -> Result<Vec<(String, String)>> {
        self.channels
            .write(move |c| {
                Box::pin(async move {
                    let rows = c
                        .query(
                            "DELETE FROM channel_subscribers WHERE active_at < $1 \
                             RETURNING channel, subscriber",
                            &[&idle_before],
                        )
                        .await
                        .map_err(db)?;
                    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
                })
            })
            .await
    }
}
