//! NGSIv2 subscriptions seen from a receiver: notifications on API
//! updates and on device uplinks, Orion's payload and headers, the
//! counters, tenants, a dead endpoint next to a live one, and
//! subscriptions surviving kill -9.

use std::time::Duration;

use axum::http::HeaderMap;
use axum::routing::post;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::ngsi::call;
use crate::util::*;

/// A notification as received: headers and JSON body.
struct Received {
    headers: HeaderMap,
    body: Value,
}

/// A local notification receiver on an ephemeral port.
struct Sink {
    url: String,
    rx: mpsc::UnboundedReceiver<Received>,
}

impl Sink {
    async fn start() -> Sink {
        let (tx, rx) = mpsc::unbounded_channel();
        let app = axum::Router::new().route(
            "/notify",
            post(move |headers: HeaderMap, body: String| {
                let tx = tx.clone();
                async move {
                    let body = serde_json::from_str(&body).unwrap_or(Value::String(body));
                    let _ = tx.send(Received { headers, body });
                    ""
                }
            }),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/notify", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Sink { url, rx }
    }

    /// The next notification, or None within `timeout`.
    async fn next_within(&mut self, timeout: Duration) -> Option<Received> {
        tokio::time::timeout(timeout, self.rx.recv())
            .await
            .ok()
            .flatten()
    }

    async fn next(&mut self) -> Received {
        self.next_within(Duration::from_secs(10))
            .await
            .expect("a notification within 10 s")
    }
}

/// An endpoint that accepts connections and never answers.
async fn black_hole() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/notify", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    url
}

async fn subscribe(c: &Client, tenant: Option<&str>, body: Value) -> String {
    let (status, headers, reply) = call(c, "POST", "/v2/subscriptions", tenant, Some(&body)).await;
    assert_eq!(status, 201, "{reply}");
    let location = headers["location"].to_str().unwrap();
    let id = location.strip_prefix("/v2/subscriptions/").unwrap();
    assert_eq!(id.len(), 24);
    id.to_string()
}

/// A temperature change on an entity notifies with Orion's envelope and
/// headers; an update that changes nothing does not (default condition);
/// the counters show what was sent.
#[tokio::test]
async fn api_updates_notify_with_orions_payload_and_counters() {
    let server = Server::start();
    let c = server.client();
    let mut sink = Sink::start().await;
    let id = subscribe(
        &c,
        Some("acme"),
        json!({"subject": {"entities": [{"idPattern": ".*", "type": "Room"}],
                           "condition": {"attrs": ["temperature"]}},
               "notification": {"http": {"url": sink.url}, "attrs": ["temperature"]}}),
    )
    .await;
    let room = json!({"id": "R1", "type": "Room", "temperature": {"value": 20, "type": "Number"},
                      "pressure": {"value": 1000, "type": "Number"}});
    let (status, _, _) = call(&c, "POST", "/v2/entities", Some("acme"), Some(&room)).await;
    assert_eq!(status, 201);
    let n = sink.next().await;
    assert_eq!(
        n.body,
        json!({"subscriptionId": id, "data": [{"id": "R1", "type": "Room",
               "temperature": {"type": "Number", "value": 20, "metadata": {}}}]})
    );
    assert_eq!(n.headers["fiware-service"], "acme");
    assert_eq!(n.headers["fiware-servicepath"], "/");
    assert_eq!(n.headers["ngsiv2-attrsformat"], "normalized");
    assert_eq!(n.headers["content-type"], "application/json; charset=utf-8");
    assert!(n.headers["fiware-correlator"]
        .to_str()
        .unwrap()
        .ends_with("; cbnotif=1"));

    // Pressure is not a condition attribute; the same temperature is no change.
    let patch = json!({"pressure": {"value": 990, "type": "Number"}});
    call(
        &c,
        "PATCH",
        "/v2/entities/R1/attrs",
        Some("acme"),
        Some(&patch),
    )
    .await;
    let same = json!({"temperature": {"value": 20, "type": "Number"}});
    call(
        &c,
        "PATCH",
        "/v2/entities/R1/attrs",
        Some("acme"),
        Some(&same),
    )
    .await;
    let hot = json!({"temperature": {"value": 31, "type": "Number"}});
    call(
        &c,
        "PATCH",
        "/v2/entities/R1/attrs",
        Some("acme"),
        Some(&hot),
    )
    .await;
    let n = sink.next().await;
    assert_eq!(n.body["data"][0]["temperature"]["value"], 31);
    assert!(sink.next_within(Duration::from_millis(300)).await.is_none());

    let sub = eventually(Duration::from_secs(5), || async {
        let (_, _, sub) = call(
            &c,
            "GET",
            &format!("/v2/subscriptions/{id}"),
            Some("acme"),
            None,
        )
        .await;
        (sub["notification"]["lastSuccessCode"] == 200).then_some(sub)
    })
    .await;
    assert_eq!(sub["notification"]["timesSent"], 2);
    assert_eq!(sub["status"], "active");
    // Another tenant sees neither the subscription nor its entity's changes.
    let (status, _, _) = call(
        &c,
        "GET",
        &format!("/v2/subscriptions/{id}"),
        Some("other"),
        None,
    )
    .await;
    assert_eq!(status, 404);
    call(&c, "POST", "/v2/entities", Some("other"), Some(&room)).await;
    assert!(sink.next_within(Duration::from_millis(300)).await.is_none());
}

/// A device uplink updates its entity, and a subscription with a `q`
/// condition on it fires only when the condition holds.
#[tokio::test]
async fn device_uplinks_fire_subscriptions() {
    let server = Server::start();
    let c = server.client();
    let mut sink = Sink::start().await;
    c.create_em300th().await;
    let id = subscribe(
        &c,
        None,
        json!({"subject": {"entities": [{"idPattern": ".*", "type": "TemperatureSensor"}],
                           "condition": {"attrs": ["temperature"],
                                         "expression": {"q": "temperature>40"}}},
               "notification": {"http": {"url": sink.url}, "attrs": ["temperature"],
                                "attrsFormat": "keyValues"}}),
    )
    .await;
    c.uplink(
        "farm",
        "decoded",
        "em300th",
        &decoded_body("s-1", "dev-s", 37, 61, now_ms()),
    )
    .await;
    c.unit_eventually("s-1").await;
    c.uplink(
        "farm",
        "decoded",
        "em300th",
        &decoded_body("s-2", "dev-s", 45, 60, now_ms()),
    )
    .await;
    let n = sink.next().await;
    assert_eq!(
        n.body,
        json!({"subscriptionId": id,
               "data": [{"id": "dev-s", "type": "TemperatureSensor", "temperature": 45}]})
    );
    assert_eq!(n.headers["ngsiv2-attrsformat"], "keyValues");
    assert!(sink.next_within(Duration::from_millis(300)).await.is_none());
}

/// A subscription whose endpoint never answers does not hold back the
/// notifications of another subscription to a live endpoint.
#[tokio::test]
async fn a_dead_endpoint_does_not_delay_a_live_one() {
    let server = Server::start();
    let c = server.client();
    let mut sink = Sink::start().await;
    let dead = black_hole().await;
    let entity = json!({"subject": {"entities": [{"id": "E", "type": "T"}]}});
    for url in [dead.clone(), dead] {
        let mut body = entity.clone();
        body["notification"] = json!({"http": {"url": url, "timeout": 60000}});
        subscribe(&c, None, body).await;
    }
    let mut body = entity.clone();
    body["notification"] = json!({"http": {"url": sink.url}, "attrsFormat": "keyValues"});
    subscribe(&c, None, body).await;

    let e = json!({"id": "E", "type": "T", "n": {"value": 0, "type": "Number"}});
    call(&c, "POST", "/v2/entities", None, Some(&e)).await;
    for i in 1..=30 {
        let v = json!({"n": {"value": i, "type": "Number"}});
        let (status, _, _) = call(&c, "PATCH", "/v2/entities/E/attrs", None, Some(&v)).await;
        assert_eq!(status, 204);
    }
    // Each dead notification would hold a serial sender for 60 s; the
    // live endpoint gets all 31, in order, long before one of them ends.
    for i in 0..=30 {
        let n = sink.next().await;
        assert_eq!(n.body["data"][0]["n"], i);
    }
}

/// Failures are counted and `maxFailsLimit` deactivates the subscription;
/// `oneshot` fires once; subscriptions and their status survive kill -9.
#[tokio::test]
async fn failures_oneshot_and_restart() {
    let mut server = Server::start();
    let c = server.client();
    let mut sink = Sink::start().await;
    // A port nobody listens on: connection refused.
    let refused = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}/notify", l.local_addr().unwrap())
    };
    let failing = subscribe(
        &c,
        None,
        json!({"subject": {"entities": [{"id": "E", "type": "T"}]},
               "notification": {"http": {"url": refused}, "maxFailsLimit": 2}}),
    )
    .await;
    let once = subscribe(
        &c,
        None,
        json!({"subject": {"entities": [{"id": "E", "type": "T"}]},
               "notification": {"http": {"url": sink.url}}, "status": "oneshot"}),
    )
    .await;
    let e = json!({"id": "E", "type": "T", "n": {"value": 0, "type": "Number"}});
    call(&c, "POST", "/v2/entities", None, Some(&e)).await;
    sink.next().await;
    for i in 1..=3 {
        let v = json!({"n": {"value": i, "type": "Number"}});
        call(&c, "PATCH", "/v2/entities/E/attrs", None, Some(&v)).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(sink.next_within(Duration::from_millis(300)).await.is_none());
    let sub = eventually(Duration::from_secs(5), || async {
        let (_, _, sub) = call(
            &c,
            "GET",
            &format!("/v2/subscriptions/{failing}"),
            None,
            None,
        )
        .await;
        (sub["status"] == "inactive").then_some(sub)
    })
    .await;
    assert_eq!(sub["notification"]["failsCounter"], 2);
    assert_eq!(sub["notification"]["timesSent"], 2);
    assert_eq!(
        sub["notification"]["lastFailureReason"],
        "Couldn't connect to server"
    );
    let (_, _, one) = call(&c, "GET", &format!("/v2/subscriptions/{once}"), None, None).await;
    assert_eq!(one["status"], "inactive");

    // Counters are stored within a second; then crash and come back.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    server.kill9();
    server.restart();
    let c = server.client();
    let (_, _, list) = call(&c, "GET", "/v2/subscriptions", None, None).await;
    let list = list.as_array().unwrap().clone();
    assert_eq!(list.len(), 2);
    assert_eq!(list[0]["id"], failing.as_str());
    assert_eq!(list[0]["status"], "inactive");
    assert_eq!(list[0]["notification"]["failsCounter"], 2);
    // Reactivated, the oneshot fires again once.
    let (status, _, _) = call(
        &c,
        "PATCH",
        &format!("/v2/subscriptions/{once}"),
        None,
        Some(&json!({"status": "oneshot"})),
    )
    .await;
    assert_eq!(status, 204);
    let v = json!({"n": {"value": 9, "type": "Number"}});
    call(&c, "PATCH", "/v2/entities/E/attrs", None, Some(&v)).await;
    assert_eq!(sink.next().await.body["data"][0]["n"]["value"], 9);
    let (status, _, _) = call(
        &c,
        "DELETE",
        &format!("/v2/subscriptions/{once}"),
        None,
        None,
    )
    .await;
    assert_eq!(status, 204);
    let (status, _, _) = call(
        &c,
        "DELETE",
        &format!("/v2/subscriptions/{once}"),
        None,
        None,
    )
    .await;
    assert_eq!(status, 404);
}

/// Two brokers federated as Orion users do it: a subscription on one
/// notifies the other's `/v2/op/notify`, which applies the entities.
#[tokio::test]
async fn op_notify_applies_notifications_from_another_broker() {
    let upstream = Server::start();
    let downstream = Server::start();
    let (up, down) = (upstream.client(), downstream.client());
    subscribe(
        &up,
        None,
        json!({"subject": {"entities": [{"idPattern": ".*", "type": "Room"}]},
               // The downstream weft wants a key, sent as a custom header.
               "notification": {"httpCustom": {"url": format!("{}/v2/op/notify", downstream.url),
                                               "headers": {"X-Auth-Token": ADMIN_KEY}}}}),
    )
    .await;
    let room = json!({"id": "R1", "type": "Room", "t": {"value": 21, "type": "Number"}});
    call(&up, "POST", "/v2/entities", None, Some(&room)).await;
    let v = json!({"t": {"value": 22, "type": "Number"}});
    call(&up, "PATCH", "/v2/entities/R1/attrs", None, Some(&v)).await;
    let entity = eventually(Duration::from_secs(5), || async {
        let (status, _, e) = call(
            &down,
            "GET",
            "/v2/entities/R1?options=keyValues",
            None,
            None,
        )
        .await;
        (status == 200 && e["t"] == 22).then_some(e)
    })
    .await;
    assert_eq!(entity, json!({"id": "R1", "type": "Room", "t": 22}));

    let (status, _, body) =
        call(&down, "POST", "/v2/op/notify", None, Some(&json!({"x": 1}))).await;
    assert_eq!(status, 400, "{body}");
}

/// Alarms are context too: a subscription on entities of type `Alarm`
/// notifies when a rule raises one, when it repeats and when it is acked
/// over the API.
#[tokio::test]
async fn alarms_notify_subscriptions_on_the_alarm_type() {
    let server = Server::start();
    let c = server.client();
    let mut sink = Sink::start().await;
    c.create_em300th().await;
    let sub = subscribe(
        &c,
        None,
        json!({"subject": {"entities": [{"idPattern": ".*", "type": "Alarm"}],
                           "condition": {"attrs": ["count", "acked"],
                                         "expression": {"q": "severity==critical"}}},
               "notification": {"http": {"url": sink.url},
                                "attrs": ["refDevice", "state", "acked", "count"],
                                "attrsFormat": "keyValues"}}),
    )
    .await;
    let rule = json!({"condition": "temperature>45.1",
                      "alarm": {"type": "hot", "severity": "critical"}});
    c.expect(201, "PUT", "/api/v1/rules/hot", Some(&rule)).await;
    for (uuid, temperature) in [("a-1", 46), ("a-2", 47)] {
        c.uplink(
            "farm",
            "decoded",
            "em300th",
            &decoded_body(uuid, "dev-a", temperature, 60, now_ms()),
        )
        .await;
    }
    let raised = sink.next().await;
    let alarm_id = raised.body["data"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(raised.body["subscriptionId"], sub.as_str());
    assert_eq!(
        raised.body["data"][0],
        json!({"id": alarm_id, "type": "Alarm", "refDevice": "dev-a",
               "state": "active", "acked": false, "count": 1})
    );
    assert_eq!(sink.next().await.body["data"][0]["count"], 2);
    c.expect(200, "POST", &format!("/api/v1/alarms/{alarm_id}/ack"), None)
        .await;
    assert_eq!(sink.next().await.body["data"][0]["acked"], true);
}
