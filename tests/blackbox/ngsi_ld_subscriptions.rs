//! NGSI-LD subscriptions (ETSI GS CIM 009, clause 5.8) and their
//! notifications (clause 5.3.1), section by section: created, retrieved,
//! queried, updated and deleted; notified over HTTP (JSON with a `Link`
//! header, JSON-LD, keyValues, `showChanges`) and MQTT for the triggers,
//! watched attributes, `q` and `geoQ` asked; changes made through `/v2`
//! notify NGSI-LD subscribers too; kept across a restart with their
//! context, without fetching it again. Each API lists only its own
//! subscriptions.

use std::time::Duration;

use serde_json::{json, Value};

use crate::mqtt::{broker_url, unique, Mqtt};
use crate::util::*;

const LD: &str = "application/ld+json";
const JSON: &str = "application/json";

/// A `Link` header naming `url` as the JSON-LD context.
fn link(url: &str) -> String {
    format!("<{url}>; rel=\"http://www.w3.org/ns/json-ld#context\"; type=\"{LD}\"")
}

fn vehicle(id: &str, speed: i64) -> Value {
    json!({
        "id": id,
        "type": "Vehicle",
        "brandName": {"type": "Property", "value": "Mercedes"},
        "speed": {"type": "Property", "value": speed},
        "location": {"type": "GeoProperty", "value": {"type": "Point", "coordinates": [-8.5, 41.2]}}
    })
}

async fn post_json(c: &Client, path: &str, headers: &[(&str, &str)], body: &Value) -> (u16, Value) {
    let (status, headers, body) = call_as(c, "POST", path, headers, Some((JSON, body))).await;
    let shown = match headers.get("location") {
        Some(l) => json!({"location": l.to_str().unwrap(), "body": body}),
        None => body,
    };
    (status, shown)
}

async fn patch_speed(c: &Client, id: &str, speed: i64) {
    let (status, _, body) = call_as(
        c,
        "PATCH",
        &format!("/ngsi-ld/v1/entities/{id}/attrs"),
        &[],
        Some((
            JSON,
            &json!({"speed": {"type": "Property", "value": speed}}),
        )),
    )
    .await;
    assert_eq!(status, 204, "{body}");
}

/// 5.8.1–5.8.5: a subscription is created (201 with its `Location`),
/// retrieved, listed (paged, counted), paused and resumed, and deleted;
/// an id the tenant has is 409; bodies that are not subscriptions are
/// 400 and store nothing; `/v2/subscriptions` and
/// `/ngsi-ld/v1/subscriptions` each show only their own.
#[tokio::test]
async fn subscriptions_are_created_read_listed_updated_and_deleted() {
    let server = Server::start();
    let c = server.client();
    let sub = json!({
        "id": "urn:ngsi-ld:Subscription:one",
        "type": "Subscription",
        "subscriptionName": "speeding",
        "entities": [{"type": "Vehicle"}],
        "watchedAttributes": ["speed"],
        "q": "speed>50",
        "notification": {"attributes": ["speed"], "format": "keyValues",
                          "endpoint": {"uri": "http://127.0.0.1:9/notify", "accept": JSON}},
        "throttling": 5
    });
    let (status, created) = post_json(&c, "/ngsi-ld/v1/subscriptions", &[], &sub).await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(
        created["location"],
        "/ngsi-ld/v1/subscriptions/urn:ngsi-ld:Subscription:one"
    );
    let (status, again) = post_json(&c, "/ngsi-ld/v1/subscriptions", &[], &sub).await;
    assert_eq!(status, 409, "{again}");
    assert_eq!(
        again["type"],
        "https://uri.etsi.org/ngsi-ld/errors/AlreadyExists"
    );

    let (status, headers, got) = call_as(
        &c,
        "GET",
        "/ngsi-ld/v1/subscriptions/urn:ngsi-ld:Subscription:one",
        &[],
        None,
    )
    .await;
    assert_eq!(status, 200, "{got}");
    assert!(headers["link"]
        .to_str()
        .unwrap()
        .contains("ngsi-ld-core-context"));
    assert_eq!(got["type"], "Subscription");
    assert_eq!(got["subscriptionName"], "speeding");
    assert_eq!(got["entities"], json!([{"type": "Vehicle"}]));
    assert_eq!(got["watchedAttributes"], json!(["speed"]));
    assert_eq!(got["q"], "speed>50");
    assert!(got.get("isActive").is_none(), "not given: {got}");
    assert_eq!(got["status"], "active");
    assert_eq!(got["throttling"], 5);
    assert_eq!(got["notification"]["format"], "keyValues");
    assert_eq!(got["notification"]["attributes"], json!(["speed"]));
    assert_eq!(
        got["notification"]["endpoint"]["uri"],
        "http://127.0.0.1:9/notify"
    );

    // Created without an id: one is given.
    let mut unnamed = sub.clone();
    unnamed.as_object_mut().unwrap().remove("id");
    let (status, created) = post_json(&c, "/ngsi-ld/v1/subscriptions", &[], &unnamed).await;
    assert_eq!(status, 201, "{created}");
    let location = created["location"].as_str().unwrap().to_string();
    assert!(location.starts_with("/ngsi-ld/v1/subscriptions/urn:ngsi-ld:Subscription:"));

    // NGSIv2's own subscription is not NGSI-LD's, and the other way round.
    let (status, _) = post_json(
        &c,
        "/v2/subscriptions",
        &[],
        &json!({"subject": {"entities": [{"idPattern": ".*"}]},
                "notification": {"http": {"url": "http://127.0.0.1:9/v2"}}}),
    )
    .await;
    assert_eq!(status, 201);
    let (status, headers, list) = call_as(
        &c,
        "GET",
        "/ngsi-ld/v1/subscriptions?count=true&limit=1",
        &[],
        None,
    )
    .await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(headers["ngsild-results-count"], "2");
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert_eq!(list[0]["id"], "urn:ngsi-ld:Subscription:one");
    // Links to the pages before and after, beside the context's.
    let links = headers["link"].to_str().unwrap();
    assert!(
        links.contains("</ngsi-ld/v1/subscriptions?limit=1&offset=1>;rel=\"next\""),
        "{links}"
    );
    assert!(!links.contains("rel=\"prev\""), "{links}");
    let (_, headers, _) = call_as(
        &c,
        "GET",
        "/ngsi-ld/v1/subscriptions?limit=1&offset=1",
        &[("Accept", "application/ld+json")],
        None,
    )
    .await;
    assert_eq!(
        headers["link"],
        "</ngsi-ld/v1/subscriptions?limit=1&offset=0>;rel=\"prev\";type=\"application/ld+json\""
    );
    let (_, _, v2) = call(&c, "GET", "/v2/subscriptions", &[], None).await;
    assert_eq!(v2.as_array().unwrap().len(), 1, "{v2}");
    let (status, _, _) = call(
        &c,
        "GET",
        "/v2/subscriptions/urn:ngsi-ld:Subscription:one",
        &[],
        None,
    )
    .await;
    // Not an id of Orion's form (400), nor an NGSIv2 subscription.
    assert!(matches!(status, 400 | 404), "{status}");
    let (status, _, _) = call(
        &c,
        "DELETE",
        "/v2/subscriptions/urn:ngsi-ld:Subscription:one",
        &[],
        None,
    )
    .await;
    // Not an id of Orion's form (400), nor an NGSIv2 subscription.
    assert!(matches!(status, 400 | 404), "{status}");

    // Paused, then changed and resumed.
    let path = "/ngsi-ld/v1/subscriptions/urn:ngsi-ld:Subscription:one";
    let (status, _, body) = call_as(
        &c,
        "PATCH",
        path,
        &[],
        Some((JSON, &json!({"isActive": false}))),
    )
    .await;
    assert_eq!(status, 204, "{body}");
    let (_, _, got) = call_as(&c, "GET", path, &[], None).await;
    assert_eq!(got["status"], "paused");
    assert_eq!(got["q"], "speed>50");
    let (status, _, _) = call_as(
        &c,
        "PATCH",
        path,
        &[],
        Some((
            JSON,
            &json!({"isActive": true, "q": "speed>80", "notification": {"format": "normalized"}}),
        )),
    )
    .await;
    assert_eq!(status, 204);
    let (_, _, got) = call_as(&c, "GET", &format!("{path}?options=sysAttrs"), &[], None).await;
    assert_eq!(got["status"], "active");
    assert_eq!(got["q"], "speed>80");
    assert_eq!(got["notification"]["format"], "normalized");
    assert_eq!(got["notification"]["attributes"], json!(["speed"]));
    assert!(
        got["createdAt"].is_string() && got["modifiedAt"].is_string(),
        "{got}"
    );
    // A change that breaks it is refused and changes nothing.
    let (status, _, body) = call_as(
        &c,
        "PATCH",
        path,
        &[],
        Some((JSON, &json!({"throttling": "often"}))),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let (_, _, got) = call_as(&c, "GET", path, &[], None).await;
    assert_eq!(got["throttling"], 5);

    // Bodies that are not subscriptions.
    for (bad, why) in [
        (
            json!({"type": "Subscription", "entities": [{"type": "T"}]}),
            "no notification",
        ),
        (
            json!({"entities": [{"type": "T"}], "notification": {"endpoint": {"uri": "http://x.example/"}}}),
            "no type",
        ),
        (
            json!({"type": "Subscription", "entities": [{"type": "T"}],
                   "notification": {"endpoint": {"uri": "ftp://x.example/"}}}),
            "an endpoint weft cannot notify",
        ),
        (
            json!({"type": "Subscription", "notification": {"endpoint": {"uri": "http://x.example/"}}}),
            "neither entities nor watchedAttributes",
        ),
        (
            json!({"type": "Subscription", "entities": [{"type": "T"}], "q": "speed>>1",
                   "notification": {"endpoint": {"uri": "http://x.example/"}}}),
            "a q that does not parse",
        ),
    ] {
        let (status, body) = post_json(&c, "/ngsi-ld/v1/subscriptions", &[], &bad).await;
        assert_eq!(status, 400, "{why}: {body}");
        assert_eq!(
            body["type"], "https://uri.etsi.org/ngsi-ld/errors/BadRequestData",
            "{why}"
        );
    }

    let (status, _, _) = call_as(&c, "DELETE", path, &[], None).await;
    assert_eq!(status, 204);
    let (status, _, body) = call_as(&c, "GET", path, &[], None).await;
    assert_eq!(status, 404);
    assert_eq!(
        body["type"],
        "https://uri.etsi.org/ngsi-ld/errors/ResourceNotFound"
    );
    let (status, _, _) = call_as(&c, "DELETE", path, &[], None).await;
    assert_eq!(status, 404);
    let (_, headers, _) =
        call_as(&c, "GET", "/ngsi-ld/v1/subscriptions?count=true", &[], None).await;
    assert_eq!(headers["ngsild-results-count"], "1");
}

/// 5.3.1 and the default triggers: a change of a watched attribute for
/// which `q` holds is notified as an NGSI-LD Notification with the
/// attributes asked and a `Link` header; other attributes, a `q` that
/// does not hold, and a deletion notify nothing. A change through `/v2`
/// notifies the same subscriber.
#[tokio::test]
async fn watched_changes_are_notified_as_ngsi_ld() {
    let server = Server::start();
    let c = server.client();
    let mut receiver = Receiver::start().await;
    let id = "urn:ngsi-ld:Vehicle:N1";
    let (status, body) = post_json(
        &c,
        "/ngsi-ld/v1/subscriptions",
        &[],
        &json!({
            "type": "Subscription",
            "entities": [{"type": "Vehicle"}],
            "watchedAttributes": ["speed"],
            "q": "speed>50",
            "notification": {"attributes": ["speed"],
                              "endpoint": {"uri": format!("{}/ld", receiver.base)}}
        }),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let sub_id = body["location"]
        .as_str()
        .unwrap()
        .rsplit('/')
        .next()
        .unwrap()
        .to_string();

    // Created with speed 60: an attribute created, q holds.
    let (status, _) = post_json(&c, "/ngsi-ld/v1/entities", &[], &vehicle(id, 60)).await;
    assert_eq!(status, 201);
    let seen = receiver.next().await;
    assert_eq!(seen.method, "POST");
    assert_eq!(seen.target, "/ld");
    assert_eq!(seen.header("content-type"), Some(JSON));
    assert!(seen
        .header("link")
        .unwrap()
        .contains("ngsi-ld-core-context"));
    let n = seen.json();
    assert_eq!(n["type"], "Notification");
    assert!(n["id"]
        .as_str()
        .unwrap()
        .starts_with("urn:ngsi-ld:Notification:"));
    assert_eq!(n["subscriptionId"], sub_id);
    assert!(n["notifiedAt"].is_string());
    assert_eq!(
        n["data"],
        json!([{"id": id, "type": "Vehicle", "speed": {"type": "Property", "value": 60}}])
    );

    patch_speed(&c, id, 70).await;
    assert_eq!(
        receiver.next().await.json()["data"][0]["speed"]["value"],
        70
    );
    // Not watched; q does not hold.
    let (status, _, _) = call_as(
        &c,
        "PATCH",
        &format!("/ngsi-ld/v1/entities/{id}/attrs"),
        &[],
        Some((
            JSON,
            &json!({"brandName": {"type": "Property", "value": "Volvo"}}),
        )),
    )
    .await;
    assert_eq!(status, 204);
    patch_speed(&c, id, 40).await;
    receiver.nothing_more().await;

    // The same entity through NGSIv2.
    let (status, _, body) = call(
        &c,
        "PATCH",
        &format!("/v2/entities/{id}/attrs"),
        &[],
        Some(&json!({"speed": {"type": "Property", "value": 90}})),
    )
    .await;
    assert_eq!(status, 204, "{body}");
    assert_eq!(
        receiver.next().await.json()["data"][0]["speed"]["value"],
        90
    );

    // Deletion is not among the default triggers.
    let (status, _, _) = call_as(
        &c,
        "DELETE",
        &format!("/ngsi-ld/v1/entities/{id}"),
        &[],
        None,
    )
    .await;
    assert_eq!(status, 204);
    receiver.nothing_more().await;

    // The counters.
    let (_, _, got) = call_as(
        &c,
        "GET",
        &format!("/ngsi-ld/v1/subscriptions/{sub_id}"),
        &[],
        None,
    )
    .await;
    assert_eq!(got["notification"]["timesSent"], 3, "{got}");
    assert_eq!(got["notification"]["status"], "ok");
    assert!(got["notification"]["lastSuccess"].is_string());
}

/// `accept: application/ld+json` puts the context in the notification;
/// `keyValues`, `entityDeleted`, `attributeDeleted`, `showChanges`,
/// `receiverInfo` as headers, a tenant named by `NGSILD-Tenant`, and a
/// `geoQ` that must hold.
#[tokio::test]
async fn formats_triggers_and_geo_queries() {
    let server = Server::start();
    let c = server.client();
    let mut receiver = Receiver::start().await;
    let tenant = [("NGSILD-Tenant", "fleet")];
    let (status, body) = post_json(
        &c,
        "/ngsi-ld/v1/subscriptions",
        &tenant,
        &json!({
            "type": "Subscription",
            "entities": [{"idPattern": "urn:ngsi-ld:Vehicle:.*", "type": "Vehicle"}],
            "notificationTrigger": ["attributeUpdated", "attributeDeleted", "entityDeleted"],
            "geoQ": {"geometry": "Point", "coordinates": [-8.5, 41.2], "georel": "near;maxDistance==1000"},
            "notification": {"format": "keyValues", "showChanges": true,
                              "endpoint": {"uri": format!("{}/ld", receiver.base), "accept": LD,
                                           "receiverInfo": [{"key": "X-Fleet", "value": "north"}]}}
        }),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let id = "urn:ngsi-ld:Vehicle:G1";
    let (status, _) = post_json(&c, "/ngsi-ld/v1/entities", &tenant, &vehicle(id, 10)).await;
    assert_eq!(status, 201);
    // Creation is not asked for.
    receiver.nothing_more().await;

    patch_in(
        &c,
        &tenant,
        id,
        json!({"speed": {"type": "Property", "value": 20}}),
    )
    .await;
    let seen = receiver.next().await;
    assert_eq!(seen.header("content-type"), Some(LD));
    assert_eq!(seen.header("ngsild-tenant"), Some("fleet"));
    assert_eq!(seen.header("x-fleet"), Some("north"));
    assert!(seen.header("link").is_none());
    let n = seen.json();
    assert!(
        n["@context"].to_string().contains("ngsi-ld-core-context"),
        "{n}"
    );
    assert_eq!(n["data"][0]["speed"], 20, "keyValues: {n}");
    assert_eq!(n["data"][0]["brandName"], "Mercedes");

    // Moved away: geoQ no longer holds.
    patch_in(
        &c,
        &tenant,
        id,
        json!({"location": {"type": "GeoProperty", "value": {"type": "Point", "coordinates": [10.0, 50.0]}}}),
    )
    .await;
    receiver.nothing_more().await;
    patch_in(
        &c,
        &tenant,
        id,
        json!({"location": {"type": "GeoProperty", "value": {"type": "Point", "coordinates": [-8.5, 41.2]}}}),
    )
    .await;
    receiver.next().await;

    // An attribute removed.
    let (status, _, _) = call_as(
        &c,
        "DELETE",
        &format!("/ngsi-ld/v1/entities/{id}/attrs/brandName"),
        &tenant,
        None,
    )
    .await;
    assert_eq!(status, 204);
    let n = receiver.next().await.json();
    // Shown as deleted (4.5.22): in keyValues, the null URI.
    assert_eq!(n["data"][0]["brandName"], "urn:ngsi-ld:null", "{n}");
    assert_eq!(n["data"][0]["speed"], 20, "{n}");

    // The entity removed: its id and type.
    let (status, _, _) = call_as(
        &c,
        "DELETE",
        &format!("/ngsi-ld/v1/entities/{id}"),
        &tenant,
        None,
    )
    .await;
    assert_eq!(status, 204);
    let n = receiver.next().await.json();
    let gone = &n["data"][0];
    assert_eq!(
        (&gone["id"], &gone["type"]),
        (&json!(id), &json!("Vehicle"))
    );
    assert!(gone["deletedAt"].is_string(), "{n}");
    // Nothing watched, changes shown: every attribute as deleted.
    assert_eq!(gone["speed"], "urn:ngsi-ld:null", "{n}");
    // A JSON-LD notification's entities carry the context too.
    assert_eq!(gone["@context"], n["@context"]);

    // Another tenant's entity notifies nothing.
    let (status, _) = post_json(&c, "/ngsi-ld/v1/entities", &[], &vehicle(id, 10)).await;
    assert_eq!(status, 201);
    patch_speed(&c, id, 30).await;
    receiver.nothing_more().await;
}

/// `showChanges` in the normalized format: the value before beside the
/// value after.
#[tokio::test]
async fn show_changes_sends_the_previous_value() {
    let server = Server::start();
    let c = server.client();
    let mut receiver = Receiver::start().await;
    let id = "urn:ngsi-ld:Vehicle:S1";
    let (status, _) = post_json(&c, "/ngsi-ld/v1/entities", &[], &vehicle(id, 10)).await;
    assert_eq!(status, 201);
    let (status, body) = post_json(
        &c,
        "/ngsi-ld/v1/subscriptions",
        &[],
        &json!({
            "type": "Subscription",
            "entities": [{"id": id, "type": "Vehicle"}],
            "watchedAttributes": ["speed"],
            "notification": {"attributes": ["speed"], "showChanges": true,
                              "endpoint": {"uri": receiver.base.clone()}}
        }),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    patch_speed(&c, id, 11).await;
    let n = receiver.next().await.json();
    assert_eq!(
        n["data"][0]["speed"],
        json!({"type": "Property", "value": 11, "previousValue": 10})
    );
}

async fn patch_in(c: &Client, headers: &[(&str, &str)], id: &str, body: Value) {
    let (status, _, reply) = call_as(
        c,
        "PATCH",
        &format!("/ngsi-ld/v1/entities/{id}/attrs"),
        headers,
        Some((JSON, &body)),
    )
    .await;
    assert_eq!(status, 204, "{reply}");
}

/// A subscription written with a remote context is kept across a restart
/// with that context: it still reads its names, and notifies in its
/// terms, without fetching the context again.
#[tokio::test]
async fn a_subscription_keeps_its_context_across_a_restart() {
    let mut server = Server::start();
    let c = server.client();
    let mut context_server = Receiver::start().await;
    context_server.answer(
        200,
        &json!({"@context": {"velocity": "http://example.org/vocab/speed",
                              "Car": "http://example.org/vocab/Car"}})
        .to_string(),
    );
    let context_url = format!("{}/context.jsonld", context_server.base);
    let with_link = link(&context_url);
    let headers = [("Link", with_link.as_str())];
    let mut receiver = Receiver::start().await;
    let (status, body) = post_json(
        &c,
        "/ngsi-ld/v1/subscriptions",
        &headers,
        &json!({
            "id": "urn:ngsi-ld:Subscription:cars",
            "type": "Subscription",
            "entities": [{"type": "Car"}],
            "watchedAttributes": ["velocity"],
            "q": "velocity>100",
            "notification": {"attributes": ["velocity"], "endpoint": {"uri": receiver.base.clone()}}
        }),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    context_server.next().await;

    server.restart();
    let c = server.client();
    // Read back without a context: in the terms it was written with.
    let (status, _, got) = call_as(
        &c,
        "GET",
        "/ngsi-ld/v1/subscriptions/urn:ngsi-ld:Subscription:cars",
        &[],
        None,
    )
    .await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["entities"][0]["type"], "Car");
    assert_eq!(got["watchedAttributes"], json!(["velocity"]));

    // Written with the full names and no context: notified in the
    // subscription's terms.
    let (status, body) = post_json(
        &c,
        "/ngsi-ld/v1/entities",
        &[],
        &json!({"id": "urn:ngsi-ld:Car:1", "type": "http://example.org/vocab/Car",
                "http://example.org/vocab/speed": {"type": "Property", "value": 120}}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let seen = receiver.next().await;
    assert!(seen.header("link").unwrap().contains(&context_url));
    assert_eq!(
        seen.json()["data"],
        json!([{"id": "urn:ngsi-ld:Car:1", "type": "Car",
                "velocity": {"type": "Property", "value": 120}}])
    );
    assert!(
        context_server
            .next_within(Duration::from_millis(300))
            .await
            .is_none(),
        "the context was fetched again"
    );
}

/// An `mqtt://` endpoint: the notification published on the URI's topic
/// as `{"metadata", "body"}`, with the QoS of `notifierInfo`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_endpoints_receive_the_notification_with_its_metadata() {
    let url = broker_url();
    let server = Server::start();
    let c = server.client();
    let topic = unique("ngsild/");
    let mut subscriber = Mqtt::connect(&url, &unique("sub-"), None).await;
    subscriber.subscribe(&topic).await;
    let (status, body) = post_json(
        &c,
        "/ngsi-ld/v1/subscriptions",
        &[],
        &json!({
            "type": "Subscription",
            "entities": [{"type": "Vehicle"}],
            "notification": {"attributes": ["speed"],
                              "endpoint": {"uri": format!("{url}/{topic}"),
                                           "notifierInfo": [{"key": "MQTT-QoS", "value": "1"}],
                                           "receiverInfo": [{"key": "fleet", "value": "north"}]}}
        }),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let id = "urn:ngsi-ld:Vehicle:M1";
    let (status, _) = post_json(&c, "/ngsi-ld/v1/entities", &[], &vehicle(id, 33)).await;
    assert_eq!(status, 201);
    let (got_topic, payload) = subscriber.next().await;
    assert_eq!(got_topic, topic);
    let message: Value = serde_json::from_slice(&payload).unwrap();
    assert_eq!(message["metadata"]["Content-Type"], JSON);
    assert_eq!(message["metadata"]["fleet"], "north");
    assert!(message["metadata"]["Link"]
        .as_str()
        .unwrap()
        .contains("ngsi-ld-core-context"));
    assert_eq!(message["body"]["type"], "Notification");
    assert_eq!(message["body"]["data"][0]["speed"]["value"], 33);
}

/// A periodic subscription (`timeInterval`) notifies every interval with
/// every entity it selects as it is then, and nothing on changes; paused,
/// it sends nothing.
#[tokio::test]
async fn a_periodic_subscription_notifies_every_interval_with_what_it_selects() {
    let server = Server::start();
    let c = server.client();
    let mut receiver = Receiver::start().await;
    for (id, speed) in [
        ("urn:ngsi-ld:Vehicle:P1", 10),
        ("urn:ngsi-ld:Vehicle:P2", 90),
    ] {
        let (status, _) = post_json(&c, "/ngsi-ld/v1/entities", &[], &vehicle(id, speed)).await;
        assert_eq!(status, 201);
    }
    let (status, body) = post_json(
        &c,
        "/ngsi-ld/v1/subscriptions",
        &[],
        &json!({
            "id": "urn:ngsi-ld:Subscription:every-second",
            "type": "Subscription",
            "entities": [{"type": "Vehicle"}],
            "q": "speed>50",
            "timeInterval": 1,
            "notification": {"attributes": ["speed"], "format": "keyValues",
                              "endpoint": {"uri": receiver.base.clone()}}
        }),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let first = receiver.next().await.json();
    assert_eq!(
        first["data"],
        json!([{"id": "urn:ngsi-ld:Vehicle:P2", "type": "Vehicle", "speed": 90}])
    );
    // A change is not notified by itself; the next period shows it.
    patch_speed(&c, "urn:ngsi-ld:Vehicle:P1", 60).await;
    let started = std::time::Instant::now();
    let second = receiver.next().await.json();
    assert!(
        started.elapsed() > Duration::from_millis(200),
        "sent on the change"
    );
    assert_eq!(second["data"].as_array().unwrap().len(), 2, "{second}");

    let (_, _, got) = call_as(
        &c,
        "GET",
        "/ngsi-ld/v1/subscriptions/urn:ngsi-ld:Subscription:every-second",
        &[],
        None,
    )
    .await;
    assert_eq!(got["timeInterval"], 1);
    let (status, _, _) = call_as(
        &c,
        "PATCH",
        "/ngsi-ld/v1/subscriptions/urn:ngsi-ld:Subscription:every-second",
        &[],
        Some((JSON, &json!({"isActive": false}))),
    )
    .await;
    assert_eq!(status, 204);
    // One may have been on its way.
    let _ = receiver.next_within(Duration::from_millis(300)).await;
    assert!(
        receiver
            .next_within(Duration::from_millis(2500))
            .await
            .is_none(),
        "a paused subscription notified"
    );
}
