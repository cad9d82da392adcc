//! The ingest consumer in process: uplinks accepted the way the HTTP and
//! MQTT surfaces accept them ([`crate::uplink::accept`]), consumed by the
//! services [`crate::Services::start`] wires, on a temporary SQLite store.

use serde_json::{json, Value};
use weft_bus::{Payload, Stream};
use weft_model::{DataUnit, DeviceType, FailureReason, NewUplink, UplinkFormat};
use weft_store::{FailedQuery, Store};

use crate::testkit::{config, eventually, Node};
use crate::uplink::{accept, Arrival, Patience};

/// A `decodeUplink` codec: the first byte is the temperature in °C; 255
/// is a sensor fault, which the codec throws on.
const THERMO: &str = "function decodeUplink(input) { \
    if (input.bytes[0] === 255) { throw new Error('sensor fault'); } \
    return { data: { temperature: { celsius: input.bytes[0] } } }; }";

async fn thermo(node: &Node) {
    let def: DeviceType = serde_json::from_value(json!({"decoder": {"script": THERMO}})).unwrap();
    node.services
        .catalog
        .put_device_type("thermo", def)
        .await
        .unwrap();
}

/// An encoded sensae uplink of type `device_type` from `device`, with
/// `dataId` `uuid` and payload `bytes`.
fn encoded(device_type: &str, device: &str, uuid: &str, bytes: &[u8]) -> NewUplink {
    NewUplink {
        partition: 0,
        received_at: weft_model::now_ms(),
        format: UplinkFormat::SensaeEncoded,
        channel: Some("farm".into()),
        device_type: Some(device_type.into()),
        event: None,
        device_id: None,
        source: None,
        pins: Default::default(),
        body: serde_json::to_vec(&json!({"uuid": uuid, "id": device, "bytes": bytes, "port": 1}))
            .unwrap(),
    }
}

async fn send(node: &Node, uplink: NewUplink) {
    let arrival = Arrival {
        uplinks: vec![uplink],
        parsed: None,
        route: None,
    };
    accept(&node.services, arrival, &Patience::Once)
        .await
        .expect("accepted");
}

/// The stored unit with `data_id`, once the consumer stored it.
async fn stored_unit(store: &dyn Store, data_id: &str) -> DataUnit {
    eventually(&format!("unit {data_id} stored"), || async {
        let unit = store.get_data(data_id).await.unwrap()?;
        Some(serde_json::from_str(&unit.json).unwrap())
    })
    .await
}

/// Every stored unit's `dataId`, in storage order.
async fn stored_ids(store: &dyn Store) -> Vec<String> {
    store
        .query_data(&weft_store::DataQuery {
            limit: 1000,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_iter()
        .map(|u| serde_json::from_str::<DataUnit>(&u.json).unwrap().data_id)
        .collect()
}

async fn failures(store: &dyn Store) -> Vec<weft_model::FailedUplink> {
    store
        .query_failed(&FailedQuery {
            limit: 1000,
            ..Default::default()
        })
        .await
        .unwrap()
}

/// An accepted uplink is decoded by its type's codec into a data unit that
/// is stored with the device, channel and measures, and the device's
/// entity takes the measure; the device is registered on first sight.
#[tokio::test]
async fn an_accepted_uplink_becomes_a_stored_unit_and_its_entity() {
    let node = Node::start(config()).await;
    thermo(&node).await;
    send(&node, encoded("thermo", "t1", "u-1", &[21])).await;

    let unit = stored_unit(&*node.store, "u-1").await;
    assert_eq!(unit.device.id, "t1");
    assert_eq!(unit.device.device_type, "thermo");
    assert_eq!(unit.channel, "farm");
    assert_eq!(unit.measures["temperature"], json!({"celsius": 21}));

    // A decoded uplink needs no codec: its body (less the envelope) is the
    // measures.
    let mut decoded = encoded("thermo", "t1", "u-2", &[]);
    decoded.format = UplinkFormat::SensaeDecoded;
    decoded.body = serde_json::to_vec(&json!({"uuid": "u-2", "id": "t1", "humidity": 40})).unwrap();
    send(&node, decoded).await;
    let unit = stored_unit(&*node.store, "u-2").await;
    assert_eq!(Value::Object(unit.measures), json!({"humidity": 40}));

    let entity = eventually("the device's entity", || async {
        let e = node
            .services
            .context
            .get("", &[], "t1", Some("thermo"))
            .ok()?;
        e.entity.attrs.get("humidity").is_some().then_some(e)
    })
    .await;
    assert_eq!(entity.service_path, "/");
    assert_eq!(entity.entity.attrs.get("temperature").unwrap().value, 21);
    assert_eq!(entity.entity.attrs.get("humidity").unwrap().value, 40);
    let devices = node
        .store
        .list_devices(&weft_store::DeviceFilter::default())
        .await
        .unwrap();
    assert!(
        devices
            .iter()
            .any(|d| d.id == "t1" && d.device_type == "thermo"),
        "the device was registered: {devices:?}"
    );
    assert!(failures(&*node.store).await.is_empty());
    node.stop().await;
}

/// An uplink naming a type that does not exist, one whose codec throws,
/// or one giving a registered device another type, is kept as failed with its reason and description and its body, and
/// stores no unit; the uplinks after it are processed as usual.
#[tokio::test]
async fn a_failed_uplink_is_kept_with_its_reason() {
    let node = Node::start(config()).await;
    thermo(&node).await;
    crate::testkit::plain_type(&node, "other").await;
    node.services
        .catalog
        .put_device(weft_model::Device {
            id: "t9".into(),
            device_type: "thermo".into(),
            ..weft_model::Device::default()
        })
        .await
        .unwrap();
    send(&node, encoded("nosuchtype", "t1", "u-1", &[21])).await;
    send(&node, encoded("thermo", "t2", "u-2", &[255])).await;
    // A registered device keeps its type.
    send(
        &node,
        crate::testkit::decoded_uplink("other", json!({"uuid": "u-9", "id": "t9", "x": 1})),
    )
    .await;
    send(&node, encoded("thermo", "t3", "u-3", &[19])).await;

    stored_unit(&*node.store, "u-3").await;
    let failed = eventually("three failed uplinks", || async {
        let f = failures(&*node.store).await;
        (f.len() >= 3).then_some(f)
    })
    .await;
    assert_eq!(failed.len(), 3, "{failed:?}");
    assert_eq!(failed[2].reason, FailureReason::TypeMismatch);
    let (unknown, thrown) = (&failed[0], &failed[1]);
    assert_eq!(unknown.reason, FailureReason::UnknownType);
    assert!(
        unknown.description.contains("'nosuchtype'"),
        "{}",
        unknown.description
    );
    assert_eq!(unknown.body["uuid"], "u-1", "the body is kept");
    assert_eq!(unknown.channel.as_deref(), Some("farm"));
    assert_eq!(thrown.reason, FailureReason::DecodeError);
    assert!(
        thrown.description.contains("sensor fault"),
        "the codec's error is told: {}",
        thrown.description
    );
    assert!(unknown.seq < thrown.seq);
    assert_eq!(stored_ids(&*node.store).await, ["u-3"]);
    node.stop().await;
}

/// After a restart the consumer goes on from its stored cursor: what was
/// processed before is neither decoded again nor stored or published
/// twice, and what comes after is processed.
#[tokio::test]
async fn the_consumer_resumes_from_its_cursor_after_a_restart() {
    let node = Node::start(config()).await;
    thermo(&node).await;
    for (i, uuid) in ["u-1", "u-2", "u-3"].into_iter().enumerate() {
        send(&node, encoded("thermo", "t1", uuid, &[20 + i as u8])).await;
    }
    stored_unit(&*node.store, "u-3").await;
    let committed = *node.store.committed_seq().borrow();
    eventually("the cursor past the three uplinks", || async {
        (node.store.cursor(crate::CONSUMER).await.unwrap() > committed).then_some(())
    })
    .await;

    // Were the first uplinks decoded again after the restart, this codec
    // would fail them.
    let broken: DeviceType = serde_json::from_value(json!({"decoder": {"script":
        "function decodeUplink(input) { throw new Error('decoded again'); }"}}))
    .unwrap();
    node.services
        .catalog
        .put_device_type("thermo", broken)
        .await
        .unwrap();
    let node = node.restart().await;
    let mut data = node.bus.subscribe(Stream::Data);
    let mut decoded = encoded("thermo", "t1", "u-4", &[]);
    decoded.format = UplinkFormat::SensaeDecoded;
    decoded.body = serde_json::to_vec(&json!({"uuid": "u-4", "id": "t1", "humidity": 40})).unwrap();
    send(&node, decoded).await;

    stored_unit(&*node.store, "u-4").await;
    assert_eq!(stored_ids(&*node.store).await, ["u-1", "u-2", "u-3", "u-4"]);
    assert!(
        failures(&*node.store).await.is_empty(),
        "nothing before the cursor was decoded again"
    );
    // The first unit published after the restart is the new one.
    let event = tokio::time::timeout(crate::testkit::DEADLINE, data.recv())
        .await
        .expect("a unit is published")
        .expect("the bus is open");
    match &event.payload {
        Payload::Data(unit) => assert_eq!(unit.data_id, "u-4"),
        other => panic!("not a data unit: {other:?}"),
    }
    // The entity, built again from the store, has the data of both runs.
    let entity = node
        .services
        .context
        .get("", &[], "t1", Some("thermo"))
        .unwrap();
    assert_eq!(entity.entity.attrs.get("temperature").unwrap().value, 22);
    assert_eq!(entity.entity.attrs.get("humidity").unwrap().value, 40);
    node.stop().await;
}

/// The same `dataId` sent again (a network server's retry) is stored and
/// published once, keeps its first content and does not touch the
/// entity; the backlog drains to nothing.
#[tokio::test]
async fn a_resent_uplink_is_stored_once() {
    let node = Node::start(config()).await;
    thermo(&node).await;
    let mut data = node.bus.subscribe(Stream::Data);
    send(&node, encoded("thermo", "t1", "u-1", &[21])).await;
    send(&node, encoded("thermo", "t1", "u-1", &[22])).await;
    send(&node, encoded("thermo", "t2", "u-2", &[23])).await;

    stored_unit(&*node.store, "u-2").await;
    assert_eq!(stored_ids(&*node.store).await, ["u-1", "u-2"]);
    let first = stored_unit(&*node.store, "u-1").await;
    assert_eq!(first.measures["temperature"], json!({"celsius": 21}));
    let entity = node
        .services
        .context
        .get("", &[], "t1", Some("thermo"))
        .unwrap();
    assert_eq!(entity.entity.attrs.get("temperature").unwrap().value, 21);
    let mut published = Vec::new();
    for _ in 0..2 {
        let event = tokio::time::timeout(crate::testkit::DEADLINE, data.recv())
            .await
            .expect("a unit is published")
            .expect("the bus is open");
        if let Payload::Data(unit) = &event.payload {
            published.push(unit.data_id.clone());
        }
    }
    assert_eq!(published, ["u-1", "u-2"], "u-1 published once");
    eventually("the backlog drained", || async {
        (node.services.ingest.backlog() == 0).then_some(())
    })
    .await;
    node.stop().await;
}

/// A network server's message that is a device event (ChirpStack's
/// `?event=join`) is kept as the device's event: neither a unit nor a
/// failure.
#[tokio::test]
async fn a_device_event_is_kept_as_an_event() {
    let node = Node::start(config()).await;
    thermo(&node).await;
    let join = NewUplink {
        format: UplinkFormat::ChirpStack,
        event: Some("join".into()),
        device_type: None,
        body: serde_json::to_vec(&json!({"deviceInfo": {"devEui": "0102"},
                                         "time": "2026-03-01T10:00:00Z"}))
        .unwrap(),
        ..encoded("thermo", "", "", &[])
    };
    send(&node, join).await;
    send(&node, encoded("thermo", "t1", "u-1", &[21])).await;
    stored_unit(&*node.store, "u-1").await;
    let events = node.store.device_events("0102", None, 10).await.unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].event, "join");
    assert_eq!(events[0].time, Some(1_772_359_200_000));
    assert_eq!(stored_ids(&*node.store).await, ["u-1"]);
    assert!(failures(&*node.store).await.is_empty());
    node.stop().await;
}

/// The decode dry run runs a sample through a type's codec and answers
/// the units it makes, or the failure with the codec's own words,
/// storing nothing; a candidate type decodes instead of the saved one.
#[tokio::test]
async fn a_dry_run_decodes_without_storing() {
    let node = Node::start(config()).await;
    thermo(&node).await;
    let ingest = &node.services.ingest;
    let produced = ingest
        .dry_run("thermo", Some("lab".into()), &json!({"bytes": [21]}), None)
        .await
        .expect("decoded");
    assert_eq!(produced.units.len(), 1);
    assert_eq!(
        produced.units[0].measures["temperature"],
        json!({"celsius": 21})
    );
    assert_eq!(produced.units[0].channel, "lab");

    let (failed, _) = ingest
        .dry_run("thermo", None, &json!({"bytes": [255]}), None)
        .await
        .unwrap_err();
    assert_eq!(failed.reason, FailureReason::DecodeError);
    assert!(failed.description.contains("sensor fault"), "{failed:?}");

    let def: DeviceType = serde_json::from_value(json!({"decoder": {"script":
        "function decodeUplink(input) { return { data: { kelvin: input.bytes[0] + 273 } }; }"}}))
    .unwrap();
    let candidate = std::sync::Arc::new(
        node.services
            .catalog
            .candidate("thermo", def)
            .await
            .unwrap(),
    );
    let produced = ingest
        .dry_run("thermo", None, &json!({"bytes": [21]}), Some(&candidate))
        .await
        .expect("decoded");
    assert_eq!(produced.units[0].measures["kelvin"], 294);

    assert!(stored_ids(&*node.store).await.is_empty());
    assert!(failures(&*node.store).await.is_empty());
    assert_eq!(*node.store.committed_seq().borrow(), 0, "nothing logged");
    node.stop().await;
}
