//! The `console` scenario: the requests the web console makes, measured
//! with a fleet of 100,000 devices, so the issue's bar — the device list's
//! first page and the device page answered in under 100 ms — is a figure
//! with its command rather than a note.
//!
//! A run has three phases:
//!
//! 1. seed: `--seed-concurrency` workers `PUT /api/v1/devices/console-<n>`
//!    for `--devices` devices (type `em300th`, idempotent, so a second run
//!    against the same server replaces rather than adds);
//! 2. data: `--uplinks` decoded uplinks for the device the page is measured
//!    on (the last one), so its entity, history and live state exist, then
//!    a wait until its history holds them;
//! 3. measure: `--concurrency` clients send `--requests` requests of each
//!    kind, the kinds in turn (what the console asks, see [`Kind`]); each
//!    kind's latency is a trend of its own and each answer is checked.
//!
//! `--duration` is not used: the measure phase is a fixed number of
//! requests per kind, so runs compare request for request.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, ensure};
use serde_json::json;
use tokio::time::Instant;

use crate::common::{CommonArgs, Session};
use crate::history::client::{Caller, Tally};
use crate::http::{self, encode_query_value, render_request};
use crate::ingest::payload::{device_type_body, DEVICE_TYPE};
use crate::summary::{Check, Metric, Summary, Trend};

/// Devices on one page of the console's device list.
pub const PAGE: usize = 50;

/// History points the device page asks for (`lastN`).
pub const LAST_N: usize = 500;

/// The channel the seeded devices and the measured device's uplinks use.
const CHANNEL: &str = "consolebench";

/// Longest wait for one response.
const TIMEOUT: Duration = Duration::from_secs(30);

/// Flags of `weft bench console`.
#[derive(Debug, Clone, clap::Args)]
pub struct ConsoleArgs {
    /// The flags every scenario takes (--duration is not used: the
    /// measure phase sends a fixed number of requests).
    #[command(flatten)]
    pub common: CommonArgs,

    /// Devices registered before measuring (`console-000000` …).
    #[arg(long, default_value_t = 100_000)]
    pub devices: usize,

    /// Workers registering the devices at once.
    #[arg(long, default_value_t = 16)]
    pub seed_concurrency: usize,

    /// Uplinks sent for the measured device (its history and latest values).
    #[arg(long, default_value_t = 100)]
    pub uplinks: usize,

    /// Requests of each kind in the measure phase.
    #[arg(long, default_value_t = 200)]
    pub requests: usize,

    /// Clients of the measure phase (1: one console, latency alone).
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
}

impl ConsoleArgs {
    fn validate(&self) -> anyhow::Result<()> {
        ensure!(
            self.devices >= PAGE,
            "--devices must be at least {PAGE} (one page)"
        );
        ensure!(
            self.seed_concurrency >= 1,
            "--seed-concurrency must be at least 1"
        );
        ensure!(self.uplinks >= 1, "--uplinks must be at least 1");
        ensure!(self.requests >= 1, "--requests must be at least 1");
        ensure!(self.concurrency >= 1, "--concurrency must be at least 1");
        Ok(())
    }
}

/// What the console asks, one kind per metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// The device list as it opens: the first page and the total.
    FirstPage,
    /// The device list's last page (a large `offset`).
    LatePage,
    /// A search of ids and names for one device's name.
    Search,
    /// The device page: the device's record.
    Device,
    /// The device page: its NGSI entity (latest values).
    Entity,
    /// The device page: its network-server events.
    Events,
    /// The device page: its history (`lastN`), for the charts.
    History,
}

impl Kind {
    /// Every kind, in the order a client sends them.
    pub const ALL: [Kind; 7] = [
        Kind::FirstPage,
        Kind::LatePage,
        Kind::Search,
        Kind::Device,
        Kind::Entity,
        Kind::Events,
        Kind::History,
    ];

    /// The metric's name stem.
    pub fn name(self) -> &'static str {
        match self {
            Kind::FirstPage => "first_page",
            Kind::LatePage => "late_page",
            Kind::Search => "search",
            Kind::Device => "device",
            Kind::Entity => "entity",
            Kind::Events => "events",
            Kind::History => "history",
        }
    }

    /// The request's path and query for a fleet of `devices`.
    pub fn path(self, devices: usize) -> String {
        let id = device_id(devices - 1);
        match self {
            Kind::FirstPage => format!("/api/v1/devices?limit={PAGE}&offset=0"),
            Kind::LatePage => format!("/api/v1/devices?limit={PAGE}&offset={}", devices - PAGE),
            Kind::Search => format!(
                "/api/v1/devices?limit={PAGE}&q={}",
                encode_query_value(&device_name(devices - 1))
            ),
            Kind::Device => format!("/api/v1/devices/{id}"),
            Kind::Entity => format!("/v2/entities/{id}"),
            Kind::Events => format!("/api/v1/devices/{id}/events?limit=20"),
            Kind::History => format!("/ql/v2/entities/{id}?lastN={LAST_N}"),
        }
    }

    /// Whether `body` (of a 200) is what the console needs: a full page,
    /// the searched device, the device, its entity, its history.
    fn answered(self, body: &[u8], devices: usize) -> bool {
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else {
            return false;
        };
        let id = device_id(devices - 1);
        match self {
            Kind::FirstPage | Kind::LatePage => v.as_array().is_some_and(|a| a.len() == PAGE),
            Kind::Search => v
                .as_array()
                .is_some_and(|a| a.iter().any(|d| d["id"] == id.as_str())),
            Kind::Device | Kind::Entity => v["id"] == id.as_str(),
            Kind::Events => v["events"].is_array(),
            Kind::History => v["index"].as_array().is_some_and(|i| !i.is_empty()),
        }
    }
}

/// Device `n`'s id.
pub fn device_id(n: usize) -> String {
    format!("console-{n:06}")
}

/// Device `n`'s name (what the search looks for).
pub fn device_name(n: usize) -> String {
    format!("Console sensor {n}")
}

/// Runs the scenario against the session's server.
pub async fn run(args: &ConsoleArgs, session: &Session) -> anyhow::Result<Summary> {
    args.validate()?;
    let mut phases = Vec::new();

    http::put_setup(
        &session.base,
        &format!("/api/v1/device-types/{DEVICE_TYPE}"),
        &device_type_body(),
        "registering the em300th device type",
    )
    .await?;
    let started = Instant::now();
    let seeded = seed(args, session).await;
    let seed_secs = started.elapsed().as_secs_f64();
    phases.push(("seed".to_string(), seed_secs));
    if seeded.status(200) + seeded.status(201) < args.devices as u64 {
        bail!(
            "registering the devices failed: {:?} (connect errors {}, timeouts {})",
            seeded.statuses,
            seeded.connect_errors,
            seeded.timeouts
        );
    }

    let started = Instant::now();
    send_uplinks(args, session).await?;
    phases.push(("data".to_string(), started.elapsed().as_secs_f64()));

    let started = Instant::now();
    let measured = measure(args, session).await;
    let secs = started.elapsed().as_secs_f64();
    phases.push(("measure".to_string(), secs));

    let mut s = Summary {
        scenario: "console".to_string(),
        ok: false,
        target: session.base.to_string(),
        spawned: session.spawned(),
        params: params(args),
        phases,
        description: describe(args),
        checks: Vec::new(),
        metrics: BTreeMap::new(),
        notes: Vec::new(),
        calibration: None,
        throughput: None,
        memory: Vec::new(),
    };
    s.checks.push(Check::new(
        "devices registered (200/201)",
        seeded.status(200) + seeded.status(201),
        seeded.sent - seeded.status(200) - seeded.status(201),
    ));
    s.metrics
        .insert("seed_reqs".into(), Metric::counter(seeded.sent, seed_secs));
    s.metrics.insert(
        "seed_duration".into(),
        Metric::Trend(Trend::from_micros(&seeded.latency)),
    );
    let mut all = Tally::default();
    for (kind, (tally, good)) in &measured {
        s.checks.push(Check::new(
            format!(
                "GET {} answered 200 as the console needs",
                kind.path(args.devices)
            ),
            *good,
            tally.sent - good,
        ));
        s.metrics.insert(
            format!("{}_duration", kind.name()),
            Metric::Trend(Trend::from_micros(&tally.latency)),
        );
        all.merge(tally);
    }
    s.metrics
        .insert("console_reqs".into(), Metric::counter(all.sent, secs));
    s.metrics
        .insert("console_status".into(), all.status_metric());
    s.seal();
    Ok(s)
}

/// Phase 1: registers the devices, `--seed-concurrency` at a time.
async fn seed(args: &ConsoleArgs, session: &Session) -> Tally {
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let workers: Vec<_> = (0..args.seed_concurrency.min(args.devices))
        .map(|_| {
            let (next, base, devices) = (next.clone(), session.base.clone(), args.devices);
            tokio::spawn(async move {
                let mut caller = Caller::new(&base.connect, TIMEOUT);
                let mut tally = Tally::default();
                loop {
                    let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if n >= devices {
                        break tally;
                    }
                    let body =
                        json!({"name": device_name(n), "type": DEVICE_TYPE, "channel": CHANNEL});
                    let request = render_request(
                        "PUT",
                        &base.path(&format!("/api/v1/devices/{}", device_id(n))),
                        &base.host,
                        &[],
                        Some(body.to_string().as_bytes()),
                    );
                    caller.call(&request, None, &mut tally).await;
                }
            })
        })
        .collect();
    let mut all = Tally::default();
    for w in workers {
        if let Ok(t) = w.await {
            all.merge(&t);
        }
    }
    all
}

/// Phase 2: decoded uplinks for the measured device, a minute apart, then
/// waits until its history holds them all (the device page's chart).
async fn send_uplinks(args: &ConsoleArgs, session: &Session) -> anyhow::Result<()> {
    let n = args.devices - 1;
    let id = device_id(n);
    let key = crate::http::ingest_credential(args.common.ingest_key.as_deref());
    let headers: Vec<(&str, &str)> = key
        .as_deref()
        .map(|k| vec![("Authorization", k)])
        .unwrap_or_default();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as i64;
    let first = now - args.uplinks as i64 * 60_000;
    for i in 0..args.uplinks {
        let body = json!({"id": id, "name": device_name(n), "temperature": 20 + (i % 10),
                          "humidity": 50, "reported_at": first + i as i64 * 60_000,
                          "uuid": format!("{id}-{i}")});
        let path = format!("/sensor-data/{CHANNEL}/decoded/{DEVICE_TYPE}");
        let r = http::request(
            &session.base,
            "POST",
            &path,
            &headers,
            Some(body.to_string().as_bytes()),
            TIMEOUT,
        )
        .await?;
        if r.status != 202 {
            bail!("POST {path} answered {}: {}", r.status, r.text().trim());
        }
    }
    let path = format!(
        "/ql/v2/entities/{id}/attrs/temperature?lastN={}",
        args.uplinks
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = http::request(&session.base, "GET", &path, &[], None, TIMEOUT).await?;
        let stored = serde_json::from_slice::<serde_json::Value>(&r.body)
            .ok()
            .and_then(|v| v["values"].as_array().map(Vec::len))
            .unwrap_or(0);
        if stored >= args.uplinks {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "the measured device's history holds {stored} of {} values after 60 s",
                args.uplinks
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Phase 3: `--concurrency` clients, each sending its share of every
/// kind's `--requests`, the kinds in turn; per kind its tally and how many
/// answers were what the console needs.
async fn measure(args: &ConsoleArgs, session: &Session) -> BTreeMap<Kind, (Tally, u64)> {
    let requests: Vec<(Kind, Vec<u8>)> = Kind::ALL
        .iter()
        .map(|&k| {
            let target = session.base.path(&k.path(args.devices));
            (
                k,
                render_request("GET", &target, &session.base.host, &[], None),
            )
        })
        .collect();
    let requests = std::sync::Arc::new(requests);
    let clients: Vec<_> = (0..args.concurrency)
        .map(|c| {
            let share = args.requests / args.concurrency
                + usize::from(c < args.requests % args.concurrency);
            let (requests, connect, devices) =
                (requests.clone(), session.base.connect.clone(), args.devices);
            tokio::spawn(async move {
                let mut caller = Caller::new(&connect, TIMEOUT);
                let mut out: BTreeMap<Kind, (Tally, u64)> = BTreeMap::new();
                let mut body = Vec::new();
                for _ in 0..share {
                    for (kind, request) in requests.iter() {
                        let (tally, good) = out.entry(*kind).or_default();
                        body.clear();
                        let head = caller.call(request, Some(&mut body), tally).await;
                        if head.is_some_and(|h| h.status == 200) && kind.answered(&body, devices) {
                            *good += 1;
                        }
                    }
                }
                out
            })
        })
        .collect();
    let mut all: BTreeMap<Kind, (Tally, u64)> = BTreeMap::new();
    for c in clients {
        if let Ok(part) = c.await {
            for (kind, (tally, good)) in part {
                let (t, g) = all.entry(kind).or_default();
                t.merge(&tally);
                *g += good;
            }
        }
    }
    all
}

/// The parameters as JSON, for `--json` readers and `docs/console.md`.
fn params(args: &ConsoleArgs) -> serde_json::Map<String, serde_json::Value> {
    let v = json!({
        "devices": args.devices,
        "seed_concurrency": args.seed_concurrency,
        "uplinks": args.uplinks,
        "requests": args.requests,
        "concurrency": args.concurrency,
        "page": PAGE,
        "last_n": LAST_N,
    });
    match v {
        serde_json::Value::Object(map) => map,
        _ => unreachable!("json! of an object literal is an object"),
    }
}

/// The lines under `scenario:` describing the load.
fn describe(args: &ConsoleArgs) -> Vec<String> {
    vec![
        format!(
            "seed: {} devices PUT by {} workers; {} uplinks for {}",
            args.devices,
            args.seed_concurrency,
            args.uplinks,
            device_id(args.devices - 1)
        ),
        format!(
            "measure: {} client(s) × {} requests of each of {} kinds, in turn \
             (device list first and late page, search, device page: record, entity, events, history)",
            args.concurrency,
            args.requests,
            Kind::ALL.len()
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse_with_defaults() {
        let crate::BenchCommand::Console(args) =
            crate::parse_command(&["console", "--spawn", "--devices", "2000"])
        else {
            panic!("not the console scenario");
        };
        assert_eq!(
            (args.devices, args.requests, args.concurrency, args.uplinks),
            (2000, 200, 1, 100)
        );
        assert!(args.validate().is_ok());
        let mut small = args.clone();
        small.devices = 10;
        assert!(small.validate().is_err());
    }

    #[test]
    fn paths_name_the_last_device_and_the_last_page() {
        assert_eq!(
            Kind::LatePage.path(100_000),
            "/api/v1/devices?limit=50&offset=99950"
        );
        assert_eq!(
            Kind::Search.path(100_000),
            "/api/v1/devices?limit=50&q=Console%20sensor%2099999"
        );
        assert_eq!(
            Kind::History.path(100_000),
            "/ql/v2/entities/console-099999?lastN=500"
        );
    }

    #[test]
    fn answers_are_checked_for_what_the_console_needs() {
        let page: Vec<_> = (0..PAGE).map(|n| json!({"id": device_id(n)})).collect();
        let page = serde_json::to_vec(&page).unwrap();
        assert!(Kind::FirstPage.answered(&page, 100));
        assert!(!Kind::FirstPage.answered(b"[]", 100));
        assert!(Kind::Device.answered(br#"{"id":"console-000099"}"#, 100));
        assert!(!Kind::Device.answered(br#"{"id":"console-000001"}"#, 100));
        assert!(Kind::History.answered(br#"{"index":["t"]}"#, 100));
        assert!(!Kind::History.answered(b"not json", 100));
    }
}
