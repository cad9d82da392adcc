//! Health and metrics.

use std::time::Duration;

use crate::util::*;

/// `/health` passes on a writable store and `/metrics` counts uplinks.
#[tokio::test]
async fn health_and_metrics() {
    let server = Server::start();
    let c = server.client();
    let h = c.expect(200, "GET", "/health", None).await;
    assert_eq!(h["status"], "pass");
    c.create_em300th().await;
    c.uplink(
        "irrigation",
        "decoded",
        "em300th",
        &decoded_body("m1", "d", 1, 1, now_ms()),
    )
    .await;
    let text = metrics_text(&server).await;
    assert!(text.contains("weft_uplinks_accepted_total 1"), "{text}");
    // Timings are histograms: every observation since the start is in a
    // bucket, not only the last minute's in a quantile.
    assert!(
        text.contains("# TYPE weft_store_commit_seconds histogram")
            && text.contains("weft_store_commit_seconds_bucket{writer=\"log\",le=\"+Inf\"}"),
        "{text}"
    );
    assert!(!text.contains("quantile="), "no summaries: {text}");
    // One node alone does every piece of the work done once, and says so.
    let health = eventually(Duration::from_secs(10), || async {
        let health = c.expect(200, "GET", "/health", None).await;
        (health["work"].as_array().map(Vec::len) == Some(6)).then_some(health)
    })
    .await;
    let node = health["node"].as_str().expect("a node id").to_string();
    assert!(
        text.contains(&format!("node=\"{node}\"")) && text.contains("weft_cluster_node_info"),
        "{text}"
    );
    let mut work: Vec<&str> = health["work"]
        .as_array()
        .expect("the work done here")
        .iter()
        .filter_map(|w| w.as_str())
        .collect();
    work.sort_unstable();
    assert_eq!(
        work,
        [
            "bridges",
            "expiry",
            "history",
            "history-changes",
            "periodic-notifications",
            "pipeline"
        ],
        "{health}"
    );
    let metrics = metrics_text(&server).await;
    assert!(
        metrics.contains("weft_cluster_lease_held{work=\"pipeline\"} 1"),
        "{metrics}"
    );
    let api = c.expect(200, "GET", "/api/v1/openapi.json", None).await;
    assert!(api["paths"]["/sensor-data/{channel}/{infoType}/{deviceType}"].is_object());
}

/// A second weft on a data directory in use stops at start with a message
/// naming the first, and the first keeps serving.
#[tokio::test]
async fn a_second_weft_on_the_same_data_directory_refuses_to_start() {
    let server = Server::start();
    let second = std::process::Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(server.data_dir())
        .env("WEFT_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("weft starts");
    // It must exit by itself; if it served instead, the wait would hang,
    // so wait on a thread with a deadline.
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let out = second.wait_with_output().expect("second weft's output");
        let _ = tx.send(out);
    });
    let out = rx
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("the second weft exits instead of serving");
    waiter.join().unwrap();
    assert!(!out.status.success(), "the second weft exits with an error");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("is in use by another weft (pid "),
        "clear message: {stderr}"
    );
    let c = server.client();
    let h = c.expect(200, "GET", "/health", None).await;
    assert_eq!(h["status"], "pass");
}

/// Asked for PostgreSQL without saying where it is, weft stops at start
/// with a message naming the setting, instead of falling back to SQLite.
#[test]
fn postgres_without_a_url_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(dir.path())
        .env("WEFT_LOG", "warn")
        .env("WEFT_STORE__BACKEND", "postgres")
        .env_remove("WEFT_STORE__URL")
        .output()
        .expect("weft runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("WEFT_STORE__URL"), "{stderr}");
}

/// `/metrics` of `server`, as text.
async fn metrics_text(server: &Server) -> String {
    server
        .client()
        .http
        .get(format!("{}/metrics", server.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}
