//! [`CatalogStore`] on the main file: device types and devices, each kept
//! as JSON under its key, with a device's type and channel as columns for
//! filtering.

use async_trait::async_trait;
use rusqlite::{Connection, Row};
use serde_json::{Map, Value};
use weft_model::{Device, DeviceEvent, DeviceType};

use super::reader::corrupt;
use super::{encode, to_i64, Db, SqliteStore};
use crate::{
    device_matches, record_text, CatalogStore, DeviceFilter, DevicePage, DevicePageQuery,
    DeviceSummary, Result, DEVICE_EVENTS_KEPT, DEVICE_STATE_KINDS,
};

#[async_trait]
impl CatalogStore for SqliteStore {
    async fn put_device_type(&self, name: &str, device_type: &DeviceType) -> Result<bool> {
        let json = encode("device type", device_type)?;
        let name = name.to_string();
        self.main
            .write(move |c| put_device_type(c, &name, &json))
            .await
    }

    async fn list_device_types(&self) -> Result<Vec<(String, DeviceType)>> {
        self.main.read(list_device_types).await
    }

    async fn delete_device_type(&self, name: &str) -> Result<bool> {
        let name = name.to_string();
        self.main
            .write(move |c| delete(c, "DELETE FROM device_types WHERE name = ?1", &name))
            .await
    }

    async fn put_device(&self, device: &Device) -> Result<bool> {
        let json = encode("device", device)?;
        let (id, device_type, channel) = (
            device.id.clone(),
            device.device_type.clone(),
            device.channel.clone(),
        );
        self.main
            .write(move |c| put_device(c, &id, &device_type, &channel, &json))
            .await
    }

    async fn list_devices(&self, filter: &DeviceFilter) -> Result<Vec<Device>> {
        let filter = filter.clone();
        self.main.read(move |c| list_devices(c, &filter)).await
    }

    async fn page_devices(&self, query: &DevicePageQuery) -> Result<DevicePage> {
        let query = query.clone();
        self.main.read(move |c| page_devices(c, &query)).await
    }

    async fn delete_device(&self, id: &str) -> Result<bool> {
        let id = id.to_string();
        self.main
            .write(move |c| {
                delete(c, "DELETE FROM device_events WHERE device_id = ?1", &id)?;
                delete(c, "DELETE FROM device_state WHERE device_id = ?1", &id)?;
                delete(c, "DELETE FROM devices WHERE id = ?1", &id)
            })
            .await
    }

    async fn device_state(&self, device_id: &str) -> Result<Map<String, Value>> {
        let id = device_id.to_string();
        self.main.read(move |c| device_state(c, &id)).await
    }

    async fn device_events(
        &self,
        device_id: &str,
        event: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DeviceEvent>> {
        let (id, event) = (device_id.to_string(), event.map(str::to_string));
        self.main
            .read(move |c| device_events(c, &id, event.as_deref(), limit))
            .await
    }
}

/// Stores device events (a replayed one, same `seq`, once), makes each
/// its device's state of its kind unless a later one is there (a new kind
/// only while the device has fewer than [`DEVICE_STATE_KINDS`]), and keeps
/// only each device's last [`DEVICE_EVENTS_KEPT`] events. Part of a
/// processed batch's savepoint.
pub(super) fn store_events(conn: &Connection, events: &[DeviceEvent]) -> rusqlite::Result<()> {
    if events.is_empty() {
        return Ok(());
    }
    let mut insert = conn.prepare_cached(
        "INSERT OR IGNORE INTO device_events (seq, device_id, event, received_at, json) \
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )?;
    let mut state = conn.prepare_cached(
        "INSERT INTO device_state (device_id, kind, seq, json) SELECT ?1, ?2, ?3, ?4 \
         WHERE (SELECT COUNT(*) FROM device_state WHERE device_id = ?1) < ?5 \
            OR EXISTS (SELECT 1 FROM device_state WHERE device_id = ?1 AND kind = ?2) \
         ON CONFLICT (device_id, kind) DO UPDATE SET seq = excluded.seq, json = excluded.json \
         WHERE excluded.seq >= device_state.seq",
    )?;
    let mut trim = conn.prepare_cached(
        "DELETE FROM device_events WHERE device_id = ?1 AND seq <= \
         (SELECT seq FROM device_events WHERE device_id = ?1 ORDER BY seq DESC LIMIT 1 OFFSET ?2)",
    )?;
    let mut devices = std::collections::BTreeSet::new();
    for e in events {
        let seq = to_i64(e.seq);
        insert.execute((seq, &e.device_id, &e.event, e.received_at, json(e)?))?;
        state.execute((
            &e.device_id,
            e.kind(),
            seq,
            json(&e.summary())?,
            DEVICE_STATE_KINDS as i64,
        ))?;
        devices.insert(e.device_id.as_str());
    }
    for id in devices {
        trim.execute((id, DEVICE_EVENTS_KEPT as i64))?;
    }
    Ok(())
}

/// JSON text of what a batch stores (serialising these types cannot
/// fail; a failure would be reported as an SQL error, not a panic).
fn json<T: serde::Serialize>(value: &T) -> rusqlite::Result<String> {
    serde_json::to_string(value).map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))
}

/// A device's state: kind → summary of its latest event of that kind.
fn device_state(conn: &Connection, id: &str) -> Result<Map<String, Value>> {
    let mut stmt = conn
        .prepare_cached("SELECT kind, json FROM device_state WHERE device_id = ?1 ORDER BY kind")
        .db()?;
    let mut rows = stmt.query([id]).db()?;
    let mut out = Map::new();
    while let Some(row) = rows.next().db()? {
        let kind: String = row.get(0).db()?;
        let text: String = row.get(1).db()?;
        let value = serde_json::from_str(&text)
            .map_err(|e| corrupt(&format!("state '{kind}' of device '{id}'"), e))?;
        out.insert(kind, value);
    }
    Ok(out)
}

/// A device's latest events, newest first.
fn device_events(
    conn: &Connection,
    id: &str,
    event: Option<&str>,
    limit: usize,
) -> Result<Vec<DeviceEvent>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT seq, json FROM device_events WHERE device_id = ?1 \
             AND (?2 IS NULL OR event = ?2) ORDER BY seq DESC LIMIT ?3",
        )
        .db()?;
    let mut rows = stmt
        .query((id, event, i64::try_from(limit).unwrap_or(i64::MAX)))
        .db()?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().db()? {
        let seq: i64 = row.get(0).db()?;
        let text: String = row.get(1).db()?;
        out.push(
            serde_json::from_str(&text).map_err(|e| corrupt(&format!("device event {seq}"), e))?,
        );
    }
    Ok(out)
}

/// Insert-if-absent, else update: two single statements, so "created" is
/// known without a read, and the single writer makes the pair atomic.
fn put_device_type(conn: &Connection, name: &str, json: &str) -> rusqlite::Result<bool> {
    let created = conn
        .prepare_cached("INSERT OR IGNORE INTO device_types (name, json) VALUES (?1, ?2)")?
        .execute((name, json))?
        == 1;
    if !created {
        conn.prepare_cached("UPDATE device_types SET json = ?2 WHERE name = ?1")?
            .execute((name, json))?;
    }
    Ok(created)
}

/// Creates or replaces a device, like [`put_device_type`]; answers
/// "created".
fn put_device(
    conn: &Connection,
    id: &str,
    device_type: &str,
    channel: &str,
    json: &str,
) -> rusqlite::Result<bool> {
    let created = conn
        .prepare_cached(
            "INSERT OR IGNORE INTO devices (id, device_type, channel, json) \
             VALUES (?1, ?2, ?3, ?4)",
        )?
        .execute((id, device_type, channel, json))?
        == 1;
    if !created {
        conn.prepare_cached(
            "UPDATE devices SET device_type = ?2, channel = ?3, json = ?4 WHERE id = ?1",
        )?
        .execute((id, device_type, channel, json))?;
    }
    Ok(created)
}

/// Runs a delete by key (`sql`); answers "existed".
fn delete(conn: &Connection, sql: &str, key: &str) -> rusqlite::Result<bool> {
    Ok(conn.prepare_cached(sql)?.execute([key])? > 0)
}

/// All device types, by name.
fn list_device_types(conn: &Connection) -> Result<Vec<(String, DeviceType)>> {
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

/// Type and channel are filtered in SQL; records in Rust, on the decoded
/// device, with the same text comparison live filters use.
fn list_devices(conn: &Connection, filter: &DeviceFilter) -> Result<Vec<Device>> {
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

/// The filter and search of a device page, as SQL on `devices` (type,
/// channel and search as `?1`, `?2`, `?3`, `?4`). The search reads the name
/// from the stored JSON: a scan, but of one table with no decoding.
/// `?4` is 1 when the search may be looked for in the JSON text first
/// ([`crate::search_in_json_text`]): a plain substring test, which spares
/// most rows the JSON parse of `json_extract` (about half the time).
const PAGE_WHERE: &str = "(?1 IS NULL OR device_type = ?1) AND (?2 IS NULL OR channel = ?2) \
     AND (?3 IS NULL OR ((?4 = 0 OR instr(lower(json), ?3) > 0) \
          AND (instr(lower(id), ?3) > 0 \
               OR instr(lower(coalesce(json_extract(json, '$.name'), '')), ?3) > 0)))";

/// One page of devices: counted and cut in SQL (the primary key gives
/// the id order), unless record filters ask for Rust-side matching, when
/// the filtered rows are walked once.
fn page_devices(conn: &Connection, query: &DevicePageQuery) -> Result<DevicePage> {
    let f = &query.filter;
    let args = (
        f.device_type.as_deref(),
        f.channel.as_deref(),
        query.search.as_deref(),
        query
            .search
            .as_deref()
            .is_some_and(crate::search_in_json_text),
    );
    let mut page = DevicePage::default();
    let mut devices = Vec::new();
    if f.records.is_empty() {
        page.total = conn
            .prepare_cached(&format!("SELECT COUNT(*) FROM devices WHERE {PAGE_WHERE}"))
            .db()?
            .query_row(args, |r| r.get::<_, i64>(0))
            .db()? as u64;
        let mut stmt = conn
            .prepare_cached(&format!(
                "SELECT json FROM devices WHERE {PAGE_WHERE} ORDER BY id LIMIT ?5 OFFSET ?6"
            ))
            .db()?;
        let mut rows = stmt
            .query((
                args.0,
                args.1,
                args.2,
                args.3,
                i64::try_from(query.limit).unwrap_or(i64::MAX),
                i64::try_from(query.offset).unwrap_or(i64::MAX),
            ))
            .db()?;
        while let Some(row) = rows.next().db()? {
            devices.push(device_from_row(row)?);
        }
    } else {
        let mut stmt = conn
            .prepare_cached(&format!(
                "SELECT json FROM devices WHERE {PAGE_WHERE} ORDER BY id"
            ))
            .db()?;
        let mut rows = stmt.query(args).db()?;
        while let Some(row) = rows.next().db()? {
            let device = device_from_row(row)?;
            if device_matches(&device, query) {
                let n = page.total as usize;
                if n >= query.offset && n - query.offset < query.limit {
                    devices.push(device);
                }
                page.total += 1;
            }
        }
    }
    for device in devices {
        let last_seen = last_seen(conn, &device.id)?;
        let state = device_state(conn, &device.id)?;
        page.devices.push(DeviceSummary {
            device,
            last_seen,
            state,
        });
    }
    Ok(page)
}

/// When a device was last heard of: its latest unit's `reportedAt` or its
/// latest event's arrival, whichever is later (two index lookups).
fn last_seen(conn: &Connection, id: &str) -> Result<Option<i64>> {
    let (unit, event): (Option<i64>, Option<i64>) = conn
        .prepare_cached(
            "SELECT (SELECT reported_at FROM data_units WHERE device_id = ?1 \
                     ORDER BY seq DESC LIMIT 1), \
                    (SELECT received_at FROM device_events WHERE device_id = ?1 \
                     ORDER BY seq DESC LIMIT 1)",
        )
        .db()?
        .query_row([id], |r| Ok((r.get(0)?, r.get(1)?)))
        .db()?;
    Ok(unit.max(event))
}
