//! NGSI-LD subscriptions (ETSI GS CIM 009, clauses 5.2.12, 5.2.14 and
//! 5.8): what a client asks to be told about, read into the same
//! [`Subscription`] NGSIv2's subscriptions are, so one matcher and one
//! sender serve both APIs.
//!
//! The parts both APIs share are NGSIv2's: the entity selectors (`type`
//! stored as entity types are), the watched attributes (the condition's
//! attributes), `expiresAt` (`expires`), `isActive` (the status),
//! `throttling`, the endpoint (`http` or `mqtt`) and the counters. What
//! only NGSI-LD has is the [`LdSubscription`] the subscription carries:
//! the client's `@context` (names are compacted with it in notifications
//! and when the subscription is read back), the notification triggers,
//! `q` and `geoQ` in NGSI-LD's languages, the notification's format and
//! media type, `receiverInfo`/`notifierInfo`, `timeInterval` (periodic
//! notifications) and the system times.
//!
//! A subscription is stored as its NGSI-LD rendering with the client's
//! term definitions resolved ([`Context::definitions`]) and the counters
//! in full ([`to_storage`]), so it is read back ([`from_storage`]) after
//! a restart without fetching any context.

use std::sync::Arc;

use regex::Regex;
use serde_json::{Map, Value};

use super::context::Context;
use super::entity::{is_uri, Format};
use super::geo::geo_query;
use super::query::LdQuery;
use super::LdError;
use crate::geo::GeoQuery;
use crate::ngsi::subscription::{
    parse_stats, strings, Condition, CustomPayload, Endpoint, EntitySelector, Guarantee,
    MqttEndpoint, Notification, NotificationStats, Status, Subject, Subscription,
};
use crate::ngsi::{format_datetime, parse_datetime, Format as V2Format};

/// The `type` of every subscription.
pub const SUBSCRIPTION_TYPE: &str = "Subscription";

/// What makes a subscription notify (`notificationTrigger`, clause
/// 5.2.12).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// A matching entity was created.
    EntityCreated,
    /// A matching entity was updated (any of its attributes written).
    EntityUpdated,
    /// A matching entity was deleted.
    EntityDeleted,
    /// A watched attribute was added (also by creating the entity).
    AttributeCreated,
    /// A watched attribute was written.
    AttributeUpdated,
    /// A watched attribute was removed.
    AttributeDeleted,
}

impl Trigger {
    const ALL: [Trigger; 6] = [
        Trigger::EntityCreated,
        Trigger::EntityUpdated,
        Trigger::EntityDeleted,
        Trigger::AttributeCreated,
        Trigger::AttributeUpdated,
        Trigger::AttributeDeleted,
    ];

    /// The specification's name.
    pub fn name(self) -> &'static str {
        match self {
            Trigger::EntityCreated => "entityCreated",
            Trigger::EntityUpdated => "entityUpdated",
            Trigger::EntityDeleted => "entityDeleted",
            Trigger::AttributeCreated => "attributeCreated",
            Trigger::AttributeUpdated => "attributeUpdated",
            Trigger::AttributeDeleted => "attributeDeleted",
        }
    }

    fn from_name(name: &str) -> Option<Trigger> {
        Trigger::ALL.into_iter().find(|t| t.name() == name)
    }
}

/// The triggers of a subscription that names none: an attribute of a
/// matching entity created or updated.
pub const DEFAULT_TRIGGERS: [Trigger; 2] = [Trigger::AttributeCreated, Trigger::AttributeUpdated];

/// The media type notifications are sent in (`endpoint.accept`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Accept {
    /// `application/json`, the context in a `Link` header.
    #[default]
    Json,
    /// `application/ld+json`, the context in the body.
    JsonLd,
    /// `application/geo+json`: the entities as a FeatureCollection.
    GeoJson,
}

impl Accept {
    /// The media type.
    pub fn media_type(self) -> &'static str {
        match self {
            Accept::Json => "application/json",
            Accept::JsonLd => "application/ld+json",
            Accept::GeoJson => "application/geo+json",
        }
    }

    fn from_media_type(m: &str) -> Option<Accept> {
        [Accept::Json, Accept::JsonLd, Accept::GeoJson]
            .into_iter()
            .find(|a| a.media_type() == m)
    }
}

/// `geoQ`: a geo-query on one GeoProperty, as sent and compiled.
#[derive(Debug, Clone)]
pub struct GeoQ {
    /// `georel`.
    pub georel: String,
    /// `geometry`.
    pub geometry: String,
    /// `coordinates`, as sent (an array, or its text).
    pub coordinates: Value,
    /// `geoproperty` as the client wrote it (`None`: `location`).
    pub geoproperty: Option<String>,
    /// The GeoProperty's stored name.
    pub stored_property: String,
    /// The query, in NGSIv2's geo-query terms.
    pub query: GeoQuery,
}

/// What only an NGSI-LD subscription has (see the module's
/// documentation).
#[derive(Debug, Clone)]
pub struct LdSubscription {
    /// The context the subscription was written with: its names are read
    /// with it, and notifications and readings compacted with it.
    pub context: Arc<Context>,
    /// `subscriptionName`.
    pub name: Option<String>,
    /// Whether `entities` was given (without it, every entity is
    /// selected and the subscription is rendered without the member).
    pub entities_given: bool,
    /// `watchedAttributes` as the client wrote them (the condition holds
    /// their stored names).
    pub watched: Vec<String>,
    /// `notificationTrigger` (the default when not given).
    pub triggers: Vec<Trigger>,
    /// Whether `notificationTrigger` was given.
    pub triggers_given: bool,
    /// `q`, as sent and parsed.
    pub q: Option<(String, LdQuery)>,
    /// `geoQ`.
    pub geo_q: Option<GeoQ>,
    /// Whether `isActive` was given (it is shown back only then, or when
    /// false).
    pub is_active_given: bool,
    /// `notification.attributes` as the client wrote them.
    pub attributes: Vec<String>,
    /// `notification.pick`: only these members of each entity notified
    /// (`id` and `type` included).
    pub pick: Vec<String>,
    /// `notification.omit`: these members of each entity left out.
    pub omit: Vec<String>,
    /// `notification.format`.
    pub format: Format,
    /// `notification.endpoint.accept`.
    pub accept: Accept,
    /// `notification.sysAttrs`: `createdAt`/`modifiedAt` in notifications.
    pub sys_attrs: bool,
    /// `notification.showChanges`: each updated attribute's previous value.
    pub show_changes: bool,
    /// `notification.endpoint.uri`, as sent.
    pub uri: String,
    /// `notification.endpoint.receiverInfo`: headers (HTTP) or metadata
    /// (MQTT) sent with every notification.
    pub receiver_info: Vec<(String, String)>,
    /// `notification.endpoint.notifierInfo` (`MQTT-QoS`, `MQTT-Version`).
    pub notifier_info: Vec<(String, String)>,
    /// `lang`: the language LanguageProperties are notified in.
    pub lang: Option<String>,
    /// `jsonldContext`: the context notifications name instead of the
    /// subscription's.
    pub jsonld_context: Option<String>,
    /// `timeInterval`: a periodic subscription notifies every so many
    /// seconds with every entity it selects, and never on changes.
    pub time_interval: Option<f64>,
    /// When it was created (epoch ms).
    pub created_at: i64,
    /// When it was last changed (epoch ms).
    pub modified_at: i64,
}

impl LdSubscription {
    /// Whether `trigger` is asked for.
    pub fn wants(&self, trigger: Trigger) -> bool {
        self.triggers.contains(&trigger)
    }
}

/// Whether a subscription is being created (every rule applies) or read
/// back from the store (an `expiresAt` in the past is kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reading {
    Request,
    Stored,
}

/// Reads a "Create Subscription" body (clause 5.8.1) with `ctx`; `id` is
/// the id to give it when the body names none; `now` (epoch ms) stamps it.
pub fn parse(
    body: &Value,
    ctx: Arc<Context>,
    id: String,
    now: i64,
) -> Result<Subscription, LdError> {
    parse_with(body, ctx, id, now, Reading::Request)
}

fn parse_with(
    body: &Value,
    ctx: Arc<Context>,
    id: String,
    now: i64,
    reading: Reading,
) -> Result<Subscription, LdError> {
    let obj = body
        .as_object()
        .ok_or_else(|| LdError::invalid("a subscription is a JSON object"))?;
    match obj.get("type") {
        Some(Value::String(t)) if t == SUBSCRIPTION_TYPE => {}
        Some(_) => {
            return Err(LdError::bad_request(
                "the type of a subscription is \"Subscription\"",
            ))
        }
        None => return Err(LdError::bad_request("the subscription has no type")),
    }
    let id = match obj.get("id").or_else(|| obj.get("@id")) {
        None => id,
        Some(Value::String(given)) if is_uri(given) => given.clone(),
        Some(other) => {
            return Err(LdError::bad_request(format!(
                "the subscription id is not a URI: {other}"
            )))
        }
    };
    let name = text(obj, "subscriptionName")?;
    let description = text(obj, "description")?;
    let (entities, entities_given) = match obj.get("entities") {
        None => (vec![every_entity()], false),
        Some(v) => (selectors(v, &ctx)?, true),
    };
    let watched = match obj.get("watchedAttributes") {
        None => Vec::new(),
        Some(v) => {
            let names = names(v, "watchedAttributes")?;
            if names.is_empty() {
                return Err(LdError::bad_request("watchedAttributes is empty"));
            }
            names
        }
    };
    if !entities_given && watched.is_empty() {
        return Err(LdError::bad_request(
            "a subscription names entities, watchedAttributes or both",
        ));
    }
    let time_interval = match obj.get("timeInterval") {
        None => None,
        Some(Value::Number(n)) => match n.as_f64() {
            Some(t) if t > 0.0 => Some(t),
            _ => return Err(LdError::bad_request("timeInterval is a positive number")),
        },
        Some(_) => return Err(LdError::bad_request("timeInterval is a positive number")),
    };
    if time_interval.is_some() && !watched.is_empty() {
        return Err(LdError::bad_request(
            "a periodic subscription (timeInterval) watches no attributes",
        ));
    }
    if time_interval.is_some() && obj.contains_key("throttling") {
        return Err(LdError::bad_request(
            "a periodic subscription (timeInterval) is not throttled",
        ));
    }
    let (triggers, triggers_given) = match obj.get("notificationTrigger") {
        None => (DEFAULT_TRIGGERS.to_vec(), false),
        Some(v) => (triggers(v)?, true),
    };
    let q = match obj.get("q") {
        None => None,
        Some(Value::String(q)) => Some((q.clone(), LdQuery::parse(q, &ctx)?)),
        Some(_) => return Err(LdError::bad_request("q is a string")),
    };
    let geo_q = obj.get("geoQ").map(|g| geo(g, &ctx)).transpose()?;
    let expires = match obj.get("expiresAt") {
        None | Some(Value::Null) => None,
        Some(Value::String(t)) => {
            let at = parse_datetime(t)
                .ok_or_else(|| LdError::bad_request(format!("expiresAt is not a DateTime: {t}")))?;
            if reading == Reading::Request && at <= now {
                return Err(LdError::bad_request("expiresAt is in the past"));
            }
            Some(at)
        }
        Some(_) => return Err(LdError::bad_request("expiresAt is a DateTime string")),
    };
    let throttling = match obj.get("throttling") {
        None => None,
        Some(Value::Number(n)) => match n.as_f64() {
            Some(t) if t > 0.0 => Some(t),
            _ => return Err(LdError::bad_request("throttling is a positive number")),
        },
        Some(_) => return Err(LdError::bad_request("throttling is a positive number")),
    };
    let status = match obj.get("isActive") {
        None | Some(Value::Bool(true)) => Status::Active,
        Some(Value::Bool(false)) => Status::Inactive,
        Some(_) => return Err(LdError::bad_request("isActive is true or false")),
    };
    let lang = text(obj, "lang")?;
    let jsonld_context = match text(obj, "jsonldContext")? {
        Some(url) if !is_uri(&url) => {
            return Err(LdError::bad_request("jsonldContext is a URI"));
        }
        other => other,
    };
    let notification = obj
        .get("notification")
        .ok_or_else(|| LdError::bad_request("the subscription has no notification"))?;
    let params = notification_params(notification, &ctx)?;
    let condition = Condition {
        attrs: watched.iter().map(|n| ctx.to_stored(n)).collect(),
        expression: None,
        jexl_expression: None,
        alteration_types: Vec::new(),
        notify_on_metadata_change: true,
    };
    let (created_at, modified_at) = match reading {
        Reading::Request => (now, now),
        Reading::Stored => (stamp(obj, "createdAt", now), stamp(obj, "modifiedAt", now)),
    };
    let ld = LdSubscription {
        context: ctx.clone(),
        name,
        entities_given,
        watched,
        triggers,
        triggers_given,
        q,
        geo_q,
        is_active_given: obj.contains_key("isActive"),
        attributes: params.attributes.clone(),
        pick: params.pick,
        omit: params.omit,
        format: params.format,
        accept: params.accept,
        sys_attrs: params.sys_attrs,
        show_changes: params.show_changes,
        uri: params.uri.clone(),
        receiver_info: params.receiver_info,
        notifier_info: params.notifier_info,
        lang,
        jsonld_context,
        time_interval,
        created_at,
        modified_at,
    };
    Ok(Subscription {
        id,
        description,
        subject: Subject {
            entities,
            condition,
            has_condition: true,
        },
        notification: Notification {
            attrs: params.attributes.iter().map(|n| ctx.to_stored(n)).collect(),
            except_attrs: None,
            attrs_format: V2Format::Normalized,
            metadata: Vec::new(),
            only_changed_attrs: false,
            covered: false,
            endpoint: params.endpoint,
            max_fails_limit: None,
            // A periodic notification is a snapshot: one that fails is
            // not sent again, the next period's is.
            delivery: if time_interval.is_some() {
                Guarantee::AtMostOnce
            } else {
                Guarantee::AtLeastOnce
            },
            stats: NotificationStats::default(),
        },
        expires,
        status,
        throttling,
        ld: Some(Box::new(ld)),
    })
}

/// Applies an "Update Subscription" fragment (clause 5.8.2) read with
/// `ctx`: each member given replaces the subscription's (the members of
/// `notification` and of its `endpoint` one by one), `null` removes one;
/// the id, the counters and the creation time are kept. Nothing changes
/// when the result is not a valid subscription.
pub fn patch(
    sub: &Subscription,
    fragment: &Value,
    ctx: Arc<Context>,
    now: i64,
) -> Result<Subscription, LdError> {
    let Some(ld) = &sub.ld else {
        return Err(LdError::not_found("no NGSI-LD subscription of this id"));
    };
    let Value::Object(changes) = fragment else {
        return Err(LdError::invalid("a subscription fragment is a JSON object"));
    };
    if changes.is_empty() {
        return Err(LdError::bad_request("the fragment is empty"));
    }
    if let Some(id) = changes.get("id") {
        if id.as_str() != Some(sub.id.as_str()) {
            return Err(LdError::bad_request("a subscription's id cannot change"));
        }
    }
    // The fragment's names are read with its context: the current
    // subscription is rendered with the same, merged, and read again.
    let ctx = if ctx.is_core() {
        ld.context.clone()
    } else {
        ctx
    };
    let mut current = render_with(sub, &ctx, 0, false, Secrets::Kept);
    merge(&mut current, changes, 0);
    current.insert("type".into(), SUBSCRIPTION_TYPE.into());
    let mut next = parse_with(
        &Value::Object(current),
        ctx,
        sub.id.clone(),
        now,
        Reading::Request,
    )?;
    next.notification.stats = sub.notification.stats.clone();
    if let Some(next_ld) = next.ld.as_mut() {
        next_ld.created_at = ld.created_at;
        next_ld.modified_at = now;
    }
    Ok(next)
}

/// Merges a fragment into a rendering: `notification` and its `endpoint`
/// member by member, every other member replaced; `null` removes.
fn merge(into: &mut Map<String, Value>, changes: &Map<String, Value>, depth: usize) {
    for (key, value) in changes {
        let nested = (depth == 0 && key == "notification") || (depth == 1 && key == "endpoint");
        match (value, into.get_mut(key)) {
            (Value::Null, _) => {
                into.remove(key);
            }
            (Value::Object(inner), Some(Value::Object(existing))) if nested => {
                merge(existing, inner, depth + 1);
            }
            _ => {
                into.insert(key.clone(), value.clone());
            }
        }
    }
}

/// Whether an MQTT password in an endpoint URI is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Secrets {
    /// Masked, for clients.
    Masked,
    /// Kept, for the store and for patching.
    Kept,
}

/// The subscription as NGSI-LD shows it (clause 5.2.12), names compacted
/// with `ctx`; `createdAt`/`modifiedAt` with `sys_attrs`. `now` decides
/// `status` (`expired` past `expiresAt`). NGSIv2 subscriptions have no
/// NGSI-LD rendering (`None`).
pub fn render(sub: &Subscription, ctx: &Context, now: i64, sys_attrs: bool) -> Option<Value> {
    sub.ld.as_ref()?;
    Some(Value::Object(render_with(
        sub,
        ctx,
        now,
        sys_attrs,
        Secrets::Masked,
    )))
}

fn render_with(
    sub: &Subscription,
    ctx: &Context,
    now: i64,
    sys_attrs: bool,
    secrets: Secrets,
) -> Map<String, Value> {
    let ld = sub.ld.as_ref().expect("an NGSI-LD subscription");
    let own = ctx.is_core() && !ld.context.is_core();
    // A reader without a context of its own sees the names the
    // subscription was written with.
    let ctx = if own { ld.context.as_ref() } else { ctx };
    let mut out = Map::new();
    out.insert("id".into(), sub.id.clone().into());
    out.insert("type".into(), SUBSCRIPTION_TYPE.into());
    if let Some(n) = &ld.name {
        out.insert("subscriptionName".into(), n.clone().into());
    }
    if let Some(d) = &sub.description {
        out.insert("description".into(), d.clone().into());
    }
    if ld.entities_given {
        let entities = sub
            .subject
            .entities
            .iter()
            .map(|e| {
                let mut m = Map::new();
                if let Some(id) = &e.id {
                    m.insert("id".into(), id.clone().into());
                }
                if let Some(p) = &e.id_pattern {
                    m.insert("idPattern".into(), p.as_str().into());
                }
                if let Some(t) = &e.entity_type {
                    m.insert("type".into(), ctx.from_stored(t).into());
                }
                Value::Object(m)
            })
            .collect();
        out.insert("entities".into(), Value::Array(entities));
    }
    if !sub.subject.condition.attrs.is_empty() {
        out.insert(
            "watchedAttributes".into(),
            names_value(&sub.subject.condition.attrs, ctx),
        );
    }
    out.insert(
        "notificationTrigger".into(),
        Value::Array(ld.triggers.iter().map(|t| t.name().into()).collect()),
    );
    if let Some((q, _)) = &ld.q {
        out.insert("q".into(), q.clone().into());
    }
    if let Some(g) = &ld.geo_q {
        let mut m = Map::new();
        m.insert("geometry".into(), g.geometry.clone().into());
        m.insert("coordinates".into(), g.coordinates.clone());
        m.insert("georel".into(), g.georel.clone().into());
        if g.geoproperty.is_some() {
            m.insert(
                "geoproperty".into(),
                ctx.from_stored(&g.stored_property).into(),
            );
        }
        out.insert("geoQ".into(), Value::Object(m));
    }
    if ld.is_active_given || sub.status == Status::Inactive {
        out.insert("isActive".into(), (sub.status != Status::Inactive).into());
    }
    let status = if sub.expired(now) {
        "expired"
    } else if sub.status == Status::Inactive {
        "paused"
    } else {
        "active"
    };
    out.insert("status".into(), status.into());
    if let Some(e) = sub.expires {
        out.insert("expiresAt".into(), format_datetime(e).into());
    }
    if let Some(t) = sub.throttling {
        out.insert("throttling".into(), crate::ngsi::subscription::number(t));
    }
    if let Some(t) = ld.time_interval {
        out.insert("timeInterval".into(), crate::ngsi::subscription::number(t));
    }
    if let Some(l) = &ld.lang {
        out.insert("lang".into(), l.clone().into());
    }
    if let Some(c) = &ld.jsonld_context {
        out.insert("jsonldContext".into(), c.clone().into());
    }
    out.insert(
        "notification".into(),
        render_notification(sub, ld, ctx, secrets),
    );
    if sys_attrs {
        out.insert("createdAt".into(), format_datetime(ld.created_at).into());
        out.insert("modifiedAt".into(), format_datetime(ld.modified_at).into());
    }
    out
}

fn render_notification(
    sub: &Subscription,
    ld: &LdSubscription,
    ctx: &Context,
    secrets: Secrets,
) -> Value {
    let n = &sub.notification;
    let st = &n.stats;
    let mut out = Map::new();
    if !n.attrs.is_empty() {
        out.insert("attributes".into(), names_value(&n.attrs, ctx));
    }
    if !ld.pick.is_empty() {
        out.insert("pick".into(), strings(&ld.pick));
    }
    if !ld.omit.is_empty() {
        out.insert("omit".into(), strings(&ld.omit));
    }
    let format = match ld.format {
        Format::Normalized => "normalized",
        Format::Concise => "concise",
        Format::KeyValues => "keyValues",
    };
    out.insert("format".into(), format.into());
    if ld.sys_attrs {
        out.insert("sysAttrs".into(), true.into());
    }
    if ld.show_changes {
        out.insert("showChanges".into(), true.into());
    }
    let mut endpoint = Map::new();
    let uri = match secrets {
        Secrets::Kept => ld.uri.clone(),
        Secrets::Masked => masked(&ld.uri),
    };
    endpoint.insert("uri".into(), uri.into());
    endpoint.insert("accept".into(), ld.accept.media_type().into());
    if let Some(t) = n.endpoint.timeout() {
        endpoint.insert("timeout".into(), t.into());
    }
    if !ld.receiver_info.is_empty() {
        endpoint.insert("receiverInfo".into(), key_values(&ld.receiver_info));
    }
    if !ld.notifier_info.is_empty() {
        endpoint.insert("notifierInfo".into(), key_values(&ld.notifier_info));
    }
    out.insert("endpoint".into(), Value::Object(endpoint));
    // Said once there is something to say.
    if st.times_sent > 0 {
        let failed = st.last_failure.is_some() && st.last_failure >= st.last_success;
        out.insert("status".into(), if failed { "failed" } else { "ok" }.into());
        out.insert("timesSent".into(), st.times_sent.into());
    }
    if let Some(t) = st.last_notification {
        out.insert("lastNotification".into(), format_datetime(t).into());
    }
    if let Some(t) = st.last_success {
        out.insert("lastSuccess".into(), format_datetime(t).into());
    }
    if let Some(t) = st.last_failure {
        out.insert("lastFailure".into(), format_datetime(t).into());
    }
    Value::Object(out)
}

/// An endpoint URI with the password of its user information masked.
fn masked(uri: &str) -> String {
    match url::Url::parse(uri) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("*****"));
            u.to_string()
        }
        _ => uri.to_string(),
    }
}

/// The form a subscription is kept in: its rendering with its own
/// context's names and the password kept, plus (under `weft`) the
/// context's resolved definitions, the counters in full and the system
/// times.
pub fn to_storage(sub: &Subscription) -> String {
    let Some(ld) = &sub.ld else {
        return String::new();
    };
    let mut out = render_with(sub, &ld.context, i64::MIN, true, Secrets::Kept);
    let st = &sub.notification.stats;
    let mut stats = Map::new();
    stats.insert("timesSent".into(), st.times_sent.into());
    let dated = [
        ("lastNotification", st.last_notification),
        ("lastFailure", st.last_failure),
        ("lastSuccess", st.last_success),
    ];
    for (key, at) in dated {
        if let Some(t) = at {
            stats.insert(key.into(), format_datetime(t).into());
        }
    }
    if let Some(r) = &st.last_failure_reason {
        stats.insert("lastFailureReason".into(), r.clone().into());
    }
    if let Some(c) = st.last_success_code {
        stats.insert("lastSuccessCode".into(), c.into());
    }
    stats.insert("failsCounter".into(), st.fails_counter.into());
    let mut weft = Map::new();
    weft.insert(
        "context".into(),
        ld.context.given().cloned().unwrap_or(Value::Null),
    );
    weft.insert("definitions".into(), ld.context.definitions());
    weft.insert("stats".into(), Value::Object(stats));
    out.insert("weft".into(), Value::Object(weft));
    Value::Object(out).to_string()
}

/// Whether a stored subscription is an NGSI-LD one.
pub fn is_stored_ld(value: &Value) -> bool {
    value.get("type").and_then(Value::as_str) == Some(SUBSCRIPTION_TYPE)
}

/// Reads [`to_storage`] back.
pub fn from_storage(value: &Value) -> Result<Subscription, LdError> {
    let weft = value
        .get("weft")
        .ok_or_else(|| LdError::invalid("a stored NGSI-LD subscription without its context"))?;
    let given = weft.get("context").filter(|c| !c.is_null()).cloned();
    let definitions = weft.get("definitions").cloned().unwrap_or(Value::Null);
    let ctx = Arc::new(Context::restore(given, &definitions)?);
    let id = value
        .get("id")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let mut sub = parse_with(value, ctx, id, crate::now_ms(), Reading::Stored)?;
    if let Some(stats) = weft.get("stats") {
        sub.notification.stats = parse_stats(stats);
    }
    Ok(sub)
}

/// What `notification` (NotificationParams, clause 5.2.14) says.
struct Params {
    attributes: Vec<String>,
    pick: Vec<String>,
    omit: Vec<String>,
    format: Format,
    accept: Accept,
    sys_attrs: bool,
    show_changes: bool,
    uri: String,
    endpoint: Endpoint,
    receiver_info: Vec<(String, String)>,
    notifier_info: Vec<(String, String)>,
}

fn notification_params(v: &Value, ctx: &Context) -> Result<Params, LdError> {
    let obj = v
        .as_object()
        .ok_or_else(|| LdError::bad_request("notification is an object"))?;
    let attributes = match obj.get("attributes") {
        None => Vec::new(),
        Some(v) => names(v, "notification.attributes")?,
    };
    let projection = |key: &str| match obj.get(key) {
        None => Ok(Vec::new()),
        Some(v) => names(v, &format!("notification.{key}")),
    };
    let (pick, omit) = (projection("pick")?, projection("omit")?);
    if !attributes.is_empty() && (!pick.is_empty() || !omit.is_empty()) {
        return Err(LdError::bad_request(
            "notification.attributes goes with neither pick nor omit",
        ));
    }
    if !pick.is_empty() && !omit.is_empty() {
        return Err(LdError::bad_request(
            "notification.pick and omit exclude each other",
        ));
    }
    let format = match obj.get("format").map(Value::as_str) {
        None | Some(Some("normalized")) => Format::Normalized,
        Some(Some("keyValues" | "simplified")) => Format::KeyValues,
        Some(Some("concise")) => Format::Concise,
        Some(_) => {
            return Err(LdError::bad_request(
                "notification.format is normalized, concise or keyValues",
            ))
        }
    };
    let flag = |key: &str| match obj.get(key) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(LdError::bad_request(format!(
            "notification.{key} is true or false"
        ))),
    };
    let (sys_attrs, show_changes) = (flag("sysAttrs")?, flag("showChanges")?);
    let endpoint = obj
        .get("endpoint")
        .and_then(Value::as_object)
        .ok_or_else(|| LdError::bad_request("notification.endpoint is missing"))?;
    let uri = match endpoint.get("uri") {
        Some(Value::String(u)) => u.clone(),
        _ => return Err(LdError::bad_request("notification.endpoint.uri is missing")),
    };
    let accept = match endpoint.get("accept") {
        None => Accept::Json,
        Some(Value::String(m)) => Accept::from_media_type(m).ok_or_else(|| {
            LdError::bad_request(format!(
                "notification.endpoint.accept is application/json, application/ld+json or application/geo+json, not {m}"
            ))
        })?,
        Some(_) => return Err(LdError::bad_request("notification.endpoint.accept is a string")),
    };
    let timeout = match endpoint.get("timeout") {
        None => None,
        Some(Value::Number(n)) => Some(n.as_u64().ok_or_else(|| {
            LdError::bad_request("notification.endpoint.timeout is milliseconds")
        })?),
        Some(_) => {
            return Err(LdError::bad_request(
                "notification.endpoint.timeout is milliseconds",
            ))
        }
    };
    let receiver_info = key_value_list(endpoint.get("receiverInfo"), "receiverInfo")?;
    let notifier_info = key_value_list(endpoint.get("notifierInfo"), "notifierInfo")?;
    let endpoint = endpoint_of(&uri, timeout, &notifier_info)?;
    // Names are checked as the entity's are read: expanded now.
    for a in &attributes {
        ctx.to_stored(a);
    }
    Ok(Params {
        attributes,
        pick,
        omit,
        format,
        accept,
        sys_attrs,
        show_changes,
        uri,
        endpoint,
        receiver_info,
        notifier_info,
    })
}

/// The endpoint a URI names: `http(s)://…`, or `mqtt(s)://[user:pass@]
/// host[:port]/topic` (the QoS from `notifierInfo`'s `MQTT-QoS`).
fn endpoint_of(
    uri: &str,
    timeout: Option<u64>,
    notifier_info: &[(String, String)],
) -> Result<Endpoint, LdError> {
    let bad = || {
        LdError::bad_request(format!(
            "notification.endpoint.uri is not a URL weft can notify: {uri}"
        ))
    };
    let url = url::Url::parse(uri).map_err(|_| bad())?;
    if url.host_str().is_none_or(str::is_empty) {
        return Err(bad());
    }
    match url.scheme() {
        "http" | "https" => Ok(Endpoint::Http {
            url: uri.to_string(),
            timeout,
        }),
        "mqtt" | "mqtts" => {
            let topic = url.path().trim_start_matches('/').to_string();
            if topic.is_empty() || topic.contains(['+', '#']) {
                return Err(LdError::bad_request(
                    "an MQTT endpoint's path is the topic, without wildcards",
                ));
            }
            let qos = match notifier_info.iter().find(|(k, _)| k == "MQTT-QoS") {
                None => 0,
                Some((_, q)) => match q.as_str() {
                    "0" => 0,
                    "1" => 1,
                    "2" => 2,
                    _ => return Err(LdError::bad_request("MQTT-QoS is 0, 1 or 2")),
                },
            };
            let host = url.host_str().unwrap_or_default();
            let broker = match url.port() {
                Some(p) => format!("{}://{host}:{p}", url.scheme()),
                None => format!("{}://{host}", url.scheme()),
            };
            let user = (!url.username().is_empty()).then(|| url.username().to_string());
            Ok(Endpoint::Mqtt(MqttEndpoint {
                custom: false,
                url: broker,
                topic,
                qos,
                retain: false,
                passwd: user
                    .as_ref()
                    .map(|_| url.password().unwrap_or("").to_string()),
                user,
                payload: CustomPayload::Standard,
            }))
        }
        _ => Err(bad()),
    }
}

/// A selector that selects every entity (a subscription without
/// `entities`).
fn every_entity() -> EntitySelector {
    EntitySelector {
        id: None,
        id_pattern: None,
        entity_type: None,
        type_pattern: None,
    }
}

/// `entities`: a non-empty array of EntitySelectors, each with a `type`
/// and optionally an `id` or an `idPattern`. A type that is a selection
/// of alternatives (clause 4.17: `(Building|Tower)`, `Building,Tower`)
/// is a selector per type.
fn selectors(v: &Value, ctx: &Context) -> Result<Vec<EntitySelector>, LdError> {
    let items = v
        .as_array()
        .filter(|items| !items.is_empty())
        .ok_or_else(|| LdError::bad_request("entities is a non-empty array"))?;
    let mut out = Vec::new();
    for item in items {
        let alternatives: Vec<Value> = match item.get("type").and_then(Value::as_str) {
            Some(t) if t.contains(['|', ',', '(', ')']) => t
                .split(['|', ','])
                .map(|term| Value::String(term.trim_matches(['(', ')', ' ']).to_string()))
                .collect(),
            _ => vec![item.get("type").cloned().unwrap_or(Value::Null)],
        };
        for alternative in alternatives {
            let mut one = item.clone();
            if let Value::Object(map) = &mut one {
                if map.contains_key("type") {
                    map.insert("type".into(), alternative);
                }
            }
            out.push(selector(&one, ctx)?);
        }
    }
    Ok(out)
}

/// One EntitySelector of `entities`.
fn selector(item: &Value, ctx: &Context) -> Result<EntitySelector, LdError> {
    let obj = item
        .as_object()
        .ok_or_else(|| LdError::bad_request("an entities item is an object"))?;
    let entity_type = match obj.get("type") {
        Some(t) => super::entity::parse_type(t, ctx)?,
        None => {
            return Err(LdError::bad_request("an entities item names a type"));
        }
    };
    let id = match obj.get("id") {
        None => None,
        Some(Value::String(id)) if is_uri(id) => Some(id.clone()),
        Some(other) => {
            return Err(LdError::bad_request(format!(
                "an entities item's id is not a URI: {other}"
            )))
        }
    };
    let id_pattern = match obj.get("idPattern") {
        None => None,
        // An id names the one entity; a pattern beside it is moot.
        Some(_) if id.is_some() => None,
        Some(Value::String(p)) => {
            Some(Regex::new(p).map_err(|e| LdError::bad_request(format!("idPattern: {e}")))?)
        }
        Some(_) => return Err(LdError::bad_request("idPattern is a string")),
    };
    Ok(EntitySelector {
        id,
        id_pattern,
        entity_type: Some(entity_type),
        type_pattern: None,
    })
}

fn triggers(v: &Value) -> Result<Vec<Trigger>, LdError> {
    let items = v
        .as_array()
        .filter(|items| !items.is_empty())
        .ok_or_else(|| LdError::bad_request("notificationTrigger is a non-empty array"))?;
    let mut out = Vec::new();
    for item in items {
        let t = item.as_str().and_then(Trigger::from_name).ok_or_else(|| {
            LdError::bad_request(format!("notificationTrigger: unknown trigger {item}"))
        })?;
        if !out.contains(&t) {
            out.push(t);
        }
    }
    Ok(out)
}

fn geo(v: &Value, ctx: &Context) -> Result<GeoQ, LdError> {
    let obj = v
        .as_object()
        .ok_or_else(|| LdError::bad_request("geoQ is an object"))?;
    let field = |key: &str| -> Result<String, LdError> {
        match obj.get(key) {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(_) => Err(LdError::bad_request(format!("geoQ.{key} is a string"))),
            None => Err(LdError::bad_request(format!("geoQ.{key} is missing"))),
        }
    };
    let georel = field("georel")?;
    let geometry = field("geometry")?;
    let coordinates = obj
        .get("coordinates")
        .cloned()
        .ok_or_else(|| LdError::bad_request("geoQ.coordinates is missing"))?;
    let coords_text = match &coordinates {
        Value::String(s) => s.clone(),
        Value::Array(_) => coordinates.to_string(),
        _ => return Err(LdError::bad_request("geoQ.coordinates is an array")),
    };
    let geoproperty = match obj.get("geoproperty") {
        None => None,
        Some(Value::String(p)) => Some(p.clone()),
        Some(_) => return Err(LdError::bad_request("geoQ.geoproperty is a string")),
    };
    let query = geo_query(Some(&georel), Some(&geometry), Some(&coords_text))?
        .ok_or_else(|| LdError::bad_request("geoQ is incomplete"))?;
    let stored_property = ctx.to_stored(geoproperty.as_deref().unwrap_or("location"));
    Ok(GeoQ {
        georel,
        geometry,
        coordinates,
        geoproperty,
        stored_property,
        query,
    })
}

/// An optional string member.
fn text(obj: &Map<String, Value>, key: &str) -> Result<Option<String>, LdError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(LdError::bad_request(format!("{key} is a string"))),
    }
}

/// An array of attribute names.
fn names(v: &Value, what: &str) -> Result<Vec<String>, LdError> {
    let items = v
        .as_array()
        .ok_or_else(|| LdError::bad_request(format!("{what} is an array of names")))?;
    let mut out: Vec<String> = Vec::with_capacity(items.len());
    for item in items {
        match item.as_str() {
            Some(n) if !n.is_empty() => {
                if !out.iter().any(|o| o == n) {
                    out.push(n.to_string());
                }
            }
            _ => return Err(LdError::bad_request(format!("{what} is an array of names"))),
        }
    }
    Ok(out)
}

/// Stored names as `ctx` shows them.
fn names_value(stored: &[String], ctx: &Context) -> Value {
    Value::Array(
        stored
            .iter()
            .map(|n| Value::String(ctx.from_stored(n)))
            .collect(),
    )
}

/// `receiverInfo`/`notifierInfo`: an array of `{"key", "value"}`.
fn key_value_list(v: Option<&Value>, what: &str) -> Result<Vec<(String, String)>, LdError> {
    let Some(v) = v else {
        return Ok(Vec::new());
    };
    let bad = || {
        LdError::bad_request(format!(
            "{what} is an array of {{\"key\", \"value\"}} strings"
        ))
    };
    v.as_array()
        .ok_or_else(bad)?
        .iter()
        .map(|item| {
            let key = item.get("key").and_then(Value::as_str).ok_or_else(bad)?;
            let value = item.get("value").and_then(Value::as_str).ok_or_else(bad)?;
            if key.is_empty() || key.contains(|c: char| c.is_whitespace() || c == ':') {
                return Err(bad());
            }
            Ok((key.to_string(), value.to_string()))
        })
        .collect()
}

fn key_values(list: &[(String, String)]) -> Value {
    Value::Array(
        list.iter()
            .map(|(k, v)| serde_json::json!({"key": k, "value": v}))
            .collect(),
    )
}

/// A stored system time, or `default`.
fn stamp(obj: &Map<String, Value>, key: &str, default: i64) -> i64 {
    obj.get(key)
        .and_then(Value::as_str)
        .and_then(parse_datetime)
        .unwrap_or(default)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ngsi_ld::ErrorKind;
    use serde_json::json;

    const NOW: i64 = 1_800_000_000_000;

    fn core() -> Arc<Context> {
        Context::core()
    }

    fn minimal() -> Value {
        json!({
            "type": "Subscription",
            "entities": [{"type": "Vehicle"}],
            "notification": {"endpoint": {"uri": "http://receiver.example/notify"}},
        })
    }

    #[test]
    fn a_minimal_subscription_takes_the_defaults() {
        let sub = parse(&minimal(), core(), "urn:ngsi-ld:Subscription:1".into(), NOW).unwrap();
        let ld = sub.ld.as_ref().unwrap();
        assert_eq!(ld.triggers, DEFAULT_TRIGGERS.to_vec());
        assert_eq!(ld.accept, Accept::Json);
        assert_eq!(sub.status, Status::Active);
        let shown = render(&sub, &core(), NOW, false).unwrap();
        assert_eq!(shown["id"], "urn:ngsi-ld:Subscription:1");
        assert_eq!(shown["status"], "active");
        assert!(shown.get("isActive").is_none(), "shown only when given");
        assert_eq!(shown["entities"], json!([{"type": "Vehicle"}]));
        assert_eq!(shown["notification"]["format"], "normalized");
        assert!(
            shown["notification"].get("status").is_none(),
            "nothing sent yet"
        );
        assert_eq!(
            shown["notification"]["endpoint"],
            json!({"uri": "http://receiver.example/notify", "accept": "application/json"})
        );
    }

    #[test]
    fn what_a_subscription_cannot_be_is_refused() {
        let refused = |mutate: &dyn Fn(&mut Value)| {
            let mut body = minimal();
            mutate(&mut body);
            parse(&body, core(), "urn:x:1".into(), NOW).unwrap_err()
        };
        assert_eq!(
            refused(&|b| b["type"] = json!("Other")).kind,
            ErrorKind::BadRequestData
        );
        assert_eq!(
            refused(&|b| b["id"] = json!("not a uri")).kind,
            ErrorKind::BadRequestData
        );
        refused(&|b| {
            b.as_object_mut().unwrap().remove("entities");
        });
        refused(&|b| b["entities"] = json!([{"id": "urn:x:1"}]));
        refused(&|b| b["watchedAttributes"] = json!([]));
        refused(&|b| b["notificationTrigger"] = json!(["entityExploded"]));
        refused(&|b| b["expiresAt"] = json!("2001-01-01T00:00:00Z"));
        refused(&|b| b["throttling"] = json!(-1));
        refused(&|b| b["q"] = json!("speed>"));
        refused(&|b| b["notification"]["endpoint"]["uri"] = json!("ftp://x/y"));
        refused(&|b| b["notification"]["endpoint"]["accept"] = json!("text/plain"));
        refused(&|b| b["notification"]["format"] = json!("values"));
        refused(&|b| b["notification"]["endpoint"]["uri"] = json!("mqtt://broker:1883"));
        refused(&|b| b["timeInterval"] = json!(0));
        refused(&|b| {
            b["timeInterval"] = json!(10);
            b["watchedAttributes"] = json!(["speed"]);
        });
        refused(&|b| {
            b["timeInterval"] = json!(10);
            b["throttling"] = json!(1);
        });
    }

    #[test]
    fn names_are_stored_expanded_and_shown_in_the_readers_terms() {
        let ctx = Arc::new(
            Context::build(
                &json!({"speed": "http://example.org/speed", "Car": "http://example.org/Car"}),
                &|_: &str| None,
            )
            .unwrap(),
        );
        let mut body = minimal();
        body["entities"] = json!([{"type": "Car"}]);
        body["watchedAttributes"] = json!(["speed"]);
        body["notification"]["attributes"] = json!(["speed", "brand"]);
        let sub = parse(&body, ctx.clone(), "urn:x:1".into(), NOW).unwrap();
        assert_eq!(
            sub.subject.condition.attrs,
            vec!["http://example.org/speed"]
        );
        assert_eq!(
            sub.subject.entities[0].entity_type.as_deref(),
            Some("http://example.org/Car")
        );
        assert_eq!(
            sub.notification.attrs,
            vec!["http://example.org/speed", "brand"]
        );
        // Its own context, or the core's: the client's terms come back.
        for reader in [ctx.clone(), core()] {
            let shown = render(&sub, &reader, NOW, false).unwrap();
            assert_eq!(shown["watchedAttributes"], json!(["speed"]));
            assert_eq!(shown["entities"][0]["type"], "Car");
        }
    }

    #[test]
    fn the_stored_form_reads_back_without_fetching_the_context() {
        let docs = |url: &str| {
            (url == "http://ctx.example/c.jsonld")
                .then(|| json!({"@context": {"speed": "http://example.org/speed"}}))
        };
        let ctx = Arc::new(Context::build(&json!("http://ctx.example/c.jsonld"), &docs).unwrap());
        let mut body = minimal();
        body["q"] = json!("speed>50");
        body["watchedAttributes"] = json!(["speed"]);
        body["expiresAt"] = json!("2030-01-01T00:00:00Z");
        body["notification"]["endpoint"]["uri"] = json!("mqtt://u:secret@broker:1883/cars/speed");
        body["notification"]["endpoint"]["notifierInfo"] =
            json!([{"key": "MQTT-QoS", "value": "1"}]);
        let mut sub = parse(&body, ctx, "urn:x:1".into(), NOW).unwrap();
        sub.notification.stats.times_sent = 7;
        sub.notification.stats.fails_counter = 2;
        let text = to_storage(&sub);
        let value: Value = serde_json::from_str(&text).unwrap();
        assert!(is_stored_ld(&value));
        let back = from_storage(&value).unwrap();
        let ld = back.ld.as_ref().unwrap();
        assert_eq!(ld.context.link_url(), "http://ctx.example/c.jsonld");
        assert_eq!(
            back.subject.condition.attrs,
            vec!["http://example.org/speed"]
        );
        assert_eq!(back.notification.stats.times_sent, 7);
        assert_eq!(back.notification.stats.fails_counter, 2);
        assert_eq!(ld.created_at, NOW);
        match &back.notification.endpoint {
            Endpoint::Mqtt(m) => {
                assert_eq!(
                    (m.url.as_str(), m.topic.as_str(), m.qos),
                    ("mqtt://broker:1883", "cars/speed", 1)
                );
                assert_eq!(m.passwd.as_deref(), Some("secret"));
            }
            other => panic!("not MQTT: {other:?}"),
        }
        // The password is not shown to clients.
        let shown = render(&back, &core(), NOW, false).unwrap();
        assert_eq!(
            shown["notification"]["endpoint"]["uri"],
            "mqtt://u:*****@broker:1883/cars/speed"
        );
    }

    #[test]
    fn a_patch_replaces_members_and_keeps_the_rest() {
        let mut body = minimal();
        body["notification"]["attributes"] = json!(["speed"]);
        body["description"] = json!("before");
        let mut sub = parse(&body, core(), "urn:x:1".into(), NOW).unwrap();
        sub.notification.stats.times_sent = 3;
        let next = patch(
            &sub,
            &json!({"isActive": false, "description": null, "notification": {"format": "keyValues"}}),
            core(),
            NOW + 1,
        )
        .unwrap();
        assert_eq!(next.status, Status::Inactive);
        assert!(next.description.is_none());
        let ld = next.ld.as_ref().unwrap();
        assert_eq!(ld.format, Format::KeyValues);
        assert_eq!(next.notification.attrs, vec!["speed"]);
        assert_eq!(next.notification.stats.times_sent, 3);
        assert_eq!((ld.created_at, ld.modified_at), (NOW, NOW + 1));
        let shown = render(&next, &core(), NOW, false).unwrap();
        assert_eq!(shown["status"], "paused");
        // A patch that breaks it changes nothing.
        assert!(patch(&sub, &json!({"throttling": "fast"}), core(), NOW).is_err());
    }
}
