//! [`HistoryStore`] on two files: the changes feed lives in the main file
//! (queued with the entity changes themselves), everything else in the
//! history's own file — the notifications feed, the rows, the entities
//! with history, the minute and hour rollups, and the changes feed's
//! cursor. Its writes are appends of feed moves and chunked deletes; its
//! reads are range scans of the series a query covers.

use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension};

use super::reader::{cursor, limit, position};
use super::writer::in_savepoint;
use super::{to_i64, Db, SqliteStore};
use crate::history::{
    decode_feed_blob, decode_feed_entry, delete_in_chunks, delete_in_steps, encode_feed_entry,
    move_feed, path_matches, DeleteStep, MoveTuning,
};
use crate::rollup::RollupPartial;
use crate::{
    AggrMethod, AggrPeriod, FeedFilter, FeedMove, HistoryAggregate, HistoryCutoffs, HistoryDelete,
    HistoryEntity, HistoryFeed, HistoryQuery, HistoryRow, HistoryStore, Result,
    HISTORY_FEED_CURSOR,
};

/// How the history feed's moves are batched and paced on SQLite.
const MOVE_TUNING: MoveTuning = MoveTuning {
    // A few milliseconds of the history writer, so notifications queued
    // behind a move wait little.
    chunk_rows: 4_096,
    // A commit writes every page it dirtied once, and rows of many series
    // dirty a page each; waiting lets more rows share those pages
    // (measured: the WAL writes of frequent small commits took most of
    // the history writer's time). History then lags by up to this much,
    // except for queries, which settle the notifications feed first.
    interval: Duration::from_millis(500),
};

#[async_trait]
impl HistoryStore for SqliteStore {
    async fn move_history_feed(
        &self,
        feed: HistoryFeed,
        max_rows: usize,
        keep: &FeedFilter<'_>,
    ) -> Result<FeedMove> {
        move_feed(self, feed, max_rows, keep, MOVE_TUNING).await
    }

    async fn read_history_feed(
        &self,
        feed: HistoryFeed,
        after: u64,
        max_rows: usize,
    ) -> Result<Vec<(u64, Vec<HistoryRow>)>> {
        let part = match feed {
            HistoryFeed::Changes => &self.main,
            HistoryFeed::Notifications => &self.history,
        };
        part.read(move |c| read_history_feed(c, after, max_rows))
            .await
    }

    async fn append_history_from_feed(
        &self,
        feed: HistoryFeed,
        rows: Vec<HistoryRow>,
        through: Option<u64>,
    ) -> Result<u64> {
        self.history
            .write(move |c| in_savepoint(c, |c| append_from_feed(c, feed, &rows, through)))
            .await
    }

    async fn history_feed_cursor(&self, feed: HistoryFeed) -> Result<u64> {
        if feed == HistoryFeed::Notifications {
            return Ok(0);
        }
        // Stored as the next position to read, like the pipeline's (1 when
        // nothing was consumed yet).
        let next = self
            .history
            .read(|c| cursor(c, HISTORY_FEED_CURSOR))
            .await?;
        Ok(next.saturating_sub(1))
    }

    async fn prune_history_feed(&self, through: u64) -> Result<u64> {
        self.main.write(move |c| prune_feed(c, through)).await
    }

    async fn queue_history(&self, rows: Vec<HistoryRow>) -> Result<u64> {
        let entry = encode_feed_entry(&rows);
        self.history.write(move |c| queue_notified(c, &entry)).await
    }

    async fn query_history(&self, query: &HistoryQuery) -> Result<Vec<HistoryRow>> {
        let query = query.clone();
        self.history.read(move |c| query_history(c, &query)).await
    }

    async fn aggregate_history(
        &self,
        query: &HistoryQuery,
        method: AggrMethod,
        period: Option<AggrPeriod>,
    ) -> Result<Vec<HistoryAggregate>> {
        let query = query.clone();
        self.history
            .read(move |c| aggregate_history(c, &query, method, period))
            .await
    }

    async fn history_entities(
        &self,
        tenant: &str,
        entity_type: Option<&str>,
        service_path: Option<&str>,
    ) -> Result<Vec<HistoryEntity>> {
        let tenant = tenant.to_string();
        let entity_type = entity_type.map(str::to_string);
        let service_path = service_path.map(str::to_string);
        self.history
            .read(move |c| {
                history_entities(c, &tenant, entity_type.as_deref(), service_path.as_deref())
            })
            .await
    }

    async fn delete_history(&self, target: &HistoryDelete) -> Result<u64> {
        let target = target.clone();
        delete_in_steps(|| {
            let target = target.clone();
            self.history
                .write(move |c| in_savepoint(c, |c| delete_history(c, &target)))
        })
        .await
    }

    async fn expire_history(&self, cutoffs: &[HistoryCutoffs]) -> Result<u64> {
        let mut total = 0;
        for HistoryCutoffs {
            tenant,
            rows_before,
            rollups_before,
        } in cutoffs.iter().cloned()
        {
            total += self
                .delete_in_chunks(move |c| expire_history(c, &tenant, rows_before, rollups_before))
                .await?;
        }
        Ok(total)
    }

    async fn history_tenants(&self) -> Result<Vec<String>> {
        self.history.read(history_tenants).await
    }
}

impl SqliteStore {
    /// Runs a chunked delete of the history ([`delete_history`],
    /// [`expire_history`]: at most [`HISTORY_DELETE_CHUNK`] rows, in a
    /// savepoint), each chunk a write of its own, until one is not full
    /// ([`crate::history::delete_in_chunks`]).
    async fn delete_in_chunks<F>(&self, chunk: F) -> Result<u64>
    where
        F: Fn(&Connection) -> rusqlite::Result<u64> + Clone + Send + 'static,
    {
        delete_in_chunks(|| {
            let chunk = chunk.clone();
            self.history.write(move |c| in_savepoint(c, chunk))
        })
        .await
    }
}

// --- writes ---------------------------------------------------------------

/// Queues history rows in the feed (nothing for none), in the compact
/// form ([`encode_feed_entry`]).
pub(super) fn queue_history(conn: &Connection, rows: &[HistoryRow]) -> rusqlite::Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let entry = encode_feed_entry(rows);
    conn.prepare_cached("INSERT INTO history_feed (rows) VALUES (?1)")?
        .execute([entry])?;
    Ok(())
}

/// Queues notified history rows (their compact form) in this file's
/// feed; answers the entry's `seq`.
fn queue_notified(conn: &Connection, entry: &[u8]) -> rusqlite::Result<u64> {
    conn.prepare_cached("INSERT INTO history_feed (rows) VALUES (?1)")
        .and_then(|mut st| st.insert([entry]))
        .map(|seq| seq as u64)
}

/// Drops consumed changes-feed entries; answers how many.
fn prune_feed(conn: &Connection, through: u64) -> rusqlite::Result<u64> {
    conn.prepare_cached("DELETE FROM history_feed WHERE seq <= ?1")
        .and_then(|mut st| st.execute([to_i64(through)]))
        .map(|n| n as u64)
}

/// Stores history rows taken from a feed and, with `through`, marks the
/// feed consumed that far (the changes feed's cursor; the notifications
/// feed's entries are deleted, in this same file). Answers how many rows
/// were new.
fn append_from_feed(
    conn: &Connection,
    feed: HistoryFeed,
    rows: &[HistoryRow],
    through: Option<u64>,
) -> rusqlite::Result<u64> {
    let n = append_history(conn, rows)?;
    let Some(through) = through else {
        return Ok(n);
    };
    match feed {
        HistoryFeed::Changes => conn
            .prepare_cached(
                "INSERT INTO cursors (name, next_seq) VALUES (?1, ?2) \
                 ON CONFLICT (name) DO UPDATE SET next_seq = excluded.next_seq",
            )?
            .execute((HISTORY_FEED_CURSOR, to_i64(through + 1)))?,
        HistoryFeed::Notifications => conn
            .prepare_cached("DELETE FROM history_feed WHERE seq <= ?1")?
            .execute([to_i64(through)])?,
    };
    Ok(n)
}

/// Inserts the rows that are new (the primary key makes a replayed row a
/// no-op) and the entities seen for the first time (keeping the service
/// path they first came with), then adds the new rows to their series'
/// minute and hour rollups (one upsert per bucket, not per row). Rows
/// usually come grouped by entity, so the entity insert runs once per run
/// of rows of the same entity, before them.
///
/// It runs without a savepoint of its own: inside one, SQLite copies every
/// page the operation touches to a sub-journal first, and an append
/// touches one page per series (its last leaf). The feed's moves, which
/// are large and rare, wrap it in one ([`append_from_feed`]);
/// the statements cannot fail on their values (strings, integers, optional
/// floats into columns without checks), so only an I/O error can stop an
/// append midway.
pub(super) fn append_history(conn: &Connection, rows: &[HistoryRow]) -> rusqlite::Result<u64> {
    let mut insert = conn.prepare_cached(
        "INSERT OR IGNORE INTO history \
         (tenant, entity_id, entity_type, attr, time, instance, service_path, attr_type, value, \
          number) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    )?;
    let mut entity = conn.prepare_cached(
        "INSERT OR IGNORE INTO history_entities (tenant, entity_type, entity_id, service_path) \
         VALUES (?1, ?2, ?3, ?4)",
    )?;
    let mut rollups = Rollups::default();
    let mut new = 0u64;
    let mut previous: Option<&HistoryRow> = None;
    for row in rows {
        let same_entity = previous.is_some_and(|p| {
            p.entity_id == row.entity_id
                && p.entity_type == row.entity_type
                && p.tenant == row.tenant
        });
        if !same_entity {
            entity.execute((
                &row.tenant,
                &row.entity_type,
                &row.entity_id,
                &row.service_path,
            ))?;
        }
        previous = Some(row);
        let inserted = insert.execute((
            &row.tenant,
            &row.entity_id,
            &row.entity_type,
            &row.attr,
            row.time,
            row.instance,
            &row.service_path,
            &row.attr_type,
            &row.value,
            row.number,
        ))?;
        if inserted > 0 {
            new += 1;
            rollups.add(row);
        }
    }
    rollups.store(conn)?;
    Ok(new)
}

/// The rollup buckets an append adds to, keyed like `history_rollups`.
#[derive(Default)]
struct Rollups<'a> {
    buckets: std::collections::BTreeMap<RollupKey<'a>, crate::rollup::RollupPartial>,
}

/// (tenant, entity id, entity type, attribute, period, bucket start).
type RollupKey<'a> = (&'a str, &'a str, &'a str, &'a str, i64, i64);

impl<'a> Rollups<'a> {
    fn add(&mut self, row: &'a HistoryRow) {
        for period in crate::rollup::ROLLUP_PERIODS {
            let key = (
                row.tenant.as_str(),
                row.entity_id.as_str(),
                row.entity_type.as_str(),
                row.attr.as_str(),
                period,
                crate::rollup::floor_to(row.time, period),
            );
            self.buckets.entry(key).or_default().add(row.number);
        }
    }

    fn store(self, conn: &Connection) -> rusqlite::Result<()> {
        if self.buckets.is_empty() {
            return Ok(());
        }
        let mut upsert = conn.prepare_cached(
            "INSERT INTO history_rollups (tenant, entity_id, entity_type, attr, period, bucket, \
                 rows, numbers, sum_value, min_value, max_value) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11) \
             ON CONFLICT DO UPDATE SET \
                 rows = rows + excluded.rows, \
                 numbers = numbers + excluded.numbers, \
                 sum_value = CASE WHEN sum_value IS NULL THEN excluded.sum_value \
                     WHEN excluded.sum_value IS NULL THEN sum_value \
                     ELSE sum_value + excluded.sum_value END, \
                 min_value = min(coalesce(min_value, excluded.min_value), \
                                 coalesce(excluded.min_value, min_value)), \
                 max_value = max(coalesce(max_value, excluded.max_value), \
                                 coalesce(excluded.max_value, max_value))",
        )?;
        for ((tenant, id, ty, attr, period, bucket), p) in self.buckets {
            upsert.execute((
                tenant,
                id,
                ty,
                attr,
                period,
                bucket,
                p.rows as i64,
                p.numbers as i64,
                p.sum(),
                p.min,
                p.max,
            ))?;
        }
        Ok(())
    }
}

pub(super) use crate::HISTORY_DELETE_CHUNK;

/// One step of a history delete: up to [`HISTORY_DELETE_CHUNK`] rows of
/// the matching entities in range, series by series, with their rollups
/// (whole buckets in range deleted, the buckets the range cuts through
/// corrected from the rows deleted and the rows left,
/// [`crate::rollup::after_delete`]); an entity left with neither rows nor
/// rollups leaves `history_entities`. Every statement is a primary-key
/// range of one series. Steps are idempotent: a bucket is corrected only
/// for rows this step removes, in the same transaction.
fn delete_history(conn: &Connection, d: &HistoryDelete) -> rusqlite::Result<DeleteStep> {
    use crate::rollup::{after_delete, covered_buckets, cut_buckets, floor_to, ROLLUP_PERIODS};
    let entities = delete_targets(conn, d)?;
    let (from, to) = d.time_range();
    let cut = cut_buckets(d.from, d.to);
    let mut budget = HISTORY_DELETE_CHUNK;
    let mut step = DeleteStep::default();
    for (id, ty) in &entities {
        for attr in entity_attrs(conn, &d.tenant, id, ty)? {
            if budget == 0 {
                return Ok(step);
            }
            let series = (&d.tenant, id, ty, &attr);
            for period in ROLLUP_PERIODS {
                let (first, last) = covered_buckets(d.from, d.to, period);
                conn.prepare_cached(
                    "DELETE FROM history_rollups WHERE tenant = ?1 AND entity_id = ?2 \
                     AND entity_type = ?3 AND attr = ?4 AND period = ?5 \
                     AND bucket >= ?6 AND bucket <= ?7",
                )?
                .execute((series.0, series.1, series.2, series.3, period, first, last))?;
            }
            let doomed: Vec<(i64, i64, Option<f64>)> = conn
                .prepare_cached(
                    "SELECT time, instance, number FROM history WHERE tenant = ?1 \
                     AND entity_id = ?2 AND entity_type = ?3 AND attr = ?4 \
                     AND time >= ?5 AND time <= ?6 ORDER BY time, instance LIMIT ?7",
                )?
                .query_map(
                    (
                        series.0,
                        series.1,
                        series.2,
                        series.3,
                        from,
                        to,
                        budget as i64,
                    ),
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )?
                .collect::<rusqlite::Result<_>>()?;
            let Some(&(last, last_instance, _)) = doomed.last() else {
                continue;
            };
            // Exactly the rows read: up to the last one's (time, instance).
            conn.prepare_cached(
                "DELETE FROM history WHERE tenant = ?1 AND entity_id = ?2 \
                 AND entity_type = ?3 AND attr = ?4 AND time >= ?5 AND time <= ?6 \
                 AND (time < ?6 OR instance <= ?7)",
            )?
            .execute((
                series.0,
                series.1,
                series.2,
                series.3,
                from,
                last,
                last_instance,
            ))?;
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
                let key = (series.0, series.1, series.2, series.3, period, bucket);
                let stored = conn
                    .prepare_cached(
                        "SELECT rows, numbers, sum_value, min_value, max_value \
                         FROM history_rollups WHERE tenant = ?1 AND entity_id = ?2 \
                         AND entity_type = ?3 AND attr = ?4 AND period = ?5 AND bucket = ?6",
                    )?
                    .query_row(key, partial_of)
                    .optional()?;
                let Some(stored) = stored else { continue };
                let remaining = conn
                    .prepare_cached(
                        "SELECT COUNT(*), COUNT(number), SUM(number), MIN(number), MAX(number) \
                         FROM history WHERE tenant = ?1 AND entity_id = ?2 \
                         AND entity_type = ?3 AND attr = ?4 AND time >= ?5 AND time < ?6",
                    )?
                    .query_row(
                        (
                            series.0,
                            series.1,
                            series.2,
                            series.3,
                            bucket,
                            bucket + period,
                        ),
                        partial_of,
                    )?;
                match after_delete(&stored, &deleted, &remaining) {
                    None => conn
                        .prepare_cached(
                            "DELETE FROM history_rollups WHERE tenant = ?1 AND entity_id = ?2 \
                             AND entity_type = ?3 AND attr = ?4 AND period = ?5 AND bucket = ?6",
                        )?
                        .execute(key)?,
                    Some(p) => conn
                        .prepare_cached(
                            "UPDATE history_rollups SET rows = ?7, numbers = ?8, \
                                 sum_value = ?9, min_value = ?10, max_value = ?11 \
                             WHERE tenant = ?1 AND entity_id = ?2 AND entity_type = ?3 \
                             AND attr = ?4 AND period = ?5 AND bucket = ?6",
                        )?
                        .execute((
                            key.0,
                            key.1,
                            key.2,
                            key.3,
                            key.4,
                            key.5,
                            p.rows as i64,
                            p.numbers as i64,
                            p.sum(),
                            p.min,
                            p.max,
                        ))?,
                };
            }
            step.rows += doomed.len() as u64;
            budget -= doomed.len();
        }
        if budget == 0 {
            return Ok(step);
        }
        forget_if_empty(conn, &d.tenant, id, ty)?;
    }
    step.done = true;
    Ok(step)
}

/// The rollup partial of a `rows, numbers, sum, min, max` result row.
fn partial_of(r: &rusqlite::Row<'_>) -> rusqlite::Result<RollupPartial> {
    let sum: Option<f64> = r.get(2)?;
    Ok(RollupPartial {
        rows: r.get::<_, i64>(0)? as u64,
        numbers: r.get::<_, i64>(1)? as u64,
        sum: sum.unwrap_or(0.0),
        min: r.get(3)?,
        max: r.get(4)?,
    })
}

/// The (id, type) of the entities a delete covers, in key order: its
/// tenant's entities with its id and/or type, under its service path.
/// With neither an id nor a type, none.
fn delete_targets(conn: &Connection, d: &HistoryDelete) -> rusqlite::Result<Vec<(String, String)>> {
    let mut stmt = conn.prepare_cached(
        "SELECT entity_id, entity_type, service_path FROM history_entities \
         WHERE tenant = ?1 AND (?2 IS NULL OR entity_id = ?2) \
         AND (?3 IS NULL OR entity_type = ?3) ORDER BY entity_type, entity_id",
    )?;
    if d.entity_id.is_none() && d.entity_type.is_none() {
        return Ok(Vec::new());
    }
    let rows = stmt.query_map(
        (&d.tenant, d.entity_id.as_deref(), d.entity_type.as_deref()),
        |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
            ))
        },
    )?;
    let mut out = Vec::new();
    for row in rows {
        let (id, ty, path) = row?;
        if d.covers_path(&path) {
            out.push((id, ty));
        }
    }
    Ok(out)
}

/// Removes an entity from `history_entities` once it has neither rows nor
/// rollups.
fn forget_if_empty(conn: &Connection, tenant: &str, id: &str, ty: &str) -> rusqlite::Result<()> {
    let left: bool = conn
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM history \
                 WHERE tenant = ?1 AND entity_id = ?2 AND entity_type = ?3) \
             OR EXISTS (SELECT 1 FROM history_rollups \
                 WHERE tenant = ?1 AND entity_id = ?2 AND entity_type = ?3)",
        )?
        .query_row((tenant, id, ty), |r| r.get(0))?;
    if !left {
        conn.prepare_cached(
            "DELETE FROM history_entities \
             WHERE tenant = ?1 AND entity_type = ?2 AND entity_id = ?3",
        )?
        .execute((tenant, ty, id))?;
    }
    Ok(())
}

/// Deletes a tenant's expired history, series by series, up to
/// [`HISTORY_DELETE_CHUNK`] rows and buckets: rows before `rows_before`,
/// minute and hour buckets that end by `rollups_before`; an entity left
/// with neither rows nor rollups leaves `history_entities`. Every delete
/// is a primary-key range (series, then time), so expiring old data costs
/// what it deletes plus a few seeks per series.
fn expire_history(
    conn: &Connection,
    tenant: &str,
    rows_before: Option<i64>,
    rollups_before: Option<i64>,
) -> rusqlite::Result<u64> {
    let entities: Vec<(String, String)> = conn
        .prepare_cached("SELECT entity_id, entity_type FROM history_entities WHERE tenant = ?1")?
        .query_map([tenant], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let mut budget = HISTORY_DELETE_CHUNK;
    let mut deleted = 0u64;
    for (id, ty) in &entities {
        for attr in entity_attrs(conn, tenant, id, ty)? {
            if budget == 0 {
                return Ok(deleted);
            }
            if let Some(before) = rows_before {
                // Never more than the budget: stop at the budget-th row.
                let boundary: Option<i64> = conn
                    .prepare_cached(
                        "SELECT time FROM history WHERE tenant = ?1 AND entity_id = ?2 \
                         AND entity_type = ?3 AND attr = ?4 AND time < ?5 \
                         ORDER BY time LIMIT 1 OFFSET ?6",
                    )?
                    .query_row((tenant, id, ty, &attr, before, budget as i64), |r| r.get(0))
                    .optional()?;
                let n = conn
                    .prepare_cached(
                        "DELETE FROM history WHERE tenant = ?1 AND entity_id = ?2 \
                         AND entity_type = ?3 AND attr = ?4 AND time < ?5",
                    )?
                    .execute((tenant, id, ty, &attr, boundary.unwrap_or(before)))?;
                deleted += n as u64;
                budget = budget.saturating_sub(n);
            }
            if let Some(before) = rollups_before {
                for period in crate::rollup::ROLLUP_PERIODS {
                    let n = conn
                        .prepare_cached(
                            "DELETE FROM history_rollups WHERE tenant = ?1 AND entity_id = ?2 \
                             AND entity_type = ?3 AND attr = ?4 AND period = ?5 AND bucket <= ?6",
                        )?
                        .execute((tenant, id, ty, &attr, period, before - period))?;
                    deleted += n as u64;
                    budget = budget.saturating_sub(n);
                }
            }
        }
        forget_if_empty(conn, tenant, id, ty)?;
    }
    Ok(deleted)
}

// --- reads ----------------------------------------------------------------
//
// Every series (tenant, entity id, entity type, attribute) is one
// contiguous range of the `history` primary key, in time order. So a query
// first decides which series it covers — entities from `history_entities`,
// attributes from the query or by skipping through the key — and then
// reads each series with a range scan (a backward one for `last_n`).

/// The entities of `tenant` with history, optionally of one type and under
/// a service-path prefix, ordered by type then id (the key's order).
fn history_entities(
    conn: &Connection,
    tenant: &str,
    entity_type: Option<&str>,
    prefix: Option<&str>,
) -> Result<Vec<HistoryEntity>> {
    let mut stmt;
    let mut rows = match entity_type {
        Some(ty) => {
            stmt = conn
                .prepare_cached(
                    "SELECT entity_id, entity_type, service_path FROM history_entities \
                     WHERE tenant = ?1 AND entity_type = ?2 ORDER BY entity_type, entity_id",
                )
                .db()?;
            stmt.query((tenant, ty)).db()?
        }
        None => {
            stmt = conn
                .prepare_cached(
                    "SELECT entity_id, entity_type, service_path FROM history_entities \
                     WHERE tenant = ?1 ORDER BY entity_type, entity_id",
                )
                .db()?;
            stmt.query([tenant]).db()?
        }
    };
    let mut out = Vec::new();
    while let Some(row) = rows.next().db()? {
        let service_path: String = row.get(2).db()?;
        if prefix.is_none_or(|p| path_matches(p, &service_path)) {
            out.push(HistoryEntity {
                entity_id: row.get(0).db()?,
                entity_type: row.get(1).db()?,
                service_path,
            });
        }
    }
    Ok(out)
}

/// The (id, type) of the entities a query covers, ordered by id then
/// type. With ids, each is looked up (by its key when the type is given,
/// else through `history_entities_id`); without, the tenant's (or the
/// type's) entities are listed. The service-path filter applies to the
/// path an entity was first recorded under.
fn query_entities(conn: &Connection, q: &HistoryQuery) -> Result<Vec<(String, String)>> {
    let prefix = q.service_path.as_deref();
    let mut out: Vec<(String, String)> = Vec::new();
    if q.entity_ids.is_empty() {
        for e in history_entities(conn, &q.tenant, q.entity_type.as_deref(), prefix)? {
            out.push((e.entity_id, e.entity_type));
        }
    } else {
        for id in &q.entity_ids {
            let mut stmt;
            let mut rows = match q.entity_type.as_deref() {
                Some(ty) => {
                    stmt = conn
                        .prepare_cached(
                            "SELECT entity_type, service_path FROM history_entities \
                             WHERE tenant = ?1 AND entity_type = ?2 AND entity_id = ?3",
                        )
                        .db()?;
                    stmt.query((&q.tenant, ty, id)).db()?
                }
                None => {
                    stmt = conn
                        .prepare_cached(
                            "SELECT entity_type, service_path FROM history_entities \
                             WHERE tenant = ?1 AND entity_id = ?2",
                        )
                        .db()?;
                    stmt.query((&q.tenant, id)).db()?
                }
            };
            while let Some(row) = rows.next().db()? {
                let service_path: String = row.get(1).db()?;
                if prefix.is_none_or(|p| path_matches(p, &service_path)) {
                    out.push((id.clone(), row.get(0).db()?));
                }
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// The attributes of an entity that has rows or rollups, in order. Each is
/// found by a seek past the previous one (a skip-scan of the primary key),
/// so an entity with millions of rows costs a few lookups per attribute;
/// rollups count too, since a tenant's retention may have downsampled the
/// rows away.
fn entity_attrs(
    conn: &Connection,
    tenant: &str,
    id: &str,
    ty: &str,
) -> rusqlite::Result<Vec<String>> {
    let mut out = std::collections::BTreeSet::new();
    for table in ["history", "history_rollups"] {
        let mut next = conn.prepare_cached(&format!(
            "SELECT attr FROM {table} WHERE tenant = ?1 AND entity_id = ?2 AND entity_type = ?3 \
             AND attr > ?4 ORDER BY attr LIMIT 1"
        ))?;
        let mut current: Option<String> = next
            .query_row((tenant, id, ty, ""), |r| r.get(0))
            .optional()?;
        while let Some(attr) = current {
            current = next
                .query_row((tenant, id, ty, &attr), |r| r.get(0))
                .optional()?;
            out.insert(attr);
        }
    }
    Ok(out.into_iter().collect())
}

/// Every (entity id, entity type, attribute) series a query covers, in
/// result order.
fn query_series(conn: &Connection, q: &HistoryQuery) -> Result<Vec<(String, String, String)>> {
    let mut wanted = q.attrs.clone();
    wanted.sort_unstable();
    wanted.dedup();
    let mut out = Vec::new();
    for (id, ty) in query_entities(conn, q)? {
        let attrs = if wanted.is_empty() {
            entity_attrs(conn, &q.tenant, &id, &ty).db()?
        } else {
            wanted.clone()
        };
        for attr in attrs {
            out.push((id.clone(), ty.clone(), attr));
        }
    }
    Ok(out)
}

/// Rows matching `q`: per series, the range scan from `from` to `to`;
/// with `last_n`, the range first starts at the N-th newest row in range
/// (found by a backward scan, as a (time, instance) bound, so it is exact
/// when rows share a time); then `offset` and `limit` (at most
/// [`MAX_QUERY_ROWS`](super::reader::MAX_QUERY_ROWS), QuantumLeap's cap) in
/// ascending time.
fn query_history(conn: &Connection, q: &HistoryQuery) -> Result<Vec<HistoryRow>> {
    let (from, to) = q.time_range();
    let per_series = limit(q.limit);
    let offset = i64::try_from(q.offset).unwrap_or(i64::MAX);
    let mut out = Vec::new();
    if per_series == 0 || q.last_n == Some(0) {
        return Ok(out);
    }
    // One snapshot for every series, whatever commits meanwhile (a read
    // transaction; dropping it at the end only ends the read).
    let _snapshot = conn.unchecked_transaction().db()?;
    let mut nth_newest = conn
        .prepare_cached(
            "SELECT time, instance FROM history \
             WHERE tenant = ?1 AND entity_id = ?2 AND entity_type = ?3 AND attr = ?4 \
             AND time >= ?5 AND time <= ?6 ORDER BY time DESC, instance DESC LIMIT 1 OFFSET ?7",
        )
        .db()?;
    let mut scan = conn
        .prepare_cached(
            "SELECT time, service_path, attr_type, value, number, instance FROM history \
             WHERE tenant = ?1 AND entity_id = ?2 AND entity_type = ?3 AND attr = ?4 \
             AND time >= ?5 AND time <= ?6 AND (time > ?5 OR instance >= ?9) \
             ORDER BY time, instance LIMIT ?7 OFFSET ?8",
        )
        .db()?;
    for (id, ty, attr) in query_series(conn, q)? {
        // The first row: the N-th newest with `last_n`, as a (time,
        // instance) bound since several rows may share a time.
        let mut start = (from, i64::MIN);
        if let Some(n) = q.last_n {
            let skip = i64::try_from(n - 1).unwrap_or(i64::MAX);
            let bound: Option<(i64, i64)> = nth_newest
                .query_row((&q.tenant, &id, &ty, &attr, from, to, skip), |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .optional()
                .db()?;
            if let Some(bound) = bound {
                start = bound;
            }
        }
        let mut rows = scan
            .query((
                &q.tenant, &id, &ty, &attr, start.0, to, per_series, offset, start.1,
            ))
            .db()?;
        while let Some(row) = rows.next().db()? {
            out.push(HistoryRow {
                tenant: q.tenant.clone(),
                service_path: row.get(1).db()?,
                entity_id: id.clone(),
                entity_type: ty.clone(),
                attr: attr.clone(),
                attr_type: row.get(2).db()?,
                time: row.get(0).db()?,
                instance: row.get(5).db()?,
                value: row.get(3).db()?,
                number: row.get(4).db()?,
            });
        }
    }
    Ok(out)
}

/// The SQL of the start (epoch ms, UTC) of the bucket holding the time in
/// `column`. Fixed-length periods floor it to a multiple of their length
/// (also for times before 1970); months and years use SQLite's calendar.
/// No period: one bucket (0) for everything.
fn bucket_sql(period: Option<AggrPeriod>, column: &str) -> String {
    let fixed = |unit: i64| format!("({column} - (({column} % {unit}) + {unit}) % {unit})");
    let calendar = |start: &str| {
        format!(
            "(CAST(strftime('%s', {column} / 1000.0, 'unixepoch', '{start}') AS INTEGER) * 1000)"
        )
    };
    match period {
        None => "0".to_string(),
        Some(AggrPeriod::Second) => fixed(1_000),
        Some(AggrPeriod::Minute) => fixed(60_000),
        Some(AggrPeriod::Hour) => fixed(3_600_000),
        Some(AggrPeriod::Day) => fixed(86_400_000),
        Some(AggrPeriod::Month) => calendar("start of month"),
        Some(AggrPeriod::Year) => calendar("start of year"),
    }
}

/// Earliest and latest times an aggregation considers: far beyond any
/// real time index, and far enough from `i64`'s ends that bucket
/// arithmetic never overflows.
const AGGREGATE_BOUND: i64 = 1 << 52;

/// Aggregates per series and bucket. Each series' range is split
/// ([`crate::rollup::plan`]) into whole hours, answered from the hour
/// rollups, whole minutes at the edges, from the minute rollups, and the
/// ragged ends, from the rows — so a day of hourly averages reads 24
/// stored buckets instead of every row, and aggregates still answer for
/// ranges whose rows a tenant's retention has downsampled away. Seconds
/// are computed from the rows. Without a period, one aggregate per series
/// that has rows in range, its bucket the time of the first of them.
fn aggregate_history(
    conn: &Connection,
    q: &HistoryQuery,
    method: AggrMethod,
    period: Option<AggrPeriod>,
) -> Result<Vec<HistoryAggregate>> {
    use crate::rollup::{plan, Level, RollupPartial, HOUR_MS, MINUTE_MS};
    const SERIES: &str = "tenant = ?1 AND entity_id = ?2 AND entity_type = ?3 AND attr = ?4";
    let rows_sql = format!(
        "SELECT {bucket}, COUNT(*), COUNT(number), SUM(number), MIN(number), MAX(number) \
         FROM history WHERE {SERIES} AND time >= ?5 AND time < ?6 GROUP BY 1",
        bucket = bucket_sql(period, "time")
    );
    let rollups_sql = format!(
        "SELECT {bucket}, SUM(rows), SUM(numbers), SUM(sum_value), MIN(min_value), MAX(max_value) \
         FROM history_rollups WHERE {SERIES} AND period = ?7 AND bucket >= ?5 AND bucket < ?6 \
         GROUP BY 1",
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
    // One snapshot for every series, as in `query_history`.
    let _snapshot = conn.unchecked_transaction().db()?;
    let mut from_rows = conn.prepare_cached(&rows_sql).db()?;
    let mut from_rollups = conn.prepare_cached(&rollups_sql).db()?;
    let mut out = Vec::new();
    for (id, ty, attr) in query_series(conn, q)? {
        let mut buckets: std::collections::BTreeMap<i64, RollupPartial> = Default::default();
        for &(level, a, b) in &pieces {
            let mut rows = match level {
                Level::Rows => from_rows.query((&q.tenant, &id, &ty, &attr, a, b)),
                Level::Rollup(unit) => from_rollups.query((&q.tenant, &id, &ty, &attr, a, b, unit)),
            }
            .db()?;
            while let Some(row) = rows.next().db()? {
                let count: i64 = row.get(1).db()?;
                if count == 0 {
                    continue;
                }
                let numbers: i64 = row.get(2).db()?;
                let sum: Option<f64> = row.get(3).db()?;
                let partial = RollupPartial {
                    rows: count as u64,
                    numbers: numbers as u64,
                    sum: sum.unwrap_or(0.0),
                    min: row.get(4).db()?,
                    max: row.get(5).db()?,
                };
                buckets.entry(row.get(0).db()?).or_default().merge(&partial);
            }
        }
        for (bucket, partial) in buckets {
            let bucket = match period {
                Some(_) => bucket,
                None => first_time(conn, q, (&id, &ty, &attr), from, to)?,
            };
            out.push(HistoryAggregate {
                entity_id: id.clone(),
                entity_type: ty.clone(),
                attr: attr.clone(),
                bucket,
                value: partial.value(method),
            });
        }
    }
    Ok(out)
}

/// The time of a series' first row in `[from, to)`; when the rows are gone
/// (downsampled), the start of its first minute rollup there.
fn first_time(
    conn: &Connection,
    q: &HistoryQuery,
    (id, ty, attr): (&str, &str, &str),
    from: i64,
    to: i64,
) -> Result<i64> {
    let row: Option<i64> = conn
        .prepare_cached(
            "SELECT MIN(time) FROM history WHERE tenant = ?1 AND entity_id = ?2 \
             AND entity_type = ?3 AND attr = ?4 AND time >= ?5 AND time < ?6",
        )
        .db()?
        .query_row((&q.tenant, id, ty, attr, from, to), |r| r.get(0))
        .db()?;
    if let Some(t) = row {
        return Ok(t);
    }
    let bucket: Option<i64> = conn
        .prepare_cached(
            "SELECT MIN(bucket) FROM history_rollups WHERE tenant = ?1 AND entity_id = ?2 \
             AND entity_type = ?3 AND attr = ?4 AND period = ?5 AND bucket >= ?6 AND bucket < ?7",
        )
        .db()?
        .query_row(
            (
                &q.tenant,
                id,
                ty,
                attr,
                crate::rollup::MINUTE_MS,
                crate::rollup::floor_to(from, crate::rollup::MINUTE_MS),
                to,
            ),
            |r| r.get(0),
        )
        .db()?;
    Ok(bucket.unwrap_or(from).max(from))
}

/// The feed's entries after `after`, oldest first, until they hold
/// `max_rows` rows or more.
fn read_history_feed(
    conn: &Connection,
    after: u64,
    max_rows: usize,
) -> Result<Vec<(u64, Vec<HistoryRow>)>> {
    let mut stmt = conn
        .prepare_cached("SELECT seq, rows FROM history_feed WHERE seq > ?1 ORDER BY seq")
        .db()?;
    let mut rows = stmt.query([after as i64]).db()?;
    let mut out = Vec::new();
    let mut total = 0;
    while let Some(row) = rows.next().db()? {
        let seq = position(row, 0)?;
        // Entries are compact BLOBs; those queued before were JSON text.
        let batch = match row.get_ref(1).db()? {
            rusqlite::types::ValueRef::Blob(bytes) => decode_feed_blob(seq, bytes)?,
            value => {
                let text = value.as_str().map_err(|e| {
                    crate::StoreError::Corrupt(format!("history feed entry {seq}: {e}"))
                })?;
                decode_feed_entry(seq, text)?
            }
        };
        total += batch.len();
        out.push((seq, batch));
        if total >= max_rows {
            break;
        }
    }
    Ok(out)
}

/// The tenants that have history.
fn history_tenants(conn: &Connection) -> Result<Vec<String>> {
    conn.prepare_cached("SELECT DISTINCT tenant FROM history_entities ORDER BY tenant")
        .and_then(|mut st| {
            st.query_map([], |r| r.get(0))?
                .collect::<rusqlite::Result<Vec<String>>>()
        })
        .db()
}
