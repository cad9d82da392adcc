//! Device types and devices on PostgreSQL: configuration rows written
//! through the main writer, read from the pool.

use async_trait::async_trait;
use serde_json::{Map, Value};
use weft_model::{Device, DeviceEvent, DeviceType};

use super::conn::Conn;
use super::schema::db;
use super::writer::param;
use super::{to_i64, PostgresStore};
use crate::{
    device_matches, encode, record_text, CatalogStore, DeviceFilter, DevicePage, DevicePageQuery,
    DeviceSummary, Result, StoreError, DEVICE_EVENTS_KEPT, DEVICE_STATE_KINDS,
};

#[async_trait]
impl CatalogStore for PostgresStore {
    async fn put_device_type(&self, name: &str, device_type: &DeviceType) -> Result<bool> {
        let json = encode("device type", device_type)?;
        // `xmax = 0` only on a row this statement inserted.
        let row = self
            .main
            .query_one(
                "INSERT INTO device_types (name, json) VALUES ($1, $2) \
                 ON CONFLICT (name) DO UPDATE SET json = excluded.json \
                 RETURNING xmax = 0",
                vec![param(name.to_string()), param(json)],
            )
            .await?;
        Ok(row.get(0))
    }

    async fn list_device_types(&self) -> Result<Vec<(String, DeviceType)>> {
        let client = self.reader().await?;
        let rows = client
            .query("SELECT name, json FROM device_types ORDER BY name", &[])
            .await
            .map_err(db)?;
        rows.iter()
            .map(|row| {
                let name: String = row.get(0);
                let json: &str = row.get(1);
                let device_type = serde_json::from_str(json)
                    .map_err(|e| StoreError::Corrupt(format!("device type {name:?}: {e}")))?;
                Ok((name, device_type))
            })
            .collect()
    }

    async fn delete_device_type(&self, name: &str) -> Result<bool> {
        let n = self
            .main
            .execute(
                "DELETE FROM device_types WHERE name = $1",
                vec![param(name.to_string())],
            )
            .await?;
        Ok(n > 0)
    }

    async fn put_device(&self, device: &Device) -> Result<bool> {
        let json = encode("device", device)?;
        let row = self
            .main
            .query_one(
                "INSERT INTO devices (id, device_type, channel, json) \
                 VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (id) DO UPDATE SET device_type = excluded.device_type, \
                   channel = excluded.channel, json = excluded.json \
                 RETURNING xmax = 0",
                vec![
                    param(device.id.clone()),
                    param(device.device_type.clone()),
                    param(device.channel.clone()),
                    param(json),
                ],
            )
            .await?;
        Ok(row.get(0))
    }

    /// Type and channel are filtered in SQL; records in Rust, on the
    /// decoded device, with the same text comparison live filters use.
    async fn list_devices(&self, filter: &DeviceFilter) -> Result<Vec<Device>> {
        let client = self.reader().await?;
        let rows = client
            .query(
                "SELECT json FROM devices \
                 WHERE ($1::TEXT IS NULL OR device_type = $1) \
                   AND ($2::TEXT IS NULL OR channel = $2) \
                 ORDER BY id",
                &[&filter.device_type, &filter.channel],
            )
            .await
            .map_err(db)?;
        let mut out = Vec::new();
        for row in &rows {
            let device: Device = serde_json::from_str(row.get(0))
                .map_err(|e| StoreError::Corrupt(format!("device: {e}")))?;
            let matches = filter.records.iter().all(|(label, value)| {
                record_text(&device.records, label).as_deref() == Some(value.as_str())
            });
            if matches {
                out.push(device);
            }
        }
        Ok(out)
    }

    /// Counted and cut in SQL (the primary key gives the id order) unless
    /// record filters ask for Rust-side matching; then the page's last
    /// seen times and states in one query each.
    async fn page_devices(&self, query: &DevicePageQuery) -> Result<DevicePage> {
        const WHERE: &str = "($1::TEXT IS NULL OR device_type = $1) \
             AND ($2::TEXT IS NULL OR channel = $2) \
             AND ($3::TEXT IS NULL OR ((NOT $4 OR strpos(lower(json), $3) > 0) \
                  AND (strpos(lower(id), $3) > 0 \
                       OR strpos(lower(coalesce(json::jsonb ->> 'name', '')), $3) > 0)))";
        let client = self.reader().await?;
        let f = &query.filter;
        // Looked for in the JSON text first, sparing most rows the parse.
        let plain = query
            .search
            .as_deref()
            .is_some_and(crate::search_in_json_text);
        let mut page = DevicePage::default();
        let decode = |text: &str| {
            serde_json::from_str::<Device>(text)
                .map_err(|e| StoreError::Corrupt(format!("device: {e}")))
        };
        let mut devices = Vec::new();
        if f.records.is_empty() {
            let count = client
                .query_one(
                    &format!("SELECT COUNT(*) FROM devices WHERE {WHERE}"),
                    &[&f.device_type, &f.channel, &query.search, &plain],
                )
                .await
                .map_err(db)?;
            page.total = count.get::<_, i64>(0) as u64;
            let (limit, offset) = (to_i64(query.limit as u64), to_i64(query.offset as u64));
            let rows = client
                .query(
                    &format!(
                        "SELECT json FROM devices WHERE {WHERE} ORDER BY id LIMIT $5 OFFSET $6"
                    ),
                    &[
                        &f.device_type,
                        &f.channel,
                        &query.search,
                        &plain,
                        &limit,
                        &offset,
                    ],
                )
                .await
                .map_err(db)?;
            for row in &rows {
                devices.push(decode(row.get(0))?);
            }
        } else {
            let rows = client
                .query(
                    &format!("SELECT json FROM devices WHERE {WHERE} ORDER BY id"),
                    &[&f.device_type, &f.channel, &query.search, &plain],
                )
                .await
                .map_err(db)?;
            for row in &rows {
                let device = decode(row.get(0))?;
                if device_matches(&device, query) {
                    let n = page.total as usize;
                    if n >= query.offset && n - query.offset < query.limit {
                        devices.push(device);
                    }
                    page.total += 1;
                }
            }
        }
        let ids: Vec<&str> = devices.iter().map(|d| d.id.as_str()).collect();
        let seen = client
            .query(
                "SELECT d, (SELECT reported_at FROM data_units WHERE device_id = d \
                            ORDER BY seq DESC LIMIT 1), \
                           (SELECT received_at FROM device_events WHERE device_id = d \
                            ORDER BY seq DESC LIMIT 1) \
                 FROM unnest($1::TEXT[]) AS d",
                &[&ids],
            )
            .await
            .map_err(db)?;
        let mut last_seen = std::collections::HashMap::new();
        for row in &seen {
            let (id, unit, event): (String, Option<i64>, Option<i64>) =
                (row.get(0), row.get(1), row.get(2));
            last_seen.insert(id, unit.max(event));
        }
        let states = client
            .query(
                "SELECT device_id, kind, json FROM device_state WHERE device_id = ANY($1) \
                 ORDER BY device_id, kind",
                &[&ids],
            )
            .await
            .map_err(db)?;
        let mut state: std::collections::HashMap<String, Map<String, Value>> =
            std::collections::HashMap::new();
        for row in &states {
            let (id, kind, text): (String, String, &str) = (row.get(0), row.get(1), row.get(2));
            let value = serde_json::from_str(text).map_err(|e| {
                StoreError::Corrupt(format!("state '{kind}' of device '{id}': {e}"))
            })?;
            state.entry(id).or_default().insert(kind, value);
        }
        for device in devices {
            page.devices.push(DeviceSummary {
                last_seen: last_seen.get(&device.id).copied().flatten(),
                state: state.remove(&device.id).unwrap_or_default(),
                device,
            });
        }
        Ok(page)
    }

    async fn delete_device(&self, id: &str) -> Result<bool> {
        let id = id.to_string();
        self.main
            .write(move |c| {
                Box::pin(async move {
                    for sql in [
                        "DELETE FROM device_events WHERE device_id = $1",
                        "DELETE FROM device_state WHERE device_id = $1",
                    ] {
                        c.execute(sql, &[&id]).await.map_err(db)?;
                    }
                    let n = c
                        .execute("DELETE FROM devices WHERE id = $1", &[&id])
                        .await
                        .map_err(db)?;
                    Ok(n > 0)
                })
            })
            .await
    }

    async fn device_state(&self, device_id: &str) -> Result<Map<String, Value>> {
        let client = self.reader().await?;
        let rows = client
            .query(
                "SELECT kind, json FROM device_state WHERE device_id = $1",
                &[&device_id],
            )
            .await
            .map_err(db)?;
        let mut out = Map::new();
        for row in rows {
            let kind: String = row.get(0);
            let text: String = row.get(1);
            let value = serde_json::from_str(&text).map_err(|e| {
                StoreError::Corrupt(format!("state '{kind}' of device '{device_id}': {e}"))
            })?;
            out.insert(kind, value);
        }
        out.sort_keys();
        Ok(out)
    }

    async fn device_events(
        &self,
        device_id: &str,
        event: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DeviceEvent>> {
        let client = self.reader().await?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = client
            .query(
                "SELECT seq, json FROM device_events WHERE device_id = $1 \
                 AND ($2::text IS NULL OR event = $2) ORDER BY seq DESC LIMIT $3",
                &[&device_id, &event, &limit],
            )
            .await
            .map_err(db)?;
        rows.iter()
            .map(|row| {
                let seq: i64 = row.get(0);
                let text: String = row.get(1);
                serde_json::from_str(&text)
                    .map_err(|e| StoreError::Corrupt(format!("device event {seq}: {e}")))
            })
            .collect()
    }
}

/// Stores device events: the SQLite backend's `store_events` (a replayed
/// event once, the latest of each kind as the device's state, each
/// device's last [`DEVICE_EVENTS_KEPT`] events kept). Part of a processed
/// batch's transaction.
pub(super) async fn store_events(c: &Conn, events: &[DeviceEvent]) -> Result<()> {
    let mut devices = std::collections::BTreeSet::new();
    for e in events {
        let seq = to_i64(e.seq);
        let event_json = encode("device event", e)?;
        let summary = encode("device state", &e.summary())?;
        c.execute(
            "INSERT INTO device_events (seq, device_id, event, received_at, json) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (seq) DO NOTHING",
            &[&seq, &e.device_id, &e.event, &e.received_at, &event_json],
        )
        .await
        .map_err(db)?;
        c.execute(
            "INSERT INTO device_state AS s (device_id, kind, seq, json) SELECT $1, $2, $3, $4 \
             WHERE (SELECT COUNT(*) FROM device_state WHERE device_id = $1) < $5 \
                OR EXISTS (SELECT 1 FROM device_state WHERE device_id = $1 AND kind = $2) \
             ON CONFLICT (device_id, kind) DO UPDATE SET seq = excluded.seq, json = excluded.json \
             WHERE excluded.seq >= s.seq",
            &[
                &e.device_id,
                &e.kind(),
                &seq,
                &summary,
                &(DEVICE_STATE_KINDS as i64),
            ],
        )
        .await
        .map_err(db)?;
        devices.insert(e.device_id.as_str());
    }
    for id in devices {
        c.execute(
            "DELETE FROM device_events WHERE device_id = $1 AND seq <= \
             (SELECT seq FROM device_events WHERE device_id = $1 \
              ORDER BY seq DESC LIMIT 1 OFFSET $2)",
            &[&id, &(DEVICE_EVENTS_KEPT as i64)],
        )
        .await
        .map_err(db)?;
    }
    Ok(())
}
