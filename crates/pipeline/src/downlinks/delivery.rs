//! The delivery worker: claims the downlinks that are due, sends each
//! through its device's route, and records the outcome — `sent`, a retry
//! after a growing wait, `failed` after the last attempt, `expired` once
//! `expiresAt` has passed, or `pending` when the device has no route weft
//! can use yet. Commands' `<command>_status` / `<command>_info` follow.
//!
//! One attempt at a time per worker keeps a device's downlinks in queue
//! order; a claim leases what it took, so the workers of several weft
//! processes share the queue without sending anything twice.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use weft_model::downlink::{Delivery, HttpDelivery};
use weft_model::{now_ms, Downlink, DownlinkRoute, DownlinkStatus};

use super::Downlinks;

/// Downlinks one claim takes; small, so a lease never outlives the work.
const CLAIM_BATCH: usize = 16;

/// How often the worker looks for due downlinks when nothing woke it:
/// retries and pending re-checks become due without a wake-up.
const POLL: Duration = Duration::from_millis(500);

/// The reason a downlink for a device weft knows no route to stays pending.
pub const NO_ROUTE: &str = "no downlink route known for this device yet: weft learns it from \
     the device's uplinks (TTN webhook X-Downlink-* headers, ChirpStack, Helium downlink_url, \
     an MQTT source's topics) \
     or from the device's endpoint";

/// The most of a network server's (or device's) answer read: its error
/// text or a command's result.
const MAX_ANSWER_BYTES: usize = 1 << 20;

/// What one attempt came to.
enum Outcome {
    /// Accepted; for IoT Agent devices, what they answered.
    Sent(Option<Value>),
    /// Not sent, worth retrying.
    Retry(String),
    /// Not sent until something changes (a route, a connection).
    Pending(String),
}

impl Downlinks {
    /// Runs the delivery worker until `shutdown`: reads when the next
    /// downlink is due (a read, so an idle worker writes nothing), claims
    /// what is due, attempts it, and sleeps until the next is due, a
    /// wake-up, or [`POLL`].
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let lease = self.config.request_timeout.saturating_mul(2) + Duration::from_secs(5);
        loop {
            let now = now_ms();
            let next = match self.store.next_downlink_due().await {
                Ok(next) => next,
                Err(error) => {
                    tracing::warn!(%error, "could not read when downlinks are due");
                    None
                }
            };
            let mut worked = false;
            if next.is_some_and(|due| due <= now) {
                let claimed = match self
                    .store
                    .claim_due_downlinks(now, now + lease.as_millis() as i64, CLAIM_BATCH)
                    .await
                {
                    Ok(claimed) => claimed,
                    Err(error) => {
                        tracing::warn!(%error, "could not claim due downlinks");
                        Vec::new()
                    }
                };
                worked = !claimed.is_empty();
                for downlink in claimed {
                    if shutdown.is_cancelled() {
                        return;
                    }
                    self.attempt(downlink).await;
                }
            }
            if worked {
                continue;
            }
            let wait = next
                .filter(|due| *due > now)
                .map(|due| Duration::from_millis((due - now) as u64).min(POLL))
                .unwrap_or(POLL);
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// One attempt at `d`, and its recorded outcome.
    async fn attempt(&self, mut d: Downlink) {
        let now = now_ms();
        if d.expires_at.is_some_and(|at| at <= now) {
            d.status = DownlinkStatus::Expired;
            d.reason = Some("expired before it could be sent".into());
            d.updated_at = now;
            metrics::counter!("weft_downlinks_expired_total").increment(1);
            if self.record(&d).await {
                self.follow_command(
                    &d,
                    "EXPIRED",
                    Some(json!("expired before it could be sent")),
                )
                .await;
            }
            return;
        }
        let mut route_name = None;
        let outcome = match self.route(&d.device_id).await {
            Ok(Some(route)) => {
                route_name = Some(route.name());
                self.send(&route, &d).await
            }
            Ok(None) => Outcome::Pending(NO_ROUTE.to_string()),
            Err(error) => Outcome::Retry(format!("could not read the device's route: {error}")),
        };
        let now = now_ms();
        d.updated_at = now;
        match outcome {
            Outcome::Sent(answer) => {
                d.status = DownlinkStatus::Sent;
                d.sent_at = Some(now);
                d.route = route_name.map(str::to_string);
                d.reason = None;
                d.attempts += 1;
                if self.record(&d).await {
                    match answer {
                        Some(result) => self.follow_command(&d, "OK", Some(result)).await,
                        None => self.follow_command(&d, "DELIVERED", None).await,
                    }
                }
            }
            Outcome::Pending(reason) => {
                d.status = DownlinkStatus::Pending;
                d.reason = Some(reason);
                d.next_attempt_at =
                    until_expiry(&d, now + self.config.pending_recheck.as_millis() as i64);
                self.record(&d).await;
            }
            Outcome::Retry(reason) => {
                d.attempts += 1;
                metrics::counter!("weft_downlink_attempts_failed_total").increment(1);
                if d.attempts >= self.config.max_attempts {
                    d.status = DownlinkStatus::Failed;
                    d.reason = Some(reason.clone());
                    metrics::counter!("weft_downlinks_failed_total").increment(1);
                    if self.record(&d).await {
                        self.follow_command(&d, "ERROR", Some(json!(reason))).await;
                    }
                } else {
                    d.status = DownlinkStatus::Queued;
                    d.reason = Some(reason);
                    d.next_attempt_at = until_expiry(
                        &d,
                        now + self.config.backoff().delay(d.attempts).as_millis() as i64,
                    );
                    self.record(&d).await;
                }
            }
        }
    }

    /// Stores the downlink's new state; `false` (and nothing more to do)
    /// when it was flushed or replaced while being sent.
    async fn record(&self, d: &Downlink) -> bool {
        match self.store.update_downlink(d).await {
            Ok(kept) => kept,
            Err(error) => {
                // Its lease runs out and it is attempted again.
                tracing::warn!(%error, id = %d.id, "could not record a downlink's outcome");
                false
            }
        }
    }

    /// Sends `d` through `route`.
    async fn send(&self, route: &DownlinkRoute, d: &Downlink) -> Outcome {
        let chirpstack = self.chirpstack_for(&d.device_id);
        let outcome = match crate::uplink::delivery(route, d, chirpstack, false) {
            Err(reason) => Outcome::Pending(reason),
            Ok(Delivery::Mqtt(message)) => {
                match self
                    .mqtt
                    .publish_acked(
                        &message.source,
                        &message.topic,
                        message.payload,
                        self.config.request_timeout,
                    )
                    .await
                {
                    Ok(()) => Outcome::Sent(None),
                    Err(reason) => Outcome::Retry(reason),
                }
            }
            Ok(Delivery::Http(http)) => self.post(&http, d).await,
        };
        if let Outcome::Sent(_) = outcome {
            metrics::counter!("weft_downlinks_sent_total", "route" => route.name()).increment(1);
        }
        outcome
    }

    /// POSTs an HTTP delivery: 2xx is sent, anything else a retry. An IoT
    /// Agent device's JSON answer naming the command is its result.
    async fn post(&self, http: &HttpDelivery, d: &Downlink) -> Outcome {
        let mut request = self
            .client
            .post(&http.url)
            .timeout(self.config.request_timeout)
            .json(&http.body);
        for (name, value) in &http.headers {
            request = request.header(name, value);
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(error) => return Outcome::Retry(format!("POST {} failed: {error}", http.url)),
        };
        let status = response.status();
        let body = crate::outbound::read_body(response, MAX_ANSWER_BYTES).await;
        if !status.is_success() {
            let text = body
                .map(|b| {
                    String::from_utf8_lossy(&b)
                        .chars()
                        .take(200)
                        .collect::<String>()
                })
                .unwrap_or_default();
            return Outcome::Retry(format!("POST {} answered {status}: {text}", http.url));
        }
        let answer = match (&d.command, body) {
            (Some(command), Ok(body)) => serde_json::from_slice::<Value>(&body)
                .ok()
                .and_then(|body| body.get(command).cloned()),
            _ => None,
        };
        Outcome::Sent(answer)
    }
}

/// `at`, or the downlink's expiry if that comes first: an expiring
/// downlink is looked at when it expires, not a wait later.
fn until_expiry(d: &Downlink, at: i64) -> i64 {
    d.expires_at.map_or(at, |expiry| at.min(expiry))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The doubling backoff from the configured first wait, capped, each
    /// wait within ±20 % of its base and never past the cap.
    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let config = super::super::DownlinksConfig {
            retry_initial: Duration::from_millis(100),
            retry_max: Duration::from_millis(500),
            ..Default::default()
        };
        let backoff = config.backoff();
        let bases: Vec<u64> = (1..=5)
            .map(|n| backoff.base(n).as_millis() as u64)
            .collect();
        assert_eq!(bases, [100, 200, 400, 500, 500]);
        for n in 1..=5 {
            for _ in 0..50 {
                let wait = backoff.delay(n).as_secs_f64();
                let base = backoff.base(n).as_secs_f64();
                assert!(
                    wait >= base * 0.8 - 1e-9 && wait <= 0.5 + 1e-9,
                    "{n}: {wait}"
                );
            }
        }
    }
}
