//! The uplinks the `ingest` scenario sends: Milesight EM300-TH readings,
//! either as sensae's load-test body (`decoded`) or as a Helium-style body
//! carrying the device's raw bytes in base64 (`encoded`).
//!
//! Everything that is the same for every uplink of a device — the request
//! head up to `Content-Length`, the device's identity fields — is rendered
//! once; per uplink only the reading, `reported_at` and the uplink's uuid
//! are formatted, into buffers the worker reuses.

use std::io::Write;

use base64::Engine;
use rand::Rng;
use uuid::Uuid;

/// The device type the scenario registers and posts to.
pub const DEVICE_TYPE: &str = "em300th";

/// The em300th decoder, registered on the server before the load starts.
pub const DECODER_SOURCE: &str = include_str!("../../../../examples/codecs/em300th.js");

/// The fixed part of an encoded body between the identity and the payload;
/// 85 is the LoRaWAN port Milesight devices send measurements on.
const PORT_AND_PAYLOAD: &str = r#""port":85,"payload":""#;

/// One EM300-TH measurement.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    /// °C; the payload carries tenths.
    pub temperature: f64,
    /// Relative humidity, %; the payload carries halves.
    pub humidity: f64,
    /// Battery, %.
    pub battery: u8,
}

impl Reading {
    /// A reading like the seed's load test: temperature uniform on 1..50
    /// and humidity on 30..90 (whole numbers, as sensae's k6 script sent),
    /// battery 1..100.
    pub fn random(rng: &mut impl Rng) -> Reading {
        Reading {
            temperature: f64::from(rng.random_range(1..=50u8)),
            humidity: f64::from(rng.random_range(30..=90u8)),
            battery: rng.random_range(1..=100u8),
        }
    }

    /// The device's payload: battery (01 75 uint8), temperature (03 67
    /// int16 little-endian tenths of °C), humidity (04 68 uint8 halves of %).
    pub fn encode_em300th(&self) -> [u8; 10] {
        let t = ((self.temperature * 10.0).round() as i16).to_le_bytes();
        let h = (self.humidity * 2.0).round() as u8;
        [
            0x01,
            0x75,
            self.battery,
            0x03,
            0x67,
            t[0],
            t[1],
            0x04,
            0x68,
            h,
        ]
    }
}

/// Which ingest path an uplink takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// `/sensor-data/{ch}/decoded/em300th`: values in the body.
    Decoded,
    /// `/sensor-data/{ch}/encoded/em300th`: base64 payload in the body.
    Encoded,
}

/// A simulated device: its identity and the ingest path it uses.
#[derive(Debug, Clone)]
pub struct Device {
    /// `{"downlink_url":…,"id":…,"name":…,` — the body up to the varying fields.
    prefix: Vec<u8>,
    /// Whether this device sends raw payloads or decoded values.
    pub form: Form,
    /// The device id (a uuid, hyphenated), as in the body.
    id: String,
}

impl Device {
    /// A device with a fresh random id; `index` gives its name (`P00010`).
    pub fn new(index: usize, form: Form, rng: &mut impl Rng) -> Device {
        let id = uplink_id(rng);
        let prefix = format!(
            r#"{{"downlink_url":"https://console.example/api/v1/down/abc/def/{}","id":"{}","name":"P{:05}","#,
            id.simple(),
            id.hyphenated(),
            index
        );
        Device {
            prefix: prefix.into_bytes(),
            form,
            id: id.hyphenated().to_string(),
        }
    }

    /// The device's id.
    pub fn id(&self) -> &str {
        &self.id
    }
}

/// Request heads shared by all workers: everything before the
/// `Content-Length` value, for each ingest path.
#[derive(Debug, Clone)]
pub struct Heads {
    decoded: Vec<u8>,
    encoded: Vec<u8>,
}

impl Heads {
    /// Renders `POST {prefix}/sensor-data/{channel}/{form}/em300th` heads.
    pub fn new(path_prefix: &str, host: &str, channel: &str, ingest_key: Option<&str>) -> Heads {
        let head = |form: &str| {
            let mut h = format!(
                "POST {path_prefix}/sensor-data/{channel}/{form}/{DEVICE_TYPE} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            );
            if let Some(key) = ingest_key {
                h.push_str(&format!("Authorization: {key}\r\n"));
            }
            h.push_str("Content-Length: ");
            h.into_bytes()
        };
        Heads {
            decoded: head("decoded"),
            encoded: head("encoded"),
        }
    }
}

/// A worker's reusable buffers for rendering uplink requests.
#[derive(Debug, Default)]
pub struct Renderer {
    body: Vec<u8>,
    request: Vec<u8>,
}

impl Renderer {
    /// Renders one uplink request and returns it; the slice borrows the
    /// renderer's buffer, valid until the next call.
    pub fn render(
        &mut self,
        heads: &Heads,
        device: &Device,
        reading: &Reading,
        reported_at_ms: u64,
        uplink: Uuid,
    ) -> &[u8] {
        self.body.clear();
        self.body.extend_from_slice(&device.prefix);
        match device.form {
            Form::Decoded => {
                // Whole numbers print without a fraction, like the seed's body.
                let _ = write!(
                    self.body,
                    r#""temperature":{},"humidity":{}"#,
                    reading.temperature, reading.humidity
                );
            }
            Form::Encoded => {
                let mut b64 = [0u8; 16];
                let n = base64::engine::general_purpose::STANDARD
                    .encode_slice(reading.encode_em300th(), &mut b64)
                    .expect("10 bytes fit in 16 base64 characters");
                self.body.extend_from_slice(PORT_AND_PAYLOAD.as_bytes());
                self.body.extend_from_slice(&b64[..n]);
                self.body.push(b'"');
            }
        }
        let mut id = [0u8; uuid::fmt::Hyphenated::LENGTH];
        let id = uplink.hyphenated().encode_lower(&mut id);
        let _ = write!(
            self.body,
            r#","reported_at":{reported_at_ms},"uuid":"{id}"}}"#
        );

        self.request.clear();
        self.request.extend_from_slice(match device.form {
            Form::Decoded => &heads.decoded,
            Form::Encoded => &heads.encoded,
        });
        let _ = write!(self.request, "{}\r\n\r\n", self.body.len());
        self.request.extend_from_slice(&self.body);
        &self.request
    }
}

impl Renderer {
    /// The body of the last request rendered (what an MQTT publish
    /// carries).
    pub fn body(&self) -> &[u8] {
        &self.body
    }
}

/// A random version-4 uuid: an uplink's `dataId`, or a device id.
pub fn uplink_id(rng: &mut impl Rng) -> Uuid {
    uuid::Builder::from_random_bytes(rng.random::<[u8; 16]>()).into_uuid()
}

/// Whether device `index` of a fleet sends encoded payloads: spreads the
/// encoded devices evenly (`ratio` 0.5 alternates), so any prefix of the
/// fleet has the requested mix.
pub fn device_form(index: usize, ratio: f64) -> Form {
    let ratio = ratio.clamp(0.0, 1.0);
    let before = (index as f64 * ratio).floor();
    let after = ((index + 1) as f64 * ratio).floor();
    if after > before {
        Form::Encoded
    } else {
        Form::Decoded
    }
}

/// The session's registration body for `PUT /api/v1/device-types/em300th`:
/// the example type shipped with weft (the decoder plus the processor
/// mappings of sensae's load test), the same file the README uploads.
pub fn device_type_body() -> Vec<u8> {
    include_bytes!("../../../../examples/device-types/em300th.json").to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// Decodes a payload by the EM300-TH table, independently of the encoder.
    fn decode(bytes: &[u8]) -> Reading {
        let mut r = Reading {
            temperature: f64::NAN,
            humidity: f64::NAN,
            battery: 0,
        };
        let mut i = 0;
        while i < bytes.len() {
            match (bytes[i], bytes[i + 1]) {
                (0x01, 0x75) => {
                    r.battery = bytes[i + 2];
                    i += 3;
                }
                (0x03, 0x67) => {
                    r.temperature =
                        f64::from(i16::from_le_bytes([bytes[i + 2], bytes[i + 3]])) / 10.0;
                    i += 4;
                }
                (0x04, 0x68) => {
                    r.humidity = f64::from(bytes[i + 2]) / 2.0;
                    i += 3;
                }
                other => panic!("unknown record {other:?}"),
            }
        }
        r
    }

    #[test]
    fn encodes_the_spec_example() {
        let r = Reading {
            temperature: 30.8,
            humidity: 50.5,
            battery: 92,
        };
        assert_eq!(
            r.encode_em300th(),
            [0x01, 0x75, 0x5C, 0x03, 0x67, 0x34, 0x01, 0x04, 0x68, 0x65]
        );
        assert_eq!(decode(&r.encode_em300th()), r);
    }

    #[test]
    fn encoding_round_trips() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..1000 {
            let r = Reading::random(&mut rng);
            assert!((1.0..=50.0).contains(&r.temperature));
            assert!((30.0..=90.0).contains(&r.humidity));
            assert_eq!(decode(&r.encode_em300th()), r);
        }
        // Negative and fractional temperatures survive too.
        let cold = Reading {
            temperature: -12.3,
            humidity: 0.5,
            battery: 100,
        };
        assert_eq!(cold.encode_em300th()[5..7], (-123i16).to_le_bytes());
        assert_eq!(decode(&cold.encode_em300th()), cold);
    }

    fn rendered_body(request: &[u8]) -> (String, serde_json::Value) {
        let text = std::str::from_utf8(request).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("Content-Length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(len, body.len());
        (head.to_string(), serde_json::from_str(body).unwrap())
    }

    #[test]
    fn renders_decoded_and_encoded_uplinks() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let heads = Heads::new("", "127.0.0.1:8080", "benchAbc123", Some("k3y"));
        let reading = Reading {
            temperature: 37.0,
            humidity: 61.0,
            battery: 92,
        };
        let mut renderer = Renderer::default();

        let device = Device::new(10, Form::Decoded, &mut rng);
        let id = uplink_id(&mut rng);
        let (head, body) =
            rendered_body(renderer.render(&heads, &device, &reading, 1_700_000_000_123, id));
        assert!(head.starts_with("POST /sensor-data/benchAbc123/decoded/em300th HTTP/1.1\r\n"));
        assert!(head.contains("\r\nAuthorization: k3y\r\n"));
        assert!(head.contains("\r\nHost: 127.0.0.1:8080\r\n"));
        assert_eq!(body["temperature"], 37);
        assert_eq!(body["humidity"], 61);
        assert_eq!(body["name"], "P00010");
        assert_eq!(body["reported_at"], 1_700_000_000_123u64);
        assert_eq!(body["uuid"], id.hyphenated().to_string());
        let device_id = Uuid::parse_str(body["id"].as_str().unwrap()).unwrap();
        assert_eq!(device_id.get_version_num(), 4);
        assert!(body["downlink_url"]
            .as_str()
            .unwrap()
            .ends_with(&device_id.simple().to_string()));

        let device = Device::new(3, Form::Encoded, &mut rng);
        let (head, body) = rendered_body(renderer.render(&heads, &device, &reading, 5, id));
        assert!(head.starts_with("POST /sensor-data/benchAbc123/encoded/em300th HTTP/1.1\r\n"));
        assert_eq!(body["port"], 85);
        assert!(body.get("temperature").is_none());
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(body["payload"].as_str().unwrap())
            .unwrap();
        assert_eq!(decode(&bytes), reading);

        let heads = Heads::new("/weft", "h", "ch", None);
        let text =
            String::from_utf8(renderer.render(&heads, &device, &reading, 5, id).to_vec()).unwrap();
        assert!(text.starts_with("POST /weft/sensor-data/ch/encoded/em300th HTTP/1.1\r\n"));
        assert!(!text.contains("Authorization"));
    }

    #[test]
    fn encoded_devices_are_spread_evenly() {
        let count = |n: usize, ratio: f64| {
            (0..n)
                .filter(|&i| device_form(i, ratio) == Form::Encoded)
                .count()
        };
        assert_eq!(count(500, 0.5), 250);
        assert_eq!(count(500, 0.0), 0);
        assert_eq!(count(500, 1.0), 500);
        assert_eq!(count(1000, 0.1), 100);
        assert_eq!(count(3, 0.5), 1);
        let first: Vec<Form> = (0..4).map(|i| device_form(i, 0.5)).collect();
        assert_eq!(
            first,
            [Form::Decoded, Form::Encoded, Form::Decoded, Form::Encoded]
        );
    }

    #[test]
    fn registration_carries_decoder_and_mappings() {
        let v: serde_json::Value = serde_json::from_slice(&device_type_body()).unwrap();
        assert_eq!(v["entityType"], "TemperatureSensor");
        assert!(v["decoder"]["script"]
            .as_str()
            .unwrap()
            .contains("function decodeUplink"));
        assert_eq!(v["processor"]["mappings"].as_array().unwrap().len(), 6);
    }
}
