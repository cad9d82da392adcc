//! MQTT in and out, against a real mosquitto (`WEFT_TEST_MQTT_URL`, started
//! by scripts/test-services): each source format decoded and stored; bad
//! payloads refused and counted without stopping a source; kill -9 between
//! the broker's delivery and the commit; a broker restart; Orion's `mqtt`
//! and `mqttCustom` notifications received by a real subscriber; the
//! embedded broker with good and bad device credentials.

use std::time::Duration;

use rumqttc::{AsyncClient, Event, EventLoop, MqttOptions, Packet, QoS};
use serde_json::{json, Value};

use crate::util::{eventually, Client, Server, EM300TH_JS, KEY};

/// The test broker's URL; the suite fails without one.
pub(crate) fn broker_url() -> String {
    std::env::var("WEFT_TEST_MQTT_URL").expect(
        "WEFT_TEST_MQTT_URL is not set: start the test services (eval \"$(scripts/test-services start)\")",
    )
}

/// Host and port of an `mqtt://` URL.
pub(crate) fn host_port(url: &str) -> (String, u16) {
    let rest = url.strip_prefix("mqtt://").expect("an mqtt:// URL");
    let (host, port) = rest.rsplit_once(':').expect("a port");
    (host.to_string(), port.parse().expect("a port number"))
}

/// A name no other test uses, for topics and client ids on the shared broker.
pub(crate) fn unique(prefix: &str) -> String {
    format!(
        "{prefix}{}",
        &uuid::Uuid::new_v4().simple().to_string()[..10]
    )
}

/// An MQTT client of the test broker, its event loop driven by a task.
pub(crate) struct Mqtt {
    client: AsyncClient,
    messages: tokio::sync::mpsc::UnboundedReceiver<(String, Vec<u8>)>,
    connack: tokio::sync::watch::Receiver<Option<rumqttc::ConnectReturnCode>>,
}

impl Mqtt {
    /// Connects to `url` (as `credentials`, if any) and waits for the
    /// broker's answer.
    pub(crate) async fn connect(
        url: &str,
        client_id: &str,
        credentials: Option<(&str, &str)>,
    ) -> Mqtt {
        Self::connect_with(url, client_id, credentials, true).await
    }

    /// Connects with a persistent session (`clean_session = false`) when
    /// `clean` is false: the broker keeps its subscriptions and queued
    /// QoS 1 messages while it is away.
    pub(crate) async fn connect_with(
        url: &str,
        client_id: &str,
        credentials: Option<(&str, &str)>,
        clean: bool,
    ) -> Mqtt {
        let (host, port) = host_port(url);
        let mut options = MqttOptions::new(client_id, host, port);
        options.set_keep_alive(Duration::from_secs(30));
        options.set_clean_session(clean);
        if let Some((user, password)) = credentials {
            options.set_credentials(user, password);
        }
        let (client, events) = AsyncClient::new(options, 64);
        let (tx, messages) = tokio::sync::mpsc::unbounded_channel();
        let (connack_tx, connack) = tokio::sync::watch::channel(None);
        tokio::spawn(drive(events, tx, connack_tx));
        Mqtt {
            client,
            messages,
            connack,
        }
    }

    /// Whether the broker admits the client: a successful CONNACK within
    /// `wait` (a refusal is a CONNACK with an error code, or the
    /// connection closed without one).
    pub(crate) async fn admitted(&mut self, wait: Duration) -> bool {
        tokio::time::timeout(wait, async {
            loop {
                if let Some(code) = *self.connack.borrow_and_update() {
                    return code == rumqttc::ConnectReturnCode::Success;
                }
                if self.connack.changed().await.is_err() {
                    return false;
                }
            }
        })
        .await
        .unwrap_or(false)
    }

    pub(crate) async fn publish(&self, topic: &str, payload: impl Into<Vec<u8>>) {
        self.client
            .publish(topic, QoS::AtLeastOnce, false, payload.into())
            .await
            .expect("published");
    }

    pub(crate) async fn subscribe(&mut self, filter: &str) {
        self.client
            .subscribe(filter, QoS::AtLeastOnce)
            .await
            .expect("subscribed");
        // SUBACK before anything is published to the filter.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    /// The next message, within 10 s.
    pub(crate) async fn next(&mut self) -> (String, Vec<u8>) {
        tokio::time::timeout(Duration::from_secs(10), self.messages.recv())
            .await
            .expect("a message within 10 s")
            .expect("the client runs")
    }
}

/// Polls a test client's event loop, passing on messages and the CONNACK.
pub(crate) async fn drive(
    mut events: EventLoop,
    tx: tokio::sync::mpsc::UnboundedSender<(String, Vec<u8>)>,
    connack: tokio::sync::watch::Sender<Option<rumqttc::ConnectReturnCode>>,
) {
    loop {
        match events.poll().await {
            Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                let _ = connack.send(Some(ack.code));
            }
            Ok(Event::Incoming(Packet::Publish(p))) => {
                if tx.send((p.topic.clone(), p.payload.to_vec())).is_err() {
                    return;
                }
            }
            Ok(_) => {}
            Err(rumqttc::ConnectionError::ConnectionRefused(code)) => {
                let _ = connack.send(Some(code));
                return;
            }
            Err(_) => {
                if tx.is_closed() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// The value of the Prometheus sample `name{…labels…}` (0 when absent).
pub(crate) async fn metric(c: &Client, name: &str, labels: &[&str]) -> f64 {
    let text = c.metrics().await.expect("metrics");
    text.lines()
        .filter(|l| l.starts_with(name) && labels.iter().all(|lab| l.contains(lab)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `/health`'s view of source `name`.
pub(crate) async fn source_health(c: &Client, name: &str) -> Value {
    let (_, health) = c.send("GET", "/health", None, None).await;
    health["mqtt"]["sources"][name].clone()
}

/// Waits until source `name` is connected (subscribed a moment later).
pub(crate) async fn connected(c: &Client, name: &str) {
    eventually(Duration::from_secs(20), || async {
        (source_health(c, name).await["connected"] == true).then_some(())
    })
    .await;
    // The SUBSCRIBE follows the CONNACK.
    tokio::time::sleep(Duration::from_millis(500)).await;
}

/// Environment naming source `name` of `format` on `url` with its topic.
pub(crate) fn source_env(
    name: &str,
    format: &str,
    url: &str,
    topic: &str,
) -> Vec<(String, String)> {
    let key = |k: &str| format!("WEFT_MQTT__SOURCES__{}__{k}", name.to_uppercase());
    vec![
        (key("URL"), url.to_string()),
        (key("FORMAT"), format.to_string()),
        (key("TOPIC"), topic.to_string()),
        (key("CLIENT_ID"), unique("weft-test-")),
    ]
}

pub(crate) fn start(env: &[(String, String)]) -> Server {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    Server::start_with_env(&env)
}

async fn em300th(c: &Client) {
    c.expect(
        201,
        "PUT",
        "/api/v1/device-types/em300th",
        Some(&json!({"decoder": {"script": EM300TH_JS}})),
    )
    .await;
}

/// The Things Stack's and ChirpStack's MQTT integrations: uplinks are
/// decoded and stored exactly as from their webhooks, `join` and other
/// messages kept as device events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttn_and_chirpstack_topics_are_stored_as_their_webhooks_are() {
    let url = broker_url();
    let app = unique("farm");
    let cs_app = unique("");
    let mut env = source_env("ttn", "ttn", &url, &format!("v3/{app}@ttn/devices/+/#"));
    env.extend(source_env(
        "cs",
        "chirpstack",
        &url,
        &format!("application/{cs_app}/device/+/event/+"),
    ));
    let server = start(&env);
    let c = server.client();
    em300th(&c).await;
    connected(&c, "ttn").await;
    connected(&c, "cs").await;

    let device = unique("eui-");
    let up_id = format!("as:up:{}", unique(""));
    let ttn_up = json!({
        "end_device_ids": {"device_id": device, "application_ids": {"application_id": app},
                           "dev_eui": "A84041000181D2A5"},
        "correlation_ids": [up_id],
        "received_at": "2026-01-02T03:04:05.678Z",
        "uplink_message": {"f_port": 85, "f_cnt": 7, "frm_payload": "AXVcA2c0AQRoZQ==",
                           "version_ids": {"model_id": "em300th"}}
    });
    let ttn_join = json!({
        "end_device_ids": {"device_id": device, "application_ids": {"application_id": app},
                           "dev_addr": "260B1234"},
        "received_at": "2026-01-02T03:00:00Z",
        "join_accept": {"session_key_id": "AYZ"}
    });
    let publisher = Mqtt::connect(&url, &unique("pub-"), None).await;
    let base = format!("v3/{app}@ttn/devices/{device}");
    publisher
        .publish(&format!("{base}/join"), ttn_join.to_string())
        .await;
    publisher
        .publish(&format!("{base}/up"), ttn_up.to_string())
        .await;
    // weft's own downlink topic is not an uplink.
    publisher
        .publish(&format!("{base}/down/push"), r#"{"downlinks":[]}"#)
        .await;

    let unit = c.unit_eventually(&up_id).await;
    assert_eq!(unit["device"]["id"], device.as_str());
    assert_eq!(unit["device"]["type"], "em300th");
    assert_eq!(unit["channel"], app.as_str());
    assert!(unit["measures"].as_object().is_some_and(|m| !m.is_empty()));
    let state = eventually(Duration::from_secs(10), || async {
        let (status, d) = c
            .send("GET", &format!("/api/v1/devices/{device}"), None, None)
            .await;
        (status == 200 && d["state"]["join"].is_object()).then_some(d["state"].clone())
    })
    .await;
    assert_eq!(state["join"]["devAddr"], "260B1234");

    let eui = format!("{:016x}", rand_u64());
    let cs_up = json!({
        "deduplicationId": unique("cs-"), "time": "2026-01-02T03:04:06Z",
        "deviceInfo": {"applicationName": "orchard", "deviceProfileName": "em300th",
                       "deviceName": "north", "devEui": eui},
        "fPort": 85, "data": "AXVcA2c0AQRoZQ=="
    });
    let cs_status = json!({
        "deduplicationId": unique("cs-"), "time": "2026-01-02T03:05:00Z",
        "deviceInfo": {"devEui": eui}, "margin": 7, "batteryLevel": 75.5
    });
    let base = format!("application/{cs_app}/device/{eui}/event");
    publisher
        .publish(&format!("{base}/up"), cs_up.to_string())
        .await;
    publisher
        .publish(&format!("{base}/status"), cs_status.to_string())
        .await;
    let unit = c
        .unit_eventually(cs_up["deduplicationId"].as_str().unwrap())
        .await;
    assert_eq!(unit["device"]["id"], eui.as_str());
    assert_eq!(unit["channel"], "orchard");
    let state = eventually(Duration::from_secs(10), || async {
        let (status, d) = c
            .send("GET", &format!("/api/v1/devices/{eui}"), None, None)
            .await;
        (status == 200 && d["state"]["status"].is_object()).then_some(d["state"].clone())
    })
    .await;
    assert_eq!(state["status"]["batteryLevel"], 75.5);
    assert!(
        metric(
            &c,
            "weft_mqtt_messages_total",
            &["source=\"ttn\"", "outcome=\"committed\""]
        )
        .await
            >= 2.0
    );
}

pub(crate) fn rand_u64() -> u64 {
    u64::from_str_radix(&uuid::Uuid::new_v4().simple().to_string()[..15], 16).unwrap()
}

/// IoT-Agent JSON and UltraLight topics and a plain topic bound to a
/// device type: each message becomes the device's unit and entity; a
/// malformed one is refused and counted, and the source carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn iot_agent_and_plain_topics_are_stored_and_bad_payloads_counted() {
    let url = broker_url();
    let key = unique("k");
    let site = unique("site");
    let mut env = source_env("j", "iota-json", &url, &format!("/json/{key}/+/attrs/#"));
    env.extend(source_env(
        "u",
        "iota-ul",
        &url,
        &format!("/ul/{key}/+/attrs/#"),
    ));
    env.extend(source_env("p", "plain", &url, &format!("{site}/+/data")));
    env.push((
        "WEFT_MQTT__SOURCES__J__API_KEYS".into(),
        format!("{{{key}=\"thermo\"}}"),
    ));
    env.push((
        "WEFT_MQTT__SOURCES__U__API_KEYS".into(),
        format!("{{{key}=\"thermo\"}}"),
    ));
    env.push((
        "WEFT_MQTT__SOURCES__P__DEVICE_TYPE".into(),
        "em300th".into(),
    ));
    env.push(("WEFT_MQTT__SOURCES__P__F_PORT".into(), "85".into()));
    let server = start(&env);
    let c = server.client();
    em300th(&c).await;
    c.expect(201, "PUT", "/api/v1/device-types/thermo", Some(&json!({})))
        .await;
    for s in ["j", "u", "p"] {
        connected(&c, s).await;
    }
    let publisher = Mqtt::connect(&url, &unique("pub-"), None).await;
    let (dj, du, dp) = (unique("dj"), unique("du"), unique("dp"));
    publisher
        .publish(&format!("/json/{key}/{dj}/attrs"), r#"{"t":21.5,"s":"on"}"#)
        .await;
    publisher
        .publish(&format!("/json/{key}/{dj}/attrs"), "not json")
        .await;
    publisher
        .publish(&format!("/json/{key}/{dj}/attrs/h"), "40")
        .await;
    publisher
        .publish(&format!("/ul/{key}/{du}/attrs"), "t|19|s|off#t|20")
        .await;
    publisher
        .publish(&format!("/ul/{key}/{du}/attrs"), "t|1|dangling")
        .await;
    publisher
        .publish(
            &format!("{site}/{dp}/data"),
            vec![0x01, 0x75, 0x5c, 0x03, 0x67, 0x34, 0x01, 0x04, 0x68, 0x65],
        )
        .await;

    let entity = |id: String| {
        let c = c.clone();
        async move {
            eventually(Duration::from_secs(15), || async {
                let (status, e) = c
                    .send(
                        "GET",
                        &format!("/v2/entities/{id}?options=keyValues"),
                        None,
                        None,
                    )
                    .await;
                (status == 200).then_some(e)
            })
            .await
        }
    };
    let j = eventually(Duration::from_secs(15), || async {
        let e = entity(dj.clone()).await;
        (e.get("h").is_some()).then_some(e)
    })
    .await;
    assert_eq!(
        (
            j["type"].clone(),
            j["t"].clone(),
            j["s"].clone(),
            j["h"].clone()
        ),
        (json!("thermo"), json!(21.5), json!("on"), json!(40))
    );
    let u = eventually(Duration::from_secs(15), || async {
        let units = c.all_units(&format!("device={du}")).await;
        (units.len() == 2).then_some(units)
    })
    .await;
    let temps: Vec<Value> = u.iter().map(|u| u["measures"]["t"].clone()).collect();
    assert!(
        temps.contains(&json!(19)) && temps.contains(&json!(20)),
        "{u:?}"
    );
    let p = entity(dp.clone()).await;
    assert_eq!(p["type"], "em300th");
    assert!(p.as_object().unwrap().len() > 3, "decoded measures: {p}");

    let refused = metric(&c, "weft_mqtt_messages_total", &["outcome=\"refused\""]).await;
    assert_eq!(refused, 2.0);
    assert_eq!(source_health(&c, "j").await["connected"], true);
    // The source still works after the bad message.
    publisher
        .publish(&format!("/json/{key}/{dj}/attrs"), r#"{"t":30}"#)
        .await;
    eventually(Duration::from_secs(15), || async {
        (entity(dj.clone()).await["t"] == json!(30)).then_some(())
    })
    .await;
}

/// kill -9 after the broker delivered a message but before weft committed
/// it: the broker delivers it again to the restarted weft, which stores it
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_delivered_but_not_committed_survives_kill_9() {
    let url = broker_url();
    let app = unique("crash");
    let mut env = source_env("ttn", "ttn", &url, &format!("v3/{app}@ttn/devices/+/#"));
    // The client id must stay the same across the restart: the session
    // holding the unacknowledged message is the broker's under it.
    let delay_key = "WEFT_MQTT__SOURCES__TTN__TEST_COMMIT_DELAY".to_string();
    env.push((delay_key.clone(), "30s".into()));
    let mut server = start(&env);
    let c = server.client();
    em300th(&c).await;
    connected(&c, "ttn").await;

    let up_id = format!("as:up:{}", unique(""));
    let body = json!({
        "end_device_ids": {"device_id": "crash-dev", "application_ids": {"application_id": app}},
        "correlation_ids": [up_id], "received_at": "2026-01-02T03:04:05Z",
        "uplink_message": {"f_port": 85, "frm_payload": "AXVcA2c0AQRoZQ==",
                           "version_ids": {"model_id": "em300th"}}
    });
    let publisher = Mqtt::connect(&url, &unique("pub-"), None).await;
    publisher
        .publish(
            &format!("v3/{app}@ttn/devices/crash-dev/up"),
            body.to_string(),
        )
        .await;
    eventually(Duration::from_secs(10), || async {
        (metric(&c, "weft_mqtt_messages_total", &["outcome=\"received\""]).await >= 1.0)
            .then_some(())
    })
    .await;
    assert_eq!(
        metric(&c, "weft_mqtt_messages_total", &["outcome=\"committed\""]).await,
        0.0
    );
    server.kill9();
    // The same data, client id and topic; no commit delay this time.
    env.retain(|(k, _)| *k != delay_key);
    server.restart_with_env(&env);
    let c = server.client();
    let unit = c.unit_eventually(&up_id).await;
    assert_eq!(unit["device"]["id"], "crash-dev");
    // Published again (a duplicate from the device's side): still once.
    publisher
        .publish(
            &format!("v3/{app}@ttn/devices/crash-dev/up"),
            body.to_string(),
        )
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(c.all_units("device=crash-dev").await.len(), 1);
}

/// A broker that goes away and comes back: `/health` shows the source
/// down with the error, then up again, and messages flow again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_reconnects_after_its_broker_restarts() {
    broker_url();
    let bin =
        std::env::var("WEFT_TEST_MOSQUITTO").expect("WEFT_TEST_MOSQUITTO (scripts/test-services)");
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("mosquitto.conf");
    let mut text = format!("listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n");
    if std::env::var("USER").as_deref() == Ok("root") || is_root() {
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
    let mut broker = spawn();
    let url = format!("mqtt://127.0.0.1:{port}");
    wait_port(port).await;
    let server = start(
        &source_env("iot", "iota-json", &url, "/json/+/+/attrs/#")
            .into_iter()
            .chain([(
                "WEFT_MQTT__SOURCES__IOT__DEVICE_TYPE".to_string(),
                "thermo".to_string(),
            )])
            .collect::<Vec<_>>(),
    );
    let c = server.client();
    c.expect(201, "PUT", "/api/v1/device-types/thermo", Some(&json!({})))
        .await;
    connected(&c, "iot").await;

    let _ = broker.kill();
    let _ = broker.wait();
    let down = eventually(Duration::from_secs(30), || async {
        let h = source_health(&c, "iot").await;
        (h["connected"] == false).then_some(h)
    })
    .await;
    assert!(down["lastError"].is_string(), "{down}");

    let mut broker = spawn();
    wait_port(port).await;
    let up = eventually(Duration::from_secs(60), || async {
        let h = source_health(&c, "iot").await;
        (h["connected"] == true).then_some(h)
    })
    .await;
    assert!(up["reconnections"].as_u64().unwrap() >= 1, "{up}");
    assert!(metric(&c, "weft_mqtt_reconnections_total", &["source=\"iot\""]).await >= 1.0);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let publisher = Mqtt::connect(&url, &unique("pub-"), None).await;
    publisher
        .publish("/json/any/back-again/attrs", r#"{"t":1}"#)
        .await;
    eventually(Duration::from_secs(15), || async {
        let (status, _) = c.send("GET", "/v2/entities/back-again", None, None).await;
        (status == 200).then_some(())
    })
    .await;
    let _ = broker.kill();
    let _ = broker.wait();
}

pub(crate) fn is_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub(crate) async fn wait_port(port: u16) {
    eventually(Duration::from_secs(10), || async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()
            .map(|_| ())
    })
    .await;
}

/// Orion's `mqtt` subscription: the standard notification published on
/// the topic; `mqttCustom`: macros in topic and payload; the password is
/// not shown back; the counters move as for HTTP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_and_mqtt_custom_subscriptions_reach_a_real_subscriber() {
    let url = broker_url();
    let server = Server::start();
    let c = server.client();
    let base = unique("orion/");
    let mut subscriber = Mqtt::connect(&url, &unique("sub-"), None).await;
    subscriber.subscribe(&format!("{base}/#")).await;

    let (status, reply) = c
        .send(
            "POST",
            "/v2/subscriptions",
            Some(&json!({
                "subject": {"entities": [{"idPattern": "Room.*", "type": "Room"}]},
                "notification": {"mqtt": {"url": url, "topic": format!("{base}/plain"), "qos": 1,
                                          "user": "u", "passwd": "secret"},
                                 "attrs": ["temperature"]}
            })),
            None,
        )
        .await;
    assert_eq!(status, 201, "{reply}");
    let (status, reply) = c
        .send(
            "POST",
            "/v2/subscriptions",
            Some(&json!({
                "subject": {"entities": [{"idPattern": "Room.*", "type": "Room"}]},
                "notification": {"mqttCustom": {"url": url, "topic": format!("{base}/${{id}}"),
                                                "payload": "temperature ${temperature} in ${id}"}}
            })),
            None,
        )
        .await;
    assert_eq!(status, 201, "{reply}");

    c.send(
        "POST",
        "/v2/entities",
        Some(
            &json!({"id": "Room1", "type": "Room", "temperature": {"value": 23, "type": "Number"}}),
        ),
        None,
    )
    .await;
    let mut got = std::collections::BTreeMap::new();
    for _ in 0..2 {
        let (topic, payload) = subscriber.next().await;
        got.insert(topic, payload);
    }
    let plain: Value = serde_json::from_slice(&got[&format!("{base}/plain")]).unwrap();
    assert!(plain["subscriptionId"].is_string(), "{plain}");
    assert_eq!(plain["data"][0]["id"], "Room1");
    assert_eq!(plain["data"][0]["temperature"]["value"], 23);
    assert_eq!(
        String::from_utf8_lossy(&got[&format!("{base}/Room1")]),
        "temperature 23 in Room1"
    );

    let subs = eventually(Duration::from_secs(10), || async {
        let (_, subs) = c.send("GET", "/v2/subscriptions", None, None).await;
        let all_sent = subs.as_array().is_some_and(|s| {
            s.len() == 2
                && s.iter()
                    .all(|s| s["notification"]["lastSuccess"].is_string())
        });
        all_sent.then_some(subs)
    })
    .await;
    let mqtt = subs
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["notification"].get("mqtt").is_some())
        .unwrap();
    assert_eq!(mqtt["notification"]["mqtt"]["user"], "u");
    // Masked, as the real Orion 4.7.0 shows it.
    assert_eq!(mqtt["notification"]["mqtt"]["passwd"], "*****");
    assert_eq!(mqtt["notification"]["mqtt"]["qos"], 1);
    assert_eq!(mqtt["notification"]["timesSent"], 1);

    // Orion's checks.
    for (notification, text) in [
        (
            json!({"mqtt": {"url": url}}),
            "topic mqtt notification is missing",
        ),
        (
            json!({"mqtt": {"url": "http://h:1", "topic": "t"}}),
            "Invalid URL parsing notification url",
        ),
        (
            json!({"mqtt": {"url": format!("{url}/path"), "topic": "t"}}),
            "path cannot be used in mqtt url, use topic instead",
        ),
        (
            json!({"mqtt": {"url": url, "topic": "t", "qos": 3}}),
            "MQTT QoS must be an uint in the 0 to 2 range",
        ),
        (
            json!({"mqtt": {"url": url, "topic": "a/#"}}),
            "+ and # are not allowed in mqtt notification topic",
        ),
        (
            json!({"mqtt": {"url": url, "topic": "t", "user": "u"}}),
            "you must use user and passwd fields simultaneously in MQTT notifications",
        ),
    ] {
        let (status, reply) = c
            .send(
                "POST",
                "/v2/subscriptions",
                Some(&json!({"subject": {"entities": [{"idPattern": ".*"}]}, "notification": notification})),
                None,
            )
            .await;
        assert_eq!(
            (status, reply["description"].as_str()),
            (400, Some(text)),
            "{notification}"
        );
    }

    // A broker that cannot be reached: a failure, counted as for HTTP.
    let dead = format!("mqtt://127.0.0.1:{}", free_port());
    let (status, _) = c
        .send(
            "POST",
            "/v2/subscriptions",
            Some(
                &json!({"subject": {"entities": [{"id": "Dead", "type": "Room"}]},
                         "notification": {"mqtt": {"url": dead, "topic": "x"}}}),
            ),
            None,
        )
        .await;
    assert_eq!(status, 201);
    c.send(
        "POST",
        "/v2/entities",
        Some(&json!({"id": "Dead", "type": "Room", "temperature": {"value": 1, "type": "Number"}})),
        None,
    )
    .await;
    eventually(Duration::from_secs(20), || async {
        let (_, subs) = c.send("GET", "/v2/subscriptions", None, None).await;
        subs.as_array()?
            .iter()
            .find(|s| s["subject"]["entities"][0]["id"] == "Dead")
            .filter(|s| {
                s["notification"]["failsCounter"] == 1
                    && s["notification"]["lastFailure"].is_string()
            })
            .map(|_| ())
    })
    .await;
}

/// The embedded broker: a device logs in with its id and key and its
/// messages are stored; a wrong key, an unknown device and a client id
/// that is not the device's are refused at CONNECT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_broker_admits_devices_by_their_key() {
    broker_url();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let server = Server::start_with_env(&[
        ("WEFT_MQTT__LISTEN", listen.as_str()),
        ("WEFT_MQTT__API_KEYS", "{apikey1=\"thermo\"}"),
    ]);
    let c = server.client();
    let url = format!("mqtt://{listen}");
    c.expect(201, "PUT", "/api/v1/device-types/thermo", Some(&json!({})))
        .await;
    c.expect(
        201,
        "PUT",
        "/api/v1/devices/dev-7",
        Some(&json!({"type": "thermo"})),
    )
    .await;
    let (status, reply) = c
        .send("POST", "/api/v1/devices/dev-7/key", None, None)
        .await;
    assert_eq!(status, 201, "{reply}");
    let secret = reply["key"].as_str().unwrap().to_string();
    let shown = c.expect(200, "GET", "/api/v1/devices/dev-7", None).await;
    assert_eq!(shown["hasKey"], true);
    assert!(shown.get("keyHash").is_none());
    let (health_status, health) = c.send("GET", "/health", None, None).await;
    assert_eq!(
        (health_status, health["mqtt"]["broker"].as_str()),
        (200, Some(listen.as_str()))
    );

    for (client_id, user, password) in [
        ("dev-7", "dev-7", "wdk_wrong"),
        ("nobody", "nobody", secret.as_str()),
        ("other", "dev-7", secret.as_str()),
    ] {
        let mut refused = Mqtt::connect(&url, client_id, Some((user, password))).await;
        assert!(
            !refused.admitted(Duration::from_secs(3)).await,
            "{client_id}/{user} admitted"
        );
    }

    let mut device = Mqtt::connect(&url, "dev-7", Some(("dev-7", &secret))).await;
    assert!(device.admitted(Duration::from_secs(10)).await);
    device
        .publish("/json/apikey1/dev-7/attrs", r#"{"t":12.5}"#)
        .await;
    device.publish("/ul/unknown-key/dev-7/attrs", "h|55").await;
    device.publish("devices/dev-7/up", r#"{"p":3}"#).await;
    let entity = eventually(Duration::from_secs(15), || async {
        let (status, e) = c
            .send("GET", "/v2/entities/dev-7?options=keyValues", None, None)
            .await;
        (status == 200 && e.get("t").is_some() && e.get("h").is_some() && e.get("p").is_some())
            .then_some(e)
    })
    .await;
    assert_eq!(
        (
            entity["t"].clone(),
            entity["h"].clone(),
            entity["p"].clone()
        ),
        (json!(12.5), json!(55), json!(3))
    );

    // A removed key no longer logs in.
    c.expect(204, "DELETE", "/api/v1/devices/dev-7/key", None)
        .await;
    let mut again = Mqtt::connect(&url, "dev-7", Some(("dev-7", &secret))).await;
    assert!(!again.admitted(Duration::from_secs(3)).await);
    let _ = KEY;
}

/// MQTT notifications are at least once too: a broker that is down when
/// an entity changes gets every notification once it is up, and a QoS 1
/// notification counts as sent only once the broker acknowledged it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_notifications_owed_while_the_broker_is_down_arrive_once_it_is_up() {
    use crate::notify_outbox::{create_room, first_delivery, set_seq};
    let bin =
        std::env::var("WEFT_TEST_MOSQUITTO").expect("WEFT_TEST_MOSQUITTO (scripts/test-services)");
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("mosquitto.conf");
    let mut text = format!("listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n");
    if is_root() {
        text.push_str("user root\n");
    }
    std::fs::write(&conf, text).unwrap();
    let url = format!("mqtt://127.0.0.1:{port}");
    let server = Server::start();
    let c = server.client();
    let base = unique("owed/");
    // One retained topic per value: a subscriber that comes after the
    // broker gets every one that reached it.
    let (status, reply) = c
        .send(
            "POST",
            "/v2/subscriptions",
            Some(&json!({
                "subject": {"entities": [{"id": "Room1", "type": "Room"}]},
                "notification": {"mqttCustom": {"url": url, "topic": format!("{base}/${{seq}}"),
                                                "qos": 1, "retain": true,
                                                "payload": "${seq}"}}
            })),
            None,
        )
        .await;
    assert_eq!(status, 201, "{reply}");
    create_room(&c).await;
    set_seq(&c, 1..=5).await;
    let failing = eventually(Duration::from_secs(10), || async {
        let d = first_delivery(&c).await;
        d["failing"].is_string().then_some(d)
    })
    .await;
    assert_eq!(failing["fromLog"], true, "{failing}");

    let mut broker = std::process::Command::new(&bin)
        .arg("-c")
        .arg(&conf)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("mosquitto starts");
    wait_port(port).await;
    eventually(Duration::from_secs(30), || async {
        (first_delivery(&c).await["fromLog"] == false).then_some(())
    })
    .await;
    let mut subscriber = Mqtt::connect(&url, &unique("sub-"), None).await;
    subscriber.subscribe(&format!("{base}/#")).await;
    let mut got = std::collections::BTreeSet::new();
    while got.len() < 6 {
        let (topic, payload) = subscriber.next().await;
        assert_eq!(
            topic,
            format!("{base}/{}", String::from_utf8_lossy(&payload))
        );
        got.insert(String::from_utf8_lossy(&payload).into_owned());
    }
    let want: std::collections::BTreeSet<String> = (0..=5).map(|v| v.to_string()).collect();
    assert_eq!(got, want, "the creation and every update");
    let (_, subs) = c.send("GET", "/v2/subscriptions", None, None).await;
    assert!(subs[0]["notification"]["lastSuccess"].is_string(), "{subs}");
    let _ = broker.kill();
    let _ = broker.wait();
}
