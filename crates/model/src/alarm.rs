//! Alarms: what a rule raises about a device, with the lifecycle users know
//! from ThingsBoard — active or cleared, acknowledged or not — and the
//! events that announce each change on the live `alarms` stream, as NGSI
//! entity changes and into channels.
//!
//! At most one alarm per (device, alarm type) is active: a repeat of the
//! condition updates it (`count`, `updatedAt`, `dataIds`) instead of
//! raising another. Every change bumps `version`, which orders writes of
//! the same alarm and names each event (`eventId`).

use serde::{Deserialize, Serialize};

/// How bad an alarm is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Service-affecting, act now.
    Critical,
    /// Service-affecting, act soon.
    Major,
    /// Not service-affecting yet.
    Minor,
    /// Something to look at.
    Warning,
    /// Unknown severity (the default).
    #[default]
    Indeterminate,
}

impl Severity {
    /// The name used in the API and in filters.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Critical => "critical",
            Severity::Major => "major",
            Severity::Minor => "minor",
            Severity::Warning => "warning",
            Severity::Indeterminate => "indeterminate",
        }
    }

    /// Inverse of [`Severity::as_str`].
    pub fn parse(s: &str) -> Option<Severity> {
        [
            Severity::Critical,
            Severity::Major,
            Severity::Minor,
            Severity::Warning,
            Severity::Indeterminate,
        ]
        .into_iter()
        .find(|v| v.as_str() == s)
    }
}

/// Whether the alarm's condition is still on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AlarmState {
    /// Raised and not cleared.
    Active,
    /// Cleared by its rule's `clear`, by data after inactivity, or by a user.
    Cleared,
}

impl AlarmState {
    /// The name used in the API and in filters.
    pub fn as_str(self) -> &'static str {
        match self {
            AlarmState::Active => "active",
            AlarmState::Cleared => "cleared",
        }
    }
}

/// The device an alarm is about.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct AlarmDevice {
    /// Device id.
    pub id: String,
    /// Device name, as in its data units.
    #[serde(default)]
    pub name: String,
}

/// How many triggering `dataIds` an alarm keeps (the most recent ones), so
/// an alarm that repeats for days stays small.
pub const MAX_DATA_IDS: usize = 16;

/// One alarm, as stored and as the API returns it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Alarm {
    /// Unique id (32 lowercase hex digits).
    pub id: String,
    /// Alarm type, from the rule.
    #[serde(rename = "type")]
    pub alarm_type: String,
    /// Grouping, from the rule.
    pub category: String,
    /// Sub-grouping, from the rule.
    pub sub_category: String,
    /// How bad it is.
    pub severity: Severity,
    /// Active or cleared.
    pub state: AlarmState,
    /// Whether a user acknowledged it.
    pub acked: bool,
    /// The device it is about.
    pub device: AlarmDevice,
    /// The id of the rule that raised it.
    pub rule: String,
    /// The rule's description template filled from the latest triggering unit.
    pub description: String,
    /// The most recent triggering data units (at most [`MAX_DATA_IDS`]).
    pub data_ids: Vec<String>,
    /// When it was raised, epoch ms.
    pub raised_at: i64,
    /// When it last changed, epoch ms.
    pub updated_at: i64,
    /// When it was cleared, epoch ms.
    pub cleared_at: Option<i64>,
    /// When it was acknowledged, epoch ms.
    #[serde(default)]
    pub acked_at: Option<i64>,
    /// How many times the condition fired while it was active.
    pub count: u64,
    /// Bumped on every change; orders writes and names events.
    #[serde(default)]
    pub version: u64,
}

/// What happened to an alarm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AlarmChange {
    /// A new active alarm.
    Raised,
    /// The active alarm fired again (`count` went up).
    Updated,
    /// It was cleared.
    Cleared,
    /// It was acknowledged.
    Acked,
}

impl AlarmChange {
    /// The name used in events.
    pub fn as_str(self) -> &'static str {
        match self {
            AlarmChange::Raised => "raised",
            AlarmChange::Updated => "updated",
            AlarmChange::Cleared => "cleared",
            AlarmChange::Acked => "acked",
        }
    }
}

/// One change of one alarm, as published on the `alarms` stream: the
/// alarm's fields as they are after the change, plus what changed and an
/// id for the event (`<alarm id>-<version>`, unique and usable as a
/// channel message id).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AlarmEvent {
    /// `<alarm id>-<version>`.
    pub event_id: String,
    /// What happened.
    pub change: AlarmChange,
    /// The alarm after the change.
    #[serde(flatten)]
    pub alarm: Alarm,
}

impl AlarmEvent {
    /// The event announcing `change` of `alarm` (already bumped).
    pub fn new(change: AlarmChange, alarm: Alarm) -> AlarmEvent {
        AlarmEvent {
            event_id: format!("{}-{}", alarm.id, alarm.version),
            change,
            alarm,
        }
    }
}

impl Alarm {
    /// Records another triggering data unit.
    pub fn push_data_id(&mut self, data_id: &str) {
        if self.data_ids.len() >= MAX_DATA_IDS {
            self.data_ids.remove(0);
        }
        self.data_ids.push(data_id.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An event serialises as the alarm's own fields plus `eventId` and
    /// `change`, so a consumer reads `event.description` directly.
    #[test]
    fn events_flatten_the_alarm() {
        let alarm = Alarm {
            id: "abc".into(),
            alarm_type: "hot".into(),
            category: String::new(),
            sub_category: String::new(),
            severity: Severity::Critical,
            state: AlarmState::Active,
            acked: false,
            device: AlarmDevice {
                id: "d".into(),
                name: "D".into(),
            },
            rule: "r".into(),
            description: "x".into(),
            data_ids: vec!["u".into()],
            raised_at: 1,
            updated_at: 1,
            cleared_at: None,
            acked_at: None,
            count: 1,
            version: 1,
        };
        let json = serde_json::to_value(AlarmEvent::new(AlarmChange::Raised, alarm)).unwrap();
        assert_eq!(json["eventId"], "abc-1");
        assert_eq!(json["change"], "raised");
        assert_eq!(json["severity"], "critical");
        assert_eq!(json["device"]["id"], "d");
        assert_eq!(json["clearedAt"], serde_json::Value::Null);
        let mut a: Alarm = serde_json::from_value(json).unwrap();
        for i in 0..20 {
            a.push_data_id(&i.to_string());
        }
        assert_eq!(a.data_ids.len(), MAX_DATA_IDS);
        assert_eq!(a.data_ids.last().unwrap(), "19");
    }
}
