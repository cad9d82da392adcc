//! Renders the HTTP request of one notification, as Orion sends it.
//!
//! - `http`: `POST` to the URL with `{"subscriptionId","data":[entity]}`
//!   (`simplified*` formats: the entity alone), headers `Content-Type:
//!   application/json; charset=utf-8`, `Accept`, `User-Agent: orion/…`,
//!   `Fiware-Service` (tenants only), `Fiware-ServicePath`,
//!   `Fiware-Correlator: <correlator>; cbnotif=<n>` and
//!   `Ngsiv2-AttrsFormat`.
//! - `httpCustom`: the same defaults, then the subscription's method,
//!   headers (a header whose value ends up empty is removed), query
//!   string and payload, with `${…}` macros replaced by the JEXL
//!   expressions' results ([`weft_model::jexl::template`]) in the context
//!   of [`super::expressions`]. An `ngsi` payload is patched onto the
//!   entity attribute by attribute, in `evalPriority` order, each result
//!   joining the context of the next; `id` and `type` come last.
//!
//! The entity (patched, for `ngsi`) is then projected: `attrs` (or
//! `exceptAttrs`), then `onlyChangedAttrs`, then `covered` (missing
//! attributes as `null`); the pseudo-attribute `alterationType` appears
//! when named in `attrs`.

use bytes::Bytes;
use serde_json::{Map, Value};
use weft_model::jexl::{as_text, template};
use weft_model::ngsi::parse::is_valid_url;
use weft_model::ngsi::subscription::{
    attrs_format_name, eval_priority, AlterationType, CustomPayload, Endpoint, Subscription,
};
use weft_model::ngsi::{
    default_type, format_datetime, number, parse_datetime, render_with, AttrChange, Attribute,
    ChangeKind, Entity, Format, Metadata, OrderedMap, RenderContext, EXPIRATION_ATTR,
};

use super::expressions::Source;
use super::sender::Request;
use crate::context::Origin;

/// The `User-Agent` of notifications: Orion's form (`orion/<version>`),
/// which receivers written for Orion may check.
pub use crate::outbound::NGSI_USER_AGENT as USER_AGENT;

/// What a notification is about.
pub struct Trigger<'a> {
    /// The subscription.
    pub sub: &'a Subscription,
    /// Tenant (empty: none).
    pub tenant: &'a str,
    /// The entity's service path.
    pub service_path: &'a str,
    /// The entity after the change.
    pub entity: &'a Entity,
    /// Attributes the change touched.
    pub touched: &'a [AttrChange],
    /// The kind of change reported.
    pub alteration: AlterationType,
    /// The request that made the change (none for device data).
    pub origin: Option<&'a Origin>,
    /// Position of this notification among those the change triggered
    /// (`cbnotif=<n>`).
    pub sequence: u32,
}

impl Trigger<'_> {
    /// What the JEXL context of this notification is built from.
    pub fn source(&self) -> Source<'_> {
        Source {
            entity: self.entity,
            tenant: self.tenant,
            service_path: self.service_path,
            touched: self.touched,
            alteration: self.alteration,
            origin: self.origin,
        }
    }
}

/// Why a notification is not sent.
#[derive(Debug, PartialEq)]
pub enum NotSent {
    /// Skipped without a trace on the subscription, as Orion skips a
    /// custom notification whose URL is malformed once its macros are
    /// replaced.
    Skipped,
    /// A failure, recorded as `lastFailureReason`.
    Failed(String),
}

/// Builds the request.
pub fn build(t: &Trigger<'_>) -> Result<Request, NotSent> {
    let n = &t.sub.notification;
    let correlator = match t.origin {
        Some(o) => format!("{}; cbnotif={}", o.correlator, t.sequence),
        None => format!("{}; cbnotif={}", uuid_like(), t.sequence),
    };
    if let Some(ld) = &t.sub.ld {
        return super::ld::request(t, ld, &correlator);
    }
    let source = t.source();
    let service = source.service();
    let auth_token = source.auth_token();
    let mut headers: Vec<(String, String)> = Vec::with_capacity(8);
    let mut push = |k: &str, v: &str| headers.push((k.to_string(), v.to_string()));
    push("Content-Type", "application/json; charset=utf-8");
    push("Accept", "application/json");
    push("User-Agent", USER_AGENT);
    if !service.is_empty() {
        push("Fiware-Service", service);
    }
    push("Fiware-ServicePath", t.service_path);
    push("Fiware-Correlator", &correlator);
    if let Some(token) = auth_token {
        push("X-Auth-Token", token);
    }
    match &n.endpoint {
        Endpoint::Http { url, .. } => {
            let entity = project(t, t.entity, &[]);
            headers.push((
                "Ngsiv2-AttrsFormat".into(),
                attrs_format_name(n.attrs_format).into(),
            ));
            let body = standard_body(t, &entity, n.attrs_format);
            Ok(Request {
                method: hyper::Method::POST,
                url: url.clone(),
                headers,
                body: Some(body),
                mqtt: None,
            })
        }
        Endpoint::HttpCustom(c) => {
            let mut context = source.context();
            let (format_header, body) = custom_body(t, &c.payload, &mut context, &mut headers);
            headers.push(("Ngsiv2-AttrsFormat".into(), format_header.into()));
            // Orion keeps custom headers in a map ordered by name and
            // sends them in that order.
            let mut custom: Vec<&(String, String)> = c.headers.iter().collect();
            custom.sort_by(|a, b| a.0.cmp(&b.0));
            for (name, value) in custom {
                let name = template::render_text(name, &context);
                // Loop detection and the receiver's parsing depend on
                // these two; Orion does not let a subscription change them.
                let fixed = ["Fiware-Correlator", "Ngsiv2-AttrsFormat"]
                    .iter()
                    .any(|h| h.eq_ignore_ascii_case(&name));
                if !name.is_empty() && !fixed {
                    // Header values reach a subscription percent-encoded
                    // where they hold forbidden characters; sent decoded.
                    let value = percent_decode(&template::render_text(value, &context));
                    set_header(&mut headers, &name, &value);
                }
            }
            headers.retain(|(_, v)| !v.is_empty());
            let mut url = template::render_text(&c.url, &context);
            if !c.qs.is_empty() {
                let mut pairs: Vec<String> = Vec::new();
                for (k, v) in &c.qs {
                    let k = template::render_text(k, &context);
                    let v = template::render_text(v, &context);
                    if !v.is_empty() {
                        pairs.push(format!("{}={}", encode(&k), encode(&v)));
                    }
                }
                if !pairs.is_empty() {
                    url.push(if url.contains('?') { '&' } else { '?' });
                    url.push_str(&pairs.join("&"));
                }
            }
            if !is_valid_url(&url, true) {
                return Err(NotSent::Skipped);
            }
            let method = match &c.method {
                Some(m) => hyper::Method::from_bytes(m.as_bytes())
                    .map_err(|_| NotSent::Failed("invalid HTTP method".into()))?,
                None => hyper::Method::POST,
            };
            if body.as_ref().is_some_and(|b| b.is_empty()) {
                headers.retain(|(k, _)| !k.eq_ignore_ascii_case("Content-Type"));
                // Orion says so explicitly; a client library would not.
                headers.push(("Content-Length".into(), "0".into()));
            }
            Ok(Request {
                method,
                url,
                headers,
                body,
                mqtt: None,
            })
        }
        Endpoint::Mqtt(m) => {
            let mut context = source.context();
            let (_, body) = custom_body(t, &m.payload, &mut context, &mut headers);
            let topic = if m.custom {
                template::render_text(&m.topic, &context)
            } else {
                m.topic.clone()
            };
            // A topic its macros emptied or filled with wildcards cannot
            // be published on: skipped, as a custom URL its macros broke.
            if topic.is_empty() || topic.contains(['+', '#', '\0']) {
                return Err(NotSent::Skipped);
            }
            Ok(Request {
                method: hyper::Method::POST,
                url: m.url.clone(),
                headers,
                body,
                mqtt: Some(Box::new(super::mqtt::Publish {
                    topic,
                    qos: m.qos,
                    retain: m.retain,
                    credentials: m.user.clone().zip(m.passwd.clone()),
                })),
            })
        }
    }
}

/// The body of a custom notification (`httpCustom` or `mqttCustom`) and
/// the attributes format it is announced with: the standard payload, a
/// text template, a JSON template, or the entity patched by `ngsi`.
fn custom_body(
    t: &Trigger<'_>,
    payload: &CustomPayload,
    context: &mut Map<String, Value>,
    headers: &mut Vec<(String, String)>,
) -> (&'static str, Option<Bytes>) {
    let n = &t.sub.notification;
    match payload {
        CustomPayload::Standard => (
            attrs_format_name(n.attrs_format),
            Some(standard_body(t, &project(t, t.entity, &[]), n.attrs_format)),
        ),
        CustomPayload::Text(None) => ("custom", Some(Bytes::new())),
        CustomPayload::Text(Some(text)) => {
            set_header(headers, "Content-Type", "text/plain; charset=utf-8");
            // Forbidden characters reach a payload percent-encoded
            // (`%22` for `"`); they are sent decoded.
            let text = percent_decode(&template::render_text(text, context));
            ("custom", Some(Bytes::from(text)))
        }
        CustomPayload::Json(template) => {
            let v = template::render_json(template, context);
            ("custom", Some(Bytes::from(number::to_vec(&v))))
        }
        CustomPayload::Ngsi(patch) => {
            let patched = apply_ngsi_patch(t.entity, patch, context);
            let computed: Vec<&str> = patch
                .keys()
                .map(String::as_str)
                .filter(|k| *k != "id" && *k != "type")
                .collect();
            let projected = project(t, &patched, &computed);
            (
                attrs_format_name(n.attrs_format),
                Some(standard_body(t, &projected, n.attrs_format)),
            )
        }
    }
}

/// Sets a header, replacing one of the same name (case-insensitively).
fn set_header(headers: &mut Vec<(String, String)>, name: &str, value: &str) {
    match headers
        .iter_mut()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
    {
        Some(slot) => *slot = (slot.0.clone(), value.to_string()),
        None => headers.push((name.to_string(), value.to_string())),
    }
}

/// Decodes `%XX` escapes (invalid ones are kept as they are).
fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// Percent-encodes a query-string component.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A correlator for changes made without one (device data).
fn uuid_like() -> String {
    use std::hash::{BuildHasher, Hasher};
    let a = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let b = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let hex = format!("{a:016x}{b:016x}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The notification's body in the subscription's format.
fn standard_body(t: &Trigger<'_>, entity: &(Entity, Vec<String>), format: Format) -> Bytes {
    let (entity, names) = entity;
    let action = match t.alteration {
        AlterationType::EntityCreate => "append",
        AlterationType::EntityDelete => "delete",
        _ => match t.touched.first().map(|c| c.kind) {
            Some(ChangeKind::Created) => "append",
            Some(ChangeKind::Deleted) => "delete",
            _ => "update",
        },
    };
    let ctx = RenderContext {
        previous: Some(t.touched),
        action_type: Some(action),
        service_path: Some(t.service_path),
    };
    let metadata = &t.sub.notification.metadata;
    let rendered = render_with(
        entity,
        format,
        Some(names),
        (!metadata.is_empty()).then_some(metadata.as_slice()),
        &ctx,
    );
    let body = match format {
        Format::SimplifiedNormalized | Format::SimplifiedKeyValues => rendered,
        _ => {
            let mut obj = Map::new();
            obj.insert("subscriptionId".into(), t.sub.id.clone().into());
            obj.insert("data".into(), Value::Array(vec![rendered]));
            Value::Object(obj)
        }
    };
    Bytes::from(number::to_vec(&body))
}

/// The entity as notified (only the selected attributes, plus
/// `alterationType` and covered ones) and the names to render, in order.
/// `computed` names the attributes an `ngsi` patch computed for this
/// notification: `onlyChangedAttrs` keeps them.
fn project(t: &Trigger<'_>, e: &Entity, computed: &[&str]) -> (Entity, Vec<String>) {
    let n = &t.sub.notification;
    let all = n.attrs.is_empty() || n.attrs.iter().any(|a| a == "*");
    // Every attribute but the builtin `dateExpires`, which only its name
    // brings (as in responses).
    let user_attrs = || e.attrs.keys().filter(|n| *n != EXPIRATION_ATTR);
    let mut names: Vec<String> = Vec::new();
    let push = |name: &str, names: &mut Vec<String>| {
        if !names.iter().any(|x| x == name) {
            names.push(name.to_string());
        }
    };
    if let Some(except) = &n.except_attrs {
        for name in user_attrs() {
            if !except.iter().any(|x| x == name) {
                push(name, &mut names);
            }
        }
    } else if all {
        for a in &n.attrs {
            if a == "*" {
                for name in user_attrs() {
                    push(name, &mut names);
                }
            } else {
                push(a, &mut names);
            }
        }
        if n.attrs.is_empty() {
            for name in user_attrs() {
                push(name, &mut names);
            }
        }
    } else {
        for a in &n.attrs {
            push(a, &mut names);
        }
    }
    if n.only_changed_attrs && t.alteration != AlterationType::EntityDelete {
        let touched: Vec<&str> = match t.alteration {
            AlterationType::EntityCreate => e.attrs.keys().collect(),
            _ => t.touched.iter().map(|c| c.name.as_str()).collect(),
        };
        // The builtins asked for stay (Orion 3.11: `alterationType`,
        // `dateCreated` and `dateModified` are kept with onlyChangedAttrs),
        // and so do the attributes an `ngsi` patch computed.
        names.retain(|n| {
            touched.contains(&n.as_str())
                || computed.contains(&n.as_str())
                || matches!(
                    n.as_str(),
                    "alterationType" | "dateCreated" | "dateModified"
                )
        });
    }
    let mut out = Entity {
        attrs: OrderedMap::new(),
        ..e.clone()
    };
    out.attrs = OrderedMap::new();
    let mut kept: Vec<String> = Vec::with_capacity(names.len());
    for name in names {
        if let Some(a) = e.attrs.get(&name) {
            out.attrs.insert(name.clone(), a.clone());
        } else if name == "alterationType" {
            out.attrs.insert(
                name.clone(),
                Attribute::new(Value::String(t.alteration.as_str().into()), "Text"),
            );
        } else if matches!(
            name.as_str(),
            "dateCreated" | "dateModified" | "dateExpires" | "servicePath"
        ) {
            // Rendered as builtins.
        } else if n.covered {
            out.attrs
                .insert(name.clone(), Attribute::new(Value::Null, "None"));
        } else {
            continue;
        }
        kept.push(name);
    }
    if kept.is_empty() {
        // An empty filter would mean "all": name nothing that exists.
        kept.push(String::new());
    }
    (out, kept)
}

/// Patches an `ngsi` template onto the entity (update or append):
/// attributes in `evalPriority` order (ties in template order), each
/// result added to `context` so that later expressions can use it; then
/// `id` and `type`, always as text. Attribute types default from the
/// value as in entity updates; `evalPriority` is kept as metadata.
fn apply_ngsi_patch(
    entity: &Entity,
    patch: &Map<String, Value>,
    context: &mut Map<String, Value>,
) -> Entity {
    let mut entity = entity.clone();
    let mut attrs: Vec<(&String, &Value)> = patch
        .iter()
        .filter(|(k, _)| *k != "id" && *k != "type")
        .collect();
    // A stable sort keeps template order among equal priorities.
    attrs.sort_by(|a, b| eval_priority(a.1).total_cmp(&eval_priority(b.1)));
    for (name, template) in attrs {
        let value = template
            .get("value")
            .map(|v| template::render_json(v, context))
            .unwrap_or(Value::Null);
        let attr_type = match template.get("type").and_then(Value::as_str) {
            Some(t) => t.to_string(),
            None => default_type(&value).to_string(),
        };
        let value = match (&value, attr_type.as_str()) {
            (Value::String(s), "DateTime") => parse_datetime(s)
                .map(|ms| Value::String(format_datetime(ms)))
                .unwrap_or(value),
            _ => value,
        };
        context.insert(name.clone(), value.clone());
        let mut attr = Attribute::new(value, attr_type);
        if let Some(md) = template.get("metadata").and_then(|m| m.get("evalPriority")) {
            attr.metadata.insert(
                "evalPriority".to_string(),
                Metadata {
                    value: md.get("value").cloned().unwrap_or(Value::Null),
                    md_type: md
                        .get("type")
                        .and_then(Value::as_str)
                        .unwrap_or("Number")
                        .to_string(),
                },
            );
        }
        if let Some(existing) = entity.attrs.get(name) {
            attr.date_created = existing.date_created;
        }
        entity.attrs.insert(name.clone(), attr);
    }
    // `id` and `type` come after every attribute, as if their priority
    // were one above the highest an attribute can have.
    if let Some(v) = patch.get("id").and_then(Value::as_str) {
        entity.id = as_text(&template::render_string_value(v, context));
    }
    if let Some(v) = patch.get("type").and_then(Value::as_str) {
        entity.entity_type = as_text(&template::render_string_value(v, context));
    }
    entity
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entity() -> Entity {
        let mut e = Entity::new("E1", "T");
        e.attrs
            .insert("A".to_string(), Attribute::new(json!(10), "Number"));
        e.attrs.insert(
            "B".to_string(),
            Attribute::new(json!({"x": [1]}), "StructuredValue"),
        );
        e.attrs
            .insert("S".to_string(), Attribute::new(json!("foo"), "Text"));
        e
    }

    fn sub(notification: Value) -> Subscription {
        Subscription::parse(
            &json!({"subject": {"entities": [{"id": "E1"}]}, "notification": notification}),
            "0123456789abcdef01234567".into(),
        )
        .unwrap()
    }

    fn request(sub: &Subscription, entity: &Entity) -> Request {
        build(&Trigger {
            sub,
            tenant: "t1",
            service_path: "/",
            entity,
            touched: &[],
            alteration: AlterationType::EntityChange,
            origin: Some(&Origin {
                correlator: "c-1".into(),
                service: None,
                auth_token: Some("tok".into()),
                custom_notification: false,
            }),
            sequence: 1,
        })
        .unwrap()
    }

    fn header<'a>(r: &'a Request, name: &str) -> Option<&'a str> {
        r.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn standard_notification_has_orions_headers_and_envelope() {
        let s = sub(json!({"http": {"url": "http://h:1/notify"}, "attrs": ["A"]}));
        let r = request(&s, &entity());
        assert_eq!(r.url, "http://h:1/notify");
        assert_eq!(header(&r, "Fiware-Service"), Some("t1"));
        assert_eq!(header(&r, "Fiware-ServicePath"), Some("/"));
        assert_eq!(header(&r, "Fiware-Correlator"), Some("c-1; cbnotif=1"));
        assert_eq!(header(&r, "Ngsiv2-AttrsFormat"), Some("normalized"));
        let body: Value = serde_json::from_slice(r.body.as_ref().unwrap()).unwrap();
        assert_eq!(
            body,
            json!({"subscriptionId": "0123456789abcdef01234567",
                   "data": [{"id": "E1", "type": "T",
                             "A": {"type": "Number", "value": 10, "metadata": {}}}]})
        );
    }

    #[test]
    fn custom_json_macros_keep_types_and_text_macros_splice() {
        let s = sub(json!({"httpCustom": {
            "url": "http://h:1/${id}",
            "qs": {"a": "${S}", "none": "${missing}"},
            "headers": {"X-A": "${A}", "Fiware-Service": ""},
            "json": {"a": "${A}", "b": "${B}", "t": "id=${id} a=${A}", "m": "${missing}"}
        }}));
        let r = request(&s, &entity());
        // A query parameter whose macro has no value is left out.
        assert_eq!(r.url, "http://h:1/E1?a=foo");
        assert_eq!(header(&r, "X-A"), Some("10"));
        assert_eq!(header(&r, "Fiware-Service"), None, "emptied header removed");
        assert_eq!(header(&r, "Ngsiv2-AttrsFormat"), Some("custom"));
        let body: Value = serde_json::from_slice(r.body.as_ref().unwrap()).unwrap();
        assert_eq!(
            body,
            json!({"a": 10, "b": {"x": [1]}, "t": "id=E1 a=10", "m": null})
        );
    }

    #[test]
    fn ngsi_patch_evaluates_by_priority_and_survives_only_changed_attrs() {
        let s = sub(json!({
            "onlyChangedAttrs": true,
            "attrsFormat": "keyValues",
            "httpCustom": {"url": "http://h:1", "ngsi": {
                "type": "${S|uppercase}",
                "Late": {"value": "${Early*2}"},
                "Early": {"value": "${A+1}", "metadata": {"evalPriority": {"value": 1}}},
                "When": {"value": "2024-07-10T10:22:29Z", "type": "DateTime"}
            }}
        }));
        let r = request(&s, &entity());
        assert_eq!(header(&r, "Ngsiv2-AttrsFormat"), Some("keyValues"));
        let body: Value = serde_json::from_slice(r.body.as_ref().unwrap()).unwrap();
        // Nothing was touched: only the computed attributes remain.
        assert_eq!(
            body["data"][0],
            json!({"id": "E1", "type": "FOO", "Late": 22, "Early": 11,
                   "When": "2024-07-10T10:22:29.000Z"})
        );
    }

    #[test]
    fn a_url_malformed_by_its_macros_is_skipped() {
        let s = sub(json!({"httpCustom": {"url": "${S}://h:1/x"}}));
        let t = Trigger {
            sub: &s,
            tenant: "",
            service_path: "/",
            entity: &entity(),
            touched: &[],
            alteration: AlterationType::EntityChange,
            origin: None,
            sequence: 1,
        };
        assert_eq!(build(&t).unwrap_err(), NotSent::Skipped);
    }

    #[test]
    fn text_payload_is_plain_text() {
        let s = sub(
            json!({"httpCustom": {"url": "http://h:1", "payload": "A is ${A}", "method": "PUT"}}),
        );
        let r = request(&s, &entity());
        assert_eq!(r.method, hyper::Method::PUT);
        assert_eq!(
            header(&r, "Content-Type"),
            Some("text/plain; charset=utf-8")
        );
        assert_eq!(r.body.as_deref(), Some(&b"A is 10"[..]));
    }

    #[test]
    fn except_attrs_covered_and_alteration_type() {
        let s = sub(
            json!({"http": {"url": "http://h:1"}, "exceptAttrs": ["B"], "attrsFormat": "keyValues"}),
        );
        let body: Value =
            serde_json::from_slice(request(&s, &entity()).body.as_ref().unwrap()).unwrap();
        assert_eq!(
            body["data"][0],
            json!({"id": "E1", "type": "T", "A": 10, "S": "foo"})
        );

        let s = sub(
            json!({"http": {"url": "http://h:1"}, "attrs": ["A", "Z", "alterationType"],
                           "covered": true, "attrsFormat": "simplifiedKeyValues"}),
        );
        let body: Value =
            serde_json::from_slice(request(&s, &entity()).body.as_ref().unwrap()).unwrap();
        assert_eq!(
            body,
            json!({"id": "E1", "type": "T", "A": 10, "Z": null, "alterationType": "entityChange"})
        );
    }
}
