//! The SQLite schema as an append-only list of migration steps, and the
//! connection settings every connection of the store shares.
//!
//! `PRAGMA user_version` records how many steps a database has applied.
//! Opening a database applies the missing steps in order, all in one
//! transaction, so a crash mid-migration leaves the database as it was.
//! Later issues add tables by appending a step; a step, once released, is
//! never edited, because databases in the field have already applied it.

use std::time::Duration;

use rusqlite::Connection;

use super::Synchronous;

/// How long a connection waits for a lock held by another connection
/// before reporting `database is locked`. Only another process (or a
/// checkpoint) ever holds the write lock against our single writer, so a
/// generous wait turns rare contention into latency instead of errors.
pub(super) const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The migration steps, applied in order. Step `i` (0-based) brings the
/// database to `user_version = i + 1`.
///
/// Step 1, the first schema:
/// - `ingest_log`: uplinks exactly as received. `AUTOINCREMENT` makes
///   SQLite remember the highest `seq` ever used, so pruning the log never
///   lets a `seq` be handed out twice (consumer cursors rely on that).
/// - `data_units`: the pipeline's output. `seq` is the paging cursor of
///   `GET /api/v1/data` (also `AUTOINCREMENT`, never reused); `data_id` is
///   unique so replays store a unit once. `(device_id, seq)` serves the
///   per-device history query in storage order.
/// - `failed_uplinks`: keyed by the log `seq` of the uplink, so a replay
///   overwrites instead of duplicating. `body` is JSON text.
/// - `devices`, `device_types`: configuration, stored as the API's JSON
///   with the columns filters need beside it.
/// - `cursors`: how far each log consumer got (the next `seq` to read).
/// - `entities` (step 2): NGSI entities as the model's JSON, keyed as
///   Orion keys them, with their creation order.
/// - `ngsi_documents` (step 3): NGSI subscriptions and registrations, one
///   row per (kind, tenant, id), as the model's JSON, with the service
///   path they were created in and their creation order.
/// - `history` (step 4): QuantumLeap's time series, one row per
///   (tenant, entity id, entity type, attribute, time index) — that key is
///   the primary key, so `INSERT OR IGNORE` makes replays idempotent and
///   every series is one contiguous range of the table, read in time order
///   (`last_n` is a backward scan, `from`/`to` a range). `value` is the
///   attribute's value as JSON text, `number` the same value when numeric
///   (what aggregations read; `NULL` otherwise). `WITHOUT ROWID`: the rows
///   live in the key's b-tree, with no second index to maintain.
/// - `history_entities` (step 4): one row per entity with history, keyed
///   by (tenant, type, id) with the service path of its first row; the
///   entity listings and type queries read it instead of the big table.
///   `history_entities_id` finds an entity's types (and path) from its id;
///   it covers the lookup, which SQLite's planner otherwise skips in favour
///   of scanning the tenant's part of the primary key.
///
/// Every file of the store applies every step (the tables a file does not
/// use stay empty), so one list serves all of them.
/// - `history_feed` (step 5, main file): history rows of entity changes
///   waiting for the history writer, one JSON array per change set,
///   written in the same transaction as the change. In the history's
///   file the same table queues the rows of QuantumLeap notifications
///   (their 200 waits only for this append).
/// - `history_rollups` (step 6, history file): per series, the row count,
///   numeric count, sum, min and max of every minute (`period` 60000) and
///   hour (3600000) bucket that has rows, kept with every insert. Hourly,
///   daily, monthly and yearly aggregates read these instead of the rows,
///   and they outlive the rows when a tenant's retention downsamples old
///   data. The step builds them for the rows already stored.
/// - `rules`, `rule_states`, `alarms`, `alarm_events` (step 7, main file):
///   alarm rules, each rule's per-device state, alarms (one row each, the
///   columns the API filters on beside the JSON) and the log of alarm
///   changes that durable consumers tail by `seq`.
/// - `channel_messages`, `channel_subscribers` (step 8, channels file):
///   durable pull channels' messages (unique per channel and message id)
///   and polling subscribers with their acknowledgement cursors.
/// - `ingest_log.event` (step 9, log file), `device_events`,
///   `device_state` (step 9, main file): the event a network server named for a message that is not an
///   uplink (ChirpStack's `?event=`); the latest events of each device,
///   keyed by their log `seq` so a replay stores them once; and per
///   device and kind of event (`join`, `status`, …) the summary of the
///   latest, which the device's record shows.
/// - `api_keys` (step 10, main file): API keys, one row per key id with the
///   SHA-256 of its secret (unique) and its record as JSON; never deleted,
///   only marked revoked.
/// - `history.instance` (step 11, history file): the recorded entity state
///   a row belongs to ([`HistoryRow::instance`](crate::HistoryRow::instance)),
///   appended to the primary key, so two notifications of one entity filed
///   under the same time index (arrivals in the same millisecond) are two
///   rows, as QuantumLeap stores them. SQLite cannot change a primary key
///   in place: the step copies the table (rows stored before it get 0).
/// - `history_series`, `history_states`, `history_rollups` (step 12,
///   history file): the history as one row per recorded entity state
///   instead of one per attribute. `history_series` gives every entity
///   with history an integer `key` (with its tenant, type, id and the
///   service path of its first state; `history_series_id` finds it by
///   id); `history_states` is keyed by (entity key, time, instance), its
///   `attrs` a JSON object `{"<attr>": ["<type>", "<value as JSON text>",
///   <number or null>]}`, `rows` how many attributes it holds and
///   `service_path` the state's own path when it differs from the
///   entity's (NULL otherwise); the rollups are keyed by (entity key,
///   attribute, period, bucket). An NGSI update is then one insert keyed
///   by integers instead of one per attribute keyed by four strings. The
///   step converts the rows, rollups and entities already stored and
///   drops the old tables (`history`, `history_entities`).
/// - `downlinks`, `downlink_routes` (step 13, main file): the downlink
///   queues, one row per downlink (its status and next attempt beside its
///   JSON record, so the delivery worker finds what is due by index), and
///   per device the route its uplinks came through.
/// - `ingest_log.device_id`, `ingest_log.source` (step 14, log file): the
///   device an MQTT topic (or an embedded-broker login) named, which wins
///   over the body's, and the MQTT source a message arrived on.
/// - `history_columns` (step 16, history file): every attribute name
///   recorded for an entity type of a tenant, QuantumLeap's columns of the
///   type's table, which its answers list for every record; added to as
///   states are appended, filled from the rollups on upgrade, forgotten
///   when no entity of the type has history left.
/// - `change_log`, `notification_cursors` (step 17, main file): every
///   entity change some subscription may owe a notification for, logged
///   per node in the transaction that makes it, keyed by the node's order
///   of changes, with its tenant, commit time and the model's (compressed)
///   form of the change; and per node and subscription how far it has been served
///   ([`OutboxStore`](crate::OutboxStore)).
/// - `channel_webhooks` (step 18, channels file): the outgoing webhook
///   calls a new message owes, queued in the transaction that stores it,
///   per sending node, deleted once delivered or given up.
/// - `entities` as a rowid table (step 19, main file): the same columns,
///   the key (tenant, service path, id, type) a unique index beside the
///   rows instead of the table's own key. A `WITHOUT ROWID` table keeps
///   whole rows in its interior pages too, and an entity's JSON is a third
///   to a half of the main file's 1 KiB page: one or two entities a page,
///   a deep tree, and every write's seek compared keys page after page.
///   Rows now sit in a tree of integers, the key in a small index, and an
///   update is an upsert in place (measured with 450-byte entities: half
///   the CPU per write of `INSERT OR REPLACE` on the old table).
/// - `ingest_log.pins` (step 15, log file): the channel and device type
///   the ingest key an uplink came with is limited to (JSON, NULL for
///   none), which the pipeline holds the decoded device to.
pub(super) const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE ingest_log (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    received_at INTEGER NOT NULL,
    format      TEXT    NOT NULL,
    channel     TEXT,
    device_type TEXT,
    body        BLOB    NOT NULL
);
CREATE TABLE data_units (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    data_id     TEXT    NOT NULL UNIQUE,
    device_id   TEXT    NOT NULL,
    channel     TEXT    NOT NULL,
    device_type TEXT    NOT NULL,
    reported_at INTEGER NOT NULL,
    json        TEXT    NOT NULL
);
CREATE INDEX data_units_device_seq ON data_units (device_id, seq);
CREATE TABLE failed_uplinks (
    seq         INTEGER PRIMARY KEY,
    received_at INTEGER NOT NULL,
    format      TEXT    NOT NULL,
    channel     TEXT,
    device_type TEXT,
    reason      TEXT    NOT NULL,
    description TEXT    NOT NULL,
    body        TEXT    NOT NULL
);
CREATE TABLE devices (
    id          TEXT PRIMARY KEY,
    device_type TEXT NOT NULL,
    channel     TEXT NOT NULL,
    json        TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE device_types (
    name TEXT PRIMARY KEY,
    json TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE cursors (
    name     TEXT    PRIMARY KEY,
    next_seq INTEGER NOT NULL
) WITHOUT ROWID;
"#,
    r#"
CREATE TABLE entities (
    tenant       TEXT    NOT NULL,
    service_path TEXT    NOT NULL,
    id           TEXT    NOT NULL,
    type         TEXT    NOT NULL,
    created      INTEGER NOT NULL,
    json         TEXT    NOT NULL,
    PRIMARY KEY (tenant, service_path, id, type)
) WITHOUT ROWID;
"#,
    r#"
CREATE TABLE ngsi_documents (
    kind         TEXT    NOT NULL,
    tenant       TEXT    NOT NULL,
    id           TEXT    NOT NULL,
    service_path TEXT    NOT NULL,
    created      INTEGER NOT NULL,
    json         TEXT    NOT NULL,
    PRIMARY KEY (kind, tenant, id)
) WITHOUT ROWID;
"#,
    r#"
CREATE TABLE history (
    tenant       TEXT    NOT NULL,
    entity_id    TEXT    NOT NULL,
    entity_type  TEXT    NOT NULL,
    attr         TEXT    NOT NULL,
    time         INTEGER NOT NULL,
    service_path TEXT    NOT NULL,
    attr_type    TEXT    NOT NULL,
    value        TEXT    NOT NULL,
    number       REAL,
    PRIMARY KEY (tenant, entity_id, entity_type, attr, time)
) WITHOUT ROWID;
CREATE TABLE history_entities (
    tenant       TEXT NOT NULL,
    entity_type  TEXT NOT NULL,
    entity_id    TEXT NOT NULL,
    service_path TEXT NOT NULL,
    PRIMARY KEY (tenant, entity_type, entity_id)
) WITHOUT ROWID;
CREATE INDEX history_entities_id ON history_entities (tenant, entity_id, service_path);
"#,
    r#"
CREATE TABLE history_feed (
    seq  INTEGER PRIMARY KEY AUTOINCREMENT,
    rows TEXT    NOT NULL
);
"#,
    r#"
CREATE TABLE history_rollups (
    tenant      TEXT    NOT NULL,
    entity_id   TEXT    NOT NULL,
    entity_type TEXT    NOT NULL,
    attr        TEXT    NOT NULL,
    period      INTEGER NOT NULL,
    bucket      INTEGER NOT NULL,
    rows        INTEGER NOT NULL,
    numbers     INTEGER NOT NULL,
    sum_value   REAL,
    min_value   REAL,
    max_value   REAL,
    PRIMARY KEY (tenant, entity_id, entity_type, attr, period, bucket)
) WITHOUT ROWID;
INSERT INTO history_rollups
SELECT tenant, entity_id, entity_type, attr, 60000, time - ((time % 60000) + 60000) % 60000,
       COUNT(*), COUNT(number), SUM(number), MIN(number), MAX(number)
FROM history GROUP BY 1, 2, 3, 4, 6;
INSERT INTO history_rollups
SELECT tenant, entity_id, entity_type, attr, 3600000, time - ((time % 3600000) + 3600000) % 3600000,
       COUNT(*), COUNT(number), SUM(number), MIN(number), MAX(number)
FROM history GROUP BY 1, 2, 3, 4, 6;
"#,
    // rules and alarms
    r#"
CREATE TABLE rules (
    id   TEXT PRIMARY KEY,
    json TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE rule_states (
    rule   TEXT NOT NULL,
    device TEXT NOT NULL,
    json   TEXT NOT NULL,
    PRIMARY KEY (rule, device)
) WITHOUT ROWID;
CREATE TABLE alarms (
    id        TEXT    PRIMARY KEY,
    device    TEXT    NOT NULL,
    type      TEXT    NOT NULL,
    state     TEXT    NOT NULL,
    acked     INTEGER NOT NULL,
    severity  TEXT    NOT NULL,
    raised_at INTEGER NOT NULL,
    version   INTEGER NOT NULL,
    json      TEXT    NOT NULL
) WITHOUT ROWID;
CREATE INDEX alarms_raised ON alarms (raised_at);
CREATE INDEX alarms_state_device ON alarms (state, device);
CREATE TABLE alarm_events (
    seq  INTEGER PRIMARY KEY AUTOINCREMENT,
    json TEXT    NOT NULL
);
"#,
    // durable channels
    r#"
CREATE TABLE channel_messages (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    channel      TEXT    NOT NULL,
    message_id   TEXT    NOT NULL,
    content      TEXT    NOT NULL,
    published_at INTEGER NOT NULL,
    UNIQUE (channel, message_id)
);
CREATE INDEX channel_messages_channel_seq ON channel_messages (channel, seq);
CREATE TABLE channel_subscribers (
    channel    TEXT    NOT NULL,
    subscriber TEXT    NOT NULL,
    cursor     INTEGER NOT NULL,
    PRIMARY KEY (channel, subscriber)
) WITHOUT ROWID;
"#,
    // device events
    r#"
ALTER TABLE ingest_log ADD COLUMN event TEXT;
CREATE TABLE device_events (
    seq         INTEGER PRIMARY KEY,
    device_id   TEXT    NOT NULL,
    event       TEXT    NOT NULL,
    received_at INTEGER NOT NULL,
    json        TEXT    NOT NULL
);
CREATE INDEX device_events_device_seq ON device_events (device_id, seq);
CREATE TABLE device_state (
    device_id TEXT    NOT NULL,
    kind      TEXT    NOT NULL,
    seq       INTEGER NOT NULL,
    json      TEXT    NOT NULL,
    PRIMARY KEY (device_id, kind)
) WITHOUT ROWID;
"#,
    r#"
CREATE TABLE api_keys (
    id   TEXT PRIMARY KEY,
    hash TEXT NOT NULL UNIQUE,
    json TEXT NOT NULL
);
"#,
    // history rows keyed by recorded state too
    r#"
CREATE TABLE history_by_instance (
    tenant       TEXT    NOT NULL,
    entity_id    TEXT    NOT NULL,
    entity_type  TEXT    NOT NULL,
    attr         TEXT    NOT NULL,
    time         INTEGER NOT NULL,
    instance     INTEGER NOT NULL,
    service_path TEXT    NOT NULL,
    attr_type    TEXT    NOT NULL,
    value        TEXT    NOT NULL,
    number       REAL,
    PRIMARY KEY (tenant, entity_id, entity_type, attr, time, instance)
) WITHOUT ROWID;
INSERT INTO history_by_instance
SELECT tenant, entity_id, entity_type, attr, time, 0, service_path, attr_type, value, number
FROM history;
DROP TABLE history;
ALTER TABLE history_by_instance RENAME TO history;
"#,
    // history as one row per recorded state, keyed by an integer per entity
    r#"
CREATE TABLE history_series (
    key          INTEGER PRIMARY KEY,
    tenant       TEXT NOT NULL,
    entity_type  TEXT NOT NULL,
    entity_id    TEXT NOT NULL,
    service_path TEXT NOT NULL,
    UNIQUE (tenant, entity_type, entity_id)
);
CREATE INDEX history_series_id ON history_series (tenant, entity_id, entity_type);
INSERT INTO history_series (tenant, entity_type, entity_id, service_path)
SELECT tenant, entity_type, entity_id, service_path FROM history_entities
ORDER BY tenant, entity_type, entity_id;
CREATE TABLE history_states (
    entity       INTEGER NOT NULL,
    time         INTEGER NOT NULL,
    instance     INTEGER NOT NULL,
    service_path TEXT,
    rows         INTEGER NOT NULL,
    attrs        TEXT    NOT NULL,
    PRIMARY KEY (entity, time, instance)
) WITHOUT ROWID;
INSERT INTO history_states
SELECT s.key, h.time, h.instance, NULLIF(MIN(h.service_path), s.service_path), COUNT(*),
       json_group_object(h.attr, json_array(h.attr_type, h.value, h.number))
FROM history h JOIN history_series s
  ON s.tenant = h.tenant AND s.entity_type = h.entity_type AND s.entity_id = h.entity_id
GROUP BY s.key, h.time, h.instance;
CREATE TABLE history_series_rollups (
    entity    INTEGER NOT NULL,
    attr      TEXT    NOT NULL,
    period    INTEGER NOT NULL,
    bucket    INTEGER NOT NULL,
    rows      INTEGER NOT NULL,
    numbers   INTEGER NOT NULL,
    sum_value REAL,
    min_value REAL,
    max_value REAL,
    PRIMARY KEY (entity, attr, period, bucket)
) WITHOUT ROWID;
INSERT INTO history_series_rollups
SELECT s.key, r.attr, r.period, r.bucket, r.rows, r.numbers, r.sum_value, r.min_value, r.max_value
FROM history_rollups r JOIN history_series s
  ON s.tenant = r.tenant AND s.entity_type = r.entity_type AND s.entity_id = r.entity_id;
DROP TABLE history;
DROP TABLE history_rollups;
DROP TABLE history_entities;
ALTER TABLE history_series_rollups RENAME TO history_rollups;
"#,
    // downlink queues and the routes to devices
    r#"
CREATE TABLE downlinks (
    seq       INTEGER PRIMARY KEY AUTOINCREMENT,
    id        TEXT    NOT NULL UNIQUE,
    device_id TEXT    NOT NULL,
    status    TEXT    NOT NULL,
    due_at    INTEGER NOT NULL,
    json      TEXT    NOT NULL
);
CREATE INDEX downlinks_device ON downlinks (device_id, seq);
CREATE INDEX downlinks_due ON downlinks (due_at) WHERE status IN ('queued', 'pending');
CREATE TABLE downlink_routes (
    device_id TEXT PRIMARY KEY,
    json      TEXT NOT NULL
);
"#,
    // what the transport says about an uplink: its device and its MQTT source
    r#"
ALTER TABLE ingest_log ADD COLUMN device_id TEXT;
ALTER TABLE ingest_log ADD COLUMN source TEXT;
"#,
    // the pins of the ingest key an uplink came with
    r#"
ALTER TABLE ingest_log ADD COLUMN pins TEXT;
"#,
    // the attributes recorded per entity type (QuantumLeap's columns)
    r#"
CREATE TABLE history_columns (
    tenant      TEXT NOT NULL,
    entity_type TEXT NOT NULL,
    attr        TEXT NOT NULL,
    PRIMARY KEY (tenant, entity_type, attr)
) WITHOUT ROWID;
INSERT OR IGNORE INTO history_columns
SELECT DISTINCT s.tenant, s.entity_type, r.attr
FROM history_rollups r JOIN history_series s ON s.key = r.entity;
"#,
    // the notification outbox: the change log and the subscriptions' cursors
    r#"
CREATE TABLE change_log (
    node   TEXT    NOT NULL,
    seq    INTEGER NOT NULL,
    tenant TEXT    NOT NULL,
    at     INTEGER NOT NULL,
    body   BLOB    NOT NULL,
    PRIMARY KEY (node, seq)
);
CREATE TABLE notification_cursors (
    node         TEXT    NOT NULL,
    tenant       TEXT    NOT NULL,
    subscription TEXT    NOT NULL,
    through      INTEGER NOT NULL,
    PRIMARY KEY (node, tenant, subscription)
) WITHOUT ROWID;
"#,
    // the channel webhook calls owed, queued with their messages
    r#"
CREATE TABLE channel_webhooks (
    seq  INTEGER PRIMARY KEY AUTOINCREMENT,
    node TEXT    NOT NULL,
    call TEXT    NOT NULL
);
"#,
    // entities as a rowid table: rows out of the key's tree
    r#"
CREATE TABLE entities_by_rowid (
    tenant       TEXT    NOT NULL,
    service_path TEXT    NOT NULL,
    id           TEXT    NOT NULL,
    type         TEXT    NOT NULL,
    created      INTEGER NOT NULL,
    json         TEXT    NOT NULL,
    UNIQUE (tenant, service_path, id, type)
);
INSERT INTO entities_by_rowid (tenant, service_path, id, type, created, json)
SELECT tenant, service_path, id, type, created, json FROM entities ORDER BY created;
DROP TABLE entities;
ALTER TABLE entities_by_rowid RENAME TO entities;
"#,
];

/// Settings for the write connection: WAL (readers never block the writer
/// and the writer never blocks readers), the chosen fsync policy, and the
/// page size a new file is created with (see [`PAGE_SIZE`]).
pub(super) fn configure_writer(
    conn: &Connection,
    sync: Synchronous,
    page_size: i64,
    cache_pages: i64,
) -> rusqlite::Result<()> {
    conn.busy_timeout(BUSY_TIMEOUT)?;
    // Only takes effect when the database is created (before WAL mode is
    // set).
    conn.pragma_update(None, "page_size", page_size)?;
    // `journal_mode` answers with the mode actually in effect; WAL is
    // persistent, so this is a no-op after the first open.
    let mode: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        tracing::warn!(%mode, "SQLite refused WAL mode; writes will block reads");
    }
    let level = match sync {
        Synchronous::Full => "FULL",
        Synchronous::Normal => "NORMAL",
    };
    conn.pragma_update(None, "synchronous", level)?;
    // Checkpoints run on the checkpointer's thread, not inside commits.
    conn.pragma_update(None, "wal_autocheckpoint", 0)?;
    // When the WAL starts over, cut its file back to 64 MiB, so a burst
    // does not leave a huge file behind.
    conn.pragma_update(None, "journal_size_limit", 64 * 1024 * 1024)?;
    // Temporary b-trees (sorts of unindexed queries) stay in memory.
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    // Keep the hot index pages in memory: inserts into the random-keyed
    // `data_id` index touch pages all over it, and a miss costs a read.
    conn.pragma_update(None, "cache_size", cache_pages)?;
    Ok(())
}

/// Page size in bytes of the log and main files. Small pages: a commit
/// writes every page it dirtied to the WAL, and inserts into the
/// random-keyed `data_id` index dirty one leaf each, so the WAL volume per
/// uplink is about one page.
pub(super) const PAGE_SIZE: i64 = 1024;

/// Page size in bytes of the history file. Appends cost about one page
/// per series per commit whatever the size (each lands on the last leaf of
/// its series; measured: 1 KiB and 4 KiB pages append at the same rate),
/// while a range read of a series fetches four times fewer 4 KiB pages.
pub(super) const HISTORY_PAGE_SIZE: i64 = 4096;

/// Page cache of the writer connection of the log, main and channels
/// files, in pages (2 MiB of their 1 KiB pages).
///
/// Bigger is slower here. When a b-tree balance swaps two pages' numbers
/// it parks one under the locking page's number (page 1,048,577 at 1 KiB
/// pages), so the commit that follows finds a cached page far beyond the
/// file's end and truncates the page cache by scanning all of its hash
/// table. That scan costs in proportion to the pages cached: with 64 MiB
/// (65,536 pages) it was a fifth of the server's CPU at 5,000 uplinks/s
/// and doubled the live lag (docs/benchmarks.md); at 8,192 pages it was
/// still 28% of the main writer's CPU at 4,000 uplinks/s. 2,048 pages
/// still hold the indexes' interior pages of a large file and the
/// entities of the NGSI benchmark, a miss is a read from the OS's cache,
/// and the main writer's CPU per uplink is 17% lower than at 8,192 (40 s
/// at 5,000 uplinks/s).
pub(super) const WRITER_CACHE_PAGES: i64 = 2 * 1024;

/// Page cache of the history file's writer, in pages (32 MiB of its 4 KiB
/// pages, which then hold the last leaf of every entity's states). Its
/// writer commits a few times a second, so the truncation scan above
/// costs it little.
pub(super) const HISTORY_WRITER_CACHE_PAGES: i64 = 8 * 1024;

/// Page cache of each read connection: 16 MiB.
const READER_CACHE_KIB: i64 = -16 * 1024;

/// Settings for a read connection.
pub(super) fn configure_reader(conn: &Connection) -> rusqlite::Result<()> {
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    conn.pragma_update(None, "cache_size", READER_CACHE_KIB)?;
    Ok(())
}

/// Brings the database up to the latest schema. Returns the version it
/// is at afterwards. A database written by a newer weft (more steps than
/// this build knows) is refused rather than misread.
pub(super) fn migrate(conn: &mut Connection) -> Result<usize, MigrateError> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let current: i64 = tx.pragma_query_value(None, "user_version", |r| r.get(0))?;
    let current = usize::try_from(current).map_err(|_| MigrateError::Version(current))?;
    if current > MIGRATIONS.len() {
        return Err(MigrateError::Newer {
            found: current,
            known: MIGRATIONS.len(),
        });
    }
    for (index, step) in MIGRATIONS.iter().enumerate().skip(current) {
        tx.execute_batch(step)?;
        tracing::debug!(version = index + 1, "applied storage migration");
    }
    if current < MIGRATIONS.len() {
        // One line for the whole run: a fresh database takes every step.
        tracing::info!(
            from = current,
            to = MIGRATIONS.len(),
            "migrated the storage schema"
        );
    }
    if current < MIGRATIONS.len() {
        tx.pragma_update(None, "user_version", MIGRATIONS.len() as i64)?;
    }
    tx.commit()?;
    Ok(MIGRATIONS.len())
}

/// Why [`migrate`] failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum MigrateError {
    /// SQLite failed while migrating.
    #[error("{0}")]
    Sqlite(#[from] rusqlite::Error),
    /// `user_version` holds something no weft writes.
    #[error("the database's schema version {0} is invalid")]
    Version(i64),
    /// The database comes from a newer weft.
    #[error("the database has schema version {found}, newer than this weft knows ({known}); upgrade weft")]
    Newer {
        /// The database's version.
        found: usize,
        /// The newest version this build knows.
        known: usize,
    },
}
