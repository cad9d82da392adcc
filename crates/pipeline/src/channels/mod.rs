//! Durable pull channels (the DSPS model): a publish stores a message
//! (deduplicated by its id) and is answered once committed; each polling
//! subscriber receives every message published after it was created, again
//! and again, until it acknowledges them with the `ackHandle` of a fetch,
//! which works as a cursor ("everything up to here").
//!
//! The store holds the messages and the subscribers' cursors; memory holds,
//! per channel, the highest committed message position (a watch that
//! wakes long polls the moment a publish commits), the subscribers with
//! their cursors and last activity, and a bounded copy of the newest
//! messages ([`recent`]) that answers the fetches of subscribers keeping
//! up without reading the store. So memory grows with channels and
//! subscribers, never with the messages waiting, however slow the
//! subscribers are.
//!
//! A sweeper forgets subscribers idle longer than `expire_after` (a fetch
//! for them then answers 404, as DSPS does) and channels without
//! subscribers, and deletes messages every subscriber has acknowledged.
//!
//! A JWT revoked through another node is reloaded from the store as soon
//! as that node announces it ([`Follower`]).
//!
//! Several nodes (a bus shared with other nodes) serve the same channels
//! from the same store, and a client may publish, fetch and acknowledge
//! through any of them. Then the store, not memory, is the truth for what
//! other nodes change: a fetch or an acknowledgement reads the
//! subscriber's stored cursor (and answers 404 once another node deleted
//! or expired it); a publish is announced to the other nodes
//! ([`DefinitionKind::ChannelMessages`]), which read the channel's head
//! from the store and wake their long polls; the sweeper expires
//! subscribers by their activity on any node (recorded in the store) and
//! deletes only what every stored subscriber has acknowledged.

pub mod bridge;
pub mod listing;
pub mod recent;
pub mod rules;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use weft_bus::Bus;
use weft_store::{ChannelMessage, Store, StoreError};

use crate::definitions::{DefinitionChange, DefinitionKind, Follower, Reload};

/// Tuning of the channels.
#[derive(Debug, Clone)]
pub struct ChannelsConfig {
    /// Subscribers (and channels) idle longer than this are removed.
    /// DSPS's default is 30 minutes.
    pub expire_after: Duration,
    /// Longest a fetch may wait for a message (`timeout` is capped to it).
    pub max_wait: Duration,
    /// Bridges from the configuration, by name.
    pub bridges: Vec<(String, bridge::BridgeSpec)>,
    /// Per channel-name pattern: JWT checks and webhooks.
    pub rules: Vec<rules::ChannelRule>,
    /// Bearer tokens of the admin API (`/admin/…`); none: it is closed.
    pub admin_tokens: Vec<String>,
}

impl Default for ChannelsConfig {
    fn default() -> Self {
        ChannelsConfig {
            expire_after: Duration::from_secs(30 * 60),
            max_wait: Duration::from_secs(30),
            bridges: Vec::new(),
            rules: Vec::new(),
            admin_tokens: Vec::new(),
        }
    }
}

/// Messages a fetch returns when the client names no `max` (DSPS's default).
pub const DEFAULT_FETCH_MAX: usize = 64;

/// Why a channel operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    /// The subscriber does not exist (never created, deleted or expired).
    #[error("subscriber not found")]
    SubscriberNotFound,
    /// An id in the call breaks DSPS's id rule (400 naming its parameter:
    /// `channelID`, `subscriberID`, `messageID`).
    #[error("Invalid \"{0}\" parameter")]
    InvalidId(&'static str),
    /// The caller's JWT did not pass the channel's rule (403).
    #[error("{0}")]
    Forbidden(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a fetch returns.
#[derive(Debug, Clone, Default)]
pub struct Fetched {
    /// Unacknowledged messages, oldest first.
    pub messages: Vec<ChannelMessage>,
    /// Whether more are waiting beyond these.
    pub more: bool,
}

/// One subscriber in memory.
#[derive(Debug)]
struct Subscriber {
    cursor: u64,
    last_seen: Instant,
}

/// One channel in memory.
struct Channel {
    /// The highest committed message position; long polls wait on it.
    head: watch::Sender<u64>,
    subscribers: parking_lot::Mutex<ChannelState>,
    /// The newest messages (a single node's channels only).
    recent: parking_lot::Mutex<recent::Recent>,
}

struct ChannelState {
    subscribers: HashMap<String, Subscriber>,
    last_active: Instant,
    /// Messages up to here are already deleted.
    pruned: u64,
}

impl Channel {
    /// A channel at `head`; `known`: every message up to `head` is in the
    /// store and none after it (loaded at start), so the copy of the
    /// newest messages may claim what comes after it.
    fn new(head: u64, known: bool, budget: &Arc<recent::Budget>) -> Channel {
        Channel {
            head: watch::Sender::new(head),
            subscribers: parking_lot::Mutex::new(ChannelState {
                subscribers: HashMap::new(),
                last_active: Instant::now(),
                pruned: 0,
            }),
            recent: parking_lot::Mutex::new(recent::Recent::new(
                known.then_some(head),
                budget.clone(),
            )),
        }
    }

    /// Notes that `subscriber`, whose stored cursor is `cursor`, was
    /// active here just now.
    fn active(&self, subscriber: &str, cursor: u64) {
        let now = Instant::now();
        let mut state = self.subscribers.lock();
        state.last_active = now;
        let s = state
            .subscribers
            .entry(subscriber.to_string())
            .or_insert(Subscriber {
                cursor,
                last_seen: now,
            });
        s.cursor = s.cursor.max(cursor);
        s.last_seen = now;
    }

    fn advance(&self, seq: u64) {
        self.head.send_if_modified(|h| {
            let newer = seq > *h;
            if newer {
                *h = seq;
            }
            newer
        });
    }
}

/// The channels; see the module doc.
pub struct Channels {
    store: Arc<dyn Store>,
    /// Where revocations are announced to the other nodes.
    bus: Arc<dyn Bus>,
    config: ChannelsConfig,
    rules: rules::ChannelRules,
    /// Sends the webhook calls new messages queue, when any rule has
    /// webhooks.
    webhooks: Option<Arc<rules::WebhookSender>>,
    channels: parking_lot::Mutex<HashMap<String, Arc<Channel>>>,
    /// Whether other nodes serve the same channels (see the module doc).
    clustered: bool,
    /// Subscribers active here since the sweeper last recorded it in the
    /// store (clustered only).
    touched: parking_lot::Mutex<std::collections::HashSet<(String, String)>>,
    /// The bytes the channels' copies of their newest messages share.
    budget: Arc<recent::Budget>,
    /// Fetches answered from those copies, without reading the store.
    from_memory: std::sync::atomic::AtomicU64,
}

impl Channels {
    /// Loads the subscribers and channel positions and starts the sweeper
    /// (stopped by `shutdown`).
    pub async fn start(
        store: Arc<dyn Store>,
        config: ChannelsConfig,
        bus: Arc<dyn Bus>,
        node: &str,
        shutdown: CancellationToken,
    ) -> Result<Arc<Channels>, StoreError> {
        let budget = recent::Budget::new(recent::DEFAULT_BUDGET);
        let (heads, _) = store.channel_heads().await?;
        let mut map: HashMap<String, Arc<Channel>> = heads
            .into_iter()
            .map(|(name, head)| (name, Arc::new(Channel::new(head, true, &budget))))
            .collect();
        for s in store.channel_subscribers().await? {
            let channel = map
                .entry(s.channel.clone())
                .or_insert_with(|| Arc::new(Channel::new(s.cursor, false, &budget)));
            channel.advance(s.cursor);
            channel.subscribers.lock().subscribers.insert(
                s.subscriber,
                Subscriber {
                    cursor: s.cursor,
                    last_seen: Instant::now(),
                },
            );
        }
        let rules = rules::ChannelRules::new(&config.rules).map_err(StoreError::Database)?;
        load_revocations(&store, &rules).await?;
        let clustered = bus.node().is_some();
        let webhooks = rules
            .has_webhooks()
            .then(|| rules::WebhookSender::start(store.clone(), node.to_string()));
        let channels = Arc::new(Channels {
            store,
            bus,
            config,
            rules,
            webhooks,
            channels: parking_lot::Mutex::new(map),
            clustered,
            touched: Default::default(),
            budget,
            from_memory: Default::default(),
        });
        tokio::spawn(channels.clone().sweep_loop(shutdown));
        Ok(channels)
    }

    fn channel(&self, name: &str) -> Arc<Channel> {
        let mut map = self.channels.lock();
        if let Some(c) = map.get(name) {
            return c.clone();
        }
        // What an earlier copy of this channel left in the store is not
        // known here: its copy of the newest messages claims nothing yet.
        let c = Arc::new(Channel::new(0, false, &self.budget));
        map.insert(name.to_string(), c.clone());
        c
    }

    fn existing(&self, name: &str) -> Option<Arc<Channel>> {
        self.channels.lock().get(name).cloned()
    }

    /// Publishes `content` (JSON text) as `message_id`; returns once it is
    /// committed. A message id already in the channel changes nothing (the
    /// first content stays) and answers the same. Answers whether the
    /// message was new.
    pub async fn publish(
        &self,
        channel: &str,
        message_id: &str,
        content: String,
    ) -> Result<bool, StoreError> {
        let webhooks = match &self.webhooks {
            Some(sender) => weft_store::WebhookCalls {
                node: sender.node().to_string(),
                calls: self.rules.webhook_calls(channel, message_id, &content),
            },
            None => weft_store::WebhookCalls::default(),
        };
        let queued = !webhooks.calls.is_empty();
        let c = self.channel(channel);
        let stored = if self.clustered {
            let stored = self
                .store
                .publish_message(channel, message_id, content, webhooks)
                .await?;
            if let Some(seq) = stored {
                c.advance(seq);
            }
            stored
        } else {
            self.publish_here(&c, channel, message_id, content, webhooks)
                .await?
        };
        c.subscribers.lock().last_active = Instant::now();
        if stored.is_some() {
            if self.clustered {
                self.bus.definition_changed(DefinitionChange::new(
                    DefinitionKind::ChannelMessages,
                    channel,
                ));
            }
            if let (Some(sender), true) = (&self.webhooks, queued) {
                sender.wake();
            }
            metrics::counter!("weft_channel_messages_published_total").increment(1);
        }
        Ok(stored.is_some())
    }

    /// A single node's publish: stores the message and adds it to the
    /// channel's copy of its newest messages, then moves the head. The
    /// write and the bookkeeping run as a task of their own, so a caller
    /// that goes away (a client hanging up) cannot leave the copy
    /// counting a publish that never ends.
    async fn publish_here(
        &self,
        c: &Arc<Channel>,
        channel: &str,
        message_id: &str,
        content: String,
        webhooks: weft_store::WebhookCalls,
    ) -> Result<Option<u64>, StoreError> {
        c.recent.lock().begin();
        let (store, c) = (self.store.clone(), c.clone());
        let (channel, message_id) = (channel.to_string(), message_id.to_string());
        let task = tokio::spawn(async move {
            let stored = store
                .publish_message(&channel, &message_id, content.clone(), webhooks)
                .await;
            c.recent.lock().end(match &stored {
                Ok(Some(seq)) => recent::Outcome::Stored(ChannelMessage {
                    seq: *seq,
                    message_id,
                    content,
                }),
                Ok(None) => recent::Outcome::Duplicate,
                Err(_) => recent::Outcome::Failed,
            });
            if let Ok(Some(seq)) = stored {
                c.advance(seq);
            }
            stored
        });
        task.await
            .map_err(|e| StoreError::Database(format!("the publish task failed: {e}")))?
    }

    /// Admits a call on `channel` naming `other` (`("subscriberID", id)`
    /// or `("messageID", id)`): both ids must follow DSPS's id rule
    /// ([`weft_model::validate::is_dsps_id`]; the channel's checked first),
    /// then the caller must pass the JWT rules matching the channel.
    pub fn admit(
        &self,
        channel: &str,
        other: (&'static str, &str),
        authorization: Option<&str>,
    ) -> Result<(), ChannelError> {
        use weft_model::validate::is_dsps_id;
        if !is_dsps_id(channel) {
            return Err(ChannelError::InvalidId("channelID"));
        }
        if !is_dsps_id(other.1) {
            return Err(ChannelError::InvalidId(other.0));
        }
        self.authorize(channel, authorization)
    }

    /// Checks the caller of an operation on `channel` against the JWT rules
    /// matching it (`authorization`: the request's header).
    pub fn authorize(
        &self,
        channel: &str,
        authorization: Option<&str>,
    ) -> Result<(), ChannelError> {
        self.rules
            .authorize(channel, authorization)
            .map_err(|r| ChannelError::Forbidden(r.0))
    }

    /// Whether `authorization` carries one of the admin tokens.
    pub fn is_admin(&self, authorization: Option<&str>) -> bool {
        let token = authorization.and_then(|h| h.strip_prefix("Bearer "));
        token.is_some_and(|t| self.config.admin_tokens.iter().any(|a| a == t))
    }

    /// Revokes JWT id `jti` until `exp` (epoch seconds), durably.
    pub async fn revoke_jwt(&self, jti: &str, exp: i64) -> Result<(), StoreError> {
        self.store
            .put_document(weft_store::NgsiDocument {
                kind: weft_store::DocumentKind::RevokedJwt,
                tenant: String::new(),
                id: jti.to_string(),
                service_path: "/".to_string(),
                created: weft_model::now_ms() as u64,
                json: serde_json::json!({ "exp": exp }).to_string(),
            })
            .await?;
        self.rules.revoke(jti, exp);
        self.bus
            .definition_changed(DefinitionChange::new(DefinitionKind::RevokedJwt, jti));
        Ok(())
    }

    /// Creates a polling subscriber (or finds it); it receives the messages
    /// published after it was first created.
    pub async fn subscribe(&self, channel: &str, subscriber: &str) -> Result<(), StoreError> {
        let c = self.channel(channel);
        // Clustered, another node may have deleted it: the store decides.
        if !self.clustered {
            if let Some(s) = c.subscribers.lock().subscribers.get_mut(subscriber) {
                s.last_seen = Instant::now();
                return Ok(());
            }
        }
        // Clustered, this node's head may not have seen another node's
        // publish yet: the new subscriber starts after what is stored.
        if self.clustered {
            c.advance(self.store.channel_head(channel).await?);
        }
        let start = *c.head.borrow();
        let cursor = self
            .store
            .put_channel_subscriber(channel, subscriber, start)
            .await?;
        c.active(subscriber, cursor);
        self.touch(channel, subscriber);
        Ok(())
    }

    /// Deletes a subscriber (nothing if it does not exist).
    pub async fn unsubscribe(&self, channel: &str, subscriber: &str) -> Result<(), StoreError> {
        self.store
            .delete_channel_subscriber(channel, subscriber)
            .await?;
        if let Some(c) = self.existing(channel) {
            c.subscribers.lock().subscribers.remove(subscriber);
        }
        Ok(())
    }

    /// The subscriber's unacknowledged messages (at most `max`), waiting up
    /// to `wait` (capped at `max_wait`) for one if there are none.
    pub async fn fetch(
        &self,
        channel: &str,
        subscriber: &str,
        wait: Duration,
        max: usize,
    ) -> Result<Fetched, ChannelError> {
        let c = if self.clustered {
            // Made, and published to, through any node.
            self.channel(channel)
        } else {
            self.existing(channel)
                .ok_or(ChannelError::SubscriberNotFound)?
        };
        let max = max.max(1);
        let deadline = tokio::time::Instant::now() + wait.min(self.config.max_wait);
        let mut head = c.head.subscribe();
        loop {
            let cursor = if self.clustered {
                self.stored_cursor(channel, &c, subscriber).await?
            } else {
                let mut state = c.subscribers.lock();
                state.last_active = Instant::now();
                let s = state
                    .subscribers
                    .get_mut(subscriber)
                    .ok_or(ChannelError::SubscriberNotFound)?;
                s.last_seen = Instant::now();
                s.cursor
            };
            // Clustered, messages another node stored may be there before
            // their notice: the store is asked.
            let seen = *head.borrow_and_update();
            if seen > cursor || self.clustered {
                if !self.clustered {
                    if let Some(mut messages) = c.recent.lock().after(cursor, seen, max + 1) {
                        metrics::counter!("weft_channel_fetches_from_memory_total").increment(1);
                        self.from_memory
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let more = messages.len() > max;
                        messages.truncate(max);
                        return Ok(Fetched { messages, more });
                    }
                }
                let mut messages = self
                    .store
                    .channel_messages(channel, cursor, max + 1)
                    .await?;
                if let Some(last) = messages.last() {
                    // Read back committed before its publisher moved the
                    // head: move it now, so an ack of it is not clamped.
                    c.advance(last.seq);
                    let more = messages.len() > max;
                    messages.truncate(max);
                    return Ok(Fetched { messages, more });
                }
            }
            match tokio::time::timeout_at(deadline, head.changed()).await {
                Ok(Ok(())) => continue,
                // Timed out, or the channel was dropped: nothing came.
                _ => return Ok(Fetched::default()),
            }
        }
    }

    /// Fetches answered from the channels' copies of their newest
    /// messages, without reading the store, since the start.
    pub fn fetches_from_memory(&self) -> u64 {
        self.from_memory.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Acknowledges the subscriber's messages up to `through` (a stale
    /// handle, behind the cursor, changes nothing).
    pub async fn ack(
        &self,
        channel: &str,
        subscriber: &str,
        through: u64,
    ) -> Result<(), ChannelError> {
        if self.clustered {
            let c = self.channel(channel);
            let cursor = self.stored_cursor(channel, &c, subscriber).await?;
            // Never past what is stored (a handle from the future would
            // acknowledge messages not yet published).
            let through = through.min(self.store.channel_head(channel).await?);
            if through > cursor {
                self.store
                    .ack_channel_messages(channel, subscriber, through)
                    .await?;
                if let Some(s) = c.subscribers.lock().subscribers.get_mut(subscriber) {
                    s.cursor = s.cursor.max(through);
                }
            }
            return Ok(());
        }
        let c = self
            .existing(channel)
            .ok_or(ChannelError::SubscriberNotFound)?;
        let through = through.min(*c.head.borrow());
        {
            let state = c.subscribers.lock();
            let s = state
                .subscribers
                .get(subscriber)
                .ok_or(ChannelError::SubscriberNotFound)?;
            if through <= s.cursor {
                return Ok(());
            }
        }
        self.store
            .ack_channel_messages(channel, subscriber, through)
            .await?;
        let mut state = c.subscribers.lock();
        if let Some(s) = state.subscribers.get_mut(subscriber) {
            s.cursor = s.cursor.max(through);
            s.last_seen = Instant::now();
        }
        Ok(())
    }

    /// Clustered: the subscriber's stored cursor, kept in memory too (for
    /// the listing and the sweeper); `SubscriberNotFound` once it is gone
    /// from the store, whichever node deleted or expired it.
    async fn stored_cursor(
        &self,
        channel: &str,
        c: &Channel,
        subscriber: &str,
    ) -> Result<u64, ChannelError> {
        let Some(cursor) = self.store.channel_subscriber(channel, subscriber).await? else {
            c.subscribers.lock().subscribers.remove(subscriber);
            return Err(ChannelError::SubscriberNotFound);
        };
        c.active(subscriber, cursor);
        self.touch(channel, subscriber);
        Ok(cursor)
    }

    /// Clustered: notes that a subscriber was active here, for the
    /// sweeper to record in the store.
    fn touch(&self, channel: &str, subscriber: &str) {
        if self.clustered {
            self.touched
                .lock()
                .insert((channel.to_string(), subscriber.to_string()));
        }
    }

    /// Every so often: expire idle subscribers and channels, delete what
    /// every subscriber has acknowledged.
    async fn sweep_loop(self: Arc<Self>, shutdown: CancellationToken) {
        let every = (self.config.expire_after / 4)
            .clamp(Duration::from_millis(100), Duration::from_secs(10));
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = shutdown.cancelled() => break,
            }
            if let Err(e) = self.sweep().await {
                tracing::warn!(error = %e, "sweeping channels failed");
            }
            match self.backlog_total().await {
                Ok(b) => {
                    metrics::gauge!("weft_channel_backlog_messages").set(b.messages as f64);
                    let age = b
                        .oldest_published_at
                        .map_or(0, |t| (weft_model::now_ms() - t).max(0));
                    metrics::gauge!("weft_channel_oldest_unacked_seconds").set(age as f64 / 1000.0);
                }
                Err(e) => tracing::warn!(error = %e, "reading the channels' backlog failed"),
            }
        }
    }

    /// Sweeps every channel; their store writes run concurrently, so they
    /// share commits instead of taking one each in turn.
    async fn sweep(&self) -> Result<(), StoreError> {
        if self.clustered {
            // Activity here first, so that no node expires what this one
            // serves; then what was idle on every node.
            let touched: Vec<(String, String)> = self.touched.lock().drain().collect();
            self.store
                .touch_channel_subscribers(touched, weft_model::now_ms())
                .await?;
            let idle_before = weft_model::now_ms() - self.config.expire_after.as_millis() as i64;
            for (channel, subscriber) in self.store.expire_channel_subscribers(idle_before).await? {
                metrics::counter!("weft_channel_subscribers_expired_total").increment(1);
                if let Some(c) = self.existing(&channel) {
                    c.subscribers.lock().subscribers.remove(&subscriber);
                }
            }
        }
        let all: Vec<(String, Arc<Channel>)> = self
            .channels
            .lock()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let swept = all.iter().map(|(name, c)| self.sweep_channel(name, c));
        futures::future::join_all(swept).await.into_iter().collect()
    }

    /// Expires one channel's idle subscribers, deletes what all of them
    /// acknowledged, and forgets the channel when it is idle and empty.
    async fn sweep_channel(&self, name: &str, c: &Arc<Channel>) -> Result<(), StoreError> {
        let expire = self.config.expire_after;
        let (expired, prune_to, idle) = {
            let mut state = c.subscribers.lock();
            let expired: Vec<String> = state
                .subscribers
                .iter()
                .filter(|(_, s)| s.last_seen.elapsed() >= expire)
                .map(|(k, _)| k.clone())
                .collect();
            for e in &expired {
                state.subscribers.remove(e);
            }
            let head = *c.head.borrow();
            let floor = state
                .subscribers
                .values()
                .map(|s| s.cursor)
                .min()
                .unwrap_or(head);
            let prune_to = (floor > state.pruned).then_some(floor);
            let idle = state.subscribers.is_empty() && state.last_active.elapsed() >= expire;
            (expired, prune_to, idle)
        };
        // Clustered, only the store knows every subscriber (and expired
        // the idle ones above): this node forgets its idle copies, and
        // deletes what every stored subscriber acknowledged.
        let prune_to = if self.clustered {
            let floor = match self.store.channel_floor(name).await? {
                Some(floor) => floor,
                None => self.store.channel_head(name).await?,
            };
            (floor > c.subscribers.lock().pruned).then_some(floor)
        } else {
            for sub in &expired {
                self.store.delete_channel_subscriber(name, sub).await?;
                metrics::counter!("weft_channel_subscribers_expired_total").increment(1);
            }
            prune_to
        };
        if let Some(to) = prune_to {
            self.store.prune_channel(name, to).await?;
            c.subscribers.lock().pruned = to;
            c.recent.lock().prune(to);
        }
        if idle {
            let mut map = self.channels.lock();
            let still_idle = c.subscribers.lock().subscribers.is_empty();
            if still_idle {
                map.remove(name);
            }
        }
        Ok(())
    }
}

/// Applies every stored JWT revocation to `rules` (revocations are only
/// ever added).
async fn load_revocations(
    store: &Arc<dyn Store>,
    rules: &rules::ChannelRules,
) -> Result<(), StoreError> {
    for doc in store
        .load_documents(weft_store::DocumentKind::RevokedJwt)
        .await?
    {
        let exp = serde_json::from_str::<serde_json::Value>(&doc.json)
            .ok()
            .and_then(|v| v["exp"].as_i64())
            .unwrap_or(i64::MAX);
        rules.revoke(&doc.id, exp);
    }
    Ok(())
}

impl Follower for Channels {
    const KINDS: &'static [DefinitionKind] =
        &[DefinitionKind::RevokedJwt, DefinitionKind::ChannelMessages];

    /// Applies the stored revocations again, the new ones among them;
    /// moves the heads of channels another node published to, waking the
    /// long polls waiting here.
    async fn reload(&self, what: &Reload) -> Result<(), StoreError> {
        match what {
            Reload::One(change) if change.kind == DefinitionKind::ChannelMessages => {
                if let Some(c) = self.existing(&change.id) {
                    c.advance(self.store.channel_head(&change.id).await?);
                }
                Ok(())
            }
            Reload::One(_) => load_revocations(&self.store, &self.rules).await,
            Reload::All => {
                load_revocations(&self.store, &self.rules).await?;
                let (heads, _) = self.store.channel_heads().await?;
                for (name, head) in heads {
                    if let Some(c) = self.existing(&name) {
                        c.advance(head);
                    }
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests;
