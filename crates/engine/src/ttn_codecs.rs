//! Codecs in the shapes of The Things Stack's device repository, run as
//! its engine runs them: `decodeUplink` (with `normalizeUplink` beside it,
//! which weft does not call), TTN v2's `Decoder`/`Encoder`, `undefined`
//! fields rendered as `null`, returned `errors`, and the JavaScript idioms
//! vendor codecs use. Each expected value is what The Things Stack shows
//! for the same payload. The codecs live in `codecs/`.

use serde_json::{json, Value};

use crate::{
    interpret_decode_uplink, interpret_encode_downlink, reported_problems, Call, CodecError,
    Encoded, Engine, EngineConfig, Script, ScriptKind,
};

const CLIMATE: &str = include_str!("../codecs/climate-v3.js");
const LEGACY: &str = include_str!("../codecs/legacy-v2.js");
const UNDEFINED: &str = include_str!("../codecs/undefined-fields.js");
const IDIOMS: &str = include_str!("../codecs/idioms.js");
const ACTUATOR: &str = include_str!("../codecs/actuator-v3.js");

/// One call's raw result.
async fn run(engine: &Engine, call: Call) -> Result<Value, CodecError> {
    engine.run(vec![call]).await.expect("engine runs").remove(0)
}

/// `decodeUplink` (or `Decoder`) on `bytes` at `f_port`, raw result.
async fn uplink(
    engine: &Engine,
    source: &str,
    bytes: &[u8],
    f_port: u32,
) -> Result<Value, CodecError> {
    run(
        engine,
        Call::DecodeUplink {
            script: Script::new(source),
            bytes: bytes.to_vec(),
            f_port,
            recv_time_ms: 1_700_000_000_123,
        },
    )
    .await
}

/// The decoded data, as the pipeline reads it.
async fn data(
    engine: &Engine,
    source: &str,
    bytes: &[u8],
    f_port: u32,
) -> Result<Value, CodecError> {
    let returned = uplink(engine, source, bytes, f_port).await?;
    interpret_decode_uplink(returned).map(|d| Value::Object(d.data))
}

async fn encode(
    engine: &Engine,
    source: &str,
    data: Value,
    f_port: Option<u32>,
) -> Result<Encoded, CodecError> {
    let returned = run(
        engine,
        Call::EncodeDownlink {
            script: Script::new(source),
            data,
            f_port,
        },
    )
    .await?;
    interpret_encode_downlink(returned)
}

/// A v3 codec: DataView, toFixed, bit fields, String.fromCharCode,
/// unsigned shifts; warnings come with the data; returned errors fail the
/// uplink and are readable as the codec wrote them.
#[tokio::test]
async fn device_repository_v3_codec() {
    let engine = Engine::start(EngineConfig::default());
    assert_eq!(
        engine.check(&Script::new(CLIMATE)).await,
        Ok(ScriptKind::DecodeUplink)
    );
    let returned = uplink(
        &engine,
        CLIMATE,
        &[0x09, 0x24, 0x8b, 0x44, 0x7d, 0x50, 0x00, 0x85],
        1,
    )
    .await
    .unwrap();
    assert_eq!(
        returned,
        json!({"data": {"temperature": 23.4, "humidity": 69.5, "pressure": 1013.25,
                        "battery": {"voltage": 2.1, "low": true}},
               "warnings": ["battery low"]})
    );
    assert_eq!(
        data(&engine, CLIMATE, b"hi!", 2).await,
        Ok(json!({"label": "hi!"}))
    );
    assert_eq!(
        data(&engine, CLIMATE, &[0xff, 0, 0, 1], 3).await,
        Ok(json!({"counter": 4_278_190_081u64}))
    );
    let failed = uplink(&engine, CLIMATE, &[1], 9).await.unwrap();
    assert_eq!(
        reported_problems(&failed),
        Some((vec!["unknown fPort 9".to_string()], Vec::new()))
    );
    assert_eq!(
        interpret_decode_uplink(failed),
        Err(CodecError::Reported(vec!["unknown fPort 9".into()]))
    );
    assert_eq!(
        data(&engine, CLIMATE, &[1], 1).await,
        Err(CodecError::Reported(vec!["expected 8 bytes, got 1".into()]))
    );
}

/// TTN v2's `Decoder(bytes, port)`: called when no `decodeUplink`
/// exists, its return taken as the data; `Encoder(object, port)`'s byte
/// array becomes the downlink's bytes, on the port asked for.
#[tokio::test]
async fn legacy_v2_decoder_and_encoder() {
    let engine = Engine::start(EngineConfig::default());
    assert_eq!(
        engine.check(&Script::new(LEGACY)).await,
        Ok(ScriptKind::DecodeUplink)
    );
    assert_eq!(
        data(&engine, LEGACY, &[1, 0, 0xeb], 1).await,
        Ok(json!({"led": "on", "temperature": 23.5, "port": 1}))
    );
    assert_eq!(
        encode(&engine, LEGACY, json!({"led": "on"}), Some(2)).await,
        Ok(Encoded {
            bytes: vec![1],
            f_port: Some(2),
            warnings: vec![]
        })
    );
    // No port asked for: LoRaWAN's first application port.
    assert_eq!(
        encode(&engine, LEGACY, json!({"led": "on"}), None)
            .await
            .unwrap()
            .f_port,
        Some(1)
    );
    let encoder_only = "function Encoder(o, port) { return [o.n & 0xff, port]; }";
    assert_eq!(
        engine.check(&Script::new(encoder_only)).await,
        Ok(ScriptKind::EncodeDownlink)
    );
    assert_eq!(
        encode(&engine, encoder_only, json!({"n": 258}), Some(7))
            .await
            .unwrap()
            .bytes,
        vec![2, 7]
    );
    // An encoder-only codec has no uplink decoder, and says so by name.
    assert_eq!(
        uplink(&engine, encoder_only, &[1], 1).await,
        Err(CodecError::MissingFunction("decodeUplink".into()))
    );
    // `decodeUplink` wins over a `Decoder` in the same script.
    let both = "function Decoder(b) { return {v: 2}; }\nfunction decodeUplink(i) { return {data: {v: 3}}; }";
    assert_eq!(data(&engine, both, &[], 1).await, Ok(json!({"v": 3})));
}

/// `undefined` fields are rendered `null`, at any depth and in arrays,
/// as The Things Stack shows them; the keys are kept.
#[tokio::test]
async fn undefined_fields_become_null() {
    let engine = Engine::start(EngineConfig::default());
    assert_eq!(
        data(&engine, UNDEFINED, &[0, 100], 1).await,
        Ok(
            json!({"temperature": 10, "humidity": null, "nested": {"gps": null, "list": [null, 1]}})
        )
    );
    let legacy = "function Decoder(bytes, port) { return {a: undefined, b: bytes[0]}; }";
    assert_eq!(
        data(&engine, legacy, &[4], 1).await,
        Ok(json!({"a": null, "b": 4}))
    );
    // Functions and symbols are still left out, as any JSON rendering does.
    let functions = "function decodeUplink() { return {data: {f: function () {}, n: 1}}; }";
    assert_eq!(data(&engine, functions, &[], 1).await, Ok(json!({"n": 1})));
}

/// Destructuring, spread, arrow functions, template strings, `Date` from
/// `recvTime`, `JSON`, `Math`, `Object.assign`, typed arrays and hex.
#[tokio::test]
async fn common_javascript_idioms() {
    let engine = Engine::start(EngineConfig::default());
    assert_eq!(
        data(&engine, IDIOMS, &[7, 0, 60], 1).await,
        Ok(
            json!({"model": "demo", "version": 2, "unit": "°C", "kind": "k7",
                  "measuredAt": "2023-11-14T22:12:20.123Z", "max": 60, "hypot": 5,
                  "pow": 1024, "sqrt": 1.414, "json": "{\"a\":[1,2]}"})
        )
    );
    assert_eq!(
        data(&engine, IDIOMS, &[0x05, 0xf0, 0x12, 0x34, 0x56], 5).await,
        Ok(
            json!({"hex": "05f0123456", "signed": -16, "alarm": true, "mode": 2,
                  "id": 1_193_046, "scaled": 24})
        )
    );
}

/// `encodeDownlink` from `{data}` and `decodeDownlink` back: the codec's
/// port wins, its errors refuse the downlink.
#[tokio::test]
async fn downlink_encoder_and_decoder() {
    let engine = Engine::start(EngineConfig::default());
    let encoded = encode(
        &engine,
        ACTUATOR,
        json!({"command": "interval", "minutes": 300}),
        None,
    )
    .await
    .unwrap();
    assert_eq!(
        encoded,
        Encoded {
            bytes: vec![2, 1, 44],
            f_port: Some(11),
            warnings: vec![]
        }
    );
    assert_eq!(
        encode(&engine, ACTUATOR, json!({"command": "dance"}), Some(3)).await,
        Err(CodecError::Reported(vec!["unknown command dance".into()]))
    );
    let decoded = run(
        &engine,
        Call::DecodeDownlink {
            script: Script::new(ACTUATOR),
            bytes: vec![2, 1, 44],
            f_port: 11,
        },
    )
    .await
    .unwrap();
    assert_eq!(
        interpret_decode_uplink(decoded).map(|d| Value::Object(d.data)),
        Ok(json!({"command": "interval", "minutes": 300}))
    );
    // A codec without `decodeDownlink` says so.
    assert_eq!(
        run(
            &engine,
            Call::DecodeDownlink {
                script: Script::new(CLIMATE),
                bytes: vec![1],
                f_port: 1,
            },
        )
        .await,
        Err(CodecError::MissingFunction("decodeDownlink".into()))
    );
}
