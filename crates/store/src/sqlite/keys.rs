//! [`KeyStore`] on the main file: one row per key, its record as JSON
//! beside the hash it is looked up by.

use async_trait::async_trait;
use rusqlite::Connection;
use weft_model::apikey::ApiKey;

use super::reader::corrupt;
use super::{encode, Db, SqliteStore};
use crate::{KeyStore, Result};

#[async_trait]
impl KeyStore for SqliteStore {
    async fn put_api_key(&self, key: &ApiKey) -> Result<bool> {
        let json = encode("api key", key)?;
        let (id, hash) = (key.id.clone(), key.hash.clone());
        self.main
            .write(move |c| put_key(c, &id, &hash, &json))
            .await
    }

    async fn list_api_keys(&self) -> Result<Vec<ApiKey>> {
        self.main.read(list_keys).await
    }
}

/// Creates or replaces by id; a second id with the same hash fails
/// (`INSERT OR IGNORE` would swallow that conflict too). The single writer
/// makes the look-up and the upsert atomic.
fn put_key(conn: &Connection, id: &str, hash: &str, json: &str) -> rusqlite::Result<bool> {
    let existed = conn
        .prepare_cached("SELECT 1 FROM api_keys WHERE id = ?1")?
        .exists([id])?;
    conn.prepare_cached(
        "INSERT INTO api_keys (id, hash, json) VALUES (?1, ?2, ?3) \
         ON CONFLICT (id) DO UPDATE SET hash = excluded.hash, json = excluded.json",
    )?
    .execute((id, hash, json))?;
    Ok(!existed)
}

fn list_keys(conn: &Connection) -> Result<Vec<ApiKey>> {
    let mut stmt = conn
        .prepare_cached("SELECT id, json FROM api_keys ORDER BY id")
        .db()?;
    let mut rows = stmt.query([]).db()?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().db()? {
        let id: String = row.get(0).db()?;
        let json: String = row.get(1).db()?;
        out.push(serde_json::from_str(&json).map_err(|e| corrupt(&format!("api key {id:?}"), e))?);
    }
    Ok(out)
}
