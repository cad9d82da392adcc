//! What the channels hold, for operators: every channel by name, its
//! polling subscribers, and how far behind each one is (its backlog: the
//! messages it has not acknowledged, and how old the oldest of them is).
//! DSPS's own API has no such listing; weft's `/api/v1/channels` and the
//! console's Channels screen read it from here.
//!
//! Names, subscribers, cursors and last activity come from memory (this
//! node's view, as everything in [`super`]); the backlog figures from the
//! store, one range of its `(channel, seq)` index per distinct cursor of
//! the channels asked for — never a scan of other channels' messages.
//! Channels whose subscribers are all caught up (their cursor at the
//! channel's head, known in memory) cost no query at all.
//!
//! The sweeper publishes the total as gauges as well
//! (`weft_channel_backlog_messages`, `weft_channel_oldest_unacked_seconds`),
//! which the console's overview reads.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use weft_store::{ChannelBacklog, StoreError};

use super::{Channel, Channels};

/// One polling subscriber in a listing.
#[derive(Debug, Clone, PartialEq)]
pub struct SubscriberView {
    /// Its id.
    pub id: String,
    /// Messages up to this position are acknowledged.
    pub cursor: u64,
    /// What it has not acknowledged yet.
    pub backlog: ChannelBacklog,
    /// When it last fetched, acknowledged or was created (epoch ms): an
    /// idle subscriber expires `expire_after` later.
    pub last_seen: i64,
}

/// One channel in a listing.
#[derive(Debug, Clone, PartialEq)]
pub struct ChannelView {
    /// The channel's id.
    pub id: String,
    /// Position of its newest committed message (0: none yet).
    pub head: u64,
    /// Messages some subscriber still waits to acknowledge (the slowest
    /// subscriber's backlog); with no subscriber, the messages stored and
    /// not yet swept.
    pub backlog: ChannelBacklog,
    /// Its subscribers, by id.
    pub subscribers: Vec<SubscriberView>,
    /// When it was last published to, subscribed to or fetched from
    /// (epoch ms).
    pub last_active: i64,
}

/// A page of channels and how many there are in all.
#[derive(Debug, Clone, PartialEq)]
pub struct ChannelPage {
    /// Channels on this node, in all.
    pub total: usize,
    /// The page asked for, ordered by id.
    pub channels: Vec<ChannelView>,
}

/// An `Instant` in the past as epoch milliseconds.
fn epoch_ms(at: Instant) -> i64 {
    weft_model::now_ms() - at.elapsed().as_millis() as i64
}

impl Channels {
    /// The channels ordered by id, `limit` from `offset`, with their
    /// subscribers and backlogs.
    pub async fn page(&self, offset: usize, limit: usize) -> Result<ChannelPage, StoreError> {
        let mut all: Vec<(String, Arc<Channel>)> = self
            .channels
            .lock()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let total = all.len();
        all.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let mut channels = Vec::new();
        for (name, channel) in all.into_iter().skip(offset).take(limit) {
            channels.push(self.view(&name, &channel).await?);
        }
        Ok(ChannelPage { total, channels })
    }

    /// One channel with its subscribers and backlogs; `None` when this
    /// node does not know it.
    pub async fn describe(&self, name: &str) -> Result<Option<ChannelView>, StoreError> {
        match self.existing(name) {
            Some(channel) => Ok(Some(self.view(name, &channel).await?)),
            None => Ok(None),
        }
    }

    /// Reads one channel's figures: one backlog query per distinct cursor
    /// behind the head.
    async fn view(&self, name: &str, channel: &Channel) -> Result<ChannelView, StoreError> {
        let head = *channel.head.borrow();
        let (mut subscribers, last_active) = {
            let state = channel.subscribers.lock();
            let subs: Vec<SubscriberView> = state
                .subscribers
                .iter()
                .map(|(id, s)| SubscriberView {
                    id: id.clone(),
                    cursor: s.cursor,
                    backlog: ChannelBacklog::default(),
                    last_seen: epoch_ms(s.last_seen),
                })
                .collect();
            (subs, epoch_ms(state.last_active))
        };
        subscribers.sort_unstable_by(|a, b| a.id.cmp(&b.id));
        let floor = subscribers.iter().map(|s| s.cursor).min().unwrap_or(0);
        let cursors: Vec<u64> = std::iter::once(floor)
            .chain(subscribers.iter().map(|s| s.cursor))
            .collect();
        let mut by_cursor: HashMap<u64, ChannelBacklog> = HashMap::new();
        for cursor in cursors {
            if by_cursor.contains_key(&cursor) {
                continue;
            }
            // At the head nothing after the cursor is committed yet.
            let backlog = if cursor >= head {
                ChannelBacklog::default()
            } else {
                self.store.channel_backlog(name, cursor).await?
            };
            by_cursor.insert(cursor, backlog);
        }
        let backlog = by_cursor[&floor];
        for s in &mut subscribers {
            s.backlog = by_cursor[&s.cursor];
        }
        Ok(ChannelView {
            id: name.to_string(),
            head,
            backlog,
            subscribers,
            last_active,
        })
    }

    /// Every channel's messages that some subscriber has not acknowledged
    /// (the slowest subscriber's backlog, summed over channels), and the
    /// oldest of them: what the sweeper publishes as gauges. Channels
    /// whose subscribers are all at the head cost no query.
    pub(super) async fn backlog_total(&self) -> Result<ChannelBacklog, StoreError> {
        let behind: Vec<(String, u64)> = self
            .channels
            .lock()
            .iter()
            .filter_map(|(name, c)| {
                let head = *c.head.borrow();
                let floor = c
                    .subscribers
                    .lock()
                    .subscribers
                    .values()
                    .map(|s| s.cursor)
                    .min()?;
                (floor < head).then(|| (name.clone(), floor))
            })
            .collect();
        let mut total = ChannelBacklog::default();
        for (name, floor) in behind {
            let b = self.store.channel_backlog(&name, floor).await?;
            total.messages += b.messages;
            total.oldest_published_at = match (total.oldest_published_at, b.oldest_published_at) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        Ok(total)
    }
}
