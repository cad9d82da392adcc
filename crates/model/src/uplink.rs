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
    /// The request body, byte for byte.
    pub body: Vec<u8>,
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
