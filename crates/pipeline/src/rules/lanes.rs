//! The evaluation lanes: each takes the stored units handed to it (or
//! reads those it missed from the store), evaluates its rules on them —
//! conditions and inactivity in one lane, scripts in the other —
//! and commits what changed with its cursor; and the inactivity clock.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use weft_engine::{Call, CodecError};
use weft_model::{DataUnit, Rule};
use weft_store::StoreError;

use super::state::json_size;
use super::verdict::{is_stateless, step, Action, Verdict};
use super::{Changes, Compiled, FedUnit, Inner, Lane, RuleEngine, UnitBatch, SCRIPT_ENTRY};

/// Most units a lane evaluates in one step (one commit) when hand-offs
/// have queued up.
const MAX_STEP_UNITS: usize = 4096;

/// How many units a lane reads from the store at a time when catching up.
const CATCH_UP_BATCH: usize = 1000;

/// How often a lane without rules stores how far it got.
const IDLE_CURSOR_INTERVAL: Duration = Duration::from_secs(5);

impl RuleEngine {
    /// One lane: evaluates what it is handed, catching up from the store
    /// whenever it finds it missed units.
    pub(super) async fn lane_loop(
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
    pub(super) fn cursors(&self, lane: Lane, next: u64) -> Vec<(String, u64)> {
        let held = self.held.lock();
        let floors = &held.floors[lane.index()];
        held.names[lane.index()]
            .iter()
            .filter(|(p, _)| floors.get(p).is_none_or(|f| *f <= next))
            .map(|(_, name)| (name.clone(), next))
            .collect()
    }

    pub(super) fn has_rules(&self, lane: Lane) -> bool {
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
    pub(super) async fn evaluate(&self, lane: Lane, units: &[FedUnit]) -> Option<u64> {
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
            let evicted = inner.states.enforce_total(self.config.state_limits.total);
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
    pub(super) async fn inactivity_loop(self: Arc<Self>, shutdown: CancellationToken) {
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
