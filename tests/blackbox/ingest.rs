//! Uplinks in: both sensae paths produce the documented data unit on the
//! socket and in storage; bad requests change nothing; duplicates are
//! stored once; TTN and ChirpStack webhooks are understood.

use std::time::Duration;

use serde_json::{json, Value};

use crate::util::*;

/// The decoded path maps the seed's body, the encoded path decodes its
/// payload with the em300th codec; both arrive on the socket and in
/// storage as the same shape of data unit.
#[tokio::test]
async fn encoded_and_decoded_uplinks_become_data_units_on_the_socket_and_in_storage() {
    let server = Server::start();
    let c = server.client();
    c.create_em300th().await;
    let mut live = Live::connect(&server).await;
    live.subscribe("s1", "data", json!({"channels":["irrigation"]}))
        .await;

    c.uplink(
        "irrigation",
        "decoded",
        "em300th",
        &decoded_body("u-dec", "dev-1", 37, 61, 1700000000123),
    )
    .await;
    let payload = [0x01, 0x75, 0x5C, 0x03, 0x67, 0x34, 0x01, 0x04, 0x68, 0x65];
    c.uplink(
        "irrigation",
        "encoded",
        "em300th",
        &encoded_body("u-enc", "dev-2", &payload, 1700000000456),
    )
    .await;

    let mut events = vec![live.next().await, live.next().await];
    events.sort_by_key(|e| e["event"]["dataId"].as_str().unwrap().to_string());
    for e in &events {
        assert_eq!(e["type"], "event");
        assert_eq!(e["id"], "s1");
    }
    let (dec, enc) = (&events[0]["event"], &events[1]["event"]);
    assert_eq!(dec["dataId"], "u-dec");
    assert_eq!(dec["reportedAt"], 1700000000123i64);
    assert_eq!(dec["channel"], "irrigation");
    assert_eq!(
        dec["device"],
        json!({"id":"dev-1","name":"P00010","type":"em300th"})
    );
    assert_eq!(
        dec["measures"],
        json!({"temperature":{"celsius":37},"airHumidity":{"relativePercentage":61}})
    );
    assert!(dec["receivedAt"].as_i64().unwrap() > 1700000000123);

    assert_eq!(enc["dataId"], "u-enc");
    assert_eq!(enc["reportedAt"], 1700000000456i64);
    assert_eq!(
        enc["device"],
        json!({"id":"dev-2","name":"P00011","type":"em300th"})
    );
    assert_eq!(
        enc["measures"],
        json!({"temperature":{"celsius":30.8},"airHumidity":{"relativePercentage":50.5}})
    );

    for e in [dec, enc] {
        let id = e["dataId"].as_str().unwrap();
        let stored = c
            .expect(200, "GET", &format!("/api/v1/data/{id}"), None)
            .await;
        assert_eq!(&stored, e, "stored unit equals the one pushed live");
    }
    let listed = c.all_units("channel=irrigation").await;
    assert_eq!(listed.len(), 2);
}

/// Wrong or missing keys (401) and malformed paths or bodies (400) are
/// refused before anything is logged: no unit, no failed uplink appears.
#[tokio::test]
async fn unauthorized_and_malformed_uplinks_change_nothing() {
    let server = Server::start();
    let c = server.client();
    c.create_em300th().await;
    let body = decoded_body("u-bad", "dev-1", 20, 50, now_ms());
    let ok_path = "/sensor-data/irrigation/decoded/em300th";

    assert_eq!(c.send("POST", ok_path, Some(&body), None).await.0, 401);
    assert_eq!(
        c.send("POST", ok_path, Some(&body), Some("wrong")).await.0,
        401
    );
    assert_eq!(
        c.send("POST", ok_path, Some(&body), Some("Bearer wrong"))
            .await
            .0,
        401
    );
    for path in [
        "/sensor-data/i/decoded/em300th",
        "/sensor-data/irrigation-x/decoded/em300th",
        "/sensor-data/irrigation/decoded/em300th-v2",
        "/sensor-data/irrigation/decodedx/em300th",
        "/sensor-data/abcdefghijklmnop/decoded/em300th",
    ] {
        let (status, reply) = c.send("POST", path, Some(&body), Some(KEY)).await;
        assert_eq!(status, 400, "{path}: {reply}");
        assert_eq!(reply["error"], "BadRequest");
    }
    for raw in ["not json", "[1,2]", "{\"a\":", "\"text\"", ""] {
        assert_eq!(
            c.send_raw(ok_path, raw, Some(KEY)).await.0,
            400,
            "body {raw:?}"
        );
    }

    // A valid uplink afterwards is the only thing that gets through.
    c.uplink(
        "irrigation",
        "decoded",
        "em300th",
        &decoded_body("u-good", "dev-1", 20, 50, now_ms()),
    )
    .await;
    let units = eventually(Duration::from_secs(10), || async {
        let u = c.all_units("channel=irrigation").await;
        (!u.is_empty()).then_some(u)
    })
    .await;
    assert_eq!(units.len(), 1);
    assert_eq!(units[0]["dataId"], "u-good");
    let failed = c.expect(200, "GET", "/api/v1/uplinks/failed", None).await;
    assert_eq!(failed["failures"], json!([]));
}

/// The same `dataId` sent twice is accepted twice (the sender cannot know)
/// but stored and pushed once.
#[tokio::test]
async fn a_duplicate_data_id_is_stored_and_pushed_once() {
    let server = Server::start();
    let c = server.client();
    c.create_em300th().await;
    let mut live = Live::connect(&server).await;
    live.subscribe("s", "data", json!({})).await;

    let body = decoded_body("dup-1", "dev-1", 30, 40, now_ms());
    c.uplink("irrigation", "decoded", "em300th", &body).await;
    c.uplink("irrigation", "decoded", "em300th", &body).await;
    c.uplink(
        "irrigation",
        "decoded",
        "em300th",
        &decoded_body("after", "dev-1", 31, 40, now_ms()),
    )
    .await;

    assert_eq!(live.next().await["event"]["dataId"], "dup-1");
    // The next event is the later uplink: the duplicate was not pushed.
    assert_eq!(live.next().await["event"]["dataId"], "after");
    let units = c.all_units("device=dev-1").await;
    let ids: Vec<&str> = units
        .iter()
        .map(|u| u["dataId"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["dup-1", "after"]);
}

/// An uplink resent with the same `dataId` but other values is a
/// duplicate: the first one's values stay everywhere — the stored unit,
/// the device's live entity, its history — and the socket sees it once.
/// The resend arrives right behind the original, so both may be decoded
/// in one batch, or the second while the first is still being stored.
#[tokio::test]
async fn a_resent_uplink_with_other_values_changes_nothing() {
    let server = Server::start_with_env(&[("WEFT_HISTORY__RECORD_CHANGES", "true")]);
    let c = server.client();
    c.create_em300th().await;
    let mut live = Live::connect(&server).await;
    live.subscribe("s", "data", json!({})).await;
    let mut entities = Live::connect(&server).await;
    entities
        .subscribe("e", "entities", json!({"devices":["dev-r"]}))
        .await;

    let at = 1_700_000_000_000;
    for round in 0..3 {
        let id = format!("resent-{round}");
        let first = decoded_body(&id, "dev-r", 20 + round, 50, at + round * 60_000);
        let resent = decoded_body(&id, "dev-r", 90, 10, at + round * 60_000 + 1);
        let late = decoded_body(&id, "dev-r", 77, 10, at + round * 60_000 + 2);
        // Sent concurrently, then once more after the first is stored.
        let (a, b) = tokio::join!(
            c.send(
                "POST",
                "/sensor-data/farm/decoded/em300th",
                Some(&first),
                Some(KEY)
            ),
            c.send(
                "POST",
                "/sensor-data/farm/decoded/em300th",
                Some(&resent),
                Some(KEY)
            ),
        );
        assert_eq!((a.0, b.0), (202, 202));
        let unit = c.unit_eventually(&id).await;
        c.uplink("farm", "decoded", "em300th", &late).await;
        // Whichever of the two was stored first is the one that counts.
        let temperature = unit["measures"]["temperature"]["celsius"].clone();
        let event = live.next().await;
        assert_eq!(event["event"]["dataId"], id.as_str());
        assert_eq!(
            event["event"]["measures"]["temperature"]["celsius"],
            temperature
        );
    }
    c.uplink(
        "farm",
        "decoded",
        "em300th",
        &decoded_body("last", "dev-s", 23, 50, at + 600_000),
    )
    .await;
    // The next event is the last uplink: no resend was pushed. The
    // pipeline keeps the log's order, so every resend has been processed.
    assert_eq!(live.next().await["event"]["dataId"], "last");

    let units = c.all_units("device=dev-r").await;
    let stored: Vec<(String, Value)> = units
        .iter()
        .map(|u| {
            (
                u["dataId"].as_str().unwrap().to_string(),
                u["measures"]["temperature"]["celsius"].clone(),
            )
        })
        .collect();
    assert_eq!(stored.len(), 3, "{stored:?}");
    let expected_values: Vec<Value> = stored.iter().map(|(_, v)| v.clone()).collect();
    assert!(
        expected_values.iter().all(|v| v != &json!(77)),
        "a late resend's values were stored: {stored:?}"
    );

    // The live entity holds the last stored unit's values, not a resend's.
    let (status, _, entity) = crate::ngsi::call(&c, "GET", "/v2/entities/dev-r", None, None).await;
    assert_eq!(status, 200, "{entity}");
    assert_eq!(entity["temperature"]["value"], stored[2].1, "{entity}");

    // History: one value per stored unit, and none of a resend.
    let history = eventually(Duration::from_secs(10), || async {
        let (status, _, body) = crate::ngsi::call(
            &c,
            "GET",
            "/ql/v2/entities/dev-r/attrs/temperature",
            None,
            None,
        )
        .await;
        (status == 200 && body["values"].as_array().map(Vec::len) >= Some(3)).then_some(body)
    })
    .await;
    // QuantumLeap answers `Number` values as floats: compared as numbers.
    let numbers = |v: &[Value]| v.iter().map(Value::as_f64).collect::<Vec<_>>();
    assert_eq!(
        numbers(history["values"].as_array().unwrap()),
        numbers(&expected_values),
        "{history}"
    );

    // The entities stream: one change per stored unit, none of a resend.
    let mut changed = Vec::new();
    while let Some(m) = entities.next_within(Duration::from_millis(1500)).await {
        changed.push(m["event"]["entity"]["temperature"]["value"].clone());
    }
    assert_eq!(changed, expected_values, "entity changes");
}

/// An uplink of a type that does not exist is accepted (the log keeps it)
/// and kept as a failed uplink with its reason, not silently dropped.
#[tokio::test]
async fn an_unknown_type_is_kept_as_a_failed_uplink() {
    let server = Server::start();
    let c = server.client();
    c.uplink(
        "irrigation",
        "decoded",
        "nosuchtype",
        &decoded_body("u-x", "dev-1", 1, 2, now_ms()),
    )
    .await;
    let failed = eventually(Duration::from_secs(10), || async {
        let f = c.expect(200, "GET", "/api/v1/uplinks/failed", None).await;
        let list = f["failures"].as_array().unwrap().clone();
        (!list.is_empty()).then_some(list)
    })
    .await;
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0]["reason"], "UnknownType");
    assert_eq!(failed[0]["deviceType"], "nosuchtype");
    assert_eq!(failed[0]["channel"], "irrigation");
    assert_eq!(failed[0]["body"]["uuid"], "u-x");
    assert!(failed[0]["description"]
        .as_str()
        .unwrap()
        .contains("nosuchtype"));
}

/// TTN v3 and ChirpStack v4 uplink webhooks are decoded with the device
/// type's codec and carry the network server's identity fields.
#[tokio::test]
async fn ttn_and_chirpstack_webhooks_produce_units() {
    let server = Server::start();
    let c = server.client();
    c.expect(
        201,
        "PUT",
        "/api/v1/device-types/em300th",
        Some(&json!({"decoder":{"script": EM300TH_JS}})),
    )
    .await;
    let ttn = json!({
        "end_device_ids": {"device_id": "eui-a84041", "dev_eui": "A84041000181D2A5",
                           "application_ids": {"application_id": "farm"}},
        "correlation_ids": ["as:up:01HTTN", "gs:uplink:01X"],
        "received_at": "2026-01-02T03:04:05.678Z",
        "uplink_message": {"f_port": 85, "f_cnt": 7, "frm_payload": "AXVcA2c0AQRoZQ==",
                           "rx_metadata": [{"gateway_ids": {"gateway_id": "gw"}, "rssi": -80}]}
    });
    let (status, _) = c
        .send(
            "POST",
            "/api/v1/uplinks/ttn?type=em300th",
            Some(&ttn),
            Some(&format!("Bearer {KEY}")),
        )
        .await;
    assert_eq!(status, 202);
    let cs = json!({
        "deduplicationId": "3f2a-cs", "time": "2026-01-02T03:04:06Z",
        "deviceInfo": {"tenantId": "t", "applicationName": "orchard", "deviceProfileName": "em300th",
                       "deviceName": "north", "devEui": "0102030405060708"},
        "fPort": 85, "data": "AXVcA2c0AQRoZQ=="
    });
    assert_eq!(
        c.send("POST", "/api/v1/uplinks/chirpstack", Some(&cs), Some(KEY))
            .await
            .0,
        202
    );
    assert_eq!(
        c.send(
            "POST",
            "/api/v1/uplinks/chirpstack",
            Some(&cs),
            Some("nope")
        )
        .await
        .0,
        401
    );

    let t = c.unit_eventually("as:up:01HTTN").await;
    assert_eq!(t["device"]["id"], "eui-a84041");
    assert_eq!(t["channel"], "farm");
    assert_eq!(t["reportedAt"], 1767323045678i64);
    assert_eq!(
        t["measures"],
        json!({"battery":92,"temperature":30.8,"humidity":50.5})
    );

    let s = c.unit_eventually("3f2a-cs").await;
    assert_eq!(
        s["device"],
        json!({"id":"0102030405060708","name":"north","type":"em300th"})
    );
    assert_eq!(s["channel"], "orchard");
    assert_eq!(s["measures"]["temperature"], json!(30.8));
}

/// Sub-device measures (`{"0":…,"1":…}`) become one unit per device, the
/// sub-device mapped through the device record.
#[tokio::test]
async fn indexed_measures_split_into_sub_device_units() {
    let server = Server::start();
    let c = server.client();
    c.expect(201, "PUT", "/api/v1/device-types/valves", Some(&json!({})))
        .await;
    c.expect(
        201,
        "PUT",
        "/api/v1/devices/gw-1",
        Some(&json!({"name":"gateway","type":"valves","subDevices":[{"ref":1,"id":"valve-7"}]})),
    )
    .await;
    let body = json!({"uuid":"sd-1","id":"gw-1","reported_at":5,"0":{"battery":{"percentage":80}},"1":{"valve":{"open":true}}});
    c.uplink("field", "decoded", "valves", &body).await;
    let units: Vec<Value> = eventually(Duration::from_secs(10), || async {
        let u = c.all_units("channel=field").await;
        (u.len() == 2).then_some(u)
    })
    .await;
    assert_eq!(units[0]["dataId"], "sd-1");
    assert_eq!(units[0]["device"]["id"], "gw-1");
    assert_eq!(units[0]["measures"], json!({"battery":{"percentage":80}}));
    assert_eq!(units[1]["dataId"], "sd-1:1");
    assert_eq!(units[1]["device"]["id"], "valve-7");
    assert_eq!(units[1]["measures"], json!({"valve":{"open":true}}));
}

/// ChirpStack v4's `deviceInfo` of the test device.
fn chirpstack_device() -> Value {
    json!({"tenantId": "52f14cd4-c6f1-4fbd-8f87-4025e1d49242", "tenantName": "ChirpStack",
           "applicationId": "17c82e96-be03-4f38-aef3-f83d48582d97", "applicationName": "orchard",
           "deviceProfileId": "14855bf7-d10d-4aee-b618-ebfcb64dc7ad", "deviceProfileName": "em300th",
           "deviceName": "north", "devEui": "0102030405060708", "tags": {}})
}

/// The events ChirpStack v4's HTTP integration posts besides `up`, as its
/// documentation shows them (`?event=<name>`, the event's JSON body).
fn chirpstack_events() -> Vec<(&'static str, Value)> {
    let d = chirpstack_device();
    vec![
        (
            "join",
            json!({"deduplicationId": "c9dbe358-2578-4fb7-b295-66b44edc45a6",
            "time": "2026-01-02T03:00:00Z", "deviceInfo": d, "devAddr": "00189440"}),
        ),
        (
            "status",
            json!({"deduplicationId": "b0d3ba1c-8a2b-4a5c-9b2d-1f0e1d2c3b4a",
            "time": "2026-01-02T03:01:00Z", "deviceInfo": d, "margin": 6,
            "externalPowerSource": false, "batteryLevelUnavailable": false, "batteryLevel": 75.5}),
        ),
        (
            "ack",
            json!({"deduplicationId": "e2b7a8d4-3c1f-4b5e-a6d7-8f9e0a1b2c3d",
            "time": "2026-01-02T03:02:00Z", "deviceInfo": d,
            "queueItemId": "5a2b9d3c-1e4f-4a6b-8c7d-9e0f1a2b3c4d", "acknowledged": true, "fCntDown": 4}),
        ),
        (
            "txack",
            json!({"downlinkId": 3143208394u32, "time": "2026-01-02T03:02:30Z", "deviceInfo": d,
            "queueItemId": "5a2b9d3c-1e4f-4a6b-8c7d-9e0f1a2b3c4d", "fCntDown": 4,
            "gatewayId": "0016c001f153a14c",
            "txInfo": {"frequency": 868100000, "power": 14,
                       "modulation": {"lora": {"bandwidth": 125000, "spreadingFactor": 7,
                                               "codeRate": "CR_4_5"}},
                       "timing": {"delay": {"delay": "1s"}}, "context": "EFwMtA=="}}),
        ),
        (
            "log",
            json!({"time": "2026-01-02T03:03:00Z", "deviceInfo": d, "level": "ERROR",
            "code": "UPLINK_CODEC", "description": "Error: no decodeUplink",
            "context": {"deduplication_id": "c9dbe358-2578-4fb7-b295-66b44edc45a6"}}),
        ),
        (
            "location",
            json!({"deduplicationId": "0f1e2d3c-4b5a-4968-8776-655443322110",
            "time": "2026-01-02T03:04:00Z", "deviceInfo": d,
            "location": {"latitude": 41.1496, "longitude": -8.611, "altitude": 95.0,
                         "source": "GEO_RESOLVER_TDOA", "accuracy": 20.0}}),
        ),
        (
            "integration",
            json!({"deduplicationId": "1a2b3c4d-5e6f-4a8b-9c0d-1e2f3a4b5c6d",
            "time": "2026-01-02T03:05:00Z", "deviceInfo": d, "integrationName": "loracloud",
            "eventType": "modem_UplinkResponse", "object": {"dnlink": null}}),
        ),
        // A name weft does not know: kept under that name.
        (
            "frobnicate",
            json!({"time": "2026-01-02T03:06:00Z", "deviceInfo": d, "anything": 1}),
        ),
    ]
}

/// Every ChirpStack event besides `up` is accepted (202, logged like an
/// uplink) and kept as the device's event, never as a failed uplink: the
/// device's record shows its last join, status, location, ack and txack
/// (and any other kind), its events are listed newest first, and a client
/// that GETs the device and PUTs it back unchanged succeeds.
#[tokio::test]
async fn chirpstack_events_are_kept_as_device_events() {
    let server = Server::start();
    let c = server.client();
    c.expect(
        201,
        "PUT",
        "/api/v1/device-types/em300th",
        Some(&json!({"decoder":{"script": EM300TH_JS}})),
    )
    .await;
    let up = json!({"deduplicationId": "up-1", "time": "2026-01-02T02:59:00Z",
                    "deviceInfo": chirpstack_device(), "fPort": 85, "data": "AXVcA2c0AQRoZQ=="});
    assert_eq!(
        c.send(
            "POST",
            "/api/v1/uplinks/chirpstack?event=up",
            Some(&up),
            Some(KEY)
        )
        .await
        .0,
        202
    );
    c.unit_eventually("up-1").await;
    let events = chirpstack_events();
    for (name, body) in &events {
        let path = format!("/api/v1/uplinks/chirpstack?event={name}");
        let (status, reply) = c.send("POST", &path, Some(body), Some(KEY)).await;
        assert_eq!(status, 202, "{name}: {reply}");
    }
    // Bad event names and an event on TTN's path are refused; nothing kept.
    for path in [
        "/api/v1/uplinks/chirpstack?event=%3Cscript%3E",
        "/api/v1/uplinks/ttn?event=join",
    ] {
        let (status, reply) = c.send("POST", path, Some(&events[0].1), Some(KEY)).await;
        assert_eq!(status, 400, "{path}: {reply}");
    }

    let id = "0102030405060708";
    let device = eventually(Duration::from_secs(10), || async {
        let d = c
            .expect(200, "GET", &format!("/api/v1/devices/{id}"), None)
            .await;
        (d["state"].as_object().map_or(0, |s| s.len()) == events.len()).then_some(d)
    })
    .await;
    let state = &device["state"];
    assert_eq!(state["join"]["devAddr"], "00189440");
    assert_eq!(state["join"]["time"], 1767322800000i64);
    assert!(state["join"]["receivedAt"].as_i64().unwrap() > 0);
    assert_eq!(state["status"]["batteryLevel"], 75.5);
    assert_eq!(state["status"]["margin"], 6);
    assert_eq!(state["status"]["externalPowerSource"], false);
    assert_eq!(state["location"]["latitude"], 41.1496);
    assert_eq!(state["location"]["longitude"], -8.611);
    assert_eq!(state["ack"]["acknowledged"], true);
    assert_eq!(state["ack"]["fCntDown"], 4);
    assert_eq!(state["txack"]["gatewayId"], "0016c001f153a14c");
    assert_eq!(state["log"]["code"], "UPLINK_CODEC");
    assert_eq!(state["frobnicate"]["event"], "frobnicate");

    // None of them is a failed uplink or a data unit.
    let failed = c.expect(200, "GET", "/api/v1/uplinks/failed", None).await;
    assert_eq!(failed["failures"], json!([]), "{failed}");
    let units = c.all_units(&format!("device={id}")).await;
    assert_eq!(units.len(), 1);

    // The events, newest first, with their bodies as received.
    let listed = c
        .expect(200, "GET", &format!("/api/v1/devices/{id}/events"), None)
        .await;
    let names: Vec<&str> = listed["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    let mut sent: Vec<&str> = events.iter().map(|(n, _)| *n).collect();
    sent.reverse();
    assert_eq!(names, sent);
    let joins = c
        .expect(
            200,
            "GET",
            &format!("/api/v1/devices/{id}/events?event=join"),
            None,
        )
        .await;
    assert_eq!(joins["events"][0]["body"], events[0].1);
    assert_eq!(joins["events"][0]["source"], "chirpstack");
    c.expect(404, "GET", "/api/v1/devices/nobody/events", None)
        .await;

    // GET then PUT back unchanged: accepted, the state is read-only.
    c.expect(200, "PUT", &format!("/api/v1/devices/{id}"), Some(&device))
        .await;
    let again = c
        .expect(200, "GET", &format!("/api/v1/devices/{id}"), None)
        .await;
    assert_eq!(again, device);
}

/// The Things Stack v3 posts each message type (to one URL when the
/// webhook is set up so): the body's message field says which. Every
/// type but `uplink_message` is kept as the device's event, whatever its
/// name, never as a failed uplink.
#[tokio::test]
async fn ttn_messages_other_than_uplinks_are_kept_as_device_events() {
    let server = Server::start();
    let c = server.client();
    let id = "eui-a84041000181d2a5";
    c.expect(
        201,
        "PUT",
        &format!("/api/v1/devices/{id}"),
        Some(&json!({"name": "north", "type": "em300th", "channel": "farm"})),
    )
    .await;
    let ids = json!({"device_id": id, "application_ids": {"application_id": "farm"},
                     "dev_eui": "A84041000181D2A5", "join_eui": "0000000000000000",
                     "dev_addr": "260B1234"});
    let msg = |field: &str, time: &str, inner: Value| {
        let mut m = json!({"end_device_ids": ids, "correlation_ids": ["as:up:01H0", "rpc:/ttn.lorawan.v3.AppAs/Up:0"],
                           "received_at": time});
        m[field] = inner;
        m
    };
    let messages = [
        msg(
            "join_accept",
            "2026-01-02T03:00:00.000Z",
            json!({"session_key_id": "AYa8ILmaQ0E4bDz8VEOwKA==", "received_at": "2026-01-02T03:00:00.000Z"}),
        ),
        msg(
            "downlink_queued",
            "2026-01-02T03:01:00.000Z",
            json!({"f_port": 1, "frm_payload": "AQ==", "confirmed": true, "priority": "NORMAL",
                   "correlation_ids": ["as:downlink:01H1"]}),
        ),
        msg(
            "downlink_sent",
            "2026-01-02T03:01:01.000Z",
            json!({"session_key_id": "AYa8ILmaQ0E4bDz8VEOwKA==", "f_port": 1, "f_cnt": 3,
                   "frm_payload": "AQ==", "confirmed": true, "priority": "NORMAL"}),
        ),
        msg(
            "downlink_ack",
            "2026-01-02T03:01:05.000Z",
            json!({"session_key_id": "AYa8ILmaQ0E4bDz8VEOwKA==", "f_port": 1, "f_cnt": 3,
                   "frm_payload": "AQ==", "confirmed": true, "priority": "NORMAL"}),
        ),
        msg(
            "downlink_failed",
            "2026-01-02T03:02:00.000Z",
            json!({"downlink": {"f_port": 1, "frm_payload": "Ag==", "priority": "NORMAL"},
                   "error": {"namespace": "pkg/networkserver", "name": "application_downlink_too_long",
                             "message_format": "application downlink payload too long", "code": 3}}),
        ),
        msg(
            "location_solved",
            "2026-01-02T03:03:00.000Z",
            json!({"service": "lora-cloud-geolocation-v3",
                   "location": {"latitude": 41.15, "longitude": -8.61, "altitude": 90,
                                "accuracy": 15, "source": "SOURCE_GPS"}}),
        ),
        msg(
            "service_data",
            "2026-01-02T03:04:00.000Z",
            json!({"service": "lora-cloud-device-management-v1-uplink", "data": {"result": {}}}),
        ),
    ];
    for m in &messages {
        let (status, reply) = c
            .send(
                "POST",
                "/api/v1/uplinks/ttn",
                Some(m),
                Some(&format!("Bearer {KEY}")),
            )
            .await;
        assert_eq!(status, 202, "{reply}");
    }
    let device = eventually(Duration::from_secs(10), || async {
        let d = c
            .expect(200, "GET", &format!("/api/v1/devices/{id}"), None)
            .await;
        (d["state"].as_object().map_or(0, |s| s.len()) == 7).then_some(d)
    })
    .await;
    let state = &device["state"];
    assert_eq!(state["join"]["event"], "join_accept");
    assert_eq!(state["join"]["devAddr"], "260B1234");
    assert_eq!(state["join"]["time"], 1767322800000i64);
    assert_eq!(state["ack"]["acknowledged"], true);
    assert_eq!(state["ack"]["fCntDown"], 3);
    assert_eq!(state["txack"]["fCntDown"], 3);
    assert_eq!(state["location"]["latitude"], 41.15);
    assert_eq!(state["downlink_failed"]["event"], "downlink_failed");
    assert_eq!(state["downlink_queued"]["event"], "downlink_queued");
    assert_eq!(state["service_data"]["event"], "service_data");
    let listed = c
        .expect(200, "GET", &format!("/api/v1/devices/{id}/events"), None)
        .await;
    assert_eq!(listed["events"].as_array().unwrap().len(), messages.len());
    assert_eq!(listed["events"][0]["source"], "ttn");
    let failed = c.expect(200, "GET", "/api/v1/uplinks/failed", None).await;
    assert_eq!(failed["failures"], json!([]), "{failed}");
}
