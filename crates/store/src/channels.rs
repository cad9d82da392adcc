//! What the store keeps for durable pull channels (the DSPS API): the
//! messages of each channel, deduplicated by message id, and each polling
//! subscriber with its acknowledgement cursor. They live in a file of
//! their own (`<name>-channels.db`), so a publish's 200 waits only for
//! that file's commit.

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
