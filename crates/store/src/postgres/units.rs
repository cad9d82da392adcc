//! What the pipeline made of uplinks, on PostgreSQL: a processed batch is
//! one write of the main writer (units, failures, new devices, the
//! consumer's cursor, entity states, their history rows and their logged
//! changes together), so after a crash either all of it is stored or the
//! pipeline does it again.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use async_trait::async_trait;
use tokio_postgres::Client;
use weft_model::{FailedUplink, FailureReason};

use super::catalog::store_events;
use super::conn::Conn;
use super::context::{put_entities, queue_changes, MainLog};
use super::outbox::log_changes;
use super::schema::db;
use super::{position, to_i64, PostgresStore, MAX_QUERY_ROWS};
use crate::history::encode_feed_entry;
use crate::{
    CommitOutcome, DataQuery, FailedQuery, ProcessedBatch, Result, StoreError, StoredUnit,
    UnitStore,
};

#[async_trait]
impl UnitStore for PostgresStore {
    async fn cursor(&self, consumer: &str) -> Result<u64> {
        let client = self.reader().await?;
        cursor(&client, consumer).await
    }

    async fn commit_processed(&self, batch: Arc<ProcessedBatch>) -> Result<CommitOutcome> {
        if !batch.entities.is_empty() {
            // After the NGSI entity writes waiting now, before any later one.
            self.entity_puts.seal();
        }
        let partitions = crate::HistoryStore::change_feed_partitions(self);
        self.main
            .write(move |c| Box::pin(async move { processed(c, &batch, partitions).await }))
            .await
    }

    /// Reads no further than the data units' horizon: a rule lane or a
    /// bridge reading forward never passes a unit another node commits
    /// later.
    async fn query_data(&self, query: &DataQuery) -> Result<Vec<StoredUnit>> {
        let through = self.main_horizon(MainLog::Units).await;
        let client = self.reader().await?;
        let limit = query.limit.min(MAX_QUERY_ROWS) as i64;
        let partitions: Option<Vec<i16>> = query
            .partitions
            .as_ref()
            .map(|p| p.iter().map(|&p| p as i16).collect());
        let rows = client
            .query(
                "SELECT seq, json, part FROM data_units WHERE seq > $1 \
                   AND ($2::TEXT IS NULL OR device_id = $2) \
                   AND ($3::TEXT IS NULL OR channel = $3) \
                   AND ($4::TEXT IS NULL OR device_type = $4) \
                   AND ($5::BIGINT IS NULL OR reported_at >= $5) \
                   AND ($6::BIGINT IS NULL OR reported_at <= $6) \
                   AND ($8::SMALLINT[] IS NULL OR part = ANY($8)) \
                   AND seq <= $9 \
                 ORDER BY seq LIMIT $7",
                &[
                    &to_i64(query.after.unwrap_or(0)),
                    &query.device,
                    &query.channel,
                    &query.device_type,
                    &query.from,
                    &query.to,
                    &limit,
                    &partitions,
                    &to_i64(through),
                ],
            )
            .await
            .map_err(db)?;
        rows.iter()
            .map(|row| {
                Ok(StoredUnit {
                    seq: position(row, 0)?,
                    json: row.get(1),
                    partition: row.get::<_, i16>(2) as u16,
                })
            })
            .collect()
    }

    async fn get_data(&self, data_id: &str) -> Result<Option<StoredUnit>> {
        let client = self.reader().await?;
        let row = client
            .query_opt(
                "SELECT seq, json, part FROM data_units WHERE data_id = $1",
                &[&data_id],
            )
            .await
            .map_err(db)?;
        row.map(|row| {
            Ok(StoredUnit {
                seq: position(&row, 0)?,
                json: row.get(1),
                partition: row.get::<_, i16>(2) as u16,
            })
        })
        .transpose()
    }

    async fn stored_data_ids(&self, data_ids: Vec<String>) -> Result<HashSet<String>> {
        if data_ids.is_empty() {
            return Ok(HashSet::new());
        }
        let client = self.reader().await?;
        let rows = client
            .query(
                "SELECT data_id FROM data_units WHERE data_id = ANY($1)",
                &[&data_ids],
            )
            .await
            .map_err(db)?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    }

    async fn query_failed(&self, query: &FailedQuery) -> Result<Vec<FailedUplink>> {
        let client = self.reader().await?;
        let limit = query.limit.min(MAX_QUERY_ROWS) as i64;
        let rows = client
            .query(
                "SELECT seq, received_at, format, channel, device_type, reason, description, body \
                 FROM failed_uplinks WHERE seq > $1 \
                   AND ($2::TEXT IS NULL OR device_type = $2) \
                   AND ($3::TEXT IS NULL OR channel = $3) \
                 ORDER BY seq LIMIT $4",
                &[
                    &to_i64(query.after.unwrap_or(0)),
                    &query.device_type,
                    &query.channel,
                    &limit,
                ],
            )
            .await
            .map_err(db)?;
        rows.iter()
            .map(|row| {
                let seq = position(row, 0)?;
                let reason: &str = row.get(5);
                let reason = FailureReason::parse(reason).ok_or_else(|| {
                    StoreError::Corrupt(format!("failed uplink {seq}: unknown reason {reason:?}"))
                })?;
                let body: String = row.get(7);
                // Bodies are stored as JSON; anything else comes back as
                // text rather than failing the whole listing.
                let body = serde_json::from_str(&body).unwrap_or(serde_json::Value::String(body));
                Ok(FailedUplink {
                    seq,
                    received_at: row.get(1),
                    format: row.get(2),
                    channel: row.get(3),
                    device_type: row.get(4),
                    reason,
                    description: row.get(6),
                    body,
                })
            })
            .collect()
    }

    /// The newest unit below the horizon: a bridge starting after it
    /// never skips one committing late.
    async fn data_head(&self) -> Result<u64> {
        let through = self.main_horizon(MainLog::Units).await;
        let client = self.reader().await?;
        let row = client
            .query_one(
                "SELECT COALESCE(MAX(seq), 0) FROM data_units WHERE seq <= $1",
                &[&to_i64(through)],
            )
            .await
            .map_err(db)?;
        position(&row, 0)
    }
}

/// The next `seq` consumer `name` has to process (1 for a new consumer).
pub(super) async fn cursor(client: &Client, name: &str) -> Result<u64> {
    let row = client
        .query_opt("SELECT next_seq FROM cursors WHERE name = $1", &[&name])
        .await
        .map_err(db)?;
    match row {
        Some(row) => position(&row, 0),
        None => Ok(1),
    }
}

/// One processed batch, inside the main writer's transaction. The units go
/// in as one statement over arrays; a unit whose `dataId` is stored (or
/// earlier in the batch) is skipped and answered as not inserted.
async fn processed(c: &Conn, batch: &ProcessedBatch, partitions: u16) -> Result<CommitOutcome> {
    // Sent together on the writer's connection (pipelined): one round
    // trip for all of them instead of one each. They touch different
    // tables, so the order PostgreSQL runs them in does not matter.
    let history = encode_feed_entry(&batch.history);
    let (units, failures, devices, events, cursors, queued, logged) = tokio::join!(
        insert_units(c, batch),
        store_failures(c, batch),
        store_new_devices(c, batch),
        store_events(c, &batch.events),
        move_cursors(c, batch),
        queue_changes(c, &history, partitions),
        log_changes(c, &batch.changes),
    );
    let (inserted, seqs) = units?;
    failures
        .and(devices)
        .and(events)
        .and(cursors)
        .and(queued)
        .and(logged)?;
    if !batch.entities.is_empty() {
        // After the units: the cursor is the newest unit stored (a
        // partition changing hands, seldom).
        put_entities(c, &batch.entities).await?;
        c.execute(
            "INSERT INTO cursors (name, next_seq) \
             SELECT UNNEST($1::TEXT[]), COALESCE((SELECT MAX(seq) FROM data_units), 0) + 1 \
             ON CONFLICT (name) DO UPDATE SET next_seq = excluded.next_seq",
            &[&batch.entity_cursors],
        )
        .await
        .map_err(db)?;
    }
    Ok(CommitOutcome { inserted, seqs })
}

/// The batch's data units, each stored once by its id: which were new,
/// and their `seq`s.
async fn insert_units(c: &Conn, batch: &ProcessedBatch) -> Result<(Vec<bool>, Vec<u64>)> {
    let mut inserted = vec![false; batch.units.len()];
    let mut seqs = vec![0; batch.units.len()];
    if batch.units.is_empty() {
        return Ok((inserted, seqs));
    }
    let n = batch.units.len();
    let mut parts: Vec<i16> = Vec::with_capacity(n);
    let (mut ids, mut devices, mut channels, mut types, mut times, mut jsons) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    for record in &batch.units {
        let unit = &record.unit;
        ids.push(unit.data_id.as_str());
        parts.push(record.partition as i16);
        devices.push(unit.device.id.as_str());
        channels.push(unit.channel.as_str());
        types.push(unit.device.device_type.as_str());
        times.push(unit.reported_at);
        jsons.push(
            std::str::from_utf8(&record.json)
                .map_err(|e| StoreError::Database(format!("a unit's JSON: {e}")))?,
        );
    }
    let rows = c
        .query(
            "INSERT INTO data_units (data_id, device_id, channel, device_type, reported_at, json, part) \
             SELECT * FROM UNNEST($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::TEXT[], \
                                  $5::BIGINT[], $6::TEXT[], $7::SMALLINT[]) \
             ON CONFLICT (data_id) DO NOTHING RETURNING data_id, seq",
            &[&ids, &devices, &channels, &types, &times, &jsons, &parts],
        )
        .await
        .map_err(db)?;
    let mut stored: HashMap<&str, u64> = HashMap::with_capacity(rows.len());
    for row in &rows {
        stored.insert(row.get(0), position(row, 1)?);
    }
    for (i, id) in ids.iter().enumerate() {
        // The first of several units with one id is the one stored.
        if let Some(seq) = stored.remove(id) {
            inserted[i] = true;
            seqs[i] = seq;
        }
    }
    Ok((inserted, seqs))
}

/// The batch's failed uplinks, each kept under its log `seq`.
async fn store_failures(c: &Conn, batch: &ProcessedBatch) -> Result<()> {
    for failure in &batch.failures {
        c.execute(
            "INSERT INTO failed_uplinks \
             (seq, received_at, format, channel, device_type, reason, description, body) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
             ON CONFLICT (seq) DO UPDATE SET received_at = excluded.received_at, \
               format = excluded.format, channel = excluded.channel, \
               device_type = excluded.device_type, reason = excluded.reason, \
               description = excluded.description, body = excluded.body",
            &[
                &to_i64(failure.seq),
                &failure.received_at,
                &failure.format,
                &failure.channel,
                &failure.device_type,
                &failure.reason.as_str(),
                &failure.description,
                &failure.body.to_string(),
            ],
        )
        .await
        .map_err(db)?;
    }
    Ok(())
}

/// The devices the batch registered on their first uplink.
async fn store_new_devices(c: &Conn, batch: &ProcessedBatch) -> Result<()> {
    for device in &batch.new_devices {
        let json = serde_json::to_string(device)
            .map_err(|e| StoreError::Database(format!("device: {e}")))?;
        c.execute(
            "INSERT INTO devices (id, device_type, channel, json) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (id) DO NOTHING",
            &[&device.id, &device.device_type, &device.channel, &json],
        )
        .await
        .map_err(db)?;
    }
    Ok(())
}

/// The pipeline's cursors, moved past the batch.
async fn move_cursors(c: &Conn, batch: &ProcessedBatch) -> Result<()> {
    if batch.consumers.is_empty() {
        return Ok(());
    }
    c.execute(
        "INSERT INTO cursors (name, next_seq) SELECT UNNEST($1::TEXT[]), $2 \
         ON CONFLICT (name) DO UPDATE SET next_seq = excluded.next_seq",
        &[&batch.consumers, &to_i64(batch.next_seq)],
    )
    .await
    .map_err(db)?;
    Ok(())
}
