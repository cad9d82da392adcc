//! The subscription service in process: subscriptions created as
//! `POST /v2/subscriptions` creates them, entities changed through the
//! context as `/v2` changes them, notifications received by a local HTTP
//! server.
//!
//! Whether a change fires a subscription is decided while the change is
//! announced, before the write returns, and counted in `timesSent` then:
//! so a notification that must not be sent is checked on `timesSent`
//! right after the write, with no waiting.

use serde_json::{json, Value};
use weft_model::ngsi::{self, parse_attrs, parse_entity, UpdateOptions};

use crate::testkit::{
    accept, config, dead_url, decoded_uplink, eventually, plain_type, Node, Receiver,
};

async fn subscribe(node: &Node, body: Value) -> String {
    node.services
        .subscriptions
        .create("", Vec::new(), &body)
        .await
        .expect("the subscription is valid")
}

/// A subscription to every `Room`, notifying `url` (with `extra` merged
/// into the top level and `notification` into its notification).
fn rooms(url: &str, extra: Value, notification: Value) -> Value {
    let mut body = json!({
        "subject": {"entities": [{"idPattern": ".*", "type": "Room"}]},
        "notification": {"http": {"url": url}},
    });
    for (k, v) in extra.as_object().unwrap() {
        if k == "subject" {
            for (sk, sv) in v.as_object().unwrap() {
                body["subject"][sk] = sv.clone();
            }
        } else {
            body[k] = v.clone();
        }
    }
    for (k, v) in notification.as_object().unwrap() {
        body["notification"][k] = v.clone();
    }
    body
}

async fn create(node: &Node, id: &str, entity_type: &str, temperature: f64) {
    let entity = parse_entity(
        &json!({"id": id, "type": entity_type,
                "temperature": {"value": temperature, "type": "Number"},
                "pressure": {"value": 1000, "type": "Number"}}),
        false,
    )
    .unwrap();
    node.services
        .context
        .create("", "/", entity)
        .await
        .expect("created");
}

/// `PATCH /v2/entities/{id}/attrs` with `attrs` (normalized).
async fn update(node: &Node, id: &str, attrs: Value) {
    let now = weft_model::now_ms();
    node.services
        .context
        .modify("", &[], id, None, move |e| {
            let attrs = parse_attrs(&attrs, false)?;
            Ok(ngsi::update(e, attrs, UpdateOptions::default(), now))
        })
        .await
        .expect("updated");
}

/// The subscription as `GET /v2/subscriptions/{id}` renders it.
fn rendered(node: &Node, id: &str) -> Value {
    node.services.subscriptions.get("", id).unwrap()
}

fn times_sent(node: &Node, id: &str) -> u64 {
    rendered(node, id)["notification"]["timesSent"]
        .as_u64()
        .unwrap_or(0)
}

/// The value of `attr` of the entity a notification carries.
fn notified(request: &crate::testkit::Received, attr: &str) -> Value {
    request.json()["data"][0][attr]["value"].clone()
}

/// A change to a matching entity is POSTed to the subscription's URL with
/// the subscription's id and the entity as it is after the change; an
/// entity the subject does not name is not notified; the answer is
/// recorded on the subscription.
#[tokio::test]
async fn a_matching_change_is_notified_to_the_endpoint() {
    let node = Node::start(config()).await;
    let receiver = Receiver::start().await;
    let url = format!("{}/notify", receiver.url);
    let id = subscribe(&node, rooms(&url, json!({}), json!({}))).await;

    create(&node, "Car1", "Car", 5.0).await;
    create(&node, "Room1", "Room", 20.0).await;
    update(
        &node,
        "Room1",
        json!({"temperature": {"value": 25, "type": "Number"}}),
    )
    .await;
    assert_eq!(times_sent(&node, &id), 2, "the car is not a room");

    let got = receiver.wait_for("/notify", 2).await;
    // One subscription's notifications arrive in order.
    for (request, temperature) in got.iter().zip([20, 25]) {
        assert_eq!(request.method, "POST");
        let body = request.json();
        assert_eq!(body["subscriptionId"], id.as_str());
        assert_eq!(body["data"][0]["id"], "Room1");
        assert_eq!(body["data"][0]["type"], "Room");
        assert_eq!(notified(request, "temperature"), temperature);
        assert_eq!(request.header("fiware-servicepath"), Some("/"));
    }
    let stats = eventually("the answer recorded", || async {
        let n = rendered(&node, &id)["notification"].clone();
        n.get("lastSuccessCode").is_some().then_some(n)
    })
    .await;
    assert_eq!(stats["lastSuccessCode"], 200);
    assert_eq!(stats["timesSent"], 2);
    assert!(stats.get("failsCounter").is_none_or(|f| f == 0), "{stats}");
    node.stop().await;
}

/// `condition.attrs` fires only for a change of one of its attributes
/// (creation counts every attribute); `condition.expression.q` only when
/// the entity after the change passes it.
#[tokio::test]
async fn conditions_filter_notifications() {
    let node = Node::start(config()).await;
    let receiver = Receiver::start().await;
    let on_pressure = subscribe(
        &node,
        rooms(
            &format!("{}/pressure", receiver.url),
            json!({"subject": {"condition": {"attrs": ["pressure"]}}}),
            json!({}),
        ),
    )
    .await;
    let when_hot = subscribe(
        &node,
        rooms(
            &format!("{}/hot", receiver.url),
            json!({"subject": {"condition": {"expression": {"q": "temperature>30"}}}}),
            json!({}),
        ),
    )
    .await;

    create(&node, "Room1", "Room", 20.0).await;
    assert_eq!(
        (
            times_sent(&node, &on_pressure),
            times_sent(&node, &when_hot)
        ),
        (1, 0),
        "created: every attribute is new; 20 is not > 30"
    );
    update(
        &node,
        "Room1",
        json!({"temperature": {"value": 25, "type": "Number"}}),
    )
    .await;
    assert_eq!(
        (
            times_sent(&node, &on_pressure),
            times_sent(&node, &when_hot)
        ),
        (1, 0),
        "only the temperature changed, to 25"
    );
    update(
        &node,
        "Room1",
        json!({"temperature": {"value": 35, "type": "Number"}}),
    )
    .await;
    assert_eq!(
        (
            times_sent(&node, &on_pressure),
            times_sent(&node, &when_hot)
        ),
        (1, 1)
    );
    update(
        &node,
        "Room1",
        json!({"pressure": {"value": 990, "type": "Number"}}),
    )
    .await;
    assert_eq!(
        (
            times_sent(&node, &on_pressure),
            times_sent(&node, &when_hot)
        ),
        (2, 2),
        "the pressure changed, and the room is still hot"
    );
    // An update that changes nothing is no change.
    update(
        &node,
        "Room1",
        json!({"pressure": {"value": 990, "type": "Number"}}),
    )
    .await;
    assert_eq!(times_sent(&node, &on_pressure), 2);

    let pressure = receiver.wait_for("/pressure", 2).await;
    assert_eq!(notified(&pressure[0], "pressure"), 1000);
    assert_eq!(notified(&pressure[1], "pressure"), 990);
    let hot = receiver.wait_for("/hot", 2).await;
    assert_eq!(notified(&hot[0], "temperature"), 35);
    assert_eq!(notified(&hot[1], "pressure"), 990);
    node.stop().await;
}

/// `throttling` drops changes inside its window; an `expires` in the past
/// and `status: inactive` send nothing; `oneshot` sends once and becomes
/// inactive; an inactive subscription made active again notifies again.
#[tokio::test]
async fn throttling_expiry_and_status_suppress_notifications() {
    let node = Node::start(config()).await;
    let receiver = Receiver::start().await;
    let url = |path: &str| format!("{}/{path}", receiver.url);
    let throttled = subscribe(
        &node,
        rooms(&url("throttled"), json!({"throttling": 3600}), json!({})),
    )
    .await;
    let expired = subscribe(
        &node,
        rooms(
            &url("expired"),
            json!({"expires": "2020-01-01T00:00:00.000Z"}),
            json!({}),
        ),
    )
    .await;
    let inactive = subscribe(
        &node,
        rooms(&url("inactive"), json!({"status": "inactive"}), json!({})),
    )
    .await;
    let oneshot = subscribe(
        &node,
        rooms(&url("oneshot"), json!({"status": "oneshot"}), json!({})),
    )
    .await;
    assert_eq!(rendered(&node, &expired)["status"], "expired");

    create(&node, "Room1", "Room", 20.0).await;
    for t in [21, 22] {
        update(
            &node,
            "Room1",
            json!({"temperature": {"value": t, "type": "Number"}}),
        )
        .await;
    }
    assert_eq!(times_sent(&node, &throttled), 1, "inside the window");
    assert_eq!(times_sent(&node, &expired), 0);
    assert_eq!(times_sent(&node, &inactive), 0);
    assert_eq!(times_sent(&node, &oneshot), 1);
    assert_eq!(rendered(&node, &oneshot)["status"], "inactive");

    node.services
        .subscriptions
        .patch("", &inactive, &json!({"status": "active"}))
        .await
        .unwrap();
    update(
        &node,
        "Room1",
        json!({"temperature": {"value": 23, "type": "Number"}}),
    )
    .await;
    assert_eq!(times_sent(&node, &inactive), 1);
    assert_eq!(times_sent(&node, &throttled), 1);
    assert_eq!(times_sent(&node, &oneshot), 1);

    let got = receiver.wait_for("/inactive", 1).await;
    assert_eq!(notified(&got[0], "temperature"), 23);
    let got = receiver.wait_for("/throttled", 1).await;
    assert_eq!(notified(&got[0], "temperature"), 20);
    let got = receiver.wait_for("/oneshot", 1).await;
    assert_eq!(notified(&got[0], "temperature"), 20);
    assert!(receiver.requests_to("/expired").is_empty());
    node.stop().await;
}

/// A notification nobody receives is a failure, counted with its reason;
/// at `maxFailsLimit` failures in a row the subscription becomes
/// inactive and sends nothing more. An error status is an answer, so a
/// success (as in Orion).
#[tokio::test]
async fn failures_are_counted_and_the_limit_deactivates() {
    let node = Node::start(config()).await;
    let receiver = Receiver::start().await;
    let dead = subscribe(
        &node,
        rooms(&dead_url(), json!({}), json!({"maxFailsLimit": 2})),
    )
    .await;
    let erring = subscribe(
        &node,
        rooms(&format!("{}/erring", receiver.url), json!({}), json!({})),
    )
    .await;
    receiver.answer(500);

    create(&node, "Room1", "Room", 20.0).await;
    let stats = eventually("the 500 recorded", || async {
        let n = rendered(&node, &erring)["notification"].clone();
        (n.get("lastSuccess").is_some() || n.get("lastFailure").is_some()).then_some(n)
    })
    .await;
    assert_eq!(stats["lastSuccessCode"], 500, "{stats}");
    assert!(stats.get("failsCounter").is_none_or(|f| f == 0), "{stats}");

    let stats = eventually("the first failure counted", || async {
        let n = rendered(&node, &dead)["notification"].clone();
        (n["failsCounter"] == 1).then_some(n)
    })
    .await;
    assert_eq!(stats["lastFailureReason"], "Couldn't connect to server");
    assert!(stats.get("lastSuccess").is_none(), "{stats}");
    assert_eq!(rendered(&node, &dead)["status"], "active");

    update(
        &node,
        "Room1",
        json!({"temperature": {"value": 21, "type": "Number"}}),
    )
    .await;
    eventually("the limit reached", || async {
        let s = rendered(&node, &dead);
        (s["status"] == "inactive").then_some(())
    })
    .await;
    assert_eq!(rendered(&node, &dead)["notification"]["failsCounter"], 2);
    update(
        &node,
        "Room1",
        json!({"temperature": {"value": 22, "type": "Number"}}),
    )
    .await;
    assert_eq!(times_sent(&node, &dead), 2, "inactive: nothing sent");
    assert_eq!(times_sent(&node, &erring), 3);
    node.stop().await;
}

/// Subscriptions and their counters are stored: after a restart they are
/// there with what they counted, and they notify again.
#[tokio::test]
async fn subscriptions_and_counters_survive_a_restart() {
    let node = Node::start(config()).await;
    let receiver = Receiver::start().await;
    let id = subscribe(
        &node,
        rooms(&format!("{}/notify", receiver.url), json!({}), json!({})),
    )
    .await;
    create(&node, "Room1", "Room", 20.0).await;
    receiver.wait_for("/notify", 1).await;
    eventually("the answer recorded", || async {
        rendered(&node, &id)["notification"]
            .get("lastSuccessCode")
            .map(|_| ())
    })
    .await;

    let node = node.restart().await;
    let stats = rendered(&node, &id)["notification"].clone();
    assert_eq!(stats["timesSent"], 1, "{stats}");
    assert_eq!(stats["lastSuccessCode"], 200, "{stats}");
    update(
        &node,
        "Room1",
        json!({"temperature": {"value": 26, "type": "Number"}}),
    )
    .await;
    let got = receiver.wait_for("/notify", 2).await;
    assert_eq!(notified(&got[1], "temperature"), 26);
    assert_eq!(times_sent(&node, &id), 2);
    node.stop().await;
}

/// Device data changes its device's entity, and that change is notified
/// as one made through `/v2` is; a deleted subscription notifies nothing
/// more.
#[tokio::test]
async fn device_data_is_notified_until_the_subscription_is_deleted() {
    let node = Node::start(config()).await;
    let receiver = Receiver::start().await;
    plain_type(&node, "thermo").await;
    let id = subscribe(
        &node,
        json!({"subject": {"entities": [{"id": "t1", "type": "thermo"}],
                           "condition": {"attrs": ["temperature"]}},
               "notification": {"http": {"url": format!("{}/device", receiver.url)},
                                "attrs": ["temperature"]}}),
    )
    .await;
    for (uuid, t) in [("u-1", 20), ("u-2", 21)] {
        accept(
            &node,
            decoded_uplink(
                "thermo",
                json!({"uuid": uuid, "id": "t1", "temperature": t}),
            ),
        )
        .await;
    }
    let got = receiver.wait_for("/device", 2).await;
    assert_eq!(notified(&got[0], "temperature"), 20);
    assert_eq!(notified(&got[1], "temperature"), 21);
    let entity = &got[1].json()["data"][0];
    assert_eq!(entity["id"], "t1");
    assert_eq!(entity["type"], "thermo");
    assert!(
        entity.get("dateObserved").is_none(),
        "only the attributes asked for: {entity}"
    );

    node.services
        .subscriptions
        .delete("", &id, super::Api::NgsiV2)
        .await
        .unwrap();
    assert!(node.services.subscriptions.get("", &id).is_err());
    accept(
        &node,
        decoded_uplink(
            "thermo",
            json!({"uuid": "u-3", "id": "t1", "temperature": 22}),
        ),
    )
    .await;
    eventually("the third unit applied", || async {
        let e = node
            .services
            .context
            .get("", &[], "t1", Some("thermo"))
            .ok()?;
        (e.entity.attrs.get("temperature")?.value == 22).then_some(())
    })
    .await;
    assert!(node.services.subscriptions.list("").is_empty());
    node.stop().await;
}

/// A `oneshot` subscription that fired is `inactive` for good: after a
/// restart it is still inactive and a change notifies nothing.
#[tokio::test]
async fn a_fired_oneshot_stays_inactive_after_a_restart() {
    let node = Node::start(config()).await;
    let receiver = Receiver::start().await;
    let id = subscribe(
        &node,
        rooms(
            &format!("{}/oneshot", receiver.url),
            json!({"status": "oneshot"}),
            json!({}),
        ),
    )
    .await;
    create(&node, "Room1", "Room", 20.0).await;
    assert_eq!(rendered(&node, &id)["status"], "inactive");
    receiver.wait_for("/oneshot", 1).await;
    eventually("the answer recorded", || async {
        rendered(&node, &id)["notification"]
            .get("lastSuccessCode")
            .map(|_| ())
    })
    .await;

    let node = node.restart().await;
    assert_eq!(
        rendered(&node, &id)["status"],
        "inactive",
        "the status it took when it fired is kept"
    );
    update(
        &node,
        "Room1",
        json!({"temperature": {"value": 26, "type": "Number"}}),
    )
    .await;
    assert_eq!(times_sent(&node, &id), 1, "a oneshot fires once");
    node.stop().await;
}

/// A subscription asking for `entityDelete` is notified of a deletion
/// (with the entity as it was), whatever its `condition.attrs`; one in a
/// service path sees only the entities under it.
#[tokio::test]
async fn deletions_and_service_paths() {
    let node = Node::start(config()).await;
    let receiver = Receiver::start().await;
    let deleted = subscribe(
        &node,
        rooms(
            &format!("{}/deleted", receiver.url),
            json!({"subject": {"condition": {"attrs": ["pressure"],
                                             "alterationTypes": ["entityDelete"]}}}),
            json!({}),
        ),
    )
    .await;
    let under_a = node
        .services
        .subscriptions
        .create(
            "",
            vec!["/a/#".into()],
            &rooms(&format!("{}/a", receiver.url), json!({}), json!({})),
        )
        .await
        .unwrap();
    create(&node, "Room1", "Room", 20.0).await;
    let in_b = parse_entity(&json!({"id": "Room2", "type": "Room"}), false).unwrap();
    node.services.context.create("", "/b", in_b).await.unwrap();
    let in_a = parse_entity(&json!({"id": "Room3", "type": "Room"}), false).unwrap();
    node.services
        .context
        .create("", "/a/x", in_a)
        .await
        .unwrap();
    assert_eq!(times_sent(&node, &deleted), 0, "no creation asked for");
    assert_eq!(times_sent(&node, &under_a), 1, "only /a/x is under /a");

    node.services
        .context
        .delete("", &[], "Room1", None)
        .await
        .unwrap();
    let got = receiver.wait_for("/deleted", 1).await;
    assert_eq!(got[0].json()["data"][0]["id"], "Room1");
    assert_eq!(notified(&got[0], "temperature"), 20);
    let got = receiver.wait_for("/a", 1).await;
    assert_eq!(got[0].json()["data"][0]["id"], "Room3");
    assert_eq!(got[0].header("fiware-servicepath"), Some("/a/x"));
    node.stop().await;
}

/// Throttling holds across a restart: a change inside the window of the
/// last notification (stored as `lastNotification`) is not notified.
#[tokio::test]
async fn throttling_holds_across_a_restart() {
    let node = Node::start(config()).await;
    let receiver = Receiver::start().await;
    let id = subscribe(
        &node,
        rooms(
            &format!("{}/throttled", receiver.url),
            json!({"throttling": 3600}),
            json!({}),
        ),
    )
    .await;
    create(&node, "Room1", "Room", 20.0).await;
    assert_eq!(times_sent(&node, &id), 1);
    receiver.wait_for("/throttled", 1).await;

    let node = node.restart().await;
    update(
        &node,
        "Room1",
        json!({"temperature": {"value": 26, "type": "Number"}}),
    )
    .await;
    assert_eq!(times_sent(&node, &id), 1, "still inside the window");
    node.stop().await;
}
