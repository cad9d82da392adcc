//! Everything weft sends out over HTTP, made in one place: the client
//! (TLS roots, timeouts, no redirects, user agent, connection pool) and
//! the retry policy ([`Backoff`]).
//!
//! Who uses it:
//!
//! | caller | client | timeout (whole exchange) | retries |
//! |---|---|---|---|
//! | NGSI notifications ([`crate::subscriptions::sender`]) | [`notification_client`] | the subscription's `timeout`, else `[notifications] timeout` (5 s) | none, as Orion: a failure is counted on the subscription |
//! | context providers ([`crate::forwarding`]) | [`http`] | `[ngsi] forward_timeout` (5 s) | none: the client waits for the answer |
//! | downlinks to network servers ([`crate::downlinks`]) | [`http`] | `[downlinks] request_timeout` | [`Backoff`] from `retry_initial` doubling to `retry_max`, ±20 % |
//! | channel webhooks ([`crate::channels::rules`], fed by bridges and publishes) | [`http`] | the webhook's `timeout` (30 s) per attempt | [`Backoff`] from the webhook's `retry` (DSPS's count, interval, multiplier, jitter), each wait at most [`WEBHOOK_MAX_WAIT`] |
//! | page services (`weft-pages`) | [`http`] | the service's `timeout` (2 s) | none: the snippet's fallback is rendered |
//!
//! The client never follows a redirect: a 3xx is the answer (a failure
//! for every caller but notifications, which record its status as Orion
//! does). Following one would let an endpoint that passed a check send
//! weft somewhere else, and neither Orion (libcurl without
//! `FOLLOWLOCATION`) nor the network servers' APIs redirect.
//!
//! Notifications go through hyper directly rather than reqwest: a
//! notification carries exactly the headers Orion's would, and a
//! subscription may remove one (`Accept`) that reqwest always adds. Both
//! clients trust the same roots ([`tls_config`]) and neither follows
//! redirects.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio_rustls::rustls::{crypto::ring, ClientConfig, RootCertStore};

/// The `User-Agent` of what weft sends on the NGSI side (notifications,
/// forwards): Orion's form (`orion/<version>`), which receivers written
/// for Orion may check.
pub const NGSI_USER_AGENT: &str = concat!("orion/3.10.1 weft/", env!("CARGO_PKG_VERSION"));

/// The `User-Agent` of every other request (downlinks, webhooks, page
/// services).
pub const USER_AGENT: &str = concat!("weft/", env!("CARGO_PKG_VERSION"));

/// Longest a connection may take to open, whatever the request's own
/// timeout (which covers connecting too, and is usually shorter).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Idle keep-alive connections kept per host by [`http`].
pub const IDLE_PER_HOST: usize = 32;

/// How long an idle keep-alive connection is kept.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Longest wait between two attempts of a channel webhook, whatever its
/// `retry` says (DSPS's multiplier alone would grow without end).
pub const WEBHOOK_MAX_WAIT: Duration = Duration::from_secs(300);

/// The TLS settings of every outbound connection: the web's root
/// certificates (webpki) and the system's, ring as the provider, TLS 1.2
/// and 1.3. Built once (reading the system's roots is slow).
pub fn tls_config() -> Arc<ClientConfig> {
    static TLS: OnceLock<Arc<ClientConfig>> = OnceLock::new();
    TLS.get_or_init(|| {
        let mut roots = RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        for cert in rustls_native_certs::load_native_certs().certs {
            // A system certificate rustls cannot read is one root less.
            let _ = roots.add(cert);
        }
        let config = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("ring supports the default TLS versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        Arc::new(config)
    })
    .clone()
}

/// The HTTP client of everything but notifications: one connection pool
/// for the whole process. It sets no overall timeout: every caller gives
/// each request its own (`RequestBuilder::timeout`), which covers
/// connecting, sending and reading the answer.
pub fn http() -> reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            reqwest::Client::builder()
                .use_preconfigured_tls((*tls_config()).clone())
                .redirect(reqwest::redirect::Policy::none())
                .user_agent(USER_AGENT)
                .connect_timeout(CONNECT_TIMEOUT)
                .pool_max_idle_per_host(IDLE_PER_HOST)
                .pool_idle_timeout(IDLE_TIMEOUT)
                .tcp_nodelay(true)
                .build()
                .expect("the outbound HTTP client builds")
        })
        .clone()
}

/// The HTTP client of notifications: hyper's pooled HTTP/1.1 client, plain
/// or over TLS ([`tls_config`]), writing header names in title case; it
/// never follows redirects.
pub type NotificationClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// Builds the notification client, keeping up to `idle_per_host`
/// keep-alive connections per endpoint (one per lane of the sender).
pub fn notification_client(idle_per_host: usize) -> NotificationClient {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(CONNECT_TIMEOUT));
    let https = HttpsConnectorBuilder::new()
        .with_tls_config((*tls_config()).clone())
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Client::builder(TokioExecutor::new())
        // Header names as Orion and most servers write them (`Link`,
        // `Fiware-Service`): receivers that match names case-sensitively
        // (ETSI's suite, simple scripts) find them.
        .http1_title_case_headers(true)
        .pool_max_idle_per_host(idle_per_host)
        .pool_idle_timeout(IDLE_TIMEOUT)
        .build(https)
}

/// Why [`read_body`] gave no body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyError {
    /// The answer is longer than the caller reads.
    TooLarge,
    /// The connection failed while reading (or timed out).
    Failed(String),
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyError::TooLarge => f.write_str("answer too large"),
            BodyError::Failed(why) => f.write_str(why),
        }
    }
}

/// Reads an answer's body, refusing one longer than `limit` bytes (as
/// soon as its `Content-Length` or what arrived says so): an endpoint is
/// someone else's server, and what it sends must not decide weft's memory.
pub async fn read_body(
    mut response: reqwest::Response,
    limit: usize,
) -> Result<Vec<u8>, BodyError> {
    if response.content_length().is_some_and(|n| n > limit as u64) {
        return Err(BodyError::TooLarge);
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| BodyError::Failed(describe(&e)))?
    {
        if body.len() + chunk.len() > limit {
            return Err(BodyError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// A reqwest error in the words Orion (libcurl) uses where they exist.
pub fn describe(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "Timeout was reached".into()
    } else if e.is_connect() {
        "Couldn't connect to server".into()
    } else {
        e.to_string()
    }
}

/// The random part of a [`Backoff`]'s waits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Jitter {
    /// Exactly the computed wait.
    None,
    /// Up to this much more or less (DSPS's `interval_jitter`).
    Absolute(Duration),
    /// Up to this fraction of the wait more or less (0.2: ±20 %).
    Ratio(f64),
}

/// Exponential backoff with jitter and a cap: the wait before retry `n`
/// (1 for the first) is `initial × multiplier^(n-1)`, at most `max`, then
/// moved by the jitter, never below zero nor above `max`. The one policy
/// of everything weft retries when sending.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// Wait before the first retry.
    pub initial: Duration,
    /// Each further wait is the previous times this (≥ 1).
    pub multiplier: f64,
    /// Longest wait.
    pub max: Duration,
    /// Randomness, so that senders that failed together do not retry
    /// together.
    pub jitter: Jitter,
}

impl Backoff {
    /// The wait before retry `n` (1 for the first) without its jitter.
    pub fn base(&self, n: u32) -> Duration {
        let exponent = n.saturating_sub(1).min(64) as i32;
        let factor = self.multiplier.max(1.0).powi(exponent);
        let secs = self.initial.as_secs_f64() * factor;
        if !secs.is_finite() || secs >= self.max.as_secs_f64() {
            return self.max;
        }
        Duration::from_secs_f64(secs).min(self.max)
    }

    /// The wait before retry `n` (1 for the first), jitter included.
    pub fn delay(&self, n: u32) -> Duration {
        self.delay_with(n, rand::random_range(-1.0..=1.0))
    }

    /// [`Backoff::delay`] with the random draw given (in −1..=1).
    fn delay_with(&self, n: u32, draw: f64) -> Duration {
        let base = self.base(n).as_secs_f64();
        let spread = match self.jitter {
            Jitter::None => 0.0,
            Jitter::Absolute(d) => d.as_secs_f64(),
            Jitter::Ratio(r) => base * r.clamp(0.0, 1.0),
        };
        let secs = (base + spread * draw.clamp(-1.0, 1.0)).clamp(0.0, self.max.as_secs_f64());
        Duration::from_secs_f64(secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(d: Duration) -> u64 {
        d.as_millis() as u64
    }

    /// Doubling from the first wait, capped.
    #[test]
    fn backoff_grows_to_its_cap() {
        let b = Backoff {
            initial: Duration::from_millis(100),
            multiplier: 2.0,
            max: Duration::from_millis(500),
            jitter: Jitter::None,
        };
        let waits: Vec<u64> = (1..=6).map(|n| ms(b.delay(n))).collect();
        assert_eq!(waits, [100, 200, 400, 500, 500, 500]);
        // Far past any sensible attempt count: still the cap, no overflow.
        assert_eq!(b.delay(u32::MAX), b.max);
        // A multiplier below 1 does not shrink the waits.
        let flat = Backoff {
            multiplier: 0.5,
            ..b
        };
        assert_eq!(ms(flat.delay(3)), 100);
    }

    /// Jitter moves a wait within its spread, never below zero nor past
    /// the cap.
    #[test]
    fn jitter_stays_within_its_bounds() {
        let b = Backoff {
            initial: Duration::from_secs(3),
            multiplier: 1.5,
            max: Duration::from_secs(5),
            jitter: Jitter::Absolute(Duration::from_millis(1500)),
        };
        assert_eq!(ms(b.delay_with(1, -1.0)), 1500);
        assert_eq!(ms(b.delay_with(1, 1.0)), 4500);
        assert_eq!(ms(b.delay_with(2, 1.0)), 5000, "capped");
        let big = Backoff {
            jitter: Jitter::Absolute(Duration::from_secs(10)),
            ..b
        };
        assert_eq!(ms(big.delay_with(1, -1.0)), 0);
        let ratio = Backoff {
            initial: Duration::from_secs(1),
            multiplier: 2.0,
            max: Duration::from_secs(60),
            jitter: Jitter::Ratio(0.2),
        };
        assert_eq!(ms(ratio.delay_with(2, -1.0)), 1600);
        assert_eq!(ms(ratio.delay_with(2, 1.0)), 2400);
        for n in 1..20 {
            let d = ratio.delay(n);
            let base = ratio.base(n).as_secs_f64();
            assert!(
                d.as_secs_f64() >= base * 0.8 - 1e-9 && d <= ratio.max,
                "{n}: {d:?}"
            );
        }
    }

    /// The shared client does not follow redirects, and a body longer than
    /// the limit is refused.
    #[tokio::test]
    async fn no_redirects_and_bounded_bodies() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let n = s.read(&mut buf).await.unwrap_or(0);
                    let head = String::from_utf8_lossy(&buf[..n]).to_string();
                    let answer = if head.starts_with("GET /moved") {
                        format!(
                            "HTTP/1.1 302 Found\r\nLocation: http://{addr}/big\r\nContent-Length: 0\r\n\r\n"
                        )
                    } else {
                        let ua = head
                            .lines()
                            .find_map(|l| l.strip_prefix("user-agent: "))
                            .unwrap_or("")
                            .to_string();
                        format!(
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{ua}",
                            ua.len()
                        )
                    };
                    let _ = s.write_all(answer.as_bytes()).await;
                });
            }
        });
        let client = http();
        let moved = client
            .get(format!("http://{addr}/moved"))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .unwrap();
        assert_eq!(moved.status().as_u16(), 302, "not followed");
        let answer = client
            .get(format!("http://{addr}/big"))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .unwrap();
        assert_eq!(read_body(answer, 4).await, Err(BodyError::TooLarge));
        let answer = client
            .get(format!("http://{addr}/big"))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .unwrap();
        let body = read_body(answer, 1 << 10).await.unwrap();
        assert_eq!(String::from_utf8(body).unwrap(), USER_AGENT);
    }
}
