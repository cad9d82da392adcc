//! The live stream: filters select events; unsubscribe stops them; SSE
//! carries the same events; a client that stops reading is cut off while
//! other subscribers keep receiving.

use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};

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

/// The `entities` stream carries every committed entity change once, in
/// the order it was made: device data creating and updating a device's
/// entity, NGSI writes to it, and NGSI writes in another tenant (selected
/// by `service` and `servicePath`). A resent uplink, which is a duplicate,
/// changes no entity and so sends nothing.
#[tokio::test]
async fn the_entities_stream_delivers_each_change_once_in_order() {
    let server = Server::start();
    let c = server.client();
    c.create_em300th().await;
    let mut live = Live::connect(&server).await;
    live.subscribe("dev", "entities", json!({"devices":["dev-e"]}))
        .await;
    live.subscribe(
        "acme",
        "entities",
        json!({"service":"acme","servicePath":"/a/#","q":"temperature>0"}),
    )
    .await;

    let at = now_ms();
    for i in 0..5 {
        let body = decoded_body(&format!("e-{i}"), "dev-e", 10 + i, 50, at + i);
        c.uplink("farm", "decoded", "em300th", &body).await;
    }
    let mut changes = Vec::new();
    for i in 0..5 {
        let m = live.next().await;
        assert_eq!(m["type"], "event", "{m}");
        assert_eq!(m["id"], "dev", "{m}");
        let event = &m["event"];
        assert_eq!(event["id"], "dev-e");
        assert_eq!(event["service"], "");
        assert_eq!(event["servicePath"], "/");
        let expected = if i == 0 { "created" } else { "updated" };
        assert_eq!(event["change"], expected, "{event}");
        assert!(event["attrs"]
            .as_array()
            .unwrap()
            .contains(&json!("temperature")));
        changes.push(event["entity"]["temperature"]["value"].as_f64().unwrap());
    }
    assert_eq!(changes, [10.0, 11.0, 12.0, 13.0, 14.0]);

    // A resend of e-2 with another value, then a new uplink: only the new
    // one changes the entity.
    let resent = decoded_body("e-2", "dev-e", 99, 50, at + 2);
    c.uplink("farm", "decoded", "em300th", &resent).await;
    let next = decoded_body("e-5", "dev-e", 15, 50, at + 5);
    c.uplink("farm", "decoded", "em300th", &next).await;
    let m = live.next().await;
    assert_eq!(
        m["event"]["entity"]["temperature"]["value"].as_f64(),
        Some(15.0),
        "{m}"
    );

    // An NGSI write to the device's entity is a change like any other.
    let (status, _, body) = crate::ngsi::call(
        &c,
        "POST",
        "/v2/entities/dev-e/attrs",
        None,
        Some(&json!({"note":{"value":"checked","type":"Text"}})),
    )
    .await;
    assert_eq!(status, 204, "{body}");
    let m = live.next().await;
    assert_eq!(m["id"], "dev");
    assert_eq!(m["event"]["change"], "updated");
    assert_eq!(m["event"]["attrs"], json!(["note"]));
    assert_eq!(m["event"]["entity"]["note"]["value"], "checked");
    assert_eq!(
        m["event"]["entity"]["temperature"]["value"].as_f64(),
        Some(15.0)
    );

    // Another tenant: a create, updates and a delete under /a/b, in order;
    // a change elsewhere in the tenant and one failing `q` are not sent.
    let acme = |method: &'static str, path: &'static str, sp: &'static str, body: Value| {
        let c = &c;
        async move {
            let mut req = c
                .http
                .request(method.parse().unwrap(), format!("{}{}", c.url, path))
                .header("Fiware-Service", "acme")
                .header("Fiware-ServicePath", sp);
            if !body.is_null() {
                req = req.json(&body);
            }
            let resp = req.send().await.expect("request sent");
            resp.status().as_u16()
        }
    };
    let room = json!({"id":"room","type":"Room","temperature":{"value":21,"type":"Number"}});
    assert_eq!(acme("POST", "/v2/entities", "/a/b", room).await, 201);
    let other = json!({"id":"hall","type":"Room","temperature":{"value":5,"type":"Number"}});
    assert_eq!(acme("POST", "/v2/entities", "/b", other).await, 201);
    for t in [22, -3, 23] {
        let body = json!({"temperature":{"value":t,"type":"Number"}});
        assert_eq!(
            acme("PATCH", "/v2/entities/room/attrs", "/a/b", body).await,
            204
        );
    }
    assert_eq!(
        acme("DELETE", "/v2/entities/room", "/a/b", Value::Null).await,
        204
    );
    let mut seen = Vec::new();
    for _ in 0..4 {
        let m = live.next().await;
        assert_eq!(m["id"], "acme", "{m}");
        let e = &m["event"];
        assert_eq!(
            (&e["service"], &e["servicePath"]),
            (&json!("acme"), &json!("/a/b"))
        );
        seen.push(format!(
            "{}:{}",
            e["change"].as_str().unwrap(),
            e["entity"]["temperature"]["value"]
        ));
    }
    // The update to -3 fails `q` (temperature>0) and is not sent.
    assert_eq!(
        seen,
        ["created:21", "updated:22", "updated:23", "deleted:23"]
    );
    assert_eq!(live.next_within(Duration::from_millis(1500)).await, None);
}

/// SSE carries entity changes too, filtered the same way.
#[tokio::test]
async fn sse_carries_entity_changes() {
    let server = Server::start();
    let c = server.client();
    let mut resp = c
        .http
        .get(format!(
            "{}/api/v1/live/sse?stream=entities&types=Lamp",
            c.url
        ))
        .send()
        .await
        .unwrap();
    // The handler subscribes before it answers: changes from now on count.
    assert_eq!(resp.status(), 200);
    for (id, kind) in [("pump", "Pump"), ("lamp", "Lamp")] {
        let e = json!({"id":id,"type":kind,"on":{"value":true,"type":"Boolean"}});
        let (status, _, _) = crate::ngsi::call(&c, "POST", "/v2/entities", None, Some(&e)).await;
        assert_eq!(status, 201);
    }
    let mut text = String::new();
    while !text.contains("\n\n") {
        let chunk = tokio::time::timeout(Duration::from_secs(10), resp.chunk())
            .await
            .expect("an SSE event within 10 s")
            .unwrap()
            .expect("the stream goes on");
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    assert!(text.starts_with("event: entities\n"), "{text}");
    let data = text
        .lines()
        .find_map(|l| l.strip_prefix("data: "))
        .expect("a data line");
    let event: Value = serde_json::from_str(data).unwrap();
    assert_eq!(event["id"], "lamp", "{event}");
    assert_eq!(event["change"], "created");
}
