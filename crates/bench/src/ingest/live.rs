//! The websocket subscriber: watches `/api/v1/live` for this run's channel
//! and records which data units arrived, how often, and how long after
//! their uplink was stamped (`time_lapse`, the seed's availability metric).
//!
//! At 20,000+ events per second the reader must stay cheap or the server
//! will (rightly) disconnect it as a slow consumer: each event is parsed
//! into a borrowed struct holding only `dataId` and `reportedAt`, the
//! dataId is kept as a 128-bit integer, and nothing else is allocated.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use futures::{SinkExt, StreamExt};
use hdrhistogram::Histogram;
use serde::Deserialize;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;
use uuid::Uuid;

use crate::summary::micros_histogram;
use crate::target::BaseUrl;

/// How long the server may take to confirm the subscription.
const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(10);

/// The `time_lapse` histogram's range; a unit later than this is clamped
/// (and the run is hopeless anyway).
const TIME_LAPSE_RANGE: Duration = Duration::from_secs(3600);

/// The subscription id the bench uses.
const SUBSCRIPTION: &str = "s1";

/// A server message, reduced to the fields the bench reads.
#[derive(Deserialize)]
struct Frame<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default, borrow)]
    event: Option<EventHead<'a>>,
    #[serde(default, borrow)]
    error: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    description: Option<Cow<'a, str>>,
}

/// The fields of an event the checks need; the rest is skipped. A data
/// unit has `dataId`, `reportedAt` and `receivedAt`; an alarm event has
/// `dataIds` (the triggering unit last), `updatedAt` (when the alarm was
/// raised or updated) and the bench rule's description
/// `<dataId>;<reportedAt>;<device>`.
#[derive(Deserialize)]
struct EventHead<'a> {
    #[serde(rename = "dataId", borrow, default)]
    data_id: Cow<'a, str>,
    #[serde(rename = "reportedAt", default)]
    reported_at: i64,
    /// When the server accepted the uplink; splits `time_lapse` into the
    /// request's share and the pipeline-to-socket share.
    #[serde(rename = "receivedAt", default)]
    received_at: i64,
    #[serde(rename = "dataIds", borrow, default)]
    data_ids: Vec<Cow<'a, str>>,
    #[serde(rename = "updatedAt", default)]
    updated_at: i64,
    #[serde(borrow, default)]
    description: Cow<'a, str>,
}

impl EventHead<'_> {
    /// Reads an alarm event as the unit that triggered it: its dataId,
    /// its `reportedAt` (from the description) and, in place of
    /// `receivedAt`, when the alarm changed.
    fn as_alarm(&mut self) {
        if let Some(last) = self.data_ids.pop() {
            self.data_id = last;
        }
        self.reported_at = self
            .description
            .split(';')
            .nth(1)
            .and_then(|t| t.parse().ok())
            .unwrap_or(self.updated_at);
        self.received_at = self.updated_at;
    }
}

/// What a subscriber watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watched {
    /// Data units of one channel.
    Data,
    /// Alarm events of one alarm type.
    Alarms,
}

/// What the subscriber saw, read by the scenario while draining and at the end.
#[derive(Debug)]
pub struct LiveState {
    /// Times each dataId was received.
    pub seen: HashMap<u128, u32>,
    /// `time_lapse` in microseconds (from millisecond clocks).
    pub time_lapse: Histogram<u64>,
    /// Socket receive time − the unit's `receivedAt` (server accepted it),
    /// in microseconds: `time_lapse` without the request's own latency.
    pub delivery_lapse: Histogram<u64>,
    /// Every message received, including the subscription confirmation.
    pub messages: u64,
    /// Events whose dataId is not a uuid (so cannot be one of ours).
    pub foreign: u64,
    /// Why the socket ended early, when it did (`SlowConsumer: …`).
    pub failure: Option<String>,
}

/// The runtime running live subscribers: one dedicated worker thread.
fn live_runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("bench-live")
            .enable_all()
            .build()
            .expect("the live subscriber runtime starts")
    })
}

/// A running subscription.
pub struct Live {
    state: Arc<Mutex<LiveState>>,
    /// Events received so far, for the progress bar without taking the lock.
    events: Arc<AtomicU64>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Live {
    /// Connects, subscribes to `channel`'s data units, and returns once
    /// the server confirmed the subscription — so no uplink sent after
    /// this can be missed for want of a subscriber.
    ///
    /// The socket and its reader live on a runtime of their own (one
    /// thread), so each event is stamped when it arrives rather than when
    /// the load generator's busy runtime gets round to it: otherwise the
    /// generator's own scheduling delay would be counted as `time_lapse`.
    pub async fn subscribe(base: &BaseUrl, channel: &str) -> anyhow::Result<Live> {
        let filter = serde_json::json!({"channels": [channel]});
        Live::subscribe_to(base, Watched::Data, filter).await
    }

    /// Like [`Live::subscribe`], for the alarm events of `alarm_type`:
    /// each is recorded under the dataId of the unit that triggered it,
    /// with `time_lapse` measured from that unit's `reportedAt` (the seed's
    /// `time_lapse_full`) and `delivery_lapse` from the alarm's change (the
    /// seed's alarm `time_lapse`).
    pub async fn subscribe_alarms(base: &BaseUrl, alarm_type: &str) -> anyhow::Result<Live> {
        let filter = serde_json::json!({"types": [alarm_type]});
        Live::subscribe_to(base, Watched::Alarms, filter).await
    }

    async fn subscribe_to(
        base: &BaseUrl,
        watched: Watched,
        filter: serde_json::Value,
    ) -> anyhow::Result<Live> {
        let url = base.ws_url("/api/v1/live");
        live_runtime()
            .spawn(async move { Live::connect(url, watched, filter).await })
            .await
            .map_err(|e| anyhow!("the live subscriber task failed: {e}"))?
    }

    async fn connect(
        url: String,
        watched: Watched,
        filter: serde_json::Value,
    ) -> anyhow::Result<Live> {
        let (mut ws, _) = tokio::time::timeout(
            SUBSCRIBE_TIMEOUT,
            tokio_tungstenite::connect_async_with_config(url.as_str(), None, true),
        )
        .await
        .map_err(|_| {
            anyhow!(
                "{url}: no websocket handshake within {}s",
                SUBSCRIBE_TIMEOUT.as_secs()
            )
        })?
        .with_context(|| format!("opening {url}"))?;
        let request = serde_json::json!({
            "type": "subscribe",
            "id": SUBSCRIPTION,
            "stream": match watched {
                Watched::Data => "data",
                Watched::Alarms => "alarms",
            },
            "filter": filter,
        });
        ws.send(Message::text(request.to_string()))
            .await
            .context("sending the subscription")?;
        let mut messages = 0;
        let confirmed = tokio::time::timeout(SUBSCRIBE_TIMEOUT, async {
            while let Some(msg) = ws.next().await {
                let msg = msg.context("reading the subscription reply")?;
                let Message::Text(text) = msg else { continue };
                messages += 1;
                let frame: Frame = serde_json::from_str(&text)
                    .with_context(|| format!("unexpected message {:?}", text.as_str()))?;
                match frame.kind.as_ref() {
                    "subscribed" => return Ok(()),
                    "error" => bail!(
                        "subscription refused: {}: {}",
                        frame.error.unwrap_or_default(),
                        frame.description.unwrap_or_default()
                    ),
                    _ => continue,
                }
            }
            bail!("the server closed the websocket before confirming the subscription")
        })
        .await
        .map_err(|_| {
            anyhow!(
                "no 'subscribed' reply within {}s",
                SUBSCRIBE_TIMEOUT.as_secs()
            )
        })?;
        confirmed?;

        let state = Arc::new(Mutex::new(LiveState {
            seen: HashMap::new(),
            time_lapse: micros_histogram(TIME_LAPSE_RANGE),
            delivery_lapse: micros_histogram(TIME_LAPSE_RANGE),
            messages,
            foreign: 0,
            failure: None,
        }));
        let events = Arc::new(AtomicU64::new(0));
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(read_events(
            ws,
            watched,
            state.clone(),
            events.clone(),
            stopped,
        ));
        Ok(Live {
            state,
            events,
            stop: Some(stop),
            task,
        })
    }

    /// Events received so far.
    pub fn events(&self) -> u64 {
        self.events.load(Ordering::Relaxed)
    }

    /// The state so far; the reader waits while it is held, so keep it short.
    pub fn lock(&self) -> MutexGuard<'_, LiveState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stops reading, closes the socket, and returns what was seen.
    pub async fn finish(mut self) -> LiveState {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), &mut self.task).await;
        self.task.abort();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::replace(
            &mut *state,
            LiveState {
                seen: HashMap::new(),
                time_lapse: micros_histogram(TIME_LAPSE_RANGE),
                delivery_lapse: micros_histogram(TIME_LAPSE_RANGE),
                messages: 0,
                foreign: 0,
                failure: None,
            },
        )
    }
}

/// The reader task: records every event until told to stop or the socket ends.
async fn read_events<S>(
    mut ws: tokio_tungstenite::WebSocketStream<S>,
    watched: Watched,
    state: Arc<Mutex<LiveState>>,
    events: Arc<AtomicU64>,
    mut stopped: oneshot::Receiver<()>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let failure = loop {
        let msg = tokio::select! {
            _ = &mut stopped => {
                let _ = ws.close(None).await;
                return;
            }
            msg = ws.next() => msg,
        };
        let text = match msg {
            Some(Ok(Message::Text(text))) => text,
            Some(Ok(Message::Close(frame))) => {
                break Some(match frame {
                    Some(f) => format!(
                        "the server closed the live socket ({}: {})",
                        f.code, f.reason
                    ),
                    None => "the server closed the live socket".to_string(),
                });
            }
            Some(Ok(_)) => continue, // ping/pong/binary: tungstenite answers pings itself
            Some(Err(e)) => break Some(format!("live socket error: {e}")),
            None => break Some("the live socket ended".to_string()),
        };
        let received_ms = now_ms();
        let frame: Frame = match serde_json::from_str(&text) {
            Ok(frame) => frame,
            Err(e) => {
                let mut st = lock(&state);
                st.messages += 1;
                st.failure
                    .get_or_insert_with(|| format!("unreadable live message ({e})"));
                continue;
            }
        };
        let mut st = lock(&state);
        st.messages += 1;
        match frame.kind.as_ref() {
            "event" => {
                let Some(mut event) = frame.event else {
                    continue;
                };
                if watched == Watched::Alarms {
                    event.as_alarm();
                }
                events.fetch_add(1, Ordering::Relaxed);
                match Uuid::try_parse(&event.data_id) {
                    Ok(id) => *st.seen.entry(id.as_u128()).or_insert(0) += 1,
                    Err(_) => st.foreign += 1,
                }
                let lapse_ms = (received_ms - event.reported_at).max(0) as u64;
                st.time_lapse.saturating_record(lapse_ms * 1000);
                let delivery_ms = (received_ms - event.received_at).max(0) as u64;
                st.delivery_lapse.saturating_record(delivery_ms * 1000);
            }
            "error" => {
                // e.g. SlowConsumer: the server is about to drop us.
                let reason = format!(
                    "the server sent {}: {}",
                    frame.error.as_deref().unwrap_or("an error"),
                    frame.description.as_deref().unwrap_or("")
                );
                st.failure.get_or_insert(reason);
            }
            _ => {}
        }
    };
    if let Some(reason) = failure {
        lock(&state).failure.get_or_insert(reason);
    }
}

fn lock(state: &Mutex<LiveState>) -> MutexGuard<'_, LiveState> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

/// Wall-clock epoch milliseconds, the clock `reportedAt` is stamped with.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_only_what_it_needs() {
        let text = r#"{"type":"event","id":"s1","event":{"dataId":"0e1c6ab8-1111-4222-8333-444455556666","reportedAt":1700000000123,"receivedAt":1700000000125,"channel":"c","device":{"id":"x","name":"P1","records":{"a":"b"}},"measures":{"temperature":{"celsius":37},"airHumidity":{"relativePercentage":61}}}}"#;
        let f: Frame = serde_json::from_str(text).unwrap();
        assert_eq!(f.kind, "event");
        let e = f.event.unwrap();
        assert_eq!(e.data_id, "0e1c6ab8-1111-4222-8333-444455556666");
        assert!(matches!(e.data_id, Cow::Borrowed(_)));
        assert_eq!(e.reported_at, 1_700_000_000_123);

        let f: Frame = serde_json::from_str(
            r#"{"type":"error","id":null,"error":"SlowConsumer","description":"too slow"}"#,
        )
        .unwrap();
        assert_eq!(f.kind, "error");
        assert_eq!(f.error.as_deref(), Some("SlowConsumer"));
        assert_eq!(f.description.as_deref(), Some("too slow"));

        let f: Frame = serde_json::from_str(r#"{"type":"subscribed","id":"s1"}"#).unwrap();
        assert_eq!(f.kind, "subscribed");
        assert!(f.event.is_none());
    }
}
