//! The embedded broker (`[mqtt] listen`) with real MQTT clients (rumqttc):
//! a device publishing on another device's topic is refused and
//! disconnected; every QoS 1 message a device got a PUBACK for survives
//! kill -9; a command queued while its device is offline reaches it once
//! it connects and subscribes; commands go at the QoS the device
//! subscribed with.

use std::collections::HashMap;
use std::time::Duration;

use rumqttc::{AsyncClient, Event, EventLoop, MqttOptions, Outgoing, Packet, QoS};
use serde_json::{json, Value};

use crate::mqtt::{free_port, metric, Mqtt};
use crate::util::{eventually, Client, Server};

/// Starts weft with the embedded broker on a free port; returns the
/// server, its broker's `host:port`, and the environment (for a restart).
fn start_broker(extra: &[(&str, &str)]) -> (Server, String, Vec<(String, String)>) {
    let listen = format!("127.0.0.1:{}", free_port());
    let mut env = vec![
        ("WEFT_MQTT__LISTEN".to_string(), listen.clone()),
        (
            "WEFT_MQTT__API_KEYS".to_string(),
            "{k1=\"thermo\"}".to_string(),
        ),
    ];
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    (Server::start_with_env(&pairs), listen, env)
}

/// Registers device `id` of type `thermo` and returns its key.
async fn device_with_key(c: &Client, id: &str) -> String {
    device_of_type_with_key(c, id, "thermo", json!({})).await
}

/// Puts device type `device_type` (as `type_body`), registers device `id`
/// of that type and returns the device's key.
async fn device_of_type_with_key(
    c: &Client,
    id: &str,
    device_type: &str,
    type_body: Value,
) -> String {
    let path = format!("/api/v1/device-types/{device_type}");
    let (status, reply) = c.send("PUT", &path, Some(&type_body), None).await;
    assert!(matches!(status, 200 | 201 | 204), "{status} {reply}");
    c.expect(
        201,
        "PUT",
        &format!("/api/v1/devices/{id}"),
        Some(&json!({"type": device_type})),
    )
    .await;
    let (status, reply) = c
        .send("POST", &format!("/api/v1/devices/{id}/key"), None, None)
        .await;
    assert_eq!(status, 201, "{reply}");
    reply["key"].as_str().unwrap().to_string()
}

/// A raw client logged in as `device`, for tests that watch its packets.
fn raw_client(listen: &str, device: &str, key: &str) -> (AsyncClient, EventLoop) {
    let (host, port) = listen.rsplit_once(':').unwrap();
    let mut options = MqttOptions::new(device, host, port.parse().unwrap());
    options.set_keep_alive(Duration::from_secs(30));
    options.set_credentials(device, key);
    AsyncClient::new(options, 256)
}

/// The entity `id` as key-values, if it exists.
async fn entity(c: &Client, id: &str) -> Option<Value> {
    let (status, e) = c
        .send(
            "GET",
            &format!("/v2/entities/{id}?options=keyValues"),
            None,
            None,
        )
        .await;
    (status == 200).then_some(e)
}

/// A device logged in with its own key publishes on another device's
/// topic: it gets no PUBACK, its connection is closed, nothing is stored
/// for the other device, and the message is counted refused. Its own
/// topics still work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_cannot_publish_as_another_device() {
    let (server, listen, _) = start_broker(&[]);
    let c = server.client();
    let key_a = device_with_key(&c, "dev-a").await;
    device_with_key(&c, "dev-b").await;

    let (client, mut events) = raw_client(&listen, "dev-a", &key_a);
    client
        .publish(
            "/json/k1/dev-b/attrs",
            QoS::AtLeastOnce,
            false,
            r#"{"t":99}"#,
        )
        .await
        .unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            match events.poll().await {
                Ok(Event::Incoming(Packet::PubAck(_))) => return "acknowledged",
                Ok(_) => {}
                Err(_) => return "disconnected",
            }
        }
    })
    .await
    .expect("an answer from the broker within 15 s");
    assert_eq!(ended, "disconnected");
    drop((client, events));
    eventually(Duration::from_secs(10), || async {
        (metric(
            &c,
            "weft_mqtt_messages_total",
            &["source=\"broker\"", "outcome=\"refused\""],
        )
        .await
            >= 1.0)
            .then_some(())
    })
    .await;

    // The same device on its own topic: stored. By then the refused
    // message, published first, would have been stored too.
    let url = format!("mqtt://{listen}");
    let mut own = Mqtt::connect(&url, "dev-a", Some(("dev-a", &key_a))).await;
    assert!(own.admitted(Duration::from_secs(10)).await);
    own.publish("/json/k1/dev-a/attrs", r#"{"t":1}"#).await;
    eventually(Duration::from_secs(15), || async {
        entity(&c, "dev-a")
            .await
            .filter(|e| e["t"] == json!(1))
            .map(|_| ())
    })
    .await;
    assert_eq!(entity(&c, "dev-b").await, None, "stored as dev-b");
    assert_eq!(c.all_units("device=dev-b").await.len(), 0);
}

/// kill -9 while a device streams QoS 1 messages: after the restart on the
/// same data directory, every message the device got a PUBACK for is
/// stored, each once. (A message committed but not yet acknowledged may
/// be stored too: the device did not hear it was, and would send it
/// again.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_message_survives_kill_9() {
    let (mut server, listen, env) = start_broker(&[]);
    let c = server.client();
    let key = device_with_key(&c, "dev-k").await;
    let (client, mut events) = raw_client(&listen, "dev-k", &key);
    // Publishes far more than will be acknowledged before the kill, so
    // messages are in flight when it lands.
    let publisher = tokio::spawn(async move {
        for n in 0..2_000u32 {
            if client
                .publish(
                    "/json/k1/dev-k/attrs",
                    QoS::AtLeastOnce,
                    false,
                    json!({ "n": n }).to_string(),
                )
                .await
                .is_err()
            {
                return;
            }
        }
    });
    // Packet ids are reused only once acknowledged, so the id of each
    // outgoing PUBLISH names its message until its PUBACK.
    let mut sent = 0u32;
    let mut in_flight: HashMap<u16, u32> = HashMap::new();
    let mut acked: Vec<u32> = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), async {
        while acked.len() < 40 {
            match events.poll().await.expect("the broker is up") {
                Event::Outgoing(Outgoing::Publish(pkid)) => {
                    in_flight.insert(pkid, sent);
                    sent += 1;
                }
                Event::Incoming(Packet::PubAck(ack)) => {
                    acked.push(
                        in_flight
                            .remove(&ack.pkid)
                            .expect("a PUBACK of a sent message"),
                    );
                }
                _ => {}
            }
        }
    })
    .await
    .expect("40 PUBACKs within 60 s");
    // Right after a PUBACK: with an acknowledgement sent before the commit
    // this is when a message would be lost.
    server.kill9();
    publisher.abort();
    drop(events);
    server.restart_with_env(&env);
    let c = server.client();

    let n_of = |u: &Value| u["measures"]["n"].as_u64();
    let units = eventually(Duration::from_secs(30), || async {
        let units = c.all_units("device=dev-k").await;
        let stored: Vec<u64> = units.iter().filter_map(n_of).collect();
        acked
            .iter()
            .all(|n| stored.contains(&u64::from(*n)))
            .then_some(units)
    })
    .await;
    for n in &acked {
        let copies = units
            .iter()
            .filter(|u| n_of(u) == Some(u64::from(*n)))
            .count();
        assert_eq!(copies, 1, "message {n} stored {copies} times");
    }
}

/// A command for a device that is not connected stays queued (it is not
/// published to no one and marked sent); once the device connects and
/// subscribes, it gets the command at QoS 1 and it is `DELIVERED`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_waits_for_its_device_to_connect() {
    let (server, listen, _) = start_broker(&[
        ("WEFT_DOWNLINKS__RETRY_INITIAL", "100ms"),
        ("WEFT_DOWNLINKS__RETRY_MAX", "300ms"),
    ]);
    let c = server.client();
    let secret =
        device_of_type_with_key(&c, "lamp-w", "lampb", json!({"commands": ["ring"]})).await;
    let url = format!("mqtt://{listen}");
    // One uplink (on an API key not in `api_keys`: the device's own type),
    // so weft knows the way back to the device, then away.
    {
        let mut device = Mqtt::connect(&url, "lamp-w", Some(("lamp-w", &secret))).await;
        assert!(device.admitted(Duration::from_secs(10)).await);
        device
            .publish("/json/lk/lamp-w/attrs", r#"{"level":1}"#)
            .await;
        eventually(Duration::from_secs(15), || async {
            entity(&c, "lamp-w")
                .await
                .filter(|e| e["level"] == json!(1))
                .map(|_| ())
        })
        .await;
    }
    let (status, body) = c
        .send(
            "PATCH",
            "/v2/entities/lamp-w/attrs",
            Some(&json!({"ring": {"type": "command", "value": 3}})),
            None,
        )
        .await;
    assert_eq!(status, 204, "{body}");
    // Offline: attempted and kept pending, never DELIVERED.
    eventually(Duration::from_secs(15), || async {
        let (_, downlinks) = c
            .send("GET", "/api/v1/devices/lamp-w/downlinks", None, None)
            .await;
        downlinks["downlinks"]
            .as_array()
            .and_then(|d| d.first())
            .filter(|d| d["attempts"].as_u64().unwrap_or(0) >= 1 && d["status"] != "sent")
            .map(|_| ())
    })
    .await;
    assert_ne!(
        entity(&c, "lamp-w").await.unwrap()["ring_status"],
        json!("DELIVERED")
    );

    let mut device = Mqtt::connect(&url, "lamp-w", Some(("lamp-w", &secret))).await;
    assert!(device.admitted(Duration::from_secs(10)).await);
    device.subscribe("/lk/lamp-w/cmd").await;
    let (topic, payload) = device.next().await;
    assert_eq!(topic, "/lk/lamp-w/cmd");
    assert_eq!(
        serde_json::from_slice::<Value>(&payload).unwrap(),
        json!({"ring": 3})
    );
    eventually(Duration::from_secs(15), || async {
        entity(&c, "lamp-w")
            .await
            .filter(|e| e["ring_status"] == json!("DELIVERED"))
            .map(|_| ())
    })
    .await;
}

/// A device that subscribed to its command topic at QoS 0 gets its
/// commands at QoS 0 (nothing to acknowledge: `DELIVERED` once written).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_subscribed_at_qos_0_gets_its_commands_at_qos_0() {
    let (server, listen, _) = start_broker(&[]);
    let c = server.client();
    let secret =
        device_of_type_with_key(&c, "lamp-q", "lampq", json!({"commands": ["ring"]})).await;
    let (client, mut events) = raw_client(&listen, "lamp-q", &secret);
    client
        .subscribe("/lk/lamp-q/cmd", QoS::AtMostOnce)
        .await
        .unwrap();
    client
        .publish(
            "/json/lk/lamp-q/attrs",
            QoS::AtLeastOnce,
            false,
            r#"{"level":1}"#,
        )
        .await
        .unwrap();
    let watcher = c.clone();
    let received = tokio::spawn(async move {
        loop {
            match events.poll().await {
                Ok(Event::Incoming(Packet::Publish(p))) => return p,
                Ok(_) => {}
                Err(e) => panic!("the connection failed: {e}"),
            }
        }
    });
    eventually(Duration::from_secs(15), || async {
        entity(&watcher, "lamp-q")
            .await
            .filter(|e| e["level"] == json!(1))
            .map(|_| ())
    })
    .await;
    let (status, body) = c
        .send(
            "PATCH",
            "/v2/entities/lamp-q/attrs",
            Some(&json!({"ring": {"type": "command", "value": 1}})),
            None,
        )
        .await;
    assert_eq!(status, 204, "{body}");
    let publish = tokio::time::timeout(Duration::from_secs(15), received)
        .await
        .expect("a command within 15 s")
        .unwrap();
    assert_eq!(
        (publish.topic.as_str(), publish.qos),
        ("/lk/lamp-q/cmd", QoS::AtMostOnce)
    );
    eventually(Duration::from_secs(15), || async {
        entity(&c, "lamp-q")
            .await
            .filter(|e| e["ring_status"] == json!("DELIVERED"))
            .map(|_| ())
    })
    .await;
    drop(client);
}
