//! Bridges: weft's own events published into a channel, so a program that
//! can only poll (behind a firewall, a batch job) consumes them reliably
//! through DSPS's API.
//!
//! A bridge tails a durable, ordered source — the stored data units or the
//! stored alarm events — from its cursor, applies the live stream's filter,
//! and publishes each event with the event's id as message id (a data
//! unit's `dataId`, an alarm event's `eventId`). Publishing is idempotent
//! by message id, so after a crash the bridge starts again from its stored
//! cursor and republishes at most what it had not yet recorded, which the
//! channel drops as duplicates: every event arrives exactly once, in order.
//! The bus only rings the doorbell (and a timer stands in when it lags).
//!
//! A bridge made or deleted through another node's API is known here as
//! soon as that node announces it ([`Follower`]). The bridges run on one
//! node of a cluster, the holder of the `bridges` lease
//! ([`Bridges::run`]); the others only keep their definitions, and take
//! them over from the shared cursors when the lease comes to them. Should
//! two nodes both publish for a moment (a holder stalled past its lease),
//! the channel drops the duplicates by message id.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use weft_bus::{Bus, Stream};
use weft_model::validate;
use weft_model::{AlarmEvent, DataUnit};
use weft_store::{AlarmBatch, DocumentKind, NgsiDocument, Store, StoreError};

use super::Channels;
use crate::definitions::{DefinitionChange, DefinitionKind, Follower, Reload};
use crate::filter::{EventFilter, FilterSpec};

/// Events a bridge reads from the store at a time.
const BATCH: usize = 500;

/// How long a bridge sleeps when the bus is quiet (it also wakes on every
/// event of its stream).
const IDLE_POLL: Duration = Duration::from_secs(1);

/// A bridge as configured (`[[channels.bridges]]` or `/api/v1/bridges`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BridgeSpec {
    /// `data` or `alarms`.
    pub stream: String,
    /// The channel the events are published into.
    pub channel: String,
    /// Which events, as on the live stream.
    #[serde(default)]
    pub filter: FilterSpec,
}

/// Why a bridge was refused.
#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    /// The definition is invalid (400).
    #[error("{0}")]
    Invalid(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The durable sources a bridge can tail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Data,
    Alarms,
}

impl BridgeSpec {
    fn validate(&self, name: &str) -> Result<(Source, EventFilter), BridgeError> {
        let bad = |m: String| BridgeError::Invalid(m);
        let invalid = |e: validate::Invalid| BridgeError::Invalid(e.to_string());
        validate::dsps_id("name", name).map_err(invalid)?;
        let source = match self.stream.as_str() {
            "data" => Source::Data,
            "alarms" => Source::Alarms,
            other => {
                return Err(bad(format!(
                "stream must be 'data' or 'alarms', not {} (entity changes are not bridged yet)",
                validate::shown(other)
            )))
            }
        };
        validate::dsps_id("channel", &self.channel).map_err(invalid)?;
        self.filter
            .check_names()
            .map_err(|e| invalid(e.within("filter")))?;
        let filter = EventFilter::new(self.filter.clone()).map_err(|e| {
            if e.starts_with("servicePath") {
                bad(format!("filter.{e}"))
            } else {
                bad(format!("filter.q: {e}"))
            }
        })?;
        Ok((source, filter))
    }
}

/// The running bridges.
pub struct Bridges {
    store: Arc<dyn Store>,
    bus: Arc<dyn Bus>,
    channels: Arc<Channels>,
    /// Every bridge, by name: its definition, whether it was made through
    /// the API, and what stops its task.
    running: parking_lot::Mutex<HashMap<String, (BridgeSpec, bool, CancellationToken)>>,
    /// While this node holds the `bridges` lease: the lease's token, whose
    /// children stop the tasks. `None`: the bridges are only known here.
    lease: parking_lot::Mutex<Option<CancellationToken>>,
}

impl Bridges {
    /// Knows the configured bridges and those stored through the API; they
    /// run from [`Bridges::run`].
    pub async fn start(
        store: Arc<dyn Store>,
        bus: Arc<dyn Bus>,
        channels: Arc<Channels>,
        configured: Vec<(String, BridgeSpec)>,
    ) -> Result<Arc<Bridges>, BridgeError> {
        let bridges = Arc::new(Bridges {
            store: store.clone(),
            bus,
            channels,
            running: parking_lot::Mutex::new(HashMap::new()),
            lease: parking_lot::Mutex::new(None),
        });
        for (name, spec) in configured {
            bridges.launch(&name, spec, false).await?;
        }
        for doc in store.load_documents(DocumentKind::Bridge).await? {
            match serde_json::from_str::<BridgeSpec>(&doc.json) {
                Ok(spec) => bridges.launch(&doc.id, spec, true).await?,
                Err(e) => {
                    tracing::warn!(bridge = %doc.id, error = %e, "a stored bridge is invalid; skipped")
                }
            }
        }
        Ok(bridges)
    }

    /// Creates or replaces a bridge (stored, so it survives restarts); it
    /// publishes the events stored from now on. Answers whether it was new.
    pub async fn put(&self, name: &str, spec: BridgeSpec) -> Result<bool, BridgeError> {
        spec.validate(name)?;
        let existed = self.running.lock().contains_key(name);
        self.store
            .put_document(NgsiDocument {
                kind: DocumentKind::Bridge,
                tenant: String::new(),
                id: name.to_string(),
                service_path: "/".to_string(),
                created: weft_model::now_ms() as u64,
                json: serde_json::to_string(&spec).expect("bridges serialise"),
            })
            .await?;
        self.launch(name, spec, true).await?;
        self.announce(name);
        Ok(!existed)
    }

    /// Stops and forgets a bridge made through the API; `false` if there
    /// is none (configured bridges are changed in the configuration).
    pub async fn delete(&self, name: &str) -> Result<bool, StoreError> {
        let existed = self
            .store
            .delete_document(DocumentKind::Bridge, "", name)
            .await?;
        {
            let mut running = self.running.lock();
            if matches!(running.get(name), Some((_, true, _))) {
                if let Some((_, _, stop)) = running.remove(name) {
                    stop.cancel();
                }
            }
        }
        if existed {
            // One made again under this name is a new bridge: it starts
            // with the events stored after it, not where this one stopped.
            let cursor = cursor_name(name);
            self.store
                .commit_alarms(AlarmBatch {
                    cursors: vec![(started_name(&cursor), 1), (cursor, 1)],
                    ..AlarmBatch::default()
                })
                .await?;
        }
        self.announce(name);
        Ok(existed)
    }

    /// Tells the other nodes that bridge `name` changed.
    fn announce(&self, name: &str) {
        self.bus
            .definition_changed(DefinitionChange::new(DefinitionKind::Bridge, name));
    }

    /// Every bridge, by name, with whether it was made through the API.
    pub fn list(&self) -> Vec<(String, BridgeSpec, bool)> {
        let mut all: Vec<_> = self
            .running
            .lock()
            .iter()
            .map(|(k, (s, stored, _))| (k.clone(), s.clone(), *stored))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// Runs every bridge until `stop` (this node holds the `bridges` lease
    /// meanwhile), each from its stored cursor, including those made or
    /// changed while it runs.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        *self.lease.lock() = Some(stop.clone());
        let known: Vec<(String, BridgeSpec, bool)> = self
            .running
            .lock()
            .iter()
            .map(|(name, (spec, stored, _))| (name.clone(), spec.clone(), *stored))
            .collect();
        for (name, spec, stored) in known {
            if let Err(e) = self.launch(&name, spec, stored).await {
                tracing::warn!(bridge = %name, error = %e, "starting a bridge failed");
            }
        }
        stop.cancelled().await;
        *self.lease.lock() = None;
    }

    /// Records bridge `name` and, while this node runs the bridges,
    /// (re)starts its task.
    async fn launch(&self, name: &str, spec: BridgeSpec, stored: bool) -> Result<(), BridgeError> {
        let (source, filter) = spec.validate(name)?;
        let lease = self.lease.lock().clone();
        let stop = lease
            .as_ref()
            .map_or_else(CancellationToken::new, CancellationToken::child_token);
        if let Some((_, _, old)) = self
            .running
            .lock()
            .insert(name.to_string(), (spec.clone(), stored, stop.clone()))
        {
            old.cancel();
        }
        if lease.is_none() {
            return Ok(());
        }
        let task = BridgeTask {
            cursor_name: cursor_name(name),
            source,
            filter,
            channel: spec.channel,
            store: self.store.clone(),
            bus: self.bus.clone(),
            channels: self.channels.clone(),
        };
        let start = task.start_cursor().await?;
        tokio::spawn(task.run(start, stop));
        Ok(())
    }
}

impl Follower for Bridges {
    const KINDS: &'static [DefinitionKind] = &[DefinitionKind::Bridge];

    /// Starts (or restarts with their new definition) the stored bridges
    /// named and stops the API-made ones the store no longer has;
    /// configured bridges are left alone.
    async fn reload(&self, what: &Reload) -> Result<(), StoreError> {
        let mut stored = HashMap::new();
        for doc in self.store.load_documents(DocumentKind::Bridge).await? {
            if !what.covers(DefinitionKind::Bridge, "", &doc.id) {
                continue;
            }
            match serde_json::from_str::<BridgeSpec>(&doc.json) {
                Ok(spec) => {
                    stored.insert(doc.id, spec);
                }
                Err(e) => {
                    tracing::warn!(bridge = %doc.id, error = %e, "a stored bridge is invalid; skipped")
                }
            }
        }
        {
            let mut running = self.running.lock();
            let gone: Vec<String> = running
                .iter()
                .filter(|(name, (_, from_api, _))| {
                    *from_api
                        && what.covers(DefinitionKind::Bridge, "", name)
                        && !stored.contains_key(*name)
                })
                .map(|(name, _)| name.clone())
                .collect();
            for name in gone {
                if let Some((_, _, stop)) = running.remove(&name) {
                    stop.cancel();
                }
            }
        }
        for (name, spec) in stored {
            let unchanged = self
                .running
                .lock()
                .get(&name)
                .is_some_and(|(running, from_api, _)| *from_api && *running == spec);
            if unchanged {
                continue;
            }
            match self.launch(&name, spec, true).await {
                Ok(()) => {}
                Err(BridgeError::Store(e)) => return Err(e),
                Err(BridgeError::Invalid(e)) => {
                    tracing::warn!(bridge = %name, error = %e, "a stored bridge is invalid; skipped")
                }
            }
        }
        Ok(())
    }
}

/// The name of bridge `name`'s cursor: the next event it publishes.
fn cursor_name(name: &str) -> String {
    format!("bridge:{name}")
}

/// The name of the cursor set to 2 once the bridge's cursor `cursor` is
/// stored (see [`BridgeTask::start_cursor`]).
fn started_name(cursor: &str) -> String {
    format!("{cursor}:started")
}

/// One bridge's loop.
struct BridgeTask {
    cursor_name: String,
    source: Source,
    filter: EventFilter,
    channel: String,
    store: Arc<dyn Store>,
    bus: Arc<dyn Bus>,
    channels: Arc<Channels>,
}

impl BridgeTask {
    /// The stored cursor, or (for a new bridge) just past the newest event,
    /// stored at once so a restart does not go back further.
    ///
    /// A cursor nobody stored reads as 1, the same as the cursor of a
    /// bridge made while nothing was stored yet: a second cursor, set to 2
    /// when the bridge's is first stored, tells them apart, so such a
    /// bridge still publishes, after a restart, the events stored before it
    /// read them.
    async fn start_cursor(&self) -> Result<u64, StoreError> {
        let stored = self.store.cursor(&self.cursor_name).await?;
        let started = started_name(&self.cursor_name);
        if stored > 1 || self.store.cursor(&started).await? > 1 {
            return Ok(stored);
        }
        let head = match self.source {
            Source::Data => self.store.data_head().await?,
            Source::Alarms => self.store.alarm_events_head().await?,
        };
        self.store
            .commit_alarms(AlarmBatch {
                cursors: vec![(self.cursor_name.clone(), head + 1), (started, 2)],
                ..AlarmBatch::default()
            })
            .await?;
        Ok(head + 1)
    }

    async fn save(&self, next: u64) -> Result<(), StoreError> {
        self.store
            .commit_alarms(AlarmBatch {
                cursors: vec![(self.cursor_name.clone(), next)],
                ..AlarmBatch::default()
            })
            .await
            .map(|_| ())
    }

    /// Reads up to [`BATCH`] events from `next`: `(seq, message id, JSON,
    /// passes the filter)`.
    async fn read(&self, next: u64) -> Result<Vec<(u64, String, String, bool)>, StoreError> {
        match self.source {
            Source::Alarms => {
                let rows = self
                    .store
                    .alarm_events(next.saturating_sub(1), BATCH)
                    .await?;
                Ok(rows
                    .into_iter()
                    .map(
                        |(seq, json)| match serde_json::from_str::<AlarmEvent>(&json) {
                            Ok(e) => {
                                let pass = self.filter.matches_alarm(&e);
                                (seq, e.event_id, json, pass)
                            }
                            Err(_) => (seq, String::new(), json, false),
                        },
                    )
                    .collect())
            }
            Source::Data => {
                let rows = self
                    .store
                    .query_data(&weft_store::DataQuery {
                        after: Some(next.saturating_sub(1)),
                        limit: BATCH,
                        ..Default::default()
                    })
                    .await?;
                Ok(rows
                    .into_iter()
                    .map(|r| match serde_json::from_str::<DataUnit>(&r.json) {
                        Ok(u) => {
                            let pass = self.filter.matches_unit(&u);
                            let id = if validate::is_dsps_id(&u.data_id) {
                                u.data_id
                            } else {
                                format!("unit-{}", r.seq)
                            };
                            (r.seq, id, r.json, pass)
                        }
                        Err(_) => (r.seq, String::new(), r.json, false),
                    })
                    .collect())
            }
        }
    }

    async fn run(self, mut next: u64, stop: CancellationToken) {
        let stream = match self.source {
            Source::Data => Stream::Data,
            Source::Alarms => Stream::Alarms,
        };
        let mut doorbell = self.bus.subscribe(stream);
        let mut delay = Duration::from_millis(50);
        loop {
            if stop.is_cancelled() {
                return;
            }
            let events = match self.read(next).await {
                Ok(e) => e,
                Err(StoreError::Closed) => return,
                Err(e) => {
                    tracing::warn!(bridge = %self.cursor_name, error = %e, "bridge: reading failed");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                    continue;
                }
            };
            let Some(last) = events.last().map(|e| e.0) else {
                tokio::select! {
                    _ = doorbell.recv() => {}
                    _ = tokio::time::sleep(IDLE_POLL) => {}
                    _ = stop.cancelled() => return,
                }
                continue;
            };
            for (_, id, json, pass) in events {
                if !pass {
                    continue;
                }
                // Retried until stored: the cursor must not pass it.
                loop {
                    match self
                        .channels
                        .publish(&self.channel, &id, json.clone())
                        .await
                    {
                        Ok(_) => break,
                        Err(StoreError::Closed) => return,
                        Err(e) => {
                            tracing::warn!(bridge = %self.cursor_name, error = %e, "bridge: publishing failed");
                            tokio::select! {
                                _ = tokio::time::sleep(delay) => {}
                                _ = stop.cancelled() => return,
                            }
                            delay = (delay * 2).min(Duration::from_secs(5));
                        }
                    }
                }
                metrics::counter!("weft_bridge_events_total").increment(1);
            }
            delay = Duration::from_millis(50);
            next = last + 1;
            if let Err(e) = self.save(next).await {
                tracing::warn!(bridge = %self.cursor_name, error = %e, "bridge: storing the cursor failed");
            }
        }
    }
}
