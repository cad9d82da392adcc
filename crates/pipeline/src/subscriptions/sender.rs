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
//! lanes: when a lane is full the notification fails at once (counted on
//! the subscription as `lastFailureReason`), so memory stays bounded and
//! the change that triggered it is never delayed.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::mpsc;

use super::{Dirty, Entry};

/// How notifications are sent.
#[derive(Debug, Clone)]
pub struct SenderConfig {
    /// Timeout of a notification request when the subscription sets none.
    pub timeout: Duration,
    /// Parallel connections (lanes) per endpoint.
    pub lanes: usize,
    /// Notifications queued per lane before new ones fail.
    pub lane_capacity: usize,
}

impl Default for SenderConfig {
    fn default() -> Self {
        SenderConfig {
            timeout: Duration::from_secs(5),
            lanes: 8,
            lane_capacity: 10_000,
        }
    }
}

/// A rendered notification request.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// HTTP method.
    pub method: reqwest::Method,
    /// Full URL, query string included.
    pub url: String,
    /// Headers, in order.
    pub headers: Vec<(String, String)>,
    /// Body (none for an empty custom payload).
    pub body: Option<Bytes>,
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
}

/// How a notification ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The endpoint answered with this status (any status: Orion counts an
    /// answered notification as sent, and reports the code).
    Answered(u16),
    /// No answer: why (Orion's/curl's words where they exist).
    Failed(String),
}

/// The lanes of all endpoints.
pub struct Sender {
    config: SenderConfig,
    client: reqwest::Client,
    endpoints: Mutex<HashMap<String, Arc<Vec<mpsc::Sender<Job>>>>>,
    dirty: Arc<Dirty>,
    runtime: tokio::runtime::Handle,
}

impl Sender {
    /// A sender whose lane tasks run on the current runtime.
    pub(crate) fn new(config: SenderConfig, dirty: Arc<Dirty>) -> Sender {
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(config.lanes.max(1))
            .tcp_nodelay(true)
            .build()
            .expect("the HTTP client builds");
        Sender {
            config,
            client,
            endpoints: Mutex::new(HashMap::new()),
            dirty,
            runtime: tokio::runtime::Handle::current(),
        }
    }

    /// Queues a notification on its endpoint's lane; never waits. `Err`
    /// says why it was not queued.
    pub fn enqueue(&self, job: Job) -> Result<(), String> {
        let endpoint = endpoint_of(&job.request.url)
            .ok_or_else(|| "Invalid URL parsing notification url".to_string())?;
        let lanes = {
            let mut endpoints = self.endpoints.lock();
            endpoints
                .entry(endpoint)
                .or_insert_with(|| Arc::new(self.start_lanes()))
                .clone()
        };
        let mut h = std::collections::hash_map::DefaultHasher::new();
        job.lane_key.hash(&mut h);
        let lane = &lanes[(h.finish() as usize) % lanes.len()];
        lane.try_send(job).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => "notification queue full".to_string(),
            mpsc::error::TrySendError::Closed(_) => "notification sender stopped".to_string(),
        })
    }

    fn start_lanes(&self) -> Vec<mpsc::Sender<Job>> {
        (0..self.config.lanes.max(1))
            .map(|_| {
                let (tx, rx) = mpsc::channel(self.config.lane_capacity.max(1));
                self.runtime.spawn(lane(
                    rx,
                    self.client.clone(),
                    self.config.timeout,
                    self.dirty.clone(),
                ));
                tx
            })
            .collect()
    }
}

/// Drains one lane: one request at a time, outcomes recorded.
async fn lane(
    mut rx: mpsc::Receiver<Job>,
    client: reqwest::Client,
    default_timeout: Duration,
    dirty: Arc<Dirty>,
) {
    while let Some(job) = rx.recv().await {
        let timeout = job
            .timeout
            .map(Duration::from_millis)
            .unwrap_or(default_timeout);
        let outcome = send(&client, job.request, timeout).await;
        match &outcome {
            Outcome::Answered(_) => metrics::counter!("weft_notifications_sent_total").increment(1),
            Outcome::Failed(_) => metrics::counter!("weft_notifications_failed_total").increment(1),
        }
        let key = job.entry.record(outcome);
        dirty.lock().insert(key);
    }
}

/// Sends one request.
async fn send(client: &reqwest::Client, request: Request, timeout: Duration) -> Outcome {
    let mut builder = client
        .request(request.method, &request.url)
        .timeout(timeout);
    for (name, value) in &request.headers {
        builder = builder.header(name.as_str(), value.as_str());
    }
    if let Some(body) = request.body {
        builder = builder.body(body);
    }
    match builder.send().await {
        Ok(resp) => {
            let code = resp.status().as_u16();
            // Read the body so the connection can be reused.
            let _ = resp.bytes().await;
            Outcome::Answered(code)
        }
        Err(e) if e.is_timeout() => Outcome::Failed("Timeout was reached".into()),
        Err(e) if e.is_connect() => Outcome::Failed("Couldn't connect to server".into()),
        Err(e) if e.is_builder() => Outcome::Failed("Invalid URL parsing notification url".into()),
        Err(e) => Outcome::Failed(e.to_string()),
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
