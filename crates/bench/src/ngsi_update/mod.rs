//! The `ngsi-update` scenario: seed 002's update stress tests (scenarios
//! 1, 2 and 4: C clients updating 1–6, or 1–20, attributes of random
//! entities through NGSIv2).
//!
//! A run goes through three phases:
//!
//! 1. create: `--entities` entities `Room<i>` of type `Room`, every
//!    attribute `a1..a{max}` at 0 (`POST /v2/entities?options=keyValues`);
//! 2. load: `--concurrency` closed-loop clients, one keep-alive connection
//!    each, `PATCH /v2/entities/{id}/attrs` with a normalized body of a
//!    random number (in `--attrs`) of attributes, back to back for
//!    `--duration`; each client owns a disjoint subset of the entities;
//! 3. verify: `GET /v2/entities/{id}?options=keyValues` for all entities
//!    (or a sample of them) and compare with the last value written.
//!
//! The run uses a fresh random tenant (`Fiware-Service`), so the entities
//! never clash with earlier runs against a long-lived server.
//!
//! `ngsi-notify` runs the same create and load phases (`new_tenant`,
//! `create_entities`, `generate`) with subscriptions on top.

pub mod batch;
pub mod load;
pub mod payload;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use anyhow::{bail, ensure};
use rand::distr::{Alphanumeric, SampleString};
use serde_json::json;
use tokio::time::Instant;

use crate::common::{CommonArgs, Session};
use crate::http::render_request;
use crate::progress;
use crate::summary::{Check, Metric, Summary, Trend};
use load::{Counters, LoadReport, Owned, Plan};
use payload::{Api, AttrRange, PatchHead};

/// Entities checked at the end: all of them up to this many, else a
/// random sample of this size.
const VERIFY_SAMPLE: usize = 2000;

/// Connections used by the create and verify phases (and by
/// `ngsi-notify`'s subscribe and unsubscribe phases).
pub(crate) const SETUP_PARALLEL: usize = 16;

/// Flags of `weft bench ngsi-update`.
#[derive(Debug, Clone, clap::Args)]
pub struct NgsiUpdateArgs {
    /// The flags every scenario takes.
    #[command(flatten)]
    pub common: CommonArgs,

    /// Entities created up front and updated at random.
    #[arg(long, default_value_t = 1000)]
    pub entities: usize,

    /// Closed-loop clients, each with one connection and at most one
    /// update in flight (capped at --entities: each owns its entities).
    #[arg(long, default_value_t = 300)]
    pub concurrency: usize,

    /// Attributes per update, drawn uniformly from this range (e.g. 1-6,
    /// 1-20); every entity has attributes `a1..a<max>`.
    #[arg(long, default_value = "1-6", value_parser = AttrRange::parse)]
    pub attrs: AttrRange,

    /// The API the entities are created, updated and read through: `v2`
    /// (Orion's), or `ld` (NGSI-LD; with `--attrs 1` each update is a
    /// partial attribute update, Stellio's k6 scenario).
    #[arg(long, value_enum, default_value_t = Api::V2)]
    pub api: Api,
}

impl NgsiUpdateArgs {
    fn validate(&self) -> anyhow::Result<()> {
        ensure!(self.entities >= 1, "--entities must be at least 1");
        ensure!(self.concurrency >= 1, "--concurrency must be at least 1");
        ensure!(
            !self.common.duration.is_zero(),
            "--duration must be positive"
        );
        Ok(())
    }

    /// Clients actually run: one per entity at most.
    pub(crate) fn clients(&self) -> usize {
        self.concurrency.min(self.entities)
    }
}

/// Runs the scenario against the session's server.
pub async fn run(args: &NgsiUpdateArgs, session: &Session) -> anyhow::Result<Summary> {
    args.validate()?;
    let tenant = new_tenant();

    let create_started = Instant::now();
    create_entities(session, &tenant, args.entities, args.attrs.max, args.api).await?;
    let create_elapsed = create_started.elapsed();

    let plan = Plan {
        connects: session.connects(),
        head: PatchHead::new(&session.base.prefix, &session.base.host, &tenant, args.api),
        entities: args.entities,
        clients: args.clients(),
        attrs: args.attrs,
        duration: args.common.duration,
        values: load::sequence,
    };
    let load = generate(plan, session.show_progress, Instant::now(), String::new).await;

    if session.bases.len() > 1 {
        // The last updates made through the other nodes reach the first
        // (which verifies) within milliseconds.
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
    let verify_started = Instant::now();
    let verified = verify(session, &tenant, &load.owned, args.api).await;
    let verify_elapsed = verify_started.elapsed();

    let mut s = Summary {
        scenario: match args.api {
            Api::V2 => "ngsi-update",
            Api::Ld => "ngsi-update (NGSI-LD)",
        }
        .to_string(),
        ok: false,
        target: session.targets(),
        spawned: session.spawned(),
        params: params(args, &tenant),
        phases: vec![
            ("create".to_string(), create_elapsed.as_secs_f64()),
            ("load".to_string(), load.elapsed.as_secs_f64()),
            ("verify".to_string(), verify_elapsed.as_secs_f64()),
        ],
        description: describe(args, &tenant),
        checks: Vec::new(),
        metrics: BTreeMap::new(),
        notes: Vec::new(),
        calibration: None,
        throughput: None,
        memory: Vec::new(),
    };

    let load_secs = load.elapsed.as_secs_f64();
    let ok_204 = load.status(204);
    s.checks
        .push(Check::new("status was 204", ok_204, load.sent - ok_204));
    s.checks.push(Check::new(
        "final entity state matches the last write",
        verified.matched,
        verified.mismatched + verified.errors,
    ));

    let m = &mut s.metrics;
    m.insert("http_reqs".into(), Metric::counter(load.sent, load_secs));
    m.insert(
        "http_req_duration".into(),
        Metric::Trend(Trend::from_micros(&load.latency)),
    );
    m.insert(
        "http_req_failed".into(),
        Metric::rate(load.sent - ok_204, ok_204),
    );
    m.insert("http_status".into(), status_tally(&load));
    m.insert("updates".into(), Metric::counter(ok_204, load_secs));
    m.insert(
        "attrs_updated".into(),
        Metric::counter(load.attrs_updated, load_secs),
    );
    m.insert("entities_checked".into(), Metric::count(verified.checked));
    m.insert(
        "entities_mismatched".into(),
        Metric::count(verified.mismatched),
    );

    if verified.uncertain > 0 {
        s.notes.push(format!(
            "{} entities had an update answered other than 204 (or not at all): their final state is unknown, \
             so they were not checked",
            verified.uncertain
        ));
    }
    if load.retry_pauses > 0 {
        s.notes.push(format!(
            "clients paused {} times for Retry-After",
            load.retry_pauses
        ));
    }
    if args.concurrency > args.entities {
        s.notes.push(format!(
            "--concurrency {} capped at --entities {}: each client owns at least one entity",
            args.concurrency, args.entities
        ));
    }
    s.notes.extend(verified.examples);
    s.seal();
    Ok(s)
}

/// A fresh random tenant (`Fiware-Service`) for one run, so its entities
/// (and subscriptions) never clash with earlier runs on a long-lived server.
pub(crate) fn new_tenant() -> String {
    format!(
        "bench{}",
        Alphanumeric
            .sample_string(&mut rand::rng(), 8)
            .to_ascii_lowercase()
    )
}

/// Phase 1: create entities `Room0..Room{entities-1}` (through NGSI-LD
/// `urn:ngsi-ld:Room:0…`) in `tenant`, every attribute `a1..a{attrs}` at
/// 0.
pub(crate) async fn create_entities(
    session: &Session,
    tenant: &str,
    entities: usize,
    attrs: usize,
    api: Api,
) -> anyhow::Result<()> {
    let base = &session.base;
    let target = match api {
        Api::V2 => base.path("/v2/entities?options=keyValues"),
        Api::Ld => base.path(api.entities_path()),
    };
    let headers = [(api.tenant_header(), tenant)];
    let requests: Vec<Vec<u8>> = (0..entities)
        .map(|i| {
            let body = api.create_body(i, attrs);
            render_request("POST", &target, &base.host, &headers, Some(&body))
        })
        .collect();
    let bar = progress::spinner(session.show_progress, "create");
    bar.set_message(format!("{entities} entities"));
    let results = batch::exchange_all(&base.connect, requests, SETUP_PARALLEL, &bar).await;
    bar.finish_and_clear();
    for (i, result) in results.iter().enumerate() {
        match result {
            Ok(r) if r.status == 201 => {}
            Ok(r) => bail!(
                "creating {}: POST {target} answered {}: {}",
                api.entity_id(i),
                r.status,
                r.text().trim()
            ),
            Err(e) => bail!("creating {}: POST {target}: {e}", api.entity_id(i)),
        }
    }
    Ok(())
}

/// Phase 2: the load from `start` (the origin of the times the plan's
/// values see), with a progress bar fed from the clients' counters and
/// `extra`, a scenario's own live figures appended to the message.
pub(crate) async fn generate(
    plan: Plan,
    show_progress: bool,
    start: Instant,
    extra: impl Fn() -> String,
) -> LoadReport {
    let duration = plan.duration;
    let counters = Arc::new(Counters::default());
    let bar = progress::timed_bar(show_progress, "update", duration);
    let load = load::run(Arc::new(plan), counters.clone(), start);
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
                    "{sent} sent ({:.0}/s), {} updated, {} failed{}",
                    sent as f64 / elapsed.as_secs_f64().max(1e-3),
                    counters.updated.load(Ordering::Relaxed),
                    counters.failed.load(Ordering::Relaxed),
                    extra(),
                ));
            }
        }
    };
    bar.finish_and_clear();
    report
}

/// What the verify phase found.
#[derive(Debug, Default)]
struct Verified {
    /// Entities read back.
    checked: u64,
    /// Entities whose every attribute had the last value written.
    matched: u64,
    /// Entities with at least one attribute off.
    mismatched: u64,
    /// Entities that could not be read.
    errors: u64,
    /// Entities left out because an update of theirs failed.
    uncertain: u64,
    /// A few mismatches, for the notes.
    examples: Vec<String>,
}

/// Most mismatches quoted in the notes.
const MAX_EXAMPLES: usize = 5;

/// Phase 3: read back all entities (or a sample) and compare each with
/// the last values written.
async fn verify(session: &Session, tenant: &str, owned: &[Owned], api: Api) -> Verified {
    let mut v = Verified::default();
    let certain: Vec<&Owned> = owned.iter().filter(|o| !o.uncertain()).collect();
    v.uncertain = (owned.len() - certain.len()) as u64;
    let chosen: Vec<&Owned> = if certain.len() <= VERIFY_SAMPLE {
        certain
    } else {
        let mut picks: Vec<usize> =
            rand::seq::index::sample(&mut rand::rng(), certain.len(), VERIFY_SAMPLE).into_vec();
        picks.sort_unstable();
        picks.into_iter().map(|i| certain[i]).collect()
    };
    let base = &session.base;
    let headers = [(api.tenant_header(), tenant)];
    let requests: Vec<Vec<u8>> = chosen
        .iter()
        .map(|o| {
            let target = base.path(&format!(
                "{}/{}?options=keyValues",
                api.entities_path(),
                api.entity_id(o.entity)
            ));
            render_request("GET", &target, &base.host, &headers, None)
        })
        .collect();
    let bar = progress::spinner(session.show_progress, "verify");
    bar.set_message(format!("reading back {} entities", chosen.len()));
    let results = batch::exchange_all(&base.connect, requests, SETUP_PARALLEL, &bar).await;
    bar.finish_and_clear();
    for (o, result) in chosen.iter().zip(results) {
        v.checked += 1;
        let outcome = match result {
            Ok(r) if r.status == 200 => compare(&r.body, &o.last),
            Ok(r) => Err(format!("GET answered {}: {}", r.status, r.text().trim())),
            Err(e) => Err(format!("GET failed: {e}")),
        };
        match outcome {
            Ok(()) => v.matched += 1,
            Err(why) => {
                if why.starts_with("GET") {
                    v.errors += 1;
                } else {
                    v.mismatched += 1;
                }
                if v.examples.len() < MAX_EXAMPLES {
                    v.examples
                        .push(format!("{}: {why}", api.entity_id(o.entity)));
                }
            }
        }
    }
    v
}

/// Compares a keyValues rendering of an entity with the last values
/// written to its attributes `a1..a{last.len()}`.
fn compare(body: &[u8], last: &[u64]) -> Result<(), String> {
    let entity: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("unreadable entity: {e}"))?;
    for (a, expected) in last.iter().enumerate() {
        let name = format!("a{}", a + 1);
        match entity.get(&name) {
            Some(got) if got.as_f64() == Some(*expected as f64) => {}
            Some(got) => return Err(format!("{name} is {got}, last written {expected}")),
            None => return Err(format!("{name} is missing, last written {expected}")),
        }
    }
    Ok(())
}

/// Responses by status, plus the requests that got none.
pub(crate) fn status_tally(load: &LoadReport) -> Metric {
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
fn params(args: &NgsiUpdateArgs, tenant: &str) -> serde_json::Map<String, serde_json::Value> {
    let v = json!({
        "entities": args.entities,
        "concurrency": args.concurrency,
        "clients": args.clients(),
        "attrs": args.attrs.to_string(),
        "duration": humantime::format_duration(args.common.duration).to_string(),
        "tenant": tenant,
        "api": format!("{:?}", args.api).to_lowercase(),
        "verify_sample": VERIFY_SAMPLE,
    });
    match v {
        serde_json::Value::Object(map) => map,
        _ => unreachable!("json! of an object literal is an object"),
    }
}

/// The lines under `scenario:` describing the load.
fn describe(args: &NgsiUpdateArgs, tenant: &str) -> Vec<String> {
    vec![
        format!(
            "closed loop: {} clients × PATCH {}/{{id}}/attrs{} back to back for {}",
            args.clients(),
            args.api.entities_path(),
            if args.api == Api::Ld && args.attrs.max == 1 {
                "/{attr}"
            } else {
                ""
            },
            humantime::format_duration(args.common.duration)
        ),
        format!(
            "{} {} entities (tenant {tenant}), {} attributes per update",
            args.entities,
            payload::ENTITY_TYPE,
            args.attrs
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn parse(args: &[&str]) -> NgsiUpdateArgs {
        let cmd = crate::parse_command(&[&["ngsi-update"], args].concat());
        match cmd {
            crate::BenchCommand::NgsiUpdate(args) => args,
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn defaults_match_the_seed() {
        let a = parse(&[]);
        assert_eq!(a.entities, 1000);
        assert_eq!(a.concurrency, 300);
        assert_eq!(a.attrs, AttrRange { min: 1, max: 6 });
        assert_eq!(a.clients(), 300);
        a.validate().unwrap();
    }

    #[test]
    fn flags_parse() {
        let a = parse(&[
            "--spawn",
            "--duration",
            "5s",
            "--entities",
            "10",
            "--concurrency",
            "50",
            "--attrs",
            "1-20",
            "--json",
        ]);
        assert!(a.common.spawn && a.common.json);
        assert_eq!(a.common.duration, Duration::from_secs(5));
        assert_eq!(a.attrs, AttrRange { min: 1, max: 20 });
        assert_eq!(a.clients(), 10);
        assert!(describe(&a, "t")[1].contains("1-20 attributes"));
        assert!(crate::try_parse_command(&["ngsi-update", "--attrs", "0-3"]).is_err());
        let watched = parse(&["--watch-pid", "orion=12", "--watch-pid", "7"])
            .common
            .watch_pid;
        assert_eq!(
            watched
                .iter()
                .map(|w| (w.name.as_str(), w.pid))
                .collect::<Vec<_>>(),
            [("orion", 12), ("7", 7)]
        );
        assert!(crate::try_parse_command(&["ngsi-update", "--watch-pid", "orion=x"]).is_err());
        assert!(parse(&["--entities", "0"]).validate().is_err());
    }

    #[test]
    fn compares_entities_with_the_last_write() {
        let body = br#"{"id":"Room1","type":"Room","a1":5,"a2":0,"a3":9.0}"#;
        assert_eq!(compare(body, &[5, 0, 9]), Ok(()));
        assert_eq!(compare(body, &[5, 0]), Ok(()));
        assert!(compare(body, &[5, 1, 9]).unwrap_err().contains("a2 is 0"));
        assert!(compare(body, &[5, 0, 9, 0])
            .unwrap_err()
            .contains("a4 is missing"));
        assert!(compare(b"nope", &[0]).is_err());
    }
}
