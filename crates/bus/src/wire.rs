//! How events and definition changes look on NATS, and how a receiving
//! node rebuilds them. Pure functions, no I/O: the NATS backend
//! ([`crate::nats`]) sends and receives what these make and read.
//!
//! # Subjects and streams
//!
//! Everything a cluster sends starts with its name (`[bus] cluster`,
//! `weft` by default), so several clusters can share one NATS:
//!
//! | what | subject | JetStream stream |
//! |---|---|---|
//! | events | `<cluster>.events.<data\|alarms\|entities>` | `<cluster>_events` |
//! | changed definitions | `<cluster>.definitions.<kind>` (`device-type`, `rule`, `api-key`, …) | `<cluster>_definitions` |
//!
//! # Messages
//!
//! An event's payload is exactly the JSON the event carries in this
//! process (what the live socket sends), so anything else listening on
//! NATS reads the same documents as a websocket client. Headers say what
//! the JSON leaves out:
//!
//! - `Weft-Wire`: the format's version ([`WIRE_VERSION`]); a message of
//!   another version is refused, so nodes of two incompatible versions
//!   miss each other's events loudly (counted, logged) instead of
//!   misreading them.
//! - `Weft-Node`: the node that published it, so that node skips its own
//!   events (it delivered them to its own subscribers already).
//! - `Weft-Entity-Dates` (entity events only): the entity's builtin
//!   `dateCreated`, `dateModified` and, for a transient entity,
//!   `dateExpires`, as epoch milliseconds separated by commas; the rest of
//!   the entity (id, type, attributes with their types and user metadata,
//!   tenant, service path, what changed) is in the JSON.
//!
//! A data unit and an alarm event rebuild exactly from their JSON. An
//! entity change rebuilds with everything the receiving side reads from
//! it (the live filters and bridges: tenant, service path, id, type,
//! attributes, the entity's builtin dates), but without the attributes'
//! builtin `dateCreated`/`dateModified` metadata, the attributes' previous
//! values and the request's origin: those feed NGSI notifications, which
//! the node that made the change sends.
//!
//! A definition change's payload is `{"tenant":…,"id":…}`; its kind is the
//! subject's last token.

use std::sync::Arc;

use async_nats::HeaderMap;
use bytes::Bytes;
use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use weft_model::ngsi::{
    Alteration, AttrChange, Attribute, ChangeKind, Entity, EntityChange, Metadata, OrderedMap,
};
use weft_model::{AlarmEvent, DataUnit};

use crate::definitions::{DefinitionChange, DefinitionKind};
use crate::{Event, Payload, Stream};

/// The version of this format, sent in [`VERSION_HEADER`].
pub const WIRE_VERSION: &str = "1";
/// Header naming the format's version.
pub const VERSION_HEADER: &str = "Weft-Wire";
/// Header naming the node that published a message.
pub const NODE_HEADER: &str = "Weft-Node";
/// Header carrying an entity's builtin dates (`created,modified[,expires]`).
pub const DATES_HEADER: &str = "Weft-Entity-Dates";

/// Longest cluster name: subjects and stream names stay short.
pub const MAX_CLUSTER_LEN: usize = 32;

/// Why a message could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireError(pub String);

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for WireError {}

fn bad(what: impl Into<String>) -> WireError {
    WireError(what.into())
}

/// The subjects and stream names of one cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subjects {
    cluster: String,
}

impl Subjects {
    /// The names of `cluster`, which must be 1 to [`MAX_CLUSTER_LEN`] of
    /// `[A-Za-z0-9_-]` (a NATS subject token and part of a stream name).
    pub fn new(cluster: &str) -> Result<Subjects, WireError> {
        let valid = !cluster.is_empty()
            && cluster.len() <= MAX_CLUSTER_LEN
            && cluster
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !valid {
            return Err(bad(format!(
                "bus.cluster '{cluster}' must be 1-{MAX_CLUSTER_LEN} of [A-Za-z0-9_-]"
            )));
        }
        Ok(Subjects {
            cluster: cluster.to_string(),
        })
    }

    /// The subject of `stream`'s events.
    pub fn event(&self, stream: Stream) -> String {
        format!("{}.events.{}", self.cluster, stream.as_str())
    }

    /// The subjects of every event (the events stream's filter).
    pub fn all_events(&self) -> String {
        format!("{}.events.*", self.cluster)
    }

    /// The subject of changes of `kind`.
    pub fn definition(&self, kind: DefinitionKind) -> String {
        format!("{}.definitions.{}", self.cluster, kind.as_str())
    }

    /// The subjects of every definition change.
    pub fn all_definitions(&self) -> String {
        format!("{}.definitions.*", self.cluster)
    }

    /// The JetStream stream holding the events.
    pub fn events_stream(&self) -> String {
        format!("{}_events", self.cluster)
    }

    /// The JetStream stream holding the definition changes.
    pub fn definitions_stream(&self) -> String {
        format!("{}_definitions", self.cluster)
    }

    /// The definition kind a subject carries, if it is one of ours.
    pub fn kind_of(&self, subject: &str) -> Option<DefinitionKind> {
        let rest = subject
            .strip_prefix(self.cluster.as_str())?
            .strip_prefix(".definitions.")?;
        DefinitionKind::parse(rest)
    }
}

/// A message ready to publish.
#[derive(Debug, Clone)]
pub struct Outgoing {
    /// Where it goes.
    pub subject: String,
    /// Its headers.
    pub headers: HeaderMap,
    /// Its payload.
    pub payload: Bytes,
}

fn headers(node: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(VERSION_HEADER, WIRE_VERSION);
    h.insert(NODE_HEADER, node);
    h
}

/// The node that published a message, as its headers say.
pub fn origin(headers: Option<&HeaderMap>) -> Option<&str> {
    headers?.get(NODE_HEADER).map(|v| v.as_str())
}

fn check_version(headers: Option<&HeaderMap>) -> Result<(), WireError> {
    match headers
        .and_then(|h| h.get(VERSION_HEADER))
        .map(|v| v.as_str())
    {
        Some(WIRE_VERSION) => Ok(()),
        Some(other) => Err(bad(format!(
            "wire version {other}, this node reads {WIRE_VERSION}"
        ))),
        None => Err(bad(format!("no {VERSION_HEADER} header"))),
    }
}

/// `event`, published by `node`, as a message on its stream's subject.
pub fn encode_event(subjects: &Subjects, node: &str, event: &Event) -> Outgoing {
    let mut h = headers(node);
    if let Payload::Entity(change) = &event.payload {
        let e = &change.entity;
        let dates = match e.date_expires {
            Some(x) => format!("{},{},{x}", e.date_created, e.date_modified),
            None => format!("{},{}", e.date_created, e.date_modified),
        };
        h.insert(DATES_HEADER, dates.as_str());
    }
    Outgoing {
        subject: subjects.event(event.stream),
        headers: h,
        payload: event.json.clone(),
    }
}

/// Rebuilds an event of `stream` from a message's headers and payload.
pub fn decode_event(
    stream: Stream,
    headers: Option<&HeaderMap>,
    payload: &Bytes,
) -> Result<Event, WireError> {
    check_version(headers)?;
    let payload_of = |what: &str, e: serde_json::Error| bad(format!("{what}: {e}"));
    let typed = match stream {
        Stream::Data => Payload::Data(Arc::new(
            serde_json::from_slice::<DataUnit>(payload).map_err(|e| payload_of("data unit", e))?,
        )),
        Stream::Alarms => Payload::Alarm(Arc::new(
            serde_json::from_slice::<AlarmEvent>(payload)
                .map_err(|e| payload_of("alarm event", e))?,
        )),
        Stream::Entities => {
            let dates = headers
                .and_then(|h| h.get(DATES_HEADER))
                .map(|v| v.as_str())
                .ok_or_else(|| bad(format!("an entity change without {DATES_HEADER}")))?;
            let wire: WireChange =
                serde_json::from_slice(payload).map_err(|e| payload_of("entity change", e))?;
            Payload::Entity(Arc::new(entity_change(wire, dates)?))
        }
    };
    Ok(Event {
        stream,
        payload: typed,
        json: payload.clone(),
    })
}

/// An entity change as its live JSON (`EntityChange::to_json`) carries
/// it, read straight into the parts the receiving node rebuilds: no tree
/// of `Value`s for the whole change, and each attribute's value moved
/// into its attribute rather than copied out of one. Every node reads
/// every other node's changes, so this is most of what replication costs
/// a node.
#[derive(Deserialize)]
struct WireChange {
    change: String,
    service: String,
    #[serde(rename = "servicePath")]
    service_path: String,
    id: String,
    #[serde(rename = "type")]
    entity_type: String,
    #[serde(default)]
    attrs: Vec<String>,
    entity: WireAttrs,
}

/// The attributes of the change's normalized entity, in its order (its
/// `id` and `type` skipped: the change carries them).
struct WireAttrs(Vec<(String, WireAttr)>);

impl<'de> Deserialize<'de> for WireAttrs {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Attrs;
        impl<'de> Visitor<'de> for Attrs {
            type Value = WireAttrs;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an entity object")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<WireAttrs, A::Error> {
                let mut attrs = Vec::with_capacity(map.size_hint().unwrap_or(8));
                while let Some(name) = map.next_key::<String>()? {
                    if name == "id" || name == "type" {
                        map.next_value::<IgnoredAny>()?;
                    } else {
                        attrs.push((name, map.next_value()?));
                    }
                }
                Ok(WireAttrs(attrs))
            }
        }
        deserializer.deserialize_map(Attrs)
    }
}

/// One attribute in its normalized rendering (`{"type","value","metadata"}`).
#[derive(Deserialize)]
struct WireAttr {
    #[serde(rename = "type")]
    attr_type: String,
    #[serde(default)]
    value: Value,
    #[serde(default)]
    metadata: OrderedMap<WireMetadata>,
}

/// One metadata item in its normalized rendering.
#[derive(Deserialize)]
struct WireMetadata {
    #[serde(rename = "type", default)]
    md_type: Option<String>,
    #[serde(default)]
    value: Value,
}

/// The entity change a [`WireChange`] and its dates header make.
fn entity_change(wire: WireChange, dates: &str) -> Result<EntityChange, WireError> {
    let alteration = match wire.change.as_str() {
        "created" => Alteration::Created,
        "updated" => Alteration::Updated,
        "deleted" => Alteration::Deleted,
        other => return Err(bad(format!("entity change: unknown change {other:?}"))),
    };
    let mut entity = Entity::new(wire.id, wire.entity_type);
    let mut parts = dates.split(',').map(|d| {
        d.trim().parse::<i64>().map_err(|_| {
            bad(format!(
                "{DATES_HEADER} '{dates}' is not epoch milliseconds"
            ))
        })
    });
    entity.date_created = parts.next().transpose()?.unwrap_or_default();
    entity.date_modified = parts.next().transpose()?.unwrap_or_default();
    entity.date_expires = parts.next().transpose()?;
    for (name, attr) in wire.entity.0 {
        let mut built = Attribute::new(attr.value, attr.attr_type);
        for (md_name, md) in attr.metadata {
            built.metadata.insert(
                md_name,
                Metadata {
                    value: md.value,
                    md_type: md.md_type.unwrap_or_default(),
                },
            );
        }
        entity.attrs.insert(name, built);
    }
    let kind = match alteration {
        Alteration::Created => ChangeKind::Created,
        Alteration::Updated => ChangeKind::Updated,
        Alteration::Deleted => ChangeKind::Deleted,
    };
    let attrs = wire
        .attrs
        .into_iter()
        .map(|name| AttrChange {
            name,
            kind,
            previous: None,
            modified: true,
        })
        .collect();
    Ok(EntityChange {
        tenant: wire.service,
        service_path: wire.service_path,
        entity,
        alteration,
        attrs,
        origin: None,
    })
}

/// `change`, made by `node`, as a message on its kind's subject.
pub fn encode_definition(subjects: &Subjects, node: &str, change: &DefinitionChange) -> Outgoing {
    let body = json!({"tenant": change.tenant, "id": change.id});
    Outgoing {
        subject: subjects.definition(change.kind),
        headers: headers(node),
        payload: Bytes::from(body.to_string()),
    }
}

/// Rebuilds a definition change of `kind` from a message.
pub fn decode_definition(
    kind: DefinitionKind,
    headers: Option<&HeaderMap>,
    payload: &[u8],
) -> Result<DefinitionChange, WireError> {
    check_version(headers)?;
    let body: Map<String, Value> =
        serde_json::from_slice(payload).map_err(|e| bad(format!("definition change: {e}")))?;
    let field = |key: &str| {
        body.get(key)
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| bad(format!("definition change: no '{key}'")))
    };
    Ok(DefinitionChange {
        kind,
        tenant: field("tenant")?,
        id: field("id")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_model::ngsi::EntityChange;

    fn subjects() -> Subjects {
        Subjects::new("weft").unwrap()
    }

    fn unit() -> DataUnit {
        serde_json::from_value(json!({
            "dataId": "u-1", "reportedAt": 1700000000123i64, "receivedAt": 1700000000456i64,
            "channel": "irrigation",
            "device": {"id": "dev-1", "name": "P00010", "type": "em300th"},
            "measures": {"temperature": {"celsius": 30.8}}
        }))
        .unwrap()
    }

    fn event(stream: Stream, payload: Payload, json: Vec<u8>) -> Event {
        Event {
            stream,
            payload,
            json: Bytes::from(json),
        }
    }

    /// What a live client of the receiving node is sent must be, byte for
    /// byte, what the publishing node's clients are sent.
    #[test]
    fn a_data_unit_crosses_unchanged() {
        let u = unit();
        let json = serde_json::to_vec(&u).unwrap();
        let sent = encode_event(
            &subjects(),
            "node-a",
            &event(
                Stream::Data,
                Payload::Data(Arc::new(u.clone())),
                json.clone(),
            ),
        );
        assert_eq!(sent.subject, "weft.events.data");
        assert_eq!(origin(Some(&sent.headers)), Some("node-a"));
        assert_eq!(&sent.payload[..], &json[..]);
        let got = decode_event(Stream::Data, Some(&sent.headers), &sent.payload).unwrap();
        assert!(matches!(&got.payload, Payload::Data(d) if **d == u));
        assert_eq!(&got.json[..], &json[..]);
    }

    #[test]
    fn an_alarm_event_crosses_unchanged() {
        let alarm: AlarmEvent = serde_json::from_value(json!({
            "eventId": "a1-2", "change": "raised", "id": "a1", "version": 2,
            "type": "overheat", "category": "env", "subCategory": "heat",
            "severity": "critical", "state": "active", "acked": false,
            "device": {"id": "dev-1", "name": "P1"}, "rule": "hot", "description": "hot",
            "dataIds": ["u-1"], "raisedAt": 1, "updatedAt": 2, "clearedAt": null, "count": 1
        }))
        .unwrap();
        let json = serde_json::to_vec(&alarm).unwrap();
        let sent = encode_event(
            &subjects(),
            "n",
            &event(
                Stream::Alarms,
                Payload::Alarm(Arc::new(alarm.clone())),
                json.clone(),
            ),
        );
        assert_eq!(sent.subject, "weft.events.alarms");
        let got = decode_event(Stream::Alarms, Some(&sent.headers), &sent.payload).unwrap();
        assert!(matches!(&got.payload, Payload::Alarm(a) if **a == alarm));
    }

    fn change() -> EntityChange {
        let mut entity = Entity::new("Room1", "Room");
        let mut temp = Attribute::new(json!(21.5), "Number");
        temp.metadata.insert(
            "unit",
            Metadata {
                value: json!("celsius"),
                md_type: "Text".into(),
            },
        );
        // In name order: the change travels rendered, and rendering sorts
        // attributes by name (as Orion does), so that is the order the
        // receiving node rebuilds them in.
        entity.attrs.insert(
            "location",
            Attribute::new(json!({"type": "Point", "coordinates": [1, 2]}), "geo:json"),
        );
        entity.attrs.insert("temperature", temp);
        entity.date_created = 1_700_000_000_000;
        entity.date_modified = 1_700_000_000_500;
        entity.date_expires = Some(1_800_000_000_000);
        EntityChange {
            tenant: "smart".into(),
            service_path: "/b1".into(),
            entity,
            alteration: Alteration::Updated,
            attrs: vec![AttrChange {
                name: "temperature".into(),
                kind: ChangeKind::Updated,
                previous: None,
                modified: true,
            }],
            origin: None,
        }
    }

    /// The receiving node filters remote entity changes as local ones:
    /// tenant, path, id, type, attributes and builtin dates must survive.
    #[test]
    fn an_entity_change_rebuilds_what_filters_read() {
        let c = change();
        let json = c.to_json().to_string().into_bytes();
        let sent = encode_event(
            &subjects(),
            "n",
            &event(
                Stream::Entities,
                Payload::Entity(Arc::new(c.clone())),
                json.clone(),
            ),
        );
        assert_eq!(
            sent.headers.get(DATES_HEADER).map(|v| v.as_str()),
            Some("1700000000000,1700000000500,1800000000000")
        );
        let got = decode_event(Stream::Entities, Some(&sent.headers), &sent.payload).unwrap();
        let Payload::Entity(r) = &got.payload else {
            panic!("an entity change")
        };
        assert_eq!(r.tenant, "smart");
        assert_eq!(r.service_path, "/b1");
        assert_eq!(r.alteration, Alteration::Updated);
        assert_eq!(r.entity, c.entity, "attributes, metadata and dates");
        assert_eq!(r.attrs.len(), 1);
        assert_eq!(r.attrs[0].name, "temperature");
        assert_eq!(&got.json[..], &json[..], "the JSON is forwarded as it came");
        // A change without an expiry date carries two dates.
        let mut plain = c;
        plain.entity.date_expires = None;
        let sent = encode_event(
            &subjects(),
            "n",
            &event(
                Stream::Entities,
                Payload::Entity(Arc::new(plain.clone())),
                plain.to_json().to_string().into_bytes(),
            ),
        );
        let got = decode_event(Stream::Entities, Some(&sent.headers), &sent.payload).unwrap();
        assert!(matches!(&got.payload, Payload::Entity(r) if r.entity.date_expires.is_none()));
    }

    #[test]
    fn unreadable_messages_are_refused_not_guessed() {
        let u = unit();
        let json = Bytes::from(serde_json::to_vec(&u).unwrap());
        let mut h = headers("n");
        assert!(decode_event(Stream::Data, Some(&h), &Bytes::from_static(b"{")).is_err());
        assert!(
            decode_event(Stream::Data, None, &json).is_err(),
            "no version"
        );
        h.insert(VERSION_HEADER, "2");
        let err = decode_event(Stream::Data, Some(&h), &json).unwrap_err();
        assert!(err.0.contains("wire version 2"), "{err}");
        let h = headers("n");
        let entity = Bytes::from(change().to_json().to_string());
        assert!(
            decode_event(Stream::Entities, Some(&h), &entity).is_err(),
            "an entity change needs its dates"
        );
        let mut h = headers("n");
        h.insert(DATES_HEADER, "1,2");
        let with = |edit: fn(&mut Value)| {
            let mut json = change().to_json();
            edit(&mut json);
            Bytes::from(json.to_string())
        };
        for (bad, why) in [
            (
                with(|j| j["change"] = json!("renamed")),
                "an unknown change",
            ),
            (
                with(|j| {
                    j["entity"]["temperature"]["type"].take();
                }),
                "an attribute without a type",
            ),
            (
                with(|j| j["entity"] = json!([])),
                "an entity that is not an object",
            ),
            (
                with(|j| {
                    j["service"].take();
                }),
                "no tenant",
            ),
        ] {
            assert!(
                decode_event(Stream::Entities, Some(&h), &bad).is_err(),
                "{why}"
            );
        }
        // What the JSON may add or leave out is read as the sender meant.
        let lenient = with(|j| {
            j["notifiedBy"] = json!("someone");
            j["entity"]["temperature"]["metadata"]["unit"]["type"].take();
        });
        let got = decode_event(Stream::Entities, Some(&h), &lenient).unwrap();
        let Payload::Entity(r) = &got.payload else {
            panic!("an entity change")
        };
        let unit = r
            .entity
            .attrs
            .get("temperature")
            .unwrap()
            .metadata
            .get("unit");
        assert_eq!(unit.map(|m| m.md_type.as_str()), Some(""));
    }

    #[test]
    fn definition_changes_cross_with_their_kind_and_tenant() {
        let s = subjects();
        let change = DefinitionChange::in_tenant(DefinitionKind::Subscription, "smart", "abc");
        let sent = encode_definition(&s, "node-b", &change);
        assert_eq!(sent.subject, "weft.definitions.subscription");
        assert_eq!(origin(Some(&sent.headers)), Some("node-b"));
        let kind = s.kind_of(&sent.subject).unwrap();
        let got = decode_definition(kind, Some(&sent.headers), &sent.payload).unwrap();
        assert_eq!(got, change);
        assert_eq!(
            s.kind_of("other.definitions.rule"),
            None,
            "another cluster's"
        );
        assert_eq!(s.kind_of("weft.definitions.nope"), None);
        assert!(decode_definition(kind, Some(&sent.headers), b"{\"id\":\"x\"}").is_err());
    }

    #[test]
    fn cluster_names_keep_subjects_and_stream_names_valid() {
        let s = Subjects::new("site-2_b").unwrap();
        assert_eq!(s.event(Stream::Entities), "site-2_b.events.entities");
        assert_eq!(s.all_events(), "site-2_b.events.*");
        assert_eq!(s.all_definitions(), "site-2_b.definitions.*");
        assert_eq!(s.events_stream(), "site-2_b_events");
        assert_eq!(s.definitions_stream(), "site-2_b_definitions");
        for bad in [
            "",
            "a.b",
            "a b",
            "a*",
            "a>",
            &"x".repeat(MAX_CLUSTER_LEN + 1),
        ] {
            assert!(Subjects::new(bad).is_err(), "'{bad}' refused");
        }
    }
}
