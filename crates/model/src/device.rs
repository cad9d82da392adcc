//! Device types and devices, as configured through `/api/v1/device-types`
//! and `/api/v1/devices`.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::validate::{self, Invalid};

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
    /// Checks a type about to be stored as `name`: the name
    /// ([`validate::device_type_name`]); the NGSI entity type its devices
    /// get (its `entityType`, or `name`), which must be one NGSI accepts so
    /// devices of the type never make entities `/v2` cannot serve; its
    /// commands (NGSI attribute names, each once); and its mappings'
    /// dotted paths. The refusal names the field.
    pub fn check(&self, name: &str) -> Result<(), Invalid> {
        validate::device_type_name("name", name)?;
        let mut seen = std::collections::HashSet::new();
        for (i, command) in self.commands.iter().enumerate() {
            crate::ngsi::check_name(crate::ngsi::NameKind::AttrName, command).map_err(|e| {
                Invalid::new(
                    format!("commands[{i}]"),
                    format!(
                        "{} cannot be an NGSI attribute: {}",
                        validate::shown(command),
                        e.description
                    ),
                )
            })?;
            if !seen.insert(command.as_str()) {
                return Err(Invalid::new(
                    format!("commands[{i}]"),
                    format!("{} is listed twice", validate::shown(command)),
                ));
            }
        }
        if let Some(processor) = &self.processor {
            for (i, m) in processor.mappings.iter().enumerate() {
                let at = format!("processor.mappings[{i}]");
                dotted_path("from", &m.from).map_err(|e| e.within(&at))?;
                dotted_path("to", &m.to).map_err(|e| e.within(&at))?;
            }
        }
        let entity_type = self.entity_type.as_deref().unwrap_or(name);
        crate::ngsi::check_name(crate::ngsi::NameKind::EntityType, entity_type).map_err(|e| {
            let field = if self.entity_type.is_some() {
                "entityType"
            } else {
                "name (no entityType given)"
            };
            Invalid::new(
                field,
                format!(
                    "{} cannot be an NGSI entity type: {}",
                    validate::shown(entity_type),
                    e.description
                ),
            )
        })
    }
}

/// A mapping's dotted path: 1–256 characters without control characters,
/// no segment empty (`a..b`, `.a`).
fn dotted_path(field: &str, path: &str) -> Result<(), Invalid> {
    validate::label(field, path)?;
    if path.split('.').any(str::is_empty) {
        return Err(Invalid::new(
            field,
            format!(
                "{} is not a dotted path: a segment is empty",
                validate::shown(path)
            ),
        ));
    }
    Ok(())
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
    /// ChirpStack's device variables: names to text that the type's codec
    /// reads as `input.variables` (a calibration offset, a serial number,
    /// a key), so one codec serves devices that differ in such settings.
    /// Shared behind an `Arc` so each codec call of the device takes a
    /// reference, not a copy; text values only, as in ChirpStack (a number
    /// is refused with a 400 naming the variable).
    #[serde(
        default,
        skip_serializing_if = "no_variables",
        with = "shared_variables"
    )]
    pub variables: Variables,
    /// SHA-256 (hex) of the device's key, its password on weft's embedded
    /// MQTT broker; the key itself is shown once, when made, and never
    /// kept. Stored with the device; the API never shows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_hash: Option<String>,
}

/// A device's variables (names to text), shared between the cached device
/// and every codec call made for it.
pub type Variables = Arc<BTreeMap<String, String>>;

/// Most variables one device may have.
pub const MAX_VARIABLES: usize = 256;

fn no_variables(variables: &Variables) -> bool {
    variables.is_empty()
}

/// Variables as a plain JSON object of strings, in and out: serde's own
/// `Arc` support needs its `rc` feature, and this is the only `Arc` a
/// definition holds.
mod shared_variables {
    use super::*;
    use serde::{Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(v: &Variables, s: S) -> Result<S::Ok, S::Error> {
        v.as_ref().serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Variables, D::Error> {
        BTreeMap::deserialize(d).map(Arc::new)
    }
}

/// Checks a device's variables (those of a device, or those an encode dry
/// run is given): at most [`MAX_VARIABLES`], each name a label (not empty,
/// no control characters, at most 256 characters), each value text of at
/// most [`validate::MAX_TEXT`] characters. The refusal names the variable.
pub fn check_variables(variables: &BTreeMap<String, String>) -> Result<(), Invalid> {
    if variables.len() > MAX_VARIABLES {
        return Err(Invalid::new(
            "variables",
            format!(
                "has {} variables; a device may have at most {MAX_VARIABLES}",
                variables.len()
            ),
        ));
    }
    for (name, value) in variables {
        validate::label("variables", name).map_err(|e| {
            Invalid::new(
                "variables",
                format!("name {}: {}", validate::shown(name), e.problem),
            )
        })?;
        validate::text(&format!("variables.{name}"), value)?;
    }
    Ok(())
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
    /// refused when it is saved rather than producing broken entities or
    /// unreachable devices later: a device or sub-device id that cannot
    /// name an NGSI entity; a `name` with control characters or too long;
    /// a `type` that cannot name a device type, a `channel` that cannot name
    /// an uplink's channel; an empty or unprintable record label; a static
    /// `location` that is not `{lat, lon}` on the globe; an `endpoint` that
    /// is not an http(s) URL; more than [`MAX_VARIABLES`] variables, an
    /// empty or unprintable variable name, or a value longer than
    /// [`validate::MAX_TEXT`] characters; a sub-device at index 0 (the device itself)
    /// or an index used twice, and a sub-device that is the device itself
    /// or appears twice (either would give one uplink two units for one
    /// entity). The refusal names the field.
    pub fn check(&self) -> Result<(), Invalid> {
        let unprefixed = |e: String| {
            e.strip_prefix("device id ")
                .map(str::to_string)
                .unwrap_or(e)
        };
        check_device_id(&self.id).map_err(|e| Invalid::new("id", unprefixed(e)))?;
        validate::object_id("id", &self.id)?;
        validate::name("name", &self.name)?;
        if !self.device_type.is_empty() {
            validate::device_type_name("type", &self.device_type)?;
        }
        if !self.channel.is_empty() {
            validate::channel("channel", &self.channel)?;
        }
        for label in self.records.keys() {
            validate::label("records", label).map_err(|e| {
                Invalid::new(
                    "records",
                    format!("label {}: {}", validate::shown(label), e.problem),
                )
            })?;
        }
        if let Some(location) = self.static_data.get("location") {
            let Some(fields) = location.as_object() else {
                return Err(Invalid::new(
                    "static.location",
                    format!("{location} must be {{\"lat\": <latitude>, \"lon\": <longitude>}}"),
                ));
            };
            let missing = |f: &str| {
                Invalid::new(
                    format!("static.location.{f}"),
                    "is missing: a location is {\"lat\": <latitude>, \"lon\": <longitude>}",
                )
            };
            validate::latitude(
                "static.location.lat",
                fields.get("lat").ok_or_else(|| missing("lat"))?,
            )?;
            validate::longitude(
                "static.location.lon",
                fields.get("lon").ok_or_else(|| missing("lon"))?,
            )?;
        }
        if let Some(endpoint) = &self.endpoint {
            validate::http_url("endpoint", endpoint)?;
        }
        check_variables(&self.variables)?;
        let mut indexes = std::collections::HashSet::new();
        let mut ids = std::collections::HashSet::from([self.id.as_str()]);
        let sub = |i: usize, problem: String| Invalid::new(format!("subDevices[{i}]"), problem);
        for (i, s) in self.sub_devices.iter().enumerate() {
            check_device_id(&s.id).map_err(|e| sub(i, unprefixed(e)))?;
            validate::object_id(&format!("subDevices[{i}].id"), &s.id)?;
            if s.index == 0 {
                return Err(sub(
                    i,
                    format!("'{}' has ref 0, which is the device itself", s.id),
                ));
            }
            if !indexes.insert(s.index) {
                return Err(sub(i, format!("ref {} is used twice", s.index)));
            }
            if !ids.insert(s.id.as_str()) {
                return Err(sub(
                    i,
                    if s.id == self.id {
                        format!("'{}': a device cannot be its own sub-device", s.id)
                    } else {
                        format!("'{}' is listed twice", s.id)
                    },
                ));
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
        let err = |d: Device| d.check().unwrap_err().to_string();
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

    fn refused(v: Value) -> String {
        let d: Device = serde_json::from_value(v).unwrap();
        d.check().unwrap_err().to_string()
    }

    #[test]
    fn device_fields_are_checked_and_named() {
        let ok: Device = serde_json::from_value(serde_json::json!({
            "id": "dev-1", "name": "Soil 1", "type": "em300th", "channel": "irrigation",
            "records": {"Project": "perf"}, "static": {"location": {"lat": 41.15, "lon": -8.61}},
            "endpoint": "https://device.example/down"}))
        .unwrap();
        assert_eq!(ok.check(), Ok(()));
        let cases = [
            (serde_json::json!({"id": "d", "type": "[]"}), "type '[]'"),
            (
                serde_json::json!({"id": "d", "channel": "bad chan!"}),
                "channel 'bad chan!'",
            ),
            (serde_json::json!({"id": "d", "name": "a\u{7}"}), "name "),
            (
                serde_json::json!({"id": "d", "records": {"": 1}}),
                "records label ''",
            ),
            (
                serde_json::json!({"id": "d", "static": {"location": {"lat": 999, "lon": 0}}}),
                "static.location.lat 999",
            ),
            (
                serde_json::json!({"id": "d", "static": {"location": {"lat": 0, "lon": 181}}}),
                "static.location.lon 181",
            ),
            (
                serde_json::json!({"id": "d", "static": {"location": {"lat": 0}}}),
                "static.location.lon is missing",
            ),
            (
                serde_json::json!({"id": "d", "static": {"location": "Porto"}}),
                "static.location ",
            ),
            (
                serde_json::json!({"id": "d", "endpoint": "not a url"}),
                "endpoint 'not a url'",
            ),
            (serde_json::json!({"id": "a b"}), "id 'a b'"),
        ];
        for (body, start) in cases {
            let e = refused(body.clone());
            assert!(e.starts_with(start), "{body}: {e}");
        }
    }

    /// Variables are text, kept as given and left out of the JSON when
    /// there are none; a value of another JSON type is refused naming the
    /// variable, and names and values are held to their limits.
    #[test]
    fn variables_are_text_named_in_refusals() {
        let parse = |v: Value| crate::validate::from_value::<Device>(v);
        let d =
            parse(serde_json::json!({"id": "d", "variables": {"offset": "1.5", "serial": "A7"}}))
                .unwrap();
        assert_eq!(d.variables.get("offset").map(String::as_str), Some("1.5"));
        assert_eq!(d.check(), Ok(()));
        let back = serde_json::to_value(&d).unwrap();
        assert_eq!(
            back["variables"],
            serde_json::json!({"offset": "1.5", "serial": "A7"})
        );
        let none = serde_json::to_value(parse(serde_json::json!({"id": "d"})).unwrap()).unwrap();
        assert!(none.get("variables").is_none(), "{none}");

        for bad in [
            serde_json::json!(5),
            serde_json::json!(true),
            serde_json::json!({"a": "b"}),
        ] {
            let e = parse(serde_json::json!({"id": "d", "variables": {"offset": bad}}))
                .unwrap_err()
                .to_string();
            assert!(e.starts_with("variables.offset: invalid type"), "{e}");
        }
        let e = parse(serde_json::json!({"id": "d", "variables": ["a"]}))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("variables: invalid type"), "{e}");

        let e = refused(serde_json::json!({"id": "d", "variables": {"": "x"}}));
        assert!(e.starts_with("variables name '': must not be empty"), "{e}");
        let e = refused(serde_json::json!({"id": "d", "variables": {"k": "a\u{1}b"}}));
        assert!(e.starts_with("variables.k "), "{e}");
        let long = "x".repeat(crate::validate::MAX_TEXT + 1);
        let e = refused(serde_json::json!({"id": "d", "variables": {"k": long}}));
        assert!(e.starts_with("variables.k is longer than"), "{e}");
        let many: Map<String, Value> = (0..=MAX_VARIABLES)
            .map(|i| (format!("v{i}"), Value::from("x")))
            .collect();
        let e = refused(serde_json::json!({"id": "d", "variables": many}));
        assert!(e.starts_with("variables has 257 variables"), "{e}");
    }

    #[test]
    fn device_type_fields_are_checked_and_named() {
        let t = |v: Value| serde_json::from_value::<DeviceType>(v).unwrap();
        assert_eq!(t(serde_json::json!({})).check("em300-th"), Ok(()));
        let e = t(serde_json::json!({}))
            .check("[]")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("name '[]'"), "{e}");
        let e = t(serde_json::json!({"processor": {"mappings": [{"from": "a", "to": ""}]}}))
            .check("ok")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("processor.mappings[0].to "), "{e}");
        let e = t(serde_json::json!({"processor": {"mappings": [{"from": "a..b", "to": "x"}]}}))
            .check("ok")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("processor.mappings[0].from "), "{e}");
        let e = t(serde_json::json!({"commands": ["ring", "ring"]}))
            .check("ok")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("commands[1] 'ring'"), "{e}");
        let e = t(serde_json::json!({"entityType": "a b"}))
            .check("ok")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("entityType 'a b'"), "{e}");
    }
}
