//! The backend conformance suite: the same tests, run against every
//! backend, so SQLite and PostgreSQL keep the same promises. A backend's
//! test module implements [`Backend`] and expands [`conformance_tests!`]
//! with the tests of the domains it implements.
//!
//! Tests that are about one backend's own machinery (SQLite's files and
//! locks, PostgreSQL's partitions) stay in that backend's test module.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{json, Map, Value};
use weft_model::{
    DataUnit, Device, DeviceInfo, DeviceType, FailedUplink, FailureReason, NewUplink, Processor,
    UplinkFormat,
};

use crate::prelude::*;
use crate::{
    DataQuery, DeviceFilter, DocumentKind, EntityRecord, FailedQuery, NgsiDocument, ProcessedBatch,
    UnitRecord,
};

/// A backend under test: a place for data of its own (a temporary
/// directory, a fresh database), and stores opened on it — again after a
/// close, to check what survives.
#[async_trait]
pub(crate) trait Backend: Sized + Send + Sync + 'static {
    /// The store type; the tests need only the domain traits they use.
    type Store: Send + Sync + 'static;
    /// A fresh, empty place for data.
    async fn fresh() -> Self;
    /// A store on this backend's data.
    async fn open(&self) -> Arc<Self::Store>;
    /// Closes a store as `Store::close` does (committing what is queued).
    async fn close(store: &Self::Store);
    /// Runs SQL on the data behind the store's back, for tests that put
    /// something there weft would not.
    async fn execute(&self, sql: &str);
}

/// Expands to one `#[tokio::test]` per conformance test, run against
/// `$backend`: the list of the suite's tests lives here, once.
#[macro_export]
macro_rules! conformance_tests {
    ($backend:ty) => {
        $crate::conformance_tests!($backend:
            stored_data_ids_reports_what_is_stored,
            appends_survive_reopen,
            commit_processed_is_idempotent_and_moves_the_cursor,
            query_data_filters_and_get_data,
            query_failed_filters_and_overwrites,
            devices_crud_and_filters,
            device_types_crud,
            prune_keeps_unprocessed_and_never_reuses_seqs,
            entities_are_keyed_replaced_deleted_and_kept_across_reopen,
            ngsi_documents_are_keyed_by_kind_and_kept_across_reopen,
        );
    };
    ($backend:ty: $($test:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread")]
            async fn $test() {
                $crate::conformance::$test::<$backend>().await
            }
        )+
    };
}

/// A stored device by id, looked up in the full listing.
async fn device_by_id(store: &impl CatalogStore, id: &str) -> Option<Device> {
    let all = store.list_devices(&DeviceFilter::default()).await.unwrap();
    all.into_iter().find(|d| d.id == id)
}

/// A stored device type by name, looked up in the full listing.
async fn device_type_named(store: &impl CatalogStore, name: &str) -> Option<DeviceType> {
    let all = store.list_device_types().await.unwrap();
    all.into_iter().find(|(n, _)| n == name).map(|(_, t)| t)
}

/// Which of a batch's ids the store reports as stored.
pub(crate) async fn stored_data_ids_reports_what_is_stored<B: Backend>()
where
    B::Store: UnitStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
    let none = store.stored_data_ids(vec!["a".into()]).await.unwrap();
    assert!(none.is_empty());
    store
        .commit_processed(Arc::new(ProcessedBatch {
            consumer: "pipeline".to_string(),
            next_seq: 2,
            units: vec![unit("a", "d", "c", "t", 1), unit("b", "d", "c", "t", 2)],
            ..ProcessedBatch::default()
        }))
        .await
        .unwrap();
    let mut found: Vec<String> = store
        .stored_data_ids(vec!["b".into(), "x".into(), "a".into(), "a".into()])
        .await
        .unwrap()
        .into_iter()
        .collect();
    found.sort();
    assert_eq!(found, ["a", "b"]);
    assert!(store.stored_data_ids(Vec::new()).await.unwrap().is_empty());
    assert_eq!(
        store.data_head().await.unwrap(),
        store.get_data("b").await.unwrap().unwrap().seq
    );
}

pub(crate) fn uplink(i: usize) -> NewUplink {
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

pub(crate) fn unit(
    data_id: &str,
    device: &str,
    channel: &str,
    device_type: &str,
    at: i64,
) -> UnitRecord {
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

pub(crate) fn failure(
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

pub(crate) fn device(id: &str, device_type: &str, channel: &str, records: Value) -> Device {
    Device {
        id: id.to_string(),
        name: format!("{id} name"),
        device_type: device_type.to_string(),
        channel: channel.to_string(),
        records: records.as_object().cloned().unwrap_or_default(),
        ..Device::default()
    }
}

pub(crate) fn seqs_of(units: &[crate::StoredUnit]) -> Vec<u64> {
    units.iter().map(|u| u.seq).collect()
}

pub(crate) fn data_ids(units: &[crate::StoredUnit]) -> Vec<String> {
    units
        .iter()
        .map(|u| {
            let v: Value = serde_json::from_str(&u.json).expect("stored json");
            v["dataId"].as_str().unwrap_or_default().to_string()
        })
        .collect()
}

pub(crate) fn entity(
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

pub(crate) fn document(
    kind: DocumentKind,
    tenant: &str,
    id: &str,
    created: u64,
    json: &str,
) -> NgsiDocument {
    NgsiDocument {
        kind,
        tenant: tenant.into(),
        id: id.into(),
        service_path: "/".into(),
        created,
        json: json.into(),
    }
}

/// Acknowledged appends survive closing and reopening, with their seqs and
/// bytes, and `committed_seq` starts at the last of them.
pub(crate) async fn appends_survive_reopen<B: Backend>()
where
    B::Store: IngestLogStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
    assert_eq!(*store.committed_seq().borrow(), 0);
    let mut seqs = Vec::new();
    for i in 0..50 {
        seqs.push(store.append_uplink(uplink(i)).await.unwrap());
    }
    assert_eq!(seqs, (1..=50).collect::<Vec<u64>>());
    B::close(&store).await;
    drop(store);

    let store = backend.open().await;
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

/// A processed batch stores each `dataId` once (replays report
/// `inserted = false`), and its cursor commits with it: after reopening,
/// the cursor is the last batch's `next_seq`.
pub(crate) async fn commit_processed_is_idempotent_and_moves_the_cursor<B: Backend>()
where
    B::Store: UnitStore + CatalogStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
    assert_eq!(store.cursor("pipeline").await.unwrap(), 1);

    let first = ProcessedBatch {
        consumer: "pipeline".to_string(),
        next_seq: 3,
        units: vec![unit("a", "d1", "c", "t", 10), unit("b", "d1", "c", "t", 11)],
        failures: vec![failure(2, Some("c"), None, json!({"x": 1}))],
        new_devices: vec![device("d1", "t", "c", json!({}))],
        entities: vec![entity("", "/", "d1", "T", 1, "{\"v\":1}")],
        history: Vec::new(),
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
    B::close(&store).await;
    drop(store);

    let store = backend.open().await;
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
    let d1 = device_by_id(&*store, "d1").await.unwrap();
    assert_eq!(d1.device_type, "t");
}

/// Every `DataQuery` filter narrows the result, `after` pages, `limit`
/// bounds, and `get_data` finds a unit by `dataId`.
pub(crate) async fn query_data_filters_and_get_data<B: Backend>()
where
    B::Store: UnitStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
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
pub(crate) async fn query_failed_filters_and_overwrites<B: Backend>()
where
    B::Store: UnitStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
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
    backend
        .execute("UPDATE failed_uplinks SET body = 'not json' WHERE seq = 3")
        .await;
    let listed = all(FailedQuery {
        limit: 1,
        ..FailedQuery::default()
    })
    .await;
    assert_eq!(listed[0].body, json!("not json"));
}

/// Devices: create vs replace, get, delete, and listing by type, channel
/// and record values (numbers and booleans compared by their JSON text).
pub(crate) async fn devices_crud_and_filters<B: Backend>()
where
    B::Store: CatalogStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
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
    assert_eq!(device_by_id(&*store, "b").await, Some(renamed));
    assert_eq!(device_by_id(&*store, "zzz").await, None);

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
pub(crate) async fn device_types_crud<B: Backend>()
where
    B::Store: CatalogStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
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
        device_type_named(&*store, "alpha").await,
        Some(mapped.clone())
    );
    assert_eq!(device_type_named(&*store, "nope").await, None);
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
pub(crate) async fn prune_keeps_unprocessed_and_never_reuses_seqs<B: Backend>()
where
    B::Store: IngestLogStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
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
    B::close(&store).await;
    drop(store);

    let store = backend.open().await;
    assert_eq!(*store.committed_seq().borrow(), 11);
    assert_eq!(store.append_uplink(uplink(11)).await.unwrap(), 12);
}

/// Entities are keyed by tenant, service path, id and type, replaced on
/// put, loaded in creation order, and survive a reopen; a processed batch
/// stores its entities with its units.
pub(crate) async fn entities_are_keyed_replaced_deleted_and_kept_across_reopen<B: Backend>()
where
    B::Store: ContextStore + UnitStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
    store
        .put_entity(entity("t1", "/", "E", "T", 2, "{}"), Vec::new())
        .await
        .unwrap();
    store
        .put_entity(entity("t1", "/a", "E", "T", 3, "{}"), Vec::new())
        .await
        .unwrap();
    store
        .put_entity(entity("t2", "/", "E", "T", 1, "{}"), Vec::new())
        .await
        .unwrap();
    store
        .put_entity(entity("t1", "/", "E", "T", 2, "{\"new\":true}"), Vec::new())
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
    B::close(&store).await;
    drop(store);

    let store = backend.open().await;
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

/// Subscriptions and registrations are kept apart by kind, keyed by tenant
/// and id, replaced on put, loaded in creation order, and survive a reopen.
pub(crate) async fn ngsi_documents_are_keyed_by_kind_and_kept_across_reopen<B: Backend>()
where
    B::Store: ContextStore,
{
    use DocumentKind::{Registration, Subscription};
    let backend = B::fresh().await;
    let store = backend.open().await;
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
    B::close(&store).await;
    drop(store);

    let store = backend.open().await;
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
