//! The NGSIv2 surface (`/v2`, `/version`): FIWARE Orion's API, so that
//! Orion's clients (IoT agents, QuantumLeap, dashboards) work unchanged.
//!
//! Requests flow: [`correlator`] (echo or mint `Fiware-Correlator`) →
//! [`guard`] (Orion's 411/413 checks on bodies) → routing (405 with
//! `Allow` for a known path with a wrong verb; [`fallback`] for unknown
//! paths) → the handler, whose extractors ([`tenant::Tenant`],
//! [`tenant::ServicePath`], [`params::Params`]) validate the scoping and
//! parameters → the pipeline's context. Entity state lives in the
//! context; this module only parses, validates and renders.
//!
//! One file per route group: [`entities`], [`attrs`], [`types`],
//! [`batch`], [`subscriptions`], [`registrations`].

pub mod attrs;
pub mod batch;
pub mod entities;
pub mod error;
pub mod params;
pub mod registrations;
pub mod subscriptions;
pub mod tenant;
pub mod types;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, MethodRouter};
use axum::Router;
use serde_json::json;
use tower::ServiceExt;

use crate::{AppState, MAX_BODY_BYTES};
use error::{method_not_allowed, Error};

/// The Orion version weft reports at `/version`: the release whose API
/// it mirrors.
pub const ORION_VERSION: &str = "3.10.1";

/// The `/v2` and `/version` routes with the NGSIv2 layers.
pub fn router() -> Router<AppState> {
    routes()
        .fallback(fallback)
        .layer(middleware::from_fn(guard))
        .layer(middleware::from_fn(correlator))
}

/// A method router answering every other verb with Orion's 405.
///
/// The verbs are dispatched inside an `any` route rather than by axum's
/// own method routing, because axum adds its own `Allow` header (in its
/// order, with `HEAD`) to every answer of a route whose verb did not
/// match, including the 411 that [`guard`] gives before the verb is
/// looked at.
fn verbs(allow: &'static str, m: MethodRouter<AppState>) -> MethodRouter<AppState> {
    let m = m.fallback(move || async move { method_not_allowed(allow) });
    any(move |State(state): State<AppState>, req: Request| {
        let m = m.clone();
        async move {
            match m.with_state(state).oneshot(req).await {
                Ok(resp) => resp,
                Err(never) => match never {},
            }
        }
    })
}

fn routes() -> Router<AppState> {
    Router::new()
        .route("/version", verbs("GET", get(version)))
        .route("/v2", verbs("GET", get(entry_point)))
        .route(
            "/v2/entities",
            verbs("GET, POST", get(entities::list).post(entities::create)),
        )
        .route(
            "/v2/entities/{id}",
            verbs(
                "GET, DELETE",
                get(entities::retrieve).delete(entities::remove),
            ),
        )
        .route(
            "/v2/entities/{id}/attrs",
            verbs(
                "GET, PATCH, POST, PUT",
                get(attrs::get_attrs)
                    .post(attrs::append_attrs)
                    .put(attrs::replace_attrs)
                    .patch(attrs::update_attrs),
            ),
        )
        .route(
            "/v2/entities/{id}/attrs/{attr}",
            verbs(
                "GET, PUT, DELETE",
                get(attrs::get_attr)
                    .put(attrs::put_attr)
                    .delete(attrs::delete_attr),
            ),
        )
        .route(
            "/v2/entities/{id}/attrs/{attr}/value",
            verbs("GET, PUT", get(attrs::get_value).put(attrs::put_value)),
        )
        .route("/v2/types", verbs("GET", get(types::list)))
        .route("/v2/types/{type}", verbs("GET", get(types::retrieve)))
        .route(
            "/v2/op/update",
            verbs("POST", axum::routing::post(batch::update)),
        )
        .route(
            "/v2/op/query",
            verbs("POST", axum::routing::post(batch::query)),
        )
        .route(
            "/v2/op/notify",
            verbs("POST", axum::routing::post(batch::notify)),
        )
        .route(
            "/v2/subscriptions",
            verbs(
                "GET, POST",
                get(subscriptions::list).post(subscriptions::create),
            ),
        )
        .route(
            "/v2/subscriptions/{id}",
            verbs(
                "GET, DELETE, PATCH",
                get(subscriptions::retrieve)
                    .patch(subscriptions::update)
                    .delete(subscriptions::remove),
            ),
        )
        .route(
            "/v2/registrations",
            verbs(
                "GET, POST",
                get(registrations::list).post(registrations::create),
            ),
        )
        .route(
            "/v2/registrations/{id}",
            verbs(
                "GET, DELETE",
                get(registrations::retrieve).delete(registrations::remove),
            ),
        )
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
    static STARTED: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let started = *STARTED.get_or_init(std::time::Instant::now);
    let secs = started.elapsed().as_secs();
    let uptime = format!(
        "{} d, {} h, {} m, {} s",
        secs / 86_400,
        secs / 3600 % 24,
        secs / 60 % 60,
        secs % 60
    );
    axum::Json(json!({"orion": {
        "version": ORION_VERSION,
        "uptime": uptime,
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
    }}))
    .into_response()
}

/// Echoes `Fiware-Correlator`, or mints a UUID v4 when the request had
/// none, on every answer of the surface; gives 422s Orion's reason phrase.
async fn correlator(req: Request, next: Next) -> Response {
    let value = req
        .headers()
        .get("fiware-correlator")
        .cloned()
        .unwrap_or_else(|| {
            HeaderValue::from_str(&uuid::Uuid::new_v4().to_string())
                .expect("a UUID is a valid header value")
        });
    let header = |headers: &HeaderMap, name: &str| -> Option<String> {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let service = header(req.headers(), "fiware-service").map(|s| s.to_ascii_lowercase());
    let auth_token = header(req.headers(), "x-auth-token");
    let origin = weft_pipeline::context::Origin {
        correlator: value.to_str().unwrap_or_default().to_string(),
        service,
        auth_token,
    };
    let mut resp = weft_pipeline::context::ORIGIN
        .scope(origin, next.run(req))
        .await;
    resp.headers_mut().insert("fiware-correlator", value);
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
async fn guard(req: Request, next: Next) -> Response {
    let length = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let chunked = req.headers().contains_key(header::TRANSFER_ENCODING);
    let needs_body = matches!(*req.method(), Method::POST | Method::PUT | Method::PATCH);
    if needs_body && !chunked && length.unwrap_or(0) == 0 {
        return Error::content_length_required().into_response();
    }
    if let Some(n) = length.filter(|n| *n > MAX_BODY_BYTES as u64) {
        return Error::too_large(n, MAX_BODY_BYTES).into_response();
    }
    next.run(req).await
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
        let inner = routes().fallback(no_route_handler).with_state(state);
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

/// Now, in epoch milliseconds (entity and attribute dates).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
