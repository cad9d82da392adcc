//! The history and its feeds on PostgreSQL: the SQLite backend's history
//! (`sqlite/writer.rs`'s appends, rollups and deletes, `sqlite/reader.rs`'s
//! queries and aggregates) in PostgreSQL's dialect, with the same answers.
//!
//! Writes go through the history writer (rows, rollups, the changes feed's
//! cursor and the moved notifications' deletion), except queueing
//! notifications, which goes through a notifications writer of its own so
//! that no move holds it up, and pruning the changes feed, which goes
//! through the main writer that queues its entries. Rows and
//! rollups are keyed by an integer series id (`history_series`, numbered
//! once per tenant, entity and attribute, [`SeriesIds`]). Where SQLite
//! runs one statement per row or per series, this sends arrays: an append
//! is one statement whatever its number of rows (`UNNEST` of column
//! arrays, the new rows' rollups folded in by the same statement; a
//! second one when a row was already stored), and a query or an aggregate
//! is one statement per stored level, joining the series it covers
//! (`UNNEST … WITH ORDINALITY`) laterally to their rows.
//!
//! Result orders that callers see (entities, attributes) are decided in
//! Rust, in byte order like SQLite's `BINARY` collation, whatever the
//! database's collation.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::{try_join_all, BoxFuture};
use parking_lot::Mutex;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, GenericClient, IsolationLevel, Row};

use super::combine::{seqs_in_order, Combine};
use super::conn::Conn;
use super::context::MainLog;
use super::horizon::{followed, Followed};
use super::schema::{self, db};
use super::writer::param;
use super::{position, to_i64, PostgresStore};
use crate::history::{
    decode_feed_blob, decode_feed_entry, delete_in_chunks, delete_in_steps, move_feed,
    path_matches, DeleteStep, MoveTuning, ReadEntry,
};
use crate::rollup::{plan, Level, RollupPartial, HOUR_MS, MINUTE_MS, ROLLUP_PERIODS};
use crate::{
    AggrMethod, AggrPeriod, FeedFilter, FeedMove, HistoryAggregate, HistoryCutoffs, HistoryDelete,
    HistoryEntity, HistoryFeed, HistoryQuery, HistoryRow, HistoryStates, HistoryStore, Result,
    StoreError, HISTORY_FEED_CURSOR,
};

use super::MAX_QUERY_ROWS;

pub(super) use crate::HISTORY_DELETE_CHUNK;

/// Earliest and latest times an aggregation considers: far beyond any
/// real time index, and far enough from `i64`'s ends that bucket
/// arithmetic never overflows.
const AGGREGATE_BOUND: i64 = 1 << 52;

/// A QuantumLeap notification's rows queued in the notifications feed
/// (an entry in the compact form), as written together with the others
/// that wait with it (`postgres/combine.rs`): one multi-row `INSERT` per
/// transaction of the notifications writer instead of a statement and a
/// round trip each. Answers the entry's `seq`.
pub(super) struct QueuedNotification;

impl Combine for QueuedNotification {
    type Item = Vec<u8>;
    type Answer = u64;

    fn write_many<'c>(c: &'c Conn, entries: &'c [Vec<u8>]) -> BoxFuture<'c, Result<Vec<u64>>> {
        Box::pin(async move {
            let rows = c
                .query(
                    "INSERT INTO history_feed (feed, states) \
                     SELECT $1, r FROM UNNEST($2::BYTEA[]) WITH ORDINALITY AS u(r, o) \
                     ORDER BY o RETURNING seq",
                    &[&feed_name(HistoryFeed::Notifications), &entries],
                )
                .await
                .map_err(db)?;
            seqs_in_order(&rows)
        })
    }

    fn write_one<'c>(c: &'c Conn, entry: &'c Vec<u8>) -> BoxFuture<'c, Result<u64>> {
        Box::pin(async move {
            let row = c
                .query_one(
                    "INSERT INTO history_feed (feed, states) VALUES ($1, $2) RETURNING seq",
                    &[&feed_name(HistoryFeed::Notifications), entry],
                )
                .await
                .map_err(db)?;
            position(&row, 0)
        })
    }
}

/// The notifications feed as the notification writers of several nodes
/// append to it side by side (see `postgres/horizon.rs`): the history
/// mover reads it only up to its horizon, so it never moves, and deletes,
/// past an entry another node has yet to commit. Its entries share
/// `history_feed`'s sequence with the changes feed, whose `seq`s only make
/// the horizon trail a little more.
///
/// A node's notifications writer does nothing else, so its connection is
/// named the feed's writer for good, like the ingest log's; the history
/// writer's moves (tens of milliseconds each) are none of the horizon's
/// business.
pub(super) const NOTIFIED: Followed = followed! {
    name: "notifications feed",
    writer: "weft notifications feed",
    lock: none,
    tables: ["history_feed"],
    on_demand: false
};

/// The span of `seq`s one round trip of [`HistoryStore::read_history_feed`]
/// reads (a page).
const FEED_PAGE: i64 = 256;

/// The `history_feed.feed` value of each feed (both share the table):
/// the main writer queues entity changes under it too.
pub(super) fn feed_name(feed: HistoryFeed) -> &'static str {
    match feed {
        HistoryFeed::Changes => "changes",
        HistoryFeed::Notifications => "notifications",
    }
}

/// The weekly history partitions this store knows exist (their starts),
/// so that an append checks the catalog, and creates a partition, only
/// for a week it has not seen yet instead of once per append.
///
/// A week is added only after the write creating (or finding) its
/// partition committed, and forgotten before retention may drop it, so
/// the set never names a partition this store removed. A partition
/// dropped behind its back (by hand, or by another node's retention) is
/// not noticed: rows of that week then land in the default partition,
/// kept and queried like any other, until a restart forgets the week.
#[derive(Debug, Default)]
pub(super) struct Partitions {
    known: Mutex<HashSet<i64>>,
}

impl Partitions {
    /// The starts of the weeks `rows` fall in that are not known to exist.
    fn missing(&self, rows: &[HistoryRow]) -> Vec<i64> {
        let known = self.known.lock();
        let weeks: BTreeSet<i64> = rows
            .iter()
            .map(|r| schema::partition_for(r.time).1)
            .filter(|week| !known.contains(week))
            .collect();
        weeks.into_iter().collect()
    }

    /// Records weeks whose partitions exist (committed).
    fn add(&self, weeks: &[i64]) {
        self.known.lock().extend(weeks);
    }

    /// Forgets the weeks that end by `before`: retention may drop them.
    fn forget_before(&self, before: i64) {
        self.known
            .lock()
            .retain(|&from| from.saturating_add(schema::HISTORY_PARTITION_MS) > before);
    }
}

/// A series' key: tenant, entity id, entity type and attribute.
type SeriesKey = (String, String, String, String);

/// The same key borrowed from a row.
type SeriesRef<'r> = (&'r str, &'r str, &'r str, &'r str);

/// The ids of the series (`history_series`) this store has seen, so that
/// an append numbers its rows without asking the database, except for a
/// series it has not met yet. Ids are never deleted or reused (see
/// schema step 14), so a cached one stays right whatever other nodes do.
/// Past [`SERIES_CACHED`] entries the cache starts over rather than grow
/// without bound. Keyed by the series' four parts in one string
/// ([`cache_key`]), so that looking a row's series up allocates nothing.
#[derive(Debug, Default)]
pub(super) struct SeriesIds {
    known: Mutex<HashMap<String, i64>>,
}

/// Most series ids a store keeps in memory (about 100 bytes each).
const SERIES_CACHED: usize = 1 << 20;

fn series_ref(r: &HistoryRow) -> SeriesRef<'_> {
    (&r.tenant, &r.entity_id, &r.entity_type, &r.attr)
}

fn owned((tenant, id, ty, attr): SeriesRef<'_>) -> SeriesKey {
    (tenant.into(), id.into(), ty.into(), attr.into())
}

/// Writes the cache's key of a series into `out` (cleared first): each
/// part preceded by its length, so no two series share a key.
fn cache_key(out: &mut String, (tenant, id, ty, attr): SeriesRef<'_>) {
    use std::fmt::Write;
    out.clear();
    for part in [tenant, id, ty, attr] {
        let _ = write!(out, "{}:{part}", part.len());
    }
}

impl SeriesIds {
    /// The ids of the distinct series in `wanted` that are cached, and
    /// those that are not.
    fn split<'r>(
        &self,
        wanted: &[SeriesRef<'r>],
    ) -> (HashMap<SeriesRef<'r>, i64>, Vec<SeriesRef<'r>>) {
        let known = self.known.lock();
        let mut found = HashMap::new();
        let mut missing = Vec::new();
        let mut buffer = String::new();
        for &key in wanted {
            cache_key(&mut buffer, key);
            match known.get(buffer.as_str()) {
                Some(&id) => {
                    found.insert(key, id);
                }
                None => missing.push(key),
            }
        }
        (found, missing)
    }

    /// Records committed ids.
    fn add(&self, ids: &[(SeriesKey, i64)]) {
        let mut known = self.known.lock();
        if known.len() >= SERIES_CACHED {
            known.clear();
        }
        for ((tenant, id, ty, attr), series) in ids {
            let mut key = String::new();
            cache_key(&mut key, (tenant, id, ty, attr));
            known.insert(key, *series);
        }
    }
}

/// Numbers the series `keys` (inserting those not numbered yet) and
/// answers `(key, id)` for each: two statements, the second seeing what
/// other nodes committed meanwhile (read committed), so two nodes meeting
/// a new series together both get the one id.
async fn number_series(c: &Conn, keys: &[SeriesKey]) -> Result<Vec<(SeriesKey, i64)>> {
    let column = |pick: fn(&SeriesKey) -> &str| keys.iter().map(pick).collect::<Vec<&str>>();
    let (tenants, ids, types, attrs) = (
        column(|k| &k.0),
        column(|k| &k.1),
        column(|k| &k.2),
        column(|k| &k.3),
    );
    let params: [&(dyn ToSql + Sync); 4] = [&tenants, &ids, &types, &attrs];
    c.execute(
        "INSERT INTO history_series (tenant, entity_id, entity_type, attr) \
         SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[]) \
         ORDER BY 1, 2, 3, 4 ON CONFLICT DO NOTHING",
        &params,
    )
    .await
    .map_err(db)?;
    let rows = c
        .query(
            "SELECT k.n, s.id FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[]) \
                 WITH ORDINALITY AS k(tenant, entity_id, entity_type, attr, n) \
             JOIN history_series s ON s.tenant = k.tenant AND s.entity_id = k.entity_id \
                 AND s.entity_type = k.entity_type AND s.attr = k.attr",
            &params,
        )
        .await
        .map_err(db)?;
    if rows.len() != keys.len() {
        return Err(StoreError::Database(format!(
            "numbered {} history series of {}",
            rows.len(),
            keys.len()
        )));
    }
    Ok(rows
        .iter()
        .map(|r| (keys[(r.get::<_, i64>(0) - 1) as usize].clone(), r.get(1)))
        .collect())
}

/// Longest a read of the notifications feed waits for its horizon to
/// pass what this node queued (another node's entry in flight below it
/// holds the horizon back; the read then stops below that entry).
const OWN_NOTIFICATIONS_WAIT: Duration = Duration::from_secs(1);

impl PostgresStore {
    /// How far the notifications feed may be read: its horizon, once it
    /// has passed every notification this node has queued (answered at
    /// commit, before the horizon's next look), so that what a node was
    /// told is queued is what its reads find.
    async fn notified_horizon(&self) -> u64 {
        let mine = self.notified_last.load(Ordering::Acquire);
        let mut through = self.notified_through.clone();
        let passed = through.wait_for(|&t| t >= mine);
        let _ = tokio::time::timeout(OWN_NOTIFICATIONS_WAIT, passed).await;
        let horizon = *through.borrow();
        horizon
    }

    /// The series id of each of `rows`, numbering the series this store
    /// has not met yet in one write of the history writer (usually none,
    /// and then no write at all).
    pub(super) async fn series_of(&self, rows: &[HistoryRow]) -> Result<Vec<i64>> {
        let mut distinct: Vec<SeriesRef<'_>> = rows.iter().map(series_ref).collect();
        distinct.sort_unstable();
        distinct.dedup();
        let (mut found, missing) = self.series.split(&distinct);
        if !missing.is_empty() {
            let keys: Vec<SeriesKey> = missing.iter().copied().map(owned).collect();
            let numbered = self
                .history
                .write(move |c| Box::pin(async move { number_series(c, &keys).await }))
                .await?;
            for (key, id) in &numbered {
                let at = missing
                    .binary_search(&(&*key.0, &*key.1, &*key.2, &*key.3))
                    .map_err(|_| StoreError::Database("a series numbered unasked".into()))?;
                found.insert(missing[at], *id);
            }
            self.series.add(&numbered);
        }
        Ok(rows.iter().map(|r| found[&series_ref(r)]).collect())
    }

    /// Makes sure the weekly partitions `rows` fall in exist before they
    /// are appended: one write of the history writer creating those not
    /// known yet (usually none, and then no write at all).
    pub(super) async fn ensure_partitions(&self, rows: &[HistoryRow]) -> Result<()> {
        let missing = self.partitions.missing(rows);
        if missing.is_empty() {
            return Ok(());
        }
        let weeks = missing.clone();
        self.history
            .write(move |c| {
                Box::pin(async move {
                    for week in weeks {
                        schema::ensure_partition(c, week).await?;
                    }
                    Ok(())
                })
            })
            .await?;
        self.partitions.add(&missing);
        Ok(())
    }
}

/// Stores `rows`, whose series ids are `series` (skipping rows whose key
/// is stored, or came earlier in `rows`), records entities seen for the
/// first time with the service path of their first row and the types'
/// attributes, and adds the new rows to their series' minute and hour
/// rollups — all in one statement. The weekly partitions the rows fall in
/// are created beforehand ([`PostgresStore::ensure_partitions`]); a row
/// whose partition is missing lands in the default one. Answers how many
/// rows were new.
pub(super) async fn append_history(c: &Conn, rows: &[HistoryRow], series: &[i64]) -> Result<u64> {
    if rows.is_empty() {
        return Ok(0);
    }
    debug_assert_eq!(rows.len(), series.len());
    // The entities (with their first row's path) and the types'
    // attributes, each once: a handful per batch, which the statement
    // only has to look up, in key order like every insert two nodes may
    // make together.
    let mut seen = HashSet::new();
    let firsts: Vec<&HistoryRow> = rows
        .iter()
        .filter(|r| seen.insert((&r.tenant, &r.entity_type, &r.entity_id)))
        .collect();
    let mut seen = HashSet::new();
    let columns: Vec<&HistoryRow> = rows
        .iter()
        .filter(|r| seen.insert((&r.tenant, &r.entity_type, &r.attr)))
        .collect();
    let e_tenants: Vec<&str> = firsts.iter().map(|r| r.tenant.as_str()).collect();
    let e_types: Vec<&str> = firsts.iter().map(|r| r.entity_type.as_str()).collect();
    let e_ids: Vec<&str> = firsts.iter().map(|r| r.entity_id.as_str()).collect();
    let e_paths: Vec<&str> = firsts.iter().map(|r| r.service_path.as_str()).collect();
    let c_tenants: Vec<&str> = columns.iter().map(|r| r.tenant.as_str()).collect();
    let c_types: Vec<&str> = columns.iter().map(|r| r.entity_type.as_str()).collect();
    let c_attrs: Vec<&str> = columns.iter().map(|r| r.attr.as_str()).collect();
    let times: Vec<i64> = rows.iter().map(|r| r.time).collect();
    let instances: Vec<i64> = rows.iter().map(|r| r.instance).collect();
    let paths: Vec<&str> = rows.iter().map(|r| r.service_path.as_str()).collect();
    let attr_types: Vec<&str> = rows.iter().map(|r| r.attr_type.as_str()).collect();
    let values: Vec<&str> = rows.iter().map(|r| r.value.as_str()).collect();
    let numbers: Vec<Option<f64>> = rows.iter().map(|r| r.number).collect();
    // Data-modifying CTEs all run, whether or not the final SELECT reads
    // them; `added` holds only the rows the insert did not skip, so the
    // rollups count each stored row once, like the SQLite backend's
    // `Rollups` (a bucket's partial merged into the stored one: counts and
    // sums add, NULL meaning "no number", LEAST/GREATEST ignoring NULLs).
    // Rows go in their input order, so of two with one key the first stays.
    //
    // A row already stored (a move made again after a crash, a notification
    // sent twice) is rare, and skipping conflicts costs the insert a second
    // look into the key for every row: the rows go in plainly first, and
    // only when one is refused as a duplicate are they written again,
    // skipping those stored.
    let sql = |skip: &str| {
        format!(
            "WITH batch AS (
             SELECT * FROM UNNEST($1::int8[], $2::int8[], $3::int8[], $4::text[], $5::text[],
                                  $6::text[], $7::float8[])
                 WITH ORDINALITY AS u(series, time, instance, service_path, attr_type, value,
                                      number, n)
         ),
         entities AS (
             INSERT INTO history_entities (tenant, entity_type, entity_id, service_path)
             SELECT * FROM UNNEST($8::text[], $9::text[], $10::text[], $11::text[])
             ORDER BY 1, 2, 3
             ON CONFLICT DO NOTHING
         ),
         columns AS (
             INSERT INTO history_columns (tenant, entity_type, attr)
             SELECT * FROM UNNEST($12::text[], $13::text[], $14::text[])
             ORDER BY 1, 2, 3
             ON CONFLICT DO NOTHING
         ),
         added AS (
             INSERT INTO history (series, time, instance, service_path, attr_type, value, number)
             SELECT series, time, instance, service_path, attr_type, value, number
             FROM batch ORDER BY n
             {skip}
             RETURNING series, time, number
         ),
         rolled AS (
             INSERT INTO history_rollups AS r (series, period, bucket, rows, numbers,
                 sum_value, min_value, max_value)
             SELECT series, p.period, {bucket},
                    COUNT(*), COUNT(number), SUM(number), MIN(number), MAX(number)
             FROM added CROSS JOIN (VALUES ({MINUTE_MS}::int8), ({HOUR_MS}::int8)) AS p(period)
             GROUP BY 1, 2, 3
             ON CONFLICT (series, period, bucket) DO UPDATE SET
                 rows = r.rows + excluded.rows,
                 numbers = r.numbers + excluded.numbers,
                 sum_value = CASE WHEN r.sum_value IS NULL THEN excluded.sum_value
                     WHEN excluded.sum_value IS NULL THEN r.sum_value
                     ELSE r.sum_value + excluded.sum_value END,
                 min_value = LEAST(r.min_value, excluded.min_value),
                 max_value = GREATEST(r.max_value, excluded.max_value)
         )
         SELECT COUNT(*) FROM added",
            bucket = floor_sql("time", "p.period"),
        )
    };
    debug_assert_eq!(ROLLUP_PERIODS, [MINUTE_MS, HOUR_MS]);
    let params: [&(dyn ToSql + Sync); 14] = [
        &series,
        &times,
        &instances,
        &paths,
        &attr_types,
        &values,
        &numbers,
        &e_tenants,
        &e_types,
        &e_ids,
        &e_paths,
        &c_tenants,
        &c_types,
        &c_attrs,
    ];
    let plain = sql("");
    let (saved, tried) = futures::future::join(
        c.batch_execute("SAVEPOINT plain"),
        c.query_one(&plain, &params),
    )
    .await;
    saved.map_err(db)?;
    match tried {
        Ok(row) => return Ok(row.get::<_, i64>(0) as u64),
        Err(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) => {
            c.batch_execute("ROLLBACK TO SAVEPOINT plain")
                .await
                .map_err(db)?;
        }
        Err(e) => return Err(db(e)),
    }
    let row = c
        .query_one(&sql("ON CONFLICT DO NOTHING"), &params)
        .await
        .map_err(db)?;
    Ok(row.get::<_, i64>(0) as u64)
}

/// SQL flooring integer `column` to a multiple of `unit` (also below 0:
/// `%` truncates toward zero, so the remainder is made non-negative).
fn floor_sql(column: &str, unit: &str) -> String {
    format!("({column} - (({column} % {unit}) + {unit}) % {unit})")
}

/// The SQL of the start (epoch ms, UTC) of the bucket holding the time in
/// `column`: the SQLite backend's `bucket_sql` in PostgreSQL. Fixed-length
/// periods floor it to a multiple of their length (also for times before
/// 1970); months and years use the UTC calendar. No period: one bucket (0)
/// for everything.
fn bucket_sql(period: Option<AggrPeriod>, column: &str) -> String {
    let fixed = |unit: i64| floor_sql(column, &unit.to_string());
    let calendar = |field: &str| {
        format!(
            "(EXTRACT(EPOCH FROM date_trunc('{field}', \
                 to_timestamp({column} / 1000.0) AT TIME ZONE 'UTC'))::int8 * 1000)"
        )
    };
    match period {
        None => "0::int8".to_string(),
        Some(AggrPeriod::Second) => fixed(1_000),
        Some(AggrPeriod::Minute) => fixed(60_000),
        Some(AggrPeriod::Hour) => fixed(3_600_000),
        Some(AggrPeriod::Day) => fixed(86_400_000),
        Some(AggrPeriod::Month) => calendar("month"),
        Some(AggrPeriod::Year) => calendar("year"),
    }
}

/// One step of a history delete: the SQLite backend's `delete_history`
/// (up to [`HISTORY_DELETE_CHUNK`] rows in range, series by series, whole
/// rollup buckets in range deleted, the buckets the range cuts through
/// corrected, [`crate::rollup::after_delete`]). The row delete names its
/// time range, so PostgreSQL reads only the weekly partitions it spans.
async fn delete_history(c: &Conn, d: &HistoryDelete) -> Result<DeleteStep> {
    use crate::rollup::{after_delete, covered_buckets, cut_buckets, floor_to};
    let entities = delete_targets(c, d).await?;
    let (from, to) = d.time_range();
    let cut = cut_buckets(d.from, d.to);
    let tenant = d.tenant.as_str();
    let mut budget = HISTORY_DELETE_CHUNK;
    let mut step = DeleteStep::default();
    for (id, ty) in &entities {
        for (attr, series) in entity_attrs(&**c, tenant, id, ty).await? {
            if !d.covers_attr(&attr) {
                continue;
            }
            if budget == 0 {
                return Ok(step);
            }
            for period in ROLLUP_PERIODS {
                let (first, last) = covered_buckets(d.from, d.to, period);
                c.execute(
                    "DELETE FROM history_rollups WHERE series = $1 AND period = $2 \
                     AND bucket >= $3 AND bucket <= $4",
                    &[&series, &period, &first, &last],
                )
                .await
                .map_err(db)?;
            }
            let doomed: Vec<(i64, i64, Option<f64>)> = c
                .query(
                    "SELECT time, instance, number FROM history WHERE series = $1 \
                     AND time >= $2 AND time <= $3 ORDER BY time, instance LIMIT $4",
                    &[&series, &from, &to, &(budget as i64)],
                )
                .await
                .map_err(db)?
                .iter()
                .map(|r| (r.get(0), r.get(1), r.get(2)))
                .collect();
            let Some(&(last, last_instance, _)) = doomed.last() else {
                continue;
            };
            // Exactly the rows read: up to the last one's (time, instance).
            c.execute(
                "DELETE FROM history WHERE series = $1 AND time >= $2 AND time <= $3 \
                 AND (time < $3 OR instance <= $4)",
                &[&series, &from, &last, &last_instance],
            )
            .await
            .map_err(db)?;
            for &(period, bucket) in &cut {
                let mut deleted = RollupPartial::default();
                for &(time, _, number) in &doomed {
                    if floor_to(time, period) == bucket {
                        deleted.add(number);
                    }
                }
                if deleted.rows == 0 {
                    continue;
                }
                let stored = c
                    .query_opt(
                        "SELECT rows, numbers, sum_value, min_value, max_value \
                         FROM history_rollups WHERE series = $1 AND period = $2 AND bucket = $3",
                        &[&series, &period, &bucket],
                    )
                    .await
                    .map_err(db)?
                    .map(|r| partial_of(&r));
                let Some(stored) = stored else { continue };
                let remaining = partial_of(
                    &c.query_one(
                        "SELECT COUNT(*), COUNT(number), SUM(number), MIN(number), MAX(number) \
                         FROM history WHERE series = $1 AND time >= $2 AND time < $3",
                        &[&series, &bucket, &(bucket + period)],
                    )
                    .await
                    .map_err(db)?,
                );
                match after_delete(&stored, &deleted, &remaining) {
                    None => c
                        .execute(
                            "DELETE FROM history_rollups \
                             WHERE series = $1 AND period = $2 AND bucket = $3",
                            &[&series, &period, &bucket],
                        )
                        .await
                        .map_err(db)?,
                    Some(p) => c
                        .execute(
                            "UPDATE history_rollups SET rows = $4, numbers = $5, \
                                 sum_value = $6, min_value = $7, max_value = $8 \
                             WHERE series = $1 AND period = $2 AND bucket = $3",
                            &[
                                &series,
                                &period,
                                &bucket,
                                &(p.rows as i64),
                                &(p.numbers as i64),
                                &p.sum(),
                                &p.min,
                                &p.max,
                            ],
                        )
                        .await
                        .map_err(db)?,
                };
            }
            step.rows += doomed.len() as u64;
            budget -= doomed.len();
        }
        if budget == 0 {
            return Ok(step);
        }
        forget_if_empty(c, tenant, id, ty).await?;
    }
    step.done = true;
    Ok(step)
}

/// The rollup partial of a `rows, numbers, sum, min, max` result row.
fn partial_of(r: &Row) -> RollupPartial {
    let sum: Option<f64> = r.get(2);
    RollupPartial {
        rows: r.get::<_, i64>(0) as u64,
        numbers: r.get::<_, i64>(1) as u64,
        sum: sum.unwrap_or(0.0),
        min: r.get(3),
        max: r.get(4),
    }
}

/// The (id, type) of the entities a delete covers, in key order (byte
/// order, as SQLite's): its tenant's entities with its id and/or type,
/// under its service path. With neither an id nor a type, none.
async fn delete_targets(c: &Conn, d: &HistoryDelete) -> Result<Vec<(String, String)>> {
    if d.entity_id.is_none() && d.entity_type.is_none() {
        return Ok(Vec::new());
    }
    let mut out: Vec<(String, String)> = c
        .query(
            "SELECT entity_id, entity_type, service_path FROM history_entities \
             WHERE tenant = $1 AND ($2::text IS NULL OR entity_id = $2) \
             AND ($3::text IS NULL OR entity_type = $3)",
            &[&d.tenant, &d.entity_id, &d.entity_type],
        )
        .await
        .map_err(db)?
        .iter()
        .filter(|r| d.covers_path(r.get(2)))
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    out.sort_unstable_by(|a, b| (&a.1, &a.0).cmp(&(&b.1, &b.0)));
    Ok(out)
}

/// Removes an entity from `history_entities` once it has neither rows nor
/// rollups, and its type's `history_columns` once no entity of the type is
/// left.
async fn forget_if_empty(c: &Conn, tenant: &str, id: &str, ty: &str) -> Result<()> {
    let left: bool = c
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM history_series s \
                 WHERE s.tenant = $1 AND s.entity_id = $2 AND s.entity_type = $3 \
                 AND (EXISTS (SELECT 1 FROM history h WHERE h.series = s.id) \
                      OR EXISTS (SELECT 1 FROM history_rollups r WHERE r.series = s.id)))",
            &[&tenant, &id, &ty],
        )
        .await
        .map_err(db)?
        .get(0);
    if !left {
        c.execute(
            "DELETE FROM history_entities \
             WHERE tenant = $1 AND entity_type = $2 AND entity_id = $3",
            &[&tenant, &ty, &id],
        )
        .await
        .map_err(db)?;
        c.execute(
            "DELETE FROM history_columns WHERE tenant = $1 AND entity_type = $2 \
             AND NOT EXISTS (SELECT 1 FROM history_entities \
                 WHERE tenant = $1 AND entity_type = $2)",
            &[&tenant, &ty],
        )
        .await
        .map_err(db)?;
    }
    Ok(())
}

/// Deletes a tenant's expired history, series by series, up to
/// [`HISTORY_DELETE_CHUNK`] rows and buckets: rows before `rows_before`,
/// minute and hour buckets that end by `rollups_before`; an entity left
/// with neither rows nor rollups leaves `history_entities`. The SQLite
/// backend's `expire_history`; what runs after
/// [`drop_expired_partitions`], so its row deletes touch only the weeks
/// no partition drop could take (the one straddling the cutoff, those a
/// longer retention keeps, the default partition).
async fn expire_history(
    c: &Conn,
    tenant: &str,
    rows_before: Option<i64>,
    rollups_before: Option<i64>,
) -> Result<u64> {
    let entities: Vec<(String, String)> = c
        .query(
            "SELECT entity_id, entity_type FROM history_entities WHERE tenant = $1",
            &[&tenant],
        )
        .await
        .map_err(db)?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let mut budget = HISTORY_DELETE_CHUNK;
    let mut deleted = 0u64;
    for (id, ty) in &entities {
        for (_, series) in entity_attrs(&**c, tenant, id, ty).await? {
            if budget == 0 {
                return Ok(deleted);
            }
            if let Some(before) = rows_before {
                // Never more than the budget: stop at the budget-th row.
                let boundary: Option<i64> = c
                    .query_opt(
                        "SELECT time FROM history WHERE series = $1 AND time < $2 \
                         ORDER BY time LIMIT 1 OFFSET $3",
                        &[&series, &before, &(budget as i64)],
                    )
                    .await
                    .map_err(db)?
                    .map(|r| r.get(0));
                let n = c
                    .execute(
                        "DELETE FROM history WHERE series = $1 AND time < $2",
                        &[&series, &boundary.unwrap_or(before)],
                    )
                    .await
                    .map_err(db)?;
                deleted += n;
                budget = budget.saturating_sub(n as usize);
            }
            if let Some(before) = rollups_before {
                for period in ROLLUP_PERIODS {
                    let n = c
                        .execute(
                            "DELETE FROM history_rollups \
                             WHERE series = $1 AND period = $2 AND bucket <= $3",
                            &[&series, &period, &(before - period)],
                        )
                        .await
                        .map_err(db)?;
                    deleted += n;
                    budget = budget.saturating_sub(n as usize);
                }
            }
        }
        forget_if_empty(c, tenant, id, ty).await?;
    }
    Ok(deleted)
}

/// Longest a partition drop waits for the queries reading the history
/// (dropping takes an exclusive lock on it); past it the drop gives up
/// for this pass and the rows are deleted one by one instead.
const DROP_LOCK_TIMEOUT: &str = "2s";

/// Drops the weekly partitions whose rows every cutoff lets go: those
/// ending by the latest listed `rows_before` in which no tenant keeping
/// rows of that week (unlisted, without a row cutoff, or with an earlier
/// one) has any. Tenants share partitions, so one whose retention is
/// longer keeps a week's partition for everyone, and the others' rows in
/// it are deleted row by row. Answers the dropped weeks' starts and how
/// many rows they held.
async fn drop_expired_partitions(c: &Conn, cutoffs: &[HistoryCutoffs]) -> Result<(Vec<i64>, u64)> {
    let Some(horizon) = cutoffs.iter().filter_map(|t| t.rows_before).max() else {
        return Ok((Vec::new(), 0));
    };
    // A tenant listed twice keeps what its earlier cutoff keeps.
    let mut cutoff: HashMap<&str, Option<i64>> = HashMap::new();
    for t in cutoffs {
        cutoff
            .entry(t.tenant.as_str())
            .and_modify(|c| *c = c.zip(t.rows_before).map(|(a, b)| a.min(b)))
            .or_insert(t.rows_before);
    }
    // Every tenant with rows has an entry here, written with them.
    let tenants: Vec<String> = c
        .query("SELECT DISTINCT tenant FROM history_entities", &[])
        .await
        .map_err(db)?
        .iter()
        .map(|r| r.get(0))
        .collect();
    // Partition names are built per week: run on the plain client, not
    // kept among the writer's prepared statements.
    let client: &Client = c;
    let mut dropped = Vec::new();
    let mut rows = 0u64;
    for (name, from) in schema::history_partitions(client).await? {
        let end = from.saturating_add(schema::HISTORY_PARTITION_MS);
        if end > horizon {
            break;
        }
        let mut kept = false;
        for tenant in &tenants {
            let expires = cutoff
                .get(tenant.as_str())
                .copied()
                .flatten()
                .is_some_and(|before| before >= end);
            if !expires
                && client
                    .query_opt(
                        &format!(
                            "SELECT 1 FROM {name} WHERE series IN \
                                 (SELECT id FROM history_series WHERE tenant = $1) LIMIT 1"
                        ),
                        &[tenant],
                    )
                    .await
                    .map_err(db)?
                    .is_some()
            {
                kept = true;
                break;
            }
        }
        if kept {
            continue;
        }
        let n: i64 = client
            .query_one(&format!("SELECT COUNT(*) FROM {name}"), &[])
            .await
            .map_err(db)?
            .get(0);
        client
            .batch_execute(&format!(
                "SET LOCAL lock_timeout = '{DROP_LOCK_TIMEOUT}'; DROP TABLE {name}; \
                 SET LOCAL lock_timeout TO DEFAULT"
            ))
            .await
            .map_err(db)?;
        dropped.push(from);
        rows += n as u64;
    }
    Ok((dropped, rows))
}

/// The entities of `tenant` with history, optionally of one type and under
/// a service-path prefix, ordered by type then id (in byte order).
async fn history_entities<C: GenericClient + Sync>(
    c: &C,
    tenant: &str,
    entity_type: Option<&str>,
    prefix: Option<&str>,
) -> Result<Vec<HistoryEntity>> {
    let rows = match entity_type {
        Some(ty) => {
            c.query(
                "SELECT entity_id, entity_type, service_path FROM history_entities \
                 WHERE tenant = $1 AND entity_type = $2",
                &[&tenant, &ty],
            )
            .await
        }
        None => {
            c.query(
                "SELECT entity_id, entity_type, service_path FROM history_entities \
                 WHERE tenant = $1",
                &[&tenant],
            )
            .await
        }
    }
    .map_err(db)?;
    let mut out: Vec<HistoryEntity> = rows
        .iter()
        .map(|r| HistoryEntity {
            entity_id: r.get(0),
            entity_type: r.get(1),
            service_path: r.get(2),
        })
        .filter(|e| prefix.is_none_or(|p| path_matches(p, &e.service_path)))
        .collect();
    out.sort_unstable_by(|a, b| {
        (&a.entity_type, &a.entity_id).cmp(&(&b.entity_type, &b.entity_id))
    });
    Ok(out)
}

/// The (id, type) of the entities a query covers, ordered by id then
/// type. The service-path filter applies to the path an entity was first
/// recorded under.
async fn query_entities<C: GenericClient + Sync>(
    c: &C,
    q: &HistoryQuery,
) -> Result<Vec<(String, String)>> {
    let prefix = q.service_path.as_deref();
    let mut out: Vec<(String, String)> = if q.entity_ids.is_empty() {
        history_entities(c, &q.tenant, q.entity_type.as_deref(), prefix)
            .await?
            .into_iter()
            .map(|e| (e.entity_id, e.entity_type))
            .collect()
    } else {
        let rows = match q.entity_type.as_deref() {
            Some(ty) => {
                c.query(
                    "SELECT entity_id, entity_type, service_path FROM history_entities \
                     WHERE tenant = $1 AND entity_type = $2 AND entity_id = ANY($3)",
                    &[&q.tenant, &ty, &q.entity_ids],
                )
                .await
            }
            None => {
                c.query(
                    "SELECT entity_id, entity_type, service_path FROM history_entities \
                     WHERE tenant = $1 AND entity_id = ANY($2)",
                    &[&q.tenant, &q.entity_ids],
                )
                .await
            }
        }
        .map_err(db)?;
        rows.iter()
            .filter(|r| prefix.is_none_or(|p| path_matches(p, r.get(2))))
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    };
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// The attributes of an entity that have rows or rollups, in byte order,
/// with their series' ids. Rollups count too, since a tenant's retention
/// may have downsampled the rows away; a series left with neither is not
/// one of them (its id stays numbered, see schema step 14).
async fn entity_attrs<C: GenericClient + Sync>(
    c: &C,
    tenant: &str,
    id: &str,
    ty: &str,
) -> Result<Vec<(String, i64)>> {
    let rows = c
        .query(
            "SELECT s.attr, s.id FROM history_series s \
             WHERE s.tenant = $1 AND s.entity_id = $2 AND s.entity_type = $3 \
             AND (EXISTS (SELECT 1 FROM history h WHERE h.series = s.id) \
                  OR EXISTS (SELECT 1 FROM history_rollups r WHERE r.series = s.id))",
            &[&tenant, &id, &ty],
        )
        .await
        .map_err(db)?;
    let mut attrs: Vec<(String, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    attrs.sort_unstable();
    Ok(attrs)
}

/// One series a query covers: its entity, its attribute and its id.
#[derive(Debug, Clone)]
struct Series {
    entity_id: String,
    entity_type: String,
    attr: String,
    id: i64,
}

/// Every series a query covers that was ever numbered, in result order.
async fn query_series<C: GenericClient + Sync>(c: &C, q: &HistoryQuery) -> Result<Vec<Series>> {
    let mut wanted = q.attrs.clone();
    wanted.sort_unstable();
    wanted.dedup();
    let entities = query_entities(c, q).await?;
    let series = |id: &str, ty: &str, attr: String, sid: i64| Series {
        entity_id: id.to_string(),
        entity_type: ty.to_string(),
        attr,
        id: sid,
    };
    let mut out = Vec::new();
    if wanted.is_empty() {
        // The entities' attributes are looked up together: the statements
        // are pipelined on the one connection.
        let attrs = try_join_all(
            entities
                .iter()
                .map(|(id, ty)| entity_attrs(c, &q.tenant, id, ty)),
        )
        .await?;
        for ((id, ty), attrs) in entities.iter().zip(attrs) {
            out.extend(
                attrs
                    .into_iter()
                    .map(|(attr, sid)| series(id, ty, attr, sid)),
            );
        }
        return Ok(out);
    }
    // Every entity's wanted attributes, in result order, numbered in one
    // statement; those never recorded have no id and no rows.
    let pairs: Vec<(&str, &str, &str)> = entities
        .iter()
        .flat_map(|(id, ty)| {
            wanted
                .iter()
                .map(move |a| (id.as_str(), ty.as_str(), a.as_str()))
        })
        .collect();
    let ids: Vec<&str> = pairs.iter().map(|p| p.0).collect();
    let types: Vec<&str> = pairs.iter().map(|p| p.1).collect();
    let attrs: Vec<&str> = pairs.iter().map(|p| p.2).collect();
    let mut numbered: Vec<(i64, i64)> = c
        .query(
            "SELECT k.n, s.id FROM UNNEST($2::text[], $3::text[], $4::text[]) \
                 WITH ORDINALITY AS k(entity_id, entity_type, attr, n) \
             JOIN history_series s ON s.tenant = $1 AND s.entity_id = k.entity_id \
                 AND s.entity_type = k.entity_type AND s.attr = k.attr",
            &[&q.tenant, &ids, &types, &attrs],
        )
        .await
        .map_err(db)?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    numbered.sort_unstable();
    for (n, sid) in numbered {
        let (id, ty, attr) = pairs[(n - 1) as usize];
        out.push(series(id, ty, attr.to_string(), sid));
    }
    Ok(out)
}

/// The ids of a query's series, for `UNNEST` ([`SERIES_SQL`]).
fn series_ids(series: &[Series]) -> Vec<i64> {
    series.iter().map(|s| s.id).collect()
}

/// The series of a query, numbered from 1 in result order (`s.n`), as
/// `s(sid, n)`: their ids, parameter `$1`.
const SERIES_SQL: &str = "UNNEST($1::int8[]) WITH ORDINALITY AS s(sid, n)";

/// The rows (or rollups) of series `s` (see [`SERIES_SQL`]).
const IN_SERIES: &str = "series = s.sid";

/// The rows under the service-path prefix `$6` (none: every row), `$7`
/// being the prefix without its final slashes: the rule of
/// [`path_matches`], segment-wise and with no `LIKE` patterns.
const IN_PATH: &str = "($6::text IS NULL OR service_path = $6 \
     OR starts_with(service_path, $7::text || '/') OR (service_path = $7 AND $7 <> ''))";

/// Index into the series of an `s.n` a statement returned.
fn series_index(row: &Row, column: usize) -> usize {
    (row.get::<_, i64>(column) - 1) as usize
}

/// Rows matching `q`: per series, the rows from `from` to `to`; with
/// `last_n`, the range first starts at the N-th newest row in range (a
/// (time, instance) bound, exact when rows share a time); then `offset` and
/// `limit` (at most [`MAX_QUERY_ROWS`]) in ascending time. One statement
/// for every series, in one snapshot.
async fn query_history(c: &mut Client, q: &HistoryQuery) -> Result<Vec<HistoryRow>> {
    let (from, to) = q.time_range();
    let per_series = q.limit.min(MAX_QUERY_ROWS) as i64;
    let offset = i64::try_from(q.offset).unwrap_or(i64::MAX);
    if per_series == 0 || q.last_n == Some(0) {
        return Ok(Vec::new());
    }
    let tx = c
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .map_err(db)?;
    // The service path filters each row by its own path (QuantumLeap
    // keeps one per row), so every entity is looked at whatever path it
    // was first recorded under.
    // Rows are stored per attribute here: a query wanting every state
    // reads every attribute (the reader picks out the ones asked).
    let every_path = HistoryQuery {
        service_path: None,
        attrs: if q.every_state {
            Vec::new()
        } else {
            q.attrs.clone()
        },
        ..q.clone()
    };
    let series = query_series(&tx, &every_path).await?;
    if series.is_empty() {
        return Ok(Vec::new());
    }
    let ids = series_ids(&series);
    let prefix: Option<&str> = q.service_path.as_deref();
    let base: Option<&str> = prefix.map(|p| p.trim_end_matches('/'));
    let skip = q.last_n.map(|n| i64::try_from(n - 1).unwrap_or(i64::MAX));
    // The start is computed in a lateral of its own, so the rows' scan
    // takes it as a parameter: an index range, not a filter.
    // Several rows may share a time, so the start is a (time, instance)
    // bound.
    let start = match skip {
        Some(_) => format!(
            "SELECT COALESCE(n.time, $2) AS start, COALESCE(n.instance, {min}::int8) AS start_instance \
             FROM (SELECT 1) one LEFT JOIN LATERAL ( \
                 SELECT time, instance FROM history \
                 WHERE {IN_SERIES} AND {IN_PATH} AND time >= $2 AND time <= $3 \
                 ORDER BY time DESC, instance DESC LIMIT 1 OFFSET $8) n ON true",
            min = i64::MIN + 1
        ),
        None => format!(
            "SELECT $2::int8 AS start, {min}::int8 AS start_instance",
            min = i64::MIN + 1
        ),
    };
    let sql = format!(
        "SELECT s.n, h.time, h.service_path, h.attr_type, h.value, h.number, h.instance \
         FROM {SERIES_SQL} \
         CROSS JOIN LATERAL ({start}) b \
         CROSS JOIN LATERAL ( \
             SELECT time, instance, service_path, attr_type, value, number FROM history \
             WHERE {IN_SERIES} AND {IN_PATH} AND time >= b.start AND time <= $3 \
             AND (time > b.start OR instance >= b.start_instance) \
             ORDER BY time, instance LIMIT $4 OFFSET $5) h \
         ORDER BY s.n, h.time, h.instance"
    );
    let mut params: Vec<&(dyn ToSql + Sync)> =
        vec![&ids, &from, &to, &per_series, &offset, &prefix, &base];
    if let Some(skip) = &skip {
        params.push(skip);
    }
    let rows = tx.query(&sql, &params).await.map_err(db)?;
    let out: Vec<HistoryRow> = rows
        .iter()
        .map(|row| {
            let series = &series[series_index(row, 0)];
            HistoryRow {
                tenant: q.tenant.clone(),
                service_path: row.get(2),
                entity_id: series.entity_id.clone(),
                entity_type: series.entity_type.clone(),
                attr: series.attr.clone(),
                attr_type: row.get(3),
                time: row.get(1),
                instance: row.get(6),
                value: row.get(4),
                number: row.get(5),
            }
        })
        .collect();
    tx.commit().await.map_err(db)?;
    if q.every_state && !q.attrs.is_empty() {
        return Ok(asked_and_markers(out, &q.attrs));
    }
    Ok(out)
}

/// Rows of every attribute turned into what [`HistoryQuery::every_state`]
/// answers: the rows of the attributes asked, and one marker row per
/// state holding none of them (cut as the rows of every attribute were,
/// so a reader cutting records afterwards finds the same records).
fn asked_and_markers(rows: Vec<HistoryRow>, asked: &[String]) -> Vec<HistoryRow> {
    use std::collections::HashSet;
    let with_asked: HashSet<(String, String, i64, i64)> = rows
        .iter()
        .filter(|r| asked.contains(&r.attr))
        .map(|r| {
            (
                r.entity_id.clone(),
                r.entity_type.clone(),
                r.time,
                r.instance,
            )
        })
        .collect();
    let mut marked: HashSet<(String, String, i64, i64)> = HashSet::new();
    let mut out = Vec::new();
    for r in rows {
        if asked.contains(&r.attr) {
            out.push(r);
            continue;
        }
        let key = (
            r.entity_id.clone(),
            r.entity_type.clone(),
            r.time,
            r.instance,
        );
        if !with_asked.contains(&key) && marked.insert(key) {
            out.push(HistoryRow {
                attr: crate::STATE_MARKER.to_string(),
                attr_type: String::new(),
                value: "null".to_string(),
                number: None,
                ..r
            });
        }
    }
    out
}

/// Aggregates per series and bucket, as the SQLite backend computes them:
/// each range is split ([`crate::rollup::plan`]) into whole hours, answered
/// from the hour rollups, whole minutes at the edges, from the minute
/// rollups, and the ragged ends, from the rows; seconds come from the
/// rows. One statement per piece covers every series (the pieces'
/// statements pipelined), all in one snapshot. Without a period, one
/// aggregate per series that has rows in range, its bucket the time of
/// the first of them.
async fn aggregate_history(
    c: &mut Client,
    q: &HistoryQuery,
    method: AggrMethod,
    period: Option<AggrPeriod>,
) -> Result<Vec<HistoryAggregate>> {
    let rows_sql = format!(
        "SELECT s.n, x.* FROM {SERIES_SQL} CROSS JOIN LATERAL ( \
             SELECT {bucket}, COUNT(*), COUNT(number), SUM(number), MIN(number), MAX(number) \
             FROM history WHERE {IN_SERIES} AND time >= $2 AND time < $3 GROUP BY 1) x",
        bucket = bucket_sql(period, "time")
    );
    let rollups_sql = format!(
        "SELECT s.n, x.* FROM {SERIES_SQL} CROSS JOIN LATERAL ( \
             SELECT {bucket}, SUM(rows)::int8, SUM(numbers)::int8, SUM(sum_value), \
                    MIN(min_value), MAX(max_value) \
             FROM history_rollups WHERE {IN_SERIES} AND period = $4 \
             AND bucket >= $2 AND bucket < $3 GROUP BY 1) x",
        bucket = bucket_sql(period, "bucket")
    );
    let coarsest = match period {
        Some(AggrPeriod::Second) => None,
        Some(AggrPeriod::Minute) => Some(MINUTE_MS),
        _ => Some(HOUR_MS),
    };
    let (from, to) = q.time_range();
    let from = from.clamp(-AGGREGATE_BOUND, AGGREGATE_BOUND);
    let to = to.clamp(-AGGREGATE_BOUND, AGGREGATE_BOUND) + 1;
    let pieces = plan(from, to, coarsest);
    let tx = c
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .map_err(db)?;
    let series = query_series(&tx, q).await?;
    if series.is_empty() {
        return Ok(Vec::new());
    }
    let ids = &series_ids(&series);
    let results = try_join_all(pieces.iter().map(|(level, a, b)| {
        let tx = &tx;
        let (rows_sql, rollups_sql) = (&rows_sql, &rollups_sql);
        async move {
            match level {
                Level::Rows => tx.query(rows_sql, &[ids, a, b]).await,
                Level::Rollup(unit) => tx.query(rollups_sql, &[ids, a, b, unit]).await,
            }
        }
    }))
    .await
    .map_err(db)?;
    // Per series, bucket → partial, merged in the pieces' order.
    let mut buckets: Vec<BTreeMap<i64, RollupPartial>> = vec![BTreeMap::new(); series.len()];
    for rows in &results {
        for row in rows {
            let count: i64 = row.get(2);
            if count == 0 {
                continue;
            }
            let numbers: i64 = row.get(3);
            let sum: Option<f64> = row.get(4);
            let partial = RollupPartial {
                rows: count as u64,
                numbers: numbers as u64,
                sum: sum.unwrap_or(0.0),
                min: row.get(5),
                max: row.get(6),
            };
            buckets[series_index(row, 0)]
                .entry(row.get(1))
                .or_default()
                .merge(&partial);
        }
    }
    let firsts = match period {
        Some(_) => Vec::new(),
        None => first_times(&tx, &series, &buckets, from, to).await?,
    };
    tx.commit().await.map_err(db)?;
    let mut out = Vec::new();
    for (i, (series, buckets)) in series.iter().zip(buckets).enumerate() {
        for (bucket, partial) in buckets {
            let bucket = match period {
                Some(_) => bucket,
                None => firsts[i],
            };
            out.push(HistoryAggregate {
                entity_id: series.entity_id.clone(),
                entity_type: series.entity_type.clone(),
                attr: series.attr.clone(),
                bucket,
                value: partial.value(method),
            });
        }
    }
    Ok(out)
}

/// For each series with an aggregate (the others get `from`, unused): the
/// time of its first row in `[from, to)`; when the rows are gone
/// (downsampled), the start of its first minute rollup there, but not
/// before `from`.
async fn first_times<C: GenericClient + Sync>(
    c: &C,
    series: &[Series],
    buckets: &[BTreeMap<i64, RollupPartial>],
    from: i64,
    to: i64,
) -> Result<Vec<i64>> {
    let mut firsts = vec![from; series.len()];
    let wanted: Vec<usize> = (0..series.len())
        .filter(|&i| !buckets[i].is_empty())
        .collect();
    if wanted.is_empty() {
        return Ok(firsts);
    }
    let ids: Vec<i64> = wanted.iter().map(|&i| series[i].id).collect();
    let minute_from = crate::rollup::floor_to(from, MINUTE_MS);
    let rows = c
        .query(
            &format!(
                "SELECT s.n, COALESCE( \
                     (SELECT MIN(time) FROM history \
                      WHERE {IN_SERIES} AND time >= $2 AND time < $3), \
                     GREATEST((SELECT MIN(bucket) FROM history_rollups \
                               WHERE {IN_SERIES} AND period = $4 \
                               AND bucket >= $5 AND bucket < $3), $2)) \
                 FROM {SERIES_SQL}"
            ),
            &[&ids, &from, &to, &MINUTE_MS, &minute_from],
        )
        .await
        .map_err(db)?;
    for row in &rows {
        firsts[wanted[series_index(row, 0)]] = row.get(1);
    }
    Ok(firsts)
}

/// The entries of `feed` after `after` and up to `through`, oldest first,
/// until about `max_rows` rows (whole entries), read page by page so a
/// long backlog is not fetched whole.
///
/// A page is the entries among the [`FEED_PAGE`] `seq`s from the first one
/// left, not the first [`FEED_PAGE`] entries: the feed fills and drains
/// faster than PostgreSQL's statistics follow, and with "a couple of
/// rows" in mind the planner would fetch and sort every entry in range
/// to return the first few. A range bounds that work whatever the plan.
async fn read_history_feed(
    c: &Client,
    feed: HistoryFeed,
    after: u64,
    through: u64,
    max_rows: usize,
) -> Result<Vec<ReadEntry>> {
    let mut out = Vec::new();
    let mut total = 0;
    let mut after = to_i64(after);
    let through = to_i64(through);
    loop {
        let rows = c
            .query(
                "SELECT seq, rows, states FROM history_feed WHERE feed = $1 AND seq > $2 \
                 AND seq <= LEAST($4, (SELECT MIN(seq) FROM history_feed \
                                       WHERE feed = $1 AND seq > $2) + $3 - 1) \
                 ORDER BY seq",
                &[&feed_name(feed), &after, &FEED_PAGE, &through],
            )
            .await
            .map_err(db)?;
        if rows.is_empty() {
            return Ok(out);
        }
        for row in rows {
            let (seq, batch) = feed_row(&row)?;
            total += batch.len();
            out.push((seq, 0, batch));
            after = to_i64(seq);
            if total >= max_rows {
                return Ok(out);
            }
        }
    }
}

/// A `seq, rows, states` row of `history_feed`: the entry's position and
/// rows, whichever form it was queued in.
fn feed_row(row: &Row) -> Result<(u64, Vec<HistoryRow>)> {
    let seq: i64 = row.get(0);
    let rows = match (
        row.get::<_, Option<&[u8]>>(2),
        row.get::<_, Option<&str>>(1),
    ) {
        (Some(states), _) => decode_feed_blob(seq as u64, states)?,
        // Queued before schema step 15.
        (None, Some(json)) => decode_feed_entry(seq as u64, json)?,
        (None, None) => {
            return Err(StoreError::Corrupt(format!(
                "history feed entry {seq} is empty"
            )))
        }
    };
    Ok((seq.max(0) as u64, rows))
}

/// The changes feed's entries of partitions `parts`, each after its own
/// cursor (`afters`, alike in order), oldest first across them, until
/// about `max_rows` rows (whole entries), page by page as
/// [`read_history_feed`] reads (a page spans [`FEED_PAGE`] `seq`s from the
/// first entry left in any of the partitions).
async fn read_change_parts(
    c: &Client,
    parts: &[u16],
    afters: &[u64],
    through: u64,
    max_rows: usize,
) -> Result<Vec<ReadEntry>> {
    let parts: Vec<i16> = parts.iter().map(|p| *p as i16).collect();
    let afters: Vec<i64> = afters.iter().map(|a| to_i64(*a)).collect();
    let mut out = Vec::new();
    let mut total = 0;
    let mut after: i64 = 0;
    loop {
        let rows = c
            .query(
                "WITH c AS (SELECT * FROM UNNEST($2::SMALLINT[], $3::BIGINT[]) AS c(part, after)), \
                 lo AS (SELECT MIN(n.seq) AS lo FROM c, LATERAL ( \
                     SELECT seq FROM history_feed f WHERE f.feed = $1 AND f.part = c.part \
                     AND f.seq > GREATEST(c.after, $4) AND f.seq <= $6 ORDER BY f.seq LIMIT 1) n) \
                 SELECT f.seq, f.rows, f.states, f.part FROM c, lo, LATERAL ( \
                     SELECT seq, rows, states, part FROM history_feed f \
                     WHERE f.feed = $1 AND f.part = c.part AND f.seq > GREATEST(c.after, $4) \
                     AND f.seq <= LEAST(lo.lo + $5 - 1, $6)) f \
                 ORDER BY f.seq",
                &[
                    &feed_name(HistoryFeed::Changes),
                    &parts,
                    &afters,
                    &after,
                    &FEED_PAGE,
                    &to_i64(through),
                ],
            )
            .await
            .map_err(db)?;
        if rows.is_empty() {
            return Ok(out);
        }
        for row in rows {
            let (seq, batch) = feed_row(&row)?;
            let part: i16 = row.get(3);
            total += batch.len();
            out.push((seq, part.max(0) as u16, batch));
            after = to_i64(seq);
            if total >= max_rows {
                return Ok(out);
            }
        }
    }
}

/// How far each of the changes feed's partitions `parts` has been moved
/// (alike in order; 0: nothing yet): their cursors hold the next position
/// to read, like the pipeline's, and a partition without one starts at 1.
async fn change_feed_positions(c: &Client, parts: &[u16]) -> Result<Vec<u64>> {
    let names = change_cursors(parts.iter().copied());
    let stored: HashMap<String, i64> = c
        .query(
            "SELECT name, next_seq FROM cursors WHERE name = ANY($1)",
            &[&names],
        )
        .await
        .map_err(db)?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    Ok(names
        .iter()
        .map(|n| (stored.get(n).copied().unwrap_or(1).max(1) - 1) as u64)
        .collect())
}

/// The cursor names of the changes feed's partitions `parts`.
fn change_cursors(parts: impl IntoIterator<Item = u16>) -> Vec<String> {
    parts
        .into_iter()
        .map(|p| crate::partition_cursor(HISTORY_FEED_CURSOR, p))
        .collect()
}

impl PostgresStore {
    /// The notifications feed's entries after `after`, up to about
    /// `max_rows` rows, no further than its horizon: moved entries are
    /// deleted, and none can commit below the horizon later, so past what
    /// this node moved last there are the same entries, without the dead
    /// index entries of the moved ones to step over.
    async fn read_notifications(&self, after: u64, max_rows: usize) -> Result<Vec<ReadEntry>> {
        let after = after.max(self.notified_moved.load(Ordering::Acquire));
        let through = self.notified_horizon().await;
        let client = self.reader().await?;
        read_history_feed(
            &client,
            HistoryFeed::Notifications,
            after,
            through,
            max_rows,
        )
        .await
    }
}

/// How the history feed's moves are batched and paced on PostgreSQL: the
/// SQLite backend's values (not measured apart here). A chunk is one
/// `UNNEST` insert and one commit of the history writer; fewer, larger
/// commits share their WAL flushes and index pages the same way.
const MOVE_TUNING: MoveTuning = MoveTuning {
    chunk_rows: 4_096,
    interval: Duration::from_millis(500),
};

#[async_trait]
impl HistoryStore for PostgresStore {
    async fn move_history_feed(
        &self,
        feed: HistoryFeed,
        parts: &[u16],
        max_rows: usize,
        keep: &FeedFilter<'_>,
    ) -> Result<FeedMove> {
        let entries = match feed {
            HistoryFeed::Changes => {
                if parts.is_empty() {
                    return Ok(FeedMove::default());
                }
                // Every node's main writer queues changes side by side:
                // read up to their horizon, so a move never passes (nor
                // prunes past) an entry that commits late.
                let through = self.main_horizon(MainLog::ChangesFeed).await;
                let client = self.reader().await?;
                let afters = change_feed_positions(&client, parts).await?;
                read_change_parts(&client, parts, &afters, through, max_rows).await?
            }
            HistoryFeed::Notifications => self.read_notifications(0, max_rows).await?,
        };
        move_feed(self, feed, entries, max_rows, keep, MOVE_TUNING).await
    }

    fn change_feed_partitions(&self) -> u16 {
        self.pipeline_partitions
    }

    async fn read_history_feed(
        &self,
        feed: HistoryFeed,
        after: u64,
        max_rows: usize,
    ) -> Result<Vec<(u64, Vec<HistoryRow>)>> {
        let entries = match feed {
            HistoryFeed::Changes => {
                let through = self.main_horizon(MainLog::ChangesFeed).await;
                let client = self.reader().await?;
                read_history_feed(&client, feed, after, through, max_rows).await?
            }
            HistoryFeed::Notifications => self.read_notifications(after, max_rows).await?,
        };
        Ok(entries
            .into_iter()
            .map(|(seq, _, rows)| (seq, rows))
            .collect())
    }

    async fn append_history_from_feed(
        &self,
        feed: HistoryFeed,
        rows: Vec<HistoryRow>,
        through: &[(u16, u64)],
    ) -> Result<u64> {
        self.ensure_partitions(&rows).await?;
        let series = self.series_of(&rows).await?;
        // Each partition's cursor is stored as the next position to read,
        // like the pipeline's.
        let (names, nexts): (Vec<String>, Vec<i64>) = through
            .iter()
            .map(|(part, seq)| {
                let name = crate::partition_cursor(HISTORY_FEED_CURSOR, *part);
                (name, to_i64(seq.saturating_add(1)))
            })
            .unzip();
        let last = through.iter().map(|(_, seq)| *seq).max();
        let n = self
            .history
            .write(move |c| {
                Box::pin(async move {
                    let n = append_history(c, &rows, &series).await?;
                    let Some(last) = last else {
                        return Ok(n);
                    };
                    match feed {
                        HistoryFeed::Changes => c
                            .execute(
                                "INSERT INTO cursors (name, next_seq) \
                                 SELECT * FROM UNNEST($1::TEXT[], $2::BIGINT[]) \
                                 ON CONFLICT (name) DO UPDATE SET next_seq = excluded.next_seq",
                                &[&names, &nexts],
                            )
                            .await
                            .map_err(db)?,
                        HistoryFeed::Notifications => c
                            .execute(
                                "DELETE FROM history_feed WHERE feed = $1 AND seq <= $2",
                                &[&feed_name(feed), &to_i64(last)],
                            )
                            .await
                            .map_err(db)?,
                    };
                    Ok(n)
                })
            })
            .await?;
        if let (HistoryFeed::Notifications, Some(last)) = (feed, last) {
            self.notified_moved.fetch_max(last, Ordering::AcqRel);
        }
        Ok(n)
    }

    async fn history_feed_cursor(&self, feed: HistoryFeed, part: u16) -> Result<u64> {
        if feed == HistoryFeed::Notifications {
            return Ok(0);
        }
        let client = self.reader().await?;
        Ok(change_feed_positions(&client, &[part]).await?[0])
    }

    async fn prune_history_feed(&self, through: &[(u16, u64)]) -> Result<u64> {
        let (parts, seqs): (Vec<i16>, Vec<i64>) = through
            .iter()
            .map(|(part, seq)| (*part as i16, to_i64(*seq)))
            .unzip();
        // The main writer queues the changes feed; it prunes it too.
        self.main
            .execute(
                "DELETE FROM history_feed f \
                 USING UNNEST($2::SMALLINT[], $3::BIGINT[]) AS t(part, through) \
                 WHERE f.feed = $1 AND f.part = t.part AND f.seq <= t.through",
                vec![
                    param(feed_name(HistoryFeed::Changes)),
                    param(parts),
                    param(seqs),
                ],
            )
            .await
    }

    async fn changes_moved_through(&self, seq: u64) -> Result<bool> {
        let count = self.change_feed_partitions().max(1);
        let parts: Vec<i16> = (0..count).map(|p| p as i16).collect();
        let names = change_cursors(0..count);
        let client = self.reader().await?;
        let row = client
            .query_one(
                "SELECT NOT EXISTS ( \
                     SELECT 1 FROM UNNEST($2::SMALLINT[], $3::TEXT[]) AS c(part, name) \
                     LEFT JOIN cursors k ON k.name = c.name \
                     CROSS JOIN LATERAL (SELECT 1 FROM history_feed f \
                         WHERE f.feed = $1 AND f.part = c.part \
                         AND f.seq >= COALESCE(k.next_seq, 1) AND f.seq <= $4 LIMIT 1) w)",
                &[
                    &feed_name(HistoryFeed::Changes),
                    &parts,
                    &names,
                    &to_i64(seq),
                ],
            )
            .await
            .map_err(db)?;
        Ok(row.get(0))
    }

    async fn queue_history(&self, states: &HistoryStates) -> Result<u64> {
        let entry = HistoryStates::entry([states]);
        let seq = self.notifications.write(&self.notified, entry).await?;
        self.notified_last.fetch_max(seq, Ordering::AcqRel);
        Ok(seq)
    }

    async fn newest_queued_notification(&self) -> Result<Option<u64>> {
        let client = self.reader().await?;
        let row = client
            .query_one(
                "SELECT MAX(seq) FROM history_feed WHERE feed = $1",
                &[&feed_name(HistoryFeed::Notifications)],
            )
            .await
            .map_err(db)?;
        Ok(row.get::<_, Option<i64>>(0).map(|s| s.max(0) as u64))
    }

    async fn newest_queued_change(&self) -> Result<Option<u64>> {
        let client = self.reader().await?;
        let row = client
            .query_one(
                "SELECT MAX(seq) FROM history_feed WHERE feed = $1",
                &[&feed_name(HistoryFeed::Changes)],
            )
            .await
            .map_err(db)?;
        Ok(row.get::<_, Option<i64>>(0).map(|s| s.max(0) as u64))
    }

    async fn notifications_queued_through(&self, seq: u64) -> Result<bool> {
        let client = self.reader().await?;
        let row = client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM history_feed WHERE feed = $1 AND seq <= $2)",
                &[&feed_name(HistoryFeed::Notifications), &to_i64(seq)],
            )
            .await
            .map_err(db)?;
        Ok(row.get(0))
    }

    async fn query_history(&self, query: &HistoryQuery) -> Result<Vec<HistoryRow>> {
        let mut client = self.reader().await?;
        query_history(&mut client, query).await
    }

    async fn aggregate_history(
        &self,
        query: &HistoryQuery,
        method: AggrMethod,
        period: Option<AggrPeriod>,
    ) -> Result<Vec<HistoryAggregate>> {
        let mut client = self.reader().await?;
        aggregate_history(&mut client, query, method, period).await
    }

    async fn history_entities(
        &self,
        tenant: &str,
        entity_type: Option<&str>,
        service_path: Option<&str>,
    ) -> Result<Vec<HistoryEntity>> {
        let client = self.reader().await?;
        history_entities(&**client, tenant, entity_type, service_path).await
    }

    async fn history_attributes(&self, tenant: &str, entity_type: &str) -> Result<Vec<String>> {
        let client = self.reader().await?;
        let rows = client
            .query(
                "SELECT attr FROM history_columns WHERE tenant = $1 AND entity_type = $2",
                &[&tenant, &entity_type],
            )
            .await
            .map_err(db)?;
        // Sorted here, by bytes, whatever the database's collation.
        let mut names: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
        names.sort_unstable();
        Ok(names)
    }

    async fn delete_history(&self, target: &HistoryDelete) -> Result<u64> {
        // Step by step, each its own transaction.
        delete_in_steps(|| {
            let target = target.clone();
            self.history
                .write(move |c| Box::pin(async move { delete_history(c, &target).await }))
        })
        .await
    }

    async fn expire_history(&self, cutoffs: &[HistoryCutoffs]) -> Result<u64> {
        let mut total = 0;
        // Whole weeks first, in one write: whatever they held costs no
        // row deletes below.
        if let Some(horizon) = cutoffs.iter().filter_map(|t| t.rows_before).max() {
            self.partitions.forget_before(horizon);
            let listed = cutoffs.to_vec();
            let dropped = self
                .history
                .write(move |c| Box::pin(async move { drop_expired_partitions(c, &listed).await }))
                .await;
            match dropped {
                Ok((weeks, rows)) => {
                    if !weeks.is_empty() {
                        tracing::debug!(?weeks, rows, "dropped expired history partitions");
                    }
                    total += rows;
                }
                Err(e @ (StoreError::Closed | StoreError::Overloaded)) => return Err(e),
                Err(e) => tracing::warn!(
                    error = %e,
                    "dropping expired history partitions failed; deleting their rows instead"
                ),
            }
        }
        // Then what is left, tenant by tenant, in chunks as `delete_history`.
        for t in cutoffs {
            total += delete_in_chunks(|| {
                let HistoryCutoffs {
                    tenant,
                    rows_before,
                    rollups_before,
                } = t.clone();
                self.history.write(move |c| {
                    Box::pin(async move {
                        expire_history(c, &tenant, rows_before, rollups_before).await
                    })
                })
            })
            .await?;
        }
        Ok(total)
    }

    async fn history_tenants(&self) -> Result<Vec<String>> {
        let client = self.reader().await?;
        let mut tenants: Vec<String> = client
            .query("SELECT DISTINCT tenant FROM history_entities", &[])
            .await
            .map_err(db)?
            .iter()
            .map(|r| r.get(0))
            .collect();
        tenants.sort_unstable();
        Ok(tenants)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Series whose parts join to the same text still get keys of their
    /// own, and a series finds its id again.
    #[test]
    fn every_series_has_a_cache_key_of_its_own() {
        let cut = [
            ("t", "a:1", "T", "x"),
            ("t", "a", ":1T", "x"),
            ("t:a", "1", "T", "x"),
        ];
        let keys: HashSet<String> = cut
            .iter()
            .map(|&s| {
                let mut key = String::new();
                cache_key(&mut key, s);
                key
            })
            .collect();
        assert_eq!(keys.len(), cut.len());
        let ids = SeriesIds::default();
        ids.add(&[(owned(cut[0]), 7)]);
        let (found, missing) = ids.split(&cut);
        assert_eq!(found.get(&cut[0]), Some(&7));
        assert_eq!(missing, cut[1..]);
    }
}
