//! NGSI entities and the documents kept beside them (subscriptions,
//! registrations) on PostgreSQL, written through the main writer. An
//! entity change queues its history rows in the changes feed and logs
//! itself in the change log (when given) in the same transaction, so a
//! change is never stored without its history, nor without what it owes
//! the subscriptions.

use async_trait::async_trait;

/// Opens every transaction of the main writer, which queues the changes
/// feed: a lock held until the commit, taken by every node's main writer,
/// so feed entries become visible in `seq` order across the cluster and
/// the history's mover, reading forward from its cursor, never passes one
/// that commits later (any constant unique to weft: "weft_chg").
pub(super) const SERIAL_CHANGES: &str = "SELECT pg_advisory_xact_lock(8603115516262213735)";

use super::conn::Conn;
use super::history::feed_name;
use super::outbox::log_changes;
use super::schema::db;
use super::writer::param;
use super::{position, to_i64, PostgresStore};
use crate::{
    ContextStore, DocumentKind, EntityRecord, HistoryFeed, HistoryRow, HistoryStates, LoggedChange,
    NgsiDocument, Result,
};

#[async_trait]
impl ContextStore for PostgresStore {
    async fn put_entity(
        &self,
        record: EntityRecord,
        history: HistoryStates,
        change: Option<LoggedChange>,
    ) -> Result<()> {
        let history = history.rows();
        self.main
            .write(move |c| {
                Box::pin(async move {
                    // Sent together on the one connection (pipelined): one
                    // round trip for the three instead of one each.
                    let (entity, logged, queued) = tokio::join!(
                        put_entities(c, std::slice::from_ref(&record)),
                        log_changes(c, change.as_slice()),
                        queue_changes(c, &history),
                    );
                    entity.and(logged).and(queued)
                })
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
                Box::pin(async move {
                    let [tenant, service_path, id, entity_type] = &key;
                    let n = c
                        .execute(
                            "DELETE FROM entities \
                             WHERE tenant = $1 AND service_path = $2 AND id = $3 AND type = $4",
                            &[tenant, service_path, id, entity_type],
                        )
                        .await
                        .map_err(db)?;
                    log_changes(c, change.as_slice()).await?;
                    Ok(n > 0)
                })
            })
            .await
    }

    async fn load_entities(&self) -> Result<Vec<EntityRecord>> {
        let client = self.reader().await?;
        let rows = client
            .query(
                "SELECT tenant, service_path, id, type, created, json FROM entities \
                 ORDER BY created",
                &[],
            )
            .await
            .map_err(db)?;
        rows.iter()
            .map(|row| {
                Ok(EntityRecord {
                    tenant: row.get(0),
                    service_path: row.get(1),
                    id: row.get(2),
                    entity_type: row.get(3),
                    created: position(row, 4)?,
                    json: row.get(5),
                })
            })
            .collect()
    }

    async fn put_document(&self, document: NgsiDocument) -> Result<()> {
        let d = document;
        self.main
            .execute(
                "INSERT INTO ngsi_documents (kind, tenant, id, service_path, created, json) \
                 VALUES ($1, $2, $3, $4, $5, $6) \
                 ON CONFLICT (kind, tenant, id) DO UPDATE SET \
                   service_path = excluded.service_path, created = excluded.created, \
                   json = excluded.json",
                vec![
                    param(d.kind.as_str()),
                    param(d.tenant),
                    param(d.id),
                    param(d.service_path),
                    param(to_i64(d.created)),
                    param(d.json),
                ],
            )
            .await?;
        Ok(())
    }

    async fn merge_document(
        &self,
        kind: DocumentKind,
        tenant: &str,
        id: &str,
        merge: crate::DocumentMerge,
    ) -> Result<Option<NgsiDocument>> {
        let (tenant, id) = (tenant.to_string(), id.to_string());
        // The main writer's transactions are serialised across nodes (see
        // `SERIAL_CHANGES`), and the row is locked besides.
        self.main
            .write(move |c| {
                Box::pin(async move {
                    let row = c
                        .query_opt(
                            "SELECT service_path, created, json FROM ngsi_documents \
                             WHERE kind = $1 AND tenant = $2 AND id = $3 FOR UPDATE",
                            &[&kind.as_str(), &tenant, &id],
                        )
                        .await
                        .map_err(db)?;
                    let current = row.map(|row| NgsiDocument {
                        kind,
                        tenant: tenant.clone(),
                        id: id.clone(),
                        service_path: row.get(0),
                        created: u64::try_from(row.get::<_, i64>(1)).unwrap_or(0),
                        json: row.get(2),
                    });
                    let Some(d) = merge(current) else {
                        return Ok(None);
                    };
                    c.execute(
                        "INSERT INTO ngsi_documents (kind, tenant, id, service_path, created, json) \
                         VALUES ($1, $2, $3, $4, $5, $6) \
                         ON CONFLICT (kind, tenant, id) DO UPDATE SET \
                           service_path = excluded.service_path, created = excluded.created, \
                           json = excluded.json",
                        &[
                            &d.kind.as_str(),
                            &d.tenant,
                            &d.id,
                            &d.service_path,
                            &to_i64(d.created),
                            &d.json,
                        ],
                    )
                    .await
                    .map_err(db)?;
                    Ok(Some(d))
                })
            })
            .await
    }

    async fn delete_document(&self, kind: DocumentKind, tenant: &str, id: &str) -> Result<bool> {
        let n = self
            .main
            .execute(
                "DELETE FROM ngsi_documents WHERE kind = $1 AND tenant = $2 AND id = $3",
                vec![
                    param(kind.as_str()),
                    param(tenant.to_string()),
                    param(id.to_string()),
                ],
            )
            .await?;
        Ok(n > 0)
    }

    async fn load_documents(&self, kind: DocumentKind) -> Result<Vec<NgsiDocument>> {
        let client = self.reader().await?;
        let rows = client
            .query(
                "SELECT tenant, id, service_path, created, json FROM ngsi_documents \
                 WHERE kind = $1 ORDER BY created",
                &[&kind.as_str()],
            )
            .await
            .map_err(db)?;
        rows.iter()
            .map(|row| {
                Ok(NgsiDocument {
                    kind,
                    tenant: row.get(0),
                    id: row.get(1),
                    service_path: row.get(2),
                    created: position(row, 3)?,
                    json: row.get(4),
                })
            })
            .collect()
    }
}

/// Creates or replaces entities, in one statement over arrays.
pub(super) async fn put_entities(c: &Conn, records: &[EntityRecord]) -> Result<()> {
    if records.is_empty() {
        return Ok(());
    }
    let column = |f: fn(&EntityRecord) -> &str| records.iter().map(f).collect::<Vec<&str>>();
    let created: Vec<i64> = records.iter().map(|r| to_i64(r.created)).collect();
    c.execute(
        "INSERT INTO entities (tenant, service_path, id, type, created, json) \
         SELECT * FROM UNNEST($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::TEXT[], $5::BIGINT[], \
                              $6::TEXT[]) \
         ON CONFLICT (tenant, service_path, id, type) DO UPDATE SET \
           created = excluded.created, json = excluded.json",
        &[
            &column(|r| &r.tenant),
            &column(|r| &r.service_path),
            &column(|r| &r.id),
            &column(|r| &r.entity_type),
            &created,
            &column(|r| &r.json),
        ],
    )
    .await
    .map_err(db)?;
    Ok(())
}

/// Queues the history rows of entity changes in the changes feed (nothing
/// for none), as one JSON array per change set.
pub(super) async fn queue_changes(c: &Conn, rows: &[HistoryRow]) -> Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let json = crate::encode("history rows", rows)?;
    c.execute(
        "INSERT INTO history_feed (feed, rows) VALUES ($1, $2)",
        &[&feed_name(HistoryFeed::Changes), &json],
    )
    .await
    .map_err(db)?;
    Ok(())
}
