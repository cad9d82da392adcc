//! Rule state stays bounded: a script rule whose `state` grows with every
//! unit (a list of every `dataId` seen) has it reset to `{}` at
//! `[rules] max_state_bytes`, which the script sees (it starts afresh)
//! and `/metrics` counts, instead of growing without end.

use std::time::Duration;

use serde_json::json;

use crate::util::*;

/// `/metrics` of `server`, as text.
async fn metrics(server: &Server) -> String {
    server
        .client()
        .http
        .get(format!("{}/metrics", server.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The value of the metric line starting with `name ` (0 without one).
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn a_growing_script_state_is_reset_at_its_limit() {
    let limit = 2048;
    let server = Server::start_with_env(&[("WEFT_RULES__MAX_STATE_BYTES", "2048")]);
    let c = server.client();
    c.create_em300th().await;
    // Raises (or updates) an alarm whenever it starts from an empty state,
    // naming the unit it started at.
    let rule = json!({
        "scope": {"types": ["em300th"]},
        "script": "function evaluate(unit, state) { \
                   var fresh = !state.seen; \
                   state.seen = (state.seen || []).concat([unit.dataId]); \
                   return fresh ? {raise: true, description: 'fresh at ' + unit.dataId} : false; }",
        "alarm": {"type": "hoard"}
    });
    c.expect(201, "PUT", "/api/v1/rules/hoard", Some(&rule))
        .await;
    // Each id takes 9 bytes of the list ("u-0001",): the state passes 2 KiB
    // after about 227 units.
    let t0 = now_ms();
    for i in 1..=300 {
        let id = format!("u-{i:04}");
        c.uplink(
            "field",
            "decoded",
            "em300th",
            &decoded_body(&id, "d1", 20, 50, t0 + i),
        )
        .await;
    }
    let alarm = eventually(Duration::from_secs(30), || async {
        let alarms = c
            .expect(200, "GET", "/api/v1/alarms?device=d1&type=hoard", None)
            .await;
        let alarm = alarms.as_array()?.first()?.clone();
        (alarm["count"] == json!(2)).then_some(alarm)
    })
    .await;
    // Started afresh once, where the state would have passed the limit.
    let description = alarm["description"].as_str().unwrap();
    let at: u32 = description
        .strip_prefix("fresh at u-")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{alarm}"));
    assert!((200..=260).contains(&at), "{description}");
    let text = eventually(Duration::from_secs(10), || async {
        let text = metrics(&server).await;
        (metric(&text, "weft_rule_state_resets_total") >= 1.0).then_some(text)
    })
    .await;
    assert_eq!(metric(&text, "weft_rule_state_resets_total"), 1.0);
    let bytes = metric(&text, "weft_rule_state_bytes");
    assert!(bytes > 0.0 && bytes <= limit as f64, "{bytes}");
}
