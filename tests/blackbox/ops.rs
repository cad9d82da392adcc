//! Health and metrics.

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
    let text = c
        .http
        .get(format!("{}/metrics", server.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains("weft_uplinks_accepted_total 1"), "{text}");
    let api = c.expect(200, "GET", "/api/v1/openapi.json", None).await;
    assert!(api["paths"]["/sensor-data/{channel}/{infoType}/{deviceType}"].is_object());
}
