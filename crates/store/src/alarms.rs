//! What the store keeps for the rule engine: rules, alarms, the events
//! announcing alarm changes, and each rule's per-device state. The rule
//! engine commits one [`AlarmBatch`] per run of data units it evaluated,
//! together with its cursor, so an alarm is never lost between the rule
//! firing and its storage, and rule state survives a restart.

use async_trait::async_trait;

use crate::Result;

/// An alarm as stored: its JSON (the model's form, opaque here) and the
/// columns the API filters on.
#[derive(Debug, Clone, PartialEq)]
pub struct AlarmRecord {
    /// Alarm id.
    pub id: String,
    /// Device id.
    pub device: String,
    /// Alarm type.
    pub alarm_type: String,
    /// `active` or `cleared`.
    pub state: String,
    /// Acknowledged.
    pub acked: bool,
    /// Severity name.
    pub severity: String,
    /// When raised, epoch ms (listings are newest first by this).
    pub raised_at: i64,
    /// The alarm's version: a stored alarm is only ever replaced by a
    /// higher version, so concurrent writers (the rule engine, an ack)
    /// cannot put an older state back.
    pub version: u64,
    /// The alarm.
    pub json: String,
}

/// The state a rule keeps for one device (consecutive matches, since
/// when the condition holds, when the device was last seen…), opaque here.
#[derive(Debug, Clone, PartialEq)]
pub struct RuleStateRecord {
    /// Rule id.
    pub rule: String,
    /// Device id.
    pub device: String,
    /// The state; `None` deletes it.
    pub json: Option<String>,
}

/// Everything one evaluation step changed, committed atomically.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AlarmBatch {
    /// Alarms to create or replace (each only if its version is newer).
    pub alarms: Vec<AlarmRecord>,
    /// Events announcing the changes (JSON), appended to the alarm event log.
    pub events: Vec<String>,
    /// Rule states to store or delete.
    pub states: Vec<RuleStateRecord>,
    /// Consumers' new cursors (a rule-engine lane's, one per partition of
    /// the pipeline it evaluates: the next data-unit `seq`; a channel
    /// bridge's: the next event it publishes), read back with
    /// [`UnitStore::cursor`](crate::UnitStore::cursor).
    pub cursors: Vec<(String, u64)>,
}

/// Filters of `GET /api/v1/alarms`; results are newest first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AlarmQuery {
    /// `active` or `cleared`.
    pub state: Option<String>,
    /// Acknowledged or not.
    pub acked: Option<bool>,
    /// Severity name.
    pub severity: Option<String>,
    /// Device id.
    pub device: Option<String>,
    /// Alarm type.
    pub alarm_type: Option<String>,
    /// At most this many (capped at 10,000 by the backend).
    pub limit: usize,
    /// Skipped first.
    pub offset: usize,
}

/// Rules, their per-device state, alarms and alarm events: what the rule
/// engine needs to survive a restart, and what the alarm API reads.
#[async_trait]
pub trait RuleStore: Send + Sync {
    /// Creates or replaces a rule (its JSON); `true` if it was created.
    async fn put_rule(&self, id: &str, json: String) -> Result<bool>;
    /// Deletes a rule and its per-device state; `true` if it existed.
    async fn delete_rule(&self, id: &str) -> Result<bool>;
    /// Every rule as `(id, json)`, by id.
    async fn load_rules(&self) -> Result<Vec<(String, String)>>;
    /// Every stored per-device rule state.
    async fn load_rule_states(&self) -> Result<Vec<RuleStateRecord>>;
    /// Commits alarms, their events, rule state and the rule engine's
    /// cursor atomically; answers the `seq` of the batch's last event.
    async fn commit_alarms(&self, batch: AlarmBatch) -> Result<u64>;
    /// One alarm's JSON.
    async fn get_alarm(&self, id: &str) -> Result<Option<String>>;
    /// Alarms matching `query`, newest first (JSON).
    async fn query_alarms(&self, query: &AlarmQuery) -> Result<Vec<String>>;
    /// Every active alarm (JSON): loaded once at start by the rule engine.
    async fn active_alarms(&self) -> Result<Vec<String>>;
    /// The `seq` of the newest alarm event (0: none): where a new consumer
    /// of [`RuleStore::alarm_events`] starts.
    async fn alarm_events_head(&self) -> Result<u64>;
    /// The alarm events stored after `after` (their `seq`, exclusive),
    /// oldest first: a durable feed for consumers that must see every
    /// alarm change (channel bridges).
    async fn alarm_events(&self, after: u64, limit: usize) -> Result<Vec<(u64, String)>>;
}
