//! The PostgreSQL schema as an append-only list of migration steps.
//!
//! `weft_schema` records how many steps a database has applied. Opening
//! the store applies the missing steps in order, all in one transaction
//! under an advisory lock, so two weft nodes starting together against the
//! same database migrate it once, and a crash mid-migration leaves it as
//! it was. A step, once released, is never edited.
//!
//! The tables are the SQLite backend's (`sqlite/schema.rs` explains each),
//! in PostgreSQL's types: `BIGINT` epoch milliseconds, identity columns
//! for the sequences consumers page by (never reused, like SQLite's
//! `AUTOINCREMENT`), `BYTEA` for uplink bodies, `DOUBLE PRECISION` for
//! numbers. Two differences:
//!
//! - `history` is partitioned by its time index, one partition per week
//!   (created on demand before rows land in it, [`partition_for`]), plus a
//!   default partition for anything outside the created ones. Retention
//!   drops a whole partition once every tenant with rows in it is past
//!   its end, instead of deleting its rows one by one
//!   (`postgres/history.rs`).
//! - There is one database for everything: the SQLite backend's four
//!   files (log, main, history, channels) are writers here (the history's
//!   two: one queues notifications, one moves them), each keeping its own
//!   commit order (see `postgres/writer.rs`).

use tokio_postgres::Client;

use super::conn::Conn;
use crate::{Result, StoreError};

/// Key of the advisory lock migrations hold (any constant, unique to weft).
const MIGRATION_LOCK: i64 = 0x7765_6674_5f6d_6967; // "weft_mig"

/// Width of one history partition: a week of time index, in milliseconds.
pub(super) const HISTORY_PARTITION_MS: i64 = 7 * 24 * 3_600_000;

/// The migration steps, applied in order.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE ingest_log (
    seq         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    received_at BIGINT NOT NULL,
    format      TEXT   NOT NULL,
    channel     TEXT,
    device_type TEXT,
    body        BYTEA  NOT NULL
);
CREATE TABLE data_units (
    seq         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    data_id     TEXT   NOT NULL UNIQUE,
    device_id   TEXT   NOT NULL,
    channel     TEXT   NOT NULL,
    device_type TEXT   NOT NULL,
    reported_at BIGINT NOT NULL,
    json        TEXT   NOT NULL
);
CREATE INDEX data_units_device_seq ON data_units (device_id, seq);
CREATE TABLE failed_uplinks (
    seq         BIGINT PRIMARY KEY,
    received_at BIGINT NOT NULL,
    format      TEXT   NOT NULL,
    channel     TEXT,
    device_type TEXT,
    reason      TEXT   NOT NULL,
    description TEXT   NOT NULL,
    body        TEXT   NOT NULL
);
CREATE TABLE devices (
    id          TEXT PRIMARY KEY,
    device_type TEXT NOT NULL,
    channel     TEXT NOT NULL,
    json        TEXT NOT NULL
);
CREATE TABLE device_types (
    name TEXT PRIMARY KEY,
    json TEXT NOT NULL
);
CREATE TABLE cursors (
    name     TEXT   PRIMARY KEY,
    next_seq BIGINT NOT NULL
);
CREATE TABLE entities (
    tenant       TEXT   NOT NULL,
    service_path TEXT   NOT NULL,
    id           TEXT   NOT NULL,
    type         TEXT   NOT NULL,
    created      BIGINT NOT NULL,
    json         TEXT   NOT NULL,
    PRIMARY KEY (tenant, service_path, id, type)
);
CREATE TABLE ngsi_documents (
    kind         TEXT   NOT NULL,
    tenant       TEXT   NOT NULL,
    id           TEXT   NOT NULL,
    service_path TEXT   NOT NULL,
    created      BIGINT NOT NULL,
    json         TEXT   NOT NULL,
    PRIMARY KEY (kind, tenant, id)
);
CREATE TABLE history (
    tenant       TEXT   NOT NULL,
    entity_id    TEXT   NOT NULL,
    entity_type  TEXT   NOT NULL,
    attr         TEXT   NOT NULL,
    time         BIGINT NOT NULL,
    service_path TEXT   NOT NULL,
    attr_type    TEXT   NOT NULL,
    value        TEXT   NOT NULL,
    number       DOUBLE PRECISION,
    PRIMARY KEY (tenant, entity_id, entity_type, attr, time)
) PARTITION BY RANGE (time);
CREATE TABLE history_default PARTITION OF history DEFAULT;
CREATE TABLE history_entities (
    tenant       TEXT NOT NULL,
    entity_type  TEXT NOT NULL,
    entity_id    TEXT NOT NULL,
    service_path TEXT NOT NULL,
    PRIMARY KEY (tenant, entity_type, entity_id)
);
CREATE INDEX history_entities_id ON history_entities (tenant, entity_id, service_path);
CREATE TABLE history_feed (
    feed TEXT   NOT NULL,
    seq  BIGINT GENERATED ALWAYS AS IDENTITY,
    rows TEXT   NOT NULL,
    PRIMARY KEY (feed, seq)
);
CREATE TABLE history_rollups (
    tenant      TEXT   NOT NULL,
    entity_id   TEXT   NOT NULL,
    entity_type TEXT   NOT NULL,
    attr        TEXT   NOT NULL,
    period      BIGINT NOT NULL,
    bucket      BIGINT NOT NULL,
    rows        BIGINT NOT NULL,
    numbers     BIGINT NOT NULL,
    sum_value   DOUBLE PRECISION,
    min_value   DOUBLE PRECISION,
    max_value   DOUBLE PRECISION,
    PRIMARY KEY (tenant, entity_id, entity_type, attr, period, bucket)
);
CREATE TABLE rules (
    id   TEXT PRIMARY KEY,
    json TEXT NOT NULL
);
CREATE TABLE rule_states (
    rule   TEXT NOT NULL,
    device TEXT NOT NULL,
    json   TEXT NOT NULL,
    PRIMARY KEY (rule, device)
);
CREATE TABLE alarms (
    id        TEXT    PRIMARY KEY,
    device    TEXT    NOT NULL,
    type      TEXT    NOT NULL,
    state     TEXT    NOT NULL,
    acked     BOOLEAN NOT NULL,
    severity  TEXT    NOT NULL,
    raised_at BIGINT  NOT NULL,
    version   BIGINT  NOT NULL,
    json      TEXT    NOT NULL
);
CREATE INDEX alarms_raised ON alarms (raised_at);
CREATE INDEX alarms_state_device ON alarms (state, device);
CREATE TABLE alarm_events (
    seq  BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    json TEXT   NOT NULL
);
CREATE TABLE channel_messages (
    seq          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    channel      TEXT   NOT NULL,
    message_id   TEXT   NOT NULL,
    content      TEXT   NOT NULL,
    published_at BIGINT NOT NULL,
    UNIQUE (channel, message_id)
);
CREATE INDEX channel_messages_channel_seq ON channel_messages (channel, seq);
CREATE TABLE channel_subscribers (
    channel    TEXT   NOT NULL,
    subscriber TEXT   NOT NULL,
    cursor     BIGINT NOT NULL,
    PRIMARY KEY (channel, subscriber)
);
"#,
    r#"
ALTER TABLE ingest_log ADD COLUMN event TEXT;
CREATE TABLE device_events (
    seq         BIGINT PRIMARY KEY,
    device_id   TEXT   NOT NULL,
    event       TEXT   NOT NULL,
    received_at BIGINT NOT NULL,
    json        TEXT   NOT NULL
);
CREATE INDEX device_events_device_seq ON device_events (device_id, seq);
CREATE TABLE device_state (
    device_id TEXT   NOT NULL,
    kind      TEXT   NOT NULL,
    seq       BIGINT NOT NULL,
    json      TEXT   NOT NULL,
    PRIMARY KEY (device_id, kind)
);
"#,
    // Step 3: API keys (see the SQLite schema's `api_keys`).
    r#"
CREATE TABLE api_keys (
    id   TEXT PRIMARY KEY,
    hash TEXT NOT NULL UNIQUE,
    json TEXT NOT NULL
);
"#,
    // Step 4: history rows keyed by the recorded state too (see the SQLite
    // schema's `history.instance`); the new key is built on every weekly
    // partition.
    r#"
ALTER TABLE history ADD COLUMN instance BIGINT NOT NULL DEFAULT 0;
ALTER TABLE history DROP CONSTRAINT history_pkey;
ALTER TABLE history ADD PRIMARY KEY (tenant, entity_id, entity_type, attr, time, instance);
"#,
    // Step 5: the nodes of a cluster and the leases on its singular work
    // (see `crate::cluster`). Times are epoch ms of the database's clock.
    r#"
CREATE TABLE cluster_nodes (
    node       TEXT   PRIMARY KEY,
    address    TEXT   NOT NULL,
    version    TEXT   NOT NULL,
    started_at BIGINT NOT NULL,
    last_seen  BIGINT NOT NULL
);
CREATE TABLE cluster_leases (
    work       TEXT   PRIMARY KEY,
    holder     TEXT   NOT NULL,
    expires_at BIGINT NOT NULL
);
"#,
    // Step 6: downlink queues and the routes to devices (see the SQLite
    // schema's `downlinks`).
    r#"
CREATE TABLE downlinks (
    seq       BIGSERIAL PRIMARY KEY,
    id        TEXT   NOT NULL UNIQUE,
    device_id TEXT   NOT NULL,
    status    TEXT   NOT NULL,
    due_at    BIGINT NOT NULL,
    json      TEXT   NOT NULL
);
CREATE INDEX downlinks_device ON downlinks (device_id, seq);
CREATE INDEX downlinks_due ON downlinks (due_at) WHERE status IN ('queued', 'pending');
CREATE TABLE downlink_routes (
    device_id TEXT PRIMARY KEY,
    json      TEXT NOT NULL
);
"#,
    // Step 7: the device an MQTT topic named and the MQTT source (see the
    // SQLite schema's `ingest_log.device_id`).
    r#"
ALTER TABLE ingest_log ADD COLUMN device_id TEXT;
ALTER TABLE ingest_log ADD COLUMN source TEXT;
"#,
    // Step 8: the pipeline split by device across a cluster's nodes: the
    // partition each log entry is processed in, and that each data unit
    // was stored by (the rule engine of that partition reads them back).
    // Rows written before are partition 0's, whose cursors keep the
    // names they had.
    r#"
ALTER TABLE ingest_log ADD COLUMN part SMALLINT NOT NULL DEFAULT 0;
ALTER TABLE data_units ADD COLUMN part SMALLINT NOT NULL DEFAULT 0;
CREATE INDEX data_units_part_seq ON data_units (part, seq);
"#,
    // Step 9: channels shared by several nodes. When each subscriber was
    // last active on any node, so that no node expires one another node
    // serves (subscribers that exist now count as active now); and
    // channel publishes of several nodes commit in `seq` order (see
    // `postgres/channels.rs`).
    r#"
ALTER TABLE channel_subscribers
    ADD COLUMN active_at BIGINT NOT NULL DEFAULT (EXTRACT(EPOCH FROM now()) * 1000)::BIGINT;
CREATE INDEX channel_subscribers_active ON channel_subscribers (active_at);
"#,
    // Step 10: the pins of the ingest key an uplink came with (see the
    // SQLite schema's `ingest_log.pins`).
    r#"
ALTER TABLE ingest_log ADD COLUMN pins TEXT;
"#,
    // Step 11: the attributes recorded per entity type, QuantumLeap's
    // columns (see the SQLite schema's `history_columns`).
    r#"
CREATE TABLE history_columns (
    tenant      TEXT NOT NULL,
    entity_type TEXT NOT NULL,
    attr        TEXT NOT NULL,
    PRIMARY KEY (tenant, entity_type, attr)
);
INSERT INTO history_columns
SELECT DISTINCT tenant, entity_type, attr FROM history_rollups
ON CONFLICT DO NOTHING;
"#,
    // Step 12: the notification outbox, the change log per node and the
    // subscriptions' cursors over it (see the SQLite schema's `change_log`
    // and `crate::OutboxStore`). Changes are logged by the main writer in
    // the transaction of the entity write that makes them.
    r#"
CREATE TABLE change_log (
    node   TEXT   NOT NULL,
    seq    BIGINT NOT NULL,
    tenant TEXT   NOT NULL,
    at     BIGINT NOT NULL,
    body   BYTEA  NOT NULL,
    PRIMARY KEY (node, seq)
);
CREATE TABLE notification_cursors (
    node         TEXT   NOT NULL,
    tenant       TEXT   NOT NULL,
    subscription TEXT   NOT NULL,
    through      BIGINT NOT NULL,
    PRIMARY KEY (node, tenant, subscription)
);
"#,
    // Step 13: the channel webhook calls owed, queued with their messages
    // (see the SQLite schema's `channel_webhooks`).
    r#"
CREATE TABLE channel_webhooks (
    seq  BIGSERIAL PRIMARY KEY,
    node TEXT NOT NULL,
    call TEXT NOT NULL
);
"#,
    // Step 14: history rows and rollups keyed by an integer series id
    // (`history_series`: one per tenant, entity id, entity type and
    // attribute) instead of those four texts. The keys every append
    // inserts and every query seeks shrink from four texts to an integer,
    // which is most of an append's cost (`postgres/history.rs`). A series,
    // once numbered, keeps its id for good: nodes cache ids, so one is
    // never deleted or reused.
    r#"
CREATE TABLE history_series (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant      TEXT NOT NULL,
    entity_id   TEXT NOT NULL,
    entity_type TEXT NOT NULL,
    attr        TEXT NOT NULL,
    UNIQUE (tenant, entity_id, entity_type, attr)
);
INSERT INTO history_series (tenant, entity_id, entity_type, attr)
SELECT tenant, entity_id, entity_type, attr FROM history
UNION SELECT tenant, entity_id, entity_type, attr FROM history_rollups
ORDER BY 1, 2, 3, 4;
ALTER TABLE history ADD COLUMN series BIGINT;
UPDATE history h SET series = s.id FROM history_series s
WHERE s.tenant = h.tenant AND s.entity_id = h.entity_id
  AND s.entity_type = h.entity_type AND s.attr = h.attr;
ALTER TABLE history DROP CONSTRAINT history_pkey;
ALTER TABLE history DROP COLUMN tenant, DROP COLUMN entity_id,
    DROP COLUMN entity_type, DROP COLUMN attr;
ALTER TABLE history ALTER COLUMN series SET NOT NULL;
ALTER TABLE history ADD PRIMARY KEY (series, time, instance);
ALTER TABLE history_rollups ADD COLUMN series BIGINT;
UPDATE history_rollups r SET series = s.id FROM history_series s
WHERE s.tenant = r.tenant AND s.entity_id = r.entity_id
  AND s.entity_type = r.entity_type AND s.attr = r.attr;
ALTER TABLE history_rollups DROP CONSTRAINT history_rollups_pkey;
ALTER TABLE history_rollups DROP COLUMN tenant, DROP COLUMN entity_id,
    DROP COLUMN entity_type, DROP COLUMN attr;
ALTER TABLE history_rollups ALTER COLUMN series SET NOT NULL;
ALTER TABLE history_rollups ADD PRIMARY KEY (series, period, bucket);
"#,
    // Step 15: history feed entries in the compact form the SQLite
    // backend queues (`crate::history::encode_feed_entry`) instead of
    // JSON, stored as they are: an entry lives until the next move, so
    // compressing it is CPU spent for nothing. Entries queued before keep
    // their JSON (`rows`) and are read as before.
    r#"
ALTER TABLE history_feed ADD COLUMN states BYTEA;
ALTER TABLE history_feed ALTER COLUMN states SET STORAGE EXTERNAL;
ALTER TABLE history_feed ALTER COLUMN rows DROP NOT NULL;
"#,
    // Step 16: an entity found by its id alone, for a node that missed
    // another node's change to it (`ContextStore::load_entities_with_id`).
    r#"
CREATE INDEX entities_id ON entities (tenant, id);
"#,
    // Step 17: settings fixed when the database is created: how many
    // partitions the pipeline is split into (`ingest::settle_partitions`).
    // A database that already holds uplinks, units or cursors was split
    // into 16, the number every version before this one used.
    r#"
CREATE TABLE store_settings (
    name  TEXT PRIMARY KEY,
    value BIGINT NOT NULL
);
INSERT INTO store_settings (name, value)
SELECT 'partitions', 16
WHERE EXISTS (SELECT 1 FROM ingest_log) OR EXISTS (SELECT 1 FROM data_units)
   OR EXISTS (SELECT 1 FROM cursors);
"#,
    // Step 18: the load a lease's holder measured on it (work a second),
    // so nodes share split work by load (`weft_pipeline::balance`).
    r#"
ALTER TABLE cluster_leases ADD COLUMN load DOUBLE PRECISION NOT NULL DEFAULT 0;
"#,
    // Step 19: the changes feed split by entity into the pipeline's
    // number of partitions (`crate::history_partition`), each moved by
    // whichever node holds it, under a cursor of its own. Entries queued
    // before are partition 0's, under the cursor the feed had.
    r#"
ALTER TABLE history_feed ADD COLUMN part SMALLINT NOT NULL DEFAULT 0;
CREATE INDEX history_feed_parts ON history_feed (feed, part, seq);
"#,
];

/// Brings the database up to the latest schema; returns the version it is
/// at afterwards. A database migrated by a newer weft (more steps than
/// this build knows) is refused rather than misread.
pub(super) async fn migrate(client: &mut Client) -> Result<usize> {
    migrate_through(client, MIGRATIONS.len()).await
}

/// [`migrate`], stopping after the first `steps` steps: what a database
/// an older weft migrated looks like, for the tests of the steps after.
pub(super) async fn migrate_through(client: &mut Client, through: usize) -> Result<usize> {
    let steps = &MIGRATIONS[..through.min(MIGRATIONS.len())];
    let tx = client.transaction().await.map_err(db)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(db)?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS weft_schema (version INTEGER NOT NULL)")
        .await
        .map_err(db)?;
    let current: Option<i32> = tx
        .query_opt("SELECT version FROM weft_schema", &[])
        .await
        .map_err(db)?
        .map(|row| row.get(0));
    let current = usize::try_from(current.unwrap_or(0))
        .map_err(|_| StoreError::Corrupt("weft_schema holds a negative version".into()))?;
    if current > steps.len() {
        return Err(StoreError::Database(format!(
            "the database's schema is at version {current}, newer than this weft knows ({}); \
             run a newer weft",
            steps.len()
        )));
    }
    for (index, step) in steps.iter().enumerate().skip(current) {
        tx.batch_execute(step).await.map_err(db)?;
        tracing::debug!(version = index + 1, "applied PostgreSQL migration");
    }
    if current < steps.len() {
        // One line for the whole run: a fresh database takes every step.
        tracing::info!(
            from = current,
            to = steps.len(),
            "migrated the PostgreSQL schema"
        );
    }
    let version = i32::try_from(steps.len()).expect("a handful of steps");
    tx.execute("DELETE FROM weft_schema", &[])
        .await
        .map_err(db)?;
    tx.execute("INSERT INTO weft_schema (version) VALUES ($1)", &[&version])
        .await
        .map_err(db)?;
    tx.commit().await.map_err(db)?;
    Ok(steps.len())
}

/// The name and bounds (`[from, to)`, epoch ms) of the history partition
/// holding time index `time`.
pub(super) fn partition_for(time: i64) -> (String, i64, i64) {
    let from = time.div_euclid(HISTORY_PARTITION_MS) * HISTORY_PARTITION_MS;
    let name = if from < 0 {
        format!("history_m{}", -from)
    } else {
        format!("history_p{from}")
    };
    (name, from, from + HISTORY_PARTITION_MS)
}

/// The start (epoch ms) of the history partition named `name`, when it is
/// one [`partition_for`] names; `None` for any other table (the default
/// partition among them).
pub(super) fn partition_start(name: &str) -> Option<i64> {
    let from = match (
        name.strip_prefix("history_p"),
        name.strip_prefix("history_m"),
    ) {
        (Some(digits), _) => digits.parse::<i64>().ok()?,
        (_, Some(digits)) => digits.parse::<i64>().ok()?.checked_neg()?,
        _ => return None,
    };
    (partition_for(from).0 == name).then_some(from)
}

/// The weekly history partitions that exist, as (name, start), oldest
/// first; the default partition is not among them.
pub(super) async fn history_partitions(client: &Client) -> Result<Vec<(String, i64)>> {
    let rows = client
        .query(
            "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
             WHERE i.inhparent = 'history'::regclass",
            &[],
        )
        .await
        .map_err(db)?;
    let mut out: Vec<(String, i64)> = rows
        .iter()
        .filter_map(|r| {
            let name: String = r.get(0);
            partition_start(&name).map(|from| (name, from))
        })
        .collect();
    out.sort_unstable_by_key(|(_, from)| *from);
    Ok(out)
}

/// Held (for its transaction) by whoever creates a history partition:
/// nodes moving the history side by side would otherwise create the same
/// week's partition at once and deadlock on the locks both take.
const HISTORY_PARTITION_LOCK: i64 = 0x7765_6674_5f70_6172; // "weft_par"

/// Creates the history partition for `time` unless it exists, one node at
/// a time. Rows already in the default partition for that range are moved
/// into it (PostgreSQL refuses to attach a range the default partition
/// holds rows of).
pub(super) async fn ensure_partition(client: &Conn, time: i64) -> Result<()> {
    let (name, from, to) = partition_for(time);
    client
        .execute(
            "SELECT pg_advisory_xact_lock($1)",
            &[&HISTORY_PARTITION_LOCK],
        )
        .await
        .map_err(db)?;
    let exists = client
        .query_opt("SELECT 1 FROM pg_class WHERE relname = $1", &[&name])
        .await
        .map_err(db)?
        .is_some();
    if exists {
        return Ok(());
    }
    client
        .batch_execute(&format!(
            "CREATE TEMP TABLE IF NOT EXISTS history_moving (LIKE history) ON COMMIT DROP;
             WITH moved AS (DELETE FROM history_default WHERE time >= {from} AND time < {to} \
                            RETURNING *)
             INSERT INTO history_moving SELECT * FROM moved;
             CREATE TABLE IF NOT EXISTS {name} PARTITION OF history FOR VALUES FROM ({from}) TO ({to});
             INSERT INTO history SELECT * FROM history_moving;
             DELETE FROM history_moving;"
        ))
        .await
        .map_err(db)
}

/// A PostgreSQL error as the store reports it.
pub(super) fn db(e: tokio_postgres::Error) -> StoreError {
    match e.as_db_error() {
        Some(d) => StoreError::Database(format!("{}: {}", d.code().code(), d.message())),
        None => StoreError::Database(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_are_whole_weeks_named_by_their_start() {
        let (name, from, to) = partition_for(1_700_000_000_000);
        assert_eq!(to - from, HISTORY_PARTITION_MS);
        assert!(from <= 1_700_000_000_000 && 1_700_000_000_000 < to);
        assert_eq!(name, format!("history_p{from}"));
        assert_eq!(partition_for(from).1, from);
        assert_eq!(partition_for(to - 1).1, from);
        assert_eq!(partition_for(to).1, to);
        let (name, from, to) = partition_for(-1);
        assert_eq!((from, to), (-HISTORY_PARTITION_MS, 0));
        assert_eq!(name, format!("history_m{HISTORY_PARTITION_MS}"));
    }

    #[test]
    fn a_partition_name_gives_back_its_start_and_nothing_else_does() {
        for t in [-1, 0, 5, 1_700_000_000_000, -3 * HISTORY_PARTITION_MS - 7] {
            let (name, from, _) = partition_for(t);
            assert_eq!(partition_start(&name), Some(from), "{name}");
        }
        for other in [
            "history_default",
            "history_p",
            "history_px",
            "history_p5",
            "history_m0",
            "history_p-604800000",
            "history_m-604800000",
            "history_entities",
        ] {
            assert_eq!(partition_start(other), None, "{other}");
        }
    }
}
