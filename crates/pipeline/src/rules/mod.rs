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
//!
//! The parts: this file holds the engine (its state, start, the runs on
//! the partitions this node holds, the rules' definitions); [`lanes`]
//! evaluates units and runs the inactivity clock; [`alarms`] raises,
//! updates and clears alarms, takes users' acks and clears, and commits
//! and publishes every change; [`state`] holds what rules remember per
//! device, within its bounds; [`verdict`] is the pure step from one
//! rule's outcome on one unit to its state and alarm.

mod alarm_entity;
mod alarms;
mod lanes;
pub mod state;
#[cfg(test)]
mod tests;
pub mod verdict;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use weft_bus::{Bus, Payload, Stream};
use weft_engine::{Engine, EngineConfig, Script};
use weft_model::alarm::AlarmState;
use weft_model::{Alarm, AlarmChange, AlarmEvent, DataUnit, Rule, RuleSpec};
use weft_store::{Store, StoreError};

use crate::context::Context;
use crate::definitions::{DefinitionChange, DefinitionKind, Follower, Reload};
pub use state::StateLimits;
use state::States;
use verdict::RuleState;

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
                    crate::partitions::partition_cursors(&*self.store, lane.cursor(), &partitions)
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
        spec.check(id)
            .map_err(|e| RulesError::Invalid(e.to_string()))?;
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
