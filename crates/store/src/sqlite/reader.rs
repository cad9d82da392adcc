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
use rusqlite::{params_from_iter, Connection, OpenFlags, Row};
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
