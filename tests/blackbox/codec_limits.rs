//! Codec limits that hold for built-in functions: a decoder stuck in a
//! native loop that neither allocates nor polls the interrupt handler
//! (`new Array(1e9).join("x")`, which ran for 16 s and held up another
//! device type's uplinks for 39 s) fails its uplinks with a reason, while
//! another type's uplinks sent at the same time are all stored; a dry run
//! of such a decoder answers with the failure instead of hanging.

use serde_json::{json, Value};

use crate::util::*;

const STUCK: &str =
    "function decodeUplink(input) { var s = new Array(1e9).join('x'); return {data: {}}; }";

async fn dry_run(c: &Client, ty: &str, sample: Value) -> Reply {
    c.send(
        "POST",
        &format!("/api/v1/device-types/{ty}/decode"),
        Some(&sample),
        Some(KEY),
    )
    .await
}

/// Ten uplinks of a type whose decoder is stuck in `join`, interleaved with
/// ten of em300th: every em300th unit is stored, in order, on the live
/// stream (each within the helper's 10 s, where the stuck decoder alone
/// used to take minutes for ten); every stuck uplink is kept as failed
/// with reason `Timeout`: the first that ran because it ran past the 50 ms
/// limit, the others because they were not run (skipped for the rest of
/// their batch, or held back while the abandoned thread winds down). A dry
/// run of the saved stuck type, and of a stuck decoder not saved, answers
/// 422 `Timeout`, and the engine decodes right after.
#[tokio::test]
async fn a_decoder_stuck_in_a_builtin_fails_while_other_types_flow() {
    let server = Server::start_with_env(&[("WEFT_ENGINE__TIME_LIMIT", "50ms")]);
    let c = server.client();
    c.create_em300th().await;
    c.expect(
        201,
        "PUT",
        "/api/v1/device-types/stuck",
        Some(&json!({"decoder": {"script": STUCK}})),
    )
    .await;
    let mut live = Live::connect(&server).await;
    live.subscribe("s", "data", json!({"types": ["em300th"]}))
        .await;

    let payload = [0x01, 0x75, 0x5C];
    for i in 0..10 {
        c.uplink(
            "farm",
            "encoded",
            "stuck",
            &encoded_body(&format!("stuck-{i}"), "dev-stuck", &payload, now_ms()),
        )
        .await;
        c.uplink(
            "farm",
            "encoded",
            "em300th",
            &encoded_body(&format!("ok-{i}"), "dev-ok", &[0x04, 0x68, 2 * i], now_ms()),
        )
        .await;
    }
    for i in 0..10 {
        let event = live.next().await;
        assert_eq!(event["event"]["dataId"], format!("ok-{i}"), "{event}");
        assert_eq!(
            event["event"]["measures"]["airHumidity"]["relativePercentage"],
            json!(i),
            "{event}"
        );
    }
    assert_eq!(c.all_units("device=dev-ok").await.len(), 10);

    let failures = eventually(std::time::Duration::from_secs(20), || async {
        let f = c
            .expect(200, "GET", "/api/v1/uplinks/failed?type=stuck", None)
            .await;
        let list = f["failures"].as_array().unwrap().clone();
        (list.len() == 10).then_some(list)
    })
    .await;
    let mut ran = 0;
    for f in &failures {
        assert_eq!(f["reason"], "Timeout", "{f}");
        let description = f["description"].as_str().unwrap();
        assert!(description.contains("50ms limit"), "{f}");
        if description.starts_with("script ran longer than its 50ms limit") {
            ran += 1;
        } else {
            assert!(description.starts_with("not run: "), "{f}");
        }
    }
    assert!(ran >= 1, "{failures:?}");
    assert_eq!(c.all_units("device=dev-stuck").await.len(), 0);

    // The dry run goes through the same engine and limits: the saved type
    // (its script still held back), and an unsaved stuck decoder.
    let sample = json!({"bytes": "046864", "fPort": 85, "id": "d1"});
    let (status, reply) = dry_run(&c, "stuck", sample.clone()).await;
    assert_eq!(
        (status, &reply["reason"]),
        (422, &json!("Timeout")),
        "{reply}"
    );
    let mut unsaved = sample.clone();
    unsaved["decoder"] = json!({"script": STUCK.replace("'x'", "'y'")});
    let (status, reply) = dry_run(&c, "em300th", unsaved).await;
    assert_eq!(
        (status, &reply["reason"]),
        (422, &json!("Timeout")),
        "{reply}"
    );
    assert!(
        reply["description"]
            .as_str()
            .is_some_and(|m| m.starts_with("script ran longer than its 50ms limit")),
        "{reply}"
    );
    let (status, reply) = dry_run(&c, "em300th", sample).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(
        reply["units"][0]["measures"]["airHumidity"],
        json!({"relativePercentage": 50}),
        "{reply}"
    );
}
