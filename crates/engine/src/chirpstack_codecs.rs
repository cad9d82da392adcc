//! ChirpStack-style codecs, written here in ChirpStack's form
//! (`decodeUplink(input)` with `Buffer.from(input.bytes)`,
//! `encodeDownlink(input)` returning `{bytes}`), run end to end: the
//! `Buffer` global, `input.variables` and the way encoder bytes become
//! bytes. Every expected value is worked out by hand in the comments.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::{
    interpret_decode_uplink, interpret_encode_downlink, Call, CodecError, Engine, EngineConfig,
    Script,
};

fn engine() -> Engine {
    Engine::start(EngineConfig::default())
}

async fn run_one(engine: &Engine, call: Call) -> Result<Value, CodecError> {
    let mut results = engine
        .run(vec![call])
        .await
        .expect("engine accepts the batch");
    results.remove(0)
}

fn uplink(script: &Script, bytes: &[u8]) -> Call {
    Call::DecodeUplink {
        script: script.clone(),
        bytes: bytes.to_vec(),
        f_port: 10,
        recv_time_ms: 0,
    }
}

fn downlink(script: &Script, data: Value) -> Call {
    Call::EncodeDownlink {
        script: script.clone(),
        data,
        f_port: None,
    }
}

/// Decodes `bytes` with a `decodeUplink` whose body is `body` and returns
/// its `data`.
async fn decode_with(body: &str, bytes: &[u8]) -> Result<Value, CodecError> {
    let script = Script::new(&format!(
        "function decodeUplink(input) {{\n var buf = Buffer.from(input.bytes);\n {body}\n}}"
    ));
    let returned = run_one(&engine(), uplink(&script, bytes)).await?;
    interpret_decode_uplink(returned).map(|decoded| Value::Object(decoded.data))
}

fn variables(pairs: &[(&str, &str)]) -> Arc<BTreeMap<String, String>> {
    Arc::new(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

/// Integer reads, both byte orders, signed and unsigned, fixed and
/// variable width, plus `.length` and index access.
#[tokio::test]
async fn buffer_integer_reads() {
    // index:  0     1     2     3     4     5     6     7     8     9     10    11
    let bytes = [
        0x01, 0xFF, 0x80, 0x00, 0x12, 0x34, 0x56, 0x78, 0xFE, 0xFF, 0xFF, 0xFF,
    ];
    let data = decode_with(
        "return {data: {
           length: buf.length, first: buf[0], last: buf[buf.length - 1],
           u8: buf.readUInt8(1), u8alias: buf.readUint8(1), i8: buf.readInt8(1), i8min: buf.readInt8(2),
           u8default: buf.readUInt8(),
           u16le: buf.readUInt16LE(4), u16be: buf.readUInt16BE(4),
           i16le: buf.readInt16LE(1), i16be: buf.readInt16BE(1),
           u32le: buf.readUInt32LE(4), u32be: buf.readUInt32BE(4),
           u32le8: buf.readUInt32LE(8),
           i32le: buf.readInt32LE(8), i32be: buf.readInt32BE(8),
           uintbe3: buf.readUIntBE(4, 3), uintle3: buf.readUIntLE(4, 3), intle3: buf.readIntLE(8, 3),
           big: String(buf.readBigUInt64BE(4)), bigi: String(buf.readBigInt64LE(4))
         }};",
        &bytes,
    )
    .await
    .unwrap();
    assert_eq!(
        data,
        json!({
            "length": 12, "first": 1, "last": 255,
            "u8": 255, "u8alias": 255, "i8": -1, "i8min": -128, "u8default": 1,
            // 34 12 little endian = 0x3412; big endian 0x1234.
            "u16le": 13330, "u16be": 4660,
            // FF 80: LE 0x80FF = 33023 - 65536; BE 0xFF80 = 65408 - 65536.
            "i16le": -32513, "i16be": -128,
            "u32le": 0x7856_3412_u32, "u32be": 0x1234_5678_u32,
            "u32le8": 0xFFFF_FFFE_u32,
            // FE FF FF FF: LE 0xFFFFFFFE = -2; BE 0xFEFFFFFF = -16777217.
            "i32le": -2, "i32be": -16_777_217,
            "uintbe3": 0x12_3456, "uintle3": 0x56_3412, "intle3": -2,
            // 12 34 56 78 FE FF FF FF.
            "big": 0x1234_5678_FEFF_FFFF_u64.to_string(),
            // LE: 0xFFFFFFFE78563412 as i64 = -(0x1_87A9_CBEE).
            "bigi": (-0x1_87A9_CBEE_i64).to_string()
        })
    );
}

/// Float and double reads in both byte orders: 1.5 is 0x3FC00000, -2.25
/// is 0xC0100000, 100.25 is the double 0x4059100000000000.
#[tokio::test]
async fn buffer_float_reads() {
    let bytes = [
        0x3F, 0xC0, 0x00, 0x00, // 1.5, BE
        0x00, 0x00, 0x10, 0xC0, // -2.25, LE
        0x40, 0x59, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, // 100.25, BE
        0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x59, 0x40, // 100.25, LE
    ];
    let data = decode_with(
        "return {data: {
           fbe: buf.readFloatBE(0), fle: buf.readFloatLE(4),
           dbe: buf.readDoubleBE(8), dle: buf.readDoubleLE(16)
         }};",
        &bytes,
    )
    .await
    .unwrap();
    assert_eq!(
        data,
        json!({"fbe": 1.5, "fle": -2.25, "dbe": 100.25, "dle": 100.25})
    );
}

/// Every `write*` method returns offset + size and lays the bytes out as
/// Node does; the encoder returns them as a plain array and the Buffer
/// itself (which arrives as its toJSON form and is taken as its bytes).
#[tokio::test]
async fn buffer_writes() {
    let script = Script::new(
        "function encodeDownlink(input) {
           var b = Buffer.alloc(50);
           var ends = [
             b.writeUInt8(0xAB, 0), b.writeInt8(-2, 1),
             b.writeUInt16LE(0x1234, 2), b.writeUInt16BE(0x1234, 4),
             b.writeInt16LE(-2, 6), b.writeInt16BE(-300, 8),
             b.writeUInt32LE(0xDEADBEEF, 10), b.writeUInt32BE(1, 14),
             b.writeInt32LE(-1, 18), b.writeInt32BE(-16777217, 22),
             b.writeFloatLE(1.5, 26), b.writeFloatBE(-2.25, 30),
             b.writeDoubleBE(100.25, 34), b.writeDoubleLE(100.25, 42)
           ];
           return input.data.asBuffer ? { bytes: b } : { bytes: Array.from(b), ends: ends };
         }",
    );
    let want: Vec<u8> = vec![
        0xAB, 0xFE, // u8, i8 -2
        0x34, 0x12, 0x12, 0x34, // u16 LE, BE
        0xFE, 0xFF, 0xFE, 0xD4, // i16 LE -2, BE -300 = 0xFED4
        0xEF, 0xBE, 0xAD, 0xDE, 0x00, 0x00, 0x00, 0x01, // u32 LE, BE
        0xFF, 0xFF, 0xFF, 0xFF, 0xFE, 0xFF, 0xFF, 0xFF, // i32 LE -1, BE -16777217
        0x00, 0x00, 0xC0, 0x3F, 0xC0, 0x10, 0x00, 0x00, // float LE 1.5, BE -2.25
        0x40, 0x59, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, // double BE 100.25
        0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x59, 0x40, // double LE 100.25
    ];
    let engine = engine();
    let returned = run_one(&engine, downlink(&script, json!({})))
        .await
        .unwrap();
    assert_eq!(
        returned["ends"],
        json!([1, 2, 4, 6, 8, 10, 14, 18, 22, 26, 30, 34, 42, 50])
    );
    assert_eq!(interpret_encode_downlink(returned).unwrap().bytes, want);
    let returned = run_one(&engine, downlink(&script, json!({"asBuffer": true})))
        .await
        .unwrap();
    assert_eq!(interpret_encode_downlink(returned).unwrap().bytes, want);
}

/// Strings: hex, base64 (with and without padding, base64url), utf8 by
/// default with multi-byte characters, all round trips.
#[tokio::test]
async fn buffer_strings() {
    let data = decode_with(
        "var hello = Buffer.from('48656c6c6f', 'hex');
         var text = 'h\\u00e9llo \\u20ac';
         var smile = '\\ud83d\\ude00';
         return {data: {
           hello: hello.toString(), helloUtf8: hello.toString('utf8'),
           b64: hello.toString('base64'),
           fromB64: Buffer.from('SGVsbG8=', 'base64').toString('hex'),
           fromB64NoPad: Buffer.from('SGVsbG8', 'base64').toString(),
           bytesB64: buf.toString('base64'), bytesB64url: buf.toString('base64url'),
           oneB64: Buffer.from([0xFB]).toString('base64'),
           bytesHex: buf.toString('hex'),
           hexRoundTrip: Buffer.from(buf.toString('hex'), 'hex').equals(buf),
           b64RoundTrip: Buffer.from(buf.toString('base64'), 'base64').equals(buf),
           utf8Length: Buffer.from(text).length, utf8Hex: Buffer.from(text, 'utf8').toString('hex'),
           utf8RoundTrip: Buffer.from(text).toString() === text,
           smileHex: Buffer.from(smile).toString('hex'),
           smileBack: Buffer.from('f09f9880', 'hex').toString() === smile,
           upperHex: Buffer.from('ABcd', 'hex').toString('hex'),
           badHex: Buffer.from('12zz34', 'hex').toString('hex'),
           partial: hello.toString('hex', 1, 3)
         }};",
        &[0xFF, 0xFE, 0x00],
    )
    .await
    .unwrap();
    assert_eq!(
        data,
        json!({
            "hello": "Hello", "helloUtf8": "Hello",
            "b64": "SGVsbG8=", "fromB64": "48656c6c6f", "fromB64NoPad": "Hello",
            // 11111111 11111110 00000000 → 111111 111111 111000 000000.
            "bytesB64": "//4A", "bytesB64url": "__4A",
            // 111110 11(0000) → "+w" and two pads.
            "oneB64": "+w==",
            "bytesHex": "fffe00", "hexRoundTrip": true, "b64RoundTrip": true,
            // h é(2) l l o space €(3) = 10 bytes.
            "utf8Length": 10, "utf8Hex": "68c3a96c6c6f20e282ac", "utf8RoundTrip": true,
            "smileHex": "f09f9880", "smileBack": true,
            "upperHex": "abcd",
            // Node stops at the first pair that is not hex.
            "badHex": "12",
            "partial": "656c"
        })
    );
}

/// `from` (array, Buffer copy, `new Buffer`), `alloc` and its fills,
/// `isBuffer`, `concat`, `slice`/`subarray` sharing memory, `toJSON`,
/// `equals`.
#[tokio::test]
async fn buffer_construction_and_helpers() {
    let data = decode_with(
        "var copy = Buffer.from(buf); copy[0] = 9;
         var view = buf.slice(1); view[0] = 7;
         var sub = buf.subarray(-1);
         return {data: {
           original: Array.from(buf), copy: Array.from(copy),
           viewLength: view.length, subFirst: sub[0], viewIsBuffer: Buffer.isBuffer(view),
           viewInstance: view instanceof Buffer,
           legacy: new Buffer(input.bytes).toString('hex'),
           wrapped: Buffer.from([256, -1, 511]).toString('hex'),
           zeros: Buffer.alloc(3).toString('hex'), filled: Buffer.alloc(3, 0xAA).toString('hex'),
           filledText: Buffer.alloc(4, 'ab').toString('hex'), filledBig: Buffer.alloc(3, 257).toString('hex'),
           isBuffer: [Buffer.isBuffer(buf), Buffer.isBuffer(new Uint8Array(2)), Buffer.isBuffer([1]), Buffer.isBuffer('ab')],
           concat: Buffer.concat([Buffer.from([1]), Buffer.from([2, 3])]).toString('hex'),
           concatShort: Buffer.concat([Buffer.from([1]), Buffer.from([2, 3])], 2).toString('hex'),
           json: buf.toJSON(), stringified: JSON.stringify(Buffer.from([1, 2])),
           equal: Buffer.from('0102', 'hex').equals(Buffer.from([1, 2])),
           unequal: Buffer.from([1, 2]).equals(Buffer.from([1, 3])),
           shorter: Buffer.from([1, 2]).equals(Buffer.from([1]))
         }};",
        &[1, 2, 3],
    )
    .await
    .unwrap();
    assert_eq!(
        data,
        json!({
            "original": [1, 7, 3], "copy": [9, 2, 3],
            "viewLength": 2, "subFirst": 3, "viewIsBuffer": true, "viewInstance": true,
            // A copy of input.bytes, which the view above did not touch.
            "legacy": "010203",
            // Array values are taken modulo 256, as a Uint8Array stores them.
            "wrapped": "00ffff",
            "zeros": "000000", "filled": "aaaaaa", "filledText": "61626162", "filledBig": "010101",
            "isBuffer": [true, false, false, false],
            "concat": "010203", "concatShort": "0102",
            "json": {"type": "Buffer", "data": [1, 7, 3]},
            "stringified": "{\"type\":\"Buffer\",\"data\":[1,2]}",
            "equal": true, "unequal": false, "shorter": false
        })
    );
}

/// Reads and writes outside the buffer throw a catchable RangeError with
/// Node's text; uncaught, the decode fails with it.
#[tokio::test]
async fn buffer_out_of_range() {
    let data = decode_with(
        "function attempt(f) {
           try { f(); return 'no error'; }
           catch (e) { return [e instanceof RangeError, e.name, e.code, e.message]; }
         }
         return {data: {
           u16: attempt(function () { return buf.readUInt16LE(1); }),
           u8: attempt(function () { return buf.readUInt8(2); }),
           negative: attempt(function () { return buf.readInt8(-1); }),
           fraction: attempt(function () { return buf.readUInt8(0.5); }),
           short: attempt(function () { return buf.readUInt32BE(0); }),
           write: attempt(function () { return buf.writeUInt8(256, 0); }),
           writeAt: attempt(function () { return buf.writeUInt16BE(1, 1); }),
           writeSigned: attempt(function () { return buf.writeInt8(-129, 0); })
         }};",
        &[1, 2],
    )
    .await
    .unwrap();
    let range = |code: &str, message: &str| json!([true, "RangeError", code, message]);
    let offset = |max: u32, got: &str| {
        range(
            "ERR_OUT_OF_RANGE",
            &format!(
                "The value of \"offset\" is out of range. It must be >= 0 and <= {max}. Received {got}"
            ),
        )
    };
    assert_eq!(
        data,
        json!({
            "u16": offset(0, "1"),
            "u8": offset(1, "2"),
            "negative": offset(1, "-1"),
            "fraction": range("ERR_OUT_OF_RANGE", "The value of \"offset\" is out of range. It must be an integer. Received 0.5"),
            "short": range("ERR_BUFFER_OUT_OF_BOUNDS", "Attempt to access memory outside buffer bounds"),
            "write": range("ERR_OUT_OF_RANGE", "The value of \"value\" is out of range. It must be >= 0 and <= 255. Received 256"),
            "writeAt": offset(0, "1"),
            "writeSigned": range("ERR_OUT_OF_RANGE", "The value of \"value\" is out of range. It must be >= -128 and <= 127. Received -129")
        })
    );
    let error = decode_with("return {data: {v: buf.readUInt8(5)}};", &[1])
        .await
        .unwrap_err();
    assert!(
        matches!(&error, CodecError::Exception { message, .. }
            if message == "RangeError: The value of \"offset\" is out of range. It must be >= 0 and <= 0. Received 5"),
        "{error:?}"
    );
}

/// `input.variables` reaches decodeUplink, encodeDownlink and
/// decodeDownlink: the device's when given, `{}` otherwise.
#[tokio::test]
async fn variables_reach_the_codec() {
    let engine = engine();
    let script = Script::new(
        "function decodeUplink(input) {
           return {data: {vars: input.variables, scaled: input.bytes[0] * Number(input.variables.scale || 1)}};
         }
         function encodeDownlink(input) {
           return {bytes: [Object.keys(input.variables).length, input.data.x], seen: input.variables};
         }
         function decodeDownlink(input) { return {data: {vars: input.variables}}; }",
    );
    let vars = variables(&[("scale", "10"), ("apiKey", "abc")]);

    let plain = run_one(&engine, uplink(&script, &[3])).await.unwrap();
    assert_eq!(plain["data"], json!({"vars": {}, "scaled": 3}));
    let with = run_one(
        &engine,
        uplink(&script, &[3]).with_variables(Arc::clone(&vars)),
    )
    .await
    .unwrap();
    assert_eq!(
        with["data"],
        json!({"vars": {"scale": "10", "apiKey": "abc"}, "scaled": 30})
    );

    let plain = run_one(&engine, downlink(&script, json!({"x": 5})))
        .await
        .unwrap();
    assert_eq!(plain["seen"], json!({}));
    assert_eq!(interpret_encode_downlink(plain).unwrap().bytes, vec![0, 5]);
    let with = run_one(
        &engine,
        downlink(&script, json!({"x": 5})).with_variables(Arc::clone(&vars)),
    )
    .await
    .unwrap();
    assert_eq!(with["seen"], json!({"scale": "10", "apiKey": "abc"}));
    assert_eq!(interpret_encode_downlink(with).unwrap().bytes, vec![2, 5]);

    let call = Call::DecodeDownlink {
        script: script.clone(),
        bytes: vec![1],
        f_port: 1,
    };
    // Wrapping twice keeps the last variables only.
    let call = call
        .with_variables(variables(&[("a", "1")]))
        .with_variables(variables(&[("b", "2")]));
    assert_eq!(
        run_one(&engine, call).await.unwrap()["data"],
        json!({"vars": {"b": "2"}})
    );
}

/// A ChirpStack-form encoder that builds its bytes in a `Buffer` from the
/// data and the device's variables, as the encode dry run and a queued
/// downlink run it: the returned `Buffer` is its bytes, its `fPort` and
/// `warnings` come through, and its `errors` (with `warnings`) refuse it.
#[tokio::test]
async fn a_buffer_encoder_reads_the_devices_variables() {
    let engine = engine();
    let script = Script::new(
        "function encodeDownlink(input) {
           if (typeof input.data.setpoint !== 'number') {
             return {errors: ['setpoint must be a number'], warnings: ['checked']};
           }
           var b = Buffer.alloc(4);
           b.writeUInt8(Number(input.variables.command || 1), 0);
           b.writeInt16BE(Math.round(input.data.setpoint * 10), 1);
           b.writeUInt8(input.variables.serial ? input.variables.serial.length : 0, 3);
           return {bytes: b, fPort: Number(input.variables.port || 20),
                   warnings: input.data.setpoint > 30 ? ['hot'] : []};
         }",
    );
    let vars = variables(&[("command", "7"), ("port", "9"), ("serial", "A-77")]);
    // 21.5 → 215 = 0x00d7; "A-77" is 4 characters.
    let returned = run_one(
        &engine,
        downlink(&script, json!({"setpoint": 21.5})).with_variables(Arc::clone(&vars)),
    )
    .await
    .unwrap();
    assert_eq!(
        interpret_encode_downlink(returned),
        Ok(crate::Encoded {
            bytes: vec![7, 0x00, 0xd7, 4],
            f_port: Some(9),
            warnings: Vec::new(),
        })
    );
    // Without variables: command 1, port 20, no serial; -3.2 → -32 = 0xffe0.
    let returned = run_one(&engine, downlink(&script, json!({"setpoint": -3.2})))
        .await
        .unwrap();
    assert_eq!(
        interpret_encode_downlink(returned),
        Ok(crate::Encoded {
            bytes: vec![1, 0xff, 0xe0, 0],
            f_port: Some(20),
            warnings: Vec::new(),
        })
    );
    let returned = run_one(&engine, downlink(&script, json!({"setpoint": 31})))
        .await
        .unwrap();
    assert_eq!(
        interpret_encode_downlink(returned).unwrap().warnings,
        vec!["hot".to_string()]
    );
    let returned = run_one(&engine, downlink(&script, json!({"setpoint": "x"})))
        .await
        .unwrap();
    assert_eq!(
        crate::reported_problems(&returned),
        Some((
            vec!["setpoint must be a number".to_string()],
            vec!["checked".to_string()]
        ))
    );
    assert_eq!(
        interpret_encode_downlink(returned),
        Err(CodecError::Reported(vec![
            "setpoint must be a number".into()
        ]))
    );
}

/// Encoder bytes outside 0–255 are converted as ChirpStack converts them
/// (saturating: 256 → 255, -1 → 0, fraction dropped); non-numbers are
/// still refused.
#[tokio::test]
async fn encoder_bytes_are_clamped() {
    let engine = engine();
    let script = Script::new(
        "function encodeDownlink(input) {
           if (input.data.text) return {bytes: [1, '2']};
           return {bytes: [256, -1, 1000, 127.9, 0x1FF, 0, 255]};
         }",
    );
    let returned = run_one(&engine, downlink(&script, json!({})))
        .await
        .unwrap();
    assert_eq!(
        interpret_encode_downlink(returned).unwrap().bytes,
        vec![255, 0, 255, 127, 255, 0, 255]
    );
    let returned = run_one(&engine, downlink(&script, json!({"text": true})))
        .await
        .unwrap();
    assert_eq!(
        interpret_encode_downlink(returned),
        Err(CodecError::InvalidOutput(
            "encodeDownlink returned \"2\" in bytes, which must be numbers".into()
        ))
    );
}

/// Buffer is JavaScript inside the sandbox: a Buffer-heavy endless loop is
/// stopped by the time limit, a huge Buffer by the memory limit, and the
/// worker carries on.
#[tokio::test]
async fn buffer_work_is_bounded_by_the_limits() {
    let engine = engine();
    let looping = Script::new(
        "function decodeUplink(input) {
           var b = Buffer.alloc(64);
           while (true) {
             b.writeUInt32LE((b.readUInt32LE(0) + 1) >>> 0, 0);
             Buffer.from(b.toString('hex'), 'hex');
           }
         }",
    );
    assert_eq!(
        run_one(&engine, uplink(&looping, &[])).await,
        Err(CodecError::Timeout(Duration::from_millis(100)))
    );
    let huge = Script::new(
        "function decodeUplink(input) { return {data: {n: Buffer.alloc(1e9).length}}; }",
    );
    assert_eq!(
        run_one(&engine, uplink(&huge, &[])).await,
        Err(CodecError::OutOfMemory)
    );
    let fine = Script::new(
        "function decodeUplink(input) { return {data: {hex: Buffer.from(input.bytes).toString('hex')}}; }",
    );
    assert_eq!(
        run_one(&engine, uplink(&fine, &[0xAB])).await.unwrap()["data"],
        json!({"hex": "ab"})
    );
}

/// The legacy entry points and rules get Buffer too, and a codec that
/// brings its own `Buffer` keeps it.
#[tokio::test]
async fn buffer_everywhere_and_shadowable() {
    let engine = engine();
    let legacy = Script::new(
        "function Decoder(bytes, port) { return {hex: Buffer.from(bytes).toString('hex'), port: port}; }
         function Encoder(object, port) { var b = Buffer.alloc(2); b.writeUInt16BE(object.v, 0); return Array.from(b); }",
    );
    assert_eq!(
        run_one(&engine, uplink(&legacy, &[1, 2])).await.unwrap()["data"],
        json!({"hex": "0102", "port": 10})
    );
    let returned = run_one(&engine, downlink(&legacy, json!({"v": 0x0102})))
        .await
        .unwrap();
    assert_eq!(
        interpret_encode_downlink(returned).unwrap().bytes,
        vec![1, 2]
    );
    let rule = Script::new("function evaluate(x) { return Buffer.from([x]).toString('hex'); }");
    let call = Call::Function {
        script: rule,
        name: "evaluate".into(),
        args: vec![json!(255)],
    };
    assert_eq!(run_one(&engine, call).await, Ok(json!("ff")));
    let own = Script::new(
        "function Buffer(n) { this.mine = n; }
         function decodeUplink(input) { return {data: {mine: new Buffer(4).mine}}; }",
    );
    assert_eq!(
        run_one(&engine, uplink(&own, &[])).await.unwrap()["data"],
        json!({"mine": 4})
    );
    // Buffer is built once per context and stays the same object; a
    // script that assigns it changes it for its own later calls (as with
    // any builtin), not for other scripts.
    let clobber = Script::new(
        "function decodeUplink(input) {
           var had = typeof Buffer, same = Buffer === Buffer;
           Buffer = undefined;
           return {data: {had: had, same: same, gone: Buffer === undefined}};
         }",
    );
    assert_eq!(
        run_one(&engine, uplink(&clobber, &[])).await.unwrap()["data"],
        json!({"had": "function", "same": true, "gone": true})
    );
    assert_eq!(
        run_one(&engine, uplink(&clobber, &[])).await.unwrap()["data"],
        json!({"had": "undefined", "same": true, "gone": true})
    );
    let other = Script::new("function decodeUplink(input) { return {data: {t: typeof Buffer}}; }");
    assert_eq!(
        run_one(&engine, uplink(&other, &[])).await.unwrap()["data"],
        json!({"t": "function"})
    );
}
