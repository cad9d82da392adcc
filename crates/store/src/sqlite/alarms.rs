//! [`RuleStore`] on the main file (schema step 7): rules, alarms, alarm
//! events and rule state, the writer's statements and the reads kept
//! together because they are only ever used by the rule engine and its
//! API.

use async_trait::async_trait;
use rusqlite::types::Value as SqlValue;
use rusqlite::{params_from_iter, Connection};

use super::reader::{max_seq, MAX_QUERY_ROWS};
use super::writer::in_savepoint;
use super::{to_i64, Db, SqliteStore};
use crate::{AlarmBatch, AlarmQuery, Result, RuleStateRecord, RuleStore};

#[async_trait]
impl RuleStore for SqliteStore {
    async fn put_rule(&self, id: &str, json: String) -> Result<bool> {
        let id = id.to_string();
        self.main.write(move |c| put_rule(c, &id, &json)).await
    }

    async fn delete_rule(&self, id: &str) -> Result<bool> {
        let id = id.to_string();
        self.main.write(move |c| delete_rule(c, &id)).await
    }

    async fn load_rules(&self) -> Result<Vec<(String, String)>> {
        self.main.read(load_rules).await
    }

    async fn load_rule_states(&self) -> Result<Vec<RuleStateRecord>> {
        self.main.read(load_rule_states).await
    }

    async fn commit_alarms(&self, batch: AlarmBatch) -> Result<u64> {
        self.main
            .write(move |c| in_savepoint(c, |c| commit_alarms(c, &batch)))
            .await
    }

    async fn get_alarm(&self, id: &str) -> Result<Option<String>> {
        let id = id.to_string();
        self.main.read(move |c| get_alarm(c, &id)).await
    }

    async fn query_alarms(&self, query: &AlarmQuery) -> Result<Vec<String>> {
        let query = query.clone();
        self.main.read(move |c| query_alarms(c, &query)).await
    }

    async fn active_alarms(&self) -> Result<Vec<String>> {
        self.main.read(active_alarms).await
    }

    async fn alarm_events_head(&self) -> Result<u64> {
        self.main.read(|c| max_seq(c, ALARM_EVENTS_HEAD)).await
    }

    async fn alarm_events(&self, after: u64, limit: usize) -> Result<Vec<(u64, String)>> {
        self.main.read(move |c| alarm_events(c, after, limit)).await
    }
}

/// Creates or replaces a rule; answers "created".
fn put_rule(conn: &Connection, id: &str, json: &str) -> rusqlite::Result<bool> {
    let existed = conn
        .prepare_cached("SELECT 1 FROM rules WHERE id = ?1")?
        .exists([id])?;
    conn.prepare_cached(
        "INSERT INTO rules (id, json) VALUES (?1, ?2) \
         ON CONFLICT (id) DO UPDATE SET json = excluded.json",
    )?
    .execute((id, json))?;
    Ok(!existed)
}

/// Deletes a rule and its per-device state; answers "existed".
fn delete_rule(conn: &Connection, id: &str) -> rusqlite::Result<bool> {
    conn.prepare_cached("DELETE FROM rule_states WHERE rule = ?1")?
        .execute([id])?;
    Ok(conn
        .prepare_cached("DELETE FROM rules WHERE id = ?1")?
        .execute([id])?
        > 0)
}

/// Stores one evaluation step: alarms (only over older versions), events,
/// rule states and the cursor. Answers the `seq` of the last event.
fn commit_alarms(conn: &Connection, batch: &AlarmBatch) -> rusqlite::Result<u64> {
    if !batch.alarms.is_empty() {
        let mut stmt = conn.prepare_cached(
            "INSERT INTO alarms (id, device, type, state, acked, severity, raised_at, version, json) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) \
             ON CONFLICT (id) DO UPDATE SET state = excluded.state, acked = excluded.acked, \
                 severity = excluded.severity, version = excluded.version, json = excluded.json \
             WHERE excluded.version > alarms.version",
        )?;
        for a in &batch.alarms {
            stmt.execute((
                &a.id,
                &a.device,
                &a.alarm_type,
                &a.state,
                a.acked,
                &a.severity,
                a.raised_at,
                to_i64(a.version),
                &a.json,
            ))?;
        }
    }
    let mut last = 0;
    if !batch.events.is_empty() {
        let mut stmt = conn.prepare_cached("INSERT INTO alarm_events (json) VALUES (?1)")?;
        for e in &batch.events {
            last = stmt.insert([e])? as u64;
        }
    }
    if !batch.states.is_empty() {
        let mut put = conn.prepare_cached(
            "INSERT INTO rule_states (rule, device, json) VALUES (?1, ?2, ?3) \
             ON CONFLICT (rule, device) DO UPDATE SET json = excluded.json",
        )?;
        let mut delete =
            conn.prepare_cached("DELETE FROM rule_states WHERE rule = ?1 AND device = ?2")?;
        for s in &batch.states {
            match &s.json {
                Some(json) => put.execute((&s.rule, &s.device, json))?,
                None => delete.execute((&s.rule, &s.device))?,
            };
        }
    }
    for (name, next) in &batch.cursors {
        conn.prepare_cached(
            "INSERT INTO cursors (name, next_seq) VALUES (?1, ?2) \
             ON CONFLICT (name) DO UPDATE SET next_seq = excluded.next_seq",
        )?
        .execute((name, to_i64(*next)))?;
    }
    Ok(last)
}

/// Every rule as `(id, json)`, by id.
fn load_rules(conn: &Connection) -> Result<Vec<(String, String)>> {
    let mut stmt = conn
        .prepare_cached("SELECT id, json FROM rules ORDER BY id")
        .db()?;
    let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).db()?;
    rows.collect::<rusqlite::Result<_>>().db()
}

/// Every stored rule state.
fn load_rule_states(conn: &Connection) -> Result<Vec<RuleStateRecord>> {
    let mut stmt = conn
        .prepare_cached("SELECT rule, device, json FROM rule_states")
        .db()?;
    let rows = stmt
        .query_map([], |r| {
            Ok(RuleStateRecord {
                rule: r.get(0)?,
                device: r.get(1)?,
                json: Some(r.get(2)?),
            })
        })
        .db()?;
    rows.collect::<rusqlite::Result<_>>().db()
}

/// One alarm's JSON.
fn get_alarm(conn: &Connection, id: &str) -> Result<Option<String>> {
    use rusqlite::OptionalExtension;
    conn.prepare_cached("SELECT json FROM alarms WHERE id = ?1")
        .db()?
        .query_row([id], |r| r.get(0))
        .optional()
        .db()
}

/// Alarms matching `query`, newest first (JSON).
fn query_alarms(conn: &Connection, query: &AlarmQuery) -> Result<Vec<String>> {
    let mut sql = String::from("SELECT json FROM alarms WHERE 1 = 1");
    let mut args: Vec<SqlValue> = Vec::new();
    let mut filter = |column: &str, value: SqlValue| {
        args.push(value);
        sql.push_str(&format!(" AND {column} = ?{}", args.len()));
    };
    if let Some(v) = &query.state {
        filter("state", SqlValue::Text(v.clone()));
    }
    if let Some(v) = query.acked {
        filter("acked", SqlValue::Integer(v as i64));
    }
    if let Some(v) = &query.severity {
        filter("severity", SqlValue::Text(v.clone()));
    }
    if let Some(v) = &query.device {
        filter("device", SqlValue::Text(v.clone()));
    }
    if let Some(v) = &query.alarm_type {
        filter("type", SqlValue::Text(v.clone()));
    }
    let limit = query.limit.min(MAX_QUERY_ROWS);
    sql.push_str(&format!(
        " ORDER BY raised_at DESC, id LIMIT {limit} OFFSET {}",
        query.offset
    ));
    let mut stmt = conn.prepare_cached(&sql).db()?;
    let rows = stmt.query_map(params_from_iter(args), |r| r.get(0)).db()?;
    rows.collect::<rusqlite::Result<_>>().db()
}

/// Every active alarm (JSON), however many: the rule engine's index.
fn active_alarms(conn: &Connection) -> Result<Vec<String>> {
    let mut stmt = conn
        .prepare_cached("SELECT json FROM alarms WHERE state = 'active'")
        .db()?;
    let rows = stmt.query_map([], |r| r.get(0)).db()?;
    rows.collect::<rusqlite::Result<_>>().db()
}

/// Alarm events after `after`, oldest first, at most `limit`.
fn alarm_events(conn: &Connection, after: u64, limit: usize) -> Result<Vec<(u64, String)>> {
    let mut stmt = conn
        .prepare_cached("SELECT seq, json FROM alarm_events WHERE seq > ?1 ORDER BY seq LIMIT ?2")
        .db()?;
    let rows = stmt
        .query_map((to_i64(after), limit.min(MAX_QUERY_ROWS) as i64), |r| {
            Ok((r.get::<_, i64>(0)? as u64, r.get(1)?))
        })
        .db()?;
    rows.collect::<rusqlite::Result<_>>().db()
}

/// The newest alarm event's `seq` (0: none).
const ALARM_EVENTS_HEAD: &str = "SELECT COALESCE(MAX(seq), 0) FROM alarm_events";
