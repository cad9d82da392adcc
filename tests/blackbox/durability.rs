//! Nothing acknowledged is lost: a burst of 202s followed at once by
//! kill -9, then a restart, still yields every uplink stored exactly once.

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;

use crate::util::*;

/// Every uplink answered 202 before the crash is processed after the
/// restart, and none is stored twice (the pipeline resumes from its cursor
/// and `dataId` makes replays idempotent).
#[tokio::test]
async fn kill_9_after_a_burst_of_202s_loses_nothing() {
    let mut server = Server::start();
    let c = server.client();
    c.create_em300th().await;

    let total = 3000;
    let payload = [0x01, 0x75, 0x5C, 0x03, 0x67, 0x34, 0x01, 0x04, 0x68, 0x65];
    let accepted: Vec<String> = futures::stream::iter(0..total)
        .map(|i| {
            let c = c.clone();
            async move {
                let id = format!("k9-{i}");
                let body = if i % 2 == 0 {
                    decoded_body(&id, &format!("dev-{}", i % 50), 20, 40, now_ms())
                } else {
                    encoded_body(&id, &format!("dev-{}", i % 50), &payload, now_ms())
                };
                let path = if i % 2 == 0 { "decoded" } else { "encoded" };
                let (status, _) = c
                    .send(
                        "POST",
                        &format!("/sensor-data/crash/{path}/em300th"),
                        Some(&body),
                        Some(KEY),
                    )
                    .await;
                (status == 202).then_some(id)
            }
        })
        .buffer_unordered(64)
        .filter_map(|x| async move { x })
        .collect()
        .await;
    assert_eq!(accepted.len(), total, "every uplink was accepted");
    server.kill9();

    server.restart();
    let c = server.client();
    let units = eventually(Duration::from_secs(60), || async {
        let units = c.all_units("channel=crash").await;
        (units.len() >= total).then_some(units)
    })
    .await;
    let mut seen: HashMap<String, usize> = HashMap::new();
    for u in &units {
        *seen
            .entry(u["dataId"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    for id in &accepted {
        assert_eq!(seen.get(id), Some(&1), "{id} stored exactly once");
    }
    assert_eq!(units.len(), total, "nothing stored twice");
}

/// SIGTERM is a clean stop: weft exits with status 0 after finishing what
/// it accepted, and everything is there when it starts again.
#[tokio::test]
async fn sigterm_stops_cleanly_and_keeps_everything() {
    let mut server = Server::start();
    let c = server.client();
    c.create_em300th().await;
    let total = 300;
    futures::stream::iter(0..total)
        .map(|i| {
            let c = c.clone();
            async move {
                let body = decoded_body(&format!("term-{i}"), "dev-t", 20, 40, now_ms());
                c.uplink("term", "decoded", "em300th", &body).await;
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<()>>()
        .await;
    assert!(server.terminate(), "weft exited with a failure status");

    server.restart();
    let c = server.client();
    let units = eventually(Duration::from_secs(30), || async {
        let units = c.all_units("channel=term").await;
        (units.len() >= total).then_some(units)
    })
    .await;
    assert_eq!(units.len(), total);
}
