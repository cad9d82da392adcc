//! DSPS's HTTP API at the root, so DSPS clients and its load test run
//! unchanged: `/channel/{channelID}/message/{messageID}` (publish),
//! `/channel/{channelID}/subscription/polling/{subscriberID}` (create,
//! delete, long-poll fetch), `…/message?ackHandle=` (acknowledge), and the
//! probes. Errors use DSPS's shape, `{"error": "<text>"}` (with a `code`
//! where DSPS gives one), not weft's own.
//!
//! An `ackHandle` is the position of the last message a fetch returned:
//! acknowledging it acknowledges everything up to there.

use std::collections::HashMap;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::json;
use weft_model::channel::parse_go_duration;
use weft_pipeline::channels::bridge::{BridgeError, BridgeSpec};
use weft_pipeline::channels::{ChannelError, DEFAULT_FETCH_MAX};
use weft_store::StoreError;

use crate::routes::{delete, get, put, Access, Routes, Scope::Own};
use crate::{ApiError, ApiResult, AppState};

/// The DSPS routes: fetching is a read; publishing, subscribing and
/// acknowledging change data (write); revoking a channel's JWT is admin's;
/// the probes are open.
pub fn routes() -> Routes {
    Routes::new()
        .route(
            "/channel/{channel}/message/{message}",
            put(Access::write(Own), publish),
        )
        .route(
            "/channel/{channel}/subscription/polling/{subscriber}",
            put(Access::write(Own), subscribe)
                .delete(Access::write(Own), unsubscribe)
                .get(Access::read(Own), fetch),
        )
        .route(
            "/channel/{channel}/subscription/polling/{subscriber}/message",
            delete(Access::write(Own), ack),
        )
        .route("/admin/jwt/revoke", put(Access::admin(Own), revoke_jwt))
        .route("/probe/liveness", get(Access::Open, probe))
        .route("/probe/readiness", get(Access::Open, probe))
}

/// An error in DSPS's shape.
struct DspsError {
    status: StatusCode,
    body: serde_json::Value,
}

impl DspsError {
    fn bad(text: impl Into<String>) -> DspsError {
        DspsError {
            status: StatusCode::BAD_REQUEST,
            body: json!({"error": text.into()}),
        }
    }

    fn invalid(param: &str) -> DspsError {
        DspsError::bad(format!("Invalid \"{param}\" parameter"))
    }
}

impl IntoResponse for DspsError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, axum::Json(self.body)).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            resp.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
        }
        resp
    }
}

impl From<StoreError> for DspsError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Overloaded => DspsError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                body: json!({"error": "Server is overloaded, retry later"}),
            },
            other => {
                tracing::error!(error = %other, "channel storage failed");
                DspsError {
                    status: StatusCode::INTERNAL_SERVER_ERROR,
                    body: json!({"error": "Internal Server Error"}),
                }
            }
        }
    }
}

impl From<ChannelError> for DspsError {
    fn from(e: ChannelError) -> Self {
        match e {
            ChannelError::SubscriberNotFound => DspsError {
                status: StatusCode::NOT_FOUND,
                body: json!({"error": "Subscription not found",
                             "code": "dsps.storage.subscription-not-found"}),
            },
            ChannelError::InvalidId(param) => DspsError::invalid(param),
            ChannelError::Forbidden(reason) => {
                tracing::info!(%reason, "channel call refused");
                DspsError {
                    status: StatusCode::FORBIDDEN,
                    body: json!({"error": "Forbidden"}),
                }
            }
            ChannelError::Store(s) => s.into(),
        }
    }
}

/// The request's `Authorization` header.
fn authorization(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
}

/// Checks the ids (DSPS's rule, in DSPS's order), then the caller
/// against the channel's JWT rule: the channels service does both.
fn admit(
    state: &AppState,
    headers: &HeaderMap,
    channel: &str,
    other: (&'static str, &str),
) -> DspsResult<()> {
    state
        .services
        .channels
        .admit(channel, other, authorization(headers))?;
    Ok(())
}

type DspsResult<T> = Result<T, DspsError>;

/// `PUT /channel/{channelID}/message/{messageID}`: 200 once committed;
/// the same id again stores nothing and answers the same.
async fn publish(
    State(state): State<AppState>,
    Path((channel, message)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> DspsResult<impl IntoResponse> {
    admit(&state, &headers, &channel, ("messageID", &message))?;
    // Kept as sent, so it must be JSON every subscriber's parser can read
    // back: no deeper than the limit, no number a double cannot hold.
    let content = match weft_model::json::parse_within_limits(&body) {
        Ok(_) => match serde_json::from_slice::<&serde_json::value::RawValue>(&body) {
            Ok(raw) => raw.get().to_string(),
            Err(_) => return Err(DspsError::bad("Request body is not JSON")),
        },
        Err(weft_model::json::JsonLimitError::Syntax(_)) => {
            return Err(DspsError::bad("Request body is not JSON"))
        }
        Err(limit) => return Err(DspsError::bad(limit.to_string())),
    };
    state
        .services
        .channels
        .publish(&channel, &message, content)
        .await?;
    Ok(axum::Json(
        json!({"channelID": channel, "messageID": message}),
    ))
}

/// `PUT …/subscription/polling/{subscriberID}`: creates it (idempotent).
async fn subscribe(
    State(state): State<AppState>,
    Path((channel, subscriber)): Path<(String, String)>,
    headers: HeaderMap,
) -> DspsResult<impl IntoResponse> {
    subscription(&state, &headers, channel, subscriber, true).await
}

/// `DELETE …/subscription/polling/{subscriberID}`: 200 whether or not it existed.
async fn unsubscribe(
    State(state): State<AppState>,
    Path((channel, subscriber)): Path<(String, String)>,
    headers: HeaderMap,
) -> DspsResult<impl IntoResponse> {
    subscription(&state, &headers, channel, subscriber, false).await
}

/// Creates (`create`) or deletes a subscriber; both answer its ids.
async fn subscription(
    state: &AppState,
    headers: &HeaderMap,
    channel: String,
    subscriber: String,
    create: bool,
) -> DspsResult<axum::Json<serde_json::Value>> {
    admit(state, headers, &channel, ("subscriberID", &subscriber))?;
    let channels = &state.services.channels;
    if create {
        channels.subscribe(&channel, &subscriber).await?;
    } else {
        channels.unsubscribe(&channel, &subscriber).await?;
    }
    Ok(axum::Json(
        json!({"channelID": channel, "subscriberID": subscriber}),
    ))
}

/// `GET …/subscription/polling/{subscriberID}?timeout=3s&max=64`: the
/// unacknowledged messages, waiting up to `timeout` (Go duration, default
/// 0, at most 30 s) for one.
async fn fetch(
    State(state): State<AppState>,
    Path((channel, subscriber)): Path<(String, String)>,
    headers: HeaderMap,
    Query(params): Query<HashMap<String, String>>,
) -> DspsResult<Response> {
    admit(&state, &headers, &channel, ("subscriberID", &subscriber))?;
    let wait = match params.get("timeout").map(String::as_str) {
        None | Some("") => Duration::ZERO,
        Some(t) => parse_go_duration(t).ok_or_else(|| DspsError::invalid("timeout"))?,
    };
    let max = match params.get("max").map(String::as_str) {
        None | Some("") => DEFAULT_FETCH_MAX,
        Some(m) => m
            .parse::<usize>()
            .ok()
            .filter(|m| *m >= 1)
            .ok_or_else(|| DspsError::invalid("max"))?,
    };
    let fetched = state
        .services
        .channels
        .fetch(&channel, &subscriber, wait, max)
        .await?;
    // Contents are stored as validated JSON text: spliced in, not re-parsed.
    let mut body = String::with_capacity(
        64 + fetched
            .messages
            .iter()
            .map(|m| m.content.len() + m.message_id.len() + 32)
            .sum::<usize>(),
    );
    body.push_str("{\"channelID\":");
    body.push_str(&json!(channel).to_string());
    body.push_str(",\"messages\":[");
    for (i, m) in fetched.messages.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        body.push_str("{\"messageID\":");
        body.push_str(&json!(m.message_id).to_string());
        body.push_str(",\"content\":");
        body.push_str(&m.content);
        body.push('}');
    }
    body.push_str("],\"moreMessages\":");
    body.push_str(if fetched.more { "true" } else { "false" });
    if let Some(last) = fetched.messages.last() {
        body.push_str(",\"ackHandle\":\"");
        body.push_str(&last.seq.to_string());
        body.push('"');
    }
    body.push('}');
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response())
}

/// `DELETE …/subscription/polling/{subscriberID}/message?ackHandle=…`:
/// 204; acknowledges everything up to the handle (a stale one changes
/// nothing).
async fn ack(
    State(state): State<AppState>,
    Path((channel, subscriber)): Path<(String, String)>,
    headers: HeaderMap,
    Query(params): Query<HashMap<String, String>>,
) -> DspsResult<StatusCode> {
    admit(&state, &headers, &channel, ("subscriberID", &subscriber))?;
    let through = params
        .get("ackHandle")
        .and_then(|h| h.parse::<u64>().ok())
        .ok_or_else(|| DspsError::invalid("ackHandle"))?;
    state
        .services
        .channels
        .ack(&channel, &subscriber, through)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `PUT /admin/jwt/revoke?jti=…&exp=…` (admin token required): tokens
/// with that `jti` are refused from now on (kept until `exp`, epoch
/// seconds). 200 `{"jti","exp"}`.
async fn revoke_jwt(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(params): Query<HashMap<String, String>>,
) -> DspsResult<impl IntoResponse> {
    if !state.services.channels.is_admin(authorization(&headers)) {
        return Err(DspsError {
            status: StatusCode::FORBIDDEN,
            body: json!({"error": "Forbidden"}),
        });
    }
    let jti = params
        .get("jti")
        .filter(|j| !j.is_empty())
        .ok_or_else(|| DspsError::invalid("jti"))?;
    let exp: i64 = params
        .get("exp")
        .and_then(|e| e.parse().ok())
        .ok_or_else(|| DspsError::invalid("exp"))?;
    state.services.channels.revoke_jwt(jti, exp).await?;
    Ok(axum::Json(json!({"jti": jti, "exp": exp})))
}

/// `GET /probe/liveness`, `GET /probe/readiness`.
async fn probe() -> impl IntoResponse {
    axum::Json(json!({}))
}

/// The `/api/v1/bridges` routes (weft's own API, weft's error shapes):
/// bridges publishing weft's events into channels.
pub fn bridges_routes() -> Routes {
    Routes::new()
        .route("/api/v1/bridges", get(Access::read(Own), list_bridges))
        .route(
            "/api/v1/bridges/{name}",
            get(Access::read(Own), get_bridge)
                .put(Access::admin(Own), put_bridge)
                .delete(Access::admin(Own), delete_bridge),
        )
}

fn bridge_json(name: &str, spec: &BridgeSpec, stored: bool) -> serde_json::Value {
    let mut v = serde_json::to_value(spec).expect("bridges serialise");
    if let serde_json::Value::Object(m) = &mut v {
        m.insert("name".into(), json!(name));
        m.insert("configured".into(), json!(!stored));
    }
    v
}

/// `GET /api/v1/bridges`: every bridge, by name (`configured`: from the
/// configuration file rather than this API).
async fn list_bridges(State(state): State<AppState>) -> axum::Json<serde_json::Value> {
    let all = state.services.bridges.list();
    axum::Json(serde_json::Value::Array(
        all.iter()
            .map(|(n, s, stored)| bridge_json(n, s, *stored))
            .collect(),
    ))
}

/// `GET /api/v1/bridges/{name}`.
async fn get_bridge(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<axum::Json<serde_json::Value>> {
    state
        .services
        .bridges
        .list()
        .into_iter()
        .find(|(n, _, _)| *n == name)
        .map(|(n, s, stored)| axum::Json(bridge_json(&n, &s, stored)))
        .ok_or_else(|| ApiError::not_found(format!("bridge '{name}' does not exist")))
}

/// `PUT /api/v1/bridges/{name}` `{"stream":"alarms","channel":"…","filter":{…}}`:
/// create (201) or replace (200); publishes the events stored from now on.
async fn put_bridge(
    State(state): State<AppState>,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult<impl IntoResponse> {
    let spec: BridgeSpec = crate::catalog::parse_definition(&body)?;
    let created = state
        .services
        .bridges
        .put(&name, spec.clone())
        .await
        .map_err(|e| match e {
            BridgeError::Invalid(text) => ApiError::bad_request(text),
            BridgeError::Store(s) => s.into(),
        })?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, axum::Json(bridge_json(&name, &spec, true))))
}

/// `DELETE /api/v1/bridges/{name}`: stops it (its channel stays).
async fn delete_bridge(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    if state.services.bridges.delete(&name).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(format!(
            "bridge '{name}' does not exist"
        )))
    }
}

/// The `/api/v1/channels` routes (weft's own API, admin keys): a read-only
/// listing of the channels with their subscribers and backlogs, which
/// DSPS's API does not have and the console's Channels screen shows.
pub fn listing_routes() -> Routes {
    Routes::new()
        .route("/api/v1/channels", get(Access::admin(Own), list_channels))
        .route(
            "/api/v1/channels/{id}",
            get(Access::admin(Own), get_channel),
        )
}

/// Channels a listing page holds when the client names no `limit`.
const DEFAULT_CHANNEL_PAGE: usize = 50;

/// Most channels one listing page may hold.
const MAX_CHANNEL_PAGE: usize = 1000;

/// A backlog as JSON: how many messages, when the oldest was published
/// (epoch ms) and its age in ms (`null`s when there are none).
fn backlog_json(b: &weft_store::ChannelBacklog, now: i64) -> serde_json::Value {
    json!({
        "messages": b.messages,
        "oldestMessageAt": b.oldest_published_at,
        "oldestMessageAgeMs": b.oldest_published_at.map(|t| (now - t).max(0)),
    })
}

/// A channel as the listing shows it.
fn channel_json(c: &weft_pipeline::channels::listing::ChannelView) -> serde_json::Value {
    let now = weft_model::now_ms();
    json!({
        "id": c.id,
        "head": c.head,
        "lastActive": c.last_active,
        "backlog": backlog_json(&c.backlog, now),
        "subscribers": c.subscribers.iter().map(|s| json!({
            "id": s.id,
            "type": "polling",
            "cursor": s.cursor,
            "lastSeen": s.last_seen,
            "backlog": backlog_json(&s.backlog, now),
        })).collect::<Vec<_>>(),
    })
}

/// `GET /api/v1/channels?limit=&offset=`: the channels this node holds,
/// ordered by id, `limit` (1–1000, default 50) from `offset`, each with
/// its polling subscribers and their backlogs; `X-Total-Count` says how
/// many channels there are. 400 for a bad `limit`/`offset` or an unknown
/// parameter.
async fn list_channels(
    State(state): State<AppState>,
    Query(params): Query<Vec<(String, String)>>,
) -> ApiResult<Response> {
    let (mut limit, mut offset) = (DEFAULT_CHANNEL_PAGE, 0);
    for (k, v) in params {
        match k.as_str() {
            "limit" => {
                limit = v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_CHANNEL_PAGE).contains(n))
                    .ok_or_else(|| {
                        ApiError::bad_request(format!(
                            "limit must be an integer from 1 to {MAX_CHANNEL_PAGE}, not '{v}'"
                        ))
                    })?
            }
            "offset" => {
                offset = v.parse::<usize>().map_err(|_| {
                    ApiError::bad_request(format!(
                        "offset must be a non-negative integer, not '{v}'"
                    ))
                })?
            }
            _ => return Err(ApiError::bad_request(format!("unknown parameter '{k}'"))),
        }
    }
    let page = state.services.channels.page(offset, limit).await?;
    let items: Vec<serde_json::Value> = page.channels.iter().map(channel_json).collect();
    Ok((
        [("x-total-count", page.total.to_string())],
        axum::Json(items),
    )
        .into_response())
}

/// `GET /api/v1/channels/{id}`: one channel with its subscribers and
/// backlogs; 404 when this node holds no such channel.
async fn get_channel(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<serde_json::Value>> {
    state
        .services
        .channels
        .describe(&id)
        .await?
        .map(|c| axum::Json(channel_json(&c)))
        .ok_or_else(|| ApiError::not_found(format!("channel '{id}' does not exist")))
}
