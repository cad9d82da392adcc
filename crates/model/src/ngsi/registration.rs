//! NGSIv2 registrations (`/v2/registrations`): the context providers a
//! client announces for some entities and attributes, parsed with Orion's
//! validation and error texts and rendered back as Orion renders them.
//!
//! A [`Registration`] is pure data: what is provided
//! ([`RegisteredEntity`]s and attribute names), by whom ([`Provider`]) and
//! its life cycle (`expires`, [`Status`]). Which registrations a request
//! reaches ([`Registration::covers`], [`Registration::provided`]) is
//! decided here too; sending the request is the pipeline's forwarding.
//! What forwarding did is counted in a [`ForwardingInfo`], rendered as
//! `forwardingInformation`.
//!
//! What Orion 3.10 accepts, and so what this parser accepts:
//! - entities by `id` or `idPattern`, with an optional `type`; an
//!   `idPattern` other than `.*` and any `typePattern` are valid NGSIv2 but
//!   not implemented by Orion (501 NotImplemented);
//! - `supportedForwardingMode` `all` (default), `none`, `query`, `update`;
//!   `legacyForwarding` (default false);
//! - `status` `active` (default) or `inactive`; `expires` as ISO 8601.
//!
//! The store keeps the rendering ([`Registration::to_storage`]) and reads it
//! back with the same parser ([`Registration::from_storage`]), so one format
//! serves the API and the disk.

use regex::Regex;
use serde_json::{Map, Value};

use super::parse::{is_valid_url, FORBIDDEN_CHARS};
use super::{format_datetime, parse_datetime, NgsiError, MAX_NAME_LEN};

/// Longest `description` Orion accepts.
pub const MAX_DESCRIPTION_LEN: usize = 1024;

/// The only `idPattern` Orion implements for registrations.
pub const ANY_ID_PATTERN: &str = ".*";

/// A registration: what is provided, by whom, until when.
#[derive(Debug, Clone, PartialEq)]
pub struct Registration {
    /// 24 lowercase hexadecimal digits, as Orion's (Mongo) ids.
    pub id: String,
    /// Free text (`description`), when given and not empty.
    pub description: Option<String>,
    /// The entities provided (`dataProvided.entities`), without duplicates.
    pub entities: Vec<RegisteredEntity>,
    /// The attributes provided (`dataProvided.attrs`), without duplicates;
    /// empty means all.
    pub attrs: Vec<String>,
    /// Who provides them.
    pub provider: Provider,
    /// Expiration (epoch ms); `None` is permanent.
    pub expires: Option<i64>,
    /// `active` or `inactive`.
    pub status: Status,
}

/// One entity selector of `dataProvided.entities`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisteredEntity {
    /// `id`, or `None` when the selector is an `idPattern`.
    pub id: Option<String>,
    /// `idPattern` (always `.*`, the only pattern Orion implements).
    pub id_pattern: Option<String>,
    /// `type`; `None` means any type.
    pub entity_type: Option<String>,
}

/// The context provider of a registration (`provider`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provider {
    /// `http.url`: where Orion would forward requests.
    pub url: String,
    /// `supportedForwardingMode`.
    pub forwarding_mode: ForwardingMode,
    /// `legacyForwarding`: the provider speaks NGSIv1 (deprecated in Orion).
    pub legacy_forwarding: bool,
}

/// Which requests the provider accepts (`supportedForwardingMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardingMode {
    /// Queries and updates (Orion's default).
    All,
    /// Neither.
    None,
    /// Queries only.
    Query,
    /// Updates only.
    Update,
}

impl ForwardingMode {
    /// The name in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            ForwardingMode::All => "all",
            ForwardingMode::None => "none",
            ForwardingMode::Query => "query",
            ForwardingMode::Update => "update",
        }
    }

    fn parse(s: &str) -> Option<ForwardingMode> {
        Some(match s {
            "all" => ForwardingMode::All,
            "none" => ForwardingMode::None,
            "query" => ForwardingMode::Query,
            "update" => ForwardingMode::Update,
            _ => return None,
        })
    }
}

/// A registration's `status`. Orion stores it but forwards to inactive
/// registrations too, and so does weft: it is informative.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// The default.
    Active,
    /// Set by the client.
    Inactive,
}

impl Status {
    /// The name in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Active => "active",
            Status::Inactive => "inactive",
        }
    }
}

/// What forwarding to a registration's provider did, shown as
/// `forwardingInformation`: clients read it to tell a provider that
/// answers from one that fails.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ForwardingInfo {
    /// Requests forwarded (`timesSent`).
    pub times_sent: u64,
    /// Requests the provider did not answer usefully (weft's count of
    /// failures; not rendered, Orion has no such field).
    pub times_failed: u64,
    /// When the last request was forwarded (epoch ms).
    pub last_forwarding: Option<i64>,
    /// When the provider last answered usefully (epoch ms).
    pub last_success: Option<i64>,
    /// When the provider last failed (epoch ms).
    pub last_failure: Option<i64>,
}

impl ForwardingInfo {
    /// Counts one forwarded request at `now`, successful or not.
    pub fn record(&mut self, ok: bool, now: i64) {
        self.times_sent += 1;
        self.last_forwarding = Some(now);
        if ok {
            self.last_success = Some(now);
        } else {
            self.times_failed += 1;
            self.last_failure = Some(now);
        }
    }

    /// `{"timesSent", "lastForwarding", "lastSuccess"?, "lastFailure"?}`.
    pub fn render(&self) -> Value {
        let mut out = Map::new();
        out.insert("timesSent".into(), self.times_sent.into());
        if let Some(t) = self.last_forwarding {
            out.insert("lastForwarding".into(), format_datetime(t).into());
        }
        if let Some(t) = self.last_success {
            out.insert("lastSuccess".into(), format_datetime(t).into());
        }
        if let Some(t) = self.last_failure {
            out.insert("lastFailure".into(), format_datetime(t).into());
        }
        Value::Object(out)
    }
}

/// 404 for an id no registration of the tenant has (GET and DELETE).
pub fn not_found() -> NgsiError {
    NgsiError::new(
        404,
        "NotFound",
        "The requested registration has not been found. Check id",
    )
}

/// A new 24-hex-digit id for a registration: the same minting as
/// subscriptions ([`super::new_document_id`], shaped like the Mongo
/// ObjectIds Orion hands out), so both kinds of documents get ids alike.
pub fn new_id() -> String {
    super::new_document_id()
}

/// Whether `s` has the shape of an id: 24 hexadecimal digits.
pub fn is_id(s: &str) -> bool {
    s.len() == 24 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn bad(text: impl Into<String>) -> NgsiError {
    NgsiError::bad_request(text)
}

fn not_implemented(text: &str) -> NgsiError {
    NgsiError::new(501, "NotImplemented", text)
}

/// Whether `s` has only the characters Orion allows in identifiers
/// (entity ids and types, attribute names): printable ASCII without
/// whitespace, `& ? / #` and the forbidden `< > " ' = ; ( )`.
fn id_chars_ok(s: &str) -> bool {
    s.bytes().all(|b| {
        b.is_ascii_graphic()
            && !matches!(b, b'&' | b'?' | b'/' | b'#')
            && !FORBIDDEN_CHARS.contains(&(b as char))
    })
}

impl Registration {
    /// Parses the body of `POST /v2/registrations` as text. A body that is
    /// not JSON is Orion's 400 BadRequest (not ParseError, as elsewhere:
    /// Orion's registration parser reports it so).
    pub fn parse_text(body: &[u8], id: String) -> Result<Registration, NgsiError> {
        let value: Value = serde_json::from_slice(body)
            .map_err(|_| bad("Errors found in incoming JSON buffer"))?;
        Registration::parse(&value, id)
    }

    /// Parses a registration body with Orion's checks, in Orion's order.
    /// `id` is the id to give it. Unknown fields are ignored, as in Orion.
    pub fn parse(body: &Value, id: String) -> Result<Registration, NgsiError> {
        let obj = body.as_object().ok_or_else(|| bad("not a JSON object"))?;
        if obj.is_empty() {
            return Err(bad("empty payload"));
        }
        let description = parse_description(obj.get("description"))?;
        let data_provided = obj
            .get("dataProvided")
            .ok_or_else(|| bad("the field /dataProvided/ is missing in payload"))?;
        let (entities, attrs) = parse_data_provided(data_provided)?;
        let provider = obj
            .get("provider")
            .ok_or_else(|| bad("the field /provider/ is missing in payload"))?;
        let provider = parse_provider(provider)?;
        let expires = parse_expires(obj.get("expires"))?;
        let status = parse_status(obj.get("status"))?;
        Ok(Registration {
            id,
            description,
            entities,
            attrs,
            provider,
            expires,
            status,
        })
    }

    /// Orion's rendering (`GET /v2/registrations[/{id}]`): `id`,
    /// `description` (when given), `expires` (when not permanent),
    /// `dataProvided`, `provider` and `status`, without
    /// `forwardingInformation` (see [`Registration::render_with`]).
    pub fn render(&self) -> Value {
        self.render_with(None)
    }

    /// The rendering with `forwardingInformation` when something was
    /// forwarded (`timesSent` > 0), as Orion shows it.
    pub fn render_with(&self, info: Option<&ForwardingInfo>) -> Value {
        let mut out = Map::new();
        out.insert("id".into(), self.id.clone().into());
        if let Some(d) = &self.description {
            out.insert("description".into(), d.clone().into());
        }
        if let Some(e) = self.expires {
            out.insert("expires".into(), format_datetime(e).into());
        }
        let entities: Vec<Value> = self.entities.iter().map(render_entity).collect();
        let mut data = Map::new();
        data.insert("entities".into(), Value::Array(entities));
        data.insert(
            "attrs".into(),
            Value::Array(self.attrs.iter().cloned().map(Value::from).collect()),
        );
        out.insert("dataProvided".into(), Value::Object(data));
        let mut http = Map::new();
        http.insert("url".into(), self.provider.url.clone().into());
        let mut provider = Map::new();
        provider.insert("http".into(), Value::Object(http));
        provider.insert(
            "supportedForwardingMode".into(),
            self.provider.forwarding_mode.as_str().into(),
        );
        provider.insert(
            "legacyForwarding".into(),
            self.provider.legacy_forwarding.into(),
        );
        out.insert("provider".into(), Value::Object(provider));
        out.insert("status".into(), self.status.as_str().into());
        if let Some(info) = info.filter(|i| i.times_sent > 0) {
            out.insert("forwardingInformation".into(), info.render());
        }
        Value::Object(out)
    }

    /// Whether an entity (`id`, and the type when the request or the
    /// local entity tells it) is among `dataProvided.entities`. A selector
    /// without type matches every type, and a request without type
    /// matches every selector of its id; `idPattern` is always `.*`.
    pub fn covers(&self, id: &str, entity_type: Option<&str>) -> bool {
        self.entities.iter().any(|e| {
            let id_ok = match &e.id {
                Some(rid) => rid == id,
                None => e.id_pattern.is_some(),
            };
            let type_ok = match (&e.entity_type, entity_type) {
                (Some(rt), Some(t)) => rt == t,
                _ => true,
            };
            id_ok && type_ok
        })
    }

    /// The attributes of `wanted` this registration provides: all of them
    /// when it registers no attribute list; `None` for "every attribute"
    /// (neither side names any).
    pub fn provided(&self, wanted: Option<&[String]>) -> Option<Vec<String>> {
        match (self.attrs.is_empty(), wanted) {
            (true, None) => None,
            (true, Some(w)) => Some(w.to_vec()),
            (false, None) => Some(self.attrs.clone()),
            (false, Some(w)) => Some(
                w.iter()
                    .filter(|a| self.attrs.contains(a))
                    .cloned()
                    .collect(),
            ),
        }
    }

    /// Whether queries are forwarded to the provider: its
    /// `supportedForwardingMode` is `all` or `query`, and it speaks
    /// NGSIv2 (weft does not forward in the legacy NGSIv1 format).
    pub fn forwards_queries(&self) -> bool {
        !self.provider.legacy_forwarding
            && matches!(
                self.provider.forwarding_mode,
                ForwardingMode::All | ForwardingMode::Query
            )
    }

    /// Whether updates are forwarded: `all` or `update`, NGSIv2 only.
    pub fn forwards_updates(&self) -> bool {
        !self.provider.legacy_forwarding
            && matches!(
                self.provider.forwarding_mode,
                ForwardingMode::All | ForwardingMode::Update
            )
    }

    /// The form kept in the store: the rendering.
    pub fn to_storage(&self) -> String {
        self.render().to_string()
    }

    /// Reads [`Registration::to_storage`] back.
    pub fn from_storage(text: &str) -> Result<Registration, NgsiError> {
        let value: Value = serde_json::from_str(text).map_err(|_| NgsiError::parse_error())?;
        let id = value
            .get("id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        Registration::parse(&value, id)
    }
}

fn render_entity(e: &RegisteredEntity) -> Value {
    let mut out = Map::new();
    if let Some(id) = &e.id {
        out.insert("id".into(), id.clone().into());
    }
    if let Some(p) = &e.id_pattern {
        out.insert("idPattern".into(), p.clone().into());
    }
    if let Some(t) = &e.entity_type {
        out.insert("type".into(), t.clone().into());
    }
    Value::Object(out)
}

fn parse_description(v: Option<&Value>) -> Result<Option<String>, NgsiError> {
    let s = match v {
        None => return Ok(None),
        Some(Value::String(s)) => s,
        Some(_) => return Err(bad("invalid description")),
    };
    if s.len() > MAX_DESCRIPTION_LEN {
        return Err(bad("max description length exceeded"));
    }
    if s.contains(FORBIDDEN_CHARS) {
        return Err(bad("forbidden characters in description"));
    }
    Ok(Some(s.clone()).filter(|s| !s.is_empty()))
}

/// `dataProvided`: the entities and attribute names, each list without
/// duplicates (Orion drops repeated items silently).
fn parse_data_provided(v: &Value) -> Result<(Vec<RegisteredEntity>, Vec<String>), NgsiError> {
    let obj = v
        .as_object()
        .ok_or_else(|| bad("/dataProvided/ must be a JSON object"))?;
    if obj.is_empty() {
        return Err(bad("/dataProvided/ is empty"));
    }
    let mut entities: Vec<RegisteredEntity> = Vec::new();
    let mut type_pattern = false;
    if let Some(list) = obj.get("entities") {
        let items = list
            .as_array()
            .ok_or_else(|| bad("/entities/ is not an array"))?;
        for item in items {
            let (entity, has_type_pattern) = parse_entity(item)?;
            type_pattern |= has_type_pattern;
            if !entities.contains(&entity) {
                entities.push(entity);
            }
        }
    }
    // Valid NGSIv2 that Orion does not implement, checked once every
    // selector is known to be well formed.
    if entities
        .iter()
        .any(|e| e.id_pattern.as_deref().is_some_and(|p| p != ANY_ID_PATTERN))
    {
        return Err(not_implemented("Unsupported idPattern"));
    }
    if type_pattern {
        return Err(not_implemented("Unsupported typePattern"));
    }
    let mut attrs: Vec<String> = Vec::new();
    if let Some(list) = obj.get("attrs") {
        let items = list
            .as_array()
            .ok_or_else(|| bad("the field /attrs/ must be a JSON array"))?;
        for item in items {
            let name = item
                .as_str()
                .ok_or_else(|| bad("only JSON Strings allowed in string vector /attrs/"))?;
            if name.is_empty() {
                return Err(bad("empty string found in string vector /attrs/"));
            }
            if !attrs.iter().any(|a| a == name) {
                attrs.push(name.to_string());
            }
        }
        if attrs.iter().any(|a| !id_chars_ok(a)) {
            return Err(bad("forbidden characters in attribute name"));
        }
    }
    Ok((entities, attrs))
}

/// One item of `dataProvided.entities`, with Orion's texts in Orion's
/// order; the flag tells whether it had a (well-formed) `typePattern`.
fn parse_entity(v: &Value) -> Result<(RegisteredEntity, bool), NgsiError> {
    let obj = v
        .as_object()
        .ok_or_else(|| bad("/entities/ vector item is not an object"))?;
    let has = |k: &str| obj.contains_key(k);
    if !has("id") && !has("idPattern") {
        return Err(bad(
            "/entities/ vector item does not have /id/ nor /idPattern/",
        ));
    }
    if has("id") && has("idPattern") {
        return Err(bad("/entities/ vector item has both /id/ and /idPattern/"));
    }
    if has("type") && has("typePattern") {
        return Err(bad("/entities/ element has both /type/ and /typePattern/"));
    }
    let text = |key: &str, what: &str| -> Result<Option<&str>, NgsiError> {
        match obj.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(_) => Err(bad(format!("{what} is not a string"))),
        }
    };
    let id = text("id", "/entities/ vector item /id/")?;
    if let Some(id) = id {
        if id.is_empty() {
            return Err(bad("/entities/ element id is empty"));
        }
        if !id_chars_ok(id) {
            return Err(bad("forbidden characters in /entities/ vector item /id/"));
        }
        if id.len() > MAX_NAME_LEN {
            return Err(bad("max id length exceeded in /entities/ vector item /id/"));
        }
    }
    let id_pattern = text("idPattern", "/entities/ vector item /idPattern/")?;
    if let Some(p) = id_pattern {
        if p.is_empty() {
            return Err(bad("/entities/ vector item /idPattern/ is empty"));
        }
        Regex::new(p).map_err(|_| bad("Invalid regex for entity idPattern"))?;
    }
    let entity_type = text("type", "/entities/ vector item type")?;
    if let Some(t) = entity_type {
        if !id_chars_ok(t) {
            return Err(bad("forbidden characters in /entities/ vector item /type/"));
        }
        if t.len() > MAX_NAME_LEN {
            return Err(bad(
                "max type length exceeded in /entities/ vector item /type/",
            ));
        }
        if t.is_empty() {
            return Err(bad("entity type length: 0, min length supported: 1"));
        }
    }
    let type_pattern = text("typePattern", "/entities/ vector item /typePattern/")?;
    if let Some(p) = type_pattern {
        if p.is_empty() {
            return Err(bad("/entities/ vector item /typePattern/ is empty"));
        }
        Regex::new(p).map_err(|_| bad("Invalid regex for entity typePattern"))?;
    }
    let entity = RegisteredEntity {
        id: id.map(str::to_string),
        id_pattern: id_pattern.map(str::to_string),
        entity_type: entity_type.map(str::to_string),
    };
    Ok((entity, type_pattern.is_some()))
}

fn parse_provider(v: &Value) -> Result<Provider, NgsiError> {
    let obj = v
        .as_object()
        .ok_or_else(|| bad("/provider/ must be a JSON object"))?;
    if obj.is_empty() {
        return Err(bad("/provider/ empty"));
    }
    let http = obj
        .get("http")
        .ok_or_else(|| bad("/provider/ must contain a field /http/"))?;
    let url = parse_http(http)?;
    let forwarding_mode = match obj.get("supportedForwardingMode") {
        None => ForwardingMode::All,
        Some(Value::String(s)) => ForwardingMode::parse(s)
            .ok_or_else(|| bad("invalid value of /supportedForwardingMode/"))?,
        Some(_) => return Err(bad("/supportedForwardingMode/ must be a JSON string")),
    };
    let legacy_forwarding = match obj.get("legacyForwarding") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("the field /legacyForwarding/ must be a boolean")),
    };
    Ok(Provider {
        url,
        forwarding_mode,
        legacy_forwarding,
    })
}

fn parse_http(v: &Value) -> Result<String, NgsiError> {
    let obj = v
        .as_object()
        .ok_or_else(|| bad("/http/ must be a JSON object"))?;
    let url = match obj.get("url") {
        None => return Err(bad("/http/ must contain a field /url/")),
        Some(Value::String(u)) => u,
        Some(_) => return Err(bad("/url/ field of /http/ must be a JSON string")),
    };
    if url.is_empty() {
        return Err(bad("/url/ field of /http/ cannot be the empty string"));
    }
    if !is_valid_url(url, false) {
        return Err(bad("/url/ field of /http/ is invalid"));
    }
    Ok(url.clone())
}

fn parse_expires(v: Option<&Value>) -> Result<Option<i64>, NgsiError> {
    match v {
        None => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => parse_datetime(s)
            .map(Some)
            .ok_or_else(|| bad("the field /expires/ has an invalid format")),
        Some(_) => Err(bad("expires is not a string")),
    }
}

fn parse_status(v: Option<&Value>) -> Result<Status, NgsiError> {
    match v {
        None => Ok(Status::Active),
        Some(Value::String(s)) => match s.as_str() {
            "active" => Ok(Status::Active),
            "inactive" => Ok(Status::Inactive),
            _ => Err(bad("invalid value for /status/")),
        },
        Some(_) => Err(bad("/status/ must be a string")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body() -> Value {
        json!({
            "description": "Relative Humidity Context Source",
            "dataProvided": {
                "entities": [{"id": "E1", "type": "T1"}, {"id": "E2", "type": "T2"}],
                "attrs": ["A1", "A2"]
            },
            "provider": {"http": {"url": "http://localhost:9801/v2"}, "legacyForwarding": true},
            "status": "inactive"
        })
    }

    fn err(v: Value) -> (u16, &'static str, String) {
        let e = Registration::parse(&v, "0".repeat(24)).unwrap_err();
        (e.status, e.error, e.description)
    }

    fn bad_text(v: Value) -> String {
        let (status, name, text) = err(v);
        assert_eq!((status, name), (400, "BadRequest"), "{text}");
        text
    }

    /// Builds a body from `body()` with `f` applied.
    fn with(f: impl FnOnce(&mut Value)) -> Value {
        let mut b = body();
        f(&mut b);
        b
    }

    // 3004_v2_reg_create/v2_reg_create.test: the rendering and its length.
    #[test]
    fn renders_as_orion() {
        let id = "5af1b2c3d4e5f60718293a4b".to_string();
        let r = Registration::parse(&body(), id.clone()).unwrap();
        let v = r.render();
        assert_eq!(
            v,
            json!({
                "id": id,
                "description": "Relative Humidity Context Source",
                "dataProvided": {
                    "entities": [{"id": "E1", "type": "T1"}, {"id": "E2", "type": "T2"}],
                    "attrs": ["A1", "A2"]
                },
                "provider": {
                    "http": {"url": "http://localhost:9801/v2"},
                    "supportedForwardingMode": "all",
                    "legacyForwarding": true
                },
                "status": "inactive"
            })
        );
        assert_eq!(v.to_string().len(), 311);
    }

    #[test]
    fn defaults_and_optional_fields() {
        let r = Registration::parse(
            &json!({"dataProvided": {"entities": [{"idPattern": ".*"}]},
                    "provider": {"http": {"url": "http://cp.example.org"}},
                    "expires": "2040-01-01T14:00:00Z", "description": ""}),
            "x".into(),
        )
        .unwrap();
        let v = r.render();
        assert!(v.get("description").is_none());
        assert_eq!(v["expires"], "2040-01-01T14:00:00.000Z");
        assert_eq!(v["status"], "active");
        assert_eq!(
            v["dataProvided"],
            json!({"entities": [{"idPattern": ".*"}], "attrs": []})
        );
        assert_eq!(v["provider"]["supportedForwardingMode"], "all");
        assert_eq!(v["provider"]["legacyForwarding"], false);
        let empty_expires = with(|b| b["expires"] = json!(""));
        let r = Registration::parse(&empty_expires, "x".into()).unwrap();
        assert!(r.render().get("expires").is_none());
    }

    #[test]
    fn duplicates_are_dropped() {
        let b = with(|b| {
            b["dataProvided"] = json!({
                "entities": [{"id": "E1"}, {"id": "E1"}, {"id": "E1", "type": "T"}],
                "attrs": ["A", "B", "A"]
            })
        });
        let r = Registration::parse(&b, "x".into()).unwrap();
        assert_eq!(r.entities.len(), 2);
        assert_eq!(r.attrs, ["A", "B"]);
    }

    #[test]
    fn storage_round_trip() {
        let r = Registration::parse(
            &with(|b| {
                b["expires"] = json!("2031-05-06T07:08:09.123Z");
                b["provider"]["supportedForwardingMode"] = json!("query");
            }),
            "5af1b2c3d4e5f60718293a4b".into(),
        )
        .unwrap();
        assert_eq!(Registration::from_storage(&r.to_storage()).unwrap(), r);
    }

    // 3004_v2_reg_create/v2_reg_create_errors.test and
    // 3468_v2_registrations_attribute_name_with_forbidden_character.
    #[test]
    fn payload_errors_have_orions_texts() {
        assert_eq!(
            Registration::parse_text(b"{{", "x".into())
                .unwrap_err()
                .to_json(),
            json!({"error": "BadRequest", "description": "Errors found in incoming JSON buffer"})
        );
        assert_eq!(bad_text(json!(["a", "b"])), "not a JSON object");
        assert_eq!(bad_text(json!({})), "empty payload");
        assert_eq!(bad_text(json!({"description": 4})), "invalid description");
        assert_eq!(
            bad_text(json!({"description": "x".repeat(1025)})),
            "max description length exceeded"
        );
        assert_eq!(
            bad_text(json!({"description": "<>="})),
            "forbidden characters in description"
        );
        assert_eq!(
            bad_text(json!({"description": "D"})),
            "the field /dataProvided/ is missing in payload"
        );
        let dp = |d: Value| bad_text(with(|b| b["dataProvided"] = d));
        assert_eq!(dp(json!(5)), "/dataProvided/ must be a JSON object");
        assert_eq!(dp(json!({})), "/dataProvided/ is empty");
        assert_eq!(dp(json!({"entities": 6})), "/entities/ is not an array");
        let ent = |e: Value| dp(json!({"entities": [e]}));
        assert_eq!(ent(json!(1)), "/entities/ vector item is not an object");
        assert_eq!(
            ent(json!({"type": "T1"})),
            "/entities/ vector item does not have /id/ nor /idPattern/"
        );
        assert_eq!(
            ent(json!({"id": "E1", "idPattern": "E,*"})),
            "/entities/ vector item has both /id/ and /idPattern/"
        );
        assert_eq!(
            ent(json!({"id": true})),
            "/entities/ vector item /id/ is not a string"
        );
        assert_eq!(ent(json!({"id": ""})), "/entities/ element id is empty");
        assert_eq!(
            ent(json!({"id": "<>!="})),
            "forbidden characters in /entities/ vector item /id/"
        );
        assert_eq!(
            ent(json!({"id": "E1 "})),
            "forbidden characters in /entities/ vector item /id/"
        );
        assert_eq!(
            ent(json!({"id": "0".repeat(257)})),
            "max id length exceeded in /entities/ vector item /id/"
        );
        assert_eq!(
            ent(json!({"idPattern": 7})),
            "/entities/ vector item /idPattern/ is not a string"
        );
        assert_eq!(
            ent(json!({"idPattern": ""})),
            "/entities/ vector item /idPattern/ is empty"
        );
        assert_eq!(
            ent(json!({"id": "E1", "type": "T1", "typePattern": "T.*"})),
            "/entities/ element has both /type/ and /typePattern/"
        );
        assert_eq!(
            ent(json!({"id": "E1", "type": 6})),
            "/entities/ vector item type is not a string"
        );
        assert_eq!(
            ent(json!({"id": "E1", "type": ""})),
            "entity type length: 0, min length supported: 1"
        );
        assert_eq!(
            ent(json!({"id": "E1", "type": "T1 "})),
            "forbidden characters in /entities/ vector item /type/"
        );
        assert_eq!(
            ent(json!({"id": "E1", "type": "0".repeat(257)})),
            "max type length exceeded in /entities/ vector item /type/"
        );
        assert_eq!(
            ent(json!({"id": "E1", "typePattern": false})),
            "/entities/ vector item /typePattern/ is not a string"
        );
        assert_eq!(
            ent(json!({"id": "E1", "typePattern": ""})),
            "/entities/ vector item /typePattern/ is empty"
        );
        let attrs = |a: Value| dp(json!({"entities": [{"id": "E1"}], "attrs": a}));
        assert_eq!(attrs(json!(true)), "the field /attrs/ must be a JSON array");
        assert_eq!(
            attrs(json!([1, 2])),
            "only JSON Strings allowed in string vector /attrs/"
        );
        assert_eq!(
            attrs(json!(["A1", ""])),
            "empty string found in string vector /attrs/"
        );
        assert_eq!(
            attrs(json!(["brandName ", "speed"])),
            "forbidden characters in attribute name"
        );
    }

    #[test]
    fn provider_and_life_cycle_errors() {
        let no_provider = with(|b| {
            b.as_object_mut().unwrap().remove("provider");
        });
        assert_eq!(
            bad_text(no_provider),
            "the field /provider/ is missing in payload"
        );
        let prov = |p: Value| bad_text(with(|b| b["provider"] = p));
        assert_eq!(prov(json!({})), "/provider/ empty");
        assert_eq!(prov(json!(7)), "/provider/ must be a JSON object");
        assert_eq!(
            prov(json!({"a": 0})),
            "/provider/ must contain a field /http/"
        );
        let url = json!({"url": "http://localhost:9801/v2"});
        assert_eq!(
            prov(json!({"http": url, "supportedForwardingMode": true})),
            "/supportedForwardingMode/ must be a JSON string"
        );
        assert_eq!(
            prov(json!({"http": url, "supportedForwardingMode": "invalid"})),
            "invalid value of /supportedForwardingMode/"
        );
        assert_eq!(prov(json!({"http": []})), "/http/ must be a JSON object");
        assert_eq!(
            prov(json!({"http": {"noUrl": true}})),
            "/http/ must contain a field /url/"
        );
        assert_eq!(
            prov(json!({"http": {"url": true}})),
            "/url/ field of /http/ must be a JSON string"
        );
        assert_eq!(
            prov(json!({"http": {"url": ""}})),
            "/url/ field of /http/ cannot be the empty string"
        );
        assert_eq!(
            prov(json!({"http": {"url": "www:/abc"}})),
            "/url/ field of /http/ is invalid"
        );
        assert_eq!(
            prov(json!({"http": url, "legacyForwarding": 14})),
            "the field /legacyForwarding/ must be a boolean"
        );
        assert_eq!(
            bad_text(with(|b| b["status"] = json!(4))),
            "/status/ must be a string"
        );
        assert_eq!(
            bad_text(with(|b| b["status"] = json!("green"))),
            "invalid value for /status/"
        );
        assert_eq!(
            bad_text(with(|b| b["expires"] = json!(1))),
            "expires is not a string"
        );
        assert_eq!(
            bad_text(with(|b| b["expires"] = json!("tomorrow"))),
            "the field /expires/ has an invalid format"
        );
        for mode in ["none", "query", "update", "all"] {
            let b = with(|b| b["provider"]["supportedForwardingMode"] = json!(mode));
            let r = Registration::parse(&b, "x".into()).unwrap();
            assert_eq!(r.render()["provider"]["supportedForwardingMode"], mode);
        }
    }

    #[test]
    fn patterns_orion_does_not_implement_are_501() {
        let ent = |e: Value| err(with(|b| b["dataProvided"]["entities"] = json!([e])));
        let (status, name, text) = ent(json!({"idPattern": "E.*", "type": "T1"}));
        assert_eq!(
            (status, name, text.as_str()),
            (501, "NotImplemented", "Unsupported idPattern")
        );
        let (status, name, _) = ent(json!({"id": "E1", "typePattern": "T.*"}));
        assert_eq!((status, name), (501, "NotImplemented"));
        // A bad item later in the list is still a 400.
        let (status, _, _) = err(with(|b| {
            b["dataProvided"]["entities"] = json!([{"idPattern": "E.*"}, {"id": ""}])
        }));
        assert_eq!(status, 400);
    }

    #[test]
    fn urls() {
        for ok in [
            "http://localhost:1028/v2",
            "https://cp.example.org",
            "http://127.0.0.1:9801",
            "http://[::1]:1026/x",
        ] {
            assert!(is_valid_url(ok, false), "{ok}");
        }
        for no in [
            "www:/abc",
            "http://",
            "http://h:x",
            "localhost:1026",
            "http://a b",
        ] {
            assert!(!is_valid_url(no, false), "{no}");
        }
    }

    #[test]
    fn coverage_and_provided_attributes() {
        let r = Registration::parse(&body(), "x".into()).unwrap();
        assert!(r.covers("E1", Some("T1")));
        assert!(r.covers("E1", None));
        assert!(!r.covers("E1", Some("T2")));
        assert!(!r.covers("E3", None));
        let any = Registration::parse(
            &json!({"dataProvided": {"entities": [{"idPattern": ".*"}]},
                    "provider": {"http": {"url": "http://cp.example.org"}}}),
            "x".into(),
        )
        .unwrap();
        assert!(any.covers("whatever", Some("T9")));
        assert_eq!(any.provided(None), None);
        let wanted = ["A".to_string()];
        assert_eq!(any.provided(Some(&wanted)), Some(vec!["A".to_string()]));
        assert_eq!(r.provided(None), Some(vec!["A1".into(), "A2".into()]));
        let wanted = ["A2".to_string(), "B".to_string()];
        assert_eq!(r.provided(Some(&wanted)), Some(vec!["A2".to_string()]));
        // legacyForwarding: true in body(): never forwarded.
        assert!(!r.forwards_queries() && !r.forwards_updates());
        let modes = |mode: &str| {
            let b = with(|b| {
                b["provider"]["legacyForwarding"] = json!(false);
                b["provider"]["supportedForwardingMode"] = json!(mode);
            });
            let r = Registration::parse(&b, "x".into()).unwrap();
            (r.forwards_queries(), r.forwards_updates())
        };
        assert_eq!(modes("all"), (true, true));
        assert_eq!(modes("query"), (true, false));
        assert_eq!(modes("update"), (false, true));
        assert_eq!(modes("none"), (false, false));
    }

    #[test]
    fn forwarding_information_is_shown_once_something_was_sent() {
        let r = Registration::parse(&body(), "x".into()).unwrap();
        let mut info = ForwardingInfo::default();
        assert!(r
            .render_with(Some(&info))
            .get("forwardingInformation")
            .is_none());
        info.record(true, 1_000);
        info.record(false, 2_000);
        assert_eq!(
            r.render_with(Some(&info))["forwardingInformation"],
            json!({
                "timesSent": 2,
                "lastForwarding": "1970-01-01T00:00:02.000Z",
                "lastSuccess": "1970-01-01T00:00:01.000Z",
                "lastFailure": "1970-01-01T00:00:02.000Z"
            })
        );
        assert_eq!(info.times_failed, 1);
    }

    #[test]
    fn ids_are_24_hex_and_distinct() {
        let a = new_id();
        let b = new_id();
        assert!(is_id(&a) && is_id(&b), "{a} {b}");
        assert_eq!(a, a.to_ascii_lowercase());
        assert_ne!(a, b);
        assert!(!is_id("inexistentid"));
        assert_eq!(
            not_found().to_json(),
            json!({"error": "NotFound", "description": "The requested registration has not been found. Check id"})
        );
    }
}
