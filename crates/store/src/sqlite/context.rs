//! [`ContextStore`] on the main file: NGSI entities (keyed by tenant,
//! service path, id and type) and documents (keyed by kind, tenant and
//! id), each kept as the model's JSON with its creation order.

use async_trait::async_trait;
use rusqlite::Connection;

use super::history::queue_feed_states;
use super::outbox::log_changes;
use super::reader::position;
use super::{to_i64, Db, SqliteStore};
use crate::{
    ContextStore, DocumentKind, EntityRecord, HistoryStates, LoggedChange, NgsiDocument, Result,
};

#[async_trait]
impl ContextStore for SqliteStore {
    async fn put_entity(
        &self,
        record: EntityRecord,
        history: HistoryStates,
        change: Option<LoggedChange>,
    ) -> Result<()> {
        self.main
            .write(move |c| {
                put_entity(c, &record)?;
                log_changes(c, &change)?;
                queue_feed_states(history.as_bytes());
                Ok::<(), rusqlite::Error>(())
            })
            .await
    }

    async fn delete_entity(
        &self,
        tenant: &str,
        service_path: &str,
        id: &str,
        entity_type: &str,
        change: Option<LoggedChange>,
    ) -> Result<bool> {
        let key = [tenant, service_path, id, entity_type].map(str::to_string);
        self.main
            .write(move |c| {
                let existed = delete_entity(c, &key)?;
                log_changes(c, &change)?;
                Ok::<bool, rusqlite::Error>(existed)
            })
            .await
    }

    async fn load_entities(&self) -> Result<Vec<EntityRecord>> {
        self.main.read(load_entities).await
    }

    async fn load_entities_with_id(&self, tenant: &str, id: &str) -> Result<Vec<EntityRecord>> {
        let (tenant, id) = (tenant.to_string(), id.to_string());
        self.main
            .read(move |c| load_entities_with_id(c, &tenant, &id))
            .await
    }

    async fn put_document(&self, document: NgsiDocument) -> Result<()> {
        self.main.write(move |c| put_document(c, &document)).await
    }

    async fn delete_document(&self, kind: DocumentKind, tenant: &str, id: &str) -> Result<bool> {
        let key = [kind.as_str(), tenant, id].map(str::to_string);
        self.main.write(move |c| delete_document(c, &key)).await
    }

    async fn load_documents(&self, kind: DocumentKind) -> Result<Vec<NgsiDocument>> {
        self.main.read(move |c| load_documents(c, kind)).await
    }

    async fn merge_document(
        &self,
        kind: DocumentKind,
        tenant: &str,
        id: &str,
        merge: crate::DocumentMerge,
    ) -> Result<Option<NgsiDocument>> {
        let (tenant, id) = (tenant.to_string(), id.to_string());
        // The writer runs one write at a time: nothing comes between the
        // read and the write.
        self.main
            .write(move |c| -> Result<Option<NgsiDocument>> {
                let current = load_document(c, kind, &tenant, &id)?;
                match merge(current) {
                    Some(d) => {
                        put_document(c, &d).db()?;
                        Ok(Some(d))
                    }
                    None => Ok(None),
                }
            })
            .await
    }
}

/// One document, if stored.
fn load_document(
    conn: &Connection,
    kind: DocumentKind,
    tenant: &str,
    id: &str,
) -> Result<Option<NgsiDocument>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT service_path, created, json FROM ngsi_documents \
             WHERE kind = ?1 AND tenant = ?2 AND id = ?3",
        )
        .db()?;
    let mut rows = stmt.query((kind.as_str(), tenant, id)).db()?;
    match rows.next().db()? {
        Some(row) => Ok(Some(NgsiDocument {
            kind,
            tenant: tenant.to_string(),
            id: id.to_string(),
            service_path: row.get(0).db()?,
            created: position(row, 1)?,
            json: row.get(2).db()?,
        })),
        None => Ok(None),
    }
}

/// Creates or replaces an entity: an existing row is updated in place
/// (it keeps its place in the table; see the schema's step 19).
pub(super) fn put_entity(conn: &Connection, r: &EntityRecord) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO entities (tenant, service_path, id, type, created, json) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
         ON CONFLICT (tenant, service_path, id, type) \
         DO UPDATE SET created = excluded.created, json = excluded.json",
    )?
    .execute((
        &r.tenant,
        &r.service_path,
        &r.id,
        &r.entity_type,
        to_i64(r.created),
        &r.json,
    ))?;
    Ok(())
}

/// Deletes an entity (tenant, service path, id, type); answers "existed".
fn delete_entity(
    conn: &Connection,
    [tenant, path, id, entity_type]: &[String; 4],
) -> rusqlite::Result<bool> {
    conn.prepare_cached(
        "DELETE FROM entities WHERE tenant = ?1 AND service_path = ?2 AND id = ?3 AND type = ?4",
    )
    .and_then(|mut st| st.execute((tenant, path, id, entity_type)))
    .map(|n| n > 0)
}

/// Creates or replaces a document.
fn put_document(conn: &Connection, d: &NgsiDocument) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT OR REPLACE INTO ngsi_documents (kind, tenant, id, service_path, created, json) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )
    .and_then(|mut st| {
        st.execute((
            d.kind.as_str(),
            &d.tenant,
            &d.id,
            &d.service_path,
            d.created as i64,
            &d.json,
        ))
    })
    .map(|_| ())
}

/// Deletes a document (kind, tenant, id); answers "existed".
fn delete_document(conn: &Connection, [kind, tenant, id]: &[String; 3]) -> rusqlite::Result<bool> {
    conn.prepare_cached("DELETE FROM ngsi_documents WHERE kind = ?1 AND tenant = ?2 AND id = ?3")
        .and_then(|mut st| st.execute((kind, tenant, id)))
        .map(|n| n > 0)
}

/// Every entity, in creation order.
fn load_entities(conn: &Connection) -> Result<Vec<EntityRecord>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT tenant, service_path, id, type, created, json FROM entities ORDER BY created",
        )
        .db()?;
    let rows = stmt.query([]).db()?;
    entity_records(rows)
}

/// The entities of `tenant` with `id`, in creation order.
fn load_entities_with_id(conn: &Connection, tenant: &str, id: &str) -> Result<Vec<EntityRecord>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT tenant, service_path, id, type, created, json FROM entities \
             WHERE tenant = ?1 AND id = ?2 ORDER BY created",
        )
        .db()?;
    let rows = stmt.query(rusqlite::params![tenant, id]).db()?;
    entity_records(rows)
}

/// The records of `tenant, service_path, id, type, created, json` rows.
fn entity_records(mut rows: rusqlite::Rows<'_>) -> Result<Vec<EntityRecord>> {
    let mut out = Vec::new();
    while let Some(row) = rows.next().db()? {
        out.push(EntityRecord {
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

/// Every document of `kind`, in creation order.
fn load_documents(conn: &Connection, kind: DocumentKind) -> Result<Vec<NgsiDocument>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT tenant, id, service_path, created, json FROM ngsi_documents \
             WHERE kind = ?1 ORDER BY created",
        )
        .db()?;
    let mut rows = stmt.query([kind.as_str()]).db()?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().db()? {
        out.push(NgsiDocument {
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
