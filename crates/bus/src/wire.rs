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
//! An event message carries one or more events of one stream, in the
//! order they were published: their payloads are exactly the JSON each
//! event carries in this process (what the live socket sends), one
//! document per line, so anything else listening on NATS reads the same
//! documents as a websocket client. A node sends what its outbox holds
//! together (up to [`MAX_BATCH_EVENTS`] and about [`MAX_BATCH_BYTES`]):
//! under load most of what crossing a node costs is per message, on the
//! sender, on NATS and on every receiver. Headers say what the JSON
//! leaves out:
//!
//! - `Weft-Wire`: the format's version ([`WIRE_VERSION`]); a message of
//!   another version is refused, so nodes of two incompatible versions
//!   miss each other's events loudly (counted, logged) instead of
//!   misreading them.
//! - `Weft-Node`: the node that published it, so that node skips its own
//!   events (it delivered them to its own subscribers already).
//! - `Weft-Entity-Dates` (entity events only): each entity's builtin
//!   `dateCreated`, `dateModified` and, for a transient entity,
//!   `dateExpires`, as epoch milliseconds separated by commas, one entity
//!   after another separated by `;`, in the documents' order; the rest of
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

use std::borrow::Cow;
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

/// The version of this format, sent in [`VERSION_HEADER`] (2: several
/// events to a message).
pub const WIRE_VERSION: &str = "2";
/// Header naming the format's version.
pub const VERSION_HEADER: &str = "Weft-Wire";
/// Header naming the node that published a message.
pub const NODE_HEADER: &str = "Weft-Node";
/// Header carrying each entity's builtin dates (`created,modified[,expires]`,
/// entities separated by `;`).
pub const DATES_HEADER: &str = "Weft-Entity-Dates";

/// Most events sent in one message.
pub const MAX_BATCH_EVENTS: usize = 512;

/// Once a message's documents reach this many bytes, no further event
/// joins it: well under NATS's default largest payload (1 MiB), so a
/// message of many events is never refused where each alone would pass.
pub const MAX_BATCH_BYTES: usize = 256 * 1024;

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

/// `events` of `stream`, published by `node`, in this order, as one
/// message on the stream's subject ([`batches`] says which go together).
pub fn encode_events(
    subjects: &Subjects,
    node: &str,
    stream: Stream,
    events: &[Event],
) -> Outgoing {
    debug_assert!(events.iter().all(|e| e.stream == stream));
    let mut h = headers(node);
    let mut dates = String::new();
    let mut payload = Vec::with_capacity(events.iter().map(|e| e.json.len() + 1).sum());
    for (i, event) in events.iter().enumerate() {
        if i > 0 {
            payload.push(b'\n');
            dates.push(';');
        }
        payload.extend_from_slice(&event.json);
        if let Payload::Entity(change) = &event.payload {
            use std::fmt::Write;
            let e = &change.entity;
            let _ = write!(dates, "{},{}", e.date_created, e.date_modified);
            if let Some(x) = e.date_expires {
                let _ = write!(dates, ",{x}");
            }
        }
    }
    if stream == Stream::Entities {
        h.insert(DATES_HEADER, dates.as_str());
    }
    Outgoing {
        subject: subjects.event(stream),
        headers: h,
        payload: Bytes::from(payload),
    }
}

/// How `events` (of one stream, in order) go out as messages: runs of at
/// most [`MAX_BATCH_EVENTS`], each closed once its documents reach
/// [`MAX_BATCH_BYTES`].
pub fn batches(events: &[Event]) -> impl Iterator<Item = &[Event]> {
    let mut rest = events;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut bytes = 0;
        let mut n = 0;
        while n < rest.len() && n < MAX_BATCH_EVENTS && bytes < MAX_BATCH_BYTES {
            bytes += rest[n].json.len() + 1;
            n += 1;
        }
        let (batch, after) = rest.split_at(n);
        rest = after;
        Some(batch)
    })
}

/// How many events a message's payload carries, counted without reading
/// them (a document per line: compact JSON has no raw line break).
pub fn events_in(payload: &[u8]) -> usize {
    if payload.is_empty() {
        return 0;
    }
    1 + payload.iter().filter(|&&b| b == b'\n').count()
}

/// Rebuilds the events of `stream` a message carries, in order, from its
/// headers and payload. A message one of whose events cannot be read is
/// refused whole: its sender is not a node of this version.
pub fn decode_events(
    stream: Stream,
    headers: Option<&HeaderMap>,
    payload: &Bytes,
) -> Result<Vec<Event>, WireError> {
    check_version(headers)?;
    let mut dates = match stream {
        Stream::Entities => Some(dates_header(headers)?.split(';')),
        Stream::Data | Stream::Alarms => None,
    };
    let mut events = Vec::new();
    let mut push = |payload: Payload, json: Bytes| {
        events.push(Event {
            stream,
            payload,
            json,
        })
    };
    match stream {
        Stream::Data => each_document(payload, "data unit", |unit: DataUnit, json| {
            push(Payload::Data(Arc::new(unit)), json);
            Ok(())
        })?,
        Stream::Alarms => each_document(payload, "alarm event", |alarm: AlarmEvent, json| {
            push(Payload::Alarm(Arc::new(alarm)), json);
            Ok(())
        })?,
        Stream::Entities => each_document(payload, "entity change", |wire: WireChange, json| {
            let dates = dates
                .as_mut()
                .and_then(Iterator::next)
                .ok_or_else(|| bad(format!("fewer {DATES_HEADER} than entity changes")))?;
            push(Payload::Entity(Arc::new(entity_change(wire, dates)?)), json);
            Ok(())
        })?,
    }
    if events.is_empty() {
        return Err(bad("a message without an event"));
    }
    if dates.is_some_and(|mut rest| rest.next().is_some()) {
        return Err(bad(format!("more {DATES_HEADER} than entity changes")));
    }
    Ok(events)
}

/// An entity message's [`DATES_HEADER`].
fn dates_header(headers: Option<&HeaderMap>) -> Result<&str, WireError> {
    headers
        .and_then(|h| h.get(DATES_HEADER))
        .map(|v| v.as_str())
        .ok_or_else(|| bad(format!("an entity change without {DATES_HEADER}")))
}

/// Another node's entity change as it arrived: which entity it changes,
/// how and when, read at once; the rest (the entity's attributes) kept as
/// it came and read only when this node needs the entity
/// ([`RemoteEntityChange::read`]). Every node receives every other node's
/// changes, and most of them are overtaken by the next change of the same
/// entity before anyone here reads it: reading a change whole costs
/// several times what reading which entity it is costs.
#[derive(Debug, Clone)]
pub struct RemoteEntityChange {
    /// The tenant (`Fiware-Service`) of the entity.
    pub tenant: String,
    /// The entity's service path.
    pub service_path: String,
    /// The entity's id.
    pub id: String,
    /// The entity's type.
    pub entity_type: String,
    /// Created, updated or deleted.
    pub alteration: Alteration,
    /// The entity's `dateModified` after the change (epoch ms): of two
    /// changes of one entity, the later wins.
    pub date_modified: i64,
    /// The change's live JSON, a copy of its line of the message (so a
    /// change kept does not keep the whole message).
    document: Bytes,
    /// Its entry of [`DATES_HEADER`].
    dates: Box<str>,
}

impl RemoteEntityChange {
    /// The whole change, read from what arrived.
    pub fn read(&self) -> Result<EntityChange, WireError> {
        let wire: WireChange = serde_json::from_slice(&self.document)
            .map_err(|e| bad(format!("entity change: {e}")))?;
        entity_change(wire, &self.dates)
    }
}

/// What [`read_entity_changes`] reads of a change at once; serde skips
/// the rest of the document without building anything from it.
#[derive(Deserialize)]
struct WireHead<'a> {
    #[serde(borrow)]
    change: Cow<'a, str>,
    #[serde(borrow)]
    service: Cow<'a, str>,
    #[serde(borrow, rename = "servicePath")]
    service_path: Cow<'a, str>,
    #[serde(borrow)]
    id: Cow<'a, str>,
    #[serde(borrow, rename = "type")]
    entity_type: Cow<'a, str>,
}

/// The entity changes a message carries, in order, each read only as far
/// as [`RemoteEntityChange`] says. A message one of whose changes cannot
/// be read that far is refused whole, as by [`decode_events`].
pub fn read_entity_changes(
    headers: Option<&HeaderMap>,
    payload: &Bytes,
) -> Result<Vec<RemoteEntityChange>, WireError> {
    check_version(headers)?;
    let mut dates = dates_header(headers)?.split(';');
    let mut changes = Vec::new();
    each_document(payload, "entity change", |head: WireHead<'_>, json| {
        let these = dates
            .next()
            .ok_or_else(|| bad(format!("fewer {DATES_HEADER} than entity changes")))?;
        let (_, date_modified, _) = entity_dates(these)?;
        changes.push(RemoteEntityChange {
            tenant: head.service.into_owned(),
            service_path: head.service_path.into_owned(),
            id: head.id.into_owned(),
            entity_type: head.entity_type.into_owned(),
            alteration: alteration_of(&head.change)?,
            date_modified,
            document: Bytes::copy_from_slice(&json),
            dates: these.into(),
        });
        Ok(())
    })?;
    if changes.is_empty() {
        return Err(bad("a message without an event"));
    }
    if dates.next().is_some() {
        return Err(bad(format!("more {DATES_HEADER} than entity changes")));
    }
    Ok(changes)
}

/// Reads the JSON documents of `payload` one after another as `T`s,
/// handing each to `take` with its own bytes (a slice of `payload`, no
/// copy).
fn each_document<'a, T: Deserialize<'a>>(
    payload: &'a Bytes,
    what: &str,
    mut take: impl FnMut(T, Bytes) -> Result<(), WireError>,
) -> Result<(), WireError> {
    let mut documents = serde_json::Deserializer::from_slice(payload).into_iter::<T>();
    loop {
        let start = documents.byte_offset();
        let document = match documents.next() {
            None => return Ok(()),
            Some(document) => document.map_err(|e| bad(format!("{what}: {e}")))?,
        };
        let end = documents.byte_offset();
        let separator = payload[start..end]
            .iter()
            .take_while(|b| b.is_ascii_whitespace())
            .count();
        take(document, payload.slice(start + separator..end))?;
    }
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

/// What a change's `change` field names.
fn alteration_of(change: &str) -> Result<Alteration, WireError> {
    match change {
        "created" => Ok(Alteration::Created),
        "updated" => Ok(Alteration::Updated),
        "deleted" => Ok(Alteration::Deleted),
        other => Err(bad(format!("entity change: unknown change {other:?}"))),
    }
}

/// One entity's `created,modified[,expires]` from [`DATES_HEADER`].
fn entity_dates(dates: &str) -> Result<(i64, i64, Option<i64>), WireError> {
    let mut parts = dates.split(',').map(|d| {
        d.trim().parse::<i64>().map_err(|_| {
            bad(format!(
                "{DATES_HEADER} '{dates}' is not epoch milliseconds"
            ))
        })
    });
    let created = parts.next().transpose()?.unwrap_or_default();
    let modified = parts.next().transpose()?.unwrap_or_default();
    Ok((created, modified, parts.next().transpose()?))
}

/// The entity change a [`WireChange`] and its dates header make.
fn entity_change(wire: WireChange, dates: &str) -> Result<EntityChange, WireError> {
    let alteration = alteration_of(&wire.change)?;
    let mut entity = Entity::new(wire.id, wire.entity_type);
    let (created, modified, expires) = entity_dates(dates)?;
    entity.date_created = created;
    entity.date_modified = modified;
    entity.date_expires = expires;
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
        entity: std::sync::Arc::new(entity),
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

    /// A message of `event` alone.
    fn encode_event(subjects: &Subjects, node: &str, event: &Event) -> Outgoing {
        encode_events(subjects, node, event.stream, std::slice::from_ref(event))
    }

    /// The one event a message carries.
    fn decode_event(
        stream: Stream,
        headers: Option<&HeaderMap>,
        payload: &Bytes,
    ) -> Result<Event, WireError> {
        let mut events = decode_events(stream, headers, payload)?;
        assert_eq!(events.len(), 1, "one event");
        Ok(events.remove(0))
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
            entity: entity.into(),
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
        Arc::make_mut(&mut plain.entity).date_expires = None;
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

    fn entity_event(change: EntityChange) -> Event {
        let json = change.to_json().to_string().into_bytes();
        event(Stream::Entities, Payload::Entity(Arc::new(change)), json)
    }

    /// Events sent together arrive as they were published, one by one,
    /// each with its own dates and its own JSON.
    #[test]
    fn events_sent_together_arrive_in_order_each_whole() {
        let changes: Vec<EntityChange> = (0..5)
            .map(|i| {
                let mut c = change();
                Arc::make_mut(&mut c.entity).id = format!("Room{i}");
                Arc::make_mut(&mut c.entity).date_modified += i;
                // Every other one transient, one deleted.
                if i % 2 == 1 {
                    Arc::make_mut(&mut c.entity).date_expires = None;
                }
                if i == 3 {
                    c.alteration = Alteration::Deleted;
                    c.attrs[0].kind = ChangeKind::Deleted;
                }
                c
            })
            .collect();
        let events: Vec<Event> = changes.iter().cloned().map(entity_event).collect();
        let sent = encode_events(&subjects(), "n", Stream::Entities, &events);
        assert_eq!(sent.subject, "weft.events.entities");
        let got = decode_events(Stream::Entities, Some(&sent.headers), &sent.payload).unwrap();
        assert_eq!(got.len(), changes.len());
        for ((got, sent), change) in got.iter().zip(&events).zip(&changes) {
            let Payload::Entity(r) = &got.payload else {
                panic!("an entity change")
            };
            assert_eq!(r.entity, change.entity, "attributes and dates");
            assert_eq!(r.alteration, change.alteration);
            assert_eq!(&got.json[..], &sent.json[..], "its own JSON, as it came");
        }
        // Data units too; and a message of many is read line by line.
        let units: Vec<Event> = (0..3)
            .map(|i| {
                let mut u = unit();
                u.data_id = format!("u-{i}");
                let json = serde_json::to_vec(&u).unwrap();
                event(Stream::Data, Payload::Data(Arc::new(u)), json)
            })
            .collect();
        let sent = encode_events(&subjects(), "n", Stream::Data, &units);
        assert_eq!(events_in(&sent.payload), 3, "counted without reading them");
        let got = decode_events(Stream::Data, Some(&sent.headers), &sent.payload).unwrap();
        let ids: Vec<&str> = got
            .iter()
            .map(|e| match &e.payload {
                Payload::Data(u) => u.data_id.as_str(),
                _ => panic!("a data unit"),
            })
            .collect();
        assert_eq!(ids, ["u-0", "u-1", "u-2"]);
        // Dates that do not match the changes refuse the message whole.
        for dates in ["1,2", "1,2;1,2;1,2;1,2;1,2;1,2"] {
            let mut h = sent_headers(&events);
            h.insert(DATES_HEADER, dates);
            let payload = encode_events(&subjects(), "n", Stream::Entities, &events).payload;
            assert!(
                decode_events(Stream::Entities, Some(&h), &payload).is_err(),
                "{dates}"
            );
        }
        assert!(
            decode_events(Stream::Data, Some(&headers("n")), &Bytes::new()).is_err(),
            "a message without an event"
        );
        assert_eq!(events_in(b""), 0);
    }

    /// Read as far as which entity it changes, a change says exactly
    /// what its sender's did (ids that need escaping in JSON too), and
    /// read whole later it is what [`decode_events`] makes of it.
    #[test]
    fn entity_changes_read_as_far_as_their_entity_then_whole() {
        let changes: Vec<EntityChange> = ["Room1", "Ro\"om\\2", "Zimmer\u{e9}3"]
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let mut c = change();
                Arc::make_mut(&mut c.entity).id = id.to_string();
                c.tenant = format!("t{i}");
                c.service_path = format!("/b{i}");
                Arc::make_mut(&mut c.entity).date_modified += i as i64;
                if i == 1 {
                    c.alteration = Alteration::Deleted;
                    Arc::make_mut(&mut c.entity).date_expires = None;
                }
                c
            })
            .collect();
        let events: Vec<Event> = changes.iter().cloned().map(entity_event).collect();
        let sent = encode_events(&subjects(), "n", Stream::Entities, &events);
        let heads = read_entity_changes(Some(&sent.headers), &sent.payload).unwrap();
        let whole = decode_events(Stream::Entities, Some(&sent.headers), &sent.payload).unwrap();
        assert_eq!(heads.len(), changes.len());
        for ((head, change), whole) in heads.iter().zip(&changes).zip(&whole) {
            assert_eq!(head.tenant, change.tenant);
            assert_eq!(head.service_path, change.service_path);
            assert_eq!(head.id, change.entity.id);
            assert_eq!(head.entity_type, change.entity.entity_type);
            assert_eq!(head.alteration, change.alteration);
            assert_eq!(head.date_modified, change.entity.date_modified);
            let read = head.read().unwrap();
            let Payload::Entity(decoded) = &whole.payload else {
                panic!("an entity change")
            };
            assert_eq!(read.entity, decoded.entity, "attributes and dates");
            assert_eq!(read.entity, change.entity);
            assert_eq!(read.alteration, decoded.alteration);
            assert_eq!(read.tenant, decoded.tenant);
        }
        // What refuses a message decoded whole refuses it read this far.
        let mut h = sent.headers.clone();
        h.insert(DATES_HEADER, "1,2;1,2");
        assert!(
            read_entity_changes(Some(&h), &sent.payload).is_err(),
            "too few dates"
        );
        assert!(
            read_entity_changes(Some(&headers("n")), &sent.payload).is_err(),
            "no dates"
        );
        let mut h = headers("n");
        h.insert(DATES_HEADER, "1,2");
        for (bad, why) in [
            (json!({"change": "renamed"}), "an unknown change"),
            (json!({"id": null}), "no id"),
        ] {
            let mut json = change().to_json();
            for (k, v) in bad.as_object().unwrap() {
                json[k] = v.clone();
            }
            let payload = Bytes::from(json.to_string());
            assert!(read_entity_changes(Some(&h), &payload).is_err(), "{why}");
        }
    }

    fn sent_headers(events: &[Event]) -> HeaderMap {
        encode_events(&subjects(), "n", Stream::Entities, events).headers
    }

    /// A message closes at [`MAX_BATCH_EVENTS`] events or once it reaches
    /// [`MAX_BATCH_BYTES`]; none is empty and all are sent, in order.
    #[test]
    fn batches_are_bounded_in_count_and_bytes() {
        let small = |i: usize| {
            event(
                Stream::Data,
                Payload::Data(Arc::new(unit())),
                vec![b'x'; i % 7 + 1],
            )
        };
        let many: Vec<Event> = (0..MAX_BATCH_EVENTS * 2 + 3).map(small).collect();
        let sizes: Vec<usize> = batches(&many).map(<[Event]>::len).collect();
        assert_eq!(sizes, [MAX_BATCH_EVENTS, MAX_BATCH_EVENTS, 3]);
        let big = |_| {
            event(
                Stream::Data,
                Payload::Data(Arc::new(unit())),
                vec![b'x'; MAX_BATCH_BYTES / 3],
            )
        };
        let large: Vec<Event> = (0..7).map(big).collect();
        let sizes: Vec<usize> = batches(&large).map(<[Event]>::len).collect();
        assert_eq!(sizes, [3, 3, 1]);
        let huge = vec![event(
            Stream::Data,
            Payload::Data(Arc::new(unit())),
            vec![b'x'; MAX_BATCH_BYTES * 2],
        )];
        assert_eq!(
            batches(&huge).count(),
            1,
            "an event larger than the bound goes alone"
        );
        assert_eq!(batches(&[]).count(), 0);
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
        h.insert(VERSION_HEADER, "1");
        let err = decode_event(Stream::Data, Some(&h), &json).unwrap_err();
        assert!(err.0.contains("wire version 1"), "{err}");
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
