//! Device types and devices on PostgreSQL: configuration rows written
//! through the main writer, read from the pool.

use async_trait::async_trait;
use weft_model::{Device, DeviceType};

use super::schema::db;
use super::writer::param;
use super::PostgresStore;
use crate::{encode, record_text, CatalogStore, DeviceFilter, Result, StoreError};

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

    async fn delete_device(&self, id: &str) -> Result<bool> {
        let n = self
            .main
            .execute(
                "DELETE FROM devices WHERE id = $1",
                vec![param(id.to_string())],
            )
            .await?;
        Ok(n > 0)
    }
}
