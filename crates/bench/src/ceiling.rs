//! Calibration: this machine's HTTP ceiling, measured in the same run as
//! the scenario it calibrates.
//!
//! An absolute throughput says little on its own: the same commit on the
//! same kind of machine measures a third of itself an hour later. What
//! holds is a ratio to a reference measured in the same run. Before a
//! scenario's load, the bench serves a bare hyper handler (one trivial GET,
//! one small POST) on a runtime of its own, drives it with its own client
//! at the scenario's concurrency for `--calibration` each, then drives the
//! target's own trivial endpoint (`GET /version` on weft, the probe on a
//! peer) the same way. The summary prints the scenario's throughput as a
//! share of that ceiling next to the absolute figure.
//!
//! `weft bench ceiling` runs the calibration alone.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context};
use serde::Serialize;
use tokio::time::Instant;

use crate::common::{CommonArgs, Session};
use crate::http::{render_request, Conn};
use crate::summary::{Check, Metric, Summary};
use crate::target::BaseUrl;

/// The body of the ceiling's POST: about the size of an NGSI update of a
/// few attributes or a decoded uplink.
pub const POST_BODY: &[u8] = br#"{"temperature":{"type":"Number","value":21.5},"humidity":{"type":"Number","value":48},"pressure":{"type":"Number","value":1013.2}}"#;

/// weft's trivial endpoint: Orion's `GET /version`, no store, no state.
pub const WEFT_TRIVIAL_PATH: &str = "/version";

/// Which of the ceiling's two requests a scenario's throughput is read
/// against: the one its own requests resemble.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Reference {
    /// A GET with a small answer (pages, queries).
    Get,
    /// A small JSON body in, a short answer out (updates, uplinks,
    /// notifications, publishes).
    Post,
}

impl std::fmt::Display for Reference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Reference::Get => "GET",
            Reference::Post => "POST",
        })
    }
}

/// How fast one endpoint answered under the calibration's load.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rate {
    /// Requests answered with a 2xx.
    pub ok: u64,
    /// Requests answered otherwise, or lost to a transport error.
    pub errors: u64,
    /// How long the load ran, in seconds.
    pub seconds: f64,
    /// `ok / seconds`.
    pub per_second: f64,
}

impl Rate {
    /// A rate from its tallies; 0/s over no time.
    pub fn new(ok: u64, errors: u64, seconds: f64) -> Rate {
        Rate {
            ok,
            errors,
            seconds,
            per_second: per_second(ok, seconds),
        }
    }

    /// This rate and `other` measured as one.
    pub fn add(&self, other: &Rate) -> Rate {
        Rate::new(
            self.ok + other.ok,
            self.errors + other.errors,
            self.seconds + other.seconds,
        )
    }
}

/// `count / seconds`, 0 when no time passed.
fn per_second(count: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        count as f64 / seconds
    } else {
        0.0
    }
}

/// The references measured before a scenario's load.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Calibration {
    /// Connections driven at once (the scenario's concurrency).
    pub concurrency: usize,
    /// The bare handler's trivial GET: the machine's ceiling for reads.
    pub bare_get: Rate,
    /// The bare handler's small POST: the ceiling for writes.
    pub bare_post: Rate,
    /// The target's trivial endpoint, driven the same way.
    pub target_path: String,
    /// How fast the target answered it.
    pub target_get: Rate,
}

impl Calibration {
    /// The ceiling a throughput of kind `reference` is read against.
    pub fn ceiling(&self, reference: Reference) -> f64 {
        match reference {
            Reference::Get => self.bare_get.per_second,
            Reference::Post => self.bare_post.per_second,
        }
    }

    /// The target's trivial GET as a share of the bare GET: what the
    /// target's HTTP layer alone leaves of the machine.
    pub fn target_share(&self) -> Option<f64> {
        ratio(self.target_get.per_second, self.bare_get.per_second)
    }

    /// One line for the text summary.
    pub fn describe(&self) -> String {
        let share = self
            .target_share()
            .map(|r| format!(" = {} of the bare GET", percent(r)))
            .unwrap_or_default();
        format!(
            "{} connections, {} each in turns: bare GET {} req/s, bare POST {} req/s; target GET {} {} req/s{share}",
            self.concurrency,
            crate::summary::format_duration_us(self.bare_get.seconds * 1e6),
            thousands(self.bare_get.per_second),
            thousands(self.bare_post.per_second),
            self.target_path,
            thousands(self.target_get.per_second),
        )
    }
}

/// A scenario's headline throughput read against the calibration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Throughput {
    /// The summary metric it comes from (`updates`, `pages`, …).
    pub metric: String,
    /// Its rate, per second.
    pub per_second: f64,
    /// The ceiling it is read against.
    pub reference: Reference,
    /// That ceiling, requests per second.
    pub ceiling: f64,
    /// `per_second / ceiling`; absent when the ceiling is 0.
    pub ratio: Option<f64>,
}

impl Throughput {
    /// Reads `per_second` of `metric` against `calibration`'s ceiling for
    /// `reference`.
    pub fn new(
        metric: &str,
        per_second: f64,
        reference: Reference,
        calibration: &Calibration,
    ) -> Throughput {
        let ceiling = calibration.ceiling(reference);
        Throughput {
            metric: metric.to_string(),
            per_second,
            reference,
            ceiling,
            ratio: ratio(per_second, ceiling),
        }
    }

    /// One line for the text summary.
    pub fn describe(&self) -> String {
        match self.ratio {
            Some(r) => format!(
                "{} {}/s = {} of the bare {} ceiling ({} req/s)",
                self.metric,
                thousands(self.per_second),
                percent(r),
                self.reference,
                thousands(self.ceiling)
            ),
            None => format!(
                "{} {}/s (no ceiling measured)",
                self.metric,
                thousands(self.per_second)
            ),
        }
    }
}

/// `value / reference`, `None` when the reference is not a positive number.
pub fn ratio(value: f64, reference: f64) -> Option<f64> {
    (reference > 0.0 && reference.is_finite()).then(|| value / reference)
}

/// A share as a percentage with one decimal: `0.4567` → `45.7%`.
pub fn percent(share: f64) -> String {
    format!("{:.1}%", share * 100.0)
}

/// A rate rounded to a whole number with thousands separators:
/// `81234.6` → `81,235`.
pub fn thousands(x: f64) -> String {
    let n = x.round().max(0.0) as u64;
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        // `is_multiple_of` is newer than the workspace's rust-version.
        #[allow(clippy::manual_is_multiple_of)]
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The bare handler: hyper's HTTP/1 server with a handler that answers
/// `ok` to a GET and reads a POST's body before answering, on a
/// multi-threaded runtime of its own (the same shape as `weft serve`'s),
/// so it shares the machine with the bench as the target does. Nothing
/// sits between the connection and the handler: no router, no protocol
/// detection (axum's `serve` probes every connection for HTTP/2), which
/// is what makes it the ceiling.
pub struct BareServer {
    addr: SocketAddr,
    runtime: Option<tokio::runtime::Runtime>,
}

impl BareServer {
    /// Starts the handler on an ephemeral loopback port.
    pub fn start() -> anyhow::Result<BareServer> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .thread_name("bench-ceiling")
            .enable_all()
            .build()
            .context("starting the ceiling's runtime")?;
        // Bound here, served on the runtime: `start` may be called from
        // inside another runtime, which cannot block on this one.
        let listener =
            std::net::TcpListener::bind("127.0.0.1:0").context("binding the ceiling's listener")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        runtime.spawn(async move {
            let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                return;
            };
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let _ = stream.set_nodelay(true);
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(
                            hyper_util::rt::TokioIo::new(stream),
                            hyper::service::service_fn(answer),
                        )
                        .await;
                });
            }
        });
        Ok(BareServer {
            addr,
            runtime: Some(runtime),
        })
    }

    /// Where it listens.
    pub fn base(&self) -> BaseUrl {
        BaseUrl::parse(&format!("http://{}", self.addr)).expect("a socket address is a valid URL")
    }
}

/// The bare handler: `GET /` and `POST /` (body read) answer `ok`,
/// anything else 404.
async fn answer(
    req: hyper::Request<hyper::body::Incoming>,
) -> Result<hyper::Response<http_body_util::Full<hyper::body::Bytes>>, std::convert::Infallible> {
    use http_body_util::BodyExt;

    let found = req.uri().path() == "/"
        && match *req.method() {
            hyper::Method::GET => true,
            hyper::Method::POST => req.into_body().collect().await.is_ok(),
            _ => false,
        };
    let (status, body) = if found {
        (hyper::StatusCode::OK, "ok")
    } else {
        (hyper::StatusCode::NOT_FOUND, "")
    };
    let mut response = hyper::Response::new(http_body_util::Full::new(
        hyper::body::Bytes::from_static(body.as_bytes()),
    ));
    *response.status_mut() = status;
    Ok(response)
}

impl Drop for BareServer {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Drives `request` on `concurrency` keep-alive connections to `connect`,
/// back to back, for `duration`, and counts the answers.
///
/// Every connection is open before the clock starts, so the figure is
/// the steady state, not the connection storm.
pub async fn drive(
    connect: &str,
    request: Vec<u8>,
    concurrency: usize,
    duration: Duration,
) -> anyhow::Result<Rate> {
    ensure!(
        concurrency >= 1,
        "the calibration needs at least one connection"
    );
    let mut conns = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        conns.push(
            Conn::connect(connect)
                .await
                .with_context(|| format!("connecting to {connect}"))?,
        );
    }
    let request: Arc<[u8]> = request.into();
    let ok = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let deadline = started + duration;
    let mut tasks = Vec::with_capacity(concurrency);
    for mut conn in conns {
        let (request, ok, errors, stop) =
            (request.clone(), ok.clone(), errors.clone(), stop.clone());
        let connect = connect.to_string();
        tasks.push(tokio::spawn(async move {
            let (mut n_ok, mut n_err) = (0u64, 0u64);
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                match conn.round_trip(&request, None).await {
                    Ok(head) if (200..300).contains(&head.status) => n_ok += 1,
                    Ok(_) => n_err += 1,
                    Err(_) => n_err += 1,
                }
                if !conn.reusable() {
                    match Conn::connect(&connect).await {
                        Ok(c) => conn = c,
                        Err(_) => break,
                    }
                }
            }
            ok.fetch_add(n_ok, Ordering::Relaxed);
            errors.fetch_add(n_err, Ordering::Relaxed);
        }));
    }
    tokio::time::sleep_until(deadline).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        let _ = task.await;
    }
    // Requests in flight at the deadline finish and count: the elapsed
    // time includes them.
    let seconds = started.elapsed().as_secs_f64();
    Ok(Rate::new(
        ok.load(Ordering::Relaxed),
        errors.load(Ordering::Relaxed),
        seconds,
    ))
}

/// Measures the bare handler's GET and POST and the target's trivial
/// endpoint, each for `each` at `concurrency`.
///
/// The three are measured in turns of about a second (GET, POST, target;
/// GET, POST, target; …) rather than one after the other, so that a
/// machine whose load drifts during the calibration (another process
/// starting, a CPU's frequency changing) weighs on all three alike.
pub async fn calibrate(
    session: &Session,
    concurrency: usize,
    each: Duration,
) -> anyhow::Result<Calibration> {
    let bare = BareServer::start()?;
    let base = bare.base();
    let get = render_request("GET", "/", &base.host, &[], None);
    let post = render_request(
        "POST",
        "/",
        &base.host,
        &[("Content-Type", "application/json")],
        Some(POST_BODY),
    );
    let target_path = session.trivial_path().to_string();
    let trivial = render_request(
        "GET",
        &session.base.path(&target_path),
        &session.base.host,
        &[],
        None,
    );
    let turns = turns(each);
    let slice = each / turns;
    let mut rates = [
        Rate::new(0, 0, 0.0),
        Rate::new(0, 0, 0.0),
        Rate::new(0, 0, 0.0),
    ];
    for _ in 0..turns {
        for (rate, (connect, request)) in rates.iter_mut().zip([
            (&base.connect, &get),
            (&base.connect, &post),
            (&session.base.connect, &trivial),
        ]) {
            let more = drive(connect, request.clone(), concurrency, slice).await?;
            *rate = rate.add(&more);
        }
    }
    drop(bare);
    let [bare_get, bare_post, target_get] = rates;
    Ok(Calibration {
        concurrency,
        bare_get,
        bare_post,
        target_path,
        target_get,
    })
}

/// How many turns a calibration of `each` per endpoint takes: one per
/// whole second, at least one.
fn turns(each: Duration) -> u32 {
    (each.as_secs() as u32).clamp(1, 60)
}

/// Flags of `weft bench ceiling`.
#[derive(Debug, Clone, clap::Args)]
pub struct CeilingArgs {
    /// The flags every scenario takes (`--calibration` is how long each of
    /// the three measurements runs; `--duration` is not used).
    #[command(flatten)]
    pub common: CommonArgs,

    /// Connections driven at once.
    #[arg(long, default_value_t = 256)]
    pub concurrency: usize,
}

/// `weft bench ceiling`: the calibration alone, as a summary whose
/// throughput is the target's trivial GET against the bare GET.
pub fn summary(args: &CeilingArgs, session: &Session, calibration: Calibration) -> Summary {
    let mut params = serde_json::Map::new();
    params.insert("concurrency".into(), args.concurrency.into());
    params.insert(
        "each".into(),
        humantime::format_duration(args.common.calibration)
            .to_string()
            .into(),
    );
    let c = &calibration;
    let mut s = Summary::new("ceiling", session, params);
    s.description = vec![format!(
        "a bare hyper handler (GET, small POST), then the target's GET {}, {} connections each",
        c.target_path, c.concurrency
    )];
    s.phases = vec![(
        "calibration".to_string(),
        c.bare_get.seconds + c.bare_post.seconds + c.target_get.seconds,
    )];
    for (name, rate) in [
        ("bare_get", &c.bare_get),
        ("bare_post", &c.bare_post),
        ("target_get", &c.target_get),
    ] {
        s.checks.push(Check::new(
            format!("{name} answered 2xx"),
            rate.ok,
            rate.errors,
        ));
        s.metrics.insert(
            format!("{name}_reqs"),
            Metric::counter(rate.ok, rate.seconds),
        );
    }
    s.throughput = Some(Throughput::new(
        "target_get_reqs",
        c.target_get.per_second,
        Reference::Get,
        c,
    ));
    s.calibration = Some(calibration);
    s.seal();
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(per_second: f64) -> Rate {
        Rate::new((per_second * 2.0) as u64, 0, 2.0)
    }

    fn calibration() -> Calibration {
        Calibration {
            concurrency: 300,
            bare_get: rate(80_000.0),
            bare_post: rate(60_000.0),
            target_path: "/version".into(),
            target_get: rate(68_000.0),
        }
    }

    #[test]
    fn ratios_read_against_the_right_ceiling() {
        let c = calibration();
        assert_eq!(c.ceiling(Reference::Get), 80_000.0);
        assert_eq!(c.ceiling(Reference::Post), 60_000.0);
        assert_eq!(c.target_share(), Some(0.85));
        let t = Throughput::new("updates", 24_000.0, Reference::Post, &c);
        assert_eq!(t.ratio, Some(0.4));
        assert_eq!(t.ceiling, 60_000.0);
        let t = Throughput::new("pages", 24_000.0, Reference::Get, &c);
        assert_eq!(t.ratio, Some(0.3));
    }

    #[test]
    fn turns_add_up() {
        let a = Rate::new(30_000, 1, 1.0);
        let b = Rate::new(50_000, 0, 1.5);
        let sum = a.add(&b);
        assert_eq!((sum.ok, sum.errors, sum.seconds), (80_000, 1, 2.5));
        assert_eq!(sum.per_second, 32_000.0);
        assert_eq!(turns(Duration::from_millis(300)), 1);
        assert_eq!(turns(Duration::from_secs(3)), 3);
        assert_eq!(turns(Duration::from_secs(3600)), 60);
    }

    #[test]
    fn no_ceiling_no_ratio() {
        assert_eq!(ratio(10.0, 0.0), None);
        assert_eq!(ratio(10.0, f64::NAN), None);
        assert_eq!(ratio(0.0, 5.0), Some(0.0));
        let mut c = calibration();
        c.bare_post = Rate::new(0, 10, 2.0);
        let t = Throughput::new("updates", 100.0, Reference::Post, &c);
        assert_eq!(t.ratio, None);
        assert_eq!(t.describe(), "updates 100/s (no ceiling measured)");
        assert_eq!(Rate::new(5, 0, 0.0).per_second, 0.0);
    }

    #[test]
    fn lines_read_well() {
        assert_eq!(thousands(0.4), "0");
        assert_eq!(thousands(999.5), "1,000");
        assert_eq!(thousands(81_234.6), "81,235");
        assert_eq!(thousands(1_234_567.0), "1,234,567");
        assert_eq!(percent(0.4567), "45.7%");
        let c = calibration();
        assert_eq!(
            c.describe(),
            "300 connections, 2s each in turns: bare GET 80,000 req/s, bare POST 60,000 req/s; \
             target GET /version 68,000 req/s = 85.0% of the bare GET"
        );
        let t = Throughput::new("updates", 24_000.0, Reference::Post, &c);
        assert_eq!(
            t.describe(),
            "updates 24,000/s = 40.0% of the bare POST ceiling (60,000 req/s)"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_bare_handler_answers_both_requests() {
        let server = BareServer::start().unwrap();
        let base = server.base();
        for request in [
            render_request("GET", "/", &base.host, &[], None),
            render_request("POST", "/", &base.host, &[], Some(POST_BODY)),
        ] {
            let rate = drive(&base.connect, request, 4, Duration::from_millis(200))
                .await
                .unwrap();
            assert!(rate.ok > 0, "{rate:?}");
            assert_eq!(rate.errors, 0, "{rate:?}");
            assert!(rate.seconds >= 0.2, "{rate:?}");
        }
        // A path the handler does not serve counts as errors, not answers.
        let rate = drive(
            &base.connect,
            render_request("GET", "/nothing", &base.host, &[], None),
            2,
            Duration::from_millis(100),
        )
        .await
        .unwrap();
        assert_eq!(rate.ok, 0);
        assert!(rate.errors > 0);
    }
}
