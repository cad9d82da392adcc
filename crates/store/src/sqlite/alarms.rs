//! The SQL of rules, alarms, alarm events and rule state (schema step 7,
//! main file): the writer's statements and the reads, kept together
//! because they are only ever used by the rule engine and its API.

use rusqlite::types::Value as SqlValue;
use rusqlite::{params_from_iter, Connection};

use super::{reader::MAX_QUERY_ROWS, to_i64, Db};
use crate::{AlarmBatch, AlarmQuery, Result, RuleStateRecord};

/// Creates or replaces a rule; answers "created".
pub(super) fn put_rule(conn: &Connection, id: &str, json: &str) -> rusqlite::Result<bool> {
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
pub(super) fn delete_rule(conn: &Connection, id: &str) -> rusqlite::Result<bool> {
    conn.prepare_cached("DELETE FROM rule_states WHERE rule = ?1")?
        .execute([id])?;
    Ok(conn
        .prepare_cached("DELETE FROM rules WHERE id = ?1")?
        .execute([id])?
        > 0)
}

/// Stores one evaluation step: alarms (only over older versions), events,
/// rule states and the cursor. Answers the `seq` of the last event.
pub(super) fn commit_alarms(conn: &Connection, batch: &AlarmBatch) -> rusqlite::Result<u64> {
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
    if let Some((name, next)) = &batch.cursor {
        conn.prepare_cached(
            "INSERT INTO cursors (name, next_seq) VALUES (?1, ?2) \
             ON CONFLICT (name) DO UPDATE SET next_seq = excluded.next_seq",
        )?
        .execute((name, to_i64(*next)))?;
    }
    Ok(last)
}

/// Every rule as `(id, json)`, by id.
pub(super) fn load_rules(conn: &Connection) -> Result<Vec<(String, String)>> {
    let mut stmt = conn
        .prepare_cached("SELECT id, json FROM rules ORDER BY id")
        .db()?;
    let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).db()?;
    rows.collect::<rusqlite::Result<_>>().db()
}

/// Every stored rule state.
pub(super) fn load_rule_states(conn: &Connection) -> Result<Vec<RuleStateRecord>> {
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
pub(super) fn get_alarm(conn: &Connection, id: &str) -> Result<Option<String>> {
    use rusqlite::OptionalExtension;
    conn.prepare_cached("SELECT json FROM alarms WHERE id = ?1")
        .db()?
        .query_row([id], |r| r.get(0))
        .optional()
        .db()
}

/// Alarms matching `query`, newest first (JSON).
pub(super) fn query_alarms(conn: &Connection, query: &AlarmQuery) -> Result<Vec<String>> {
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
pub(super) fn active_alarms(conn: &Connection) -> Result<Vec<String>> {
    let mut stmt = conn
        .prepare_cached("SELECT json FROM alarms WHERE state = 'active'")
        .db()?;
    let rows = stmt.query_map([], |r| r.get(0)).db()?;
    rows.collect::<rusqlite::Result<_>>().db()
}

/// Alarm events after `after`, oldest first, at most `limit`.
pub(super) fn alarm_events(
    conn: &Connection,
    after: u64,
    limit: usize,
) -> Result<Vec<(u64, String)>> {
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
pub(super) const ALARM_EVENTS_HEAD: &str = "SELECT COALESCE(MAX(seq), 0) FROM alarm_events";

/// The newest stored data unit's `seq` (0: none).
pub(super) const DATA_HEAD: &str = "SELECT COALESCE(MAX(seq), 0) FROM data_units";

/// The single number `sql` selects (one of the heads above).
pub(super) fn max_seq(conn: &Connection, sql: &'static str) -> Result<u64> {
    conn.prepare_cached(sql)
        .db()?
        .query_row([], |r| r.get::<_, i64>(0))
        .map(|n| n as u64)
        .db()
}
