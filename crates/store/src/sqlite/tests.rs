//! Tests of the SQLite backend against real database files in temporary
//! directories: durability across reopen, group commit under concurrency,
//! atomic pipeline batches, queries, overload and shutdown.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tempfile::TempDir;
use weft_model::{DeviceType, NewUplink, UplinkFormat};

use super::{SqliteConfig, SqliteStore, Synchronous};
use crate::conformance::*;
use crate::prelude::*;
use crate::{
    AggrMethod, AggrPeriod, DataQuery, HistoryFeed, HistoryQuery, HistoryRow, ProcessedBatch,
    StoreError,
};

fn config(dir: &TempDir) -> SqliteConfig {
    SqliteConfig {
        path: dir.path().join("data").join("weft.db"),
        ..SqliteConfig::default()
    }
}

fn open(dir: &TempDir) -> SqliteStore {
    SqliteStore::open(config(dir)).expect("open store")
}

/// SQLite under the conformance suite: a temporary directory per test.
struct Sqlite(TempDir);

#[async_trait::async_trait]
impl Backend for Sqlite {
    type Store = SqliteStore;

    async fn fresh() -> Self {
        Sqlite(TempDir::new().unwrap())
    }

    async fn open(&self) -> Arc<SqliteStore> {
        Arc::new(open(&self.0))
    }

    async fn close(store: &SqliteStore) {
        store.close().await;
    }

    async fn append_history(store: &SqliteStore, rows: Vec<HistoryRow>) -> crate::Result<u64> {
        append_history(store, rows).await
    }

    async fn execute(&self, sql: &str) {
        let raw = rusqlite::Connection::open(config(&self.0).path).unwrap();
        raw.execute_batch(sql).unwrap();
    }

    async fn query_i64(&self, sql: &str) -> i64 {
        let raw = rusqlite::Connection::open(config(&self.0).path).unwrap();
        raw.query_row(sql, [], |r| r.get(0)).unwrap()
    }
}

crate::conformance_tests!(Sqlite);

/// History lives in a file of its own beside the main one.
#[tokio::test(flavor = "multi_thread")]
async fn history_is_kept_in_its_own_file() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    append_history(&store, vec![hrow("t", "/", "E", "T", "a", 1, 1.0)])
        .await
        .unwrap();
    store.close().await;
    assert!(dir.path().join("data").join("weft-history.db").exists());
}

/// Stores history rows straight into the history (no feed involved), the
/// way the history writer's moves insert them: the backend's insert, run
/// as one write of the history's file. Answers how many rows were new.
async fn append_history(store: &SqliteStore, rows: Vec<HistoryRow>) -> crate::Result<u64> {
    if rows.is_empty() {
        return Ok(0);
    }
    store
        .history
        .write(move |c| super::history::append_history(c, &rows))
        .await
}

/// Holds SQLite's write lock from a second connection, so the store's
/// writer blocks in `BEGIN IMMEDIATE` until the guard is released: makes
/// "the writer is busy" deterministic.
struct WriteLock(rusqlite::Connection);

impl WriteLock {
    /// Locks the ingest log's file (the writer of appends).
    fn take(dir: &TempDir) -> WriteLock {
        Self::take_file(&super::log_path(&config(dir).path))
    }

    /// Locks the main file (everything but the log).
    fn take_main(dir: &TempDir) -> WriteLock {
        Self::take_file(&config(dir).path)
    }

    fn take_file(path: &std::path::Path) -> WriteLock {
        let conn = rusqlite::Connection::open(path).expect("second connection");
        conn.execute_batch("BEGIN IMMEDIATE")
            .expect("take the write lock");
        WriteLock(conn)
    }

    fn release(self) {
        self.0
            .execute_batch("ROLLBACK")
            .expect("release the write lock");
    }
}

/// Waits until the writer has taken everything out of its queue.
async fn queue_drained(store: &SqliteStore) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.log.ops.capacity() < store.log.ops.max_capacity()
        || store.main.ops.capacity() < store.main.ops.max_capacity()
    {
        assert!(Instant::now() < deadline, "the writer never took its queue");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // Let it get past draining and into `BEGIN`.
    tokio::time::sleep(Duration::from_millis(20)).await;
}

/// 2,000 appends from 100 tasks at once all succeed with distinct seqs,
/// read back in order, and `committed_seq` reaches the highest.
#[tokio::test(flavor = "multi_thread")]
async fn concurrent_appends_get_unique_ordered_seqs() {
    let dir = TempDir::new().unwrap();
    let store = Arc::new(open(&dir));
    let mut watch = store.committed_seq();
    let mut tasks = Vec::new();
    for t in 0..100 {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            let mut seqs = Vec::new();
            for i in 0..20 {
                seqs.push((
                    store.append_uplink(uplink(t * 20 + i)).await.unwrap(),
                    t * 20 + i,
                ));
            }
            seqs
        }));
    }
    let mut acked = Vec::new();
    for task in tasks {
        acked.extend(task.await.unwrap());
    }
    acked.sort();
    let seqs: Vec<u64> = acked.iter().map(|(s, _)| *s).collect();
    assert_eq!(
        seqs,
        (1..=2_000).collect::<Vec<u64>>(),
        "unique, gap-free seqs"
    );

    tokio::time::timeout(Duration::from_secs(5), watch.wait_for(|s| *s == 2_000))
        .await
        .expect("committed_seq reaches the last append")
        .unwrap();

    let log = store.read_uplinks(1, 5_000, None).await.unwrap();
    assert_eq!(log.len(), 2_000);
    for (entry, (seq, i)) in log.iter().zip(&acked) {
        assert_eq!(entry.seq, *seq);
        assert_eq!(
            entry.uplink,
            uplink(*i),
            "seq {seq} holds what was appended"
        );
    }
}

/// One operation failing inside a group commit fails alone: a processed
/// batch whose insert is rejected leaves nothing behind (not even its
/// cursor), while the operations batched with it commit.
#[tokio::test(flavor = "multi_thread")]
async fn a_failing_operation_fails_alone() {
    let dir = TempDir::new().unwrap();
    let store = Arc::new(open(&dir));
    let lock = WriteLock::take_main(&dir);
    lock.0
        .execute_batch(
            "CREATE TRIGGER poison BEFORE INSERT ON data_units WHEN NEW.data_id = 'poison' \
             BEGIN SELECT RAISE(ABORT, 'poisoned unit'); END;",
        )
        .unwrap();
    // A first write occupies the main writer (blocked on the lock) so the
    // next ones queue up and are committed together.
    let first = tokio::spawn({
        let store = Arc::clone(&store);
        async move { store.put_device_type("first", &DeviceType::default()).await }
    });
    queue_drained(&store).await;
    let bad = tokio::spawn({
        let store = Arc::clone(&store);
        async move {
            store
                .commit_processed(Arc::new(ProcessedBatch {
                    consumers: vec!["pipeline".into()],
                    next_seq: 9,
                    units: vec![
                        unit("fine", "d", "c", "t", 1),
                        unit("poison", "d", "c", "t", 2),
                    ],
                    ..ProcessedBatch::default()
                }))
                .await
        }
    });
    let good = tokio::spawn({
        let store = Arc::clone(&store);
        async move {
            store
                .commit_processed(Arc::new(ProcessedBatch {
                    consumers: vec!["other".into()],
                    next_seq: 4,
                    units: vec![unit("good", "d", "c", "t", 3)],
                    ..ProcessedBatch::default()
                }))
                .await
        }
    });
    let append = tokio::spawn({
        let store = Arc::clone(&store);
        async move { store.append_uplink(uplink(1)).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Commit (not roll back) so the trigger exists when the writer runs.
    lock.0.execute_batch("COMMIT").unwrap();

    assert!(first.await.unwrap().unwrap());
    let err = bad.await.unwrap().unwrap_err();
    assert!(err.to_string().contains("poisoned unit"), "{err}");
    assert_eq!(good.await.unwrap().unwrap().inserted, [true]);
    // The log has a writer of its own: the append went through regardless.
    assert_eq!(append.await.unwrap().unwrap(), 1);

    let all = store
        .query_data(&DataQuery {
            limit: 10,
            ..DataQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(data_ids(&all), ["good"]);
    assert_eq!(store.cursor("pipeline").await.unwrap(), 1);
    assert_eq!(store.cursor("other").await.unwrap(), 4);
}

/// With a one-slot queue and the writer stuck, further writes fail at once
/// with `Overloaded` instead of waiting, and every acknowledged write is
/// stored.
#[tokio::test(flavor = "multi_thread")]
async fn full_queue_is_overloaded_and_loses_nothing() {
    let dir = TempDir::new().unwrap();
    let store = Arc::new(
        SqliteStore::open(SqliteConfig {
            queue_capacity: 1,
            ..config(&dir)
        })
        .unwrap(),
    );
    let lock = WriteLock::take(&dir);
    let occupying = tokio::spawn({
        let store = Arc::clone(&store);
        async move { store.append_uplink(uplink(0)).await }
    });
    queue_drained(&store).await;

    let mut tries = Vec::new();
    for i in 1..=50 {
        let store = Arc::clone(&store);
        tries.push(tokio::spawn(async move {
            (i, store.append_uplink(uplink(i)).await)
        }));
    }
    // Give every try time to be turned away before the writer frees up.
    tokio::time::sleep(Duration::from_millis(100)).await;
    lock.release();

    let mut acked = vec![(0, occupying.await.unwrap().unwrap())];
    let mut overloaded = 0;
    for t in tries {
        match t.await.unwrap() {
            (i, Ok(seq)) => acked.push((i, seq)),
            (_, Err(StoreError::Overloaded)) => overloaded += 1,
            (i, Err(e)) => panic!("append {i} failed with {e}"),
        }
    }
    assert!(overloaded >= 48, "only {overloaded} of 50 were turned away");
    let log = store.read_uplinks(1, 100, None).await.unwrap();
    assert_eq!(log.len(), acked.len());
    for (i, seq) in acked {
        let entry = log
            .iter()
            .find(|u| u.seq == seq)
            .expect("acknowledged entry stored");
        assert_eq!(entry.uplink, uplink(i));
    }
}

/// `ping` round-trips through the writer; after `close` (idempotent),
/// writes fail with `Closed` while reads still work, and what was queued
/// before `close` was committed.
#[tokio::test(flavor = "multi_thread")]
async fn close_commits_the_queue_then_refuses_writes() {
    let dir = TempDir::new().unwrap();
    let store = Arc::new(open(&dir));
    store.ping().await.unwrap();
    let pending: Vec<_> = (0..100)
        .map(|i| {
            let store = Arc::clone(&store);
            tokio::spawn(async move { store.append_uplink(uplink(i)).await })
        })
        .collect();
    // Let the appends reach the queue before closing behind them.
    tokio::time::sleep(Duration::from_millis(20)).await;
    store.close().await;
    store.close().await;
    let mut ok = 0;
    for p in pending {
        match p.await.unwrap() {
            Ok(_) => ok += 1,
            Err(StoreError::Closed) => {}
            Err(e) => panic!("unexpected {e}"),
        }
    }
    assert_eq!(store.read_uplinks(1, 1_000, None).await.unwrap().len(), ok);

    assert!(matches!(
        store.append_uplink(uplink(0)).await,
        Err(StoreError::Closed)
    ));
    assert!(matches!(store.ping().await, Err(StoreError::Closed)));
    assert!(matches!(
        store.put_device_type("t", &DeviceType::default()).await,
        Err(StoreError::Closed)
    ));
}

/// Dropping the store without `close` still lets the writer finish and
/// stop on its own.
#[tokio::test(flavor = "multi_thread")]
async fn dropping_the_store_stops_the_writer() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    store.append_uplink(uplink(0)).await.unwrap();
    let mut stopped = store.log.stopped.clone();
    drop(store);
    let done = tokio::time::timeout(Duration::from_secs(5), stopped.wait_for(|s| *s)).await;
    assert!(matches!(done, Ok(Ok(_))), "writer did not stop");
    let store = open(&dir);
    assert_eq!(store.read_uplinks(1, 10, None).await.unwrap().len(), 1);
}

/// Entities stored in the `WITHOUT ROWID` table of step 2 survive step
/// 19's move to a rowid table: read back in creation order, replaced
/// (still one row), deleted, and created anew, across a reopen.
#[tokio::test(flavor = "multi_thread")]
async fn entities_survive_the_move_to_a_rowid_table() {
    let dir = TempDir::new().unwrap();
    let path = config(&dir).path;
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let raw = rusqlite::Connection::open(&path).unwrap();
    for step in &super::schema::MIGRATIONS[..18] {
        raw.execute_batch(step).unwrap();
    }
    raw.execute_batch(
        "INSERT INTO entities VALUES ('t', '/', 'B', 'T', 2, '{\"b\":1}');
         INSERT INTO entities VALUES ('t', '/', 'A', 'T', 1, '{\"a\":1}');
         INSERT INTO entities VALUES ('u', '/x', 'A', 'T', 3, '{\"a\":2}');
         PRAGMA user_version = 18;",
    )
    .unwrap();
    drop(raw);
    let store = open(&dir);
    let loaded = |store: SqliteStore| async move {
        let records = store.load_entities().await.unwrap();
        let loaded: Vec<(String, String, u64, String)> = records
            .into_iter()
            .map(|r| (r.tenant, r.id, r.created, r.json))
            .collect();
        (store, loaded)
    };
    let (store, entities) = loaded(store).await;
    assert_eq!(
        entities,
        [
            ("t".into(), "A".into(), 1, r#"{"a":1}"#.into()),
            ("t".into(), "B".into(), 2, r#"{"b":1}"#.into()),
            ("u".into(), "A".into(), 3, r#"{"a":2}"#.into()),
        ]
    );
    let record = |id: &str, created: u64, json: &str| crate::EntityRecord {
        tenant: "t".into(),
        service_path: "/".into(),
        id: id.into(),
        entity_type: "T".into(),
        created,
        json: json.into(),
    };
    store
        .put_entity(record("A", 1, r#"{"a":9}"#), Default::default(), None)
        .await
        .unwrap();
    assert!(store.delete_entity("t", "/", "B", "T", None).await.unwrap());
    assert!(!store.delete_entity("t", "/", "B", "T", None).await.unwrap());
    store
        .put_entity(record("B", 4, r#"{"b":2}"#), Default::default(), None)
        .await
        .unwrap();
    store.close().await;
    let (_store, entities) = loaded(open(&dir)).await;
    assert_eq!(
        entities,
        [
            ("t".into(), "A".into(), 1, r#"{"a":9}"#.into()),
            ("u".into(), "A".into(), 3, r#"{"a":2}"#.into()),
            ("t".into(), "B".into(), 4, r#"{"b":2}"#.into()),
        ]
    );
    let raw = rusqlite::Connection::open(&path).unwrap();
    let without_rowid: i64 = raw
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE name = 'entities' AND sql LIKE '%WITHOUT ROWID%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(without_rowid, 0, "entities is a rowid table");
}

/// History stored before rows had an instance, and before states were
/// stored whole, survives the migration steps that change its layout: the
/// old rows read back (instance 0), their rollups still aggregate, and a
/// second state at one of their times is a row of its own.
#[tokio::test(flavor = "multi_thread")]
async fn history_rows_survive_the_layout_migrations() {
    let dir = TempDir::new().unwrap();
    std::fs::create_dir_all(dir.path().join("data")).unwrap();
    let history = dir.path().join("data").join("weft-history.db");
    let raw = rusqlite::Connection::open(&history).unwrap();
    // The history as step 10 left it, holding two rows of one state.
    for step in &super::schema::MIGRATIONS[..10] {
        raw.execute_batch(step).unwrap();
    }
    raw.execute_batch(
        "INSERT INTO history VALUES ('t', 'E', 'T', 'a', 1000, '/', 'Number', '7', 7.0);
         INSERT INTO history VALUES ('t', 'E', 'T', 'b', 1000, '/', 'Text', '\"x\"', NULL);
         INSERT INTO history_entities VALUES ('t', 'T', 'E', '/');
         INSERT INTO history_rollups VALUES ('t', 'E', 'T', 'a', 60000, 0, 1, 1, 7.0, 7.0, 7.0);
         INSERT INTO history_rollups VALUES ('t', 'E', 'T', 'a', 3600000, 0, 1, 1, 7.0, 7.0, 7.0);
         INSERT INTO history_rollups VALUES ('t', 'E', 'T', 'b', 60000, 0, 1, 0, NULL, NULL, NULL);
         INSERT INTO history_rollups VALUES ('t', 'E', 'T', 'b', 3600000, 0, 1, 0, NULL, NULL, NULL);
         PRAGMA user_version = 10;",
    )
    .unwrap();
    drop(raw);
    let store = open(&dir);
    let mut second = hrow("t", "/", "E", "T", "a", 1000, 8.0);
    second.instance = 5;
    assert_eq!(append_history(&store, vec![second]).await.unwrap(), 1);
    let rows = store
        .query_history(&HistoryQuery {
            tenant: "t".into(),
            limit: 10,
            ..HistoryQuery::default()
        })
        .await
        .unwrap();
    type Row<'a> = (&'a str, &'a str, &'a str, i64, i64, Option<f64>);
    let got: Vec<Row<'_>> = rows
        .iter()
        .map(|r| {
            (
                r.attr.as_str(),
                r.attr_type.as_str(),
                r.value.as_str(),
                r.time,
                r.instance,
                r.number,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("a", "Number", "7", 1000, 0, Some(7.0)),
            ("a", "Number", "8.0", 1000, 5, Some(8.0)),
            ("b", "Text", "\"x\"", 1000, 0, None),
        ]
    );
    let count = store
        .aggregate_history(
            &HistoryQuery {
                tenant: "t".into(),
                attrs: vec!["a".into()],
                ..HistoryQuery::default()
            },
            AggrMethod::Sum,
            Some(AggrPeriod::Hour),
        )
        .await
        .unwrap();
    assert_eq!(count.len(), 1);
    assert_eq!(count[0].value, Some(15.0));
    assert_eq!(
        store.history_entities("t", None, None).await.unwrap().len(),
        1
    );
}

/// A database from a newer weft is refused instead of misread.
#[tokio::test(flavor = "multi_thread")]
async fn newer_schema_is_refused() {
    let dir = TempDir::new().unwrap();
    open(&dir).close().await;
    let raw = rusqlite::Connection::open(config(&dir).path).unwrap();
    raw.pragma_update(None, "user_version", 999).unwrap();
    drop(raw);
    let err = SqliteStore::open(config(&dir)).unwrap_err();
    assert!(err.to_string().contains("newer"), "{err}");
}

/// Throughput, not a correctness test (run it in release with
/// `cargo test -p weft-store --release -- --ignored --nocapture`):
/// durable appends per second from 256 concurrent tasks with
/// `synchronous = FULL`, and the time of `commit_processed` batches of
/// 1,000 units.
#[tokio::test(flavor = "multi_thread")]
#[ignore]
async fn throughput() {
    const TASKS: usize = 256;
    const APPENDS: usize = 100_000;
    let dir = TempDir::new().unwrap();
    let store = Arc::new(
        SqliteStore::open(SqliteConfig {
            synchronous: Synchronous::Full,
            ..config(&dir)
        })
        .unwrap(),
    );
    let body = br#"{"uuid":"0b5c9e1e-7a52-4c8e-9d0e-3f1f6f0a9b11","deviceId":"thermo-0042","channel":"north","payload":"AQIDBAUGBwg=","port":2,"measures":{"temperature":{"celsius":21.5},"humidity":{"percent":40}}}"#;
    let started = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                for _ in 0..APPENDS / TASKS {
                    store
                        .append_uplink(NewUplink {
                            partition: 0,
                            received_at: 1,
                            format: UplinkFormat::SensaeEncoded,
                            channel: Some("north".to_string()),
                            device_type: Some("thermo".to_string()),
                            body: body.to_vec(),
                            event: None,
                            device_id: None,
                            source: None,
                            pins: Default::default(),
                        })
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let elapsed = started.elapsed();
    let done = APPENDS / TASKS * TASKS;
    println!(
        "appends: {done} from {TASKS} tasks in {:.2?} = {:.0} appends/s (synchronous=FULL)",
        elapsed,
        done as f64 / elapsed.as_secs_f64()
    );

    const BATCHES: usize = 20;
    let mut times = Vec::new();
    for b in 0..BATCHES {
        let units = (0..1_000)
            .map(|i| {
                unit(
                    &format!("b{b}-u{i}"),
                    &format!("dev-{}", i % 50),
                    "north",
                    "thermo",
                    i,
                )
            })
            .collect();
        let batch = ProcessedBatch {
            consumers: vec!["pipeline".into()],
            next_seq: (b as u64 + 1) * 1_000,
            units,
            ..ProcessedBatch::default()
        };
        let started = Instant::now();
        store.commit_processed(Arc::new(batch)).await.unwrap();
        times.push(started.elapsed());
    }
    times.sort();
    let total: Duration = times.iter().sum();
    println!(
        "commit_processed: {BATCHES} batches of 1000 units, median {:.2?}, max {:.2?} = {:.0} units/s",
        times[BATCHES / 2],
        times[BATCHES - 1],
        (BATCHES * 1_000) as f64 / total.as_secs_f64()
    );
    store.close().await;
}

// --- history ------------------------------------------------------------

/// Measures history appends (1,000,000 rows in batches of 1,000 from 8
/// tasks over 8,000 series, then 100,000 notify-shaped appends of 2 rows
/// from 256 tasks; `synchronous = FULL`), then builds one series of
/// `HISTORY_BENCH_SERIES` rows (default 10,000,000, one per second) and
/// times `last_n = 100` and a one-day hourly average over it.
/// `cargo test -p weft-store --release -- --ignored --nocapture history_throughput`
#[tokio::test(flavor = "multi_thread")]
#[ignore]
async fn history_throughput() {
    const TASKS: usize = 8;
    const ROWS: usize = 1_000_000;
    const BATCH: usize = 1_000;
    let dir = TempDir::new().unwrap();
    let store = Arc::new(
        SqliteStore::open(SqliteConfig {
            synchronous: Synchronous::Full,
            ..config(&dir)
        })
        .unwrap(),
    );
    let started = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                // Each batch: 500 rooms of this task × 2 attributes at one time.
                for step in 0..ROWS / TASKS / BATCH {
                    let time = 1_704_067_200_000 + step as i64 * 1_000;
                    let mut rows = Vec::with_capacity(BATCH);
                    for room in 0..BATCH / 2 {
                        let id = format!("urn:ngsi-ld:Room:{}", task * BATCH / 2 + room);
                        let t = 20.0 + (room % 10) as f64 / 10.0;
                        rows.push(hrow("", "/", &id, "Room", "temperature", time, t));
                        rows.push(hrow("", "/", &id, "Room", "pressure", time, 720.0));
                    }
                    assert_eq!(append_history(&store, rows).await.unwrap(), BATCH as u64);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let elapsed = started.elapsed();
    println!(
        "history appends: {ROWS} rows in batches of {BATCH} from {TASKS} tasks in {elapsed:.2?} = {:.0} rows/s (synchronous=FULL)",
        ROWS as f64 / elapsed.as_secs_f64()
    );

    // Notify-shaped: one entity with two attributes per append (QuantumLeap's
    // k6 body), from 256 concurrent callers.
    const CALLERS: usize = 256;
    const NOTIFIES: usize = 100_000;
    let started = Instant::now();
    let tasks: Vec<_> = (0..CALLERS)
        .map(|caller| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                for n in 0..NOTIFIES / CALLERS {
                    let id = format!("urn:ngsi-ld:Sensor:{}", caller * 16 + n % 16);
                    let time = 1_704_067_200_000 + n as i64 * 1_000;
                    let rows = vec![
                        hrow("", "/", &id, "Room", "temperature", time, 23.3),
                        hrow("", "/", &id, "Room", "pressure", time, 720.0),
                    ];
                    assert_eq!(append_history(&store, rows).await.unwrap(), 2);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let elapsed = started.elapsed();
    let done = NOTIFIES / CALLERS * CALLERS;
    println!(
        "notify-shaped appends: {done} appends of 2 rows from {CALLERS} tasks in {elapsed:.2?} = {:.0} appends/s, {:.0} rows/s",
        done as f64 / elapsed.as_secs_f64(),
        2.0 * done as f64 / elapsed.as_secs_f64()
    );

    let series: usize = std::env::var("HISTORY_BENCH_SERIES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000_000);
    const T0: i64 = 1_600_000_000_000;
    let started = Instant::now();
    let mut pending = Vec::new();
    for start in (0..series).step_by(10_000) {
        let rows: Vec<HistoryRow> = (start..(start + 10_000).min(series))
            .map(|i| {
                hrow(
                    "",
                    "/",
                    "Big:1",
                    "Big",
                    "temperature",
                    T0 + i as i64 * 1_000,
                    (i % 1_000) as f64,
                )
            })
            .collect();
        let store = Arc::clone(&store);
        pending.push(tokio::spawn(async move {
            append_history(&store, rows).await.unwrap()
        }));
        if pending.len() == 8 {
            for p in pending.drain(..) {
                p.await.unwrap();
            }
        }
    }
    for p in pending {
        p.await.unwrap();
    }
    let elapsed = started.elapsed();
    println!(
        "one series of {series} rows appended in {elapsed:.2?} = {:.0} rows/s",
        series as f64 / elapsed.as_secs_f64()
    );
    let last = HistoryQuery {
        tenant: String::new(),
        entity_ids: vec!["Big:1".into()],
        entity_type: Some("Big".into()),
        attrs: vec!["temperature".into()],
        last_n: Some(100),
        limit: 10_000,
        ..HistoryQuery::default()
    };
    let mut timings = Vec::new();
    for _ in 0..20 {
        let started = Instant::now();
        let rows = store.query_history(&last).await.unwrap();
        timings.push(started.elapsed());
        assert_eq!(rows.len(), 100);
    }
    timings.sort();
    println!(
        "last_n=100 on {series} rows: median {:.2?}, max {:.2?}",
        timings[10], timings[19]
    );
    // A day in the middle of the series: 86,400 rows into 24 buckets.
    let day_start = T0 + (series as i64 / 2) * 1_000;
    let day = HistoryQuery {
        from: Some(day_start - day_start.rem_euclid(86_400_000)),
        to: Some(day_start - day_start.rem_euclid(86_400_000) + 86_400_000 - 1),
        last_n: None,
        ..last.clone()
    };
    let mut timings = Vec::new();
    for _ in 0..20 {
        let started = Instant::now();
        let aggs = store
            .aggregate_history(&day, AggrMethod::Avg, Some(AggrPeriod::Hour))
            .await
            .unwrap();
        timings.push(started.elapsed());
        assert_eq!(
            aggs.len(),
            if series >= 2 * 86_400 { 24 } else { aggs.len() }
        );
    }
    timings.sort();
    println!(
        "one-day hourly avg on {series} rows: median {:.2?}, max {:.2?}",
        timings[10], timings[19]
    );
    let started = Instant::now();
    let rows = store
        .query_history(&HistoryQuery {
            last_n: None,
            from: day.from,
            limit: 10_000,
            ..last.clone()
        })
        .await
        .unwrap();
    println!(
        "10,000 rows from the middle of {series} rows: {:.2?}",
        started.elapsed()
    );
    assert_eq!(rows.len(), 10_000);
    store.close().await;
}

/// Feed entries queued as JSON text (before the compact form) are still
/// read, beside compact ones, in order.
#[tokio::test]
async fn json_feed_entries_queued_before_are_still_read() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    store
        .queue_history(&crate::HistoryStates::from(vec![feed_row("N", 1)]))
        .await
        .unwrap();
    store.close().await;
    let json = serde_json::to_string(&vec![feed_row("N", 2), feed_row("M", 3)]).unwrap();
    let raw = rusqlite::Connection::open(super::history_path(&config(&dir).path)).unwrap();
    raw.execute("INSERT INTO history_feed (rows) VALUES (?1)", [json])
        .unwrap();
    drop(raw);
    let store = open(&dir);
    let entries = store
        .read_history_feed(HistoryFeed::Notifications, 0, 100)
        .await
        .unwrap();
    assert_eq!(
        entries,
        vec![
            (1, vec![feed_row("N", 1)]),
            (2, vec![feed_row("N", 2), feed_row("M", 3)])
        ]
    );
    store.close().await;
}

/// Changes committed together queue their history rows as one feed entry
/// (the main writer's transaction), and a write that fails after queueing
/// rows leaves none of them in it.
#[tokio::test(flavor = "multi_thread")]
async fn changes_of_one_transaction_share_a_feed_entry_and_failed_ones_queue_nothing() {
    let dir = TempDir::new().unwrap();
    let store = Arc::new(open(&dir));
    let writes: Vec<_> = (0..200)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let rows = vec![feed_row(&format!("E{i}"), i)];
                store
                    .main
                    .write(move |c| {
                        super::history::queue_history(c, &rows)?;
                        if i % 3 == 0 {
                            // Fails after queueing: its rows must go too.
                            c.execute("INSERT INTO no_such_table VALUES (1)", [])?;
                        }
                        Ok::<_, rusqlite::Error>(())
                    })
                    .await
                    .is_ok()
            })
        })
        .collect();
    let mut ok = Vec::new();
    for (i, w) in writes.into_iter().enumerate() {
        if w.await.unwrap() {
            ok.push(i as i64);
        }
    }
    assert_eq!(ok.len(), 133);
    let entries = store
        .read_history_feed(HistoryFeed::Changes, 0, 1_000)
        .await
        .unwrap();
    assert!(entries.len() < ok.len(), "{} entries", entries.len());
    let mut queued: Vec<i64> = entries
        .into_iter()
        .flat_map(|(_, rows)| rows)
        .map(|r| r.time)
        .collect();
    queued.sort_unstable();
    assert_eq!(queued, ok);
}

/// An attribute whose name JSON must escape is read back like any other,
/// beside one that needs no escaping, alone and together.
#[tokio::test]
async fn attribute_names_json_escapes_read_back() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    let rows = vec![
        hrow("t", "/", "E", "T", "x", 1_000, 1.0),
        hrow("t", "/", "E", "T", "q\"uote\\", 1_000, 2.0),
    ];
    append_history(&store, rows).await.unwrap();
    for (attrs, want) in [
        (vec!["x"], vec![("x", 1.0)]),
        (vec!["q\"uote\\"], vec![("q\"uote\\", 2.0)]),
        (vec![], vec![("q\"uote\\", 2.0), ("x", 1.0)]),
    ] {
        let got = store
            .query_history(&HistoryQuery {
                tenant: "t".into(),
                attrs: attrs.iter().map(|a| a.to_string()).collect(),
                limit: 10,
                ..HistoryQuery::default()
            })
            .await
            .unwrap();
        let got: Vec<(&str, f64)> = got
            .iter()
            .map(|r| (r.attr.as_str(), r.number.unwrap()))
            .collect();
        assert_eq!(got, want, "{attrs:?}");
    }
}

/// A move whose every state the filter refuses (notifications already past
/// their retention) still consumes the feed, and the next move stores what
/// comes after.
#[tokio::test]
async fn a_move_of_only_refused_states_consumes_the_feed() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    let seq = store
        .queue_history(&crate::HistoryStates::from(vec![feed_row("Old", 1)]))
        .await
        .unwrap();
    let moved = store
        .move_history_feed(HistoryFeed::Notifications, &[], 100, &|_| false)
        .await
        .unwrap();
    assert_eq!((moved.through, moved.rows), (Some(seq), 0));
    assert!(store
        .read_history_feed(HistoryFeed::Notifications, 0, 100)
        .await
        .unwrap()
        .is_empty());
    store
        .queue_history(&crate::HistoryStates::from(vec![feed_row("New", 2)]))
        .await
        .unwrap();
    let moved = store
        .move_history_feed(HistoryFeed::Notifications, &[], 100, &|_| true)
        .await
        .unwrap();
    assert_eq!(moved.rows, 1);
    let rows = store
        .query_history(&HistoryQuery {
            limit: 10,
            ..HistoryQuery::default()
        })
        .await
        .unwrap();
    let ids: Vec<&str> = rows.iter().map(|r| r.entity_id.as_str()).collect();
    assert_eq!(ids, ["New"]);
}
