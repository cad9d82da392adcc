//! The notification sink: the HTTP/1.1 endpoint the subscriptions notify,
//! running inside the bench process, that counts what arrives and how late.
//!
//! It answers every request at once with `200` and an empty body on a
//! keep-alive connection, as a healthy Orion notification receiver does,
//! so the server's notifier is measured rather than the receiver. Each
//! notification is parsed ([`super::notification`]), its headers checked,
//! and tallied per subscription and entity; its delay is the time it
//! arrived minus the send time stamped in its newest attribute value
//! ([`super::stamp`]), both read from one monotonic clock.
//!
//! Like the ingest scenario's websocket reader, the sink runs on a runtime
//! of its own (one thread), so a notification is stamped when it arrives
//! rather than when the load generator's busy runtime gets round to it.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use hdrhistogram::Histogram;
use hyper::body::{Body as _, Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

use super::notification::{self, Headers};
use super::stamp;
use crate::summary::micros_histogram;

/// The delay histogram's range; later notifications are clamped to it.
const DELAY_RANGE: Duration = Duration::from_secs(3600);

/// Largest notification body read; a larger one counts as malformed.
const MAX_BODY: usize = 1 << 20;

/// Most problems quoted in [`Tally::examples`].
const MAX_EXAMPLES: usize = 5;

/// Pause after a failed accept (out of file descriptors and the like).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// What one subscription's notifications carried.
#[derive(Debug, Default)]
pub struct SubscriptionTally {
    /// Stamped notifications (sent for a load update), by entity id.
    /// Normally one entry: the entity the subscription watches.
    pub entities: Vec<(Box<str>, u64)>,
    /// Notifications whose attributes all held their creation values:
    /// sent before the load (an initial notification on subscribing).
    pub unstamped: u64,
}

impl SubscriptionTally {
    /// Stamped notifications about entity `id`.
    pub fn for_entity(&self, id: &str) -> u64 {
        self.entities
            .iter()
            .find(|(e, _)| e.as_ref() == id)
            .map_or(0, |(_, n)| *n)
    }

    /// Stamped notifications about any entity.
    pub fn stamped(&self) -> u64 {
        self.entities.iter().map(|(_, n)| n).sum()
    }
}

/// Everything the sink saw.
#[derive(Debug)]
pub struct Tally {
    /// Notifications by subscription id.
    pub subscriptions: HashMap<Box<str>, SubscriptionTally>,
    /// Arrival − send time of every stamped notification, microseconds.
    pub delay: Histogram<u64>,
    /// Requests received, of any kind.
    pub requests: u64,
    /// Stamped notifications (counted in `subscriptions` and `delay`).
    pub stamped: u64,
    /// Notifications without a stamp (see [`SubscriptionTally::unstamped`]).
    pub unstamped: u64,
    /// Requests that were not a readable notification of one entity.
    pub malformed: u64,
    /// Requests with a method other than POST.
    pub not_post: u64,
    /// Notifications whose headers were as Orion sends them.
    pub headers_ok: u64,
    /// Notifications with a header off (see [`notification::check_headers`]).
    pub headers_bad: u64,
    /// When the last stamped notification arrived, since the load started.
    pub last_at: Option<Duration>,
    /// The first few problems, in words, for the summary's notes.
    pub examples: Vec<String>,
}

impl Tally {
    /// An empty tally: nothing received yet.
    pub(crate) fn new() -> Tally {
        Tally {
            subscriptions: HashMap::new(),
            delay: micros_histogram(DELAY_RANGE),
            requests: 0,
            stamped: 0,
            unstamped: 0,
            malformed: 0,
            not_post: 0,
            headers_ok: 0,
            headers_bad: 0,
            last_at: None,
            examples: Vec::new(),
        }
    }

    fn example(&mut self, what: impl FnOnce() -> String) {
        if self.examples.len() < MAX_EXAMPLES {
            self.examples.push(what());
        }
    }

    /// Tallies one request that arrived `at` after the load started (`None`
    /// before it started).
    fn record(
        &mut self,
        not_post: Option<&Method>,
        headers: Result<(), String>,
        body: Result<&[u8], String>,
        at: Option<Duration>,
    ) {
        self.requests += 1;
        if let Some(method) = not_post {
            self.not_post += 1;
            self.example(|| format!("the sink got a {method} request"));
            return;
        }
        match headers {
            Ok(()) => self.headers_ok += 1,
            Err(why) => {
                self.headers_bad += 1;
                self.example(|| format!("notification header: {why}"));
            }
        }
        let parsed = body.and_then(notification::parse);
        let n = match parsed {
            Ok(n) => n,
            Err(why) => {
                self.malformed += 1;
                self.example(|| format!("malformed notification: {why}"));
                return;
            }
        };
        let sub = match self.subscriptions.get_mut(n.subscription_id.as_ref()) {
            Some(sub) => sub,
            None => self
                .subscriptions
                .entry(n.subscription_id.as_ref().into())
                .or_default(),
        };
        let Some(sent_us) = n.newest.and_then(stamp::sent_micros) else {
            sub.unstamped += 1;
            self.unstamped += 1;
            return;
        };
        match sub
            .entities
            .iter_mut()
            .find(|(e, _)| e.as_ref() == n.entity_id.as_ref())
        {
            Some((_, count)) => *count += 1,
            None => sub.entities.push((n.entity_id.as_ref().into(), 1)),
        }
        self.stamped += 1;
        if let Some(at) = at {
            let at_us = at.as_micros() as u64;
            self.delay.saturating_record(at_us.saturating_sub(sent_us));
            self.last_at = Some(self.last_at.map_or(at, |last| last.max(at)));
        }
    }
}

/// State shared by the sink's connections and the scenario.
struct Shared {
    /// The run's tenant, expected in `Fiware-Service`.
    tenant: String,
    /// When the load started: the origin of the stamps.
    origin: OnceLock<Instant>,
    tally: Mutex<Tally>,
    /// Requests so far, for the progress bar without taking the lock.
    requests: AtomicU64,
    /// Connections the server opened to the sink.
    connections: AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Tally> {
        self.tally.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The runtime running the sink: one dedicated worker thread.
fn sink_runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("bench-sink")
            .enable_all()
            .build()
            .expect("the notification sink runtime starts")
    })
}

/// A running sink.
pub struct Sink {
    addr: SocketAddr,
    shared: Arc<Shared>,
    /// The accept loop; aborting it closes every connection.
    task: JoinHandle<()>,
}

impl Sink {
    /// Listens on `listen` (port 0 picks a free port) and serves until
    /// [`Sink::stop`]. Notifications must carry `tenant` in `Fiware-Service`.
    pub async fn start(listen: SocketAddr, tenant: &str) -> anyhow::Result<Sink> {
        let shared = Arc::new(Shared {
            tenant: tenant.to_string(),
            origin: OnceLock::new(),
            tally: Mutex::new(Tally::new()),
            requests: AtomicU64::new(0),
            connections: AtomicU64::new(0),
        });
        let serving = shared.clone();
        let (addr, task) = sink_runtime()
            .spawn(async move {
                let listener = TcpListener::bind(listen)
                    .await
                    .with_context(|| format!("the notification sink cannot listen on {listen}"))?;
                let addr = listener.local_addr()?;
                Ok::<_, anyhow::Error>((addr, tokio::spawn(serve(listener, serving))))
            })
            .await
            .map_err(|e| anyhow!("the notification sink task failed: {e}"))??;
        Ok(Sink { addr, shared, task })
    }

    /// The address the sink listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The URL to give the server when none was set: the listening address
    /// with path `/notify`, an unspecified address (`0.0.0.0`, `::`) made
    /// loopback, which a server on the same machine can reach.
    pub fn default_url(&self) -> String {
        notify_url(self.addr)
    }

    /// Sets when the load started, the origin of the send-time stamps;
    /// only the first call counts.
    pub fn set_origin(&self, start: Instant) {
        let _ = self.shared.origin.set(start);
    }

    /// Requests received so far (any kind).
    pub fn requests(&self) -> u64 {
        self.shared.requests.load(Ordering::Relaxed)
    }

    /// Connections the server opened to the sink so far.
    pub fn connections(&self) -> u64 {
        self.shared.connections.load(Ordering::Relaxed)
    }

    /// The tally so far; the sink waits while it is held, so keep it short.
    pub fn lock(&self) -> MutexGuard<'_, Tally> {
        self.shared.lock()
    }

    /// Takes the tally so far, leaving an empty one: what arrives later
    /// (after the checks were made) is not counted, but still answered.
    pub fn take(&self) -> Tally {
        std::mem::replace(&mut *self.shared.lock(), Tally::new())
    }

    /// Stops serving, closing every connection.
    pub fn stop(self) {
        self.task.abort();
    }
}

/// See [`Sink::default_url`].
fn notify_url(addr: SocketAddr) -> String {
    let host = match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => Ipv4Addr::LOCALHOST.to_string(),
        IpAddr::V4(ip) => ip.to_string(),
        IpAddr::V6(ip) if ip.is_unspecified() => format!("[{}]", Ipv6Addr::LOCALHOST),
        IpAddr::V6(ip) => format!("[{ip}]"),
    };
    format!("http://{host}:{}/notify", addr.port())
}

/// The accept loop: one hyper HTTP/1.1 connection task per connection,
/// owned by a `JoinSet` so aborting the loop ends them all.
async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(_) => {
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        while connections.try_join_next().is_some() {}
        // The 200s are tiny single writes: send them at once.
        let _ = stream.set_nodelay(true);
        shared.connections.fetch_add(1, Ordering::Relaxed);
        let shared = shared.clone();
        connections.spawn(async move {
            let service = service_fn(move |req| handle(shared.clone(), req));
            // A connection ends when the server closes it; nothing to report.
            let _ = http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// Answers one request with `200` and an empty body, after tallying it.
async fn handle(
    shared: Arc<Shared>,
    request: Request<Incoming>,
) -> Result<Response<String>, Infallible> {
    let arrived = Instant::now();
    shared.requests.fetch_add(1, Ordering::Relaxed);
    let (parts, body) = request.into_parts();
    let body = read_body(body).await;
    let header = |name: &str| parts.headers.get(name).map(|v| v.as_bytes());
    let headers = notification::check_headers(
        &Headers {
            content_type: header("content-type"),
            service: header("fiware-service"),
            service_path: header("fiware-servicepath"),
            correlator: header("fiware-correlator"),
        },
        &shared.tenant,
    );
    let at = shared
        .origin
        .get()
        .and_then(|origin| arrived.checked_duration_since(*origin));
    let not_post = (parts.method != Method::POST).then_some(&parts.method);
    shared
        .lock()
        .record(not_post, headers, body.as_deref().map_err(Clone::clone), at);
    Ok(Response::new(String::new()))
}

/// Reads a whole request body (at most [`MAX_BODY`] bytes); a body in one
/// frame, the usual case, is not copied.
async fn read_body(mut body: Incoming) -> Result<Bytes, String> {
    let mut first: Option<Bytes> = None;
    let mut joined: Vec<u8> = Vec::new();
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let frame = frame.map_err(|e| format!("reading the body: {e}"))?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        if first.as_ref().map_or(0, Bytes::len) + joined.len() + data.len() > MAX_BODY {
            return Err(format!("body larger than {MAX_BODY} bytes"));
        }
        match first.take() {
            None if joined.is_empty() => first = Some(data),
            None => joined.extend_from_slice(&data),
            Some(prev) => {
                joined.extend_from_slice(&prev);
                joined.extend_from_slice(&data);
            }
        }
    }
    Ok(match first {
        Some(data) => data,
        None => Bytes::from(joined),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::{render_request, Conn};

    const BODY: &str = r#"{"subscriptionId":"s1","data":[{"id":"Room1","type":"Room","a1":{"type":"Number","value":5001001,"metadata":{}}}]}"#;

    fn orion_headers(tenant: &str) -> Vec<(&'static str, String)> {
        vec![
            ("Fiware-Service", tenant.to_string()),
            ("Fiware-ServicePath", "/".to_string()),
            ("Fiware-Correlator", "c-1".to_string()),
        ]
    }

    #[test]
    fn default_urls_name_a_reachable_address() {
        let url = |a: &str| notify_url(a.parse().unwrap());
        assert_eq!(url("127.0.0.1:4000"), "http://127.0.0.1:4000/notify");
        assert_eq!(url("0.0.0.0:4000"), "http://127.0.0.1:4000/notify");
        assert_eq!(url("[::]:4000"), "http://[::1]:4000/notify");
        assert_eq!(url("[::1]:4000"), "http://[::1]:4000/notify");
        assert_eq!(url("10.1.2.3:80"), "http://10.1.2.3:80/notify");
    }

    #[test]
    fn tallies_notifications() {
        let mut t = Tally::new();
        let at = Some(Duration::from_micros(7_000));
        t.record(None, Ok(()), Ok(BODY.as_bytes()), at);
        t.record(None, Err("x".into()), Ok(BODY.as_bytes()), at);
        let other = BODY.replace("Room1", "Room2");
        t.record(None, Ok(()), Ok(other.as_bytes()), None);
        let initial = BODY.replace("5001001", "0");
        t.record(None, Ok(()), Ok(initial.as_bytes()), at);
        t.record(None, Ok(()), Ok(b"{}"), at);
        t.record(None, Ok(()), Err("broken".into()), at);
        t.record(Some(&Method::GET), Ok(()), Ok(b""), at);
        assert_eq!(t.requests, 7);
        assert_eq!(
            (t.stamped, t.unstamped, t.malformed, t.not_post),
            (3, 1, 2, 1)
        );
        assert_eq!((t.headers_ok, t.headers_bad), (5, 1));
        let s1 = &t.subscriptions["s1"];
        assert_eq!(s1.for_entity("Room1"), 2);
        assert_eq!(s1.for_entity("Room2"), 1);
        assert_eq!(s1.stamped(), 3);
        assert_eq!(s1.unstamped, 1);
        // Sent at 5000µs, arrived at 7000µs; one arrived before the origin.
        assert_eq!(t.delay.len(), 2);
        assert_eq!(t.delay.max(), 2000);
        assert_eq!(t.last_at, at);
        assert_eq!(t.examples.len(), 4);
    }

    /// The sink over real sockets: keep-alive, 200 with an empty body,
    /// and the notification tallied.
    #[tokio::test]
    async fn answers_and_counts_over_http() {
        let sink = Sink::start("127.0.0.1:0".parse().unwrap(), "benchabc")
            .await
            .unwrap();
        sink.set_origin(Instant::now());
        let addr = sink.addr().to_string();
        let mut conn = Conn::connect(&addr).await.unwrap();
        let headers = orion_headers("benchabc");
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        for _ in 0..3 {
            let request = render_request("POST", "/notify", &addr, &headers, Some(BODY.as_bytes()));
            let mut body = Vec::new();
            let head = conn.round_trip(&request, Some(&mut body)).await.unwrap();
            assert_eq!(head.status, 200);
            assert!(body.is_empty());
            assert!(conn.reusable());
        }
        assert_eq!(sink.requests(), 3);
        assert_eq!(sink.connections(), 1);
        let tally = sink.take();
        sink.stop();
        assert_eq!(tally.subscriptions["s1"].for_entity("Room1"), 3);
        assert_eq!(
            (tally.headers_ok, tally.headers_bad, tally.malformed),
            (3, 0, 0)
        );
        assert_eq!(tally.delay.len(), 3);
    }
}
