//! The data unit: the canonical record that leaves the decode/process stage,
//! is stored, updates the device's context entity and is pushed to live
//! subscribers. See docs/data-units.md for the field-by-field description.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// One device's measures at one moment. `dataId` is the idempotency key:
/// the same `dataId` twice is stored once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DataUnit {
    /// Idempotency key, from the uplink (sensae `uuid`, ChirpStack
    /// `deduplicationId`, …) or derived from the ingest-log position.
    pub data_id: String,
    /// When the device (or its network server) says the reading was taken, epoch ms.
    pub reported_at: i64,
    /// When weft accepted the uplink, epoch ms.
    pub received_at: i64,
    /// The channel the uplink came in on (a grouping chosen by the sender).
    pub channel: String,
    /// The device the measures belong to, enriched with its records.
    pub device: DeviceInfo,
    /// Measures by name, e.g. `{"temperature":{"celsius":37}}`.
    pub measures: Map<String, Value>,
}

/// The device part of a data unit.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct DeviceInfo {
    /// Device id (also the NGSI entity id).
    pub id: String,
    /// Human name.
    #[serde(default)]
    pub name: String,
    /// Device type name.
    #[serde(rename = "type", default)]
    pub device_type: String,
    /// Free labels from the device record.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub records: Map<String, Value>,
    /// Static data from the device record (fixed location, battery range…).
    #[serde(rename = "static", default, skip_serializing_if = "Map::is_empty")]
    pub static_data: Map<String, Value>,
}

/// Why an uplink produced no data unit. Stable names, shown by the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailureReason {
    /// No device type could be determined, or the named one does not exist.
    UnknownType,
    /// The decoder threw, reported `errors`, or returned something unusable.
    DecodeError,
    /// The decoder ran past its time limit and was interrupted.
    Timeout,
    /// The decoder ran out of its memory allowance.
    OutOfMemory,
    /// The body lacks something the format requires (no payload, bad
    /// base64, a reported time that is no time…).
    InvalidUplink,
    /// The device lies outside the pins of the ingest key the uplink came
    /// with (registered in another channel, or with another type).
    Forbidden,
    /// The device is registered with another device type than the one the
    /// uplink names.
    TypeMismatch,
}

impl FailureReason {
    /// The stable name used in storage and the API.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureReason::UnknownType => "UnknownType",
            FailureReason::DecodeError => "DecodeError",
            FailureReason::Timeout => "Timeout",
            FailureReason::OutOfMemory => "OutOfMemory",
            FailureReason::InvalidUplink => "InvalidUplink",
            FailureReason::Forbidden => "Forbidden",
            FailureReason::TypeMismatch => "TypeMismatch",
        }
    }

    /// Inverse of [`FailureReason::as_str`].
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "UnknownType" => FailureReason::UnknownType,
            "DecodeError" => FailureReason::DecodeError,
            "Timeout" => FailureReason::Timeout,
            "OutOfMemory" => FailureReason::OutOfMemory,
            "InvalidUplink" => FailureReason::InvalidUplink,
            "Forbidden" => FailureReason::Forbidden,
            "TypeMismatch" => FailureReason::TypeMismatch,
            _ => return None,
        })
    }
}

/// An uplink that could not be turned into data units, kept with its
/// reason so nothing is silently dropped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FailedUplink {
    /// Its ingest-log position (unique).
    pub seq: u64,
    /// When it was received, epoch ms.
    pub received_at: i64,
    /// `encoded`, `decoded`, `ttn` or `chirpstack`.
    pub format: String,
    /// Channel, if known.
    pub channel: Option<String>,
    /// Device type, if known.
    pub device_type: Option<String>,
    /// Machine-readable reason.
    pub reason: FailureReason,
    /// Human-readable detail (the engine's message, the codec's `errors`…).
    pub description: String,
    /// The uplink body as received (JSON).
    pub body: Value,
}

impl DataUnit {
    /// The value a query sees for attribute `path`: the measure itself,
    /// except that a measure holding exactly one scalar under a unit name
    /// (`{"celsius":37}`) reads as that scalar, so `temperature>40` works on
    /// `{"temperature":{"celsius":37}}`. Dotted paths reach inside
    /// (`temperature.celsius`).
    pub fn attribute(&self, path: &str) -> Option<&Value> {
        let (head, rest) = match path.split_once('.') {
            Some((h, r)) => (h, Some(r)),
            None => (path, None),
        };
        let measure = self.measures.get(head)?;
        match rest {
            Some(rest) => crate::mapping::get_path(measure, rest),
            None => Some(unit_scalar(measure).unwrap_or(measure)),
        }
    }
}

/// `{"celsius":37}` → `37`: the scalar of a single-entry unit object.
pub fn unit_scalar(measure: &Value) -> Option<&Value> {
    match measure {
        Value::Object(map) if map.len() == 1 => {
            let v = map.values().next()?;
            (!v.is_object() && !v.is_array()).then_some(v)
        }
        _ => None,
    }
}
