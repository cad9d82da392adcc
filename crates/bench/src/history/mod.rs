//! The `history` scenario: seed 003's load test of QuantumLeap (k6 POSTing
//! Orion-style notifications of a `Room` entity to `/v2/notify`), then the
//! history queries QuantumLeap exists to answer.
//!
//! A run goes through four phases (five with a preload), after one setup
//! notification of `Room:setup` that creates the run's tenant and `Room`
//! type before the clients start ([`notify::setup`]):
//!
//! 1. notify: `--concurrency` closed-loop clients, one keep-alive
//!    connection each, POST QuantumLeap's k6 body to `/v2/notify` back to
//!    back for `--duration`, spread over `--entities` entities `Room:<n>`.
//!    Every notification has its own time index (`TimeInstant`, one minute
//!    after the entity's previous one) and `temperature` = its number, so
//!    each 200 owes exactly three rows (`TimeInstant`, `temperature`,
//!    `pressure`) that can be told apart ([`series`]);
//! 2. settle, then verify: one query waits until the history holds what
//!    was acknowledged (its time counts in `notifications_stored`'s rate,
//!    [`verify::settle`]); then every entity (or a sample of 200) is read
//!    back through `/ql/v2`: "rows stored = notifications sent"
//!    ([`verify`]);
//! 3. preload (`--preload-rows N`): `Room:big` is filled with N rows,
//!    a thousand states per notification, one second apart ([`preload`]),
//!    and its rows counted;
//! 4. query: `--query-concurrency` clients ask `lastN=100`, an hour's
//!    range and a day of hourly averages (or the kinds named by
//!    `--queries`) for `--query-duration`, of the load entities and of
//!    `Room:big`; every answer is checked ([`query`]).
//!
//! The run uses a fresh random tenant (`Fiware-Service`), so its rows
//! never clash with earlier runs against a long-lived server.

pub mod answer;
pub mod client;
pub mod notify;
pub mod payload;
pub mod preload;
pub mod query;
pub mod series;
pub mod verify;

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::ensure;
use serde_json::json;
use tokio::time::Instant;

use crate::common::{CommonArgs, Session};
use crate::ngsi_update::new_tenant;
use crate::summary::{Check, Metric, Summary, Trend};
use client::Tally;
use payload::{NotifyHead, ATTRS_PER_ENTITY, BIG_ENTITY, SETUP_ENTITY};
use query::{Class, Kind};

/// Time index of notification 0 of every series: 2025-01-01T00:00:00.000Z.
/// A fixed origin keeps every run's windows alike (and the tenant is new).
pub const ORIGIN_MS: i64 = 1_735_689_600_000;

/// Time between a load entity's consecutive notifications: one minute,
/// a sensor's usual period, so an hour's range holds 60 values and a day
/// of hourly averages up to 24 buckets of 60.
pub const NOTIFY_STEP_MS: i64 = 60_000;

/// Flags of `weft bench history`.
#[derive(Debug, Clone, clap::Args)]
pub struct HistoryArgs {
    /// The flags every scenario takes (--duration is the notify phase's).
    #[command(flatten)]
    pub common: CommonArgs,

    /// Entities `Room:<n>` the notifications are spread over.
    #[arg(long, default_value_t = 100)]
    pub entities: usize,

    /// Closed-loop clients of the notify phase, each with one connection
    /// and one notification in flight (capped at --entities: each owns its
    /// entities).
    #[arg(long, default_value_t = 100)]
    pub concurrency: usize,

    /// How long the query phase lasts (0s skips it).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub query_duration: Duration,

    /// Closed-loop clients of the query phase.
    #[arg(long, default_value_t = 8)]
    pub query_concurrency: usize,

    /// The queries asked, in turn (comma list of lastn, range, avg_hour):
    /// one kind alone measures its latency without the others queueing
    /// ahead of it.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "lastn,range,avg_hour",
        value_parser = Kind::parse
    )]
    pub queries: Vec<Kind>,

    /// Root of the query API the stored rows are read back through:
    /// weft's `/ql/v2`, or `/v2` for QuantumLeap itself (and for weft's
    /// `history.quantumleap_listen` port).
    #[arg(long, default_value = "/ql/v2")]
    pub query_root: String,

    /// Before the query phase, store this many extra rows (3 per state:
    /// TimeInstant, temperature, pressure) for one entity `Room:big`, one
    /// state a second, and query it too; e.g. 10000000.
    #[arg(long, default_value_t = 0)]
    pub preload_rows: u64,
}

impl HistoryArgs {
    fn validate(&self) -> anyhow::Result<()> {
        ensure!(self.entities >= 1, "--entities must be at least 1");
        ensure!(self.concurrency >= 1, "--concurrency must be at least 1");
        ensure!(
            self.query_root.starts_with('/') && !self.query_root.ends_with('/'),
            "--query-root must start with '/' and not end with one (e.g. /ql/v2)"
        );
        ensure!(
            !self.common.duration.is_zero(),
            "--duration must be positive"
        );
        ensure!(
            self.query_concurrency >= 1,
            "--query-concurrency must be at least 1"
        );
        ensure!(!self.queries.is_empty(), "--queries names no query");
        Ok(())
    }

    /// Notify clients actually run: one per entity at most.
    pub(crate) fn clients(&self) -> usize {
        self.concurrency.min(self.entities)
    }
}

/// Runs the scenario against the session's server.
pub async fn run(args: &HistoryArgs, session: &Session) -> anyhow::Result<Summary> {
    args.validate()?;
    let tenant = new_tenant();
    let mut phases = Vec::new();
    let mut notes = Vec::new();

    let head = NotifyHead::new(&session.base.prefix, &session.base.host, &tenant);
    let started = Instant::now();
    let setup = notify::setup(&session.base.connect, &head, ORIGIN_MS).await;
    phases.push(("setup".to_string(), started.elapsed().as_secs_f64()));
    if setup != Some(200) {
        notes.push(format!(
            "the setup notification of {SETUP_ENTITY} was answered {}",
            setup.map_or_else(|| "not at all".to_string(), |s| s.to_string())
        ));
    }

    let notify = notify::generate(
        notify::Plan {
            connect: session.base.connect.clone(),
            head,
            entities: args.entities,
            clients: args.clients(),
            duration: args.common.duration,
            origin: ORIGIN_MS,
            step: NOTIFY_STEP_MS,
        },
        session.show_progress,
    )
    .await;
    phases.push(("notify".to_string(), notify.elapsed.as_secs_f64()));
    let settled = verify::settle(session, &tenant, &args.query_root).await;
    phases.push(("settle".to_string(), settled.as_secs_f64()));

    let started = Instant::now();
    let verified = verify::verify(session, &tenant, &args.query_root, &notify.series).await;
    phases.push(("verify".to_string(), started.elapsed().as_secs_f64()));

    let mut big = None;
    if args.preload_rows > 0 {
        let report = preload::preload(session, &tenant, args.preload_rows, ORIGIN_MS).await;
        phases.push(("preload".to_string(), report.elapsed.as_secs_f64()));
        let started = Instant::now();
        let (tally, counted) = verify::check_big(
            session,
            &tenant,
            &args.query_root,
            BIG_ENTITY,
            &report.series,
        )
        .await;
        phases.push(("count big".to_string(), started.elapsed().as_secs_f64()));
        big = Some((report, tally, counted));
    }

    let load: Vec<(usize, series::Series)> = notify
        .series
        .iter()
        .enumerate()
        .filter(|(_, s)| s.sent() > 0)
        .map(|(e, s)| (e, s.clone()))
        .collect();
    let queried = if args.query_duration.is_zero() {
        None
    } else {
        let big_series = big.as_ref().map(|(r, ..)| r.series.clone());
        let mix = query::Plan::mix(&args.queries, !load.is_empty(), big_series.is_some());
        if load.is_empty() {
            notes.push("no entity was notified, so none was queried".to_string());
        }
        let report = query::run(
            query::Plan {
                connect: session.base.connect.clone(),
                host: session.base.host.clone(),
                prefix: session.base.prefix.clone(),
                root: args.query_root.clone(),
                tenant: tenant.clone(),
                load,
                big: big_series,
                mix: mix.clone(),
                clients: args.query_concurrency,
                duration: args.query_duration,
            },
            session.show_progress,
        )
        .await;
        phases.push(("query".to_string(), report.elapsed.as_secs_f64()));
        Some((mix, report))
    };

    let mut s = Summary {
        scenario: "history".to_string(),
        ok: false,
        target: session.base.to_string(),
        spawned: session.spawned(),
        params: params(args, &tenant),
        phases,
        description: describe(args, &tenant),
        checks: Vec::new(),
        metrics: BTreeMap::new(),
        notes,
        calibration: None,
        throughput: None,
        memory: Vec::new(),
    };

    // Notify and verify. Notifications count as stored at the rate of
    // the notify phase and the wait until a query saw them all.
    let secs = notify.elapsed.as_secs_f64();
    let stored_secs = secs + settled.as_secs_f64();
    let sent = notify.tally.sent;
    s.checks.push(Check::new(
        "notify status was 200",
        notify.ok,
        sent - notify.ok,
    ));
    s.checks.push(Check::new(
        "rows stored = notifications sent (3 rows each, values as sent)",
        verified.matched,
        verified.mismatched + verified.errors,
    ));
    let m = &mut s.metrics;
    m.insert("notify_reqs".into(), Metric::counter(sent, secs));
    m.insert(
        "notify_duration".into(),
        Metric::Trend(Trend::from_micros(&notify.tally.latency)),
    );
    m.insert(
        "notify_failed".into(),
        Metric::rate(sent - notify.ok, notify.ok),
    );
    m.insert("notify_status".into(), notify.tally.status_metric());
    m.insert(
        "notifications_stored".into(),
        Metric::counter(notify.ok, stored_secs),
    );
    m.insert(
        "rows_stored".into(),
        Metric::counter(notify.ok * ATTRS_PER_ENTITY, stored_secs),
    );
    m.insert("entities_verified".into(), Metric::count(verified.checked));
    m.insert("rows_verified".into(), Metric::count(verified.rows));
    if verified.sampled {
        s.notes.push(format!(
            "verified a random sample of {} of the {} entities",
            verified.checked, args.entities
        ));
    }
    if verified.unsure > 0 {
        s.notes.push(format!(
            "{} verified entities had a notification answered other than 200 (or not at all): \
             its rows were allowed to be stored or not",
            verified.unsure
        ));
    }
    s.notes.extend(verified.examples.iter().cloned());
    if notify.tally.retry_pauses > 0 {
        s.notes.push(format!(
            "notify clients paused {} times for Retry-After",
            notify.tally.retry_pauses
        ));
    }
    if args.concurrency > args.entities {
        s.notes.push(format!(
            "--concurrency {} capped at --entities {}: each client owns at least one entity",
            args.concurrency, args.entities
        ));
    }

    // Preload.
    if let Some((report, tally, counted)) = &big {
        let secs = report.elapsed.as_secs_f64();
        s.checks.push(Check::new(
            "preload status was 200",
            report.batches_ok,
            report.batches_failed,
        ));
        let ok = counted.is_ok();
        s.checks.push(Check::new(
            format!("{BIG_ENTITY} rows stored = rows sent"),
            u64::from(ok),
            u64::from(!ok),
        ));
        if let Err(why) = counted {
            s.notes.push(format!("{BIG_ENTITY}: {why}"));
        }
        if report.tally.retry_pauses > 0 {
            s.notes.push(format!(
                "preload batches were resent {} times after 429/503",
                report.tally.retry_pauses
            ));
        }
        if tally.sent > tally.status(200) {
            s.notes.push(format!(
                "counting {BIG_ENTITY}'s rows failed: {:?}",
                tally.statuses
            ));
        }
        let m = &mut s.metrics;
        m.insert("preload_rows".into(), Metric::counter(report.rows_ok, secs));
        m.insert(
            "preload_reqs".into(),
            Metric::counter(report.tally.sent, secs),
        );
        m.insert(
            "preload_duration".into(),
            Metric::Trend(Trend::from_micros(&report.tally.latency)),
        );
        if let Ok(c) = counted {
            m.insert("big_rows_stored".into(), Metric::count(c.rows));
            if !c.time_instant_counted {
                s.notes.push(format!(
                    "{BIG_ENTITY}: the server counts no TimeInstant (aggrMethod=count of a \
                     DateTime answered null); its newest {} states were read whole instead",
                    verify::PAGE
                ));
            }
        }
    }

    // Queries.
    if let Some((mix, report)) = &queried {
        let secs = report.elapsed.as_secs_f64();
        let mut all = Tally::default();
        let (mut passes, mut fails) = (0, 0);
        for (&(kind, class), pair) in mix.iter().zip(&report.pairs) {
            let (who, prefix) = match class {
                Class::Load => ("Room:<n>", "query"),
                Class::Big => (BIG_ENTITY, "query_big"),
            };
            s.checks.push(Check::new(
                format!(
                    "{who} {} answered 200 with the expected values",
                    kind.describe()
                ),
                pair.passes,
                pair.fails,
            ));
            s.metrics.insert(
                format!("{prefix}_{}_duration", kind.name()),
                Metric::Trend(Trend::from_micros(&pair.tally.latency)),
            );
            s.notes.extend(pair.examples.iter().cloned());
            all.merge(&pair.tally);
            passes += pair.passes;
            fails += pair.fails;
        }
        let m = &mut s.metrics;
        m.insert("query_reqs".into(), Metric::counter(all.sent, secs));
        m.insert("query_failed".into(), Metric::rate(fails, passes));
        m.insert("query_status".into(), all.status_metric());
    }

    s.seal();
    Ok(s)
}

/// The parameters as JSON, for `--json` readers and `docs/benchmarks.md`.
fn params(args: &HistoryArgs, tenant: &str) -> serde_json::Map<String, serde_json::Value> {
    let v = json!({
        "entities": args.entities,
        "concurrency": args.concurrency,
        "clients": args.clients(),
        "duration": humantime::format_duration(args.common.duration).to_string(),
        "query_duration": humantime::format_duration(args.query_duration).to_string(),
        "query_concurrency": args.query_concurrency,
        "preload_rows": args.preload_rows,
        "preload_states": preload::states_for(args.preload_rows),
        "preload_batch": preload::BATCH,
        "tenant": tenant,
        "verify_sample": verify::VERIFY_SAMPLE,
        "origin": payload::iso(ORIGIN_MS),
        "notify_step_ms": NOTIFY_STEP_MS,
        "preload_step_ms": preload::STEP_MS,
        "queries": args.queries.iter().map(|k| k.name()).collect::<Vec<_>>(),
        "last_n": query::LAST_N,
    });
    match v {
        serde_json::Value::Object(map) => map,
        _ => unreachable!("json! of an object literal is an object"),
    }
}

/// The lines under `scenario:` describing the load.
fn describe(args: &HistoryArgs, tenant: &str) -> Vec<String> {
    let mut lines = vec![
        format!(
            "notify: {} clients × POST /v2/notify (QuantumLeap's k6 Room body) back to back for {}",
            args.clients(),
            humantime::format_duration(args.common.duration)
        ),
        format!(
            "{} entities Room:<n> (tenant {tenant}), one TimeInstant a minute from {}, \
             temperature = notification number",
            args.entities,
            payload::iso(ORIGIN_MS)
        ),
    ];
    if args.preload_rows > 0 {
        lines.push(format!(
            "preload: {} rows of {BIG_ENTITY} ({} states 1 s apart, {} per notification, {} connections)",
            args.preload_rows,
            preload::states_for(args.preload_rows),
            preload::BATCH,
            preload::PARALLEL
        ));
    }
    if !args.query_duration.is_zero() {
        let kinds: Vec<String> = Kind::ALL
            .into_iter()
            .filter(|k| args.queries.contains(k))
            .map(Kind::describe)
            .collect();
        lines.push(format!(
            "query: {} clients × {} for {}",
            args.query_concurrency,
            kinds.join(", "),
            humantime::format_duration(args.query_duration)
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> HistoryArgs {
        let cmd = crate::parse_command(&[&["history"], args].concat());
        match cmd {
            crate::BenchCommand::History(args) => args,
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn defaults_match_the_seed() {
        let a = parse(&[]);
        assert_eq!(a.entities, 100);
        assert_eq!(a.concurrency, 100);
        assert_eq!(a.clients(), 100);
        assert_eq!(a.query_duration, Duration::from_secs(10));
        assert_eq!(a.query_concurrency, 8);
        assert_eq!(a.preload_rows, 0);
        assert_eq!(a.queries, Kind::ALL);
        a.validate().unwrap();
        assert_eq!(payload::iso(ORIGIN_MS), "2025-01-01T00:00:00.000Z");
    }

    #[test]
    fn flags_parse() {
        let a = parse(&[
            "--spawn",
            "--duration",
            "10s",
            "--entities",
            "10",
            "--concurrency",
            "50",
            "--query-duration",
            "0s",
            "--query-concurrency",
            "2",
            "--preload-rows",
            "10000000",
            "--json",
        ]);
        assert!(a.common.spawn && a.common.json);
        assert_eq!(a.common.duration, Duration::from_secs(10));
        assert_eq!(a.clients(), 10);
        assert_eq!(a.preload_rows, 10_000_000);
        let lines = describe(&a, "t");
        assert!(lines[2].contains("3333334 states"), "{lines:?}");
        assert_eq!(lines.len(), 3, "no query line when it is skipped");
        assert_eq!(params(&a, "t")["preload_states"], 3_333_334);
        let a = parse(&["--queries", "avg_hour,lastn"]);
        assert_eq!(a.queries, [Kind::AvgHour, Kind::LastN]);
        assert!(describe(&a, "t")[2].contains("lastN=100, avg per hour"));
        assert!(crate::try_parse_command(&["history", "--queries", "lastn,nope"]).is_err());
        assert!(parse(&["--entities", "0"]).validate().is_err());
        assert!(parse(&["--query-concurrency", "0"]).validate().is_err());
    }
}
