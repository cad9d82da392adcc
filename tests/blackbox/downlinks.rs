//! Downlinks: the per-device queue (push, replace, list, flush, its
//! checks), delivery through each HTTP route to a fake network server or
//! device (The Things Stack's webhook push URL, ChirpStack's REST queue,
//! Helium's `downlink_url`, an IoT Agent device's endpoint) with retries
//! on a 500, expiry, and the NGSI command round trip.

use std::time::Duration;

use base64::Engine as _;
use serde_json::{json, Value};

use crate::util::*;

/// The actuator codec: `encodeDownlink` and `decodeDownlink` in The Things
/// Stack's shapes.
const ACTUATOR_JS: &str = include_str!("../../crates/engine/codecs/actuator-v3.js");

/// Quick retries and re-checks, so tests see them within their deadlines.
const FAST: &[(&str, &str)] = &[
    ("WEFT_DOWNLINKS__RETRY_INITIAL", "100ms"),
    ("WEFT_DOWNLINKS__RETRY_MAX", "200ms"),
    ("WEFT_DOWNLINKS__PENDING_RECHECK", "300ms"),
];

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Creates the `actuator` type (with its codec, and `ring` as a command)
/// and device `id` of that type.
async fn actuator(c: &Client, id: &str, device: Value) {
    let status = c
        .send(
            "PUT",
            "/api/v1/device-types/actuator",
            Some(&json!({"decoder": {"script": ACTUATOR_JS}, "commands": ["ring"]})),
            None,
        )
        .await
        .0;
    assert!(status == 201 || status == 200, "type stored: {status}");
    let mut body = device;
    body["type"] = json!("actuator");
    let (status, reply) = c
        .send("PUT", &format!("/api/v1/devices/{id}"), Some(&body), None)
        .await;
    assert!(status == 201 || status == 200, "device stored: {reply}");
}

/// The device's downlinks as listed.
async fn downlinks(c: &Client, id: &str) -> Vec<Value> {
    let (status, reply) = c
        .send(
            "GET",
            &format!("/api/v1/devices/{id}/downlinks"),
            None,
            None,
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    reply["downlinks"].as_array().unwrap().clone()
}

/// Waits for the downlink `id` of `device` to reach `status`; returns it.
async fn downlink_reaching(c: &Client, device: &str, id: &str, status: &str) -> Value {
    eventually(Duration::from_secs(10), || async {
        downlinks(c, device)
            .await
            .into_iter()
            .find(|d| d["id"] == id && d["status"] == status)
    })
    .await
}

/// Push appends (raw bytes as given, data through the codec), replace
/// swaps the open ones, flush empties the queue, the list decodes raw
/// downlinks with the codec's `decodeDownlink`; bad requests are 400s
/// that change nothing, an unknown device is 404, a codec's refusal a
/// 422 with its own errors. With no route known, a downlink waits as
/// `pending` with the reason.
#[tokio::test]
async fn the_queue_is_pushed_replaced_listed_and_flushed() {
    let server = Server::start_with_env(FAST);
    let c = server.client();
    actuator(&c, "act1", json!({})).await;
    let path = "/api/v1/devices/act1/downlinks";

    let (status, raw) = c
        .send(
            "POST",
            path,
            Some(&json!({"fPort": 11, "bytes": b64(&[2, 0, 30])})),
            None,
        )
        .await;
    assert_eq!(status, 202, "{raw}");
    let raw = &raw["downlinks"][0];
    assert_eq!(raw["status"], "queued");
    assert_eq!(raw["frmPayload"], b64(&[2, 0, 30]));
    let (status, encoded) = c
        .send(
            "POST",
            path,
            Some(&json!({"downlinks": [{"data": {"command": "ring", "duration": 7}, "confirmed": true, "priority": "HIGH"}]})),
            None,
        )
        .await;
    assert_eq!(status, 202, "{encoded}");
    let encoded = &encoded["downlinks"][0];
    assert_eq!(encoded["frmPayload"], b64(&[1, 7]));
    assert_eq!(encoded["fPort"], 10, "the codec's port");
    assert_eq!(encoded["confirmed"], true);

    let listed = downlinks(&c, "act1").await;
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0]["id"], raw["id"]);
    assert_eq!(
        listed[0]["decoded"],
        json!({"command": "interval", "minutes": 30}),
        "raw downlinks are shown decoded"
    );
    assert_eq!(listed[1]["data"], json!({"command": "ring", "duration": 7}));

    // No route yet: pending, with the reason.
    let pending = downlink_reaching(&c, "act1", raw["id"].as_str().unwrap(), "pending").await;
    assert!(
        pending["reason"]
            .as_str()
            .unwrap()
            .contains("no downlink route"),
        "{pending}"
    );

    // Bad requests: 400, nothing queued.
    for bad in [
        json!({"bytes": b64(&[1])}),
        json!({"fPort": 0, "bytes": b64(&[1])}),
        json!({"fPort": 1, "bytes": "not base64!"}),
        json!({"fPort": 1}),
        json!({"data": {"command": "ring"}, "bytes": b64(&[1])}),
        json!({"data": {"command": "ring"}, "priority": "URGENT"}),
        json!({"data": {"command": "ring"}, "expiresAt": "2001-01-01T00:00:00Z"}),
        json!({"data": {"command": "ring"}, "colour": "red"}),
        json!([1, 2]),
    ] {
        let (status, reply) = c.send("POST", path, Some(&bad), None).await;
        assert_eq!(status, 400, "{bad} → {reply}");
        assert_eq!(reply["error"], "BadRequest", "{reply}");
    }
    // The codec refuses: 422 with its own errors.
    let (status, reply) = c
        .send(
            "POST",
            path,
            Some(&json!({"data": {"command": "dance"}})),
            None,
        )
        .await;
    assert_eq!(status, 422, "{reply}");
    assert_eq!(reply["errors"], json!(["unknown command dance"]));
    assert_eq!(downlinks(&c, "act1").await.len(), 2, "nothing queued");
    // Unknown device: 404 on every verb.
    for method in ["GET", "POST", "PUT", "DELETE"] {
        let body = json!({"fPort": 1, "bytes": b64(&[1])});
        let (status, _) = c
            .send(
                method,
                "/api/v1/devices/nobody/downlinks",
                Some(&body),
                None,
            )
            .await;
        assert_eq!(status, 404, "{method}");
    }

    // Replace: the open ones go, the new one stays.
    let (status, replaced) = c
        .send(
            "PUT",
            path,
            Some(&json!({"fPort": 5, "bytes": b64(&[9])})),
            None,
        )
        .await;
    assert_eq!(status, 202, "{replaced}");
    let listed = downlinks(&c, "act1").await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["id"], replaced["downlinks"][0]["id"]);
    // Flush: empty.
    let (status, flushed) = c.send("DELETE", path, None, None).await;
    assert_eq!((status, flushed), (200, json!({"flushed": 1})));
    assert!(downlinks(&c, "act1").await.is_empty());
}

/// A TTN uplink posted with The Things Stack's webhook headers teaches
/// weft the device's downlink push URL and key; a queued downlink goes
/// there in TTN's queue body, retried after a 500 until it is accepted.
#[tokio::test]
async fn ttn_webhook_downlinks_are_pushed_and_retried() {
    let mut ttn = Receiver::start().await;
    ttn.answer(500, r#"{"message":"try again"}"#);
    let server = Server::start_with_env(FAST);
    let c = server.client();
    actuator(&c, "eui-70b3d57ed0000001", json!({})).await;
    let push = format!(
        "{}/api/v3/as/applications/farm/webhooks/weft/devices/eui-70b3d57ed0000001/down/push",
        ttn.base
    );
    let uplink = json!({
        "end_device_ids": {"device_id": "eui-70b3d57ed0000001", "application_ids": {"application_id": "farm"}},
        "received_at": "2026-01-02T03:04:05Z",
        "uplink_message": {"f_port": 1, "frm_payload": b64(&[1])}
    });
    let reply = c
        .http
        .post(format!("{}/api/v1/uplinks/ttn?type=actuator", c.url))
        .header("Authorization", KEY)
        .header("X-Downlink-Push", &push)
        .header("X-Downlink-Replace", push.replace("/push", "/replace"))
        .header("X-Downlink-Apikey", "NNSXS.SECRET")
        .json(&uplink)
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 202);

    let (status, queued) = c
        .send(
            "POST",
            "/api/v1/devices/eui-70b3d57ed0000001/downlinks",
            Some(&json!({"data": {"command": "interval", "minutes": 300}, "confirmed": true})),
            None,
        )
        .await;
    assert_eq!(status, 202, "{queued}");
    let id = queued["downlinks"][0]["id"].as_str().unwrap().to_string();

    let first = ttn.next().await;
    ttn.answer(200, "{}");
    assert_eq!(first.method, "POST");
    assert!(first.target.ends_with("/down/push"), "{}", first.target);
    assert_eq!(first.header("authorization"), Some("Bearer NNSXS.SECRET"));
    assert_eq!(
        first.json(),
        json!({"downlinks": [{"frm_payload": b64(&[2, 1, 44]), "f_port": 11, "confirmed": true, "priority": "NORMAL"}]})
    );
    let retried = ttn.next().await;
    assert_eq!(retried.json(), first.json(), "the same downlink again");
    let sent = downlink_reaching(&c, "eui-70b3d57ed0000001", &id, "sent").await;
    assert_eq!(sent["attempts"], 2);
    assert_eq!(sent["route"], "ttn");
    ttn.nothing_more().await;
    let metrics = c.metrics().await.expect("metrics");
    assert!(
        metrics.contains("weft_downlinks_sent_total{route=\"ttn\"} 1"),
        "sent counted"
    );
}

/// A ChirpStack uplink routes the device's downlinks to the configured
/// ChirpStack REST API: `POST /api/devices/{devEui}/queue` with the token
/// and v4's queue item. A route that keeps failing ends `failed`.
#[tokio::test]
async fn chirpstack_downlinks_go_to_its_rest_queue() {
    let mut chirpstack = Receiver::start().await;
    let mut env = FAST.to_vec();
    env.push(("WEFT_DOWNLINKS__CHIRPSTACK__URL", &chirpstack.base));
    env.push(("WEFT_DOWNLINKS__CHIRPSTACK__TOKEN", "cs-token"));
    env.push(("WEFT_DOWNLINKS__MAX_ATTEMPTS", "2"));
    let server = Server::start_with_env(&env);
    let c = server.client();
    actuator(&c, "0102030405060708", json!({})).await;
    let uplink = json!({"deduplicationId": "d1", "time": "2026-01-02T03:04:05Z", "fPort": 1, "data": b64(&[1]),
        "deviceInfo": {"devEui": "0102030405060708", "deviceName": "valve", "deviceProfileName": "actuator"}});
    c.expect(202, "POST", "/api/v1/uplinks/chirpstack", Some(&uplink))
        .await;

    let path = "/api/v1/devices/0102030405060708/downlinks";
    let (status, queued) = c
        .send(
            "POST",
            path,
            Some(&json!({"fPort": 20, "bytes": b64(&[0xca, 0xfe])})),
            None,
        )
        .await;
    assert_eq!(status, 202, "{queued}");
    let seen = chirpstack.next().await;
    assert_eq!(seen.target, "/api/devices/0102030405060708/queue");
    assert_eq!(
        seen.header("grpc-metadata-authorization"),
        Some("Bearer cs-token")
    );
    assert_eq!(
        seen.json(),
        json!({"queueItem": {"confirmed": false, "fPort": 20, "data": b64(&[0xca, 0xfe])}})
    );
    let id = queued["downlinks"][0]["id"].as_str().unwrap();
    downlink_reaching(&c, "0102030405060708", id, "sent").await;

    // Every attempt refused: failed after the configured two, with the error.
    chirpstack.answer(500, r#"{"error":"down"}"#);
    let (_, queued) = c
        .send(
            "POST",
            path,
            Some(&json!({"fPort": 20, "bytes": b64(&[1])})),
            None,
        )
        .await;
    let id = queued["downlinks"][0]["id"].as_str().unwrap();
    let failed = downlink_reaching(&c, "0102030405060708", id, "failed").await;
    assert_eq!(failed["attempts"], 2);
    assert!(
        failed["reason"].as_str().unwrap().contains("500"),
        "{failed}"
    );
}

/// A Helium uplink's `downlink_url` takes the device's downlinks
/// (Helium's `payload_raw`/`port`); a downlink whose `expiresAt` passes
/// while it waits is marked `expired` and never sent.
#[tokio::test]
async fn helium_downlinks_and_expiry() {
    let mut helium = Receiver::start().await;
    let server = Server::start_with_env(FAST);
    let c = server.client();
    actuator(&c, "hotspot-dev", json!({})).await;
    // Expiry first: no route yet, so it waits, then expires.
    let expires = now_ms() + 1_500;
    let (status, queued) = c
        .send(
            "POST",
            "/api/v1/devices/hotspot-dev/downlinks",
            Some(&json!({"fPort": 3, "bytes": b64(&[7]), "expiresAt": expires})),
            None,
        )
        .await;
    assert_eq!(status, 202, "{queued}");
    let id = queued["downlinks"][0]["id"].as_str().unwrap().to_string();
    let expired = downlink_reaching(&c, "hotspot-dev", &id, "expired").await;
    assert_eq!(expired["expiresAt"], expires);

    let uplink = json!({"id": "hotspot-dev", "uuid": "u-1", "reported_at": now_ms(), "port": 1,
        "payload": b64(&[1]), "downlink_url": format!("{}/api/v1/down/abc/xyz", helium.base)});
    c.uplink("ch1", "encoded", "actuator", &uplink).await;
    let (status, queued) = c
        .send(
            "POST",
            "/api/v1/devices/hotspot-dev/downlinks",
            Some(&json!({"data": {"command": "ring"}})),
            None,
        )
        .await;
    assert_eq!(status, 202, "{queued}");
    let seen = helium.next().await;
    assert_eq!(seen.target, "/api/v1/down/abc/xyz");
    assert_eq!(
        seen.json(),
        json!({"payload_raw": b64(&[1, 5]), "port": 10, "confirmed": false})
    );
    helium.nothing_more().await;
}

/// The NGSI command pattern: a device type declaring `ring`, a device
/// with its own endpoint. PATCHing `ring` on the device's entity sends
/// the command to the device and `ring_status` follows (`PENDING`, then
/// `DELIVERED`); the device's later answer on the IoT Agent JSON path
/// sets `ring_status` `OK` and `ring_info`. A device answering at once
/// sets them in one go.
#[tokio::test]
async fn a_command_attribute_round_trip() {
    let mut lamp = Receiver::start().await;
    let server = Server::start_with_env(FAST);
    let c = server.client();
    actuator(
        &c,
        "lamp1",
        json!({"endpoint": format!("{}/lamp1/cmd", lamp.base)}),
    )
    .await;
    // The device's entity comes with its first uplink.
    c.uplink(
        "ch1",
        "decoded",
        "actuator",
        &json!({"id": "lamp1", "uuid": "u-lamp", "reported_at": now_ms(), "level": 3}),
    )
    .await;
    eventually(Duration::from_secs(10), || async {
        (c.send("GET", "/v2/entities/lamp1", None, None).await.0 == 200).then_some(())
    })
    .await;

    let (status, reply) = c
        .send(
            "PATCH",
            "/v2/entities/lamp1/attrs",
            Some(&json!({"ring": {"type": "command", "value": "loud"}})),
            None,
        )
        .await;
    assert_eq!(status, 204, "{reply}");
    let seen = lamp.next().await;
    assert_eq!(seen.target, "/lamp1/cmd");
    assert_eq!(seen.json(), json!({"ring": "loud"}));
    let entity = eventually(Duration::from_secs(10), || async {
        let (_, e) = c
            .send("GET", "/v2/entities/lamp1?options=keyValues", None, None)
            .await;
        (e["ring_status"] == "DELIVERED").then_some(e)
    })
    .await;
    assert_eq!(entity["level"], 3, "the entity's data is untouched");

    // The device answers later, as an IoT Agent JSON device does.
    let (status, reply) = c
        .send(
            "POST",
            &format!("/iot/json/commands?k={KEY}&i=lamp1"),
            Some(&json!({"ring": "rang 3 times"})),
            None,
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    let (_, entity) = c
        .send("GET", "/v2/entities/lamp1?options=keyValues", None, None)
        .await;
    assert_eq!(entity["ring_status"], "OK");
    assert_eq!(entity["ring_info"], "rang 3 times");
    // Naming no command is a 400; an unknown device a 404.
    let (status, _) = c
        .send(
            "POST",
            &format!("/iot/json/commands?k={KEY}&i=lamp1"),
            Some(&json!({"level": 1})),
            None,
        )
        .await;
    assert_eq!(status, 400);
    let (status, _) = c
        .send(
            "POST",
            &format!("/iot/json/commands?k={KEY}&i=nobody"),
            Some(&json!({"ring": 1})),
            None,
        )
        .await;
    assert_eq!(status, 404);

    // A device answering in its HTTP response: OK and the result at once.
    lamp.answer(200, r#"{"ring":"ok now"}"#);
    let (status, _) = c
        .send(
            "PATCH",
            "/v2/entities/lamp1/attrs",
            Some(&json!({"ring": {"type": "command", "value": "soft"}, "level": {"type": "Number", "value": 4}})),
            None,
        )
        .await;
    assert_eq!(status, 204);
    assert_eq!(lamp.next().await.json(), json!({"ring": "soft"}));
    let entity = eventually(Duration::from_secs(10), || async {
        let (_, e) = c
            .send("GET", "/v2/entities/lamp1?options=keyValues", None, None)
            .await;
        (e["ring_info"] == "ok now").then_some(e)
    })
    .await;
    assert_eq!(entity["ring_status"], "OK");
    assert_eq!(
        entity["level"], 4,
        "the other attributes are updated as usual"
    );
    assert!(
        entity.get("ring").is_none(),
        "a command is no attribute value"
    );
}
