//! Attacks with real keys that got through when roles were decided by the
//! request's path string, each tried as an attacker would: a path ending
//! in `/health` on QuantumLeap's listener, a write key defining pages
//! whose names end in `/decode`, a read key reading the keys stored in
//! subscriptions, and streams outliving the key that opened them.

use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use crate::util::{eventually, Client, Server};

/// Makes a key through the API with the admin client; its id and secret.
async fn make_key(admin: &Client, spec: Value) -> (String, String) {
    let made = admin.expect(201, "POST", "/api/v1/keys", Some(&spec)).await;
    (
        made["id"].as_str().unwrap().to_string(),
        made["key"].as_str().unwrap().to_string(),
    )
}

/// On QuantumLeap's own listener, only `/health` itself is open: paths
/// that merely end in `/health` are history queries and deletes like any
/// other, and want a key of the tenant they name.
#[tokio::test]
async fn quantumleap_paths_ending_in_health_want_a_key() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let addr = format!("127.0.0.1:{port}");
    let server = Server::start_with_env(&[("WEFT_HISTORY__QUANTUMLEAP_LISTEN", &addr)]);
    let admin = server.client();
    eventually(Duration::from_secs(5), || async {
        tokio::net::TcpStream::connect(&addr).await.ok().map(|_| ())
    })
    .await;
    // Another tenant's history of an entity called `health`.
    let notification = json!({"subscriptionId": "s", "data": [
        {"id": "health", "type": "Pump", "health": {"type": "Number", "value": 1}},
        {"id": "Pump1", "type": "Pump", "health": {"type": "Number", "value": 2}},
    ]});
    let secret_tenant = [("Fiware-Service", "secret")];
    let ql = Client {
        url: format!("http://{addr}"),
        ..admin.clone()
    };
    let notify = ql
        .http
        .post(format!("{}/v2/notify", ql.url))
        .header("Fiware-Service", "secret")
        .json(&notification)
        .send()
        .await
        .unwrap();
    assert!(notify.status().is_success(), "{}", notify.status());

    let stranger = reqwest::Client::new();
    for (method, path) in [
        ("GET", "/v2/entities/health"),
        ("GET", "/v2/entities/Pump1/attrs/health"),
        ("GET", "/v2/attrs/health"),
        ("GET", "/v2/types/Pump/attrs/health"),
        ("DELETE", "/v2/entities/health"),
    ] {
        for tenant in [None, Some("secret")] {
            let mut req = stranger.request(method.parse().unwrap(), format!("{}{path}", ql.url));
            if let Some(t) = tenant {
                req = req.header("Fiware-Service", t);
            }
            let status = req.send().await.unwrap().status().as_u16();
            assert_eq!(status, 401, "{method} {path} (tenant {tenant:?})");
        }
    }
    // `/health` itself stays open, and the history is still there.
    let health = stranger
        .get(format!("{}/health", ql.url))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status().as_u16(), 200);
    let mut req = ql.http.get(format!("{}/v2/entities/health", ql.url));
    for (k, v) in secret_tenant {
        req = req.header(k, v);
    }
    let kept = req.send().await.unwrap();
    assert_eq!(kept.status().as_u16(), 200, "the history was not erased");
}

/// Pages are definitions: a write key can neither create nor delete one,
/// whatever its name ends with; rendered pages run in a sandbox of their
/// own so a page's script cannot act on the console's origin.
#[tokio::test]
async fn a_write_key_cannot_define_pages_and_pages_are_sandboxed() {
    let server = Server::start();
    let admin = server.client();
    let (_, secret) = make_key(&admin, json!({"name": "w", "role": "write"})).await;
    let writer = server.client_with(Some(&secret));
    let evil = "<script>fetch('/api/v1/keys')</script>";
    for name in ["evil/decode", "evil/downlinks", "evil"] {
        let path = format!("/api/v1/pages/{name}");
        let resp = writer
            .http
            .put(format!("{}{path}", writer.url))
            .body(evil)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 403, "PUT {path}");
        assert_eq!(
            writer.send("DELETE", &path, None, None).await.0,
            403,
            "DELETE {path}"
        );
        assert_eq!(
            admin
                .send("GET", &format!("/pages/{name}"), None, None)
                .await
                .0,
            404,
            "nothing was made at {name}"
        );
    }
    let made = admin
        .http
        .put(format!("{}/api/v1/pages/hello/decode", admin.url))
        .body("<p>hello</p>")
        .send()
        .await
        .unwrap();
    assert_eq!(made.status().as_u16(), 201);
    let page = admin
        .http
        .get(format!("{}/pages/hello/decode", admin.url))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status().as_u16(), 200);
    let policy = page
        .headers()
        .get("content-security-policy")
        .expect("a Content-Security-Policy")
        .to_str()
        .unwrap();
    assert!(
        policy.starts_with("sandbox") && !policy.contains("allow-same-origin"),
        "{policy}"
    );
}

/// The keys users store in a subscription's custom headers (and a URL's
/// password) are shown to admin keys only; readers and writers see them
/// masked, and the notifications still carry the real ones.
#[tokio::test]
async fn subscription_secrets_are_masked_for_all_but_admin() {
    let server = Server::start();
    let admin = server.client();
    let sub = json!({
        "subject": {"entities": [{"idPattern": ".*"}]},
        "notification": {"httpCustom": {
            "url": "http://bob:hunter2@127.0.0.1:9/notify",
            "headers": {"X-Auth-Token": "weft_receivers-secret-key"},
        }},
    });
    let resp = admin
        .http
        .post(format!("{}/v2/subscriptions", admin.url))
        .json(&sub)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 201);
    let location = resp.headers()["location"].to_str().unwrap().to_string();
    for role in ["read", "write"] {
        let (_, secret) = make_key(&admin, json!({"name": role, "role": role})).await;
        let c = server.client_with(Some(&secret));
        for path in ["/v2/subscriptions", location.as_str()] {
            let shown = c.expect(200, "GET", path, None).await;
            let text = shown.to_string();
            assert!(
                !text.contains("receivers-secret") && !text.contains("hunter2"),
                "{role} sees {text}"
            );
            assert!(text.contains("********"), "{text}");
        }
    }
    let shown = admin.expect(200, "GET", &location, None).await;
    assert_eq!(
        shown["notification"]["httpCustom"]["headers"]["X-Auth-Token"],
        "weft_receivers-secret-key"
    );
}

/// Revoking a key ends the websocket and the SSE stream it opened, each
/// with an `Unauthorized` error; a stream of another key goes on.
#[tokio::test]
async fn revoking_a_key_ends_its_streams() {
    let server = Server::start();
    let admin = server.client();
    let (id, secret) = make_key(&admin, json!({"name": "viewer", "role": "read"})).await;
    let (_, other) = make_key(&admin, json!({"name": "other", "role": "read"})).await;

    let ws_url = |key: &str| {
        format!(
            "{}/api/v1/live?access_token={key}",
            server.url.replacen("http", "ws", 1)
        )
    };
    let (mut ws, _) = tokio_tungstenite::connect_async(ws_url(&secret))
        .await
        .expect("the key opens the websocket");
    let (mut kept, _) = tokio_tungstenite::connect_async(ws_url(&other))
        .await
        .expect("another key opens one too");
    let sse = reqwest::Client::new()
        .get(format!("{}/api/v1/live/sse?stream=data", server.url))
        .header("Authorization", format!("Bearer {secret}"))
        .send()
        .await
        .unwrap();
    assert_eq!(sse.status().as_u16(), 200);
    let mut sse = sse;

    admin
        .expect(204, "DELETE", &format!("/api/v1/keys/{id}"), None)
        .await;

    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        let mut error = None;
        while let Some(msg) = ws.next().await {
            match msg {
                Ok(Message::Text(t)) => {
                    let v: Value = serde_json::from_str(&t).unwrap();
                    if v["type"] == "error" {
                        error = Some(v);
                    }
                }
                Ok(Message::Close(_)) | Err(_) => break,
                Ok(_) => {}
            }
        }
        error
    })
    .await
    .expect("the revoked key's websocket is closed");
    assert_eq!(
        ended.expect("an error before the close")["error"],
        "Unauthorized"
    );

    let text = tokio::time::timeout(Duration::from_secs(10), async {
        let mut text = String::new();
        while let Ok(Some(chunk)) = sse.chunk().await {
            text.push_str(&String::from_utf8_lossy(&chunk));
        }
        text
    })
    .await
    .expect("the revoked key's SSE stream ends");
    assert!(
        text.contains("event: error") && text.contains("Unauthorized"),
        "{text}"
    );

    // The other key's websocket still answers.
    use futures::SinkExt;
    kept.send(Message::Text(
        json!({"type": "subscribe", "id": "a", "stream": "data"})
            .to_string()
            .into(),
    ))
    .await
    .unwrap();
    let reply = tokio::time::timeout(Duration::from_secs(5), kept.next())
        .await
        .expect("an answer")
        .unwrap()
        .unwrap();
    assert!(reply.to_text().unwrap().contains("subscribed"), "{reply}");
}
