//! The query phase: a few closed-loop clients asking QuantumLeap's three
//! typical history questions of the series the bench wrote, each answer
//! checked against the [`Series`] bookkeeping:
//!
//! - `lastN=100`: the newest 100 temperatures of an entity;
//! - a range: `fromDate`/`toDate` over one hour of the entity's times;
//! - an aggregation: `aggrMethod=avg&aggrPeriod=hour` over one UTC day.
//!
//! Each kind is asked of a random load entity (`Room:<n>`) and, after a
//! preload, of `Room:big`; every (kind, entity class) pair has its own
//! latency trend, so the long series' figures are read on their own.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::answer;
use super::client::{Caller, Tally};
use super::payload::{entity_id, iso, BIG_ENTITY, DAY_MS};
use super::series::{Expect, Series};
use crate::http::render_request;
use crate::progress;

/// `lastN` of the `lastN` query.
pub const LAST_N: u64 = 100;

/// Length of the range query's window, ms.
pub const RANGE_MS: i64 = 3_600_000;

/// The aggregation's period (`hour`), ms.
const HOUR_MS: i64 = 3_600_000;

/// Longest wait for one answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Most failed answers quoted per kind.
const MAX_EXAMPLES: usize = 3;

/// A question the clients ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `lastN=100`.
    LastN,
    /// One hour of `fromDate`/`toDate`.
    Range,
    /// `aggrMethod=avg&aggrPeriod=hour` over one day.
    AvgHour,
}

impl Kind {
    /// Every kind, in the order they are asked and reported.
    pub const ALL: [Kind; 3] = [Kind::LastN, Kind::Range, Kind::AvgHour];

    /// Parses a kind by its [`name`](Kind::name), for `--queries`.
    pub fn parse(s: &str) -> Result<Kind, String> {
        Kind::ALL
            .into_iter()
            .find(|k| k.name() == s.trim())
            .ok_or_else(|| format!("{s:?}: expected one of lastn, range, avg_hour"))
    }

    /// The kind's name in metric names and `--queries`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::LastN => "lastn",
            Kind::Range => "range",
            Kind::AvgHour => "avg_hour",
        }
    }

    /// The kind in words, for checks.
    pub fn describe(self) -> String {
        match self {
            Kind::LastN => format!("lastN={LAST_N}"),
            Kind::Range => "range (fromDate/toDate, 1 hour)".to_string(),
            Kind::AvgHour => "avg per hour over 1 day".to_string(),
        }
    }

    /// The query string asking this of `series`, and the answer it must
    /// get. `pick` (any number; the clients draw it at random) chooses the
    /// window among the series' times: the range starts at notification
    /// `1 + pick mod n` of those that leave a full hour after them, the
    /// day is the one holding notification `1 + pick mod sent`.
    pub fn plan(self, series: &Series, pick: u64) -> (String, Expect) {
        match self {
            Kind::LastN => (format!("lastN={LAST_N}"), series.expect_last_n(LAST_N)),
            Kind::Range => {
                let per_window = (RANGE_MS / series.step()).max(1) as u64;
                let starts = series.sent().saturating_sub(per_window - 1).max(1);
                let from = series.time(1 + pick % starts);
                let to = from + RANGE_MS - 1;
                (
                    format!("fromDate={}&toDate={}", iso(from), iso(to)),
                    series.expect_window(from, to),
                )
            }
            Kind::AvgHour => {
                let t = series.time(1 + pick % series.sent().max(1));
                let from = t - t.rem_euclid(DAY_MS);
                let to = from + DAY_MS - 1;
                (
                    format!(
                        "aggrMethod=avg&aggrPeriod=hour&fromDate={}&toDate={}",
                        iso(from),
                        iso(to)
                    ),
                    series.expect_avg(from, to, HOUR_MS),
                )
            }
        }
    }
}

/// Which entities a question is asked of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// A random entity among those the notify phase wrote.
    Load,
    /// The preload's `Room:big`.
    Big,
}

/// What the clients share, read-only.
pub struct Plan {
    /// `host:port` to connect to.
    pub connect: String,
    /// The `Host` header.
    pub host: String,
    /// The server's path prefix.
    pub prefix: String,
    /// The query API's root under it (`/ql/v2`, QuantumLeap's `/v2`).
    pub root: String,
    /// The run's `Fiware-Service`.
    pub tenant: String,
    /// The notify phase's entities that have a series, `(index, series)`.
    pub load: Vec<(usize, Series)>,
    /// `Room:big`'s series, after a preload.
    pub big: Option<Series>,
    /// The (kind, class) pairs asked, in turn.
    pub mix: Vec<(Kind, Class)>,
    /// Closed-loop clients.
    pub clients: usize,
    /// Length of the phase.
    pub duration: Duration,
}

impl Plan {
    /// The pairs to ask: each of `kinds` (once, in the order of
    /// [`Kind::ALL`]) of the load entities when there are any, and of
    /// `Room:big` when it was preloaded.
    pub fn mix(kinds: &[Kind], load: bool, big: bool) -> Vec<(Kind, Class)> {
        let mut mix = Vec::new();
        for (class, wanted) in [(Class::Load, load), (Class::Big, big)] {
            if wanted {
                let asked = Kind::ALL.into_iter().filter(|k| kinds.contains(k));
                mix.extend(asked.map(|k| (k, class)));
            }
        }
        mix
    }
}

/// The answers to one (kind, class) pair.
#[derive(Debug, Clone, Default)]
pub struct PairReport {
    /// Requests, statuses and latencies.
    pub tally: Tally,
    /// Answers that were 200 with the expected values.
    pub passes: u64,
    /// Answers that were not.
    pub fails: u64,
    /// A few failures, for the notes.
    pub examples: Vec<String>,
}

impl PairReport {
    fn merge(&mut self, other: &PairReport) {
        self.tally.merge(&other.tally);
        self.passes += other.passes;
        self.fails += other.fails;
        for e in &other.examples {
            if self.examples.len() < MAX_EXAMPLES {
                self.examples.push(e.clone());
            }
        }
    }
}

/// What the query phase produced.
#[derive(Debug)]
pub struct QueryReport {
    /// One report per pair of the plan's mix, in its order.
    pub pairs: Vec<PairReport>,
    /// From the first query to the last answer.
    pub elapsed: Duration,
}

/// Runs the clients for the plan's duration, with a progress bar.
pub async fn run(plan: Plan, show_progress: bool) -> QueryReport {
    let plan = Arc::new(plan);
    let answered = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let bar = progress::timed_bar(show_progress, "query", plan.duration);
    let start = Instant::now();
    let mut seeds = rand::rng();
    let workers: Vec<_> = (0..plan.clients.max(1))
        .map(|c| {
            let rng = SmallRng::seed_from_u64(seeds.random());
            tokio::spawn(closed_loop(
                plan.clone(),
                c,
                rng,
                start,
                answered.clone(),
                failed.clone(),
            ))
        })
        .collect();
    let all = futures::future::join_all(workers);
    tokio::pin!(all);
    let mut tick = tokio::time::interval(progress::REFRESH);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let results = loop {
        tokio::select! {
            results = &mut all => break results,
            _ = tick.tick(), if !bar.is_hidden() => {
                let elapsed = start.elapsed();
                bar.set_position(elapsed.as_millis() as u64);
                let n = answered.load(Ordering::Relaxed);
                bar.set_message(format!(
                    "{n} queries ({:.0}/s), {} failed",
                    n as f64 / elapsed.as_secs_f64().max(1e-3),
                    failed.load(Ordering::Relaxed)
                ));
            }
        }
    };
    let elapsed = start.elapsed();
    bar.finish_and_clear();
    let mut pairs = vec![PairReport::default(); plan.mix.len()];
    for result in results {
        let theirs = match result {
            Ok(r) => r,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        };
        for (mine, theirs) in pairs.iter_mut().zip(&theirs) {
            mine.merge(theirs);
        }
    }
    QueryReport { pairs, elapsed }
}

/// One client: asks the mix's pairs in turn (starting at its own offset,
/// so the clients spread over the kinds) until the duration is over.
async fn closed_loop(
    plan: Arc<Plan>,
    client: usize,
    mut rng: SmallRng,
    start: Instant,
    answered: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
) -> Vec<PairReport> {
    let mut reports = vec![PairReport::default(); plan.mix.len()];
    if plan.mix.is_empty() {
        return reports;
    }
    let mut caller = Caller::new(&plan.connect, REQUEST_TIMEOUT);
    let mut body = Vec::new();
    let headers = [("Fiware-Service", plan.tenant.as_str())];
    let mut turn = client;
    while start.elapsed() < plan.duration {
        let pair = turn % plan.mix.len();
        turn += 1;
        let (kind, class) = plan.mix[pair];
        let (id, series) = match (class, &plan.big) {
            (Class::Big, Some(big)) => (BIG_ENTITY.to_string(), big),
            _ => {
                let (e, series) = &plan.load[rng.random_range(0..plan.load.len())];
                (entity_id(*e), series)
            }
        };
        let (query, expect) = kind.plan(series, rng.random());
        let target = format!(
            "{}{}/entities/{id}/attrs/temperature?{query}",
            plan.prefix, plan.root
        );
        let request = render_request("GET", &target, &plan.host, &headers, None);
        body.clear();
        let report = &mut reports[pair];
        let head = caller
            .call(&request, Some(&mut body), &mut report.tally)
            .await;
        answered.fetch_add(1, Ordering::Relaxed);
        let outcome = match head {
            Some(h) if h.status == 200 || answer::is_not_found(h.status, &body) => {
                answer::values(&body).and_then(|v| expect.check(&v))
            }
            Some(h) => Err(format!(
                "answered {}: {}",
                h.status,
                String::from_utf8_lossy(&body[..body.len().min(200)]).trim()
            )),
            None => Err("no response".to_string()),
        };
        match outcome {
            Ok(()) => report.passes += 1,
            Err(why) => {
                report.fails += 1;
                failed.fetch_add(1, Ordering::Relaxed);
                if report.examples.len() < MAX_EXAMPLES {
                    report.examples.push(format!("GET {target}: {why}"));
                }
            }
        }
    }
    reports
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORIGIN: i64 = 1_735_689_600_000; // 2025-01-01T00:00:00.000Z

    fn series(step: i64, sent: u64) -> Series {
        let mut s = Series::new(ORIGIN, step);
        s.set_sent(sent);
        s
    }

    #[test]
    fn last_n_asks_for_the_newest_hundred() {
        let (q, e) = Kind::LastN.plan(&series(60_000, 250), 7);
        assert_eq!(q, "lastN=100");
        assert_eq!((e.min, e.max), (100, 100));
        assert_eq!(e.values.unwrap()[0], 151.0);
    }

    #[test]
    fn ranges_cover_one_hour_inside_the_series() {
        // One state a minute, 300 of them: a full hour starts at 1..=241.
        let s = series(60_000, 300);
        let (q, e) = Kind::Range.plan(&s, 0);
        assert_eq!(
            q,
            "fromDate=2025-01-01T00:01:00.000Z&toDate=2025-01-01T01:00:59.999Z"
        );
        assert_eq!((e.min, e.max), (60, 60));
        assert_eq!(e.values.as_ref().unwrap()[0], 1.0);
        for pick in [240, 241, 1000, u64::MAX] {
            let (_, e) = Kind::Range.plan(&s, pick);
            assert_eq!(e.max, 60, "pick {pick}");
        }
        // One a second: 3600 values an hour.
        let (_, e) = Kind::Range.plan(&series(1000, 10_000), 5);
        assert_eq!(e.max, 3600);
        // A series shorter than an hour: the window holds all of it.
        let (_, e) = Kind::Range.plan(&series(60_000, 10), 3);
        assert_eq!(e.max, 10);
        // No series at all: nothing.
        assert_eq!(Kind::Range.plan(&series(60_000, 0), 3).1.max, 0);
    }

    #[test]
    fn averages_cover_one_utc_day() {
        // Two days of one state a second; picks fall on day 1 or day 2.
        let s = series(1000, 2 * 86_400);
        let (q, e) = Kind::AvgHour.plan(&s, 0);
        assert_eq!(
            q,
            "aggrMethod=avg&aggrPeriod=hour&fromDate=2025-01-01T00:00:00.000Z&toDate=2025-01-01T23:59:59.999Z"
        );
        // Hour 0 holds 1..=3599 (state 0 is never sent), the others 3600.
        let values = e.values.unwrap();
        assert_eq!(values.len(), 24);
        assert_eq!(values[0], 1800.0);
        assert_eq!(values[1], (3600 + 7199) as f64 / 2.0);
        let (q, e) = Kind::AvgHour.plan(&s, 86_400);
        assert!(q.contains("fromDate=2025-01-02T00:00:00.000Z"), "{q}");
        // The last day ends with state 172800 at midnight of day 3.
        assert_eq!(e.max, 24);
        // A few hours of one a minute: one value per hour.
        let (_, e) = Kind::AvgHour.plan(&series(60_000, 150), 99);
        assert_eq!(e.values.unwrap(), vec![30.0, 89.5, 135.0]);
    }

    #[test]
    fn the_mix_asks_every_kind_of_every_class() {
        let all = Kind::ALL;
        assert_eq!(Plan::mix(&all, true, false).len(), 3);
        let both = Plan::mix(&all, true, true);
        assert_eq!(both.len(), 6);
        assert_eq!(both[3], (Kind::LastN, Class::Big));
        assert_eq!(Plan::mix(&all, false, true)[0].1, Class::Big);
        assert!(Plan::mix(&all, false, false).is_empty());
        // A subset, given in any order or twice, is asked once each in order.
        let some = [Kind::AvgHour, Kind::LastN, Kind::AvgHour];
        assert_eq!(
            Plan::mix(&some, false, true),
            [(Kind::LastN, Class::Big), (Kind::AvgHour, Class::Big)]
        );
    }

    #[test]
    fn kinds_parse_by_name() {
        for k in Kind::ALL {
            assert_eq!(Kind::parse(k.name()), Ok(k));
        }
        assert!(Kind::parse("avg").is_err());
    }
}
