//! Native TLS (`[http] tls_cert` / `tls_key`): the API is served over
//! HTTPS with the configured certificate, keys still apply, plain HTTP on
//! the same port gets nothing, and a half-configured or broken pair stops
//! weft at start with a message naming the file.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::util::{decoded_body, Client, Server, ADMIN_KEY, KEY};

/// A self-signed certificate for `localhost` and 127.0.0.1, written to
/// `dir`; its PEM (the client's only trusted root) and the two paths.
fn self_signed(dir: &Path) -> (String, String, String) {
    let made = rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()])
        .expect("a certificate");
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    std::fs::write(&cert, made.cert.pem()).unwrap();
    std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
    (
        made.cert.pem(),
        cert.to_str().unwrap().to_string(),
        key.to_str().unwrap().to_string(),
    )
}

/// A client trusting only `root_pem`, sending `key` (if any).
fn tls_client(server: &Server, root_pem: &str, key: Option<&str>) -> Client {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(key) = key {
        headers.insert("X-Auth-Token", key.parse().unwrap());
    }
    Client {
        http: reqwest::Client::builder()
            .tls_built_in_root_certs(false)
            .add_root_certificate(reqwest::Certificate::from_pem(root_pem.as_bytes()).unwrap())
            .default_headers(headers)
            .build()
            .unwrap(),
        url: server.url.clone(),
    }
}

#[tokio::test]
async fn the_api_is_served_over_https_with_the_configured_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let (root, cert, key) = self_signed(dir.path());
    let server =
        Server::start_with_env(&[("WEFT_HTTP__TLS_CERT", &cert), ("WEFT_HTTP__TLS_KEY", &key)]);
    assert!(server.url.starts_with("https://"), "{}", server.url);

    // Keys apply over TLS as over HTTP.
    let admin = tls_client(&server, &root, Some(ADMIN_KEY));
    admin.create_em300th().await;
    let anonymous = tls_client(&server, &root, None);
    let (status, _) = anonymous
        .send("GET", "/api/v1/device-types", None, None)
        .await;
    assert_eq!(status, 401);
    let (status, _) = anonymous.send("GET", "/health", None, None).await;
    assert_eq!(status, 200);

    // An uplink over HTTPS is stored.
    let body = decoded_body(
        "d6f6a5d8-6d0a-4b8a-9f57-6f1f0e7e0001",
        "tls-device",
        21,
        40,
        crate::util::now_ms(),
    );
    let (status, _) = admin
        .send(
            "POST",
            "/sensor-data/tls/decoded/em300th",
            Some(&body),
            Some(KEY),
        )
        .await;
    assert_eq!(status, 202);
    admin
        .unit_eventually("d6f6a5d8-6d0a-4b8a-9f57-6f1f0e7e0001")
        .await;

    // A client that does not trust the certificate is refused by its TLS
    // layer, and plain HTTP on the TLS port gets no HTTP answer.
    let untrusting = reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .build()
        .unwrap();
    assert!(untrusting
        .get(format!("{}/health", server.url))
        .send()
        .await
        .is_err());
    let plain = server.url.replacen("https://", "http://", 1);
    assert!(reqwest::get(format!("{plain}/health")).await.is_err());
}

/// Runs `weft serve` with `env` until it exits; its status and stderr.
fn start_failing(dir: &Path, env: &[(&str, &str)]) -> (bool, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_weft"));
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(dir.join("data"))
        .env("WEFT_LOG", "warn")
        .env("WEFT_ADMIN_KEY", ADMIN_KEY)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("weft runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_broken_tls_configuration_stops_weft_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let (_, cert, key) = self_signed(dir.path());

    let (ok, stderr) = start_failing(dir.path(), &[("WEFT_HTTP__TLS_CERT", &cert)]);
    assert!(!ok);
    assert!(
        stderr.contains("tls_cert and tls_key go together"),
        "{stderr}"
    );

    let missing = dir.path().join("missing.pem");
    let (ok, stderr) = start_failing(
        dir.path(),
        &[
            ("WEFT_HTTP__TLS_CERT", missing.to_str().unwrap()),
            ("WEFT_HTTP__TLS_KEY", &key),
        ],
    );
    assert!(!ok);
    assert!(stderr.contains("missing.pem"), "{stderr}");

    // The certificate given as its own key: no private key in it.
    let (ok, stderr) = start_failing(
        dir.path(),
        &[
            ("WEFT_HTTP__TLS_CERT", &cert),
            ("WEFT_HTTP__TLS_KEY", &cert),
        ],
    );
    assert!(!ok);
    assert!(stderr.contains("cert.pem"), "{stderr}");
}
