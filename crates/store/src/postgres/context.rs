//! NGSI entities and the documents kept beside them (subscriptions,
//! registrations) on PostgreSQL, written through the main writer. An
//! entity change queues its history rows in the changes feed and logs
//! itself in the change log (when given) in the same transaction, so a
//! change is never stored without its history, nor without what it owes
//! the subscriptions.

use async_trait::async_trait;

/// The logs the main writer appends to that readers follow forward: data
/// units (rule lanes catching up, bridges), alarm events (bridges) and the
/// history's changes feed (its movers, per partition). Every node's main
/// writer appends side by side; readers read each only up to its horizon
/// (`postgres/horizon.rs`), so none passes an entry that commits late.
///
/// A node's main writer connection is named for good, like the ingest
/// log's writer. Writers and looks take the lock older versions of weft
/// took exclusively around every transaction of their main writer
/// (8603115516262213735, "weft_chg"), shared: while a cluster is being
/// upgraded, an older node's transactions are never in flight beside a
/// look. Looked at only when a reader asks: nothing follows these logs
/// closely enough to look every few milliseconds.
pub(super) const MAIN: Followed = followed! {
    name: "main writer's logs",
    writer: "weft main writer",
    lock: 8603115516262213735,
    tables: ["data_units", "alarm_events", "history_feed"],
    on_demand: true
};

/// Which of [`MAIN`]'s sequences a horizon's `seq` is of.
#[derive(Debug, Clone, Copy)]
pub(super) enum MainLog {
    /// `data_units.seq`.
    Units = 0,
    /// `alarm_events.seq`.
    AlarmEvents = 1,
    /// `history_feed.seq` (the changes feed's entries among others).
    ChangesFeed = 2,
}

use std::collections::HashMap;

use futures::future::BoxFuture;

use super::combine::Combine;
use super::conn::Conn;
use super::history::feed_name;
use super::horizon::{followed, Followed};
use super::outbox::log_changes;
use super::schema::db;
use super::writer::param;
use super::{position, to_i64, PostgresStore};
use crate::history::split_feed_entry;
use crate::{
    ContextStore, DocumentKind, EntityRecord, HistoryFeed, HistoryStates, HistoryStore,
    LoggedChange, NgsiDocument, Result,
};

/// An NGSI entity write (`put_entity`): the entity, the history rows it
/// queues and its change-log entry. Writes that wait together go out as
/// three statements for all of them (`postgres/combine.rs`), instead of a
/// round trip each.
pub(super) struct EntityPut {
    record: EntityRecord,
    history: HistoryStates,
    change: Option<LoggedChange>,
    /// The changes feed's partitions ([`HistoryStore::change_feed_partitions`]).
    partitions: u16,
}

impl Combine for EntityPut {
    type Item = EntityPut;
    type Answer = ();

    fn write_many<'c>(c: &'c Conn, puts: &'c [EntityPut]) -> BoxFuture<'c, Result<Vec<()>>> {
        Box::pin(async move {
            // One row per entity, its last state: an upsert may not touch a
            // row twice, and the last write of an entity is what it is
            // after all of them, as if they had gone one by one.
            let mut last: HashMap<(&str, &str, &str, &str), &EntityRecord> = HashMap::new();
            for put in puts {
                let r = &put.record;
                last.insert((&r.tenant, &r.service_path, &r.id, &r.entity_type), r);
            }
            let records: Vec<EntityRecord> = last.into_values().cloned().collect();
            let changes: Vec<LoggedChange> = puts.iter().filter_map(|p| p.change.clone()).collect();
            // The puts' states, already in the feed's compact form.
            let history = HistoryStates::entry(puts.iter().map(|p| &p.history));
            // Sent together on the one connection (pipelined).
            let (entities, logged, queued) = tokio::join!(
                put_entities(c, &records),
                log_changes(c, &changes),
                queue_changes(c, &history, partitions_of(puts)),
            );
            entities.and(logged).and(queued)?;
            Ok(vec![(); puts.len()])
        })
    }

    fn write_one<'c>(c: &'c Conn, put: &'c EntityPut) -> BoxFuture<'c, Result<()>> {
        Box::pin(async move {
            let entry = HistoryStates::entry([&put.history]);
            let (entity, logged, queued) = tokio::join!(
                put_entities(c, std::slice::from_ref(&put.record)),
                log_changes(c, put.change.as_slice()),
                queue_changes(c, &entry, put.partitions),
            );
            entity.and(logged).and(queued)
        })
    }
}

#[async_trait]
impl ContextStore for PostgresStore {
    async fn put_entity(
        &self,
        record: EntityRecord,
        history: HistoryStates,
        change: Option<LoggedChange>,
    ) -> Result<()> {
        let put = EntityPut {
            record,
            history,
            change,
            partitions: self.change_feed_partitions(),
        };
        self.entity_puts.write(&self.main, put).await
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
        // After the entity writes waiting now, before any later one.
        self.entity_puts.seal();
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
        rows.iter().map(entity_record).collect()
    }

    async fn load_entities_with_id(&self, tenant: &str, id: &str) -> Result<Vec<EntityRecord>> {
        let client = self.reader().await?;
        let rows = client
            .query(
                "SELECT tenant, service_path, id, type, created, json FROM entities \
                 WHERE tenant = $1 AND id = $2 ORDER BY created",
                &[&tenant, &id],
            )
            .await
            .map_err(db)?;
        rows.iter().map(entity_record).collect()
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
        // The row is locked until the commit: another node's merge of the
        // same document waits for this one, then reads what it stored.
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
    // In the order of their keys: every node's writes lock the rows they
    // upsert in the same order, so two nodes writing the same entities at
    // once wait for one another instead of deadlocking.
    let mut records: Vec<&EntityRecord> = records.iter().collect();
    records.sort_unstable_by(|a, b| {
        (&a.tenant, &a.service_path, &a.id, &a.entity_type).cmp(&(
            &b.tenant,
            &b.service_path,
            &b.id,
            &b.entity_type,
        ))
    });
    let column = |f: fn(&EntityRecord) -> &str| records.iter().map(|r| f(r)).collect::<Vec<&str>>();
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

/// The changes feed's partitions, as the puts written together know them.
fn partitions_of(puts: &[EntityPut]) -> u16 {
    puts.first().map_or(1, |p| p.partitions)
}

/// Queues the history states of entity changes in the changes feed: a
/// change set's entry in the compact form
/// ([`crate::history::encode_feed_entry`]) split into one entry per
/// partition its entities fall in (`partitions`), in one statement
/// (nothing for an entry without states).
pub(super) async fn queue_changes(c: &Conn, entry: &[u8], partitions: u16) -> Result<()> {
    if entry.len() <= 1 {
        return Ok(());
    }
    let split = split_feed_entry(entry, partitions).ok_or_else(|| {
        crate::StoreError::Corrupt("a history entry to queue is not decodable".into())
    })?;
    let (parts, states): (Vec<i16>, Vec<Vec<u8>>) = split
        .into_iter()
        .map(|(part, states)| (part as i16, states))
        .unzip();
    c.execute(
        "INSERT INTO history_feed (feed, part, states) \
         SELECT $1, p, s FROM UNNEST($2::SMALLINT[], $3::BYTEA[]) AS u(p, s)",
        &[&feed_name(HistoryFeed::Changes), &parts, &states],
    )
    .await
    .map_err(db)?;
    Ok(())
}

/// An entity's record from a `tenant, service_path, id, type, created,
/// json` row.
fn entity_record(row: &tokio_postgres::Row) -> Result<EntityRecord> {
    Ok(EntityRecord {
        tenant: row.get(0),
        service_path: row.get(1),
        id: row.get(2),
        entity_type: row.get(3),
        created: position(row, 4)?,
        json: row.get(5),
    })
}
