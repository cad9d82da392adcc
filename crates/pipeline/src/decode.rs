//! Decode and process: turns ingest-log entries into data units. Each
//! wire format (sensae encoded/decoded, TTN v3, ChirpStack v4) is read into
//! an `Envelope` of identity fields and payload; the device type's codec
//! runs in the engine (all of a batch's calls in one engine round trip);
//! the processor mappings shape the result; the device record enriches it.
//!
//! Nothing here writes: the caller stores units and failures together with
//! the log cursor. See docs/data-units.md for the rules implemented here.

use std::sync::Arc;

use base64::Engine as _;
use serde_json::{Map, Value};
use weft_engine::{
    interpret_decode_uplink, reported_problems, Call, CodecError, Engine, ScriptKind,
};
use weft_model::mapping::{self, get_path, value_as_id, PartialUnit};
use weft_model::{
    DataUnit, Device, DeviceEvent, DeviceInfo, FailedUplink, FailureReason, Uplink, UplinkFormat,
};

use crate::catalog::{Catalog, TypeEntry};
use crate::uplink::Envelope;

/// Channel used when neither the request nor the device names one.
pub const DEFAULT_CHANNEL: &str = "default";

/// What an uplink produced: its data units (and the codec's warnings), or
/// why it produced none.
pub type Outcome = Result<Produced, FailedUplink>;

/// The data units of one uplink, or the device event a network server's
/// message that is not an uplink is.
#[derive(Debug, Clone, PartialEq)]
pub struct Produced {
    /// One unit per (sub-)device.
    pub units: Vec<DataUnit>,
    /// Warnings the codec returned; shown by the dry-run endpoint.
    pub warnings: Vec<String>,
    /// The event, when the message was one (ChirpStack's `?event=join`,
    /// TTN's `join_accept`, …): kept as the device's event, never decoded
    /// nor failed as an uplink.
    pub event: Option<DeviceEvent>,
}

/// An uplink read and matched to its type, waiting for its codec call.
struct Prepared {
    body: Value,
    envelope: Envelope,
    device_type: Arc<TypeEntry>,
    call: Option<Call>,
}

/// A reason plus a description; becomes a [`FailedUplink`].
type Failure = (FailureReason, String);

/// What a log entry is once read: an uplink waiting for its codec, or a
/// device event, which needs nothing more.
// One per log entry, built in place in the batch's vector and consumed
// from it: boxing the larger variant would cost an allocation per uplink.
#[allow(clippy::large_enum_variant)]
enum Step {
    Uplink(Prepared),
    Event(DeviceEvent),
}

/// Decodes and processes `uplinks`, in order, one outcome per uplink.
/// Devices seen for the first time are appended to `new_devices`.
/// `register` is false only for the dry run, which registers nothing and
/// needs no device id (its units then have an empty one).
// A failed uplink carries its whole body; outcomes are moved once, not copied.
#[allow(clippy::result_large_err)]
pub async fn process(
    uplinks: &[Uplink],
    catalog: &Catalog,
    engine: &Engine,
    new_devices: &mut Vec<Device>,
    register: bool,
) -> Vec<Outcome> {
    process_reporting(uplinks, catalog, engine, new_devices, register)
        .await
        .into_iter()
        .map(|(outcome, _)| outcome)
        .collect()
}

/// The `errors` and `warnings` a codec returned, as it wrote them.
pub type CodecReport = (Vec<String>, Vec<String>);

/// [`process`], with each failed uplink's codec report: the `errors` and
/// `warnings` its `decodeUplink` returned, when it returned errors (the
/// dry run's 422 shows them).
#[allow(clippy::result_large_err)]
pub async fn process_reporting(
    uplinks: &[Uplink],
    catalog: &Catalog,
    engine: &Engine,
    new_devices: &mut Vec<Device>,
    register: bool,
) -> Vec<(Outcome, Option<CodecReport>)> {
    process_reporting_as(uplinks, catalog, engine, new_devices, register, None).await
}

/// [`process_reporting`], with uplinks of `candidate`'s type decoded by
/// `candidate` instead of the catalog's entry: the dry run of a codec not
/// saved yet (the console's Test of what is in its editor).
#[allow(clippy::result_large_err)]
pub async fn process_reporting_as(
    uplinks: &[Uplink],
    catalog: &Catalog,
    engine: &Engine,
    new_devices: &mut Vec<Device>,
    register: bool,
    candidate: Option<&Arc<TypeEntry>>,
) -> Vec<(Outcome, Option<CodecReport>)> {
    let prepared: Vec<Result<Step, Failure>> = uplinks
        .iter()
        .map(|u| prepare(u, catalog, candidate, register))
        .collect();

    let calls: Vec<Call> = prepared
        .iter()
        .filter_map(|p| match p {
            Ok(Step::Uplink(p)) => p.call.clone(),
            _ => None,
        })
        .collect();
    let mut results = run_calls(engine, calls).await.into_iter();

    uplinks
        .iter()
        .zip(prepared)
        .map(|(uplink, p)| {
            let mut report = None;
            let produced = p.and_then(|step| match step {
                Step::Event(event) => Ok(Produced {
                    units: Vec::new(),
                    warnings: Vec::new(),
                    event: Some(event),
                }),
                Step::Uplink(p) => {
                    let result = p
                        .call
                        .as_ref()
                        .map(|_| results.next().expect("one result per call"));
                    report = result
                        .as_ref()
                        .and_then(|r| r.as_ref().ok())
                        .and_then(reported_problems)
                        .filter(|(errors, _)| !errors.is_empty());
                    finish(uplink, p, result, catalog, new_devices, register)
                }
            });
            let outcome =
                produced.map_err(|(reason, description)| failed(uplink, reason, description));
            let report = report.filter(|_| outcome.is_err());
            (outcome, report)
        })
        .collect()
}

/// Runs the calls, waiting out a momentarily full engine queue: the log
/// keeps the uplinks, so waiting here is backpressure, not loss.
async fn run_calls(engine: &Engine, calls: Vec<Call>) -> Vec<Result<Value, CodecError>> {
    if calls.is_empty() {
        return Vec::new();
    }
    let mut delay = std::time::Duration::from_millis(1);
    loop {
        match engine.run(calls.clone()).await {
            Ok(results) => return results,
            Err(CodecError::Busy) => {
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(std::time::Duration::from_millis(100));
            }
            Err(other) => return calls.iter().map(|_| Err(other.clone())).collect(),
        }
    }
}

fn failed(uplink: &Uplink, reason: FailureReason, description: String) -> FailedUplink {
    let u = &uplink.uplink;
    let body = serde_json::from_slice(&u.body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&u.body).into_owned()));
    FailedUplink {
        seq: uplink.seq,
        received_at: u.received_at,
        format: u.format.as_str().to_string(),
        channel: u.channel.clone(),
        device_type: u.device_type.clone(),
        reason,
        description,
        body,
    }
}

/// Reads a log entry: a device event when the network server named one
/// (kept whatever its name; only one naming no device fails, as
/// `InvalidUplink`), else an uplink matched to its device type.
fn prepare(
    uplink: &Uplink,
    catalog: &Catalog,
    candidate: Option<&Arc<TypeEntry>>,
    register: bool,
) -> Result<Step, Failure> {
    let u = &uplink.uplink;
    let body: Value = serde_json::from_slice(&u.body).map_err(|e| {
        (
            FailureReason::InvalidUplink,
            format!("body is not JSON: {e}"),
        )
    })?;
    if !body.is_object() {
        return Err((
            FailureReason::InvalidUplink,
            "body is not a JSON object".into(),
        ));
    }
    if let Some(event) = crate::uplink::device_event(uplink, &body) {
        let event = event.map_err(|e| (FailureReason::InvalidUplink, e))?;
        within_pins(u, catalog.device(&event.device_id).as_deref())?;
        return Ok(Step::Event(event));
    }
    let mut envelope = crate::uplink::server(u.format).envelope(&body);
    // The device the transport named (an MQTT topic, a broker login) is
    // the device, whatever the body claims.
    if let Some(id) = &u.device_id {
        envelope.device_id = Some(id.clone());
    }
    // What the envelope names is checked before any codec runs; a device
    // that only the decoded payload names is checked in `finish`.
    // The dry run (`register` false) decodes a sample as the type asked,
    // whatever device it names.
    let known = envelope
        .device_id
        .as_deref()
        .and_then(|id| catalog.device(id));
    if register && envelope.device_id.is_some() {
        within_pins(u, known.as_deref())?;
        if let Some(named) = &u.device_type {
            keeps_its_type(known.as_deref(), named)?;
        }
    }

    let type_name = u
        .device_type
        .clone()
        .or_else(|| {
            known
                .as_ref()
                .map(|d| d.device_type.clone())
                .filter(|t| !t.is_empty())
        })
        .or_else(|| envelope.type_hint.clone())
        .ok_or_else(|| {
            (
                FailureReason::UnknownType,
                "no device type: name it in the path or ?type=, or register the device".into(),
            )
        })?;
    let device_type = match candidate {
        Some(c) if c.name == type_name => Some(c.clone()),
        _ => catalog.device_type(&type_name),
    };
    let device_type = device_type.ok_or_else(|| {
        (
            FailureReason::UnknownType,
            format!("device type '{type_name}' does not exist"),
        )
    })?;

    let mut call = codec_call(u.format, &body, &envelope, &device_type, u.received_at)?;
    // The device's variables reach its codec as `input.variables`, as
    // ChirpStack's do; shared, not copied. A device that only the decoded
    // payload names is not known yet here: its codec gets `{}`.
    if let Some(variables) = known.map(|d| d.variables.clone()).filter(|v| !v.is_empty()) {
        call = call.map(|c| match c {
            c @ Call::DecodeUplink { .. } => c.with_variables(variables),
            other => other,
        });
    }
    Ok(Step::Uplink(Prepared {
        body,
        envelope,
        device_type,
        call,
    }))
}

/// The engine call an uplink needs, if any.
fn codec_call(
    format: UplinkFormat,
    body: &Value,
    envelope: &Envelope,
    device_type: &TypeEntry,
    received_at: i64,
) -> Result<Option<Call>, Failure> {
    if matches!(format, UplinkFormat::SensaeDecoded | UplinkFormat::Iota) {
        return Ok(None);
    }
    let Some((script, kind)) = &device_type.codec else {
        if format == UplinkFormat::SensaeEncoded || envelope.predecoded.is_none() {
            return Err((
                FailureReason::DecodeError,
                format!("device type '{}' has no decoder", device_type.name),
            ));
        }
        return Ok(None);
    };
    match kind {
        ScriptKind::Convert => Ok(Some(Call::Convert {
            script: script.clone(),
            input: body.clone(),
        })),
        _ => {
            let (bytes, f_port) = match &envelope.payload {
                Some(Ok(p)) => p.clone(),
                Some(Err(e)) => return Err((FailureReason::InvalidUplink, e.clone())),
                None => {
                    return Err((
                        FailureReason::InvalidUplink,
                        "uplink carries no payload".into(),
                    ))
                }
            };
            let recv_time_ms = envelope
                .reported_at
                .clone()
                .map_err(|e| (FailureReason::InvalidUplink, e))?
                .unwrap_or(received_at);
            Ok(Some(Call::DecodeUplink {
                script: script.clone(),
                bytes,
                f_port,
                recv_time_ms,
            }))
        }
    }
}

fn finish(
    uplink: &Uplink,
    p: Prepared,
    result: Option<Result<Value, CodecError>>,
    catalog: &Catalog,
    new_devices: &mut Vec<Device>,
    register: bool,
) -> Result<Produced, Failure> {
    let u = &uplink.uplink;
    let mut warnings = Vec::new();
    let mappings = p
        .device_type
        .def
        .processor
        .as_ref()
        .map(|pr| pr.mappings.as_slice())
        .unwrap_or(&[]);

    let partial = match result {
        Some(Err(e)) => return Err(codec_failure(e)),
        Some(Ok(returned)) => match p.device_type.codec.as_ref().map(|c| c.1) {
            Some(ScriptKind::Convert) => from_convert(returned)?,
            _ => {
                let decoded = interpret_decode_uplink(returned).map_err(codec_failure)?;
                warnings = decoded.warnings;
                let data = Value::Object(decoded.data);
                if u.format == UplinkFormat::SensaeEncoded {
                    shape(
                        mappings,
                        merged(&p.body, data.clone()),
                        Some(data),
                        u.format,
                    )
                } else {
                    shape(mappings, data.clone(), Some(data), u.format)
                }
            }
        },
        None => match (u.format, p.envelope.predecoded.clone()) {
            (UplinkFormat::SensaeDecoded | UplinkFormat::Iota, _) => {
                shape(mappings, p.body.clone(), None, u.format)
            }
            (_, Some(pre)) => shape(mappings, pre.clone(), Some(pre), u.format),
            (_, None) => return Err((FailureReason::InvalidUplink, "nothing to decode".into())),
        },
    };

    let env = p.envelope;
    let device_id = match u.device_id.clone().or(partial.device_id).or(env.device_id) {
        Some(id) => id,
        // The dry run shows what a sample decodes to; it needs no device.
        None if !register => String::new(),
        None => {
            return Err((
                FailureReason::InvalidUplink,
                "uplink names no device id".to_string(),
            ))
        }
    };
    // The id names the device's NGSI entity: one that NGSI cannot read or
    // delete (control characters, `<>();`, 100 KB) never gets that far.
    if register || !device_id.is_empty() {
        weft_model::device::check_device_id(&device_id)
            .map_err(|e| (FailureReason::InvalidUplink, e))?;
    }
    let known = catalog.device(&device_id);
    if register {
        within_pins(u, known.as_deref())?;
        keeps_its_type(known.as_deref(), &p.device_type.name)?;
    }
    let name = partial
        .device_name
        .or(env.device_name)
        .or_else(|| known.as_ref().map(|d| d.name.clone()))
        .unwrap_or_default();
    let channel = u
        .channel
        .clone()
        .or_else(|| {
            known
                .as_ref()
                .map(|d| d.channel.clone())
                .filter(|c| !c.is_empty())
        })
        .or(env.channel_hint)
        .unwrap_or_else(|| DEFAULT_CHANNEL.to_string());
    let data_id = partial
        .data_id
        .or(env.data_id)
        .unwrap_or_else(|| format!("weft-{}", uplink.seq));
    let reported_at = match partial.reported_at {
        Some(mapped) => mapped,
        None => env.reported_at.map(|t| t.unwrap_or(u.received_at)),
    }
    .map_err(|e| (FailureReason::InvalidUplink, e))?;

    if known.is_none() && register {
        let device = Device {
            id: device_id.clone(),
            name: name.clone(),
            device_type: p.device_type.name.clone(),
            channel: channel.clone(),
            ..Device::default()
        };
        if catalog.register_seen(&device) {
            new_devices.push(device);
        }
    }

    let base = DataUnit {
        data_id,
        reported_at,
        received_at: u.received_at,
        channel,
        device: DeviceInfo {
            id: device_id,
            name,
            device_type: p.device_type.name.clone(),
            records: known
                .as_ref()
                .map(|d| d.records.clone())
                .unwrap_or_default(),
            static_data: known
                .as_ref()
                .map(|d| d.static_data.clone())
                .unwrap_or_default(),
        },
        measures: partial.measures,
    };
    let main = base.device.id.clone();
    let units = split_sub_devices(base, known.as_deref(), catalog);
    if register {
        for unit in units.iter().filter(|unit| unit.device.id != main) {
            within_pins(u, catalog.device(&unit.device.id).as_deref())?;
        }
    }
    Ok(Produced {
        units,
        warnings,
        event: None,
    })
}

/// Holds an uplink's device to the pins of the ingest key it came with: a
/// registered device must be registered within them (a failed uplink,
/// `Forbidden`, otherwise). A device not registered yet is registered
/// within them when first seen (the uplink's channel and type are the
/// pins then, set at accept).
fn within_pins(u: &weft_model::NewUplink, known: Option<&Device>) -> Result<(), Failure> {
    match known.and_then(|known| u.pins.refusal(known)) {
        Some(why) => Err((FailureReason::Forbidden, why)),
        None => Ok(()),
    }
}

/// A registered device keeps its type: an uplink decoding it as another
/// fails (`TypeMismatch`) rather than making a second entity of the same
/// id. A device registered without a type takes the uplink's.
fn keeps_its_type(known: Option<&Device>, named: &str) -> Result<(), Failure> {
    match known {
        Some(known) if !known.device_type.is_empty() && known.device_type != named => Err((
            FailureReason::TypeMismatch,
            format!(
                "device '{}' is registered with device type '{}'; this uplink names device type '{named}'",
                known.id, known.device_type
            ),
        )),
        _ => Ok(()),
    }
}

fn codec_failure(e: CodecError) -> Failure {
    let reason = match e.root() {
        CodecError::Timeout(_) => FailureReason::Timeout,
        CodecError::OutOfMemory => FailureReason::OutOfMemory,
        _ => FailureReason::DecodeError,
    };
    (reason, e.to_string())
}

/// `body` with `data`'s fields laid over it: decoded values win over
/// envelope fields of the same name.
fn merged(body: &Value, data: Value) -> Value {
    let mut out = body.as_object().cloned().unwrap_or_default();
    if let Value::Object(d) = data {
        out.extend(d);
    }
    Value::Object(out)
}

/// Applies the processor mappings, or without any, takes `decoded` (or the
/// body minus its envelope fields) as the measures.
fn shape(
    mappings: &[weft_model::Mapping],
    source: Value,
    decoded: Option<Value>,
    format: UplinkFormat,
) -> PartialUnit {
    if !mappings.is_empty() {
        return mapping::apply(mappings, &source);
    }
    let measures = match decoded {
        Some(Value::Object(m)) => m,
        Some(_) => Map::new(),
        None => {
            let mut m = source.as_object().cloned().unwrap_or_default();
            if matches!(
                format,
                UplinkFormat::SensaeDecoded | UplinkFormat::SensaeEncoded
            ) {
                for f in crate::uplink::sensae::ENVELOPE_FIELDS {
                    m.shift_remove(*f);
                }
            }
            if format == UplinkFormat::Iota {
                m.shift_remove(crate::uplink::iota::TIME_FIELD);
            }
            m
        }
    };
    PartialUnit {
        measures,
        ..PartialUnit::default()
    }
}

/// A sensae `convert(object)` codec returns the data unit itself.
fn from_convert(returned: Value) -> Result<PartialUnit, Failure> {
    let Value::Object(obj) = returned else {
        return Err((
            FailureReason::DecodeError,
            "convert() did not return an object".into(),
        ));
    };
    let v = Value::Object(obj);
    let measures = match get_path(&v, "measures") {
        Some(Value::Object(m)) => m.clone(),
        None => Map::new(),
        Some(_) => {
            return Err((
                FailureReason::DecodeError,
                "convert() returned non-object measures".into(),
            ))
        }
    };
    Ok(PartialUnit {
        data_id: get_path(&v, "dataId").and_then(value_as_id),
        reported_at: weft_model::uplink::read_optional_time(
            "reportedAt (returned by convert())",
            get_path(&v, "reportedAt"),
        )
        .transpose(),
        device_id: get_path(&v, "device.id").and_then(value_as_id),
        device_name: get_path(&v, "device.name").and_then(value_as_id),
        measures,
    })
}

/// sensae's sub-device shape: when every measure key is an index
/// (`{"0":{…},"1":{…}}`), index 0 is the device itself and the others map
/// to sub-device ids through the device record (unmapped indexes become
/// `<device id>:<index>`). Each gets its own unit and `dataId`
/// (`<dataId>:<index>` for sub-devices, so replays stay idempotent). An
/// index that resolves to a device already given a unit (a loop or a
/// duplicate in a record saved before definitions were checked), or to an
/// id NGSI cannot name, is dropped: one uplink never makes two units for
/// one entity.
fn split_sub_devices(base: DataUnit, known: Option<&Device>, catalog: &Catalog) -> Vec<DataUnit> {
    let all_indexes = !base.measures.is_empty()
        && base
            .measures
            .iter()
            .all(|(k, v)| k.parse::<u32>().is_ok() && v.is_object());
    if !all_indexes {
        return vec![base];
    }
    let mut indexed: Vec<(u32, &Value)> = base
        .measures
        .iter()
        .map(|(k, v)| (k.parse().expect("checked above"), v))
        .collect();
    indexed.sort_by_key(|(index, _)| *index);
    let mut units = Vec::with_capacity(indexed.len());
    let mut produced = std::collections::HashSet::new();
    for (index, measures) in indexed {
        let Value::Object(measures) = measures else {
            continue;
        };
        let mut unit = base.clone();
        unit.measures = measures.clone();
        if index != 0 {
            let id = known
                .and_then(|d| d.sub_devices.iter().find(|s| s.index == index))
                .map(|s| s.id.clone())
                .unwrap_or_else(|| format!("{}:{index}", base.device.id));
            if id == base.device.id
                || produced.contains(&id)
                || weft_model::device::check_device_id(&id).is_err()
            {
                tracing::debug!(device = %base.device.id, index, sub = %id, "sub-device index dropped");
                continue;
            }
            let sub = catalog.device(&id);
            unit.data_id = format!("{}:{index}", base.data_id);
            unit.device = DeviceInfo {
                id,
                name: sub.as_ref().map(|d| d.name.clone()).unwrap_or_default(),
                device_type: sub
                    .as_ref()
                    .map(|d| d.device_type.clone())
                    .unwrap_or_else(|| base.device.device_type.clone()),
                records: sub.as_ref().map(|d| d.records.clone()).unwrap_or_default(),
                static_data: sub
                    .as_ref()
                    .map(|d| d.static_data.clone())
                    .unwrap_or_default(),
            };
        }
        produced.insert(unit.device.id.clone());
        units.push(unit);
    }
    units
}

/// Bytes from a base64 string (standard alphabet, padding optional).
pub fn base64_bytes(raw: &str) -> Result<Vec<u8>, String> {
    let raw = raw.trim();
    base64::engine::general_purpose::STANDARD
        .decode(raw)
        .or_else(|_| {
            base64::engine::general_purpose::STANDARD_NO_PAD.decode(raw.trim_end_matches('='))
        })
        .map_err(|e| format!("payload is not valid base64: {e}"))
}

/// Bytes from a hex string (spaces allowed) or, failing that, base64.
pub fn hex_or_base64(raw: &str) -> Result<Vec<u8>, String> {
    let compact: String = raw.chars().filter(|c| !c.is_whitespace()).collect();
    if compact.len().is_multiple_of(2) && compact.chars().all(|c| c.is_ascii_hexdigit()) {
        return hex::decode(&compact).map_err(|e| e.to_string());
    }
    base64_bytes(raw)
}

/// Property tests of reading uplinks: whatever JSON a device or network
/// server posts, in any of the formats, reading its envelope and payload
/// answers (with a payload error where it is one) and never panics.
/// `PROPTEST_CASES=100000 cargo test -p weft-pipeline proptest` runs
/// longer.
#[cfg(test)]
mod proptests {
    use base64::Engine;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    use super::*;

    /// The field names the formats read, so generated bodies reach them.
    fn key() -> impl Strategy<Value = String> {
        prop::sample::select(vec![
            "uuid",
            "dataId",
            "id",
            "device",
            "name",
            "dev_eui",
            "reported_at",
            "reportedAt",
            "payload",
            "bytes",
            "port",
            "fPort",
            "f_port",
            "uplink_message",
            "correlation_ids",
            "received_at",
            "end_device_ids",
            "device_id",
            "application_ids",
            "application_id",
            "f_cnt",
            "frm_payload",
            "f_port",
            "decoded_payload",
            "version_ids",
            "model_id",
            "deduplicationId",
            "deviceInfo",
            "devEui",
            "deviceName",
            "deviceProfileName",
            "applicationName",
            "time",
            "data",
            "object",
            "x",
        ])
        .prop_map(str::to_string)
    }

    /// JSON values, with the formats' names as keys and payload-like
    /// strings, nested deeply too.
    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            "[0-9a-fA-F ]{0,12}".prop_map(Value::String),
            "[A-Za-z0-9+/=]{0,12}".prop_map(Value::String),
            "as:up:\\PC{0,4}".prop_map(Value::String),
            Just(json!("2026-01-02T03:04:05.123456789Z")),
            "\\PC{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(24, 256, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::vec((key(), inner), 0..8)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    const FORMATS: [UplinkFormat; 4] = [
        UplinkFormat::SensaeEncoded,
        UplinkFormat::SensaeDecoded,
        UplinkFormat::Ttn,
        UplinkFormat::ChirpStack,
    ];

    /// `cases` cases per property, unless `PROPTEST_CASES` asks for another
    /// number (a longer run: `PROPTEST_CASES=100000`).
    fn config(cases: u32) -> ProptestConfig {
        let mut config = ProptestConfig::default();
        if std::env::var_os("PROPTEST_CASES").is_none() {
            config.cases = cases;
        }
        config
    }

    proptest! {
        #![proptest_config(config(1024))]

        /// Any body, in every format, gives an envelope.
        #[test]
        fn arbitrary_bodies_never_panic(body in json()) {
            for format in FORMATS {
                let _ = crate::uplink::server(format).envelope(&body);
            }
        }

        /// Any string as a payload decodes or fails cleanly.
        #[test]
        fn arbitrary_payload_strings_never_panic(raw in "\\PC{0,64}") {
            let _ = base64_bytes(&raw);
            let _ = hex_or_base64(&raw);
            let _ = weft_model::uplink::read_reported_time("t", &Value::String(raw.clone()));
        }

        /// Bytes written as base64 (padded or not) or hex read back as
        /// the same bytes.
        #[test]
        fn payload_encodings_round_trip(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            let padded = base64::engine::general_purpose::STANDARD.encode(&bytes);
            prop_assert_eq!(base64_bytes(&padded).unwrap(), bytes.clone());
            prop_assert_eq!(base64_bytes(padded.trim_end_matches('=')).unwrap(), bytes.clone());
            prop_assert_eq!(hex_or_base64(&hex::encode(&bytes)).unwrap(), bytes.clone());
            let body = json!({"payload": padded, "port": 7});
            let read = crate::uplink::server(UplinkFormat::SensaeEncoded).envelope(&body);
            prop_assert_eq!(read.payload.unwrap().unwrap(), (bytes, 7));
        }
    }
}
