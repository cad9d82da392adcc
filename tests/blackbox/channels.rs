//! Durable pull channels through DSPS's API: redelivery until ack, ack as
//! a cursor, dedup by message id, long polls woken by a publish, expiry,
//! DSPS's error shapes, and nothing lost across kill -9.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::util::*;

/// `PUT` with an optional raw body; status and JSON body.
pub(crate) async fn put(c: &Client, path: &str, body: Option<&str>) -> (u16, Value) {
    let mut req = c.http.put(format!("{}{path}", c.url));
    if let Some(b) = body {
        req = req.body(b.to_string());
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// `GET` or `DELETE`; status and JSON body.
async fn call(c: &Client, method: &str, path: &str) -> (u16, Value) {
    c.send(method, path, None, None).await
}

/// The message ids and contents of a fetch, and its ackHandle.
pub(crate) fn ids(fetched: &Value) -> Vec<String> {
    fetched["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["messageID"].as_str().unwrap().to_string())
        .collect()
}

/// A subscriber gets what was published after it existed, again on every
/// fetch until it acknowledges; an ack handle acknowledges everything up
/// to it (a cursor); a re-published id is stored once with its first
/// content; `max` pages with `moreMessages`.
#[tokio::test]
async fn redelivery_ack_cursor_and_dedup() {
    let server = Server::start();
    let c = server.client();
    assert_eq!(
        put(&c, "/channel/ch-1/message/early", Some(r#"{"n":0}"#))
            .await
            .0,
        200
    );
    let (s, body) = put(&c, "/channel/ch-1/subscription/polling/sub-1", None).await;
    assert_eq!(
        (s, body),
        (200, json!({"channelID":"ch-1","subscriberID":"sub-1"}))
    );
    assert_eq!(
        put(&c, "/channel/ch-1/subscription/polling/sub-1", None)
            .await
            .0,
        200
    );
    for (id, n) in [("m1", 1), ("m2", 2), ("m3", 3)] {
        let (s, body) = put(
            &c,
            &format!("/channel/ch-1/message/{id}"),
            Some(&json!({"n": n}).to_string()),
        )
        .await;
        assert_eq!((s, body), (200, json!({"channelID":"ch-1","messageID":id})));
    }
    // The same id again: 200, stored once, first content kept.
    assert_eq!(
        put(&c, "/channel/ch-1/message/m2", Some(r#"{"n":99}"#))
            .await
            .0,
        200
    );

    let path = "/channel/ch-1/subscription/polling/sub-1";
    let (s, first) = call(&c, "GET", path).await;
    assert_eq!(s, 200);
    assert_eq!(ids(&first), ["m1", "m2", "m3"]);
    assert_eq!(first["messages"][1]["content"], json!({"n": 2}));
    assert_eq!(first["moreMessages"], false);
    assert_eq!(first["channelID"], "ch-1");
    let (_, again) = call(&c, "GET", path).await;
    assert_eq!(
        ids(&again),
        ["m1", "m2", "m3"],
        "unacknowledged: redelivered"
    );

    // Page of 2, ack it: the third remains.
    let (_, page) = call(&c, "GET", &format!("{path}?max=2")).await;
    assert_eq!(ids(&page), ["m1", "m2"]);
    assert_eq!(page["moreMessages"], true);
    let handle = page["ackHandle"].as_str().unwrap();
    let (s, _) = call(&c, "DELETE", &format!("{path}/message?ackHandle={handle}")).await;
    assert_eq!(s, 204);
    let (_, rest) = call(&c, "GET", path).await;
    assert_eq!(ids(&rest), ["m3"]);
    // The stale handle again changes nothing.
    let (s, _) = call(&c, "DELETE", &format!("{path}/message?ackHandle={handle}")).await;
    assert_eq!(s, 204);
    let last = rest["ackHandle"].as_str().unwrap();
    call(&c, "DELETE", &format!("{path}/message?ackHandle={last}")).await;
    let (_, empty) = call(&c, "GET", path).await;
    assert_eq!(
        empty,
        json!({"channelID":"ch-1","messages":[],"moreMessages":false})
    );
}

/// A long poll waiting on an empty subscriber is answered as soon as a
/// message is published (well before its timeout), and with nothing when
/// the timeout passes.
#[tokio::test]
async fn long_poll_wakes_on_publish() {
    let server = Server::start();
    let c = server.client();
    put(&c, "/channel/lp/subscription/polling/s", None).await;
    let started = Instant::now();
    let (_, empty) = call(
        &c,
        "GET",
        "/channel/lp/subscription/polling/s?timeout=300ms",
    )
    .await;
    assert!(started.elapsed() >= Duration::from_millis(290));
    assert_eq!(empty["messages"], json!([]));

    let waiter = {
        let c = c.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let reply = call(&c, "GET", "/channel/lp/subscription/polling/s?timeout=10s").await;
            (reply, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    put(&c, "/channel/lp/message/wake", Some("\"hello\"")).await;
    let ((status, body), waited) = waiter.await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(ids(&body), ["wake"]);
    assert_eq!(body["messages"][0]["content"], "hello");
    assert!(
        waited < Duration::from_secs(5),
        "answered at the publish, not the timeout"
    );
}

/// Bad ids, bodies and parameters get DSPS's 400s and change nothing;
/// unknown subscribers get its 404; deleting is idempotent; probes answer.
#[tokio::test]
async fn dsps_errors() {
    let server = Server::start();
    let c = server.client();
    let (s, body) = put(&c, "/channel/Bad/message/m", Some("{}")).await;
    assert_eq!(
        (s, body),
        (400, json!({"error": "Invalid \"channelID\" parameter"}))
    );
    let (s, body) = put(&c, "/channel/ok/message/-m", Some("{}")).await;
    assert_eq!(
        (s, body),
        (400, json!({"error": "Invalid \"messageID\" parameter"}))
    );
    let (s, body) = put(&c, "/channel/ok/subscription/polling/UP", None).await;
    assert_eq!(
        (s, body),
        (400, json!({"error": "Invalid \"subscriberID\" parameter"}))
    );
    let (s, body) = put(&c, "/channel/ok/message/m", Some("not json")).await;
    assert_eq!(
        (s, body),
        (400, json!({"error": "Request body is not JSON"}))
    );

    let (s, body) = call(&c, "GET", "/channel/ok/subscription/polling/nobody").await;
    assert_eq!(s, 404);
    assert_eq!(body["code"], "dsps.storage.subscription-not-found");
    let (s, _) = call(
        &c,
        "DELETE",
        "/channel/ok/subscription/polling/nobody/message?ackHandle=1",
    )
    .await;
    assert_eq!(s, 404);

    put(&c, "/channel/ok/subscription/polling/s", None).await;
    for q in ["timeout=soon", "timeout=-1s", "max=0", "max=x"] {
        let (s, _) = call(
            &c,
            "GET",
            &format!("/channel/ok/subscription/polling/s?{q}"),
        )
        .await;
        assert_eq!(s, 400, "{q}");
    }
    for h in ["", "abc"] {
        let (s, _) = call(
            &c,
            "DELETE",
            &format!("/channel/ok/subscription/polling/s/message?ackHandle={h}"),
        )
        .await;
        assert_eq!(s, 400, "handle {h:?}");
    }
    // The refused publish stored nothing.
    put(&c, "/channel/ok/message/m2", Some("1")).await;
    let (_, got) = call(&c, "GET", "/channel/ok/subscription/polling/s").await;
    assert_eq!(ids(&got), ["m2"]);

    for _ in 0..2 {
        let (s, body) = call(&c, "DELETE", "/channel/ok/subscription/polling/s").await;
        assert_eq!(
            (s, body),
            (200, json!({"channelID":"ok","subscriberID":"s"}))
        );
    }
    let (s, _) = call(&c, "GET", "/channel/ok/subscription/polling/s").await;
    assert_eq!(s, 404);
    assert_eq!(call(&c, "GET", "/probe/liveness").await.0, 200);
    assert_eq!(call(&c, "GET", "/probe/readiness").await.0, 200);
}

/// A subscriber idle past `channels.expire_after` is removed: its fetch
/// answers 404; an active one is kept.
#[tokio::test]
async fn idle_subscribers_expire() {
    let server = Server::start_with_env(&[("WEFT_CHANNELS__EXPIRE_AFTER", "1s")]);
    let c = server.client();
    put(&c, "/channel/ex/subscription/polling/idle", None).await;
    put(&c, "/channel/ex/subscription/polling/busy", None).await;
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        assert_eq!(
            call(&c, "GET", "/channel/ex/subscription/polling/busy")
                .await
                .0,
            200
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (s, body) = call(&c, "GET", "/channel/ex/subscription/polling/idle").await;
    assert_eq!(s, 404, "{body}");
    assert_eq!(
        call(&c, "GET", "/channel/ex/subscription/polling/busy")
            .await
            .0,
        200
    );
}

/// Every published (200) message survives kill -9: the unacknowledged
/// ones are delivered after the restart, the acknowledged ones are not,
/// and a re-publish after the restart is still recognised as a duplicate.
#[tokio::test]
async fn nothing_lost_across_kill_9() {
    let mut server = Server::start();
    let c = server.client();
    put(&c, "/channel/dur/subscription/polling/a", None).await;
    put(&c, "/channel/dur/subscription/polling/b", None).await;
    let mut sent = Vec::new();
    let publishers: Vec<_> = (0..4)
        .map(|p| {
            let c = c.clone();
            tokio::spawn(async move {
                let mut ok = Vec::new();
                for i in 0..100 {
                    let id = format!("p{p}-{i}");
                    let (s, _) = put(
                        &c,
                        &format!("/channel/dur/message/{id}"),
                        Some(&i.to_string()),
                    )
                    .await;
                    if s == 200 {
                        ok.push(id);
                    }
                }
                ok
            })
        })
        .collect();
    for p in publishers {
        sent.extend(p.await.unwrap());
    }
    assert_eq!(sent.len(), 400);
    // b acknowledges the first 150.
    let (_, page) = call(&c, "GET", "/channel/dur/subscription/polling/b?max=150").await;
    let handle = page["ackHandle"].as_str().unwrap().to_string();
    let acked: Vec<String> = ids(&page);
    assert_eq!(
        call(
            &c,
            "DELETE",
            &format!("/channel/dur/subscription/polling/b/message?ackHandle={handle}")
        )
        .await
        .0,
        204
    );
    server.kill9();
    server.restart();
    let c = server.client();
    let all = |sub: &'static str| {
        let c = c.clone();
        async move {
            let (s, got) = call(
                &c,
                "GET",
                &format!("/channel/dur/subscription/polling/{sub}?max=1000"),
            )
            .await;
            assert_eq!(s, 200);
            ids(&got)
        }
    };
    let mut a = all("a").await;
    let mut expected = sent.clone();
    a.sort();
    expected.sort();
    assert_eq!(a, expected, "every published message still owed to a");
    let b = all("b").await;
    assert_eq!(b.len(), 250);
    assert!(
        b.iter().all(|id| !acked.contains(id)),
        "acknowledged ones stay acknowledged"
    );
    put(&c, "/channel/dur/message/p0-0", Some("\"again\"")).await;
    assert_eq!(
        all("b").await.len(),
        250,
        "a duplicate after restart is dropped"
    );
}

/// A bridge publishes every alarm change into a channel exactly as it was
/// raised (the same JSON as on the live socket, in order, once each, with
/// the event id as message id); a data bridge with a filter publishes only
/// the units it passes; a bridge survives a restart.
#[tokio::test]
async fn bridges_deliver_alarms_and_data_exactly_once() {
    let mut server = Server::start();
    let c = server.client();
    c.create_em300th().await;
    let rule = json!({"condition": "temperature>45.1", "clear": "temperature<40",
                      "alarm": {"type": "hot", "severity": "major", "description": "{{dataId}}"}});
    c.expect(201, "PUT", "/api/v1/rules/hot", Some(&rule)).await;
    let bridge = json!({"stream": "alarms", "channel": "alarm-feed"});
    let made = c
        .expect(201, "PUT", "/api/v1/bridges/alarms-out", Some(&bridge))
        .await;
    assert_eq!(made["channel"], "alarm-feed");
    let data_bridge = json!({"stream": "data", "channel": "hot-data",
                             "filter": {"q": "temperature>45"}});
    c.expect(201, "PUT", "/api/v1/bridges/data-out", Some(&data_bridge))
        .await;
    for bad in [
        json!({"stream": "nope", "channel": "x"}),
        json!({"stream": "data", "channel": "Bad"}),
        json!({"stream": "data", "channel": "x", "filter": {"q": "a>>"}}),
    ] {
        c.expect(400, "PUT", "/api/v1/bridges/bad", Some(&bad))
            .await;
    }
    put(&c, "/channel/alarm-feed/subscription/polling/ops", None).await;
    put(&c, "/channel/hot-data/subscription/polling/ops", None).await;
    let mut live = Live::connect(&server).await;
    live.subscribe("a", "alarms", json!({})).await;

    let t0 = now_ms();
    let readings = [
        ("u1", "d1", 46),
        ("u2", "d2", 47),
        ("u3", "d1", 48),
        ("u4", "d1", 30),
        ("u5", "d3", 20),
    ];
    for (i, (id, dev, t)) in readings.iter().enumerate() {
        c.uplink(
            "farm",
            "decoded",
            "em300th",
            &decoded_body(id, dev, *t, 50, t0 + i as i64),
        )
        .await;
    }
    let mut on_socket = Vec::new();
    for _ in 0..4 {
        on_socket.push(live.next().await["event"].clone());
    }
    let acked = c
        .expect(
            200,
            "POST",
            &format!(
                "/api/v1/alarms/{}/ack",
                on_socket[1]["id"].as_str().unwrap()
            ),
            None,
        )
        .await;
    on_socket.push(live.next().await["event"].clone());
    assert_eq!(acked["acked"], true);

    let fetched = eventually(Duration::from_secs(10), || async {
        let (_, got) = call(
            &c,
            "GET",
            "/channel/alarm-feed/subscription/polling/ops?max=100",
        )
        .await;
        (got["messages"].as_array().map_or(0, Vec::len) >= 5).then_some(got)
    })
    .await;
    let messages = fetched["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 5);
    for (m, e) in messages.iter().zip(&on_socket) {
        assert_eq!(&m["content"], e, "the event as raised");
        assert_eq!(m["messageID"], e["eventId"]);
    }
    let hot = eventually(Duration::from_secs(10), || async {
        let (_, got) = call(&c, "GET", "/channel/hot-data/subscription/polling/ops").await;
        (got["messages"].as_array().map_or(0, Vec::len) >= 3).then_some(got)
    })
    .await;
    assert_eq!(ids(&hot), ["u1", "u2", "u3"]);
    assert_eq!(hot["messages"][0]["content"]["dataId"], "u1");

    // After a crash the bridges go on from where they were, nothing twice.
    server.restart();
    let c = server.client();
    c.uplink(
        "farm",
        "decoded",
        "em300th",
        &decoded_body("u6", "d3", 49, 50, t0 + 9),
    )
    .await;
    let after = eventually(Duration::from_secs(10), || async {
        let (_, got) = call(&c, "GET", "/channel/hot-data/subscription/polling/ops").await;
        (got["messages"].as_array().map_or(0, Vec::len) >= 4).then_some(got)
    })
    .await;
    assert_eq!(ids(&after), ["u1", "u2", "u3", "u6"]);
    let listed = c.expect(200, "GET", "/api/v1/bridges", None).await;
    assert_eq!(listed.as_array().unwrap().len(), 2);
    c.expect(204, "DELETE", "/api/v1/bridges/data-out", None)
        .await;
    c.expect(404, "GET", "/api/v1/bridges/data-out", None).await;
}

/// An HS256 token with these claims.
fn jwt(claims: Value, secret: &[u8]) -> String {
    use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
    encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret),
    )
    .unwrap()
}

/// Writes a config file and starts weft with it.
fn server_with_config(toml: &str) -> (Server, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weft.toml");
    std::fs::write(&path, toml).unwrap();
    let server = Server::start_with_env(&[("WEFT_CONFIG", path.to_str().unwrap())]);
    (server, dir)
}

/// A channel whose rule asks for a JWT accepts a valid one bound to the
/// channel, refuses a missing, wrong or foreign one with 403, and refuses
/// a revoked one after the admin API revoked its `jti` (also after a
/// restart); the admin API wants its token.
#[tokio::test]
async fn jwt_accept_reject_and_revoke() {
    let (mut server, _dir) = server_with_config(
        r#"
[channels]
admin_tokens = ["admin-secret"]
[[channels.rules]]
regex = 'room-(?P<id>\d+)'
[channels.rules.jwt]
iss = ["https://issuer.example"]
keys = { HS256 = ["c2VjcmV0LWtleS0xMjM0NTY3ODkw"] }
claims = { room = "{{.channel.id}}" }
"#,
    );
    let c = server.client();
    let secret = b"secret-key-1234567890";
    let exp = now_ms() / 1000 + 600;
    let good = jwt(
        json!({"iss": "https://issuer.example", "room": "7", "exp": exp, "jti": "tok-1"}),
        secret,
    );
    let other_room = jwt(
        json!({"iss": "https://issuer.example", "room": "8", "exp": exp}),
        secret,
    );
    let forged = jwt(
        json!({"iss": "https://issuer.example", "room": "7", "exp": exp}),
        b"not-the-secret-at-all",
    );
    let with = |token: &str| format!("Bearer {token}");
    let put_auth = |path: &'static str, auth: Option<String>| {
        let c = c.clone();
        async move {
            let mut req = c.http.put(format!("{}{path}", c.url)).body("{}");
            if let Some(a) = auth {
                req = req.header("Authorization", a);
            }
            req.send().await.unwrap().status().as_u16()
        }
    };
    assert_eq!(
        put_auth("/channel/room-7/message/m1", Some(with(&good))).await,
        200
    );
    assert_eq!(put_auth("/channel/room-7/message/m2", None).await, 403);
    assert_eq!(
        put_auth("/channel/room-7/message/m3", Some(with(&other_room))).await,
        403
    );
    assert_eq!(
        put_auth("/channel/room-7/message/m4", Some(with(&forged))).await,
        403
    );
    assert_eq!(
        put_auth("/channel/lobby/message/m5", None).await,
        200,
        "no rule, no check"
    );
    let (s, body) = c
        .send("GET", "/channel/room-7/subscription/polling/s", None, None)
        .await;
    assert_eq!((s, body), (403, json!({"error": "Forbidden"})));

    let revoke = format!("/admin/jwt/revoke?jti=tok-1&exp={exp}");
    let (s, _) = c.send("PUT", &revoke, None, Some("Bearer wrong")).await;
    assert_eq!(s, 403);
    let (s, body) = c
        .send("PUT", &revoke, None, Some("Bearer admin-secret"))
        .await;
    assert_eq!((s, body), (200, json!({"jti": "tok-1", "exp": exp})));
    assert_eq!(
        put_auth("/channel/room-7/message/m6", Some(with(&good))).await,
        403
    );
    server.restart();
    let c = server.client();
    let mut req = c
        .http
        .put(format!("{}/channel/room-7/message/m7", c.url))
        .body("{}");
    req = req.header("Authorization", with(&good));
    assert_eq!(
        req.send().await.unwrap().status().as_u16(),
        403,
        "revocation survives a restart"
    );
}

/// A webhook whose receiver is down is retried until the receiver comes
/// back, with DSPS's body; the publish itself answers at once.
#[tokio::test]
async fn webhooks_are_retried_until_the_receiver_answers() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (server, _dir) = server_with_config(&format!(
        r#"
[[channels.rules]]
regex = 'hook-(?P<id>.+)'
[[channels.rules.webhooks]]
url = "http://127.0.0.1:{port}/hook/{{{{.channel.id}}}}"
headers = {{ X-Room = "{{{{.channel.id}}}}" }}
retry = {{ count = 30, interval = "200ms", interval_multiplier = 1.0, interval_jitter = "0s" }}
"#
    ));
    let c = server.client();
    let started = Instant::now();
    assert_eq!(
        put(&c, "/channel/hook-a1/message/m1", Some(r#"{"x":1}"#))
            .await
            .0,
        200
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the publish does not wait for the webhook"
    );
    tokio::time::sleep(Duration::from_millis(700)).await;

    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let app = axum::Router::new().route(
        "/hook/{room}",
        axum::routing::put(
            move |axum::extract::Path(room): axum::extract::Path<String>,
                  headers: axum::http::HeaderMap,
                  body: String| {
                let tx = tx.clone();
                async move {
                    let _ = tx.send((room, headers["x-room"].to_str().unwrap().to_string(), body));
                    ""
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let (room, header, body) = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("the webhook arrives once the receiver is up")
        .unwrap();
    assert_eq!((room.as_str(), header.as_str()), ("a1", "a1"));
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        body,
        json!({"type": "dsps.channel.outgoing-webhook", "channelID": "hook-a1",
               "messageID": "m1", "content": {"x": 1}})
    );
}

/// `GET /api/v1/channels?…` as the admin: status, `X-Total-Count` and body.
async fn listing(c: &Client, query: &str) -> (u16, Option<u64>, Value) {
    let resp = c
        .http
        .get(format!("{}/api/v1/channels{query}", c.url))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let total = resp
        .headers()
        .get("x-total-count")
        .and_then(|v| v.to_str().ok()?.parse().ok());
    (status, total, resp.json().await.unwrap_or(Value::Null))
}

/// A subscriber's backlog figure in a channel as listed.
fn backlog_of(channel: &Value, subscriber: &str) -> Value {
    channel["subscribers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == subscriber)
        .unwrap_or_else(|| panic!("{subscriber} listed in {channel}"))["backlog"]
        .clone()
}

/// The channel listing: each channel with its subscribers and how far
/// behind each is — a subscriber that pulled and acknowledged has a
/// backlog of 0, one that did not has every message published since it
/// subscribed, with the oldest one's time; paged with `X-Total-Count`,
/// 400 for bad paging, 404 for an unknown channel, admin keys only; and
/// the total backlog reaches `/metrics` (what the console's overview
/// shows).
#[tokio::test]
async fn the_channel_listing_shows_subscribers_and_backlogs() {
    let server = Server::start();
    let c = server.client();
    let before = now_ms();
    for sub in ["fast", "slow"] {
        let path = format!("/channel/feed/subscription/polling/{sub}");
        assert_eq!(put(&c, &path, None).await.0, 200);
    }
    assert_eq!(
        put(&c, "/channel/archive/message/a1", Some("{}")).await.0,
        200
    );
    for i in 0..3 {
        let path = format!("/channel/feed/message/m{i}");
        assert_eq!(put(&c, &path, Some(r#"{"n":1}"#)).await.0, 200);
    }
    // `fast` pulls the three and acknowledges them; `slow` does nothing.
    let fast = "/channel/feed/subscription/polling/fast";
    let (s, fetched) = call(&c, "GET", fast).await;
    assert_eq!((s, ids(&fetched).len()), (200, 3), "{fetched}");
    let handle = fetched["ackHandle"].as_str().unwrap();
    let (s, _) = call(&c, "DELETE", &format!("{fast}/message?ackHandle={handle}")).await;
    assert_eq!(s, 204);

    let (s, total, all) = listing(&c, "").await;
    assert_eq!((s, total), (200, Some(2)), "{all}");
    let names: Vec<&str> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|ch| ch["id"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["archive", "feed"]);
    let feed = &all[1];
    assert_eq!(backlog_of(feed, "fast")["messages"], 0, "{feed}");
    assert_eq!(backlog_of(feed, "fast")["oldestMessageAt"], Value::Null);
    let slow = backlog_of(feed, "slow");
    assert_eq!(slow["messages"], 3, "{feed}");
    let oldest = slow["oldestMessageAt"].as_i64().expect("the oldest's time");
    assert!(oldest >= before - 1000, "{slow}");
    assert!(slow["oldestMessageAgeMs"].as_i64().unwrap() >= 0, "{slow}");
    assert_eq!(feed["backlog"]["messages"], 3, "{feed}");
    // A channel without subscribers: its stored messages, no subscribers.
    assert_eq!(all[0]["subscribers"], json!([]));
    assert_eq!(all[0]["backlog"]["messages"], 1, "{}", all[0]);

    // One channel; a page; bad paging; an unknown channel.
    let (s, one) = call(&c, "GET", "/api/v1/channels/feed").await;
    assert_eq!(
        (s, backlog_of(&one, "slow")["messages"].clone()),
        (200, json!(3))
    );
    let (s, total, page) = listing(&c, "?limit=1&offset=1").await;
    assert_eq!((s, total), (200, Some(2)));
    assert_eq!(page.as_array().map(Vec::len), Some(1));
    assert_eq!(page[0]["id"], "feed");
    for bad in ["?limit=0", "?limit=1001", "?offset=-1", "?sort=id"] {
        let (s, _, body) = listing(&c, bad).await;
        assert_eq!(s, 400, "{bad}: {body}");
        assert_eq!(body["error"], "BadRequest", "{bad}: {body}");
    }
    let (s, body) = call(&c, "GET", "/api/v1/channels/nope").await;
    assert_eq!(s, 404, "{body}");

    // Admin keys only: a read key is refused, no key is unauthorized.
    let made = c
        .expect(
            201,
            "POST",
            "/api/v1/keys",
            Some(&json!({"name": "dash", "role": "read"})),
        )
        .await;
    let reader = server.client_with(made["key"].as_str());
    assert_eq!(listing(&reader, "").await.0, 403);
    assert_eq!(
        server
            .client_with(None)
            .send("GET", "/api/v1/channels/feed", None, None)
            .await
            .0,
        401
    );

    // The total backlog reaches /metrics with the sweeper's next round:
    // 3 waiting in `feed` for `slow` (`archive` has no subscriber).
    eventually(Duration::from_secs(30), || async {
        let text = c.metrics().await?;
        text.lines()
            .any(|l| l == "weft_channel_backlog_messages 3")
            .then_some(())
    })
    .await;
}

/// Webhook calls are queued with their messages: weft killed with kill -9
/// while most calls of a burst are still waiting for a slow receiver
/// makes them after the restart, every message's call at least once.
#[tokio::test]
async fn webhook_calls_survive_kill_9() {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::put(move |body: String| {
            let tx = tx.clone();
            async move {
                // A slow receiver: the burst outlives the first process.
                tokio::time::sleep(Duration::from_millis(100)).await;
                let body: Value = serde_json::from_str(&body).unwrap();
                let _ = tx.send(body["messageID"].as_str().unwrap().to_string());
                ""
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let (mut server, _dir) = server_with_config(&format!(
        r#"
[[channels.rules]]
regex = 'burst'
[[channels.rules.webhooks]]
url = "http://127.0.0.1:{port}/hook"
retry = {{ count = 3, interval = "100ms", interval_multiplier = 1.0, interval_jitter = "0s" }}
"#
    ));
    let c = server.client();
    let total = 300;
    for i in 0..total {
        let (status, body) = put(&c, &format!("/channel/burst/message/m{i}"), Some("{}")).await;
        assert_eq!(status, 200, "{body}");
    }
    server.kill9();
    let mut seen: std::collections::HashSet<String> =
        std::iter::from_fn(|| rx.try_recv().ok()).collect();
    let before = seen.len();
    assert!(
        before < total,
        "the kill came before every call was made ({before})"
    );
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.len() < total {
        let id = tokio::time::timeout(deadline - Instant::now(), rx.recv())
            .await
            .unwrap_or_else(|_| panic!("{} of {total} calls within 60 s", seen.len()))
            .unwrap();
        seen.insert(id);
    }
}
