//! The NGSI-LD surface (`/ngsi-ld/v1`, ETSI GS CIM 009) over the same
//! entities as `/v2`.
//!
//! Every request goes: the route's guard (a key, [`Scope::NgsiLd`]) →
//! [`LdRequest`] (the tenant from `NGSILD-Tenant`, the context from a
//! `Link` header or the body's `@context`, resolved by the pipeline's
//! [`weft_pipeline::ld_contexts`]) → the model's reading of the body
//! ([`weft_model::ngsi_ld::entity`]) → the NGSI write or the context →
//! an answer in the representation `Accept` asks for ([`Answer`]).
//! Errors are problem details ([`LdError`]).
//!
//! One file per route group: [`entities`] (entities and their
//! attributes), [`batch`] (the batch operations), [`temporal`] (the
//! temporal API, over weft's history), [`subscriptions`] (on the
//! registry and sender NGSIv2's subscriptions use), [`discovery`] (types
//! and attributes), [`contexts`] (the `@context`s kept).

pub mod batch;
pub mod contexts;
pub mod discovery;
pub mod entities;
pub mod join;
pub mod subscriptions;
pub mod temporal;

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Map, Value};
use weft_model::ngsi::{tenancy, NgsiError};
use weft_model::ngsi_ld::projection::{Mode, Projection};
use weft_model::ngsi_ld::{entity, Context, ErrorKind, LdError};
use weft_pipeline::context::{Target, Tenancy, DEFAULT_TENANT};
use weft_pipeline::ld_contexts::LdContexts;

use crate::ngsi::params::{content_type, media_type, Params};
use crate::routes::{delete, get, patch, post, Access, Routes, Scope};
use crate::AppState;

/// The NGSI-LD tenant header.
pub static NGSILD_TENANT: HeaderName = HeaderName::from_static("ngsild-tenant");

pub use weft_model::ngsi_ld::context::{CONTEXT_REL, LD_JSON};

/// The service path NGSI-LD writes go to: NGSI-LD has none, and NGSIv2
/// clients see its entities at the root.
pub const LD_SERVICE_PATH: &str = "/";

/// Reads of the NGSI-LD surface.
const READ: Access = Access::read(Scope::NgsiLd);
/// Writes of the NGSI-LD surface.
const WRITE: Access = Access::write(Scope::NgsiLd);

/// Every route of the NGSI-LD surface with who may call it.
pub fn routes() -> Routes {
    use entities::*;
    Routes::new()
        .route("/ngsi-ld/v1/entities", get(READ, query).post(WRITE, create))
        .route(
            "/ngsi-ld/v1/entities/{id}",
            get(READ, retrieve)
                .put(WRITE, replace)
                .patch(WRITE, merge)
                .delete(WRITE, remove),
        )
        .route(
            "/ngsi-ld/v1/entities/{id}/attrs",
            post(WRITE, append).patch(WRITE, update),
        )
        .route(
            "/ngsi-ld/v1/entities/{id}/attrs/{attr}",
            patch(WRITE, update_attr)
                .put(WRITE, replace_attr)
                .delete(WRITE, remove_attr),
        )
        .route(
            "/ngsi-ld/v1/subscriptions",
            get(READ, subscriptions::query).post(WRITE, subscriptions::create),
        )
        .route(
            "/ngsi-ld/v1/subscriptions/{id}",
            get(READ, subscriptions::retrieve)
                .patch(WRITE, subscriptions::update)
                .delete(WRITE, subscriptions::remove),
        )
        .route(
            "/ngsi-ld/v1/jsonldContexts",
            get(READ, contexts::list).post(WRITE, contexts::add),
        )
        .route(
            "/ngsi-ld/v1/jsonldContexts/{id}",
            get(READ, contexts::serve).delete(WRITE, contexts::forget),
        )
        .route("/ngsi-ld/v1/types", get(READ, discovery::types))
        .route("/ngsi-ld/v1/types/{type}", get(READ, discovery::type_info))
        .route("/ngsi-ld/v1/attributes", get(READ, discovery::attributes))
        .route(
            "/ngsi-ld/v1/attributes/{attr}",
            get(READ, discovery::attribute),
        )
        .route(
            "/ngsi-ld/v1/temporal/entities",
            get(READ, temporal::query).post(WRITE, temporal::create),
        )
        .route(
            "/ngsi-ld/v1/temporal/entities/{id}",
            get(READ, temporal::retrieve).delete(WRITE, temporal::delete),
        )
        .route(
            "/ngsi-ld/v1/temporal/entities/{id}/attrs",
            post(WRITE, temporal::append),
        )
        .route(
            "/ngsi-ld/v1/temporal/entities/{id}/attrs/{attr}",
            delete(WRITE, temporal::delete_attr),
        )
        .route(
            "/ngsi-ld/v1/temporal/entityOperations/query",
            post(READ, temporal::query_by_post),
        )
        .route(
            "/ngsi-ld/v1/entityOperations/create",
            post(WRITE, batch::create),
        )
        .route(
            "/ngsi-ld/v1/entityOperations/upsert",
            post(WRITE, batch::upsert),
        )
        .route(
            "/ngsi-ld/v1/entityOperations/update",
            post(WRITE, batch::update),
        )
        .route(
            "/ngsi-ld/v1/entityOperations/merge",
            post(WRITE, batch::merge),
        )
        .route(
            "/ngsi-ld/v1/entityOperations/delete",
            post(WRITE, batch::delete),
        )
        .route(
            "/ngsi-ld/v1/entityOperations/query",
            post(READ, query_by_post),
        )
}

/// NGSI-LD clients (and ETSI's test suite) write collection paths with a
/// trailing slash (`/ngsi-ld/v1/entities/`): the path is read without it,
/// so both spellings reach the same route.
pub fn trim_trailing_slash<B>(req: &mut axum::http::Request<B>) {
    let uri = req.uri();
    let path = uri.path();
    if !(path.starts_with("/ngsi-ld/v1/")
        && path.len() > "/ngsi-ld/v1/".len()
        && path.ends_with('/'))
    {
        return;
    }
    let trimmed = path.trim_end_matches('/');
    let rebuilt = match uri.query() {
        Some(q) => format!("{trimmed}?{q}"),
        None => trimmed.to_string(),
    };
    if let Ok(uri) = rebuilt.parse() {
        *req.uri_mut() = uri;
    }
}

/// An NGSI-LD error answer: problem details with the kind's status.
#[derive(Debug)]
pub struct Error(pub LdError);

/// Result alias of the surface's handlers.
pub type Result<T> = std::result::Result<T, Error>;

impl From<LdError> for Error {
    fn from(e: LdError) -> Self {
        Error(e)
    }
}

impl From<NgsiError> for Error {
    fn from(e: NgsiError) -> Self {
        Error(from_ngsi(e))
    }
}

/// An NGSIv2 error of the shared write, said in NGSI-LD's kinds.
pub fn from_ngsi(e: NgsiError) -> LdError {
    let kind = match e.status {
        404 => ErrorKind::ResourceNotFound,
        422 if e.description == "Already Exists" => ErrorKind::AlreadyExists,
        409 => ErrorKind::AlreadyExists,
        400 | 413 | 422 => ErrorKind::BadRequestData,
        _ => ErrorKind::InternalError,
    };
    LdError::new(kind, e.description)
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.0.kind.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (
            status,
            [(header::CONTENT_TYPE, "application/json")],
            self.0.to_json().to_string(),
        )
            .into_response()
    }
}

/// What every NGSI-LD request carries besides its body: the tenant it
/// addresses, the context its names are read with (from a `Link` header;
/// a JSON-LD body's own `@context` replaces it, see [`LdRequest::body`])
/// and the representation its answer is wanted in.
pub struct LdRequest {
    /// The tenant (`NGSILD-Tenant`, lowercased; the default when absent).
    pub tenant: String,
    /// The context of the `Link` header, or the core context.
    pub context: Arc<Context>,
    /// The media type of the answer `Accept` chose.
    pub form: AnswerForm,
    /// The body's media type, read when [`LdRequest::body`] reads it.
    content_type: Option<String>,
    /// Whether a `Link` header named a context.
    link_given: bool,
    /// Whether the body read was JSON-LD (`application/ld+json`).
    body_ld: bool,
    /// Where a JSON-LD body's own context is resolved.
    contexts: Arc<LdContexts>,
}

impl FromRequestParts<AppState> for LdRequest {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self> {
        let tenant = tenant(&parts.headers, state)?;
        let reads = matches!(parts.method, Method::GET | Method::DELETE);
        if reads && !tenant_exists(state, &tenant).await {
            return Err(Error(LdError::new(
                ErrorKind::NonexistentTenant,
                format!("there is no tenant {tenant}"),
            )));
        }
        let link = link_context(&parts.headers)?;
        let link_given = link.is_some();
        let context = state
            .services
            .ld_contexts
            .resolve(link.map(Value::String).as_ref())
            .await?;
        Ok(LdRequest {
            tenant,
            context,
            form: answer_form(&parts.headers)?,
            content_type: content_type(&parts.headers),
            link_given,
            body_ld: false,
            contexts: state.services.ld_contexts.clone(),
        })
    }
}

impl LdRequest {
    /// The tenancy reads of this request cover: every service path.
    pub fn tenancy(&self) -> Tenancy {
        Tenancy {
            tenant: self.tenant.clone(),
            received: None,
            read_paths: Vec::new(),
        }
    }

    /// The entity `id` as a write addresses it.
    pub fn target(&self, id: &str, entity_type: Option<String>) -> Target {
        Target {
            tenancy: self.tenancy(),
            path: LD_SERVICE_PATH.to_string(),
            id: id.to_string(),
            entity_type,
        }
    }

    /// Reads the request's JSON body, and the context its names are read
    /// with: with `Content-Type: application/json` the `Link` header's
    /// (and no `@context` in the body); with `application/ld+json` the
    /// body's `@context` (and no `Link` header). The context of the answer
    /// becomes the body's too.
    pub async fn body(&mut self, body: &Bytes) -> Result<Value> {
        let ld = match self.content_type.as_deref() {
            Some(LD_JSON) => true,
            Some("application/json" | "application/merge-patch+json") => false,
            Some(other) => {
                return Err(Error(LdError::new(
                    ErrorKind::UnsupportedMediaType,
                    format!("unsupported Content-Type: {other}"),
                )))
            }
            None => {
                return Err(Error(LdError::new(
                    ErrorKind::UnsupportedMediaType,
                    "a body needs a Content-Type: application/json or application/ld+json",
                )))
            }
        };
        self.body_ld = ld;
        let value = weft_model::json::parse_within_limits(body)
            .map_err(|e| LdError::invalid(format!("the body is not JSON NGSI-LD reads: {e}")))?;
        let inline = value.get("@context");
        match (ld, inline) {
            (true, None) if !value.is_array() => {
                return Err(Error(LdError::bad_request(
                    "a body of Content-Type application/ld+json carries its @context",
                )))
            }
            (true, _) if self.link_given => {
                return Err(Error(LdError::bad_request(
                    "a body of Content-Type application/ld+json takes its @context from the body, not a Link header",
                )))
            }
            (true, Some(inline)) => {
                self.context = self.contexts.resolve(Some(inline)).await?;
            }
            (false, Some(_)) => {
                return Err(Error(LdError::bad_request(
                    "a body of Content-Type application/json cannot carry an @context: send it in a Link header",
                )))
            }
            _ => {}
        }
        Ok(value)
    }

    /// Whether the body [`LdRequest::body`] read was JSON-LD: each entity
    /// of a JSON-LD batch carries its own `@context`.
    pub fn body_is_ld(&self) -> bool {
        self.body_ld
    }

    /// The answer `body` (an entity or a list of them, or another NGSI-LD
    /// object) in the representation asked for; GeoJSON is answered as
    /// JSON (only entities have a GeoJSON form, see
    /// [`LdRequest::answer_entities`]).
    pub fn answer(&self, body: Value) -> Response {
        self.answer_with(StatusCode::OK, body)
    }

    /// Entities (one, or a list) in the representation asked for: with
    /// `Accept: application/geo+json`, a GeoJSON Feature (or
    /// FeatureCollection) whose geometry is the GeoProperty
    /// `geometryProperty` names (`location` by default).
    pub fn answer_entities(&self, body: Value, geometry_property: &str) -> Response {
        if self.form != AnswerForm::GeoJson {
            return self.answer(body);
        }
        let name = self
            .context
            .from_stored(&self.context.to_stored(geometry_property));
        let mut body = match body {
            Value::Array(items) => serde_json::json!({
                "type": "FeatureCollection",
                "features": items.into_iter().map(|e| entity::feature(e, &name)).collect::<Vec<_>>(),
            }),
            one => entity::feature(one, &name),
        };
        // GeoJSON readers ignore it; NGSI-LD clients read the names with it.
        if let Value::Object(map) = &mut body {
            map.insert("@context".into(), self.context.answer_context());
        }
        let mut resp = self.answer_with(StatusCode::OK, body);
        resp.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(GEO_JSON));
        resp
    }

    /// [`LdRequest::answer`] with another status.
    pub fn answer_with(&self, status: StatusCode, body: Value) -> Response {
        if self.form == AnswerForm::JsonLd {
            let ctx = self.context.answer_context();
            let body = match body {
                Value::Object(map) => Value::Object(with_context(map, ctx)),
                Value::Array(items) => Value::Array(
                    items
                        .into_iter()
                        .map(|item| match item {
                            Value::Object(map) => Value::Object(with_context(map, ctx.clone())),
                            other => other,
                        })
                        .collect(),
                ),
                other => other,
            };
            return (status, [(header::CONTENT_TYPE, LD_JSON)], body.to_string()).into_response();
        }
        let link = weft_model::ngsi_ld::context::link_header(self.context.link_url());
        let mut resp = (
            status,
            [(header::CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
            .into_response();
        if let Ok(link) = HeaderValue::from_str(&link) {
            resp.headers_mut().insert(header::LINK, link);
        }
        resp
    }
}

/// `map` with `@context` added last.
fn with_context(mut map: Map<String, Value>, ctx: Value) -> Map<String, Value> {
    map.insert("@context".into(), ctx);
    map
}

/// The request's tenant: `NGSILD-Tenant`, checked as `Fiware-Service`
/// is (the two name the same tenants).
fn tenant(headers: &HeaderMap, state: &AppState) -> Result<String> {
    let Some(raw) = headers.get(&NGSILD_TENANT) else {
        return Ok(DEFAULT_TENANT.to_string());
    };
    let name = raw
        .to_str()
        .map_err(|_| LdError::bad_request("the NGSILD-Tenant header is not text"))?;
    let tenant = tenancy::check_tenant(name)
        .map_err(|e| LdError::bad_request(format!("NGSILD-Tenant: {}", e.description)))?;
    Ok(if state.ngsi_multiservice {
        tenant
    } else {
        DEFAULT_TENANT.to_string()
    })
}

/// Whether `tenant` exists: the default one always; another once it has
/// had an entity, a subscription or a history (NGSI-LD's tenants come to
/// be with what is created in them; reading or deleting in one that never
/// had anything is `NonexistentTenant`).
async fn tenant_exists(state: &AppState, tenant: &str) -> bool {
    let services = &state.services;
    if tenant == DEFAULT_TENANT
        || services.context.has_tenant(tenant)
        || services.subscriptions.has_tenant(tenant)
    {
        return true;
    }
    match services.store.history_tenants().await {
        Ok(tenants) => tenants.iter().any(|t| t == tenant),
        // Not known to be missing: the read itself will say what it finds.
        Err(_) => true,
    }
}

/// The URL of the JSON-LD context a `Link` header names, if any; two are
/// refused.
pub fn link_context(headers: &HeaderMap) -> Result<Option<String>> {
    let mut found = None;
    for value in headers.get_all(header::LINK) {
        let text = value
            .to_str()
            .map_err(|_| LdError::bad_request("the Link header is not text"))?;
        for link in text.split(',') {
            let Some((target, params)) = link.trim().split_once('>') else {
                continue;
            };
            let rel = params.split(';').map(str::trim).any(|p| {
                p.strip_prefix("rel=")
                    .is_some_and(|r| r.trim_matches('"') == CONTEXT_REL)
            });
            if !rel {
                continue;
            }
            let url = target.trim().trim_start_matches('<').trim();
            if !weft_model::ngsi_ld::entity::is_uri(url) {
                return Err(Error(LdError::bad_request(format!(
                    "the Link header's context is not a URL: {url:?}"
                ))));
            }
            if found.replace(url.to_string()).is_some() {
                return Err(Error(LdError::bad_request(
                    "only one Link header may name a JSON-LD context",
                )));
            }
        }
    }
    Ok(found)
}

/// The media types an answer is given in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerForm {
    /// `application/json`, the context in a `Link` header.
    Json,
    /// `application/ld+json`, the context in the body.
    JsonLd,
    /// `application/geo+json` (entities), the context in a `Link` header.
    GeoJson,
}

/// `Content-Type` of GeoJSON answers.
pub const GEO_JSON: &str = "application/geo+json";

/// The answer's media type: the first of `Accept` weft serves decides;
/// none it serves is 406.
fn answer_form(headers: &HeaderMap) -> Result<AnswerForm> {
    let Some(accept) = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()) else {
        return Ok(AnswerForm::Json);
    };
    for item in accept.split(',') {
        let media = media_type(item);
        match media.as_str() {
            LD_JSON => return Ok(AnswerForm::JsonLd),
            GEO_JSON => return Ok(AnswerForm::GeoJson),
            "application/json" | "application/*" | "*/*" => return Ok(AnswerForm::Json),
            _ => {}
        }
    }
    Err(Error(LdError::new(
        ErrorKind::NotAcceptable,
        format!("none of the media types accepted is served: {accept}"),
    )))
}

/// The decoded query parameters of a request, in order (NGSI-LD's
/// decoding: `+` is a space), read as NGSIv2's are.
#[derive(Debug, Default)]
pub struct LdParams(Params);

impl<S: Send + Sync> FromRequestParts<S> for LdParams {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self> {
        let query = parts.uri.query().unwrap_or("");
        let params = LdParams(Params::from_pairs(
            form_urlencoded::parse(query.as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        ));
        params.check()?;
        Ok(params)
    }
}

/// The words `options` may hold, across the operations.
const OPTIONS: &[&str] = &[
    "keyValues",
    "simplified",
    "concise",
    "normalized",
    "sysAttrs",
    "temporalValues",
    "aggregatedValues",
    "noOverwrite",
    "replace",
    "update",
];

/// The representations `format` names.
const FORMATS: &[&str] = &[
    "keyValues",
    "simplified",
    "concise",
    "normalized",
    "temporalValues",
    "aggregatedValues",
];

impl LdParams {
    /// Refuses what no operation reads: an `options` word or a `format`
    /// NGSI-LD does not define, `pick` with `omit`, an empty or malformed
    /// name in `attrs`, `pick` or `omit`, a `join` or `joinLevel` that
    /// names no way of joining.
    fn check(&self) -> Result<()> {
        for word in self.list("options").unwrap_or_default() {
            if !OPTIONS.contains(&word.as_str()) {
                return Err(Error(LdError::invalid(format!(
                    "options: unknown option {word}"
                ))));
            }
        }
        if let Some(format) = self.get("format") {
            if !FORMATS.contains(&format) {
                return Err(Error(LdError::invalid(format!(
                    "format is normalized, concise, keyValues, simplified, temporalValues or aggregatedValues, not {format}"
                ))));
            }
        }
        if self.get("pick").is_some() && self.get("omit").is_some() {
            return Err(Error(LdError::bad_request(
                "pick and omit exclude each other",
            )));
        }
        if self.get("attrs").is_some() && (self.get("pick").is_some() || self.get("omit").is_some())
        {
            return Err(Error(LdError::bad_request(
                "attrs goes with neither pick nor omit",
            )));
        }
        if let Some(attrs) = self.list("attrs") {
            if attrs.iter().any(|a| a == "id" || a == "type") {
                return Err(Error(LdError::bad_request(
                    "attrs names attributes: id and type are always shown",
                )));
            }
        }
        self.projection()?;
        if let Some(join) = self.get("join") {
            if !matches!(join, "inline" | "flat" | "@none") {
                return Err(Error(LdError::bad_request(format!(
                    "join is inline, flat or @none, not {join}"
                ))));
            }
        }
        if let Some(level) = self.get("joinLevel") {
            if !level.parse::<u32>().is_ok_and(|l| l > 0) {
                return Err(Error(LdError::bad_request(format!(
                    "joinLevel is a positive integer, not {level}"
                ))));
            }
        }
        if let Some(raw) = self.get("attrs") {
            let bad = raw.split(',').any(|n| {
                n.is_empty()
                    || n.chars()
                        .any(|c| c.is_whitespace() || "<>\"'=;()[]{}".contains(c))
            });
            if bad {
                return Err(Error(LdError::bad_request(format!(
                    "attrs is a comma list of names: {raw}"
                ))));
            }
        }
        Ok(())
    }

    /// `pick` or `omit` (they exclude each other), read.
    pub fn projection(&self) -> Result<Option<Projection>> {
        let (mode, raw) = match (self.get("pick"), self.get("omit")) {
            (Some(raw), _) => (Mode::Pick, raw),
            (_, Some(raw)) => (Mode::Omit, raw),
            _ => return Ok(None),
        };
        Projection::parse(mode, raw).map(Some).map_err(|why| {
            Error(LdError::bad_request(format!(
                "{} is a comma list of names: {why}",
                if mode == Mode::Pick { "pick" } else { "omit" }
            )))
        })
    }

    /// These parameters and `extra` (read from a body, as `POST
    /// /entityOperations/query`'s), checked as the URL's are.
    pub fn extended(&self, extra: Vec<(String, String)>) -> Result<LdParams> {
        let mut pairs = self.0.pairs().to_vec();
        pairs.extend(extra);
        let params = LdParams(Params::from_pairs(pairs));
        params.check()?;
        Ok(params)
    }

    /// The first value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key)
    }

    /// A comma list, `None` when absent.
    pub fn list(&self, key: &str) -> Option<Vec<String>> {
        self.0.list(key)
    }

    /// Whether `options` (or its alias `format`) names `word`.
    pub fn option(&self, word: &str) -> bool {
        ["options", "format"].iter().any(|key| {
            self.list(key)
                .is_some_and(|words| words.iter().any(|w| w == word))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn the_link_header_names_one_context() {
        let ctx = "<http://example.org/c.jsonld>; rel=\"http://www.w3.org/ns/json-ld#context\"; type=\"application/ld+json\"";
        assert_eq!(link_context(&headers(&[])).unwrap(), None);
        assert_eq!(
            link_context(&headers(&[("link", ctx)])).unwrap().as_deref(),
            Some("http://example.org/c.jsonld")
        );
        // Links of other relations are not contexts.
        let other = "<http://example.org/next>; rel=\"next\"";
        assert_eq!(link_context(&headers(&[("link", other)])).unwrap(), None);
        assert!(link_context(&headers(&[("link", ctx), ("link", ctx)])).is_err());
        let not_url = "<not a url>; rel=\"http://www.w3.org/ns/json-ld#context\"";
        assert!(link_context(&headers(&[("link", not_url)])).is_err());
    }

    #[test]
    fn accept_picks_the_answers_media_type() {
        let form = |accept: &str| answer_form(&headers(&[("accept", accept)])).ok();
        assert_eq!(answer_form(&HeaderMap::new()).ok(), Some(AnswerForm::Json));
        assert_eq!(form("application/ld+json"), Some(AnswerForm::JsonLd));
        assert_eq!(
            form("application/geo+json;q=0.9"),
            Some(AnswerForm::GeoJson)
        );
        assert_eq!(form("text/html, */*"), Some(AnswerForm::Json));
        assert_eq!(form("text/html"), None);
    }

    #[test]
    fn ngsiv2_errors_read_as_ngsi_ld_kinds() {
        assert_eq!(
            from_ngsi(NgsiError::already_exists()).kind,
            ErrorKind::AlreadyExists
        );
        assert_eq!(
            from_ngsi(NgsiError::entity_not_found()).kind,
            ErrorKind::ResourceNotFound
        );
        assert_eq!(
            from_ngsi(NgsiError::bad_request("x")).kind,
            ErrorKind::BadRequestData
        );
        assert_eq!(
            from_ngsi(NgsiError::new(500, "InternalServerError", "x")).kind,
            ErrorKind::InternalError
        );
    }
}
