//! The verify phase: "rows stored = notifications sent", read back through
//! QuantumLeap's own query API.
//!
//! For every entity (or a random sample of [`VERIFY_SAMPLE`]) it reads the
//! entity's states whole (`attrs=TimeInstant,temperature,pressure`, paged
//! with `limit`/`offset`) and checks them against the [`Series`] written:
//! every notification answered 200 is there with its own time and
//! temperature, nothing else is, and each state holds the notification's
//! three attributes as sent ([`check_states`]).
//!
//! What is checked of `TimeInstant` is what QuantumLeap stores of it: the
//! notified `TimeInstant` becomes the state's time index, and is kept as an
//! attribute too, its value the same time written as the index is
//! (`2025-01-01T00:01:00.000+00:00`). It is not counted: QuantumLeap 1.0
//! answers `null` to `aggrMethod=count` over a `DateTime` attribute (weft
//! answers the number). The preload's `Room:big` is checked by counting
//! ([`check_big`]): reading millions of states back would take longer than
//! writing them; where `TimeInstant` is not counted, its newest
//! [`PAGE`] states are read whole instead.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::answer::{self, Table};
use super::client::{Caller, Tally};
use super::payload::{entity_id, iso, parse_iso, ATTRS_PER_ENTITY, ATTR_NAMES, PRESSURE};
use super::series::Series;
use crate::common::Session;
use crate::http::render_request;
use crate::ngsi_update::SETUP_PARALLEL;
use crate::progress;

/// Entities checked: all of them up to this many, else a random sample.
pub const VERIFY_SAMPLE: usize = 200;

/// Values per page: QuantumLeap's default (and most) `limit`.
pub const PAGE: usize = 10_000;

/// Longest wait for one verification response (a count over millions of
/// rows included).
const TIMEOUT: Duration = Duration::from_secs(120);

/// Most problems quoted in the notes.
const MAX_EXAMPLES: usize = 5;

/// What the verify phase found.
#[derive(Debug, Default)]
pub struct Verified {
    /// Entities read back.
    pub checked: u64,
    /// Entities whose rows are exactly those owed.
    pub matched: u64,
    /// Entities with rows missing, extra or wrong.
    pub mismatched: u64,
    /// Entities that could not be read.
    pub errors: u64,
    /// Entities checked with a notification of unknown fate (allowed to
    /// be stored or not).
    pub unsure: u64,
    /// Rows found in the entities that matched (all attributes).
    pub rows: u64,
    /// Whether only a sample of the entities was checked.
    pub sampled: bool,
    /// The verification requests.
    pub tally: Tally,
    /// A few problems, for the notes.
    pub examples: Vec<String>,
}

/// Why an entity did not pass.
enum Problem {
    /// It was read, and differs from what was written.
    Mismatch(String),
    /// It could not be read.
    Error(String),
}

/// Checks every entity of `series` (indexed by entity), or a sample.
pub async fn verify(session: &Session, tenant: &str, root: &str, series: &[Series]) -> Verified {
    let mut chosen: Vec<usize> = (0..series.len()).collect();
    let sampled = chosen.len() > VERIFY_SAMPLE;
    if sampled {
        chosen = rand::seq::index::sample(&mut rand::rng(), series.len(), VERIFY_SAMPLE).into_vec();
        chosen.sort_unstable();
    }
    let bar = progress::spinner(session.show_progress, "verify");
    bar.set_message(format!("reading back {} entities", chosen.len()));
    let chosen = Arc::new(chosen);
    let next = Arc::new(AtomicUsize::new(0));
    let series = Arc::new(series.to_vec());
    let workers: Vec<_> = (0..SETUP_PARALLEL.min(chosen.len()).max(1))
        .map(|_| {
            let (chosen, next, series) = (chosen.clone(), next.clone(), series.clone());
            let base = session.base.clone();
            let tenant = tenant.to_string();
            let root = root.to_string();
            let bar = bar.clone();
            tokio::spawn(async move {
                let mut caller = Caller::new(&base.connect, TIMEOUT);
                let mut tally = Tally::default();
                let mut out = Vec::new();
                while let Some(&e) = chosen.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let id = entity_id(e);
                    let outcome = check_entity(
                        &mut caller,
                        &mut tally,
                        &base,
                        &tenant,
                        &root,
                        &id,
                        &series[e],
                    )
                    .await;
                    out.push((id, series[e].unsure() > 0, outcome));
                    bar.inc(1);
                }
                (tally, out)
            })
        })
        .collect();
    let mut v = Verified {
        sampled,
        ..Verified::default()
    };
    for worker in workers {
        let (tally, outcomes) = match worker.await {
            Ok(r) => r,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        };
        v.tally.merge(&tally);
        for (id, unsure, outcome) in outcomes {
            v.checked += 1;
            v.unsure += u64::from(unsure);
            let why = match outcome {
                Ok(rows) => {
                    v.matched += 1;
                    v.rows += rows;
                    continue;
                }
                Err(Problem::Mismatch(why)) => {
                    v.mismatched += 1;
                    why
                }
                Err(Problem::Error(why)) => {
                    v.errors += 1;
                    why
                }
            };
            if v.examples.len() < MAX_EXAMPLES {
                v.examples.push(format!("{id}: {why}"));
            }
        }
    }
    bar.finish_and_clear();
    v
}

/// Reads one entity back and compares it with its series; the rows found
/// (all attributes) when it matches.
async fn check_entity(
    caller: &mut Caller,
    tally: &mut Tally,
    base: &crate::target::BaseUrl,
    tenant: &str,
    root: &str,
    id: &str,
    series: &Series,
) -> Result<u64, Problem> {
    let mut stored = Vec::new();
    for page in 0.. {
        let target = base.path(&format!(
            "{root}/entities/{id}?attrs={}&limit={PAGE}&offset={}",
            ATTR_NAMES.join(","),
            page * PAGE
        ));
        let body = get(caller, tally, base, tenant, &target).await?;
        let table = answer::table(&body).map_err(Problem::Mismatch)?;
        let last_page = table.times.len() < PAGE;
        stored.extend(check_states(&table).map_err(Problem::Mismatch)?);
        if last_page {
            break;
        }
    }
    let states = series.check_stored(&stored).map_err(Problem::Mismatch)?;
    Ok(states * ATTRS_PER_ENTITY)
}

/// Checks the states of an entity read whole: each holds the three
/// attributes a notification sends, as sent — `TimeInstant` the state's own
/// time index (the notified `TimeInstant` *is* the index, and is kept as an
/// attribute too), `pressure` [`PRESSURE`], `temperature` a number — and no
/// other attribute is answered. A state missing one of them answers `null`
/// there and fails. Returns the `(time, temperature)` pairs, in answer
/// order, for [`Series::check_stored`].
pub fn check_states(table: &Table) -> Result<Vec<(i64, f64)>, String> {
    if table.times.is_empty() {
        return Ok(Vec::new());
    }
    if let Some(other) = table
        .columns
        .keys()
        .find(|k| !ATTR_NAMES.contains(&k.as_str()))
    {
        return Err(format!("rows of an attribute never sent: {other}"));
    }
    let [time_instant, temperature, pressure] = ATTR_NAMES.map(|name| {
        table
            .columns
            .get(name)
            .ok_or_else(|| format!("no {name} rows at all"))
    });
    let (time_instant, temperature, pressure) = (time_instant?, temperature?, pressure?);
    let mut pairs = Vec::with_capacity(table.times.len());
    for (i, &time) in table.times.iter().enumerate() {
        let at = || iso(time);
        if time_instant[i].as_str().and_then(parse_iso) != Some(time) {
            return Err(format!(
                "TimeInstant at {} is {}, expected that time",
                at(),
                time_instant[i]
            ));
        }
        if pressure[i].as_f64() != Some(f64::from(PRESSURE)) {
            return Err(format!(
                "pressure at {} is {}, expected {PRESSURE}",
                at(),
                pressure[i]
            ));
        }
        let Some(value) = temperature[i].as_f64() else {
            return Err(format!(
                "temperature at {} is {}, expected a number",
                at(),
                temperature[i]
            ));
        };
        pairs.push((time, value));
    }
    Ok(pairs)
}

/// How long `Room:big` may take to be fully stored after its preload.
const BIG_SETTLE_DEADLINE: Duration = Duration::from_secs(600);

/// Checks `Room:big`'s rows by counting them: every attribute of every
/// notification answered 200 is stored, and nothing more than was sent.
/// Where the server counts no `TimeInstant` (QuantumLeap), the newest
/// [`PAGE`] states are read whole as well ([`check_newest`]). Returns the
/// rows found, and whether `TimeInstant` was counted.
pub async fn check_big(
    session: &Session,
    tenant: &str,
    root: &str,
    id: &str,
    series: &Series,
) -> (Tally, Result<Counted, String>) {
    let mut caller = Caller::new(&session.base.connect, TIMEOUT);
    let mut tally = Tally::default();
    // The preload is acknowledged once queued in the history's feed, and
    // millions of rows take a while to be moved into the history (a query
    // waits for that at most 10 s, then reads what is there): count again
    // until everything is there or the deadline passes.
    let deadline = std::time::Instant::now() + BIG_SETTLE_DEADLINE;
    let counted = loop {
        let outcome =
            match count_rows(&mut caller, &mut tally, &session.base, tenant, root, id).await {
                Ok(counts) => check_counts(&counts, series.certain(), series.sent()),
                Err(Problem::Error(why) | Problem::Mismatch(why)) => Err(why),
            };
        if outcome.is_ok() || std::time::Instant::now() >= deadline {
            break outcome;
        }
    };
    let outcome = match counted {
        Ok(
            c @ Counted {
                time_instant_counted: false,
                ..
            },
        ) => {
            let target = session.base.path(&format!(
                "{root}/entities/{id}?attrs={}&lastN={PAGE}",
                ATTR_NAMES.join(",")
            ));
            match get(&mut caller, &mut tally, &session.base, tenant, &target).await {
                Ok(body) => answer::table(&body)
                    .and_then(|t| check_newest(&t, series, c.rows / ATTRS_PER_ENTITY))
                    .map(|()| c),
                Err(Problem::Error(why) | Problem::Mismatch(why)) => Err(why),
            }
        }
        other => other,
    };
    (tally, outcome)
}

/// Checks the newest states of a series read whole (`lastN`), when the
/// states counted are `states`: `min(states, PAGE)` of them, each one of
/// the bench's notifications with its three attributes as sent
/// ([`check_states`]), in time order.
pub fn check_newest(table: &Table, series: &Series, states: u64) -> Result<(), String> {
    let pairs = check_states(table)?;
    let want = states.min(PAGE as u64);
    if pairs.len() as u64 != want {
        return Err(format!(
            "the newest {PAGE} states read whole are {}, expected {want}",
            pairs.len()
        ));
    }
    let mut last = 0;
    for &(time, value) in &pairs {
        match series.seq_of(time, value) {
            Some(seq) if seq > last => last = seq,
            _ => {
                return Err(format!(
                    "{value} at {} is not the next notification",
                    iso(time)
                ))
            }
        }
    }
    Ok(())
}

/// Waits, as a client would, until what was acknowledged is stored: one
/// query, which weft answers only once every notification acknowledged
/// before it is in the history (QuantumLeap stores before it answers).
/// Returns how long that took: a history that acknowledges ahead of
/// storing owes this time to the notify phase's rate.
pub async fn settle(session: &Session, tenant: &str, root: &str) -> Duration {
    let started = std::time::Instant::now();
    let mut caller = Caller::new(&session.base.connect, TIMEOUT);
    let mut tally = Tally::default();
    let id = entity_id(0);
    let _ = count_rows(&mut caller, &mut tally, &session.base, tenant, root, &id).await;
    started.elapsed()
}

/// Rows per attribute of entity `id`, by `aggrMethod=count` (`None`:
/// not counted, [`answer::counts`]).
async fn count_rows(
    caller: &mut Caller,
    tally: &mut Tally,
    base: &crate::target::BaseUrl,
    tenant: &str,
    root: &str,
    id: &str,
) -> Result<BTreeMap<String, Option<u64>>, Problem> {
    let target = base.path(&format!(
        "{root}/entities/{id}?aggrMethod=count&attrs={}",
        ATTR_NAMES.join(",")
    ));
    let body = get(caller, tally, base, tenant, &target).await?;
    answer::counts(&body).map_err(Problem::Mismatch)
}

/// A GET that must answer 200 (or QuantumLeap 1.0's 404 for no data);
/// its body.
async fn get(
    caller: &mut Caller,
    tally: &mut Tally,
    base: &crate::target::BaseUrl,
    tenant: &str,
    target: &str,
) -> Result<Vec<u8>, Problem> {
    let request = render_request(
        "GET",
        target,
        &base.host,
        &[("Fiware-Service", tenant)],
        None,
    );
    let mut body = Vec::new();
    match caller.call(&request, Some(&mut body), tally).await {
        Some(head) if head.status == 200 || super::answer::is_not_found(head.status, &body) => {
            Ok(body)
        }
        Some(head) => Err(Problem::Error(format!(
            "GET {target} answered {}: {}",
            head.status,
            String::from_utf8_lossy(&body[..body.len().min(200)]).trim()
        ))),
        None => Err(Problem::Error(format!("GET {target}: no response"))),
    }
}

/// The rows [`check_counts`] found.
#[derive(Debug, PartialEq, Eq)]
pub struct Counted {
    /// Rows in all (every attribute).
    pub rows: u64,
    /// Whether `TimeInstant` was counted too: QuantumLeap 1.0 answers
    /// `null` for the count of a `DateTime` attribute, and its rows must
    /// then be seen another way.
    pub time_instant_counted: bool,
}

/// Checks the rows counted per attribute: each of the notified attributes
/// (and no other) has between `min` and `max` rows, all the same number,
/// as each notification stores one row of each. `TimeInstant` alone may be
/// uncounted (`None`); any other attribute uncounted or absent has 0 rows.
pub fn check_counts(
    counts: &BTreeMap<String, Option<u64>>,
    min: u64,
    max: u64,
) -> Result<Counted, String> {
    if max == 0 && counts.is_empty() {
        return Ok(Counted {
            rows: 0,
            time_instant_counted: true,
        });
    }
    let [time_instant, ..] = ATTR_NAMES;
    let mut first: Option<(&str, u64)> = None;
    let mut time_instant_counted = true;
    for name in ATTR_NAMES {
        let n = match counts.get(name) {
            Some(Some(n)) => *n,
            Some(None) if name == time_instant => {
                time_instant_counted = false;
                continue;
            }
            Some(None) | None => 0,
        };
        if n < min || n > max {
            let want = if min == max {
                min.to_string()
            } else {
                format!("{min}..={max}")
            };
            return Err(format!("{n} {name} rows, expected {want}"));
        }
        match first {
            None => first = Some((name, n)),
            Some((f_name, f)) if f != n => {
                return Err(format!(
                    "{n} {name} rows but {f} {f_name} rows: a notification stores one of each"
                ))
            }
            Some(_) => {}
        }
    }
    if let Some(other) = counts.keys().find(|k| !ATTR_NAMES.contains(&k.as_str())) {
        return Err(format!("rows of an attribute never sent: {other}"));
    }
    Ok(Counted {
        rows: first.map_or(0, |(_, n)| n) * ATTRS_PER_ENTITY,
        time_instant_counted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(pairs: &[(&str, Option<u64>)]) -> BTreeMap<String, Option<u64>> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    fn counted(rows: u64) -> Result<Counted, String> {
        Ok(Counted {
            rows,
            time_instant_counted: true,
        })
    }

    #[test]
    fn three_rows_per_notification() {
        let all = |n| {
            counts(&[
                ("TimeInstant", Some(n)),
                ("temperature", Some(n)),
                ("pressure", Some(n)),
            ])
        };
        assert_eq!(check_counts(&all(40), 40, 40), counted(120));
        assert_eq!(check_counts(&all(41), 40, 42), counted(123));
        assert!(check_counts(&all(39), 40, 40)
            .unwrap_err()
            .contains("39 TimeInstant rows, expected 40"));
        assert!(check_counts(&all(43), 40, 42)
            .unwrap_err()
            .contains("40..=42"));
        let uneven = counts(&[
            ("TimeInstant", Some(40)),
            ("temperature", Some(40)),
            ("pressure", Some(39)),
        ]);
        assert!(check_counts(&uneven, 39, 40)
            .unwrap_err()
            .contains("one of each"));
        let mut extra = all(40);
        extra.insert("humidity".into(), Some(40));
        assert!(check_counts(&extra, 40, 40)
            .unwrap_err()
            .contains("humidity"));
        // An entity never notified answers [].
        assert_eq!(check_counts(&BTreeMap::new(), 0, 0), counted(0));
        assert!(check_counts(&BTreeMap::new(), 1, 1).is_err());
    }

    /// QuantumLeap's count of `TimeInstant` is `null`: the other two
    /// attributes still decide, and missing rows of them still fail.
    #[test]
    fn an_uncounted_time_instant_leaves_the_others_to_count() {
        let ql = |t, p| {
            counts(&[
                ("TimeInstant", None),
                ("temperature", Some(t)),
                ("pressure", Some(p)),
            ])
        };
        assert_eq!(
            check_counts(&ql(40, 40), 40, 40),
            Ok(Counted {
                rows: 120,
                time_instant_counted: false
            })
        );
        assert!(check_counts(&ql(39, 39), 40, 40)
            .unwrap_err()
            .contains("39 temperature rows, expected 40"));
        assert!(check_counts(&ql(40, 39), 40, 40)
            .unwrap_err()
            .contains("39 pressure rows"));
        // A number attribute answered null is not "uncounted": 0 rows.
        let null_temperature = counts(&[
            ("TimeInstant", None),
            ("temperature", None),
            ("pressure", Some(40)),
        ]);
        assert!(check_counts(&null_temperature, 40, 40)
            .unwrap_err()
            .contains("0 temperature rows"));
    }

    /// Notifications `1..=n` of `Room:<n>` as QuantumLeap 1.0 answers an
    /// entity read whole (`attrs=TimeInstant,temperature,pressure`), from
    /// `from` on: `TimeInstant` is the index and an attribute alike.
    fn ql_answer(series: &Series, seqs: std::ops::RangeInclusive<u64>) -> serde_json::Value {
        let times: Vec<String> = seqs
            .clone()
            .map(|s| iso(series.time(s)).replace('Z', "+00:00"))
            .collect();
        serde_json::json!({
            "attributes": [
                {"attrName": "TimeInstant", "values": times},
                {"attrName": "pressure", "values": seqs.clone().map(|_| PRESSURE).collect::<Vec<_>>()},
                {"attrName": "temperature", "values": seqs.map(|s| s as f64).collect::<Vec<_>>()},
            ],
            "entityId": "Room:7",
            "entityType": "Room",
            "index": times,
        })
    }

    fn read(body: &serde_json::Value) -> Result<Vec<(i64, f64)>, String> {
        check_states(&answer::table(body.to_string().as_bytes())?)
    }

    fn sent(n: u64) -> Series {
        let mut series = Series::new(super::super::ORIGIN_MS, super::super::NOTIFY_STEP_MS);
        series.set_sent(n);
        series
    }

    /// QuantumLeap's shape passes when every notification is there, and
    /// fails when a state, or one attribute of a state, is missing.
    #[test]
    fn checks_quantumleaps_states() {
        let series = sent(3);
        let body = ql_answer(&series, 1..=3);
        let pairs = read(&body).unwrap();
        assert_eq!(series.check_stored(&pairs), Ok(3));

        // A notification answered 200 but not stored.
        let missing = read(&ql_answer(&series, 1..=2)).unwrap();
        assert!(series.check_stored(&missing).is_err());

        // One attribute of a state missing: QuantumLeap answers null there.
        for (attr, why) in [
            (0, "TimeInstant at 2025-01-01T00:02:00.000Z is null"),
            (1, "pressure at 2025-01-01T00:02:00.000Z is null"),
            (2, "temperature at 2025-01-01T00:02:00.000Z is null"),
        ] {
            let mut holed = body.clone();
            holed["attributes"][attr]["values"][1] = serde_json::Value::Null;
            assert!(read(&holed).unwrap_err().contains(why), "{attr}");
        }
        // No TimeInstant rows at all (the attribute never answered).
        let mut without = body.clone();
        without["attributes"].as_array_mut().unwrap().remove(0);
        assert!(read(&without)
            .unwrap_err()
            .contains("no TimeInstant rows at all"));
        // A TimeInstant that is not the state's time index.
        let mut moved = body.clone();
        moved["attributes"][0]["values"][2] = "2025-01-01T00:09:00.000+00:00".into();
        assert!(read(&moved).unwrap_err().contains("expected that time"));
        let mut number = body.clone();
        number["attributes"][0]["values"][2] = 3.into();
        assert!(read(&number).is_err());
        // Another attribute answered.
        let mut extra = body.clone();
        extra["attributes"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({"attrName": "humidity", "values": [1, 2, 3]}));
        assert!(read(&extra).unwrap_err().contains("humidity"));
        // Nothing stored: QuantumLeap 1.0's 404 reads as no states.
        let not_found =
            br#"{"error":"Not Found","description":"No records were found for such query."}"#;
        assert_eq!(check_states(&answer::table(not_found).unwrap()), Ok(vec![]));
        assert!(series.check_stored(&[]).is_err());
    }

    /// `Room:big` where `TimeInstant` is not counted: its newest states,
    /// read whole, must be the newest notifications, all of them.
    #[test]
    fn checks_the_newest_states() {
        let series = sent(5);
        let table = |seqs| answer::table(ql_answer(&series, seqs).to_string().as_bytes()).unwrap();
        assert_eq!(check_newest(&table(1..=5), &series, 5), Ok(()));
        assert!(check_newest(&table(2..=5), &series, 5)
            .unwrap_err()
            .contains("are 4, expected 5"));
        let mut holed = ql_answer(&series, 1..=5);
        holed["attributes"][0]["values"][4] = serde_json::Value::Null;
        let holed = answer::table(holed.to_string().as_bytes()).unwrap();
        assert!(check_newest(&holed, &series, 5).is_err());
        // The same state twice is not the next notification.
        let mut twice = ql_answer(&series, 1..=2);
        twice["attributes"][2]["values"][1] = 1.0.into();
        let twice = answer::table(twice.to_string().as_bytes()).unwrap();
        assert!(check_newest(&twice, &series, 2).is_err());
    }
}
