//! The `ingest` scenario: seed 000's throughput and availability tests.
//!
//! A run goes through five phases, each a function below:
//!
//! 1. register the `em300th` device type (decoder and processor mappings);
//! 2. subscribe to a fresh channel on the live websocket — before any load,
//!    so nothing can be missed for want of a subscriber;
//! 3. load: N devices post uplinks, half encoded, half decoded, either each
//!    once per interval (closed loop, like the seed's k6 VUs) or on a fixed
//!    clock at `--rate` (open loop);
//! 4. drain: wait up to `--drain-timeout` for the socket to deliver what
//!    was accepted;
//! 5. verify: read the channel back from the store and check every
//!    accepted uplink was delivered and stored exactly once.
//!
//! The channel name is random per run, so the checks only see this run's
//! data even against a long-lived server.

pub mod live;
pub mod load;
pub mod payload;
pub mod schedule;
pub mod verify;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::ensure;
use rand::distr::{Alphanumeric, SampleString};
use serde_json::json;
use tokio::time::Instant;

use crate::common::{CommonArgs, Session};
use crate::summary::{format_duration_us, Check, Metric, Summary, Trend};
use crate::{http, progress};
use live::Live;
use load::{Counters, LoadReport, Model, Plan};
use payload::{device_form, Device, Heads};
use schedule::{OpenClock, OpenSchedule};
use verify::{retain_missing, tally, Stored, Tally};

/// How often the drain phase looks for the missing deliveries.
const DRAIN_POLL: Duration = Duration::from_millis(50);

/// Pause between store reads while stored units are still missing.
const STORE_POLL: Duration = Duration::from_millis(500);

/// The share of the nominal closed-loop rate below which the summary
/// warns that the generator could not offer the load it was asked for.
const SHORTFALL_WARNING: f64 = 0.95;

/// Flags of `weft bench ingest`.
#[derive(Debug, Clone, clap::Args)]
pub struct IngestArgs {
    /// The flags every scenario takes.
    #[command(flatten)]
    pub common: CommonArgs,

    /// Simulated devices; each has its own id and name.
    #[arg(long, default_value_t = 500)]
    pub devices: usize,

    /// Closed loop: each device posts one uplink per interval (at most one
    /// in flight), as the seed's k6 VUs did.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub interval: Duration,

    /// Open loop: total uplinks per second across all devices, sent on a
    /// fixed clock whatever the responses (overrides --interval).
    #[arg(long)]
    pub rate: Option<f64>,

    /// Most connections, and so most requests in flight. In open loop a
    /// send that finds none free in time is dropped by the generator and
    /// reported as such.
    #[arg(long, default_value_t = 256)]
    pub connections: usize,

    /// Share of devices sending encoded (raw base64 payload) uplinks; the
    /// rest send decoded values.
    #[arg(long, default_value_t = 0.5)]
    pub encoded_ratio: f64,

    /// After the load, how long to wait for the remaining websocket
    /// deliveries (and then for the store) before checking.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub drain_timeout: Duration,
}

impl IngestArgs {
    fn validate(&self) -> anyhow::Result<()> {
        ensure!(self.devices >= 1, "--devices must be at least 1");
        ensure!(self.connections >= 1, "--connections must be at least 1");
        ensure!(
            (0.0..=1.0).contains(&self.encoded_ratio),
            "--encoded-ratio must be between 0 and 1"
        );
        ensure!(!self.interval.is_zero(), "--interval must be positive");
        ensure!(
            !self.common.duration.is_zero(),
            "--duration must be positive"
        );
        if let Some(rate) = self.rate {
            ensure!(
                rate.is_finite() && rate > 0.0,
                "--rate must be a positive number"
            );
        }
        Ok(())
    }

    /// Uplinks per second the run is meant to offer.
    fn nominal_rate(&self) -> f64 {
        self.rate
            .unwrap_or(self.devices as f64 / self.interval.as_secs_f64())
    }
}

/// What the run's websocket subscriber watches, and so what it must see.
#[derive(Debug, Clone, Copy)]
pub enum Watch {
    /// Every accepted uplink's data unit (the `ingest` scenario).
    Data,
    /// The alarm of every accepted uplink hotter than `threshold` °C,
    /// raised by a rule the run creates (the `alarms` scenario).
    Alarms {
        /// The rule's condition is `temperature>threshold`.
        threshold: f64,
    },
}

/// Runs the scenario against the session's server.
pub async fn run(args: &IngestArgs, session: &Session) -> anyhow::Result<Summary> {
    run_watching(args, session, Watch::Data).await
}

/// Runs the ingest load with the subscriber watching `watch`; the
/// `alarms` scenario is this with [`Watch::Alarms`].
pub async fn run_watching(
    args: &IngestArgs,
    session: &Session,
    watch: Watch,
) -> anyhow::Result<Summary> {
    args.validate()?;
    let channel = format!("bench{}", Alphanumeric.sample_string(&mut rand::rng(), 6));
    register_device_type(session).await?;
    let (live, mark_above) = match watch {
        Watch::Data => (Live::subscribe(&session.base, &channel).await?, None),
        Watch::Alarms { threshold } => {
            create_rule(session, &channel, threshold).await?;
            let live = Live::subscribe_alarms(&session.base, &channel).await?;
            (live, Some(threshold))
        }
    };

    let load = generate(args, session, &channel, &live, mark_above).await;
    let accepted: HashSet<u128> = load.accepted.iter().copied().collect();
    // What the socket must deliver: every accepted unit, or every alarm.
    let owed_list = match watch {
        Watch::Data => &load.accepted,
        Watch::Alarms { .. } => &load.marked,
    };
    let owed: HashSet<u128> = owed_list.iter().copied().collect();

    let drain_started = Instant::now();
    drain(args, session, &live, owed_list).await;
    let live_state = live.finish().await;
    let drain_elapsed = drain_started.elapsed();

    let verify_started = Instant::now();
    let stored = verify_store(args, session, &channel, &accepted).await;
    let verify_elapsed = verify_started.elapsed();

    let ws = tally(&owed, &live_state.seen);
    let mut s = Summary {
        scenario: match watch {
            Watch::Data => "ingest",
            Watch::Alarms { .. } => "alarms",
        }
        .to_string(),
        ok: false,
        target: session.targets(),
        spawned: session.spawned(),
        params: params(args, &channel),
        phases: vec![
            ("load".to_string(), load.elapsed.as_secs_f64()),
            ("drain".to_string(), drain_elapsed.as_secs_f64()),
            ("verify".to_string(), verify_elapsed.as_secs_f64()),
        ],
        description: describe(args, &channel, watch),
        checks: Vec::new(),
        metrics: BTreeMap::new(),
        notes: Vec::new(),
        calibration: None,
        throughput: None,
        memory: Vec::new(),
    };

    let load_secs = load.elapsed.as_secs_f64();
    let ok_202 = load.status(202);
    let overloaded = load.status(503) + load.status(429);
    s.checks
        .push(Check::new("status was 202", ok_202, load.sent - ok_202));
    match watch {
        Watch::Data => s.checks.push(Check::new(
            "every accepted uplink delivered on the socket",
            ws.once + ws.repeated,
            ws.missing,
        )),
        Watch::Alarms { .. } => {
            s.checks.push(Check::new(
                "every matching uplink raised or updated its alarm on the socket",
                ws.once + ws.repeated,
                ws.missing,
            ));
            s.checks.push(Check::new(
                "no alarm event for a non-matching uplink, none twice",
                ws.once,
                ws.repeated + ws.unexpected,
            ));
        }
    }
    match &stored {
        Ok((_, t)) => s.checks.push(Check::new(
            "every accepted uplink stored exactly once",
            t.once,
            t.missing + t.repeated,
        )),
        Err(e) => {
            s.checks.push(Check::new(
                "every accepted uplink stored exactly once",
                0,
                (accepted.len() as u64).max(1),
            ));
            s.notes.push(format!("the store could not be read: {e:#}"));
        }
    }
    s.checks.push(Check::new(
        "live subscription stayed open",
        u64::from(live_state.failure.is_none()),
        u64::from(live_state.failure.is_some()),
    ));

    let m = &mut s.metrics;
    m.insert("http_reqs".into(), Metric::counter(load.sent, load_secs));
    m.insert(
        "http_req_duration".into(),
        Metric::Trend(Trend::from_micros(&load.latency)),
    );
    m.insert(
        "http_req_failed".into(),
        Metric::rate(load.sent - ok_202, ok_202),
    );
    m.insert("http_req_overloaded".into(), Metric::count(overloaded));
    m.insert("http_status".into(), status_tally(&load));
    m.insert(
        "uplinks_accepted".into(),
        Metric::counter(ok_202, load_secs),
    );
    m.insert(
        "uplinks_dropped_by_generator".into(),
        Metric::count(load.dropped),
    );
    m.insert(
        "ws_msgs_received".into(),
        Metric::counter(
            live_state.messages,
            (load.elapsed + drain_elapsed).as_secs_f64(),
        ),
    );
    // For alarms, the seed's names: `time_lapse` from the alarm's change
    // to the socket, `time_lapse_full` from the uplink's `reportedAt`.
    let (full, partial) = match watch {
        Watch::Data => ("time_lapse", "delivery_lapse"),
        Watch::Alarms { .. } => ("time_lapse_full", "time_lapse"),
    };
    m.insert(
        full.into(),
        Metric::Trend(Trend::from_micros(&live_state.time_lapse)),
    );
    m.insert(
        partial.into(),
        Metric::Trend(Trend::from_micros(&live_state.delivery_lapse)),
    );
    if matches!(watch, Watch::Alarms { .. }) {
        m.insert(
            "uplinks_matching".into(),
            Metric::count(load.marked.len() as u64),
        );
    }
    m.insert("ws_duplicates".into(), Metric::count(ws.repeated));
    m.insert("ws_missing".into(), Metric::count(ws.missing));
    m.insert(
        "ws_unexpected".into(),
        Metric::count(ws.unexpected + live_state.foreign),
    );
    if let Ok((stored, t)) = &stored {
        m.insert("store_units".into(), Metric::count(stored.units));
        m.insert("store_missing".into(), Metric::count(t.missing));
        m.insert("store_duplicates".into(), Metric::count(t.repeated));
        m.insert(
            "store_unexpected".into(),
            Metric::count(t.unexpected + stored.foreign),
        );
    }

    if load.dropped > 0 {
        s.notes.push(format!(
            "the generator dropped {} of {} scheduled uplinks: no connection was free within {} of their send time \
             (raise --connections, or the server is saturated)",
            load.dropped,
            load.dropped + load.sent,
            format_duration_us(load::SEND_GRACE.as_micros() as f64),
        ));
    }
    if args.rate.is_none() {
        let offered = load.sent as f64 / load_secs.max(1e-9);
        if offered < args.nominal_rate() * SHORTFALL_WARNING {
            s.notes.push(format!(
                "offered {offered:.1} uplinks/s, below the nominal {:.1}/s: responses were slower than the interval \
                 allows (closed loop slows down with the server)",
                args.nominal_rate()
            ));
        }
    }
    if load.retry_pauses > 0 {
        s.notes.push(format!(
            "connections paused {} times for Retry-After",
            load.retry_pauses
        ));
    }
    if let Some(failure) = &live_state.failure {
        s.notes.push(format!("live socket: {failure}"));
    }
    s.seal();
    Ok(s)
}

/// Phase 1: `PUT /api/v1/device-types/em300th`.
async fn register_device_type(session: &Session) -> anyhow::Result<()> {
    let path = format!("/api/v1/device-types/{}", payload::DEVICE_TYPE);
    let what = format!("registering the {} device type", payload::DEVICE_TYPE);
    http::put_setup(&session.base, &path, &payload::device_type_body(), &what).await
}

/// For the `alarms` scenario: a rule on this run's channel raising an
/// alarm of type `<channel>` on every uplink hotter than `threshold`, with
/// the seed's description `{{dataId}};{{reportedAt}};{{device.id}}`.
async fn create_rule(session: &Session, channel: &str, threshold: f64) -> anyhow::Result<()> {
    let rule = json!({
        "name": "bench hot soil",
        "scope": {"types": [payload::DEVICE_TYPE], "channels": [channel]},
        "condition": format!("temperature>{threshold}"),
        "alarm": {"type": channel, "category": "perfTest", "subCategory": "alarmPerformance",
                  "severity": "critical", "description": "{{dataId}};{{reportedAt}};{{device.id}}"}
    });
    let path = format!("/api/v1/rules/{channel}");
    http::put_setup(
        &session.base,
        &path,
        rule.to_string().as_bytes(),
        "creating the alarm rule",
    )
    .await
}

/// Phase 3: the load, with a progress bar fed from the workers' counters.
async fn generate(
    args: &IngestArgs,
    session: &Session,
    channel: &str,
    live: &Live,
    mark_above: Option<f64>,
) -> LoadReport {
    let mut rng = rand::rng();
    let devices: Vec<Device> = (0..args.devices)
        .map(|i| Device::new(i, device_form(i, args.encoded_ratio), &mut rng))
        .collect();
    let model = match args.rate {
        Some(rate) => Model::Open {
            clock: OpenClock::new(OpenSchedule::new(rate, args.common.duration)),
        },
        None => Model::Closed {
            interval: args.interval,
        },
    };
    let plan = Arc::new(Plan {
        connects: session.connects(),
        heads: Heads::new(
            &session.base.prefix,
            &session.base.host,
            channel,
            crate::http::ingest_credential(args.common.ingest_key.as_deref()).as_deref(),
        ),
        devices,
        model,
        connections: args.connections,
        duration: args.common.duration,
        mark_above,
    });
    let counters = Arc::new(Counters::default());
    let bar = progress::timed_bar(session.show_progress, "ingest", args.common.duration);
    let start = Instant::now();
    let load = load::run(plan, counters.clone(), start);
    tokio::pin!(load);
    let mut tick = tokio::time::interval(progress::REFRESH);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let report = loop {
        tokio::select! {
            report = &mut load => break report,
            _ = tick.tick(), if !bar.is_hidden() => {
                let elapsed = start.elapsed();
                bar.set_position(elapsed.as_millis() as u64);
                let sent = counters.sent.load(Ordering::Relaxed);
                bar.set_message(format!(
                    "{sent} sent ({:.0}/s), {} accepted, {} failed, {} dropped, {} on socket",
                    sent as f64 / elapsed.as_secs_f64().max(1e-3),
                    counters.accepted.load(Ordering::Relaxed),
                    counters.failed.load(Ordering::Relaxed),
                    counters.dropped.load(Ordering::Relaxed),
                    live.events(),
                ));
            }
        }
    };
    bar.finish_and_clear();
    report
}

/// Phase 4: wait until every accepted uplink was seen on the socket, the
/// socket failed, or the drain timeout passed.
async fn drain(args: &IngestArgs, session: &Session, live: &Live, accepted: &[u128]) {
    let bar = progress::spinner(session.show_progress, "drain");
    let started = Instant::now();
    let mut pending = accepted.to_vec();
    loop {
        {
            let state = live.lock();
            retain_missing(&mut pending, &state.seen);
            if state.failure.is_some() {
                break;
            }
        }
        if pending.is_empty() || started.elapsed() >= args.drain_timeout {
            break;
        }
        bar.set_message(format!(
            "{} accepted uplinks not yet on the socket",
            pending.len()
        ));
        tokio::time::sleep(DRAIN_POLL).await;
    }
    bar.finish_and_clear();
}

/// Phase 5: read the channel back from the store, re-reading while accepted
/// uplinks are still missing and the drain timeout allows (the store may
/// lag the socket).
async fn verify_store(
    args: &IngestArgs,
    session: &Session,
    channel: &str,
    accepted: &HashSet<u128>,
) -> anyhow::Result<(Stored, Tally)> {
    let bar = progress::spinner(session.show_progress, "verify");
    let started = Instant::now();
    let result = loop {
        let stored = match verify::read_store(&session.base, channel, &bar).await {
            Ok(stored) => stored,
            Err(e) => break Err(e),
        };
        let t = tally(accepted, &stored.counts);
        if t.missing == 0 || started.elapsed() + STORE_POLL >= args.drain_timeout {
            break Ok((stored, t));
        }
        bar.set_message(format!("{} accepted uplinks not yet stored", t.missing));
        tokio::time::sleep(STORE_POLL).await;
    };
    bar.finish_and_clear();
    result
}

/// Responses by status, plus the requests that got none.
fn status_tally(load: &LoadReport) -> Metric {
    let mut values: BTreeMap<String, u64> = load
        .statuses
        .iter()
        .map(|(s, n)| (s.to_string(), *n))
        .collect();
    for (label, n) in [
        ("connect_error", load.connect_errors),
        ("broken", load.io_errors),
        ("timeout", load.timeouts),
    ] {
        if n > 0 {
            values.insert(label.to_string(), n);
        }
    }
    Metric::Tally { values }
}

/// The parameters as JSON, for `--json` readers and `docs/benchmarks.md`.
fn params(args: &IngestArgs, channel: &str) -> serde_json::Map<String, serde_json::Value> {
    let v = json!({
        "model": if args.rate.is_some() { "open" } else { "closed" },
        "devices": args.devices,
        "interval": humantime::format_duration(args.interval).to_string(),
        "rate": args.rate,
        "nominal_rate": args.nominal_rate(),
        "connections": args.connections,
        "encoded_ratio": args.encoded_ratio,
        "duration": humantime::format_duration(args.common.duration).to_string(),
        "drain_timeout": humantime::format_duration(args.drain_timeout).to_string(),
        "channel": channel,
        "send_grace_ms": load::SEND_GRACE.as_millis() as u64,
    });
    match v {
        serde_json::Value::Object(map) => map,
        _ => unreachable!("json! of an object literal is an object"),
    }
}

/// The lines under `scenario:` describing the load.
fn describe(args: &IngestArgs, channel: &str, watch: Watch) -> Vec<String> {
    let duration = humantime::format_duration(args.common.duration);
    let load = match args.rate {
        Some(rate) => format!(
            "open loop: {rate} uplinks/s for {duration} over {} devices, at most {} in flight",
            args.devices, args.connections
        ),
        None => format!(
            "closed loop: {} devices × 1 uplink every {} for {duration} ({:.1}/s nominal) over {} connections",
            args.devices,
            humantime::format_duration(args.interval),
            args.nominal_rate(),
            args.connections.min(args.devices)
        ),
    };
    let mut lines = vec![
        load,
        format!(
            "{:.0}% encoded, {:.0}% decoded em300th uplinks on channel {channel}",
            args.encoded_ratio * 100.0,
            (1.0 - args.encoded_ratio) * 100.0
        ),
    ];
    if let Watch::Alarms { threshold } = watch {
        lines.push(format!(
            "one rule temperature>{threshold} (temperature uniform 1..50); the socket watches its alarms"
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> IngestArgs {
        let cmd = crate::parse_command(&[&["ingest"], args].concat());
        let crate::BenchCommand::Ingest(args) = cmd else {
            panic!("not parsed as ingest");
        };
        args
    }

    #[test]
    fn defaults_match_the_seed() {
        let a = parse(&[]);
        assert_eq!(a.devices, 500);
        assert_eq!(a.interval, Duration::from_secs(1));
        assert_eq!(a.rate, None);
        assert_eq!(a.connections, 256);
        assert_eq!(a.encoded_ratio, 0.5);
        assert_eq!(a.drain_timeout, Duration::from_secs(10));
        assert_eq!(a.common.duration, Duration::from_secs(60));
        assert_eq!(a.common.url, ["http://127.0.0.1:8080"]);
        assert!(!a.common.spawn && !a.common.json && !a.common.no_progress);
        assert_eq!(a.nominal_rate(), 500.0);
        a.validate().unwrap();
    }

    #[test]
    fn flags_parse() {
        let a = parse(&[
            "--spawn",
            "--duration",
            "5s",
            "--rate",
            "20000",
            "--connections",
            "64",
            "--encoded-ratio",
            "0.25",
            "--drain-timeout",
            "2s",
            "--ingest-key",
            "k",
            "--json",
            "--no-progress",
        ]);
        assert!(a.common.spawn && a.common.json && a.common.no_progress);
        assert_eq!(a.common.duration, Duration::from_secs(5));
        assert_eq!(a.rate, Some(20000.0));
        assert_eq!(a.nominal_rate(), 20000.0);
        assert_eq!(a.common.ingest_key.as_deref(), Some("k"));
        let d = describe(&a, "benchX", Watch::Data);
        assert!(
            d[0].starts_with("open loop: 20000 uplinks/s for 5s"),
            "{d:?}"
        );
        assert!(d[1].starts_with("25% encoded"), "{d:?}");
        assert!(parse(&["--encoded-ratio", "2"]).validate().is_err());
        assert!(parse(&["--rate", "0"]).validate().is_err());
    }

    #[test]
    fn help_lists_every_flag() {
        let err = crate::try_parse_command(&["ingest", "--help"])
            .err()
            .unwrap();
        let help = err.to_string();
        for flag in [
            "--url",
            "--spawn",
            "--duration",
            "--json",
            "--ingest-key",
            "--no-progress",
            "--devices",
            "--interval",
            "--rate",
            "--connections",
            "--encoded-ratio",
            "--drain-timeout",
        ] {
            assert!(help.contains(flag), "{flag} missing from\n{help}");
        }
    }

    #[test]
    fn channel_names_are_valid() {
        for _ in 0..100 {
            let c = format!("bench{}", Alphanumeric.sample_string(&mut rand::rng(), 6));
            assert_eq!(c.len(), 11);
            assert!(c.bytes().all(|b| b.is_ascii_alphanumeric()));
        }
    }
}
