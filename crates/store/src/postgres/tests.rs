//! The PostgreSQL backend against a real server: the one
//! `scripts/test-services start` runs (its URL in
//! `WEFT_TEST_POSTGRES_URL`). Each test gets a database of its own.

use std::sync::Arc;

use super::*;
use crate::conformance::{hquery, hrow, times, Backend};
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

    async fn append_history(store: &PostgresStore, rows: Vec<HistoryRow>) -> Result<u64> {
        store.append_history(rows).await
    }

    async fn execute(&self, sql: &str) {
        raw(&self.0).await.batch_execute(sql).await.unwrap();
    }
}

crate::conformance_tests!(Postgres);
use crate::{
    AlarmBatch, AlarmQuery, AlarmRecord, ChannelMessage, ChannelStore, ChannelSubscriber,
    HistoryRow, HistoryStore, RuleStateRecord, RuleStore,
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
