//! Tests of the SQLite backend against real database files in temporary
//! directories: durability across reopen, group commit under concurrency,
//! atomic pipeline batches, queries, overload and shutdown.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};
use tempfile::TempDir;
use weft_model::{
    DataUnit, Device, DeviceInfo, DeviceType, FailedUplink, FailureReason, NewUplink, Processor,
    UplinkFormat,
};

use super::{SqliteConfig, SqliteStore, Synchronous};
use crate::{
    DocumentKind, NgsiDocument,
    DataQuery, DeviceFilter, EntityRecord, FailedQuery, ProcessedBatch, Store, StoreError,
    UnitRecord,
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

fn uplink(i: usize) -> NewUplink {
    NewUplink {
        received_at: 1_000 + i as i64,
        format: [UplinkFormat::SensaeDecoded, UplinkFormat::Ttn][i % 2],
        channel: match i % 3 {
            0 => None,
            n => Some(format!("ch{n}")),
        },
        device_type: match i % 5 {
            0 => None,
            _ => Some("thermo".to_string()),
        },
        body: format!(r#"{{"n":{i},"uuid":"u-{i}"}}"#).into_bytes(),
    }
}

fn unit(data_id: &str, device: &str, channel: &str, device_type: &str, at: i64) -> UnitRecord {
    let unit = DataUnit {
        data_id: data_id.to_string(),
        reported_at: at,
        received_at: at + 1,
        channel: channel.to_string(),
        device: DeviceInfo {
            id: device.to_string(),
            name: String::new(),
            device_type: device_type.to_string(),
            records: Map::new(),
            static_data: Map::new(),
        },
        measures: json!({"temperature": {"celsius": at % 40}})
            .as_object()
            .cloned()
            .unwrap_or_default(),
    };
    let json = serde_json::to_string(&unit).expect("unit serialises");
    UnitRecord {
        unit: Arc::new(unit),
        json: json.into(),
    }
}

fn failure(
    seq: u64,
    channel: Option<&str>,
    device_type: Option<&str>,
    body: Value,
) -> FailedUplink {
    FailedUplink {
        seq,
        received_at: 5_000 + seq as i64,
        format: "decoded".to_string(),
        channel: channel.map(str::to_string),
        device_type: device_type.map(str::to_string),
        reason: FailureReason::UnknownType,
        description: format!("no type for {seq}"),
        body,
    }
}

fn device(id: &str, device_type: &str, channel: &str, records: Value) -> Device {
    Device {
        id: id.to_string(),
        name: format!("{id} name"),
        device_type: device_type.to_string(),
        channel: channel.to_string(),
        records: records.as_object().cloned().unwrap_or_default(),
        ..Device::default()
    }
}

fn seqs_of(units: &[crate::StoredUnit]) -> Vec<u64> {
    units.iter().map(|u| u.seq).collect()
}

fn data_ids(units: &[crate::StoredUnit]) -> Vec<String> {
    units
        .iter()
        .map(|u| {
            let v: Value = serde_json::from_str(&u.json).expect("stored json");
            v["dataId"].as_str().unwrap_or_default().to_string()
        })
        .collect()
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

/// Acknowledged appends survive closing and reopening, with their seqs and
/// bytes, and `committed_seq` starts at the last of them.
#[tokio::test(flavor = "multi_thread")]
async fn appends_survive_reopen() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    assert_eq!(*store.committed_seq().borrow(), 0);
    let mut seqs = Vec::new();
    for i in 0..50 {
        seqs.push(store.append_uplink(uplink(i)).await.unwrap());
    }
    assert_eq!(seqs, (1..=50).collect::<Vec<u64>>());
    store.close().await;
    drop(store);

    let store = open(&dir);
    assert_eq!(*store.committed_seq().borrow(), 50);
    let log = store.read_uplinks(1, 1_000).await.unwrap();
    assert_eq!(log.len(), 50);
    for (i, entry) in log.iter().enumerate() {
        assert_eq!(entry.seq, i as u64 + 1);
        assert_eq!(entry.uplink, uplink(i));
    }
    // `from_seq` is inclusive and `limit` bounds the page.
    let page = store.read_uplinks(10, 5).await.unwrap();
    assert_eq!(
        page.iter().map(|u| u.seq).collect::<Vec<_>>(),
        [10, 11, 12, 13, 14]
    );
    assert_eq!(store.append_uplink(uplink(50)).await.unwrap(), 51);
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

/// A processed batch stores each `dataId` once (replays report
/// `inserted = false`), and its cursor commits with it: after reopening,
/// the cursor is the last batch's `next_seq`.
#[tokio::test(flavor = "multi_thread")]
async fn commit_processed_is_idempotent_and_moves_the_cursor() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    assert_eq!(store.cursor("pipeline").await.unwrap(), 1);

    let first = ProcessedBatch {
        consumer: "pipeline".to_string(),
        next_seq: 3,
        units: vec![unit("a", "d1", "c", "t", 10), unit("b", "d1", "c", "t", 11)],
        failures: vec![failure(2, Some("c"), None, json!({"x": 1}))],
        new_devices: vec![device("d1", "t", "c", json!({}))],
        entities: vec![entity("", "/", "d1", "T", 1, "{\"v\":1}")],
    };
    let out = store
        .commit_processed(Arc::new(first.clone()))
        .await
        .unwrap();
    assert_eq!(out.inserted, [true, true]);

    // A replay of the same entries plus a new one, and a duplicate inside
    // the batch itself.
    let second = ProcessedBatch {
        next_seq: 5,
        units: vec![
            unit("b", "d1", "c", "t", 11),
            unit("c", "d1", "c", "t", 12),
            unit("c", "d1", "c", "t", 12),
        ],
        new_devices: vec![device("d1", "other", "elsewhere", json!({}))],
        ..first.clone()
    };
    let out = store.commit_processed(Arc::new(second)).await.unwrap();
    assert_eq!(out.inserted, [false, true, false]);
    assert_eq!(store.cursor("pipeline").await.unwrap(), 5);
    assert_eq!(store.cursor("someone-else").await.unwrap(), 1);
    store.close().await;
    drop(store);

    let store = open(&dir);
    assert_eq!(store.cursor("pipeline").await.unwrap(), 5);
    let all = store
        .query_data(&DataQuery {
            limit: 100,
            ..DataQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(data_ids(&all), ["a", "b", "c"]);
    let failed = store
        .query_failed(&FailedQuery {
            limit: 100,
            ..FailedQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(failed, [failure(2, Some("c"), None, json!({"x": 1}))]);
    // New devices are inserted only if absent: the first version stays.
    let d1 = store.get_device("d1").await.unwrap().unwrap();
    assert_eq!(d1.device_type, "t");
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

/// Every `DataQuery` filter narrows the result, `after` pages, `limit`
/// bounds, and `get_data` finds a unit by `dataId`.
#[tokio::test(flavor = "multi_thread")]
async fn query_data_filters_and_get_data() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    let units = vec![
        unit("u1", "dev-a", "north", "thermo", 100),
        unit("u2", "dev-b", "north", "meter", 200),
        unit("u3", "dev-a", "south", "thermo", 300),
        unit("u4", "dev-c", "south", "meter", 400),
        unit("u5", "dev-a", "north", "thermo", 500),
    ];
    store
        .commit_processed(Arc::new(ProcessedBatch {
            consumer: "pipeline".to_string(),
            next_seq: 2,
            units,
            ..ProcessedBatch::default()
        }))
        .await
        .unwrap();
    let q = |f: fn(&mut DataQuery)| {
        let mut query = DataQuery {
            limit: 100,
            ..DataQuery::default()
        };
        f(&mut query);
        query
    };
    let ids = |query: DataQuery| {
        let store = &store;
        async move { data_ids(&store.query_data(&query).await.unwrap()) }
    };

    assert_eq!(ids(q(|_| {})).await, ["u1", "u2", "u3", "u4", "u5"]);
    assert_eq!(
        ids(q(|q| q.device = Some("dev-a".into()))).await,
        ["u1", "u3", "u5"]
    );
    assert_eq!(
        ids(q(|q| q.channel = Some("south".into()))).await,
        ["u3", "u4"]
    );
    assert_eq!(
        ids(q(|q| q.device_type = Some("meter".into()))).await,
        ["u2", "u4"]
    );
    assert_eq!(ids(q(|q| q.from = Some(300))).await, ["u3", "u4", "u5"]);
    assert_eq!(ids(q(|q| q.to = Some(200))).await, ["u1", "u2"]);
    assert_eq!(
        ids(q(|q| {
            q.device = Some("dev-a".into());
            q.channel = Some("north".into());
            q.from = Some(200);
            q.to = Some(500);
        }))
        .await,
        ["u5"]
    );
    assert_eq!(ids(q(|q| q.limit = 2)).await, ["u1", "u2"]);
    assert_eq!(ids(q(|q| q.limit = 0)).await, Vec::<String>::new());
    assert_eq!(
        ids(q(|q| q.device = Some("nobody".into()))).await,
        Vec::<String>::new()
    );

    // Paging: `after` is the last seen `seq`.
    let first = store.query_data(&q(|q| q.limit = 2)).await.unwrap();
    let next = store
        .query_data(&DataQuery {
            after: first.last().map(|u| u.seq),
            limit: 2,
            ..DataQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(data_ids(&next), ["u3", "u4"]);
    assert!(seqs_of(&next)[0] > seqs_of(&first)[1]);

    let u3 = store.get_data("u3").await.unwrap().unwrap();
    assert_eq!(data_ids(std::slice::from_ref(&u3)), ["u3"]);
    assert_eq!(
        u3.json.as_bytes(),
        &unit("u3", "dev-a", "south", "thermo", 300).json[..]
    );
    assert_eq!(store.get_data("missing").await.unwrap(), None);
}

/// Failed uplinks are listed in log order with their filters, a replay
/// overwrites instead of duplicating, and a body that is not JSON comes
/// back as a JSON string.
#[tokio::test(flavor = "multi_thread")]
async fn query_failed_filters_and_overwrites() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    let failures = vec![
        failure(3, Some("north"), Some("thermo"), json!({"a": 1})),
        failure(7, Some("south"), None, json!([1, 2])),
        failure(9, None, Some("thermo"), json!("text")),
    ];
    let batch = ProcessedBatch {
        consumer: "pipeline".to_string(),
        next_seq: 10,
        failures: failures.clone(),
        ..ProcessedBatch::default()
    };
    store
        .commit_processed(Arc::new(batch.clone()))
        .await
        .unwrap();
    let mut replayed = batch;
    replayed.failures = vec![FailedUplink {
        description: "second try".to_string(),
        ..failures[1].clone()
    }];
    store.commit_processed(Arc::new(replayed)).await.unwrap();

    let all = |query: FailedQuery| {
        let store = &store;
        async move { store.query_failed(&query).await.unwrap() }
    };
    let listed = all(FailedQuery {
        limit: 10,
        ..FailedQuery::default()
    })
    .await;
    assert_eq!(listed.iter().map(|f| f.seq).collect::<Vec<_>>(), [3, 7, 9]);
    assert_eq!(listed[0], failures[0]);
    assert_eq!(listed[1].description, "second try");
    assert_eq!(listed[2].body, json!("text"));

    let seqs = |v: Vec<FailedUplink>| v.iter().map(|f| f.seq).collect::<Vec<_>>();
    let by_type = FailedQuery {
        device_type: Some("thermo".into()),
        limit: 10,
        ..FailedQuery::default()
    };
    assert_eq!(seqs(all(by_type).await), [3, 9]);
    let by_channel = FailedQuery {
        channel: Some("south".into()),
        limit: 10,
        ..FailedQuery::default()
    };
    assert_eq!(seqs(all(by_channel).await), [7]);
    let after = FailedQuery {
        after: Some(3),
        limit: 1,
        ..FailedQuery::default()
    };
    assert_eq!(seqs(all(after).await), [7]);

    // A body stored by something else that is not JSON reads as a string.
    let raw = rusqlite::Connection::open(config(&dir).path).unwrap();
    raw.execute(
        "UPDATE failed_uplinks SET body = 'not json' WHERE seq = 3",
        [],
    )
    .unwrap();
    let listed = all(FailedQuery {
        limit: 1,
        ..FailedQuery::default()
    })
    .await;
    assert_eq!(listed[0].body, json!("not json"));
}

/// Devices: create vs replace, get, delete, and listing by type, channel
/// and record values (numbers and booleans compared by their JSON text).
#[tokio::test(flavor = "multi_thread")]
async fn devices_crud_and_filters() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    let a = device(
        "a",
        "thermo",
        "north",
        json!({"floor": 1, "zone": "x", "on": true}),
    );
    let b = device("b", "meter", "north", json!({"floor": 2, "zone": "x"}));
    let c = device("c", "thermo", "south", json!({"floor": 1, "zone": "y"}));
    assert!(store.put_device(&c).await.unwrap());
    assert!(store.put_device(&a).await.unwrap());
    assert!(store.put_device(&b).await.unwrap());
    let renamed = Device {
        name: "renamed".to_string(),
        ..b.clone()
    };
    assert!(
        !store.put_device(&renamed).await.unwrap(),
        "replace, not create"
    );
    assert_eq!(store.get_device("b").await.unwrap(), Some(renamed));
    assert_eq!(store.get_device("zzz").await.unwrap(), None);

    let ids = |filter: DeviceFilter| {
        let store = &store;
        async move {
            store
                .list_devices(&filter)
                .await
                .unwrap()
                .into_iter()
                .map(|d| d.id)
                .collect::<Vec<_>>()
        }
    };
    let record = |label: &str, value: &str| (label.to_string(), value.to_string());
    assert_eq!(ids(DeviceFilter::default()).await, ["a", "b", "c"]);
    let thermo = DeviceFilter {
        device_type: Some("thermo".into()),
        ..DeviceFilter::default()
    };
    assert_eq!(ids(thermo).await, ["a", "c"]);
    let north = DeviceFilter {
        channel: Some("north".into()),
        ..DeviceFilter::default()
    };
    assert_eq!(ids(north).await, ["a", "b"]);
    let floor_one_x = DeviceFilter {
        records: vec![record("floor", "1"), record("zone", "x")],
        ..DeviceFilter::default()
    };
    assert_eq!(ids(floor_one_x).await, ["a"]);
    let on = DeviceFilter {
        records: vec![record("on", "true")],
        ..DeviceFilter::default()
    };
    assert_eq!(ids(on).await, ["a"]);
    let thermo_north = DeviceFilter {
        device_type: Some("thermo".into()),
        channel: Some("north".into()),
        records: vec![record("zone", "y")],
    };
    assert_eq!(ids(thermo_north).await, Vec::<String>::new());

    assert!(store.delete_device("a").await.unwrap());
    assert!(!store.delete_device("a").await.unwrap());
    assert_eq!(ids(DeviceFilter::default()).await, ["b", "c"]);
}

/// Device types: create vs replace, get, list by name, delete.
#[tokio::test(flavor = "multi_thread")]
async fn device_types_crud() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    let plain = DeviceType::default();
    let mapped = DeviceType {
        entity_type: Some("Thermometer".to_string()),
        processor: Some(Processor::default()),
        ..DeviceType::default()
    };
    assert!(store.put_device_type("zeta", &plain).await.unwrap());
    assert!(store.put_device_type("alpha", &plain).await.unwrap());
    assert!(!store.put_device_type("alpha", &mapped).await.unwrap());
    assert_eq!(
        store.get_device_type("alpha").await.unwrap(),
        Some(mapped.clone())
    );
    assert_eq!(store.get_device_type("nope").await.unwrap(), None);
    assert_eq!(
        store.list_device_types().await.unwrap(),
        [("alpha".to_string(), mapped), ("zeta".to_string(), plain)]
    );
    assert!(store.delete_device_type("zeta").await.unwrap());
    assert!(!store.delete_device_type("zeta").await.unwrap());
    assert_eq!(store.list_device_types().await.unwrap().len(), 1);
}

/// Pruning deletes only entries below the cursor and old enough; after
/// the log is emptied, new appends (even after a restart) continue above
/// every seq ever handed out.
#[tokio::test(flavor = "multi_thread")]
async fn prune_keeps_unprocessed_and_never_reuses_seqs() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    for i in 0..10 {
        store.append_uplink(uplink(i)).await.unwrap(); // received_at 1000..=1009
    }
    // Processed up to 6 (next_seq 7), but only entries received before
    // 1004 are old enough: seqs 1..=4.
    assert_eq!(store.prune_uplinks(7, 1_004).await.unwrap(), 4);
    let left: Vec<u64> = store
        .read_uplinks(0, 100)
        .await
        .unwrap()
        .iter()
        .map(|u| u.seq)
        .collect();
    assert_eq!(left, [5, 6, 7, 8, 9, 10]);
    // Old enough but not processed: kept.
    assert_eq!(store.prune_uplinks(7, i64::MAX).await.unwrap(), 2);
    assert_eq!(store.read_uplinks(0, 100).await.unwrap()[0].seq, 7);

    assert_eq!(store.prune_uplinks(u64::MAX, i64::MAX).await.unwrap(), 4);
    assert!(store.read_uplinks(0, 100).await.unwrap().is_empty());
    assert_eq!(store.append_uplink(uplink(10)).await.unwrap(), 11);
    assert_eq!(store.prune_uplinks(u64::MAX, i64::MAX).await.unwrap(), 1);
    store.close().await;
    drop(store);

    let store = open(&dir);
    assert_eq!(*store.committed_seq().borrow(), 11);
    assert_eq!(store.append_uplink(uplink(11)).await.unwrap(), 12);
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

fn entity(
    tenant: &str,
    path: &str,
    id: &str,
    entity_type: &str,
    created: u64,
    json: &str,
) -> EntityRecord {
    EntityRecord {
        tenant: tenant.into(),
        service_path: path.into(),
        id: id.into(),
        entity_type: entity_type.into(),
        created,
        json: json.into(),
    }
}

/// Entities are keyed by tenant, service path, id and type, replaced on
/// put, loaded in creation order, and survive a reopen; a processed batch
/// stores its entities with its units.
#[tokio::test(flavor = "multi_thread")]
async fn entities_are_keyed_replaced_deleted_and_kept_across_reopen() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    store
        .put_entity(entity("t1", "/", "E", "T", 2, "{}"))
        .await
        .unwrap();
    store
        .put_entity(entity("t1", "/a", "E", "T", 3, "{}"))
        .await
        .unwrap();
    store
        .put_entity(entity("t2", "/", "E", "T", 1, "{}"))
        .await
        .unwrap();
    store
        .put_entity(entity("t1", "/", "E", "T", 2, "{\"new\":true}"))
        .await
        .unwrap();
    store
        .commit_processed(Arc::new(ProcessedBatch {
            consumer: "pipeline".into(),
            next_seq: 2,
            entities: vec![entity("", "/", "dev", "Sensor", 4, "{\"t\":1}")],
            ..ProcessedBatch::default()
        }))
        .await
        .unwrap();
    assert!(store.delete_entity("t2", "/", "E", "T").await.unwrap());
    assert!(!store.delete_entity("t2", "/", "E", "T").await.unwrap());
    store.close().await;
    drop(store);

    let store = open(&dir);
    let all = store.load_entities().await.unwrap();
    assert_eq!(
        all,
        vec![
            entity("t1", "/", "E", "T", 2, "{\"new\":true}"),
            entity("t1", "/a", "E", "T", 3, "{}"),
            entity("", "/", "dev", "Sensor", 4, "{\"t\":1}"),
        ]
    );
}

fn document(kind: DocumentKind, tenant: &str, id: &str, created: u64, json: &str) -> NgsiDocument {
    NgsiDocument {
        kind,
        tenant: tenant.into(),
        id: id.into(),
        service_path: "/".into(),
        created,
        json: json.into(),
    }
}

/// Subscriptions and registrations are kept apart by kind, keyed by tenant
/// and id, replaced on put, loaded in creation order, and survive a reopen.
#[tokio::test(flavor = "multi_thread")]
async fn ngsi_documents_are_keyed_by_kind_and_kept_across_reopen() {
    use DocumentKind::{Registration, Subscription};
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    for d in [
        document(Subscription, "", "b", 2, "{}"),
        document(Subscription, "", "a", 1, "{}"),
        document(Subscription, "t", "a", 3, "{}"),
        document(Registration, "", "a", 4, "{\"r\":1}"),
        document(Subscription, "", "a", 1, "{\"v\":2}"),
    ] {
        store.put_document(d).await.unwrap();
    }
    assert!(store.delete_document(Subscription, "t", "a").await.unwrap());
    assert!(!store.delete_document(Subscription, "t", "a").await.unwrap());
    store.close().await;
    drop(store);

    let store = open(&dir);
    assert_eq!(
        store.load_documents(Subscription).await.unwrap(),
        vec![
            document(Subscription, "", "a", 1, "{\"v\":2}"),
            document(Subscription, "", "b", 2, "{}"),
        ]
    );
    assert_eq!(
        store.load_documents(Registration).await.unwrap(),
        vec![document(Registration, "", "a", 4, "{\"r\":1}")]
    );
}
