//! Self-notification loops: subscriptions whose notifications write back
//! into weft's own `/v2`, changing the entity they watch. Each would
//! notify itself for ever; weft stops them as Orion does (a custom
//! notification changing an entity whose last change came from the same
//! correlator triggers nothing) and, for notifications Orion's rule does
//! not cover, at a notification depth of 16 (`cbnotif` marks); and a
//! registration pointing at weft itself stops at a forward depth of 8. weft
//! passes no API key on in notifications, so each subscription carries
//! one in its own headers, as a real one writing into weft would.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::ngsi::call;
use crate::util::*;

/// The deepest notification weft sends (docs/ngsi.md).
const MAX_NOTIFICATION_DEPTH: u64 = 16;

/// Creates entity `E1` of type `T` with `n` = 0 and a subscription to its
/// `n` notifying with `notification`; the subscription's id.
async fn watched(c: &Client, notification: Value) -> String {
    let entity = json!({"id": "E1", "type": "T", "n": {"value": 0, "type": "Number"}});
    let (status, _, reply) = call(c, "POST", "/v2/entities", None, Some(&entity)).await;
    assert_eq!(status, 201, "{reply}");
    let sub = json!({
        "subject": {"entities": [{"id": "E1", "type": "T"}],
                    "condition": {"attrs": ["n"]}},
        "notification": notification,
    });
    let (status, headers, reply) = call(c, "POST", "/v2/subscriptions", None, Some(&sub)).await;
    assert_eq!(status, 201, "{reply}");
    headers["location"]
        .to_str()
        .unwrap()
        .rsplit('/')
        .next()
        .unwrap()
        .to_string()
}

/// Changes `n` once from outside, then waits for the subscription's
/// `timesSent` to stop changing (1.5 s without a change; 20 s at most);
/// answers it, checking on the way that weft answers a read within a
/// second every time.
async fn settle(c: &Client, id: &str) -> u64 {
    let change = json!({"n": {"value": 1, "type": "Number"}});
    let (status, _, reply) = call(c, "PATCH", "/v2/entities/E1/attrs", None, Some(&change)).await;
    assert_eq!(status, 204, "{reply}");
    let path = format!("/v2/subscriptions/{id}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = (u64::MAX, Instant::now());
    loop {
        let asked = Instant::now();
        let (status, _, sub) = call(c, "GET", &path, None, None).await;
        assert_eq!(status, 200, "{sub}");
        assert!(
            asked.elapsed() < Duration::from_secs(1),
            "weft took {:?} to answer a read",
            asked.elapsed()
        );
        let sent = sub["notification"]["timesSent"].as_u64().unwrap_or(0);
        if sent != last.0 {
            last = (sent, Instant::now());
        } else if last.1.elapsed() >= Duration::from_millis(1500) {
            return sent;
        }
        assert!(
            Instant::now() < deadline,
            "timesSent still changing after 20 s: {sent}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `n` of `E1` now.
async fn n(c: &Client) -> Value {
    let (status, _, entity) = call(c, "GET", "/v2/entities/E1?options=keyValues", None, None).await;
    assert_eq!(status, 200, "{entity}");
    entity["n"].clone()
}

/// A custom notification PATCHing the entity it watches (adding one to
/// `n` each time): the write-back is applied once and notifies no one, so
/// one outside change costs one notification, as on Orion.
#[tokio::test]
async fn a_custom_patch_of_the_watched_entity_notifies_once() {
    let server = Server::start();
    let c = server.client();
    let id = watched(
        &c,
        json!({"httpCustom": {
            "url": format!("{}/v2/entities/E1/attrs?type=T", server.url),
            "method": "PATCH",
            "headers": {"X-Auth-Token": ADMIN_KEY},
            "json": {"n": {"value": "${n+1}", "type": "Number"}}}}),
    )
    .await;
    let sent = settle(&c, &id).await;
    assert_eq!(sent, 1, "one notification per outside change");
    assert_eq!(n(&c).await, json!(2), "the write-back itself is applied");
    // The next outside change notifies again (once).
    let sent = settle(&c, &id).await;
    assert_eq!(sent, 2);
}

/// The same loop through `/v2/op/update`.
#[tokio::test]
async fn a_custom_op_update_of_the_watched_entity_notifies_once() {
    let server = Server::start();
    let c = server.client();
    let id = watched(
        &c,
        json!({"httpCustom": {
            "url": format!("{}/v2/op/update", server.url),
            "headers": {"X-Auth-Token": ADMIN_KEY},
            "json": {"actionType": "update",
                     "entities": [{"id": "${id}", "type": "${type}",
                                   "n": {"value": "${n+1}", "type": "Number"}}]}}}),
    )
    .await;
    let sent = settle(&c, &id).await;
    assert_eq!(sent, 1, "one notification per outside change");
    assert_eq!(n(&c).await, json!(2));
}

/// A notification Orion's rule does not cover (an `ngsi` patch, sent as a
/// normalized notification to `/v2/op/notify`) still stops: each hop adds
/// a `cbnotif` mark to the correlator, and a change made that many
/// notifications deep notifies no one.
#[tokio::test]
async fn a_normalized_loop_stops_at_the_depth_limit() {
    let server = Server::start();
    let c = server.client();
    let id = watched(
        &c,
        json!({"httpCustom": {
            "url": format!("{}/v2/op/notify", server.url),
            "headers": {"X-Auth-Token": ADMIN_KEY},
            "ngsi": {"n": {"value": "${n+1}", "type": "Number"}}}}),
    )
    .await;
    let sent = settle(&c, &id).await;
    assert_eq!(
        sent, MAX_NOTIFICATION_DEPTH,
        "one notification per hop, up to the limit"
    );
    // The outside change set 1; each of the 16 notifications added one.
    assert_eq!(n(&c).await, json!(1 + MAX_NOTIFICATION_DEPTH));
}

/// A registration whose provider is weft itself would forward a query to
/// itself for ever: each hop adds a `cbfwd` mark, and a request forwarded
/// 8 times is not forwarded again, so the query answers at once. (With
/// API keys on weft never passes its own on, so such a forward is refused
/// anyway; without them, the depth is what stops it.)
#[tokio::test]
async fn a_registration_pointing_at_weft_itself_stops() {
    let server = Server::start_with_env(&[("WEFT_AUTH", "off")]);
    let c = server.client();
    let registration = json!({
        "dataProvided": {"entities": [{"id": "E9", "type": "T"}], "attrs": ["x"]},
        "provider": {"http": {"url": format!("{}/v2", server.url)}}
    });
    let (status, _, reply) = call(&c, "POST", "/v2/registrations", None, Some(&registration)).await;
    assert_eq!(status, 201, "{reply}");
    let asked = Instant::now();
    let (status, _, reply) = call(&c, "GET", "/v2/entities/E9?type=T", None, None).await;
    assert_eq!(status, 404, "{reply}");
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "answered in {:?}",
        asked.elapsed()
    );
    let (_, _, counters) = call(&c, "GET", "/admin/metrics", None, None).await;
    // One forward per hop, the ninth refused before it is sent (and
    // counted as a failed one).
    let outgoing = counters["sum"]["outgoingTransactions"].as_u64().unwrap();
    assert_eq!(outgoing, 9, "{counters}");
    assert_eq!(counters["sum"]["outgoingTransactionErrors"], json!(1));
}
