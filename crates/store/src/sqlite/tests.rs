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
    AggrMethod, AggrPeriod, DataQuery, HistoryAggregate, HistoryEntity, HistoryFeed, HistoryQuery,
    HistoryRow, ProcessedBatch, StoreError,
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

    async fn execute(&self, sql: &str) {
        let raw = rusqlite::Connection::open(config(&self.0).path).unwrap();
        raw.execute_batch(sql).unwrap();
    }
}

crate::conformance_tests!(Sqlite);

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

    let log = store.read_uplinks(1, 5_000).await.unwrap();
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
                    consumer: "pipeline".to_string(),
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
                    consumer: "other".to_string(),
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
    let log = store.read_uplinks(1, 100).await.unwrap();
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
    assert_eq!(store.read_uplinks(1, 1_000).await.unwrap().len(), ok);

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
    assert_eq!(store.read_uplinks(1, 10).await.unwrap().len(), 1);
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
                            received_at: 1,
                            format: UplinkFormat::SensaeEncoded,
                            channel: Some("north".to_string()),
                            device_type: Some("thermo".to_string()),
                            body: body.to_vec(),
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
            consumer: "pipeline".to_string(),
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

/// A numeric history row.
fn hrow(tenant: &str, path: &str, id: &str, ty: &str, attr: &str, time: i64, n: f64) -> HistoryRow {
    HistoryRow {
        tenant: tenant.into(),
        service_path: path.into(),
        entity_id: id.into(),
        entity_type: ty.into(),
        attr: attr.into(),
        attr_type: "Number".into(),
        time,
        value: serde_json::to_string(&n).unwrap(),
        number: Some(n),
    }
}

/// A text history row (no number).
fn hrow_text(
    tenant: &str,
    path: &str,
    id: &str,
    ty: &str,
    attr: &str,
    time: i64,
    s: &str,
) -> HistoryRow {
    HistoryRow {
        attr_type: "Text".into(),
        value: serde_json::to_string(s).unwrap(),
        number: None,
        ..hrow(tenant, path, id, ty, attr, time, 0.0)
    }
}

/// A query of tenant `t` with the API's default limit.
fn hquery() -> HistoryQuery {
    HistoryQuery {
        tenant: "t".into(),
        limit: 10_000,
        ..HistoryQuery::default()
    }
}

/// (entity id, entity type, attribute, time) of each row, in order.
fn keys(rows: &[HistoryRow]) -> Vec<(String, String, String, i64)> {
    rows.iter()
        .map(|r| {
            (
                r.entity_id.clone(),
                r.entity_type.clone(),
                r.attr.clone(),
                r.time,
            )
        })
        .collect()
}

fn key(id: &str, ty: &str, attr: &str, time: i64) -> (String, String, String, i64) {
    (id.into(), ty.into(), attr.into(), time)
}

fn times(rows: &[HistoryRow]) -> Vec<i64> {
    rows.iter().map(|r| r.time).collect()
}

/// Appending is idempotent on (tenant, entity, attribute, time): a replay
/// stores nothing twice and the answer counts only new rows; what was
/// acknowledged survives a reopen, in its own file.
#[tokio::test(flavor = "multi_thread")]
async fn history_append_is_idempotent_and_survives_reopen() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    let first: Vec<HistoryRow> = (0..5)
        .map(|i| {
            hrow(
                "t",
                "/",
                "Room:1",
                "Room",
                "temperature",
                1_000 * i,
                i as f64,
            )
        })
        .collect();
    assert_eq!(append_history(&store, first.clone()).await.unwrap(), 5);
    assert_eq!(append_history(&store, first.clone()).await.unwrap(), 0);
    assert_eq!(append_history(&store, Vec::new()).await.unwrap(), 0);
    // Overlapping replay: two old keys (with other values, which do not
    // overwrite), one new, and a duplicate within the batch.
    let mut changed = hrow("t", "/", "Room:1", "Room", "temperature", 0, 99.0);
    changed.value = "99".into();
    let overlap = vec![
        changed,
        hrow("t", "/", "Room:1", "Room", "temperature", 4_000, 4.0),
        hrow("t", "/", "Room:1", "Room", "temperature", 5_000, 5.0),
        hrow("t", "/", "Room:1", "Room", "temperature", 5_000, 5.0),
    ];
    assert_eq!(append_history(&store, overlap).await.unwrap(), 1);
    // Concurrent replays of one batch store it once.
    let store = Arc::new(store);
    let batch: Vec<HistoryRow> = (0..100)
        .map(|i| hrow("t", "/", "Room:2", "Room", "pressure", i, 1.0))
        .collect();
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (store, batch) = (Arc::clone(&store), batch.clone());
            tokio::spawn(async move { append_history(&store, batch).await.unwrap() })
        })
        .collect();
    let mut new = 0;
    for t in tasks {
        new += t.await.unwrap();
    }
    assert_eq!(new, 100);
    store.close().await;
    drop(store);
    assert!(dir.path().join("data").join("weft-history.db").exists());

    let store = open(&dir);
    let rows = store
        .query_history(&HistoryQuery {
            entity_ids: vec!["Room:1".into()],
            ..hquery()
        })
        .await
        .unwrap();
    assert_eq!(times(&rows), vec![0, 1_000, 2_000, 3_000, 4_000, 5_000]);
    assert_eq!(rows[0], first[0], "the first value stays");
    let rows = store
        .query_history(&HistoryQuery {
            entity_ids: vec!["Room:2".into()],
            ..hquery()
        })
        .await
        .unwrap();
    assert_eq!(rows.len(), 100);
}

/// The rows of the query tests: tenant `t` has Room:1 (as a Room under
/// `/a`, 10 temperatures and a name; and as an `Other` under `/a`),
/// Room:2 under `/a/b`, Room:3 under `/ab`, Car:1 under `/`; tenant `u`
/// has its own Room:1.
fn query_fixture() -> Vec<HistoryRow> {
    let mut rows: Vec<HistoryRow> = (1..=10)
        .map(|i| {
            hrow(
                "t",
                "/a",
                "Room:1",
                "Room",
                "temperature",
                1_000 * i,
                i as f64,
            )
        })
        .collect();
    rows.push(hrow_text("t", "/a", "Room:1", "Room", "name", 1_000, "r1"));
    rows.push(hrow(
        "t",
        "/a",
        "Room:1",
        "Other",
        "temperature",
        1_000,
        99.0,
    ));
    rows.push(hrow(
        "t",
        "/a/b",
        "Room:2",
        "Room",
        "temperature",
        1_000,
        20.0,
    ));
    rows.push(hrow(
        "t",
        "/a/b",
        "Room:2",
        "Room",
        "temperature",
        2_000,
        21.0,
    ));
    rows.push(hrow(
        "t",
        "/ab",
        "Room:3",
        "Room",
        "temperature",
        1_000,
        30.0,
    ));
    rows.push(hrow("t", "/", "Car:1", "Car", "speed", 5_000, 50.0));
    rows.push(hrow(
        "u",
        "/a",
        "Room:1",
        "Room",
        "temperature",
        1_000,
        555.0,
    ));
    rows
}

/// Queries select series by ids, type, attributes and service-path
/// prefix; rows by inclusive time range, then `last_n`, `offset` and
/// `limit` per series; results are ordered by entity, attribute, time.
#[tokio::test(flavor = "multi_thread")]
async fn history_queries_filter_and_order() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    append_history(&store, query_fixture()).await.unwrap();
    let q = |f: fn(&mut HistoryQuery)| {
        let mut q = hquery();
        f(&mut q);
        q
    };
    let run = |q: HistoryQuery| {
        let store = &store;
        async move { store.query_history(&q).await.unwrap() }
    };

    // One entity by id and type: every attribute, ordered by name.
    let rows = run(q(|q| {
        q.entity_ids = vec!["Room:1".into()];
        q.entity_type = Some("Room".into());
    }))
    .await;
    assert_eq!(rows.len(), 11);
    assert_eq!(
        rows[0],
        hrow_text("t", "/a", "Room:1", "Room", "name", 1_000, "r1")
    );
    assert_eq!(
        times(&rows[1..]),
        (1..=10).map(|i| i * 1_000).collect::<Vec<_>>()
    );

    // By id alone: both types, ordered by (id, type).
    let rows = run(q(|q| {
        q.entity_ids = vec!["Room:1".into(), "Room:2".into()];
        q.attrs = vec!["temperature".into()];
        q.last_n = Some(1);
    }))
    .await;
    assert_eq!(
        keys(&rows),
        vec![
            key("Room:1", "Other", "temperature", 1_000),
            key("Room:1", "Room", "temperature", 10_000),
            key("Room:2", "Room", "temperature", 2_000),
        ]
    );

    // By type, with a service-path prefix: `/a` covers `/a/b`, not `/ab`.
    let rows = run(q(|q| {
        q.entity_type = Some("Room".into());
        q.attrs = vec!["temperature".into()];
        q.service_path = Some("/a".into());
        q.limit = 1;
    }))
    .await;
    assert_eq!(
        keys(&rows),
        vec![
            key("Room:1", "Room", "temperature", 1_000),
            key("Room:2", "Room", "temperature", 1_000),
        ]
    );
    let ids = |rows: &[HistoryRow]| {
        let mut ids: Vec<String> = rows.iter().map(|r| r.entity_id.clone()).collect();
        ids.dedup();
        ids
    };
    let under = |path: &str| {
        let mut q = hquery();
        q.service_path = Some(path.into());
        q
    };
    assert_eq!(
        ids(&run(under("/")).await),
        vec!["Car:1", "Room:1", "Room:2", "Room:3"]
    );
    assert_eq!(ids(&run(under("/ab")).await), vec!["Room:3"]);
    assert_eq!(ids(&run(under("/a/b")).await), vec!["Room:2"]);
    assert_eq!(ids(&run(under("/a/")).await), vec!["Room:1", "Room:2"]);
    assert!(
        run(under("/A")).await.is_empty(),
        "paths are case-sensitive"
    );
    assert!(run(under("/_b")).await.is_empty(), "no LIKE wildcards");
    // No type, no ids: every entity of the tenant.
    assert_eq!(
        ids(&run(hquery()).await),
        vec!["Car:1", "Room:1", "Room:2", "Room:3"]
    );

    // Time range, inclusive at both ends.
    let temps = |f: fn(&mut HistoryQuery)| {
        let mut q = hquery();
        q.entity_ids = vec!["Room:1".into()];
        q.entity_type = Some("Room".into());
        q.attrs = vec!["temperature".into()];
        f(&mut q);
        q
    };
    let window = run(temps(|q| {
        q.from = Some(3_000);
        q.to = Some(5_000);
    }))
    .await;
    assert_eq!(times(&window), vec![3_000, 4_000, 5_000]);
    assert_eq!(window[0].number, Some(3.0));
    // last_n: the newest N, ascending; within the range when one is given.
    assert_eq!(
        times(&run(temps(|q| q.last_n = Some(3))).await),
        vec![8_000, 9_000, 10_000]
    );
    assert_eq!(
        times(
            &run(temps(|q| {
                q.last_n = Some(3);
                q.to = Some(5_000);
            }))
            .await
        ),
        vec![3_000, 4_000, 5_000]
    );
    assert_eq!(times(&run(temps(|q| q.last_n = Some(50))).await).len(), 10);
    // offset and limit apply after last_n.
    assert_eq!(
        times(
            &run(temps(|q| {
                q.last_n = Some(3);
                q.offset = 1;
                q.limit = 1;
            }))
            .await
        ),
        vec![9_000]
    );
    assert_eq!(
        times(
            &run(temps(|q| {
                q.offset = 2;
                q.limit = 3;
            }))
            .await
        ),
        vec![3_000, 4_000, 5_000]
    );
    assert!(run(temps(|q| q.limit = 0)).await.is_empty());
    assert!(run(temps(|q| q.last_n = Some(0))).await.is_empty());
    assert!(run(temps(|q| q.attrs = vec!["nope".into()]))
        .await
        .is_empty());
    assert!(run(q(|q| q.entity_ids = vec!["nope".into()]))
        .await
        .is_empty());

    // Tenants never mix.
    let rows = run(q(|q| q.tenant = "u".into())).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].number, Some(555.0));
    assert!(run(q(|q| q.tenant = "v".into())).await.is_empty());
    assert!(!run(hquery()).await.iter().any(|r| r.number == Some(555.0)));
}

/// Entities with history are listed by type then id, filtered by type and
/// service-path prefix, with the path of their first row.
#[tokio::test(flavor = "multi_thread")]
async fn history_entities_are_listed_and_filtered() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    append_history(&store, query_fixture()).await.unwrap();
    // A later row under another path does not move the entity.
    append_history(
        &store,
        vec![hrow("t", "/z", "Room:2", "Room", "temperature", 9, 1.0)],
    )
    .await
    .unwrap();
    let e = |id: &str, ty: &str, path: &str| HistoryEntity {
        entity_id: id.into(),
        entity_type: ty.into(),
        service_path: path.into(),
    };
    assert_eq!(
        store.history_entities("t", None, None).await.unwrap(),
        vec![
            e("Car:1", "Car", "/"),
            e("Room:1", "Other", "/a"),
            e("Room:1", "Room", "/a"),
            e("Room:2", "Room", "/a/b"),
            e("Room:3", "Room", "/ab"),
        ]
    );
    assert_eq!(
        store
            .history_entities("t", Some("Room"), Some("/a"))
            .await
            .unwrap(),
        vec![e("Room:1", "Room", "/a"), e("Room:2", "Room", "/a/b")]
    );
    assert_eq!(
        store.history_entities("u", None, Some("/")).await.unwrap(),
        vec![e("Room:1", "Room", "/a")]
    );
    assert!(store
        .history_entities("t", Some("Nope"), None)
        .await
        .unwrap()
        .is_empty());
}

/// The aggregate of `values` the way SQLite computes it.
fn expected(method: AggrMethod, values: &[Option<f64>]) -> Option<f64> {
    let numbers: Vec<f64> = values.iter().flatten().copied().collect();
    match method {
        AggrMethod::Count => Some(values.len() as f64),
        _ if numbers.is_empty() => None,
        AggrMethod::Sum => Some(numbers.iter().sum()),
        AggrMethod::Avg => Some(numbers.iter().sum::<f64>() / numbers.len() as f64),
        AggrMethod::Min => numbers.iter().copied().reduce(f64::min),
        AggrMethod::Max => numbers.iter().copied().reduce(f64::max),
    }
}

/// Every method over every fixed-length period (and none) matches the
/// aggregates computed here from the same rows, per series and bucket,
/// within the time range; text rows count but have no number.
#[tokio::test(flavor = "multi_thread")]
async fn history_aggregates_per_method_and_period() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    const T0: i64 = 1_704_067_200_000; // 2024-01-01T00:00:00Z
    let mut rows = Vec::new();
    for i in 0..150i64 {
        // Every 50 s for a bit over two hours, with uneven values.
        let time = T0 + i * 50_000 + 250;
        let value = ((i * 37) % 101) as f64 - 20.5;
        rows.push(hrow("t", "/", "Room:1", "Room", "temperature", time, value));
        rows.push(hrow(
            "t",
            "/",
            "Room:2",
            "Room",
            "temperature",
            time,
            value * 2.0,
        ));
        if i % 3 == 0 {
            rows.push(hrow_text("t", "/", "Room:1", "Room", "status", time, "ok"));
        }
    }
    // Before 1970: buckets floor, they do not truncate toward zero.
    rows.push(hrow("t", "/", "Old:1", "Old", "temperature", -1, 1.0));
    rows.push(hrow(
        "t",
        "/",
        "Old:1",
        "Old",
        "temperature",
        -3_600_001,
        2.0,
    ));
    append_history(&store, rows.clone()).await.unwrap();

    let from = T0 + 10 * 60_000;
    let to = T0 + 100 * 60_000 + 250;
    let periods = [
        (None, 0),
        (Some(AggrPeriod::Second), 1_000),
        (Some(AggrPeriod::Minute), 60_000),
        (Some(AggrPeriod::Hour), 3_600_000),
        (Some(AggrPeriod::Day), 86_400_000),
    ];
    let methods = [
        AggrMethod::Count,
        AggrMethod::Sum,
        AggrMethod::Avg,
        AggrMethod::Min,
        AggrMethod::Max,
    ];
    let query = HistoryQuery {
        entity_type: Some("Room".into()),
        from: Some(from),
        to: Some(to),
        // Ignored by aggregations.
        last_n: Some(1),
        limit: 1,
        offset: 5,
        ..hquery()
    };
    for (period, unit) in periods {
        for method in methods {
            let got = store
                .aggregate_history(&query, method, period)
                .await
                .unwrap();
            // (id, attr) → bucket → values, in order.
            let mut want: std::collections::BTreeMap<(String, String, i64), Vec<Option<f64>>> =
                Default::default();
            let mut firsts: std::collections::BTreeMap<(String, String), i64> = Default::default();
            for r in rows
                .iter()
                .filter(|r| r.entity_type == "Room" && r.time >= from && r.time <= to)
            {
                let series = (r.entity_id.clone(), r.attr.clone());
                let first = *firsts.entry(series).or_insert(r.time);
                let bucket = if unit == 0 {
                    first
                } else {
                    r.time.div_euclid(unit) * unit
                };
                want.entry((r.entity_id.clone(), r.attr.clone(), bucket))
                    .or_default()
                    .push(r.number);
            }
            let want: Vec<HistoryAggregate> = want
                .into_iter()
                .map(|((id, attr, bucket), values)| HistoryAggregate {
                    entity_id: id,
                    entity_type: "Room".into(),
                    attr,
                    bucket,
                    value: expected(method, &values),
                })
                .collect();
            assert_eq!(got.len(), want.len(), "{method:?} per {period:?}");
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(
                    (&g.entity_id, &g.attr, g.bucket),
                    (&w.entity_id, &w.attr, w.bucket),
                    "{method:?} per {period:?}"
                );
                match (g.value, w.value) {
                    (Some(g), Some(w)) => assert!(
                        (g - w).abs() < 1e-9,
                        "{method:?} per {period:?}: {g} != {w}"
                    ),
                    (g, w) => assert_eq!(g, w, "{method:?} per {period:?}"),
                }
            }
        }
    }
    // Spot checks of the shape: the no-period bucket is the first row in
    // range, text series have no numeric aggregate.
    let all = store
        .aggregate_history(&query, AggrMethod::Max, None)
        .await
        .unwrap();
    assert_eq!(
        all.iter()
            .map(|a| (a.entity_id.as_str(), a.attr.as_str(), a.bucket))
            .collect::<Vec<_>>(),
        vec![
            ("Room:1", "status", T0 + 12 * 50_000 + 250),
            ("Room:1", "temperature", T0 + 12 * 50_000 + 250),
            ("Room:2", "temperature", T0 + 12 * 50_000 + 250),
        ]
    );
    assert_eq!(all[0].value, None);
    let hourly = store
        .aggregate_history(
            &HistoryQuery {
                entity_ids: vec!["Old:1".into()],
                ..hquery()
            },
            AggrMethod::Sum,
            Some(AggrPeriod::Hour),
        )
        .await
        .unwrap();
    assert_eq!(
        hourly
            .iter()
            .map(|a| (a.bucket, a.value))
            .collect::<Vec<_>>(),
        vec![(-7_200_000, Some(2.0)), (-3_600_000, Some(1.0))]
    );
    // Nothing in range: no aggregate, with or without a period.
    let empty = HistoryQuery {
        from: Some(0),
        to: Some(1),
        ..hquery()
    };
    assert!(store
        .aggregate_history(&empty, AggrMethod::Count, None)
        .await
        .unwrap()
        .is_empty());
    assert!(store
        .aggregate_history(&empty, AggrMethod::Avg, Some(AggrPeriod::Day))
        .await
        .unwrap()
        .is_empty());
}

/// Months and years are calendar buckets in UTC: the last millisecond of
/// January and the first of February fall apart, leap February is one
/// bucket, New Year's Eve belongs to the old year.
#[tokio::test(flavor = "multi_thread")]
async fn history_aggregates_by_month_and_year() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    const JAN_2024: i64 = 1_704_067_200_000;
    const FEB_2024: i64 = 1_706_745_600_000;
    const DEC_2024: i64 = 1_733_011_200_000;
    const JAN_2025: i64 = 1_735_689_600_000;
    let rows = [
        (FEB_2024 - 1, 1.0),
        (FEB_2024, 2.0),
        (1_709_208_000_000, 4.0), // 2024-02-29T12:00Z
        (JAN_2025 - 1, 8.0),
        (JAN_2025, 16.0),
    ]
    .map(|(time, n)| hrow("t", "/", "Room:1", "Room", "t", time, n));
    append_history(&store, rows.to_vec()).await.unwrap();
    let q = hquery();
    let buckets = |aggs: Vec<HistoryAggregate>| {
        aggs.into_iter()
            .map(|a| (a.bucket, a.value))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        buckets(
            store
                .aggregate_history(&q, AggrMethod::Sum, Some(AggrPeriod::Month))
                .await
                .unwrap()
        ),
        vec![
            (JAN_2024, Some(1.0)),
            (FEB_2024, Some(6.0)),
            (DEC_2024, Some(8.0)),
            (JAN_2025, Some(16.0)),
        ]
    );
    assert_eq!(
        buckets(
            store
                .aggregate_history(&q, AggrMethod::Count, Some(AggrPeriod::Year))
                .await
                .unwrap()
        ),
        vec![(JAN_2024, Some(4.0)), (JAN_2025, Some(1.0))]
    );
}

/// Deleting by id (with or without a type) or by type removes the rows
/// and the entities of that tenant only; a large delete runs in chunks
/// and still answers the total.
#[tokio::test(flavor = "multi_thread")]
async fn history_delete_by_id_and_type() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    append_history(&store, query_fixture()).await.unwrap();
    let listed = |tenant: &'static str| {
        let store = &store;
        async move {
            store
                .history_entities(tenant, None, None)
                .await
                .unwrap()
                .into_iter()
                .map(|e| format!("{}/{}", e.entity_id, e.entity_type))
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(store.delete_history("t", None, None).await.unwrap(), 0);
    assert_eq!(
        store
            .delete_history("t", Some("Room:1"), Some("Room"))
            .await
            .unwrap(),
        11
    );
    assert_eq!(
        listed("t").await,
        vec!["Car:1/Car", "Room:1/Other", "Room:2/Room", "Room:3/Room"]
    );
    assert_eq!(
        store
            .delete_history("t", Some("Room:1"), None)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        store
            .delete_history("t", Some("Room:1"), None)
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        store.delete_history("t", None, Some("Room")).await.unwrap(),
        3
    );
    assert_eq!(listed("t").await, vec!["Car:1/Car"]);
    assert_eq!(listed("u").await, vec!["Room:1/Room"]);
    let left = store.query_history(&hquery()).await.unwrap();
    assert_eq!(keys(&left), vec![key("Car:1", "Car", "speed", 5_000)]);
    assert_eq!(
        store
            .query_history(&HistoryQuery {
                tenant: "u".into(),
                ..hquery()
            })
            .await
            .unwrap()
            .len(),
        1
    );

    // More rows than one chunk, over two attributes and two entities.
    let big = super::history::HISTORY_DELETE_CHUNK as i64 + 1_234;
    let rows: Vec<HistoryRow> = (0..big)
        .map(|i| {
            let attr = if i % 2 == 0 { "a" } else { "b" };
            let id = if i % 5 == 0 { "Big:2" } else { "Big:1" };
            hrow("t", "/", id, "Big", attr, i, i as f64)
        })
        .collect();
    for chunk in rows.chunks(10_000) {
        append_history(&store, chunk.to_vec()).await.unwrap();
    }
    assert_eq!(
        store.delete_history("t", None, Some("Big")).await.unwrap(),
        big as u64
    );
    assert_eq!(listed("t").await, vec!["Car:1/Car"]);
    assert!(store
        .query_history(&HistoryQuery {
            entity_type: Some("Big".into()),
            entity_ids: vec!["Big:1".into()],
            ..hquery()
        })
        .await
        .unwrap()
        .is_empty());
}

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

fn feed_row(entity: &str, time: i64) -> crate::HistoryRow {
    crate::HistoryRow {
        tenant: String::new(),
        service_path: "/".into(),
        entity_id: entity.into(),
        entity_type: "T".into(),
        attr: "a".into(),
        attr_type: "Number".into(),
        time,
        value: time.to_string(),
        number: Some(time as f64),
    }
}

/// Entity changes queue their history rows durably with the change; the
/// feed is read in order, moved into the history with its cursor, pruned,
/// and the cursor survives a reopen.
#[tokio::test(flavor = "multi_thread")]
async fn history_feed_is_queued_with_the_change_and_consumed_once() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    assert_eq!(
        store
            .history_feed_cursor(HistoryFeed::Changes)
            .await
            .unwrap(),
        0
    );
    store
        .put_entity(
            entity("", "/", "E", "T", 1, "{}"),
            vec![feed_row("E", 1), feed_row("E", 2)],
        )
        .await
        .unwrap();
    store
        .commit_processed(Arc::new(ProcessedBatch {
            consumer: "pipeline".into(),
            next_seq: 2,
            history: vec![feed_row("D", 3)],
            ..ProcessedBatch::default()
        }))
        .await
        .unwrap();
    store
        .put_entity(entity("", "/", "F", "T", 2, "{}"), Vec::new())
        .await
        .unwrap();
    let feed = store
        .read_history_feed(HistoryFeed::Changes, 0, 100)
        .await
        .unwrap();
    assert_eq!(feed.len(), 2, "a change without rows queues nothing");
    assert_eq!(feed[0].1, vec![feed_row("E", 1), feed_row("E", 2)]);
    assert_eq!(feed[1].1, vec![feed_row("D", 3)]);
    let through = feed[1].0;
    let rows: Vec<_> = feed.into_iter().flat_map(|(_, r)| r).collect();
    assert_eq!(
        store
            .append_history_from_feed(HistoryFeed::Changes, rows.clone(), Some(through))
            .await
            .unwrap(),
        3
    );
    assert_eq!(
        store
            .append_history_from_feed(HistoryFeed::Changes, rows, Some(through))
            .await
            .unwrap(),
        0,
        "idempotent"
    );
    assert_eq!(
        store
            .history_feed_cursor(HistoryFeed::Changes)
            .await
            .unwrap(),
        through
    );
    assert_eq!(store.prune_history_feed(through).await.unwrap(), 2);
    assert!(store
        .read_history_feed(HistoryFeed::Changes, 0, 100)
        .await
        .unwrap()
        .is_empty());
    store.close().await;
    drop(store);
    let store = open(&dir);
    assert_eq!(
        store
            .history_feed_cursor(HistoryFeed::Changes)
            .await
            .unwrap(),
        through
    );
}

/// Notified rows wait in the history file's own feed: durable once queued
/// (also across a reopen), moved with their entries deleted in one commit.
#[tokio::test(flavor = "multi_thread")]
async fn notified_rows_are_queued_then_moved_once() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    let first = store.queue_history(vec![feed_row("N", 1)]).await.unwrap();
    let second = store
        .queue_history(vec![feed_row("N", 2), feed_row("N", 3)])
        .await
        .unwrap();
    assert!(second > first);
    store.close().await;
    drop(store);
    let store = open(&dir);
    let feed = store
        .read_history_feed(HistoryFeed::Notifications, 0, 100)
        .await
        .unwrap();
    assert_eq!(feed.len(), 2);
    let rows: Vec<_> = feed.into_iter().flat_map(|(_, r)| r).collect();
    assert_eq!(
        store
            .append_history_from_feed(HistoryFeed::Notifications, rows, Some(second))
            .await
            .unwrap(),
        3
    );
    assert!(store
        .read_history_feed(HistoryFeed::Notifications, 0, 100)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        store
            .history_feed_cursor(HistoryFeed::Notifications)
            .await
            .unwrap(),
        0
    );
    let stored = store
        .query_history(&HistoryQuery {
            entity_ids: vec!["N".into()],
            limit: 100,
            ..HistoryQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(stored.len(), 3);
}

/// Rollups count each stored row once: overlapping (replayed) appends add
/// nothing to them, hourly and per-minute aggregates equal those of the
/// rows, and deleting the entity takes its rollups with it.
#[tokio::test(flavor = "multi_thread")]
async fn rollups_count_each_row_once() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    const T0: i64 = 1_704_067_200_000; // 2024-01-01T00:00:00Z
    let rows: Vec<HistoryRow> = (0..1300i64)
        .map(|i| hrow("t", "/", "R", "T", "x", T0 + i * 7_000, (i % 13) as f64))
        .collect();
    append_history(&store, rows[..700].to_vec()).await.unwrap();
    append_history(&store, rows[500..].to_vec()).await.unwrap();
    let q = HistoryQuery {
        entity_ids: vec!["R".into()],
        attrs: vec!["x".into()],
        ..hquery()
    };
    for (period, unit) in [(AggrPeriod::Hour, 3_600_000), (AggrPeriod::Minute, 60_000)] {
        for method in [AggrMethod::Count, AggrMethod::Sum] {
            let got = store
                .aggregate_history(&q, method, Some(period))
                .await
                .unwrap();
            let mut want: std::collections::BTreeMap<i64, Vec<Option<f64>>> = Default::default();
            for r in &rows {
                want.entry(r.time.div_euclid(unit) * unit)
                    .or_default()
                    .push(r.number);
            }
            let want: Vec<(i64, Option<f64>)> = want
                .into_iter()
                .map(|(b, v)| (b, expected(method, &v)))
                .collect();
            let got: Vec<(i64, Option<f64>)> = got.iter().map(|a| (a.bucket, a.value)).collect();
            assert_eq!(got, want, "{method:?} per {period:?}");
        }
    }
    store.delete_history("t", Some("R"), None).await.unwrap();
    append_history(&store, vec![hrow("t", "/", "R", "T", "x", T0, 5.0)])
        .await
        .unwrap();
    let got = store
        .aggregate_history(&q, AggrMethod::Count, Some(AggrPeriod::Hour))
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0].value,
        Some(1.0),
        "the deleted rows' rollups are gone"
    );
}

/// Expiry deletes rows before their cutoff and only rollup buckets that
/// end by theirs (a bucket with newer rows stays whole), in chunks; an
/// entity left with nothing leaves the listing, one with rollups stays.
#[tokio::test(flavor = "multi_thread")]
async fn expiry_deletes_rows_then_whole_buckets() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    const T0: i64 = 1_704_067_200_000; // 2024-01-01T00:00:00Z
    let hour = 3_600_000;
    let rows: Vec<HistoryRow> = (0..120_000i64)
        .map(|i| hrow("t", "/", "R", "T", "x", T0 + i * 90, 1.0))
        .collect(); // three hours
    for chunk in rows.chunks(20_000) {
        append_history(&store, chunk.to_vec()).await.unwrap();
    }
    append_history(&store, vec![hrow("u", "/", "R", "T", "x", T0, 1.0)])
        .await
        .unwrap();
    assert_eq!(store.history_tenants().await.unwrap(), ["t", "u"]);
    // Rows before 01:30 go (more than one chunk); rollups ending by 01:30
    // go: hour 00 and the minutes before 01:30, not hour 01.
    let deleted = store
        .expire_history("t", Some(T0 + hour + hour / 2), Some(T0 + hour + hour / 2))
        .await
        .unwrap();
    assert_eq!(deleted, 60_000 + 1 + 90);
    let q = HistoryQuery {
        entity_ids: vec!["R".into()],
        attrs: vec!["x".into()],
        ..hquery()
    };
    let per_hour = store
        .aggregate_history(&q, AggrMethod::Count, Some(AggrPeriod::Hour))
        .await
        .unwrap();
    let per_hour: Vec<(i64, Option<f64>)> = per_hour.iter().map(|a| (a.bucket, a.value)).collect();
    assert_eq!(
        per_hour,
        [(T0 + hour, Some(40_000.0)), (T0 + 2 * hour, Some(40_000.0))]
    );
    // Only rollups left (downsampled): still listed, still aggregated.
    store
        .expire_history("t", Some(T0 + 10 * hour), None)
        .await
        .unwrap();
    assert!(store.query_history(&q).await.unwrap().is_empty());
    assert_eq!(
        store.history_entities("t", None, None).await.unwrap().len(),
        1
    );
    // Everything past: the entity goes.
    store
        .expire_history("t", Some(T0 + 10 * hour), Some(T0 + 10 * hour))
        .await
        .unwrap();
    assert!(store
        .history_entities("t", None, None)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        store.history_entities("u", None, None).await.unwrap().len(),
        1
    );
}
