//! The engine's behaviour end to end: real QuickJS workers, real scripts.
//! Each test says what it proves; together they cover ChirpStack's codec
//! cases (decoding, exact error text, infinite loop) plus what weft adds
//! (memory bomb, busy queue, isolation, cache reuse).

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::{interpret_decode_uplink, Call, CodecError, Engine, EngineConfig, Script, ScriptKind};

const EM300TH: &str = include_str!("../../../examples/codecs/em300th.js");

fn engine() -> Engine {
    Engine::start(EngineConfig::default())
}

fn decode_call(script: &Script, bytes: &[u8]) -> Call {
    Call::DecodeUplink {
        script: script.clone(),
        bytes: bytes.to_vec(),
        f_port: 85,
        recv_time_ms: 1_700_000_000_123,
    }
}

fn function_call(script: &Script, name: &str, args: Vec<Value>) -> Call {
    Call::Function {
        script: script.clone(),
        name: name.to_string(),
        args,
    }
}

/// Runs one call and returns its own result.
async fn run_one(engine: &Engine, call: Call) -> Result<Value, CodecError> {
    let mut results = engine
        .run(vec![call])
        .await
        .expect("engine accepts the batch");
    assert_eq!(results.len(), 1);
    results.remove(0)
}

async fn decode(engine: &Engine, script: &Script, bytes: &[u8]) -> Result<Value, CodecError> {
    let returned = run_one(engine, decode_call(script, bytes)).await?;
    interpret_decode_uplink(returned).map(|d| Value::Object(d.data))
}

/// The spec's example uplink decodes to exactly the documented object.
#[tokio::test]
async fn em300th_spec_example() {
    let engine = engine();
    let script = Script::new(EM300TH);
    let bytes = [0x01, 0x75, 0x5C, 0x03, 0x67, 0x34, 0x01, 0x04, 0x68, 0x65];
    assert_eq!(
        decode(&engine, &script, &bytes).await,
        Ok(json!({"battery": 92, "temperature": 30.8, "humidity": 50.5}))
    );
}

/// More vectors derived from the payload table: a negative temperature
/// (0xFF9C LE = -100 → -10.0 °C), records in another order, a lone record.
#[tokio::test]
async fn em300th_derived_vectors() {
    let engine = engine();
    let script = Script::new(EM300TH);
    let cases: &[(&[u8], Value)] = &[
        // JSON has one number type: -10.0 travels as -10.
        (&[0x03, 0x67, 0x9C, 0xFF], json!({"temperature": -10})),
        (&[0x04, 0x68, 0x7B], json!({"humidity": 61.5})),
        (
            &[0x04, 0x68, 0x00, 0x01, 0x75, 0x64, 0x03, 0x67, 0x00, 0x00],
            json!({"humidity": 0, "battery": 100, "temperature": 0}),
        ),
        (&[0x03, 0x67, 0x01, 0x80], json!({"temperature": -3276.7})),
        (&[], json!({})),
    ];
    for (bytes, want) in cases {
        assert_eq!(
            decode(&engine, &script, bytes).await.as_ref(),
            Ok(want),
            "{bytes:02X?}"
        );
    }
}

/// A record cut short and an unknown channel are the codec's own errors.
#[tokio::test]
async fn em300th_reported_errors() {
    let engine = engine();
    let script = Script::new(EM300TH);
    assert_eq!(
        decode(&engine, &script, &[0x01, 0x75, 0x5C, 0x03, 0x67, 0x34]).await,
        Err(CodecError::Reported(vec![
            "truncated record at byte 5".into()
        ]))
    );
    assert_eq!(
        decode(&engine, &script, &[0x05, 0x99, 0x01]).await,
        Err(CodecError::Reported(vec![
            "unknown record: channel 0x5 type 0x99".into()
        ]))
    );
    let error = decode(&engine, &script, &[0x01]).await.unwrap_err();
    assert_eq!(
        error.to_string(),
        "codec reported errors: truncated record at byte 0"
    );
}

/// `check` names the entry point, preferring decodeUplink over convert over evaluate.
#[tokio::test]
async fn check_reports_the_kind() {
    let engine = engine();
    let cases = [
        (EM300TH, ScriptKind::DecodeUplink),
        (
            "function convert(o) {} function decodeUplink(i) {}",
            ScriptKind::DecodeUplink,
        ),
        (
            "function evaluate() {} var convert = function (o) {};",
            ScriptKind::Convert,
        ),
        ("function evaluate(unit, state) {}", ScriptKind::Evaluate),
        ("var x = 1;", ScriptKind::Unknown),
    ];
    for (source, kind) in cases {
        assert_eq!(
            engine.check(&Script::new(source)).await,
            Ok(kind),
            "{source}"
        );
    }
}

/// A syntax error is a compile error with the parser's text and the line.
#[tokio::test]
async fn syntax_error_has_line() {
    let engine = engine();
    let script = Script::new("function decodeUplink(input) {\n  var a = 1;\n  return (a + );\n}\n");
    let error = engine.check(&script).await.unwrap_err();
    assert_eq!(
        error,
        CodecError::Compile {
            message: "SyntaxError: unexpected token in expression: ')'".into(),
            line: Some(3),
        }
    );
    assert_eq!(
        error.to_string(),
        "SyntaxError: unexpected token in expression: ')' at line 3"
    );
    // Running it gives the same error, without recompiling each time.
    assert_eq!(
        run_one(&engine, decode_call(&script, &[1])).await,
        Err(error)
    );
}

/// A thrown Error comes back with its exact text and the frame it was thrown in.
#[tokio::test]
async fn thrown_error_text() {
    let engine = engine();
    let script = Script::new(
        "function decodeUplink(input) {\n  if (input.bytes.length > 0) {\n    throw new Error(\"boom\");\n  }\n}\n",
    );
    let error = run_one(&engine, decode_call(&script, &[1]))
        .await
        .unwrap_err();
    let CodecError::Exception { message, stack } = &error else {
        panic!("expected an exception, got {error:?}");
    };
    assert_eq!(message, "Error: boom");
    assert_eq!(
        stack.as_deref(),
        Some("    at decodeUplink (script.js:3:15)\n")
    );
    assert_eq!(
        error.to_string(),
        "Error: boom\n    at decodeUplink (script.js:3:15)"
    );
    // Non-Error values are shown as themselves.
    let script = Script::new("function f(x) { throw x; }");
    let thrown = |x: Value| function_call(&script, "f", vec![x]);
    assert_eq!(
        run_one(&engine, thrown(json!("plain text"))).await,
        Err(CodecError::Exception {
            message: "plain text".into(),
            stack: None
        })
    );
    assert_eq!(
        run_one(
            &engine,
            Call::Function {
                script: Script::new(
                    "function f() { throw new RangeError('sensor out of memory'); }"
                ),
                name: "f".into(),
                args: vec![]
            }
        )
        .await,
        Err(CodecError::Exception {
            message: "RangeError: sensor out of memory".into(),
            stack: Some("    at f (script.js:1:26)\n".into())
        })
    );
    assert_eq!(
        run_one(&engine, thrown(json!({"code": 7}))).await,
        Err(CodecError::Exception {
            message: "{\"code\":7}".into(),
            stack: None
        })
    );
}

/// A codec that throws `null` or `undefined` is reported as throwing that
/// value, not as running out of memory (QuickJS's own out-of-memory
/// `null` comes only near the memory limit).
#[tokio::test]
async fn thrown_null_is_reported_as_itself() {
    let engine = engine();
    for (value, text) in [("null", "null"), ("undefined", "undefined")] {
        let script = Script::new(&format!(
            "function decodeUplink(input) {{ throw {value}; }}"
        ));
        let error = run_one(&engine, decode_call(&script, &[1]))
            .await
            .unwrap_err();
        assert_eq!(
            error,
            CodecError::Exception {
                message: text.into(),
                stack: None
            }
        );
    }
}

/// A decodeUplink without `data` is invalid output; TypeErrors of a broken
/// codec are exceptions; a script without the function says so.
#[tokio::test]
async fn missing_data_and_missing_function() {
    let engine = engine();
    let script = Script::new("function decodeUplink(input) { return {warnings: []}; }");
    assert_eq!(
        decode(&engine, &script, &[1]).await,
        Err(CodecError::InvalidOutput(
            "decodeUplink returned no data object".into()
        ))
    );
    let script = Script::new("function convert(object) { return object; }");
    let error = run_one(&engine, decode_call(&script, &[1]))
        .await
        .unwrap_err();
    assert_eq!(error, CodecError::MissingFunction("decodeUplink".into()));
    assert_eq!(
        error.to_string(),
        "script does not define a function named `decodeUplink`"
    );
    assert_eq!(
        run_one(&engine, function_call(&script, "nope", vec![])).await,
        Err(CodecError::MissingFunction("nope".into()))
    );
}

/// The decodeUplink input has TTN's shape: a plain array, the port, a real Date.
#[tokio::test]
async fn decode_uplink_input_shape() {
    let engine = engine();
    let script = Script::new(
        "function decodeUplink(input) {
           return {data: {
             isArray: Array.isArray(input.bytes), bytes: input.bytes, port: input.fPort,
             isDate: input.recvTime instanceof Date, ms: input.recvTime.getTime(),
             iso: input.recvTime.toISOString(), keys: Object.keys(input)
           }};
         }",
    );
    assert_eq!(
        decode(&engine, &script, &[0, 255, 7]).await,
        Ok(json!({
            "isArray": true, "bytes": [0, 255, 7], "port": 85, "isDate": true,
            "ms": 1_700_000_000_123_i64, "iso": "2023-11-14T22:13:20.123Z",
            "keys": ["bytes", "fPort", "recvTime", "variables"]
        }))
    );
}

/// sensae's `convert(object)` gets the body as a JS object and its result
/// comes back as JSON; undefined members vanish as in JSON.stringify.
#[tokio::test]
async fn convert_call() {
    let engine = engine();
    let script = Script::new(
        "function convert(object) {
           console.log('converting', object);
           return {
             dataId: object.uuid, reportedAt: object.ts,
             device: {id: object.dev, name: object.name.toUpperCase()},
             measures: {temperature: {celsius: object.t * 2}},
             skipped: undefined, nan: NaN, nested: [1, 'two', null, true, {deep: [2.5]}]
           };
         }",
    );
    let input = json!({"uuid": "d4f1", "ts": 1_700_000_000_123_i64, "dev": "0e1c",
                       "name": "p00010", "t": 18.5});
    let out = run_one(&engine, Call::Convert { script, input }).await;
    assert_eq!(
        out,
        Ok(json!({
            "dataId": "d4f1", "reportedAt": 1_700_000_000_123_i64,
            "device": {"id": "0e1c", "name": "P00010"},
            "measures": {"temperature": {"celsius": 37}},
            "nan": null, "nested": [1, "two", null, true, {"deep": [2.5]}]
        }))
    );
}

/// A generic function call passes each argument and returns the value as
/// JSON; a function returning nothing gives null.
#[tokio::test]
async fn function_call_with_arguments() {
    let engine = engine();
    let script = Script::new(
        "function evaluate(unit, state) {
           return {fire: unit.temperature > state.threshold, seen: (state.seen || 0) + 1};
         }
         function nothing() {}",
    );
    let results = engine
        .run(vec![
            function_call(
                &script,
                "evaluate",
                vec![
                    json!({"temperature": 31.5}),
                    json!({"threshold": 30, "seen": 4}),
                ],
            ),
            function_call(
                &script,
                "evaluate",
                vec![json!({"temperature": 20}), json!({"threshold": 30})],
            ),
            function_call(&script, "nothing", vec![]),
        ])
        .await
        .unwrap();
    assert_eq!(
        results,
        vec![
            Ok(json!({"fire": true, "seen": 5})),
            Ok(json!({"fire": false, "seen": 1})),
            Ok(Value::Null),
        ]
    );
}

/// Results mean what JSON.stringify would make of them, whether the fast
/// direct conversion or the stringify fallback produced them.
#[tokio::test]
async fn output_matches_json_stringify() {
    let engine = engine();
    let expressions = [
        "({a: 1, b: 'two', c: [1, 2.5, -0, null, true], d: {e: {f: 'g'}}})",
        "({skip: undefined, f: function () {}, s: Symbol('x'), arr: [undefined, function () {}]})",
        "({nan: NaN, inf: -Infinity, big: 1e21, max: 9007199254740993, neg: -10.0, tiny: 5e-324})",
        "({when: new Date(1700000000123), boxed: new Number(3), text: new String('t'), map: new Map([[1, 2]])})",
        "({custom: {toJSON: function (key) { return 'custom:' + key; }}})",
        "(function () { class P { constructor() { this.x = 1; } } return {p: new P()}; })()",
        "(function () { var o = Object.create(null); o.z = 1; o.a = [o.z]; return o; })()",
        "(function () { var a = [1, 2, 3]; a.extra = 'no'; delete a[1]; return a; })()",
        "(function () { var o = {}, cur = o; for (var i = 0; i < 100; i++) { cur.n = {}; cur = cur.n; } return o; })()",
        r#"({'\u00e9t\u00e9': '\ud83d\ude00', '1': 'numeric key', 'quote"': '\n'})"#,
        "({err: new Error('e'), re: /x/g, getter: Object.defineProperty({}, 'g', {get: function () { return 42; }, enumerable: true})})",
        "undefined",
        "'just a string'",
        "42",
    ];
    let mut source = String::from("var cases = [");
    for expression in expressions {
        source.push_str(&format!("function () {{ return {expression}; }},"));
    }
    source.push_str(
        "];
         function value(i) { return cases[i](); }
         function text(i) { var t = JSON.stringify(cases[i]()); return t === undefined ? 'null' : t; }
         function withToJson(i) { Number.prototype.toJSON = function () { return 'n'; }; Object.prototype.toJSON = function (k) { return 'object:' + k; }; return cases[i](); }",
    );
    let script = Script::new(&source);
    for (index, expression) in expressions.iter().enumerate() {
        let arg = vec![json!(index)];
        let results = engine
            .run(vec![
                function_call(&script, "value", arg.clone()),
                function_call(&script, "text", arg.clone()),
            ])
            .await
            .unwrap();
        let text = results[1].clone().unwrap();
        let want: Value = serde_json::from_str(text.as_str().unwrap()).unwrap();
        assert_eq!(results[0], Ok(want), "{expression}");
    }
    // A toJSON on a standard prototype is honoured on objects and arrays,
    // and (as in JSON.stringify) not on primitives.
    let results = engine
        .run(vec![function_call(&script, "withToJson", vec![json!(0)])])
        .await
        .unwrap();
    assert_eq!(results[0], Ok(json!("object:")));
}

/// A result JSON cannot express is invalid output, not a crash.
#[tokio::test]
async fn unserialisable_output() {
    let engine = engine();
    let script = Script::new(
        r#"function f() { var a = {}; a.self = a; return a; }
           function g() { return {n: 10n}; }
           function h() { var e = {}; e.toJSON = function () { throw new TypeError("no JSON"); }; return [e]; }
           function lone() { return {text: "\ud800"}; }"#,
    );
    let error = run_one(&engine, function_call(&script, "lone", vec![]))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, CodecError::InvalidOutput(m) if m.starts_with("the returned value is not valid JSON")),
        "{error:?}"
    );
    for name in ["f", "g", "h"] {
        let error = run_one(&engine, function_call(&script, name, vec![]))
            .await
            .unwrap_err();
        assert!(
            matches!(&error, CodecError::InvalidOutput(m) if m.starts_with("the returned value cannot be converted to JSON: TypeError")),
            "{error:?}"
        );
    }
}

/// An infinite loop is stopped near the limit, even when the script tries
/// to catch the interrupt, and the worker serves the next call normally.
#[tokio::test]
async fn infinite_loop_times_out_and_worker_recovers() {
    let limit = Duration::from_millis(50);
    let engine = Engine::start(EngineConfig {
        time_limit: limit,
        ..EngineConfig::default()
    });
    let good = Script::new(EM300TH);
    let bytes = [0x01, 0x75, 0x5C];
    assert!(decode(&engine, &good, &bytes).await.is_ok());
    let sources = [
        "function decodeUplink(input) { while (true) {} }",
        "function decodeUplink(input) { for (;;) { try { while (true) {} } catch (e) {} } }",
        "function decodeUplink(input) { try { while (true) {} } finally { while (true) {} } }",
        "function decodeUplink(input) { function f() { try { return f(); } catch (e) { return f(); } } return f(); }",
    ];
    for source in sources {
        let script = Script::new(source);
        let started = Instant::now();
        let result = run_one(&engine, decode_call(&script, &bytes)).await;
        let took = started.elapsed();
        assert_eq!(result, Err(CodecError::Timeout(limit)), "{source}");
        // Bounded, not timed: the interrupt ends it (a loaded machine may
        // take a few limits to schedule it), rather than running forever.
        assert!(took < limit * 40, "{source} took {took:?}");
        assert_eq!(
            decode(&engine, &good, &bytes).await,
            Ok(json!({"battery": 92})),
            "after {source}"
        );
    }
    assert_eq!(
        CodecError::Timeout(Duration::from_millis(100)).to_string(),
        "script ran longer than its 100ms limit and was interrupted"
    );
    // A loop at the top level is stopped too, when checking.
    let script = Script::new("while (true) {}");
    assert_eq!(engine.check(&script).await, Err(CodecError::Timeout(limit)));
}

/// A script that allocates without end hits the memory limit and gets
/// OutOfMemory; the worker (and the scripts cached on it) work afterwards.
#[tokio::test]
async fn memory_bomb_is_stopped_and_worker_recovers() {
    let engine = Engine::start(EngineConfig {
        memory_limit: 8 * 1024 * 1024,
        time_limit: Duration::from_secs(5),
        ..EngineConfig::default()
    });
    let good = Script::new(EM300TH);
    let bytes = [0x01, 0x75, 0x5C];
    assert!(decode(&engine, &good, &bytes).await.is_ok());
    let bombs = [
        "function decodeUplink(input) { var a = []; while (true) { a.push('x'.repeat(1000) + a.length); } }",
        "var kept = []; function decodeUplink(input) { while (true) { kept.push({n: kept.length, s: 'y' + kept.length}); } }",
        "function decodeUplink(input) { var m = new Map(); for (var i = 0; ; i++) { m.set(i, new Array(100).fill(i)); } }",
    ];
    for source in bombs {
        let script = Script::new(source);
        let result = run_one(&engine, decode_call(&script, &bytes)).await;
        assert_eq!(result, Err(CodecError::OutOfMemory), "{source}");
        assert_eq!(
            decode(&engine, &good, &bytes).await,
            Ok(json!({"battery": 92})),
            "after {source}"
        );
        // Again, to see the bomb's own state did not survive either.
        assert_eq!(
            run_one(&engine, decode_call(&script, &bytes)).await,
            Err(CodecError::OutOfMemory)
        );
    }
}

/// The memory limit applies to what a call allocates, on top of what the
/// cached scripts hold, so a full cache does not eat into it.
#[tokio::test]
async fn memory_limit_is_on_top_of_the_cache() {
    let engine = Engine::start(EngineConfig {
        memory_limit: 4 * 1024 * 1024,
        time_limit: Duration::from_secs(5),
        ..EngineConfig::default()
    });
    // About 60 KiB per cached context: 100 of them hold more than the limit.
    let calls = (0..100)
        .map(|i| {
            decode_call(
                &Script::new(&format!("{EM300TH}\n// copy {i}")),
                &[0x01, 0x75, 0x01],
            )
        })
        .collect();
    for result in engine.run(calls).await.unwrap() {
        assert!(result.is_ok());
    }
    let script = Script::new(
        "function allocate(mib) { var a = []; for (var i = 0; i < mib * 16; i++) { a.push(new Array(8000).fill(i)); } return a.length; }",
    );
    let allocate = |mib: u32| function_call(&script, "allocate", vec![json!(mib)]);
    assert_eq!(run_one(&engine, allocate(1)).await, Ok(json!(16)));
    assert_eq!(
        run_one(&engine, allocate(8)).await,
        Err(CodecError::OutOfMemory)
    );
    assert_eq!(run_one(&engine, allocate(1)).await, Ok(json!(16)));
}

/// An exception thrown by a script's top level is reported by `check` and
/// by every call, as an exception (even a runtime SyntaxError).
#[tokio::test]
async fn top_level_exception() {
    let engine = engine();
    let script = Script::new("var table = JSON.parse('{oops');\nfunction decodeUplink() {}");
    let error = engine.check(&script).await.unwrap_err();
    assert!(
        matches!(&error, CodecError::Exception { message, .. } if message.starts_with("SyntaxError")),
        "{error:?}"
    );
    assert_eq!(
        run_one(&engine, decode_call(&script, &[])).await,
        Err(error)
    );
    let script = Script::new("var buffer = Buffer.from([1]);\nfunction decodeUplink() {}");
    assert_eq!(engine.check(&script).await, Ok(ScriptKind::DecodeUplink));
    let script = Script::new("var buffer = Bufer.from([1]);\nfunction decodeUplink() {}");
    assert_eq!(
        engine.check(&script).await,
        Err(CodecError::Exception {
            message: "ReferenceError: Bufer is not defined".into(),
            stack: Some("    at <eval> (script.js:1:14)\n".into()),
        })
    );
}

/// The handle can be shared across tasks and threads.
#[test]
fn engine_is_send_sync_clone() {
    fn assert_traits<T: Send + Sync + Clone + 'static>() {}
    assert_traits::<Engine>();
    assert_traits::<Script>();
    assert_traits::<Call>();
    assert_traits::<CodecError>();
}

/// Unbounded recursion ends in a RangeError at the stack limit, not a crash.
#[tokio::test]
async fn deep_recursion_is_an_exception() {
    let engine = engine();
    let script = Script::new(
        "function f(n) { return f(n + 1) + 1; } function decodeUplink() { return f(0); }",
    );
    let error = run_one(&engine, decode_call(&script, &[]))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, CodecError::Exception { message, .. } if message == "RangeError: Maximum call stack size exceeded"),
        "{error:?}"
    );
    assert!(decode(&engine, &Script::new(EM300TH), &[0x01, 0x75, 0x01])
        .await
        .is_ok());
}

/// Each script has its own globals: one cannot read or clobber another's.
#[tokio::test]
async fn scripts_are_isolated() {
    let engine = engine();
    let a = Script::new("var secret = 'a'; Array.prototype.evil = 1; function get() { return typeof secret === 'undefined' ? null : secret; }");
    let b = Script::new("function get() { return [typeof secret, typeof [].evil, typeof a]; }");
    let results = engine
        .run(vec![
            function_call(&a, "get", vec![]),
            function_call(&b, "get", vec![]),
        ])
        .await
        .unwrap();
    assert_eq!(
        results,
        vec![
            Ok(json!("a")),
            Ok(json!(["undefined", "undefined", "undefined"]))
        ]
    );
}

/// A compiled script is reused: for named function calls (rules) its top
/// level runs once and its globals persist across calls and batches. A
/// changed source starts afresh.
#[tokio::test]
async fn compiled_script_is_reused() {
    let engine = engine();
    let source = "var loads = (globalThis.loads || 0) + 1; var calls = 0;
                  function count() { calls += 1; return [loads, calls]; }";
    let script = Script::new(source);
    let results = engine
        .run(vec![
            function_call(&script, "count", vec![]),
            function_call(&script, "count", vec![]),
        ])
        .await
        .unwrap();
    assert_eq!(results, vec![Ok(json!([1, 1])), Ok(json!([1, 2]))]);
    assert_eq!(engine.check(&script).await, Ok(ScriptKind::Unknown));
    assert_eq!(
        run_one(&engine, function_call(&script, "count", vec![])).await,
        Ok(json!([1, 3]))
    );
    let changed = Script::new(&format!("{source}\n// v2"));
    assert_ne!(changed.id, script.id);
    assert_eq!(
        run_one(&engine, function_call(&changed, "count", vec![])).await,
        Ok(json!([1, 1]))
    );
}

/// Every codec call starts from fresh state, as TTN's and ChirpStack's
/// runners give it: a byte pointer kept in a top-level `var` starts at 0
/// for every uplink, counters in top-level `var`s, on `globalThis` or in
/// undeclared names never carry over, also after a call that threw, and
/// across device types sharing one source. Top-level constants still
/// work.
#[tokio::test]
async fn every_codec_call_starts_from_fresh_state() {
    let engine = engine();
    // The shape of codecs in TTN's device repository that walk the payload
    // with a global index.
    let pointer = Script::new(
        "var i = 0;
         var TABLE = {1: 'battery', 3: 'temperature'};
         function decodeUplink(input) {
           var data = {};
           while (i < input.bytes.length) { var ch = input.bytes[i++]; data[TABLE[ch]] = input.bytes[i++]; }
           return {data: data};
         }",
    );
    for _ in 0..3 {
        assert_eq!(
            decode(&engine, &pointer, &[1, 92, 3, 21]).await,
            Ok(json!({"battery": 92, "temperature": 21}))
        );
    }
    let counters = Script::new(
        "var calls = 0;
         function decodeUplink(input) {
           calls += 1;
           globalThis.viaGlobal = (globalThis.viaGlobal || 0) + 1;
           if (typeof undeclared === 'undefined') { undeclared = 0; }
           undeclared += 1;
           if (input.bytes[0] === 0) { throw new Error('after changing state'); }
           return {data: {calls: calls, viaGlobal: viaGlobal, undeclared: undeclared}};
         }",
    );
    let once = json!({"calls": 1, "viaGlobal": 1, "undeclared": 1});
    for bytes in [[1], [0], [1], [0], [1]] {
        let got = decode(&engine, &counters, &bytes).await;
        if bytes[0] == 0 {
            assert!(matches!(got, Err(CodecError::Exception { .. })), "{got:?}");
        } else {
            assert_eq!(got, Ok(once.clone()));
        }
    }
    let convert = Script::new(
        "var seen = [];
         function convert(o) { seen.push(o.n); return {seen: seen}; }",
    );
    for n in 0..2 {
        let out = run_one(
            &engine,
            Call::Convert {
                script: convert.clone(),
                input: json!({"n": n}),
            },
        )
        .await;
        assert_eq!(out, Ok(json!({"seen": [n]})));
    }
}

/// Two sources that share an id (as a hash collision would) never run each
/// other's code: the cache compares the source on a hit.
#[tokio::test]
async fn same_id_different_source_is_not_confused() {
    let engine = engine();
    let one = Script::new("function f() { return 1; }");
    let mut two = Script::new("function f() { return 2; }");
    two.id = one.id;
    let results = engine
        .run(vec![
            function_call(&one, "f", vec![]),
            function_call(&two, "f", vec![]),
            function_call(&one, "f", vec![]),
        ])
        .await
        .unwrap();
    assert_eq!(results, vec![Ok(json!(1)), Ok(json!(2)), Ok(json!(1))]);
}

/// When the queue is full, `run` answers Busy at once instead of waiting.
#[tokio::test]
async fn full_queue_is_busy() {
    let engine = Engine::start(EngineConfig {
        queue_capacity: 1,
        time_limit: Duration::from_millis(300),
        ..EngineConfig::default()
    });
    let slow = Script::new(
        "function decodeUplink() { var end = Date.now() + 150; while (Date.now() < end) {} return {data: {}}; }",
    );
    // One worker holds one running batch plus one queued: of five batches
    // sent at once, at least three are refused, and refused at once.
    let tasks: Vec<_> = (0..5)
        .map(|_| {
            let engine = engine.clone();
            let call = decode_call(&slow, &[]);
            tokio::spawn(async move {
                let started = Instant::now();
                let result = engine.run(vec![call]).await;
                (result, started.elapsed())
            })
        })
        .collect();
    let (mut busy, mut done) = (0, 0);
    for task in tasks {
        match task.await.unwrap() {
            (Err(CodecError::Busy), took) => {
                assert!(took < Duration::from_millis(100), "Busy took {took:?}");
                busy += 1;
            }
            (Ok(results), _) => {
                assert!(results[0].is_ok());
                done += 1;
            }
            (other, _) => panic!("unexpected {other:?}"),
        }
    }
    assert!(busy >= 3 && done >= 1, "busy {busy}, done {done}");
    assert_eq!(
        CodecError::Busy.to_string(),
        "script engine is busy: its queue is full, retry later"
    );
}

/// Batches spread over several workers, and every worker compiles on demand.
#[tokio::test]
async fn several_workers() {
    let engine = Engine::start(EngineConfig {
        workers: 3,
        ..EngineConfig::default()
    });
    let script = Script::new(EM300TH);
    let mut tasks = Vec::new();
    for _ in 0..12 {
        let engine = engine.clone();
        let script = script.clone();
        tasks.push(tokio::spawn(async move {
            decode(&engine, &script, &[0x04, 0x68, 0x65]).await
        }));
    }
    for task in tasks {
        assert_eq!(task.await.unwrap(), Ok(json!({"humidity": 50.5})));
    }
    assert_eq!(engine.run(Vec::new()).await, Ok(Vec::new()));
}

/// Scripts have no I/O: no `require`, no `import`, no `std`/`os` modules.
#[tokio::test]
async fn no_io_available() {
    let engine = engine();
    let script = Script::new(
        "function probe() {
           return [typeof require, typeof process, typeof std, typeof os, typeof fetch, typeof XMLHttpRequest];
         }
         function dynamicImport() { return import('os'); }",
    );
    assert_eq!(
        run_one(&engine, function_call(&script, "probe", vec![])).await,
        Ok(json!([
            "undefined",
            "undefined",
            "undefined",
            "undefined",
            "undefined",
            "undefined"
        ]))
    );
    let script = Script::new("import * as os from 'os';\nfunction decodeUplink() {}");
    assert!(matches!(
        engine.check(&script).await,
        Err(CodecError::Compile { .. })
    ));
}

/// How a hostile script is expected to end.
#[derive(Clone, Copy, Debug)]
enum Ends {
    /// `Timeout(limit)`: by the interrupt handler or, in a built-in that
    /// never polls it, by the watchdog.
    Timeout,
    OutOfMemory,
    /// A catchable `RangeError` (the stack limit).
    RangeError,
}

/// A `decodeUplink` whose body is `body`.
fn decoder(body: &str) -> Script {
    Script::new(&format!(
        "function decodeUplink(input) {{ {body}\n return {{data: {{}}}}; }}"
    ))
}

/// Each kind of hostile script ends its decode with its own reason within
/// about its limit, built-ins included, and the next decode works: huge
/// `join`s (which go on for a minute after their buffer failed to grow,
/// neither allocating nor polling the interrupt handler), `repeat`,
/// catastrophic regex backtracking, deep recursion, `while (true)`, big
/// typed arrays and their native sort, and sorts of huge arrays.
#[tokio::test]
async fn hostile_scripts_end_within_their_limits() {
    let limit = Duration::from_millis(100);
    let engine = Engine::start(EngineConfig {
        time_limit: limit,
        ..EngineConfig::default()
    });
    let good = Script::new(EM300TH);
    let bytes = [0x01, 0x75, 0x5C];
    let cases = [
        ("var s = new Array(1e9).join('x');", Ends::Timeout),
        (
            "var s = Array.prototype.join.call({length: 2 ** 53 - 1});",
            Ends::Timeout,
        ),
        ("var s = 'x'.repeat(1e9);", Ends::OutOfMemory),
        ("/^(a+)+$/.test('a'.repeat(40) + 'b');", Ends::Timeout),
        (
            "function f(n) { return f(n + 1) + 1; } f(0);",
            Ends::RangeError,
        ),
        ("while (true) {}", Ends::Timeout),
        ("var a = new Uint8Array(1e9);", Ends::OutOfMemory),
        ("var a = new Float64Array(1e7).fill(1);", Ends::OutOfMemory),
        (
            "var u = new Uint32Array(6e6);
             for (var i = 0; i < 4096; i++) u[i] = (i * 2654435761) >>> 0;
             for (var n = 4096; n < u.length; n *= 2) u.copyWithin(n, 0, n);
             u.sort();",
            Ends::Timeout,
        ),
        ("new Array(1e9).sort();", Ends::Timeout),
        ("new Array(1e9).reverse();", Ends::Timeout),
        ("String(7n ** 300000n);", Ends::Timeout),
    ];
    for (body, ends) in cases {
        let script = decoder(body);
        let started = Instant::now();
        let result = run_one(&engine, decode_call(&script, &bytes)).await;
        let took = started.elapsed();
        match (ends, &result) {
            (Ends::Timeout, Err(CodecError::Timeout(l))) => assert_eq!(*l, limit),
            (Ends::OutOfMemory, Err(CodecError::OutOfMemory)) => {}
            (Ends::RangeError, Err(CodecError::Exception { message, .. }))
                if message == "RangeError: Maximum call stack size exceeded" => {}
            _ => panic!("{body}: expected {ends:?}, got {result:?}"),
        }
        // Bounded, not timed: the limit (plus the watchdog's grace) ends
        // it, where a machine's load may add a few limits more, rather
        // than running for seconds to minutes.
        assert!(took < limit * 40, "{body} took {took:?}");
        assert_eq!(
            decode(&engine, &good, &bytes).await,
            Ok(json!({"battery": 92})),
            "after {body}"
        );
        // Again: the same failure, or, while the thread a built-in stranded
        // winds down, held back at once.
        let again = run_one(&engine, decode_call(&script, &bytes)).await;
        match (&result, &again) {
            (first, again) if first == again => {}
            (Err(CodecError::Timeout(_)), Err(CodecError::HeldBack { earlier })) => {
                assert_eq!(**earlier, CodecError::Timeout(limit));
            }
            _ => panic!("{body} again: {again:?} after {result:?}"),
        }
    }
}

/// A call stuck in a built-in is answered with a timeout by the watchdog,
/// and the rest of its batch goes on on a new thread: the other scripts'
/// calls decode, the stuck script's later calls in the batch are not run
/// (so it costs the batch one limit, not one per call), and while the
/// stranded thread winds down the script is held back. A script stopped by
/// the interrupt handler is skipped for the rest of its batch, too, and
/// runs again in the next.
#[tokio::test]
async fn a_hung_script_costs_its_batch_one_limit() {
    let limit = Duration::from_millis(50);
    let engine = Engine::start(EngineConfig {
        time_limit: limit,
        ..EngineConfig::default()
    });
    let good = Script::new(EM300TH);
    let stuck = decoder("var s = new Array(1e9).join('x');");
    let looping = decoder("while (true) {}");
    let ok = |bytes: &[u8]| decode_call(&good, bytes);
    let mut calls = Vec::new();
    for i in 0..10u8 {
        calls.push(ok(&[0x01, 0x75, i]));
        calls.push(decode_call(&stuck, &[i]));
        calls.push(decode_call(&looping, &[i]));
    }
    let results = engine.run(calls).await.unwrap();
    let timeout = CodecError::Timeout(limit);
    let skipped = CodecError::Skipped {
        earlier: Box::new(timeout.clone()),
    };
    for (i, triple) in results.chunks(3).enumerate() {
        let decoded = interpret_decode_uplink(triple[0].clone().unwrap()).unwrap();
        assert_eq!(decoded.data["battery"], json!(i), "call {i}");
        let expected = if i == 0 { &timeout } else { &skipped };
        assert_eq!(triple[1].as_ref(), Err(expected), "stuck call {i}");
        assert_eq!(triple[2].as_ref(), Err(expected), "looping call {i}");
    }
    assert_eq!(skipped.root(), &timeout);
    assert_eq!(
        skipped.to_string(),
        "not run: an earlier call of this script in the same batch failed: script ran longer than its 50ms limit and was interrupted"
    );

    // The next batch: the stuck script is held back (its thread spins for
    // tens of seconds more), the looping one runs (and times out) again —
    // unless the OS left its thread unscheduled past the watchdog's grace,
    // when the watchdog abandoned that thread too and it is held back for
    // the moment that thread needs to notice.
    let results = engine
        .run(vec![
            decode_call(&stuck, &[0]),
            decode_call(&looping, &[0]),
            ok(&[0x01, 0x75, 7]),
        ])
        .await
        .unwrap();
    let held = CodecError::HeldBack {
        earlier: Box::new(timeout.clone()),
    };
    assert_eq!(results[0], Err(held.clone()));
    assert!(
        results[1] == Err(timeout.clone()) || results[1] == Err(held.clone()),
        "{:?}",
        results[1]
    );
    assert!(results[2].is_ok(), "{:?}", results[2]);
    assert_eq!(held.root(), &timeout);
    assert!(held.to_string().starts_with("not run: an earlier call of this script ran past its time limit inside a built-in function that cannot be interrupted"), "{held}");

    // A check (a codec being saved) stuck in its top level ends the same
    // way, and the engine checks the next script.
    let top_level = Script::new("var s = new Array(1e9).join('x'); function decodeUplink() {}");
    assert_eq!(engine.check(&top_level).await, Err(timeout));
    assert_eq!(engine.check(&good).await, Ok(ScriptKind::DecodeUplink));
}

/// A thread the watchdog abandoned frees its script once its call returns:
/// its runtime's allocations fail from the moment it is abandoned, which
/// ends a built-in that allocates as it goes (printing a huge BigInt) at
/// once, and the script then runs again (and times out again).
#[tokio::test]
async fn an_abandoned_thread_winds_down_and_its_script_runs_again() {
    let limit = Duration::from_millis(50);
    let engine = Engine::start(EngineConfig {
        time_limit: limit,
        ..EngineConfig::default()
    });
    let script = decoder("String(7n ** 300000n);");
    let timeout = Err(CodecError::Timeout(limit));
    assert_eq!(run_one(&engine, decode_call(&script, &[])).await, timeout);
    let started = Instant::now();
    loop {
        match run_one(&engine, decode_call(&script, &[])).await {
            Err(CodecError::HeldBack { .. }) => {
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "still held back after {:?}",
                    started.elapsed()
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            other => {
                assert_eq!(other, timeout);
                break;
            }
        }
    }
}

/// With several workers, one stuck in a built-in does not stop the others,
/// and its slot serves again right after the watchdog replaced its thread.
#[tokio::test]
async fn a_stuck_worker_is_replaced_while_the_others_serve() {
    let limit = Duration::from_millis(50);
    let engine = Engine::start(EngineConfig {
        workers: 2,
        time_limit: limit,
        ..EngineConfig::default()
    });
    let good = Script::new(EM300TH);
    for round in 0..3 {
        let stuck = decoder(&format!("var s = new Array(1e9).join('{round}');"));
        let hostile = {
            let engine = engine.clone();
            tokio::spawn(async move { run_one(&engine, decode_call(&stuck, &[])).await })
        };
        for i in 0..20u8 {
            assert_eq!(
                decode(&engine, &good, &[0x01, 0x75, i]).await,
                Ok(json!({"battery": i})),
                "round {round}, call {i}"
            );
        }
        assert_eq!(hostile.await.unwrap(), Err(CodecError::Timeout(limit)));
    }
}

/// Past its cap of threads left winding down, the watchdog abandons no
/// more: the worker waits for the stuck call instead (the built-in here
/// returns within seconds), which then ends as a timeout, and the worker
/// serves on.
#[tokio::test]
async fn past_the_cap_of_abandoned_threads_the_worker_waits() {
    let limit = Duration::from_millis(50);
    let engine = Engine::start_with(
        EngineConfig {
            time_limit: limit,
            ..EngineConfig::default()
        },
        1,
    );
    let timeout = Err(CodecError::Timeout(limit));
    // Abandoned, and spinning for tens of seconds.
    let stuck = decoder("var s = new Array(1e9).join('x');");
    assert_eq!(run_one(&engine, decode_call(&stuck, &[])).await, timeout);
    // Not abandoned: it runs to the end of its built-in, then stops.
    let slow = decoder("String(7n ** 150000n);");
    assert_eq!(run_one(&engine, decode_call(&slow, &[])).await, timeout);
    // Not held back, since no thread was left behind for it.
    let good = Script::new(EM300TH);
    let results = engine
        .run(vec![
            decode_call(&slow, &[]),
            decode_call(&good, &[0x01, 0x75, 1]),
        ])
        .await
        .unwrap();
    assert_eq!(results[0], timeout);
    assert!(results[1].is_ok(), "{:?}", results[1]);
}

/// Measures decode throughput on one worker: 100k em300th uplinks in batches
/// of 256, two batches in flight so the worker never waits for the caller.
/// Run with `cargo test -p weft-engine --release -- --ignored --nocapture`.
#[tokio::test]
#[ignore = "benchmark; run explicitly in release mode"]
async fn bench_em300th_decode_rate() {
    const TOTAL: usize = 100_000;
    const BATCH: usize = 256;
    let engine = engine();
    let script = Script::new(EM300TH);
    let bytes = [0x01, 0x75, 0x5C, 0x03, 0x67, 0x34, 0x01, 0x04, 0x68, 0x65];
    let submit = || {
        let engine = engine.clone();
        let calls: Vec<Call> = (0..BATCH).map(|_| decode_call(&script, &bytes)).collect();
        tokio::spawn(async move { engine.run(calls).await })
    };
    submit().await.unwrap().unwrap();
    let started = Instant::now();
    let batches = TOTAL.div_ceil(BATCH);
    let mut in_flight = std::collections::VecDeque::from([submit(), submit()]);
    let mut submitted = in_flight.len();
    let mut done = 0;
    while let Some(batch) = in_flight.pop_front() {
        if submitted < batches {
            in_flight.push_back(submit());
            submitted += 1;
        }
        for result in batch.await.unwrap().unwrap() {
            let decoded = interpret_decode_uplink(result.unwrap()).unwrap();
            assert_eq!(decoded.data.len(), 3);
        }
        done += BATCH;
    }
    let took = started.elapsed();
    println!(
        "em300th: {done} decodes in {took:?} on one worker = {:.0} decodes/s",
        done as f64 / took.as_secs_f64()
    );
}
