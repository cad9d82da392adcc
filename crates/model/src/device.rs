//! Device types and devices, as configured through `/api/v1/device-types`
//! and `/api/v1/devices`.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// How uplinks of one kind of device are decoded and mapped.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceType {
    /// NGSI entity type of this type's devices; defaults to the type name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entity_type: Option<String>,
    /// JavaScript codec for encoded uplinks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decoder: Option<Decoder>,
    /// Field mappings for decoded uplinks (and for decoder output).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processor: Option<Processor>,
}

/// A codec script. Only `javascript` exists today; the field is there so
/// stored types stay readable when another language is added.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decoder {
    /// Script language, `javascript`.
    #[serde(default = "default_language")]
    pub language: String,
    /// The script source, defining `decodeUplink(input)` or `convert(object)`.
    pub script: String,
}

fn default_language() -> String {
    "javascript".to_string()
}

/// Ordered field mappings from an uplink body to a data unit.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Processor {
    /// Applied in order; a later mapping to the same target wins.
    #[serde(default)]
    pub mappings: Vec<Mapping>,
}

/// Copy the value at dotted path `from` in the body to dotted path `to` in
/// the data unit. See [`crate::mapping`] for how targets are resolved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Mapping {
    /// Dotted path in the uplink body (or decoder output).
    pub from: String,
    /// Dotted path in the data unit.
    pub to: String,
}

/// A registered device: labels and static data that enrich every data unit
/// it produces, and the ids of its sub-devices.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// Device id; filled from the path, not the body.
    #[serde(default)]
    pub id: String,
    /// Human name.
    #[serde(default)]
    pub name: String,
    /// Device type name.
    #[serde(rename = "type", default)]
    pub device_type: String,
    /// Channel the device reports on.
    #[serde(default)]
    pub channel: String,
    /// Free labels copied into every data unit.
    #[serde(default)]
    pub records: Map<String, Value>,
    /// Static data copied into every data unit (e.g. `location`).
    #[serde(rename = "static", default)]
    pub static_data: Map<String, Value>,
    /// Sub-devices: measures under index `ref` belong to device `id`.
    #[serde(default)]
    pub sub_devices: Vec<SubDevice>,
}

/// Maps a measure index of a gateway-like device to another device id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubDevice {
    /// Index under `measures` (`"1"`, `"2"`, …); 0 is the device itself.
    #[serde(rename = "ref")]
    pub index: u32,
    /// The sub-device's own device id.
    pub id: String,
}
