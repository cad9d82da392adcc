//! The alarms' side of the rule engine: what users do to alarms (`ack`,
//! `clear`) and read of them, how an alarm is raised, updated and cleared
//! in memory ([`Inner::fire`], [`Inner::clear`]), and how every change is
//! stored with the rule state and cursors of its step, then published on
//! the bus and written to the alarm's NGSI entity ([`RuleEngine::commit`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use weft_bus::{Event, Payload, Stream};
use weft_model::alarm::{AlarmDevice, AlarmState};
use weft_model::rule::render_description;
use weft_model::{Alarm, AlarmChange, DataUnit, Rule};
use weft_store::{AlarmBatch, AlarmQuery, AlarmRecord, RuleStateRecord, StoreError};

use super::verdict::Verdict;
use super::{alarm_entity, Changes, Inner, RuleEngine};

impl RuleEngine {
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

    /// Stores `changes` (with a lane's cursor), retrying until the store
    /// takes them, then publishes the events and updates the alarms' NGSI
    /// entities. The caller holds the order lock.
    pub(super) async fn commit(
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
    pub(super) async fn entity_loop(self: Arc<Self>, mut rx: mpsc::Receiver<Alarm>) {
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

impl Inner {
    /// Raises the device's alarm of the rule's type, or updates the active one.
    pub(super) fn fire(
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
    pub(super) fn clear(
        &mut self,
        device: &str,
        alarm_type: &str,
        now: i64,
        changes: &mut Changes,
    ) {
        let key = (device.to_string(), alarm_type.to_string());
        if let Some(mut alarm) = self.active.remove(&key) {
            alarm.state = AlarmState::Cleared;
            alarm.cleared_at = Some(now);
            alarm.updated_at = now;
            alarm.version += 1;
            changes.record(AlarmChange::Cleared, &alarm);
        }
    }
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

/// A new alarm id: 32 random lowercase hex digits (usable as a channel
/// message id and an NGSI entity id).
fn new_alarm_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}
