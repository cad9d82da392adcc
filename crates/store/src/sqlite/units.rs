//! [`UnitStore`] on the main file: the pipeline's processed batches (data
//! units, failed uplinks, new devices, entity changes and their history,
//! and the cursor, in one savepoint) and the reads of units and failures.

use std::collections::HashSet;
use std::sync::Arc;

use async_trait::async_trait;
use rusqlite::types::Value as SqlValue;
use rusqlite::{params_from_iter, Connection};
use weft_model::{FailedUplink, FailureReason};

use super::catalog::store_events;
use super::context::put_entity;
use super::history::queue_history;
use super::outbox::log_changes;
use super::reader::{corrupt, cursor, limit, max_seq, position};
use super::writer::in_savepoint;
use super::{to_i64, Db, SqliteStore};
use crate::{CommitOutcome, DataQuery, FailedQuery, ProcessedBatch, Result, StoredUnit, UnitStore};

#[async_trait]
impl UnitStore for SqliteStore {
    async fn cursor(&self, consumer: &str) -> Result<u64> {
        let consumer = consumer.to_string();
        self.main.read(move |c| cursor(c, &consumer)).await
    }

    async fn commit_processed(&self, batch: Arc<ProcessedBatch>) -> Result<CommitOutcome> {
        self.main
            .write(move |c| in_savepoint(c, |c| processed(c, &batch)))
            .await
    }

    async fn query_data(&self, query: &DataQuery) -> Result<Vec<StoredUnit>> {
        let query = query.clone();
        self.main.read(move |c| query_data(c, &query)).await
    }

    async fn get_data(&self, data_id: &str) -> Result<Option<StoredUnit>> {
        let data_id = data_id.to_string();
        self.main.read(move |c| get_data(c, &data_id)).await
    }

    async fn stored_data_ids(&self, data_ids: Vec<String>) -> Result<HashSet<String>> {
        if data_ids.is_empty() {
            return Ok(HashSet::new());
        }
        self.main.read(move |c| stored_data_ids(c, &data_ids)).await
    }

    async fn query_failed(&self, query: &FailedQuery) -> Result<Vec<FailedUplink>> {
        let query = query.clone();
        self.main.read(move |c| query_failed(c, &query)).await
    }

    async fn data_head(&self) -> Result<u64> {
        self.main.read(|c| max_seq(c, DATA_HEAD)).await
    }
}

/// Stores a processed batch and moves its consumer's cursor (in the
/// caller's savepoint: all of it or nothing); answers what was inserted.
fn processed(conn: &Connection, batch: &ProcessedBatch) -> rusqlite::Result<CommitOutcome> {
    let mut inserted = Vec::with_capacity(batch.units.len());
    let mut seqs = Vec::with_capacity(batch.units.len());
    if !batch.units.is_empty() {
        let mut stmt = conn.prepare_cached(
            "INSERT OR IGNORE INTO data_units \
             (data_id, device_id, channel, device_type, reported_at, json) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )?;
        for record in &batch.units {
            let unit = &record.unit;
            let changed = stmt.execute((
                &unit.data_id,
                &unit.device.id,
                &unit.channel,
                &unit.device.device_type,
                unit.reported_at,
                json_text(&record.json)?,
            ))?;
            inserted.push(changed == 1);
            seqs.push(if changed == 1 {
                conn.last_insert_rowid() as u64
            } else {
                0
            });
        }
    }
    if !batch.failures.is_empty() {
        let mut stmt = conn.prepare_cached(
            "INSERT OR REPLACE INTO failed_uplinks \
             (seq, received_at, format, channel, device_type, reason, description, body) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        )?;
        for failure in &batch.failures {
            stmt.execute((
                to_i64(failure.seq),
                failure.received_at,
                &failure.format,
                failure.channel.as_deref(),
                failure.device_type.as_deref(),
                failure.reason.as_str(),
                &failure.description,
                failure.body.to_string(),
            ))?;
        }
    }
    if !batch.new_devices.is_empty() {
        let mut stmt = conn.prepare_cached(
            "INSERT OR IGNORE INTO devices (id, device_type, channel, json) \
             VALUES (?1, ?2, ?3, ?4)",
        )?;
        for device in &batch.new_devices {
            let json = serde_json::to_string(device)
                .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
            stmt.execute((&device.id, &device.device_type, &device.channel, json))?;
        }
    }
    store_events(conn, &batch.events)?;
    for consumer in &batch.consumers {
        conn.prepare_cached(
            "INSERT INTO cursors (name, next_seq) VALUES (?1, ?2) \
             ON CONFLICT (name) DO UPDATE SET next_seq = excluded.next_seq",
        )?
        .execute((consumer, to_i64(batch.next_seq)))?;
    }
    queue_history(conn, &batch.history)?;
    log_changes(conn, &batch.changes)?;
    if !batch.entities.is_empty() {
        for record in &batch.entities {
            put_entity(conn, record)?;
        }
        for name in &batch.entity_cursors {
            conn.prepare_cached(
                "INSERT INTO cursors (name, next_seq) \
                 VALUES (?1, COALESCE((SELECT MAX(seq) FROM data_units), 0) + 1) \
                 ON CONFLICT (name) DO UPDATE SET next_seq = excluded.next_seq",
            )?
            .execute([name])?;
        }
    }
    Ok(CommitOutcome { inserted, seqs })
}

/// A unit's JSON as text (it was serialised from a `String`, so this only
/// fails on a caller's bug, reported as an SQL error rather than a panic).
fn json_text(json: &[u8]) -> rusqlite::Result<&str> {
    std::str::from_utf8(json).map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))
}

/// One statement per combination of filters, so each uses the index that
/// fits (`(device_id, seq)` for a device's history, the primary key
/// otherwise) instead of an `?n IS NULL OR …` plan that can use neither.
fn query_data(conn: &Connection, query: &DataQuery) -> Result<Vec<StoredUnit>> {
    // One process, one partition (0): every unit is partition 0's.
    if query.partitions.as_ref().is_some_and(|p| !p.contains(&0)) {
        return Ok(Vec::new());
    }
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
            partition: 0,
            seq: position(row, 0)?,
            json: row.get(1).db()?,
        });
    }
    Ok(out)
}

/// One stored unit by `dataId`.
fn get_data(conn: &Connection, data_id: &str) -> Result<Option<StoredUnit>> {
    let mut stmt = conn
        .prepare_cached("SELECT seq, json FROM data_units WHERE data_id = ?1")
        .db()?;
    let mut rows = stmt.query([data_id]).db()?;
    match rows.next().db()? {
        Some(row) => Ok(Some(StoredUnit {
            partition: 0,
            seq: position(row, 0)?,
            json: row.get(1).db()?,
        })),
        None => Ok(None),
    }
}

/// Failed uplinks matching `query`, oldest first.
/// Which of `data_ids` are in `data_units`: one statement whatever their
/// number (the ids go in as one JSON array).
fn stored_data_ids(conn: &Connection, data_ids: &[String]) -> Result<HashSet<String>> {
    let ids = serde_json::to_string(data_ids)
        .map_err(|e| crate::StoreError::Database(format!("data ids: {e}")))?;
    let mut stmt = conn
        .prepare_cached(
            "SELECT data_id FROM data_units \
             WHERE data_id IN (SELECT value FROM json_each(?1))",
        )
        .db()?;
    let mut rows = stmt.query([ids]).db()?;
    let mut stored = HashSet::new();
    while let Some(row) = rows.next().db()? {
        stored.insert(row.get(0).db()?);
    }
    Ok(stored)
}

fn query_failed(conn: &Connection, query: &FailedQuery) -> Result<Vec<FailedUplink>> {
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

/// The newest stored data unit's `seq` (0: none).
const DATA_HEAD: &str = "SELECT COALESCE(MAX(seq), 0) FROM data_units";
