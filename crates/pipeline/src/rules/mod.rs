//! The rule engine: evaluates alarm rules on every stored data unit,
//! keeps the alarms' lifecycle, and dispatches every alarm change (on the
//! bus's `alarms` stream, as an NGSI entity, in the store's alarm event
//! log).
//!
//! Data flow: the pipeline's committer hands each batch of newly stored
//! units to [`RuleEngine::feed`]. Two lanes consume them, each on the rule
//! engine's own thread:
//!
//! - the condition lane (Simple Query Language conditions and inactivity),
//! - the script lane (`evaluate(unit, state)` scripts, on an engine of
//!   their own with their own time limit), so a slow or looping script
//!   delays only other scripts, never a threshold alarm.
//!
//! Each lane commits, per batch, the alarms it changed, their events, the
//! rule state it changed and its cursor (the next unit `seq`) in one
//! transaction, and only then publishes the events. A crash before that
//! commit loses nothing: at start each lane evaluates again the stored
//! units past its cursor, from the state stored with that cursor. A lane
//! that cannot keep up misses hand-offs (the pipeline never waits for it)
//! and reads the units it missed from the store.
//!
//! Rules are kept in memory; one changed through another node is reloaded
//! from the store as soon as that node announces it ([`Follower`]), so it
//! applies here from the next unit too.
//!
//! Alarms change from three places — the lanes, the inactivity clock and
//! the API (`ack`, `clear`) — each under one lock held until the change is
//! committed and published, so events come out in the order of the
//! alarms' versions.

mod alarm_entity;
pub mod state;
#[cfg(test)]
mod tests;
pub mod verdict;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use weft_bus::{Bus, Event, Payload, Stream};
use weft_engine::{Call, CodecError, Engine, EngineConfig, Script};
use weft_model::alarm::{AlarmDevice, AlarmState};
use weft_model::rule::render_description;
use weft_model::{Alarm, AlarmChange, AlarmEvent, DataUnit, Rule, RuleSpec};
use weft_store::{AlarmBatch, AlarmQuery, AlarmRecord, RuleStateRecord, Store, StoreError};

use crate::context::Context;
use crate::definitions::{DefinitionChange, DefinitionKind, Follower, Reload};
pub use state::StateLimits;
use state::{json_size, States};
use verdict::{is_stateless, step, Action, RuleState, Verdict};

/// Tuning of the rule engine.
#[derive(Debug, Clone)]
pub struct RulesConfig {
    /// Longest one `evaluate` call of a script rule may run before it is
    /// interrupted (its unit then counts as not matching).
    pub script_time_limit: Duration,
    /// How often inactivity rules look for silent devices.
    pub inactivity_check: Duration,
    /// The bounds of script rules' `state` objects ([`state`]).
    pub state_limits: StateLimits,
}

impl Default for RulesConfig {
    fn default() -> Self {
        RulesConfig {
            script_time_limit: Duration::from_millis(50),
            inactivity_check: Duration::from_millis(500),
            state_limits: StateLimits::default(),
        }
    }
}

/// A stored unit handed from the pipeline (or read back from the store).
#[derive(Debug, Clone)]
pub struct FedUnit {
    /// Where it is stored: lanes keep their cursors in these.
    pub seq: u64,
    /// The pipeline partition that stored it.
    pub partition: u16,
    /// The unit.
    pub unit: Arc<DataUnit>,
}

/// Stored units handed from the pipeline, in `seq` order.
pub type UnitBatch = Arc<Vec<FedUnit>>;

/// Batches a lane may hold before hand-offs are dropped (the lane then
/// reads what it missed from the store).
const LANE_QUEUE: usize = 256;

/// Alarm changes waiting for their NGSI entity write before the lanes wait.
const ENTITY_QUEUE: usize = 4096;

/// Most units a lane evaluates in one step (one commit) when hand-offs
/// have queued up.
const MAX_STEP_UNITS: usize = 4096;

/// How many units a lane reads from the store at a time when catching up.
const CATCH_UP_BATCH: usize = 1000;

/// How often a lane without rules stores how far it got.
const IDLE_CURSOR_INTERVAL: Duration = Duration::from_secs(5);

/// The function wrapped around a script rule's `evaluate`, so that what the
/// script does to `state` comes back with its result.
const SCRIPT_ENTRY: &str = "__weftEvaluate";

/// Which rules a lane evaluates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    /// Conditions and inactivity.
    Conditions,
    /// Scripts.
    Scripts,
}

impl Lane {
    const ALL: [Lane; 2] = [Lane::Conditions, Lane::Scripts];

    /// The store cursor of the lane.
    fn cursor(self) -> &'static str {
        match self {
            Lane::Conditions => "rules",
            Lane::Scripts => "rules-scripts",
        }
    }

    fn handles(self, rule: &Rule) -> bool {
        match self {
            Lane::Conditions => rule.spec.script.is_none(),
            Lane::Scripts => rule.spec.script.is_some(),
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// A rule ready to evaluate.
struct Compiled {
    rule: Rule,
    /// The script with the wrapper that returns `state` too.
    script: Option<Script>,
}

/// What the rule engine holds in memory; the store has all of it too.
#[derive(Default)]
struct Inner {
    rules: BTreeMap<String, Arc<Compiled>>,
    /// Per (rule id, device id), bounded ([`state`]).
    states: States,
    /// Active alarms by (device id, alarm type).
    active: HashMap<(String, String), Alarm>,
    /// The partitions the lanes evaluate now, when not all: the
    /// inactivity clock watches only devices heard through them.
    partitions: Option<HashSet<u16>>,
}

/// Where the lanes read and store their positions in a run: one cursor
/// per partition they evaluate.
#[derive(Default)]
struct Held {
    /// Per lane, its cursors (one per partition) and their names.
    names: [Vec<(u16, String)>; 2],
    /// Per lane, partition → stored cursor at the start of the run:
    /// units of a partition below its own cursor were evaluated before.
    floors: [HashMap<u16, u64>; 2],
    /// The partitions read back from the store, when not all.
    filter: Option<Vec<u16>>,
}

/// What one evaluation step changed, on its way to the store.
#[derive(Default)]
struct Changes {
    events: Vec<AlarmEvent>,
    /// (rule id, device id) whose state changed.
    dirty: HashSet<(String, String)>,
}

impl Changes {
    fn record(&mut self, change: AlarmChange, alarm: &Alarm) {
        self.events.push(AlarmEvent::new(change, alarm.clone()));
    }
}

/// Why a rule or alarm request was refused.
#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    /// The rule is invalid (400).
    #[error("{0}")]
    Invalid(String),
    /// The store failed (500/503).
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// One hand-off lane: its queue and whether it dropped a hand-off.
struct LaneFeed {
    tx: mpsc::Sender<UnitBatch>,
    behind: AtomicBool,
}

/// The rule engine; see the module doc.
pub struct RuleEngine {
    store: Arc<dyn Store>,
    bus: Arc<dyn Bus>,
    context: Arc<Context>,
    scripts: Engine,
    config: RulesConfig,
    inner: parking_lot::Mutex<Inner>,
    /// Held from an alarm change until it is committed and published.
    order: tokio::sync::Mutex<()>,
    lanes: [LaneFeed; 2],
    /// Alarms whose NGSI entity is to be written (see `entity_loop`).
    entity_updates: mpsc::Sender<Alarm>,
    /// The lanes' queues while the lanes are not running (this node does
    /// not hold the pipeline's lease); taken by [`RuleEngine::run`].
    receivers: parking_lot::Mutex<Vec<mpsc::Receiver<UnitBatch>>>,
    /// How many times the lanes were started here: every start after the
    /// first is a takeover.
    runs: AtomicU64,
    /// The partitions of the current run and the lanes' cursors in them.
    held: parking_lot::Mutex<Held>,
}

impl RuleEngine {
    /// Loads rules, rule state and active alarms. The lanes and the
    /// inactivity clock run in [`RuleEngine::run`], on the node holding
    /// the pipeline's lease; users' acks and clears work on every node.
    pub async fn start(
        store: Arc<dyn Store>,
        bus: Arc<dyn Bus>,
        context: Arc<Context>,
        config: RulesConfig,
    ) -> Result<Arc<RuleEngine>, StoreError> {
        let scripts = Engine::start(EngineConfig {
            workers: 1,
            time_limit: config.script_time_limit,
            ..EngineConfig::default()
        });
        let mut inner = Inner::default();
        for (id, json) in store.load_rules().await? {
            let spec: RuleSpec = serde_json::from_str(&json)
                .map_err(|e| StoreError::Corrupt(format!("rule {id}: {e}")))?;
            match Rule::new(&id, spec) {
                Ok(rule) => {
                    inner.rules.insert(id, Arc::new(compile(rule)));
                }
                Err(e) => {
                    tracing::warn!(rule = %id, error = %e, "a stored rule is invalid; skipped")
                }
            }
        }
        let (states, active) = load_state(&*store).await?;
        inner.states = States::from_loaded(states);
        inner.active = active;
        let mut receivers = Vec::new();
        let lanes = Lane::ALL.map(|_| {
            let (tx, rx) = mpsc::channel(LANE_QUEUE);
            receivers.push(rx);
            LaneFeed {
                tx,
                behind: AtomicBool::new(false),
            }
        });
        let (entity_updates, entity_rx) = mpsc::channel(ENTITY_QUEUE);
        let engine = Arc::new(RuleEngine {
            store,
            bus,
            context,
            scripts,
            config,
            inner: parking_lot::Mutex::new(inner),
            order: tokio::sync::Mutex::new(()),
            lanes,
            entity_updates,
            receivers: parking_lot::Mutex::new(receivers),
            runs: AtomicU64::new(0),
            held: parking_lot::Mutex::new(Held::default()),
        });
        // Ends when the engine (its sender) is dropped.
        tokio::spawn(engine.clone().entity_loop(entity_rx));
        Ok(engine)
    }

    /// Runs the lanes and the inactivity clock on the units of
    /// `partitions` (of `count`) from their stored cursors until `stop`,
    /// on a thread of their own. Run again each time the partitions this
    /// node holds change; the rule state and the active alarms are read
    /// again from the store first (another node may have changed them:
    /// the previous holder of a partition, or this node's own previous
    /// run).
    pub async fn run(self: Arc<Self>, partitions: Arc<[u16]>, count: u16, stop: CancellationToken) {
        let mut taken = std::mem::take(&mut *self.receivers.lock());
        if taken.len() != Lane::ALL.len() {
            tracing::error!("the rule engine's lanes are already running");
            *self.receivers.lock() = taken;
            return;
        }
        // Hand-offs left from the previous run may hold units of
        // partitions another node evaluates now; this run's own are read
        // back from the store from its cursors.
        for rx in &mut taken {
            while rx.try_recv().is_ok() {}
        }
        let mut cursors = Vec::new();
        let all = partitions.len() >= usize::from(count);
        let prepared = async {
            // Read again at every start: the partitions held may have
            // been another node's a moment ago, and what it changed there
            // is in the store.
            if self.runs.fetch_add(1, Ordering::Relaxed) > 0 || count > 1 {
                let (states, active) = load_state(&*self.store).await?;
                let _order = self.order.lock().await;
                let mut inner = self.inner.lock();
                inner.states = States::from_loaded(states);
                inner.active = active;
            }
            let mut held = Held {
                filter: (!all).then(|| partitions.to_vec()),
                ..Held::default()
            };
            for lane in Lane::ALL {
                let floors =
                    crate::ingest::partition_cursors(&*self.store, lane.cursor(), &partitions)
                        .await?;
                cursors.push(floors.values().copied().min().unwrap_or(1));
                held.names[lane.index()] = partitions
                    .iter()
                    .map(|&p| (p, weft_store::partition_cursor(lane.cursor(), p)))
                    .collect();
                held.floors[lane.index()] = floors;
            }
            *self.held.lock() = held;
            self.inner.lock().partitions = (!all).then(|| partitions.iter().copied().collect());
            Ok::<(), StoreError>(())
        };
        if let Err(e) = prepared.await {
            tracing::error!(error = %e, "starting the rule engine's lanes failed; they start with the next lease");
            *self.receivers.lock() = taken;
            return;
        }
        let runner = self.clone();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let spawned = std::thread::Builder::new()
            .name("weft-rules".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("the rule engine's runtime starts");
                runtime.block_on(async move {
                    let mut lanes = Vec::new();
                    for ((lane, rx), cursor) in Lane::ALL.into_iter().zip(taken).zip(cursors) {
                        lanes.push(tokio::spawn(runner.clone().lane_loop(
                            lane,
                            rx,
                            cursor,
                            stop.clone(),
                        )));
                    }
                    let inactivity = tokio::spawn(runner.clone().inactivity_loop(stop));
                    let mut receivers = Vec::new();
                    for lane in lanes {
                        if let Ok(rx) = lane.await {
                            receivers.push(rx);
                        }
                    }
                    let _ = inactivity.await;
                    *runner.receivers.lock() = receivers;
                });
                let _ = done_tx.send(());
            });
        match spawned {
            Ok(_) => {
                let _ = done_rx.await;
            }
            Err(e) => tracing::error!(error = %e, "starting the rule engine's thread failed"),
        }
    }

    /// Applies another node's alarm changes to the active alarms here, so
    /// a user's ack or clear on any node, and the alarms the node running
    /// the rules raises, are known to every node. A change older than the
    /// copy held (by version) is ignored.
    pub async fn follow_remote_alarms(self: Arc<Self>, shutdown: CancellationToken) {
        let Some(mut remote) = self.bus.subscribe_remote(Stream::Alarms) else {
            return;
        };
        loop {
            let event = tokio::select! {
                _ = shutdown.cancelled() => return,
                e = remote.recv() => e,
            };
            match event {
                Ok(event) => {
                    let Payload::Alarm(e) = &event.payload else {
                        continue;
                    };
                    let alarm = &e.alarm;
                    let key = (alarm.device.id.clone(), alarm.alarm_type.clone());
                    let mut inner = self.inner.lock();
                    let newer = inner
                        .active
                        .get(&key)
                        .is_none_or(|held| held.id != alarm.id || held.version <= alarm.version);
                    if !newer {
                        continue;
                    }
                    if alarm.state == AlarmState::Active {
                        inner.active.insert(key, alarm.clone());
                    } else if inner.active.get(&key).is_some_and(|a| a.id == alarm.id) {
                        inner.active.remove(&key);
                    }
                }
                Err(weft_bus::RecvError::Lagged(n)) => {
                    tracing::warn!(
                        missed = n,
                        "fell behind other nodes' alarm changes; reading the active alarms again"
                    );
                    if let Ok((_, active)) = load_state(&*self.store).await {
                        self.inner.lock().active = active;
                    }
                }
                Err(weft_bus::RecvError::Closed) => return,
            }
        }
    }

    /// Hands newly stored units to the lanes. Never waits: a lane whose
    /// queue is full reads these units from the store later.
    pub fn feed(&self, units: UnitBatch) {
        if units.is_empty() {
            return;
        }
        for lane in &self.lanes {
            if lane.tx.try_send(units.clone()).is_err() {
                lane.behind.store(true, Ordering::Release);
            }
        }
    }

    // --- rules ----------------------------------------------------------------

    /// Validates and stores a rule; it applies from the next data unit.
    /// Answers whether it was created (rather than replaced).
    pub async fn put_rule(&self, id: &str, spec: RuleSpec) -> Result<bool, RulesError> {
        let rule = Rule::new(id, spec).map_err(|e| RulesError::Invalid(e.0))?;
        let compiled = compile(rule);
        if let Some(script) = &compiled.script {
            match self.scripts.check(script).await {
                Ok(weft_engine::ScriptKind::Evaluate) => {}
                Ok(_) => {
                    return Err(RulesError::Invalid(
                        "script must define function evaluate(unit, state)".into(),
                    ))
                }
                Err(e) => return Err(RulesError::Invalid(format!("script: {e}"))),
            }
        }
        let json = serde_json::to_string(&compiled.rule.spec).expect("rules serialise");
        let created = self.store.put_rule(id, json).await?;
        self.inner
            .lock()
            .rules
            .insert(id.to_string(), Arc::new(compiled));
        self.bus
            .definition_changed(DefinitionChange::new(DefinitionKind::Rule, id));
        Ok(created)
    }

    /// Deletes a rule and its per-device state; its alarms stay as they are.
    pub async fn delete_rule(&self, id: &str) -> Result<bool, StoreError> {
        let existed = self.store.delete_rule(id).await?;
        {
            let mut inner = self.inner.lock();
            inner.rules.remove(id);
            inner.states.retain_rules(|rule| rule != id);
        }
        self.bus
            .definition_changed(DefinitionChange::new(DefinitionKind::Rule, id));
        Ok(existed)
    }

    /// Every rule as `(id, spec)`, by id.
    pub fn rules(&self) -> Vec<(String, RuleSpec)> {
        let inner = self.inner.lock();
        inner
            .rules
            .iter()
            .map(|(id, c)| (id.clone(), c.rule.spec.clone()))
            .collect()
    }

    /// One rule.
    pub fn rule(&self, id: &str) -> Option<RuleSpec> {
        self.inner.lock().rules.get(id).map(|c| c.rule.spec.clone())
    }

    // --- alarms ---------------------------------------------------------------

    /// Alarms matching `query`, newest first.
    pub async fn alarms(&self, query: &AlarmQuery) -> Result<Vec<Alarm>, StoreError> {
        let rows = self.store.query_alarms(query).await?;
        rows.iter()
            .map(|j| serde_json::from_str(j).map_err(|e| StoreError::Corrupt(e.to_string())))
            .collect()
    }

    /// One alarm.
    pub async fn alarm(&self, id: &str) -> Result<Option<Alarm>, StoreError> {
        match self.store.get_alarm(id).await? {
            Some(j) => serde_json::from_str(&j)
                .map(Some)
                .map_err(|e| StoreError::Corrupt(e.to_string())),
            None => Ok(None),
        }
    }

    /// Acknowledges an alarm (a no-op if it already is); `None` if unknown.
    pub async fn ack(&self, id: &str) -> Result<Option<Alarm>, StoreError> {
        self.change_by_user(id, AlarmChange::Acked).await
    }

    /// Clears an alarm (a no-op if it already is); `None` if unknown.
    pub async fn clear(&self, id: &str) -> Result<Option<Alarm>, StoreError> {
        self.change_by_user(id, AlarmChange::Cleared).await
    }

    async fn change_by_user(
        &self,
        id: &str,
        change: AlarmChange,
    ) -> Result<Option<Alarm>, StoreError> {
        let _order = self.order.lock().await;
        let active = {
            let inner = self.inner.lock();
            inner.active.values().find(|a| a.id == id).cloned()
        };
        let mut alarm = match active {
            Some(a) => a,
            None => match self.alarm(id).await? {
                Some(a) => a,
                None => return Ok(None),
            },
        };
        let now = weft_model::now_ms();
        match change {
            AlarmChange::Acked if !alarm.acked => {
                alarm.acked = true;
                alarm.acked_at = Some(now);
            }
            AlarmChange::Cleared if alarm.state == AlarmState::Active => {
                alarm.state = AlarmState::Cleared;
                alarm.cleared_at = Some(now);
            }
            _ => return Ok(Some(alarm)),
        }
        alarm.updated_at = now;
        alarm.version += 1;
        let mut changes = Changes::default();
        changes.record(change, &alarm);
        {
            let mut inner = self.inner.lock();
            let key = (alarm.device.id.clone(), alarm.alarm_type.clone());
            if alarm.state == AlarmState::Active {
                inner.active.insert(key, alarm.clone());
            } else {
                inner.active.remove(&key);
            }
        }
        self.commit(changes, Vec::new()).await?;
        Ok(Some(alarm))
    }

    // --- evaluation -----------------------------------------------------------

    /// One lane: evaluates what it is handed, catching up from the store
    /// whenever it finds it missed units.
    async fn lane_loop(
        self: Arc<Self>,
        lane: Lane,
        mut rx: mpsc::Receiver<UnitBatch>,
        mut cursor: u64,
        shutdown: CancellationToken,
    ) -> mpsc::Receiver<UnitBatch> {
        if self.has_rules(lane) {
            cursor = self.catch_up(lane, cursor, None).await;
        }
        let mut stored_cursor = cursor;
        let mut stored_at = std::time::Instant::now();
        loop {
            let batch = tokio::select! {
                b = rx.recv() => b,
                _ = shutdown.cancelled() => None,
            };
            let Some(batch) = batch else { break };
            let first = batch[0].seq;
            if first > cursor && self.has_rules(lane) {
                cursor = self.catch_up(lane, cursor, Some(first)).await;
            }
            // Whatever queued up meanwhile is evaluated and committed with
            // this batch: under load the lane's steps grow instead of its
            // queue (one commit per step, not per hand-off).
            let mut fresh: Vec<FedUnit> =
                batch.iter().filter(|u| u.seq >= cursor).cloned().collect();
            while fresh.len() < MAX_STEP_UNITS {
                let Ok(more) = rx.try_recv() else { break };
                let next = fresh.last().map_or(cursor, |u| u.seq + 1);
                if more[0].seq > next {
                    // A hand-off was dropped in between: evaluate up to the
                    // gap now; the catch-up after this step reads the rest.
                    self.lanes[lane.index()]
                        .behind
                        .store(true, Ordering::Release);
                    break;
                }
                fresh.extend(more.iter().filter(|u| u.seq >= next).cloned());
            }
            if let Some(next) = self.evaluate(lane, &fresh).await {
                cursor = next;
            }
            if self.lanes[lane.index()]
                .behind
                .swap(false, Ordering::AcqRel)
            {
                cursor = self.catch_up(lane, cursor, None).await;
            }
            // Without rules no batch stores the cursor; keep the stored one
            // roughly current so a restart does not reread much.
            if cursor != stored_cursor && stored_at.elapsed() >= IDLE_CURSOR_INTERVAL {
                let _order = self.order.lock().await;
                let moved = self.cursors(lane, cursor);
                if self.commit(Changes::default(), moved).await.is_ok() {
                    stored_cursor = cursor;
                    stored_at = std::time::Instant::now();
                }
            }
        }
        rx
    }

    /// The lane's cursors, all at `next` (never back: a partition whose
    /// cursor was further at the start of the run keeps it).
    fn cursors(&self, lane: Lane, next: u64) -> Vec<(String, u64)> {
        let held = self.held.lock();
        let floors = &held.floors[lane.index()];
        held.names[lane.index()]
            .iter()
            .filter(|(p, _)| floors.get(p).is_none_or(|f| *f <= next))
            .map(|(_, name)| (name.clone(), next))
            .collect()
    }

    fn has_rules(&self, lane: Lane) -> bool {
        let inner = self.inner.lock();
        inner.rules.values().any(|c| lane.handles(&c.rule))
    }

    /// Evaluates the stored units from `cursor` (up to `before`, or all);
    /// answers the new cursor.
    async fn catch_up(&self, lane: Lane, mut cursor: u64, before: Option<u64>) -> u64 {
        loop {
            let (partitions, floors) = {
                let held = self.held.lock();
                (held.filter.clone(), held.floors[lane.index()].clone())
            };
            let query = weft_store::DataQuery {
                after: Some(cursor.saturating_sub(1)),
                limit: CATCH_UP_BATCH,
                partitions,
                ..Default::default()
            };
            let rows = match self.store.query_data(&query).await {
                Ok(rows) => rows,
                Err(StoreError::Closed) => return cursor,
                Err(e) => {
                    tracing::warn!(error = %e, "rules: reading missed units failed; retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            let within = rows.iter().filter(|r| before.is_none_or(|b| r.seq < b));
            let done = rows.len() < CATCH_UP_BATCH || within.clone().count() < rows.len();
            let units: Vec<FedUnit> = within
                .filter(|r| floors.get(&r.partition).is_none_or(|f| r.seq >= *f))
                .filter_map(|r| {
                    Some(FedUnit {
                        seq: r.seq,
                        partition: r.partition,
                        unit: Arc::new(serde_json::from_str(&r.json).ok()?),
                    })
                })
                .collect();
            let last_read = rows
                .iter()
                .take_while(|r| before.is_none_or(|b| r.seq < b))
                .last()
                .map(|r| r.seq);
            if !units.is_empty() {
                tracing::debug!(lane = ?lane, units = units.len(), "rules: catching up");
                match self.evaluate(lane, &units).await {
                    Some(next) => cursor = next,
                    None => return cursor,
                }
            }
            // Units skipped (evaluated before this run) are passed too.
            if let Some(last) = last_read {
                cursor = cursor.max(last + 1);
            }
            if done {
                return before.map_or(cursor, |b| cursor.max(b));
            }
        }
    }

    /// Evaluates a lane's rules on `units`, then commits and publishes what
    /// changed with the lane's new cursor. `None` if the store is closed.
    async fn evaluate(&self, lane: Lane, units: &[FedUnit]) -> Option<u64> {
        let next = units.last()?.seq + 1;
        let rules: Vec<Arc<Compiled>> = {
            let inner = self.inner.lock();
            inner
                .rules
                .values()
                .filter(|c| c.rule.spec.enabled && lane.handles(&c.rule))
                .cloned()
                .collect()
        };
        if rules.is_empty() {
            // Nothing to evaluate: the cursor is stored now and then by
            // the lane loop instead of once per batch.
            return Some(next);
        }
        // Scripts run before the order lock is taken: a slow script never
        // holds up an ack or the other lane.
        let verdicts = match lane {
            Lane::Scripts => self.run_scripts(&rules, units).await,
            Lane::Conditions => Vec::new(),
        };
        let _order = self.order.lock().await;
        let now = weft_model::now_ms();
        let mut changes = Changes::default();
        {
            let mut inner = self.inner.lock();
            let mut scripted = verdicts.into_iter();
            for fed in units {
                let unit = &fed.unit;
                for c in &rules {
                    if !c.rule.spec.scope.covers_unit(unit) {
                        continue;
                    }
                    if c.rule.inactivity.is_some() {
                        inner.heard_from(&c.rule, unit, fed.partition, now, &mut changes);
                        continue;
                    }
                    let (verdict, state) = match lane {
                        Lane::Conditions => (condition_verdict(&c.rule, unit), None),
                        Lane::Scripts => scripted.next().unwrap_or_default(),
                    };
                    inner.apply(&c.rule, unit, &verdict, state, now, &mut changes);
                }
            }
            let evicted = inner
                .states
                .enforce_total(self.config.state_limits.total);
            changes.dirty.extend(evicted);
        }
        let cursors = self.cursors(lane, next);
        match self.commit(changes, cursors).await {
            Ok(()) => Some(next),
            Err(_) => None,
        }
    }

    /// Runs every script rule in scope on every unit, in order, chaining
    /// each (rule, device)'s `state` through the batch. One verdict (and the
    /// script's new state) per (unit, rule in scope), in that order.
    async fn run_scripts(
        &self,
        rules: &[Arc<Compiled>],
        units: &[FedUnit],
    ) -> Vec<(Verdict, Option<(Value, usize)>)> {
        let limit = self.config.state_limits.per_device;
        let mut out = Vec::new();
        let mut states: HashMap<(String, String), Value> = HashMap::new();
        for FedUnit { unit, .. } in units {
            for c in rules {
                if !c.rule.spec.scope.covers_unit(unit) {
                    continue;
                }
                let (Some(script), None) = (&c.script, c.rule.inactivity) else {
                    continue;
                };
                let key = (c.rule.id.clone(), unit.device.id.clone());
                let state = match states.get(&key) {
                    Some(s) => s.clone(),
                    None => self
                        .inner
                        .lock()
                        .states
                        .get(&key)
                        .and_then(|s| s.script.clone())
                        .unwrap_or_else(|| Value::Object(Default::default())),
                };
                let call = Call::Function {
                    script: script.clone(),
                    name: SCRIPT_ENTRY.into(),
                    args: vec![serde_json::to_value(&**unit).unwrap_or(Value::Null), state],
                };
                let result = match self.scripts.run(vec![call]).await {
                    Ok(mut r) => r.pop().unwrap_or(Err(CodecError::Stopped)),
                    Err(e) => Err(e),
                };
                match result {
                    Ok(mut returned) => {
                        let new_state = returned.get_mut("state").map(Value::take).map(|s| {
                            let bytes = json_size(&s);
                            if bytes <= limit {
                                return (s, bytes);
                            }
                            metrics::counter!("weft_rule_state_resets_total").increment(1);
                            tracing::warn!(
                                rule = %c.rule.id,
                                device = %unit.device.id,
                                bytes,
                                limit,
                                "a script rule's state for a device is over [rules] max_state_bytes; reset to {{}}"
                            );
                            (Value::Object(Default::default()), 2)
                        });
                        let mut verdict =
                            Verdict::from_script(returned.get("result").unwrap_or(&Value::Null));
                        if !verdict.fire && !verdict.clear {
                            verdict.clear = c
                                .rule
                                .clear
                                .as_ref()
                                .is_some_and(|q| q.matches(|p| unit.attribute(p)));
                        }
                        if let Some((s, _)) = &new_state {
                            states.insert(key, s.clone());
                        }
                        out.push((verdict, new_state));
                    }
                    Err(e) => {
                        metrics::counter!("weft_rule_errors_total").increment(1);
                        tracing::debug!(rule = %c.rule.id, error = %e, "rule script failed");
                        out.push((Verdict::default(), None));
                    }
                }
            }
        }
        out
    }

    /// Raises alarms for devices silent past their rule's inactivity time.
    async fn inactivity_loop(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.config.inactivity_check) => {}
                _ = shutdown.cancelled() => break,
            }
            let _order = self.order.lock().await;
            let now = weft_model::now_ms();
            let mut changes = Changes::default();
            self.inner.lock().silent_devices(now, &mut changes);
            if !changes.events.is_empty() || !changes.dirty.is_empty() {
                let _ = self.commit(changes, Vec::new()).await;
            }
        }
    }

    /// Stores `changes` (with a lane's cursor), retrying until the store
    /// takes them, then publishes the events and updates the alarms' NGSI
    /// entities. The caller holds the order lock.
    async fn commit(
        &self,
        changes: Changes,
        cursors: Vec<(String, u64)>,
    ) -> Result<(), StoreError> {
        let mut batch = AlarmBatch {
            cursors,
            ..AlarmBatch::default()
        };
        let mut latest: BTreeMap<&str, &Alarm> = BTreeMap::new();
        for e in &changes.events {
            latest.insert(&e.alarm.id, &e.alarm);
            batch
                .events
                .push(serde_json::to_string(e).expect("alarm events serialise"));
        }
        batch.alarms = latest.values().map(|a| record(a)).collect();
        {
            let mut inner = self.inner.lock();
            for key in &changes.dirty {
                let json = match inner.states.get(key) {
                    Some(s) if !s.is_empty() => Some(serde_json::to_string(s).expect("serialises")),
                    _ => {
                        inner.states.remove(key);
                        None
                    }
                };
                batch.states.push(RuleStateRecord {
                    rule: key.0.clone(),
                    device: key.1.clone(),
                    json,
                });
            }
        }
        let mut delay = Duration::from_millis(5);
        loop {
            match self.store.commit_alarms(batch.clone()).await {
                Ok(_) => break,
                Err(StoreError::Closed) => return Err(StoreError::Closed),
                Err(e) => {
                    tracing::warn!(error = %e, "storing alarms failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(1));
                }
            }
        }
        if changes.events.is_empty() {
            return Ok(());
        }
        metrics::counter!("weft_alarm_events_total").increment(changes.events.len() as u64);
        let mut entities = Vec::new();
        for event in changes.events {
            let json = serde_json::to_vec(&event).expect("alarm events serialise");
            entities.push(event.alarm.clone());
            self.bus.publish(Event {
                stream: Stream::Alarms,
                payload: Payload::Alarm(Arc::new(event)),
                json: json.into(),
            });
        }
        for alarm in entities {
            // Waits only when the entity writer is far behind.
            let _ = self.entity_updates.send(alarm).await;
        }
        Ok(())
    }

    /// Keeps the alarms' NGSI entities up to date, off the lanes' path.
    /// Every change is written (subscriptions see each one), in order per
    /// alarm; the changes of different alarms queued together are written
    /// concurrently, so their store writes share commits.
    async fn entity_loop(self: Arc<Self>, mut rx: mpsc::Receiver<Alarm>) {
        while let Some(first) = rx.recv().await {
            let mut queued = vec![first];
            while let Ok(more) = rx.try_recv() {
                queued.push(more);
            }
            // Round r writes the r-th queued change of every alarm.
            let mut rounds: Vec<Vec<Alarm>> = Vec::new();
            let mut seen: HashMap<String, usize> = HashMap::new();
            for alarm in queued {
                let round = seen.entry(alarm.id.clone()).or_insert(0);
                if rounds.len() <= *round {
                    rounds.push(Vec::new());
                }
                rounds[*round].push(alarm);
                *round += 1;
            }
            for round in rounds {
                let updates = round.iter().map(|a| alarm_entity::upsert(&self.context, a));
                for result in futures::future::join_all(updates).await {
                    if let Err(e) = result {
                        tracing::warn!(error = ?e, "updating an alarm's NGSI entity failed");
                    }
                }
            }
        }
    }
}

/// Rule state and active alarms as stored.
type LoadedState = (
    HashMap<(String, String), RuleState>,
    HashMap<(String, String), Alarm>,
);

/// Reads the rule state and the active alarms from the store.
async fn load_state(store: &dyn Store) -> Result<LoadedState, StoreError> {
    let mut states = HashMap::new();
    for s in store.load_rule_states().await? {
        if let Some(state) = s.json.and_then(|j| serde_json::from_str(&j).ok()) {
            states.insert((s.rule, s.device), state);
        }
    }
    let mut active = HashMap::new();
    for json in store.active_alarms().await? {
        let alarm: Alarm =
            serde_json::from_str(&json).map_err(|e| StoreError::Corrupt(format!("alarm: {e}")))?;
        active.insert((alarm.device.id.clone(), alarm.alarm_type.clone()), alarm);
    }
    Ok((states, active))
}

fn record(a: &Alarm) -> AlarmRecord {
    AlarmRecord {
        id: a.id.clone(),
        device: a.device.id.clone(),
        alarm_type: a.alarm_type.clone(),
        state: a.state.as_str().to_string(),
        acked: a.acked,
        severity: a.severity.as_str().to_string(),
        raised_at: a.raised_at,
        version: a.version,
        json: serde_json::to_string(a).expect("alarms serialise"),
    }
}

impl Follower for RuleEngine {
    const KINDS: &'static [DefinitionKind] = &[DefinitionKind::Rule];

    /// Replaces the rules whose stored definition differs from the one in
    /// memory and drops (with their per-device state) those the store no
    /// longer has. The other node checked a rule's script before storing
    /// it; a stored rule that is invalid here is skipped, as at start.
    async fn reload(&self, what: &Reload) -> Result<(), StoreError> {
        let mut stored = BTreeMap::new();
        for (id, json) in self.store.load_rules().await? {
            if !what.covers(DefinitionKind::Rule, "", &id) {
                continue;
            }
            let spec: RuleSpec = serde_json::from_str(&json)
                .map_err(|e| StoreError::Corrupt(format!("rule {id}: {e}")))?;
            stored.insert(id, spec);
        }
        let mut inner = self.inner.lock();
        let gone: Vec<String> = inner
            .rules
            .keys()
            .filter(|id| what.covers(DefinitionKind::Rule, "", id) && !stored.contains_key(*id))
            .cloned()
            .collect();
        for id in gone {
            inner.rules.remove(&id);
            inner.states.retain_rules(|rule| rule != id);
        }
        for (id, spec) in stored {
            if inner.rules.get(&id).is_some_and(|c| c.rule.spec == spec) {
                continue;
            }
            match Rule::new(&id, spec) {
                Ok(rule) => {
                    inner.rules.insert(id, Arc::new(compile(rule)));
                }
                Err(e) => {
                    tracing::warn!(rule = %id, error = %e, "a stored rule is invalid; skipped");
                    inner.rules.remove(&id);
                }
            }
        }
        Ok(())
    }
}

fn compile(rule: Rule) -> Compiled {
    let script = rule.spec.script.as_deref().map(|source| {
        Script::new(&format!(
            "{source}\n;function {SCRIPT_ENTRY}(unit, state) {{ \
             var r = evaluate(unit, state); \
             return {{ result: r === undefined ? null : r, state: state }}; }}"
        ))
    });
    Compiled { rule, script }
}

fn condition_verdict(rule: &Rule, unit: &DataUnit) -> Verdict {
    let lookup = |p: &str| unit.attribute(p);
    let fire = rule.condition.as_ref().is_some_and(|q| q.matches(lookup));
    let clear = !fire && rule.clear.as_ref().is_some_and(|q| q.matches(lookup));
    Verdict {
        fire,
        clear,
        ..Verdict::default()
    }
}

impl Inner {
    /// Applies one rule's verdict on one unit: state, then the alarm.
    fn apply(
        &mut self,
        rule: &Rule,
        unit: &DataUnit,
        verdict: &Verdict,
        script_state: Option<(Value, usize)>,
        now: i64,
        changes: &mut Changes,
    ) {
        let action = if is_stateless(rule) {
            match (verdict.fire, verdict.clear) {
                (true, _) => Action::Fire,
                (false, true) => Action::Clear,
                _ => Action::None,
            }
        } else {
            let key = (rule.id.clone(), unit.device.id.clone());
            let before = self.states.get(&key).cloned().unwrap_or_default();
            if let Some((script, bytes)) = script_state {
                self.states.set_script(&key, Some(script), bytes);
            }
            let state = self.states.state_mut(&key);
            let action = step(rule, state, verdict, unit.reported_at);
            if *state != before {
                changes.dirty.insert(key);
            }
            action
        };
        match action {
            Action::Fire => self.fire(rule, unit, verdict, now, changes),
            Action::Clear => self.clear(&unit.device.id, &rule.spec.alarm.alarm_type, now, changes),
            Action::None => {}
        }
    }

    /// Raises the device's alarm of the rule's type, or updates the active one.
    fn fire(
        &mut self,
        rule: &Rule,
        unit: &DataUnit,
        verdict: &Verdict,
        now: i64,
        changes: &mut Changes,
    ) {
        let template = &rule.spec.alarm;
        let description = verdict
            .description
            .clone()
            .unwrap_or_else(|| render_description(&template.description, unit));
        let severity = verdict.severity.unwrap_or(template.severity);
        let key = (unit.device.id.clone(), template.alarm_type.clone());
        if let Some(alarm) = self.active.get_mut(&key) {
            alarm.count += 1;
            alarm.updated_at = now;
            alarm.description = description;
            alarm.severity = severity;
            alarm.push_data_id(&unit.data_id);
            alarm.version += 1;
            changes.record(AlarmChange::Updated, alarm);
            return;
        }
        let alarm = Alarm {
            id: new_alarm_id(),
            alarm_type: template.alarm_type.clone(),
            category: template.category.clone(),
            sub_category: template.sub_category.clone(),
            severity,
            state: AlarmState::Active,
            acked: false,
            device: AlarmDevice {
                id: unit.device.id.clone(),
                name: unit.device.name.clone(),
            },
            rule: rule.id.clone(),
            description,
            data_ids: vec![unit.data_id.clone()],
            raised_at: now,
            updated_at: now,
            cleared_at: None,
            acked_at: None,
            count: 1,
            version: 1,
        };
        changes.record(AlarmChange::Raised, &alarm);
        self.active.insert(key, alarm);
    }

    /// Clears the device's active alarm of `alarm_type`, if there is one.
    fn clear(&mut self, device: &str, alarm_type: &str, now: i64, changes: &mut Changes) {
        let key = (device.to_string(), alarm_type.to_string());
        if let Some(mut alarm) = self.active.remove(&key) {
            alarm.state = AlarmState::Cleared;
            alarm.cleared_at = Some(now);
            alarm.updated_at = now;
            alarm.version += 1;
            changes.record(AlarmChange::Cleared, &alarm);
        }
    }

    /// An inactivity rule heard from a device: note when, and clear the
    /// alarm its silence raised.
    fn heard_from(
        &mut self,
        rule: &Rule,
        unit: &DataUnit,
        partition: u16,
        now: i64,
        changes: &mut Changes,
    ) {
        let key = (rule.id.clone(), unit.device.id.clone());
        let state = self.states.state_mut(&key);
        state.partition = partition;
        let was_alarmed = state.alarmed;
        state.last_seen = Some(unit.received_at.max(state.last_seen.unwrap_or(0)));
        state.name = unit.device.name.clone();
        state.alarmed = false;
        changes.dirty.insert(key);
        if was_alarmed {
            self.clear(&unit.device.id, &rule.spec.alarm.alarm_type, now, changes);
        }
    }

    /// Raises an alarm for every device an inactivity rule has not heard
    /// from for its duration (once per silence).
    fn silent_devices(&mut self, now: i64, changes: &mut Changes) {
        let rules: Vec<Arc<Compiled>> = self
            .rules
            .values()
            .filter(|c| c.rule.spec.enabled && c.rule.inactivity.is_some())
            .cloned()
            .collect();
        for c in rules {
            let rule = &c.rule;
            let after = rule.inactivity.expect("filtered").as_millis() as i64;
            let silent: Vec<(String, String, i64)> = self
                .states
                .iter_mut()
                .filter(|((r, _), s)| {
                    r == &rule.id
                        && self
                            .partitions
                            .as_ref()
                            .is_none_or(|held| held.contains(&s.partition))
                        && !s.alarmed
                        && s.last_seen.is_some_and(|t| now.saturating_sub(t) >= after)
                })
                .map(|((_, d), s)| {
                    s.alarmed = true;
                    (d.clone(), s.name.clone(), s.last_seen.unwrap_or(0))
                })
                .collect();
            for (device, name, last_seen) in silent {
                changes.dirty.insert((rule.id.clone(), device.clone()));
                let unit = DataUnit {
                    data_id: String::new(),
                    reported_at: last_seen,
                    received_at: last_seen,
                    channel: String::new(),
                    device: weft_model::DeviceInfo {
                        id: device,
                        name,
                        ..Default::default()
                    },
                    measures: Default::default(),
                };
                self.fire(rule, &unit, &Verdict::default(), now, changes);
                if let Some(a) = self
                    .active
                    .get_mut(&(unit.device.id.clone(), rule.spec.alarm.alarm_type.clone()))
                {
                    a.data_ids.retain(|d| !d.is_empty());
                }
                if let Some(e) = changes.events.last_mut() {
                    e.alarm.data_ids.retain(|d| !d.is_empty());
                }
            }
        }
    }
}

/// A new alarm id: 32 random lowercase hex digits (usable as a channel
/// message id and an NGSI entity id).
fn new_alarm_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}
