//! What callers hand to the engine: a [`Script`] (source plus a cache key)
//! and the [`Call`]s to run with it. These types are plain data, so the
//! pipeline and the rule engine can build and keep them without knowing
//! anything about QuickJS.

use std::collections::BTreeMap;
use std::sync::Arc;

/// A script's source together with the key its compiled form is cached under.
///
/// Workers keep one compiled context per script id, so the id must change
/// whenever the source changes: it is a hash of the source, computed once
/// here instead of on every call. A worker still compares the source on a
/// cache hit, so two sources that happen to share a hash never run each
/// other's code.
#[derive(Clone, Debug)]
pub struct Script {
    /// Stable 64-bit FNV-1a hash of `source`: the same text gives the same
    /// id in every process and every build.
    pub id: u64,
    /// The JavaScript source, shared so that cloning a script into each of
    /// thousands of calls costs a reference count, not a copy.
    pub source: Arc<str>,
}

impl Script {
    /// Wraps `source` and computes its cache key.
    pub fn new(source: &str) -> Script {
        Script {
            id: fnv1a(source.as_bytes()),
            source: Arc::from(source),
        }
    }
}

impl PartialEq for Script {
    fn eq(&self, other: &Script) -> bool {
        self.id == other.id && self.source == other.source
    }
}

impl Eq for Script {}

/// 64-bit FNV-1a: tiny, fast enough for sources hashed once, and fixed by
/// its definition, so ids never change between builds (unlike std's hasher).
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// Which well-known entry point a script defines, so the console can tell a
/// user which kind of codec or rule they saved.
///
/// When a script defines several, the first in this order wins:
/// `decodeUplink` (or TTN v2's `Decoder`), `convert`, `encodeDownlink` (or
/// TTN v2's `Encoder`), `evaluate`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScriptKind {
    /// TTN / ChirpStack style: `decodeUplink(input)` returning `{data, warnings?, errors?}`,
    /// or The Things Network v2's legacy `Decoder(bytes, port)` returning the data itself.
    DecodeUplink,
    /// sensae style: `convert(object)` returning a data unit.
    Convert,
    /// A codec for downlinks only: `encodeDownlink(input)` (or TTN v2's
    /// `Encoder(object, port)`) and no uplink decoder, for actuators that
    /// never report.
    EncodeDownlink,
    /// A JS rule: `evaluate(...)`.
    Evaluate,
    /// None of the above; only [`Call::Function`] can use it.
    Unknown,
}

/// One invocation of a script, the unit of work inside a batch.
#[derive(Clone, Debug)]
pub enum Call {
    /// Runs `decodeUplink({bytes, fPort, recvTime, variables})` where `bytes`
    /// is a plain array of numbers, `recvTime` a JS `Date` and `variables`
    /// the device's variables (`{}` unless given with
    /// [`Call::with_variables`]), as TTN and ChirpStack codecs expect. The raw return value comes back; see
    /// [`interpret_decode_uplink`](crate::interpret_decode_uplink).
    DecodeUplink {
        /// The codec.
        script: Script,
        /// The uplink's payload.
        bytes: Vec<u8>,
        /// The LoRaWAN port, which many codecs switch on.
        f_port: u32,
        /// When the network server received the uplink, epoch milliseconds.
        recv_time_ms: i64,
    },
    /// Runs `encodeDownlink({data, fPort, variables})` (The Things Stack's
    /// and ChirpStack's downlink encoder API; `variables` as for
    /// [`Call::DecodeUplink`]) or, when the script defines only TTN v2's
    /// `Encoder(object, port)`, that; the raw return value comes back, with
    /// a legacy encoder's byte array wrapped as `{bytes, fPort}`. See
    /// [`interpret_encode_downlink`](crate::interpret_encode_downlink).
    EncodeDownlink {
        /// The codec.
        script: Script,
        /// What to encode (the downlink's `data` object).
        data: serde_json::Value,
        /// The port the caller asked for, passed to the codec as `fPort`
        /// (TTN passes none; the codec may choose one).
        f_port: Option<u32>,
    },
    /// Runs `decodeDownlink({bytes, fPort, variables})`, The Things Stack's way of
    /// showing what a queued downlink's bytes mean.
    DecodeDownlink {
        /// The codec.
        script: Script,
        /// The downlink's payload.
        bytes: Vec<u8>,
        /// The downlink's port.
        f_port: u32,
    },
    /// Runs sensae's `convert(object)` with the parsed uplink body.
    Convert {
        /// The converter.
        script: Script,
        /// The uplink body.
        input: serde_json::Value,
    },
    /// A codec call together with the device's variables (ChirpStack's
    /// device variables: names to text), passed to the codec as
    /// `input.variables`. Build it with [`Call::with_variables`]; a codec
    /// call without it gets an empty `variables` object.
    WithVariables {
        /// The device's variables.
        variables: Arc<BTreeMap<String, String>>,
        /// The call they are for: [`Call::DecodeUplink`],
        /// [`Call::EncodeDownlink`] or [`Call::DecodeDownlink`] (other
        /// calls run as they would without them).
        call: Box<Call>,
    },
    /// Runs any global function by name, each argument passed as a JS value
    /// built from JSON (e.g. a rule's `evaluate(unit, state)`).
    Function {
        /// The script defining the function.
        script: Script,
        /// The global function to call.
        name: String,
        /// Its arguments, in order.
        args: Vec<serde_json::Value>,
    },
}

impl Call {
    /// This call with the device's `variables`, which the codec sees as
    /// `input.variables` (replacing any the call already had).
    pub fn with_variables(self, variables: Arc<BTreeMap<String, String>>) -> Call {
        let call = match self {
            Call::WithVariables { call, .. } => call,
            other => Box::new(other),
        };
        Call::WithVariables { variables, call }
    }

    /// The call itself and the variables it carries, if any.
    pub(crate) fn into_parts(self) -> (Call, Option<Arc<BTreeMap<String, String>>>) {
        match self {
            Call::WithVariables { variables, call } => {
                let (call, _) = call.into_parts();
                (call, Some(variables))
            }
            other => (other, None),
        }
    }

    /// The script this call runs.
    pub(crate) fn script(&self) -> &Script {
        match self {
            Call::WithVariables { call, .. } => call.script(),
            Call::DecodeUplink { script, .. }
            | Call::EncodeDownlink { script, .. }
            | Call::DecodeDownlink { script, .. }
            | Call::Convert { script, .. }
            | Call::Function { script, .. } => script,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The id is a pure function of the source: equal text, equal id; a
    /// one-character change gives a new id, so the changed codec is compiled afresh.
    #[test]
    fn id_follows_the_source() {
        let a = Script::new("function convert(o) { return o }");
        let b = Script::new("function convert(o) { return o }");
        let c = Script::new("function convert(o) { return o;}");
        assert_eq!(a.id, b.id);
        assert_ne!(a.id, c.id);
        // FNV-1a's published test vector: the id is stable across builds.
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
