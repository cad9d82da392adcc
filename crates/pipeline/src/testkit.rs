//! Test-only: weft's services started in process, as the binary starts
//! them ([`Services::start`]), on a temporary SQLite store and the
//! in-process bus; a restart on the same data; a polling wait with a
//! deadline; and a small HTTP receiver for what the services send out
//! (notifications, webhooks).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use parking_lot::Mutex;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use weft_bus::{Bus, InProcessBus};
use weft_engine::{Engine, EngineConfig};
use weft_store::sqlite::{SqliteConfig, SqliteStore, Synchronous};
use weft_store::Store;

use crate::{Services, ServicesConfig};

/// How long [`eventually`] waits before failing a test: long, because a
/// debug build on a machine shared with other builds is slow.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// A SQLite store in `dir` (opened again on the same files after a
/// restart). Commits are not synced: a test needs no power-cut safety.
pub fn open_store(dir: &Path) -> Arc<dyn Store> {
    Arc::new(
        SqliteStore::open(SqliteConfig {
            path: dir.join("weft.db"),
            synchronous: Synchronous::Normal,
            ..SqliteConfig::default()
        })
        .expect("the test store opens"),
    )
}

/// The configuration tests start from: the defaults, with a node id kept
/// across restarts (as the binary keeps it in its data directory).
pub fn config() -> ServicesConfig {
    let mut config = ServicesConfig::default();
    config.cluster.node = Some("test-node".into());
    config
}

/// One weft node running in process on its own temporary data directory.
pub struct Node {
    /// Where the store's files are (kept until the node is dropped).
    dir: Arc<tempfile::TempDir>,
    /// The services, as the API holds them.
    pub services: Services,
    /// The store the services run on.
    pub store: Arc<dyn Store>,
    /// The bus the services publish on.
    pub bus: Arc<dyn Bus>,
    /// Stops the services' tasks (as [`Node::stop`] does first).
    pub shutdown: CancellationToken,
    config: ServicesConfig,
    tracker: TaskTracker,
}

impl Node {
    /// Starts the services with `config` on a new, empty data directory.
    pub async fn start(config: ServicesConfig) -> Node {
        let dir = Arc::new(tempfile::tempdir().expect("a temporary directory"));
        Node::start_in(dir, config).await
    }

    /// Starts the services with `config` on the data directory `dir`
    /// (one a stopped node left, see [`Node::stop`]).
    pub async fn start_in(dir: Arc<tempfile::TempDir>, config: ServicesConfig) -> Node {
        let store = open_store(dir.path());
        let bus: Arc<dyn Bus> = Arc::new(InProcessBus::default());
        let shutdown = CancellationToken::new();
        let tracker = TaskTracker::new();
        let services = Services::start(
            store.clone(),
            bus.clone(),
            Engine::start(EngineConfig::default()),
            config.clone(),
            shutdown.clone(),
            &tracker,
        )
        .await
        .expect("the services start");
        Node {
            dir,
            services,
            store,
            bus,
            config,
            shutdown,
            tracker,
        }
    }

    /// Stops the services as the binary does (shutdown, then waits for
    /// every task), then closes the store. Answers the data directory.
    pub async fn stop(self) -> Arc<tempfile::TempDir> {
        self.shutdown.cancel();
        self.tracker.close();
        tokio::time::timeout(DEADLINE, self.tracker.wait())
            .await
            .expect("the services stop");
        drop(self.services);
        self.store.close().await;
        self.dir
    }

    /// Stops the node and starts it again on the same data directory with
    /// the same configuration: a restart of the binary.
    pub async fn restart(self) -> Node {
        let config = self.config.clone();
        self.restart_with(config).await
    }

    /// [`Node::restart`] with another configuration.
    pub async fn restart_with(self, config: ServicesConfig) -> Node {
        let dir = self.stop().await;
        Node::start_in(dir, config).await
    }
}

/// A decoded sensae uplink (no codec runs) of `device_type`, its body
/// `body` (which names the device and the `uuid`).
pub fn decoded_uplink(device_type: &str, body: Value) -> weft_model::NewUplink {
    weft_model::NewUplink {
        partition: 0,
        received_at: weft_model::now_ms(),
        format: weft_model::UplinkFormat::SensaeDecoded,
        channel: Some("farm".into()),
        device_type: Some(device_type.into()),
        event: None,
        device_id: None,
        source: None,
        pins: Default::default(),
        body: serde_json::to_vec(&body).expect("JSON"),
    }
}

/// Accepts `uplink` as the HTTP surface does ([`crate::uplink::accept`],
/// no retries); fails the test if it is refused.
pub async fn accept(node: &Node, uplink: weft_model::NewUplink) {
    let arrival = crate::uplink::Arrival {
        uplinks: vec![uplink],
        parsed: None,
        route: None,
    };
    crate::uplink::accept(&node.services, arrival, &crate::uplink::Patience::Once)
        .await
        .expect("the uplink is accepted");
}

/// Creates device type `name` without a codec (for decoded uplinks).
pub async fn plain_type(node: &Node, name: &str) {
    let def = serde_json::from_value(serde_json::json!({})).expect("a device type");
    node.services
        .catalog
        .put_device_type(name, def)
        .await
        .expect("the type is stored");
}

/// Polls `check` every 20 ms until it answers `Some`, and answers that;
/// fails the test, saying `what` was waited for, after [`DEADLINE`].
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        if let Some(found) = check().await {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "gave up waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether `future` is still waiting after 300 ms (it is polled, not
/// dropped, so a test can let it go on afterwards): for a write that must
/// be held back.
pub async fn still_waiting<F: Future + Unpin>(future: &mut F) -> bool {
    tokio::time::timeout(Duration::from_millis(300), future)
        .await
        .is_err()
}

/// A local port nobody listens on (bound, then let go).
pub fn dead_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let port = listener.local_addr().expect("its address").port();
    drop(listener);
    format!("http://127.0.0.1:{port}")
}

/// One request the [`Receiver`] got.
#[derive(Debug, Clone)]
pub struct Received {
    /// The method.
    pub method: String,
    /// Path and query.
    pub path: String,
    /// Headers, names in lower case.
    pub headers: Vec<(String, String)>,
    /// The body as sent.
    pub body: Bytes,
}

impl Received {
    /// The body as JSON (the test fails if it is not).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "the body is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A local HTTP/1.1 server recording every request and answering each
/// with the next status queued by [`Receiver::answer`] (200 once the queue
/// is empty). Stops when dropped.
pub struct Receiver {
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    received: Arc<Mutex<Vec<Received>>>,
    statuses: Arc<Mutex<VecDeque<u16>>>,
    stop: CancellationToken,
}

impl Receiver {
    /// Starts listening on a free local port.
    pub async fn start() -> Receiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a free port");
        let addr: SocketAddr = listener.local_addr().expect("its address");
        let received: Arc<Mutex<Vec<Received>>> = Arc::default();
        let statuses: Arc<Mutex<VecDeque<u16>>> = Arc::default();
        let stop = CancellationToken::new();
        {
            let received = received.clone();
            let statuses = statuses.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                loop {
                    let stream = tokio::select! {
                        _ = stop.cancelled() => return,
                        accepted = listener.accept() => match accepted {
                            Ok((stream, _)) => stream,
                            Err(_) => continue,
                        },
                    };
                    let received = received.clone();
                    let statuses = statuses.clone();
                    let service = service_fn(move |req: hyper::Request<Incoming>| {
                        let received = received.clone();
                        let statuses = statuses.clone();
                        async move {
                            let method = req.method().to_string();
                            let path = req
                                .uri()
                                .path_and_query()
                                .map_or_else(String::new, |p| p.to_string());
                            let headers = req
                                .headers()
                                .iter()
                                .map(|(n, v)| {
                                    (
                                        n.as_str().to_string(),
                                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                                    )
                                })
                                .collect();
                            let body = req
                                .into_body()
                                .collect()
                                .await
                                .map(|b| b.to_bytes())
                                .unwrap_or_default();
                            // The status is taken when the request is
                            // recorded, so the n-th request gets the n-th.
                            let status = {
                                let mut received = received.lock();
                                received.push(Received {
                                    method,
                                    path,
                                    headers,
                                    body,
                                });
                                statuses.lock().pop_front().unwrap_or(200)
                            };
                            let answer = hyper::Response::builder()
                                .status(status)
                                .body(Full::new(Bytes::new()))
                                .expect("a valid answer");
                            Ok::<_, Infallible>(answer)
                        }
                    });
                    tokio::spawn(async move {
                        let io = hyper_util::rt::TokioIo::new(stream);
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(io, service)
                            .await;
                    });
                }
            });
        }
        Receiver {
            url: format!("http://{addr}"),
            received,
            statuses,
            stop,
        }
    }

    /// Queues the status of the next request not yet answered.
    pub fn answer(&self, status: u16) {
        self.statuses.lock().push_back(status);
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<Received> {
        self.received.lock().clone()
    }

    /// The requests so far whose path starts with `prefix`.
    pub fn requests_to(&self, prefix: &str) -> Vec<Received> {
        self.received
            .lock()
            .iter()
            .filter(|r| r.path.starts_with(prefix))
            .cloned()
            .collect()
    }

    /// Waits until at least `n` requests to paths starting with `prefix`
    /// arrived, and answers them all.
    pub async fn wait_for(&self, prefix: &str, n: usize) -> Vec<Received> {
        eventually(&format!("{n} request(s) to {prefix}"), || async {
            let got = self.requests_to(prefix);
            (got.len() >= n).then_some(got)
        })
        .await
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
