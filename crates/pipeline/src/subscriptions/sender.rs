//! The notification sender: HTTP requests out, outcomes back onto the
//! subscriptions, and nothing ever waits for an endpoint except that
//! endpoint's own queue.
//!
//! Every endpoint (scheme, host and port) gets [`SenderConfig::lanes`]
//! lanes; each lane is a bounded queue drained by one task over one
//! keep-alive connection, one request at a time. A subscription always
//! uses the same lane, so its notifications arrive in the order they were
//! triggered; different subscriptions to one endpoint are spread over the
//! lanes and sent in parallel. A slow or dead endpoint fills only its own
//! lanes. When a lane is full, what happens depends on the endpoint's
//! health: an endpoint that answers is only slower than the updates, so
//! the change that triggered the notification waits for room (up to the
//! notification timeout) and updates slow down to what notifications can
//! carry, losing nothing; an endpoint whose last request failed gets no
//! such wait: the notification fails at once (counted on the subscription
//! as `lastFailureReason`), so a dead endpoint never holds anything up and
//! memory stays bounded.
//!
//! Nothing is lost either way: a notification that fails, or finds no
//! room, hands its subscription over to the outbox ([`super::outbox`]),
//! which serves it from the change log, in order, retrying with backoff,
//! until it has caught up; the subscription's notifications still queued
//! here are then dropped unsent (they belong to an older generation).

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use parking_lot::Mutex;
use tokio::sync::mpsc;

use super::{Entry, Subscriptions};

/// The most of a notification's answer read (and dropped) so the
/// connection can be reused; a longer answer closes it.
const MAX_ANSWER_BYTES: usize = 64 << 10;

/// How notifications are sent.
#[derive(Debug, Clone)]
pub struct SenderConfig {
    /// Timeout of a notification request when the subscription sets none.
    pub timeout: Duration,
    /// Parallel connections (lanes) per endpoint.
    pub lanes: usize,
    /// Notifications queued per lane before new ones fail.
    pub lane_capacity: usize,
    /// Whether HTTP notifications carry [`NOTIFICATION_ID_HEADER`].
    pub id_header: bool,
    /// How long a change stays in the change log for subscriptions that
    /// have not been served it (a receiver down for longer misses it).
    pub retention: Duration,
    /// The most changes of the log a subscription served from it may be
    /// behind; the older ones are skipped (and counted).
    pub max_owed: u64,
}

/// The header that names a notification: the same for every attempt and
/// every replay of it, so a receiver can drop the duplicates that
/// at-least-once delivery may bring (`<subscription id>-<seq>`, with the
/// node between them in a cluster).
pub const NOTIFICATION_ID_HEADER: &str = "Weft-Notification-Id";

impl Default for SenderConfig {
    fn default() -> Self {
        SenderConfig {
            timeout: Duration::from_secs(5),
            lanes: 8,
            lane_capacity: 512,
            id_header: true,
            retention: Duration::from_secs(24 * 3600),
            max_owed: 1_000_000,
        }
    }
}

/// A rendered notification request.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// HTTP method.
    pub method: hyper::Method,
    /// Full URL, query string included.
    pub url: String,
    /// Headers, in order.
    pub headers: Vec<(String, String)>,
    /// Body (none for an empty custom payload).
    pub body: Option<Bytes>,
    /// For an `mqtt`/`mqttCustom` subscription: publish the body on this
    /// topic of the broker at `url` instead of making an HTTP request
    /// (`method` and `headers` are then unused).
    pub mqtt: Option<Box<super::mqtt::Publish>>,
}

/// A notification on its way.
pub struct Job {
    /// What to send.
    pub request: Request,
    /// The subscription's timeout (ms), if it sets one.
    pub timeout: Option<u64>,
    /// Picks the lane (the subscription id), so one subscription's
    /// notifications stay in order.
    pub lane_key: String,
    /// Where the outcome is recorded.
    pub entry: Arc<Entry>,
    /// The change it notifies (its place in the change log).
    pub seq: u64,
    /// The subscription's delivery generation when it was triggered: a
    /// job of an older one (the subscription went to the outbox since) is
    /// dropped unsent.
    pub generation: u64,
}

/// How a notification ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The endpoint answered with this status (any status: Orion counts an
    /// answered notification as sent, and reports the code).
    Answered(u16),
    /// Published to an MQTT broker (no status code: Orion sets no
    /// `lastSuccessCode` for MQTT).
    Published,
    /// No answer: why (Orion's/curl's words where they exist).
    Failed(String),
}

/// One endpoint's lanes and health.
struct Endpoint {
    lanes: Vec<mpsc::Sender<Job>>,
    /// Consecutive failed requests (0: the endpoint answers).
    failures: AtomicU64,
}

/// What [`Sender::enqueue`] did with a notification.
pub enum Enqueued {
    /// Queued on its lane.
    Queued,
    /// Parked behind the subscription's earlier notifications waiting for
    /// room (its lane is full, its endpoint healthy): the caller should
    /// wait until they are queued ([`Sender::drain`]).
    Parked,
    /// Not queued (the job is handed back), for this reason.
    Refused(Box<Job>, String),
}

/// The HTTP client of notifications (see [`crate::outbound`]).
type HttpClient = crate::outbound::NotificationClient;

/// The lanes of all endpoints.
pub struct Sender {
    config: SenderConfig,
    client: HttpClient,
    /// Connections to the brokers of MQTT subscriptions.
    mqtt: Arc<super::mqtt::Pool>,
    endpoints: Mutex<HashMap<String, Arc<Endpoint>>>,
    /// Where outcomes go.
    owner: Weak<Subscriptions>,
    runtime: tokio::runtime::Handle,
}

impl Sender {
    /// A sender whose lane tasks run on the current runtime.
    pub(crate) fn new(config: SenderConfig, owner: Weak<Subscriptions>) -> Sender {
        let client = crate::outbound::notification_client(config.lanes.max(1));
        Sender {
            config,
            client,
            mqtt: Arc::default(),
            endpoints: Mutex::new(HashMap::new()),
            owner,
            runtime: tokio::runtime::Handle::current(),
        }
    }

    /// The endpoint and lane of a job.
    fn lane(&self, job: &Job) -> Result<(Arc<Endpoint>, mpsc::Sender<Job>), String> {
        let key = endpoint_of(&job.request.url)
            .ok_or_else(|| "Invalid URL parsing notification url".to_string())?;
        let endpoint = {
            let mut endpoints = self.endpoints.lock();
            endpoints
                .entry(key)
                .or_insert_with(|| self.start_endpoint())
                .clone()
        };
        let mut h = std::collections::hash_map::DefaultHasher::new();
        job.lane_key.hash(&mut h);
        let lane = endpoint.lanes[(h.finish() as usize) % endpoint.lanes.len()].clone();
        Ok((endpoint, lane))
    }

    /// Queues a notification on its endpoint's lane without waiting, or
    /// parks it behind the subscription's notifications already waiting
    /// for room, so they stay in order.
    pub fn enqueue(&self, job: Job) -> Enqueued {
        let (endpoint, lane) = match self.lane(&job) {
            Ok(l) => l,
            Err(reason) => return Enqueued::Refused(Box::new(job), reason),
        };
        let entry = job.entry.clone();
        let mut parked = entry.parked.lock();
        if !parked.is_empty() {
            parked.push_back(job);
            return Enqueued::Parked;
        }
        match lane.try_send(job) {
            Ok(()) => Enqueued::Queued,
            Err(mpsc::error::TrySendError::Full(job)) => {
                if endpoint.failures.load(Ordering::Relaxed) == 0 {
                    parked.push_back(job);
                    Enqueued::Parked
                } else {
                    Enqueued::Refused(Box::new(job), "notification queue full".into())
                }
            }
            Err(mpsc::error::TrySendError::Closed(job)) => {
                Enqueued::Refused(Box::new(job), "notification sender stopped".into())
            }
        }
    }

    /// Moves `entry`'s parked notifications onto their lane, in order,
    /// waiting for room up to the notification timeout each; if there is
    /// none by then, the subscription is served from the log instead and
    /// the parked notifications are dropped (the log sends them).
    pub async fn drain(&self, entry: &Arc<Entry>) {
        // One drainer at a time per subscription: the order of the lane is
        // the order of the parked queue.
        let _draining = entry.draining.lock().await;
        loop {
            let Some(lane) = entry
                .parked
                .lock()
                .front()
                .map(|job| self.lane(job).map(|(_, lane)| lane))
            else {
                return;
            };
            let permit = match lane {
                Ok(lane) => tokio::time::timeout(self.config.timeout, lane.reserve_owned()).await,
                Err(_) => Ok(Err(mpsc::error::SendError(()))),
            };
            let mut parked = entry.parked.lock();
            match permit {
                Ok(Ok(permit)) => {
                    if let Some(job) = parked.pop_front() {
                        permit.send(job);
                    }
                }
                _ => {
                    let first = parked.pop_front();
                    parked.clear();
                    drop(parked);
                    if let (Some(job), Some(owner)) = (first, self.owner.upgrade()) {
                        owner.refused(&job.entry, &job, "notification queue full".into());
                    }
                    return;
                }
            }
        }
    }

    /// Sends one notification now, outside the lanes (the outbox's
    /// replays, one at a time per subscription), and answers how it went.
    pub(crate) async fn send_now(&self, request: Request, timeout: Option<u64>) -> Outcome {
        let timeout = timeout
            .map(Duration::from_millis)
            .unwrap_or(self.config.timeout);
        transmit(&self.client, &self.mqtt, request, timeout).await
    }

    /// How the sender was configured.
    pub(crate) fn config(&self) -> &SenderConfig {
        &self.config
    }

    fn start_endpoint(&self) -> Arc<Endpoint> {
        let mut receivers = Vec::new();
        let lanes = (0..self.config.lanes.max(1))
            .map(|_| {
                let (tx, rx) = mpsc::channel(self.config.lane_capacity.max(1));
                receivers.push(rx);
                tx
            })
            .collect();
        let endpoint = Arc::new(Endpoint {
            lanes,
            failures: AtomicU64::new(0),
        });
        for rx in receivers {
            self.runtime.spawn(lane(
                rx,
                self.client.clone(),
                self.mqtt.clone(),
                self.config.timeout,
                self.owner.clone(),
                Arc::downgrade(&endpoint),
            ));
        }
        endpoint
    }
}

/// Drains one lane: one request at a time, outcomes recorded on the
/// subscription and on the endpoint's health.
async fn lane(
    mut rx: mpsc::Receiver<Job>,
    client: HttpClient,
    mqtt: Arc<super::mqtt::Pool>,
    default_timeout: Duration,
    owner: Weak<Subscriptions>,
    endpoint: std::sync::Weak<Endpoint>,
) {
    while let Some(job) = rx.recv().await {
        if !job.entry.in_generation(job.generation) {
            // The subscription went to the outbox since: it sends this.
            if let Some(owner) = owner.upgrade() {
                owner.superseded(&job.entry, job.seq);
            }
            continue;
        }
        let timeout = job
            .timeout
            .map(Duration::from_millis)
            .unwrap_or(default_timeout);
        let outcome = transmit(&client, &mqtt, job.request, timeout).await;
        let failed = matches!(outcome, Outcome::Failed(_));
        if let Some(endpoint) = endpoint.upgrade() {
            if failed {
                endpoint.failures.fetch_add(1, Ordering::Relaxed);
            } else {
                endpoint.failures.store(0, Ordering::Relaxed);
            }
        }
        if failed {
            metrics::counter!("weft_notifications_failed_total").increment(1);
        } else {
            metrics::counter!("weft_notifications_sent_total").increment(1);
        }
        if let Some(owner) = owner.upgrade() {
            owner.settled(&job.entry, job.seq, job.generation, outcome);
        }
    }
}

/// Sends one request, over MQTT or HTTP as it says.
async fn transmit(
    client: &HttpClient,
    mqtt: &super::mqtt::Pool,
    request: Request,
    timeout: Duration,
) -> Outcome {
    match &request.mqtt {
        Some(publish) => {
            let payload = request.body.clone().unwrap_or_default().to_vec();
            match mqtt.publish(&request.url, publish, payload, timeout).await {
                Ok(()) => Outcome::Published,
                Err(reason) => Outcome::Failed(reason),
            }
        }
        None => send(client, request, timeout).await,
    }
}

/// Sends one request; any answer is [`Outcome::Answered`], no answer
/// within `timeout` (connecting, sending and reading included) a failure
/// in curl's words, as Orion reports it.
async fn send(client: &HttpClient, request: Request, timeout: Duration) -> Outcome {
    let invalid_url = || Outcome::Failed("Invalid URL parsing notification url".into());
    // `url` escapes what a URI may not hold (spaces, non-ASCII ids spliced
    // in by macros) before hyper reads it.
    let Some(uri) = url::Url::parse(&request.url)
        .ok()
        .and_then(|u| u.as_str().parse::<hyper::Uri>().ok())
    else {
        return invalid_url();
    };
    let mut builder = hyper::Request::builder().method(request.method).uri(uri);
    for (name, value) in &request.headers {
        builder = builder.header(name.as_str(), value.as_str());
    }
    let Ok(req) = builder.body(Full::new(request.body.unwrap_or_default())) else {
        return Outcome::Failed("invalid header in notification".into());
    };
    let exchange = async {
        let resp = client.request(req).await?;
        let code = resp.status().as_u16();
        // Read the body so the connection can be reused; one longer than
        // weft reads of an answer nobody looks at ends the connection.
        let _ = http_body_util::Limited::new(resp.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await;
        Ok::<u16, hyper_util::client::legacy::Error>(code)
    };
    match tokio::time::timeout(timeout, exchange).await {
        Err(_) => Outcome::Failed("Timeout was reached".into()),
        Ok(Ok(code)) => Outcome::Answered(code),
        Ok(Err(e)) if e.is_connect() => Outcome::Failed("Couldn't connect to server".into()),
        Ok(Err(e)) => Outcome::Failed(e.to_string()),
    }
}

/// `scheme://authority` of a URL: the key of its endpoint.
fn endpoint_of(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    if authority.is_empty() {
        return None;
    }
    Some(format!("{scheme}://{authority}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_scheme_and_authority() {
        assert_eq!(
            endpoint_of("http://127.0.0.1:9997/notify?x=1").as_deref(),
            Some("http://127.0.0.1:9997")
        );
        assert_eq!(endpoint_of("https://h/a").as_deref(), Some("https://h"));
        assert_eq!(endpoint_of("localhost:1234"), None);
        assert_eq!(endpoint_of("http:///x"), None);
    }
}
