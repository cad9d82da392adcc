//! The NGSI write in process: the services on a temporary SQLite store
//! and the in-process bus, writes made as the NGSI surface makes them.

use serde_json::{json, Value};
use weft_model::ngsi::{parse_attrs, parse_entity};
use weft_model::{Device, DeviceType};

use super::*;
use crate::context::Tenancy;
use crate::testkit::{self, Node};

fn target(id: &str, entity_type: Option<&str>) -> Target {
    Target {
        tenancy: Tenancy::default(),
        path: "/".into(),
        id: id.into(),
        entity_type: entity_type.map(str::to_string),
    }
}

fn entity(v: Value) -> Entity {
    parse_entity(&v, false).unwrap()
}

fn attrs(v: Value) -> AttrMap {
    parse_attrs(&v, false).unwrap()
}

fn item(v: Value) -> BatchItem {
    let names = v
        .as_object()
        .unwrap()
        .keys()
        .filter(|k| *k != "id" && *k != "type")
        .cloned()
        .collect();
    BatchItem {
        typed: v.get("type").is_some(),
        entity: entity(v),
        names,
    }
}

/// The value of `attr` on entity `id` (None: no such attribute).
fn value_of(run: &Node, id: &str, attr: &str) -> Option<Value> {
    let found = run.services.context.get("", &[], id, None).unwrap();
    found.entity.attrs.get(attr).map(|a| a.value.clone())
}

async fn write(run: &Node, target: &Target, w: Write) -> Result<Written, NgsiError> {
    run.services
        .ngsi_writer
        .write(target, w, UpdateOptions::default())
        .await
}

/// A device `door1` whose type `bell` takes the command `ring`, and its
/// entity.
async fn bell(run: &Node) {
    let catalog = &run.services.catalog;
    let def = DeviceType {
        commands: vec!["ring".into()],
        ..DeviceType::default()
    };
    catalog.put_device_type("bell", def).await.unwrap();
    catalog
        .put_device(Device {
            id: "door1".into(),
            device_type: "bell".into(),
            channel: "default".into(),
            ..Device::default()
        })
        .await
        .unwrap();
    let door = entity(json!({"id": "door1", "type": "bell", "temperature": {"value": 20}}));
    write(run, &target("door1", Some("bell")), Write::Create(door))
        .await
        .unwrap();
}

/// Every path that writes attributes of an existing entity takes a
/// command out of the write and queues it as a downlink, as the IoT
/// Agent does: append, update, one attribute, one value, upsert and the
/// batch actions doing these. A replace of all attributes is no command.
#[tokio::test]
async fn commands_are_taken_on_every_path_that_writes_them() {
    let run = Node::start(testkit::config()).await;
    bell(&run).await;
    let door = target("door1", None);
    let ring = || attrs(json!({"ring": {"value": "once"}}));
    let writes: Vec<(&str, Write)> = vec![
        ("append", Write::Append(ring())),
        (
            "update",
            Write::Update(attrs(
                json!({"ring": {"value": 2}, "temperature": {"value": 21}}),
            )),
        ),
        (
            "one attribute",
            Write::UpdateAttr {
                name: "ring".into(),
                attr: ring().get("ring").unwrap().clone(),
            },
        ),
        (
            "one value",
            Write::SetValue {
                name: "ring".into(),
                value: json!("twice"),
            },
        ),
        (
            "upsert",
            Write::Upsert(entity(
                json!({"id": "door1", "type": "bell", "ring": {"value": 3}}),
            )),
        ),
    ];
    let mut queued = 0;
    for (path, w) in writes {
        write(&run, &door, w).await.unwrap();
        queued += 1;
        assert_eq!(
            value_of(&run, "door1", "ring"),
            None,
            "{path}: kept as a value"
        );
        assert_eq!(
            value_of(&run, "door1", "ring_status"),
            Some(json!("PENDING")),
            "{path}"
        );
        let list = run.services.downlinks.list("door1").await.unwrap();
        assert_eq!(list.len(), queued, "{path}: no downlink queued");
    }
    for action in [BatchAction::Update, BatchAction::Append] {
        run.services
            .ngsi_writer
            .batch(
                &Tenancy::default(),
                "/",
                action,
                vec![item(json!({"id": "door1", "ring": {"value": "batch"}}))],
                UpdateOptions::default(),
            )
            .await
            .unwrap();
        queued += 1;
        assert_eq!(value_of(&run, "door1", "ring"), None, "{action:?}");
        let list = run.services.downlinks.list("door1").await.unwrap();
        assert_eq!(list.len(), queued, "{action:?}: no downlink queued");
    }
    assert_eq!(value_of(&run, "door1", "temperature"), Some(json!(21)));
    write(&run, &door, Write::Replace(ring())).await.unwrap();
    assert_eq!(value_of(&run, "door1", "ring"), Some(json!("once")));
    let list = run.services.downlinks.list("door1").await.unwrap();
    assert_eq!(list.len(), queued, "a replace queued a command");
}

/// A write carrying only commands needs the entity: 404 without it,
/// and nothing is queued.
#[tokio::test]
async fn commands_alone_need_the_entity() {
    let run = Node::start(testkit::config()).await;
    bell(&run).await;
    write(&run, &target("door1", None), Write::Delete)
        .await
        .unwrap();
    let ring = attrs(json!({"ring": {"value": 1}}));
    let err = write(&run, &target("door1", None), Write::Update(ring))
        .await
        .unwrap_err();
    assert_eq!(err, NgsiError::entity_not_found());
    assert!(run
        .services
        .downlinks
        .list("door1")
        .await
        .unwrap()
        .is_empty());
}

/// Update operators resolve against the current value on the update
/// paths and against nothing on a creation.
#[tokio::test]
async fn operators_resolve_against_the_current_value() {
    let run = Node::start(testkit::config()).await;
    let counter = || target("C", Some("T"));
    let created = entity(json!({"id": "C", "type": "T", "n": {"value": {"$inc": 2}}}));
    write(&run, &counter(), Write::Create(created))
        .await
        .unwrap();
    assert_eq!(value_of(&run, "C", "n"), Some(json!(2)));
    let inc = |by: i64| attrs(json!({"n": {"value": {"$inc": by}}}));
    write(&run, &counter(), Write::Update(inc(3)))
        .await
        .unwrap();
    assert_eq!(value_of(&run, "C", "n"), Some(json!(5)));
    write(&run, &counter(), Write::Append(inc(1)))
        .await
        .unwrap();
    assert_eq!(value_of(&run, "C", "n"), Some(json!(6)));
    let by_value = Write::SetValue {
        name: "n".into(),
        value: json!({"$inc": 4}),
    };
    write(&run, &counter(), by_value).await.unwrap();
    assert_eq!(value_of(&run, "C", "n"), Some(json!(10)));
    let upsert = entity(json!({"id": "C", "type": "T", "n": {"value": {"$inc": 1}}}));
    let written = write(&run, &counter(), Write::Upsert(upsert))
        .await
        .unwrap();
    assert!(!written.created);
    assert_eq!(value_of(&run, "C", "n"), Some(json!(11)));
    // Stored before the write returned.
    let stored = run.store.load_entities().await.unwrap();
    let c = stored.iter().find(|r| r.id == "C").unwrap();
    let c = Entity::from_storage(&c.json).unwrap();
    assert_eq!(c.attrs.get("n").unwrap().value, json!(11));
}

/// An upsert creates the entity when there is none, and merges into it
/// otherwise; under deletes running at the same time it never answers
/// 404 or 422 (the lookup and the write are one step).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upserts_never_lose_to_a_concurrent_delete() {
    let run = Node::start(testkit::config()).await;
    let writer = run.services.ngsi_writer.clone();
    let upsert = || Write::Upsert(entity(json!({"id": "U", "type": "T", "a": {"value": 1}})));
    let first = write(&run, &target("U", Some("T")), upsert())
        .await
        .unwrap();
    assert!(first.created);
    let again = write(&run, &target("U", Some("T")), upsert())
        .await
        .unwrap();
    assert!(!again.created);
    for round in 0..200 {
        let deleter = {
            let writer = writer.clone();
            tokio::spawn(async move {
                writer
                    .write(
                        &target("U", Some("T")),
                        Write::Delete,
                        UpdateOptions::default(),
                    )
                    .await
            })
        };
        let upserted = writer
            .write(&target("U", Some("T")), upsert(), UpdateOptions::default())
            .await;
        assert!(upserted.is_ok(), "round {round}: {upserted:?}");
        match deleter.await.unwrap() {
            Ok(_) => {}
            Err(e) => assert_eq!(e, NgsiError::entity_not_found(), "round {round}"),
        }
    }
}

/// A batch gathers what failed into Orion's one text: missing attributes
/// and missing entities, PartialUpdate when something was applied, 404
/// when no entity existed; appends create what is missing.
#[tokio::test]
async fn batches_report_what_failed_in_one_text() {
    let run = Node::start(testkit::config()).await;
    let writer = &run.services.ngsi_writer;
    let everywhere = Tenancy::default();
    let batch = |action, items: Vec<Value>| {
        writer.batch(
            &everywhere,
            "/",
            action,
            items.into_iter().map(item).collect(),
            UpdateOptions::default(),
        )
    };
    batch(
        BatchAction::Append,
        vec![json!({"id": "E1", "type": "T", "A": {"value": 1}})],
    )
    .await
    .unwrap();
    assert_eq!(value_of(&run, "E1", "A"), Some(json!(1)));
    let err = batch(
        BatchAction::Update,
        vec![
            json!({"id": "E1", "type": "T", "A": {"value": 2}, "B": {"value": 1}}),
            json!({"id": "E2", "type": "T", "A": {"value": 1}}),
        ],
    )
    .await
    .unwrap_err();
    assert_eq!(
        (err.error, err.description.as_str()),
        (
            "PartialUpdate",
            "do not exist: E1/T - [ B ], E2/T [entity itself]"
        )
    );
    assert_eq!(
        value_of(&run, "E1", "A"),
        Some(json!(2)),
        "the rest applied"
    );
    let err = batch(
        BatchAction::Delete,
        vec![json!({"id": "E3"}), json!({"id": "E4"})],
    )
    .await
    .unwrap_err();
    assert_eq!(
        (err.status, err.description.as_str()),
        (
            404,
            "do not exist: E3 - [entity itself], E4 [entity itself]"
        )
    );
    let err = batch(
        BatchAction::AppendStrict,
        vec![json!({"id": "E1", "type": "T", "A": {"value": 3}})],
    )
    .await
    .unwrap_err();
    assert_eq!(
        (err.error, err.description.as_str()),
        (
            "Unprocessable",
            "one or more of the attributes in the request already exist: E1/T - [ A ]"
        )
    );
    assert_eq!(value_of(&run, "E1", "A"), Some(json!(2)), "strict kept it");
}
