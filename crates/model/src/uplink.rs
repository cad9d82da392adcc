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
    /// The request body, byte for byte.
    pub body: Vec<u8>,
}

/// The partition of the pipeline that processes the uplinks keyed by
/// `key` (the device the uplink names) among `partitions`: a hash every
/// node computes alike, stable across releases (FNV-1a, 64 bits), so a
/// device's uplinks always land in one partition whichever node takes
/// them in. An uplink that names no device is keyed by the empty string.
pub fn partition_of(key: &str, partitions: u16) -> u16 {
    if partitions <= 1 {
        return 0;
    }
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key.as_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
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
    use super::partition_of;

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
}
