//! The PostgreSQL backend against a real server: the one
//! `scripts/test-services start` runs (its URL in
//! `WEFT_TEST_POSTGRES_URL`). Each test gets a database of its own.

use std::sync::Arc;

use super::*;
use crate::conformance::Backend;
use crate::Store;

/// PostgreSQL under the conformance suite: a database per test.
struct Postgres(String);

#[async_trait::async_trait]
impl Backend for Postgres {
    type Store = PostgresStore;

    async fn fresh() -> Self {
        Postgres(test_database().await)
    }

    async fn open(&self) -> Arc<PostgresStore> {
        Arc::new(open(&self.0).await)
    }

    async fn close(store: &PostgresStore) {
        store.close().await;
    }

    async fn execute(&self, sql: &str) {
        raw(&self.0).await.batch_execute(sql).await.unwrap();
    }
}

crate::conformance_tests!(Postgres);
use crate::{
    AggrMethod, AggrPeriod, AlarmBatch, AlarmQuery, AlarmRecord, ChannelMessage, ChannelStore,
    ChannelSubscriber, HistoryAggregate, HistoryEntity, HistoryFeed, HistoryQuery, HistoryRow,
    HistoryStore, RuleStateRecord, RuleStore,
};

impl PostgresStore {
    /// Stores history rows straight into the history (no feed involved),
    /// the way the history writer's moves insert them, as one write of the
    /// history writer. Answers how many rows were new.
    async fn append_history(&self, rows: Vec<HistoryRow>) -> Result<u64> {
        if rows.is_empty() {
            return Ok(0);
        }
        self.history
            .write(move |c| Box::pin(async move { history::append_history(c, &rows).await }))
            .await
    }
}

/// A fresh, empty database on the test server; its URL.
pub(crate) async fn test_database() -> String {
    let admin = std::env::var("WEFT_TEST_POSTGRES_URL").expect(
        "WEFT_TEST_POSTGRES_URL names the test PostgreSQL server: \
         run `scripts/test-services start` (the README's test command does)",
    );
    let name = format!("weft_{}", uuid::Uuid::new_v4().simple());
    let connector = Connector::new(&admin).unwrap();
    let client = connector.connect().await.expect("the test server answers");
    client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    let (base, query) = match admin.split_once('?') {
        Some((base, query)) => (base, format!("?{query}")),
        None => (admin.as_str(), String::new()),
    };
    let (server, _) = base.rsplit_once('/').expect("the URL names a database");
    format!("{server}/{name}{query}")
}

async fn open(url: &str) -> PostgresStore {
    PostgresStore::open(PostgresConfig {
        url: url.to_string(),
        ..PostgresConfig::default()
    })
    .await
    .unwrap()
}

async fn raw(url: &str) -> Client {
    Connector::new(url).unwrap().connect().await.unwrap()
}

#[tokio::test]
async fn opening_migrates_once_and_refuses_a_newer_schema() {
    let url = test_database().await;
    let store = open(&url).await;
    store.ping().await.unwrap();
    store.close().await;
    // Again: nothing to apply, same version.
    let store = open(&url).await;
    store.close().await;
    let client = raw(&url).await;
    let versions: Vec<i32> = client
        .query("SELECT version FROM weft_schema", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(versions, [1]);
    client
        .batch_execute("UPDATE weft_schema SET version = 99")
        .await
        .unwrap();
    let err = PostgresStore::open(PostgresConfig {
        url,
        ..PostgresConfig::default()
    })
    .await
    .unwrap_err();
    assert!(
        err.to_string().contains("newer than this weft knows"),
        "{err}"
    );
}

#[tokio::test]
async fn a_write_is_answered_after_its_commit_and_a_failing_one_fails_alone() {
    let url = test_database().await;
    let store = open(&url).await;
    let insert = |id: &'static str| {
        store.main.write(move |c| {
            Box::pin(async move {
                c.execute("INSERT INTO rules (id, json) VALUES ($1, '{}')", &[&id])
                    .await
                    .map_err(db)
            })
        })
    };
    // Three writes queued together: the duplicate fails, the others commit.
    let (a, b, c) = tokio::join!(insert("r1"), insert("r1"), insert("r2"));
    let outcomes = [a.is_ok(), b.is_ok(), c.is_ok()];
    assert_eq!(outcomes.iter().filter(|ok| **ok).count(), 2, "{outcomes:?}");
    assert!(c.is_ok());
    let failed = if a.is_err() { a } else { b };
    assert!(
        failed.unwrap_err().to_string().contains("23505"),
        "unique violation"
    );
    // Answered means committed: another connection sees both rows.
    let client = raw(&url).await;
    let ids: Vec<String> = client
        .query("SELECT id FROM rules ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(ids, ["r1", "r2"]);
    store.close().await;
    let after = store.ping().await.unwrap_err();
    assert!(matches!(after, StoreError::Closed), "{after:?}");
}

#[tokio::test]
async fn an_append_is_committed_before_its_seq_is_answered() {
    let url = test_database().await;
    let store = open(&url).await;
    let mut committed = store.committed.clone();
    assert_eq!(*committed.borrow_and_update(), 0);
    let mut seqs = Vec::new();
    for n in 0..3i64 {
        let seq = store
            .log
            .append(move |c| {
                Box::pin(async move {
                    let row = c
                        .query_one(
                            "INSERT INTO ingest_log (received_at, format, body) \
                             VALUES ($1, 'decoded', '\\x00') RETURNING seq",
                            &[&n],
                        )
                        .await
                        .map_err(db)?;
                    Ok(row.get::<_, i64>(0) as u64)
                })
            })
            .await
            .unwrap();
        assert!(*committed.borrow() >= seq, "published before answered");
        seqs.push(seq);
    }
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    store.close().await;
    // A reopened store starts from the highest seq.
    let store = open(&url).await;
    assert_eq!(*store.committed.borrow(), seqs[2]);
    store.close().await;
}

#[tokio::test]
async fn a_new_history_partition_takes_over_its_rows_from_the_default() {
    let url = test_database().await;
    let store = open(&url).await;
    store.close().await;
    let client = raw(&url).await;
    let t = 1_700_000_000_000i64;
    client
        .execute(
            "INSERT INTO history (tenant, entity_id, entity_type, attr, time, service_path, \
             attr_type, value, number) VALUES ('', 'e', 'T', 'a', $1, '/', 'Number', '1', 1)",
            &[&t],
        )
        .await
        .unwrap();
    let conn = conn::Conn::new(client);
    schema::ensure_partition(&conn, t).await.unwrap();
    schema::ensure_partition(&conn, t).await.unwrap();
    let client = &*conn;
    let (name, _, _) = schema::partition_for(t);
    let in_partition: i64 = client
        .query_one(&format!("SELECT COUNT(*) FROM {name}"), &[])
        .await
        .unwrap()
        .get(0);
    let in_default: i64 = client
        .query_one("SELECT COUNT(*) FROM history_default", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!((in_partition, in_default), (1, 0));
}

// --- channels -------------------------------------------------------------

/// A message id is stored once per channel (the first content stays) and
/// draws no `seq` when it is a duplicate; `seq`s grow across channels in
/// publish order; messages page by `seq`.
#[tokio::test]
async fn channel_publish_dedupes_and_pages() {
    let url = test_database().await;
    let store = open(&url).await;
    let s1 = store
        .publish_message("c", "m1", "1".into())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        store
            .publish_message("c", "m1", "other".into())
            .await
            .unwrap(),
        None
    );
    let s2 = store
        .publish_message("c", "m2", "2".into())
        .await
        .unwrap()
        .unwrap();
    let s3 = store
        .publish_message("d", "m1", "3".into())
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
    store.close().await;
}

/// Subscribers are created once (their first cursor stays), acknowledge
/// forward only, and are deleted; pruning drops a channel's messages up to
/// a `seq`; heads give each channel's highest `seq` and the highest ever
/// handed out, also after the messages are pruned and across a reopen.
#[tokio::test]
async fn channel_subscribers_ack_prune_and_heads() {
    let url = test_database().await;
    let store = open(&url).await;
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
            .publish_message("c", &format!("m{i}"), "{}".into())
            .await
            .unwrap()
            .unwrap();
        seqs.push(seq);
    }
    let d = store
        .publish_message("d", "m", "{}".into())
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
    // Everything pruned: no heads, the top stays.
    store.prune_channel("c", u64::MAX).await.unwrap();
    store.prune_channel("d", u64::MAX).await.unwrap();
    store.close().await;
    let store = open(&url).await;
    assert_eq!(store.channel_heads().await.unwrap(), (Vec::new(), d));
    assert_eq!(store.channel_subscribers().await.unwrap().len(), 1);
    let next = store
        .publish_message("c", "again", "{}".into())
        .await
        .unwrap()
        .unwrap();
    assert!(next > d, "seqs are never reused");
    store.close().await;
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
#[tokio::test]
async fn rules_are_put_listed_and_deleted_with_their_state() {
    let url = test_database().await;
    let store = open(&url).await;
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
    store.close().await;
}

/// A batch commits alarms (each only over a lower version), events (in
/// order, answering the last `seq`), rule states (stored or deleted, the
/// last one per key winning) and the cursor, together.
#[tokio::test]
async fn alarm_batches_commit_versions_events_states_and_cursor() {
    let url = test_database().await;
    let store = open(&url).await;
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
            cursor: Some(("rules".into(), 42)),
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
            cursor: Some(("rules".into(), 43)),
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
    let client = raw(&url).await;
    let cursor: i64 = client
        .query_one("SELECT next_seq FROM cursors WHERE name = 'rules'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(cursor, 43);
    let raised: i64 = client
        .query_one("SELECT raised_at FROM alarms WHERE id = 'a2'", &[])
        .await
        .unwrap()
        .get(0);
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
    store.close().await;
}

/// The alarm listing filters on every column, newest first (ties by id),
/// with limit and offset.
#[tokio::test]
async fn alarms_are_queried_newest_first_with_filters() {
    let url = test_database().await;
    let store = open(&url).await;
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
    store.close().await;
}

// --- history --------------------------------------------------------------
//
// The SQLite backend's history tests, against PostgreSQL.

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
/// acknowledged survives a reopen.
#[tokio::test(flavor = "multi_thread")]
async fn history_append_is_idempotent_and_survives_reopen() {
    let url = test_database().await;
    let store = open(&url).await;
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
    assert_eq!(store.append_history(first.clone()).await.unwrap(), 5);
    assert_eq!(store.append_history(first.clone()).await.unwrap(), 0);
    assert_eq!(store.append_history(Vec::new()).await.unwrap(), 0);
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
    assert_eq!(store.append_history(overlap).await.unwrap(), 1);
    // Concurrent replays of one batch store it once.
    let store = Arc::new(store);
    let batch: Vec<HistoryRow> = (0..100)
        .map(|i| hrow("t", "/", "Room:2", "Room", "pressure", i, 1.0))
        .collect();
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (store, batch) = (Arc::clone(&store), batch.clone());
            tokio::spawn(async move { store.append_history(batch).await.unwrap() })
        })
        .collect();
    let mut new = 0;
    for t in tasks {
        new += t.await.unwrap();
    }
    assert_eq!(new, 100);
    store.close().await;
    drop(store);

    let store = open(&url).await;
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
    let url = test_database().await;
    let store = open(&url).await;
    store.append_history(query_fixture()).await.unwrap();
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
    let url = test_database().await;
    let store = open(&url).await;
    store.append_history(query_fixture()).await.unwrap();
    // A later row under another path does not move the entity.
    store
        .append_history(vec![hrow(
            "t",
            "/z",
            "Room:2",
            "Room",
            "temperature",
            9,
            1.0,
        )])
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

/// The aggregate of `values` the way SQL computes it.
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
    let url = test_database().await;
    let store = open(&url).await;
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
    store.append_history(rows.clone()).await.unwrap();

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
    let url = test_database().await;
    let store = open(&url).await;
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
    store.append_history(rows.to_vec()).await.unwrap();
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
    let url = test_database().await;
    let store = open(&url).await;
    store.append_history(query_fixture()).await.unwrap();
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
        store.append_history(chunk.to_vec()).await.unwrap();
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

/// Queues rows in the changes feed as the main writer does with an entity
/// change (the context domain's writes are not this backend part's).
async fn queue_change(store: &PostgresStore, rows: Vec<HistoryRow>) -> u64 {
    let json = serde_json::to_string(&rows).unwrap();
    store
        .main
        .write(move |c| {
            Box::pin(async move {
                let row = c
                    .query_one(
                        "INSERT INTO history_feed (feed, rows) VALUES ($1, $2) RETURNING seq",
                        &[&history::feed_name(HistoryFeed::Changes), &json],
                    )
                    .await
                    .map_err(db)?;
                Ok(row.get::<_, i64>(0) as u64)
            })
        })
        .await
        .unwrap()
}

/// Entity changes queue their history rows durably with the change; the
/// feed is read in order, moved into the history with its cursor, pruned,
/// and the cursor survives a reopen.
#[tokio::test(flavor = "multi_thread")]
async fn history_feed_is_queued_with_the_change_and_consumed_once() {
    let url = test_database().await;
    let store = open(&url).await;
    assert_eq!(
        store
            .history_feed_cursor(HistoryFeed::Changes)
            .await
            .unwrap(),
        0
    );
    queue_change(&store, vec![feed_row("E", 1), feed_row("E", 2)]).await;
    // The other feed shares the table, not the entries.
    store.queue_history(vec![feed_row("N", 9)]).await.unwrap();
    queue_change(&store, vec![feed_row("D", 3)]).await;
    let first = store
        .read_history_feed(HistoryFeed::Changes, 0, 1)
        .await
        .unwrap();
    assert_eq!(first.len(), 1, "whole entries up to about max_rows");
    assert_eq!(
        store
            .read_history_feed(HistoryFeed::Changes, first[0].0, 100)
            .await
            .unwrap()[0]
            .1,
        vec![feed_row("D", 3)]
    );
    let feed = store
        .read_history_feed(HistoryFeed::Changes, 0, 100)
        .await
        .unwrap();
    assert_eq!(feed.len(), 2);
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
    let store = open(&url).await;
    assert_eq!(
        store
            .history_feed_cursor(HistoryFeed::Changes)
            .await
            .unwrap(),
        through
    );
}

/// Notified rows wait in their own feed: durable once queued
/// (also across a reopen), moved with their entries deleted in one commit.
#[tokio::test(flavor = "multi_thread")]
async fn notified_rows_are_queued_then_moved_once() {
    let url = test_database().await;
    let store = open(&url).await;
    let first = store.queue_history(vec![feed_row("N", 1)]).await.unwrap();
    let second = store
        .queue_history(vec![feed_row("N", 2), feed_row("N", 3)])
        .await
        .unwrap();
    assert!(second > first);
    store.close().await;
    drop(store);
    let store = open(&url).await;
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
    let url = test_database().await;
    let store = open(&url).await;
    const T0: i64 = 1_704_067_200_000; // 2024-01-01T00:00:00Z
    let rows: Vec<HistoryRow> = (0..1300i64)
        .map(|i| hrow("t", "/", "R", "T", "x", T0 + i * 7_000, (i % 13) as f64))
        .collect();
    store.append_history(rows[..700].to_vec()).await.unwrap();
    store.append_history(rows[500..].to_vec()).await.unwrap();
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
    store
        .append_history(vec![hrow("t", "/", "R", "T", "x", T0, 5.0)])
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
    let url = test_database().await;
    let store = open(&url).await;
    const T0: i64 = 1_704_067_200_000; // 2024-01-01T00:00:00Z
    let hour = 3_600_000;
    let rows: Vec<HistoryRow> = (0..120_000i64)
        .map(|i| hrow("t", "/", "R", "T", "x", T0 + i * 90, 1.0))
        .collect(); // three hours
    for chunk in rows.chunks(20_000) {
        store.append_history(chunk.to_vec()).await.unwrap();
    }
    store
        .append_history(vec![hrow("u", "/", "R", "T", "x", T0, 1.0)])
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

/// Appended rows land in the weekly partition of their time index (created
/// on demand, also before 1970), never in the default one.
#[tokio::test]
async fn history_rows_land_in_their_weekly_partitions() {
    let url = test_database().await;
    let store = open(&url).await;
    const WEEK: i64 = schema::HISTORY_PARTITION_MS;
    let at = [
        -1,
        0,
        3 * WEEK + 5,
        1_700_000_000_000,
        1_700_000_000_000 + WEEK,
    ];
    let rows: Vec<HistoryRow> = at
        .iter()
        .map(|&t| hrow("t", "/", "R", "T", "x", t, 1.0))
        .collect();
    assert_eq!(store.append_history(rows.clone()).await.unwrap(), 5);
    assert_eq!(store.append_history(rows).await.unwrap(), 0);
    let client = raw(&url).await;
    for t in at {
        let (name, _, _) = schema::partition_for(t);
        let n: i64 = client
            .query_one(&format!("SELECT COUNT(*) FROM {name}"), &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(n, 1, "{name}");
    }
    let in_default: i64 = client
        .query_one("SELECT COUNT(*) FROM history_default", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(in_default, 0);
    assert_eq!(
        times(&store.query_history(&hquery()).await.unwrap()),
        at.to_vec()
    );
    store.close().await;
}
