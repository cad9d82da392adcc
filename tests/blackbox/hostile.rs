//! Hostile input: what a device, a codec or a client sends can never
//! spoof an entity, make one `/v2` cannot serve, or make one uplink's
//! decode depend on another's. Each case gets a clear refusal (a 4xx, or
//! a failed uplink with its reason), changes nothing else, and weft keeps
//! answering.

use std::time::Duration;

use serde_json::{json, Value};

use crate::util::*;

/// Asserts weft still answers its health check.
async fn healthy(c: &Client) {
    c.expect(200, "GET", "/health", None).await;
}

/// The entity of device `id` in the default tenant, once it exists.
async fn entity_eventually(c: &Client, id: &str) -> Value {
    eventually(Duration::from_secs(10), || async {
        let (status, body) = c
            .send("GET", &format!("/v2/entities/{id}"), None, None)
            .await;
        (status == 200).then_some(body)
    })
    .await
}

/// Measures named `id` or `type`, or with names NGSI forbids, stay in the
/// data unit but never touch the entity's id or type; the entity stays
/// readable through `/v2`.
#[tokio::test]
async fn measures_cannot_spoof_or_break_entities() {
    let server = Server::start();
    let c = server.client();
    // No processor: every body field but the envelope becomes a measure.
    c.expect(201, "PUT", "/api/v1/device-types/raw", Some(&json!({})))
        .await;
    let body = json!({"uuid": "h-1", "id": "dev-h", "name": "n", "reported_at": now_ms(),
                      "type": "Spoofed", "a<b>": 1, "bell\u{7}": 2, "ok": 3});
    c.uplink("farm", "decoded", "raw", &body).await;
    let unit = c.unit_eventually("h-1").await;
    assert_eq!(
        unit["measures"]["type"], "Spoofed",
        "the unit keeps what was sent"
    );

    let entity = entity_eventually(&c, "dev-h").await;
    assert_eq!(entity["id"], "dev-h");
    assert_eq!(entity["type"], "raw", "{entity}");
    assert_eq!(entity["ok"]["value"], 3);
    for name in ["a<b>", "bell\u{7}"] {
        assert!(entity.get(name).is_none(), "{entity}");
    }
    let (status, list) = c.send("GET", "/v2/entities?type=Spoofed", None, None).await;
    assert_eq!((status, list), (200, json!([])));
    healthy(&c).await;
}

/// A device id NGSI cannot name an entity with fails its uplink as
/// `InvalidUplink` (kept, with the reason) and creates no entity.
#[tokio::test]
async fn device_ids_ngsi_forbids_fail_their_uplink() {
    let server = Server::start();
    let c = server.client();
    c.create_em300th().await;
    let long = "x".repeat(100_000);
    let bad = ["<script>", "tab\there", "semi;colon", long.as_str()];
    for (i, id) in bad.iter().enumerate() {
        let body = decoded_body(&format!("bad-{i}"), id, 20, 50, now_ms());
        c.uplink("farm", "decoded", "em300th", &body).await;
    }
    // A good uplink after them: once it is stored, the bad ones were seen.
    c.uplink(
        "farm",
        "decoded",
        "em300th",
        &decoded_body("good", "dev-ok", 20, 50, now_ms()),
    )
    .await;
    c.unit_eventually("good").await;
    let failed = c.expect(200, "GET", "/api/v1/uplinks/failed", None).await;
    let failures = failed["failures"].as_array().unwrap();
    assert_eq!(failures.len(), bad.len(), "{failed}");
    for f in failures {
        assert_eq!(f["reason"], "InvalidUplink");
        assert!(f["description"]
            .as_str()
            .unwrap()
            .contains("cannot name an NGSI entity"));
    }
    let (status, entities) = c.send("GET", "/v2/entities", None, None).await;
    assert_eq!(status, 200);
    let ids: Vec<&str> = entities
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["dev-ok"]);
    healthy(&c).await;
}

/// A device listed as its own sub-device, or a sub-device listed twice,
/// is refused with a 400 naming the problem, and nothing is stored.
#[tokio::test]
async fn sub_device_loops_are_refused() {
    let server = Server::start();
    let c = server.client();
    for (subs, says) in [
        (json!([{"ref": 1, "id": "gw"}]), "its own sub-device"),
        (
            json!([{"ref": 1, "id": "a"}, {"ref": 2, "id": "a"}]),
            "listed twice",
        ),
        (
            json!([{"ref": 1, "id": "a"}, {"ref": 1, "id": "b"}]),
            "used twice",
        ),
    ] {
        let body = json!({"name": "gateway", "type": "em300th", "subDevices": subs});
        let reply = c
            .expect(400, "PUT", "/api/v1/devices/gw", Some(&body))
            .await;
        assert!(reply.to_string().contains(says), "{reply}");
    }
    // A misspelt field is named, not dropped.
    let body = json!({"name": "gateway", "sub_devices": [{"ref": 1, "id": "gw"}]});
    let reply = c
        .expect(400, "PUT", "/api/v1/devices/gw", Some(&body))
        .await;
    assert!(reply.to_string().contains("sub_devices"), "{reply}");
    c.expect(404, "GET", "/api/v1/devices/gw", None).await;
    c.expect(400, "PUT", "/api/v1/devices/a%3Cb", Some(&json!({})))
        .await;
    healthy(&c).await;
}

/// A codec that walks the payload with a top-level index (the shape of
/// many codecs in TTN's device repository) decodes every uplink from its
/// first byte: each decode starts from fresh state.
#[tokio::test]
async fn a_codec_keeping_state_in_globals_decodes_each_uplink_afresh() {
    let server = Server::start();
    let c = server.client();
    let script = "var i = 0; var calls = 0;
        function decodeUplink(input) {
          calls++;
          var data = {calls: calls};
          while (i < input.bytes.length) { data['b' + i] = input.bytes[i]; i++; }
          return {data: data};
        }";
    let def = json!({"decoder": {"language": "javascript", "script": script}});
    c.expect(201, "PUT", "/api/v1/device-types/walker", Some(&def))
        .await;
    // Two device types with the same source share one compiled script.
    c.expect(201, "PUT", "/api/v1/device-types/walker2", Some(&def))
        .await;
    // One device per type: a registered device keeps its type.
    for (n, device_type) in [(0, "walker"), (1, "walker2"), (2, "walker")] {
        let body = encoded_body(
            &format!("w-{n}"),
            &format!("dev-{device_type}"),
            &[7, 8],
            now_ms(),
        );
        c.uplink("farm", "encoded", device_type, &body).await;
        let unit = c.unit_eventually(&format!("w-{n}")).await;
        assert_eq!(
            unit["measures"],
            json!({"calls": 1, "b0": 7, "b1": 8}),
            "uplink {n}: {unit}"
        );
    }
    healthy(&c).await;
}

/// A channel message nested 10,000 levels deep or holding a number no
/// double can carry is refused with a 400 and never reaches a subscriber,
/// which keeps getting what it can parse.
#[tokio::test]
async fn channel_messages_ordinary_clients_cannot_parse_are_refused() {
    let server = Server::start();
    let c = server.client();
    let put = |path: String, body: String| {
        let c = &c;
        async move {
            let resp = c
                .http
                .put(format!("{}{}", c.url, path))
                .body(body)
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let sub = "/channel/h/subscription/polling/s".to_string();
    assert_eq!(put(sub.clone(), String::new()).await.0, 200);
    let deep = "[".repeat(10_000) + &"]".repeat(10_000);
    for (id, body, says) in [
        ("deep", deep, "nested deeper"),
        ("huge", r#"{"v":1e400}"#.to_string(), "out of range"),
    ] {
        let (status, reply) = put(format!("/channel/h/message/{id}"), body).await;
        assert_eq!(status, 400, "{id}: {reply}");
        assert!(reply["error"].as_str().unwrap().contains(says), "{reply}");
    }
    assert_eq!(
        put("/channel/h/message/fine".into(), r#"{"v":[1,2]}"#.into())
            .await
            .0,
        200
    );
    let (status, fetched) = c.send("GET", &sub, None, None).await;
    assert_eq!(status, 200);
    let got: Vec<&str> = fetched["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["messageID"].as_str().unwrap())
        .collect();
    assert_eq!(got, ["fine"], "{fetched}");
    assert!(fetched["ackHandle"].is_string());
    healthy(&c).await;
}

/// A device type with a misspelt field gets a 400 naming it; one whose
/// entity type NGSI forbids is refused; what `GET` answers can be sent
/// back as it is. Nothing refused is stored.
#[tokio::test]
async fn device_type_definitions_are_checked_when_saved() {
    let server = Server::start();
    let c = server.client();
    let path = "/api/v1/device-types/probe";
    for (body, says) in [
        (json!({"decodr": {"script": "x"}}), "decodr"),
        (
            json!({"processor": {"mappings": [{"from": "a", "too": "b"}]}}),
            "too",
        ),
        (json!({"entityType": "a<b>"}), "entityType"),
        (json!({"name": "other"}), "differs"),
    ] {
        let reply = c.expect(400, "PUT", path, Some(&body)).await;
        assert!(reply.to_string().contains(says), "{body}: {reply}");
    }
    c.expect(404, "GET", path, None).await;
    c.expect(400, "PUT", "/api/v1/device-types/a(b)", Some(&json!({})))
        .await;
    c.create_em300th().await;
    let got = c
        .expect(200, "GET", "/api/v1/device-types/em300th", None)
        .await;
    c.expect(200, "PUT", "/api/v1/device-types/em300th", Some(&got))
        .await;
    healthy(&c).await;
}

/// One live connection holds at most 100 subscriptions (resubscribing an
/// id replaces it), and a client message over 64 KiB ends the connection
/// instead of being buffered; other clients are unaffected.
#[tokio::test]
async fn a_live_client_cannot_grow_without_bound() {
    let server = Server::start();
    let c = server.client();
    let mut live = Live::connect(&server).await;
    for i in 0..100 {
        live.subscribe(&format!("s{i}"), "data", json!({})).await;
    }
    live.send(json!({"type":"subscribe","id":"one-more","stream":"data"}))
        .await;
    let reply = live.next().await;
    assert_eq!(reply["error"], "TooManySubscriptions", "{reply}");
    live.subscribe("s7", "alarms", json!({})).await;

    let mut other = Live::connect(&server).await;
    other.subscribe("fine", "data", json!({})).await;
    let huge = "x".repeat(100 * 1024);
    live.send(json!({"type":"subscribe","id":huge,"stream":"data"}))
        .await;
    assert_eq!(
        live.next_within(Duration::from_secs(5)).await,
        None,
        "the connection is closed, not answered"
    );
    other.subscribe("still", "alarms", json!({})).await;
    healthy(&c).await;
}

/// An uplink body nested 10,000 levels deep or holding `1e400` is refused
/// with a 400 before it reaches the ingest log: nothing is stored, not
/// even as a failed uplink that clients would then fail to read.
#[tokio::test]
async fn uplink_bodies_clients_cannot_read_back_are_refused() {
    let server = Server::start();
    let c = server.client();
    c.create_em300th().await;
    let deep = format!(
        "{{\"id\":\"d\",\"x\":{}{}}}",
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    for body in [
        deep.as_str(),
        r#"{"id":"d","uuid":"u","temperature":1e400}"#,
    ] {
        let resp = c
            .http
            .post(format!("{}/sensor-data/farm/decoded/em300th", c.url))
            .header("Authorization", KEY)
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 400);
    }
    let failed = c.expect(200, "GET", "/api/v1/uplinks/failed", None).await;
    assert_eq!(failed["failures"], json!([]), "{failed}");
    assert_eq!(c.all_units("device=d").await, Vec::<Value>::new());
    healthy(&c).await;
}
