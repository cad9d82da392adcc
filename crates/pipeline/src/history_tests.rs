//! History in process: entity changes made through the context and
//! notifications recorded through [`History::record_entities`], read back
//! as the history API reads them ([`History::settle`], then the store's
//! queries), with the services wired as [`crate::Services::start`] wires
//! them.

use std::time::Duration;

use serde_json::{json, Value};
use weft_model::ngsi::{self, parse_attrs, parse_entity, Entity, UpdateOptions};
use weft_store::{AggrMethod, AggrPeriod, HistoryQuery, HistoryRow};

use super::{Retention, RetentionPolicy};
use crate::testkit::{accept, config, decoded_uplink, eventually, plain_type, Node};
use crate::ServicesConfig;

fn recording() -> ServicesConfig {
    ServicesConfig {
        record_history: true,
        ..config()
    }
}

fn room(id: &str, temperature: i64) -> Entity {
    parse_entity(
        &json!({"id": id, "type": "Room",
                "temperature": {"value": temperature, "type": "Number"},
                "pressure": {"value": 1000, "type": "Number"}}),
        false,
    )
    .unwrap()
}

async fn set_temperature(node: &Node, tenant: &str, id: &str, temperature: i64) {
    let now = weft_model::now_ms();
    node.services
        .context
        .modify(tenant, &[], id, None, move |e| {
            let attrs = parse_attrs(
                &json!({"temperature": {"value": temperature, "type": "Number"}}),
                false,
            )?;
            Ok(ngsi::update(e, attrs, UpdateOptions::default(), now))
        })
        .await
        .unwrap();
}

/// The history of `attr` of `tenant`'s entity `id`, as a query after
/// [`History::settle`] sees it.
async fn history(node: &Node, tenant: &str, id: &str, attr: &str) -> Vec<HistoryRow> {
    node.services.history.settle().await;
    node.store
        .query_history(&HistoryQuery {
            tenant: tenant.into(),
            service_path: None,
            entity_ids: vec![id.into()],
            entity_type: None,
            attrs: vec![attr.into()],
            every_state: false,
            from: None,
            to: None,
            last_n: None,
            offset: 0,
            limit: 1000,
        })
        .await
        .unwrap()
}

fn values(rows: &[HistoryRow]) -> Vec<Value> {
    rows.iter()
        .map(|r| serde_json::from_str(&r.value).unwrap())
        .collect()
}

/// With recording on, creating an entity records each of its attributes
/// and each update the attributes it touched, in order, under the
/// entity's tenant and service path; a query made after the writes
/// returned sees them all.
#[tokio::test]
async fn entity_changes_are_recorded_as_history() {
    let node = Node::start(recording()).await;
    let context = &node.services.context;
    context.create("", "/", room("Room1", 20)).await.unwrap();
    set_temperature(&node, "", "Room1", 21).await;
    set_temperature(&node, "", "Room1", 22).await;
    context
        .create("acme", "/farm", room("Barn", 5))
        .await
        .unwrap();

    let rows = history(&node, "", "Room1", "temperature").await;
    assert_eq!(values(&rows), [json!(20), json!(21), json!(22)]);
    assert!(rows.windows(2).all(|w| w[0].time <= w[1].time));
    assert_eq!(rows[0].attr_type, "Number");
    assert_eq!(rows[0].entity_type, "Room");
    assert_eq!(rows[0].number, Some(20.0));
    // Updates record only what they touched.
    let pressure = history(&node, "", "Room1", "pressure").await;
    assert_eq!(values(&pressure), [json!(1000)]);

    let barn = history(&node, "acme", "Barn", "temperature").await;
    assert_eq!(values(&barn), [json!(5)]);
    assert_eq!(barn[0].service_path, "/farm");
    assert!(
        history(&node, "", "Barn", "temperature").await.is_empty(),
        "tenants are apart"
    );

    let sum = node
        .store
        .aggregate_history(
            &HistoryQuery {
                tenant: String::new(),
                entity_ids: vec!["Room1".into()],
                attrs: vec!["temperature".into()],
                limit: 1000,
                ..history_query()
            },
            AggrMethod::Sum,
            None,
        )
        .await
        .unwrap();
    assert_eq!(sum.len(), 1, "{sum:?}");
    assert_eq!(sum[0].value, Some(63.0));
    node.stop().await;
}

fn history_query() -> HistoryQuery {
    HistoryQuery {
        tenant: String::new(),
        service_path: None,
        entity_ids: Vec::new(),
        entity_type: None,
        attrs: Vec::new(),
        every_state: false,
        from: None,
        to: None,
        last_n: None,
        offset: 0,
        limit: 1000,
    }
}

/// Recording is off by default: entity changes leave no history.
#[tokio::test]
async fn without_recording_changes_leave_no_history() {
    let node = Node::start(config()).await;
    node.services
        .context
        .create("", "/", room("Room1", 20))
        .await
        .unwrap();
    set_temperature(&node, "", "Room1", 21).await;
    assert!(history(&node, "", "Room1", "temperature").await.is_empty());
    node.stop().await;
}

/// Notified entities (QuantumLeap's `/v2/notify`) are in the history once
/// queued: each notification a row of its own, even two of one entity
/// under the same time index, and kept across a restart.
#[tokio::test]
async fn notified_entities_are_recorded_and_kept() {
    let node = Node::start(config()).await;
    let at = "2026-03-01T10:00:00.000Z";
    let reading = |t: i64| {
        parse_entity(
            &json!({"id": "Room1", "type": "Room",
                    "temperature": {"value": t, "type": "Number"},
                    "TimeInstant": {"value": at, "type": "DateTime"}}),
            false,
        )
        .unwrap()
    };
    let history_svc = &node.services.history;
    let queued = history_svc
        .record_entities("", "/", &[reading(20).into()], Some("TimeInstant"), 0)
        .await
        .unwrap();
    assert_eq!(queued, 2, "one row per attribute");
    history_svc
        .record_entities("", "/", &[reading(21).into()], Some("TimeInstant"), 0)
        .await
        .unwrap();

    let rows = history(&node, "", "Room1", "temperature").await;
    assert_eq!(values(&rows), [json!(20), json!(21)], "in arrival order");
    let time = weft_model::ngsi::parse_datetime(at).unwrap();
    assert!(rows.iter().all(|r| r.time == time), "{rows:?}");
    assert!(
        rows.iter()
            .all(|r| r.entity_type == "Room" && r.attr_type == "Number" && r.number.is_some()),
        "type, attribute type and number as notified: {rows:?}"
    );

    let node = node.restart().await;
    let rows = history(&node, "", "Room1", "temperature").await;
    assert_eq!(values(&rows), [json!(20), json!(21)]);
    node.stop().await;
}

/// Retention per tenant: past `downsample_after` a tenant's rows go while
/// their rollups still answer aggregates; past `keep` rows go, and a row
/// already older than that when it arrives is never stored; a tenant
/// without a retention of its own (here the default tenant) keeps all.
/// (Rollup buckets go once they end before `keep`: an hour bucket, too
/// long to wait for here.)
#[tokio::test]
async fn retention_downsamples_and_expires_per_tenant() {
    let short = Duration::from_secs(3);
    let config = ServicesConfig {
        history_retention: RetentionPolicy {
            default: Retention::default(),
            tenants: [
                (
                    "thin".to_string(),
                    Retention {
                        keep: None,
                        downsample_after: Some(short),
                    },
                ),
                (
                    "gone".to_string(),
                    Retention {
                        keep: Some(short),
                        downsample_after: None,
                    },
                ),
            ]
            .into(),
            interval: Duration::from_millis(100),
        },
        ..config()
    };
    let node = Node::start(config).await;
    let history_svc = &node.services.history;
    let now = weft_model::now_ms();
    let two_hours_ago = parse_entity(
        &json!({"id": "Room1", "type": "Room",
                "temperature": {"value": 7, "type": "Number"},
                "TimeInstant": {"value": ngsi::format_datetime(now - 7_200_000),
                                "type": "DateTime"}}),
        false,
    )
    .unwrap();
    for tenant in ["", "gone"] {
        history_svc
            .record_entities(tenant, "/", &[two_hours_ago.clone().into()], None, now)
            .await
            .unwrap();
    }
    for tenant in ["", "thin", "gone"] {
        history_svc
            .record_entities(tenant, "/", &[room("Room1", 10).into()], None, now)
            .await
            .unwrap();
    }
    assert_eq!(
        values(&history(&node, "", "Room1", "temperature").await),
        [json!(7), json!(10)]
    );
    assert_eq!(
        values(&history(&node, "thin", "Room1", "temperature").await),
        [json!(10)],
        "stored while recent"
    );
    assert_eq!(
        values(&history(&node, "gone", "Room1", "temperature").await),
        [json!(10)],
        "a row past its tenant's retention is not stored"
    );
    let hourly_sum = |tenant: &'static str| {
        let store = node.store.clone();
        async move {
            let q = HistoryQuery {
                tenant: tenant.into(),
                entity_ids: vec!["Room1".into()],
                attrs: vec!["temperature".into()],
                ..history_query()
            };
            store
                .aggregate_history(&q, AggrMethod::Sum, Some(AggrPeriod::Hour))
                .await
                .unwrap()
                .into_iter()
                .filter_map(|a| a.value)
                .sum::<f64>()
        }
    };

    eventually("the thin tenant's rows downsampled", || async {
        history(&node, "thin", "Room1", "temperature")
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    assert_eq!(hourly_sum("thin").await, 10.0, "its rollups stay");
    eventually("the gone tenant's rows expired", || async {
        history(&node, "gone", "Room1", "temperature")
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    assert_eq!(
        values(&history(&node, "", "Room1", "temperature").await),
        [json!(7), json!(10)],
        "the default tenant keeps everything"
    );
    assert_eq!(hourly_sum("").await, 17.0);
    node.stop().await;
}

/// With recording on, device data is recorded too: each unit's measures
/// on its device's entity, under the unit's reported time.
#[tokio::test]
async fn device_data_is_recorded_as_history() {
    let node = Node::start(recording()).await;
    plain_type(&node, "thermo").await;
    let reported = [1_772_359_200_000_i64, 1_772_359_260_000];
    for (i, (at, t)) in reported.iter().zip([20, 21]).enumerate() {
        accept(
            &node,
            decoded_uplink(
                "thermo",
                json!({"uuid": format!("u-{i}"), "id": "t1", "temperature": t,
                       "reported_at": ngsi::format_datetime(*at)}),
            ),
        )
        .await;
    }
    eventually("both units stored", || async {
        node.store.get_data("u-1").await.unwrap().map(|_| ())
    })
    .await;
    let rows = history(&node, "", "t1", "temperature").await;
    assert_eq!(values(&rows), [json!(20), json!(21)]);
    let times: Vec<i64> = rows.iter().map(|r| r.time).collect();
    assert_eq!(times, reported);
    assert_eq!(rows[0].entity_type, "thermo");
    node.stop().await;
}

/// The node that moves the notifications feed acknowledges no more than
/// [`super::MAX_UNMOVED`] feed positions ahead of its mover: past that, a
/// notification waits, waking the mover, until the mover catches up, and
/// is queued then.
#[tokio::test]
async fn notifications_wait_for_a_mover_that_fell_behind() {
    use std::sync::atomic::Ordering;
    let node = Node::start(config()).await;
    // A recorder whose mover is not running: its positions are set by hand.
    let recorder = super::History::new(node.store.clone(), RetentionPolicy::default());
    recorder.moving.store(true, Ordering::Release);
    recorder
        .notified
        .store(super::MAX_UNMOVED + 100, Ordering::Release);
    let reading = parse_entity(
        &json!({"id": "Room1", "type": "Room", "temperature": {"value": 1, "type": "Number"}}),
        false,
    )
    .unwrap();
    let entities = [reading.into()];
    let queued = recorder.record_entities("", "/", &entities, None, 0);
    tokio::pin!(queued);
    assert!(
        crate::testkit::still_waiting(&mut queued).await,
        "acknowledged with the mover a whole backlog behind"
    );
    tokio::time::timeout(Duration::from_secs(1), recorder.wake.notified())
        .await
        .expect("the mover was woken");
    recorder.moved.send_replace(100);
    let rows = tokio::time::timeout(Duration::from_secs(5), queued)
        .await
        .expect("queued once the mover caught up")
        .unwrap();
    assert_eq!(rows, 1);
    node.stop().await;
}
