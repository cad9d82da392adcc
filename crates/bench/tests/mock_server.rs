//! Runs the `ingest` scenario end to end against a small in-process stand-in
//! for weft that follows the HTTP and websocket contract the bench codes
//! against, so the generator, the drain, the store read-back and the checks
//! are exercised without the real server. Faults can be injected (events
//! not published, units stored twice, a slow-consumer disconnect) to prove
//! the checks catch them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post, put};
use axum::{Json, Router};
use base64::Engine;
use clap::Parser;
use serde_json::{json, Value};
use tokio::sync::broadcast;
use weft_bench::common::Session;
use weft_bench::summary::{Metric, Summary};
use weft_bench::BenchCommand;

/// Faults the stand-in can inject.
#[derive(Clone, Copy, Default)]
struct Faults {
    /// Do not publish every n-th uplink on the socket.
    unpublished_every: u64,
    /// Store every n-th uplink twice.
    stored_twice_every: u64,
    /// After this many events, send SlowConsumer and close the socket.
    slow_consumer_after: u64,
    /// Answer every n-th uplink 503 with Retry-After: 1.
    overloaded_every: u64,
}

#[derive(Clone)]
struct Mock {
    faults: Faults,
    received: Arc<AtomicU64>,
    units: Arc<Mutex<Vec<(String, String)>>>,
    events: broadcast::Sender<(String, String)>,
    key: Option<&'static str>,
}

async fn start(faults: Faults, key: Option<&'static str>) -> String {
    let mock = Mock {
        faults,
        received: Arc::new(AtomicU64::new(0)),
        units: Arc::new(Mutex::new(Vec::new())),
        events: broadcast::channel(1 << 16).0,
        key,
    };
    let app = Router::new()
        .route("/health", get(|| async { Json(json!({"status": "pass"})) }))
        .route("/api/v1/device-types/{t}", put(device_type))
        .route("/sensor-data/{ch}/{info}/{t}", post(uplink))
        .route("/api/v1/data", get(data))
        .route("/api/v1/live", get(live))
        .with_state(mock);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

async fn device_type(Path(t): Path<String>, Json(body): Json<Value>) -> StatusCode {
    assert_eq!(t, "em300th");
    assert!(body["decoder"]["script"]
        .as_str()
        .unwrap()
        .contains("decodeUplink"));
    StatusCode::OK
}

async fn uplink(
    State(m): State<Mock>,
    Path((ch, info, t)): Path<(String, String, String)>,
    headers: axum::http::HeaderMap,
    Json(body): Json<Value>,
) -> impl IntoResponse {
    assert_eq!(t, "em300th");
    if let Some(key) = m.key {
        if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some(key) {
            return StatusCode::UNAUTHORIZED.into_response();
        }
    }
    let n = m.received.fetch_add(1, Ordering::Relaxed) + 1;
    if m.faults.overloaded_every > 0 && n % m.faults.overloaded_every == 0 {
        return (StatusCode::SERVICE_UNAVAILABLE, [("retry-after", "1")]).into_response();
    }
    let measures = match info.as_str() {
        "decoded" => json!({"temperature": {"celsius": body["temperature"]},
                            "airHumidity": {"relativePercentage": body["humidity"]}}),
        "encoded" => {
            assert_eq!(body["port"], 85);
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(body["payload"].as_str().unwrap())
                .unwrap();
            assert_eq!(bytes.len(), 10);
            assert_eq!(&bytes[..2], &[0x01, 0x75]);
            let t = f64::from(i16::from_le_bytes([bytes[5], bytes[6]])) / 10.0;
            json!({"temperature": {"celsius": t},
                   "airHumidity": {"relativePercentage": f64::from(bytes[9]) / 2.0},
                   "battery": {"percentage": bytes[2]}})
        }
        other => panic!("infoType {other}"),
    };
    let unit = json!({
        "dataId": body["uuid"], "reportedAt": body["reported_at"], "receivedAt": 0,
        "channel": ch, "device": {"id": body["id"], "name": body["name"], "type": "em300th"},
        "measures": measures,
    })
    .to_string();
    {
        let mut units = m.units.lock().unwrap();
        units.push((ch.clone(), unit.clone()));
        if m.faults.stored_twice_every > 0 && n % m.faults.stored_twice_every == 0 {
            units.push((ch.clone(), unit.clone()));
        }
    }
    if m.faults.unpublished_every == 0 || n % m.faults.unpublished_every != 0 {
        let _ = m.events.send((ch, unit));
    }
    StatusCode::ACCEPTED.into_response()
}

async fn data(State(m): State<Mock>, Query(q): Query<HashMap<String, String>>) -> Json<Value> {
    let limit: usize = q["limit"].parse().unwrap();
    let after: usize = q.get("after").map_or(0, |a| a.parse().unwrap());
    let units = m.units.lock().unwrap();
    let mine: Vec<Value> = units
        .iter()
        .filter(|(ch, _)| Some(ch) == q.get("channel"))
        .skip(after)
        .take(limit)
        .map(|(_, u)| serde_json::from_str(u).unwrap())
        .collect();
    let next = (mine.len() == limit).then(|| (after + limit).to_string());
    Json(json!({"units": mine, "next": next}))
}

async fn live(State(m): State<Mock>, ws: WebSocketUpgrade) -> impl IntoResponse {
    ws.on_upgrade(move |socket| serve_live(m, socket))
}

async fn serve_live(m: Mock, mut socket: WebSocket) {
    let Some(Ok(Message::Text(sub))) = socket.recv().await else {
        return;
    };
    let sub: Value = serde_json::from_str(&sub).unwrap();
    assert_eq!(sub["type"], "subscribe");
    assert_eq!(sub["stream"], "data");
    let channel = sub["filter"]["channels"][0].as_str().unwrap().to_string();
    let mut events = m.events.subscribe();
    let reply = json!({"type": "subscribed", "id": sub["id"]}).to_string();
    socket.send(Message::Text(reply.into())).await.unwrap();
    let mut sent = 0;
    loop {
        tokio::select! {
            event = events.recv() => {
                let Ok((ch, unit)) = event else { return };
                if ch != channel {
                    continue;
                }
                if m.faults.slow_consumer_after > 0 && sent == m.faults.slow_consumer_after {
                    let error = r#"{"type":"error","id":null,"error":"SlowConsumer","description":"the client fell behind"}"#;
                    let _ = socket.send(Message::Text(error.into())).await;
                    let _ = socket.send(Message::Close(None)).await;
                    return;
                }
                let msg = format!(r#"{{"type":"event","id":"s1","event":{unit}}}"#);
                if socket.send(Message::Text(msg.into())).await.is_err() {
                    return;
                }
                sent += 1;
            }
            msg = socket.recv() => match msg {
                Some(Ok(_)) => {}
                _ => return,
            }
        }
    }
}

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    cmd: BenchCommand,
}

async fn bench(url: &str, extra: &[&str]) -> Summary {
    let mut argv = vec![
        "bench",
        "ingest",
        "--url",
        url,
        "--no-progress",
        "--drain-timeout",
        "2s",
    ];
    argv.extend_from_slice(extra);
    let BenchCommand::Ingest(args) = Cli::try_parse_from(argv).unwrap().cmd else {
        panic!("not parsed as ingest");
    };
    let session = Session::start(&args.common).await.unwrap();
    let summary = weft_bench::ingest::run(&args, &session).await.unwrap();
    session.finish().await;
    summary
}

fn count(s: &Summary, name: &str) -> u64 {
    match &s.metrics[name] {
        Metric::Counter { count, .. } => *count,
        other => panic!("{name} is {other:?}"),
    }
}

fn check<'a>(s: &'a Summary, name: &str) -> &'a weft_bench::summary::Check {
    s.checks.iter().find(|c| c.name == name).unwrap()
}

/// A clean closed-loop run passes every check and accounts for every uplink.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_loop_run_passes() {
    let url = start(Faults::default(), Some("sekret")).await;
    let s = bench(
        &url,
        &[
            "--duration",
            "1s",
            "--devices",
            "40",
            "--interval",
            "100ms",
            "--ingest-key",
            "sekret",
        ],
    )
    .await;
    let text = s.to_text();
    assert!(s.passed(), "{text}");
    let sent = count(&s, "http_reqs");
    // 40 devices every 100ms for 1s: about 400 uplinks.
    assert!((300..=440).contains(&sent), "{sent} sent\n{text}");
    assert_eq!(count(&s, "uplinks_accepted"), sent);
    assert_eq!(count(&s, "ws_missing"), 0);
    assert_eq!(count(&s, "store_units"), sent);
    assert_eq!(count(&s, "uplinks_dropped_by_generator"), 0);
    assert!(
        text.contains("✓ every accepted uplink delivered on the socket"),
        "{text}"
    );
    assert!(text.contains("time_lapse"), "{text}");
    let json: Value = serde_json::from_str(&s.to_json_string()).unwrap();
    assert_eq!(json["ok"], true);
    assert_eq!(json["params"]["model"], "closed");
}

/// A wrong ingest key makes every request fail, and the run says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_uplinks_fail_the_status_check() {
    let url = start(Faults::default(), Some("sekret")).await;
    let s = bench(
        &url,
        &[
            "--duration",
            "500ms",
            "--devices",
            "5",
            "--interval",
            "100ms",
        ],
    )
    .await;
    assert!(!s.passed());
    assert!(!check(&s, "status was 202").ok);
    assert_eq!(count(&s, "uplinks_accepted"), 0);
    match &s.metrics["http_status"] {
        Metric::Tally { values } => assert!(values["401"] > 0),
        other => panic!("{other:?}"),
    }
}

/// An open-loop run at a fixed rate offers about rate × duration uplinks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_run_offers_the_rate() {
    let url = start(Faults::default(), None).await;
    let s = bench(
        &url,
        &[
            "--duration",
            "1s",
            "--rate",
            "500",
            "--devices",
            "7",
            "--connections",
            "16",
        ],
    )
    .await;
    assert!(s.passed(), "{}", s.to_text());
    let offered = count(&s, "http_reqs") + count(&s, "uplinks_dropped_by_generator");
    assert_eq!(offered, 500);
    assert_eq!(s.params["model"], "open");
}

/// Lost events, double stores and overload are each caught and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_are_caught() {
    let faults = Faults {
        unpublished_every: 10,
        stored_twice_every: 25,
        overloaded_every: 50,
        ..Faults::default()
    };
    let url = start(faults, None).await;
    let s = bench(
        &url,
        &["--duration", "1s", "--devices", "20", "--interval", "50ms"],
    )
    .await;
    let text = s.to_text();
    assert!(!s.passed(), "{text}");
    assert!(!check(&s, "status was 202").ok, "{text}");
    assert!(
        !check(&s, "every accepted uplink delivered on the socket").ok,
        "{text}"
    );
    assert!(
        !check(&s, "every accepted uplink stored exactly once").ok,
        "{text}"
    );
    assert!(check(&s, "live subscription stayed open").ok, "{text}");
    assert!(count(&s, "ws_missing") > 0, "{text}");
    assert!(count(&s, "store_duplicates") > 0, "{text}");
    assert!(count(&s, "http_req_overloaded") > 0, "{text}");
    assert!(text.contains("paused"), "{text}");
    assert!(text.contains("      ↳  "), "{text}");
}

/// A slow-consumer disconnect is reported as a failure with its reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_consumer_is_a_failure() {
    let faults = Faults {
        slow_consumer_after: 20,
        ..Faults::default()
    };
    let url = start(faults, None).await;
    let s = bench(
        &url,
        &["--duration", "1s", "--devices", "20", "--interval", "100ms"],
    )
    .await;
    let text = s.to_text();
    assert!(!s.passed(), "{text}");
    assert!(!check(&s, "live subscription stayed open").ok, "{text}");
    assert!(text.contains("SlowConsumer"), "{text}");
}
