//! weft's script sandbox: device codecs (`decodeUplink`, `encodeDownlink`,
//! `decodeDownlink`, TTN v2's `Decoder`/`Encoder`, `convert`) and JS
//! rules run here, in QuickJS, with a time limit, a memory limit and a stack
//! limit that bound everything a call runs, built-in functions included,
//! and with every script compiled once and reused. It sits in the
//! decode step of the data flow (ingest log → **decode** → process →
//! context) and in the rule engine. Callers never see rquickjs: they hand
//! [`Call`]s to an [`Engine`] and get JSON values or a [`CodecError`] back.
//! Scripts get no I/O of any kind: no modules, no network, no files.
//!
//! ```
//! use weft_engine::{interpret_decode_uplink, Call, CodecError, Engine, EngineConfig, Script, ScriptKind};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), CodecError> {
//! let engine = Engine::start(EngineConfig::default());
//! let script = Script::new("function decodeUplink(input) { return {data: {a: input.bytes[0]}}; }");
//! // Compile when the codec is saved: a syntax error is CodecError::Compile{message, line}.
//! assert_eq!(engine.check(&script).await?, ScriptKind::DecodeUplink);
//! let call = Call::DecodeUplink { script, bytes: vec![1], f_port: 85, recv_time_ms: 0 };
//! // Outer error: the engine is busy or stopped. Inner: this call's own result.
//! let mut results = engine.run(vec![call]).await?;
//! let decoded = interpret_decode_uplink(results.remove(0)?)?;
//! assert_eq!(decoded.data["a"], 1);
//! # Ok(())
//! # }
//! ```
//!
//! The modules:
//!
//! - `engine`: the cloneable handle; bounded queues in front of the workers.
//! - `worker`: a thread owning a QuickJS runtime, its limits and its cache
//!   of compiled scripts.
//! - `watchdog`: the worker slots and the jobs in progress; replaces a
//!   worker whose call is stuck in a built-in past its time limit, and
//!   keeps a script that hit a limit from costing the rest of its batch.
//! - `meter`: the allocator that lets a worker read its heap size cheaply.
//! - `convert`: JSON into JS values, results back to JSON, thrown values to errors.
//! - `buffer.js`: the Node-style `Buffer` global ChirpStack codecs use,
//!   plain JavaScript built in a context on its first use.
//! - `script`: the plain-data [`Script`] and [`Call`] callers build.
//! - `decoded`: reading a codec's result (`decodeUplink`, `encodeDownlink`)
//!   the TTN/ChirpStack way.
//! - `error`: [`CodecError`], whose texts users see.
#![deny(missing_docs)]

// `buffer.js`, the `Buffer` global every script gets, is included by `worker`.
mod convert;
mod decoded;
mod engine;
mod error;
mod meter;
mod script;
mod watchdog;
mod worker;

#[cfg(test)]
mod chirpstack_codecs;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod ttn_codecs;

pub use decoded::{
    interpret_decode_uplink, interpret_encode_downlink, reported_problems, Decoded, Encoded,
};
pub use engine::{Engine, EngineConfig};
pub use error::CodecError;
pub use script::{Call, Script, ScriptKind};
