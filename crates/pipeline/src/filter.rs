//! Which events a consumer wants: one filter for the live stream's
//! subscriptions and for channel bridges, so "filtered as the live stream
//! is" means the same thing everywhere.

use serde::{Deserialize, Serialize};
use weft_bus::{Event, Payload};
use weft_model::ngsi::EntityChange;
use weft_model::query::Query;
use weft_model::{AlarmEvent, DataUnit};

use crate::context::{path_matches, EntityResolver};

/// A filter as clients write it. Empty lists match all.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FilterSpec {
    /// Only these channels (data units).
    pub channels: Vec<String>,
    /// Only these device ids (data, alarms) or entity ids (entities).
    pub devices: Vec<String>,
    /// Only these device types (data), alarm types (alarms) or entity
    /// types (entities).
    pub types: Vec<String>,
    /// Simple Query Language over the unit's measures (data), the event's
    /// fields (alarms) or the entity's attributes (entities).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub q: Option<String>,
    /// The tenant (`Fiware-Service`) whose entity changes to receive
    /// (entities); none: the default tenant.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// Service-path patterns as `Fiware-ServicePath` takes them, comma
    /// separated (`/a/#,/b`) (entities); none: every path.
    #[serde(rename = "servicePath", skip_serializing_if = "Option::is_none")]
    pub service_path: Option<String>,
}

impl FilterSpec {
    /// Checks the names a stored filter (a bridge's) lists: channels as
    /// uplinks name them, device and type names without control
    /// characters. The refusal names the field.
    pub fn check_names(&self) -> Result<(), weft_model::validate::Invalid> {
        use weft_model::validate;
        for (i, c) in self.channels.iter().enumerate() {
            validate::channel(&format!("channels[{i}]"), c)?;
        }
        for (i, d) in self.devices.iter().enumerate() {
            validate::label(&format!("devices[{i}]"), d)?;
        }
        for (i, t) in self.types.iter().enumerate() {
            validate::label(&format!("types[{i}]"), t)?;
        }
        Ok(())
    }
}

/// A validated filter, with its query parsed once.
#[derive(Debug, Clone)]
pub struct EventFilter {
    spec: FilterSpec,
    q: Option<Query>,
    /// `servicePath`, split into patterns.
    service_paths: Vec<String>,
}

impl EventFilter {
    /// Validates `spec`; the error is the query's message.
    pub fn new(spec: FilterSpec) -> Result<EventFilter, String> {
        let q = match spec.q.as_deref().filter(|q| !q.trim().is_empty()) {
            Some(q) => Some(Query::parse(q).map_err(|e| e.to_string())?),
            None => None,
        };
        let service_paths: Vec<String> = spec
            .service_path
            .iter()
            .flat_map(|p| p.split(','))
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(str::to_string)
            .collect();
        if let Some(bad) = service_paths.iter().find(|p| !p.starts_with('/')) {
            return Err(format!(
                "servicePath '{bad}' must start with '/' (e.g. /building/# for a subtree)"
            ));
        }
        Ok(EventFilter {
            spec,
            q,
            service_paths,
        })
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
            Payload::Entity(change) => self.matches_entity(change),
        }
    }

    /// Whether an entity change passes: `service` names its tenant (none:
    /// the default one), `servicePath` its paths, `devices` its id, `types`
    /// its type, `q` the entity after the change; `channels` does not
    /// apply.
    pub fn matches_entity(&self, change: &EntityChange) -> bool {
        let s = &self.spec;
        let entity = &change.entity;
        s.service
            .as_deref()
            .unwrap_or(crate::context::DEFAULT_TENANT)
            == change.tenant
            && path_matches(&self.service_paths, &change.service_path)
            && (s.devices.is_empty() || s.devices.contains(&entity.id))
            && (s.types.is_empty() || s.types.contains(&entity.entity_type))
            && self
                .q
                .as_ref()
                .is_none_or(|q| q.matches_with(&EntityResolver(entity, &change.service_path)))
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
