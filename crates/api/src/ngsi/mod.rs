//! The NGSIv2 surface (`/v2`, `/version`): FIWARE Orion's API, so that
//! Orion's clients (IoT agents, QuantumLeap, dashboards) work unchanged.
//!
//! Requests flow: [`Surface`] (echo or mint `Fiware-Correlator`, then
//! Orion's 411/413 checks on bodies) → routing (405 with `Allow` for a
//! known path with a wrong verb; [`fallback`] for unknown paths) → the
//! handler, whose extractors ([`tenant::Tenant`],
//! [`tenant::ServicePath`], [`params::Params`]) validate the scoping and
//! parameters → the pipeline's context. Entity state lives in the
//! context; this module only parses, validates and renders.
//!
//! One file per route group: [`entities`], [`attrs`], [`types`],
//! [`batch`], [`subscriptions`], [`registrations`].

pub mod admin;
pub mod attrs;
pub mod batch;
pub mod entities;
pub mod error;
pub mod params;
pub mod query_body;
pub mod registrations;
pub mod subscriptions;
pub mod tenant;
pub mod types;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method};
use axum::response::{IntoResponse, Response};
use axum::Router;
use bytes::Bytes;
use serde_json::json;
use tower::{Service, ServiceExt};
use weft_pipeline::context::{Origin, ORIGIN};
use weft_pipeline::orion_metrics as metrics;

use crate::routes::{get, post, put, Access, Methods, Routes, Scope};
use crate::{AppState, MAX_BODY_BYTES};
use error::{method_not_allowed, Error};

/// The Orion version weft reports at `/version`: the release whose API
/// it mirrors.
pub const ORION_VERSION: &str = "3.10.1";

/// Orion's headers, as names parsed once: a lookup by `&str` parses and
/// checks the name again on every request.
pub(crate) static FIWARE_CORRELATOR: HeaderName = HeaderName::from_static("fiware-correlator");
/// The tenant (see [`tenant`]).
pub(crate) static FIWARE_SERVICE: HeaderName = HeaderName::from_static("fiware-service");
/// The service paths (see [`tenant`]).
pub(crate) static FIWARE_SERVICEPATH: HeaderName = HeaderName::from_static("fiware-servicepath");
/// The caller's token, repeated in the notifications it triggers.
static X_AUTH_TOKEN: HeaderName = HeaderName::from_static("x-auth-token");

/// The `/v2` and `/version` routes behind Orion's per-request work, as one
/// service. [`crate::app`] sends it NGSI's paths ([`owns`]) and makes it
/// the fallback of the other surfaces, so it also answers unknown paths
/// (Orion's "Service not found").
pub fn service(state: AppState) -> Surface {
    admin::started();
    Surface {
        forwards_token: state.auth != crate::auth::AuthMode::On,
        routes: routes().build(&state).with_state(state),
    }
}

/// Whether `path` is one of NGSI's own (`/version`, `/v2` and everything
/// under it but QuantumLeap's `/v2/notify`): [`crate::App`] sends these
/// straight to the surface. A path of another surface under `/v2` must be
/// excepted here too.
pub fn owns(path: &str) -> bool {
    match path.strip_prefix("/v2") {
        Some(rest) => rest.is_empty() || (rest.starts_with('/') && rest != "/notify"),
        None => path == "/version",
    }
}

/// The NGSIv2 surface. What Orion does on every request (echo or mint
/// `Fiware-Correlator`, refuse a body-less write with 411 or an oversized
/// one with 413, name 413/422 by RFC 9110's reasons) is done here, once,
/// before routing. As `middleware::from_fn` layers it would be cloned,
/// boxed and polled through on every route of every request, and a check
/// inside axum's routing gets axum's own `Allow` header added to the 411
/// it gives for a wrong verb.
#[derive(Clone)]
pub struct Surface {
    /// The NGSI routes with the state given, so nothing is built per
    /// request.
    routes: Router,
    /// Whether notifications repeat the request's `X-Auth-Token`, as
    /// Orion's do: only when weft does not check keys itself (with keys
    /// on, the token is a weft key, and weft's keys never leave weft).
    forwards_token: bool,
}

impl Service<Request> for Surface {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request) -> Self::Future {
        let correlator = correlator(req.headers());
        if let Some(refused) = guard(&req) {
            return Box::pin(std::future::ready(Ok(finish(refused, correlator))));
        }
        crate::limit_body(&mut req);
        let mut origin = origin(req.headers(), &correlator);
        if !self.forwards_token {
            origin.auth_token = None;
        }
        let counted = counted_as(req.headers());
        let started = std::time::Instant::now();
        let routed = ORIGIN.scope(origin, self.routes.call(req));
        Box::pin(async move {
            let resp = match routed.await {
                Ok(resp) => resp,
                Err(never) => match never {},
            };
            if let Some((keys, request_bytes)) = counted {
                use axum::body::HttpBody;
                let response_bytes = resp.body().size_hint().exact().unwrap_or(0);
                let error = resp.status().as_u16() >= 400;
                metrics::record_incoming(
                    &keys,
                    request_bytes,
                    response_bytes,
                    error,
                    started.elapsed(),
                );
            }
            Ok(finish(resp, correlator))
        })
    }
}

/// Orion's 405 for the verbs a route does not have: `Allow` lists the
/// verbs in Orion's order (axum adds its own `Allow` only to answers that
/// have none).
fn others(m: Methods, allow: &'static str) -> Methods {
    m.other_methods(move || async move { method_not_allowed(allow) })
}

/// Reads of the NGSI surface (`GET`, `POST /v2/op/query`).
const READ: Access = Access::read(Scope::Ngsi);
/// Writes of entities, subscriptions and registrations.
const WRITE: Access = Access::write(Scope::Ngsi);
/// Orion's administration reads (statistics, log level, semaphores,
/// metrics): weft's own, the default tenant's.
const OPS_READ: Access = Access::read(Scope::Own);
/// Orion's administration writes (resetting statistics and metrics,
/// setting the log level and traces): admin keys only.
const OPS_ADMIN: Access = Access::admin(Scope::Own);

/// Every route of the NGSI surface with who may call it. Unknown paths
/// ([`fallback`]) want a read key too, so a stranger learns nothing of
/// which paths exist.
pub fn routes() -> Routes {
    Routes::new()
        .route("/version", others(get(READ, version), "GET"))
        .route("/v2", others(get(READ, entry_point), "GET"))
        .route(
            "/statistics",
            others(
                get(OPS_READ, admin::statistics).delete(OPS_ADMIN, admin::reset_statistics),
                "GET, DELETE",
            ),
        )
        .route(
            "/cache/statistics",
            others(
                get(OPS_READ, admin::cache_statistics)
                    .delete(OPS_ADMIN, admin::reset_cache_statistics),
                "GET, DELETE",
            ),
        )
        .route(
            "/admin/log",
            others(
                get(OPS_READ, admin::get_log).put(OPS_ADMIN, admin::put_log),
                "GET, PUT",
            ),
        )
        .route(
            "/admin/sem",
            others(get(OPS_READ, admin::semaphores), "GET"),
        )
        .route(
            "/admin/metrics",
            others(
                get(OPS_READ, admin::get_metrics).delete(OPS_ADMIN, admin::reset_metrics),
                "GET, DELETE",
            ),
        )
        .route(
            "/log/trace",
            others(
                get(OPS_READ, admin::get_trace).delete(OPS_ADMIN, admin::delete_trace),
                "GET, DELETE",
            ),
        )
        .route(
            "/log/trace/{levels}",
            others(
                put(OPS_ADMIN, admin::put_trace).delete(OPS_ADMIN, admin::delete_trace),
                "PUT, DELETE",
            ),
        )
        .route(
            "/v2/entities",
            others(
                get(READ, entities::list).post(WRITE, entities::create),
                "GET, POST",
            ),
        )
        .route(
            "/v2/entities/{id}",
            others(
                get(READ, entities::retrieve).delete(WRITE, entities::remove),
                "GET, DELETE",
            ),
        )
        .route(
            "/v2/entities/{id}/attrs",
            others(
                get(READ, attrs::get_attrs)
                    .post(WRITE, attrs::append_attrs)
                    .put(WRITE, attrs::replace_attrs)
                    .patch(WRITE, attrs::update_attrs),
                "GET, PATCH, POST, PUT",
            ),
        )
        .route(
            "/v2/entities/{id}/attrs/{attr}",
            others(
                get(READ, attrs::get_attr)
                    .put(WRITE, attrs::put_attr)
                    .delete(WRITE, attrs::delete_attr),
                "GET, PUT, DELETE",
            ),
        )
        .route(
            "/v2/entities/{id}/attrs/{attr}/value",
            others(
                get(READ, attrs::get_value).put(WRITE, attrs::put_value),
                "GET, PUT",
            ),
        )
        .route("/v2/types", others(get(READ, types::list), "GET"))
        .route(
            "/v2/types/{type}",
            others(get(READ, types::retrieve), "GET"),
        )
        .route("/v2/op/update", others(post(WRITE, batch::update), "POST"))
        .route("/v2/op/query", others(post(READ, batch::query), "POST"))
        .route("/v2/op/notify", others(post(WRITE, batch::notify), "POST"))
        .route(
            "/v2/subscriptions",
            others(
                get(READ, subscriptions::list).post(WRITE, subscriptions::create),
                "GET, POST",
            ),
        )
        .route(
            "/api/v1/subscriptions/delivery",
            get(READ, subscriptions::deliveries),
        )
        .route(
            "/v2/subscriptions/{id}",
            others(
                get(READ, subscriptions::retrieve)
                    .patch(WRITE, subscriptions::update)
                    .delete(WRITE, subscriptions::remove),
                "GET, DELETE, PATCH",
            ),
        )
        .route(
            "/v2/registrations",
            others(
                get(READ, registrations::list).post(WRITE, registrations::create),
                "GET, POST",
            ),
        )
        .route(
            "/v2/registrations/{id}",
            others(
                get(READ, registrations::retrieve).delete(WRITE, registrations::remove),
                "GET, DELETE",
            ),
        )
        .fallback(READ, fallback)
}

/// A 200 JSON answer whose numbers are written as Orion writes them
/// (`weft_model::ngsi::number`): every rendered entity, attribute or
/// listing goes out through here, so `3.0` reads `3` and `1e20` reads
/// `1e+20` as with Orion.
pub fn json_response(body: &serde_json::Value) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        weft_model::ngsi::number::to_vec(body),
    )
        .into_response()
}

/// Orion's "Retrieve API Resources" (`GET /v2`).
async fn entry_point() -> Response {
    axum::Json(json!({
        "entities_url": "/v2/entities",
        "types_url": "/v2/types",
        "subscriptions_url": "/v2/subscriptions",
        "registrations_url": "/v2/registrations",
    }))
    .into_response()
}

/// Orion's `GET /version`: the Orion release mirrored, plus weft's own
/// build in `git_hash`/`compiled_by`.
async fn version() -> Response {
    thread_local! {
        /// The body last rendered on this thread, and the uptime second it
        /// is for: monitors poll `/version`, and only the uptime changes.
        static RENDERED: std::cell::RefCell<(u64, Bytes)> =
            const { std::cell::RefCell::new((u64::MAX, Bytes::new())) };
    }
    let secs = admin::started().elapsed().as_secs();
    let body = RENDERED.with_borrow_mut(|(at, body)| {
        if *at != secs {
            *at = secs;
            *body = Bytes::from(version_body(secs));
        }
        body.clone()
    });
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}

/// The JSON of `/version` after `secs` of uptime, written as text
/// (building it as a `serde_json` map was half of what a `/version`
/// request cost).
fn version_body(secs: u64) -> String {
    format!(
        concat!(
            r#"{{"orion":{{"version":"{version}","#,
            r#""uptime":"{d} d, {h} h, {m} m, {s} s","#,
            r#""git_hash":"nogitversion","compile_time":"nodate","#,
            r#""compiled_by":"weft {weft}","compiled_in":"weft","release_date":"nodate","#,
            r#""machine":"{arch}","doc":"https://fiware-orion.rtfd.io/en/{version}/","#,
            r#""libversions":{{"serde_json":"1","axum":"0.8"}}}}}}"#,
        ),
        version = ORION_VERSION,
        d = secs / 86_400,
        h = secs / 3600 % 24,
        m = secs / 60 % 60,
        s = secs % 60,
        weft = env!("CARGO_PKG_VERSION"),
        arch = std::env::consts::ARCH,
    )
}

/// The request's `Fiware-Correlator`, or a new UUID v4 when it had none
/// (as Orion does). The UUID's bits come from the thread's random
/// generator, not a `getrandom` system call per request.
fn correlator(headers: &HeaderMap) -> HeaderValue {
    if let Some(value) = headers.get(&FIWARE_CORRELATOR) {
        return value.clone();
    }
    let id = uuid::Builder::from_random_bytes(rand::random()).into_uuid();
    let mut text = [0u8; uuid::fmt::Hyphenated::LENGTH];
    HeaderValue::from_str(id.hyphenated().encode_lower(&mut text))
        .expect("a UUID is a valid header value")
}

/// Where `/admin/metrics` counts a request (service, subservice) and its
/// body size; `None` when its tenant or service path is invalid.
fn counted_as(headers: &HeaderMap) -> Option<(metrics::Keys, u64)> {
    let text = |name: &HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    let keys = metrics::keys(text(&FIWARE_SERVICE), text(&FIWARE_SERVICEPATH))?;
    let size = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    Some((keys, size))
}

/// What notifications triggered by this request repeat of it, and what
/// the self-notification loop protection reads: its correlator (a
/// notification's carries `; cbnotif=<n>` marks, one per hop) and whether
/// it is a custom notification (`Ngsiv2-AttrsFormat: custom`, which a
/// subscription cannot change), as Orion reads them.
fn origin(headers: &HeaderMap, correlator: &HeaderValue) -> Origin {
    let header = |name: &str| -> Option<String> {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    Origin {
        correlator: correlator.to_str().unwrap_or_default().to_string(),
        service: header(FIWARE_SERVICE.as_str()).map(|s| s.to_ascii_lowercase()),
        auth_token: header(X_AUTH_TOKEN.as_str()),
        custom_notification: header("ngsiv2-attrsformat")
            .is_some_and(|f| f.trim().eq_ignore_ascii_case("custom")),
    }
}

/// Puts the correlator on an answer of the surface and gives 413s and
/// 422s Orion's reason phrases.
fn finish(mut resp: Response, correlator: HeaderValue) -> Response {
    resp.headers_mut()
        .insert(FIWARE_CORRELATOR.clone(), correlator);
    // Orion's status lines use RFC 9110's reasons ("Unprocessable
    // Content", "Content Too Large"); the http crate's are older.
    let reason: Option<&'static [u8]> = match resp.status().as_u16() {
        413 => Some(b"Content Too Large"),
        422 => Some(b"Unprocessable Content"),
        _ => None,
    };
    if let Some(reason) = reason {
        resp.extensions_mut()
            .insert(hyper::ext::ReasonPhrase::from_static(reason));
    }
    resp
}

/// Orion's checks on bodies before routing: POST/PUT/PATCH need one
/// (411), and none may exceed 1 MiB (413, told by `Content-Length`).
/// `None` lets the request through.
fn guard(req: &Request) -> Option<Response> {
    let length = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let chunked = req.headers().contains_key(header::TRANSFER_ENCODING);
    let needs_body = matches!(*req.method(), Method::POST | Method::PUT | Method::PATCH);
    if needs_body && !chunked && length.unwrap_or(0) == 0 {
        return Some(Error::content_length_required().into_response());
    }
    if let Some(n) = length.filter(|n| *n > MAX_BODY_BYTES as u64) {
        return Some(Error::too_large(n, MAX_BODY_BYTES).into_response());
    }
    let accept = req.headers().get(header::ACCEPT)?.to_str().ok()?;
    let value_path = req.uri().path().trim_end_matches('/').ends_with("/value");
    unacceptable(accept, value_path).map(IntoResponse::into_response)
}

/// Orion's 406 for an `Accept` that takes nothing it answers, checked on
/// every request as Orion checks it (asked of the real Orion 4.7.0): JSON
/// is always acceptable (`application/json`, `application/*`, `*/*`,
/// whatever their `q`), text too on an attribute's `/value` (which then
/// picks between them itself). Refused, a header naming text gets
/// "acceptable MIME types: application/json", anything else "no
/// acceptable mime-type in accept header".
fn unacceptable(accept: &str, value_path: bool) -> Option<Error> {
    let mut names_text = false;
    for entry in accept.split(',') {
        let media = params::media_type(entry);
        match media.as_str() {
            "application/json" | "application/*" | "*/*" => return None,
            "text/plain" | "text/*" if value_path => return None,
            "text/plain" | "text/*" => names_text = true,
            _ => {}
        }
    }
    let description = if names_text {
        "acceptable MIME types: application/json"
    } else {
        "no acceptable mime-type in accept header"
    };
    Some(Error(weft_model::ngsi::NgsiError::new(
        406,
        "NotAcceptable",
        description,
    )))
}

/// Unknown paths. Orion ignores one trailing `/`, so `/v2/entities/` is
/// the listing and `/v2/entities//` an entity with an empty id: the path
/// without it is routed again; what still matches nothing gets
/// [`no_route`].
async fn fallback(State(state): State<AppState>, req: Request) -> Response {
    let path = req.uri().path();
    if path.len() > 1 && path.ends_with('/') {
        let stripped = &path[..path.len() - 1];
        let uri = match req.uri().query() {
            Some(q) => format!("{stripped}?{q}"),
            None => stripped.to_string(),
        };
        let (mut parts, body) = req.into_parts();
        match uri.parse() {
            Ok(u) => parts.uri = u,
            Err(_) => return Error::service_not_found().into_response(),
        }
        let req = Request::from_parts(parts, body);
        let inner = routes()
            .fallback(READ, no_route_handler)
            .build(&state)
            .with_state(state);
        return match inner.oneshot(req).await {
            Ok(resp) => resp,
            Err(never) => match never {},
        };
    }
    no_route(path)
}

async fn no_route_handler(req: Request<Body>) -> Response {
    no_route(req.uri().path())
}

/// What Orion answers for a path that matches no operation: an empty last
/// segment where an identifier belongs is that identifier's length error;
/// anything else is "Service not found".
fn no_route(path: &str) -> Response {
    use weft_model::ngsi::{check_name, NameKind};
    let segs: Vec<&str> = path.split('/').collect();
    let kind = match segs.as_slice() {
        ["", "v2", "entities", ""] => Some(NameKind::EntityId),
        ["", "v2", "entities", _, "attrs", ""] => Some(NameKind::AttrName),
        ["", "v2", "types", ""] => Some(NameKind::EntityType),
        ["", "v2", "subscriptions", ""] => {
            return Error::bad_request("Invalid subscription ID: bad length - 24 chars expected")
                .into_response()
        }
        _ => None,
    };
    match kind.map(|k| check_name(k, "")) {
        Some(Err(e)) => Error(e).into_response(),
        _ => Error::service_not_found().into_response(),
    }
}

/// Checks a decoded path segment (id, type, attribute name) for the
/// characters Orion refuses in URIs.
pub fn check_segment(s: &str) -> Result<(), Error> {
    const FORBIDDEN: &[char] = &['<', '>', '"', '\'', '=', ';', '(', ')', '&', '?', '#'];
    if s.contains(FORBIDDEN) {
        return Err(Error::bad_request("invalid character in URI"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `/version`'s text is what serializing Orion's document gives,
    /// field for field and in Orion's order.
    #[test]
    fn version_body_is_orions_document() {
        let secs = 2 * 86_400 + 3 * 3600 + 4 * 60 + 5;
        let expected = json!({"orion": {
            "version": ORION_VERSION,
            "uptime": "2 d, 3 h, 4 m, 5 s",
            "git_hash": "nogitversion",
            "compile_time": "nodate",
            "compiled_by": concat!("weft ", env!("CARGO_PKG_VERSION")),
            "compiled_in": "weft",
            "release_date": "nodate",
            "machine": std::env::consts::ARCH,
            "doc": "https://fiware-orion.rtfd.io/en/3.10.1/",
            "libversions": {
                "serde_json": "1",
                "axum": "0.8",
            }
        }});
        assert_eq!(version_body(secs), expected.to_string());
    }

    /// NGSI's own paths, which [`crate::App`] sends straight to the
    /// surface; everything else (QuantumLeap's `/v2/notify` among it) goes
    /// through the other surfaces' router first.
    #[test]
    fn owned_paths() {
        for path in [
            "/version",
            "/v2",
            "/v2/",
            "/v2/entities/R1/attrs",
            "/v2/op/notify",
            "/v2/notify/",
        ] {
            assert!(owns(path), "{path}");
        }
        for path in [
            "/v2/notify",
            "/v2x",
            "/version/",
            "/ql/v2/entities",
            "/health",
            "/",
        ] {
            assert!(!owns(path), "{path}");
        }
    }

    /// Orion's checks before routing: a write needs a body (411, unless
    /// chunked), no body may be announced over 1 MiB (413), whatever the
    /// verb; the rest passes.
    #[test]
    fn guard_follows_orion() {
        let req = |method: &str, headers: &[(&str, &str)]| {
            let mut req = Request::builder().method(method).uri("/v2/entities");
            for (name, value) in headers {
                req = req.header(*name, *value);
            }
            req.body(Body::empty()).unwrap()
        };
        let status = |req: &Request| guard(req).map(|r| r.status().as_u16());
        for method in ["POST", "PUT", "PATCH"] {
            assert_eq!(status(&req(method, &[])), Some(411), "{method}");
            assert_eq!(status(&req(method, &[("content-length", "0")])), Some(411));
            assert_eq!(status(&req(method, &[("content-length", "2")])), None);
            assert_eq!(
                status(&req(method, &[("transfer-encoding", "chunked")])),
                None
            );
        }
        let over = (MAX_BODY_BYTES + 1).to_string();
        assert_eq!(
            status(&req("POST", &[("content-length", &over)])),
            Some(413)
        );
        assert_eq!(status(&req("GET", &[("content-length", &over)])), Some(413));
        assert_eq!(status(&req("GET", &[])), None);
        assert_eq!(status(&req("DELETE", &[])), None);
    }

    /// A request without `Fiware-Correlator` gets a fresh UUID v4; one
    /// with it gets it back.
    #[test]
    fn correlators_are_echoed_or_minted() {
        let minted = correlator(&HeaderMap::new());
        let id = uuid::Uuid::parse_str(minted.to_str().unwrap()).unwrap();
        assert_eq!(id.get_version_num(), 4);
        assert_eq!(minted.to_str().unwrap(), id.hyphenated().to_string());
        assert_ne!(minted, correlator(&HeaderMap::new()));
        let mut headers = HeaderMap::new();
        headers.insert("fiware-correlator", HeaderValue::from_static("abc-1"));
        assert_eq!(correlator(&headers), "abc-1");
    }

    /// A notification's correlator keeps its marks, and a custom
    /// notification is told apart by its `Ngsiv2-AttrsFormat`.
    #[test]
    fn origins_tell_notifications_apart() {
        let mut headers = HeaderMap::new();
        headers.insert(
            "fiware-correlator",
            HeaderValue::from_static("abc; cbnotif=1; cbnotif=2"),
        );
        let c = correlator(&headers);
        let plain = origin(&headers, &c);
        assert_eq!(plain.correlator_root(), "abc");
        assert_eq!(plain.notification_depth(), 2);
        assert!(!plain.custom_notification);
        headers.insert("ngsiv2-attrsformat", HeaderValue::from_static("custom"));
        assert!(origin(&headers, &c).custom_notification);
        headers.insert("ngsiv2-attrsformat", HeaderValue::from_static("normalized"));
        assert!(!origin(&headers, &c).custom_notification);
    }
}
