//! Durable channels, their webhooks and the bridges in process, called the
//! way the DSPS API and `/api/v1/bridges` call them, with the services
//! wired as [`crate::Services::start`] wires them.

use std::time::Duration;

use serde_json::{json, Value};

use super::bridge::BridgeSpec;
use super::rules::{ChannelRule, RetryRule, WebhookRule};
use super::{ChannelError, Channels, Fetched};
use crate::filter::FilterSpec;
use crate::testkit::{accept, config, decoded_uplink, eventually, plain_type, Node, Receiver};
use crate::ServicesConfig;

/// Everything waiting for `subscriber`, without waiting.
async fn fetch(channels: &Channels, channel: &str, subscriber: &str) -> Fetched {
    channels
        .fetch(channel, subscriber, Duration::ZERO, 64)
        .await
        .expect("the subscriber exists")
}

fn ids(fetched: &Fetched) -> Vec<&str> {
    fetched
        .messages
        .iter()
        .map(|m| m.message_id.as_str())
        .collect()
}

async fn publish(channels: &Channels, channel: &str, id: &str, content: Value) -> bool {
    channels
        .publish(channel, id, content.to_string())
        .await
        .expect("published")
}

/// A subscriber receives the messages published after it was created, in
/// publish order, again on every fetch until acknowledged; a message id
/// published again is dropped (its first content stays); `max` bounds a
/// fetch and `more` says what is left.
#[tokio::test]
async fn a_subscriber_gets_what_is_published_after_it_in_order() {
    let node = Node::start(config()).await;
    let channels = &*node.services.channels;
    assert!(publish(channels, "news", "m0", json!({"n": 0})).await);
    channels.subscribe("news", "reader").await.unwrap();
    for n in 1..=3 {
        assert!(publish(channels, "news", &format!("m{n}"), json!({"n": n})).await);
    }
    assert!(
        !publish(channels, "news", "m2", json!({"n": "again"})).await,
        "a duplicate"
    );

    let got = fetch(channels, "news", "reader").await;
    assert_eq!(
        ids(&got),
        ["m1", "m2", "m3"],
        "m0 came before the subscriber"
    );
    assert!(!got.more);
    let contents: Vec<Value> = got
        .messages
        .iter()
        .map(|m| serde_json::from_str(&m.content).unwrap())
        .collect();
    assert_eq!(
        contents,
        [json!({"n": 1}), json!({"n": 2}), json!({"n": 3})]
    );
    assert!(got.messages.windows(2).all(|w| w[0].seq < w[1].seq));
    assert_eq!(
        ids(&fetch(channels, "news", "reader").await),
        ["m1", "m2", "m3"],
        "not acknowledged: delivered again"
    );

    let first_two = channels
        .fetch("news", "reader", Duration::ZERO, 2)
        .await
        .unwrap();
    assert_eq!(ids(&first_two), ["m1", "m2"]);
    assert!(first_two.more);
    node.stop().await;
}

/// An acknowledgement is a cursor: everything up to the handle goes, a
/// stale handle changes nothing, a handle past what is published does not
/// swallow later messages, and each subscriber has its own cursor.
#[tokio::test]
async fn acknowledgements_move_each_subscribers_cursor() {
    let node = Node::start(config()).await;
    let channels = &*node.services.channels;
    channels.subscribe("news", "a").await.unwrap();
    channels.subscribe("news", "b").await.unwrap();
    for n in 1..=3 {
        publish(channels, "news", &format!("m{n}"), json!(n)).await;
    }
    let got = fetch(channels, "news", "a").await;
    let seqs: Vec<u64> = got.messages.iter().map(|m| m.seq).collect();

    channels.ack("news", "a", seqs[1]).await.unwrap();
    assert_eq!(ids(&fetch(channels, "news", "a").await), ["m3"]);
    channels.ack("news", "a", seqs[0]).await.unwrap();
    assert_eq!(
        ids(&fetch(channels, "news", "a").await),
        ["m3"],
        "a stale handle changes nothing"
    );
    assert_eq!(
        ids(&fetch(channels, "news", "b").await),
        ["m1", "m2", "m3"],
        "b acknowledged nothing"
    );

    channels.ack("news", "a", seqs[2] + 1000).await.unwrap();
    assert!(fetch(channels, "news", "a").await.messages.is_empty());
    publish(channels, "news", "m4", json!(4)).await;
    assert_eq!(
        ids(&fetch(channels, "news", "a").await),
        ["m4"],
        "a handle from the future acknowledged only what existed"
    );
    node.stop().await;
}

/// A fetch with nothing to return waits, and is answered by the next
/// publish.
#[tokio::test]
async fn a_long_poll_is_answered_by_the_next_publish() {
    let node = Node::start(config()).await;
    let channels = node.services.channels.clone();
    channels.subscribe("news", "reader").await.unwrap();
    let poll = {
        let channels = channels.clone();
        tokio::spawn(async move {
            channels
                .fetch("news", "reader", Duration::from_secs(25), 64)
                .await
        })
    };
    tokio::task::yield_now().await;
    publish(&channels, "news", "late", json!("news")).await;
    let got = tokio::time::timeout(crate::testkit::DEADLINE, poll)
        .await
        .expect("the poll is answered")
        .unwrap()
        .unwrap();
    assert_eq!(ids(&got), ["late"]);
    node.stop().await;
}

/// Publishers racing on one channel, then one alone, while subscribers
/// fetch and acknowledge: each subscriber receives every message once, in
/// publish order, though racing publishes end out of order; a lone
/// publisher's messages are fetched from the channel's copy of its newest
/// messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_publishes_reach_every_subscriber_once_in_order() {
    const PUBLISHERS: usize = 4;
    const EACH: usize = 40;
    const SUBSCRIBERS: usize = 3;
    let node = Node::start(config()).await;
    let channels = node.services.channels.clone();
    for s in 0..SUBSCRIBERS {
        channels.subscribe("busy", &format!("s{s}")).await.unwrap();
    }
    let readers: Vec<_> = (0..SUBSCRIBERS)
        .map(|s| {
            let channels = channels.clone();
            tokio::spawn(async move {
                let name = format!("s{s}");
                let mut got: Vec<(u64, String)> = Vec::new();
                while got.len() < (PUBLISHERS + 1) * EACH {
                    let fetched = channels
                        .fetch("busy", &name, Duration::from_millis(500), 7)
                        .await
                        .unwrap();
                    let Some(last) = fetched.messages.last().map(|m| m.seq) else {
                        continue;
                    };
                    got.extend(fetched.messages.into_iter().map(|m| (m.seq, m.message_id)));
                    channels.ack("busy", &name, last).await.unwrap();
                }
                got
            })
        })
        .collect();
    let writers: Vec<_> = (0..PUBLISHERS)
        .map(|p| {
            let channels = channels.clone();
            tokio::spawn(async move {
                for i in 0..EACH {
                    publish(&channels, "busy", &format!("p{p}-{i}"), json!(i)).await;
                }
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    // Then one publisher alone, as most channels have: its publishes end
    // with none other in flight.
    for i in 0..EACH {
        publish(&channels, "busy", &format!("alone-{i}"), json!(i)).await;
    }
    let mut published: Vec<String> = (0..PUBLISHERS)
        .flat_map(|p| (0..EACH).map(move |i| format!("p{p}-{i}")))
        .chain((0..EACH).map(|i| format!("alone-{i}")))
        .collect();
    published.sort();
    for r in readers {
        let got = tokio::time::timeout(crate::testkit::DEADLINE, r)
            .await
            .expect("every message arrives")
            .unwrap();
        assert!(
            got.windows(2).all(|w| w[0].0 < w[1].0),
            "in publish order, none twice"
        );
        let mut ids: Vec<String> = got.into_iter().map(|(_, id)| id).collect();
        ids.sort();
        assert_eq!(ids, published, "every message, none foreign");
    }
    assert!(
        channels.fetches_from_memory() > 0,
        "fetches of subscribers keeping up are answered from memory"
    );
    node.stop().await;
}

/// An unknown or deleted subscriber is not found; ids breaking DSPS's rule
/// are refused naming the parameter.
#[tokio::test]
async fn unknown_subscribers_and_bad_ids_are_refused() {
    let node = Node::start(config()).await;
    let channels = &*node.services.channels;
    let missing = channels
        .fetch("news", "nobody", Duration::ZERO, 64)
        .await
        .unwrap_err();
    assert!(
        matches!(missing, ChannelError::SubscriberNotFound),
        "{missing}"
    );
    channels.subscribe("news", "reader").await.unwrap();
    publish(channels, "news", "m1", json!(1)).await;
    channels.unsubscribe("news", "reader").await.unwrap();
    assert!(matches!(
        channels.fetch("news", "reader", Duration::ZERO, 64).await,
        Err(ChannelError::SubscriberNotFound)
    ));
    assert!(matches!(
        channels.ack("news", "reader", 1).await,
        Err(ChannelError::SubscriberNotFound)
    ));
    assert!(matches!(
        channels.admit("News!", ("subscriberID", "reader"), None),
        Err(ChannelError::InvalidId("channelID"))
    ));
    assert!(matches!(
        channels.admit("news", ("messageID", "-bad"), None),
        Err(ChannelError::InvalidId("messageID"))
    ));
    assert!(channels
        .admit("news", ("subscriberID", "reader"), None)
        .is_ok());
    node.stop().await;
}

/// Messages and cursors are durable: after a restart a subscriber gets
/// exactly what it had not acknowledged.
#[tokio::test]
async fn cursors_and_messages_survive_a_restart() {
    let node = Node::start(config()).await;
    {
        let channels = &*node.services.channels;
        channels.subscribe("news", "reader").await.unwrap();
        for n in 1..=3 {
            publish(channels, "news", &format!("m{n}"), json!(n)).await;
        }
        let first = fetch(channels, "news", "reader").await.messages[0].seq;
        channels.ack("news", "reader", first).await.unwrap();
    }
    let node = node.restart().await;
    let channels = &*node.services.channels;
    assert_eq!(ids(&fetch(channels, "news", "reader").await), ["m2", "m3"]);
    assert!(
        !publish(channels, "news", "m3", json!("again")).await,
        "ids are remembered"
    );
    node.stop().await;
}

/// A channel rule's webhook for `channel_regex`, calling `url` and
/// retrying at once (no wait, no jitter) up to three times.
fn webhook_rule(channel_regex: &str, url: String) -> ChannelRule {
    ChannelRule {
        regex: channel_regex.into(),
        jwt: None,
        webhooks: vec![WebhookRule {
            method: "PUT".into(),
            url,
            timeout: Duration::from_secs(10),
            retry: RetryRule {
                count: 3,
                interval: Duration::ZERO,
                interval_multiplier: 1.0,
                interval_jitter: Duration::ZERO,
            },
            headers: [("X-Room".to_string(), "{{.channel.id}}".to_string())].into(),
        }],
    }
}

fn with_rules(rules: Vec<ChannelRule>) -> ServicesConfig {
    let mut config = config();
    config.channels.rules = rules;
    config
}

/// Each new message on a channel a rule matches is PUT to the rule's
/// webhook (its URL and headers filled from the channel name); a 5xx is
/// retried, a 4xx is not, and a duplicate message calls nothing.
#[tokio::test]
async fn webhooks_are_called_for_new_messages_and_retried_after_a_failure() {
    let receiver = Receiver::start().await;
    let node = Node::start(with_rules(vec![webhook_rule(
        r"room-(?P<id>\d+)",
        format!("{}/room/{{{{.channel.id}}}}", receiver.url),
    )]))
    .await;
    let channels = &*node.services.channels;

    receiver.answer(503);
    publish(channels, "room-7", "hello", json!({"text": "hi"})).await;
    let got = receiver.wait_for("/room/7", 2).await;
    for request in &got {
        assert_eq!(request.method, "PUT");
        assert_eq!(request.header("x-room"), Some("7"));
        assert_eq!(
            request.json(),
            json!({"type": "dsps.channel.outgoing-webhook", "channelID": "room-7",
                   "messageID": "hello", "content": {"text": "hi"}})
        );
    }

    receiver.answer(400);
    publish(channels, "room-7", "refused", json!(1)).await;
    receiver.wait_for("/room/7", 3).await;
    // Not for a duplicate, nor for a channel no rule matches.
    publish(channels, "room-7", "hello", json!("again")).await;
    publish(channels, "lobby", "x", json!(2)).await;
    publish(channels, "room-7", "bye", json!(3)).await;
    let got = receiver.wait_for("/room/7", 4).await;
    let message_ids: Vec<String> = got
        .iter()
        .map(|r| r.json()["messageID"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        message_ids,
        ["hello", "hello", "refused", "bye"],
        "a 503 retried, a 400 not"
    );
    assert_eq!(receiver.requests().len(), 4, "nothing for the lobby");
    node.stop().await;
}

fn uplink(device: &str, uuid: &str, temperature: i64) -> weft_model::NewUplink {
    decoded_uplink(
        "thermo",
        json!({"uuid": uuid, "id": device, "temperature": temperature}),
    )
}

async fn send(node: &Node, uplinks: Vec<weft_model::NewUplink>) {
    for u in uplinks {
        accept(node, u).await;
    }
}

/// A data bridge publishes the stored units its filter passes into its
/// channel, with the `dataId` as message id, in order, where a poller
/// reads them and the channel's webhook receives them (retried after a
/// failure); after a restart it goes on from its cursor, publishing each
/// unit once.
#[tokio::test]
async fn a_bridge_publishes_stored_units_once_into_its_channel() {
    let receiver = Receiver::start().await;
    let node = Node::start(with_rules(vec![webhook_rule(
        "unit-feed",
        format!("{}/units", receiver.url),
    )]))
    .await;
    plain_type(&node, "thermo").await;
    eventually("the bridges' lease", || async {
        node.services
            .cluster
            .held()
            .contains(&crate::cluster::work::BRIDGES)
            .then_some(())
    })
    .await;
    let spec = BridgeSpec {
        stream: "data".into(),
        channel: "unit-feed".into(),
        filter: FilterSpec {
            devices: vec!["t1".into()],
            ..FilterSpec::default()
        },
    };
    assert!(node.services.bridges.put("t1-out", spec).await.unwrap());
    node.services
        .channels
        .subscribe("unit-feed", "ops")
        .await
        .unwrap();

    receiver.answer(500);
    send(
        &node,
        vec![
            uplink("t1", "u-1", 20),
            uplink("t2", "u-2", 30),
            uplink("t1", "u-3", 21),
        ],
    )
    .await;
    let got = eventually("two units in the channel", || async {
        let f = fetch(&node.services.channels, "unit-feed", "ops").await;
        (f.messages.len() >= 2).then_some(f)
    })
    .await;
    assert_eq!(ids(&got), ["u-1", "u-3"], "t2 is filtered out");
    let unit: weft_model::DataUnit = serde_json::from_str(&got.messages[0].content).unwrap();
    assert_eq!(unit.device.id, "t1");
    assert_eq!(unit.measures["temperature"], 20);

    let hooks = receiver.wait_for("/units", 3).await;
    let mut hooked: Vec<String> = hooks
        .iter()
        .map(|r| r.json()["messageID"].as_str().unwrap().to_string())
        .collect();
    hooked.sort();
    hooked.dedup();
    assert_eq!(hooked, ["u-1", "u-3"], "the failed call was retried");
    let last = got.messages[1].seq;
    node.services
        .channels
        .ack("unit-feed", "ops", last)
        .await
        .unwrap();

    let node = node.restart().await;
    send(&node, vec![uplink("t1", "u-4", 22)]).await;
    let got = eventually("the new unit in the channel", || async {
        let f = fetch(&node.services.channels, "unit-feed", "ops").await;
        (!f.messages.is_empty()).then_some(f)
    })
    .await;
    assert_eq!(ids(&got), ["u-4"], "nothing published twice");
    receiver.wait_for("/units", 4).await;
    assert_eq!(receiver.requests().len(), 4, "no webhook call twice");
    assert_eq!(
        node.services.bridges.list()[0].0,
        "t1-out",
        "the bridge is stored"
    );
    node.stop().await;
}

/// A subscriber idle longer than `expire_after` is removed (its fetch then
/// answers not found) while an active one stays; messages every remaining
/// subscriber acknowledged are deleted from the store.
#[tokio::test]
async fn idle_subscribers_expire_and_acknowledged_messages_are_deleted() {
    let mut config = config();
    config.channels.expire_after = Duration::from_millis(400);
    let node = Node::start(config).await;
    let channels = &*node.services.channels;
    channels.subscribe("news", "idle").await.unwrap();
    channels.subscribe("news", "busy").await.unwrap();
    for n in 1..=3 {
        publish(channels, "news", &format!("m{n}"), json!(n)).await;
    }
    let seqs: Vec<u64> = fetch(channels, "news", "busy")
        .await
        .messages
        .iter()
        .map(|m| m.seq)
        .collect();
    channels.ack("news", "busy", seqs[2]).await.unwrap();

    // "busy" keeps fetching; "idle" does nothing.
    eventually("the idle subscriber expired", || async {
        assert!(fetch(channels, "news", "busy").await.messages.is_empty());
        let view = channels.describe("news").await.unwrap()?;
        let left: Vec<&str> = view.subscribers.iter().map(|s| s.id.as_str()).collect();
        (left == ["busy"]).then_some(())
    })
    .await;
    assert!(matches!(
        channels.fetch("news", "idle", Duration::ZERO, 64).await,
        Err(ChannelError::SubscriberNotFound)
    ));
    eventually("the acknowledged messages deleted", || async {
        assert!(fetch(channels, "news", "busy").await.messages.is_empty());
        node.store
            .channel_messages("news", 0, 100)
            .await
            .unwrap()
            .is_empty()
            .then_some(())
    })
    .await;
    node.stop().await;
}

/// Subscribing again is idempotent: the subscriber keeps its cursor, also
/// after a restart.
#[tokio::test]
async fn subscribing_again_keeps_the_cursor() {
    let node = Node::start(config()).await;
    let channels = &*node.services.channels;
    channels.subscribe("news", "reader").await.unwrap();
    publish(channels, "news", "m1", json!(1)).await;
    channels.subscribe("news", "reader").await.unwrap();
    assert_eq!(ids(&fetch(channels, "news", "reader").await), ["m1"]);
    let node = node.restart().await;
    let channels = &*node.services.channels;
    channels.subscribe("news", "reader").await.unwrap();
    assert_eq!(ids(&fetch(channels, "news", "reader").await), ["m1"]);
    node.stop().await;
}

/// A bridge definition is checked (stream, channel id); one made through
/// the API is stored, and once deleted is gone, also after a restart.
#[tokio::test]
async fn bridges_are_checked_stored_and_deleted() {
    let node = Node::start(config()).await;
    let bridges = &node.services.bridges;
    let spec = |stream: &str, channel: &str| BridgeSpec {
        stream: stream.into(),
        channel: channel.into(),
        filter: FilterSpec::default(),
    };
    let refused = bridges
        .put("changes", spec("entities", "feed"))
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("stream"), "{refused}");
    assert!(bridges.put("bad", spec("data", "Not Valid")).await.is_err());
    assert!(bridges.list().is_empty());

    assert!(bridges.put("out", spec("alarms", "feed")).await.unwrap());
    assert!(
        !bridges.put("out", spec("data", "feed")).await.unwrap(),
        "replaced, not new"
    );
    let node = node.restart().await;
    let listed = node.services.bridges.list();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (
            listed[0].0.as_str(),
            listed[0].1.stream.as_str(),
            listed[0].2
        ),
        ("out", "data", true)
    );
    assert!(node.services.bridges.delete("out").await.unwrap());
    assert!(!node.services.bridges.delete("out").await.unwrap());
    let node = node.restart().await;
    assert!(node.services.bridges.list().is_empty());
    node.stop().await;
}

/// Units committed by the pipeline just before weft stopped (killed before
/// the bridge read them) are published by the bridge after the restart,
/// also when the bridge had published nothing yet: it was made before
/// them, so they are its events.
#[tokio::test]
async fn a_bridge_publishes_what_was_stored_before_a_crash_after_the_restart() {
    let node = Node::start(config()).await;
    eventually("the bridges' lease", || async {
        node.services
            .cluster
            .held()
            .contains(&crate::cluster::work::BRIDGES)
            .then_some(())
    })
    .await;
    let spec = BridgeSpec {
        stream: "data".into(),
        channel: "unit-feed".into(),
        filter: FilterSpec::default(),
    };
    node.services.bridges.put("all-out", spec).await.unwrap();
    node.services
        .channels
        .subscribe("unit-feed", "ops")
        .await
        .unwrap();
    let dir = node.stop().await;

    // What the pipeline committed right before the crash.
    {
        let store = crate::testkit::open_store(dir.path());
        let now = weft_model::now_ms();
        let unit = weft_model::DataUnit {
            data_id: "u-1".into(),
            reported_at: now,
            received_at: now,
            channel: "farm".into(),
            device: weft_model::DeviceInfo {
                id: "t1".into(),
                device_type: "thermo".into(),
                ..Default::default()
            },
            measures: serde_json::Map::from_iter([("temperature".to_string(), json!(20))]),
        };
        let json = serde_json::to_string(&unit).unwrap();
        store
            .commit_processed(std::sync::Arc::new(weft_store::ProcessedBatch {
                units: vec![weft_store::UnitRecord {
                    unit: std::sync::Arc::new(unit),
                    partition: 0,
                    json: json.into(),
                }],
                ..Default::default()
            }))
            .await
            .unwrap();
        store.close().await;
    }

    let node = Node::start_in(dir, config()).await;
    plain_type(&node, "thermo").await;
    send(&node, vec![uplink("t1", "u-2", 21)]).await;
    let got = eventually("the units in the channel", || async {
        let f = fetch(&node.services.channels, "unit-feed", "ops").await;
        f.messages
            .iter()
            .any(|m| m.message_id == "u-2")
            .then_some(f)
    })
    .await;
    assert_eq!(ids(&got), ["u-1", "u-2"]);
    node.stop().await;
}

/// A bridge deleted and made again under the same name is a new bridge:
/// it starts with the events stored after it, not from where the deleted
/// one stopped.
#[tokio::test]
async fn a_bridge_made_again_after_its_deletion_starts_anew() {
    let node = Node::start(config()).await;
    plain_type(&node, "thermo").await;
    eventually("the bridges' lease", || async {
        node.services
            .cluster
            .held()
            .contains(&crate::cluster::work::BRIDGES)
            .then_some(())
    })
    .await;
    let spec = || BridgeSpec {
        stream: "data".into(),
        channel: "unit-feed".into(),
        filter: FilterSpec::default(),
    };
    let channels = &node.services.channels;
    channels.subscribe("unit-feed", "ops").await.unwrap();
    let bridges = &node.services.bridges;
    assert!(bridges.put("out", spec()).await.unwrap());
    send(&node, vec![uplink("t1", "u-1", 20)]).await;
    eventually("u-1 bridged", || async {
        (!fetch(channels, "unit-feed", "ops")
            .await
            .messages
            .is_empty())
        .then_some(())
    })
    .await;

    assert!(bridges.delete("out").await.unwrap());
    send(&node, vec![uplink("t1", "u-2", 21)]).await;
    eventually("u-2 stored", || async {
        node.store.get_data("u-2").await.unwrap().map(|_| ())
    })
    .await;
    assert!(bridges.put("out", spec()).await.unwrap(), "a new bridge");
    send(&node, vec![uplink("t1", "u-3", 22)]).await;
    let got = eventually("u-3 bridged", || async {
        let f = fetch(channels, "unit-feed", "ops").await;
        f.messages
            .iter()
            .any(|m| m.message_id == "u-3")
            .then_some(f)
    })
    .await;
    assert_eq!(
        ids(&got),
        ["u-1", "u-3"],
        "u-2 was stored while there was no bridge"
    );
    node.stop().await;
}
