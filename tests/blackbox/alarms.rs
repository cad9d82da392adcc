//! Rules and alarms: a threshold rule raises one active alarm per device
//! and updates it on repeats; `clear`, `for`, `repeat`, inactivity and
//! script rules; ack and clear over the API; alarms on the live socket and
//! as NGSI entities; rule edits apply to the next uplink; rule state and
//! alarms survive kill -9.

use std::time::Duration;

use serde_json::{json, Value};

use crate::util::*;

/// The spec's example rule with `condition`/extra fields overridden.
fn rule(extra: Value) -> Value {
    let mut r = json!({
        "name": "Hot soil", "enabled": true,
        "scope": {"types": ["em300th"], "channels": [], "devices": [], "records": {}},
        "condition": "temperature>45.1", "for": "0s", "repeat": 1,
        "clear": "temperature<40",
        "alarm": {"type": "hot", "category": "perfTest", "subCategory": "alarmPerformance",
                  "severity": "critical", "description": "{{dataId}};{{reportedAt}};{{device.id}}"}
    });
    for (k, v) in extra.as_object().unwrap() {
        r[k] = v.clone();
    }
    r
}

/// `PUT /api/v1/rules/{id}`, asserting the status; the rule as answered.
async fn put_rule(c: &Client, id: &str, status: u16, body: &Value) -> Value {
    c.expect(status, "PUT", &format!("/api/v1/rules/{id}"), Some(body))
        .await
}

/// Sends a decoded em300th uplink for `device` at `temperature`.
async fn send(c: &Client, id: &str, device: &str, temperature: i64, reported_at: i64) {
    c.uplink(
        "field",
        "decoded",
        "em300th",
        &decoded_body(id, device, temperature, 50, reported_at),
    )
    .await;
}

/// The next alarm event on `live` (10 s at most).
async fn next_alarm(live: &mut Live) -> Value {
    let m = live.next().await;
    assert_eq!(m["type"], "event", "{m}");
    m["event"].clone()
}

/// Active alarms of `device`.
async fn active(c: &Client, device: &str) -> Vec<Value> {
    let path = format!("/api/v1/alarms?state=active&device={device}");
    c.expect(200, "GET", &path, None)
        .await
        .as_array()
        .unwrap()
        .clone()
}

/// A threshold rule raises exactly one active alarm per device, updates
/// it on repeats (count, dataIds, description), and its `clear` clears
/// it; each change is an event on the socket, in order, and the alarm is
/// an NGSI entity. Units below the threshold raise nothing.
#[tokio::test]
async fn threshold_rule_raises_updates_and_clears_one_alarm_per_device() {
    let server = Server::start();
    let c = server.client();
    c.create_em300th().await;
    let created = c
        .expect(201, "PUT", "/api/v1/rules/hot-soil", Some(&rule(json!({}))))
        .await;
    assert_eq!(created["id"], "hot-soil");
    put_rule(&c, "hot-soil", 200, &rule(json!({}))).await;
    let mut live = Live::connect(&server).await;
    live.subscribe("a", "alarms", json!({})).await;

    let t0 = now_ms();
    send(&c, "u1", "d1", 20, t0).await;
    send(&c, "u2", "d1", 46, t0 + 1).await;
    let raised = next_alarm(&mut live).await;
    assert_eq!(raised["change"], "raised");
    assert_eq!(raised["device"]["id"], "d1");
    assert_eq!(raised["type"], "hot");
    assert_eq!(raised["severity"], "critical");
    assert_eq!(raised["state"], "active");
    assert_eq!(raised["acked"], false);
    assert_eq!(raised["count"], 1);
    assert_eq!(raised["rule"], "hot-soil");
    assert_eq!(raised["dataIds"], json!(["u2"]));
    assert_eq!(raised["description"], format!("u2;{};d1", t0 + 1));
    let id = raised["id"].as_str().unwrap().to_string();
    assert_eq!(raised["eventId"], format!("{id}-1"));

    send(&c, "u3", "d1", 47, t0 + 2).await;
    send(&c, "u4", "d2", 48, t0 + 3).await;
    let updated = next_alarm(&mut live).await;
    assert_eq!(updated["change"], "updated");
    assert_eq!(updated["id"], id.as_str());
    assert_eq!(updated["count"], 2);
    assert_eq!(updated["dataIds"], json!(["u2", "u3"]));
    let other = next_alarm(&mut live).await;
    assert_eq!(other["change"], "raised");
    assert_eq!(other["device"]["id"], "d2");

    assert_eq!(active(&c, "d1").await.len(), 1);
    assert_eq!(active(&c, "d1").await[0]["count"], 2);

    // 42 neither fires nor clears; 30 clears.
    send(&c, "u5", "d1", 42, t0 + 4).await;
    send(&c, "u6", "d1", 30, t0 + 5).await;
    let cleared = next_alarm(&mut live).await;
    assert_eq!(cleared["change"], "cleared");
    assert_eq!(cleared["id"], id.as_str());
    assert_eq!(cleared["state"], "cleared");
    assert!(cleared["clearedAt"].as_i64().unwrap() >= raised["raisedAt"].as_i64().unwrap());
    assert!(active(&c, "d1").await.is_empty());
    assert_eq!(live.next_within(Duration::from_millis(500)).await, None);

    // A new firing after the clear is a new alarm.
    send(&c, "u7", "d1", 50, t0 + 6).await;
    let again = next_alarm(&mut live).await;
    assert_eq!(again["change"], "raised");
    assert_ne!(again["id"], id.as_str());

    // Stored and listed: filters by state, device, severity, type.
    let all = c.expect(200, "GET", "/api/v1/alarms", None).await;
    assert_eq!(all.as_array().unwrap().len(), 3);
    let old = c
        .expect(200, "GET", "/api/v1/alarms?state=cleared", None)
        .await;
    assert_eq!(old.as_array().unwrap().len(), 1);
    assert_eq!(old[0]["id"], id.as_str());
    let none = c
        .expect(200, "GET", "/api/v1/alarms?severity=minor", None)
        .await;
    assert_eq!(none, json!([]));
    let one = c
        .expect(200, "GET", &format!("/api/v1/alarms/{id}"), None)
        .await;
    assert_eq!(one["state"], "cleared");
    assert_eq!(one["count"], 2);

    // As NGSI context.
    let entity = eventually(Duration::from_secs(5), || async {
        let (s, e) = c
            .send(
                "GET",
                &format!("/v2/entities/{id}?type=Alarm&options=keyValues"),
                None,
                None,
            )
            .await;
        (s == 200 && e["state"] == "cleared").then_some(e)
    })
    .await;
    assert_eq!(entity["refDevice"], "d1");
    assert_eq!(entity["count"], 2);
}

/// Bad rules get a 400 naming the problem and change nothing; unknown
/// rules and alarms are 404; bad alarm filters are 400.
#[tokio::test]
async fn bad_requests_are_refused_and_change_nothing() {
    let server = Server::start();
    let c = server.client();
    for body in [
        rule(json!({"condition": "temperature>>"})),
        rule(json!({"repeat": 0})),
        rule(json!({"for": "soon"})),
        rule(json!({"script": "function evaluate(u, s) { return true; }"})),
        rule(json!({"condition": null, "script": "function evaluate(u, s) { return true"})),
        rule(json!({"condition": null, "script": "function other() {}"})),
        json!({"condition": "a>1"}),
        json!([1]),
    ] {
        let (status, reply) = c
            .send("PUT", "/api/v1/rules/r1", Some(&body), Some(KEY))
            .await;
        assert_eq!(status, 400, "{body} → {reply}");
        assert_eq!(reply["error"], "BadRequest");
    }
    c.expect(404, "GET", "/api/v1/rules/r1", None).await;
    assert_eq!(c.expect(200, "GET", "/api/v1/rules", None).await, json!([]));
    c.expect(404, "DELETE", "/api/v1/rules/r1", None).await;
    c.expect(404, "GET", "/api/v1/alarms/nope", None).await;
    c.expect(404, "POST", "/api/v1/alarms/nope/ack", None).await;
    c.expect(404, "POST", "/api/v1/alarms/nope/clear", None)
        .await;
    for q in [
        "state=open",
        "acked=maybe",
        "severity=fatal",
        "limit=0",
        "colour=red",
    ] {
        c.expect(400, "GET", &format!("/api/v1/alarms?{q}"), None)
            .await;
    }
}

/// Ack and clear over the API: each is one event, repeating either
/// changes nothing, and a cleared alarm is not updated by later firings.
#[tokio::test]
async fn ack_and_clear_over_the_api() {
    let server = Server::start();
    let c = server.client();
    c.create_em300th().await;
    put_rule(&c, "hot", 201, &rule(json!({"clear": null}))).await;
    let mut live = Live::connect(&server).await;
    live.subscribe("a", "alarms", json!({"devices": ["d1"]}))
        .await;
    send(&c, "u1", "d1", 46, now_ms()).await;
    let raised = next_alarm(&mut live).await;
    let id = raised["id"].as_str().unwrap();

    let acked = c
        .expect(200, "POST", &format!("/api/v1/alarms/{id}/ack"), None)
        .await;
    assert_eq!(acked["acked"], true);
    assert_eq!(acked["state"], "active");
    let event = next_alarm(&mut live).await;
    assert_eq!(event["change"], "acked");
    assert_eq!(event["eventId"], format!("{id}-2"));
    c.expect(200, "POST", &format!("/api/v1/alarms/{id}/ack"), None)
        .await;
    let list = c
        .expect(200, "GET", "/api/v1/alarms?acked=true&state=active", None)
        .await;
    assert_eq!(list.as_array().unwrap().len(), 1);

    let cleared = c
        .expect(200, "POST", &format!("/api/v1/alarms/{id}/clear"), None)
        .await;
    assert_eq!(cleared["state"], "cleared");
    assert_eq!(cleared["acked"], true);
    assert_eq!(next_alarm(&mut live).await["change"], "cleared");
    c.expect(200, "POST", &format!("/api/v1/alarms/{id}/clear"), None)
        .await;
    assert_eq!(live.next_within(Duration::from_millis(300)).await, None);

    send(&c, "u2", "d1", 47, now_ms()).await;
    let fresh = next_alarm(&mut live).await;
    assert_eq!(fresh["change"], "raised");
    assert_ne!(fresh["id"], id);
    let old = c
        .expect(200, "GET", &format!("/api/v1/alarms/{id}"), None)
        .await;
    assert_eq!(old["count"], 1);
}

/// `for: 5s` raises only once the condition has held over 5 s of the
/// device's reports; a unit that does not match starts the wait over.
/// `repeat: 3` needs three matching units in a row.
#[tokio::test]
async fn for_and_repeat_wait_before_raising() {
    let server = Server::start();
    let c = server.client();
    c.create_em300th().await;
    put_rule(
        &c,
        "held",
        201,
        &rule(json!({"for": "5s", "scope": {"devices": ["held"]}})),
    )
    .await;
    let mut r = rule(json!({"repeat": 3, "scope": {"devices": ["rep"]}}));
    r["alarm"]["type"] = json!("repeated");
    put_rule(&c, "rep", 201, &r).await;
    let mut live = Live::connect(&server).await;
    live.subscribe("a", "alarms", json!({})).await;

    let t0 = now_ms() - 60_000;
    for (i, (t, temp)) in [(0, 46), (3000, 47), (4000, 30), (4500, 46), (9000, 46)]
        .into_iter()
        .enumerate()
    {
        send(&c, &format!("h{i}"), "held", temp, t0 + t).await;
    }
    for (i, temp) in [46, 46, 20, 46, 46].into_iter().enumerate() {
        send(&c, &format!("r{i}"), "rep", temp, t0 + i as i64).await;
    }
    assert_eq!(live.next_within(Duration::from_millis(800)).await, None);
    send(&c, "h5", "held", 46, t0 + 9500).await;
    let held = next_alarm(&mut live).await;
    assert_eq!(held["device"]["id"], "held");
    assert_eq!(held["dataIds"], json!(["h5"]));
    send(&c, "r5", "rep", 46, t0 + 6).await;
    let rep = next_alarm(&mut live).await;
    assert_eq!(rep["device"]["id"], "rep");
    assert_eq!(rep["dataIds"], json!(["r5"]));
}

/// An inactivity rule raises an alarm for a device that stops sending,
/// once, and the device's next unit clears it.
#[tokio::test]
async fn inactivity_fires_for_a_silent_device() {
    let server = Server::start_with_env(&[("WEFT_RULES__INACTIVITY_CHECK", "100ms")]);
    let c = server.client();
    c.create_em300th().await;
    let r = json!({"scope": {"devices": ["quiet"]}, "inactivity": "1s",
                   "alarm": {"type": "silent", "severity": "major",
                             "description": "{{device.id}} went quiet"}});
    put_rule(&c, "silence", 201, &r).await;
    let mut live = Live::connect(&server).await;
    live.subscribe("a", "alarms", json!({})).await;
    send(&c, "q1", "quiet", 20, now_ms()).await;
    send(&c, "n1", "noisy", 20, now_ms()).await;
    let raised = next_alarm(&mut live).await;
    assert_eq!(raised["change"], "raised");
    assert_eq!(raised["device"]["id"], "quiet");
    assert_eq!(raised["type"], "silent");
    assert_eq!(raised["description"], "quiet went quiet");
    assert_eq!(live.next_within(Duration::from_millis(1500)).await, None);
    send(&c, "q2", "quiet", 20, now_ms()).await;
    let cleared = next_alarm(&mut live).await;
    assert_eq!(cleared["change"], "cleared");
    assert_eq!(cleared["id"], raised["id"]);
    // Silent again: a new alarm.
    assert_eq!(next_alarm(&mut live).await["change"], "raised");
}

/// A script rule that never returns is interrupted at its time limit and
/// raises nothing, while a threshold rule and another script rule (which
/// keeps its own `state`) raise their alarms.
#[tokio::test]
async fn a_looping_script_rule_does_not_affect_other_rules() {
    let server = Server::start_with_env(&[("WEFT_RULES__SCRIPT_TIME_LIMIT", "20ms")]);
    let c = server.client();
    c.create_em300th().await;
    let mut looping = rule(json!({"condition": null,
        "script": "function evaluate(unit, state) { while (true) {} }"}));
    looping["alarm"]["type"] = json!("never");
    put_rule(&c, "loop", 201, &looping).await;
    let mut counting = rule(json!({"condition": null, "clear": null,
        "script": "function evaluate(unit, state) { state.n = (state.n || 0) + 1; \
                   if (state.n >= 2) return {raise: true, severity: 'minor', \
                   description: 'seen ' + state.n + ' at ' + unit.measures.temperature.celsius}; \
                   return false; }"}));
    counting["alarm"]["type"] = json!("counted");
    put_rule(&c, "count", 201, &counting).await;
    put_rule(&c, "hot", 201, &rule(json!({"clear": null}))).await;
    let mut live = Live::connect(&server).await;
    live.subscribe("a", "alarms", json!({})).await;

    send(&c, "u1", "d1", 46, now_ms()).await;
    let hot = next_alarm(&mut live).await;
    assert_eq!(hot["type"], "hot");
    send(&c, "u2", "d1", 21, now_ms()).await;
    let counted = next_alarm(&mut live).await;
    assert_eq!(counted["type"], "counted");
    assert_eq!(counted["severity"], "minor");
    assert_eq!(counted["description"], "seen 2 at 21");
    assert_eq!(live.next_within(Duration::from_millis(500)).await, None);
    let types: Vec<Value> = c
        .expect(200, "GET", "/api/v1/alarms", None)
        .await
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["type"].clone())
        .collect();
    assert!(!types.contains(&json!("never")), "{types:?}");
}

/// A rule edited over the API applies from the next uplink: the same
/// reading that did not match the old condition raises under the new one;
/// a disabled rule raises nothing.
#[tokio::test]
async fn a_rule_edit_applies_to_the_next_uplink() {
    let server = Server::start();
    let c = server.client();
    c.create_em300th().await;
    put_rule(&c, "hot", 201, &rule(json!({}))).await;
    let mut live = Live::connect(&server).await;
    live.subscribe("a", "alarms", json!({})).await;
    send(&c, "u1", "d1", 35, now_ms()).await;
    c.unit_eventually("u1").await;
    assert_eq!(live.next_within(Duration::from_millis(300)).await, None);
    put_rule(
        &c,
        "hot",
        200,
        &rule(json!({"condition": "temperature>30", "clear": "temperature<10"})),
    )
    .await;
    send(&c, "u2", "d1", 35, now_ms()).await;
    let raised = next_alarm(&mut live).await;
    assert_eq!(raised["dataIds"], json!(["u2"]));
    let rules = c.expect(200, "GET", "/api/v1/rules", None).await;
    assert_eq!(rules[0]["condition"], "temperature>30");

    put_rule(&c, "hot", 200, &rule(json!({"enabled": false}))).await;
    send(&c, "u3", "d1", 50, now_ms()).await;
    c.unit_eventually("u3").await;
    assert_eq!(live.next_within(Duration::from_millis(300)).await, None);
    c.expect(204, "DELETE", "/api/v1/rules/hot", None).await;
    c.expect(404, "GET", "/api/v1/rules/hot", None).await;
}

/// Rule state and alarms survive kill -9: two of three repeats before the
/// crash and one after raise the alarm; after another crash a repeat
/// updates the same alarm instead of raising a second one.
#[tokio::test]
async fn rule_state_and_alarms_survive_kill_9() {
    let mut server = Server::start();
    let c = server.client();
    c.create_em300th().await;
    put_rule(&c, "rep", 201, &rule(json!({"repeat": 3, "clear": null}))).await;
    let t0 = now_ms();
    send(&c, "u1", "d1", 46, t0).await;
    send(&c, "u2", "d1", 46, t0 + 1).await;
    c.unit_eventually("u2").await;
    server.restart();
    let c = server.client();
    let mut live = Live::connect(&server).await;
    live.subscribe("a", "alarms", json!({})).await;
    send(&c, "u3", "d1", 46, t0 + 2).await;
    let raised = next_alarm(&mut live).await;
    assert_eq!(raised["change"], "raised");
    assert_eq!(raised["dataIds"], json!(["u3"]));

    server.restart();
    let c = server.client();
    let mut live = Live::connect(&server).await;
    live.subscribe("a", "alarms", json!({})).await;
    send(&c, "u4", "d1", 46, t0 + 3).await;
    let updated = next_alarm(&mut live).await;
    assert_eq!(updated["change"], "updated");
    assert_eq!(updated["id"], raised["id"]);
    assert_eq!(updated["count"], 2);
    assert_eq!(active(&c, "d1").await.len(), 1);
}
