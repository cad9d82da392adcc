//! An uplink as the ingest log keeps it: the raw body exactly as received,
//! plus what the request's path said about it. Decoding happens later, in
//! the pipeline, so that a 202 costs only one durable append.

use serde::{Deserialize, Serialize};

/// Which wire format an uplink arrived in; decides how the pipeline finds
/// the payload, the device and the identity fields in the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UplinkFormat {
    /// `POST /sensor-data/{channel}/encoded/{type}`: the body carries a raw
    /// payload (Helium style `payload` base64 + `port`, or `bytes`), run the
    /// type's decoder.
    SensaeEncoded,
    /// `POST /sensor-data/{channel}/decoded/{type}`: the body's fields are
    /// values already, run the type's processor mappings.
    SensaeDecoded,
    /// The Things Stack (TTN v3) webhook uplink message.
    Ttn,
    /// ChirpStack v4 uplink event.
    ChirpStack,
    /// A FIWARE IoT Agent measure (`/json/{apikey}/{device}/attrs`, or an
    /// UltraLight 2.0 group read into one JSON object): every field of the
    /// body is an attribute of the device named by the topic, except
    /// `TimeInstant`, which says when it was measured.
    Iota,
}

impl UplinkFormat {
    /// Stable short name, used as the stored column value and in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            UplinkFormat::SensaeEncoded => "encoded",
            UplinkFormat::SensaeDecoded => "decoded",
            UplinkFormat::Ttn => "ttn",
            UplinkFormat::ChirpStack => "chirpstack",
            UplinkFormat::Iota => "iota",
        }
    }

    /// Inverse of [`UplinkFormat::as_str`].
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "encoded" => UplinkFormat::SensaeEncoded,
            "decoded" => UplinkFormat::SensaeDecoded,
            "ttn" => UplinkFormat::Ttn,
            "chirpstack" => UplinkFormat::ChirpStack,
            "iota" => UplinkFormat::Iota,
            _ => return None,
        })
    }
}

/// An uplink accepted by an ingest endpoint and about to be appended to the
/// ingest log. The body has been checked to be a JSON object and nothing
/// more.
#[derive(Debug, Clone, PartialEq)]
pub struct NewUplink {
    /// When weft received it, epoch ms; becomes the data unit's `receivedAt`.
    pub received_at: i64,
    /// How to read the body.
    pub format: UplinkFormat,
    /// Channel named by the request (sensae path or `?channel=`), if any.
    pub channel: Option<String>,
    /// Device type named by the request (sensae path or `?type=`), if any.
    pub device_type: Option<String>,
    /// The event the network server named in the request when the message
    /// is not an uplink (ChirpStack's `?event=join`, …); `None` for
    /// uplinks and for formats whose body says what it is (TTN). See
    /// [`crate::device_event`].
    pub event: Option<String>,
    /// The device the transport itself names, which wins over whatever
    /// the body says: the `{device}` of an MQTT topic, the device an
    /// embedded-broker client authenticated as. `None` on HTTP paths,
    /// where the body names the device.
    pub device_id: Option<String>,
    /// Where the message came from when that is not an HTTP path: the
    /// `[mqtt.sources.<name>]` it arrived on, or `mqtt` for the embedded
    /// broker. Kept so that a reply to the device (a downlink) can go back
    /// over the same connection.
    pub source: Option<String>,
    /// The partition of the log it is processed in: the pipeline is split
    /// by device across a cluster's nodes ([`partition_of`]), so all the
    /// uplinks of one device are decoded, and its rules evaluated, by one
    /// node in order. Set when the uplink is accepted; 0 on one node.
    pub partition: u16,
    /// What the credential the uplink came with holds it to (an ingest
    /// key's channel and device type): the device the uplink turns out to
    /// name must be within them, at accept and again once decoded.
    /// Empty for credentials without pins (the global ingest key, an admin
    /// key, MQTT).
    pub pins: UplinkPins,
    /// The request body, byte for byte.
    pub body: Vec<u8>,
}

/// An ingest credential's pins, carried with each uplink it let in: the
/// devices it may write are those registered in `channel` and with
/// `device_type` (each when set), and devices not registered yet, which
/// are registered within the pins when first seen.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UplinkPins {
    /// The channel the credential is limited to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    /// The device type the credential is limited to.
    #[serde(
        default,
        rename = "deviceType",
        skip_serializing_if = "Option::is_none"
    )]
    pub device_type: Option<String>,
}

impl UplinkPins {
    /// Whether the pins hold nothing (a credential that may write any device).
    pub fn is_empty(&self) -> bool {
        self.channel.is_none() && self.device_type.is_none()
    }

    /// Why the registered `device` lies outside these pins, or `None` when
    /// it is within them. A device registered without a channel (or type)
    /// is within no channel (or type) pin.
    pub fn refusal(&self, device: &crate::Device) -> Option<String> {
        let outside = |pinned: &Option<String>, registered: &str| {
            pinned.as_deref().filter(|p| *p != registered).map(|p| {
                let registered = if registered.is_empty() {
                    "none".to_string()
                } else {
                    format!("'{registered}'")
                };
                (p.to_string(), registered)
            })
        };
        if let Some((pin, registered)) = outside(&self.channel, &device.channel) {
            return Some(format!(
                "device '{}' is registered in channel {registered}; this ingest key is limited to channel '{pin}'",
                device.id
            ));
        }
        if let Some((pin, registered)) = outside(&self.device_type, &device.device_type) {
            return Some(format!(
                "device '{}' is registered with device type {registered}; this ingest key is limited to device type '{pin}'",
                device.id
            ));
        }
        None
    }

    /// As stored beside a log entry: `None` when empty, else JSON.
    pub fn to_stored(&self) -> Option<String> {
        (!self.is_empty()).then(|| serde_json::to_string(self).expect("pins serialise"))
    }

    /// Inverse of [`UplinkPins::to_stored`]; `Err` for text no weft wrote.
    pub fn from_stored(stored: Option<&str>) -> Result<UplinkPins, String> {
        match stored {
            None => Ok(UplinkPins::default()),
            Some(text) => serde_json::from_str(text).map_err(|e| format!("bad pins {text:?}: {e}")),
        }
    }
}

/// [`read_reported_time`] of a field that may be missing: absent or
/// `null` is `Ok(None)` (the uplink says nothing about its time).
pub fn read_optional_time(
    field: &str,
    value: Option<&serde_json::Value>,
) -> Result<Option<i64>, String> {
    match value {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(v) => read_reported_time(field, v).map(Some),
    }
}

/// When a reading was taken, as an uplink's `reported_at` (or a mapping's
/// `reportedAt`, a codec's, TTN's `received_at`, ChirpStack's `time`, the
/// IoT Agents' `TimeInstant`) says it: epoch milliseconds as a JSON
/// number or a string of digits, or an RFC 3339 date-time with its offset
/// (`2026-01-02T03:04:05.123Z`, `2026-01-02T04:04:05+01:00`). Anything else
/// (`"2026-01-01"`, a date without a time, `true`, an object) is `Err`, with
/// what was sent: an uplink whose time cannot be read fails rather than
/// being stamped with its arrival time.
pub fn read_reported_time(field: &str, value: &serde_json::Value) -> Result<i64, String> {
    use serde_json::Value;
    let read = match value {
        Value::Number(n) => n
            .as_i64()
            .or_else(|| n.as_f64().filter(|f| f.abs() < 9.0e15).map(|f| f as i64)),
        Value::String(s) => {
            let s = s.trim();
            s.parse::<i64>().ok().or_else(|| {
                chrono::DateTime::parse_from_rfc3339(s)
                    .ok()
                    .map(|t| t.timestamp_millis())
            })
        }
        _ => None,
    };
    read.ok_or_else(|| {
        let shown: String = value.to_string().chars().take(64).collect();
        format!(
            "{field} {shown} is not a time weft reads: epoch milliseconds, or an RFC 3339 date-time with its offset such as \"2026-01-02T03:04:05Z\""
        )
    })
}

/// The partition of the pipeline that processes the uplinks keyed by
/// `key` (the device the uplink names) among `partitions`: a hash every
/// node computes alike, stable across releases (FNV-1a, 64 bits), so a
/// device's uplinks always land in one partition whichever node takes
/// them in. An uplink that names no device is keyed by the empty string.
pub fn partition_of(key: &str, partitions: u16) -> u16 {
    partition_of_parts(&[key.as_bytes()], partitions)
}

/// [`partition_of`] of a key made of several parts (a tenant, an entity
/// id and type: the history feed's partition of an entity), hashed as
/// the parts joined by a 0 byte, without joining them. One part hashes
/// exactly as [`partition_of`] does.
pub fn partition_of_parts(parts: &[&[u8]], partitions: u16) -> u16 {
    if partitions <= 1 {
        return 0;
    }
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for (i, part) in parts.iter().enumerate() {
        let separator = (i > 0).then_some(&0u8);
        for byte in separator.into_iter().chain(part.iter()) {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    (hash % u64::from(partitions)) as u16
}

/// An uplink in the ingest log. `seq` is its position: the pipeline
/// processes the log in `seq` order and records how far it got, so a
/// restart resumes exactly where it stopped.
#[derive(Debug, Clone, PartialEq)]
pub struct Uplink {
    /// Position in the ingest log, strictly increasing from 1.
    pub seq: u64,
    /// What was received.
    pub uplink: NewUplink,
}

#[cfg(test)]
mod tests {
    use super::{partition_of, partition_of_parts, read_reported_time, UplinkPins};
    use serde_json::json;

    #[test]
    fn reported_times_are_epoch_ms_or_rfc3339() {
        let ok = |v| read_reported_time("reported_at", &v).unwrap();
        assert_eq!(ok(json!(1_767_225_600_000i64)), 1_767_225_600_000);
        assert_eq!(ok(json!("1767225600000")), 1_767_225_600_000);
        assert_eq!(ok(json!(1.5e12)), 1_500_000_000_000);
        assert_eq!(ok(json!("2026-01-01T00:00:00Z")), 1_767_225_600_000);
        assert_eq!(ok(json!("2026-01-01T01:00:00.5+01:00")), 1_767_225_600_500);
        for bad in [
            json!("2026-01-01"),
            json!("yesterday"),
            json!(""),
            json!(true),
            json!({"t": 1}),
            json!(1e300),
        ] {
            let e = read_reported_time("reported_at", &bad).unwrap_err();
            assert!(e.starts_with("reported_at "), "{e}");
        }
    }

    #[test]
    fn pins_hold_registered_devices_and_round_trip() {
        let device = |channel: &str, t: &str| crate::Device {
            id: "d1".into(),
            channel: channel.into(),
            device_type: t.into(),
            ..crate::Device::default()
        };
        let pins = UplinkPins {
            channel: Some("farm".into()),
            device_type: None,
        };
        assert_eq!(pins.refusal(&device("farm", "x")), None);
        assert!(pins
            .refusal(&device("secret", "x"))
            .unwrap()
            .contains("channel 'secret'; this ingest key is limited to channel 'farm'"));
        assert!(pins
            .refusal(&device("", "x"))
            .unwrap()
            .contains("channel none"));
        let typed = UplinkPins {
            channel: None,
            device_type: Some("em300th".into()),
        };
        assert!(typed.refusal(&device("farm", "lamp")).is_some());
        assert_eq!(UplinkPins::default().refusal(&device("", "")), None);
        assert_eq!(UplinkPins::default().to_stored(), None);
        let stored = pins.to_stored();
        assert_eq!(stored.as_deref(), Some(r#"{"channel":"farm"}"#));
        assert_eq!(UplinkPins::from_stored(stored.as_deref()).unwrap(), pins);
    }

    /// The hash is part of the stored data's meaning (a device's
    /// partition must not move between releases): fixed values pin it,
    /// and devices spread over every partition.
    #[test]
    fn partitions_are_stable_and_spread() {
        assert_eq!(partition_of("anything", 1), 0);
        assert_eq!(partition_of("anything", 0), 0);
        let pinned: Vec<u16> = ["dev-1", "dev-2", "eui-70b3d57ed0001234", ""]
            .iter()
            .map(|k| partition_of(k, 16))
            .collect();
        assert_eq!(pinned, PINNED);
        let mut seen = [0usize; 16];
        for i in 0..1600 {
            seen[partition_of(&format!("device-{i}"), 16) as usize] += 1;
        }
        assert!(seen.iter().all(|n| (50..=150).contains(n)), "{seen:?}");
    }

    const PINNED: [u16; 4] = [6, 3, 10, 5];

    /// A key of several parts hashes as its parts joined by a 0 byte, so
    /// moving bytes from one part to the next changes the partition.
    #[test]
    fn keys_of_parts_hash_as_joined_by_a_zero_byte() {
        for (parts, joined) in [
            (vec![&b"t"[..], b"urn:a", b"Room"], "t\0urn:a\0Room"),
            (vec![&b""[..], b"x", b""], "\0x\0"),
            (vec![&b"one"[..]], "one"),
        ] {
            for n in [7, 16, 1024] {
                assert_eq!(partition_of_parts(&parts, n), partition_of(joined, n));
            }
        }
        let spread: std::collections::BTreeSet<u16> = (0..64)
            .map(|i| partition_of_parts(&[b"t", format!("e{i}").as_bytes(), b"T"], 16))
            .collect();
        assert!(spread.len() > 8, "{spread:?}");
    }
}
