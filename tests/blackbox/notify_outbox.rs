//! Notifications are at least once: every change weft acknowledged reaches
//! every subscription that matches it, in order per entity, across a
//! kill -9 and across a receiver that is down for a while.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};

use crate::util::*;

/// One notification as a receiver got it.
#[derive(Debug, Clone)]
pub(crate) struct Got {
    /// The path it was sent to (`/s<i>`: which subscription).
    pub(crate) path: String,
    /// The entity it is about.
    pub(crate) entity: String,
    /// The value it reports (`seq` of a room, `temperature` of a device).
    pub(crate) value: i64,
    /// `Weft-Notification-Id`.
    pub(crate) id: String,
}

/// A notification receiver on a fixed port that records what it gets and
/// can be taken down and brought back.
pub(crate) struct Sink {
    port: u16,
    got: Arc<Mutex<Vec<Got>>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Sink {
    pub(crate) async fn start() -> Sink {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let mut sink = Sink {
            port,
            got: Arc::default(),
            task: None,
        };
        sink.up().await;
        sink
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Listens (again) on its port.
    pub(crate) async fn up(&mut self) {
        let got = self.got.clone();
        let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
            let got = got.clone();
            async move {
                let (parts, body) = req.into_parts();
                let body = axum::body::to_bytes(body, 1 << 20).await.unwrap();
                let json: Value = serde_json::from_slice(&body).unwrap();
                let id = parts
                    .headers
                    .get("weft-notification-id")
                    .map(|v| v.to_str().unwrap().to_string())
                    .expect("every notification carries its id");
                let mut got = got.lock().unwrap();
                for entity in json["data"].as_array().unwrap() {
                    let value = entity
                        .get("seq")
                        .or_else(|| entity.get("temperature"))
                        .map(|a| a["value"].as_f64().unwrap() as i64)
                        .expect("the watched attribute");
                    got.push(Got {
                        path: parts.uri.path().to_string(),
                        entity: entity["id"].as_str().unwrap().to_string(),
                        value,
                        id: id.clone(),
                    });
                }
                axum::http::StatusCode::NO_CONTENT
            }
        });
        let listener = loop {
            match tokio::net::TcpListener::bind(("127.0.0.1", self.port)).await {
                Ok(l) => break l,
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        };
        self.task = Some(tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        }));
    }

    /// Stops listening: connections are refused until [`Sink::up`].
    pub(crate) async fn down(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }

    pub(crate) fn got(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }
}

/// What one subscription received, checked against what it is owed: every
/// owed value at least once, and values in order per entity (duplicates
/// — the same notification id again — aside). Answers the duplicates.
fn check_subscription(path: &str, got: &[&Got], owed: &BTreeMap<String, Vec<i64>>) -> usize {
    let mut seen_ids = HashSet::new();
    let mut duplicates = 0;
    let mut last: HashMap<&str, i64> = HashMap::new();
    let mut values: HashMap<&str, HashSet<i64>> = HashMap::new();
    for g in got {
        if !seen_ids.insert(g.id.as_str()) {
            duplicates += 1;
            continue;
        }
        if let Some(&before) = last.get(g.entity.as_str()) {
            assert!(
                g.value > before,
                "{path}: {} went from {before} to {} (out of order): {:?}",
                g.entity,
                g.value,
                got.iter()
                    .filter(|o| o.entity == g.entity)
                    .map(|o| (o.value, o.id.as_str()))
                    .collect::<Vec<_>>()
            );
        }
        last.insert(&g.entity, g.value);
        values.entry(&g.entity).or_default().insert(g.value);
    }
    for (entity, owed) in owed {
        let received = values.get(entity.as_str());
        let missing: Vec<i64> = owed
            .iter()
            .filter(|v| !received.is_some_and(|r| r.contains(v)))
            .copied()
            .collect();
        assert!(
            missing.is_empty(),
            "{path}: {} acknowledged changes of {entity} never notified: {:?}…",
            missing.len(),
            &missing[..missing.len().min(10)]
        );
    }
    duplicates
}

/// Sends `method path body` to whatever URL the server has now; the
/// status, or 0 when the server could not be reached.
async fn send_to(
    http: &reqwest::Client,
    base: &Mutex<String>,
    method: &str,
    path: &str,
    body: &Value,
    auth: Option<&str>,
) -> u16 {
    let url = format!("{}{path}", base.lock().unwrap());
    let mut req = http
        .request(method.parse().unwrap(), url)
        .header("X-Auth-Token", ADMIN_KEY)
        .json(body);
    if let Some(auth) = auth {
        req = req.header("Authorization", auth);
    }
    match req.send().await {
        Ok(resp) => resp.status().as_u16(),
        Err(_) => 0,
    }
}

/// Creates `Room1` with `seq` 0 through `c`.
pub(crate) async fn create_room(c: &Client) {
    let room = json!({"id": "Room1", "type": "Room", "seq": {"value": 0, "type": "Number"}});
    let (status, body) = c.send("POST", "/v2/entities", Some(&room), None).await;
    assert_eq!(status, 201, "{body}");
}

/// Subscribes through `c` to `Room1`'s `seq`, notifying `url`, with
/// `extra` added to the notification; answers the subscription's path.
pub(crate) async fn subscribe_to_room(c: &Client, url: &str, extra: Value) -> String {
    let mut notification = json!({"http": {"url": url}, "attrs": ["seq"]});
    for (k, v) in extra.as_object().unwrap() {
        notification[k] = v.clone();
    }
    let sub = json!({"subject": {"entities": [{"id": "Room1", "type": "Room"}]},
                     "notification": notification});
    let (status, headers, body) = call(c, "POST", "/v2/subscriptions", &[], Some(&sub)).await;
    assert_eq!(status, 201, "{body}");
    headers["location"].to_str().unwrap().to_string()
}

/// Sets `Room1`'s `seq` to each of `values` in turn through `c`.
pub(crate) async fn set_seq(c: &Client, values: impl IntoIterator<Item = i64>) {
    for v in values {
        let body = json!({"seq": {"value": v, "type": "Number"}});
        let (status, reply) = c
            .send("PATCH", "/v2/entities/Room1/attrs", Some(&body), None)
            .await;
        assert_eq!(status, 204, "{reply}");
    }
}

/// The delivery of `c`'s first subscription (`GET /api/v1/subscriptions/delivery`).
pub(crate) async fn first_delivery(c: &Client) -> Value {
    let (status, d) = c
        .send("GET", "/api/v1/subscriptions/delivery", None, None)
        .await;
    assert_eq!(status, 200, "{d}");
    d[0].clone()
}

const ROOMS: usize = 50;
const DEVICES: usize = 10;

/// 100 subscriptions (90 on rooms changed through NGSI, two per room but
/// ten, 10 on devices changed by their uplinks), 10,000 NGSI updates and
/// 1,000 uplinks from 40 concurrent clients, weft killed with kill -9 when
/// half of them have been answered, then restarted: every change weft
/// acknowledged reaches every subscription that matches it, in order per
/// entity; the duplicates (notifications sent again after the restart)
/// are few.
#[tokio::test]
async fn kill_9_in_the_middle_loses_no_notification() {
    let mut server = Server::start();
    let c = server.client();
    c.create_em300th().await;
    let sink = Sink::start().await;
    for r in 0..ROOMS {
        let (status, body) = c
            .send(
                "POST",
                "/v2/entities",
                Some(&json!({"id": format!("Room{r}"), "type": "Room",
                             "seq": {"value": 0, "type": "Number"}})),
                None,
            )
            .await;
        assert_eq!(status, 201, "{body}");
    }
    // Subscription i watches Room(i mod 50) for i < 90, device i - 90 after.
    for i in 0..100 {
        let (subject, attr) = if i < 90 {
            (
                json!({"entities": [{"id": format!("Room{}", i % ROOMS), "type": "Room"}],
                    "condition": {"attrs": ["seq"]}}),
                "seq",
            )
        } else {
            (
                json!({"entities": [{"id": format!("ob-dev-{}", i - 90)}],
                    "condition": {"attrs": ["temperature"]}}),
                "temperature",
            )
        };
        let (status, body) = c
            .send(
                "POST",
                "/v2/subscriptions",
                Some(&json!({"subject": subject,
                             "notification": {"http": {"url": sink.url(&format!("/s{i}"))},
                                              "attrs": [attr]}})),
                None,
            )
            .await;
        assert_eq!(status, 201, "{body}");
    }

    let base = Arc::new(Mutex::new(server.url.clone()));
    let http = reqwest::Client::new();
    let answered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // Acknowledged values per entity.
    let acked: Arc<Mutex<BTreeMap<String, Vec<i64>>>> = Arc::default();
    let updates_per_room = 10_000 / ROOMS;
    let uplinks_per_device = 1_000 / DEVICES;
    // Each client owns its entities, so their values rise in order.
    let clients: Vec<_> = (0..ROOMS + DEVICES)
        .map(|k| {
            let (base, http, answered, acked) =
                (base.clone(), http.clone(), answered.clone(), acked.clone());
            async move {
                if k < ROOMS {
                    let room = format!("Room{k}");
                    for v in 1..=updates_per_room as i64 {
                        let body = json!({"seq": {"value": v, "type": "Number"}});
                        let path = format!("/v2/entities/{room}/attrs");
                        let status = send_to(&http, &base, "PATCH", &path, &body, None).await;
                        if status == 204 {
                            acked
                                .lock()
                                .unwrap()
                                .entry(room.clone())
                                .or_default()
                                .push(v);
                            answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        } else {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                } else {
                    let device = format!("ob-dev-{}", k - ROOMS);
                    for v in 1..=uplinks_per_device as i64 {
                        let body = decoded_body(&format!("{device}-{v}"), &device, v, 40, now_ms());
                        let status = send_to(
                            &http,
                            &base,
                            "POST",
                            "/sensor-data/outbox/decoded/em300th",
                            &body,
                            Some(KEY),
                        )
                        .await;
                        if status == 202 {
                            acked
                                .lock()
                                .unwrap()
                                .entry(device.clone())
                                .or_default()
                                .push(v);
                            answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        } else {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
            }
        })
        .collect();
    let load = tokio::spawn(
        futures::stream::iter(clients)
            .buffer_unordered(40)
            .collect::<Vec<()>>(),
    );
    eventually(Duration::from_secs(120), || async {
        (answered.load(std::sync::atomic::Ordering::Relaxed) >= 5_500).then_some(())
    })
    .await;
    server.kill9();
    server.restart();
    *base.lock().unwrap() = server.url.clone();
    load.await.unwrap();
    let acked = acked.lock().unwrap().clone();
    let total: usize = acked.values().map(Vec::len).sum();
    assert!(
        total > 6_000,
        "requests after the restart were acknowledged too ({total})"
    );

    // What each subscription is owed: the acknowledged values of its entity.
    let owed_to = |i: usize| -> BTreeMap<String, Vec<i64>> {
        let entity = if i < 90 {
            format!("Room{}", i % ROOMS)
        } else {
            format!("ob-dev-{}", i - 90)
        };
        acked
            .get(&entity)
            .map(|v| (entity, v.clone()))
            .into_iter()
            .collect()
    };
    let all_there = |got: &[Got]| {
        (0..100).all(|i| {
            let path = format!("/s{i}");
            owed_to(i).iter().all(|(entity, values)| {
                let have: HashSet<i64> = got
                    .iter()
                    .filter(|g| g.path == path && &g.entity == entity)
                    .map(|g| g.value)
                    .collect();
                values.iter().all(|v| have.contains(v))
            })
        })
    };
    let got = eventually(Duration::from_secs(90), || async {
        let got = sink.got();
        all_there(&got).then_some(got)
    })
    .await;
    let mut duplicates = 0;
    for i in 0..100 {
        let path = format!("/s{i}");
        let mine: Vec<&Got> = got.iter().filter(|g| g.path == path).collect();
        duplicates += check_subscription(&path, &mine, &owed_to(i));
    }
    let notifications = got.len();
    eprintln!(
        "{notifications} notifications for {total} acknowledged changes, {duplicates} duplicates"
    );
    // Resent are the notifications sent after the last stored cursors
    // (stored five times a second): a fraction of a second's worth.
    assert!(
        duplicates * 5 < notifications,
        "duplicates are few: {duplicates} of {notifications}"
    );
}

/// A receiver that is down for a while gets, once back, every
/// notification it was owed, in order, each once; the subscription stays
/// active and counts one failure per notification that failed, as Orion
/// counts them.
#[tokio::test]
async fn a_receiver_down_then_back_gets_everything_owed_in_order() {
    let server = Server::start();
    let c = server.client();
    let mut sink = Sink::start().await;
    create_room(&c).await;
    subscribe_to_room(&c, &sink.url("/s0"), json!({})).await;
    sink.down().await;
    set_seq(&c, 1..=50).await;
    // Each notification fails on its own (the first live, the others
    // counted behind it as they come).
    let subs = eventually(Duration::from_secs(5), || async {
        let (_, subs) = c.send("GET", "/v2/subscriptions", None, None).await;
        (subs[0]["notification"]["failsCounter"] == 50).then_some(subs)
    })
    .await;
    let n = &subs[0]["notification"];
    assert_eq!(subs[0]["status"], "active", "{subs}");
    assert_eq!(n["timesSent"], 50, "{n}");
    assert_eq!(n["lastFailureReason"], "Couldn't connect to server", "{n}");
    assert!(sink.got().is_empty());
    // What it owes shows: served from the log, the oldest change waiting.
    let d = &first_delivery(&c).await;
    assert_eq!(d["id"], subs[0]["id"], "{d}");
    assert_eq!(d["fromLog"], true, "{d}");
    assert_eq!(d["owed"], 50, "{d}");
    assert!(d["oldestOwed"].is_string(), "{d}");
    assert_eq!(d["failing"], "Couldn't connect to server", "{d}");

    // Down long enough for the retries to back off to their longest wait.
    tokio::time::sleep(Duration::from_secs(12)).await;
    sink.up().await;
    let got = eventually(Duration::from_secs(30), || async {
        let got = sink.got();
        (got.len() >= 50).then_some(got)
    })
    .await;
    let values: Vec<i64> = got.iter().map(|g| g.value).collect();
    assert_eq!(
        values,
        (1..=50).collect::<Vec<i64>>(),
        "every one, once, in order"
    );
    let (_, subs) = c.send("GET", "/v2/subscriptions", None, None).await;
    let n = &subs[0]["notification"];
    assert_eq!(subs[0]["status"], "active", "{subs}");
    assert!(n.get("lastSuccess").is_some(), "{n}");
    assert!(n.get("failsCounter").is_none_or(|f| f == 0), "{n}");
    let d = eventually(Duration::from_secs(5), || async {
        let d = first_delivery(&c).await;
        (d["fromLog"] == false).then_some(d)
    })
    .await;
    assert_eq!(d["owed"], 0, "{d}");
    assert!(d.get("failing").is_none(), "{d}");

    // Back live: the next change goes out at once.
    set_seq(&c, [51]).await;
    eventually(Duration::from_secs(5), || async {
        sink.got()
            .last()
            .is_some_and(|g| g.value == 51)
            .then_some(())
    })
    .await;
    assert_eq!(sink.got().len(), 51);
}

/// A receiver down past `maxFailsLimit` makes its subscription inactive,
/// as on Orion; what it was owed is dropped, and nothing more is sent.
#[tokio::test]
async fn a_receiver_down_past_max_fails_limit_deactivates_the_subscription() {
    let mut server = Server::start();
    let c = server.client();
    let mut sink = Sink::start().await;
    create_room(&c).await;
    subscribe_to_room(&c, &sink.url("/s0"), json!({"maxFailsLimit": 3})).await;
    sink.down().await;
    set_seq(&c, [1]).await;
    // Counters are stored every second: the failures of the next changes
    // come after a flush, with nothing else to store.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    set_seq(&c, 2..=5).await;
    let subs = eventually(Duration::from_secs(5), || async {
        let (_, subs) = c.send("GET", "/v2/subscriptions", None, None).await;
        (subs[0]["status"] == "inactive").then_some(subs)
    })
    .await;
    assert_eq!(subs[0]["notification"]["failsCounter"], 3, "{subs}");
    sink.up().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        sink.got().is_empty(),
        "an inactive subscription sends nothing"
    );
    // The counts and the status were stored (every second): a restart
    // finds them.
    server.restart();
    let c = server.client();
    let (_, subs) = c.send("GET", "/v2/subscriptions", None, None).await;
    assert_eq!(subs[0]["status"], "inactive", "{subs}");
    assert_eq!(subs[0]["notification"]["failsCounter"], 3, "{subs}");
}

/// A subscription that asks for Orion's fire-and-forget
/// (`"delivery": "atMostOnce"`) gets each notification tried once: what
/// its receiver missed while down is never sent, each miss counted.
#[tokio::test]
async fn at_most_once_is_fire_and_forget() {
    let server = Server::start();
    let c = server.client();
    let mut sink = Sink::start().await;
    create_room(&c).await;
    subscribe_to_room(&c, &sink.url("/s0"), json!({"delivery": "atMostOnce"})).await;
    sink.down().await;
    set_seq(&c, 1..=3).await;
    let subs = eventually(Duration::from_secs(5), || async {
        let (_, subs) = c.send("GET", "/v2/subscriptions", None, None).await;
        (subs[0]["notification"]["failsCounter"] == 3).then_some(subs)
    })
    .await;
    assert_eq!(subs[0]["notification"]["delivery"], "atMostOnce");
    sink.up().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(sink.got().is_empty(), "nothing missed is sent again");
    set_seq(&c, [4]).await;
    let got = eventually(Duration::from_secs(5), || async {
        let got = sink.got();
        (!got.is_empty()).then_some(got)
    })
    .await;
    assert_eq!(got.iter().map(|g| g.value).collect::<Vec<_>>(), [4]);
}

/// A subscription may owe at most `notifications.max_owed` changes: one
/// whose receiver stays down longer skips the oldest, counts them, and
/// gets the newest once its receiver is back.
#[tokio::test]
async fn a_subscription_owes_at_most_max_owed_changes() {
    let server = Server::start_with_env(&[("WEFT_NOTIFICATIONS__MAX_OWED", "10")]);
    let c = server.client();
    let mut sink = Sink::start().await;
    create_room(&c).await;
    subscribe_to_room(&c, &sink.url("/s0"), json!({})).await;
    sink.down().await;
    set_seq(&c, 1..=30).await;
    let dropped = eventually(Duration::from_secs(15), || async {
        first_delivery(&c).await["dropped"]
            .as_u64()
            .filter(|&n| n > 0)
    })
    .await;
    sink.up().await;
    let got = eventually(Duration::from_secs(30), || async {
        let got = sink.got();
        got.last().is_some_and(|g| g.value == 30).then_some(got)
    })
    .await;
    let values: Vec<i64> = got.iter().map(|g| g.value).collect();
    assert!(values.len() <= 11, "at most max_owed resent: {values:?}");
    assert!(
        values.windows(2).all(|w| w[0] < w[1]),
        "in order: {values:?}"
    );
    assert_eq!(
        dropped as usize + values.len(),
        30,
        "every change either skipped and counted or sent: {values:?}, {dropped} dropped"
    );
}
