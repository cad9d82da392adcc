//! Rules, rule state, alarms and alarm events on PostgreSQL: the SQLite
//! backend's `sqlite/alarms.rs` in PostgreSQL's dialect. Writes go through
//! the main writer (as they go to SQLite's main file), which also hands
//! out the alarm events' `seq`s, so events commit in `seq` order for the
//! consumers of [`RuleStore::alarm_events`].

use std::collections::HashMap;

use async_trait::async_trait;
use tokio_postgres::types::ToSql;

use super::context::MainLog;
use super::schema::db;
use super::writer::param;
use super::MAX_QUERY_ROWS;
use super::{to_i64, PostgresStore};
use crate::{AlarmBatch, AlarmQuery, AlarmRecord, Result, RuleStateRecord, RuleStore};

/// The alarms of a batch as one upsert can take them: one per id, as
/// SQLite's one-by-one upserts leave it (one `INSERT … ON CONFLICT DO
/// UPDATE` may not touch a row twice). Each upsert replaces only a lower
/// version, and only the columns an update sets: so per id the first
/// record's device, type and raising time, with the state, ack, severity,
/// version and JSON of the first record holding the highest version.
fn newest_alarms(alarms: &[AlarmRecord]) -> Vec<AlarmRecord> {
    let mut index: HashMap<&str, usize> = HashMap::new();
    let mut out: Vec<AlarmRecord> = Vec::new();
    for a in alarms {
        match index.get(a.id.as_str()) {
            Some(&i) => {
                let kept = &mut out[i];
                if a.version > kept.version {
                    kept.state.clone_from(&a.state);
                    kept.acked = a.acked;
                    kept.severity.clone_from(&a.severity);
                    kept.version = a.version;
                    kept.json.clone_from(&a.json);
                }
            }
            None => {
                index.insert(&a.id, out.len());
                out.push(a.clone());
            }
        }
    }
    out
}

/// The rule states of a batch, the last one per (rule, device): what
/// applying them in order leaves.
fn last_states(states: &[RuleStateRecord]) -> Vec<&RuleStateRecord> {
    let mut index: HashMap<(&str, &str), usize> = HashMap::new();
    let mut out: Vec<&RuleStateRecord> = Vec::new();
    for s in states {
        match index.get(&(s.rule.as_str(), s.device.as_str())) {
            Some(&i) => out[i] = s,
            None => {
                index.insert((&s.rule, &s.device), out.len());
                out.push(s);
            }
        }
    }
    out
}

/// Stores one evaluation step (see [`RuleStore::commit_alarms`]), inside
/// the writer's savepoint so all of it or none commits. Answers the `seq`
/// of the last event (0: none).
async fn commit_alarms(c: &tokio_postgres::Client, batch: &AlarmBatch) -> Result<u64> {
    if !batch.alarms.is_empty() {
        let alarms = newest_alarms(&batch.alarms);
        let ids: Vec<&str> = alarms.iter().map(|a| a.id.as_str()).collect();
        let devices: Vec<&str> = alarms.iter().map(|a| a.device.as_str()).collect();
        let types: Vec<&str> = alarms.iter().map(|a| a.alarm_type.as_str()).collect();
        let states: Vec<&str> = alarms.iter().map(|a| a.state.as_str()).collect();
        let acked: Vec<bool> = alarms.iter().map(|a| a.acked).collect();
        let severities: Vec<&str> = alarms.iter().map(|a| a.severity.as_str()).collect();
        let raised: Vec<i64> = alarms.iter().map(|a| a.raised_at).collect();
        let versions: Vec<i64> = alarms.iter().map(|a| to_i64(a.version)).collect();
        let jsons: Vec<&str> = alarms.iter().map(|a| a.json.as_str()).collect();
        c.execute(
            "INSERT INTO alarms (id, device, type, state, acked, severity, raised_at, version, json) \
             SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::bool[], \
                                  $6::text[], $7::int8[], $8::int8[], $9::text[]) \
             ON CONFLICT (id) DO UPDATE SET state = excluded.state, acked = excluded.acked, \
                 severity = excluded.severity, version = excluded.version, json = excluded.json \
             WHERE excluded.version > alarms.version",
            &[
                &ids,
                &devices,
                &types,
                &states,
                &acked,
                &severities,
                &raised,
                &versions,
                &jsons,
            ],
        )
        .await
        .map_err(db)?;
    }
    let mut last = 0;
    if !batch.events.is_empty() {
        // Identities are drawn in the order the rows reach the insert:
        // the events' order, by their ordinality.
        let rows = c
            .query(
                "INSERT INTO alarm_events (json) \
                 SELECT json FROM UNNEST($1::text[]) WITH ORDINALITY AS e(json, n) ORDER BY n \
                 RETURNING seq",
                &[&batch.events],
            )
            .await
            .map_err(db)?;
        last = rows.iter().map(|r| r.get::<_, i64>(0)).max().unwrap_or(0) as u64;
    }
    if !batch.states.is_empty() {
        let states = last_states(&batch.states);
        let (puts, deletes): (Vec<_>, Vec<_>) = states.into_iter().partition(|s| s.json.is_some());
        if !puts.is_empty() {
            let rules: Vec<&str> = puts.iter().map(|s| s.rule.as_str()).collect();
            let devices: Vec<&str> = puts.iter().map(|s| s.device.as_str()).collect();
            let jsons: Vec<&str> = puts.iter().filter_map(|s| s.json.as_deref()).collect();
            c.execute(
                "INSERT INTO rule_states (rule, device, json) \
                 SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[]) \
                 ON CONFLICT (rule, device) DO UPDATE SET json = excluded.json",
                &[&rules, &devices, &jsons],
            )
            .await
            .map_err(db)?;
        }
        if !deletes.is_empty() {
            let rules: Vec<&str> = deletes.iter().map(|s| s.rule.as_str()).collect();
            let devices: Vec<&str> = deletes.iter().map(|s| s.device.as_str()).collect();
            c.execute(
                "DELETE FROM rule_states WHERE (rule, device) IN \
                 (SELECT * FROM UNNEST($1::text[], $2::text[]))",
                &[&rules, &devices],
            )
            .await
            .map_err(db)?;
        }
    }
    for (name, next) in &batch.cursors {
        c.execute(
            "INSERT INTO cursors (name, next_seq) VALUES ($1, $2) \
             ON CONFLICT (name) DO UPDATE SET next_seq = excluded.next_seq",
            &[name, &to_i64(*next)],
        )
        .await
        .map_err(db)?;
    }
    Ok(last)
}

#[async_trait]
impl RuleStore for PostgresStore {
    async fn put_rule(&self, id: &str, json: String) -> Result<bool> {
        // The CTE reads the table as it was before the upsert.
        let row = self
            .main
            .query_one(
                "WITH old AS (SELECT 1 FROM rules WHERE id = $1), \
                 put AS (INSERT INTO rules (id, json) VALUES ($1, $2) \
                     ON CONFLICT (id) DO UPDATE SET json = excluded.json) \
                 SELECT NOT EXISTS (SELECT 1 FROM old)",
                vec![param(id.to_string()), param(json)],
            )
            .await?;
        Ok(row.get(0))
    }

    async fn delete_rule(&self, id: &str) -> Result<bool> {
        let id = id.to_string();
        self.main
            .write(move |c| {
                Box::pin(async move {
                    c.execute("DELETE FROM rule_states WHERE rule = $1", &[&id])
                        .await
                        .map_err(db)?;
                    let n = c
                        .execute("DELETE FROM rules WHERE id = $1", &[&id])
                        .await
                        .map_err(db)?;
                    Ok(n > 0)
                })
            })
            .await
    }

    async fn load_rules(&self) -> Result<Vec<(String, String)>> {
        let client = self.reader().await?;
        // `COLLATE "C"`: byte order, as SQLite's (and Rust's) string order,
        // whatever the database's collation.
        let rows = client
            .query("SELECT id, json FROM rules ORDER BY id COLLATE \"C\"", &[])
            .await
            .map_err(db)?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    async fn load_rule_states(&self) -> Result<Vec<RuleStateRecord>> {
        let client = self.reader().await?;
        let rows = client
            .query("SELECT rule, device, json FROM rule_states", &[])
            .await
            .map_err(db)?;
        Ok(rows
            .iter()
            .map(|r| RuleStateRecord {
                rule: r.get(0),
                device: r.get(1),
                json: Some(r.get(2)),
            })
            .collect())
    }

    async fn commit_alarms(&self, batch: AlarmBatch) -> Result<u64> {
        self.main
            .write(move |c| Box::pin(async move { commit_alarms(c, &batch).await }))
            .await
    }

    async fn get_alarm(&self, id: &str) -> Result<Option<String>> {
        let client = self.reader().await?;
        let row = client
            .query_opt("SELECT json FROM alarms WHERE id = $1", &[&id])
            .await
            .map_err(db)?;
        Ok(row.map(|r| r.get(0)))
    }

    async fn query_alarms(&self, query: &AlarmQuery) -> Result<Vec<String>> {
        let mut sql = String::from("SELECT json FROM alarms WHERE TRUE");
        let mut args: Vec<&(dyn ToSql + Sync)> = Vec::new();
        let filters: [(&str, Option<&(dyn ToSql + Sync)>); 5] = [
            ("state", query.state.as_ref().map(|v| v as _)),
            ("acked", query.acked.as_ref().map(|v| v as _)),
            ("severity", query.severity.as_ref().map(|v| v as _)),
            ("device", query.device.as_ref().map(|v| v as _)),
            ("type", query.alarm_type.as_ref().map(|v| v as _)),
        ];
        for (column, value) in filters {
            if let Some(value) = value {
                args.push(value);
                sql.push_str(&format!(" AND {column} = ${}", args.len()));
            }
        }
        let limit = query.limit.min(MAX_QUERY_ROWS);
        let offset = i64::try_from(query.offset).unwrap_or(i64::MAX);
        sql.push_str(&format!(
            " ORDER BY raised_at DESC, id COLLATE \"C\" LIMIT {limit} OFFSET {offset}"
        ));
        let client = self.reader().await?;
        let rows = client.query(&sql, &args).await.map_err(db)?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    async fn active_alarms(&self) -> Result<Vec<String>> {
        let client = self.reader().await?;
        let rows = client
            .query("SELECT json FROM alarms WHERE state = 'active'", &[])
            .await
            .map_err(db)?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    /// The newest event below the horizon (see `alarm_events`).
    async fn alarm_events_head(&self) -> Result<u64> {
        let through = self.main_horizon(MainLog::AlarmEvents).await;
        let client = self.reader().await?;
        let row = client
            .query_one(
                "SELECT COALESCE(MAX(seq), 0) FROM alarm_events WHERE seq <= $1",
                &[&to_i64(through)],
            )
            .await
            .map_err(db)?;
        Ok(row.get::<_, i64>(0) as u64)
    }

    /// Reads no further than the events' horizon: a bridge reading
    /// forward never passes an event another node commits later.
    async fn alarm_events(&self, after: u64, limit: usize) -> Result<Vec<(u64, String)>> {
        let through = self.main_horizon(MainLog::AlarmEvents).await;
        let client = self.reader().await?;
        let limit = limit.min(MAX_QUERY_ROWS) as i64;
        let rows = client
            .query(
                "SELECT seq, json FROM alarm_events WHERE seq > $1 AND seq <= $3 \
                 ORDER BY seq LIMIT $2",
                &[&to_i64(after), &limit, &to_i64(through)],
            )
            .await
            .map_err(db)?;
        Ok(rows
            .iter()
            .map(|r| (r.get::<_, i64>(0) as u64, r.get(1)))
            .collect())
    }
}
