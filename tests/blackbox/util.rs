//! The harness: starts the real `weft` binary on port 0 with its own temp
//! data directory, and offers a client whose calls state the status they
//! expect, a websocket subscriber, and polling against a deadline instead
//! of fixed sleeps.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// The ingest key every test server is started with.
pub const KEY: &str = "test-ingest-key";

/// The admin API key every test server is started with (`WEFT_ADMIN_KEY`);
/// [`Server::client`] sends it in `X-Auth-Token` on every request.
pub const ADMIN_KEY: &str = "weft_blackbox-admin-key-0123456789abcdef";

/// The em300th decoder shipped in examples/.
pub const EM300TH_JS: &str = include_str!("../../examples/codecs/em300th.js");

/// A running weft process. Killed when dropped.
pub struct Server {
    child: Child,
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    data: PathBuf,
    _dir: Option<tempfile::TempDir>,
    env: Vec<(String, String)>,
}

impl Server {
    /// Starts weft in a fresh temp data dir.
    pub fn start() -> Server {
        Self::start_with_env(&[])
    }

    /// Starts weft with extra `WEFT_*` environment variables. With
    /// `WEFT_TEST_BACKEND=postgres` (and the test PostgreSQL's URL in
    /// `WEFT_TEST_POSTGRES_URL`), every server gets a fresh database there.
    pub fn start_with_env(env: &[(&str, &str)]) -> Server {
        let dir = tempfile::tempdir().expect("temp dir");
        let data = dir.path().to_path_buf();
        let mut env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        if std::env::var("WEFT_TEST_BACKEND").as_deref() == Ok("postgres")
            && !env.iter().any(|(k, _)| k == "WEFT_STORE__BACKEND")
        {
            env.push(("WEFT_STORE__BACKEND".into(), "postgres".into()));
            env.push(("WEFT_STORE__URL".into(), fresh_postgres_database()));
        }
        let (child, url) = spawn(&data, &env);
        Server {
            child,
            url,
            data,
            _dir: Some(dir),
            env,
        }
    }

    /// Starts weft with QuantumLeap's own listener on a free port too
    /// (`history.quantumleap_listen`) and extra `env`; the server and
    /// the listener's base URL, once it takes connections.
    pub async fn start_with_quantumleap_listener(env: &[(&str, &str)]) -> (Server, String) {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
            l.local_addr().expect("its address").port()
        };
        let addr = format!("127.0.0.1:{port}");
        let mut env = env.to_vec();
        env.push(("WEFT_HISTORY__QUANTUMLEAP_LISTEN", &addr));
        let server = Server::start_with_env(&env);
        // The second listener opens right after the first.
        eventually(Duration::from_secs(5), || async {
            tokio::net::TcpStream::connect(&addr).await.ok().map(|_| ())
        })
        .await;
        (server, format!("http://{addr}"))
    }

    /// SIGKILLs the process (no graceful shutdown, like a crash).
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM and waits (15 s at most) for the process to exit;
    /// returns whether it exited successfully.
    pub fn terminate(&mut self) -> bool {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill runs");
        assert!(sent.success(), "SIGTERM delivered");
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(status) = self.child.try_wait().expect("child status") {
                return status.success();
            }
            assert!(
                Instant::now() < deadline,
                "weft did not exit within 15 s of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts weft again on the same data directory.
    pub fn restart(&mut self) {
        self.kill9();
        let (child, url) = spawn(&self.data, &self.env);
        self.child = child;
        self.url = url;
    }

    /// Starts weft again on the same data directory with `env` instead of
    /// the environment it was started with (the store's settings kept).
    pub fn restart_with_env(&mut self, env: &[(String, String)]) {
        self.kill9();
        self.env.retain(|(k, _)| k.starts_with("WEFT_STORE__"));
        self.env.extend(env.iter().cloned());
        let (child, url) = spawn(&self.data, &self.env);
        self.child = child;
        self.url = url;
    }

    /// The data directory this server runs on.
    pub fn data_dir(&self) -> &Path {
        &self.data
    }

    /// A client for this server, sending the admin key.
    pub fn client(&self) -> Client {
        self.client_with(Some(ADMIN_KEY))
    }

    /// A client sending `key` in `X-Auth-Token` on every request (none:
    /// no key at all).
    pub fn client_with(&self, key: Option<&str>) -> Client {
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(key) = key {
            headers.insert("X-Auth-Token", key.parse().expect("a header value"));
        }
        Client {
            http: reqwest::Client::builder()
                .default_headers(headers)
                .build()
                .expect("a client"),
            url: self.url.clone(),
        }
    }

    /// `ws://…/api/v1/live?access_token=<admin key>`.
    pub fn live_url(&self) -> String {
        format!(
            "{}/api/v1/live?access_token={ADMIN_KEY}",
            self.url.replacen("http", "ws", 1)
        )
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A new, empty database on the test PostgreSQL server; its URL.
pub fn fresh_postgres_database() -> String {
    let admin = std::env::var("WEFT_TEST_POSTGRES_URL")
        .expect("WEFT_TEST_BACKEND=postgres needs WEFT_TEST_POSTGRES_URL (scripts/test sets both)");
    let name = format!("weft_bb_{}", uuid::Uuid::new_v4().simple());
    let create = format!("CREATE DATABASE {name}");
    let url = admin.clone();
    // On a thread of its own: callers may be inside a tokio runtime.
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .expect("the test PostgreSQL answers");
            tokio::spawn(connection);
            client
                .batch_execute(&create)
                .await
                .expect("create database");
        });
    })
    .join()
    .expect("creating the database");
    let base = admin.split('?').next().unwrap_or(&admin);
    let (server, _) = base.rsplit_once('/').expect("the URL names a database");
    format!("{server}/{name}")
}

fn spawn(data: &Path, env: &[(String, String)]) -> (Child, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_weft"));
    cmd.args(["serve", "--listen", "127.0.0.1:0"]);
    // A test setting `WEFT_INGEST_KEY` itself (`""`: none) decides the
    // global ingest key; every other server has [`KEY`].
    if !env.iter().any(|(k, _)| k == "WEFT_INGEST_KEY") {
        cmd.args(["--ingest-key", KEY]);
    }
    cmd.arg("--data")
        .arg(data)
        .env("WEFT_LOG", "warn")
        .env("WEFT_ADMIN_KEY", ADMIN_KEY)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("weft starts");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    let line = lines
        .next()
        .expect("weft prints its address")
        .expect("readable stdout");
    let url = line
        .strip_prefix("weft listening on ")
        .expect("address line")
        .trim()
        .to_string();
    // Keep draining stdout so the child never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    (child, url)
}

/// An HTTP client bound to one server.
#[derive(Clone)]
pub struct Client {
    /// The underlying client.
    pub http: reqwest::Client,
    /// Base URL.
    pub url: String,
}

/// Status and parsed body (`Value::Null` if the body is empty or not JSON).
pub type Reply = (u16, Value);

impl Client {
    /// The server's `/metrics` text (Prometheus exposition), or `None`
    /// when it does not answer; for polling with `eventually`.
    pub async fn metrics(&self) -> Option<String> {
        self.http
            .get(format!("{}/metrics", self.url))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()
    }

    /// Sends a request and returns status and JSON body.
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        auth: Option<&str>,
    ) -> Reply {
        let mut req = self
            .http
            .request(method.parse().unwrap(), format!("{}{}", self.url, path));
        if let Some(body) = body {
            req = req.json(body);
        }
        if let Some(auth) = auth {
            req = req.header("Authorization", auth);
        }
        reply(req).await
    }

    /// Posts a raw (possibly malformed) body.
    pub async fn send_raw(&self, path: &str, body: &'static str, auth: Option<&str>) -> Reply {
        let mut req = self.http.post(format!("{}{}", self.url, path)).body(body);
        if let Some(auth) = auth {
            req = req.header("Authorization", auth);
        }
        reply(req).await
    }

    /// The stored unit `data_id`, waiting (10 s at most) for the pipeline
    /// to store it.
    pub async fn unit_eventually(&self, data_id: &str) -> Value {
        let path = format!("/api/v1/data/{data_id}");
        eventually(Duration::from_secs(10), || async {
            let (status, unit) = self.send("GET", &path, None, None).await;
            (status == 200).then_some(unit)
        })
        .await
    }

    /// Sends and asserts the status; returns the body.
    pub async fn expect(
        &self,
        status: u16,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Value {
        let (got, reply) = self.send(method, path, body, Some(KEY)).await;
        assert_eq!(
            got, status,
            "{method} {path}: expected {status}, got {got}: {reply}"
        );
        reply
    }

    /// Posts an uplink on sensae's path with the right key; asserts 202.
    pub async fn uplink(&self, channel: &str, info: &str, device_type: &str, body: &Value) {
        let path = format!("/sensor-data/{channel}/{info}/{device_type}");
        self.expect(202, "POST", &path, Some(body)).await;
    }

    /// Creates the em300th type: the shipped decoder and the seed's mappings.
    pub async fn create_em300th(&self) {
        self.expect(
            201,
            "PUT",
            "/api/v1/device-types/em300th",
            Some(&em300th_type()),
        )
        .await;
    }

    /// Every stored unit matching `query` (e.g. `channel=x`), following cursors.
    pub async fn all_units(&self, query: &str) -> Vec<Value> {
        let mut out = Vec::new();
        let mut after = String::new();
        loop {
            let path = format!("/api/v1/data?{query}&limit=1000&after={after}");
            let page = self.expect(200, "GET", &path, None).await;
            out.extend(page["units"].as_array().unwrap().iter().cloned());
            match page["next"].as_str() {
                Some(next) => after = next.to_string(),
                None => return out,
            }
        }
    }
}

/// Sends `req`; status and JSON body (`Null` when empty or not JSON).
async fn reply(req: reqwest::RequestBuilder) -> Reply {
    let resp = req.send().await.expect("request sent");
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// The em300th device type with the seed's processor mappings.
pub fn em300th_type() -> Value {
    serde_json::from_str(EM300TH_TYPE_FILE).expect("the example type file is JSON")
}

/// sensae's load-test body for the decoded path.
pub fn decoded_body(
    uuid: &str,
    device: &str,
    temperature: i64,
    humidity: i64,
    reported_at: i64,
) -> Value {
    json!({"downlink_url": "https://console.example/api/v1/down/abc/def/0e1c",
           "temperature": temperature, "humidity": humidity, "id": device, "name": "P00010",
           "reported_at": reported_at, "uuid": uuid})
}

/// A Helium-style encoded body carrying `payload` (base64) on port 85.
pub fn encoded_body(uuid: &str, device: &str, payload: &[u8], reported_at: i64) -> Value {
    use base64::Engine as _;
    json!({"id": device, "name": "P00011", "reported_at": reported_at, "uuid": uuid, "port": 85,
           "payload": base64::engine::general_purpose::STANDARD.encode(payload)})
}

/// Polls `check` until it returns `Some` or `timeout` passes.
pub async fn eventually<T, F, Fut>(timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "condition not met within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A websocket client of `/api/v1/live`.
pub struct Live {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
}

impl Live {
    /// Connects to the server's live endpoint.
    pub async fn connect(server: &Server) -> Live {
        let (ws, _) = tokio_tungstenite::connect_async(server.live_url())
            .await
            .expect("websocket connects");
        Live { ws }
    }

    /// Sends a subscribe message and waits for its acknowledgement.
    pub async fn subscribe(&mut self, id: &str, stream: &str, filter: Value) {
        self.send(json!({"type":"subscribe","id":id,"stream":stream,"filter":filter}))
            .await;
        let reply = self.next().await;
        assert_eq!(
            reply,
            json!({"type":"subscribed","id":id}),
            "subscribe acknowledged"
        );
    }

    /// Sends a JSON message.
    pub async fn send(&mut self, msg: Value) {
        self.ws
            .send(Message::Text(msg.to_string().into()))
            .await
            .expect("ws send");
    }

    /// The next JSON message (10 s at most).
    pub async fn next(&mut self) -> Value {
        self.next_within(Duration::from_secs(10))
            .await
            .expect("a live message within 10 s")
    }

    /// The next JSON message, or `None` if none arrives within `timeout`.
    pub async fn next_within(&mut self, timeout: Duration) -> Option<Value> {
        loop {
            let msg = tokio::time::timeout(timeout, self.ws.next())
                .await
                .ok()??
                .ok()?;
            if let Message::Text(t) = msg {
                return Some(serde_json::from_str(&t).expect("live messages are JSON"));
            }
        }
    }
}

/// Epoch ms now.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// The README's example device type file, which must stay in step with the
/// codec and mappings the tests use.
pub const EM300TH_TYPE_FILE: &str = include_str!("../../examples/device-types/em300th.json");

/// One call with extra headers (`Fiware-Service`, `Fiware-ServicePath`, …):
/// status, response headers and JSON body (`Null` when empty or not JSON).
pub async fn call(
    c: &Client,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&Value>,
) -> (u16, reqwest::header::HeaderMap, Value) {
    call_as(
        c,
        method,
        path,
        headers,
        body.map(|b| ("application/json", b)),
    )
    .await
}

/// [`call`] with the body sent as the media type given (`application/ld+json`, …).
pub async fn call_as(
    c: &Client,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<(&str, &Value)>,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let mut req = c
        .http
        .request(method.parse().unwrap(), format!("{}{}", c.url, path));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if let Some((content_type, b)) = body {
        req = req.header("content-type", content_type).body(b.to_string());
    }
    let resp = req.send().await.expect("request sent");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let text = resp.text().await.unwrap_or_default();
    (
        status,
        headers,
        serde_json::from_str(&text).unwrap_or(Value::Null),
    )
}

/// A request as a [`Receiver`] saw it.
pub struct Seen {
    /// `POST`, `PUT`, …
    pub method: String,
    /// Path and query string, as sent.
    pub target: String,
    /// Its headers.
    pub headers: axum::http::HeaderMap,
    /// Its body, as text.
    pub body: String,
}

impl Seen {
    /// The body as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).expect("a JSON body")
    }

    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }
}

/// A local HTTP endpoint on an ephemeral port that records every request,
/// whatever its method and path, and answers what it is told to
/// ([`Receiver::answer`]; 200 with an empty body at first): the stand-in
/// for notification receivers, network servers and devices.
pub struct Receiver {
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    rx: tokio::sync::mpsc::UnboundedReceiver<Seen>,
    answer: std::sync::Arc<std::sync::Mutex<(u16, String)>>,
}

impl Receiver {
    /// Starts the endpoint.
    pub async fn start() -> Receiver {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let answer = std::sync::Arc::new(std::sync::Mutex::new((200u16, String::new())));
        let given = answer.clone();
        let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
            let tx = tx.clone();
            let given = given.clone();
            async move {
                let (parts, body) = req.into_parts();
                let body = axum::body::to_bytes(body, 1 << 20).await.unwrap();
                let _ = tx.send(Seen {
                    method: parts.method.to_string(),
                    target: parts.uri.to_string(),
                    headers: parts.headers,
                    body: String::from_utf8_lossy(&body).into_owned(),
                });
                let (status, body) = given.lock().unwrap().clone();
                (
                    axum::http::StatusCode::from_u16(status).unwrap(),
                    [("content-type", "application/json")],
                    body,
                )
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Receiver { base, rx, answer }
    }

    /// Answers every later request with `status` and `body`.
    pub fn answer(&self, status: u16, body: &str) {
        *self.answer.lock().unwrap() = (status, body.to_string());
    }

    /// The next request, or None within `timeout`.
    pub async fn next_within(&mut self, timeout: Duration) -> Option<Seen> {
        tokio::time::timeout(timeout, self.rx.recv())
            .await
            .ok()
            .flatten()
    }

    /// The next request (10 s at most).
    pub async fn next(&mut self) -> Seen {
        self.next_within(Duration::from_secs(10))
            .await
            .expect("a request within 10 s")
    }

    /// Fails if anything else arrives soon.
    pub async fn nothing_more(&mut self) {
        if let Some(s) = self.next_within(Duration::from_millis(400)).await {
            panic!("unexpected request: {} {}", s.method, s.body);
        }
    }
}
