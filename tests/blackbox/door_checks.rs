//! Input checked at the door: every definition the admin API takes is
//! checked before anything is stored, a bad one is a 400 whose
//! description starts with the field at fault, and nothing changes; a
//! client that does not finish its request head within `[http]
//! header_timeout` has its connection closed, on every listener.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::util::{Client, Server, KEY};

/// Sends `body` (JSON, or raw text when it is a string starting with
/// `raw:`) and asserts a 400 whose description starts with `field`.
async fn refused(c: &Client, method: &str, path: &str, body: Value, field: &str) {
    let (status, reply) = match body.as_str().and_then(|s| s.strip_prefix("raw:")) {
        Some(raw) => {
            let resp = c
                .http
                .request(method.parse().unwrap(), format!("{}{}", c.url, path))
                .body(raw.to_string())
                .send()
                .await
                .expect("request sent");
            let status = resp.status().as_u16();
            let text = resp.text().await.unwrap_or_default();
            (status, serde_json::from_str(&text).unwrap_or(Value::Null))
        }
        None => c.send(method, path, Some(&body), Some(KEY)).await,
    };
    assert_eq!(status, 400, "{method} {path} {body}: {reply}");
    let description = reply["description"].as_str().unwrap_or_default();
    assert!(
        description.starts_with(field),
        "{method} {path} {body}: the description names {field}: {reply}"
    );
}

/// A device type whose name is not one (in the path, in the body), a
/// device naming such a type: 400 naming the field, nothing stored.
#[tokio::test]
async fn device_type_names_are_checked() {
    let server = Server::start();
    let c = server.client();
    refused(&c, "PUT", "/api/v1/device-types/[]", json!({}), "name '[]'").await;
    refused(&c, "PUT", "/api/v1/device-types/-x", json!({}), "name '-x'").await;
    refused(
        &c,
        "PUT",
        &format!("/api/v1/device-types/{}", "a".repeat(65)),
        json!({}),
        "name 'aaaa",
    )
    .await;
    refused(
        &c,
        "PUT",
        "/api/v1/device-types/thermo",
        json!({"name": "[]"}),
        "name \"[]\"",
    )
    .await;
    // Wrong types and bad mappings are named too.
    refused(
        &c,
        "PUT",
        "/api/v1/device-types/thermo",
        json!({"decoder": 5}),
        "decoder:",
    )
    .await;
    refused(
        &c,
        "PUT",
        "/api/v1/device-types/thermo",
        json!({"processor": {"mappings": [{"from": "t", "to": ""}]}}),
        "processor.mappings[0].to",
    )
    .await;
    refused(
        &c,
        "PUT",
        "/api/v1/device-types/thermo",
        json!({"decoder": {"language": "lua", "script": "x"}}),
        "decoder.language",
    )
    .await;
    refused(
        &c,
        "PUT",
        "/api/v1/devices/dev-1",
        json!({"type": "[]"}),
        "type '[]'",
    )
    .await;
    let types = c.expect(200, "GET", "/api/v1/device-types", None).await;
    assert_eq!(types, json!([]), "no type stored");
    let devices = c.expect(200, "GET", "/api/v1/devices", None).await;
    assert_eq!(devices, json!([]), "no device stored");

    // The Things Stack's model ids (`em300-th`) name types; sensae's path
    // names only the types of 2-15 letters and digits.
    c.expect(
        201,
        "PUT",
        "/api/v1/device-types/em300-th",
        Some(&json!({})),
    )
    .await;
    c.expect(201, "PUT", "/api/v1/device-types/em300th", Some(&json!({})))
        .await;
}

/// A device's channel, location, endpoint, name and record labels: 400
/// naming the field, and no device stored.
#[tokio::test]
async fn device_fields_are_checked() {
    let server = Server::start();
    let c = server.client();
    let cases = [
        (json!({"channel": "bad chan!"}), "channel 'bad chan!'"),
        (
            json!({"static": {"location": {"lat": 999, "lon": -8.61}}}),
            "static.location.lat 999",
        ),
        (
            json!({"static": {"location": {"lat": 41.15, "lon": 180.5}}}),
            "static.location.lon 180.5",
        ),
        (
            json!({"static": {"location": {"lat": 41.15, "lon": -181}}}),
            "static.location.lon -181",
        ),
        (
            json!({"static": {"location": {"lat": "41", "lon": 0}}}),
            "static.location.lat",
        ),
        (json!({"endpoint": "not a url"}), "endpoint 'not a url'"),
        (json!({"endpoint": "ftp://host/x"}), "endpoint"),
        (json!({"name": "bell\u{7}"}), "name"),
        (json!({"name": "n".repeat(257)}), "name"),
        (json!({"records": {"": "x"}}), "records"),
        (json!({"records": {"tab\there": "x"}}), "records"),
        (json!({"channel": 5}), "channel:"),
        (
            json!({"subDevices": [{"ref": 1, "id": "a b"}]}),
            "subDevices[0]",
        ),
    ];
    for (body, field) in cases {
        refused(&c, "PUT", "/api/v1/devices/dev-1", body, field).await;
    }
    refused(&c, "PUT", "/api/v1/devices/a%25b", json!({}), "id 'a%b'").await;
    c.expect(404, "GET", "/api/v1/devices/dev-1", None).await;
    let devices = c.expect(200, "GET", "/api/v1/devices", None).await;
    assert_eq!(devices, json!([]), "nothing stored");

    // The README's device is accepted, and a refused replacement leaves
    // it as it was.
    let good = json!({"name": "P1", "type": "em300th", "channel": "irrigation",
                      "records": {"Project": "perf"},
                      "static": {"location": {"lat": 41.15, "lon": -8.61}},
                      "endpoint": "https://device.example/down"});
    c.expect(201, "PUT", "/api/v1/devices/dev-1", Some(&good))
        .await;
    let mut bad = good.clone();
    bad["static"]["location"]["lat"] = json!(999);
    refused(
        &c,
        "PUT",
        "/api/v1/devices/dev-1",
        bad,
        "static.location.lat",
    )
    .await;
    let stored = c.expect(200, "GET", "/api/v1/devices/dev-1", None).await;
    assert_eq!(stored["static"]["location"]["lat"], json!(41.15));
    // Its key is made and removed without checking the rest again.
    c.expect(201, "POST", "/api/v1/devices/dev-1/key", None)
        .await;
    c.expect(204, "DELETE", "/api/v1/devices/dev-1/key", None)
        .await;
    c.expect(404, "DELETE", "/api/v1/devices/dev-1/key", None)
        .await;
    c.expect(404, "POST", "/api/v1/devices/nope/key", None)
        .await;
}

/// Rules: scoped channels, types, devices and labels, names and texts;
/// 400 naming the field, and no rule stored.
#[tokio::test]
async fn rule_fields_are_checked() {
    let server = Server::start();
    let c = server.client();
    let rule = |extra: Value| {
        let mut r = json!({"condition": "temperature>40", "alarm": {"type": "hot"}});
        for (k, v) in extra.as_object().unwrap() {
            r[k] = v.clone();
        }
        r
    };
    let cases = [
        (
            json!({"scope": {"channels": ["irrigation", "bad chan!"]}}),
            "scope.channels[1] 'bad chan!'",
        ),
        (json!({"scope": {"types": ["[]"]}}), "scope.types[0] '[]'"),
        (json!({"scope": {"devices": ["a b"]}}), "scope.devices[0]"),
        (json!({"scope": {"records": {"": 1}}}), "scope.records"),
        (json!({"name": "x\u{0}"}), "name"),
        (json!({"alarm": {"type": "  "}}), "alarm.type"),
        (
            json!({"alarm": {"type": "hot", "category": "c\u{1b}[31m"}}),
            "alarm.category",
        ),
        (json!({"repeat": "3"}), "repeat:"),
        (
            json!({"alarm": {"type": "hot", "severity": "fatal"}}),
            "alarm.severity:",
        ),
    ];
    for (extra, field) in cases {
        refused(&c, "PUT", "/api/v1/rules/hot", rule(extra), field).await;
    }
    c.expect(404, "GET", "/api/v1/rules/hot", None).await;
    assert_eq!(c.expect(200, "GET", "/api/v1/rules", None).await, json!([]));
    c.expect(201, "PUT", "/api/v1/rules/hot", Some(&rule(json!({}))))
        .await;
}

/// Bridges, page services and pages, ingest keys: 400 naming the field,
/// nothing stored.
#[tokio::test]
async fn bridge_page_and_key_fields_are_checked() {
    let server = Server::start();
    let c = server.client();

    refused(
        &c,
        "PUT",
        "/api/v1/bridges/out",
        json!({"stream": "data", "channel": "Bad Chan"}),
        "channel 'Bad Chan'",
    )
    .await;
    refused(
        &c,
        "PUT",
        "/api/v1/bridges/out",
        json!({"stream": "data", "channel": 5}),
        "channel:",
    )
    .await;
    refused(
        &c,
        "PUT",
        "/api/v1/bridges/out",
        json!({"stream": "data", "channel": "feed", "filter": {"channels": ["bad chan!"]}}),
        "filter.channels[0]",
    )
    .await;
    refused(
        &c,
        "PUT",
        "/api/v1/bridges/Out",
        json!({"stream": "data", "channel": "feed"}),
        "name 'Out'",
    )
    .await;
    c.expect(404, "GET", "/api/v1/bridges/out", None).await;
    assert_eq!(
        c.expect(200, "GET", "/api/v1/bridges", None).await,
        json!([])
    );

    refused(
        &c,
        "PUT",
        "/api/v1/page-services/items",
        json!({"http": {"url": "not a url"}}),
        "http.url 'not a url'",
    )
    .await;
    refused(
        &c,
        "PUT",
        "/api/v1/page-services/items",
        json!({"http": {"url": "http://127.0.0.1:9/x", "headers": ["Accept Language"]}}),
        "http.headers[0]",
    )
    .await;
    refused(
        &c,
        "PUT",
        "/api/v1/page-services/items",
        json!({"data": {"limit": 0}}),
        "data.limit",
    )
    .await;
    refused(
        &c,
        "PUT",
        "/api/v1/page-services/items",
        json!({"alarms": {"limit": "5"}}),
        "alarms.limit:",
    )
    .await;
    c.expect(404, "GET", "/api/v1/page-services/items", None)
        .await;
    // A URL with placeholders is one.
    c.expect(
        201,
        "PUT",
        "/api/v1/page-services/items",
        Some(&json!({"http": {"url": "http://127.0.0.1:9/items/{param.id}.json"}})),
    )
    .await;
    refused(
        &c,
        "PUT",
        "/api/v1/pages/a%20b",
        json!("raw:<p>hi</p>"),
        "name 'a b'",
    )
    .await;
    assert_eq!(c.expect(200, "GET", "/api/v1/pages", None).await, json!([]));

    let keys = |c: &Client| {
        let c = c.clone();
        async move {
            c.expect(200, "GET", "/api/v1/keys", None).await["keys"]
                .as_array()
                .unwrap()
                .len()
        }
    };
    let before = keys(&c).await;
    refused(
        &c,
        "POST",
        "/api/v1/keys",
        json!({"name": "gw", "role": "ingest", "channel": "bad chan!"}),
        "channel 'bad chan!'",
    )
    .await;
    refused(
        &c,
        "POST",
        "/api/v1/keys",
        json!({"name": "gw", "role": "ingest", "deviceType": "[]"}),
        "deviceType '[]'",
    )
    .await;
    refused(
        &c,
        "POST",
        "/api/v1/keys",
        json!({"name": "gw", "role": "ingest", "expiresAt": "soon"}),
        "expiresAt:",
    )
    .await;
    assert_eq!(keys(&c).await, before, "no key made");
}

/// Opens a connection (or takes `stream`), sends the start of a request
/// and nothing more, and asserts the server closes it within 15 s (the
/// configured timeout is 1 s).
async fn slow_headers_are_cut<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, what: &str) {
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        .await
        .unwrap();
    stream.flush().await.unwrap();
    let started = Instant::now();
    let deadline = Duration::from_secs(15);
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout(
            deadline.saturating_sub(started.elapsed()),
            stream.read(&mut buf),
        )
        .await
        {
            Err(_) => panic!("{what}: the connection is still open after {deadline:?}"),
            // Closed (or reset): what is wanted. Anything the server says
            // before closing (an error status) is read past.
            Ok(Ok(0)) | Ok(Err(_)) => return,
            Ok(Ok(_)) => continue,
        }
    }
}

/// A client that sends part of its request head and then nothing has its
/// connection closed after `[http] header_timeout`, on the API's listener
/// and on QuantumLeap's; a complete request is still served.
#[tokio::test]
async fn a_request_head_that_never_completes_is_cut_off() {
    let ql = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let server = Server::start_with_env(&[
        ("WEFT_HTTP__HEADER_TIMEOUT", "1s"),
        ("WEFT_HISTORY__QUANTUMLEAP_LISTEN", &ql),
    ]);
    let addr = server.url.strip_prefix("http://").unwrap().to_string();
    let stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
    slow_headers_are_cut(stream, "the API's listener").await;

    let ql_stream = crate::util::eventually(Duration::from_secs(5), || async {
        tokio::net::TcpStream::connect(&ql).await.ok()
    })
    .await;
    slow_headers_are_cut(ql_stream, "QuantumLeap's listener").await;

    // A connection that sends nothing at all is cut off too.
    let mut idle = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(15), idle.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "an idle connection is closed: {read:?}"
    );

    // The server goes on serving whole requests.
    server.client().expect(200, "GET", "/health", None).await;
}

/// The same over TLS: the timeout runs once the handshake is done.
#[tokio::test]
async fn a_request_head_that_never_completes_is_cut_off_over_tls() {
    use std::sync::Arc;
    use tokio_rustls::rustls;

    let dir = tempfile::tempdir().unwrap();
    let made = rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()])
        .expect("a certificate");
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    std::fs::write(&cert, made.cert.pem()).unwrap();
    std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
    let server = Server::start_with_env(&[
        ("WEFT_HTTP__HEADER_TIMEOUT", "1s"),
        ("WEFT_HTTP__TLS_CERT", cert.to_str().unwrap()),
        ("WEFT_HTTP__TLS_KEY", key.to_str().unwrap()),
    ]);
    let addr = server.url.strip_prefix("https://").unwrap().to_string();

    let mut roots = rustls::RootCertStore::empty();
    roots.add(made.cert.der().clone()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let tls = connector.connect(name, tcp).await.expect("TLS handshake");
    slow_headers_are_cut(tls, "the TLS listener").await;
}
