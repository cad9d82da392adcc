//! Device types and devices, as configured through `/api/v1/device-types`
//! and `/api/v1/devices`.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// How uplinks of one kind of device are decoded and mapped. Unknown
/// fields are refused, here and in its parts, so a misspelt key is named
/// in a 400 instead of silently doing nothing.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
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
    /// NGSI commands the type's devices take, as the FIWARE IoT Agents
    /// declare them: updating one of these attributes on a device's entity
    /// queues a downlink, and `<command>_status` / `<command>_info` follow it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub commands: Vec<String>,
}

/// A codec script. Only `javascript` exists today; the field is there so
/// stored types stay readable when another language is added.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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

impl DeviceType {
    /// Checks that the NGSI entity type this type's devices get (its
    /// `entityType`, or `name`, the type's own name) is one NGSI accepts,
    /// so devices of the type never make entities `/v2` cannot serve.
    pub fn check(&self, name: &str) -> Result<(), String> {
        let mut seen = std::collections::HashSet::new();
        for command in &self.commands {
            crate::ngsi::check_name(crate::ngsi::NameKind::AttrName, command).map_err(|e| {
                format!(
                    "command '{}' cannot be an NGSI attribute: {}",
                    command.escape_default(),
                    e.description
                )
            })?;
            if !seen.insert(command.as_str()) {
                return Err(format!("command '{command}' is listed twice"));
            }
        }
        let entity_type = self.entity_type.as_deref().unwrap_or(name);
        crate::ngsi::check_name(crate::ngsi::NameKind::EntityType, entity_type).map_err(|e| {
            let field = if self.entity_type.is_some() {
                "entityType"
            } else {
                "the type's name (no entityType given)"
            };
            format!(
                "{field} '{}' cannot be an NGSI entity type: {}",
                entity_type.escape_default(),
                e.description
            )
        })
    }
}

/// Ordered field mappings from an uplink body to a data unit.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Processor {
    /// Applied in order; a later mapping to the same target wins.
    #[serde(default)]
    pub mappings: Vec<Mapping>,
}

/// Copy the value at dotted path `from` in the body to dotted path `to` in
/// the data unit. See [`crate::mapping`] for how targets are resolved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mapping {
    /// Dotted path in the uplink body (or decoder output).
    pub from: String,
    /// Dotted path in the data unit.
    pub to: String,
}

/// A registered device: labels and static data that enrich every data unit
/// it produces, and the ids of its sub-devices. Unknown fields are refused
/// (a misspelt `sub_devices` would otherwise be dropped without a word).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
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
    /// An HTTP endpoint of the device's own, as an IoT Agent device has:
    /// its downlinks and commands are POSTed there, whatever its uplinks
    /// came through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// SHA-256 (hex) of the device's key, its password on weft's embedded
    /// MQTT broker; the key itself is shown once, when made, and never
    /// kept. Stored with the device; the API never shows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_hash: Option<String>,
}

/// The prefix of device keys, so one is recognisable in a configuration.
pub const DEVICE_KEY_PREFIX: &str = "wdk_";

/// A new random device key (`wdk_` and 32 letters and digits) and the hash
/// kept for it.
pub fn new_device_key() -> (String, String) {
    use rand::distr::{Alphanumeric, SampleString};
    let key = format!(
        "{DEVICE_KEY_PREFIX}{}",
        Alphanumeric.sample_string(&mut rand::rng(), 32)
    );
    let hash = device_key_hash(key.as_bytes());
    (key, hash)
}

/// The hash a device key is kept as.
pub fn device_key_hash(key: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(key))
}

/// Maps a measure index of a gateway-like device to another device id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubDevice {
    /// Index under `measures` (`"1"`, `"2"`, …); 0 is the device itself.
    #[serde(rename = "ref")]
    pub index: u32,
    /// The sub-device's own device id.
    pub id: String,
}

impl Device {
    /// Whether `key` is this device's key.
    pub fn key_matches(&self, key: &[u8]) -> bool {
        self.key_hash
            .as_deref()
            .is_some_and(|h| h == device_key_hash(key))
    }

    /// Checks what a device definition may not hold, so a bad one is
    /// refused when it is saved rather than producing broken entities
    /// later: a device or sub-device id that cannot name an NGSI entity,
    /// a sub-device at index 0 (the device itself) or an index used twice,
    /// and a sub-device that is the device itself or appears twice (either
    /// would give one uplink two units for one entity).
    pub fn check(&self) -> Result<(), String> {
        check_device_id(&self.id)?;
        if let Some(endpoint) = &self.endpoint {
            if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
                return Err(format!(
                    "endpoint '{}' must be an http:// or https:// URL",
                    endpoint.escape_default()
                ));
            }
        }
        let mut indexes = std::collections::HashSet::new();
        let mut ids = std::collections::HashSet::from([self.id.as_str()]);
        for sub in &self.sub_devices {
            check_device_id(&sub.id)?;
            if sub.index == 0 {
                return Err(format!(
                    "sub-device '{}' has ref 0, which is the device itself",
                    sub.id
                ));
            }
            if !indexes.insert(sub.index) {
                return Err(format!("sub-device ref {} is used twice", sub.index));
            }
            if !ids.insert(sub.id.as_str()) {
                return Err(if sub.id == self.id {
                    format!("device '{}' cannot be its own sub-device", sub.id)
                } else {
                    format!("sub-device '{}' is listed twice", sub.id)
                });
            }
        }
        Ok(())
    }
}

/// Checks that `id` can name a device's NGSI entity (Orion's entity id
/// rules: 1–256 printable ASCII characters, none of `&?/#<>"'=;()`).
pub fn check_device_id(id: &str) -> Result<(), String> {
    crate::ngsi::check_name(crate::ngsi::NameKind::EntityId, id).map_err(|e| {
        let shown: String = id.chars().take(64).flat_map(char::escape_default).collect();
        let more = if id.chars().count() > 64 { "…" } else { "" };
        format!(
            "device id '{shown}{more}' cannot name an NGSI entity: {}",
            e.description
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(id: &str, subs: &[(u32, &str)]) -> Device {
        Device {
            id: id.into(),
            sub_devices: subs
                .iter()
                .map(|(index, id)| SubDevice {
                    index: *index,
                    id: id.to_string(),
                })
                .collect(),
            ..Device::default()
        }
    }

    #[test]
    fn sub_device_loops_and_duplicates_are_refused() {
        assert_eq!(device("gw", &[(1, "a"), (2, "b")]).check(), Ok(()));
        let err = |d: Device| d.check().unwrap_err();
        assert!(err(device("gw", &[(1, "gw")])).contains("its own sub-device"));
        assert!(err(device("gw", &[(1, "a"), (2, "a")])).contains("listed twice"));
        assert!(err(device("gw", &[(1, "a"), (1, "b")])).contains("used twice"));
        assert!(err(device("gw", &[(0, "a")])).contains("ref 0"));
    }

    #[test]
    fn device_ids_must_name_ngsi_entities() {
        assert!(check_device_id("eui-70b3d57ed0000001").is_ok());
        for bad in ["", "a b", "a<b", "x;drop", "tab\there", "a/b"] {
            assert!(check_device_id(bad).is_err(), "{bad:?}");
        }
        let long = "x".repeat(100_000);
        let message = check_device_id(&long).unwrap_err();
        assert!(
            message.len() < 300,
            "the message does not repeat the id whole"
        );
        assert!(device("ok", &[(1, "no\u{1}")]).check().is_err());
    }
}
