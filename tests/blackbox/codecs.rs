//! Decoders: the em300th codec written from the payload table decodes the
//! spec's example and vectors derived from the table; a script that does
//! not compile is refused; a runaway script is interrupted and recorded as
//! failed while other uplinks keep flowing; the encode dry run runs a
//! type's encoder, saved or not; a device's variables reach its codec.

use std::time::Duration;

use serde_json::{json, Value};

use crate::util::*;

async fn dry_run(c: &Client, ty: &str, sample: Value) -> Reply {
    c.send(
        "POST",
        &format!("/api/v1/device-types/{ty}/decode"),
        Some(&sample),
        Some(KEY),
    )
    .await
}

/// The spec's example and vectors derived from the EM300-TH payload table,
/// through the `decode` dry run of a type with no processor (so `measures`
/// is the codec's `data` as returned).
#[tokio::test]
async fn em300th_decoder_decodes_the_spec_example_and_table_vectors() {
    let server = Server::start();
    let c = server.client();
    c.expect(
        201,
        "PUT",
        "/api/v1/device-types/em300th",
        Some(&json!({"decoder":{"script": EM300TH_JS}})),
    )
    .await;

    let cases = [
        // The spec's example.
        (
            "01755C03673401046865",
            json!({"battery":92,"temperature":30.8,"humidity":50.5}),
        ),
        // -10.0 °C is -100 = 0xFF9C little-endian; humidity 0 %; battery 100 %.
        (
            "01756403679CFF046800",
            json!({"battery":100,"temperature":-10,"humidity":0}),
        ),
        // Records may come in any order and alone.
        ("0468C9", json!({"humidity":100.5})),
        ("0367FF7F", json!({"temperature":3276.7})),
    ];
    for (hex, expected) in cases {
        let (status, reply) = dry_run(
            &c,
            "em300th",
            json!({"bytes": hex, "fPort": 85, "id": "d1"}),
        )
        .await;
        assert_eq!(status, 200, "{hex}: {reply}");
        assert_eq!(reply["units"][0]["measures"], expected, "{hex}");
        assert_eq!(reply["units"][0]["device"]["id"], "d1");
    }
    // base64 works too, and nothing was stored by the dry runs.
    let (status, reply) = dry_run(
        &c,
        "em300th",
        json!({"bytes": "AXVcA2c0AQRoZQ==", "fPort": 85, "id": "d1"}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(reply["units"][0]["measures"]["battery"], 92);
    assert_eq!(c.all_units("device=d1").await, Vec::<Value>::new());

    // Malformed payloads: the codec reports errors → 422 DecodeFailed.
    for hex in ["0367", "FF01", "01"] {
        let (status, reply) = dry_run(
            &c,
            "em300th",
            json!({"bytes": hex, "fPort": 85, "id": "d1"}),
        )
        .await;
        assert_eq!(status, 422, "{hex}: {reply}");
        assert_eq!(reply["error"], "DecodeFailed");
        assert!(!reply["errors"].as_array().unwrap().is_empty());
    }
    assert_eq!(dry_run(&c, "nosuch", json!({})).await.0, 404);
}

/// A script that does not compile is refused with the engine's message and
/// line, and the previous definition stays in force.
#[tokio::test]
async fn a_decoder_that_does_not_compile_is_refused_with_its_line() {
    let server = Server::start();
    let c = server.client();
    c.create_em300th().await;
    let bad = json!({"decoder":{"script":"function decodeUplink(input) {\n  return {data: {a: 1}\n}\n)"}});
    let (status, reply) = c
        .send("PUT", "/api/v1/device-types/em300th", Some(&bad), Some(KEY))
        .await;
    assert_eq!(status, 400, "{reply}");
    assert_eq!(reply["error"], "InvalidScript");
    assert!(
        reply["description"].as_str().unwrap().contains("line"),
        "{reply}"
    );
    let stored = c
        .expect(200, "GET", "/api/v1/device-types/em300th", None)
        .await;
    assert_eq!(stored["decoder"]["script"], EM300TH_JS);

    let none = json!({"decoder":{"script":"var x = 1;"}});
    assert_eq!(
        c.send("PUT", "/api/v1/device-types/other", Some(&none), Some(KEY))
            .await
            .0,
        400
    );
    assert_eq!(
        c.send(
            "PUT",
            "/api/v1/device-types/other",
            Some(&json!({"decoder":{"language":"lua","script":"x"}})),
            Some(KEY)
        )
        .await
        .0,
        400
    );
    assert_eq!(
        c.send("GET", "/api/v1/device-types/other", None, None)
            .await
            .0,
        404
    );
}

/// An infinite loop in one type's decoder is interrupted at the time limit
/// and recorded as a Timeout failure; uplinks of another type, sent around
/// it, are all delivered.
#[tokio::test]
async fn an_infinite_loop_is_interrupted_while_other_uplinks_keep_flowing() {
    let server = Server::start_with_env(&[("WEFT_ENGINE__TIME_LIMIT", "50ms")]);
    let c = server.client();
    c.create_em300th().await;
    c.expect(
        201,
        "PUT",
        "/api/v1/device-types/loopy",
        Some(&json!({"decoder":{"script":"function decodeUplink(input) { while (true) {} }"}})),
    )
    .await;
    let mut live = Live::connect(&server).await;
    live.subscribe("s", "data", json!({"types":["em300th"]}))
        .await;

    let payload = [0x01, 0x75, 0x5C];
    for i in 0..20 {
        c.uplink(
            "farm",
            "encoded",
            "loopy",
            &encoded_body(&format!("loop-{i}"), "dev-l", &payload, now_ms()),
        )
        .await;
        c.uplink(
            "farm",
            "decoded",
            "em300th",
            &decoded_body(&format!("ok-{i}"), "dev-ok", i, 50, now_ms()),
        )
        .await;
    }
    for i in 0..20 {
        let e = live.next().await;
        assert_eq!(e["event"]["dataId"], format!("ok-{i}"));
    }
    let failures = eventually(Duration::from_secs(20), || async {
        let f = c
            .expect(200, "GET", "/api/v1/uplinks/failed?type=loopy", None)
            .await;
        let list = f["failures"].as_array().unwrap().clone();
        (list.len() == 20).then_some(list)
    })
    .await;
    for f in &failures {
        assert_eq!(f["reason"], "Timeout");
        assert!(f["description"].as_str().unwrap().contains("50ms"), "{f}");
    }
    assert_eq!(c.all_units("device=dev-l").await.len(), 0);
}

/// sensae's `convert(object)` codecs receive the body and return the unit.
#[tokio::test]
async fn convert_codecs_return_the_data_unit() {
    let server = Server::start();
    let c = server.client();
    let script = "function convert(o) { return {dataId: o.uuid, reportedAt: o.ts, device: {id: o.dev, name: 'x'},
                   measures: {temperature: {celsius: o.t / 10}}}; }";
    c.expect(
        201,
        "PUT",
        "/api/v1/device-types/legacy",
        Some(&json!({"decoder":{"script": script}})),
    )
    .await;
    c.uplink(
        "farm",
        "encoded",
        "legacy",
        &json!({"uuid":"cv-1","ts":42,"dev":"d9","t":215}),
    )
    .await;
    let unit = c.unit_eventually("cv-1").await;
    assert_eq!(unit["reportedAt"], 42);
    assert_eq!(unit["device"]["id"], "d9");
    assert_eq!(unit["measures"], json!({"temperature":{"celsius":21.5}}));
}

/// Codecs as The Things Stack runs them, through the dry run: no device
/// id needed in the sample; TTN v2's `Decoder(bytes, port)` accepted;
/// `undefined` fields shown as `null`; a codec's returned `errors` (and
/// `warnings`) carried as they are in the 422.
#[tokio::test]
async fn the_dry_run_runs_codecs_as_the_things_stack_does() {
    let server = Server::start();
    let c = server.client();
    let legacy = include_str!("../../crates/engine/codecs/legacy-v2.js");
    c.expect(
        201,
        "PUT",
        "/api/v1/device-types/legacy",
        Some(&json!({"decoder": {"script": legacy}})),
    )
    .await;
    let (status, reply) = dry_run(&c, "legacy", json!({"bytes": "0100EB", "fPort": 1})).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(
        reply["units"][0]["measures"],
        json!({"led": "on", "temperature": 23.5, "port": 1})
    );

    let undefined = include_str!("../../crates/engine/codecs/undefined-fields.js");
    c.expect(
        201,
        "PUT",
        "/api/v1/device-types/sparse",
        Some(&json!({"decoder": {"script": undefined}})),
    )
    .await;
    let (status, reply) = dry_run(&c, "sparse", json!({"bytes": "0064", "fPort": 1})).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(
        reply["units"][0]["measures"],
        json!({"temperature": 10, "humidity": null, "nested": {"gps": null, "list": [null, 1]}})
    );

    let refusing = "function decodeUplink(input) {\n  return { errors: ['length ' + input.bytes.length + ' is wrong', 'second'], warnings: ['checked early'] };\n}";
    c.expect(
        201,
        "PUT",
        "/api/v1/device-types/refusing",
        Some(&json!({"decoder": {"script": refusing}})),
    )
    .await;
    let (status, reply) = dry_run(&c, "refusing", json!({"bytes": "01", "fPort": 1})).await;
    assert_eq!(status, 422, "{reply}");
    assert_eq!(reply["error"], "DecodeFailed");
    assert_eq!(reply["errors"], json!(["length 1 is wrong", "second"]));
    assert_eq!(reply["warnings"], json!(["checked early"]));
    // A thrown error has no errors array of the codec's: weft's one error.
    let (status, reply) = dry_run(&c, "legacy", json!({"bytes": "zz!", "fPort": 1})).await;
    assert_eq!(status, 422, "{reply}");
    assert_eq!(reply["errors"].as_array().unwrap().len(), 1);
}

/// The dry run of a decoder not saved yet: a `decoder` in the body runs
/// instead of the type's (with the type's mappings), and the saved type
/// is unchanged; without one the saved decoder runs as before; one that
/// does not compile is a 400 `InvalidScript` as on save; a `decoder`
/// that is not `{"script"}` is a 400 naming it; an unknown type, 404.
#[tokio::test]
async fn the_dry_run_tests_an_unsaved_decoder() {
    let server = Server::start();
    let c = server.client();
    c.create_em300th().await;
    let before = c
        .expect(200, "GET", "/api/v1/device-types/em300th", None)
        .await;
    let doubled =
        "function decodeUplink(input) { return {data: {temperature: input.bytes[2] * 2}}; }";
    let sample = json!({"bytes": "01755C03673401046865", "fPort": 85, "id": "d1",
                        "decoder": {"script": doubled}});
    let (status, reply) = dry_run(&c, "em300th", sample).await;
    assert_eq!(status, 200, "{reply}");
    // The type's mappings (temperature → temperature.celsius) still apply
    // to what the unsaved decoder made.
    assert_eq!(
        reply["units"][0]["measures"],
        json!({"temperature": {"celsius": 184}}),
        "{reply}"
    );
    let (status, saved) = dry_run(
        &c,
        "em300th",
        json!({"bytes": "01755C03673401046865", "fPort": 85, "id": "d1"}),
    )
    .await;
    assert_eq!(status, 200, "{saved}");
    assert_eq!(
        saved["units"][0]["measures"]["temperature"],
        json!({"celsius": 30.8}),
        "{saved}"
    );
    assert_eq!(
        c.expect(200, "GET", "/api/v1/device-types/em300th", None)
            .await,
        before,
        "the dry run changed nothing"
    );

    let broken = json!({"bytes": "01", "decoder": {"script": "function decodeUplink(input) { return {data: "}});
    let (status, reply) = dry_run(&c, "em300th", broken).await;
    assert_eq!(
        (status, reply["error"].as_str()),
        (400, Some("InvalidScript")),
        "{reply}"
    );
    for bad in [
        json!(5),
        json!({"source": "x"}),
        json!({"script": "x", "language": "lua"}),
    ] {
        let (status, reply) = dry_run(&c, "em300th", json!({"bytes": "01", "decoder": bad})).await;
        assert_eq!(status, 400, "{bad}: {reply}");
    }
    let (status, _) = dry_run(
        &c,
        "nope",
        json!({"bytes": "01", "decoder": {"script": doubled}}),
    )
    .await;
    assert_eq!(status, 404);
}

/// A ChirpStack-form codec for a valve: its encoder builds the bytes in a
/// `Buffer` (command 1, then the setpoint in tenths, big-endian, plus the
/// device's `offset` variable), answers on the port asked for or 20, and
/// returns the codec's own `errors` and `warnings`; its decoder shows the
/// variables it got.
const VALVE_JS: &str = r#"
function decodeUplink(input) {
  return {data: {setpoint: input.bytes[0], variables: input.variables}};
}
function encodeDownlink(input) {
  if (typeof input.data.setpoint !== "number") {
    return {errors: ["setpoint must be a number"], warnings: ["got " + Object.keys(input.data).join(",")]};
  }
  if (input.data.setpoint < 0) throw new RangeError("below zero");
  var b = Buffer.alloc(3);
  b.writeUInt8(1, 0);
  b.writeInt16BE(Math.round(input.data.setpoint * 10) + Number(input.variables.offset || 0), 1);
  var out = {bytes: b, fPort: input.fPort || 20};
  if (input.data.setpoint > 30) out.warnings = ["setpoint above 30"];
  return out;
}
"#;

async fn encode_dry_run(c: &Client, ty: &str, body: Value) -> Reply {
    c.send(
        "POST",
        &format!("/api/v1/device-types/{ty}/encode"),
        Some(&body),
        Some(KEY),
    )
    .await
}

/// The encode dry run of a saved encoder: the bytes as base64 and hex,
/// the codec's port (or the one asked for, which the codec reads), its
/// warnings; `variables` in the body reach `input.variables`; nothing is
/// queued or stored.
#[tokio::test]
async fn the_encode_dry_run_runs_the_saved_encoder() {
    let server = Server::start();
    let c = server.client();
    let valve = json!({"decoder": {"script": VALVE_JS}});
    c.expect(201, "PUT", "/api/v1/device-types/valve", Some(&valve))
        .await;
    c.expect(
        201,
        "PUT",
        "/api/v1/devices/valve-1",
        Some(&json!({"type": "valve"})),
    )
    .await;
    // 21.5 → 215 = 0x00d7.
    let (status, reply) = encode_dry_run(&c, "valve", json!({"data": {"setpoint": 21.5}})).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(
        reply,
        json!({"bytes": "AQDX", "hex": "0100d7", "fPort": 20, "warnings": []})
    );
    // The port asked for reaches the codec as `input.fPort`.
    let (status, reply) =
        encode_dry_run(&c, "valve", json!({"data": {"setpoint": 21.5}, "fPort": 7})).await;
    assert_eq!((status, &reply["fPort"]), (200, &json!(7)), "{reply}");
    // Variables from the body: 215 + 5 = 220 = 0x00dc.
    let (status, reply) = encode_dry_run(
        &c,
        "valve",
        json!({"data": {"setpoint": 21.5}, "variables": {"offset": "5"}}),
    )
    .await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["hex"], "0100dc", "{reply}");
    // Warnings come back with the bytes: 31 → 310 = 0x0136.
    let (status, reply) = encode_dry_run(&c, "valve", json!({"data": {"setpoint": 31}})).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["hex"], "010136");
    assert_eq!(reply["warnings"], json!(["setpoint above 30"]));
    // Nothing was queued for the type's device.
    let listed = c
        .expect(200, "GET", "/api/v1/devices/valve-1/downlinks", None)
        .await;
    assert_eq!(listed["downlinks"], json!([]), "{listed}");
}

/// A codec that cannot encode: its returned `errors` and `warnings` in a
/// 422 `EncodeFailed`, as the decode dry run's `DecodeFailed`; a thrown
/// error is weft's one error; a codec without `encodeDownlink`, or a
/// type without a codec, is a 422 saying so; a body that is not
/// `{"data": {…}}` with a port 1–223 and text variables is a 400; an
/// unknown type a 404; no key a 401, a read key a 403.
#[tokio::test]
async fn the_encode_dry_run_refuses_with_the_codecs_errors() {
    let server = Server::start();
    let c = server.client();
    let valve = json!({"decoder": {"script": VALVE_JS}});
    c.expect(201, "PUT", "/api/v1/device-types/valve", Some(&valve))
        .await;
    let (status, reply) = encode_dry_run(&c, "valve", json!({"data": {"setpoint": "hot"}})).await;
    assert_eq!(status, 422, "{reply}");
    assert_eq!(reply["error"], "EncodeFailed");
    assert_eq!(reply["errors"], json!(["setpoint must be a number"]));
    assert_eq!(reply["warnings"], json!(["got setpoint"]));
    let (status, reply) = encode_dry_run(&c, "valve", json!({"data": {"setpoint": -1}})).await;
    assert_eq!(status, 422, "{reply}");
    assert_eq!(reply["errors"].as_array().map(Vec::len), Some(1), "{reply}");
    assert!(
        reply["description"]
            .as_str()
            .is_some_and(|d| d.contains("RangeError: below zero")),
        "{reply}"
    );

    c.create_em300th().await;
    let (status, reply) = encode_dry_run(&c, "em300th", json!({"data": {"a": 1}})).await;
    assert_eq!(status, 422, "{reply}");
    assert!(
        reply["description"]
            .as_str()
            .is_some_and(|d| d.contains("encodeDownlink")),
        "{reply}"
    );
    c.expect(201, "PUT", "/api/v1/device-types/bare", Some(&json!({})))
        .await;
    let (status, reply) = encode_dry_run(&c, "bare", json!({"data": {"a": 1}})).await;
    assert_eq!(status, 422, "{reply}");
    assert!(
        reply["description"]
            .as_str()
            .is_some_and(|d| d.contains("has no codec")),
        "{reply}"
    );

    for bad in [
        json!([]),
        json!({}),
        json!({"data": 5}),
        json!({"data": {}, "fPort": 0}),
        json!({"data": {}, "fPort": 224}),
        json!({"data": {}, "variables": {"offset": 5}}),
        json!({"data": {}, "variables": ["offset"]}),
        json!({"data": {}, "variables": {"": "x"}}),
        json!({"data": {}, "port": 1}),
    ] {
        let (status, reply) = encode_dry_run(&c, "valve", bad.clone()).await;
        assert_eq!(
            (status, reply["error"].as_str()),
            (400, Some("BadRequest")),
            "{bad}: {reply}"
        );
    }
    let (status, _) = encode_dry_run(&c, "nope", json!({"data": {}})).await;
    assert_eq!(status, 404);

    let path = "/api/v1/device-types/valve/encode";
    let body = json!({"data": {"setpoint": 1}});
    let (status, _) = server
        .client_with(None)
        .send("POST", path, Some(&body), None)
        .await;
    assert_eq!(status, 401);
    let made = c
        .expect(
            201,
            "POST",
            "/api/v1/keys",
            Some(&json!({"name": "reader", "role": "read"})),
        )
        .await;
    let reader = server.client_with(made["key"].as_str());
    let (status, reply) = reader.send("POST", path, Some(&body), None).await;
    assert_eq!(status, 403, "{reply}");
    let writer = c
        .expect(
            201,
            "POST",
            "/api/v1/keys",
            Some(&json!({"name": "writer", "role": "write"})),
        )
        .await;
    let writer = server.client_with(writer["key"].as_str());
    let (status, reply) = writer.send("POST", path, Some(&body), None).await;
    assert_eq!(status, 200, "{reply}");
}

/// The encode dry run of an encoder not saved yet: an `encoder` in the
/// body runs instead of the type's, even for a type without a codec, and
/// the saved type is unchanged; one that does not compile is a 400
/// `InvalidScript` as on save; an `encoder` that is not `{"script"}` is a
/// 400.
#[tokio::test]
async fn the_encode_dry_run_tests_an_unsaved_encoder() {
    let server = Server::start();
    let c = server.client();
    let valve = json!({"decoder": {"script": VALVE_JS}});
    c.expect(201, "PUT", "/api/v1/device-types/valve", Some(&valve))
        .await;
    let before = c
        .expect(200, "GET", "/api/v1/device-types/valve", None)
        .await;
    let unsaved = "function encodeDownlink(input) {\n  var b = Buffer.from([9, input.data.setpoint]);\n  return {bytes: b, fPort: Number(input.variables.port)};\n}";
    let (status, reply) = encode_dry_run(
        &c,
        "valve",
        json!({"data": {"setpoint": 21}, "variables": {"port": "3"},
               "encoder": {"script": unsaved, "language": "javascript"}}),
    )
    .await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(
        reply,
        json!({"bytes": "CRU=", "hex": "0915", "fPort": 3, "warnings": []})
    );
    assert_eq!(
        c.expect(200, "GET", "/api/v1/device-types/valve", None)
            .await,
        before,
        "the dry run changed nothing"
    );
    // The saved encoder runs again without one.
    let (status, reply) = encode_dry_run(&c, "valve", json!({"data": {"setpoint": 21}})).await;
    assert_eq!((status, &reply["hex"]), (200, &json!("0100d2")), "{reply}");
    // A type without a codec can test one.
    c.expect(201, "PUT", "/api/v1/device-types/bare", Some(&json!({})))
        .await;
    let (status, reply) = encode_dry_run(
        &c,
        "bare",
        json!({"data": {"setpoint": 1}, "fPort": 5, "encoder": {"script": "function encodeDownlink(i) { return {bytes: [i.fPort]}; }"}}),
    )
    .await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!((&reply["hex"], &reply["fPort"]), (&json!("05"), &json!(5)));

    let broken = json!({"data": {}, "encoder": {"script": "function encodeDownlink(input) { return {bytes: "}});
    let (status, reply) = encode_dry_run(&c, "valve", broken).await;
    assert_eq!(
        (status, reply["error"].as_str()),
        (400, Some("InvalidScript")),
        "{reply}"
    );
    for bad in [
        json!(5),
        json!({"source": "x"}),
        json!({"script": "x", "language": "lua"}),
    ] {
        let (status, reply) =
            encode_dry_run(&c, "valve", json!({"data": {}, "encoder": bad})).await;
        assert_eq!(status, 400, "{bad}: {reply}");
    }
    let (status, _) = encode_dry_run(
        &c,
        "nope",
        json!({"data": {}, "encoder": {"script": unsaved}}),
    )
    .await;
    assert_eq!(status, 404);
}

/// A device's `variables` are kept with it and reach its codec as
/// `input.variables`: on its uplinks (a device without any gets `{}`)
/// and on the downlinks queued for it; a variable that is not text is
/// refused naming it.
#[tokio::test]
async fn device_variables_reach_the_codec_on_uplinks_and_downlinks() {
    let server = Server::start();
    let c = server.client();
    let valve = json!({"decoder": {"script": VALVE_JS}});
    c.expect(201, "PUT", "/api/v1/device-types/valve", Some(&valve))
        .await;
    let device = json!({"type": "valve", "channel": "farm",
                        "variables": {"offset": "5", "serial": "A-7"}});
    c.expect(201, "PUT", "/api/v1/devices/valve-1", Some(&device))
        .await;
    c.expect(
        201,
        "PUT",
        "/api/v1/devices/valve-2",
        Some(&json!({"type": "valve", "channel": "farm"})),
    )
    .await;
    let shown = c.expect(200, "GET", "/api/v1/devices/valve-1", None).await;
    assert_eq!(shown["variables"], json!({"offset": "5", "serial": "A-7"}));
    let plain = c.expect(200, "GET", "/api/v1/devices/valve-2", None).await;
    assert!(plain.get("variables").is_none(), "{plain}");
    let (status, reply) = c
        .send(
            "PUT",
            "/api/v1/devices/valve-3",
            Some(&json!({"type": "valve", "variables": {"offset": 5}})),
            None,
        )
        .await;
    assert_eq!(status, 400, "{reply}");
    assert!(
        reply["description"]
            .as_str()
            .is_some_and(|d| d.starts_with("variables.offset")),
        "{reply}"
    );

    c.uplink(
        "farm",
        "encoded",
        "valve",
        &encoded_body("var-1", "valve-1", &[21], now_ms()),
    )
    .await;
    c.uplink(
        "farm",
        "encoded",
        "valve",
        &encoded_body("var-2", "valve-2", &[22], now_ms()),
    )
    .await;
    let unit = c.unit_eventually("var-1").await;
    assert_eq!(
        unit["measures"]["variables"],
        json!({"offset": "5", "serial": "A-7"}),
        "{unit}"
    );
    let unit = c.unit_eventually("var-2").await;
    assert_eq!(unit["measures"]["variables"], json!({}), "{unit}");

    // A downlink queued for the device is encoded with its variables:
    // 21.5 → 215 + 5 = 220 = 0x00dc; without them, 0x00d7.
    let queued = c
        .expect(
            202,
            "POST",
            "/api/v1/devices/valve-1/downlinks",
            Some(&json!({"data": {"setpoint": 21.5}})),
        )
        .await;
    assert_eq!(queued["downlinks"][0]["frmPayload"], "AQDc", "{queued}");
    let queued = c
        .expect(
            202,
            "POST",
            "/api/v1/devices/valve-2/downlinks",
            Some(&json!({"data": {"setpoint": 21.5}})),
        )
        .await;
    assert_eq!(queued["downlinks"][0]["frmPayload"], "AQDX", "{queued}");
}
