//! Which events a consumer wants: one filter for the live stream's
//! subscriptions and for channel bridges, so "filtered as the live stream
//! is" means the same thing everywhere.

use serde::{Deserialize, Serialize};
use weft_bus::{Event, Payload};
use weft_model::query::Query;
use weft_model::{AlarmEvent, DataUnit};

/// A filter as clients write it. Empty lists match all.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FilterSpec {
    /// Only these channels (data units).
    pub channels: Vec<String>,
    /// Only these device ids.
    pub devices: Vec<String>,
    /// Only these device types (data) or alarm types (alarms).
    pub types: Vec<String>,
    /// Simple Query Language over the unit's measures (data) or the
    /// event's fields (alarms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub q: Option<String>,
}

/// A validated filter, with its query parsed once.
#[derive(Debug, Clone)]
pub struct EventFilter {
    spec: FilterSpec,
    q: Option<Query>,
}

impl EventFilter {
    /// Validates `spec`; the error is the query's message.
    pub fn new(spec: FilterSpec) -> Result<EventFilter, String> {
        let q = match spec.q.as_deref().filter(|q| !q.trim().is_empty()) {
            Some(q) => Some(Query::parse(q).map_err(|e| e.to_string())?),
            None => None,
        };
        Ok(EventFilter { spec, q })
    }

    /// The filter as given.
    pub fn spec(&self) -> &FilterSpec {
        &self.spec
    }

    /// Whether a bus event passes.
    pub fn matches(&self, event: &Event) -> bool {
        match &event.payload {
            Payload::Data(unit) => self.matches_unit(unit),
            Payload::Alarm(alarm) => self.matches_alarm(alarm),
        }
    }

    /// Whether a data unit passes.
    pub fn matches_unit(&self, unit: &DataUnit) -> bool {
        let s = &self.spec;
        (s.channels.is_empty() || s.channels.contains(&unit.channel))
            && (s.devices.is_empty() || s.devices.contains(&unit.device.id))
            && (s.types.is_empty() || s.types.contains(&unit.device.device_type))
            && self
                .q
                .as_ref()
                .is_none_or(|q| q.matches(|p| unit.attribute(p)))
    }

    /// Whether an alarm event passes: `devices` by the alarm's device,
    /// `types` by alarm type, `q` over the event's fields
    /// (`severity==critical;change==raised`); `channels` does not apply.
    pub fn matches_alarm(&self, alarm: &AlarmEvent) -> bool {
        let s = &self.spec;
        (s.devices.is_empty() || s.devices.contains(&alarm.alarm.device.id))
            && (s.types.is_empty() || s.types.contains(&alarm.alarm.alarm_type))
            && self.q.as_ref().is_none_or(|q| {
                let json = serde_json::to_value(alarm).unwrap_or_default();
                q.matches(|p| weft_model::mapping::get_path(&json, p))
            })
    }
}
