//! Operations endpoints: `/health` (is the store writable, how deep is the
//! backlog), `/metrics` (Prometheus text) and the OpenAPI document.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde_json::json;

use crate::routes::{get, Access, Routes, Scope::Own};
use crate::AppState;

/// The operations routes: `/health` is open (load balancers probe it);
/// the metrics and the API's description want a read key.
pub fn routes() -> Routes {
    Routes::new()
        .route("/health", get(Access::Open, health))
        .route("/metrics", get(Access::read(Own), metrics_text))
        .route("/api/v1/openapi.json", get(Access::read(Own), openapi))
}

/// `GET /health`: 200 `{"status":"pass"}` when a write round-trips through
/// the store, 503 `{"status":"fail"}` otherwise. Also says which node
/// answered (`node`) and the work it does for the cluster now (`work`:
/// the leases it holds, see docs/scale-out.md), and on a split pipeline
/// the partitions of the pipeline and of the history's changes feed it
/// holds (`partitions`, `historyPartitions`). With MQTT sources
/// configured, `mqtt` shows each one's connection (`connected`,
/// `lastError`, `reconnections`); a source that is down does not fail
/// the check, since weft keeps serving everything else.
async fn health(State(state): State<AppState>) -> impl IntoResponse {
    let backlog = state.services.ingest.backlog();
    let cluster = &state.services.cluster;
    let sources = state.services.mqtt.statuses();
    match state.services.store.ping().await {
        Ok(()) => {
            let mut body = json!({
                "status": "pass",
                "version": env!("CARGO_PKG_VERSION"),
                "backlog": backlog,
                "node": cluster.node(),
                "work": cluster.held(),
            });
            if state.services.ingest.partition_count() > 1 {
                body["partitions"] =
                    json!(cluster.partitions(weft_pipeline::cluster::work::PIPELINE));
            }
            if state.services.store.change_feed_partitions() > 1 {
                body["historyPartitions"] =
                    json!(cluster.partitions(weft_pipeline::cluster::work::HISTORY_CHANGES));
            }
            let broker = state.services.mqtt.broker();
            if !sources.is_empty() || broker.is_some() {
                body["mqtt"] = json!({ "sources": sources, "broker": broker });
            }
            (StatusCode::OK, Json(body))
        }
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(
                json!({"status":"fail","version":env!("CARGO_PKG_VERSION"),"output":e.to_string()}),
            ),
        ),
    }
}

/// `GET /metrics`: Prometheus exposition text.
async fn metrics_text(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        (state.metrics)(),
    )
}

/// `GET /api/v1/openapi.json`: the contract of weft's own API.
async fn openapi() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        include_str!("openapi.json"),
    )
}
