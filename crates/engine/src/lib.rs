//! weft's script sandbox (façade). Callers never see rquickjs: they hand
//! [`Call`]s to an [`Engine`] and get JSON values or a [`CodecError`] back.
//!
//! PUBLIC API CONTRACT (implemented in the private modules):
//!
//! ```ignore
//! let engine = Engine::start(EngineConfig::default());
//! let script = Script::new("function decodeUplink(input){ return {data:{a:input.bytes[0]}} }");
//! engine.check(&script).await?;                 // compile check: Ok(ScriptKind) or Err(CodecError::Compile{..})
//! let out = engine.run(vec![Call::DecodeUplink{script, bytes: vec![1], f_port: 85, recv_time_ms: 0}]).await?;
//! // out: Vec<Result<serde_json::Value, CodecError>>, one per call, same order
//! let decoded = interpret_decode_uplink(out[0].clone()?)?;  // Decoded{data, warnings}
//! ```
#![deny(missing_docs)]
