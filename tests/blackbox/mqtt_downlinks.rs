//! Downlinks over MQTT, against a real mosquitto: a device whose uplinks
//! arrive over an MQTT source gets its downlinks back over that source's
//! connection, in its network server's or agent's own shapes (The Things
//! Stack's `down/push`, ChirpStack's `command/down`, the IoT Agents'
//! `/{apikey}/{device}/cmd` in JSON and UltraLight), encoded by the
//! device type's codec, and is `sent` once the broker acknowledged it. An
//! NGSI command round trip over `cmd` / `cmdexe`; a broker that is down
//! keeps the downlink queued until it is back.

use std::time::Duration;

use serde_json::{json, Value};

use crate::mqtt::{
    broker_url, connected, free_port, is_root, metric, source_env, start, unique, wait_port, Mqtt,
};
use crate::util::*;

/// The actuator codec: `encodeDownlink` and `decodeDownlink` in The Things
/// Stack's shapes.
const ACTUATOR_JS: &str = include_str!("../../crates/engine/codecs/actuator-v3.js");

/// Quick retries, so tests see them within their deadlines.
fn fast(env: &mut Vec<(String, String)>) {
    for (k, v) in [
        ("WEFT_DOWNLINKS__RETRY_INITIAL", "100ms"),
        ("WEFT_DOWNLINKS__RETRY_MAX", "300ms"),
        ("WEFT_DOWNLINKS__PENDING_RECHECK", "300ms"),
        ("WEFT_DOWNLINKS__MAX_ATTEMPTS", "1000"),
        ("WEFT_DOWNLINKS__REQUEST_TIMEOUT", "3s"),
    ] {
        env.push((k.to_string(), v.to_string()));
    }
}

/// The `actuator` type, with its codec and `ring` as a command.
async fn actuator_type(c: &Client) {
    c.expect(
        201,
        "PUT",
        "/api/v1/device-types/actuator",
        Some(&json!({"decoder": {"script": ACTUATOR_JS}, "commands": ["ring"]})),
    )
    .await;
}

/// The `lamp` type: no codec, `ring` as a command (IoT Agent devices).
async fn lamp_type(c: &Client) {
    c.expect(
        201,
        "PUT",
        "/api/v1/device-types/lamp",
        Some(&json!({"commands": ["ring"]})),
    )
    .await;
}

/// Waits until `device` is registered (its first uplink was processed).
async fn registered(c: &Client, device: &str) {
    eventually(Duration::from_secs(15), || async {
        let (status, _) = c
            .send("GET", &format!("/api/v1/devices/{device}"), None, None)
            .await;
        (status == 200).then_some(())
    })
    .await;
}

/// Queues `body` for `device`; the queued downlink's id.
async fn queue(c: &Client, device: &str, body: Value) -> String {
    let (status, reply) = c
        .send(
            "POST",
            &format!("/api/v1/devices/{device}/downlinks"),
            Some(&body),
            None,
        )
        .await;
    assert_eq!(status, 202, "{reply}");
    reply["downlinks"][0]["id"].as_str().unwrap().to_string()
}

/// Waits for downlink `id` of `device` to be `status`; returns it.
async fn reaching(c: &Client, device: &str, id: &str, status: &str) -> Value {
    eventually(Duration::from_secs(20), || async {
        let (_, reply) = c
            .send(
                "GET",
                &format!("/api/v1/devices/{device}/downlinks"),
                None,
                None,
            )
            .await;
        reply["downlinks"]
            .as_array()?
            .iter()
            .find(|d| d["id"] == id && d["status"] == status)
            .cloned()
    })
    .await
}

/// The device's entity once `check` holds of it (keyValues).
async fn entity_when(c: &Client, id: &str, check: impl Fn(&Value) -> bool) -> Value {
    eventually(Duration::from_secs(15), || async {
        let (status, e) = c
            .send(
                "GET",
                &format!("/v2/entities/{id}?options=keyValues"),
                None,
                None,
            )
            .await;
        (status == 200 && check(&e)).then_some(e)
    })
    .await
}

/// The Things Stack and ChirpStack over MQTT: an uplink on each source
/// teaches weft the way back; a downlink queued with `data` is encoded by
/// the codec and published on the network server's downlink topic in its
/// JSON, and is `sent` through `ttn-mqtt` / `chirpstack-mqtt`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttn_and_chirpstack_downlinks_go_back_over_their_sources() {
    let url = broker_url();
    let app = unique("dl");
    let cs_app = unique("csdl");
    let mut env = source_env("ttn", "ttn", &url, &format!("v3/{app}@ttn/devices/+/#"));
    env.extend(source_env(
        "cs",
        "chirpstack",
        &url,
        &format!("application/{cs_app}/device/+/event/+"),
    ));
    env.push((
        "WEFT_MQTT__SOURCES__TTN__DEVICE_TYPE".into(),
        "actuator".into(),
    ));
    env.push((
        "WEFT_MQTT__SOURCES__CS__DEVICE_TYPE".into(),
        "actuator".into(),
    ));
    fast(&mut env);
    let server = start(&env);
    let c = server.client();
    actuator_type(&c).await;
    connected(&c, "ttn").await;
    connected(&c, "cs").await;
    let mut network = Mqtt::connect(&url, &unique("ns-"), None).await;
    network
        .subscribe(&format!("v3/{app}@ttn/devices/+/down/#"))
        .await;
    network
        .subscribe(&format!("application/{cs_app}/device/+/command/down"))
        .await;

    // The Things Stack.
    let up = json!({
        "end_device_ids": {"device_id": "valve-1", "application_ids": {"application_id": app}},
        "correlation_ids": [format!("as:up:{}", unique(""))],
        "received_at": "2026-01-02T03:04:05Z",
        "uplink_message": {"f_port": 1, "frm_payload": "AQ=="}
    });
    network
        .publish(&format!("v3/{app}@ttn/devices/valve-1/up"), up.to_string())
        .await;
    registered(&c, "valve-1").await;
    let id = queue(
        &c,
        "valve-1",
        json!({"data": {"command": "ring", "duration": 7}, "confirmed": true, "priority": "HIGH"}),
    )
    .await;
    let (topic, payload) = network.next().await;
    assert_eq!(topic, format!("v3/{app}@ttn/devices/valve-1/down/push"));
    let body: Value = serde_json::from_slice(&payload).unwrap();
    assert_eq!(
        body,
        json!({"downlinks": [{"frm_payload": "AQc=", "f_port": 10, "confirmed": true, "priority": "HIGH"}]})
    );
    let sent = reaching(&c, "valve-1", &id, "sent").await;
    assert_eq!(sent["route"], "ttn-mqtt");

    // ChirpStack v4.
    let eui = format!("{:016x}", crate::mqtt::rand_u64());
    let up = json!({
        "deduplicationId": unique("cs-"), "time": "2026-01-02T03:04:06Z",
        "deviceInfo": {"applicationName": "orchard", "devEui": eui},
        "fPort": 1, "data": "AQ=="
    });
    network
        .publish(
            &format!("application/{cs_app}/device/{eui}/event/up"),
            up.to_string(),
        )
        .await;
    registered(&c, &eui).await;
    let id = queue(
        &c,
        &eui,
        json!({"data": {"command": "ring", "duration": 2}}),
    )
    .await;
    let (topic, payload) = network.next().await;
    assert_eq!(
        topic,
        format!("application/{cs_app}/device/{eui}/command/down")
    );
    let body: Value = serde_json::from_slice(&payload).unwrap();
    assert_eq!(
        body,
        json!({"devEui": eui, "confirmed": false, "fPort": 10, "data": "AQI="})
    );
    let sent = reaching(&c, &eui, &id, "sent").await;
    assert_eq!(sent["route"], "chirpstack-mqtt");
    assert!(
        metric(
            &c,
            "weft_downlinks_sent_total",
            &["route=\"chirpstack-mqtt\""]
        )
        .await
            >= 1.0
    );
    assert!(metric(&c, "weft_downlinks_sent_total", &["route=\"ttn-mqtt\""]).await >= 1.0);
}

/// IoT Agent devices over MQTT, JSON and UltraLight: updating a command
/// attribute publishes the command on `/{apikey}/{device}/cmd`
/// (`ring_status` `DELIVERED` once the broker has it); the device's answer
/// on `…/cmdexe` sets `ring_status` `OK` and `ring_info`. Raw bytes
/// queued through the API go out too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn iot_agent_commands_round_trip_over_mqtt() {
    let url = broker_url();
    let json_key = unique("kj");
    let ul_key = unique("ku");
    let mut env = source_env(
        "iotj",
        "iota-json",
        &url,
        &format!("/json/{json_key}/+/attrs/#"),
    );
    env.push((
        "WEFT_MQTT__SOURCES__IOTJ__API_KEYS".into(),
        format!("{{{json_key}=\"lamp\"}}"),
    ));
    env.extend(source_env(
        "iotu",
        "iota-ul",
        &url,
        &format!("/ul/{ul_key}/+/attrs/#"),
    ));
    env.push((
        "WEFT_MQTT__SOURCES__IOTU__API_KEYS".into(),
        format!("{{{ul_key}=\"lamp\"}}"),
    ));
    fast(&mut env);
    let server = start(&env);
    let c = server.client();
    lamp_type(&c).await;
    connected(&c, "iotj").await;
    connected(&c, "iotu").await;
    let jdev = unique("lampj");
    let udev = unique("lampu");
    let mut device = Mqtt::connect(&url, &unique("dev-"), None).await;
    device.subscribe(&format!("/{json_key}/{jdev}/cmd")).await;
    device.subscribe(&format!("/{ul_key}/{udev}/cmd")).await;

    // IoT Agent JSON.
    device
        .publish(&format!("/json/{json_key}/{jdev}/attrs"), r#"{"level":3}"#)
        .await;
    entity_when(&c, &jdev, |e| e["level"] == 3).await;
    let (status, reply) = c
        .send(
            "PATCH",
            &format!("/v2/entities/{jdev}/attrs"),
            Some(&json!({"ring": {"type": "command", "value": "loud"}})),
            None,
        )
        .await;
    assert_eq!(status, 204, "{reply}");
    let (topic, payload) = device.next().await;
    assert_eq!(topic, format!("/{json_key}/{jdev}/cmd"));
    assert_eq!(
        serde_json::from_slice::<Value>(&payload).unwrap(),
        json!({"ring": "loud"})
    );
    entity_when(&c, &jdev, |e| e["ring_status"] == "DELIVERED").await;
    device
        .publish(
            &format!("/json/{json_key}/{jdev}/cmdexe"),
            r#"{"ring":"rang 3 times"}"#,
        )
        .await;
    let e = entity_when(&c, &jdev, |e| e["ring_status"] == "OK").await;
    assert_eq!(e["ring_info"], "rang 3 times");
    assert_eq!(e["level"], 3);
    // Raw bytes through the queue API.
    let id = queue(&c, &jdev, json!({"fPort": 2, "bytes": "AQI="})).await;
    let (topic, payload) = device.next().await;
    assert_eq!(topic, format!("/{json_key}/{jdev}/cmd"));
    assert_eq!(
        serde_json::from_slice::<Value>(&payload).unwrap(),
        json!({"payload": "AQI=", "fPort": 2})
    );
    let sent = reaching(&c, &jdev, &id, "sent").await;
    assert_eq!(sent["route"], "iot-agent-mqtt");

    // UltraLight 2.0.
    device
        .publish(&format!("/ul/{ul_key}/{udev}/attrs"), "level|4")
        .await;
    entity_when(&c, &udev, |e| e["level"] == 4).await;
    let (status, _) = c
        .send(
            "PATCH",
            &format!("/v2/entities/{udev}/attrs"),
            Some(&json!({"ring": {"type": "command", "value": "soft"}})),
            None,
        )
        .await;
    assert_eq!(status, 204);
    let (topic, payload) = device.next().await;
    assert_eq!(topic, format!("/{ul_key}/{udev}/cmd"));
    assert_eq!(
        String::from_utf8(payload).unwrap(),
        format!("{udev}@ring|soft")
    );
    entity_when(&c, &udev, |e| e["ring_status"] == "DELIVERED").await;
    device
        .publish(
            &format!("/ul/{ul_key}/{udev}/cmdexe"),
            format!("{udev}@ring|done"),
        )
        .await;
    let e = entity_when(&c, &udev, |e| e["ring_status"] == "OK").await;
    assert_eq!(e["ring_info"], "done");
    let id = queue(&c, &udev, json!({"fPort": 2, "bytes": "AQI="})).await;
    let (_, payload) = device.next().await;
    assert_eq!(
        String::from_utf8(payload).unwrap(),
        format!("{udev}@payload|AQI=")
    );
    reaching(&c, &udev, &id, "sent").await;
    assert!(
        metric(
            &c,
            "weft_downlinks_sent_total",
            &["route=\"iot-agent-mqtt\""]
        )
        .await
            >= 4.0
    );
}

/// A device of the embedded broker gets its commands there, and answers
/// there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_broker_devices_get_their_commands() {
    broker_url();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let server = Server::start_with_env(&[
        ("WEFT_MQTT__LISTEN", listen.as_str()),
        ("WEFT_MQTT__API_KEYS", "{k1=\"lamp\"}"),
        ("WEFT_DOWNLINKS__RETRY_INITIAL", "100ms"),
        ("WEFT_DOWNLINKS__RETRY_MAX", "300ms"),
    ]);
    let c = server.client();
    lamp_type(&c).await;
    c.expect(
        201,
        "PUT",
        "/api/v1/devices/lamp-e",
        Some(&json!({"type": "lamp"})),
    )
    .await;
    let (_, reply) = c
        .send("POST", "/api/v1/devices/lamp-e/key", None, None)
        .await;
    let secret = reply["key"].as_str().unwrap().to_string();
    let url = format!("mqtt://{listen}");
    let mut device = Mqtt::connect(&url, "lamp-e", Some(("lamp-e", &secret))).await;
    assert!(device.admitted(Duration::from_secs(10)).await);
    device.subscribe("/k1/lamp-e/cmd").await;
    device
        .publish("/json/k1/lamp-e/attrs", r#"{"level":1}"#)
        .await;
    entity_when(&c, "lamp-e", |e| e["level"] == 1).await;
    let (status, _) = c
        .send(
            "PATCH",
            "/v2/entities/lamp-e/attrs",
            Some(&json!({"ring": {"type": "command", "value": 2}})),
            None,
        )
        .await;
    assert_eq!(status, 204);
    let (topic, payload) = device.next().await;
    assert_eq!(topic, "/k1/lamp-e/cmd");
    assert_eq!(
        serde_json::from_slice::<Value>(&payload).unwrap(),
        json!({"ring": 2})
    );
    device
        .publish("/json/k1/lamp-e/cmdexe", r#"{"ring":"ok"}"#)
        .await;
    let e = entity_when(&c, "lamp-e", |e| e["ring_status"] == "OK").await;
    assert_eq!(e["ring_info"], "ok");
}

/// A broker that is down: the downlink stays queued (with the reason)
/// rather than being lost or marked sent, and is sent once the broker is
/// back; the device, subscribed on a persistent session, receives it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downlink_waits_for_its_broker_to_come_back() {
    broker_url();
    let bin =
        std::env::var("WEFT_TEST_MOSQUITTO").expect("WEFT_TEST_MOSQUITTO (scripts/test-services)");
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("mosquitto.conf");
    let mut text = format!(
        "listener {port} 127.0.0.1\nallow_anonymous true\npersistence true\npersistence_location {}/\n",
        dir.path().display()
    );
    if is_root() {
        text.push_str("user root\n");
    }
    std::fs::write(&conf, text).unwrap();
    let spawn = || {
        std::process::Command::new(&bin)
            .arg("-c")
            .arg(&conf)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("mosquitto starts")
    };
    // SIGTERM: mosquitto saves its sessions (the device's subscription).
    let stop = |broker: &mut std::process::Child| {
        let _ = std::process::Command::new("kill")
            .arg(broker.id().to_string())
            .status();
        let _ = broker.wait();
    };
    let mut broker = spawn();
    let url = format!("mqtt://127.0.0.1:{port}");
    wait_port(port).await;
    let mut env = source_env("iot", "iota-json", &url, "/json/+/+/attrs/#");
    env.push((
        "WEFT_MQTT__SOURCES__IOT__API_KEYS".into(),
        "{k=\"lamp\"}".into(),
    ));
    fast(&mut env);
    let server = start(&env);
    let c = server.client();
    lamp_type(&c).await;
    connected(&c, "iot").await;
    let mut device = Mqtt::connect_with(&url, &unique("lamp-"), None, false).await;
    device.subscribe("/k/lamp-d/cmd").await;
    device
        .publish("/json/k/lamp-d/attrs", r#"{"level":5}"#)
        .await;
    entity_when(&c, "lamp-d", |e| e["level"] == 5).await;

    stop(&mut broker);
    eventually(Duration::from_secs(30), || async {
        (crate::mqtt::source_health(&c, "iot").await["connected"] == false).then_some(())
    })
    .await;
    let id = queue(&c, "lamp-d", json!({"fPort": 3, "bytes": "BQ=="})).await;
    let waiting = eventually(Duration::from_secs(10), || async {
        let (_, reply) = c
            .send("GET", "/api/v1/devices/lamp-d/downlinks", None, None)
            .await;
        reply["downlinks"]
            .as_array()?
            .iter()
            .find(|d| d["id"] == id && d["attempts"].as_u64() >= Some(2))
            .cloned()
    })
    .await;
    assert_eq!(waiting["status"], "queued", "{waiting}");
    assert!(
        waiting["reason"]
            .as_str()
            .unwrap()
            .contains("not connected"),
        "{waiting}"
    );

    let mut broker = spawn();
    wait_port(port).await;
    reaching(&c, "lamp-d", &id, "sent").await;
    let (topic, payload) = device.next().await;
    assert_eq!(topic, "/k/lamp-d/cmd");
    assert_eq!(
        serde_json::from_slice::<Value>(&payload).unwrap(),
        json!({"payload": "BQ==", "fPort": 3})
    );
    stop(&mut broker);
}
