//! NGSI-LD subscriptions at work: which changes fire one
//! (`notificationTrigger`, `watchedAttributes`, `q`, `geoQ`) and the
//! notification it sends (ETSI GS CIM 009, clause 5.3.1: `{"id", "type":
//! "Notification", "subscriptionId", "notifiedAt", "data"}`), over HTTP
//! or MQTT. Everything else (throttling, expiry, counters, the outbox,
//! the lanes) is the same as for NGSIv2's subscriptions, in
//! [`super`].
//!
//! The triggers, read against one committed change:
//!
//! - a created entity fires `entityCreated` (if it has a watched
//!   attribute, when attributes are watched) and `attributeCreated` (if it
//!   has a watched attribute, any attribute when none is named);
//! - an update fires `attributeCreated`, `attributeUpdated` or
//!   `attributeDeleted` for each watched attribute it added, wrote or
//!   removed, and `entityUpdated` when it touched a watched attribute;
//! - a deletion fires `entityDeleted`.
//!
//! Then `q` and `geoQ` must hold for the entity after the change (its
//! last state, for a deletion).
//!
//! A periodic subscription (`timeInterval`) fires for no change: its
//! notifications are sent by [`Subscriptions::periodic_loop`], each with
//! every entity the subscription selects at that moment.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;
use weft_model::geo::Shape;
use weft_model::ngsi::subscription::{AlterationType, Endpoint, Status, Subscription};
use weft_model::ngsi::{format_datetime, number, ChangeKind, Entity, EntityChange};
use weft_model::ngsi_ld::context::link_header;
use weft_model::ngsi_ld::entity::{self, AttrKind, Format, Render};
use weft_model::ngsi_ld::subscription::{Accept, LdSubscription, Trigger as Fires};

use super::payload::{NotSent, Trigger, USER_AGENT};
use super::sender::{Enqueued, Job, Outcome, Request};
use super::{Entry, Subscriptions};
use crate::context::{Alteration, Context, EntityFilter, EntityResolver};

/// The tenant header of NGSI-LD notifications (none for the default
/// tenant).
const TENANT_HEADER: &str = "NGSILD-Tenant";

/// Whether `change` fires the NGSI-LD subscription `sub`, and as what
/// kind of change (its selectors were checked already).
pub(crate) fn fires(
    sub: &Subscription,
    ld: &LdSubscription,
    change: &EntityChange,
) -> Option<AlterationType> {
    if ld.time_interval.is_some() {
        return None;
    }
    let watched = &sub.subject.condition.attrs;
    // An instance of a watched attribute (datasetId) is watched too.
    let watching = |name: &str| {
        let base = entity::split_instance(name).0;
        watched.is_empty() || watched.iter().any(|w| w == base)
    };
    let entity = &change.entity;
    let kind = match change.alteration {
        Alteration::Created => {
            let has_watched = entity.attrs.keys().any(watching);
            let as_entity = ld.wants(Fires::EntityCreated) && (watched.is_empty() || has_watched);
            let as_attribute = ld.wants(Fires::AttributeCreated) && has_watched;
            (as_entity || as_attribute).then_some(AlterationType::EntityCreate)
        }
        Alteration::Deleted => ld
            .wants(Fires::EntityDeleted)
            .then_some(AlterationType::EntityDelete),
        Alteration::Updated => {
            let mut touched = change.attrs.iter().filter(|c| watching(&c.name)).peekable();
            let as_entity = ld.wants(Fires::EntityUpdated) && touched.peek().is_some();
            let as_attribute = touched.any(|c| {
                ld.wants(match c.kind {
                    ChangeKind::Created => Fires::AttributeCreated,
                    ChangeKind::Updated => Fires::AttributeUpdated,
                    ChangeKind::Deleted => Fires::AttributeDeleted,
                })
            });
            let changed = change.attrs.iter().any(|c| c.modified);
            (as_entity || as_attribute).then_some(if changed {
                AlterationType::EntityChange
            } else {
                AlterationType::EntityUpdate
            })
        }
    }?;
    holds(ld, entity, &change.service_path).then_some(kind)
}

/// Whether `q` and `geoQ` hold for `entity` (at `service_path`).
pub(crate) fn holds(ld: &LdSubscription, entity: &Entity, service_path: &str) -> bool {
    if let Some((_, q)) = &ld.q {
        if !q.matches_with(&EntityResolver(entity, service_path)) {
            return false;
        }
    }
    match &ld.geo_q {
        None => true,
        Some(g) => entity
            .attrs
            .get(&g.stored_property)
            .and_then(|a| Shape::of_stored_attribute("geo:json", &a.value))
            .is_some_and(|shape| g.query.matches(&shape)),
    }
}

/// The request of one NGSI-LD notification: a POST of the notification
/// to an HTTP endpoint (its context in a `Link` header, or in the body
/// for `application/ld+json`; `receiverInfo` as headers), or an MQTT
/// publish of `{"metadata": {…}, "body": notification}` on the URI's
/// topic (`receiverInfo` in the metadata).
pub(crate) fn request(
    t: &Trigger<'_>,
    ld: &LdSubscription,
    correlator: &str,
) -> Result<Request, NotSent> {
    let ctx = ld.context.as_ref();
    let now = format_datetime(weft_model::now_ms());
    let watched = &t.sub.subject.condition.attrs;
    let entity = if t.alteration == AlterationType::EntityDelete {
        // The entity as gone: its id, type and deletion time, and each
        // watched attribute as deleted.
        let mut m = Map::new();
        m.insert("id".into(), t.entity.id.clone().into());
        m.insert("type".into(), ctx.from_stored(&t.entity.entity_type).into());
        if ld.sys_attrs {
            m.insert(
                "createdAt".into(),
                format_datetime(t.entity.date_created).into(),
            );
            m.insert(
                "modifiedAt".into(),
                format_datetime(t.entity.date_modified).into(),
            );
        }
        m.insert("deletedAt".into(), now.clone().into());
        // The watched attributes, or, to show what changed, all.
        for (name, attr) in t.entity.attrs.iter() {
            let shown = if watched.is_empty() {
                ld.show_changes
            } else {
                watched.iter().any(|w| w == name)
            };
            if shown {
                m.insert(ctx.from_stored(name), deleted(ld, attr, &now));
            }
        }
        m
    } else {
        let mut m = render(t.sub, ld, t.entity);
        if ld.show_changes && ld.format != Format::KeyValues {
            previous_values(t, ld, &mut m);
        }
        // Attributes the change deleted show as deleted.
        for change in t.touched {
            let shown = watched.is_empty() || watched.contains(&change.name);
            if let (ChangeKind::Deleted, Some(previous), true) =
                (change.kind, &change.previous, shown)
            {
                m.insert(ctx.from_stored(&change.name), deleted(ld, previous, &now));
            }
        }
        m
    };
    notify(t.sub, ld, t.tenant, vec![entity], correlator)
}

/// A deleted attribute (`previous` before its deletion) as notifications
/// show it: its value `urn:ngsi-ld:null` (clause 4.5.22), with
/// `deletedAt` (and the attribute's own times) under `sysAttrs`, and its
/// previous value under `showChanges`.
fn deleted(ld: &LdSubscription, previous: &weft_model::ngsi::Attribute, now: &str) -> Value {
    const NULL: &str = "urn:ngsi-ld:null";
    if ld.format == Format::KeyValues {
        return Value::String(NULL.into());
    }
    let kind = AttrKind::of_stored(&previous.attr_type);
    let mut out = Map::new();
    if ld.format == Format::Normalized {
        out.insert("type".into(), kind.name().into());
    }
    let member = kind.value_member();
    let null = match kind {
        AttrKind::LanguageProperty => serde_json::json!({"@none": NULL}),
        _ => Value::String(NULL.into()),
    };
    out.insert(member.into(), null);
    if ld.sys_attrs {
        for (key, md) in [("createdAt", "dateCreated"), ("modifiedAt", "dateModified")] {
            if let Some(at) = previous.metadata.get(md) {
                out.insert(key.into(), at.value.clone());
            }
        }
        out.insert("deletedAt".into(), now.into());
    }
    if ld.show_changes {
        out.insert(previous_key(member), previous.value.clone());
    }
    Value::Object(out)
}

/// `previousValue`, `previousObject`, … for a value member.
fn previous_key(member: &str) -> String {
    let mut key = String::from("previous");
    let mut chars = member.chars();
    if let Some(first) = chars.next() {
        key.push(first.to_ascii_uppercase());
        key.push_str(chars.as_str());
    }
    key
}

/// The request of a periodic notification (`timeInterval`): every entity
/// the subscription selects, as they are now.
pub(crate) fn periodic_request(
    sub: &Subscription,
    ld: &LdSubscription,
    tenant: &str,
    entities: &[&Entity],
) -> Result<Request, NotSent> {
    let data = entities.iter().map(|e| render(sub, ld, e)).collect();
    let correlator = uuid::Uuid::new_v4().to_string();
    notify(sub, ld, tenant, data, &correlator)
}

/// An entity as the subscription's notifications show it.
fn render(sub: &Subscription, ld: &LdSubscription, entity: &Entity) -> Map<String, Value> {
    let attrs = &sub.notification.attrs;
    let how = Render {
        context: ld.context.as_ref(),
        format: ld.format,
        sys_attrs: ld.sys_attrs,
        attrs: (!attrs.is_empty()).then_some(attrs.as_slice()),
        lang: ld.lang.as_deref(),
        datasets: None,
    };
    let mut shown = entity::render_entity(entity, &how);
    entity::project(&mut shown, Some(&ld.pick), Some(&ld.omit));
    shown
}

/// The `@context` a JSON-LD notification names: `jsonldContext`, else
/// the subscription's own.
fn jsonld_context(ld: &LdSubscription) -> Value {
    match &ld.jsonld_context {
        Some(url) => Value::String(url.clone()),
        None => ld.context.as_ref().answer_context(),
    }
}

/// The notification of `entities` (rendered) to the subscription's
/// endpoint.
fn notify(
    sub: &Subscription,
    ld: &LdSubscription,
    tenant: &str,
    entities: Vec<Map<String, Value>>,
    correlator: &str,
) -> Result<Request, NotSent> {
    let ctx = ld.context.as_ref();
    let data = match ld.accept {
        Accept::GeoJson => {
            let geometry = ctx.from_stored("location");
            let features: Vec<Value> = entities
                .into_iter()
                .map(|e| entity::feature(Value::Object(e), &geometry))
                .collect();
            serde_json::json!({"type": "FeatureCollection", "features": features})
        }
        Accept::Json | Accept::JsonLd => {
            Value::Array(entities.into_iter().map(Value::Object).collect())
        }
    };
    let mut data = data;
    if ld.accept == Accept::JsonLd {
        // Each entity of a JSON-LD notification carries its context.
        let context = jsonld_context(ld);
        for entity in data.as_array_mut().into_iter().flatten() {
            if let Value::Object(map) = entity {
                map.insert("@context".into(), context.clone());
            }
        }
    }
    let mut notification = Map::new();
    notification.insert(
        "id".into(),
        format!("urn:ngsi-ld:Notification:{}", uuid::Uuid::new_v4()).into(),
    );
    notification.insert("type".into(), "Notification".into());
    notification.insert("subscriptionId".into(), sub.id.clone().into());
    notification.insert(
        "notifiedAt".into(),
        format_datetime(weft_model::now_ms()).into(),
    );
    notification.insert("data".into(), data);
    let link = ld.jsonld_context.as_deref().unwrap_or(ctx.link_url());
    let mut headers: Vec<(String, String)> = Vec::with_capacity(8);
    headers.push(("Content-Type".into(), ld.accept.media_type().into()));
    if ld.accept == Accept::JsonLd {
        notification.insert("@context".into(), jsonld_context(ld));
    } else {
        headers.push(("Link".into(), link_header(link)));
    }
    if !tenant.is_empty() {
        headers.push((TENANT_HEADER.into(), tenant.to_string()));
    }
    headers.extend(ld.receiver_info.iter().cloned());
    let notification = Value::Object(notification);
    match &sub.notification.endpoint {
        Endpoint::Mqtt(m) => {
            let metadata: Map<String, Value> = headers
                .into_iter()
                .map(|(k, v)| (k, Value::String(v)))
                .collect();
            let message = serde_json::json!({"metadata": metadata, "body": notification});
            Ok(Request {
                method: hyper::Method::POST,
                url: m.url.clone(),
                headers: Vec::new(),
                body: Some(Bytes::from(number::to_vec(&message))),
                mqtt: Some(Box::new(super::mqtt::Publish {
                    topic: m.topic.clone(),
                    qos: m.qos,
                    retain: m.retain,
                    credentials: m.user.clone().zip(m.passwd.clone()),
                })),
            })
        }
        Endpoint::Http { url, .. } => {
            headers.push(("User-Agent".into(), USER_AGENT.into()));
            headers.push(("Fiware-Correlator".into(), correlator.to_string()));
            Ok(Request {
                method: hyper::Method::POST,
                url: url.clone(),
                headers,
                body: Some(Bytes::from(number::to_vec(&notification))),
                mqtt: None,
            })
        }
        Endpoint::HttpCustom(_) => Err(NotSent::Failed(
            "an NGSI-LD subscription notifies over http or mqtt".into(),
        )),
    }
}

/// `showChanges`: each attribute the update wrote gets its value before
/// (`previousValue`, `previousObject`, `previousLanguageMap`, …).
fn previous_values(t: &Trigger<'_>, ld: &LdSubscription, entity: &mut Map<String, Value>) {
    for change in t.touched {
        let (ChangeKind::Updated, Some(previous)) = (change.kind, &change.previous) else {
            continue;
        };
        let name = ld.context.from_stored(&change.name);
        let Some(Value::Object(shown)) = entity.get_mut(&name) else {
            continue;
        };
        let member = AttrKind::of_stored(&previous.attr_type).value_member();
        shown.insert(previous_key(member), previous.value.clone());
    }
}

/// How often periodic subscriptions are looked at: the finest
/// `timeInterval` kept to.
const PERIODIC_TICK: Duration = Duration::from_millis(500);

impl Subscriptions {
    /// Sends the notifications of periodic NGSI-LD subscriptions
    /// (`timeInterval`) until `stop`: each, once per interval, with every
    /// entity it selects as it is then (when it selects none, nothing is
    /// sent). Every node holds every entity, so one node of a cluster
    /// does this for all.
    pub async fn periodic_loop(self: Arc<Self>, context: Arc<Context>, stop: CancellationToken) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(PERIODIC_TICK) => {}
                _ = stop.cancelled() => return,
            }
            for entry in self.periodic_due() {
                self.notify_periodic(&entry, &context).await;
            }
        }
    }

    /// The periodic subscriptions whose interval has passed.
    fn periodic_due(&self) -> Vec<Arc<Entry>> {
        let now = weft_model::now_ms();
        self.tenants
            .read()
            .values()
            .flat_map(|t| t.by_id.values())
            .filter(|e| {
                let state = e.state.lock();
                let sub = &state.sub;
                let Some(interval) = sub.ld.as_ref().and_then(|ld| ld.time_interval) else {
                    return false;
                };
                sub.status != Status::Inactive
                    && !sub.expired(now)
                    && state
                        .last_fired
                        .is_none_or(|at| at.elapsed() >= Duration::from_secs_f64(interval))
            })
            .cloned()
            .collect()
    }

    /// Sends one periodic notification of `entry`, counted as a change's
    /// would be.
    async fn notify_periodic(&self, entry: &Arc<Entry>, context: &Context) {
        let found = context.query(&entry.tenant, &EntityFilter::default());
        let job = {
            let mut state = entry.state.lock();
            state.last_fired = Some(Instant::now());
            let sub = &state.sub;
            let Some(ld) = sub.ld.as_deref() else {
                return;
            };
            let selected: Vec<&Entity> = found
                .iter()
                .filter(|e| {
                    let entity = &e.entity;
                    sub.subject
                        .entities
                        .iter()
                        .any(|s| s.matches(&entity.id, &entity.entity_type))
                        && holds(ld, entity, &e.service_path)
                })
                .map(|e| e.entity.as_ref())
                .collect();
            if selected.is_empty() {
                return;
            }
            let request = periodic_request(sub, ld, &entry.tenant, &selected);
            let timeout = sub.notification.endpoint.timeout();
            let lane_key = sub.id.clone();
            let stats = &mut state.sub.notification.stats;
            stats.times_sent += 1;
            stats.last_notification = Some(weft_model::now_ms());
            match request {
                Ok(request) => Job {
                    request,
                    timeout,
                    lane_key,
                    entry: entry.clone(),
                    // Of no change: nothing in the change log is owed.
                    seq: 0,
                    generation: state.delivery.generation,
                },
                Err(NotSent::Skipped) => return,
                Err(NotSent::Failed(reason)) => {
                    drop(state);
                    self.count(entry, Outcome::Failed(reason));
                    return;
                }
            }
        };
        self.dirty
            .lock()
            .insert((entry.tenant.clone(), job.lane_key.clone()));
        match self.sender.enqueue(job) {
            Enqueued::Queued => {}
            Enqueued::Parked => self.sender.drain(entry).await,
            Enqueued::Refused(job, reason) => self.refused(entry, &job, reason),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use weft_model::ngsi::{AttrChange, Attribute};
    use weft_model::ngsi_ld::subscription;
    use weft_model::ngsi_ld::Context;

    fn sub(extra: Value) -> Subscription {
        let mut body = json!({
            "type": "Subscription",
            "entities": [{"type": "Vehicle"}],
            "notification": {"endpoint": {"uri": "http://receiver.example/n"}},
        });
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        subscription::parse(&body, Context::core(), "urn:x:sub".into(), 0).unwrap()
    }

    fn change(alteration: Alteration, touched: &[(&str, ChangeKind)], speed: i64) -> EntityChange {
        let mut e = Entity::new("urn:ngsi-ld:Vehicle:1", "Vehicle");
        e.attrs.insert(
            "speed".to_string(),
            Attribute::new(json!(speed), "Property"),
        );
        e.attrs
            .insert("brand".to_string(), Attribute::new(json!("x"), "Property"));
        EntityChange {
            tenant: String::new(),
            service_path: "/".into(),
            entity: Arc::new(e),
            alteration,
            attrs: touched
                .iter()
                .map(|(name, kind)| AttrChange {
                    name: name.to_string(),
                    kind: *kind,
                    previous: None,
                    modified: true,
                })
                .collect(),
            origin: None,
        }
    }

    #[test]
    fn deleted_attributes_show_the_null_uri_in_their_kind() {
        let now = "2026-01-01T00:00:00.000Z";
        let speed = Attribute::new(json!(55), "Property");
        let street = Attribute::new(json!({"fr": "rue"}), "LanguageProperty");
        let kv = sub(json!({"notification": {"format": "keyValues",
            "endpoint": {"uri": "http://receiver.example/n"}}}));
        assert_eq!(
            deleted(kv.ld.as_deref().unwrap(), &speed, now),
            json!("urn:ngsi-ld:null")
        );
        let full = sub(
            json!({"notification": {"sysAttrs": true, "showChanges": true,
            "endpoint": {"uri": "http://receiver.example/n"}}}),
        );
        let ld = full.ld.as_deref().unwrap();
        assert_eq!(
            deleted(ld, &speed, now),
            json!({"type": "Property", "value": "urn:ngsi-ld:null",
                   "deletedAt": now, "previousValue": 55})
        );
        assert_eq!(
            deleted(ld, &street, now)["languageMap"],
            json!({"@none": "urn:ngsi-ld:null"})
        );
    }

    fn fired(s: &Subscription, c: &EntityChange) -> Option<AlterationType> {
        fires(s, s.ld.as_deref().unwrap(), c)
    }

    #[test]
    fn default_triggers_are_attributes_created_and_updated() {
        let s = sub(json!({"watchedAttributes": ["speed"]}));
        let created = change(Alteration::Created, &[], 1);
        assert_eq!(fired(&s, &created), Some(AlterationType::EntityCreate));
        let speed = change(Alteration::Updated, &[("speed", ChangeKind::Updated)], 1);
        assert_eq!(fired(&s, &speed), Some(AlterationType::EntityChange));
        let brand = change(Alteration::Updated, &[("brand", ChangeKind::Updated)], 1);
        assert_eq!(fired(&s, &brand), None, "not watched");
        let gone = change(Alteration::Updated, &[("speed", ChangeKind::Deleted)], 1);
        assert_eq!(fired(&s, &gone), None, "attributeDeleted not asked");
        assert_eq!(fired(&s, &change(Alteration::Deleted, &[], 1)), None);
    }

    #[test]
    fn asked_triggers_q_and_instances() {
        let s = sub(
            json!({"notificationTrigger": ["entityDeleted", "attributeDeleted"], "q": "speed>5"}),
        );
        let gone = change(Alteration::Updated, &[("speed", ChangeKind::Deleted)], 9);
        assert_eq!(fired(&s, &gone), Some(AlterationType::EntityChange));
        let slow = change(Alteration::Updated, &[("speed", ChangeKind::Deleted)], 1);
        assert_eq!(fired(&s, &slow), None, "q does not hold");
        let deleted = change(Alteration::Deleted, &[], 9);
        assert_eq!(fired(&s, &deleted), Some(AlterationType::EntityDelete));
        // An instance of a watched attribute is watched.
        let s = sub(json!({"watchedAttributes": ["speed"]}));
        let instance = change(
            Alteration::Updated,
            &[("speed urn:ngsi-ld:Dataset:1", ChangeKind::Updated)],
            1,
        );
        assert!(fired(&s, &instance).is_some());
        // A periodic subscription fires for no change.
        let periodic = sub(json!({"timeInterval": 5}));
        assert_eq!(fired(&periodic, &change(Alteration::Created, &[], 1)), None);
    }
}
