//! The live stream: filters select events; unsubscribe stops them; SSE
//! carries the same events; a client that stops reading is cut off while
//! other subscribers keep receiving.

use std::time::Duration;

use futures::StreamExt;
use serde_json::json;

use crate::util::*;

/// Channel, device, type and `q` filters each narrow what a subscription
/// receives; one connection can hold several subscriptions.
#[tokio::test]
async fn filters_select_events_per_subscription() {
    let server = Server::start();
    let c = server.client();
    c.create_em300th().await;
    let mut live = Live::connect(&server).await;
    live.subscribe("hot", "data", json!({"q":"temperature>45.1"}))
        .await;
    live.subscribe(
        "north",
        "data",
        json!({"channels":["north"],"devices":["d2"]}),
    )
    .await;

    c.uplink(
        "south",
        "decoded",
        "em300th",
        &decoded_body("a", "d1", 50, 10, now_ms()),
    )
    .await;
    c.uplink(
        "north",
        "decoded",
        "em300th",
        &decoded_body("b", "d1", 20, 10, now_ms()),
    )
    .await;
    c.uplink(
        "north",
        "decoded",
        "em300th",
        &decoded_body("c", "d2", 46, 10, now_ms()),
    )
    .await;
    c.uplink(
        "south",
        "decoded",
        "em300th",
        &decoded_body("d", "d2", 45, 10, now_ms()),
    )
    .await;

    let mut got = Vec::new();
    while let Some(m) = live.next_within(Duration::from_secs(2)).await {
        got.push(format!(
            "{}:{}",
            m["id"].as_str().unwrap(),
            m["event"]["dataId"].as_str().unwrap()
        ));
    }
    got.sort();
    assert_eq!(got, ["hot:a", "hot:c", "north:c"]);

    live.send(json!({"type":"unsubscribe","id":"hot"})).await;
    assert_eq!(live.next().await, json!({"type":"unsubscribed","id":"hot"}));
    c.uplink(
        "south",
        "decoded",
        "em300th",
        &decoded_body("e", "d1", 50, 10, now_ms()),
    )
    .await;
    assert_eq!(live.next_within(Duration::from_millis(1500)).await, None);
}

/// Bad subscriptions are answered with an error naming the subscription.
#[tokio::test]
async fn bad_subscriptions_get_errors() {
    let server = Server::start();
    let mut live = Live::connect(&server).await;
    live.send(json!({"type":"subscribe","id":"x","stream":"nope"}))
        .await;
    let e = live.next().await;
    assert_eq!(
        (e["type"].as_str(), e["id"].as_str(), e["error"].as_str()),
        (Some("error"), Some("x"), Some("BadRequest"))
    );
    live.send(json!({"type":"subscribe","id":"y","stream":"data","filter":{"q":"temperature>"}}))
        .await;
    assert_eq!(live.next().await["id"], "y");
    live.send(json!({"type":"dance"})).await;
    assert_eq!(live.next().await["error"], "BadRequest");
}

/// `GET /api/v1/live/sse` streams the same events as server-sent events.
#[tokio::test]
async fn sse_streams_matching_data_units() {
    let server = Server::start();
    let c = server.client();
    c.create_em300th().await;
    let mut resp = c
        .http
        .get(format!(
            "{}/api/v1/live/sse?stream=data&channels=north",
            server.url
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // Give the subscription a moment to be registered by sending until seen.
    let mut text = String::new();
    for i in 0..50 {
        c.uplink(
            "south",
            "decoded",
            "em300th",
            &decoded_body(&format!("s{i}"), "d1", 1, 1, now_ms()),
        )
        .await;
        c.uplink(
            "north",
            "decoded",
            "em300th",
            &decoded_body(&format!("n{i}"), "d1", 1, 1, now_ms()),
        )
        .await;
        if let Ok(Ok(Some(chunk))) =
            tokio::time::timeout(Duration::from_millis(500), resp.chunk()).await
        {
            text.push_str(&String::from_utf8_lossy(&chunk));
            if text.contains("\"dataId\":\"n") {
                break;
            }
        }
    }
    assert!(text.contains("event: data"), "{text}");
    assert!(text.contains("\"channel\":\"north\""), "{text}");
    assert!(!text.contains("\"channel\":\"south\""), "{text}");
    assert_eq!(
        c.send("GET", "/api/v1/live/sse?stream=nope", None, None)
            .await
            .0,
        400
    );
}

/// A subscriber that stops reading is disconnected once it falls behind;
/// a reading subscriber on the same server gets every event.
#[tokio::test]
async fn a_client_that_stops_reading_is_cut_off_and_others_are_unaffected() {
    let server = Server::start();
    let c = server.client();
    // No processor: every body field but the envelope becomes a measure,
    // so the padding makes each event about 2 KB.
    c.expect(201, "PUT", "/api/v1/device-types/bulky", Some(&json!({})))
        .await;
    // A raw websocket whose reads we never poll after subscribing.
    let (mut stalled, _) = tokio_tungstenite::connect_async(server.live_url())
        .await
        .unwrap();
    use futures::SinkExt;
    stalled
        .send(tokio_tungstenite::tungstenite::Message::Text(
            json!({"type":"subscribe","id":"slow","stream":"data"})
                .to_string()
                .into(),
        ))
        .await
        .unwrap();
    let mut reader = Live::connect(&server).await;
    reader.subscribe("fast", "data", json!({})).await;

    // Enough large events to overflow socket buffers and the stream capacity.
    let total = 20_000;
    let reader_task = tokio::spawn(async move {
        let mut n = 0;
        while n < total {
            let m = reader
                .next_within(Duration::from_secs(30))
                .await
                .expect("reader keeps receiving");
            assert_eq!(m["type"], "event");
            n += 1;
        }
        n
    });
    let body_pad = "x".repeat(2000);
    let mut sends = futures::stream::iter(0..total)
        .map(|i| {
            let c = c.clone();
            let mut body = decoded_body(&format!("f{i}"), "d1", 1, 1, now_ms());
            body["pad"] = json!(body_pad);
            async move {
                c.uplink("flood", "decoded", "bulky", &body).await;
            }
        })
        .buffer_unordered(64);
    while sends.next().await.is_some() {}
    assert_eq!(reader_task.await.unwrap(), total);

    // The stalled client, read now, finds what was buffered for it and
    // then the end of the connection: it did not get every event.
    let mut events = 0;
    loop {
        match tokio::time::timeout(Duration::from_secs(15), stalled.next()).await {
            Ok(Some(Ok(tokio_tungstenite::tungstenite::Message::Text(t)))) => {
                if t.contains("\"type\":\"event\"") {
                    events += 1;
                }
            }
            Ok(Some(Ok(_))) => {}
            Ok(Some(Err(_))) | Ok(None) => break,
            Err(_) => panic!("the stalled connection was not closed"),
        }
    }
    assert!(
        events < total,
        "the stalled client was cut off ({events} events)"
    );
}
