//! [`ChannelStore`] on the channels file (schema step 8): messages by
//! (channel, seq) with a unique (channel, message id) for deduplication,
//! and subscribers with their cursors.

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension};

use super::{to_i64, Db, SqliteStore};
use crate::{
    ChannelBacklog, ChannelMessage, ChannelStore, ChannelSubscriber, Result, WebhookCalls,
};

#[async_trait]
impl ChannelStore for SqliteStore {
    async fn publish_message(
        &self,
        channel: &str,
        message_id: &str,
        content: String,
        webhooks: WebhookCalls,
    ) -> Result<Option<u64>> {
        let (channel, message_id) = (channel.to_string(), message_id.to_string());
        self.channels
            .write(move |c| {
                let seq = publish(c, &channel, &message_id, &content, weft_model::now_ms())?;
                if seq.is_some() {
                    let mut stmt = c.prepare_cached(
                        "INSERT INTO channel_webhooks (node, call) VALUES (?1, ?2)",
                    )?;
                    for call in &webhooks.calls {
                        stmt.execute((&webhooks.node, call))?;
                    }
                }
                Ok::<_, rusqlite::Error>(seq)
            })
            .await
    }

    async fn pending_webhook_calls(
        &self,
        node: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(u64, String)>> {
        let node = node.to_string();
        self.channels
            .read(move |c| {
                let mut stmt = c
                    .prepare_cached(
                        "SELECT seq, call FROM channel_webhooks WHERE node = ?1 AND seq > ?2 \
                         ORDER BY seq LIMIT ?3",
                    )
                    .db()?;
                let mut rows = stmt
                    .query((
                        &node,
                        to_i64(after),
                        i64::try_from(limit).unwrap_or(i64::MAX),
                    ))
                    .db()?;
                let mut out = Vec::new();
                while let Some(row) = rows.next().db()? {
                    out.push((row.get::<_, i64>(0).db()? as u64, row.get(1).db()?));
                }
                Ok(out)
            })
            .await
    }

    async fn finish_webhook_call(&self, seq: u64) -> Result<()> {
        self.channels
            .write(move |c| {
                c.prepare_cached("DELETE FROM channel_webhooks WHERE seq = ?1")
                    .and_then(|mut st| st.execute([to_i64(seq)]))
                    .map(|_| ())
            })
            .await
    }

    async fn put_channel_subscriber(
        &self,
        channel: &str,
        subscriber: &str,
        cursor: u64,
    ) -> Result<u64> {
        let (channel, subscriber) = (channel.to_string(), subscriber.to_string());
        self.channels
            .write(move |c| subscribe(c, &channel, &subscriber, cursor))
            .await
    }

    async fn delete_channel_subscriber(&self, channel: &str, subscriber: &str) -> Result<bool> {
        let (channel, subscriber) = (channel.to_string(), subscriber.to_string());
        self.channels
            .write(move |c| unsubscribe(c, &channel, &subscriber))
            .await
    }

    async fn ack_channel_messages(
        &self,
        channel: &str,
        subscriber: &str,
        through: u64,
    ) -> Result<()> {
        let (channel, subscriber) = (channel.to_string(), subscriber.to_string());
        self.channels
            .write(move |c| ack(c, &channel, &subscriber, through))
            .await
    }

    async fn prune_channel(&self, channel: &str, through: u64) -> Result<u64> {
        let channel = channel.to_string();
        self.channels
            .write(move |c| prune(c, &channel, through))
            .await
    }

    async fn channel_messages(
        &self,
        channel: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<ChannelMessage>> {
        let channel = channel.to_string();
        self.channels
            .read(move |c| messages(c, &channel, after, limit))
            .await
    }

    async fn channel_backlog(&self, channel: &str, after: u64) -> Result<ChannelBacklog> {
        let channel = channel.to_string();
        self.channels
            .read(move |c| backlog(c, &channel, after))
            .await
    }

    async fn channel_subscribers(&self) -> Result<Vec<ChannelSubscriber>> {
        self.channels.read(subscribers).await
    }

    async fn channel_heads(&self) -> Result<(Vec<(String, u64)>, u64)> {
        self.channels.read(heads).await
    }

    async fn channel_subscriber(&self, channel: &str, subscriber: &str) -> Result<Option<u64>> {
        let (channel, subscriber) = (channel.to_string(), subscriber.to_string());
        self.channels
            .read(move |c| {
                c.query_row(
                    "SELECT cursor FROM channel_subscribers WHERE channel = ?1 AND subscriber = ?2",
                    (&channel, &subscriber),
                    |r| r.get::<_, i64>(0),
                )
                .optional()
                .db()
                .map(|c| c.map(|c| c as u64))
            })
            .await
    }

    async fn channel_head(&self, channel: &str) -> Result<u64> {
        let channel = channel.to_string();
        self.channels
            .read(move |c| {
                c.query_row(
                    "SELECT COALESCE(MAX(seq), 0) FROM channel_messages WHERE channel = ?1",
                    [&channel],
                    |r| r.get::<_, i64>(0),
                )
                .db()
                .map(|h| h as u64)
            })
            .await
    }

    async fn channel_floor(&self, channel: &str) -> Result<Option<u64>> {
        let channel = channel.to_string();
        self.channels
            .read(move |c| {
                c.query_row(
                    "SELECT MIN(cursor) FROM channel_subscribers WHERE channel = ?1",
                    [&channel],
                    |r| r.get::<_, Option<i64>>(0),
                )
                .db()
                .map(|f| f.map(|f| f as u64))
            })
            .await
    }
}

/// Stores a message unless its id is already stored in the channel;
/// answers its new `seq`, or `None` for a duplicate. The `NOT EXISTS`
/// keeps a duplicate from drawing a `seq`: `INSERT OR IGNORE` alone would
/// advance the `AUTOINCREMENT` counter for the row it then drops.
fn publish(
    conn: &Connection,
    channel: &str,
    message_id: &str,
    content: &str,
    now: i64,
) -> rusqlite::Result<Option<u64>> {
    let inserted = conn
        .prepare_cached(
            "INSERT INTO channel_messages (channel, message_id, content, published_at) \
             SELECT ?1, ?2, ?3, ?4 WHERE NOT EXISTS (SELECT 1 FROM channel_messages \
                 WHERE channel = ?1 AND message_id = ?2)",
        )?
        .execute((channel, message_id, content, now))?;
    Ok((inserted == 1).then(|| conn.last_insert_rowid() as u64))
}

/// Creates a subscriber at `cursor` unless it exists; answers its cursor
/// (the stored one if it existed).
fn subscribe(
    conn: &Connection,
    channel: &str,
    subscriber: &str,
    cursor: u64,
) -> rusqlite::Result<u64> {
    conn.prepare_cached(
        "INSERT OR IGNORE INTO channel_subscribers (channel, subscriber, cursor) VALUES (?1, ?2, ?3)",
    )?
    .execute((channel, subscriber, to_i64(cursor)))?;
    conn.prepare_cached(
        "SELECT cursor FROM channel_subscribers WHERE channel = ?1 AND subscriber = ?2",
    )?
    .query_row((channel, subscriber), |r| r.get::<_, i64>(0))
    .map(|c| c as u64)
}

/// Deletes a subscriber; answers whether it existed.
fn unsubscribe(conn: &Connection, channel: &str, subscriber: &str) -> rusqlite::Result<bool> {
    Ok(conn
        .prepare_cached("DELETE FROM channel_subscribers WHERE channel = ?1 AND subscriber = ?2")?
        .execute((channel, subscriber))?
        > 0)
}

/// Moves a subscriber's cursor forward to `through` (never back).
fn ack(conn: &Connection, channel: &str, subscriber: &str, through: u64) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "UPDATE channel_subscribers SET cursor = max(cursor, ?3) \
         WHERE channel = ?1 AND subscriber = ?2",
    )?
    .execute((channel, subscriber, to_i64(through)))?;
    Ok(())
}

/// Deletes the channel's messages up to `through`.
fn prune(conn: &Connection, channel: &str, through: u64) -> rusqlite::Result<u64> {
    Ok(conn
        .prepare_cached("DELETE FROM channel_messages WHERE channel = ?1 AND seq <= ?2")?
        .execute((channel, to_i64(through)))? as u64)
}

/// The channel's messages after `after`, oldest first, at most `limit`.
fn messages(
    conn: &Connection,
    channel: &str,
    after: u64,
    limit: usize,
) -> Result<Vec<ChannelMessage>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT seq, message_id, content FROM channel_messages \
             WHERE channel = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
        )
        .db()?;
    let rows = stmt
        .query_map((channel, to_i64(after), limit as i64), |r| {
            Ok(ChannelMessage {
                seq: r.get::<_, i64>(0)? as u64,
                message_id: r.get(1)?,
                content: r.get(2)?,
            })
        })
        .db()?;
    rows.collect::<rusqlite::Result<_>>().db()
}

/// The channel's messages after `after`: their count, a range of the
/// `(channel, seq)` index (the count reads no table row), and the oldest
/// one's publication time, one probe of the same range.
fn backlog(conn: &Connection, channel: &str, after: u64) -> Result<ChannelBacklog> {
    let (messages, oldest_published_at): (i64, Option<i64>) = conn
        .prepare_cached(
            "SELECT (SELECT COUNT(*) FROM channel_messages WHERE channel = ?1 AND seq > ?2), \
                    (SELECT published_at FROM channel_messages \
                     WHERE channel = ?1 AND seq > ?2 ORDER BY seq LIMIT 1)",
        )
        .db()?
        .query_row((channel, to_i64(after)), |r| Ok((r.get(0)?, r.get(1)?)))
        .db()?;
    Ok(ChannelBacklog {
        messages: messages as u64,
        oldest_published_at,
    })
}

/// Every subscriber.
fn subscribers(conn: &Connection) -> Result<Vec<ChannelSubscriber>> {
    let mut stmt = conn
        .prepare_cached("SELECT channel, subscriber, cursor FROM channel_subscribers")
        .db()?;
    let rows = stmt
        .query_map([], |r| {
            Ok(ChannelSubscriber {
                channel: r.get(0)?,
                subscriber: r.get(1)?,
                cursor: r.get::<_, i64>(2)? as u64,
            })
        })
        .db()?;
    rows.collect::<rusqlite::Result<_>>().db()
}

/// Each channel's highest stored `seq`, and the highest `seq` ever handed
/// out (AUTOINCREMENT's counter survives deletes).
fn heads(conn: &Connection) -> Result<(Vec<(String, u64)>, u64)> {
    let mut stmt = conn
        .prepare_cached("SELECT channel, MAX(seq) FROM channel_messages GROUP BY channel")
        .db()?;
    let rows = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get::<_, i64>(1)? as u64)))
        .db()?;
    let heads = rows.collect::<rusqlite::Result<Vec<_>>>().db()?;
    let top: i64 = conn
        .query_row(
            "SELECT COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'channel_messages'), 0)",
            [],
            |r| r.get(0),
        )
        .db()?;
    Ok((heads, top as u64))
}
