//! The `ngsi-notify` scenario: seed 002's notification stress tests
//! (scenarios 5 and 6: 1000 subscriptions, entities updated while
//! notifications flow).
//!
//! It is `ngsi-update` with subscriptions on top and a notification sink
//! inside the bench process ([`sink`]). A run goes through five phases:
//!
//! 1. create: `--entities` entities `Room<i>`, as `ngsi-update` does
//!    (`--entities` defaults to `--subscriptions`, so every update is owed
//!    exactly one notification);
//! 2. subscribe: `--subscriptions` subscriptions, subscription `i`
//!    watching `Room<i mod entities>` and notifying the sink;
//! 3. load: `ngsi-update`'s closed-loop clients, writing values that stamp
//!    their send time ([`stamp`]) so the sink can tell each notification's
//!    delay, and every write is an actual change, which Orion notifies;
//! 4. drain: wait (up to `--drain-timeout`) until every subscription has
//!    received the notifications owed for its entity's updates ([`owed`]);
//! 5. unsubscribe: delete the subscriptions, leaving a long-lived server
//!    as it was found.
//!
//! The run uses a fresh random tenant, like `ngsi-update`.

pub mod notification;
pub mod owed;
pub mod sink;
pub mod stamp;
pub mod subscriptions;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::ensure;
use serde_json::json;
use tokio::time::Instant;

use crate::common::{CommonArgs, Session};
use crate::ngsi_update::load::{LoadReport, Plan};
use crate::ngsi_update::payload::{entity_id, Api, AttrRange, PatchHead, ENTITY_TYPE};
use crate::ngsi_update::{create_entities, generate, new_tenant, status_tally};
use crate::progress;
use crate::summary::{Check, Metric, Summary, Trend};
use owed::{watched_entity, OwedRange, Reconciled};
use sink::{Sink, Tally};

/// How often the drain looks at what the sink received.
const DRAIN_POLL: Duration = Duration::from_millis(20);

/// How long to keep listening once everything owed has arrived, so
/// duplicates and other extras sent along with the last notifications are
/// counted too.
const SETTLE: Duration = Duration::from_millis(250);

/// Most problems quoted in the notes, per kind.
const MAX_EXAMPLES: usize = 5;

/// Flags of `weft bench ngsi-notify`.
#[derive(Debug, Clone, clap::Args)]
pub struct NgsiNotifyArgs {
    /// The flags every scenario takes.
    #[command(flatten)]
    pub common: CommonArgs,

    /// Subscriptions created before the load; subscription i watches
    /// entity `Room<i mod entities>`.
    #[arg(long, default_value_t = 1000)]
    pub subscriptions: usize,

    /// Entities created up front and updated at random [default: as many
    /// as --subscriptions, so each update owes exactly one notification].
    #[arg(long)]
    pub entities: Option<usize>,

    /// Closed-loop clients, each with one connection and at most one
    /// update in flight (capped at the entities: each owns its entities).
    #[arg(long, default_value_t = 300)]
    pub concurrency: usize,

    /// Attributes per update, drawn uniformly from this range (e.g. 1-6,
    /// 1-20); every entity has attributes `a1..a<max>`.
    #[arg(long, default_value = "1-6", value_parser = AttrRange::parse)]
    pub attrs: AttrRange,

    /// After the load, how long to wait for the notifications still owed.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub drain_timeout: Duration,

    /// Address the notification sink listens on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub sink_listen: SocketAddr,

    /// URL the subscriptions notify, when the server cannot reach the sink
    /// at its listening address (a server on another machine); by default
    /// `http://<sink address>/notify`.
    #[arg(long)]
    pub sink_url: Option<String>,
}

impl NgsiNotifyArgs {
    fn validate(&self) -> anyhow::Result<()> {
        ensure!(
            self.subscriptions >= 1,
            "--subscriptions must be at least 1 (without any, run ngsi-update)"
        );
        ensure!(self.entities() >= 1, "--entities must be at least 1");
        ensure!(self.concurrency >= 1, "--concurrency must be at least 1");
        ensure!(
            !self.common.duration.is_zero(),
            "--duration must be positive"
        );
        Ok(())
    }

    /// Entities created: `--entities`, or one per subscription.
    fn entities(&self) -> usize {
        self.entities.unwrap_or(self.subscriptions)
    }

    /// Clients actually run: one per entity at most.
    pub(crate) fn clients(&self) -> usize {
        self.concurrency.min(self.entities())
    }
}

/// Runs the scenario against the session's server.
pub async fn run(args: &NgsiNotifyArgs, session: &Session) -> anyhow::Result<Summary> {
    args.validate()?;
    let tenant = new_tenant();
    let sink = Sink::start(args.sink_listen, &tenant).await?;
    let outcome = run_with_sink(args, session, &tenant, &sink).await;
    sink.stop();
    outcome
}

/// The scenario once the sink listens.
async fn run_with_sink(
    args: &NgsiNotifyArgs,
    session: &Session,
    tenant: &str,
    sink: &Sink,
) -> anyhow::Result<Summary> {
    let entities = args.entities();
    let sink_url = args.sink_url.clone().unwrap_or_else(|| sink.default_url());

    let create_started = Instant::now();
    create_entities(session, tenant, entities, args.attrs.max, Api::V2).await?;
    let create_elapsed = create_started.elapsed();

    let subscribe_started = Instant::now();
    let (ids, created) =
        subscriptions::create(session, tenant, args.subscriptions, entities, &sink_url).await;
    let subscribe_elapsed = subscribe_started.elapsed();
    if let Err(e) = created {
        // Leave the server clean even so.
        let _ = subscriptions::delete(session, tenant, &ids).await;
        return Err(e);
    }
    // Subscription i watches this entity.
    let watched: Vec<String> = (0..ids.len())
        .map(|i| entity_id(watched_entity(i, entities)))
        .collect();

    let start = Instant::now();
    sink.set_origin(start.into_std());
    let plan = Plan {
        connects: session.connects(),
        head: PatchHead::new(&session.base.prefix, &session.base.host, tenant, Api::V2),
        entities,
        clients: args.clients(),
        attrs: args.attrs,
        duration: args.common.duration,
        values: stamp::encode,
    };
    let notified = || format!(", {} notified", sink.requests());
    let load = generate(plan, session.show_progress, start, notified).await;

    let owed = owed::owed(ids.len(), &load.owned);
    let drain_started = Instant::now();
    let drained = drain(sink, &ids, &watched, &owed, args.drain_timeout, session).await;
    let drain_elapsed = drain_started.elapsed();
    tokio::time::sleep(SETTLE).await;
    let tally = sink.take();

    let unsubscribe_started = Instant::now();
    let deleted = subscriptions::delete(session, tenant, &ids).await;
    let unsubscribe_elapsed = unsubscribe_started.elapsed();

    let mut s = Summary {
        scenario: "ngsi-notify".to_string(),
        ok: false,
        target: session.base.to_string(),
        spawned: session.spawned(),
        params: params(args, tenant, &sink_url),
        phases: vec![
            ("create".to_string(), create_elapsed.as_secs_f64()),
            ("subscribe".to_string(), subscribe_elapsed.as_secs_f64()),
            ("load".to_string(), load.elapsed.as_secs_f64()),
            ("drain".to_string(), drain_elapsed.as_secs_f64()),
            ("settle".to_string(), SETTLE.as_secs_f64()),
            ("unsubscribe".to_string(), unsubscribe_elapsed.as_secs_f64()),
        ],
        description: describe(args, tenant, &sink_url),
        checks: Vec::new(),
        metrics: BTreeMap::new(),
        notes: Vec::new(),
        calibration: None,
        throughput: None,
        memory: Vec::new(),
    };
    let accounted = account(&tally, &ids, &watched, &owed);
    if !drained {
        s.notes.push(format!(
            "the drain timed out after {}: {} notifications owed never arrived",
            humantime::format_duration(args.drain_timeout),
            accounted.reconciled.missing
        ));
    }
    report(&mut s, args, &load, &tally, &accounted, sink.connections());
    s.checks.push(Check::new(
        "subscription deleted (204)",
        deleted.ok,
        deleted.failed,
    ));
    s.notes.extend(deleted.first_error);
    s.seal();
    Ok(s)
}

/// Phase 4: waits until every subscription has received at least what it
/// is certainly owed, or the timeout passes; true when it has.
async fn drain(
    sink: &Sink,
    ids: &[String],
    watched: &[String],
    owed: &[OwedRange],
    timeout: Duration,
    session: &Session,
) -> bool {
    let total: u64 = owed.iter().map(|r| r.min).sum();
    let bar = progress::spinner(session.show_progress, "drain");
    let started = Instant::now();
    let done = loop {
        let (done, stamped) = {
            let tally = sink.lock();
            let done = owed::all_received(owed, |i| received(&tally, &ids[i], &watched[i]));
            (done, tally.stamped)
        };
        if done {
            break true;
        }
        if started.elapsed() >= timeout {
            break false;
        }
        bar.set_message(format!("{stamped} of {total} notifications owed"));
        tokio::time::sleep(DRAIN_POLL).await;
    };
    bar.finish_and_clear();
    done
}

/// Notifications subscription `id` received about `entity`.
fn received(tally: &Tally, id: &str, entity: &str) -> u64 {
    tally
        .subscriptions
        .get(id)
        .map_or(0, |sub| sub.for_entity(entity))
}

/// The sink's tally read against the subscriptions and what they are owed.
#[derive(Debug, Default)]
struct Accounted {
    /// Per-subscription comparison of received with owed.
    reconciled: Reconciled,
    /// Stamped notifications about another entity than the subscription's.
    wrong_entity: u64,
    /// Notifications for a subscription id this run did not create.
    unknown_subscription: u64,
    /// Unstamped notifications for this run's subscriptions.
    unstamped: u64,
    /// A few of the problems above, in words.
    examples: Vec<String>,
}

/// Reads the tally against the run's subscriptions (`ids[i]` watching
/// `watched[i]`, owed `owed[i]`).
fn account(tally: &Tally, ids: &[String], watched: &[String], owed: &[OwedRange]) -> Accounted {
    let mut a = Accounted::default();
    let index: HashMap<&str, usize> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| (id.as_str(), i))
        .collect();
    let mut received = vec![0u64; ids.len()];
    for (id, sub) in &tally.subscriptions {
        let Some(&i) = index.get(id.as_ref()) else {
            let n = sub.stamped() + sub.unstamped;
            a.unknown_subscription += n;
            if a.examples.len() < MAX_EXAMPLES {
                a.examples.push(format!(
                    "{n} notifications for subscription {id:?}, not one of this run's"
                ));
            }
            continue;
        };
        a.unstamped += sub.unstamped;
        for (entity, n) in &sub.entities {
            if entity.as_ref() == watched[i] {
                received[i] += n;
            } else {
                a.wrong_entity += n;
                if a.examples.len() < MAX_EXAMPLES {
                    a.examples.push(format!(
                        "subscription {id} (watching {}) notified {n} times about {entity}",
                        watched[i]
                    ));
                }
            }
        }
    }
    a.reconciled = owed::reconcile(owed, &received);
    for &(i, got, range) in &a.reconciled.off_examples {
        if a.examples.len() >= 2 * MAX_EXAMPLES {
            break;
        }
        let owed = if range.min == range.max {
            range.min.to_string()
        } else {
            format!("{}–{}", range.min, range.max)
        };
        a.examples.push(format!(
            "subscription {} ({}) received {got} notifications, owed {owed}",
            ids[i], watched[i]
        ));
    }
    a
}

/// Fills the checks, metrics and notes.
fn report(
    s: &mut Summary,
    args: &NgsiNotifyArgs,
    load: &LoadReport,
    tally: &Tally,
    a: &Accounted,
    connections: u64,
) {
    let r = &a.reconciled;
    let unexpected =
        r.extra + a.wrong_entity + a.unknown_subscription + tally.malformed + tally.not_post;
    let load_secs = load.elapsed.as_secs_f64();
    let ok_204 = load.status(204);

    s.checks
        .push(Check::new("status was 204", ok_204, load.sent - ok_204));
    s.checks.push(Check::new(
        "every owed notification received",
        r.owed - r.missing,
        r.missing,
    ));
    s.checks.push(Check::new(
        "every subscription received what it was owed",
        r.subscriptions_ok,
        r.subscriptions_off,
    ));
    s.checks.push(Check::new(
        "no unexpected notification",
        r.expected,
        unexpected,
    ));
    s.checks.push(Check::new(
        "notification headers as Orion sends them",
        tally.headers_ok,
        tally.headers_bad,
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
    m.insert("http_status".into(), status_tally(load));
    m.insert("updates".into(), Metric::counter(ok_204, load_secs));
    m.insert(
        "attrs_updated".into(),
        Metric::counter(load.attrs_updated, load_secs),
    );
    // Delivered throughput: from the first update to the last notification.
    let notify_secs = tally.last_at.map_or(0.0, |d| d.as_secs_f64());
    m.insert(
        "notifications".into(),
        Metric::counter(r.received, notify_secs),
    );
    m.insert("notifications_owed".into(), Metric::count(r.owed));
    m.insert("notifications_missing".into(), Metric::count(r.missing));
    m.insert("notifications_unexpected".into(), Metric::count(unexpected));
    m.insert(
        "notification_delay".into(),
        Metric::Trend(Trend::from_micros(&tally.delay)),
    );
    m.insert(
        "subscriptions".into(),
        Metric::count(args.subscriptions as u64),
    );
    m.insert("sink_connections".into(), Metric::count(connections));

    if r.unsure > 0 {
        s.notes.push(format!(
            "{} updates were answered other than 204 (or not at all): whether they were applied is unknown, \
             so up to {} more notifications were accepted",
            load.sent - ok_204,
            r.unsure
        ));
    }
    if a.unstamped > 0 {
        s.notes.push(format!(
            "{} notifications carried only creation values (initial notifications on subscribing?): not counted",
            a.unstamped
        ));
    }
    if load.retry_pauses > 0 {
        s.notes.push(format!(
            "clients paused {} times for Retry-After",
            load.retry_pauses
        ));
    }
    if args.concurrency > args.entities() {
        s.notes.push(format!(
            "--concurrency {} capped at {} entities: each client owns at least one entity",
            args.concurrency,
            args.entities()
        ));
    }
    s.notes.extend(a.examples.iter().cloned());
    s.notes.extend(tally.examples.iter().cloned());
}

/// The parameters as JSON, for `--json` readers and `docs/benchmarks.md`.
fn params(
    args: &NgsiNotifyArgs,
    tenant: &str,
    sink_url: &str,
) -> serde_json::Map<String, serde_json::Value> {
    let v = json!({
        "subscriptions": args.subscriptions,
        "entities": args.entities(),
        "concurrency": args.concurrency,
        "clients": args.clients(),
        "attrs": args.attrs.to_string(),
        "duration": humantime::format_duration(args.common.duration).to_string(),
        "drain_timeout": humantime::format_duration(args.drain_timeout).to_string(),
        "tenant": tenant,
        "sink_url": sink_url,
    });
    match v {
        serde_json::Value::Object(map) => map,
        _ => unreachable!("json! of an object literal is an object"),
    }
}

/// The lines under `scenario:` describing the load.
fn describe(args: &NgsiNotifyArgs, tenant: &str, sink_url: &str) -> Vec<String> {
    vec![
        format!(
            "closed loop: {} clients × PATCH /v2/entities/{{id}}/attrs back to back for {}",
            args.clients(),
            humantime::format_duration(args.common.duration)
        ),
        format!(
            "{} {ENTITY_TYPE} entities (tenant {tenant}), {} attributes per update, values stamped with their send time",
            args.entities(),
            args.attrs
        ),
        format!(
            "{} subscriptions (subscription i watches {ENTITY_TYPE}<i mod {}>) notifying {sink_url}",
            args.subscriptions,
            args.entities()
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use sink::SubscriptionTally;

    fn parse(args: &[&str]) -> NgsiNotifyArgs {
        let cmd = crate::parse_command(&[&["ngsi-notify"], args].concat());
        match cmd {
            crate::BenchCommand::NgsiNotify(args) => args,
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn defaults_match_the_seed() {
        let a = parse(&[]);
        assert_eq!(a.subscriptions, 1000);
        assert_eq!(a.entities(), 1000);
        assert_eq!(a.concurrency, 300);
        assert_eq!(a.clients(), 300);
        assert_eq!(a.attrs, AttrRange { min: 1, max: 6 });
        assert_eq!(a.drain_timeout, Duration::from_secs(10));
        assert_eq!(a.sink_listen, "127.0.0.1:0".parse().unwrap());
        assert_eq!(a.sink_url, None);
        a.validate().unwrap();
    }

    #[test]
    fn flags_parse() {
        let a = parse(&[
            "--subscriptions",
            "20",
            "--duration",
            "5s",
            "--concurrency",
            "50",
            "--drain-timeout",
            "2s",
            "--sink-listen",
            "0.0.0.0:9000",
            "--sink-url",
            "http://10.0.0.2:9000/notify",
        ]);
        assert_eq!(a.entities(), 20, "entities follow subscriptions");
        assert_eq!(a.clients(), 20);
        assert_eq!(a.drain_timeout, Duration::from_secs(2));
        assert_eq!(a.sink_listen.port(), 9000);
        let a = parse(&["--subscriptions", "20", "--entities", "5"]);
        assert_eq!((a.entities(), a.clients()), (5, 5));
        assert!(describe(&a, "t", "u")[2].contains("Room<i mod 5>"));
        assert!(parse(&["--subscriptions", "0"]).validate().is_err());
        assert!(parse(&["--entities", "0"]).validate().is_err());
    }

    /// A subscription id, its stamped notifications by entity, and its
    /// unstamped ones.
    type Seen<'a> = (&'a str, &'a [(&'a str, u64)], u64);

    fn tally(subs: &[Seen<'_>]) -> Tally {
        let mut t = Tally::new();
        for (id, entities, unstamped) in subs {
            t.subscriptions.insert(
                (*id).into(),
                SubscriptionTally {
                    entities: entities.iter().map(|(e, n)| ((*e).into(), *n)).collect(),
                    unstamped: *unstamped,
                },
            );
        }
        t
    }

    #[test]
    fn accounts_per_subscription() {
        let ids = vec!["a".to_string(), "b".to_string(), "c".to_string()];
        let watched = vec![
            "Room0".to_string(),
            "Room1".to_string(),
            "Room0".to_string(),
        ];
        let owed = vec![
            OwedRange { min: 2, max: 2 },
            OwedRange { min: 1, max: 1 },
            OwedRange { min: 2, max: 2 },
        ];
        let t = tally(&[
            ("a", &[("Room0", 2)], 1),
            ("b", &[("Room1", 1), ("Room5", 3)], 0),
            ("c", &[("Room0", 1)], 0),
            ("zz", &[("Room0", 4)], 2),
        ]);
        assert_eq!(received(&t, "b", "Room1"), 1);
        assert_eq!(received(&t, "nope", "Room1"), 0);
        let a = account(&t, &ids, &watched, &owed);
        assert_eq!(a.wrong_entity, 3);
        assert_eq!(a.unknown_subscription, 6);
        assert_eq!(a.unstamped, 1);
        assert_eq!(a.reconciled.owed, 5);
        assert_eq!(a.reconciled.received, 4);
        assert_eq!(a.reconciled.missing, 1);
        assert_eq!(a.reconciled.subscriptions_off, 1);
        assert_eq!(a.examples.len(), 3, "{:?}", a.examples);
        assert!(a.examples[2].contains("subscription c (Room0) received 1 notifications, owed 2"));
    }
}
