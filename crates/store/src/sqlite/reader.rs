//! The read side: a small pool of read-only connections, and the queries.
//!
//! In WAL mode readers see the last committed state and never wait for
//! the writer, so reads scale with the pool instead of queueing behind
//! group commits. Each read runs on tokio's blocking pool, holding one
//! connection; a semaphore with one permit per connection makes a burst
//! of reads wait for a free connection (asynchronously) instead of
//! opening more. Nothing here writes.

use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;
use rusqlite::types::Value as SqlValue;
use rusqlite::{params_from_iter, Connection, OpenFlags, OptionalExtension, Row};
use tokio::sync::Semaphore;
use weft_model::{
    Device, DeviceType, FailedUplink, FailureReason, NewUplink, Uplink, UplinkFormat,
};

use super::{schema, to_i64, Db};
use crate::{record_text, DataQuery, DeviceFilter, FailedQuery, Result, StoreError, StoredUnit};

/// Most rows one query returns, whatever the caller asks for: bounds the
/// memory and time of one API request.
pub(super) const MAX_QUERY_ROWS: usize = 10_000;

/// Prepared statements kept per read connection. `query_data` builds one
/// statement per combination of filters (64 at most); they are all worth
/// keeping.
const STATEMENT_CACHE: usize = 128;

/// Read-only connections shared by all reads.
pub(super) struct ReadPool {
    conns: Mutex<Vec<Connection>>,
    permits: Arc<Semaphore>,
}

impl ReadPool {
    /// Opens `size` read-only connections on an existing database.
    pub(super) fn open(path: &Path, size: usize) -> Result<ReadPool> {
        let size = size.max(1);
        let mut conns = Vec::with_capacity(size);
        for _ in 0..size {
            let conn = Connection::open_with_flags(
                path,
                OpenFlags::SQLITE_OPEN_READ_ONLY
                    | OpenFlags::SQLITE_OPEN_NO_MUTEX
                    | OpenFlags::SQLITE_OPEN_URI,
            )
            .db()?;
            schema::configure_reader(&conn).db()?;
            conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
            conns.push(conn);
        }
        Ok(ReadPool {
            conns: Mutex::new(conns),
            permits: Arc::new(Semaphore::new(size)),
        })
    }

    /// Runs `f` with a connection on the blocking pool.
    pub(super) async fn run<T, F>(self: &Arc<Self>, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| StoreError::Closed)?;
        let pool = Arc::clone(self);
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            // The permit guarantees a free connection.
            let conn = pool.conns.lock().pop().ok_or_else(|| {
                StoreError::Database("no read connection free despite a permit".to_string())
            })?;
            // A panicking read must not cost the pool its connection.
            let result = std::panic::catch_unwind(AssertUnwindSafe(|| f(&conn)));
            pool.conns.lock().push(conn);
            result.unwrap_or_else(|_| Err(StoreError::Database("a read panicked".to_string())))
        })
        .await
        .map_err(|e| StoreError::Database(format!("a read task failed: {e}")))?
    }
}

fn limit(n: usize) -> i64 {
    n.min(MAX_QUERY_ROWS) as i64
}

/// A stored position (`seq`, cursor) as `u64`; they are never negative.
fn position(row: &Row<'_>, index: usize) -> Result<u64> {
    let n: i64 = row.get(index).db()?;
    u64::try_from(n).map_err(|_| corrupt("position", format!("negative value {n}")))
}

fn corrupt(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("{what}: {e}"))
}

pub(super) fn read_uplinks(conn: &Connection, from_seq: u64, max: usize) -> Result<Vec<Uplink>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT seq, received_at, format, channel, device_type, body FROM ingest_log \
             WHERE seq >= ?1 ORDER BY seq LIMIT ?2",
        )
        .db()?;
    let mut rows = stmt
        .query((to_i64(from_seq), i64::try_from(max).unwrap_or(i64::MAX)))
        .db()?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().db()? {
        let seq = position(row, 0)?;
        let format: String = row.get(2).db()?;
        let format = UplinkFormat::parse(&format).ok_or_else(|| {
            corrupt(
                &format!("ingest log entry {seq}"),
                format!("unknown format {format:?}"),
            )
        })?;
        out.push(Uplink {
            seq,
            uplink: NewUplink {
                received_at: row.get(1).db()?,
                format,
                channel: row.get(3).db()?,
                device_type: row.get(4).db()?,
                body: row.get(5).db()?,
            },
        });
    }
    Ok(out)
}

pub(super) fn cursor(conn: &Connection, consumer: &str) -> Result<u64> {
    let mut stmt = conn
        .prepare_cached("SELECT next_seq FROM cursors WHERE name = ?1")
        .db()?;
    let mut rows = stmt.query([consumer]).db()?;
    match rows.next().db()? {
        Some(row) => position(row, 0),
        None => Ok(1),
    }
}

pub(super) fn get_device_type(conn: &Connection, name: &str) -> Result<Option<DeviceType>> {
    let mut stmt = conn
        .prepare_cached("SELECT json FROM device_types WHERE name = ?1")
        .db()?;
    let mut rows = stmt.query([name]).db()?;
    match rows.next().db()? {
        Some(row) => {
            let json: String = row.get(0).db()?;
            serde_json::from_str(&json)
                .map(Some)
                .map_err(|e| corrupt(&format!("device type {name:?}"), e))
        }
        None => Ok(None),
    }
}

pub(super) fn list_device_types(conn: &Connection) -> Result<Vec<(String, DeviceType)>> {
    let mut stmt = conn
        .prepare_cached("SELECT name, json FROM device_types ORDER BY name")
        .db()?;
    let mut rows = stmt.query([]).db()?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().db()? {
        let name: String = row.get(0).db()?;
        let json: String = row.get(1).db()?;
        let device_type = serde_json::from_str(&json)
            .map_err(|e| corrupt(&format!("device type {name:?}"), e))?;
        out.push((name, device_type));
    }
    Ok(out)
}

fn device_from_row(row: &Row<'_>) -> Result<Device> {
    let json: String = row.get(0).db()?;
    serde_json::from_str(&json).map_err(|e| corrupt("device", e))
}

pub(super) fn get_device(conn: &Connection, id: &str) -> Result<Option<Device>> {
    let mut stmt = conn
        .prepare_cached("SELECT json FROM devices WHERE id = ?1")
        .db()?;
    let mut rows = stmt.query([id]).db()?;
    match rows.next().db()? {
        Some(row) => device_from_row(row).map(Some),
        None => Ok(None),
    }
}

/// Type and channel are filtered in SQL; records in Rust, on the decoded
/// device, with the same text comparison live filters use.
pub(super) fn list_devices(conn: &Connection, filter: &DeviceFilter) -> Result<Vec<Device>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT json FROM devices \
             WHERE (?1 IS NULL OR device_type = ?1) AND (?2 IS NULL OR channel = ?2) \
             ORDER BY id",
        )
        .db()?;
    let mut rows = stmt
        .query((filter.device_type.as_deref(), filter.channel.as_deref()))
        .db()?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().db()? {
        let device = device_from_row(row)?;
        let matches = filter.records.iter().all(|(label, value)| {
            record_text(&device.records, label).as_deref() == Some(value.as_str())
        });
        if matches {
            out.push(device);
        }
    }
    Ok(out)
}

/// One statement per combination of filters, so each uses the index that
/// fits (`(device_id, seq)` for a device's history, the primary key
/// otherwise) instead of an `?n IS NULL OR …` plan that can use neither.
pub(super) fn query_data(conn: &Connection, query: &DataQuery) -> Result<Vec<StoredUnit>> {
    let mut sql = String::from("SELECT seq, json FROM data_units WHERE seq > ?");
    let mut params: Vec<SqlValue> = vec![SqlValue::Integer(to_i64(query.after.unwrap_or(0)))];
    let mut text = |column: &str, value: &Option<String>, sql: &mut String| {
        if let Some(value) = value {
            sql.push_str(" AND ");
            sql.push_str(column);
            sql.push_str(" = ?");
            params.push(SqlValue::Text(value.clone()));
        }
    };
    text("device_id", &query.device, &mut sql);
    text("channel", &query.channel, &mut sql);
    text("device_type", &query.device_type, &mut sql);
    if let Some(from) = query.from {
        sql.push_str(" AND reported_at >= ?");
        params.push(SqlValue::Integer(from));
    }
    if let Some(to) = query.to {
        sql.push_str(" AND reported_at <= ?");
        params.push(SqlValue::Integer(to));
    }
    sql.push_str(" ORDER BY seq LIMIT ?");
    params.push(SqlValue::Integer(limit(query.limit)));
    let mut stmt = conn.prepare_cached(&sql).db()?;
    let mut rows = stmt.query(params_from_iter(params)).db()?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().db()? {
        out.push(StoredUnit {
            seq: position(row, 0)?,
            json: row.get(1).db()?,
        });
    }
    Ok(out)
}

pub(super) fn get_data(conn: &Connection, data_id: &str) -> Result<Option<StoredUnit>> {
    let mut stmt = conn
        .prepare_cached("SELECT seq, json FROM data_units WHERE data_id = ?1")
        .db()?;
    let mut rows = stmt.query([data_id]).db()?;
    match rows.next().db()? {
        Some(row) => Ok(Some(StoredUnit {
            seq: position(row, 0)?,
            json: row.get(1).db()?,
        })),
        None => Ok(None),
    }
}

/// Which of `data_ids` are in `data_units`: one statement whatever their
/// number (the ids go in as one JSON array).
pub(super) fn stored_data_ids(
    conn: &Connection,
    data_ids: &[String],
) -> Result<std::collections::HashSet<String>> {
    let ids = serde_json::to_string(data_ids)
        .map_err(|e| StoreError::Database(format!("data ids: {e}")))?;
    let mut stmt = conn
        .prepare_cached(
            "SELECT data_id FROM data_units \
             WHERE data_id IN (SELECT value FROM json_each(?1))",
        )
        .db()?;
    let mut rows = stmt.query([ids]).db()?;
    let mut stored = std::collections::HashSet::new();
    while let Some(row) = rows.next().db()? {
        stored.insert(row.get(0).db()?);
    }
    Ok(stored)
}

pub(super) fn query_failed(conn: &Connection, query: &FailedQuery) -> Result<Vec<FailedUplink>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT seq, received_at, format, channel, device_type, reason, description, body \
             FROM failed_uplinks \
             WHERE seq > ?1 AND (?2 IS NULL OR device_type = ?2) AND (?3 IS NULL OR channel = ?3) \
             ORDER BY seq LIMIT ?4",
        )
        .db()?;
    let mut rows = stmt
        .query((
            to_i64(query.after.unwrap_or(0)),
            query.device_type.as_deref(),
            query.channel.as_deref(),
            limit(query.limit),
        ))
        .db()?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().db()? {
        let seq = position(row, 0)?;
        let reason: String = row.get(5).db()?;
        let reason = FailureReason::parse(&reason).ok_or_else(|| {
            corrupt(
                &format!("failed uplink {seq}"),
                format!("unknown reason {reason:?}"),
            )
        })?;
        let body: String = row.get(7).db()?;
        // Bodies are stored as JSON; anything else is returned as text
        // rather than failing the whole listing.
        let body = serde_json::from_str(&body).unwrap_or(serde_json::Value::String(body));
        out.push(FailedUplink {
            seq,
            received_at: row.get(1).db()?,
            format: row.get(2).db()?,
            channel: row.get(3).db()?,
            device_type: row.get(4).db()?,
            reason,
            description: row.get(6).db()?,
            body,
        });
    }
    Ok(out)
}

pub(super) fn load_entities(conn: &Connection) -> Result<Vec<crate::EntityRecord>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT tenant, service_path, id, type, created, json FROM entities ORDER BY created",
        )
        .db()?;
    let mut rows = stmt.query([]).db()?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().db()? {
        out.push(crate::EntityRecord {
            tenant: row.get(0).db()?,
            service_path: row.get(1).db()?,
            id: row.get(2).db()?,
            entity_type: row.get(3).db()?,
            created: position(row, 4)?,
            json: row.get(5).db()?,
        });
    }
    Ok(out)
}

pub(super) fn load_documents(
    conn: &Connection,
    kind: crate::DocumentKind,
) -> Result<Vec<crate::NgsiDocument>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT tenant, id, service_path, created, json FROM ngsi_documents \
             WHERE kind = ?1 ORDER BY created",
        )
        .db()?;
    let mut rows = stmt.query([kind.as_str()]).db()?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().db()? {
        out.push(crate::NgsiDocument {
            kind,
            tenant: row.get(0).db()?,
            id: row.get(1).db()?,
            service_path: row.get(2).db()?,
            created: position(row, 3)?,
            json: row.get(4).db()?,
        });
    }
    Ok(out)
}

// --- history ------------------------------------------------------------
//
// Every series (tenant, entity id, entity type, attribute) is one
// contiguous range of the `history` primary key, in time order. So a query
// first decides which series it covers — entities from `history_entities`,
// attributes from the query or by skipping through the key — and then
// reads each series with a range scan (a backward one for `last_n`).

/// Whether an entity recorded under `path` is under the service-path
/// prefix `prefix`: the path itself or one of its sub-paths, segment-wise
/// (`/a` and `/a/` match `/a` and `/a/b`, not `/ab`; `/` matches every
/// path). Compared exactly in Rust, so `%`, `_` and case mean nothing
/// special, as they would in a `LIKE`.
pub(super) fn path_matches(prefix: &str, path: &str) -> bool {
    let base = prefix.trim_end_matches('/');
    path == prefix
        || path
            .strip_prefix(base)
            .is_some_and(|rest| (rest.is_empty() && !base.is_empty()) || rest.starts_with('/'))
}

/// The entities of `tenant` with history, optionally of one type and under
/// a service-path prefix, ordered by type then id (the key's order).
pub(super) fn history_entities(
    conn: &Connection,
    tenant: &str,
    entity_type: Option<&str>,
    prefix: Option<&str>,
) -> Result<Vec<crate::HistoryEntity>> {
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
            out.push(crate::HistoryEntity {
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
fn query_entities(conn: &Connection, q: &crate::HistoryQuery) -> Result<Vec<(String, String)>> {
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
pub(super) fn entity_attrs(
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
fn query_series(
    conn: &Connection,
    q: &crate::HistoryQuery,
) -> Result<Vec<(String, String, String)>> {
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

/// The query's time range as inclusive bounds.
fn time_range(q: &crate::HistoryQuery) -> (i64, i64) {
    (q.from.unwrap_or(i64::MIN), q.to.unwrap_or(i64::MAX))
}

/// Rows matching `q`: per series, the range scan from `from` to `to`;
/// with `last_n`, the range first starts at the N-th newest row in range
/// (found by a backward scan; times are unique within a series, so the
/// bound is exact); then `offset` and `limit` (at most
/// [`MAX_QUERY_ROWS`], QuantumLeap's cap) in ascending time.
pub(super) fn query_history(
    conn: &Connection,
    q: &crate::HistoryQuery,
) -> Result<Vec<crate::HistoryRow>> {
    let (from, to) = time_range(q);
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
            "SELECT time FROM history \
             WHERE tenant = ?1 AND entity_id = ?2 AND entity_type = ?3 AND attr = ?4 \
             AND time >= ?5 AND time <= ?6 ORDER BY time DESC LIMIT 1 OFFSET ?7",
        )
        .db()?;
    let mut scan = conn
        .prepare_cached(
            "SELECT time, service_path, attr_type, value, number FROM history \
             WHERE tenant = ?1 AND entity_id = ?2 AND entity_type = ?3 AND attr = ?4 \
             AND time >= ?5 AND time <= ?6 ORDER BY time LIMIT ?7 OFFSET ?8",
        )
        .db()?;
    for (id, ty, attr) in query_series(conn, q)? {
        let mut start = from;
        if let Some(n) = q.last_n {
            let skip = i64::try_from(n - 1).unwrap_or(i64::MAX);
            let bound: Option<i64> = nth_newest
                .query_row((&q.tenant, &id, &ty, &attr, from, to, skip), |r| r.get(0))
                .optional()
                .db()?;
            if let Some(bound) = bound {
                start = bound;
            }
        }
        let mut rows = scan
            .query((&q.tenant, &id, &ty, &attr, start, to, per_series, offset))
            .db()?;
        while let Some(row) = rows.next().db()? {
            out.push(crate::HistoryRow {
                tenant: q.tenant.clone(),
                service_path: row.get(1).db()?,
                entity_id: id.clone(),
                entity_type: ty.clone(),
                attr: attr.clone(),
                attr_type: row.get(2).db()?,
                time: row.get(0).db()?,
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
fn bucket_sql(period: Option<crate::AggrPeriod>, column: &str) -> String {
    let fixed = |unit: i64| format!("({column} - (({column} % {unit}) + {unit}) % {unit})");
    let calendar = |start: &str| {
        format!(
            "(CAST(strftime('%s', {column} / 1000.0, 'unixepoch', '{start}') AS INTEGER) * 1000)"
        )
    };
    match period {
        None => "0".to_string(),
        Some(crate::AggrPeriod::Second) => fixed(1_000),
        Some(crate::AggrPeriod::Minute) => fixed(60_000),
        Some(crate::AggrPeriod::Hour) => fixed(3_600_000),
        Some(crate::AggrPeriod::Day) => fixed(86_400_000),
        Some(crate::AggrPeriod::Month) => calendar("start of month"),
        Some(crate::AggrPeriod::Year) => calendar("start of year"),
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
pub(super) fn aggregate_history(
    conn: &Connection,
    q: &crate::HistoryQuery,
    method: crate::AggrMethod,
    period: Option<crate::AggrPeriod>,
) -> Result<Vec<crate::HistoryAggregate>> {
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
        Some(crate::AggrPeriod::Second) => None,
        Some(crate::AggrPeriod::Minute) => Some(MINUTE_MS),
        _ => Some(HOUR_MS),
    };
    let (from, to) = time_range(q);
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
            out.push(crate::HistoryAggregate {
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
    q: &crate::HistoryQuery,
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

pub(super) fn read_history_feed(
    conn: &Connection,
    after: u64,
    max_rows: usize,
) -> Result<Vec<(u64, Vec<crate::HistoryRow>)>> {
    let mut stmt = conn
        .prepare_cached("SELECT seq, rows FROM history_feed WHERE seq > ?1 ORDER BY seq")
        .db()?;
    let mut rows = stmt.query([after as i64]).db()?;
    let mut out = Vec::new();
    let mut total = 0;
    while let Some(row) = rows.next().db()? {
        let seq = position(row, 0)?;
        let text: String = row.get(1).db()?;
        let batch: Vec<crate::HistoryRow> = serde_json::from_str(&text)
            .map_err(|e| crate::StoreError::Database(format!("history feed entry {seq}: {e}")))?;
        total += batch.len();
        out.push((seq, batch));
        if total >= max_rows {
            break;
        }
    }
    Ok(out)
}
