//! What the store keeps for durable pull channels (the DSPS API): the
//! messages of each channel, deduplicated by message id, and each polling
//! subscriber with its acknowledgement cursor. They live in a file of
//! their own (`<name>-channels.db`), so a publish's 200 waits only for
//! that file's commit.

use async_trait::async_trait;

use crate::Result;

/// One stored message of a channel.
#[derive(Debug, Clone, PartialEq)]
pub struct ChannelMessage {
    /// Its position: unique across channels and increasing in publish
    /// order, so within a channel it is the delivery order, and an
    /// acknowledgement is "everything up to this position".
    pub seq: u64,
    /// The publisher's id (unique within the channel).
    pub message_id: String,
    /// The JSON content, as published.
    pub content: String,
}

/// A polling subscriber as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct ChannelSubscriber {
    /// Channel id.
    pub channel: String,
    /// Subscriber id.
    pub subscriber: String,
    /// Messages up to this `seq` are acknowledged (or were published
    /// before the subscriber existed).
    pub cursor: u64,
}

/// How far behind a subscriber is: what the console's and the channel
/// listing's backlog figures are made of.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChannelBacklog {
    /// Stored messages after the subscriber's cursor: not yet acknowledged.
    pub messages: u64,
    /// When the oldest of them was published (epoch ms); `None` when there
    /// are none.
    pub oldest_published_at: Option<i64>,
}

/// The webhook calls a message owes when it is new, queued in the
/// transaction that stores it so none is lost across a crash: the node
/// that sends them, and each call in the sender's form (opaque to the
/// store).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WebhookCalls {
    /// The node that queued them and sends them (empty alone).
    pub node: String,
    /// The calls.
    pub calls: Vec<String>,
}

/// Durable pull channels: messages kept until every subscriber has
/// acknowledged them, the subscribers' cursors, and the webhook calls
/// new messages owe.
#[async_trait]
pub trait ChannelStore: Send + Sync {
    /// Stores a message in a channel unless its id is already there;
    /// answers its `seq` once committed, or `None` for a duplicate (the
    /// first content is kept).
    async fn publish_message(
        &self,
        channel: &str,
        message_id: &str,
        content: String,
        webhooks: WebhookCalls,
    ) -> Result<Option<u64>>;
    /// The webhook calls `node` queued with messages (in
    /// [`ChannelStore::publish_message`]) that are not finished, after
    /// `after`, in order, at most `limit`: `(seq, call)`.
    async fn pending_webhook_calls(
        &self,
        node: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(u64, String)>>;
    /// Forgets webhook call `seq`: it was delivered, or gave up.
    async fn finish_webhook_call(&self, seq: u64) -> Result<()>;
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
    /// The channel's stored messages after `after` — a subscriber's backlog
    /// when `after` is its cursor: how many, and when the oldest was
    /// published. A range of the `(channel, seq)` index: it costs one index
    /// entry per message counted, never a look at other channels.
    async fn channel_backlog(&self, channel: &str, after: u64) -> Result<ChannelBacklog>;
    /// Every stored subscriber (loaded at start).
    async fn channel_subscribers(&self) -> Result<Vec<ChannelSubscriber>>;
    /// Each channel's highest stored message `seq`, and the highest `seq`
    /// ever handed out (loaded at start).
    async fn channel_heads(&self) -> Result<(Vec<(String, u64)>, u64)>;

    // What several nodes sharing the channels read from the store rather
    // than from their own memory, which only sees their own requests.

    /// One subscriber's stored cursor; `None` when it does not exist
    /// (never created, deleted, or expired through another node).
    async fn channel_subscriber(&self, channel: &str, subscriber: &str) -> Result<Option<u64>>;
    /// The channel's highest stored message `seq` (0: none).
    async fn channel_head(&self, channel: &str) -> Result<u64>;
    /// The lowest cursor of the channel's stored subscribers (`None`:
    /// none): every subscriber has acknowledged the messages up to it.
    async fn channel_floor(&self, channel: &str) -> Result<Option<u64>>;
    /// Records that `(channel, subscriber)`s were active at `at` (epoch
    /// ms), so that no node expires a subscriber another node serves
    /// ([`ChannelStore::expire_channel_subscribers`]). A store only one
    /// process opens keeps activity in that process's memory: nothing to
    /// do.
    async fn touch_channel_subscribers(
        &self,
        _active: Vec<(String, String)>,
        _at: i64,
    ) -> Result<()> {
        Ok(())
    }
    /// Deletes the subscribers last active (created, touched) before
    /// `idle_before` (epoch ms); answers them as `(channel, subscriber)`.
    /// A store only one process opens expires in memory: none here.
    async fn expire_channel_subscribers(&self, _idle_before: i64) -> Result<Vec<(String, String)>> {
        Ok(Vec::new())
    }
}
