//! Device events: what a network server reports about a device besides
//! its uplinks — joins, battery status, acknowledgements, transmissions,
//! logs, locations — and the state they leave on the device's record.
//!
//! ChirpStack v4 posts every event to one URL and names it in `?event=`
//! (`up`, `join`, `status`, `ack`, `txack`, `log`, `location`,
//! `integration`); The Things Stack v3 names it by the message field its
//! body carries (`uplink_message`, `join_accept`, `downlink_ack`,
//! `location_solved`, …). Both arrive on the uplink webhook paths, go
//! through the ingest log like uplinks, and are kept as a [`DeviceEvent`]
//! instead of being decoded (which message is an event, and where it names
//! its device, each network server's module in the pipeline knows). An
//! event of a name weft does not know is kept all the same, under that
//! name.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::UplinkFormat;

/// One event a network server reported about a device, as kept: its kind,
/// when it happened and arrived, and the body exactly as received.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceEvent {
    /// Position of the message in the ingest log: its identity, so a
    /// replayed log entry stores the event once.
    pub seq: u64,
    /// The device the event is about (ChirpStack `deviceInfo.devEui`, TTN
    /// `end_device_ids.device_id`: the ids its uplinks are stored under).
    pub device_id: String,
    /// The event's name as the network server gave it (`join`, `status`,
    /// `join_accept`, `downlink_ack`, …).
    pub event: String,
    /// Which network server sent it (`chirpstack`, `ttn`).
    pub source: String,
    /// When weft accepted it, epoch ms.
    pub received_at: i64,
    /// When it happened by the network server's clock (ChirpStack `time`,
    /// TTN `received_at`), epoch ms; absent when the body has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<i64>,
    /// The fields a user looks for in an event of its kind, named as
    /// ChirpStack names them whichever server sent the event (a join's
    /// `devAddr`, a status's `batteryLevel`, …): read from the body by the
    /// network server's module in the pipeline, which knows where its
    /// messages keep them.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub fields: Map<String, Value>,
    /// The body as received.
    pub body: Value,
}

impl DeviceEvent {
    /// An event message of `format`'s network server about `device_id`
    /// (as its envelope names it), happening at `time` (as it says it;
    /// RFC 3339, ignored when unreadable). `Err` when it names no device
    /// to keep it under, or one that cannot name an entity. Which message
    /// is an event, and where it names its device and time, each network
    /// server's module in the pipeline knows (`crates/pipeline/src/uplink/`).
    pub fn of(
        format: UplinkFormat,
        event: &str,
        device_id: Option<String>,
        time: Option<String>,
        body: Value,
        seq: u64,
        received_at: i64,
    ) -> Result<DeviceEvent, String> {
        let device_id = device_id
            .ok_or_else(|| format!("{} event '{event}' names no device", format.as_str()))?;
        crate::device::check_device_id(&device_id)?;
        Ok(DeviceEvent {
            seq,
            device_id,
            event: event.to_string(),
            source: format.as_str().to_string(),
            received_at,
            time: time.and_then(|t| crate::ngsi::parse_datetime(&t)),
            fields: Map::new(),
            body,
        })
    }

    /// What the device's state keeps of its latest event of this kind:
    /// ChirpStack's and TTN's names for the same thing share one kind
    /// (`join` and `join_accept` are `join`, `ack`/`downlink_ack`/
    /// `downlink_nack` are `ack`, `txack`/`downlink_sent` are `txack`,
    /// `location`/`location_solved` are `location`); any other event is
    /// its own kind.
    pub fn kind(&self) -> &str {
        match self.event.as_str() {
            "join" | "join_accept" => "join",
            "ack" | "downlink_ack" | "downlink_nack" => "ack",
            "txack" | "downlink_sent" => "txack",
            "location" | "location_solved" => "location",
            other => other,
        }
    }

    /// The device-state entry of this event: its name and times, and its
    /// [`fields`](DeviceEvent::fields).
    pub fn summary(&self) -> Value {
        let mut out = Map::new();
        out.insert("event".into(), self.event.clone().into());
        if let Some(t) = self.time {
            out.insert("time".into(), t.into());
        }
        out.insert("receivedAt".into(), self.received_at.into());
        out.extend(self.fields.clone());
        Value::Object(out)
    }
}

/// Whether `name` can be an event name from a request (`?event=`): 1–64
/// of `[A-Za-z0-9_.-]`, so what a sender puts there stays a plain label.
pub fn is_event_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn summaries_hold_the_times_and_the_fields() {
        let mut cs = DeviceEvent::of(
            UplinkFormat::ChirpStack,
            "status",
            Some("0101".into()),
            Some("2026-03-01T10:00:00Z".into()),
            json!({"time": "2026-03-01T10:00:00Z", "deviceInfo": {"devEui": "0101"}, "margin": 7}),
            3,
            5,
        )
        .unwrap();
        assert_eq!(cs.kind(), "status");
        cs.fields.insert("margin".into(), json!(7));
        assert_eq!(
            cs.summary(),
            json!({"event": "status", "time": 1_772_359_200_000i64, "receivedAt": 5, "margin": 7})
        );
        let ttn = DeviceEvent::of(
            UplinkFormat::Ttn,
            "join_accept",
            Some("eui-1".into()),
            None,
            json!({}),
            4,
            6,
        )
        .unwrap();
        assert_eq!(ttn.kind(), "join");
        assert!(DeviceEvent::of(
            UplinkFormat::Ttn,
            "join_accept",
            None,
            None,
            json!({}),
            1,
            1
        )
        .is_err());
    }

    #[test]
    fn event_names_from_requests_are_plain_labels() {
        assert!(is_event_name("txack"));
        assert!(is_event_name("downlink_queue_invalidated"));
        for bad in ["", "a b", "<x>", "é", &"x".repeat(65)] {
            assert!(!is_event_name(bad), "{bad:?}");
        }
    }
}
