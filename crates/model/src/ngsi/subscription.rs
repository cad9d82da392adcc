//! NGSIv2 subscriptions: what a client asks to be told about, parsed with
//! Orion's validation and error texts, and rendered back as Orion renders
//! them (`GET /v2/subscriptions`).
//!
//! A [`Subscription`] is pure data: which entities ([`Subject`]), when
//! ([`Condition`]), how to notify ([`Notification`]) and the life cycle
//! (`expires`, `status`, `throttling`). Matching a change and sending
//! notifications is the pipeline's job; the counters it keeps
//! ([`NotificationStats`]) are rendered here with the rest.
//!
//! The same parser reads stored subscriptions back: the store keeps the
//! rendered JSON ([`Subscription::to_storage`]), so one format serves the
//! API and the disk.

use regex::Regex;
use serde_json::{Map, Value};

use super::parse::{is_valid_url, FORBIDDEN_CHARS};
use super::{format_datetime, parse_datetime, Format, NgsiError};
use crate::geo::GeoQuery;
use crate::query::Query;

/// Longest `description` Orion accepts.
pub const MAX_DESCRIPTION_LEN: usize = 1024;

/// A subscription: subject, notification and life cycle.
#[derive(Debug, Clone)]
pub struct Subscription {
    /// 24 hexadecimal digits, as Orion's (Mongo) ids.
    pub id: String,
    /// Free text.
    pub description: Option<String>,
    /// Which entities and which changes.
    pub subject: Subject,
    /// Where and what to send.
    pub notification: Notification,
    /// When the subscription stops (epoch ms); rendered `expired` after.
    pub expires: Option<i64>,
    /// `active`, `inactive` or `oneshot`, as the client set it (or as the
    /// sender left it: a oneshot that fired and a subscription past
    /// `maxFailsLimit` become `inactive`).
    pub status: Status,
    /// Minimum seconds between two notifications.
    pub throttling: Option<f64>,
    /// What an NGSI-LD subscription has besides (`None`: an NGSIv2 one).
    /// The two APIs share the registry, the matcher and the sender; each
    /// lists and changes only its own.
    pub ld: Option<Box<crate::ngsi_ld::subscription::LdSubscription>>,
}

/// The status a client can set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Notifies.
    Active,
    /// Does not notify.
    Inactive,
    /// Notifies once, then becomes inactive.
    Oneshot,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::Active => "active",
            Status::Inactive => "inactive",
            Status::Oneshot => "oneshot",
        }
    }
}

/// Which entities a subscription watches and on what changes.
#[derive(Debug, Clone)]
pub struct Subject {
    /// Entity selectors (any of).
    pub entities: Vec<EntitySelector>,
    /// When to notify.
    pub condition: Condition,
    /// Whether the client sent a `condition` object (rendered back as sent).
    pub has_condition: bool,
}

/// One `subject.entities` item: `id` or `idPattern`, and optionally `type`
/// or `typePattern`.
#[derive(Debug, Clone)]
pub struct EntitySelector {
    /// Exact id.
    pub id: Option<String>,
    /// Id regex (source text and compiled).
    pub id_pattern: Option<Regex>,
    /// Exact type.
    pub entity_type: Option<String>,
    /// Type regex.
    pub type_pattern: Option<Regex>,
}

impl EntitySelector {
    /// Whether an entity with this id and type is selected.
    pub fn matches(&self, id: &str, entity_type: &str) -> bool {
        self.id.as_deref().is_none_or(|i| i == id)
            && self.id_pattern.as_ref().is_none_or(|r| r.is_match(id))
            && self.entity_type.as_deref().is_none_or(|t| t == entity_type)
            && self
                .type_pattern
                .as_ref()
                .is_none_or(|r| r.is_match(entity_type))
    }
}

/// The kinds of change a subscription can ask for (`alterationTypes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlterationType {
    /// An entity was created.
    EntityCreate,
    /// An entity was updated, whether or not anything changed.
    EntityUpdate,
    /// An entity was updated and something actually changed.
    EntityChange,
    /// An entity was deleted.
    EntityDelete,
}

impl AlterationType {
    /// Orion's name.
    pub fn as_str(self) -> &'static str {
        match self {
            AlterationType::EntityCreate => "entityCreate",
            AlterationType::EntityUpdate => "entityUpdate",
            AlterationType::EntityChange => "entityChange",
            AlterationType::EntityDelete => "entityDelete",
        }
    }

    fn from_name(s: &str) -> Option<Self> {
        Some(match s {
            "entityCreate" => AlterationType::EntityCreate,
            "entityUpdate" => AlterationType::EntityUpdate,
            "entityChange" => AlterationType::EntityChange,
            "entityDelete" => AlterationType::EntityDelete,
            _ => return None,
        })
    }
}

/// When a subscription fires.
#[derive(Debug, Clone)]
pub struct Condition {
    /// Fire only when one of these attributes is touched (empty: any).
    pub attrs: Vec<String>,
    /// Filter on the entity after the change.
    pub expression: Option<Expression>,
    /// `jexlExpression`: a JEXL expression on the entity after the change
    /// that must evaluate to `true` (ANDed with `expression`).
    pub jexl_expression: Option<String>,
    /// Kinds of change (empty: create and change, Orion's default).
    pub alteration_types: Vec<AlterationType>,
    /// Whether a metadata-only change counts as a change.
    pub notify_on_metadata_change: bool,
}

impl Condition {
    /// Whether this kind of change is asked for.
    pub fn wants(&self, kind: AlterationType) -> bool {
        if self.alteration_types.is_empty() {
            matches!(
                kind,
                AlterationType::EntityCreate | AlterationType::EntityChange
            )
        } else {
            self.alteration_types.contains(&kind)
        }
    }
}

/// `condition.expression`: `q`, `mq` and a geo-query, kept as sent and
/// compiled.
#[derive(Debug, Clone, Default)]
pub struct Expression {
    /// `q` text.
    pub q_text: Option<String>,
    /// `q` compiled.
    pub q: Option<Query>,
    /// `mq` text.
    pub mq_text: Option<String>,
    /// `mq` compiled.
    pub mq: Option<Query>,
    /// `georel`, `geometry`, `coords` as sent.
    pub geo_text: Option<(String, String, String)>,
    /// The geo-query compiled.
    pub geo: Option<GeoQuery>,
}

/// How and what to notify.
#[derive(Debug, Clone)]
pub struct Notification {
    /// Attributes to include (empty: all).
    pub attrs: Vec<String>,
    /// Attributes to leave out (`exceptAttrs`), instead of `attrs`.
    pub except_attrs: Option<Vec<String>>,
    /// Representation of the entities.
    pub attrs_format: Format,
    /// Metadata to include (empty: all user metadata).
    pub metadata: Vec<String>,
    /// Only the attributes the change touched.
    pub only_changed_attrs: bool,
    /// Include `attrs` the entity lacks, as `null`.
    pub covered: bool,
    /// Where to send.
    pub endpoint: Endpoint,
    /// After this many consecutive failures the subscription goes inactive.
    pub max_fails_limit: Option<u64>,
    /// How hard weft tries to deliver (`delivery`, weft's own field).
    pub delivery: Guarantee,
    /// Counters kept by the sender.
    pub stats: NotificationStats,
}

/// How a subscription's notifications are delivered: weft's
/// `notification.delivery`, which Orion does not have (it always sends
/// once).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Guarantee {
    /// `atLeastOnce` (the default): every notification a committed change
    /// owes is sent until the receiver answers, across restarts.
    #[default]
    AtLeastOnce,
    /// `atMostOnce`: Orion's fire-and-forget; a notification that gets no
    /// answer is counted as failed and not sent again.
    AtMostOnce,
}

impl Guarantee {
    /// The field's value.
    pub fn as_str(self) -> &'static str {
        match self {
            Guarantee::AtLeastOnce => "atLeastOnce",
            Guarantee::AtMostOnce => "atMostOnce",
        }
    }
}

/// A notification endpoint.
#[derive(Debug, Clone)]
pub enum Endpoint {
    /// `http`: POST of the standard payload.
    Http {
        /// Target URL.
        url: String,
        /// Milliseconds (0: the server's default).
        timeout: Option<u64>,
    },
    /// `httpCustom`: method, headers, query and payload chosen by the
    /// client, with `${…}` macros.
    HttpCustom(CustomHttp),
    /// `mqtt` or `mqttCustom`: one MQTT publish per notification.
    Mqtt(MqttEndpoint),
}

impl Endpoint {
    /// The target URL (before macro substitution).
    pub fn url(&self) -> &str {
        match self {
            Endpoint::Http { url, .. } => url,
            Endpoint::HttpCustom(c) => &c.url,
            Endpoint::Mqtt(m) => &m.url,
        }
    }

    /// The `httpCustom` settings, if it is one.
    pub fn custom(&self) -> Option<&CustomHttp> {
        match self {
            Endpoint::Http { .. } | Endpoint::Mqtt(_) => None,
            Endpoint::HttpCustom(c) => Some(c),
        }
    }

    /// The request timeout in milliseconds, if the subscription sets one.
    pub fn timeout(&self) -> Option<u64> {
        match self {
            Endpoint::Http { timeout, .. } => *timeout,
            Endpoint::HttpCustom(c) => c.timeout,
            Endpoint::Mqtt(_) => None,
        }
    }
}

/// An `mqtt` or `mqttCustom` endpoint, as Orion takes them: a broker URL
/// (`mqtt://host:port`, no path), a topic (macros allowed in
/// `mqttCustom`), a QoS, `retain`, and optional credentials.
#[derive(Debug, Clone)]
pub struct MqttEndpoint {
    /// `mqttCustom` rather than `mqtt`: the topic and payload are templates.
    pub custom: bool,
    /// `mqtt://host:port`.
    pub url: String,
    /// The topic published on (a template in `mqttCustom`).
    pub topic: String,
    /// 0, 1 or 2.
    pub qos: u8,
    /// Whether the broker keeps the message as the topic's retained one.
    pub retain: bool,
    /// User name on the broker, with `passwd`.
    pub user: Option<String>,
    /// Password on the broker; stored, never shown back.
    pub passwd: Option<String>,
    /// The payload (`mqttCustom`'s `payload`/`json`/`ngsi`; the standard
    /// notification otherwise).
    pub payload: CustomPayload,
}

/// An `httpCustom` endpoint.
#[derive(Debug, Clone)]
pub struct CustomHttp {
    /// URL template.
    pub url: String,
    /// HTTP method (default POST).
    pub method: Option<String>,
    /// Header templates, in order.
    pub headers: Vec<(String, String)>,
    /// Query-string templates, in order.
    pub qs: Vec<(String, String)>,
    /// The body, if not the standard one.
    pub payload: CustomPayload,
    /// Milliseconds.
    pub timeout: Option<u64>,
}

/// The body of a custom notification.
#[derive(Debug, Clone)]
pub enum CustomPayload {
    /// The standard NGSI payload.
    Standard,
    /// `payload`: a text template (`null` in the request: no body).
    Text(Option<String>),
    /// `json`: a JSON template whose strings may hold macros.
    Json(Value),
    /// `ngsi`: an entity patch (id, type, attributes with macros) merged
    /// into the notified entity.
    Ngsi(Map<String, Value>),
}

/// The sender's counters, rendered in `notification`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NotificationStats {
    /// Notifications sent (attempted).
    pub times_sent: u64,
    /// Last attempt (epoch ms).
    pub last_notification: Option<i64>,
    /// Last failure (epoch ms).
    pub last_failure: Option<i64>,
    /// Why it failed.
    pub last_failure_reason: Option<String>,
    /// Last success (epoch ms).
    pub last_success: Option<i64>,
    /// HTTP status of the last success.
    pub last_success_code: Option<u16>,
    /// Consecutive failures.
    pub fails_counter: u64,
}

impl NotificationStats {
    /// The counters after adding, to `self` (the counters stored now),
    /// what one node counted since it last read them (`base`) up to now
    /// (`local`): sums of what is counted, the latest of what is dated.
    /// Several nodes notifying for one subscription each add their own
    /// share this way, and none is lost.
    pub fn merged(&self, base: &NotificationStats, local: &NotificationStats) -> NotificationStats {
        let mut out = self.clone();
        out.times_sent += local.times_sent.saturating_sub(base.times_sent);
        out.last_notification = out.last_notification.max(local.last_notification);
        if local.last_success > out.last_success {
            out.last_success = local.last_success;
            out.last_success_code = local.last_success_code;
        }
        if local.last_failure > out.last_failure {
            out.last_failure = local.last_failure;
            out.last_failure_reason = local.last_failure_reason.clone();
        }
        // Consecutive failures: none once the latest outcome anywhere is a
        // success; else the stored run plus this node's new failures.
        out.fails_counter = if out.last_success.is_some() && out.last_success >= out.last_failure {
            0
        } else if local.last_success > base.last_success {
            // This node's run restarted after a success of its own.
            self.fails_counter.max(local.fails_counter)
        } else {
            self.fails_counter + local.fails_counter.saturating_sub(base.fails_counter)
        };
        out
    }
}

impl Subscription {
    /// Parses `POST /v2/subscriptions` bodies. `id` is the id to give it.
    pub fn parse(body: &Value, id: String) -> Result<Subscription, NgsiError> {
        let obj = body.as_object().ok_or_else(NgsiError::parse_error)?;
        let description = parse_description(obj.get("description"))?;
        let subject = match obj.get("subject") {
            Some(s) => parse_subject(s)?,
            None => return Err(bad("no subject for subscription specified")),
        };
        let notification = match obj.get("notification") {
            Some(n) => parse_notification(n)?,
            None => return Err(bad("no notification for subscription specified")),
        };
        let expires = parse_expires(obj.get("expires"))?;
        let status = parse_status(obj.get("status"))?.unwrap_or(Status::Active);
        let throttling = parse_throttling(obj.get("throttling"))?;
        let mut sub = Subscription {
            id,
            description,
            subject,
            notification,
            expires,
            status,
            throttling,
            ld: None,
        };
        if let Some(stats) = obj.get("notification") {
            sub.notification.stats = parse_stats(stats);
        }
        Ok(sub)
    }

    /// Applies `PATCH /v2/subscriptions/{id}`: each top-level field given
    /// replaces the current one; the counters are kept.
    pub fn patch(&mut self, body: &Value) -> Result<(), NgsiError> {
        let obj = body.as_object().ok_or_else(NgsiError::parse_error)?;
        if obj.is_empty() {
            return Err(bad("empty payload"));
        }
        let mut next = self.clone();
        for (key, value) in obj {
            match key.as_str() {
                "description" => next.description = parse_description(Some(value))?,
                "subject" => next.subject = parse_subject(value)?,
                "notification" => {
                    let stats = std::mem::take(&mut next.notification.stats);
                    next.notification = parse_notification(value)?;
                    next.notification.stats = stats;
                }
                "expires" => next.expires = parse_expires(Some(value))?,
                "status" => next.status = parse_status(Some(value))?.unwrap_or(next.status),
                "throttling" => next.throttling = parse_throttling(Some(value))?,
                // Orion ignores fields it does not know.
                _ => {}
            }
        }
        *self = next;
        Ok(())
    }

    /// Whether this is an NGSI-LD subscription.
    pub fn is_ld(&self) -> bool {
        self.ld.is_some()
    }

    /// Whether the subscription is past `expires` at `now`.
    pub fn expired(&self, now: i64) -> bool {
        self.expires.is_some_and(|e| e <= now)
    }

    /// Orion's rendering, `expired` status included; an MQTT password is
    /// not shown.
    pub fn render(&self, now: i64) -> Value {
        self.render_with(now, false)
    }

    /// Orion's rendering, field for field in its order (asked of the
    /// real Orion 4.7.0): `id`, `description`, `expires`, `status`,
    /// `subject`, `notification`, `throttling`.
    fn render_with(&self, now: i64, secrets: bool) -> Value {
        let mut out = Map::new();
        out.insert("id".into(), self.id.clone().into());
        if let Some(d) = &self.description {
            out.insert("description".into(), d.clone().into());
        }
        if let Some(e) = self.expires {
            out.insert("expires".into(), format_datetime(e).into());
        }
        let status = if self.expired(now) {
            "expired"
        } else {
            self.status.as_str()
        };
        out.insert("status".into(), status.into());
        out.insert("subject".into(), render_subject(&self.subject));
        out.insert(
            "notification".into(),
            render_notification(&self.notification, secrets),
        );
        if let Some(t) = self.throttling.filter(|t| *t > 0.0) {
            out.insert("throttling".into(), number(t));
        }
        Value::Object(out)
    }

    /// The form kept in the store: the rendering, with the status the
    /// client set (not `expired`) and the MQTT password.
    pub fn to_storage(&self) -> String {
        if self.ld.is_some() {
            return crate::ngsi_ld::subscription::to_storage(self);
        }
        let mut v = self.render_with(i64::MIN, true);
        v["status"] = self.status.as_str().into();
        v.to_string()
    }

    /// Reads [`Subscription::to_storage`] back.
    pub fn from_storage(text: &str) -> Result<Subscription, NgsiError> {
        let value: Value = serde_json::from_str(text).map_err(|_| NgsiError::parse_error())?;
        if crate::ngsi_ld::subscription::is_stored_ld(&value) {
            return crate::ngsi_ld::subscription::from_storage(&value)
                .map_err(|e| NgsiError::bad_request(e.detail));
        }
        let id = value
            .get("id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        Subscription::parse(&value, id)
    }
}

fn bad(text: impl Into<String>) -> NgsiError {
    NgsiError::bad_request(text)
}

/// A JSON number as Orion writes it: integral values without a fraction.
pub(crate) fn number(n: f64) -> Value {
    if n.fract() == 0.0 && n.abs() < 1e15 {
        Value::from(n as i64)
    } else {
        Value::from(n)
    }
}

fn parse_description(v: Option<&Value>) -> Result<Option<String>, NgsiError> {
    match v {
        None => Ok(None),
        Some(Value::String(s)) => {
            if s.chars().count() > MAX_DESCRIPTION_LEN {
                return Err(bad(format!(
                    "max description length exceeded: {} (max: {MAX_DESCRIPTION_LEN})",
                    s.chars().count()
                )));
            }
            if s.contains(FORBIDDEN_CHARS) {
                return Err(bad("forbidden characters in description"));
            }
            Ok(Some(s.clone()))
        }
        Some(_) => Err(bad("description is not a string")),
    }
}

fn parse_expires(v: Option<&Value>) -> Result<Option<i64>, NgsiError> {
    match v {
        None => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => parse_datetime(s)
            .map(Some)
            .ok_or_else(|| bad("expires has an invalid format")),
        Some(_) => Err(bad("expires is not a string")),
    }
}

fn parse_status(v: Option<&Value>) -> Result<Option<Status>, NgsiError> {
    match v {
        None => Ok(None),
        Some(Value::String(s)) => match s.as_str() {
            "active" => Ok(Some(Status::Active)),
            "inactive" => Ok(Some(Status::Inactive)),
            "oneshot" => Ok(Some(Status::Oneshot)),
            _ => Err(bad(
                "status is not valid: it has to be either active, inactive or oneshot",
            )),
        },
        Some(_) => Err(bad("status is not a string")),
    }
}

fn parse_throttling(v: Option<&Value>) -> Result<Option<f64>, NgsiError> {
    match v {
        None => Ok(None),
        // A negative throttling is taken as none, as the real Orion 4.7.0
        // takes it (201, and not shown).
        Some(Value::Number(n)) => Ok(Some(n.as_f64().unwrap_or(0.0).max(0.0))),
        Some(_) => Err(bad("throttling is not a number")),
    }
}

fn parse_subject(v: &Value) -> Result<Subject, NgsiError> {
    let obj = v
        .as_object()
        .ok_or_else(|| bad("subject is not an object"))?;
    let entities = match obj.get("entities") {
        None => return Err(bad("no subject entities specified")),
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(bad("subject entities is empty"))
        }
        Some(Value::Array(items)) => items
            .iter()
            .map(parse_selector)
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => return Err(bad("/entities/ is not an array")),
    };
    let (condition, has_condition) = match obj.get("condition") {
        None => (
            Condition {
                attrs: Vec::new(),
                expression: None,
                jexl_expression: None,
                alteration_types: Vec::new(),
                notify_on_metadata_change: true,
            },
            false,
        ),
        Some(c) => (parse_condition(c)?, true),
    };
    Ok(Subject {
        entities,
        condition,
        has_condition,
    })
}

fn parse_selector(v: &Value) -> Result<EntitySelector, NgsiError> {
    let obj = v
        .as_object()
        .ok_or_else(|| bad("/entities/ vector item is not an object"))?;
    let text = |key: &str| -> Result<Option<&str>, NgsiError> {
        match obj.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(_) => Err(bad(format!(
                "/entities/ vector item /{key}/ is not a string"
            ))),
        }
    };
    let id = text("id")?;
    let id_pattern = text("idPattern")?;
    let etype = text("type")?;
    let type_pattern = text("typePattern")?;
    match (id, id_pattern) {
        (Some(_), Some(_)) => {
            return Err(bad("/entities/ vector item has both /id/ and /idPattern/"))
        }
        (None, None) => {
            return Err(bad(
                "/entities/ vector item does not have /id/ nor /idPattern/",
            ))
        }
        _ => {}
    }
    if etype.is_some() && type_pattern.is_some() {
        return Err(bad(
            "/entities/ vector item has both /type/ and /typePattern/",
        ));
    }
    if id == Some("") {
        return Err(bad("/entities/ element id is empty"));
    }
    if id_pattern == Some("") {
        return Err(bad("/entities/ element idPattern is empty"));
    }
    if etype == Some("") {
        return Err(bad("/entities/ element type is empty"));
    }
    if type_pattern == Some("") {
        return Err(bad("/entities/ element typePattern is empty"));
    }
    if let Some(i) = id {
        if i.contains(FORBIDDEN_CHARS) {
            return Err(bad("forbidden characters in /entities/ vector item /id/"));
        }
    }
    if let Some(t) = etype {
        if t.contains(FORBIDDEN_CHARS) {
            return Err(bad("forbidden characters in /entities/ vector item /type/"));
        }
    }
    let compile = |p: &str, what: &str| {
        Regex::new(p).map_err(|_| bad(format!("Invalid regex for entity {what}")))
    };
    Ok(EntitySelector {
        id: id.map(str::to_string),
        id_pattern: id_pattern.map(|p| compile(p, "idPattern")).transpose()?,
        entity_type: etype.map(str::to_string),
        type_pattern: type_pattern
            .map(|p| compile(p, "typePattern"))
            .transpose()?,
    })
}

fn string_list(v: &Value, what: &str) -> Result<Vec<String>, NgsiError> {
    let items = v
        .as_array()
        .ok_or_else(|| bad(format!("{what} is not an array")))?;
    items
        .iter()
        .map(|i| {
            i.as_str()
                .map(str::to_string)
                .ok_or_else(|| bad(format!("{what} item is not a string")))
        })
        .collect()
}

fn check_attr_names(names: &[String]) -> Result<(), NgsiError> {
    for n in names {
        if n.is_empty() {
            return Err(bad("attribute name length: 0, min length supported: 1"));
        }
        if n.contains(FORBIDDEN_CHARS) {
            return Err(bad("Invalid characters in attribute name"));
        }
    }
    Ok(())
}

fn parse_condition(v: &Value) -> Result<Condition, NgsiError> {
    let obj = v
        .as_object()
        .ok_or_else(|| bad("condition is not an object"))?;
    if obj.is_empty() {
        return Err(bad("condition is empty"));
    }
    let attrs = match obj.get("attrs") {
        Some(a) => string_list(a, "condition attrs")?,
        None => Vec::new(),
    };
    check_attr_names(&attrs)?;
    let expression = match obj.get("expression") {
        Some(e) => Some(parse_expression(e)?),
        None => None,
    };
    let jexl_expression = match obj.get("jexlExpression") {
        None => None,
        Some(Value::String(e)) => Some(e.clone()),
        Some(_) => return Err(bad("jexlExpression is not a string")),
    };
    let mut alteration_types = Vec::new();
    if let Some(a) = obj.get("alterationTypes") {
        for name in string_list(a, "alterationTypes")? {
            let t = AlterationType::from_name(&name)
                .ok_or_else(|| bad(format!("unknown subscription alterationType: {name}")))?;
            if !alteration_types.contains(&t) {
                alteration_types.push(t);
            }
        }
    }
    let notify_on_metadata_change = match obj.get("notifyOnMetadataChange") {
        None => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("notifyOnMetadataChange is not a bool")),
    };
    Ok(Condition {
        attrs,
        expression,
        jexl_expression,
        alteration_types,
        notify_on_metadata_change,
    })
}

fn parse_expression(v: &Value) -> Result<Expression, NgsiError> {
    let obj = v
        .as_object()
        .ok_or_else(|| bad("expression is not an object"))?;
    let text = |key: &str| -> Result<Option<String>, NgsiError> {
        match obj.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(bad(format!("{key} is not a string"))),
        }
    };
    let mut e = Expression::default();
    if let Some(q) = text("q")? {
        if !q.is_empty() {
            e.q = Some(Query::parse(&q).map_err(|err| bad(err.description()))?);
        }
        e.q_text = Some(q);
    }
    if let Some(mq) = text("mq")? {
        if !mq.is_empty() {
            e.mq = Some(Query::parse_mq(&mq).map_err(|err| bad(err.description()))?);
        }
        e.mq_text = Some(mq);
    }
    let georel = text("georel")?.unwrap_or_default();
    let geometry = text("geometry")?.unwrap_or_default();
    let coords = text("coords")?.unwrap_or_default();
    if !(georel.is_empty() && geometry.is_empty() && coords.is_empty()) {
        // All three or none, with Orion's `expression` texts.
        fn given(s: &str) -> Option<&str> {
            (!s.is_empty()).then_some(s)
        }
        e.geo = GeoQuery::from_expression(given(&georel), given(&geometry), given(&coords))
            .map_err(|err| bad(err.description()))?;
        e.geo_text = Some((georel, geometry, coords));
    }
    Ok(e)
}

fn parse_notification(v: &Value) -> Result<Notification, NgsiError> {
    let obj = v
        .as_object()
        .ok_or_else(|| bad("notification is not an object"))?;
    let attrs = match obj.get("attrs") {
        Some(a) => string_list(a, "notification attrs")?,
        None => Vec::new(),
    };
    let except_attrs = match obj.get("exceptAttrs") {
        Some(a) => {
            let list = string_list(a, "notification exceptAttrs")?;
            if list.is_empty() {
                return Err(bad("http notification has exceptAttrs is empty"));
            }
            Some(list)
        }
        None => None,
    };
    if except_attrs.is_some() && obj.contains_key("attrs") {
        return Err(bad("http notification has attrs and exceptAttrs"));
    }
    check_attr_names(&attrs)?;
    let attrs_format = match obj.get("attrsFormat") {
        None => Format::Normalized,
        Some(Value::String(s)) => match Format::from_name(s) {
            Some(
                f @ (Format::Normalized
                | Format::KeyValues
                | Format::Values
                | Format::SimplifiedNormalized
                | Format::SimplifiedKeyValues),
            ) => f,
            _ => return Err(bad(
                "invalid attrsFormat, accepted values: normalized, simplifiedNormalized, keyValues, simplifiedkeyValues, values",
            )),
        },
        Some(_) => return Err(bad("attrsFormat is not a string")),
    };
    let metadata = match obj.get("metadata") {
        Some(m) => string_list(m, "metadata")?,
        None => Vec::new(),
    };
    let flag = |key: &str| -> Result<bool, NgsiError> {
        match obj.get(key) {
            None => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(bad(format!("{key} is not a bool"))),
        }
    };
    let only_changed_attrs = flag("onlyChangedAttrs")?;
    let covered = flag("covered")?;
    let max_fails_limit = match obj.get("maxFailsLimit") {
        None => None,
        Some(Value::Number(n)) => match n.as_u64() {
            Some(0) | None => return Err(bad("maxFailsLimit must be greater than zero")),
            Some(n) => Some(n),
        },
        Some(_) => return Err(bad("maxFailsLimit is not a number")),
    };
    let delivery = match obj.get("delivery") {
        None => Guarantee::AtLeastOnce,
        Some(Value::String(s)) if s == "atLeastOnce" => Guarantee::AtLeastOnce,
        Some(Value::String(s)) if s == "atMostOnce" => Guarantee::AtMostOnce,
        Some(_) => return Err(bad("delivery must be atLeastOnce or atMostOnce")),
    };
    let given: Vec<&str> = ["http", "httpCustom", "mqtt", "mqttCustom"]
        .into_iter()
        .filter(|k| obj.contains_key(*k))
        .collect();
    let endpoint =
        match given.as_slice() {
            ["http"] => parse_http(&obj["http"])?,
            ["httpCustom"] => Endpoint::HttpCustom(parse_custom(&obj["httpCustom"])?),
            ["mqtt"] => Endpoint::Mqtt(parse_mqtt(&obj["mqtt"], false)?),
            ["mqttCustom"] => Endpoint::Mqtt(parse_mqtt(&obj["mqttCustom"], true)?),
            ["http", "httpCustom"] => return Err(bad("notification has both http and httpCustom")),
            [] => {
                return Err(bad(
                    "http, httpCustom, mqtt, mqttCustom, kafka or kafkaCustom is missing",
                ))
            }
            _ => return Err(bad(
                "only one of http, httpCustom, mqtt, mqttCustom, kafka or kafkaCustom is allowed",
            )),
        };
    if covered && attrs.is_empty() {
        return Err(bad(
            "covered true cannot be used if notification attributes list is empty",
        ));
    }
    Ok(Notification {
        attrs,
        except_attrs,
        attrs_format,
        metadata,
        only_changed_attrs,
        covered,
        endpoint,
        max_fails_limit,
        delivery,
        stats: NotificationStats::default(),
    })
}

fn parse_timeout(obj: &Map<String, Value>) -> Result<Option<u64>, NgsiError> {
    match obj.get("timeout") {
        None => Ok(None),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(t) if t <= 1_800_000 => Ok(Some(t).filter(|t| *t > 0)),
            _ => Err(bad(
                "timeout field must be an integer between 0 and 1800000",
            )),
        },
        Some(_) => Err(bad(
            "timeout field must be an integer between 0 and 1800000",
        )),
    }
}

fn parse_http(v: &Value) -> Result<Endpoint, NgsiError> {
    let obj = v
        .as_object()
        .ok_or_else(|| bad("http notification is not an object"))?;
    let url = match obj.get("url") {
        Some(Value::String(u)) => u.clone(),
        Some(_) => return Err(bad("url http notification is not a string")),
        None => return Err(bad("url http notification is missing")),
    };
    if url.is_empty() || !is_valid_url(&url, true) {
        return Err(bad("Invalid URL parsing notification url"));
    }
    Ok(Endpoint::Http {
        url,
        timeout: parse_timeout(obj)?,
    })
}

/// Parses `mqtt` / `mqttCustom` as Orion does: `url` `mqtt://host[:port]`
/// without a path, a `topic` without wildcards, `qos` 0–2 (default 0),
/// `retain` (default false), `user` and `passwd` together; `mqttCustom`
/// adds `payload`/`json`/`ngsi` (macros in those and in the topic).
fn parse_mqtt(v: &Value, custom: bool) -> Result<MqttEndpoint, NgsiError> {
    let kind = if custom { "mqttCustom" } else { "mqtt" };
    let obj = v
        .as_object()
        .ok_or_else(|| bad(format!("{kind} notification is not an object")))?;
    let url = match obj.get("url") {
        Some(Value::String(u)) => u.clone(),
        Some(_) => return Err(bad(format!("url {kind} notification is not a string"))),
        None => return Err(bad(format!("url {kind} notification is missing"))),
    };
    check_mqtt_url(&url)?;
    let topic = match obj.get("topic") {
        Some(Value::String(t)) => t.clone(),
        Some(_) => return Err(bad(format!("topic {kind} notification is not a string"))),
        None => return Err(bad(format!("topic {kind} notification is missing"))),
    };
    if topic.is_empty() {
        return Err(bad(format!("topic {kind} notification is empty")));
    }
    if topic.contains(['+', '#']) {
        return Err(bad("+ and # are not allowed in mqtt notification topic"));
    }
    if topic.contains(FORBIDDEN_CHARS) {
        return Err(bad(format!("forbidden characters in {kind} /topic/")));
    }
    let qos = match obj.get("qos") {
        None => 0,
        Some(Value::Number(n)) => match n.as_u64() {
            Some(q @ 0..=2) => q as u8,
            _ => return Err(bad("MQTT QoS must be an uint in the 0 to 2 range")),
        },
        Some(_) => return Err(bad("MQTT QoS must be an uint in the 0 to 2 range")),
    };
    let retain = match obj.get("retain") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad(format!("retain {kind} notification is not a bool"))),
    };
    let text = |key: &str| -> Result<Option<String>, NgsiError> {
        match obj.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(bad(format!("{key} {kind} notification is not a string"))),
        }
    };
    let (user, passwd) = (text("user")?, text("passwd")?);
    if user.is_some() != passwd.is_some() {
        return Err(bad(
            "you must use user and passwd fields simultaneously in MQTT notifications",
        ));
    }
    let payload = if custom {
        parse_custom_payload(obj)?
    } else {
        CustomPayload::Standard
    };
    Ok(MqttEndpoint {
        custom,
        url,
        topic,
        qos,
        retain,
        user,
        passwd,
        payload,
    })
}

/// An MQTT notification URL: `mqtt://host[:port]`, nothing after the port.
fn check_mqtt_url(url: &str) -> Result<(), NgsiError> {
    let Some(rest) = url.strip_prefix("mqtt://") else {
        return Err(bad("Invalid URL parsing notification url"));
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if !path.is_empty() && path != "/" {
        return Err(bad("path cannot be used in mqtt url, use topic instead"));
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => (h, Some(p)),
        _ => (authority, None),
    };
    let port_ok = port.is_none_or(|p| p.parse::<u16>().is_ok_and(|p| p > 0));
    if host.is_empty() || !port_ok || host.contains(['@', '?', '#', ' ']) {
        return Err(bad("Invalid URL parsing notification url"));
    }
    Ok(())
}

fn string_map(v: Option<&Value>, what: &str) -> Result<Vec<(String, String)>, NgsiError> {
    match v {
        None => Ok(Vec::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                _ => Err(bad(format!("{what} values must be strings"))),
            })
            .collect(),
        Some(_) => Err(bad(format!("{what} is not an object"))),
    }
}

fn parse_custom(v: &Value) -> Result<CustomHttp, NgsiError> {
    let obj = v
        .as_object()
        .ok_or_else(|| bad("httpCustom notification is not an object"))?;
    let url = match obj.get("url") {
        Some(Value::String(u)) => u.clone(),
        Some(_) => return Err(bad("url httpCustom notification is not a string")),
        None => return Err(bad("url httpCustom notification is missing")),
    };
    if url.is_empty() {
        return Err(bad("invalid custom /url/"));
    }
    // A URL with macros is checked when they are replaced.
    if !url.contains("${") && !is_valid_url(&url, true) {
        return Err(bad("Invalid URL parsing notification url"));
    }
    let method = match obj.get("method") {
        None => None,
        Some(Value::String(m)) => {
            let m = m.to_ascii_uppercase();
            if !matches!(
                m.as_str(),
                "GET"
                    | "POST"
                    | "PUT"
                    | "PATCH"
                    | "DELETE"
                    | "HEAD"
                    | "OPTIONS"
                    | "TRACE"
                    | "CONNECT"
            ) {
                return Err(bad("invalid HTTP method"));
            }
            Some(m)
        }
        Some(_) => return Err(bad("method is not a string")),
    };
    let headers = string_map(obj.get("headers"), "headers")?;
    let qs = string_map(obj.get("qs"), "qs")?;
    let payload = parse_custom_payload(obj)?;
    Ok(CustomHttp {
        url,
        method,
        headers,
        qs,
        payload,
        timeout: parse_timeout(obj)?,
    })
}

/// The payload of `httpCustom` and `mqttCustom`: at most one of
/// `payload` (a text template; `null`: no body), `json` (a JSON template)
/// and `ngsi` (an entity patch); none: the standard notification.
fn parse_custom_payload(obj: &Map<String, Value>) -> Result<CustomPayload, NgsiError> {
    let given = ["payload", "json", "ngsi"]
        .iter()
        .filter(|k| obj.contains_key(**k))
        .count();
    if given > 1 {
        return Err(bad(
            "only one of payload, json or ngsi fields accepted at the same time in httpCustom, mqttCustom or kafkaCustom",
        ));
    }
    let payload =
        if let Some(p) = obj.get("payload") {
            match p {
                Value::Null => CustomPayload::Text(None),
                // An empty template means "not set": the standard payload.
                Value::String(s) if s.is_empty() => CustomPayload::Standard,
                Value::String(s) => {
                    if s.contains(FORBIDDEN_CHARS) {
                        return Err(bad("payload has forbidden characters"));
                    }
                    CustomPayload::Text(Some(s.clone()))
                }
                _ => return Err(bad("payload is not a string")),
            }
        } else if let Some(j) = obj.get("json") {
            match j {
                Value::Object(_) | Value::Array(_) => CustomPayload::Json(j.clone()),
                _ => return Err(bad(
                    "json fields in httpCustom, mqttCustom or kafkaCustom must be object or array",
                )),
            }
        } else if let Some(n) = obj.get("ngsi") {
            match n {
                Value::Object(m) => {
                    check_ngsi_patch(m)?;
                    CustomPayload::Ngsi(ngsi_patch_form(m))
                }
                _ => return Err(bad("ngsi field must be an object")),
            }
        } else {
            CustomPayload::Standard
        };
    Ok(payload)
}

/// An `ngsi` patch as Orion keeps and shows it (asked of the real Orion
/// 4.7.0): `id` and `type` first, then the attributes sorted by name, each
/// `{"type", "value"}` with its type given or inferred from the value, and
/// its metadata (when it has any) the same way.
fn ngsi_patch_form(patch: &Map<String, Value>) -> Map<String, Value> {
    let mut out = Map::new();
    for key in ["id", "type"] {
        if let Some(v) = patch.get(key) {
            out.insert(key.into(), v.clone());
        }
    }
    let mut names: Vec<&String> = patch
        .keys()
        .filter(|k| *k != "id" && *k != "type")
        .collect();
    names.sort();
    for name in names {
        let attr = &patch[name];
        let mut rendered = typed_item(attr);
        if let Some(Value::Object(md)) = attr
            .get("metadata")
            .filter(|m| m.as_object().is_some_and(|m| !m.is_empty()))
        {
            let md: Map<String, Value> = md
                .iter()
                .map(|(k, m)| (k.clone(), Value::Object(typed_item(m))))
                .collect();
            rendered.insert("metadata".into(), Value::Object(md));
        }
        out.insert(name.clone(), Value::Object(rendered));
    }
    out
}

/// `{"type", "value"}` of an attribute or a metadata item, the type given
/// or inferred from the value.
fn typed_item(item: &Value) -> Map<String, Value> {
    let value = item.get("value").cloned().unwrap_or(Value::Null);
    let t = match item.get("type") {
        Some(t) => t.clone(),
        None => Value::from(super::default_type(&value)),
    };
    let mut out = Map::new();
    out.insert("type".into(), t);
    out.insert("value".into(), value);
    out
}

/// Lowest `evalPriority` of an `ngsi` attribute: evaluated first.
pub const MIN_EVAL_PRIORITY: f64 = 1.0;

/// Highest `evalPriority`, also the default: evaluated last among the
/// attributes (`id` and `type` come after every attribute).
pub const MAX_EVAL_PRIORITY: f64 = 100_000.0;

/// Validates the `ngsi` patch of a custom notification as Orion does: an
/// entity fragment whose `id` and `type` are optional strings and whose
/// attributes are `{value, type, metadata}` objects; attribute values are
/// templates (checked when rendered), and the only metadata allowed is
/// `evalPriority`, a number from 1 to 100000.
fn check_ngsi_patch(patch: &Map<String, Value>) -> Result<(), NgsiError> {
    for (name, v) in patch {
        if name == "id" || name == "type" {
            if !v.is_string() {
                return Err(bad(format!("ngsi field /{name}/ must be a JSON string")));
            }
            continue;
        }
        if name.is_empty() {
            return Err(bad("attribute name length: 0, min length supported: 1"));
        }
        if name.contains(FORBIDDEN_CHARS) {
            return Err(bad("Invalid characters in attribute name"));
        }
        let Value::Object(attr) = v else {
            return Err(bad(
                "attribute must be a JSON object, unless keyValues option is used",
            ));
        };
        if attr
            .keys()
            .any(|k| !matches!(k.as_str(), "value" | "type" | "metadata"))
        {
            return Err(bad("unrecognized property for context attribute"));
        }
        if attr.get("type").is_some_and(|t| !t.is_string()) {
            return Err(bad("invalid JSON type for attribute type"));
        }
        match attr.get("metadata") {
            None | Some(Value::Null) => {}
            Some(Value::Object(md)) => {
                for (md_name, md) in md {
                    if md_name != "evalPriority" {
                        return Err(bad(
                            "only evalPriority metadata is allowed in ngsi field in custom notifications",
                        ));
                    }
                    eval_priority_of(md)?;
                }
            }
            Some(_) => return Err(bad("metadata must be a JSON object")),
        }
    }
    Ok(())
}

/// The priority an `evalPriority` metadata (`{"value": n, …}`) gives.
fn eval_priority_of(md: &Value) -> Result<f64, NgsiError> {
    let n = md
        .get("value")
        .and_then(Value::as_f64)
        .ok_or_else(|| bad("evalPriority metadata must be a number"))?;
    if n < MIN_EVAL_PRIORITY {
        return Err(bad("evalPriority metadata minimum priority is 1"));
    }
    if n > MAX_EVAL_PRIORITY {
        return Err(bad("evalPriority metadata maximum priority is 100000"));
    }
    Ok(n)
}

/// The evaluation priority of one attribute of an `ngsi` patch (already
/// validated): its `evalPriority`, or the default (last).
pub fn eval_priority(attr: &Value) -> f64 {
    attr.get("metadata")
        .and_then(|m| m.get("evalPriority"))
        .and_then(|md| eval_priority_of(md).ok())
        .unwrap_or(MAX_EVAL_PRIORITY)
}

/// The counters as rendered (also in NGSI-LD's stored form).
pub(crate) fn parse_stats(v: &Value) -> NotificationStats {
    let int = |k: &str| v.get(k).and_then(Value::as_u64);
    let date = |k: &str| v.get(k).and_then(Value::as_str).and_then(parse_datetime);
    NotificationStats {
        times_sent: int("timesSent").unwrap_or(0),
        last_notification: date("lastNotification"),
        last_failure: date("lastFailure"),
        last_failure_reason: v
            .get("lastFailureReason")
            .and_then(Value::as_str)
            .map(str::to_string),
        last_success: date("lastSuccess"),
        last_success_code: int("lastSuccessCode").map(|c| c as u16),
        fails_counter: int("failsCounter").unwrap_or(0),
    }
}

/// A list of names as a JSON array.
pub(crate) fn strings(list: &[String]) -> Value {
    Value::Array(list.iter().map(|s| Value::String(s.clone())).collect())
}

fn render_subject(s: &Subject) -> Value {
    let entities: Vec<Value> = s
        .entities
        .iter()
        .map(|e| {
            let mut m = Map::new();
            if let Some(i) = &e.id {
                m.insert("id".into(), i.clone().into());
            }
            if let Some(p) = &e.id_pattern {
                m.insert("idPattern".into(), p.as_str().into());
            }
            if let Some(t) = &e.entity_type {
                m.insert("type".into(), t.clone().into());
            }
            if let Some(p) = &e.type_pattern {
                m.insert("typePattern".into(), p.as_str().into());
            }
            Value::Object(m)
        })
        .collect();
    let c = &s.condition;
    let mut cond = Map::new();
    cond.insert("attrs".into(), strings(&c.attrs));
    if let Some(e) = &c.jexl_expression {
        cond.insert("jexlExpression".into(), e.clone().into());
    }
    if let Some(e) = &c.expression {
        let mut m = Map::new();
        if let Some(q) = &e.q_text {
            m.insert("q".into(), q.clone().into());
        }
        if let Some(mq) = &e.mq_text {
            m.insert("mq".into(), mq.clone().into());
        }
        if let Some((georel, geometry, coords)) = &e.geo_text {
            m.insert("georel".into(), georel.clone().into());
            m.insert("geometry".into(), geometry.clone().into());
            m.insert("coords".into(), coords.clone().into());
        }
        cond.insert("expression".into(), Value::Object(m));
    }
    if !c.alteration_types.is_empty() {
        cond.insert(
            "alterationTypes".into(),
            Value::Array(
                c.alteration_types
                    .iter()
                    .map(|t| Value::from(t.as_str()))
                    .collect(),
            ),
        );
    }
    cond.insert(
        "notifyOnMetadataChange".into(),
        c.notify_on_metadata_change.into(),
    );
    let mut out = Map::new();
    out.insert("entities".into(), Value::Array(entities));
    out.insert("condition".into(), Value::Object(cond));
    Value::Object(out)
}

fn format_name(f: Format) -> &'static str {
    match f {
        Format::Normalized => "normalized",
        Format::KeyValues => "keyValues",
        Format::Values => "values",
        Format::Unique => "unique",
        Format::SimplifiedNormalized => "simplifiedNormalized",
        Format::SimplifiedKeyValues => "simplifiedKeyValues",
    }
}

/// Orion's name of a notification format (the `Ngsiv2-AttrsFormat` header).
pub fn attrs_format_name(f: Format) -> &'static str {
    format_name(f)
}

fn pairs(list: &[(String, String)]) -> Value {
    Value::Object(
        list.iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect(),
    )
}

/// A custom payload's field (`payload`, `json` or `ngsi`), if not standard.
fn render_payload(payload: &CustomPayload, h: &mut Map<String, Value>) {
    match payload {
        CustomPayload::Standard => {}
        CustomPayload::Text(t) => {
            h.insert(
                "payload".into(),
                t.clone().map(Value::String).unwrap_or(Value::Null),
            );
        }
        CustomPayload::Json(j) => {
            h.insert("json".into(), j.clone());
        }
        CustomPayload::Ngsi(m) => {
            h.insert("ngsi".into(), Value::Object(m.clone()));
        }
    }
}

fn render_notification(n: &Notification, secrets: bool) -> Value {
    let mut out = Map::new();
    let st = &n.stats;
    if st.times_sent > 0 {
        out.insert("timesSent".into(), st.times_sent.into());
    }
    if let Some(t) = st.last_notification {
        out.insert("lastNotification".into(), format_datetime(t).into());
    }
    match &n.except_attrs {
        Some(except) => {
            out.insert("exceptAttrs".into(), strings(except));
        }
        None => {
            out.insert("attrs".into(), strings(&n.attrs));
        }
    }
    out.insert("onlyChangedAttrs".into(), n.only_changed_attrs.into());
    out.insert("attrsFormat".into(), format_name(n.attrs_format).into());
    match &n.endpoint {
        Endpoint::Http { url, timeout } => {
            let mut h = Map::new();
            h.insert("url".into(), url.clone().into());
            if let Some(t) = timeout {
                h.insert("timeout".into(), (*t).into());
            }
            out.insert("http".into(), Value::Object(h));
        }
        Endpoint::HttpCustom(c) => {
            let mut h = Map::new();
            h.insert("url".into(), c.url.clone().into());
            if let Some(t) = c.timeout {
                h.insert("timeout".into(), t.into());
            }
            render_payload(&c.payload, &mut h);
            if let Some(m) = &c.method {
                h.insert("method".into(), m.clone().into());
            }
            if !c.qs.is_empty() {
                h.insert("qs".into(), pairs(&c.qs));
            }
            if !c.headers.is_empty() {
                h.insert("headers".into(), pairs(&c.headers));
            }
            out.insert("httpCustom".into(), Value::Object(h));
        }
        Endpoint::Mqtt(m) => {
            let mut h = Map::new();
            h.insert("url".into(), m.url.clone().into());
            h.insert("topic".into(), m.topic.clone().into());
            h.insert("qos".into(), m.qos.into());
            h.insert("retain".into(), m.retain.into());
            if let Some(user) = &m.user {
                h.insert("user".into(), user.clone().into());
            }
            // Shown masked, as Orion shows it; kept whole in the store.
            if let Some(passwd) = &m.passwd {
                let shown = if secrets { passwd.as_str() } else { "*****" };
                h.insert("passwd".into(), shown.into());
            }
            render_payload(&m.payload, &mut h);
            let key = if m.custom { "mqttCustom" } else { "mqtt" };
            out.insert(key.into(), Value::Object(h));
        }
    }
    if !n.metadata.is_empty() {
        out.insert("metadata".into(), strings(&n.metadata));
    }
    if let Some(t) = st.last_failure {
        out.insert("lastFailure".into(), format_datetime(t).into());
    }
    if let Some(r) = &st.last_failure_reason {
        out.insert("lastFailureReason".into(), r.clone().into());
    }
    if let Some(t) = st.last_success {
        out.insert("lastSuccess".into(), format_datetime(t).into());
    }
    if let Some(c) = st.last_success_code {
        out.insert("lastSuccessCode".into(), c.into());
    }
    if let Some(m) = n.max_fails_limit {
        out.insert("maxFailsLimit".into(), m.into());
    }
    if st.fails_counter > 0 {
        out.insert("failsCounter".into(), st.fails_counter.into());
    }
    // Shown only when asked for: the default renders as Orion's.
    if n.delivery != Guarantee::AtLeastOnce {
        out.insert("delivery".into(), n.delivery.as_str().into());
    }
    out.insert("covered".into(), n.covered.into());
    Value::Object(out)
}

#[cfg(test)]
mod delivery_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn delivery_is_at_least_once_unless_asked_and_shown_only_then() {
        let parse = |n: Value| {
            Subscription::parse(
                &json!({
                    "subject": {"entities": [{"idPattern": ".*"}]},
                    "notification": n,
                }),
                "1".into(),
            )
        };
        let default = parse(json!({"http": {"url": "http://a:1"}})).unwrap();
        assert_eq!(default.notification.delivery, Guarantee::AtLeastOnce);
        assert!(default.render(0)["notification"].get("delivery").is_none());
        let once = parse(json!({"http": {"url": "http://a:1"}, "delivery": "atMostOnce"})).unwrap();
        assert_eq!(once.notification.delivery, Guarantee::AtMostOnce);
        assert_eq!(once.render(0)["notification"]["delivery"], "atMostOnce");
        let back = Subscription::from_storage(&once.to_storage()).unwrap();
        assert_eq!(back.notification.delivery, Guarantee::AtMostOnce);
        for wrong in [json!("always"), json!(true)] {
            let e = parse(json!({"http": {"url": "http://a:1"}, "delivery": wrong})).unwrap_err();
            assert_eq!(e.status, 400);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sub(v: Value) -> Result<Subscription, NgsiError> {
        Subscription::parse(&v, "0123456789abcdef01234567".into())
    }

    fn minimal() -> Value {
        json!({
            "subject": {"entities": [{"idPattern": ".*", "type": "Room"}]},
            "notification": {"http": {"url": "http://localhost:1234"}}
        })
    }

    /// Two nodes' counts added to the stored counters are both kept;
    /// the latest outcome decides the dates and the failure run.
    #[test]
    fn counters_of_several_nodes_add_up() {
        let stored = NotificationStats {
            times_sent: 10,
            last_notification: Some(100),
            last_success: Some(100),
            last_success_code: Some(200),
            ..Default::default()
        };
        let base = stored.clone();
        let mut local = base.clone();
        local.times_sent = 13;
        local.last_notification = Some(130);
        local.last_failure = Some(130);
        local.last_failure_reason = Some("timeout".into());
        local.fails_counter = 2;
        // Meanwhile another node stored 5 more, all successful, up to 120.
        let mut now = stored.clone();
        now.times_sent = 15;
        now.last_notification = Some(120);
        now.last_success = Some(120);
        let merged = now.merged(&base, &local);
        assert_eq!(merged.times_sent, 18);
        assert_eq!(merged.last_notification, Some(130));
        assert_eq!(merged.last_success, Some(120));
        assert_eq!(merged.last_failure, Some(130));
        assert_eq!(merged.last_failure_reason.as_deref(), Some("timeout"));
        assert_eq!(merged.fails_counter, 2);
        // Nothing new here: the stored counters unchanged.
        assert_eq!(now.merged(&base, &base), now);
    }

    #[test]
    fn mqtt_passwords_are_stored_but_shown_masked() {
        let s = sub(json!({"subject": {"entities": [{"id": "E"}]},
                           "notification": {"mqttCustom": {"url": "mqtt://b:1883", "topic": "t/${id}",
                                                           "qos": 2, "user": "u", "passwd": "p",
                                                           "json": {"v": "${x}"}}}}))
        .unwrap();
        let shown = s.render(0);
        let m = &shown["notification"]["mqttCustom"];
        assert_eq!(
            (m["topic"].as_str(), m["qos"].as_u64()),
            (Some("t/${id}"), Some(2))
        );
        assert_eq!(
            (m["user"].as_str(), m["passwd"].as_str()),
            (Some("u"), Some("*****"))
        );
        let stored = Subscription::from_storage(&s.to_storage()).unwrap();
        let Endpoint::Mqtt(e) = &stored.notification.endpoint else {
            panic!("an mqtt endpoint");
        };
        assert_eq!(e.passwd.as_deref(), Some("p"));
        assert!(e.custom && matches!(e.payload, CustomPayload::Json(_)));
        for (mqtt, text) in [
            (
                json!({"url": "mqtt://b:1883/x", "topic": "t"}),
                "path cannot be used in mqtt url, use topic instead",
            ),
            (
                json!({"url": "http://b", "topic": "t"}),
                "Invalid URL parsing notification url",
            ),
            (
                json!({"url": "mqtt://b"}),
                "topic mqtt notification is missing",
            ),
            (
                json!({"url": "mqtt://b", "topic": "t", "qos": -1}),
                "MQTT QoS must be an uint in the 0 to 2 range",
            ),
        ] {
            let err = sub(
                json!({"subject": {"entities": [{"id": "E"}]}, "notification": {"mqtt": mqtt}}),
            )
            .unwrap_err();
            assert_eq!(err.description, text);
        }
    }

    #[test]
    fn renders_defaults_as_orion() {
        let s = sub(minimal()).unwrap();
        assert_eq!(
            s.render(0),
            json!({
                "id": "0123456789abcdef01234567",
                "subject": {"entities": [{"idPattern": ".*", "type": "Room"}],
                            "condition": {"attrs": [], "notifyOnMetadataChange": true}},
                "notification": {"attrs": [], "onlyChangedAttrs": false,
                                 "attrsFormat": "normalized",
                                 "http": {"url": "http://localhost:1234"}, "covered": false},
                "status": "active"
            })
        );
    }

    #[test]
    fn storage_round_trip_keeps_counters_and_status() {
        let mut s = sub(minimal()).unwrap();
        s.status = Status::Inactive;
        s.expires = Some(1000);
        s.notification.stats.times_sent = 3;
        s.notification.stats.last_success_code = Some(200);
        let back = Subscription::from_storage(&s.to_storage()).unwrap();
        assert_eq!(back.status, Status::Inactive);
        assert_eq!(back.notification.stats, s.notification.stats);
        assert_eq!(back.render(0), s.render(0));
        assert_eq!(back.render(2000)["status"], "expired");
    }

    #[test]
    fn orion_error_texts() {
        let cases = [
            (
                json!({"notification": {}}),
                "no subject for subscription specified",
            ),
            (
                json!({"subject": {"entities": [{"id": "E"}]}}),
                "no notification for subscription specified",
            ),
            (
                json!({"subject": {"entities": "none"}, "notification": {}}),
                "/entities/ is not an array",
            ),
            (
                json!({"subject": {"entities": [{}]}, "notification": {}}),
                "/entities/ vector item does not have /id/ nor /idPattern/",
            ),
            (
                json!({"subject": {"entities": [{"id": "a", "idPattern": "b"}]}, "notification": {}}),
                "/entities/ vector item has both /id/ and /idPattern/",
            ),
            (
                json!({"subject": {"entities": [{"id": "a"}], "condition": {}}, "notification": {}}),
                "condition is empty",
            ),
            (
                json!({"subject": {"entities": [{"id": "a"}]},
                       "notification": {"http": {"url": "localhost 1234"}}}),
                "Invalid URL parsing notification url",
            ),
            (
                json!({"subject": {"entities": [{"id": "a"}],
                                   "condition": {"alterationTypes": ["entityFoo"]}},
                       "notification": {"http": {"url": "http://a:1"}}}),
                "unknown subscription alterationType: entityFoo",
            ),
            (
                json!({"subject": {"entities": [{"id": "a"}]},
                       "notification": {"http": {"url": "http://a:1"}}, "status": "x"}),
                "status is not valid: it has to be either active, inactive or oneshot",
            ),
        ];
        for (body, text) in cases {
            assert_eq!(sub(body).unwrap_err().description, text);
        }
    }

    fn ngsi_sub(attr: Value) -> Result<Subscription, NgsiError> {
        sub(json!({"subject": {"entities": [{"id": "E"}]},
                   "notification": {"httpCustom": {"url": "http://a:1", "ngsi": {"S": attr}}}}))
    }

    #[test]
    fn ngsi_patch_accepts_only_eval_priority_metadata_in_range() {
        let md = |v: Value| json!({"value": "${A}", "metadata": {"evalPriority": {"value": v}}});
        let err = |r: Result<Subscription, NgsiError>| r.unwrap_err().description;
        assert_eq!(
            err(ngsi_sub(md(json!("foo")))),
            "evalPriority metadata must be a number"
        );
        assert_eq!(
            err(ngsi_sub(md(json!(0)))),
            "evalPriority metadata minimum priority is 1"
        );
        assert_eq!(
            err(ngsi_sub(md(json!(100001)))),
            "evalPriority metadata maximum priority is 100000"
        );
        assert_eq!(
            err(ngsi_sub(
                json!({"value": 1, "metadata": {"MD": {"value": 1}}})
            )),
            "only evalPriority metadata is allowed in ngsi field in custom notifications"
        );
        let s = ngsi_sub(md(json!(7))).unwrap();
        let CustomPayload::Ngsi(patch) = &s.notification.endpoint.custom().unwrap().payload else {
            panic!("not an ngsi payload");
        };
        assert_eq!(eval_priority(&patch["S"]), 7.0);
        assert_eq!(eval_priority(&json!({"value": 1})), MAX_EVAL_PRIORITY);
        // Rendered as the real Orion 4.7.0 renders it: typed, the
        // metadata too.
        assert_eq!(
            s.render(0)["notification"]["httpCustom"]["ngsi"]["S"],
            json!({"type": "Text", "value": "${A}",
                   "metadata": {"evalPriority": {"type": "Number", "value": 7}}})
        );
    }

    #[test]
    fn jexl_expression_is_kept_and_rendered_after_attrs() {
        let s = sub(json!({"subject": {"entities": [{"id": "E"}],
                                       "condition": {"jexlExpression": "A>1"}},
                           "notification": {"http": {"url": "http://a:1"}}}))
        .unwrap();
        assert_eq!(s.subject.condition.jexl_expression.as_deref(), Some("A>1"));
        let cond = s.render(0)["subject"]["condition"].clone();
        let keys: Vec<&String> = cond.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["attrs", "jexlExpression", "notifyOnMetadataChange"]);
        let err = sub(json!({"subject": {"entities": [{"id": "E"}],
                                         "condition": {"jexlExpression": 1}},
                             "notification": {"http": {"url": "http://a:1"}}}))
        .unwrap_err();
        assert_eq!(err.description, "jexlExpression is not a string");
    }

    #[test]
    fn default_alteration_types_are_create_and_change() {
        let s = sub(minimal()).unwrap();
        let c = &s.subject.condition;
        assert!(c.wants(AlterationType::EntityCreate));
        assert!(c.wants(AlterationType::EntityChange));
        assert!(!c.wants(AlterationType::EntityUpdate));
        assert!(!c.wants(AlterationType::EntityDelete));
    }

    #[test]
    fn patch_replaces_fields_and_keeps_counters() {
        let mut s = sub(minimal()).unwrap();
        s.notification.stats.times_sent = 7;
        s.patch(&json!({"notification": {"http": {"url": "http://other:1"}}, "throttling": 2}))
            .unwrap();
        assert_eq!(s.notification.endpoint.url(), "http://other:1");
        assert_eq!(s.notification.stats.times_sent, 7);
        assert_eq!(s.throttling, Some(2.0));
        let before = s.render(0);
        assert!(s.patch(&json!({"status": 1})).is_err());
        assert_eq!(s.render(0), before, "a bad patch changes nothing");
    }

    #[test]
    fn selectors_match_ids_and_patterns() {
        let s = sub(json!({
            "subject": {"entities": [{"id": "E1", "type": "T"}, {"idPattern": "^R", "typePattern": "^Ro"}]},
            "notification": {"http": {"url": "http://a:1"}}
        }))
        .unwrap();
        let m = |id: &str, t: &str| s.subject.entities.iter().any(|e| e.matches(id, t));
        assert!(m("E1", "T"));
        assert!(!m("E1", "U"));
        assert!(m("R7", "Room"));
        assert!(!m("R7", "Hall"));
    }
}
