//! The `channels` scenario: DSPS's own k6 load test (seed 001). Per
//! channel, one publisher PUTs 3 messages `{"at": <ms>}` and sleeps 1 s,
//! in a loop; 3 polling subscribers loop fetch (`timeout=3s`) → sleep
//! 10 ms → ack → sleep 10 ms. Every subscriber is created before the load,
//! so it is owed every message published to its channel.
//!
//! After the load the subscribers keep fetching until they have everything
//! (or `--drain-timeout`). Checks: every published message received by
//! every subscriber of its channel, and none received again after it was
//! acknowledged. Metrics as DSPS reported them: messages received per
//! second, HTTP requests per second, message delay (receive − `at`,
//! including the 20 ms of client sleeps), publish and ack latency.
//!
//! Only DSPS's API is used, so `--peer` drives DSPS itself: the `ackHandle`
//! is an opaque token (DSPS's is standard base64, weft's a number), sent
//! back percent-encoded as DSPS's own client does; delivery is at least
//! once, so a message seen again after an ack that failed is a redelivery
//! (counted, not a violation), and only one seen again after an ack that
//! was answered 204 fails the check.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use futures::StreamExt;
use hdrhistogram::Histogram;
use parking_lot::Mutex;
use rand::distr::{Alphabetic, SampleString};
use serde::Deserialize;
use serde_json::json;
use tokio::time::Instant;

use crate::common::{CommonArgs, Session};
use crate::http::{render_request, Conn};
use crate::ingest::live::now_ms;
use crate::summary::{micros_histogram, Check, Metric, Summary, Trend};
use crate::target::BaseUrl;

/// Longest any one request may take before it counts as failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Range of the latency histograms.
const LATENCY_RANGE: Duration = Duration::from_secs(120);

/// Flags of `weft bench channels`.
#[derive(Debug, Clone, clap::Args)]
pub struct ChannelsArgs {
    /// The flags every scenario takes.
    #[command(flatten)]
    pub common: CommonArgs,

    /// Channels, each with one publisher.
    #[arg(long, default_value_t = 400)]
    pub channels: usize,

    /// Polling subscribers per channel.
    #[arg(long, default_value_t = 3)]
    pub subscribers: usize,

    /// Messages each publisher sends per second (back to back, then a
    /// 1 s sleep, as DSPS's script does).
    #[arg(long, default_value_t = 3)]
    pub messages: usize,

    /// The subscribers' long-poll `timeout`.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    pub fetch_timeout: Duration,

    /// Each subscriber sleeps this long before an ack and again after it.
    #[arg(long, default_value = "10ms", value_parser = humantime::parse_duration)]
    pub sleep: Duration,

    /// After the load, how long subscribers may take to receive the rest.
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    pub drain_timeout: Duration,
}

/// A fetch's answer, reduced to what the checks read.
#[derive(Deserialize)]
struct FetchBody {
    #[serde(default)]
    messages: Vec<FetchedMessage>,
    #[serde(rename = "ackHandle", default)]
    ack_handle: Option<String>,
}

#[derive(Deserialize)]
struct FetchedMessage {
    #[serde(rename = "messageID")]
    message_id: String,
    content: serde_json::Value,
}

/// What the clients measured, merged at the end.
struct Tally {
    publish: Histogram<u64>,
    ack: Histogram<u64>,
    fetch: Histogram<u64>,
    delay: Histogram<u64>,
    /// Each message's delay (ms) by the second of the run it was received
    /// in: where in the run the tail sits (the start's burst, or steady).
    delay_by_second: Vec<(u32, u32)>,
    requests: u64,
    failed: u64,
    received: u64,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            publish: micros_histogram(LATENCY_RANGE),
            ack: micros_histogram(LATENCY_RANGE),
            fetch: micros_histogram(LATENCY_RANGE),
            delay: micros_histogram(LATENCY_RANGE),
            delay_by_second: Vec::new(),
            requests: 0,
            failed: 0,
            received: 0,
        }
    }

    fn merge(&mut self, o: &Tally) {
        let _ = self.publish.add(&o.publish);
        let _ = self.ack.add(&o.ack);
        let _ = self.fetch.add(&o.fetch);
        let _ = self.delay.add(&o.delay);
        self.delay_by_second.extend_from_slice(&o.delay_by_second);
        self.requests += o.requests;
        self.failed += o.failed;
        self.received += o.received;
    }
}

/// What one publisher sent: the ids the server confirmed (200), and those
/// whose publish failed, which the server may or may not have stored.
#[derive(Default)]
struct Sent {
    confirmed: Vec<String>,
    unconfirmed: Vec<String>,
}

/// What one subscriber received.
#[derive(Default)]
struct Received {
    /// Message id → times received.
    times: HashMap<String, u32>,
    /// Receipts of a message whose ack had been answered 204.
    after_ack: u64,
}

/// The path of an ack: `ackHandle` is opaque, so it is percent-encoded
/// (everything but RFC 3986's unreserved characters). DSPS's handles are
/// standard base64 (`+`, `/`, `=`) and DSPS reads its query as a form, where
/// a raw `+` is a space; DSPS's own client encodes it too.
fn ack_path(subscription: &str, handle: &str) -> String {
    let mut path = format!("{subscription}/message?ackHandle=");
    for b in handle.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            path.push(char::from(b));
        } else {
            let _ = write!(path, "%{b:02X}");
        }
    }
    path
}

/// One client's connection: reconnects when the server closed it.
struct Client {
    base: BaseUrl,
    conn: Option<Conn>,
}

impl Client {
    fn new(base: &BaseUrl) -> Client {
        Client {
            base: base.clone(),
            conn: None,
        }
    }

    /// Sends a request; status and body, or `None` on a transport error.
    async fn call(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
        out: Option<&mut Vec<u8>>,
    ) -> Option<u16> {
        if self.conn.is_none() {
            self.conn = Conn::connect(&self.base.connect).await.ok();
        }
        let conn = self.conn.as_mut()?;
        let request = render_request(method, &self.base.path(path), &self.base.host, &[], body);
        match tokio::time::timeout(REQUEST_TIMEOUT, conn.round_trip(&request, out)).await {
            Ok(Ok(head)) => {
                if !conn.reusable() {
                    self.conn = None;
                }
                Some(head.status)
            }
            _ => {
                self.conn = None;
                None
            }
        }
    }
}

/// Runs the scenario against the session's server.
pub async fn run(args: &ChannelsArgs, session: &Session) -> anyhow::Result<Summary> {
    anyhow::ensure!(args.channels >= 1, "--channels must be at least 1");
    anyhow::ensure!(args.subscribers >= 1, "--subscribers must be at least 1");
    let prefix = Alphabetic
        .sample_string(&mut rand::rng(), 12)
        .to_lowercase();
    let base = &session.base;

    // Subscribers first, so each is owed every message of its channel;
    // 64 at a time, over a few connections, retried on transport errors.
    let paths: Vec<String> = (0..args.channels)
        .flat_map(|ch| {
            let prefix = prefix.clone();
            (0..args.subscribers)
                .map(move |sub| format!("/channel/{prefix}-{ch}/subscription/polling/sbsc-{sub}"))
        })
        .collect();
    let created = futures::stream::iter(paths.chunks(paths.len().div_ceil(64).max(1)))
        .map(|chunk| {
            let base = base.clone();
            let chunk = chunk.to_vec();
            async move {
                let mut c = Client::new(&base);
                for path in chunk {
                    let mut tries = 0;
                    loop {
                        match c.call("PUT", &path, None, None).await {
                            Some(200) => break,
                            Some(status) => bail!("PUT {path} answered {status}"),
                            None if tries < 5 => {
                                tries += 1;
                                tokio::time::sleep(Duration::from_millis(100)).await;
                            }
                            None => bail!("PUT {path}: no response"),
                        }
                    }
                }
                Ok(())
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<anyhow::Result<()>>>()
        .await;
    for result in created {
        result?;
    }

    let published: Arc<Mutex<HashMap<usize, Sent>>> = Arc::default();
    let stop_publishing = Arc::new(AtomicBool::new(false));
    let stop_fetching = Arc::new(AtomicBool::new(false));
    // Every message in every fetch (what DSPS's k6 counts), and the first
    // receipts only (what ends the drain: redeliveries must not).
    let received_count = Arc::new(AtomicU64::new(0));
    let distinct_count = Arc::new(AtomicU64::new(0));
    let started = Instant::now();

    let mut publishers = Vec::new();
    for ch in 0..args.channels {
        let base = base.clone();
        let published = published.clone();
        let stop = stop_publishing.clone();
        let prefix = prefix.clone();
        let per_second = args.messages;
        // Spread the publishers over the first second, as k6's VUs start.
        let offset = Duration::from_millis((ch as u64 * 1000) / args.channels as u64);
        publishers.push(tokio::spawn(async move {
            let mut c = Client::new(&base);
            let mut tally = Tally::new();
            let mut ids = Sent::default();
            tokio::time::sleep(offset).await;
            let mut iteration = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for i in 0..per_second {
                    let id = format!("{iteration}-{i}");
                    let body = json!({"at": now_ms()}).to_string();
                    let sent = Instant::now();
                    let status = c
                        .call(
                            "PUT",
                            &format!("/channel/{prefix}-{ch}/message/{id}"),
                            Some(body.as_bytes()),
                            None,
                        )
                        .await;
                    tally.requests += 1;
                    tally
                        .publish
                        .saturating_record(sent.elapsed().as_micros() as u64);
                    if status == Some(200) {
                        ids.confirmed.push(id);
                    } else {
                        tally.failed += 1;
                        ids.unconfirmed.push(id);
                    }
                }
                iteration += 1;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            published.lock().insert(ch, ids);
            tally
        }));
    }

    let mut subscribers = Vec::new();
    for ch in 0..args.channels {
        for sub in 0..args.subscribers {
            let base = base.clone();
            let stop = stop_fetching.clone();
            let count = received_count.clone();
            let distinct = distinct_count.clone();
            let path = format!("/channel/{prefix}-{ch}/subscription/polling/sbsc-{sub}");
            let fetch_path = format!("{path}?timeout={}ms", args.fetch_timeout.as_millis());
            let pause = args.sleep;
            // Connect over the first second rather than all at once.
            let index = (ch * args.subscribers + sub) as u64;
            let offset =
                Duration::from_millis(index * 1000 / (args.channels * args.subscribers) as u64);
            subscribers.push(tokio::spawn(async move {
                tokio::time::sleep(offset).await;
                let mut c = Client::new(&base);
                let mut tally = Tally::new();
                let mut seen = Received::default();
                // Messages whose ack was answered 204.
                let mut acked: HashSet<String> = HashSet::new();
                let mut body = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    body.clear();
                    let sent = Instant::now();
                    let status = c.call("GET", &fetch_path, None, Some(&mut body)).await;
                    let received_at = now_ms();
                    tally.requests += 1;
                    tally
                        .fetch
                        .saturating_record(sent.elapsed().as_micros() as u64);
                    if status != Some(200) {
                        tally.failed += 1;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                    let Ok(fetched) = serde_json::from_slice::<FetchBody>(&body) else {
                        tally.failed += 1;
                        continue;
                    };
                    for m in &fetched.messages {
                        let times = seen.times.entry(m.message_id.clone()).or_insert(0);
                        *times += 1;
                        if *times == 1 {
                            distinct.fetch_add(1, Ordering::Relaxed);
                        }
                        if acked.contains(&m.message_id) {
                            seen.after_ack += 1;
                        }
                        if let Some(at) = m.content.get("at").and_then(|a| a.as_i64()) {
                            let ms = (received_at - at).max(0) as u64;
                            tally.delay.saturating_record(ms * 1000);
                            let second = started.elapsed().as_secs() as u32;
                            tally.delay_by_second.push((second, ms as u32));
                        }
                    }
                    tally.received += fetched.messages.len() as u64;
                    count.fetch_add(fetched.messages.len() as u64, Ordering::Relaxed);
                    if let Some(handle) = fetched.ack_handle {
                        tokio::time::sleep(pause).await;
                        let sent = Instant::now();
                        let status = c
                            .call("DELETE", &ack_path(&path, &handle), None, None)
                            .await;
                        tally.requests += 1;
                        tally
                            .ack
                            .saturating_record(sent.elapsed().as_micros() as u64);
                        if status == Some(204) {
                            // The handle covers this fetch's messages (and
                            // all before them, acked or in it again).
                            acked.extend(fetched.messages.into_iter().map(|m| m.message_id));
                        } else {
                            tally.failed += 1;
                        }
                    }
                    tokio::time::sleep(pause).await;
                }
                (ch, seen, tally)
            }));
        }
    }

    tokio::time::sleep(args.common.duration).await;
    stop_publishing.store(true, Ordering::Relaxed);
    let load_elapsed = started.elapsed();
    let received_during_load = received_count.load(Ordering::Relaxed);
    let mut tally = Tally::new();
    for p in publishers {
        tally.merge(&p.await?);
    }
    let published = std::mem::take(&mut *published.lock());
    let owed: u64 = published
        .values()
        .map(|v| v.confirmed.len() as u64)
        .sum::<u64>()
        * args.subscribers as u64;

    // Drain: until every owed message arrived, or the timeout.
    let drain_started = Instant::now();
    while distinct_count.load(Ordering::Relaxed) < owed
        && drain_started.elapsed() < args.drain_timeout
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // One more cycle, so redeliveries after an ack would show.
    tokio::time::sleep(args.sleep * 2 + Duration::from_millis(100)).await;
    stop_fetching.store(true, Ordering::Relaxed);
    let drain_elapsed = drain_started.elapsed();

    let mut missing = 0u64;
    let mut delivered = 0u64;
    let mut redelivered = 0u64;
    let mut repeated = 0u64;
    let mut unexpected = 0u64;
    let none = Sent::default();
    for s in subscribers {
        let (ch, seen, t) = s.await?;
        tally.merge(&t);
        let sent = published.get(&ch).unwrap_or(&none);
        let want: HashSet<&String> = sent.confirmed.iter().collect();
        let maybe: HashSet<&String> = sent.unconfirmed.iter().collect();
        for id in &want {
            match seen.times.get(*id) {
                Some(_) => delivered += 1,
                None => missing += 1,
            }
        }
        redelivered += seen.times.values().map(|n| u64::from(n - 1)).sum::<u64>();
        repeated += seen.after_ack;
        unexpected += seen
            .times
            .keys()
            .filter(|k| !want.contains(k) && !maybe.contains(k))
            .count() as u64;
    }

    let load_secs = load_elapsed.as_secs_f64();
    let mut s = Summary {
        scenario: "channels".to_string(),
        ok: false,
        target: session.base.to_string(),
        spawned: session.spawned(),
        params: match json!({
            "channels": args.channels,
            "subscribers_per_channel": args.subscribers,
            "messages_per_second_per_channel": args.messages,
            "fetch_timeout": humantime::format_duration(args.fetch_timeout).to_string(),
            "sleep": humantime::format_duration(args.sleep).to_string(),
            "duration": humantime::format_duration(args.common.duration).to_string(),
            "offered_messages_per_second": (args.channels * args.messages * args.subscribers),
        }) {
            serde_json::Value::Object(m) => m,
            _ => unreachable!("an object literal"),
        },
        phases: vec![
            ("load".to_string(), load_secs),
            ("drain".to_string(), drain_elapsed.as_secs_f64()),
        ],
        description: vec![
            format!(
                "{} channels × 1 publisher ({} messages, then 1 s) × {} subscribers (fetch timeout={}, sleep {}, ack, sleep {})",
                args.channels,
                args.messages,
                args.subscribers,
                humantime::format_duration(args.fetch_timeout),
                humantime::format_duration(args.sleep),
                humantime::format_duration(args.sleep),
            ),
            format!(
                "offers at most {} messages/s to subscribers",
                args.channels * args.messages * args.subscribers
            ),
        ],
        checks: Vec::new(),
        metrics: BTreeMap::new(),
        notes: Vec::new(),
        calibration: None,
        throughput: None,
        memory: Vec::new(),
    };
    s.checks.push(Check::new(
        "every request answered as expected",
        tally.requests - tally.failed,
        tally.failed,
    ));
    s.checks.push(Check::new(
        "every published message received by every subscriber",
        delivered,
        missing,
    ));
    s.checks.push(Check::new(
        "no message received again after its ack, none foreign",
        delivered,
        repeated + unexpected,
    ));
    let m = &mut s.metrics;
    m.insert(
        "messages_received".into(),
        Metric::counter(received_during_load, load_secs),
    );
    m.insert("messages_owed".into(), Metric::count(owed));
    m.insert("messages_missing".into(), Metric::count(missing));
    m.insert("messages_repeated".into(), Metric::count(repeated));
    m.insert("messages_redelivered".into(), Metric::count(redelivered));
    m.insert(
        "http_reqs".into(),
        Metric::counter(tally.requests, (load_elapsed + drain_elapsed).as_secs_f64()),
    );
    m.insert(
        "http_req_failed".into(),
        Metric::rate(tally.failed, tally.requests - tally.failed),
    );
    m.insert(
        "msg_delay".into(),
        Metric::Trend(Trend::from_micros(&tally.delay)),
    );
    m.insert(
        "publish_duration".into(),
        Metric::Trend(Trend::from_micros(&tally.publish)),
    );
    m.insert(
        "ack_duration".into(),
        Metric::Trend(Trend::from_micros(&tally.ack)),
    );
    m.insert(
        "fetch_duration".into(),
        Metric::Trend(Trend::from_micros(&tally.fetch)),
    );
    s.notes.push(delay_by_second(&tally.delay_by_second));
    s.seal();
    Ok(s)
}

/// The note on where the delay sits in the run: per second of receipt,
/// the messages received and their delay's p50 / p99 (ms).
fn delay_by_second(delays: &[(u32, u32)]) -> String {
    let mut by_second: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for &(second, ms) in delays {
        by_second.entry(second).or_default().push(ms);
    }
    let mut note = "msg_delay by second received (messages: p50/p99 ms):".to_string();
    for (second, mut ms) in by_second {
        ms.sort_unstable();
        let at = |q: f64| ms[((ms.len() - 1) as f64 * q).round() as usize];
        let _ = write!(note, " {second}s {}: {}/{};", ms.len(), at(0.5), at(0.99));
    }
    note
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;
    use std::time::Duration;

    use axum::extract::{Path, Query, State};
    use axum::http::StatusCode;
    use axum::routing::{delete, get, put};
    use axum::{Json, Router};
    use parking_lot::Mutex;
    use serde_json::{json, Value};

    use super::ack_path;
    use crate::common::Session;
    use crate::summary::{Metric, Summary};
    use crate::{try_parse_command, BenchCommand};

    /// DSPS's k6 shape is the default.
    #[test]
    fn defaults_are_the_seed_shape() {
        let BenchCommand::Channels(a) = try_parse_command(&["channels"]).unwrap() else {
            panic!("another scenario");
        };
        assert_eq!((a.channels, a.subscribers, a.messages), (400, 3, 3));
        assert_eq!(a.fetch_timeout, std::time::Duration::from_secs(3));
        assert_eq!(a.sleep, std::time::Duration::from_millis(10));
    }

    /// The per-second note puts each delay in the second it was received
    /// in, so a tail from the start shows apart from the steady state.
    #[test]
    fn delays_are_told_by_second() {
        let mut delays = vec![(0, 900), (0, 10), (0, 2000)];
        delays.extend((0..100).map(|i| (3, if i < 2 { 500 } else { 20 })));
        assert_eq!(
            super::delay_by_second(&delays),
            "msg_delay by second received (messages: p50/p99 ms): 0s 3: 900/2000; 3s 100: 20/500;"
        );
    }

    /// Handles are opaque: anything but unreserved characters is escaped.
    #[test]
    fn ack_handles_are_percent_encoded() {
        assert_eq!(ack_path("/c/s", "42"), "/c/s/message?ackHandle=42");
        assert_eq!(
            ack_path("/c/s", "eyJy+ZW/Rp=="),
            "/c/s/message?ackHandle=eyJy%2BZW%2FRp%3D%3D"
        );
        assert_eq!(
            ack_path("/c/s", "a,b c~-._"),
            "/c/s/message?ackHandle=a%2Cb%20c~-._"
        );
    }

    /// A stand-in for DSPS: messages in publish order per channel, a
    /// cursor per subscriber, and DSPS-like handles (standard base64
    /// characters `+`, `/`, `=`), read from the query as a form is, as DSPS
    /// reads it: a handle sent raw reaches it with a space and is refused.
    #[derive(Default)]
    struct Dsps {
        messages: HashMap<String, Vec<(String, Value)>>,
        cursors: HashMap<(String, String), usize>,
        /// Fault: answer acks 204 but keep the cursor.
        ignore_acks: bool,
        /// Fault: refuse every n-th ack (503, the cursor kept).
        refuse_acks_every: usize,
        acks: usize,
    }
    type Shared = Arc<Mutex<Dsps>>;

    fn handle_of(position: usize) -> String {
        format!("c{position}+x/y=")
    }

    async fn start_dsps(ignore_acks: bool, refuse_acks_every: usize) -> String {
        let state: Shared = Arc::new(Mutex::new(Dsps {
            ignore_acks,
            refuse_acks_every,
            ..Dsps::default()
        }));
        let app = Router::new()
            .route("/probe/readiness", get(|| async { Json(json!({})) }))
            .route("/channel/{ch}/message/{id}", put(publish))
            .route(
                "/channel/{ch}/subscription/polling/{sub}",
                put(subscribe).get(fetch),
            )
            .route(
                "/channel/{ch}/subscription/polling/{sub}/message",
                delete(ack),
            )
            .with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        url
    }

    async fn subscribe(
        State(d): State<Shared>,
        Path((ch, sub)): Path<(String, String)>,
    ) -> Json<Value> {
        let mut d = d.lock();
        let at = d.messages.get(&ch).map_or(0, Vec::len);
        d.cursors.entry((ch.clone(), sub.clone())).or_insert(at);
        Json(json!({"channelID": ch, "subscriberID": sub}))
    }

    async fn publish(
        State(d): State<Shared>,
        Path((ch, id)): Path<(String, String)>,
        body: String,
    ) -> Result<Json<Value>, StatusCode> {
        let content: Value = serde_json::from_str(&body).map_err(|_| StatusCode::BAD_REQUEST)?;
        let mut d = d.lock();
        let list = d.messages.entry(ch.clone()).or_default();
        if !list.iter().any(|(i, _)| *i == id) {
            list.push((id.clone(), content));
        }
        Ok(Json(json!({"channelID": ch, "messageID": id})))
    }

    async fn fetch(
        State(d): State<Shared>,
        Path((ch, sub)): Path<(String, String)>,
        Query(q): Query<HashMap<String, String>>,
    ) -> Result<Json<Value>, StatusCode> {
        let wait = q
            .get("timeout")
            .and_then(|t| t.strip_suffix("ms"))
            .and_then(|t| t.parse().ok())
            .map_or(Duration::ZERO, Duration::from_millis);
        let until = tokio::time::Instant::now() + wait;
        loop {
            {
                let d = d.lock();
                let key = (ch.clone(), sub.clone());
                let cursor = *d.cursors.get(&key).ok_or(StatusCode::NOT_FOUND)?;
                let all = d.messages.get(&ch).map_or(&[][..], Vec::as_slice);
                let new = &all[cursor.min(all.len())..];
                if !new.is_empty() || tokio::time::Instant::now() >= until {
                    let mut body = json!({
                        "channelID": ch,
                        "messages": new.iter().map(|(id, content)| json!({"messageID": id, "content": content})).collect::<Vec<_>>(),
                        "moreMessages": false,
                    });
                    if !new.is_empty() {
                        body["ackHandle"] = json!(handle_of(all.len()));
                    }
                    return Ok(Json(body));
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn ack(
        State(d): State<Shared>,
        Path((ch, sub)): Path<(String, String)>,
        Query(q): Query<HashMap<String, String>>,
    ) -> StatusCode {
        let Some(position) = q
            .get("ackHandle")
            .and_then(|h| h.strip_prefix('c'))
            .and_then(|h| h.strip_suffix("+x/y="))
            .and_then(|h| h.parse::<usize>().ok())
        else {
            return StatusCode::BAD_REQUEST;
        };
        let mut d = d.lock();
        d.acks += 1;
        if d.refuse_acks_every > 0 && d.acks % d.refuse_acks_every == 0 {
            return StatusCode::SERVICE_UNAVAILABLE;
        }
        let ignore = d.ignore_acks;
        match d.cursors.get_mut(&(ch, sub)) {
            Some(cursor) => {
                if !ignore {
                    *cursor = position;
                }
                StatusCode::NO_CONTENT
            }
            None => StatusCode::NOT_FOUND,
        }
    }

    async fn bench(url: &str) -> Summary {
        let BenchCommand::Channels(args) = try_parse_command(&[
            "channels",
            "--url",
            url,
            "--peer",
            "--probe",
            "/probe/readiness",
            "--channels",
            "4",
            "--subscribers",
            "2",
            "--duration",
            "2500ms",
            "--fetch-timeout",
            "500ms",
            "--drain-timeout",
            "5s",
            "--no-progress",
        ])
        .unwrap() else {
            panic!("another scenario");
        };
        let session = Session::start(&args.common).await.unwrap();
        let summary = super::run(&args, &session).await.unwrap();
        session.finish().await;
        summary
    }

    fn count(s: &Summary, name: &str) -> u64 {
        match &s.metrics[name] {
            Metric::Counter { count, .. } => *count,
            other => panic!("{name} is {other:?}"),
        }
    }

    fn check_ok(s: &Summary, prefix: &str) -> bool {
        s.checks
            .iter()
            .find(|c| c.name.starts_with(prefix))
            .unwrap()
            .ok
    }

    /// A DSPS-like peer (base64 handles) passes every check: handles go
    /// back percent-encoded, every message arrives, none after its ack.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn drives_a_dsps_like_peer() {
        let s = bench(&start_dsps(false, 0).await).await;
        assert!(s.ok, "{:?}", s.checks);
        assert!(count(&s, "messages_owed") >= 4 * 2 * 3 * 2);
        assert_eq!(count(&s, "messages_missing"), 0);
        assert_eq!(count(&s, "messages_repeated"), 0);
        assert_eq!(count(&s, "messages_redelivered"), 0);
    }

    /// A peer that answers acks 204 but delivers the messages again fails
    /// the "none after its ack" check.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redelivery_after_an_ack_is_caught() {
        let s = bench(&start_dsps(true, 0).await).await;
        assert!(!s.ok);
        assert!(check_ok(&s, "every request answered"));
        assert!(check_ok(&s, "every published message received"));
        assert!(!check_ok(&s, "no message received again after its ack"));
        assert!(count(&s, "messages_repeated") > 0);
    }

    /// Delivery is at least once: messages whose ack failed come again,
    /// which is counted as a redelivery and a failed request, not as a
    /// message received after its ack.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redelivery_after_a_failed_ack_is_not_after_its_ack() {
        let s = bench(&start_dsps(false, 3).await).await;
        assert!(!check_ok(&s, "every request answered"));
        assert!(check_ok(&s, "every published message received"));
        assert!(check_ok(&s, "no message received again after its ack"));
        assert!(count(&s, "messages_redelivered") > 0);
        assert_eq!(count(&s, "messages_repeated"), 0);
    }
}
