//! FIWARE IoT Agent devices (JSON and UltraLight 2.0, over MQTT): the
//! topic names the device and the API key its type, so the body is only
//! attributes, but for `TimeInstant`, when the measure was taken.

use serde_json::Value;
use weft_model::mapping::get_path;
use weft_model::uplink::read_optional_time;

use super::{Envelope, NetworkServer};

/// The attribute saying when a measure was taken (ISO 8601); it becomes
/// `reportedAt`, not a measure.
pub const TIME_FIELD: &str = "TimeInstant";

/// The IoT Agents' devices.
pub struct Iota;

impl NetworkServer for Iota {
    fn device(&self, _body: &Value) -> Option<String> {
        None
    }

    fn envelope(&self, body: &Value) -> Envelope {
        Envelope {
            reported_at: read_optional_time(TIME_FIELD, get_path(body, TIME_FIELD)),
            ..Envelope::empty()
        }
    }
}
