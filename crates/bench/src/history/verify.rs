//! The verify phase: "rows stored = notifications sent", read back through
//! QuantumLeap's own query API.
//!
//! For every entity (or a random sample of [`VERIFY_SAMPLE`]) it reads the
//! whole `temperature` series (`/attrs/temperature/value`, paged with
//! `limit`/`offset`) and checks it against the [`Series`] written: every
//! notification answered 200 is there with its own time and value, nothing
//! else is. Then one `aggrMethod=count` over the entity's three attributes
//! checks that each notification stored a row of each (`TimeInstant`,
//! `temperature`, `pressure`). The preload's `Room:big` is checked by the
//! count alone ([`check_big`]): reading millions of values back would take
//! longer than writing them.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::answer;
use super::client::{Caller, Tally};
use super::payload::{entity_id, ATTRS_PER_ENTITY, ATTR_NAMES};
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
            "{root}/entities/{id}/attrs/temperature/value?limit={PAGE}&offset={}",
            page * PAGE
        ));
        let body = get(caller, tally, base, tenant, &target).await?;
        let got = answer::pairs(&body).map_err(Problem::Mismatch)?;
        let last_page = got.len() < PAGE;
        stored.extend(got);
        if last_page {
            break;
        }
    }
    let values = series.check_stored(&stored).map_err(Problem::Mismatch)?;
    let counts = count_rows(caller, tally, base, tenant, root, id).await?;
    check_counts(&counts, values, values).map_err(Problem::Mismatch)
}

/// How long `Room:big` may take to be fully stored after its preload.
const BIG_SETTLE_DEADLINE: Duration = Duration::from_secs(600);

/// Checks `Room:big`'s rows by counting them: every attribute of every
/// notification answered 200 is stored, and nothing more than was sent.
/// Returns the rows found.
pub async fn check_big(
    session: &Session,
    tenant: &str,
    root: &str,
    id: &str,
    series: &Series,
) -> (Tally, Result<u64, String>) {
    let mut caller = Caller::new(&session.base.connect, TIMEOUT);
    let mut tally = Tally::default();
    // The preload is acknowledged once queued in the history's feed, and
    // millions of rows take a while to be moved into the history (a query
    // waits for that at most 10 s, then reads what is there): count again
    // until everything is there or the deadline passes.
    let deadline = std::time::Instant::now() + BIG_SETTLE_DEADLINE;
    loop {
        let outcome =
            match count_rows(&mut caller, &mut tally, &session.base, tenant, root, id).await {
                Ok(counts) => check_counts(&counts, series.certain(), series.sent()),
                Err(Problem::Error(why) | Problem::Mismatch(why)) => Err(why),
            };
        if outcome.is_ok() || std::time::Instant::now() >= deadline {
            return (tally, outcome);
        }
    }
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

/// Rows per attribute of entity `id`, by `aggrMethod=count`.
async fn count_rows(
    caller: &mut Caller,
    tally: &mut Tally,
    base: &crate::target::BaseUrl,
    tenant: &str,
    root: &str,
    id: &str,
) -> Result<BTreeMap<String, u64>, Problem> {
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

/// Checks the rows counted per attribute: each of the notified attributes
/// (and no other) has between `min` and `max` rows, all the same number,
/// as each notification stores one row of each. Returns the rows in all.
pub fn check_counts(counts: &BTreeMap<String, u64>, min: u64, max: u64) -> Result<u64, String> {
    if max == 0 && counts.is_empty() {
        return Ok(0);
    }
    let mut first = None;
    for name in ATTR_NAMES {
        let n = counts.get(name).copied().unwrap_or(0);
        if n < min || n > max {
            let want = if min == max {
                min.to_string()
            } else {
                format!("{min}..={max}")
            };
            return Err(format!("{n} {name} rows, expected {want}"));
        }
        match first {
            None => first = Some(n),
            Some(f) if f != n => {
                return Err(format!(
                    "{n} {name} rows but {f} {} rows: a notification stores one of each",
                    ATTR_NAMES[0]
                ))
            }
            Some(_) => {}
        }
    }
    if let Some(other) = counts.keys().find(|k| !ATTR_NAMES.contains(&k.as_str())) {
        return Err(format!("rows of an attribute never sent: {other}"));
    }
    Ok(first.unwrap_or(0) * ATTRS_PER_ENTITY)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn three_rows_per_notification() {
        let all = |n| counts(&[("TimeInstant", n), ("temperature", n), ("pressure", n)]);
        assert_eq!(check_counts(&all(40), 40, 40), Ok(120));
        assert_eq!(check_counts(&all(41), 40, 42), Ok(123));
        assert!(check_counts(&all(39), 40, 40)
            .unwrap_err()
            .contains("39 TimeInstant rows, expected 40"));
        assert!(check_counts(&all(43), 40, 42)
            .unwrap_err()
            .contains("40..=42"));
        let uneven = counts(&[("TimeInstant", 40), ("temperature", 40), ("pressure", 39)]);
        assert!(check_counts(&uneven, 39, 40)
            .unwrap_err()
            .contains("one of each"));
        let mut extra = all(40);
        extra.insert("humidity".into(), 40);
        assert!(check_counts(&extra, 40, 40)
            .unwrap_err()
            .contains("humidity"));
        // An entity never notified answers [].
        assert_eq!(check_counts(&BTreeMap::new(), 0, 0), Ok(0));
        assert!(check_counts(&BTreeMap::new(), 1, 1).is_err());
    }
}
