//! Attacks on the uplink journey and its way back (issue 29): an ingest
//! key pinned to a channel writing a device of another channel, on every
//! ingest path and through a decoder that names the device; forged command
//! results; an uplink giving a registered device a second type (over HTTP
//! and the embedded broker's `api_keys`); a reported time that is no time.

use std::time::Duration;

use serde_json::{json, Value};

use crate::mqtt::{free_port, Mqtt};
use crate::util::{eventually, now_ms, Client, Server, ADMIN_KEY, KEY};

/// Makes an API key; its secret.
async fn make_key(admin: &Client, spec: Value) -> String {
    let made = admin.expect(201, "POST", "/api/v1/keys", Some(&spec)).await;
    made["key"].as_str().expect("the secret, once").to_string()
}

/// Registers device `id` of `device_type` in `channel`.
async fn register(c: &Client, id: &str, device_type: &str, channel: &str) {
    c.expect(
        201,
        "PUT",
        &format!("/api/v1/devices/{id}"),
        Some(&json!({"type": device_type, "channel": channel})),
    )
    .await;
}

/// The entity `id` as key-values: its status and body.
async fn entity(c: &Client, id: &str) -> (u16, Value) {
    c.send(
        "GET",
        &format!("/v2/entities/{id}?options=keyValues"),
        None,
        None,
    )
    .await
}

/// Waits for a failed uplink whose body carries `uuid`; returns it.
async fn failure_of(c: &Client, uuid: &str) -> Value {
    eventually(Duration::from_secs(10), || async {
        let f = c.expect(200, "GET", "/api/v1/uplinks/failed", None).await;
        f["failures"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["body"]["uuid"] == uuid || f["body"]["deduplicationId"] == uuid)
            .cloned()
    })
    .await
}

/// A type without a decoder whose mappings take the device from `serial`:
/// only the decoded uplink names its device, never the envelope.
fn tagged_type() -> Value {
    json!({"processor": {"mappings": [
        {"from": "serial", "to": "device.id"},
        {"from": "uuid", "to": "dataId"},
        {"from": "temperature", "to": "temperature"}
    ]}})
}

/// An ingest key pinned to channel `farm` cannot write a device registered
/// in channel `secret`: on sensae's path, the TTN and the ChirpStack
/// webhooks the device named by the envelope is refused at accept (403,
/// nothing stored); a device only the decoder names fails in the pipeline
/// (`Forbidden`). The entity stays as it was. The key writes its own
/// channel's devices, and registers a new device within its pins.
#[tokio::test]
async fn a_pinned_ingest_key_writes_only_devices_within_its_pins() {
    let server = Server::start();
    let admin = server.client();
    admin.create_em300th().await;
    admin
        .expect(
            201,
            "PUT",
            "/api/v1/device-types/tagged",
            Some(&tagged_type()),
        )
        .await;
    register(&admin, "vault1", "em300th", "secret").await;
    register(&admin, "vault2", "tagged", "secret").await;
    register(&admin, "field1", "em300th", "farm").await;
    // The vault's entity as the global ingest key wrote it.
    admin
        .uplink(
            "secret",
            "decoded",
            "em300th",
            &json!({"id": "vault1", "uuid": "v-1", "reported_at": now_ms(), "temperature": 20}),
        )
        .await;
    admin.unit_eventually("v-1").await;

    let farm = make_key(
        &admin,
        json!({"name": "farm", "role": "ingest", "channel": "farm"}),
    )
    .await;
    let bearer = format!("Bearer {farm}");
    let plain = server.client_with(None);

    let sensae = json!({"id": "vault1", "uuid": "x-1", "reported_at": now_ms(), "temperature": 99});
    let (status, reply) = plain
        .send(
            "POST",
            "/sensor-data/farm/decoded/em300th",
            Some(&sensae),
            Some(&farm),
        )
        .await;
    assert_eq!(status, 403, "{reply}");
    let why = reply["description"].as_str().unwrap();
    assert!(
        why.contains("vault1") && why.contains("'secret'") && why.contains("'farm'"),
        "{why}"
    );
    let ttn = json!({"end_device_ids": {"device_id": "vault1"}, "correlation_ids": ["as:up:x-2"],
                     "uplink_message": {"decoded_payload": {"temperature": 99}}});
    let (status, reply) = plain
        .send("POST", "/api/v1/uplinks/ttn", Some(&ttn), Some(&bearer))
        .await;
    assert_eq!(status, 403, "{reply}");
    let chirpstack = json!({"deduplicationId": "x-3", "deviceInfo": {"devEui": "vault1"},
                            "object": {"temperature": 99}});
    let (status, reply) = plain
        .send(
            "POST",
            "/api/v1/uplinks/chirpstack?channel=farm",
            Some(&chirpstack),
            Some(&bearer),
        )
        .await;
    assert_eq!(status, 403, "{reply}");
    // ChirpStack's other events name the device too.
    let (status, _) = plain
        .send(
            "POST",
            "/api/v1/uplinks/chirpstack?event=status",
            Some(&json!({"deviceInfo": {"devEui": "vault1"}, "batteryLevel": 1})),
            Some(&bearer),
        )
        .await;
    assert_eq!(status, 403);

    // Only the decoded uplink names vault2: accepted, then failed.
    let hidden = json!({"serial": "vault2", "uuid": "x-4", "temperature": 99});
    let (status, reply) = plain
        .send(
            "POST",
            "/sensor-data/farm/decoded/tagged",
            Some(&hidden),
            Some(&farm),
        )
        .await;
    assert_eq!(status, 202, "{reply}");
    let failed = failure_of(&admin, "x-4").await;
    assert_eq!(failed["reason"], "Forbidden", "{failed}");
    assert!(
        failed["description"]
            .as_str()
            .unwrap()
            .contains("channel 'secret'"),
        "{failed}"
    );

    // Within its pins: its channel's device, and a new device, which is
    // registered in the key's channel.
    let own = json!({"id": "field1", "uuid": "f-1", "reported_at": now_ms(), "temperature": 5});
    let (status, _) = plain
        .send(
            "POST",
            "/sensor-data/farm/decoded/em300th",
            Some(&own),
            Some(&farm),
        )
        .await;
    assert_eq!(status, 202);
    let (status, _) = plain
        .send(
            "POST",
            "/api/v1/uplinks/ttn?type=tagged",
            Some(&json!({"end_device_ids": {"device_id": "newcomer"},
                         "correlation_ids": ["as:up:n-1"],
                         "uplink_message": {"decoded_payload": {"temperature": 7}}})),
            Some(&bearer),
        )
        .await;
    assert_eq!(status, 202);
    admin.unit_eventually("f-1").await;
    let unit = admin.unit_eventually("as:up:n-1").await;
    assert_eq!(unit["channel"], "farm");
    let newcomer = admin
        .expect(200, "GET", "/api/v1/devices/newcomer", None)
        .await;
    assert_eq!(newcomer["channel"], "farm", "{newcomer}");

    // Nothing of the attacks reached the vault.
    let (_, vault) = entity(&admin, "vault1").await;
    assert_eq!(vault["temperature"], 20, "{vault}");
    assert_eq!(entity(&admin, "vault2").await.0, 404);
    assert_eq!(admin.all_units("device=vault1").await.len(), 1);
}

/// Command results need a credential valid for the device: none at all is
/// 401 even while no ingest key exists; an ingest key pinned to another
/// channel is 403 (by `k` or `Authorization`); an ingest key pinned to the
/// device's channel, and a global admin key, are let in. The forged
/// results change nothing.
#[tokio::test]
async fn command_results_need_a_credential_for_their_device() {
    // No global ingest key, no ingest key yet: ingest still wants a key.
    let server = Server::start_with_env(&[("WEFT_INGEST_KEY", "")]);
    let admin = server.client();
    admin
        .expect(
            201,
            "PUT",
            "/api/v1/device-types/actuator",
            Some(&json!({"commands": ["ring"]})),
        )
        .await;
    register(&admin, "lamp1", "actuator", "secret").await;
    let plain = server.client_with(None);
    let uplink = json!({"id": "lamp1", "uuid": "l-1", "reported_at": now_ms(), "level": 3});
    let path = "/sensor-data/secret/decoded/actuator";
    let (status, _) = plain.send("POST", path, Some(&uplink), None).await;
    assert_eq!(
        status, 401,
        "no ingest without a credential, even with no ingest key"
    );
    let admin_bearer = format!("Bearer {ADMIN_KEY}");
    let (status, _) = plain
        .send("POST", path, Some(&uplink), Some(&admin_bearer))
        .await;
    assert_eq!(status, 202, "the admin key posts uplinks");
    eventually(Duration::from_secs(10), || async {
        (entity(&admin, "lamp1").await.0 == 200).then_some(())
    })
    .await;
    let forged = json!({"ring": "OK, forged"});
    let (status, reply) = plain
        .send("POST", "/iot/json/commands?i=lamp1", Some(&forged), None)
        .await;
    assert_eq!(status, 401, "a command result without credential: {reply}");
    let (status, _) = plain
        .send(
            "POST",
            "/iot/json/commands?i=lamp1&k=guess",
            Some(&forged),
            None,
        )
        .await;
    assert_eq!(status, 401);

    let farm = make_key(
        &admin,
        json!({"name": "farm", "role": "ingest", "channel": "farm"}),
    )
    .await;
    let (status, reply) = plain
        .send(
            "POST",
            &format!("/iot/json/commands?i=lamp1&k={farm}"),
            Some(&forged),
            None,
        )
        .await;
    assert_eq!(status, 403, "{reply}");
    assert!(reply["description"]
        .as_str()
        .unwrap()
        .contains("channel 'secret'"));
    let (status, _) = plain
        .send(
            "POST",
            "/iot/json/commands?i=lamp1",
            Some(&forged),
            Some(&format!("Bearer {farm}")),
        )
        .await;
    assert_eq!(status, 403);
    let (_, lamp) = entity(&admin, "lamp1").await;
    assert!(lamp.get("ring_status").is_none(), "{lamp}");

    // Credentials for the device.
    let secret = make_key(
        &admin,
        json!({"name": "secret", "role": "ingest", "channel": "secret"}),
    )
    .await;
    let (status, reply) = plain
        .send(
            "POST",
            &format!("/iot/json/commands?i=lamp1&k={secret}"),
            Some(&json!({"ring": "rang"})),
            None,
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    let (_, lamp) = entity(&admin, "lamp1").await;
    assert_eq!(lamp["ring_status"], "OK");
    assert_eq!(lamp["ring_info"], "rang");
    let (status, reply) = plain
        .send(
            "POST",
            "/iot/json/commands?i=lamp1",
            Some(&json!({"ring": "rang again"})),
            Some(&format!("Bearer {}", crate::util::ADMIN_KEY)),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    // A read key is no credential for a device.
    let read = make_key(&admin, json!({"name": "r", "role": "read"})).await;
    let (status, _) = plain
        .send(
            "POST",
            &format!("/iot/json/commands?i=lamp1&k={read}"),
            Some(&forged),
            None,
        )
        .await;
    assert_eq!(status, 403);
    let (_, lamp) = entity(&admin, "lamp1").await;
    assert_eq!(lamp["ring_info"], "rang again");
}

/// An uplink naming a registered device with another device type is a
/// failed uplink (`TypeMismatch`); the device keeps one entity, of its
/// type.
#[tokio::test]
async fn a_registered_device_keeps_its_type() {
    let server = Server::start();
    let c = server.client();
    c.create_em300th().await;
    c.expect(201, "PUT", "/api/v1/device-types/other", Some(&json!({})))
        .await;
    register(&c, "th1", "em300th", "farm").await;
    c.uplink(
        "farm",
        "decoded",
        "em300th",
        &json!({"id": "th1", "uuid": "t-1", "reported_at": now_ms(), "temperature": 21}),
    )
    .await;
    c.unit_eventually("t-1").await;
    c.uplink(
        "farm",
        "decoded",
        "other",
        &json!({"id": "th1", "uuid": "t-2", "reported_at": now_ms(), "temperature": 99}),
    )
    .await;
    let failed = failure_of(&c, "t-2").await;
    assert_eq!(failed["reason"], "TypeMismatch", "{failed}");
    let why = failed["description"].as_str().unwrap();
    assert!(
        why.contains("'em300th'") && why.contains("'other'"),
        "{why}"
    );
    let (status, th1) = entity(&c, "th1").await;
    assert_eq!(status, 200, "one entity: {th1}");
    assert_eq!(th1["temperature"], 21);
    assert_eq!(th1["type"], "TemperatureSensor");
}

/// The embedded broker's `api_keys` name a type for a topic's API key: a
/// registered device publishing under a key of another type gets no second
/// entity; the uplink fails (`TypeMismatch`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_key_of_another_type_gives_a_device_no_second_entity() {
    let listen = format!("127.0.0.1:{}", free_port());
    let server = Server::start_with_env(&[
        ("WEFT_MQTT__LISTEN", &listen),
        ("WEFT_MQTT__API_KEYS", "{k1=\"thermo\"}"),
    ]);
    let c = server.client();
    for t in ["thermo", "lamp"] {
        c.expect(
            201,
            "PUT",
            &format!("/api/v1/device-types/{t}"),
            Some(&json!({})),
        )
        .await;
    }
    register(&c, "lamp7", "lamp", "").await;
    let (status, reply) = c
        .send("POST", "/api/v1/devices/lamp7/key", None, None)
        .await;
    assert_eq!(status, 201, "{reply}");
    let key = reply["key"].as_str().unwrap().to_string();
    let mut device =
        Mqtt::connect(&format!("mqtt://{listen}"), "lamp7", Some(("lamp7", &key))).await;
    assert!(device.admitted(Duration::from_secs(10)).await);
    // Its own type first (a key `api_keys` does not list), then thermo's.
    device
        .publish("/json/k9/lamp7/attrs", r#"{"level":1}"#)
        .await;
    eventually(Duration::from_secs(15), || async {
        (entity(&c, "lamp7").await.1["level"] == 1).then_some(())
    })
    .await;
    device
        .publish("/json/k1/lamp7/attrs", r#"{"level":2}"#)
        .await;
    let failed = eventually(Duration::from_secs(15), || async {
        let f = c.expect(200, "GET", "/api/v1/uplinks/failed", None).await;
        f["failures"].as_array().unwrap().first().cloned()
    })
    .await;
    assert_eq!(failed["reason"], "TypeMismatch", "{failed}");
    let (status, lamp) = entity(&c, "lamp7").await;
    assert_eq!(status, 200, "one entity: {lamp}");
    assert_eq!(
        (lamp["type"].clone(), lamp["level"].clone()),
        (json!("lamp"), json!(1))
    );
}

/// A reported time weft cannot read fails the uplink with the reason,
/// instead of being replaced by the arrival time; RFC 3339 date-times and
/// epoch milliseconds are read.
#[tokio::test]
async fn an_unreadable_reported_time_fails_the_uplink() {
    let server = Server::start();
    let c = server.client();
    c.create_em300th().await;
    let body = |uuid: &str, at: Value| json!({"id": "clock1", "uuid": uuid, "reported_at": at, "temperature": 1});
    c.uplink(
        "farm",
        "decoded",
        "em300th",
        &body("r-1", json!("2026-01-01")),
    )
    .await;
    let failed = failure_of(&c, "r-1").await;
    assert_eq!(failed["reason"], "InvalidUplink", "{failed}");
    let why = failed["description"].as_str().unwrap();
    assert!(
        why.contains("reported_at") && why.contains("2026-01-01"),
        "{why}"
    );
    c.uplink(
        "farm",
        "decoded",
        "em300th",
        &body("r-2", json!("2026-01-01T10:00:00Z")),
    )
    .await;
    assert_eq!(
        c.unit_eventually("r-2").await["reportedAt"],
        1_767_261_600_000i64
    );
    c.uplink(
        "farm",
        "decoded",
        "em300th",
        &body("r-3", json!(1_767_261_600_123i64)),
    )
    .await;
    assert_eq!(
        c.unit_eventually("r-3").await["reportedAt"],
        1_767_261_600_123i64
    );
    // TTN's own time, unreadable, fails the same way.
    let (status, _) = c
        .send(
            "POST",
            "/api/v1/uplinks/ttn?type=em300th",
            Some(
                &json!({"end_device_ids": {"device_id": "clock1"}, "received_at": "soon",
                         "correlation_ids": ["as:up:r-4"],
                         "uplink_message": {"f_port": 85, "frm_payload": "AXVc"}}),
            ),
            Some(KEY),
        )
        .await;
    assert_eq!(status, 202);
    let failed = eventually(Duration::from_secs(10), || async {
        let f = c.expect(200, "GET", "/api/v1/uplinks/failed", None).await;
        f["failures"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["format"] == "ttn")
            .cloned()
    })
    .await;
    assert!(
        failed["description"]
            .as_str()
            .unwrap()
            .contains("received_at"),
        "{failed}"
    );
}
