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

/// A subscription to `entityUpdate` with `condition.attrs` fires when the
/// update carries one of those attributes, even unchanged, while the
/// change is elsewhere; one to `entityChange` needs the named attribute
/// itself to change.
#[tokio::test]
async fn entity_update_conditions_look_at_every_attribute_of_the_update() {
    let server = Server::start();
    let c = server.client();
    let mut update_sink = Sink::start().await;
    let mut change_sink = Sink::start().await;
    for (sink, kind) in [
        (&update_sink, "entityUpdate"),
        (&change_sink, "entityChange"),
    ] {
        subscribe(
            &c,
            None,
            json!({"subject": {"entities": [{"id": "M1", "type": "Meter"}],
                               "condition": {"attrs": ["stamp"], "alterationTypes": [kind]}},
                   "notification": {"http": {"url": sink.url}, "attrsFormat": "keyValues"}}),
        )
        .await;
    }
    let meter = json!({"id": "M1", "type": "Meter", "stamp": {"value": "s1"},
                       "volume": {"value": 20}});
    call(&c, "POST", "/v2/entities", None, Some(&meter)).await;
    let same_stamp = json!({"stamp": {"value": "s1"}, "volume": {"value": 23}});
    let (status, _, _) = call(
        &c,
        "PATCH",
        "/v2/entities/M1/attrs",
        None,
        Some(&same_stamp),
    )
    .await;
    assert_eq!(status, 204);
    let n = update_sink.next().await;
    assert_eq!(n.body["data"][0]["volume"], 23);
    assert!(change_sink
        .next_within(Duration::from_millis(400))
        .await
        .is_none());
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

/// Custom notifications computed by JEXL: macros in the URL, query
/// string, headers and payloads, the `ngsi` patch with `evalPriority`,
/// `condition.jexlExpression`, and the per-subscription `timeout`.
mod expressions {
    use std::time::Duration;

    use serde_json::{json, Value};

    use super::{black_hole, subscribe};
    use crate::ngsi::call;
    use crate::util::*;

    async fn upsert(c: &Client, entity: Value) {
        let (status, _, reply) = call(
            c,
            "POST",
            "/v2/entities?options=upsert",
            None,
            Some(&entity),
        )
        .await;
        assert_eq!(status, 204, "{reply}");
    }

    /// Every template of `httpCustom` is evaluated: a whole-string macro in
    /// `json` keeps its JSON type (numbers, objects), an embedded one is
    /// spliced as text, a missing attribute is `null`, and the URL, query
    /// string, method and headers (with quotes in their literals) follow
    /// the entity; a header left empty (by the subscription or by a macro
    /// without a value) is not sent.
    #[tokio::test]
    async fn custom_templates_evaluate_jexl() {
        let server = Server::start();
        let c = server.client();
        let mut rx = Receiver::start().await;
        subscribe(
            &c,
            None,
            json!({"subject": {"entities": [{"idPattern": ".*", "type": "Room"}]},
                   "notification": {"httpCustom": {
                       "url": format!("{}/rooms/${{id|lowercase}}", rx.base),
                       "method": "PUT",
                       "qs": {"double": "${temperature*2}", "${type}": "t"},
                       "headers": {"X-Level": "${(temperature>30)?'hot':'ok'}",
                                   "X-Fallback": "${missing||\"none\"}",
                                   "X-Missing": "${missing}",
                                   "Accept": ""},
                       "json": {"t": "${temperature}",
                                "ratio": "${count.sum/count.count}",
                                "obj": "${{n: count.count+1}}",
                                "text": "T=${temperature} in ${servicePath}",
                                "code": "${code||'invalid'}",
                                "missing": "${missing}",
                                "bad": "${temperature|noSuchTransform}",
                                "fixed": [1, "two"]}}}}),
        )
        .await;
        upsert(
            &c,
            json!({"id": "R1", "type": "Room",
                   "temperature": {"value": 31.5, "type": "Number"},
                   "count": {"value": {"count": 5, "sum": 100}},
                   "code": {"value": null}}),
        )
        .await;
        let n = rx.next().await;
        assert_eq!(n.method, "PUT");
        assert_eq!(n.target, "/rooms/r1?double=63&Room=t");
        assert_eq!(n.header("x-level"), Some("hot"));
        assert_eq!(n.header("x-fallback"), Some("none"));
        // Emptied headers are not sent, not even the client's default.
        assert_eq!(n.header("x-missing"), None);
        assert_eq!(n.header("accept"), None);
        assert_eq!(n.header("ngsiv2-attrsformat"), Some("custom"));
        assert_eq!(
            n.json(),
            json!({"t": 31.5, "ratio": 20, "obj": {"n": 6}, "text": "T=31.5 in /",
                   "code": "invalid", "missing": null, "bad": null, "fixed": [1, "two"]})
        );
    }

    /// Orion's transformations work in macros, text payloads splice their
    /// results, and forbidden characters sent percent-encoded arrive
    /// decoded.
    #[tokio::test]
    async fn transformations_and_text_payloads() {
        let server = Server::start();
        let c = server.client();
        let mut rx = Receiver::start().await;
        subscribe(
            &c,
            None,
            json!({"subject": {"entities": [{"id": "S1", "type": "Sensor"}]},
                   "notification": {"httpCustom": {
                       "url": format!("{}/json", rx.base),
                       "json": {"upper": "${name|uppercase}",
                                "parts": "${name|split(' ')}",
                                "level": "${level|thMapper(limits,labels)}",
                                "avg": "${readings|arrAvg}",
                                "fixed": "${ratio|toFixed(2)}",
                                "iso": "${stamp|toIsoString}",
                                "digits": "${serial|replaceRegex('\\d+','#')}",
                                "type": "${level|typeOf}"}}}}),
        )
        .await;
        subscribe(
            &c,
            None,
            json!({"subject": {"entities": [{"id": "S1", "type": "Sensor"}]},
                   "notification": {"httpCustom": {
                       "url": format!("{}/text", rx.base),
                       "payload": "%22${name|lowercase}%22 level ${level}"}}}),
        )
        .await;
        upsert(
            &c,
            json!({"id": "S1", "type": "Sensor",
                   "name": {"value": "Boiler Room"}, "level": {"value": 15},
                   "limits": {"value": [10, 20]},
                   "labels": {"value": ["low", "mid", "high"]},
                   "readings": {"value": [1, 2, 6]}, "ratio": {"value": 0.1234},
                   "stamp": {"value": 1720606949}, "serial": {"value": "ab12cd345"}}),
        )
        .await;
        let mut seen = [rx.next().await, rx.next().await];
        seen.sort_by(|a, b| a.target.cmp(&b.target));
        assert_eq!(
            seen[0].json(),
            json!({"upper": "BOILER ROOM", "parts": ["Boiler", "Room"], "level": "mid",
                   "avg": 3, "fixed": 0.12, "iso": "2024-07-10T10:22:29+00:00",
                   "digits": "ab#cd#", "type": "Number"})
        );
        assert_eq!(seen[1].body, "\"boiler room\" level 15");
        assert_eq!(
            seen[1].header("content-type"),
            Some("text/plain; charset=utf-8")
        );
    }

    /// An `ngsi` patch is evaluated in `evalPriority` order, each result
    /// usable by the next, `id` and `type` last; `notification.attrs`
    /// filters after the patch and `attrsFormat` applies to the result.
    #[tokio::test]
    async fn ngsi_patch_follows_eval_priority_and_format() {
        let server = Server::start();
        let c = server.client();
        let mut rx = Receiver::start().await;
        let prio = |n: u32| json!({"evalPriority": {"value": n, "type": "Number"}});
        let sub = subscribe(
            &c,
            None,
            json!({"subject": {"entities": [{"id": "E1", "type": "T"}]},
                   "notification": {
                       "attrs": ["Y2", "Z1", "S"],
                       "attrsFormat": "keyValues",
                       "httpCustom": {
                           "url": format!("{}/ngsi", rx.base),
                           "ngsi": {
                               "id": "${type}:${Y2}",
                               "Y2": {"value": "${Z1+1}", "type": "Calculated",
                                      "metadata": prio(2)},
                               "Z1": {"value": "${A+1}", "type": "Calculated",
                                      "metadata": prio(1)},
                               "S": {"value": "${Y2*10}"}}}}}),
        )
        .await;
        upsert(&c, json!({"id": "E1", "type": "T", "A": {"value": 1}})).await;
        let n = rx.next().await;
        assert_eq!(n.header("ngsiv2-attrsformat"), Some("keyValues"));
        assert_eq!(
            n.json(),
            json!({"subscriptionId": sub,
                   "data": [{"id": "T:3", "type": "T", "Y2": 3, "Z1": 2, "S": 30}]})
        );
    }

    /// `evalPriority` must be a number from 1 to 100000 and the only
    /// metadata of an `ngsi` attribute: anything else is Orion's 400, on
    /// creation and on update, and an update refused changes nothing.
    #[tokio::test]
    async fn bad_eval_priority_is_refused() {
        let server = Server::start();
        let c = server.client();
        let body = |md: Value| {
            json!({"subject": {"entities": [{"id": "E1", "type": "T"}]},
                   "notification": {"httpCustom": {"url": "http://127.0.0.1:9/x",
                       "ngsi": {"S": {"value": "${A}", "metadata": md}}}}})
        };
        let cases = [
            (
                json!({"evalPriority": {"value": "1"}}),
                "evalPriority metadata must be a number",
            ),
            (
                json!({"evalPriority": {"value": 0}}),
                "evalPriority metadata minimum priority is 1",
            ),
            (
                json!({"evalPriority": {"value": 100001}}),
                "evalPriority metadata maximum priority is 100000",
            ),
            (
                json!({"other": {"value": 1}}),
                "only evalPriority metadata is allowed in ngsi field in custom notifications",
            ),
        ];
        for (md, text) in &cases {
            let (status, _, reply) = call(
                &c,
                "POST",
                "/v2/subscriptions",
                None,
                Some(&body(md.clone())),
            )
            .await;
            assert_eq!(status, 400);
            assert_eq!(reply, json!({"error": "BadRequest", "description": text}));
        }
        let id = subscribe(&c, None, body(json!({"evalPriority": {"value": 5}}))).await;
        let path = format!("/v2/subscriptions/{id}");
        let patch = json!({"notification": body(cases[1].0.clone())["notification"]});
        let (status, _, reply) = call(&c, "PATCH", &path, None, Some(&patch)).await;
        assert_eq!(
            (status, reply["description"].as_str()),
            (400, Some(cases[1].1))
        );
        let (_, _, sub) = call(&c, "GET", &path, None, None).await;
        assert_eq!(
            sub["notification"]["httpCustom"]["ngsi"]["S"]["metadata"]["evalPriority"]["value"],
            5
        );
    }

    /// `condition.jexlExpression` lets through only the changes for which
    /// it is `true`, with the builtin metadata (`previousValue`) in its
    /// context; an expression that fails (no previous value on creation)
    /// is not `true`. The subscription shows it back.
    #[tokio::test]
    async fn jexl_condition_filters_notifications() {
        let server = Server::start();
        let c = server.client();
        let mut rx = Receiver::start().await;
        let id = subscribe(
            &c,
            None,
            json!({"subject": {"entities": [{"id": "E1", "type": "T"}],
                               "condition": {"jexlExpression":
                                   "A-metadata.A.previousValue>=3 && type=='T'"}},
                   "notification": {"http": {"url": format!("{}/cond", rx.base)},
                                    "attrsFormat": "keyValues"}}),
        )
        .await;
        for a in [1, 4, 5, 9] {
            upsert(&c, json!({"id": "E1", "type": "T", "A": {"value": a}})).await;
        }
        assert_eq!(rx.next().await.json()["data"][0]["A"], 4);
        assert_eq!(rx.next().await.json()["data"][0]["A"], 9);
        rx.nothing_more().await;
        let (_, _, sub) = call(&c, "GET", &format!("/v2/subscriptions/{id}"), None, None).await;
        assert_eq!(
            sub["subject"]["condition"]["jexlExpression"],
            "A-metadata.A.previousValue>=3 && type=='T'"
        );
    }

    /// A notification not answered within the subscription's `timeout`
    /// (ms) counts as a failure, reported as curl words it, well before
    /// the server-wide default of 5 s.
    #[tokio::test]
    async fn notification_timeout_counts_as_failure() {
        let server = Server::start();
        let c = server.client();
        let dead = black_hole().await;
        let id = subscribe(
            &c,
            None,
            json!({"subject": {"entities": [{"id": "E1", "type": "T"}]},
                   "notification": {"httpCustom": {"url": dead, "timeout": 300}}}),
        )
        .await;
        let (_, _, sub) = call(&c, "GET", &format!("/v2/subscriptions/{id}"), None, None).await;
        assert_eq!(sub["notification"]["httpCustom"]["timeout"], 300);
        upsert(&c, json!({"id": "E1", "type": "T", "A": {"value": 1}})).await;
        let sub = eventually(Duration::from_secs(3), || async {
            let (_, _, sub) = call(&c, "GET", &format!("/v2/subscriptions/{id}"), None, None).await;
            (sub["notification"]["failsCounter"] == 1).then_some(sub)
        })
        .await;
        assert_eq!(
            sub["notification"]["lastFailureReason"],
            "Timeout was reached"
        );
    }
}
