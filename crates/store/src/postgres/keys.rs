//! [`KeyStore`] on PostgreSQL: rows written through the main writer,
//! read from the pool.

use async_trait::async_trait;
use weft_model::apikey::ApiKey;

use super::schema::db;
use super::writer::param;
use super::PostgresStore;
use crate::{encode, KeyStore, Result, StoreError};

#[async_trait]
impl KeyStore for PostgresStore {
    async fn put_api_key(&self, key: &ApiKey) -> Result<bool> {
        let json = encode("api key", key)?;
        // `xmax = 0` only on a row this statement inserted.
        let row = self
            .main
            .query_one(
                "INSERT INTO api_keys (id, hash, json) VALUES ($1, $2, $3) \
                 ON CONFLICT (id) DO UPDATE SET hash = excluded.hash, json = excluded.json \
                 RETURNING xmax = 0",
                vec![param(key.id.clone()), param(key.hash.clone()), param(json)],
            )
            .await?;
        Ok(row.get(0))
    }

    async fn list_api_keys(&self) -> Result<Vec<ApiKey>> {
        let client = self.reader().await?;
        let rows = client
            .query("SELECT id, json FROM api_keys ORDER BY id", &[])
            .await
            .map_err(db)?;
        rows.iter()
            .map(|row| {
                let id: &str = row.get(0);
                let json: &str = row.get(1);
                serde_json::from_str(json)
                    .map_err(|e| StoreError::Corrupt(format!("api key {id:?}: {e}")))
            })
            .collect()
    }
}
