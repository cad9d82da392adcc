//! The PostgreSQL backend against a real server: the one
//! `scripts/test-services start` runs (its URL in
//! `WEFT_TEST_POSTGRES_URL`). Each test gets a database of its own.

use super::*;
use crate::{ChannelMessage, ChannelStore, ChannelSubscriber};

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
    schema::ensure_partition(&client, t).await.unwrap();
    schema::ensure_partition(&client, t).await.unwrap();
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
