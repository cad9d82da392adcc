//! The live stream: `/api/v1/live` (websocket) and `/api/v1/live/sse`
//! (server-sent events). Clients subscribe to a stream (`data`, `alarms`,
//! `entities`) with a filter and receive each matching event as it is
//! published on the bus.
//!
//! A consumer that cannot keep up is disconnected with a `SlowConsumer`
//! error rather than slowing the pipeline or buffering without bound: the
//! bus buffers at most its stream capacity for it, and a send that stays
//! blocked longer than [`SEND_TIMEOUT`] ends the connection.
//!
//! A stream lasts only as long as the key it was opened with: revoking
//! the key, or its `expiresAt` passing, ends it with an `Unauthorized`
//! error ([`Keys::until_unusable`](weft_pipeline::keys::Keys::until_unusable)).

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::ws::{Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::IntoResponse;
use axum::Extension;
use futures::{SinkExt, Stream as FutStream, StreamExt};
use serde::Deserialize;
use serde_json::json;
use weft_bus::{Event, RecvError, Stream, Subscription};

use crate::auth::Principal;
use crate::routes::{get, Access, Routes, Scope};
use crate::{ApiError, ApiResult, AppState};

/// How long one websocket send may stay blocked on a client that does not
/// read before the client is cut off.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(5);

/// The largest message a client may send (a subscribe with its filter);
/// a larger one ends the connection instead of being buffered.
pub const MAX_CLIENT_MESSAGE: usize = 64 * 1024;

/// Most subscriptions one connection may hold at once, so one client
/// cannot make every event cost unbounded filter work.
pub const MAX_SUBSCRIPTIONS: usize = 100;

/// Most events written to a websocket before it is flushed, so a steady
/// stream is sent in bursts of at most this many frames rather than
/// waiting for the write buffer to fill.
const FLUSH_EVERY: usize = 64;

/// A client too far behind the stream's buffer.
const SLOW_BEHIND: Ending = ("SlowConsumer", "the client fell too far behind the stream");
/// A client that stopped reading.
const SLOW_READER: Ending = ("SlowConsumer", "the client did not read for 5 s");

/// The live routes: a read key of any tenant, each subscription held to
/// what the key may see ([`scope`]).
pub fn routes() -> Routes {
    Routes::new()
        .route("/api/v1/live", get(Access::read(Scope::Live), websocket))
        .route("/api/v1/live/sse", get(Access::read(Scope::Live), sse))
}

pub use weft_pipeline::filter::{EventFilter as Filter, FilterSpec};

/// A message a websocket client sends.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum ClientMessage {
    Subscribe {
        id: String,
        stream: String,
        #[serde(default)]
        filter: FilterSpec,
    },
    Unsubscribe {
        id: String,
    },
}

/// Holds a subscription to what the key it came with may see: `data`
/// and `alarms` are the default tenant's, for keys without a tenant or
/// service-path limit; `entities` are given the key's tenant and service
/// path when the filter names none, and refused when it names others.
/// `Err` is the `Forbidden` answer's text.
fn scope(
    principal: Option<&Principal>,
    stream: Stream,
    spec: &mut FilterSpec,
) -> Result<(), String> {
    let Some(key) = principal.map(Principal::key) else {
        return Ok(());
    };
    if key.is_global() {
        return Ok(());
    }
    if stream != Stream::Entities {
        if key.tenant.is_empty() && key.service_path.is_none() {
            return Ok(());
        }
        return Err(format!(
            "the '{}' stream is the default tenant's; this key is limited to a tenant or service path",
            stream.as_str()
        ));
    }
    match &spec.service {
        Some(s) if !s.eq_ignore_ascii_case(&key.tenant) => {
            return Err(format!("this key is limited to tenant '{}'", key.tenant));
        }
        Some(_) => {}
        None if !key.tenant.is_empty() => spec.service = Some(key.tenant.clone()),
        None => {}
    }
    if let Some(prefix) = &key.service_path {
        match &spec.service_path {
            Some(paths) => {
                if !paths
                    .split(',')
                    .all(|p| weft_model::apikey::path_within(prefix, p))
                {
                    return Err(format!(
                        "this key is limited to service path '{prefix}' and below"
                    ));
                }
            }
            None => spec.service_path = Some(format!("{prefix}/#")),
        }
    }
    Ok(())
}

/// `GET /api/v1/live`: upgrades to the subscription protocol.
async fn websocket(
    State(state): State<AppState>,
    principal: Option<Extension<Principal>>,
    ws: WebSocketUpgrade,
) -> impl IntoResponse {
    let runtime = state.live_runtime.clone();
    let principal = principal.map(|Extension(p)| p);
    // A subscription message is small; nobody needs to send megabytes.
    ws.max_message_size(MAX_CLIENT_MESSAGE)
        .max_frame_size(MAX_CLIENT_MESSAGE)
        .on_upgrade(move |socket| async move {
            runtime.spawn(serve_socket(state, principal, socket));
        })
}

fn control(kind: &str, id: Option<&str>) -> Message {
    Message::Text(json!({"type": kind, "id": id}).to_string().into())
}

fn error_message(id: Option<&str>, error: &str, description: &str) -> Message {
    Message::Text(
        json!({"type":"error","id":id,"error":error,"description":description})
            .to_string()
            .into(),
    )
}

/// The next event of an optional subscription; pending forever if absent.
async fn next_event(sub: &mut Option<Subscription>) -> Result<std::sync::Arc<Event>, RecvError> {
    match sub {
        Some(s) => s.recv().await,
        None => std::future::pending().await,
    }
}

/// One subscriber's frame: the event JSON spliced into the envelope
/// without re-serialising it.
fn event_frame(id: &str, event: &Event) -> Message {
    let mut s = String::with_capacity(event.json.len() + id.len() + 40);
    s.push_str("{\"type\":\"event\",\"id\":");
    s.push_str(&serde_json::to_string(id).expect("strings serialise"));
    s.push_str(",\"event\":");
    s.push_str(std::str::from_utf8(&event.json).unwrap_or("null"));
    s.push('}');
    Message::Text(Utf8Bytes::from(s))
}

/// One connection's hold on one stream: the bus subscription (only while
/// some client subscription wants the stream) and the client's
/// subscriptions on it, by id.
type StreamSubscriptions = (Option<Subscription>, Vec<(String, Filter)>);

/// Waits until the key a stream was opened with stops working (revoked
/// or expired) and says why; never, when there is no key (keys off).
fn key_ended(
    state: &AppState,
    principal: Option<&Principal>,
) -> impl std::future::Future<Output = &'static str> + Send + 'static {
    let keys = state.keys.clone();
    let key = principal.map(|p| p.key().clone());
    async move {
        match key {
            Some(key) => keys.until_unusable(&key).await.describe(),
            None => std::future::pending().await,
        }
    }
}

/// Why a websocket is closed by weft: the error name and description
/// sent to the client before the close.
type Ending = (&'static str, &'static str);

async fn serve_socket(state: AppState, principal: Option<Principal>, socket: WebSocket) {
    let (mut sink, mut source) = socket.split();
    let key_ended = key_ended(&state, principal.as_ref());
    tokio::pin!(key_ended);
    let bus = state.services.bus.clone();
    // Per stream: the bus subscription and the client's filters on it.
    let mut subs: HashMap<Stream, StreamSubscriptions> = Stream::ALL
        .iter()
        .map(|s| (*s, (None, Vec::new())))
        .collect();
    metrics::gauge!("weft_live_connections").increment(1.0);
    let reason: Option<Ending> = loop {
        let [data, alarms, entities] = Stream::ALL;
        let (mut d, mut a, mut e) = (
            subs.get_mut(&data).map(|x| x.0.take()).unwrap_or(None),
            subs.get_mut(&alarms).map(|x| x.0.take()).unwrap_or(None),
            subs.get_mut(&entities).map(|x| x.0.take()).unwrap_or(None),
        );
        let received = tokio::select! {
            why = &mut key_ended => break Some(("Unauthorized", why)),
            msg = source.next() => Err(msg),
            ev = next_event(&mut d) => Ok((data, ev)),
            ev = next_event(&mut a) => Ok((alarms, ev)),
            ev = next_event(&mut e) => Ok((entities, ev)),
        };
        subs.get_mut(&data).expect("all streams").0 = d;
        subs.get_mut(&alarms).expect("all streams").0 = a;
        subs.get_mut(&entities).expect("all streams").0 = e;

        match received {
            Ok((stream, Ok(event))) => {
                let (sub, filters) = subs.get_mut(&stream).expect("all streams");
                // Forward this event and whatever else is already buffered
                // (up to a bound), then flush once: one write per burst,
                // and never more than FLUSH_EVERY events held back.
                let mut next = Some(event);
                let mut forwarded = 0;
                let mut lagged = false;
                let mut failed = false;
                while let Some(event) = next.take() {
                    for (id, filter) in filters.iter() {
                        if filter.matches(&event)
                            && sink.feed(event_frame(id, &event)).await.is_err()
                        {
                            failed = true;
                        }
                    }
                    forwarded += 1;
                    let Some(s) = sub.as_mut() else { break };
                    if failed || forwarded >= FLUSH_EVERY || s.backlog() == 0 {
                        break;
                    }
                    match s.recv().await {
                        Ok(e) => next = Some(e),
                        Err(RecvError::Lagged(_)) => lagged = true,
                        Err(RecvError::Closed) => {}
                    }
                }
                if failed {
                    break None;
                }
                if lagged {
                    break Some(SLOW_BEHIND);
                }
                match tokio::time::timeout(SEND_TIMEOUT, sink.flush()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => break None,
                    Err(_) => break Some(SLOW_READER),
                }
            }
            Ok((_, Err(RecvError::Lagged(_)))) => break Some(SLOW_BEHIND),
            Ok((_, Err(RecvError::Closed))) => break None,
            Err(None) | Err(Some(Err(_))) => break None,
            Err(Some(Ok(msg))) => {
                let text = match msg {
                    Message::Text(t) => t,
                    Message::Close(_) => break None,
                    _ => continue,
                };
                let reply = match serde_json::from_str::<ClientMessage>(&text) {
                    Err(e) => error_message(None, "BadRequest", &format!("invalid message: {e}")),
                    Ok(ClientMessage::Subscribe {
                        id,
                        stream,
                        mut filter,
                    }) => {
                        let scoped = match Stream::parse(&stream) {
                            Some(s) => scope(principal.as_ref(), s, &mut filter),
                            None => Ok(()),
                        };
                        match (Stream::parse(&stream), scoped.map(|()| Filter::new(filter))) {
                            (_, Err(denied)) => error_message(Some(&id), "Forbidden", &denied),
                            (None, _) => error_message(
                                Some(&id),
                                "BadRequest",
                                &format!("unknown stream '{stream}'"),
                            ),
                            (_, Ok(Err(e))) => error_message(Some(&id), "BadRequest", &e),
                            (Some(_), Ok(Ok(_)))
                                if subs.values().map(|(_, f)| f.len()).sum::<usize>()
                                    >= MAX_SUBSCRIPTIONS
                                    && !subs
                                        .values()
                                        .any(|(_, f)| f.iter().any(|(i, _)| i == &id)) =>
                            {
                                error_message(
                                    Some(&id),
                                    "TooManySubscriptions",
                                    &format!(
                                        "a connection holds at most {MAX_SUBSCRIPTIONS} subscriptions; unsubscribe one first"
                                    ),
                                )
                            }
                            (Some(stream), Ok(Ok(filter))) => {
                                for (_, filters) in subs.values_mut() {
                                    filters.retain(|(i, _)| i != &id);
                                }
                                let entry = subs.get_mut(&stream).expect("all streams");
                                if entry.0.is_none() {
                                    entry.0 = Some(bus.subscribe(stream));
                                }
                                entry.1.push((id.clone(), filter));
                                control("subscribed", Some(&id))
                            }
                        }
                    }
                    Ok(ClientMessage::Unsubscribe { id }) => {
                        for (sub, filters) in subs.values_mut() {
                            filters.retain(|(i, _)| i != &id);
                            if filters.is_empty() {
                                *sub = None;
                            }
                        }
                        control("unsubscribed", Some(&id))
                    }
                };
                if sink.send(reply).await.is_err() {
                    break None;
                }
            }
        }
    };
    if let Some((error, reason)) = reason {
        if error == SLOW_BEHIND.0 {
            metrics::counter!("weft_live_slow_consumers_total").increment(1);
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            let _ = sink.send(error_message(None, error, reason)).await;
            let _ = sink.close().await;
        })
        .await;
    }
    metrics::gauge!("weft_live_connections").decrement(1.0);
}

/// Query parameters of the SSE endpoint; lists are comma-separated.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SseParams {
    stream: String,
    channels: Option<String>,
    devices: Option<String>,
    types: Option<String>,
    q: Option<String>,
    service: Option<String>,
    #[serde(rename = "servicePath")]
    service_path: Option<String>,
    /// The API key, for clients (browsers' `EventSource`) that cannot
    /// send headers; read by [`crate::auth`], ignored here.
    #[allow(dead_code)]
    access_token: Option<String>,
}

fn list(s: Option<String>) -> Vec<String> {
    s.map(|s| {
        s.split(',')
            .filter(|x| !x.is_empty())
            .map(str::to_string)
            .collect()
    })
    .unwrap_or_default()
}

/// `GET /api/v1/live/sse?stream=data&channels=…`: the same events as
/// server-sent events (`event: data`, `data: <json>`). A lagging client
/// gets `event: error` and the stream ends.
async fn sse(
    State(state): State<AppState>,
    principal: Option<Extension<Principal>>,
    params: Result<Query<SseParams>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Sse<impl FutStream<Item = Result<SseEvent, Infallible>>>> {
    let Query(p) = params.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let stream = Stream::parse(&p.stream)
        .ok_or_else(|| ApiError::bad_request(format!("unknown stream '{}'", p.stream)))?;
    let mut spec = FilterSpec {
        channels: list(p.channels),
        devices: list(p.devices),
        types: list(p.types),
        q: p.q,
        service: p.service,
        service_path: p.service_path,
    };
    scope(principal.as_ref().map(|Extension(p)| p), stream, &mut spec)
        .map_err(|denied| ApiError::new(axum::http::StatusCode::FORBIDDEN, "Forbidden", denied))?;
    let filter = Filter::new(spec).map_err(ApiError::bad_request)?;
    let sub = state.services.bus.subscribe(stream);
    let ended = Box::pin(key_ended(&state, principal.as_ref().map(|Extension(p)| p)));
    let events = futures::stream::unfold(Some((sub, filter, ended)), move |state| async move {
        let (mut sub, filter, mut ended) = state?;
        loop {
            let received = tokio::select! {
                why = &mut ended => {
                    let ev = SseEvent::default()
                        .event("error")
                        .data(json!({"error":"Unauthorized","description":why}).to_string());
                    return Some((Ok(ev), None));
                }
                received = sub.recv() => received,
            };
            match received {
                Ok(event) if filter.matches(&event) => {
                    let data = std::str::from_utf8(&event.json)
                        .unwrap_or("null")
                        .to_string();
                    let ev = SseEvent::default().event(stream.as_str()).data(data);
                    return Some((Ok(ev), Some((sub, filter, ended))));
                }
                Ok(_) => continue,
                Err(RecvError::Lagged(_)) => {
                    let ev = SseEvent::default()
                        .event("error")
                        .data(json!({"error":"SlowConsumer","description":"the client fell too far behind the stream"}).to_string());
                    return Some((Ok(ev), None));
                }
                Err(RecvError::Closed) => return None,
            }
        }
    });
    Ok(Sse::new(events).keep_alive(KeepAlive::default()))
}
