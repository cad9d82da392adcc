//! Orion's operational endpoints beside `/v2`: `/statistics` and
//! `/cache/statistics` (read, and reset with DELETE), `/admin/log` (the
//! log level), `/log/trace`, `/admin/sem` and `/admin/metrics` (counted
//! in [`weft_pipeline::orion_metrics`]). Monitoring scripts written
//! for Orion poll these; weft answers them in Orion's shapes.
//!
//! What weft has no equivalent for is answered as an Orion started without
//! the matching option would: `/statistics` carries only the uptime and
//! the measuring interval (Orion's counters need `-statCounters`, and
//! weft's own metrics are at `/metrics`), the subscription-cache counters
//! stay at zero (weft keeps every subscription in memory, there is no
//! cache to refresh), and trace levels are accepted and reported but
//! change nothing (weft logs through `tracing`, configured with `log`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use axum::extract::Path;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::error::{Error, Result};
use super::params::Params;

/// When the NGSI surface started: `/version`'s and `/statistics`' uptime.
pub fn started() -> Instant {
    static STARTED: OnceLock<Instant> = OnceLock::new();
    *STARTED.get_or_init(Instant::now)
}

/// Seconds since start when the statistics were last reset (`DELETE
/// /statistics`): the start of `measuring_interval_in_secs`.
static STATS_RESET_AT: AtomicU64 = AtomicU64::new(0);

/// The log level `/admin/log` reports, as last set (Orion's default is
/// `WARN`).
static LOG_LEVEL: Mutex<&'static str> = Mutex::new("WARN");

/// The trace levels `/log/trace` reports, as last set.
static TRACE_LEVELS: Mutex<String> = Mutex::new(String::new());

/// Orion's log levels, in Orion's spelling.
const LOG_LEVELS: [&str; 6] = ["NONE", "FATAL", "ERROR", "WARN", "INFO", "DEBUG"];

/// Locks one of the settings above; a poisoned lock still holds a valid
/// value (they are plain data), so it is used as it is.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn uptime_secs() -> u64 {
    started().elapsed().as_secs()
}

/// Orion's "reset" answer of `DELETE /statistics` and `DELETE
/// /cache/statistics`.
fn reset_answer() -> Response {
    axum::Json(json!({"message": "All statistics counter reset"})).into_response()
}

/// `GET /statistics`: `{"uptime_in_secs", "measuring_interval_in_secs"}`,
/// what Orion shows without `-statCounters`, `-statSemWait`,
/// `-statTiming` and `-statNotifQueue`.
pub async fn statistics(_params: Params) -> Response {
    let uptime = uptime_secs();
    let interval = uptime.saturating_sub(STATS_RESET_AT.load(Ordering::Relaxed));
    axum::Json(json!({
        "uptime_in_secs": uptime,
        "measuring_interval_in_secs": interval,
    }))
    .into_response()
}

/// `DELETE /statistics`: starts a new measuring interval.
pub async fn reset_statistics() -> Response {
    STATS_RESET_AT.store(uptime_secs(), Ordering::Relaxed);
    reset_answer()
}

/// `GET /cache/statistics`: Orion's subscription-cache counters.
pub async fn cache_statistics() -> Response {
    axum::Json(json!({
        "ids": "",
        "refreshs": 0,
        "inserts": 0,
        "removes": 0,
        "updates": 0,
        "items": 0,
    }))
    .into_response()
}

/// `DELETE /cache/statistics`.
pub async fn reset_cache_statistics() -> Response {
    reset_answer()
}

/// `GET /admin/log`: `{"level"}`.
pub async fn get_log() -> Response {
    axum::Json(json!({"level": *lock(&LOG_LEVEL)})).into_response()
}

/// `PUT /admin/log?level=<NONE|FATAL|ERROR|WARN|INFO|DEBUG>` (any case):
/// 200 with no body; another level is Orion's 400.
pub async fn put_log(params: Params) -> Result<Response> {
    let wanted = params.get("level").unwrap_or_default().to_ascii_uppercase();
    let Some(level) = LOG_LEVELS.iter().find(|l| **l == wanted) else {
        return Err(Error::bad_request("invalid log level"));
    };
    *lock(&LOG_LEVEL) = level;
    Ok(axum::http::StatusCode::OK.into_response())
}

/// `GET /log/trace`: `{"tracelevels"}`, as last set.
pub async fn get_trace() -> Response {
    let levels = lock(&TRACE_LEVELS).clone();
    let text = if levels.is_empty() {
        "empty".to_string()
    } else {
        levels
    };
    axum::Json(json!({"tracelevels": text})).into_response()
}

/// `PUT /log/trace/{levels}`: sets the levels (`t1-t2,t3`) reported.
pub async fn put_trace(Path(levels): Path<String>) -> Result<Response> {
    if !levels
        .bytes()
        .all(|b| b.is_ascii_digit() || b == b'-' || b == b',')
    {
        return Err(Error::bad_request("bad trace level"));
    }
    *lock(&TRACE_LEVELS) = levels;
    Ok(axum::http::StatusCode::OK.into_response())
}

/// `DELETE /log/trace[/{levels}]`: clears the levels reported.
pub async fn delete_trace() -> Response {
    lock(&TRACE_LEVELS).clear();
    axum::http::StatusCode::OK.into_response()
}

/// `GET /admin/metrics[?reset=true]`: Orion's metrics per service and
/// subservice (see [`weft_pipeline::orion_metrics`]); `reset=true` reads and resets in
/// one step.
pub async fn get_metrics(params: Params) -> Response {
    let reset = params.get("reset") == Some("true");
    axum::Json(weft_pipeline::orion_metrics::render(reset)).into_response()
}

/// `DELETE /admin/metrics`: every counter back to zero; 204.
pub async fn reset_metrics() -> Response {
    weft_pipeline::orion_metrics::reset();
    axum::http::StatusCode::NO_CONTENT.into_response()
}

/// `GET /admin/sem`: Orion's semaphore listing; weft has none of them,
/// so each is `free`.
pub async fn semaphores() -> Response {
    let free = json!({"status": "free"});
    let names = [
        "alarmMgr",
        "connectionContext",
        "connectionEndpoints",
        "dbConnection",
        "dbConnectionPool",
        "logMsg",
        "metrics",
        "request",
        "subCache",
        "timeStat",
        "transaction",
    ];
    let body: serde_json::Map<String, serde_json::Value> = names
        .iter()
        .map(|n| (n.to_string(), free.clone()))
        .collect();
    axum::Json(serde_json::Value::Object(body)).into_response()
}
