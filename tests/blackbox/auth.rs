//! API keys on every surface: 401 without a working key, 403 for a role
//! too low or a tenant or service path outside the key's, 429 past a
//! key's rate limit, keys made and revoked through `/api/v1/keys`, ingest
//! keys pinned to a channel, the first start's admin key, and `auth=off`.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use crate::util::{eventually, now_ms, Client, Server, ADMIN_KEY, KEY};

/// Makes a key through the API with the admin client; its secret.
async fn make_key(admin: &Client, spec: Value) -> String {
    let made = admin.expect(201, "POST", "/api/v1/keys", Some(&spec)).await;
    let secret = made["key"].as_str().expect("the secret, once").to_string();
    assert!(secret.starts_with("weft_"), "{made}");
    secret
}

/// Sends `method path` with `headers`; status and JSON body.
async fn call(c: &Client, method: &str, path: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut req = c
        .http
        .request(method.parse().unwrap(), format!("{}{path}", c.url));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if !matches!(method, "GET" | "HEAD" | "DELETE") {
        req = req
            .header("Content-Type", "application/json")
            .body(call_body(path));
    }
    let resp = req.send().await.expect("request sent");
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// A plausible body for a write to `path` (it only needs to get past
/// authentication; what the surface makes of it does not matter).
fn call_body(path: &str) -> String {
    if path.starts_with("/v2/op/update") {
        json!({"actionType":"append","entities":[{"id":"x","type":"T"}]}).to_string()
    } else if path.starts_with("/v2/entities") && !path.contains("/attrs") {
        json!({"id":"probe","type":"T","n":{"value":1}}).to_string()
    } else {
        "{}".to_string()
    }
}

/// Every (method, path) of weft's OpenAPI document that needs a key,
/// with path parameters filled in.
async fn openapi_routes(admin: &Client) -> Vec<(String, String)> {
    let doc = admin.expect(200, "GET", "/api/v1/openapi.json", None).await;
    let mut routes = Vec::new();
    for (path, ops) in doc["paths"].as_object().expect("paths") {
        for (method, op) in ops.as_object().expect("operations") {
            let open = op["security"].as_array().is_some_and(|s| s.is_empty());
            if open {
                continue;
            }
            let filled = path
                .split('/')
                .map(|seg| if seg.starts_with('{') { "x1" } else { seg })
                .collect::<Vec<_>>()
                .join("/");
            let filled = if filled == "/api/v1/live/sse" {
                "/api/v1/live/sse?stream=data".to_string()
            } else {
                filled
            };
            routes.push((method.to_ascii_uppercase(), filled));
        }
    }
    assert!(
        routes.len() > 30,
        "the document lists weft's routes: {routes:?}"
    );
    routes
}

/// The compatible surfaces' routes (method, path), reads first.
const COMPATIBLE: &[(&str, &str)] = &[
    ("GET", "/version"),
    ("GET", "/v2"),
    ("GET", "/v2/entities"),
    ("GET", "/v2/entities/x1"),
    ("GET", "/v2/entities/x1/attrs"),
    ("GET", "/v2/types"),
    ("GET", "/v2/subscriptions"),
    ("GET", "/v2/registrations"),
    ("POST", "/v2/op/query"),
    ("GET", "/ql/v2/entities"),
    ("GET", "/ql/v2/entities/x1"),
    ("GET", "/ql/v2/attrs"),
    ("GET", "/ql/v2/types/T"),
    ("GET", "/channel/c1/subscription/polling/s1"),
    ("GET", "/pages/x1"),
    ("GET", "/metrics"),
    ("POST", "/v2/entities"),
    ("PATCH", "/v2/entities/x1/attrs"),
    ("DELETE", "/v2/entities/x1"),
    ("POST", "/v2/op/update"),
    ("POST", "/v2/subscriptions"),
    ("POST", "/v2/registrations"),
    ("POST", "/v2/notify"),
    ("DELETE", "/ql/v2/entities/x1"),
    ("PUT", "/channel/c1/message/m1"),
    ("PUT", "/channel/c1/subscription/polling/s1"),
    (
        "DELETE",
        "/channel/c1/subscription/polling/s1/message?ackHandle=1",
    ),
    ("PUT", "/admin/jwt/revoke?jti=a&exp=1"),
];

/// Whether a request only reads.
fn is_read(method: &str, path: &str) -> bool {
    matches!(method, "GET" | "HEAD") || path.ends_with("/op/query")
}

/// The live websocket's handshake status with `query` (e.g.
/// `?access_token=…`), 101 when it upgrades.
async fn ws_status(server: &Server, query: &str) -> u16 {
    let url = format!(
        "{}/api/v1/live{query}",
        server.url.replacen("http", "ws", 1)
    );
    match tokio_tungstenite::connect_async(url).await {
        Ok(_) => 101,
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => resp.status().as_u16(),
        Err(e) => panic!("websocket: {e}"),
    }
}

/// Without a key, with a revoked one and with an expired one, every
/// route of the OpenAPI document and of every compatible surface answers
/// 401 in the `{"error","description"}` shape; so does the live stream.
#[tokio::test]
async fn every_surface_wants_a_working_key() {
    let server = Server::start();
    let admin = server.client();
    let revoked = make_key(&admin, json!({"name":"gone","role":"admin"})).await;
    let listed = admin.expect(200, "GET", "/api/v1/keys", None).await;
    let id = listed["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["name"] == "gone")
        .expect("listed")["id"]
        .as_str()
        .unwrap()
        .to_string();
    admin
        .expect(204, "DELETE", &format!("/api/v1/keys/{id}"), None)
        .await;
    let expiring = make_key(
        &admin,
        json!({"name":"brief","role":"admin","expiresAt": now_ms() + 1500}),
    )
    .await;
    let brief = server.client_with(Some(&expiring));
    eventually(Duration::from_secs(10), || async {
        (brief.send("GET", "/api/v1/devices", None, None).await.0 == 401).then_some(())
    })
    .await;

    let mut routes = openapi_routes(&admin).await;
    routes.extend(
        COMPATIBLE
            .iter()
            .map(|(m, p)| (m.to_string(), p.to_string())),
    );
    for (label, client) in [
        ("no key", server.client_with(None)),
        ("revoked key", server.client_with(Some(&revoked))),
        ("expired key", brief.clone()),
        ("unknown key", server.client_with(Some("weft_nobody"))),
    ] {
        for (method, path) in &routes {
            let (status, body) = call(&client, method, path, &[]).await;
            assert_eq!(status, 401, "{label}: {method} {path}: {body}");
            assert_eq!(body["error"], "Unauthorized", "{label}: {method} {path}");
            assert!(body["description"].is_string(), "{label}: {method} {path}");
        }
    }
    // Bearer works as X-Auth-Token does; a raw Authorization is no key.
    let plain = server.client_with(None);
    let bearer = format!("Bearer {ADMIN_KEY}");
    assert_eq!(
        call(&plain, "GET", "/v2/entities", &[("Authorization", &bearer)])
            .await
            .0,
        200
    );
    assert_eq!(
        call(
            &plain,
            "GET",
            "/v2/entities",
            &[("Authorization", ADMIN_KEY)]
        )
        .await
        .0,
        401
    );
    // The live stream: the websocket handshake and SSE.
    assert_eq!(ws_status(&server, "").await, 401);
    assert_eq!(
        ws_status(&server, &format!("?access_token={revoked}")).await,
        401
    );
    assert_eq!(
        ws_status(&server, &format!("?access_token={ADMIN_KEY}")).await,
        101
    );
    let sse = format!("/api/v1/live/sse?stream=data&access_token={revoked}");
    assert_eq!(call(&plain, "GET", &sse, &[]).await.0, 401);
    // /health and ingest keep their own rules.
    assert_eq!(plain.send("GET", "/health", None, None).await.0, 200);
    let uplink = json!({"id":"d1","reported_at": now_ms(),"uuid":"u1","temperature":1});
    assert_eq!(
        plain
            .send(
                "POST",
                "/sensor-data/north/decoded/em300th",
                Some(&uplink),
                Some(KEY)
            )
            .await
            .0,
        202
    );
}

/// A read key reads everything (200, or 404/400 for what is not there)
/// and is refused every write with 403; a write key writes data but not
/// definitions; the live stream is a read.
#[tokio::test]
async fn roles_read_write_admin() {
    let server = Server::start();
    let admin = server.client();
    let read_key = make_key(&admin, json!({"name":"dash","role":"read"})).await;
    let read = server.client_with(Some(&read_key));
    let write = server.client_with(Some(
        &make_key(&admin, json!({"name":"app","role":"write"})).await,
    ));
    let mut routes = openapi_routes(&admin).await;
    routes.extend(
        COMPATIBLE
            .iter()
            .map(|(m, p)| (m.to_string(), p.to_string())),
    );
    for (method, path) in &routes {
        if path == "/api/v1/live" {
            continue; // a websocket, below
        }
        let (status, body) = if path.starts_with("/api/v1/live/sse") {
            let resp = read
                .http
                .get(format!("{}{path}", read.url))
                .send()
                .await
                .unwrap();
            (resp.status().as_u16(), Value::Null)
        } else {
            call(&read, method, path, &[]).await
        };
        if is_read(method, path) {
            // The keys API and the channel listing (it names every
            // subscriber) are the admin's.
            let admin_only =
                path.starts_with("/api/v1/keys") || path.starts_with("/api/v1/channels");
            if admin_only {
                assert_eq!(status, 403, "{method} {path} needs admin: {body}");
            } else {
                assert!(
                    ![401, 403, 429].contains(&status) && status < 500,
                    "read key: {method} {path}: {status} {body}"
                );
            }
        } else {
            assert_eq!(status, 403, "read key: {method} {path}: {body}");
            assert_eq!(body["error"], "Forbidden", "{method} {path}");
        }
    }
    assert_eq!(
        ws_status(&server, &format!("?access_token={read_key}")).await,
        101
    );

    // write: data yes, definitions no.
    let entity = json!({"id":"w1","type":"T","n":{"value":1}});
    write
        .expect(201, "POST", "/v2/entities", Some(&entity))
        .await;
    read.expect(200, "GET", "/v2/entities/w1", None).await;
    read.expect(403, "DELETE", "/v2/entities/w1", None).await;
    write
        .expect(403, "PUT", "/api/v1/devices/d1", Some(&json!({"type":"t"})))
        .await;
    write
        .expect(403, "PUT", "/api/v1/rules/r1", Some(&json!({})))
        .await;
    write.expect(403, "GET", "/api/v1/keys", None).await;
    let created = write
        .send("PUT", "/channel/c1/message/m1", Some(&json!({"a":1})), None)
        .await;
    assert_eq!(created.0, 200, "{created:?}");
    let device = json!({"type":"em300th","channel":"north"});
    let (status, body) = admin
        .send("PUT", "/api/v1/devices/d1", Some(&device), None)
        .await;
    assert_eq!(status, 201, "admin defines devices: {body}");
}

/// A key of tenant `beta` sees nothing of tenant `alpha` nor of the
/// default tenant: naming `alpha` is refused (403), not naming a tenant
/// acts as `beta`, and weft's own API (the default tenant's) is closed
/// to it. A service-path key is held below its path.
#[tokio::test]
async fn another_tenants_key_sees_nothing_of_this_tenant() {
    let server = Server::start();
    let admin = server.client();
    let alpha = [
        ("Fiware-Service", "alpha"),
        ("Fiware-ServicePath", "/parks"),
    ];
    let e1 = json!({"id":"a1","type":"Bench","n":{"value":1}});
    let resp = admin
        .http
        .post(format!("{}/v2/entities", admin.url))
        .headers(headers(&alpha))
        .json(&e1)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    admin
        .expect(
            201,
            "POST",
            "/v2/entities",
            Some(&json!({"id":"d1","type":"T"})),
        )
        .await;
    let beta_key = make_key(&admin, json!({"name":"b","role":"write","tenant":"beta"})).await;
    let beta = server.client_with(Some(&beta_key));
    for (method, path) in [
        ("GET", "/v2/entities"),
        ("GET", "/v2/entities/a1"),
        ("GET", "/v2/types"),
        ("GET", "/v2/subscriptions"),
        ("POST", "/v2/op/query"),
        ("GET", "/ql/v2/entities"),
        ("POST", "/v2/entities"),
    ] {
        let (status, body) = call(&beta, method, path, &[("Fiware-Service", "alpha")]).await;
        assert_eq!(status, 403, "{method} {path}: {body}");
    }
    let (status, list) = call(&beta, "GET", "/v2/entities", &[]).await;
    assert_eq!((status, list), (200, json!([])), "acts as beta: empty");
    assert_eq!(call(&beta, "GET", "/v2/entities/a1", &[]).await.0, 404);
    assert_eq!(call(&beta, "GET", "/v2/entities/d1", &[]).await.0, 404);
    for path in [
        "/api/v1/devices",
        "/api/v1/data",
        "/api/v1/alarms",
        "/metrics",
    ] {
        assert_eq!(call(&beta, "GET", path, &[]).await.0, 403, "{path}");
    }
    // Its writes land in beta.
    beta.expect(
        201,
        "POST",
        "/v2/entities",
        Some(&json!({"id":"b1","type":"T"})),
    )
    .await;
    let (_, seen) = call(&admin, "GET", "/v2/entities", &[("Fiware-Service", "beta")]).await;
    assert_eq!(seen[0]["id"], "b1");
    // The live entities stream: alpha refused, data refused.
    let url = format!(
        "{}/api/v1/live?access_token={beta_key}",
        server.url.replacen("http", "ws", 1)
    );
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    for (stream, filter) in [
        ("entities", json!({"service":"alpha"})),
        ("data", json!({})),
    ] {
        let msg = json!({"type":"subscribe","id":"s","stream":stream,"filter":filter});
        ws.send(Message::Text(msg.to_string().into()))
            .await
            .unwrap();
        let reply = loop {
            if let Some(Ok(Message::Text(t))) = ws.next().await {
                break serde_json::from_str::<Value>(&t).unwrap();
            }
        };
        assert_eq!(reply["error"], "Forbidden", "{stream}: {reply}");
    }
    let sse = "/api/v1/live/sse?stream=entities&service=alpha";
    assert_eq!(call(&beta, "GET", sse, &[]).await.0, 403);

    // A key of alpha limited to /parks: its own entity, nothing above.
    let parks = server.client_with(Some(
        &make_key(
            &admin,
            json!({"name":"p","role":"read","tenant":"alpha","servicePath":"/parks"}),
        )
        .await,
    ));
    let (status, list) = call(&parks, "GET", "/v2/entities", &[]).await;
    assert_eq!(status, 200);
    assert_eq!(list[0]["id"], "a1");
    let root = [("Fiware-ServicePath", "/")];
    assert_eq!(call(&parks, "GET", "/v2/entities", &root).await.0, 403);
    let all = [("Fiware-ServicePath", "/#")];
    assert_eq!(call(&parks, "GET", "/v2/entities", &all).await.0, 403);
    let below = [("Fiware-ServicePath", "/parks/#")];
    assert_eq!(call(&parks, "GET", "/v2/entities", &below).await.0, 200);
    // A tenant admin makes keys only in its tenant, and sees only those.
    let alpha_admin = server.client_with(Some(
        &make_key(&admin, json!({"name":"aa","role":"admin","tenant":"alpha"})).await,
    ));
    alpha_admin
        .expect(
            403,
            "POST",
            "/api/v1/keys",
            Some(&json!({"name":"x","role":"read","tenant":"beta"})),
        )
        .await;
    let mine = alpha_admin.expect(200, "GET", "/api/v1/keys", None).await;
    let tenants: Vec<&str> = mine["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["tenant"].as_str().unwrap())
        .collect();
    assert!(
        !tenants.is_empty() && tenants.iter().all(|t| *t == "alpha"),
        "{mine}"
    );
}

fn headers(pairs: &[(&str, &str)]) -> reqwest::header::HeaderMap {
    let mut h = reqwest::header::HeaderMap::new();
    for (k, v) in pairs {
        h.insert(
            reqwest::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    h
}

/// A key past its rate limit gets 429 with `Retry-After`; other keys do
/// not notice.
#[tokio::test]
async fn rate_limits_answer_429_with_retry_after() {
    let server = Server::start();
    let admin = server.client();
    let slow = make_key(
        &admin,
        json!({"name":"slow","role":"read","rateLimit":{"rate":0.001,"burst":2}}),
    )
    .await;
    let c = server.client_with(Some(&slow));
    c.expect(200, "GET", "/v2/entities", None).await;
    c.expect(200, "GET", "/api/v1/devices", None).await;
    let resp = c
        .http
        .get(format!("{}/v2/entities", c.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 429);
    let retry: u64 = resp.headers()["Retry-After"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry >= 1);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"], "TooManyRequests");
    admin.expect(200, "GET", "/v2/entities", None).await;
}

/// Keys are listed and shown without their secret or hash; a revoked
/// one stops working at once and is listed with `revokedAt`; bad
/// requests change nothing.
#[tokio::test]
async fn keys_api_shows_no_secrets_and_revokes_at_once() {
    let server = Server::start();
    let admin = server.client();
    let secret = make_key(&admin, json!({"name":"k","role":"read"})).await;
    let list = admin.expect(200, "GET", "/api/v1/keys", None).await;
    let text = list.to_string();
    assert!(!text.contains(&secret) && !text.contains("hash"), "{text}");
    let key = list["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["name"] == "k")
        .unwrap()
        .clone();
    assert_eq!(key["prefix"], &secret[..9]);
    let id = key["id"].as_str().unwrap();
    let shown = admin
        .expect(200, "GET", &format!("/api/v1/keys/{id}"), None)
        .await;
    assert!(shown.get("key").is_none() && shown.get("hash").is_none());
    let c = server.client_with(Some(&secret));
    c.expect(200, "GET", "/v2/entities", None).await;
    let revoked = admin
        .expect(200, "POST", &format!("/api/v1/keys/{id}/revoke"), None)
        .await;
    assert!(revoked["revokedAt"].is_i64());
    let (status, body) = c.send("GET", "/v2/entities", None, None).await;
    assert_eq!(status, 401, "{body}");
    admin
        .expect(404, "DELETE", "/api/v1/keys/key_nope", None)
        .await;
    let before = admin.expect(200, "GET", "/api/v1/keys", None).await;
    for bad in [
        json!({"name":"x"}),
        json!({"name":"x","role":"root"}),
        json!({"name":"","role":"read"}),
        json!({"name":"x","role":"read","tenant":"a-b"}),
        json!({"name":"x","role":"read","servicePath":"parks"}),
        json!({"name":"x","role":"read","expiresAt": 1}),
        json!({"name":"x","role":"read","channel":"c"}),
        json!({"name":"x","role":"read","extra":1}),
    ] {
        admin.expect(400, "POST", "/api/v1/keys", Some(&bad)).await;
    }
    assert_eq!(admin.expect(200, "GET", "/api/v1/keys", None).await, before);
}

/// An ingest key posts uplinks (pinned to its channel) and nothing else;
/// the global ingest key works as before.
#[tokio::test]
async fn ingest_keys_are_pinned_and_cannot_write_ngsi() {
    let server = Server::start();
    let admin = server.client();
    let ttn = make_key(
        &admin,
        json!({"name":"ttn","role":"ingest","channel":"farm"}),
    )
    .await;
    let plain = server.client_with(None);
    let bearer = format!("Bearer {ttn}");
    let uplink =
        json!({"end_device_ids":{"device_id":"d1"},"uplink_message":{"decoded_payload":{"t":1}}});
    let at = |q: &str| format!("/api/v1/uplinks/ttn{q}");
    assert_eq!(
        plain
            .send("POST", &at("?channel=farm"), Some(&uplink), Some(&bearer))
            .await
            .0,
        202
    );
    assert_eq!(
        plain
            .send("POST", &at(""), Some(&uplink), Some(&bearer))
            .await
            .0,
        202
    );
    assert_eq!(
        plain
            .send("POST", &at("?channel=city"), Some(&uplink), Some(&bearer))
            .await
            .0,
        403
    );
    let sensae = json!({"id":"d1","reported_at": now_ms(),"uuid":"u9","temperature":1});
    let path = "/sensor-data/farm/decoded/em300th";
    assert_eq!(
        plain.send("POST", path, Some(&sensae), Some(&ttn)).await.0,
        202
    );
    assert_eq!(
        plain.send("POST", path, Some(&sensae), Some(KEY)).await.0,
        202
    );
    assert_eq!(
        plain
            .send("POST", path, Some(&sensae), Some("wrong"))
            .await
            .0,
        401
    );
    assert_eq!(plain.send("POST", path, Some(&sensae), None).await.0, 401);
    let as_ttn = server.client_with(Some(&ttn));
    for (method, path) in [
        ("POST", "/v2/entities"),
        ("GET", "/v2/entities"),
        ("GET", "/api/v1/data"),
    ] {
        let (status, body) = call(&as_ttn, method, path, &[]).await;
        assert_eq!(status, 403, "{method} {path}: {body}");
    }
    // A read key is no ingest key.
    let read = make_key(&admin, json!({"name":"r","role":"read"})).await;
    let bearer = format!("Bearer {read}");
    assert_eq!(
        plain
            .send("POST", &at(""), Some(&uplink), Some(&bearer))
            .await
            .0,
        403
    );
}

/// A fresh data directory without `admin_key` prints a new admin key
/// once on stderr; it works; a restart prints none.
#[tokio::test]
async fn first_start_prints_an_admin_key_once() {
    let dir = tempfile::tempdir().unwrap();
    let start = || {
        let mut child = Command::new(env!("CARGO_BIN_EXE_weft"))
            .args(["serve", "--listen", "127.0.0.1:0", "--data"])
            .arg(dir.path())
            .env("WEFT_LOG", "warn")
            .env_remove("WEFT_ADMIN_KEY")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let url = line
            .trim()
            .strip_prefix("weft listening on ")
            .unwrap()
            .to_string();
        (child, url)
    };
    // A printed secret: a line that is nothing but `weft_` and 43 more.
    let secret_in = |text: &str| -> Vec<String> {
        text.lines()
            .map(str::trim)
            .filter(|l| l.starts_with("weft_") && l.len() == 48)
            .map(str::to_string)
            .collect()
    };
    let read_stderr = |child: &mut std::process::Child| {
        let _ = child.kill();
        let _ = child.wait();
        let mut text = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        text
    };
    let (mut child, url) = start();
    let http = reqwest::Client::new();
    // The key is printed before the first request is served.
    let health = http.get(format!("{url}/health")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let text = read_stderr(&mut child);
    let secrets = secret_in(&text);
    assert_eq!(secrets.len(), 1, "one key printed: {text}");
    let secret = secrets[0].clone();

    let (mut child, url) = start();
    let devices = http
        .get(format!("{url}/api/v1/devices"))
        .bearer_auth(&secret)
        .send()
        .await
        .unwrap();
    assert_eq!(
        devices.status(),
        200,
        "the printed key works after a restart"
    );
    let text = read_stderr(&mut child);
    assert!(secret_in(&text).is_empty(), "no new key printed: {text}");
}

/// `WEFT_AUTH=off` answers without keys (development only).
#[tokio::test]
async fn auth_off_needs_no_key() {
    let server = Server::start_with_env(&[("WEFT_AUTH", "off")]);
    let c = server.client_with(None);
    c.expect(200, "GET", "/api/v1/devices", None).await;
    c.expect(
        201,
        "POST",
        "/v2/entities",
        Some(&json!({"id":"o1","type":"T"})),
    )
    .await;
    c.expect(200, "GET", "/api/v1/keys", None).await;
    assert_eq!(ws_status(&server, "").await, 101);
}

/// With `[http] cors_origins`, a browser's preflight from a listed origin
/// is answered (without a key) and answers carry the allow header.
#[tokio::test]
async fn cors_answers_listed_origins() {
    let server =
        Server::start_with_env(&[("WEFT_HTTP__CORS_ORIGINS", "[\"https://console.example\"]")]);
    let c = server.client_with(None);
    let resp = c
        .http
        .request(reqwest::Method::OPTIONS, format!("{}/v2/entities", c.url))
        .header("Origin", "https://console.example")
        .header("Access-Control-Request-Method", "GET")
        .header("Access-Control-Request-Headers", "x-auth-token")
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());
    assert_eq!(
        resp.headers()["access-control-allow-origin"],
        "https://console.example"
    );
    let resp = server
        .client()
        .http
        .get(format!("{}/v2/entities", c.url))
        .header("Origin", "https://console.example")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["access-control-allow-origin"],
        "https://console.example"
    );
}

/// Notifications received by a local endpoint: the headers of each.
async fn header_sink() -> (
    String,
    tokio::sync::mpsc::UnboundedReceiver<axum::http::HeaderMap>,
) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let app = axum::Router::new().route(
        "/notify",
        axum::routing::post(move |headers: axum::http::HeaderMap| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(headers);
                ""
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/notify", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, rx)
}

/// The key an update came with never reaches the notifications it
/// triggers (with auth off, Orion's forwarding of `X-Auth-Token` stays).
#[tokio::test]
async fn keys_are_not_forwarded_to_notifications() {
    for (auth, forwarded) in [("on", false), ("off", true)] {
        let server = Server::start_with_env(&[("WEFT_AUTH", auth)]);
        let admin = server.client();
        let (url, mut received) = header_sink().await;
        let sub = json!({"subject": {"entities": [{"idPattern": ".*", "type": "Room"}]},
                         "notification": {"http": {"url": url}}});
        admin
            .expect(201, "POST", "/v2/subscriptions", Some(&sub))
            .await;
        let room = json!({"id": "R1", "type": "Room", "t": {"value": 1, "type": "Number"}});
        admin.expect(201, "POST", "/v2/entities", Some(&room)).await;
        let headers = tokio::time::timeout(Duration::from_secs(10), received.recv())
            .await
            .expect("a notification")
            .expect("the sink runs");
        let token = headers
            .get("x-auth-token")
            .map(|v| v.to_str().unwrap().to_string());
        assert_eq!(token.is_some(), forwarded, "auth {auth}: {headers:?}");
        if forwarded {
            assert_eq!(token.as_deref(), Some(ADMIN_KEY));
        }
        let leaked = headers
            .values()
            .any(|v| v.to_str().is_ok_and(|v| v.contains(ADMIN_KEY)));
        assert_eq!(leaked, forwarded, "auth {auth}: {headers:?}");
    }
}
