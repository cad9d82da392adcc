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
    DataUnit, Device, DeviceEvent, DeviceInfo, DeviceType, FailedUplink, FailureReason, NewUplink,
    Processor, UplinkFormat,
};

use crate::prelude::*;
use crate::{
    AggrMethod, AggrPeriod, AlarmBatch, AlarmQuery, AlarmRecord, ChannelBacklog, ChannelMessage,
    ChannelSubscriber, DataQuery, DeviceFilter, DevicePageQuery, DocumentKind, EntityRecord,
    FailedQuery, FeedFilter, FeedMove, HistoryAggregate, HistoryCutoffs, HistoryDelete,
    HistoryEntity, HistoryFeed, HistoryQuery, HistoryRow, NgsiDocument, ProcessedBatch,
    RuleStateRecord, UnitRecord,
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
    /// Stores history rows straight into the history (no feed involved),
    /// the way the history writer's moves insert them, as one write of the
    /// history's writer. Answers how many rows were new.
    async fn append_history(store: &Self::Store, rows: Vec<HistoryRow>) -> crate::Result<u64>;
    /// Runs SQL on the data behind the store's back, for tests that put
    /// something there weft would not.
    async fn execute(&self, sql: &str);
    /// The one integer a query on the store's main data answers, read
    /// behind the store's back, for tests checking what no read method
    /// returns.
    async fn query_i64(&self, sql: &str) -> i64;
}

/// Expands to one `#[tokio::test]` per conformance test, run against
/// `$backend`: the list of the suite's tests lives here, once.
#[macro_export]
macro_rules! conformance_tests {
    ($backend:ty) => {
        $crate::conformance_tests!($backend:
            stored_data_ids_reports_what_is_stored,
            appends_survive_reopen,
            partitions_split_the_log_and_the_units,
            commit_processed_is_idempotent_and_moves_the_cursor,
            query_data_filters_and_get_data,
            query_failed_filters_and_overwrites,
            devices_crud_and_filters,
            devices_keep_their_variables_across_reopen,
            device_pages_search_count_and_show_last_seen,
            device_events_are_kept_once_with_the_latest_state_per_kind,
            device_types_crud,
            prune_keeps_unprocessed_and_never_reuses_seqs,
            entities_are_keyed_replaced_deleted_and_kept_across_reopen,
            ngsi_documents_are_keyed_by_kind_and_kept_across_reopen,
            history_append_is_idempotent_and_survives_reopen,
            history_states_sharing_a_time_are_rows_of_their_own,
            history_queries_filter_and_order,
            history_entities_are_listed_and_filtered,
            history_columns_are_kept_per_type_until_it_has_no_entity,
            history_queries_mark_every_state_without_the_attributes_asked,
            history_aggregates_per_method_and_period,
            history_aggregates_by_month_and_year,
            history_delete_by_id_and_type,
            history_delete_of_a_range_keeps_the_rest_and_its_rollups_right,
            history_delete_of_one_attribute_keeps_the_others,
            history_delete_stays_in_its_service_path,
            history_feed_is_queued_with_the_change_and_consumed_once,
            notified_rows_are_queued_then_moved_once,
            feed_moves_store_what_is_kept_and_consume_the_rest,
            change_feed_partitions_are_moved_apart_each_once,
            rollups_count_each_row_once,
            expiry_deletes_rows_then_whole_buckets,
            channel_publish_dedupes_and_pages,
            channel_subscribers_ack_prune_and_heads,
            channel_backlog_counts_after_a_cursor_within_its_channel,
            webhook_calls_are_queued_with_new_messages_only,
            rules_are_put_listed_and_deleted_with_their_state,
            alarm_batches_commit_versions_events_states_and_cursor,
            alarms_are_queried_newest_first_with_filters,
            api_keys_are_put_listed_revoked_and_kept_across_reopen,
            downlink_queues_are_pushed_replaced_flushed_and_kept_across_reopen,
            downlinks_are_claimed_once_and_finished_ones_are_bounded,
            downlink_routes_are_kept_per_device,
            change_log_is_written_with_the_change_and_read_in_order,
            change_log_head_survives_pruning_everything,
            change_log_prunes_by_seq_and_by_time_in_chunks,
            notification_cursors_are_saved_per_node_and_forgotten_everywhere,
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

/// A queued downlink for the downlink tests.
fn downlink(id: &str, device: &str, due: i64) -> weft_model::Downlink {
    weft_model::Downlink {
        id: id.to_string(),
        device_id: device.to_string(),
        f_port: 10,
        confirmed: false,
        priority: "NORMAL".to_string(),
        frm_payload: vec![1, 2, 3],
        data: Some(json!({"ring": 1})),
        command: None,
        status: weft_model::DownlinkStatus::Queued,
        reason: None,
        attempts: 0,
        route: None,
        created_at: 1_000,
        updated_at: 1_000,
        sent_at: None,
        expires_at: None,
        next_attempt_at: due,
    }
}

fn ids(downlinks: &[weft_model::Downlink]) -> Vec<&str> {
    downlinks.iter().map(|d| d.id.as_str()).collect()
}

/// A device's queue keeps its order; a replace swaps the open downlinks
/// (answering them) in one go; a flush deletes and answers them; other
/// devices' queues are untouched; everything survives a reopen.
pub(crate) async fn downlink_queues_are_pushed_replaced_flushed_and_kept_across_reopen<B: Backend>()
where
    B::Store: DownlinkStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
    assert!(store.list_downlinks("dev").await.unwrap().is_empty());
    let pushed = [downlink("a", "dev", 1), downlink("b", "dev", 1)];
    assert!(store
        .queue_downlinks("dev", &pushed, false)
        .await
        .unwrap()
        .is_empty());
    store
        .queue_downlinks("other", &[downlink("x", "other", 1)], false)
        .await
        .unwrap();
    store
        .queue_downlinks("dev", &[downlink("c", "dev", 1)], false)
        .await
        .unwrap();
    let listed = store.list_downlinks("dev").await.unwrap();
    assert_eq!(ids(&listed), ["a", "b", "c"]);
    assert_eq!(listed[0], pushed[0], "every field is kept");
    // Ids are unique: a second "a" is refused and changes nothing.
    assert!(store
        .queue_downlinks(
            "dev",
            &[downlink("d", "dev", 1), downlink("a", "dev", 1)],
            false
        )
        .await
        .is_err());
    assert_eq!(
        ids(&store.list_downlinks("dev").await.unwrap()),
        ["a", "b", "c"]
    );
    // A sent downlink stays listed, and a replace leaves it.
    let mut sent = listed[0].clone();
    sent.status = weft_model::DownlinkStatus::Sent;
    assert!(store.update_downlink(&sent).await.unwrap());
    let removed = store
        .queue_downlinks("dev", &[downlink("r", "dev", 1)], true)
        .await
        .unwrap();
    assert_eq!(ids(&removed), ["b", "c"]);
    assert_eq!(ids(&store.list_downlinks("dev").await.unwrap()), ["a", "r"]);
    B::close(&store).await;
    let store = backend.open().await;
    assert_eq!(ids(&store.list_downlinks("dev").await.unwrap()), ["a", "r"]);
    assert_eq!(ids(&store.flush_downlinks("dev").await.unwrap()), ["r"]);
    let left = store.list_downlinks("dev").await.unwrap();
    assert_eq!(ids(&left), ["a"]);
    assert_eq!(left[0].status, weft_model::DownlinkStatus::Sent);
    assert_eq!(ids(&store.list_downlinks("other").await.unwrap()), ["x"]);
    // A flushed downlink can no longer be updated.
    assert!(!store
        .update_downlink(&downlink("r", "dev", 1))
        .await
        .unwrap());
}

/// A claim returns what is due, earliest first, and leases it: a second
/// claim before the lease ends gets nothing. Pending downlinks are woken
/// per device. Finished downlinks beyond the kept number are deleted,
/// oldest first, open ones never.
pub(crate) async fn downlinks_are_claimed_once_and_finished_ones_are_bounded<B: Backend>()
where
    B::Store: DownlinkStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
    assert_eq!(store.next_downlink_due().await.unwrap(), None);
    let mut pending = downlink("p", "dev", 9_000);
    pending.status = weft_model::DownlinkStatus::Pending;
    store
        .queue_downlinks(
            "dev",
            &[
                downlink("late", "dev", 500),
                downlink("early", "dev", 100),
                pending,
            ],
            false,
        )
        .await
        .unwrap();
    assert_eq!(store.next_downlink_due().await.unwrap(), Some(100));
    assert!(store
        .claim_due_downlinks(50, 5_000, 10)
        .await
        .unwrap()
        .is_empty());
    let claimed = store.claim_due_downlinks(1_000, 5_000, 10).await.unwrap();
    assert_eq!(ids(&claimed), ["early", "late"]);
    assert!(
        store
            .claim_due_downlinks(1_000, 5_000, 10)
            .await
            .unwrap()
            .is_empty(),
        "leased"
    );
    // Both leases ended at 5,000: the older of the two comes first.
    assert_eq!(
        ids(&store.claim_due_downlinks(5_000, 6_000, 1).await.unwrap()),
        ["late"]
    );
    assert_eq!(store.wake_pending_downlinks("dev", 2_000).await.unwrap(), 1);
    assert_eq!(
        store.wake_pending_downlinks("nobody", 2_000).await.unwrap(),
        0
    );
    assert_eq!(
        ids(&store.claim_due_downlinks(2_000, 3_000, 10).await.unwrap()),
        ["p"]
    );
    // An update sets the next attempt: due again at its time.
    let mut retry = claimed[1].clone();
    retry.attempts = 1;
    retry.next_attempt_at = 7_000;
    assert!(store.update_downlink(&retry).await.unwrap());
    let again = store.claim_due_downlinks(7_000, 8_000, 10).await.unwrap();
    assert!(ids(&again).contains(&"late"));
    assert_eq!(again.iter().find(|d| d.id == "late").unwrap().attempts, 1);

    // Bounded history of finished downlinks.
    let kept = crate::FINISHED_DOWNLINKS_KEPT;
    let many: Vec<_> = (0..kept + 3)
        .map(|i| downlink(&format!("m{i:03}"), "busy", 1))
        .collect();
    store.queue_downlinks("busy", &many, false).await.unwrap();
    store
        .queue_downlinks("busy", &[downlink("open", "busy", 1)], false)
        .await
        .unwrap();
    for d in &many {
        let mut done = d.clone();
        done.status = weft_model::DownlinkStatus::Failed;
        assert!(store.update_downlink(&done).await.unwrap());
    }
    let listed = store.list_downlinks("busy").await.unwrap();
    assert_eq!(listed.len(), kept + 1);
    assert_eq!(listed[0].id, "m003", "the oldest finished ones went first");
    assert_eq!(listed.last().unwrap().id, "open");
}

/// A device's route is replaced by the next one, per device, and kept.
pub(crate) async fn downlink_routes_are_kept_per_device<B: Backend>()
where
    B::Store: DownlinkStore,
{
    use weft_model::DownlinkRoute;
    let backend = B::fresh().await;
    let store = backend.open().await;
    assert_eq!(store.downlink_route("dev").await.unwrap(), None);
    let helium = DownlinkRoute::Helium {
        url: "http://h/down".into(),
    };
    let ttn = DownlinkRoute::TtnWebhook {
        push_url: "http://t/push".into(),
        replace_url: None,
        api_key: Some("k".into()),
    };
    store.put_downlink_route("dev", &helium).await.unwrap();
    store.put_downlink_route("dev2", &helium).await.unwrap();
    store.put_downlink_route("dev", &ttn).await.unwrap();
    B::close(&store).await;
    let store = backend.open().await;
    assert_eq!(store.downlink_route("dev").await.unwrap(), Some(ttn));
    assert_eq!(store.downlink_route("dev2").await.unwrap(), Some(helium));
}

/// An API key record for the key tests.
fn api_key(id: &str, secret: &str) -> weft_model::apikey::ApiKey {
    use weft_model::apikey::{hash_secret_hex, ApiKey, RateLimit, Role};
    ApiKey {
        id: id.to_string(),
        hash: hash_secret_hex(secret),
        prefix: secret[..9].to_string(),
        name: format!("key {id}"),
        role: Role::Write,
        tenant: "smartcity".to_string(),
        service_path: Some("/parks".to_string()),
        channel: None,
        device_type: None,
        rate_limit: Some(RateLimit {
            rate: 5.0,
            burst: 10,
        }),
        created_at: 1_000,
        expires_at: Some(2_000),
        revoked_at: None,
    }
}

/// Keys are created, replaced by id (a revocation is a replacement),
/// listed by id with every field kept, and survive a reopen; two keys
/// cannot share a hash.
pub(crate) async fn api_keys_are_put_listed_revoked_and_kept_across_reopen<B: Backend>()
where
    B::Store: KeyStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
    assert!(store.list_api_keys().await.unwrap().is_empty());
    let b = api_key("key_b", "weft_bbbbbbbbbbbbbbbb");
    let mut a = api_key("key_a", "weft_aaaaaaaaaaaaaaaa");
    assert!(store.put_api_key(&b).await.unwrap());
    assert!(store.put_api_key(&a).await.unwrap());
    assert_eq!(store.list_api_keys().await.unwrap(), [a.clone(), b.clone()]);
    a.revoked_at = Some(1_500);
    assert!(
        !store.put_api_key(&a).await.unwrap(),
        "replaced, not created"
    );
    let mut twin = api_key("key_c", "weft_aaaaaaaaaaaaaaaa");
    twin.role = weft_model::apikey::Role::Admin;
    assert!(
        store.put_api_key(&twin).await.is_err(),
        "a second key with the same secret is refused"
    );
    B::close(&store).await;
    let store = backend.open().await;
    assert_eq!(store.list_api_keys().await.unwrap(), [a, b]);
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
            consumers: vec!["pipeline".into()],
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
        partition: 0,
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
        event: (i % 4 == 3).then(|| format!("event{i}")),
        device_id: (i % 3 == 1).then(|| format!("dev{i}")),
        source: (i % 3 == 2).then(|| "ttn".to_string()),
        pins: weft_model::UplinkPins {
            channel: (i % 4 == 1).then(|| "farm".to_string()),
            device_type: (i % 8 == 5).then(|| "thermo".to_string()),
        },
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
        partition: 0,
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
    let log = store.read_uplinks(1, 1_000, None).await.unwrap();
    assert_eq!(log.len(), 50);
    for (i, entry) in log.iter().enumerate() {
        assert_eq!(entry.seq, i as u64 + 1);
        assert_eq!(entry.uplink, uplink(i));
    }
    // `from_seq` is inclusive and `limit` bounds the page.
    let page = store.read_uplinks(10, 5, None).await.unwrap();
    assert_eq!(
        page.iter().map(|u| u.seq).collect::<Vec<_>>(),
        [10, 11, 12, 13, 14]
    );
    assert_eq!(store.append_uplink(uplink(50)).await.unwrap(), 51);
}

/// The pipeline's partitions: each log entry is read back in its
/// partition, a unit is stored and queried by the partition that stored
/// it, and a batch moves the cursors of every partition it read. A store
/// of one process has one partition (0) and answers nothing for others.
pub(crate) async fn partitions_split_the_log_and_the_units<B: Backend>()
where
    B::Store: IngestLogStore + UnitStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
    let n = store.partitions();
    assert!(n >= 1);
    let part = |i: usize| (i as u16) % n;
    for i in 0..8 {
        let mut u = uplink(i);
        u.partition = part(i);
        store.append_uplink(u).await.unwrap();
    }
    let all = store.read_uplinks(1, 100, None).await.unwrap();
    assert_eq!(all.len(), 8);
    assert!(all
        .iter()
        .enumerate()
        .all(|(i, u)| u.uplink.partition == part(i)));
    let one = store.read_uplinks(1, 100, Some(&[1])).await.unwrap();
    let expected: Vec<u64> = (0..8)
        .filter(|&i| part(i) == 1)
        .map(|i| i as u64 + 1)
        .collect();
    assert_eq!(one.iter().map(|u| u.seq).collect::<Vec<_>>(), expected);
    let first = store.read_uplinks(1, 100, Some(&[0])).await.unwrap();
    assert_eq!(first.len(), (0..8).filter(|&i| part(i) == 0).count());

    let mut a = unit("pa", "d1", "c", "t", 10);
    a.partition = part(1);
    let b = unit("pb", "d2", "c", "t", 11);
    let names = vec!["pipeline".to_string(), "pipeline/1".to_string()];
    store
        .commit_processed(Arc::new(ProcessedBatch {
            consumers: names.clone(),
            next_seq: 9,
            units: vec![a, b],
            ..ProcessedBatch::default()
        }))
        .await
        .unwrap();
    for name in &names {
        assert_eq!(store.cursor(name).await.unwrap(), 9, "{name}");
    }
    let query = |partitions: Option<Vec<u16>>| DataQuery {
        limit: 100,
        partitions,
        ..DataQuery::default()
    };
    let ids = |rows: Vec<crate::StoredUnit>| -> Vec<(String, u16)> {
        rows.iter()
            .map(|r| {
                let v: serde_json::Value = serde_json::from_str(&r.json).unwrap();
                (v["dataId"].as_str().unwrap().to_string(), r.partition)
            })
            .collect()
    };
    let everything = ids(store.query_data(&query(None)).await.unwrap());
    assert_eq!(
        everything,
        [("pa".to_string(), part(1)), ("pb".to_string(), 0)]
    );
    let of_one = ids(store.query_data(&query(Some(vec![1]))).await.unwrap());
    if n > 1 {
        assert_eq!(of_one, [("pa".to_string(), 1)]);
    } else {
        assert!(of_one.is_empty());
    }
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
        consumers: vec!["pipeline".into()],
        next_seq: 3,
        units: vec![unit("a", "d1", "c", "t", 10), unit("b", "d1", "c", "t", 11)],
        failures: vec![failure(2, Some("c"), None, json!({"x": 1}))],
        new_devices: vec![device("d1", "t", "c", json!({}))],
        entities: vec![entity("", "/", "d1", "T", 1, "{\"v\":1}")],
        entity_cursors: vec![crate::ENTITIES_CURSOR.into()],
        history: Vec::new(),
        events: Vec::new(),
        changes: Vec::new(),
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
            consumers: vec!["pipeline".into()],
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
        consumers: vec!["pipeline".into()],
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

/// A device's variables (ChirpStack's, which its codec reads) are kept
/// with it: read back by id, in a page, after a reopen; a replace without
/// them leaves it none.
pub(crate) async fn devices_keep_their_variables_across_reopen<B: Backend>()
where
    B::Store: CatalogStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
    let variables: std::collections::BTreeMap<String, String> =
        [("offset", "-0.5"), ("serial", "A7-\"quoted\" ü")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    let with = Device {
        variables: Arc::new(variables.clone()),
        ..device("v", "thermo", "north", json!({}))
    };
    let without = device("w", "thermo", "north", json!({}));
    assert!(store.put_device(&with).await.unwrap());
    assert!(store.put_device(&without).await.unwrap());
    assert_eq!(device_by_id(&*store, "v").await, Some(with.clone()));
    let page = store
        .page_devices(&DevicePageQuery {
            filter: DeviceFilter::default(),
            search: Some("v".into()),
            limit: 10,
            offset: 0,
        })
        .await
        .unwrap();
    assert_eq!(*page.devices[0].device.variables, variables);
    B::close(&store).await;
    drop(store);

    let store = backend.open().await;
    assert_eq!(device_by_id(&*store, "v").await, Some(with.clone()));
    assert!(device_by_id(&*store, "w")
        .await
        .unwrap()
        .variables
        .is_empty());
    let cleared = Device {
        variables: Default::default(),
        ..with
    };
    assert!(!store.put_device(&cleared).await.unwrap());
    assert!(device_by_id(&*store, "v")
        .await
        .unwrap()
        .variables
        .is_empty());
}

/// Device pages: cut in id order with the count of all that match, the
/// search finds ids and names whatever their case, record filters page
/// as well, and each device shows when it was last heard of (its latest
/// event here) and its state.
pub(crate) async fn device_pages_search_count_and_show_last_seen<B: Backend>()
where
    B::Store: UnitStore + CatalogStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
    for i in 0..25 {
        let mut d = device(
            &format!("dev-{i:02}"),
            if i % 2 == 0 { "even" } else { "odd" },
            "north",
            json!({"floor": i % 3}),
        );
        if i == 7 {
            d.name = "Boiler Room".into();
        }
        if i == 8 {
            d.name = r#"Tank "B" \ west"#.into();
        }
        store.put_device(&d).await.unwrap();
    }
    let page = |filter: DeviceFilter, search: Option<&str>, limit: usize, offset: usize| {
        let store = &store;
        let query = DevicePageQuery {
            filter,
            search: search.map(str::to_string),
            limit,
            offset,
        };
        async move {
            let page = store.page_devices(&query).await.unwrap();
            let ids: Vec<String> = page.devices.iter().map(|d| d.device.id.clone()).collect();
            (page.total, ids)
        }
    };
    let all = DeviceFilter::default;
    assert_eq!(
        page(all(), None, 3, 0).await,
        (25, vec!["dev-00".into(), "dev-01".into(), "dev-02".into()])
    );
    assert_eq!(
        page(all(), None, 10, 23).await,
        (25, vec!["dev-23".into(), "dev-24".into()])
    );
    assert_eq!(page(all(), None, 10, 40).await, (25, vec![]));
    assert_eq!(
        page(all(), Some("boiler"), 10, 0).await,
        (1, vec!["dev-07".into()])
    );
    // Quotes and backslashes, which the stored JSON escapes.
    assert_eq!(
        page(all(), Some(r#""b" \"#), 10, 0).await,
        (1, vec!["dev-08".into()])
    );
    assert_eq!(
        page(all(), Some("dev-1"), 2, 0).await,
        (10, vec!["dev-10".into(), "dev-11".into()])
    );
    let odd = DeviceFilter {
        device_type: Some("odd".into()),
        ..DeviceFilter::default()
    };
    assert_eq!(
        page(odd, Some("dev-2"), 5, 1).await,
        (2, vec!["dev-23".into()])
    );
    let floor_zero = DeviceFilter {
        records: vec![("floor".into(), "0".into())],
        ..DeviceFilter::default()
    };
    // dev-00, 03, 06, 09, 12, 15, 18, 21, 24.
    assert_eq!(
        page(floor_zero, None, 2, 3).await,
        (9, vec!["dev-09".into(), "dev-12".into()])
    );

    let status = device_event(3, "dev-05", "status", json!({"batteryLevel": 42.0}));
    store
        .commit_processed(Arc::new(ProcessedBatch {
            consumers: vec!["pipeline".into()],
            next_seq: 4,
            events: vec![status],
            ..ProcessedBatch::default()
        }))
        .await
        .unwrap();
    let shown = store
        .page_devices(&DevicePageQuery {
            limit: 2,
            offset: 4,
            ..DevicePageQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(shown.devices[0].last_seen, None);
    assert_eq!(shown.devices[1].device.id, "dev-05");
    assert_eq!(shown.devices[1].last_seen, Some(1_003));
    assert_eq!(shown.devices[1].state["status"]["batteryLevel"], 42.0);
}

/// A ChirpStack-style device event at log position `seq`.
pub(crate) fn device_event(seq: u64, device: &str, event: &str, body: Value) -> DeviceEvent {
    let mut body = body;
    body["deviceInfo"] = json!({"devEui": device});
    let mut made = DeviceEvent::of(
        UplinkFormat::ChirpStack,
        event,
        Some(device.to_string()),
        None,
        body.clone(),
        seq,
        1_000 + seq as i64,
    )
    .unwrap();
    // What the pipeline reads out of the body: here, all of it.
    made.fields = body.as_object().cloned().unwrap_or_default();
    made.fields.remove("deviceInfo");
    made
}

/// Device events commit with the pipeline's batch: a replay (same log
/// position) is stored once, each device's state holds the latest event
/// of each kind (an older one replayed later does not win), only the
/// last [`crate::DEVICE_EVENTS_KEPT`] events of a device are kept, and
/// deleting the device deletes its events and state.
pub(crate) async fn device_events_are_kept_once_with_the_latest_state_per_kind<B: Backend>()
where
    B::Store: UnitStore + CatalogStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
    let batch = |next_seq: u64, events: Vec<DeviceEvent>| {
        Arc::new(ProcessedBatch {
            consumers: vec!["pipeline".into()],
            next_seq,
            events,
            ..ProcessedBatch::default()
        })
    };
    let join = device_event(2, "d1", "join", json!({"devAddr": "01020304"}));
    let status = device_event(
        3,
        "d1",
        "status",
        json!({"batteryLevel": 80.0, "margin": 5}),
    );
    let other = device_event(
        4,
        "d2",
        "log",
        json!({"level": "ERROR", "code": "UPLINK_CODEC"}),
    );
    store
        .commit_processed(batch(5, vec![join.clone(), status.clone(), other.clone()]))
        .await
        .unwrap();
    // Replayed: stored once.
    store
        .commit_processed(batch(5, vec![join.clone(), status.clone()]))
        .await
        .unwrap();
    let events = store.device_events("d1", None, 10).await.unwrap();
    assert_eq!(events, vec![status.clone(), join.clone()]);
    assert_eq!(
        store.device_events("d1", Some("join"), 10).await.unwrap(),
        vec![join.clone()]
    );
    let state = store.device_state("d1").await.unwrap();
    assert_eq!(state.keys().collect::<Vec<_>>(), ["join", "status"]);
    assert_eq!(state["join"]["devAddr"], "01020304");
    assert_eq!(state["status"]["batteryLevel"], 80.0);
    assert_eq!(state["status"]["receivedAt"], 1_003);

    // A newer status replaces the state; an older one arriving after it
    // (a replay of an earlier log entry) does not.
    let newer = device_event(10, "d1", "status", json!({"batteryLevel": 60.0}));
    let older = device_event(7, "d1", "status", json!({"batteryLevel": 99.0}));
    store
        .commit_processed(batch(11, vec![newer]))
        .await
        .unwrap();
    store
        .commit_processed(batch(11, vec![older]))
        .await
        .unwrap();
    let state = store.device_state("d1").await.unwrap();
    assert_eq!(state["status"]["batteryLevel"], 60.0);
    assert_eq!(state["join"]["devAddr"], "01020304");

    // Only the last events of a device are kept; the state stays.
    let kept = crate::DEVICE_EVENTS_KEPT as u64;
    let many: Vec<DeviceEvent> = (0..kept + 5)
        .map(|i| device_event(100 + i, "d1", "txack", json!({"fCntDown": i})))
        .collect();
    store.commit_processed(batch(500, many)).await.unwrap();
    let events = store.device_events("d1", None, 10_000).await.unwrap();
    assert_eq!(events.len() as u64, kept);
    assert_eq!(events[0].seq, 100 + kept + 4);
    assert_eq!(
        store.device_state("d1").await.unwrap()["join"]["devAddr"],
        "01020304"
    );

    // Invented kinds past the cap are kept as events, not as state.
    let invented: Vec<DeviceEvent> = (0..crate::DEVICE_STATE_KINDS as u64 + 8)
        .map(|i| device_event(1_000 + i, "d3", &format!("kind{i}"), json!({})))
        .collect();
    store
        .commit_processed(batch(2_000, invented))
        .await
        .unwrap();
    let state = store.device_state("d3").await.unwrap();
    assert_eq!(state.len(), crate::DEVICE_STATE_KINDS);
    assert!(state.contains_key("kind0") && !state.contains_key("kind39"));
    // A kind it has is still updated.
    let again = device_event(3_000, "d3", "kind0", json!({"n": 2}));
    store
        .commit_processed(batch(3_001, vec![again]))
        .await
        .unwrap();
    assert_eq!(
        store.device_state("d3").await.unwrap()["kind0"]["receivedAt"],
        4_000
    );

    // Deleting the device takes its events and state, not another's.
    store
        .put_device(&device("d1", "t", "c", json!({})))
        .await
        .unwrap();
    assert!(store.delete_device("d1").await.unwrap());
    assert!(store
        .device_events("d1", None, 10)
        .await
        .unwrap()
        .is_empty());
    assert!(store.device_state("d1").await.unwrap().is_empty());
    assert_eq!(
        store.device_events("d2", None, 10).await.unwrap(),
        vec![other]
    );
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
        .read_uplinks(0, 100, None)
        .await
        .unwrap()
        .iter()
        .map(|u| u.seq)
        .collect();
    assert_eq!(left, [5, 6, 7, 8, 9, 10]);
    // Old enough but not processed: kept.
    assert_eq!(store.prune_uplinks(7, i64::MAX).await.unwrap(), 2);
    assert_eq!(store.read_uplinks(0, 100, None).await.unwrap()[0].seq, 7);

    assert_eq!(store.prune_uplinks(u64::MAX, i64::MAX).await.unwrap(), 4);
    assert!(store.read_uplinks(0, 100, None).await.unwrap().is_empty());
    assert_eq!(store.append_uplink(uplink(10)).await.unwrap(), 11);
    assert_eq!(store.prune_uplinks(u64::MAX, i64::MAX).await.unwrap(), 1);
    B::close(&store).await;
    drop(store);

    let store = backend.open().await;
    assert_eq!(*store.committed_seq().borrow(), 11);
    assert_eq!(store.append_uplink(uplink(11)).await.unwrap(), 12);
}

/// Entities are keyed by tenant, service path, id and type, replaced on
/// put, loaded in creation order (all, or those of one id), and survive a
/// reopen; a processed batch stores its entities with its units.
pub(crate) async fn entities_are_keyed_replaced_deleted_and_kept_across_reopen<B: Backend>()
where
    B::Store: ContextStore + UnitStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
    store
        .put_entity(
            entity("t1", "/", "E", "T", 2, "{}"),
            Default::default(),
            None,
        )
        .await
        .unwrap();
    store
        .put_entity(
            entity("t1", "/a", "E", "T", 3, "{}"),
            Default::default(),
            None,
        )
        .await
        .unwrap();
    store
        .put_entity(
            entity("t2", "/", "E", "T", 1, "{}"),
            Default::default(),
            None,
        )
        .await
        .unwrap();
    store
        .put_entity(
            entity("t1", "/", "E", "T", 2, "{\"new\":true}"),
            Default::default(),
            None,
        )
        .await
        .unwrap();
    store
        .commit_processed(Arc::new(ProcessedBatch {
            consumers: vec!["pipeline".into()],
            next_seq: 2,
            entities: vec![entity("", "/", "dev", "Sensor", 4, "{\"t\":1}")],
            ..ProcessedBatch::default()
        }))
        .await
        .unwrap();
    assert!(store
        .delete_entity("t2", "/", "E", "T", None)
        .await
        .unwrap());
    assert!(!store
        .delete_entity("t2", "/", "E", "T", None)
        .await
        .unwrap());
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

    // By id alone: every path and type of that tenant's id, nothing else.
    assert_eq!(
        store.load_entities_with_id("t1", "E").await.unwrap(),
        vec![
            entity("t1", "/", "E", "T", 2, "{\"new\":true}"),
            entity("t1", "/a", "E", "T", 3, "{}"),
        ]
    );
    assert_eq!(
        store.load_entities_with_id("t2", "E").await.unwrap(),
        vec![]
    );
    assert_eq!(
        store.load_entities_with_id("t1", "dev").await.unwrap(),
        vec![]
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

// --- history ------------------------------------------------------------

/// A numeric history row.
pub(crate) fn hrow(
    tenant: &str,
    path: &str,
    id: &str,
    ty: &str,
    attr: &str,
    time: i64,
    n: f64,
) -> HistoryRow {
    HistoryRow {
        tenant: tenant.into(),
        service_path: path.into(),
        entity_id: id.into(),
        entity_type: ty.into(),
        attr: attr.into(),
        attr_type: "Number".into(),
        time,
        instance: 0,
        value: serde_json::to_string(&n).unwrap(),
        number: Some(n),
    }
}

/// A text history row (no number).
pub(crate) fn hrow_text(
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
pub(crate) fn hquery() -> HistoryQuery {
    HistoryQuery {
        tenant: "t".into(),
        limit: 10_000,
        ..HistoryQuery::default()
    }
}

/// A delete in tenant `t` of one entity and/or type, over all time.
pub(crate) fn hdelete(id: Option<&str>, ty: Option<&str>) -> HistoryDelete {
    HistoryDelete {
        tenant: "t".into(),
        entity_id: id.map(str::to_string),
        entity_type: ty.map(str::to_string),
        ..HistoryDelete::default()
    }
}

/// (entity id, entity type, attribute, time) of each row, in order.
pub(crate) fn keys(rows: &[HistoryRow]) -> Vec<(String, String, String, i64)> {
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

pub(crate) fn key(id: &str, ty: &str, attr: &str, time: i64) -> (String, String, String, i64) {
    (id.into(), ty.into(), attr.into(), time)
}

pub(crate) fn times(rows: &[HistoryRow]) -> Vec<i64> {
    rows.iter().map(|r| r.time).collect()
}

/// The rows of the query tests: tenant `t` has Room:1 (as a Room under
/// `/a`, 10 temperatures and a name; and as an `Other` under `/a`),
/// Room:2 under `/a/b`, Room:3 under `/ab`, Car:1 under `/`; tenant `u`
/// has its own Room:1.
pub(crate) fn query_fixture() -> Vec<HistoryRow> {
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

/// The aggregate of `values` the way SQLite computes it.
pub(crate) fn expected(method: AggrMethod, values: &[Option<f64>]) -> Option<f64> {
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

pub(crate) fn feed_row(entity: &str, time: i64) -> crate::HistoryRow {
    crate::HistoryRow {
        tenant: String::new(),
        service_path: "/".into(),
        entity_id: entity.into(),
        entity_type: "T".into(),
        attr: "a".into(),
        attr_type: "Number".into(),
        time,
        instance: 0,
        value: time.to_string(),
        number: Some(time as f64),
    }
}

/// Appending is idempotent on (tenant, entity, attribute, time, instance)
/// (a feed entry moved again after a crash carries the same instances): a replay
/// stores nothing twice and the answer counts only new rows; what was
/// acknowledged survives a reopen, in its own file.
pub(crate) async fn history_append_is_idempotent_and_survives_reopen<B: Backend>()
where
    B::Store: HistoryStore + ContextStore + UnitStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
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
    assert_eq!(B::append_history(&store, first.clone()).await.unwrap(), 5);
    assert_eq!(B::append_history(&store, first.clone()).await.unwrap(), 0);
    assert_eq!(B::append_history(&store, Vec::new()).await.unwrap(), 0);
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
    assert_eq!(B::append_history(&store, overlap).await.unwrap(), 1);
    // Concurrent replays of one batch store it once.
    let store = Arc::new(store);
    let batch: Vec<HistoryRow> = (0..100)
        .map(|i| hrow("t", "/", "Room:2", "Room", "pressure", i, 1.0))
        .collect();
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (store, batch) = (Arc::clone(&store), batch.clone());
            tokio::spawn(async move { B::append_history(&store, batch).await.unwrap() })
        })
        .collect();
    let mut new = 0;
    for t in tasks {
        new += t.await.unwrap();
    }
    assert_eq!(new, 100);
    B::close(&store).await;
    drop(store);

    let store = backend.open().await;
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

/// Two recorded states of one entity under the same time index (two
/// notifications arriving in the same millisecond) are two rows, told
/// apart by their instance: both stored, replays of either not; `last_n`,
/// `offset` and `limit` count them one by one in (time, instance) order;
/// aggregates count both; a delete cut inside a shared time removes
/// exactly the rows it counts.
pub(crate) async fn history_states_sharing_a_time_are_rows_of_their_own<B: Backend>()
where
    B::Store: HistoryStore + ContextStore + UnitStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
    let state = |time: i64, instance: i64, n: f64| HistoryRow {
        instance,
        ..hrow("t", "/", "Room:1", "Room", "temperature", time, n)
    };
    let rows: Vec<HistoryRow> = (0..6).map(|i| state(1_000, 10 + i, i as f64)).collect();
    assert_eq!(B::append_history(&store, rows.clone()).await.unwrap(), 6);
    assert_eq!(B::append_history(&store, rows).await.unwrap(), 0, "replay");
    assert_eq!(
        B::append_history(&store, vec![state(2_000, 1, 6.0)])
            .await
            .unwrap(),
        1
    );
    let query = |f: fn(&mut HistoryQuery)| {
        let mut q = HistoryQuery {
            entity_ids: vec!["Room:1".into()],
            ..hquery()
        };
        f(&mut q);
        q
    };
    let values = |rows: Vec<HistoryRow>| rows.iter().map(|r| r.number.unwrap()).collect::<Vec<_>>();
    let all = store.query_history(&query(|_| {})).await.unwrap();
    assert_eq!(values(all), [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let last = store
        .query_history(&query(|q| q.last_n = Some(3)))
        .await
        .unwrap();
    assert_eq!(
        values(last),
        [4.0, 5.0, 6.0],
        "last_n is exact inside a time"
    );
    let page = store
        .query_history(&query(|q| {
            q.offset = 2;
            q.limit = 3;
        }))
        .await
        .unwrap();
    assert_eq!(values(page), [2.0, 3.0, 4.0]);
    let count = store
        .aggregate_history(&query(|_| {}), AggrMethod::Count, None)
        .await
        .unwrap();
    assert_eq!(count[0].value, Some(7.0));
    let deleted = store
        .delete_history(&HistoryDelete {
            tenant: "t".into(),
            entity_id: Some("Room:1".into()),
            to: Some(1_000),
            ..HistoryDelete::default()
        })
        .await
        .unwrap();
    assert_eq!(deleted, 6);
    let left = store.query_history(&query(|_| {})).await.unwrap();
    assert_eq!(values(left), [6.0]);
    let count = store
        .aggregate_history(&query(|_| {}), AggrMethod::Count, Some(AggrPeriod::Hour))
        .await
        .unwrap();
    assert_eq!(count[0].value, Some(1.0), "the rollups lost the six rows");
}

/// Queries select series by ids, type, attributes and service-path
/// prefix; rows by inclusive time range, then `last_n`, `offset` and
/// `limit` per series; results are ordered by entity, attribute, time.
pub(crate) async fn history_queries_filter_and_order<B: Backend>()
where
    B::Store: HistoryStore + ContextStore + UnitStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
    B::append_history(&store, query_fixture()).await.unwrap();
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
pub(crate) async fn history_entities_are_listed_and_filtered<B: Backend>()
where
    B::Store: HistoryStore + ContextStore + UnitStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
    B::append_history(&store, query_fixture()).await.unwrap();
    // A later row under another path does not move the entity.
    B::append_history(
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

/// With `every_state`, a query of some attributes also answers a marker
/// row for each state in range holding none of them (counted as a series
/// of its own); without it, only the attributes' rows.
pub(crate) async fn history_queries_mark_every_state_without_the_attributes_asked<B: Backend>()
where
    B::Store: HistoryStore + ContextStore + UnitStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
    B::append_history(&store, query_fixture()).await.unwrap();
    B::append_history(
        &store,
        vec![
            hrow_text("t", "/a", "Room:1", "Room", "name", 20_000, "r2"),
            hrow_text("t", "/a", "Room:1", "Room", "name", 30_000, "r3"),
        ],
    )
    .await
    .unwrap();
    let q = HistoryQuery {
        tenant: "t".into(),
        entity_ids: vec!["Room:1".into()],
        entity_type: Some("Room".into()),
        attrs: vec!["temperature".into()],
        limit: 100,
        ..HistoryQuery::default()
    };
    let rows = |q: HistoryQuery| {
        let store = Arc::clone(&store);
        async move {
            store
                .query_history(&q)
                .await
                .unwrap()
                .into_iter()
                .map(|r| (r.attr, r.time))
                .collect::<Vec<_>>()
        }
    };
    let plain = rows(q.clone()).await;
    assert_eq!(plain.len(), 10);
    assert!(plain.iter().all(|(a, _)| a == "temperature"));
    let every = rows(HistoryQuery {
        every_state: true,
        ..q.clone()
    })
    .await;
    let markers: Vec<i64> = every
        .iter()
        .filter(|(a, _)| a == crate::STATE_MARKER)
        .map(|(_, t)| *t)
        .collect();
    assert_eq!(markers, [20_000, 30_000]);
    assert_eq!(every.len(), 12);
    // With `last_n`, the newest state is there (a marker), and nothing
    // older than each series' newest (a backend may read only that state).
    let newest = rows(HistoryQuery {
        every_state: true,
        last_n: Some(1),
        ..q
    })
    .await;
    assert!(
        newest.contains(&(crate::STATE_MARKER.to_string(), 30_000)),
        "{newest:?}"
    );
    assert!(
        newest.iter().all(|(_, t)| [10_000, 30_000].contains(t)),
        "{newest:?}"
    );
}

/// The attributes recorded per type (QuantumLeap's columns): of every
/// entity of the type, per tenant, sorted by bytes, across reopen; kept
/// while an entity of the type has history, forgotten after.
pub(crate) async fn history_columns_are_kept_per_type_until_it_has_no_entity<B: Backend>()
where
    B::Store: HistoryStore + ContextStore + UnitStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
    B::append_history(&store, query_fixture()).await.unwrap();
    B::append_history(
        &store,
        vec![hrow("t", "/", "Room:3", "Room", "Pressure", 9_000, 1.0)],
    )
    .await
    .unwrap();
    let columns = |store: &Arc<B::Store>, tenant: &'static str, ty: &'static str| {
        let store = Arc::clone(store);
        async move { store.history_attributes(tenant, ty).await.unwrap() }
    };
    assert_eq!(
        columns(&store, "t", "Room").await,
        ["Pressure", "name", "temperature"]
    );
    assert_eq!(columns(&store, "t", "Car").await, ["speed"]);
    assert_eq!(columns(&store, "u", "Room").await, ["temperature"]);
    assert!(columns(&store, "t", "Nope").await.is_empty());
    B::close(&store).await;
    let store = backend.open().await;
    assert_eq!(
        columns(&store, "t", "Car").await,
        ["speed"],
        "kept across reopen"
    );
    // Deleting one entity keeps the type's columns (Room:1's `name` too).
    store
        .delete_history(&hdelete(Some("Room:1"), Some("Room")))
        .await
        .unwrap();
    assert_eq!(
        columns(&store, "t", "Room").await,
        ["Pressure", "name", "temperature"]
    );
    store
        .delete_history(&hdelete(None, Some("Car")))
        .await
        .unwrap();
    assert!(columns(&store, "t", "Car").await.is_empty(), "no Car left");
}

/// Every method over every fixed-length period (and none) matches the
/// aggregates computed here from the same rows, per series and bucket,
/// within the time range; text rows count but have no number.
pub(crate) async fn history_aggregates_per_method_and_period<B: Backend>()
where
    B::Store: HistoryStore + ContextStore + UnitStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
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
    B::append_history(&store, rows.clone()).await.unwrap();

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
pub(crate) async fn history_aggregates_by_month_and_year<B: Backend>()
where
    B::Store: HistoryStore + ContextStore + UnitStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
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
    B::append_history(&store, rows.to_vec()).await.unwrap();
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
pub(crate) async fn history_delete_by_id_and_type<B: Backend>()
where
    B::Store: HistoryStore + ContextStore + UnitStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
    B::append_history(&store, query_fixture()).await.unwrap();
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
    assert_eq!(store.delete_history(&hdelete(None, None)).await.unwrap(), 0);
    assert_eq!(
        store
            .delete_history(&hdelete(Some("Room:1"), Some("Room")))
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
            .delete_history(&hdelete(Some("Room:1"), None))
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        store
            .delete_history(&hdelete(Some("Room:1"), None))
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        store
            .delete_history(&hdelete(None, Some("Room")))
            .await
            .unwrap(),
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
    let big = crate::HISTORY_DELETE_CHUNK as i64 + 1_234;
    let rows: Vec<HistoryRow> = (0..big)
        .map(|i| {
            let attr = if i % 2 == 0 { "a" } else { "b" };
            let id = if i % 5 == 0 { "Big:2" } else { "Big:1" };
            hrow("t", "/", id, "Big", attr, i, i as f64)
        })
        .collect();
    for chunk in rows.chunks(10_000) {
        B::append_history(&store, chunk.to_vec()).await.unwrap();
    }
    assert_eq!(
        store
            .delete_history(&hdelete(None, Some("Big")))
            .await
            .unwrap(),
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

/// A delete with a range removes the rows at its bounds and between
/// (inclusive, as QuantumLeap's `fromDate`/`toDate`) and no other, in
/// chunks; the rollups it covers whole go and those it cuts through count
/// only what is left, so aggregates agree with the rows afterwards; an
/// entity keeps its listing while it has history left.
pub(crate) async fn history_delete_of_a_range_keeps_the_rest_and_its_rollups_right<B: Backend>()
where
    B::Store: HistoryStore + ContextStore + UnitStore,
{
    range_delete::<B>(Vec::new()).await;
}

/// A delete of one attribute over a range: the attribute's rows in range
/// go, the entity's other attributes stay, in the rows and the rollups.
pub(crate) async fn history_delete_of_one_attribute_keeps_the_others<B: Backend>()
where
    B::Store: HistoryStore + ContextStore + UnitStore,
{
    range_delete::<B>(vec!["x".into()]).await;
}

/// Deletes the range below of R's `attrs` (empty: all), then checks every
/// series' rows and rollups against what should be left.
async fn range_delete<B: Backend>(attrs: Vec<String>)
where
    B::Store: HistoryStore + ContextStore + UnitStore,
{
    let covered = |attr: &str| attrs.is_empty() || attrs.iter().any(|a| a == attr);
    let backend = B::fresh().await;
    let store = backend.open().await;
    const T0: i64 = 1_704_067_200_000; // 2024-01-01T00:00:00Z
    let hour = 3_600_000;
    // Three hours of one row every 90 ms (more rows than one chunk) of
    // `x` (value: its index mod 7) and one row a minute of `y`, for R;
    // the same `x` for S, which the delete does not name.
    let x = |id: &str, i: i64| hrow("t", "/", id, "T", "x", T0 + i * 90, (i % 7) as f64);
    let mut rows: Vec<HistoryRow> = (0..120_000i64).map(|i| x("R", i)).collect();
    rows.extend((0..180i64).map(|i| hrow("t", "/", "R", "T", "y", T0 + i * 60_000, 2.0)));
    rows.extend((0..1_000i64).map(|i| x("S", i)));
    for chunk in rows.chunks(20_000) {
        B::append_history(&store, chunk.to_vec()).await.unwrap();
    }
    // From 00:30:00.030 (a row's time) to 02:10:00.000 (a row's time),
    // both inclusive: cuts minute 00:30, hour 00, minute 02:10, hour 02.
    let (from, to) = (T0 + hour / 2 + 30, T0 + 2 * hour + 10 * 60_000);
    let in_range = |t: i64| t >= from && t <= to;
    let gone_x = rows
        .iter()
        .filter(|r| r.entity_id == "R" && r.attr == "x" && in_range(r.time))
        .count();
    let gone_y = if covered("y") {
        rows.iter()
            .filter(|r| r.entity_id == "R" && r.attr == "y" && in_range(r.time))
            .count()
    } else {
        0
    };
    assert!(gone_x > crate::HISTORY_DELETE_CHUNK);
    let deleted = store
        .delete_history(&HistoryDelete {
            from: Some(from),
            to: Some(to),
            attrs: attrs.clone(),
            ..hdelete(Some("R"), None)
        })
        .await
        .unwrap();
    assert_eq!(deleted, (gone_x + gone_y) as u64);

    let kept: Vec<&HistoryRow> = rows
        .iter()
        .filter(|r| r.entity_id != "R" || !in_range(r.time) || !covered(&r.attr))
        .collect();
    for (id, attr) in [("R", "x"), ("R", "y"), ("S", "x")] {
        let q = HistoryQuery {
            entity_ids: vec![id.into()],
            attrs: vec![attr.into()],
            ..hquery()
        };
        let want: Vec<&HistoryRow> = kept
            .iter()
            .copied()
            .filter(|r| r.entity_id == id && r.attr == attr)
            .collect();
        // The rows: those outside the range, at the edges too.
        let mut got = Vec::new();
        for part in want.chunks(10_000) {
            let (a, b) = (part[0].time, part[part.len() - 1].time);
            got.extend(
                store
                    .query_history(&HistoryQuery {
                        from: Some(a),
                        to: Some(b),
                        ..q.clone()
                    })
                    .await
                    .unwrap(),
            );
        }
        assert_eq!(
            times(&got),
            want.iter().map(|r| r.time).collect::<Vec<_>>(),
            "{id} {attr}"
        );
        // The aggregates, read from the rollups, agree with the rows.
        for (period, unit) in [(AggrPeriod::Hour, hour), (AggrPeriod::Minute, 60_000)] {
            for method in [
                AggrMethod::Count,
                AggrMethod::Sum,
                AggrMethod::Min,
                AggrMethod::Max,
            ] {
                let got = store
                    .aggregate_history(&q, method, Some(period))
                    .await
                    .unwrap();
                let mut buckets: std::collections::BTreeMap<i64, Vec<Option<f64>>> =
                    Default::default();
                for r in &want {
                    buckets
                        .entry(r.time.div_euclid(unit) * unit)
                        .or_default()
                        .push(r.number);
                }
                let want: Vec<(i64, Option<f64>)> = buckets
                    .into_iter()
                    .map(|(b, v)| (b, expected(method, &v)))
                    .collect();
                let got: Vec<(i64, Option<f64>)> =
                    got.iter().map(|a| (a.bucket, a.value)).collect();
                assert_eq!(got, want, "{id} {attr} {method:?} per {period:?}");
            }
        }
    }
    assert_eq!(
        store.history_entities("t", None, None).await.unwrap().len(),
        2
    );

    // Nothing in range: nothing deleted. A range covering the rest: the
    // entity goes (rollups too).
    let none = store
        .delete_history(&HistoryDelete {
            from: Some(from),
            to: Some(to),
            attrs: attrs.clone(),
            ..hdelete(Some("R"), None)
        })
        .await
        .unwrap();
    assert_eq!(none, 0);
    store
        .delete_history(&HistoryDelete {
            from: Some(T0 - hour),
            to: Some(T0 + 10 * hour),
            ..hdelete(None, Some("T"))
        })
        .await
        .unwrap();
    assert!(store
        .history_entities("t", None, None)
        .await
        .unwrap()
        .is_empty());
    let q = HistoryQuery {
        entity_ids: vec!["R".into()],
        attrs: vec!["x".into()],
        ..hquery()
    };
    assert!(store
        .aggregate_history(&q, AggrMethod::Count, Some(AggrPeriod::Hour))
        .await
        .unwrap()
        .is_empty());
}

/// A delete reaches only the entities under its service path (as a query
/// does) and its own tenant; an open-ended range deletes from one side.
pub(crate) async fn history_delete_stays_in_its_service_path<B: Backend>()
where
    B::Store: HistoryStore + ContextStore + UnitStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
    B::append_history(&store, query_fixture()).await.unwrap();
    let scoped = |path: &str| HistoryDelete {
        service_path: Some(path.into()),
        ..hdelete(None, Some("Room"))
    };
    // Room:1 (Room) is under /a, Room:2 under /a/b, Room:3 under /ab.
    assert_eq!(store.delete_history(&scoped("/a/b")).await.unwrap(), 2);
    assert_eq!(store.delete_history(&scoped("/x")).await.unwrap(), 0);
    let left = store
        .history_entities("t", Some("Room"), None)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.entity_id)
        .collect::<Vec<_>>();
    assert_eq!(left, ["Room:1", "Room:3"]);
    // Room:1's temperatures are at 1000..=10000 and its name at 1000;
    // `toDate` only: the rows up to 3000.
    let n = store
        .delete_history(&HistoryDelete {
            to: Some(3_000),
            ..scoped("/a")
        })
        .await
        .unwrap();
    assert_eq!(n, 4);
    let q = HistoryQuery {
        entity_ids: vec!["Room:1".into()],
        entity_type: Some("Room".into()),
        ..hquery()
    };
    let left = store.query_history(&q).await.unwrap();
    assert_eq!(
        times(&left),
        (4..=10).map(|i| i * 1_000).collect::<Vec<_>>()
    );
    // Tenant u's Room:1 is untouched.
    let u = store
        .query_history(&HistoryQuery {
            tenant: "u".into(),
            ..hquery()
        })
        .await
        .unwrap();
    assert_eq!(u.len(), 1);
}

/// Entity changes queue their history rows durably with the change; the
/// feed is read in order, moved into the history with its cursor, pruned,
/// and the cursor survives a reopen.
pub(crate) async fn history_feed_is_queued_with_the_change_and_consumed_once<B: Backend>()
where
    B::Store: HistoryStore + ContextStore + UnitStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
    let (e, d) = (part_of(&*store, "E"), part_of(&*store, "D"));
    assert_eq!(
        store
            .history_feed_cursor(HistoryFeed::Changes, d)
            .await
            .unwrap(),
        0
    );
    store
        .put_entity(
            entity("", "/", "E", "T", 1, "{}"),
            vec![feed_row("E", 1), feed_row("E", 2)].into(),
            None,
        )
        .await
        .unwrap();
    store
        .commit_processed(Arc::new(ProcessedBatch {
            consumers: vec!["pipeline".into()],
            next_seq: 2,
            history: vec![feed_row("D", 3)],
            ..ProcessedBatch::default()
        }))
        .await
        .unwrap();
    store
        .put_entity(entity("", "/", "F", "T", 2, "{}"), Default::default(), None)
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
    let consumed = crate::history::consumed_through([(e, feed[0].0), (d, through)].into_iter());
    let rows: Vec<_> = feed.into_iter().flat_map(|(_, r)| r).collect();
    assert_eq!(
        store
            .append_history_from_feed(HistoryFeed::Changes, rows.clone(), &consumed)
            .await
            .unwrap(),
        3
    );
    assert_eq!(
        store
            .append_history_from_feed(HistoryFeed::Changes, rows, &consumed)
            .await
            .unwrap(),
        0,
        "idempotent"
    );
    assert_eq!(
        store
            .history_feed_cursor(HistoryFeed::Changes, d)
            .await
            .unwrap(),
        through
    );
    assert!(store.changes_moved_through(through).await.unwrap());
    assert_eq!(store.prune_history_feed(&consumed).await.unwrap(), 2);
    assert!(store
        .read_history_feed(HistoryFeed::Changes, 0, 100)
        .await
        .unwrap()
        .is_empty());
    B::close(&store).await;
    drop(store);
    let store = backend.open().await;
    assert_eq!(
        store
            .history_feed_cursor(HistoryFeed::Changes, d)
            .await
            .unwrap(),
        through
    );
}

/// The changes-feed partition of the default tenant's entity `id` of type
/// `T` (what [`feed_row`] queues) in `store`.
fn part_of(store: &impl HistoryStore, id: &str) -> u16 {
    crate::history_partition("", id, "T", store.change_feed_partitions())
}

/// Every partition of the changes feed of `store`.
fn all_parts(store: &impl HistoryStore) -> Vec<u16> {
    (0..store.change_feed_partitions()).collect()
}

/// Notified rows wait in the history file's own feed: durable once queued
/// (also across a reopen), moved with their entries deleted in one commit.
pub(crate) async fn notified_rows_are_queued_then_moved_once<B: Backend>()
where
    B::Store: HistoryStore + ContextStore + UnitStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
    let first = store
        .queue_history(&crate::HistoryStates::from(vec![feed_row("N", 1)]))
        .await
        .unwrap();
    let second = store
        .queue_history(&crate::HistoryStates::from(vec![
            feed_row("N", 2),
            feed_row("N", 3),
        ]))
        .await
        .unwrap();
    assert!(second > first);
    B::close(&store).await;
    drop(store);
    let store = backend.open().await;
    let feed = store
        .read_history_feed(HistoryFeed::Notifications, 0, 100)
        .await
        .unwrap();
    assert_eq!(feed.len(), 2);
    let rows: Vec<_> = feed.into_iter().flat_map(|(_, r)| r).collect();
    assert_eq!(
        store
            .append_history_from_feed(HistoryFeed::Notifications, rows, &[(0, second)])
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
            .history_feed_cursor(HistoryFeed::Notifications, 0)
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

/// The time indexes of the default tenant's rows of entity `id`.
async fn entity_times(store: &impl HistoryStore, id: &str) -> Vec<i64> {
    let q = HistoryQuery {
        entity_ids: vec![id.to_string()],
        limit: 10_000,
        ..HistoryQuery::default()
    };
    times(&store.query_history(&q).await.unwrap())
}

/// A feed move stores the rows its filter keeps (more than one commit's
/// worth, and a replay of stored rows, included), consumes what it read
/// (filtered rows too) and answers how far it got; a move limited by its
/// row count says more is waiting, and the next goes on from there. On
/// the changes feed the cursor moves, and survives a reopen; moved
/// notifications leave their feed.
pub(crate) async fn feed_moves_store_what_is_kept_and_consume_the_rest<B: Backend>()
where
    B::Store: HistoryStore + ContextStore + UnitStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
    let keep_all: &FeedFilter<'_> = &|_| true;
    let all = all_parts(&*store);
    assert_eq!(
        store
            .move_history_feed(HistoryFeed::Changes, &all, 100, keep_all)
            .await
            .unwrap(),
        FeedMove::default(),
        "nothing waiting"
    );
    // Three changes: 6,000 rows of E (more than a commit of a move takes),
    // 3 of F, 2 of G.
    let big: Vec<HistoryRow> = (0..6_000).map(|t| feed_row("E", t)).collect();
    store
        .put_entity(entity("", "/", "E", "T", 1, "{}"), big.into(), None)
        .await
        .unwrap();
    store
        .put_entity(
            entity("", "/", "F", "T", 2, "{}"),
            (0..3).map(|t| feed_row("F", t)).collect::<Vec<_>>().into(),
            None,
        )
        .await
        .unwrap();
    store
        .put_entity(
            entity("", "/", "G", "T", 3, "{}"),
            (0..2).map(|t| feed_row("G", t)).collect::<Vec<_>>().into(),
            None,
        )
        .await
        .unwrap();
    let entries = store
        .read_history_feed(HistoryFeed::Changes, 0, 100_000)
        .await
        .unwrap();
    let seqs: Vec<u64> = entries.iter().map(|(seq, _)| *seq).collect();
    assert_eq!(seqs.len(), 3);
    // Limited to 6,001 rows: the first two entries (whole), F's rows with
    // time 1 refused by the filter.
    let not_f1: &FeedFilter<'_> = &|r| !(r.entity_id == "F" && r.time == 1);
    let first = store
        .move_history_feed(HistoryFeed::Changes, &all, 6_001, not_f1)
        .await
        .unwrap();
    assert_eq!(
        (first.through, first.rows, first.more),
        (Some(seqs[1]), 6_002, true)
    );
    assert_eq!(
        store
            .history_feed_cursor(HistoryFeed::Changes, part_of(&*store, "F"))
            .await
            .unwrap(),
        seqs[1]
    );
    assert!(!store.changes_moved_through(seqs[2]).await.unwrap());
    let second = store
        .move_history_feed(HistoryFeed::Changes, &all, 6_001, keep_all)
        .await
        .unwrap();
    assert_eq!(
        (second.through, second.rows, second.more),
        (Some(seqs[2]), 2, false)
    );
    assert_eq!(
        entity_times(&*store, "E").await,
        (0..6_000).collect::<Vec<_>>()
    );
    assert_eq!(
        entity_times(&*store, "F").await,
        [0, 2],
        "the refused row is consumed, not stored"
    );
    assert_eq!(entity_times(&*store, "G").await, [0, 1]);
    B::close(&store).await;
    drop(store);

    let store = backend.open().await;
    assert_eq!(
        store
            .history_feed_cursor(HistoryFeed::Changes, part_of(&*store, "G"))
            .await
            .unwrap(),
        seqs[2]
    );
    assert!(store.changes_moved_through(seqs[2]).await.unwrap());
    assert_eq!(
        store
            .move_history_feed(HistoryFeed::Changes, &all, 100, keep_all)
            .await
            .unwrap()
            .through,
        None,
        "consumed once"
    );
    // Notifications: a replay of stored rows is stored once and counted,
    // and the moved entries leave the feed.
    let queued = store
        .queue_history(&crate::HistoryStates::from(vec![
            feed_row("G", 1),
            feed_row("G", 2),
        ]))
        .await
        .unwrap();
    let moved = store
        .move_history_feed(HistoryFeed::Notifications, &[], 100, keep_all)
        .await
        .unwrap();
    assert_eq!(
        (moved.through, moved.rows, moved.more),
        (Some(queued), 2, false)
    );
    assert!(store
        .read_history_feed(HistoryFeed::Notifications, 0, 100)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(entity_times(&*store, "G").await, [0, 1, 2]);
}

/// The changes feed's partitions are moved apart (as nodes each holding
/// some of them move them): one batch's states of many entities are
/// queued by entity partition, a move of some partitions stores the rows
/// of their entities only and leaves the others waiting (a query still
/// waits for them), and moving the rest stores those, each row once.
pub(crate) async fn change_feed_partitions_are_moved_apart_each_once<B: Backend>()
where
    B::Store: HistoryStore + ContextStore + UnitStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
    let keep_all: &FeedFilter<'_> = &|_| true;
    let ids: Vec<String> = (0..40).map(|i| format!("e{i}")).collect();
    store
        .commit_processed(Arc::new(ProcessedBatch {
            consumers: vec!["pipeline".into()],
            next_seq: 2,
            history: ids.iter().map(|id| feed_row(id, 7)).collect(),
            ..ProcessedBatch::default()
        }))
        .await
        .unwrap();
    let newest = store.newest_queued_change().await.unwrap().unwrap();
    let all = all_parts(&*store);
    let (first, rest) = all.split_at(all.len() / 2);
    let moved = store
        .move_history_feed(HistoryFeed::Changes, first, 100, keep_all)
        .await
        .unwrap();
    let in_first = |id: &String| first.contains(&part_of(&*store, id));
    let expected = ids.iter().filter(|id| in_first(id)).count() as u64;
    assert_eq!(moved.rows, expected);
    assert!(moved.consumed.iter().all(|(p, _)| first.contains(p)));
    for id in &ids {
        let stored = entity_times(&*store, id).await;
        if in_first(id) {
            assert_eq!(stored, [7], "{id} is in a moved partition");
        } else {
            assert!(stored.is_empty(), "{id} waits in an unmoved partition");
        }
    }
    assert_eq!(
        store.changes_moved_through(newest).await.unwrap(),
        rest.is_empty(),
        "entries of partitions nobody moved yet still wait"
    );
    let again = store
        .move_history_feed(HistoryFeed::Changes, first, 100, keep_all)
        .await
        .unwrap();
    assert_eq!(again.through, None, "a partition is consumed once");
    let moved = store
        .move_history_feed(HistoryFeed::Changes, rest, 100, keep_all)
        .await
        .unwrap();
    assert_eq!(moved.rows, ids.len() as u64 - expected);
    assert!(store.changes_moved_through(newest).await.unwrap());
    for id in &ids {
        assert_eq!(entity_times(&*store, id).await, [7], "{id}");
    }
    let moved = store
        .move_history_feed(HistoryFeed::Changes, &all, 100, keep_all)
        .await
        .unwrap();
    assert_eq!(moved.through, None);
}

/// Rollups count each stored row once: overlapping (replayed) appends add
/// nothing to them, hourly and per-minute aggregates equal those of the
/// rows, and deleting the entity takes its rollups with it.
pub(crate) async fn rollups_count_each_row_once<B: Backend>()
where
    B::Store: HistoryStore + ContextStore + UnitStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
    const T0: i64 = 1_704_067_200_000; // 2024-01-01T00:00:00Z
    let rows: Vec<HistoryRow> = (0..1300i64)
        .map(|i| hrow("t", "/", "R", "T", "x", T0 + i * 7_000, (i % 13) as f64))
        .collect();
    B::append_history(&store, rows[..700].to_vec())
        .await
        .unwrap();
    B::append_history(&store, rows[500..].to_vec())
        .await
        .unwrap();
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
    store
        .delete_history(&hdelete(Some("R"), None))
        .await
        .unwrap();
    B::append_history(&store, vec![hrow("t", "/", "R", "T", "x", T0, 5.0)])
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

/// One tenant's expiry cutoffs.
pub(crate) fn cutoffs(tenant: &str, rows: Option<i64>, rollups: Option<i64>) -> HistoryCutoffs {
    HistoryCutoffs {
        tenant: tenant.into(),
        rows_before: rows,
        rollups_before: rollups,
    }
}

/// Expiry deletes rows before their cutoff and only rollup buckets that
/// end by theirs (a bucket with newer rows stays whole), in chunks; an
/// entity left with nothing leaves the listing, one with rollups stays.
pub(crate) async fn expiry_deletes_rows_then_whole_buckets<B: Backend>()
where
    B::Store: HistoryStore + ContextStore + UnitStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
    const T0: i64 = 1_704_067_200_000; // 2024-01-01T00:00:00Z
    let hour = 3_600_000;
    let rows: Vec<HistoryRow> = (0..120_000i64)
        .map(|i| hrow("t", "/", "R", "T", "x", T0 + i * 90, 1.0))
        .collect(); // three hours
    for chunk in rows.chunks(20_000) {
        B::append_history(&store, chunk.to_vec()).await.unwrap();
    }
    B::append_history(&store, vec![hrow("u", "/", "R", "T", "x", T0, 1.0)])
        .await
        .unwrap();
    assert_eq!(store.history_tenants().await.unwrap(), ["t", "u"]);
    // Rows before 01:30 go (more than one chunk); rollups ending by 01:30
    // go: hour 00 and the minutes before 01:30, not hour 01.
    let deleted = store
        .expire_history(&[cutoffs(
            "t",
            Some(T0 + hour + hour / 2),
            Some(T0 + hour + hour / 2),
        )])
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
        .expire_history(&[cutoffs("t", Some(T0 + 10 * hour), None)])
        .await
        .unwrap();
    assert!(store.query_history(&q).await.unwrap().is_empty());
    assert_eq!(
        store.history_entities("t", None, None).await.unwrap().len(),
        1
    );
    // Everything past: the entity goes.
    store
        .expire_history(&[cutoffs("t", Some(T0 + 10 * hour), Some(T0 + 10 * hour))])
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

// --- channels ------------------------------------------------------------

/// A new message queues its webhook calls in the same transaction (a
/// duplicate queues none); pending calls are read per node in order,
/// after a position, and a finished one is gone, also after a reopen.
pub(crate) async fn webhook_calls_are_queued_with_new_messages_only<B: Backend>()
where
    B::Store: ChannelStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
    let calls = |node: &str, calls: &[&str]| crate::WebhookCalls {
        node: node.into(),
        calls: calls.iter().map(|c| c.to_string()).collect(),
    };
    store
        .publish_message("c", "m1", "1".into(), calls("a", &["a1", "a2"]))
        .await
        .unwrap();
    // A duplicate: no calls.
    store
        .publish_message("c", "m1", "1".into(), calls("a", &["dup"]))
        .await
        .unwrap();
    store
        .publish_message("c", "m2", "2".into(), calls("b", &["b1"]))
        .await
        .unwrap();
    store
        .publish_message("c", "m3", "3".into(), calls("a", &["a3"]))
        .await
        .unwrap();
    let texts = |rows: &[(u64, String)]| rows.iter().map(|(_, c)| c.clone()).collect::<Vec<_>>();
    let a = store.pending_webhook_calls("a", 0, 100).await.unwrap();
    assert_eq!(texts(&a), ["a1", "a2", "a3"]);
    assert!(a.windows(2).all(|w| w[0].0 < w[1].0), "in order: {a:?}");
    assert_eq!(
        texts(&store.pending_webhook_calls("b", 0, 100).await.unwrap()),
        ["b1"]
    );
    assert_eq!(
        texts(&store.pending_webhook_calls("a", a[0].0, 1).await.unwrap()),
        ["a2"]
    );
    store.finish_webhook_call(a[1].0).await.unwrap();
    drop(store);
    let store = backend.open().await;
    assert_eq!(
        texts(&store.pending_webhook_calls("a", 0, 100).await.unwrap()),
        ["a1", "a3"]
    );
}

/// A message id is stored once per channel (the first content stays) and
/// draws no `seq` when it is a duplicate; `seq`s grow across channels in
/// publish order; messages page by `seq`.
pub(crate) async fn channel_publish_dedupes_and_pages<B: Backend>()
where
    B::Store: ChannelStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
    let s1 = store
        .publish_message("c", "m1", "1".into(), Default::default())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        store
            .publish_message("c", "m1", "other".into(), Default::default())
            .await
            .unwrap(),
        None
    );
    let s2 = store
        .publish_message("c", "m2", "2".into(), Default::default())
        .await
        .unwrap()
        .unwrap();
    let s3 = store
        .publish_message("d", "m1", "3".into(), Default::default())
        .await
        .unwrap()
        .unwrap();
    assert!(s1 < s2 && s2 < s3, "{s1} {s2} {s3}");
    assert_eq!(s2, s1 + 1, "a duplicate draws no seq");
    let messages = store.channel_messages("c", 0, 10).await.unwrap();
    assert_eq!(
        messages,
        vec![
            ChannelMessage {
                seq: s1,
                message_id: "m1".into(),
                content: "1".into()
            },
            ChannelMessage {
                seq: s2,
                message_id: "m2".into(),
                content: "2".into()
            },
        ]
    );
    assert_eq!(store.channel_messages("c", 0, 1).await.unwrap().len(), 1);
    assert_eq!(
        store.channel_messages("c", s1, 10).await.unwrap()[0].seq,
        s2
    );
    assert!(store
        .channel_messages("c", s2, 10)
        .await
        .unwrap()
        .is_empty());
    assert!(store
        .channel_messages("c", u64::MAX, 10)
        .await
        .unwrap()
        .is_empty());
    assert!(store.channel_messages("e", 0, 10).await.unwrap().is_empty());
    B::close(&store).await;
}

/// A backlog counts the channel's messages after a cursor, never another
/// channel's, with the oldest one's publication time; none after the
/// newest, and none once pruned.
pub(crate) async fn channel_backlog_counts_after_a_cursor_within_its_channel<B: Backend>()
where
    B::Store: ChannelStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
    let before = weft_model::now_ms();
    let mut seqs = Vec::new();
    for i in 0..3 {
        let seq = store
            .publish_message("c", &format!("m{i}"), "{}".into(), Default::default())
            .await
            .unwrap()
            .unwrap();
        seqs.push(seq);
        store
            .publish_message("other", &format!("m{i}"), "{}".into(), Default::default())
            .await
            .unwrap();
    }
    let all = store.channel_backlog("c", 0).await.unwrap();
    assert_eq!(all.messages, 3);
    let oldest = all.oldest_published_at.expect("a time");
    assert!(
        oldest >= before && oldest <= weft_model::now_ms(),
        "{oldest}"
    );
    assert_eq!(
        store.channel_backlog("c", seqs[0]).await.unwrap().messages,
        2
    );
    assert_eq!(
        store.channel_backlog("c", seqs[2]).await.unwrap(),
        ChannelBacklog::default()
    );
    assert_eq!(
        store.channel_backlog("none", 0).await.unwrap(),
        ChannelBacklog::default()
    );
    store.prune_channel("c", seqs[1]).await.unwrap();
    assert_eq!(store.channel_backlog("c", 0).await.unwrap().messages, 1);
    B::close(&store).await;
}

/// Subscribers are created once (their first cursor stays), acknowledge
/// forward only, and are deleted; pruning drops a channel's messages up to
/// a `seq`; heads give each channel's highest `seq` and the highest ever
/// handed out, also after the messages are pruned and across a reopen.
pub(crate) async fn channel_subscribers_ack_prune_and_heads<B: Backend>()
where
    B::Store: ChannelStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
    assert_eq!(store.channel_heads().await.unwrap(), (Vec::new(), 0));
    assert_eq!(store.put_channel_subscriber("c", "s", 5).await.unwrap(), 5);
    assert_eq!(store.put_channel_subscriber("c", "s", 9).await.unwrap(), 5);
    assert_eq!(store.put_channel_subscriber("c", "t", 0).await.unwrap(), 0);
    store.ack_channel_messages("c", "s", 7).await.unwrap();
    store.ack_channel_messages("c", "s", 3).await.unwrap();
    store.ack_channel_messages("c", "nobody", 3).await.unwrap();
    let mut subs = store.channel_subscribers().await.unwrap();
    subs.sort_by(|a, b| a.subscriber.cmp(&b.subscriber));
    assert_eq!(
        subs,
        vec![
            ChannelSubscriber {
                channel: "c".into(),
                subscriber: "s".into(),
                cursor: 7
            },
            ChannelSubscriber {
                channel: "c".into(),
                subscriber: "t".into(),
                cursor: 0
            },
        ]
    );
    assert!(store.delete_channel_subscriber("c", "t").await.unwrap());
    assert!(!store.delete_channel_subscriber("c", "t").await.unwrap());
    assert_eq!(store.channel_subscribers().await.unwrap().len(), 1);

    let mut seqs = Vec::new();
    for i in 0..3 {
        let seq = store
            .publish_message("c", &format!("m{i}"), "{}".into(), Default::default())
            .await
            .unwrap()
            .unwrap();
        seqs.push(seq);
    }
    let d = store
        .publish_message("d", "m", "{}".into(), Default::default())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(store.prune_channel("c", seqs[1]).await.unwrap(), 2);
    assert_eq!(store.prune_channel("c", seqs[1]).await.unwrap(), 0);
    let left: Vec<u64> = store
        .channel_messages("c", 0, 10)
        .await
        .unwrap()
        .iter()
        .map(|m| m.seq)
        .collect();
    assert_eq!(left, vec![seqs[2]]);
    let (mut heads, top) = store.channel_heads().await.unwrap();
    heads.sort();
    assert_eq!(
        heads,
        vec![("c".to_string(), seqs[2]), ("d".to_string(), d)]
    );
    assert_eq!(top, d);
    // One channel's head, subscriber and floor, as nodes sharing the
    // channels read them.
    assert_eq!(store.channel_head("c").await.unwrap(), seqs[2]);
    assert_eq!(store.channel_head("none").await.unwrap(), 0);
    assert_eq!(store.channel_subscriber("c", "s").await.unwrap(), Some(7));
    assert_eq!(store.channel_subscriber("c", "t").await.unwrap(), None);
    assert_eq!(store.channel_floor("c").await.unwrap(), Some(7));
    assert_eq!(store.channel_floor("d").await.unwrap(), None);
    // Everything pruned: no heads, the top stays.
    store.prune_channel("c", u64::MAX).await.unwrap();
    store.prune_channel("d", u64::MAX).await.unwrap();
    B::close(&store).await;
    drop(store);
    let store = backend.open().await;
    assert_eq!(store.channel_heads().await.unwrap(), (Vec::new(), d));
    assert_eq!(store.channel_subscribers().await.unwrap().len(), 1);
    let next = store
        .publish_message("c", "again", "{}".into(), Default::default())
        .await
        .unwrap()
        .unwrap();
    assert!(next > d, "seqs are never reused");
    B::close(&store).await;
}

// --- rules and alarms -----------------------------------------------------

/// An alarm of type `threshold`, severity `major`, not acknowledged, its
/// JSON naming its id and version (what the assertions read back).
fn alarm(id: &str, device: &str, state: &str, raised_at: i64, version: u64) -> AlarmRecord {
    AlarmRecord {
        id: id.into(),
        device: device.into(),
        alarm_type: "threshold".into(),
        state: state.into(),
        acked: false,
        severity: "major".into(),
        raised_at,
        version,
        json: format!("{{\"id\":\"{id}\",\"v\":{version}}}"),
    }
}

/// A rule state to store (`Some`) or delete (`None`).
fn rule_state(rule: &str, device: &str, json: Option<&str>) -> RuleStateRecord {
    RuleStateRecord {
        rule: rule.into(),
        device: device.into(),
        json: json.map(str::to_string),
    }
}

/// Rules are created, replaced (answering whether they were new), listed
/// by id, and deleted with their per-device state.
pub(crate) async fn rules_are_put_listed_and_deleted_with_their_state<B: Backend>()
where
    B::Store: RuleStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
    assert!(store.put_rule("r2", "{\"a\":1}".into()).await.unwrap());
    assert!(!store.put_rule("r2", "{\"a\":2}".into()).await.unwrap());
    assert!(store.put_rule("R1", "{}".into()).await.unwrap());
    assert!(store.put_rule("r1", "{}".into()).await.unwrap());
    assert_eq!(
        store.load_rules().await.unwrap(),
        vec![
            ("R1".to_string(), "{}".to_string()),
            ("r1".to_string(), "{}".to_string()),
            ("r2".to_string(), "{\"a\":2}".to_string()),
        ],
        "byte order, as SQLite's"
    );
    store
        .commit_alarms(AlarmBatch {
            states: vec![
                rule_state("r2", "d1", Some("1")),
                rule_state("r2", "d2", Some("2")),
                rule_state("r1", "d1", Some("3")),
            ],
            ..AlarmBatch::default()
        })
        .await
        .unwrap();
    assert_eq!(store.load_rule_states().await.unwrap().len(), 3);
    assert!(store.delete_rule("r2").await.unwrap());
    assert!(!store.delete_rule("r2").await.unwrap());
    assert_eq!(
        store.load_rule_states().await.unwrap(),
        vec![rule_state("r1", "d1", Some("3"))]
    );
    B::close(&store).await;
}

/// A batch commits alarms (each only over a lower version), events (in
/// order, answering the last `seq`), rule states (stored or deleted, the
/// last one per key winning) and the cursor, together.
pub(crate) async fn alarm_batches_commit_versions_events_states_and_cursor<B: Backend>()
where
    B::Store: RuleStore + UnitStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
    assert_eq!(store.alarm_events_head().await.unwrap(), 0);
    assert_eq!(
        store.commit_alarms(AlarmBatch::default()).await.unwrap(),
        0,
        "no events: 0"
    );
    let last = store
        .commit_alarms(AlarmBatch {
            alarms: vec![alarm("a1", "d1", "active", 10, 1)],
            events: vec!["e1".into(), "e2".into()],
            states: vec![
                rule_state("r", "d1", Some("x")),
                rule_state("r", "d2", Some("y")),
            ],
            cursors: vec![("rules".into(), 42)],
        })
        .await
        .unwrap();
    assert_eq!(store.alarm_events_head().await.unwrap(), last);
    let events = store.alarm_events(0, 10).await.unwrap();
    assert_eq!(
        events,
        vec![(last - 1, "e1".to_string()), (last, "e2".to_string())]
    );
    assert_eq!(store.alarm_events(last - 1, 10).await.unwrap().len(), 1);
    assert_eq!(store.alarm_events(0, 1).await.unwrap()[0].1, "e1");
    assert_eq!(
        store.get_alarm("a1").await.unwrap().as_deref(),
        Some("{\"id\":\"a1\",\"v\":1}")
    );
    assert_eq!(store.get_alarm("nope").await.unwrap(), None);

    // An older version changes nothing; within a batch the newest wins
    // (over the columns an update sets: not the raising time), and the last
    // state per key (here a delete) is what stays.
    let mut older = alarm("a1", "d1", "cleared", 10, 0);
    older.acked = true;
    let next = store
        .commit_alarms(AlarmBatch {
            alarms: vec![
                older,
                alarm("a2", "d2", "active", 20, 2),
                alarm("a2", "d2", "cleared", 25, 3),
                alarm("a2", "d2", "active", 20, 1),
            ],
            events: vec!["e3".into()],
            states: vec![
                rule_state("r", "d1", Some("x2")),
                rule_state("r", "d1", None),
                rule_state("r", "d2", Some("y2")),
            ],
            cursors: vec![("rules".into(), 43)],
        })
        .await
        .unwrap();
    assert_eq!(next, last + 1);
    assert_eq!(
        store.get_alarm("a1").await.unwrap().as_deref(),
        Some("{\"id\":\"a1\",\"v\":1}")
    );
    assert_eq!(
        store.get_alarm("a2").await.unwrap().as_deref(),
        Some("{\"id\":\"a2\",\"v\":3}")
    );
    assert_eq!(
        store.load_rule_states().await.unwrap(),
        vec![rule_state("r", "d2", Some("y2"))]
    );
    assert_eq!(store.active_alarms().await.unwrap().len(), 1);
    assert_eq!(store.cursor("rules").await.unwrap(), 43);
    let raised = backend
        .query_i64("SELECT raised_at FROM alarms WHERE id = 'a2'")
        .await;
    assert_eq!(raised, 20, "the first record's raising time stays");
    // A newer version replaces what the API filters on too.
    store
        .commit_alarms(AlarmBatch {
            alarms: vec![{
                let mut a = alarm("a1", "d1", "cleared", 10, 5);
                a.acked = true;
                a
            }],
            ..AlarmBatch::default()
        })
        .await
        .unwrap();
    assert!(store.active_alarms().await.unwrap().is_empty());
    assert_eq!(store.alarm_events_head().await.unwrap(), next);
    B::close(&store).await;
}

/// The alarm listing filters on every column, newest first (ties by id),
/// with limit and offset.
pub(crate) async fn alarms_are_queried_newest_first_with_filters<B: Backend>()
where
    B::Store: RuleStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
    let mut acked = alarm("a3", "d2", "cleared", 30, 1);
    acked.acked = true;
    acked.severity = "minor".into();
    let mut other_type = alarm("a4", "d1", "active", 20, 1);
    other_type.alarm_type = "offline".into();
    store
        .commit_alarms(AlarmBatch {
            alarms: vec![
                alarm("a1", "d1", "active", 10, 1),
                alarm("a2", "d1", "active", 20, 1),
                acked,
                other_type,
            ],
            ..AlarmBatch::default()
        })
        .await
        .unwrap();
    let ids = |q: AlarmQuery| {
        let store = &store;
        async move {
            store
                .query_alarms(&q)
                .await
                .unwrap()
                .iter()
                .map(|j| serde_json::from_str::<serde_json::Value>(j).unwrap()["id"].clone())
                .map(|v| v.as_str().unwrap().to_string())
                .collect::<Vec<_>>()
        }
    };
    let all = AlarmQuery {
        limit: 100,
        ..AlarmQuery::default()
    };
    assert_eq!(ids(all.clone()).await, ["a3", "a2", "a4", "a1"]);
    assert_eq!(
        ids(AlarmQuery {
            state: Some("active".into()),
            ..all.clone()
        })
        .await,
        ["a2", "a4", "a1"]
    );
    assert_eq!(
        ids(AlarmQuery {
            acked: Some(true),
            ..all.clone()
        })
        .await,
        ["a3"]
    );
    assert_eq!(
        ids(AlarmQuery {
            acked: Some(false),
            device: Some("d1".into()),
            alarm_type: Some("threshold".into()),
            ..all.clone()
        })
        .await,
        ["a2", "a1"]
    );
    assert_eq!(
        ids(AlarmQuery {
            severity: Some("minor".into()),
            ..all.clone()
        })
        .await,
        ["a3"]
    );
    assert_eq!(
        ids(AlarmQuery {
            limit: 2,
            offset: 1,
            ..all.clone()
        })
        .await,
        ["a2", "a4"]
    );
    assert!(ids(AlarmQuery::default()).await.is_empty(), "limit 0");
    B::close(&store).await;
}

/// A change of the change log, for the outbox tests.
fn logged(node: &str, seq: u64, tenant: &str, at: i64, body: &str) -> crate::LoggedChange {
    crate::LoggedChange {
        node: node.into(),
        seq,
        tenant: tenant.into(),
        at,
        body: body.as_bytes().to_vec(),
    }
}

/// The `(node, seq)` of changes read back, to compare in order.
fn seqs(changes: &[crate::LoggedChange]) -> Vec<(&str, u64)> {
    changes.iter().map(|c| (c.node.as_str(), c.seq)).collect()
}

/// Every write that makes an entity change logs it (when given) with the
/// change: `put_entity`, `delete_entity`, `commit_processed`. The log is
/// per node, read in `seq` order whatever order the changes were logged
/// in, of one tenant when asked, within `after < seq <= through` and at
/// most `limit`; a change logged again under its `(node, seq)` replaces
/// it (the later of two in one batch); and it survives a reopen.
pub(crate) async fn change_log_is_written_with_the_change_and_read_in_order<B: Backend>()
where
    B::Store: OutboxStore + ContextStore + UnitStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
    assert!(store
        .read_change_log("a", None, 0, u64::MAX, 100)
        .await
        .unwrap()
        .is_empty());
    store
        .put_entity(
            entity("t1", "/", "E", "T", 1, "{}"),
            Default::default(),
            Some(logged("a", 1, "t1", 1_000, r#"{"put":"E"}"#)),
        )
        .await
        .unwrap();
    store
        .put_entity(
            entity("t1", "/", "F", "T", 2, "{}"),
            Default::default(),
            None,
        )
        .await
        .unwrap();
    store
        .put_entity(
            entity("t2", "/", "G", "T", 3, "{}"),
            Default::default(),
            None,
        )
        .await
        .unwrap();
    assert_eq!(
        seqs(
            &store
                .read_change_log("a", None, 0, u64::MAX, 100)
                .await
                .unwrap()
        ),
        [("a", 1)],
        "a put without a change logs nothing"
    );
    assert!(store
        .delete_entity(
            "t2",
            "/",
            "G",
            "T",
            Some(logged("a", 5, "t2", 5_000, r#"{"deleted":"G"}"#)),
        )
        .await
        .unwrap());
    assert!(store
        .delete_entity("t1", "/", "F", "T", None)
        .await
        .unwrap());
    store
        .commit_processed(Arc::new(ProcessedBatch {
            consumers: vec!["pipeline".into()],
            next_seq: 2,
            entities: vec![entity("t1", "/", "H", "T", 4, "{}")],
            entity_cursors: vec![crate::ENTITIES_CURSOR.into()],
            changes: vec![
                logged("a", 3, "t1", 3_000, r#"{"put":"H"}"#),
                logged("b", 1, "t1", 3_000, r#"{"on":"b"}"#),
                logged("a", 2, "t1", 2_000, r#"{"first":true}"#),
                logged("a", 2, "t1", 2_000, r#"{"second":true}"#),
            ],
            ..ProcessedBatch::default()
        }))
        .await
        .unwrap();
    let entities: Vec<String> = store
        .load_entities()
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(
        entities,
        ["E", "H"],
        "the entity writes themselves are done"
    );

    let all = store
        .read_change_log("a", None, 0, u64::MAX, 100)
        .await
        .unwrap();
    assert_eq!(
        all,
        vec![
            logged("a", 1, "t1", 1_000, r#"{"put":"E"}"#),
            logged("a", 2, "t1", 2_000, r#"{"second":true}"#),
            logged("a", 3, "t1", 3_000, r#"{"put":"H"}"#),
            logged("a", 5, "t2", 5_000, r#"{"deleted":"G"}"#),
        ],
        "in seq order, the later of a batch's two for one seq"
    );
    assert_eq!(
        seqs(
            &store
                .read_change_log("a", Some("t1"), 0, u64::MAX, 100)
                .await
                .unwrap()
        ),
        [("a", 1), ("a", 2), ("a", 3)]
    );
    assert_eq!(
        seqs(
            &store
                .read_change_log("a", Some("t2"), 0, u64::MAX, 100)
                .await
                .unwrap()
        ),
        [("a", 5)]
    );
    assert!(store
        .read_change_log("a", Some("t3"), 0, u64::MAX, 100)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        seqs(&store.read_change_log("a", None, 1, 3, 100).await.unwrap()),
        [("a", 2), ("a", 3)],
        "after is exclusive, through inclusive"
    );
    assert_eq!(
        seqs(&store.read_change_log("a", None, 0, 100, 2).await.unwrap()),
        [("a", 1), ("a", 2)],
        "the first `limit`"
    );
    assert_eq!(
        seqs(
            &store
                .read_change_log("a", Some("t1"), 1, 5, 1)
                .await
                .unwrap()
        ),
        [("a", 2)],
        "tenant, bounds and limit together"
    );
    assert!(store
        .read_change_log("a", None, 0, 100, 0)
        .await
        .unwrap()
        .is_empty());
    assert!(store
        .read_change_log("a", None, 5, u64::MAX, 100)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        store
            .read_change_log("b", None, 0, u64::MAX, 100)
            .await
            .unwrap(),
        vec![logged("b", 1, "t1", 3_000, r#"{"on":"b"}"#)],
        "each node reads its own log"
    );
    assert!(store
        .read_change_log("", None, 0, u64::MAX, 100)
        .await
        .unwrap()
        .is_empty());

    // Logged again under its (node, seq): replaced.
    store
        .put_entity(
            entity("t1", "/", "E", "T", 1, "{}"),
            Default::default(),
            Some(logged("a", 1, "t2", 1_500, r#"{"again":"E"}"#)),
        )
        .await
        .unwrap();
    B::close(&store).await;
    drop(store);
    let store = backend.open().await;
    let all = store
        .read_change_log("a", None, 0, u64::MAX, 100)
        .await
        .unwrap();
    assert_eq!(seqs(&all), [("a", 1), ("a", 2), ("a", 3), ("a", 5)]);
    assert_eq!(all[0], logged("a", 1, "t2", 1_500, r#"{"again":"E"}"#));
    assert_eq!(store.change_log_head("a").await.unwrap(), 5);
    assert_eq!(store.change_log_head("b").await.unwrap(), 1);
    B::close(&store).await;
}

/// The head is the node's highest `seq` (0 for an empty log, its own per
/// node), and pruning everything keeps the last change, so the head
/// survives it (and a reopen).
pub(crate) async fn change_log_head_survives_pruning_everything<B: Backend>()
where
    B::Store: OutboxStore + UnitStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
    assert_eq!(store.change_log_head("a").await.unwrap(), 0);
    assert_eq!(
        store
            .prune_change_log("a", u64::MAX, i64::MAX)
            .await
            .unwrap(),
        0
    );
    store
        .commit_processed(Arc::new(ProcessedBatch {
            changes: [2, 4, 7, 9]
                .into_iter()
                .map(|seq| logged("a", seq, "", seq as i64, "{}"))
                .chain([logged("b", 3, "", 3, "{}")])
                .collect(),
            ..ProcessedBatch::default()
        }))
        .await
        .unwrap();
    assert_eq!(store.change_log_head("a").await.unwrap(), 9);
    assert_eq!(store.change_log_head("b").await.unwrap(), 3);
    assert_eq!(store.change_log_head("c").await.unwrap(), 0);
    // What is left after a cursor, per node and tenant.
    assert_eq!(
        store.change_log_backlog("a", "", 4).await.unwrap(),
        crate::Backlog {
            changes: 2,
            oldest: Some(7)
        }
    );
    assert_eq!(
        store.change_log_backlog("a", "other", 0).await.unwrap(),
        crate::Backlog::default()
    );
    assert_eq!(
        store.change_log_backlog("b", "", 0).await.unwrap().changes,
        1
    );
    let mut nodes = store.change_log_nodes().await.unwrap();
    nodes.sort();
    assert_eq!(nodes, ["a", "b"]);
    assert_eq!(
        store
            .prune_change_log("a", u64::MAX, i64::MAX)
            .await
            .unwrap(),
        3,
        "all but the last"
    );
    assert_eq!(
        seqs(
            &store
                .read_change_log("a", None, 0, u64::MAX, 100)
                .await
                .unwrap()
        ),
        [("a", 9)]
    );
    assert_eq!(store.change_log_head("a").await.unwrap(), 9);
    assert_eq!(
        store
            .prune_change_log("a", u64::MAX, i64::MAX)
            .await
            .unwrap(),
        0,
        "the last change stays"
    );
    assert_eq!(
        store
            .prune_change_log("b", u64::MAX, i64::MAX)
            .await
            .unwrap(),
        0,
        "a log of one change keeps it"
    );
    B::close(&store).await;
    drop(store);
    let store = backend.open().await;
    assert_eq!(store.change_log_head("a").await.unwrap(), 9);
    assert_eq!(store.change_log_head("b").await.unwrap(), 3);
    B::close(&store).await;
}

/// Pruning deletes the changes through a `seq`, or committed before a
/// time, or either, of one node only, oldest first, at most a chunk per
/// call, and answers how many.
pub(crate) async fn change_log_prunes_by_seq_and_by_time_in_chunks<B: Backend>()
where
    B::Store: OutboxStore + UnitStore,
{
    let backend = B::fresh().await;
    let store = backend.open().await;
    let log = |node: &'static str, seqs: std::ops::RangeInclusive<u64>| ProcessedBatch {
        changes: seqs
            .map(|seq| logged(node, seq, "", seq as i64 * 1_000, "{}"))
            .collect(),
        ..ProcessedBatch::default()
    };
    store
        .commit_processed(Arc::new(log("a", 1..=10)))
        .await
        .unwrap();
    store
        .commit_processed(Arc::new(log("b", 1..=10)))
        .await
        .unwrap();
    let left = |node: &'static str| {
        let store = store.clone();
        async move {
            store
                .read_change_log(node, None, 0, u64::MAX, 100_000)
                .await
                .unwrap()
                .iter()
                .map(|c| c.seq)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        store.prune_change_log("a", 3, 0).await.unwrap(),
        3,
        "by seq"
    );
    assert_eq!(left("a").await, (4..=10).collect::<Vec<_>>());
    assert_eq!(
        store.prune_change_log("a", 0, 6_000).await.unwrap(),
        2,
        "by time: before is exclusive"
    );
    assert_eq!(left("a").await, (6..=10).collect::<Vec<_>>());
    assert_eq!(
        store.prune_change_log("a", 7, 9_000).await.unwrap(),
        3,
        "either"
    );
    assert_eq!(left("a").await, [9, 10]);
    assert_eq!(store.prune_change_log("a", 8, 0).await.unwrap(), 0);
    assert_eq!(left("b").await, (1..=10).collect::<Vec<_>>(), "b untouched");

    // More than a chunk: the oldest chunk goes first, then the rest but
    // the last.
    let n = crate::CHANGE_LOG_PRUNE_CHUNK as u64 + 3;
    store
        .commit_processed(Arc::new(log("c", 1..=n)))
        .await
        .unwrap();
    assert_eq!(
        store.prune_change_log("c", u64::MAX, 0).await.unwrap(),
        crate::CHANGE_LOG_PRUNE_CHUNK as u64
    );
    assert_eq!(
        left("c").await,
        (crate::CHANGE_LOG_PRUNE_CHUNK as u64 + 1..=n).collect::<Vec<_>>()
    );
    assert_eq!(store.prune_change_log("c", u64::MAX, 0).await.unwrap(), 2);
    assert_eq!(left("c").await, [n]);
    assert_eq!(left("b").await.len(), 10);
    B::close(&store).await;
}

/// Cursors are created and moved per node and subscription (the later of
/// two for one subscription in one save), loaded per node, kept across a
/// reopen, and forgetting a subscription removes its cursors on every
/// node, and only its.
pub(crate) async fn notification_cursors_are_saved_per_node_and_forgotten_everywhere<B: Backend>()
where
    B::Store: OutboxStore,
{
    use crate::NotificationCursor;
    let cursor = |tenant: &str, subscription: &str, through: u64| NotificationCursor {
        tenant: tenant.into(),
        subscription: subscription.into(),
        through,
    };
    let backend = B::fresh().await;
    let store = backend.open().await;
    let load = |node: &'static str| {
        let store = store.clone();
        async move {
            let mut cursors = store.load_notification_cursors(node).await.unwrap();
            cursors.sort_by(|x, y| (&x.tenant, &x.subscription).cmp(&(&y.tenant, &y.subscription)));
            cursors
        }
    };
    assert!(load("a").await.is_empty());
    store
        .save_notification_cursors("a", Vec::new())
        .await
        .unwrap();
    store
        .save_notification_cursors("a", vec![cursor("t1", "s1", 5), cursor("t1", "s2", 7)])
        .await
        .unwrap();
    store
        .save_notification_cursors("b", vec![cursor("t1", "s1", 3), cursor("t2", "s1", 9)])
        .await
        .unwrap();
    assert_eq!(
        load("a").await,
        [cursor("t1", "s1", 5), cursor("t1", "s2", 7)]
    );
    assert_eq!(
        load("b").await,
        [cursor("t1", "s1", 3), cursor("t2", "s1", 9)]
    );
    assert!(load("c").await.is_empty());

    // Moved (one of a node's cursors; the other node's stays).
    store
        .save_notification_cursors("a", vec![cursor("t1", "s1", 8)])
        .await
        .unwrap();
    store
        .save_notification_cursors("b", vec![cursor("t1", "s2", 10), cursor("t1", "s2", 11)])
        .await
        .unwrap();
    assert_eq!(
        load("a").await,
        [cursor("t1", "s1", 8), cursor("t1", "s2", 7)]
    );
    assert_eq!(
        load("b").await,
        [
            cursor("t1", "s1", 3),
            cursor("t1", "s2", 11),
            cursor("t2", "s1", 9)
        ]
    );
    B::close(&store).await;
    drop(store);

    let store = backend.open().await;
    let load = |node: &'static str| {
        let store = store.clone();
        async move {
            let mut cursors = store.load_notification_cursors(node).await.unwrap();
            cursors.sort_by(|x, y| (&x.tenant, &x.subscription).cmp(&(&y.tenant, &y.subscription)));
            cursors
        }
    };
    assert_eq!(
        load("a").await,
        [cursor("t1", "s1", 8), cursor("t1", "s2", 7)],
        "kept across a reopen"
    );
    store.forget_notification_cursors("t1", "s1").await.unwrap();
    assert_eq!(load("a").await, [cursor("t1", "s2", 7)]);
    assert_eq!(
        load("b").await,
        [cursor("t1", "s2", 11), cursor("t2", "s1", 9)],
        "on every node, and only t1's s1"
    );
    store
        .forget_notification_cursors("t1", "missing")
        .await
        .unwrap();
    assert_eq!(load("a").await.len(), 1);
    B::close(&store).await;
}
