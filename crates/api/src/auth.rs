//! Who may do what: every request but `/health`, the probes, the
//! console's static files and the
//! ingest paths (which have their own credentials, see [`admit_ingest`])
//! must carry an API key, checked here once, before routing, for every
//! surface alike ([`admit`], called by [`crate::App`] and, on
//! QuantumLeap's own listener, by [`quantumleap_guard`]).
//!
//! The order of the checks: find the key (`X-Auth-Token`, else
//! `Authorization: Bearer`, else — live stream only — `?access_token=`),
//! 401 when there is none or it is unknown, expired or revoked; 429 when
//! its rate limit is spent; 403 when its role is too low for the request
//! or the request reaches outside its tenant or service path. A tenant
//! key's request without `Fiware-Service` is given the key's tenant, and
//! a service-path key's request without `Fiware-ServicePath` its path, so
//! the surfaces behind need not know about keys at all.
//!
//! Roles per surface (docs/security.md has the table):
//! - read: GET/HEAD anywhere, NGSI's and QuantumLeap's `op/query`, the
//!   live websocket and SSE;
//! - write: every other data write (NGSI entities, subscriptions,
//!   registrations, `/v2/notify`, history deletes, alarm ack/clear,
//!   channel messages and subscribers, the decode dry run);
//! - admin: definitions — device types, devices, rules, bridges, pages,
//!   page services, DSPS's `/admin` — `/api/v1/keys`, and the channel
//!   listing `/api/v1/channels` (it names every subscriber).
//!
//! Tenants: NGSI (`/v2`, `/version`) and QuantumLeap (`/ql`, `/v2/notify`)
//! are multi-tenant; weft's own API, the channels, pages and metrics are
//! the default tenant's. A key of another tenant, or one limited to a
//! service path, reaches only the multi-tenant surfaces (and the live
//! `entities` stream of its tenant). An admin key of the default tenant
//! without a service path is global: it may name any tenant.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{self, header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use weft_model::apikey::{path_within, ApiKey, Role, SECRET_PREFIX};
use weft_pipeline::keys::{KeyEntry, Keys};

use crate::{ApiError, ApiResult, AppState};

/// How requests are authenticated (`auth` in the configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMode {
    /// API keys on every surface (the default).
    On,
    /// No authentication at all: development only (weft warns at start).
    Off,
    /// An upstream PEP proxy has authenticated and authorised the request;
    /// weft takes the tenant and service path from the FIWARE headers as
    /// they come. weft must then be reachable only through that proxy.
    TrustProxy,
}

/// The key a request was let in with, for handlers whose answers depend
/// on it (the live stream, the keys API). Absent when authentication is
/// off or left to a proxy.
#[derive(Clone)]
pub struct Principal(pub Arc<KeyEntry>);

impl Principal {
    /// The key's record.
    pub fn key(&self) -> &ApiKey {
        &self.0.key
    }
}

/// FIWARE's token header, which PEP proxies read.
static X_AUTH_TOKEN: HeaderName = HeaderName::from_static("x-auth-token");
static FIWARE_SERVICE: HeaderName = HeaderName::from_static("fiware-service");
static FIWARE_SERVICEPATH: HeaderName = HeaderName::from_static("fiware-servicepath");

/// Which listener a request came in on: QuantumLeap's own serves its API
/// at `/v2/...`, where the main one serves Orion's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// weft's listener, every surface.
    Main,
    /// `history.quantumleap_listen`: QuantumLeap's API only.
    QuantumLeap,
}

/// What a path is, for authentication.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Surface {
    /// Needs no key: `/health`, the DSPS probes, the console's files.
    Open,
    /// Has its own credentials ([`admit_ingest`]).
    Ingest,
    /// NGSI, `/version`: multi-tenant, Orion's paths.
    Ngsi,
    /// QuantumLeap: multi-tenant, service path as a prefix.
    QuantumLeap,
    /// The live websocket and SSE.
    Live,
    /// `/api/v1/keys`.
    Keys,
    /// weft's own API, channels, pages, metrics: the default tenant's.
    Own,
}

fn classify(path: &str, listener: Listener) -> Surface {
    if listener == Listener::QuantumLeap {
        return if path.ends_with("/health") {
            Surface::Open
        } else {
            Surface::QuantumLeap
        };
    }
    match path {
        "/health" | "/probe/liveness" | "/probe/readiness" => return Surface::Open,
        "/api/v1/uplinks/ttn" | "/api/v1/uplinks/chirpstack" | "/iot/json/commands" => {
            return Surface::Ingest
        }
        "/api/v1/live" | "/api/v1/live/sse" => return Surface::Live,
        "/ql/health" => return Surface::Open,
        "/v2/notify" => return Surface::QuantumLeap,
        "/version" => return Surface::Ngsi,
        _ => {}
    }
    if crate::console::owns(path) {
        // Static files holding no data; the console sends a key with
        // every API call it makes.
        Surface::Open
    } else if path.starts_with("/sensor-data/") {
        Surface::Ingest
    } else if path == "/v2" || path.starts_with("/v2/") {
        Surface::Ngsi
    } else if path.starts_with("/ql/") {
        Surface::QuantumLeap
    } else if path == "/api/v1/keys" || path.starts_with("/api/v1/keys/") {
        Surface::Keys
    } else {
        Surface::Own
    }
}

/// Paths under which every write defines something (admin).
const DEFINITIONS: [&str; 7] = [
    "/api/v1/device-types/",
    "/api/v1/devices/",
    "/api/v1/rules/",
    "/api/v1/bridges/",
    "/api/v1/pages/",
    "/api/v1/page-services/",
    "/admin/",
];

/// `/api/v1/channels`: every channel's subscriber ids, which are what a
/// DSPS client fetches and acknowledges with; admin keys only.
fn is_channel_listing(path: &str) -> bool {
    path == "/api/v1/channels" || path.starts_with("/api/v1/channels/")
}

/// The role a request needs.
fn needed_role(method: &Method, path: &str, surface: Surface) -> Role {
    if surface == Surface::Keys || is_channel_listing(path) {
        return Role::Admin;
    }
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return Role::Read;
    }
    let query = matches!(surface, Surface::Ngsi | Surface::QuantumLeap)
        && *method == Method::POST
        && path.ends_with("/op/query");
    if query {
        return Role::Read;
    }
    // A dry run defines nothing; a device's downlink queue is data sent
    // to it, as NGSI writes are.
    let definition = surface == Surface::Own
        && DEFINITIONS.iter().any(|p| path.starts_with(p))
        && !path.ends_with("/decode")
        && !path.ends_with("/downlinks");
    if definition {
        Role::Admin
    } else {
        Role::Write
    }
}

/// Where a request's API key came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Carrier {
    /// `X-Auth-Token`.
    XAuthToken,
    /// `Authorization: Bearer`.
    Authorization,
    /// `?access_token=` (live stream only).
    Query,
}

/// The API key a request carries, and where.
fn find_token<'a>(headers: &'a HeaderMap, query: Option<&'a str>) -> Option<(&'a str, Carrier)> {
    if let Some(v) = headers.get(&X_AUTH_TOKEN) {
        return v.to_str().ok().map(|t| (t.trim(), Carrier::XAuthToken));
    }
    if let Some(t) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer)
    {
        return Some((t, Carrier::Authorization));
    }
    let query = query?;
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix("access_token="))
        .map(|t| (t, Carrier::Query))
}

/// The token of an `Authorization: Bearer <token>` value.
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// An error answer in the `{"error","description"}` shape NGSI (Orion),
/// QuantumLeap and weft's own API share.
fn refuse(status: StatusCode, name: &str, description: &str) -> Response {
    // Counted by status only: a label per reason or key would let
    // strangers grow the metrics without bound.
    let label = match status.as_u16() {
        401 => "401",
        403 => "403",
        429 => "429",
        _ => "other",
    };
    metrics::counter!("weft_auth_refused_total", "status" => label).increment(1);
    let mut resp = (
        status,
        axum::Json(json!({"error": name, "description": description})),
    )
        .into_response();
    if status == StatusCode::UNAUTHORIZED {
        resp.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    resp
}

fn unauthorized(description: &str) -> Response {
    refuse(StatusCode::UNAUTHORIZED, "Unauthorized", description)
}

fn forbidden(description: &str) -> Response {
    refuse(StatusCode::FORBIDDEN, "Forbidden", description)
}

/// 429 with `Retry-After` in whole seconds (at least 1).
fn too_many(wait: Duration) -> Response {
    let mut resp = refuse(
        StatusCode::TOO_MANY_REQUESTS,
        "TooManyRequests",
        "this API key's rate limit is exceeded; retry later",
    );
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    resp.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
    resp
}

/// Authenticates and authorises `req` (see the module's doc), adapting
/// its FIWARE headers to the key's scope; `Err` is the answer to send
/// instead. Cheap on the hot path: a SHA-256, a map lookup, the bucket.
// The error is the answer itself, built only for a refused request.
#[allow(clippy::result_large_err)]
pub fn admit<B>(
    mode: AuthMode,
    keys: &Keys,
    req: &mut http::Request<B>,
    listener: Listener,
) -> Result<(), Response> {
    if mode != AuthMode::On {
        return Ok(());
    }
    let surface = classify(req.uri().path(), listener);
    if matches!(surface, Surface::Open | Surface::Ingest) {
        return Ok(());
    }
    let query = (surface == Surface::Live)
        .then(|| req.uri().query())
        .flatten();
    let Some((token, carrier)) = find_token(req.headers(), query) else {
        return Err(unauthorized(
            "an API key is required: send it as 'Authorization: Bearer <key>' or 'X-Auth-Token: <key>'",
        ));
    };
    let entry = keys
        .authenticate(token)
        .map_err(|r| unauthorized(r.describe()))?;
    entry.admit().map_err(too_many)?;
    let key = &entry.key;
    let needed = needed_role(req.method(), req.uri().path(), surface);
    if !key.role.allows(needed) {
        return Err(forbidden(&format!(
            "this API key's role ({}) may not do this; it needs {}",
            key.role.as_str(),
            needed.as_str()
        )));
    }
    match surface {
        Surface::Own if !key.tenant.is_empty() || key.service_path.is_some() => {
            return Err(forbidden(
                "this API key is limited to a tenant or service path; weft's own API belongs to the default tenant",
            ));
        }
        Surface::Ngsi | Surface::QuantumLeap => scope_fiware(key, req, surface)?,
        _ => {}
    }
    // Orion forwards X-Auth-Token with notifications, and pages may pass
    // request headers on to their services: weft's keys must not leave
    // weft, so the header that carried one goes once it is checked.
    match carrier {
        Carrier::XAuthToken => drop(req.headers_mut().remove(&X_AUTH_TOKEN)),
        Carrier::Authorization => drop(req.headers_mut().remove(header::AUTHORIZATION)),
        Carrier::Query => {}
    }
    if matches!(surface, Surface::Live | Surface::Keys) {
        req.extensions_mut().insert(Principal(entry));
    }
    Ok(())
}

/// Holds a request of a multi-tenant surface to the key's tenant and
/// service path, filling in the headers the request left out.
#[allow(clippy::result_large_err)]
fn scope_fiware<B>(
    key: &ApiKey,
    req: &mut http::Request<B>,
    surface: Surface,
) -> Result<(), Response> {
    if key.is_global() {
        return Ok(());
    }
    let headers = req.headers();
    match headers.get(&FIWARE_SERVICE) {
        Some(v) => {
            let named = v.to_str().unwrap_or("\u{0}");
            if !named.eq_ignore_ascii_case(&key.tenant) {
                return Err(forbidden(&format!(
                    "this API key is limited to tenant '{}'",
                    key.tenant
                )));
            }
        }
        None if !key.tenant.is_empty() => {
            let value = HeaderValue::from_str(&key.tenant)
                .map_err(|_| forbidden("this API key's tenant cannot be sent as Fiware-Service"))?;
            req.headers_mut().insert(FIWARE_SERVICE.clone(), value);
        }
        None => {}
    }
    let Some(prefix) = key.service_path.as_deref() else {
        return Ok(());
    };
    match req.headers().get(&FIWARE_SERVICEPATH) {
        Some(v) => {
            let within = v
                .to_str()
                .is_ok_and(|paths| paths.split(',').all(|p| path_within(prefix, p)));
            if !within {
                return Err(forbidden(&format!(
                    "this API key is limited to service path '{prefix}' and below"
                )));
            }
        }
        None => {
            let read = needed_role(req.method(), req.uri().path(), surface) == Role::Read;
            let path = if read && surface == Surface::Ngsi {
                format!("{prefix}/#")
            } else {
                prefix.to_string()
            };
            let value = HeaderValue::from_str(&path).map_err(|_| {
                forbidden("this API key's service path cannot be sent as Fiware-ServicePath")
            })?;
            req.headers_mut().insert(FIWARE_SERVICEPATH.clone(), value);
        }
    }
    Ok(())
}

/// [`admit`] as a middleware, for QuantumLeap's own listener (whose
/// router is built apart from [`crate::app`]).
pub async fn quantumleap_guard(
    State(state): State<AppState>,
    mut req: Request<Body>,
    next: Next,
) -> Response {
    match admit(state.auth, &state.keys, &mut req, Listener::QuantumLeap) {
        Ok(()) => next.run(req).await,
        Err(resp) => resp,
    }
}

/// What an ingest key pins its uplinks to.
#[derive(Debug, Default)]
pub struct IngestPins {
    channel: Option<String>,
    device_type: Option<String>,
}

impl IngestPins {
    /// The pins as they travel with an uplink into the ingest log, so the
    /// pipeline holds the device the uplink turns out to name to them.
    pub fn uplink_pins(&self) -> weft_model::UplinkPins {
        weft_model::UplinkPins {
            channel: self.channel.clone(),
            device_type: self.device_type.clone(),
        }
    }

    /// The credential of a device's command result (`/iot/json/commands`),
    /// which is never open: `k` (the IoT Agents' API key parameter) or
    /// `Authorization` (raw or `Bearer`) must hold the global ingest key,
    /// an ingest key or a global admin key; its pins are answered, for the
    /// caller to hold the device to. 401 without a working credential,
    /// whether or not any ingest key exists; 403 for a key of another
    /// role; 429 past the key's rate limit. With `auth = "off"` API keys
    /// are not looked at, and the global ingest key, when configured, is
    /// the only credential (without one, command results are open, as
    /// every surface is then).
    pub fn of_command_result(
        state: &AppState,
        headers: &HeaderMap,
        k: Option<&str>,
    ) -> ApiResult<IngestPins> {
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(|g| bearer(g).unwrap_or(g.trim()));
        let tokens = [k, given];
        let tokens = tokens.iter().flatten().filter(|t| !t.is_empty());
        let keys_apply = state.auth != AuthMode::Off;
        let mut refused = None;
        for token in tokens {
            if state.ingest_key.as_deref() == Some(*token) {
                return Ok(IngestPins::default());
            }
            if !keys_apply {
                continue;
            }
            let Ok(entry) = state.keys.authenticate(token) else {
                continue;
            };
            let key = &entry.key;
            if key.role != Role::Ingest && !key.is_global() {
                refused = Some(ApiError::new(
                    StatusCode::FORBIDDEN,
                    "Forbidden",
                    "this API key may not post command results; they need an ingest key or a global admin key",
                ));
                continue;
            }
            if let Err(wait) = entry.admit() {
                return Err(ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "TooManyRequests",
                    "this API key's rate limit is exceeded; retry later",
                )
                .with_retry_after(wait));
            }
            return Ok(IngestPins {
                channel: key.channel.clone(),
                device_type: key.device_type.clone(),
            });
        }
        if let Some(refused) = refused {
            return Err(refused);
        }
        if !keys_apply && state.ingest_key.is_none() {
            return Ok(IngestPins::default());
        }
        Err(ApiError::unauthorized())
    }

    /// Holds an uplink's channel and device type to the key's: a request
    /// naming another gets 403; one naming none is given the key's.
    pub fn apply(
        &self,
        channel: &mut Option<String>,
        device_type: &mut Option<String>,
    ) -> ApiResult<()> {
        for (pinned, given, what) in [
            (&self.channel, channel, "channel"),
            (&self.device_type, device_type, "device type"),
        ] {
            let Some(pinned) = pinned else { continue };
            match given {
                Some(g) if g != pinned => {
                    return Err(ApiError::new(
                        StatusCode::FORBIDDEN,
                        "Forbidden",
                        format!("this ingest key is limited to {what} '{pinned}'"),
                    ))
                }
                Some(_) => {}
                None => *given = Some(pinned.clone()),
            }
        }
        Ok(())
    }
}

/// Checks an ingest request's credential: the global ingest key exactly
/// as before (raw in `Authorization`, or `Bearer` on the webhooks), or an
/// API key with the `ingest` role (or a global admin key) in
/// `Authorization`, as `Bearer <key>` or raw (sensae's devices send the
/// raw value). While
/// neither a global key is configured nor any ingest key exists, ingest
/// stays open, as it always was (weft warns at start).
pub fn admit_ingest(
    state: &AppState,
    headers: &HeaderMap,
    allow_bearer: bool,
) -> ApiResult<IngestPins> {
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if let Some(key) = state.ingest_key.as_deref() {
        let ok = match given {
            Some(g) if g == key => true,
            Some(g) if allow_bearer => g.strip_prefix("Bearer ").is_some_and(|t| t == key),
            _ => false,
        };
        if ok {
            return Ok(IngestPins::default());
        }
    }
    let keys_apply = state.auth != AuthMode::Off;
    if keys_apply {
        // `Authorization` only, the header ingest has always read: a
        // client's X-Auth-Token (for the other surfaces) is no ingest
        // credential.
        let token = given
            .and_then(bearer)
            .or_else(|| given.filter(|g| g.starts_with(SECRET_PREFIX)));
        if let Some(token) = token {
            if let Ok(entry) = state.keys.authenticate(token) {
                let key = &entry.key;
                let ingest = key.role == Role::Ingest || key.is_global();
                if !ingest {
                    return Err(ApiError::new(
                        StatusCode::FORBIDDEN,
                        "Forbidden",
                        "this API key may not post uplinks; ingest needs an ingest key",
                    ));
                }
                if let Err(wait) = entry.admit() {
                    return Err(ApiError::new(
                        StatusCode::TOO_MANY_REQUESTS,
                        "TooManyRequests",
                        "this API key's rate limit is exceeded; retry later",
                    )
                    .with_retry_after(wait));
                }
                return Ok(IngestPins {
                    channel: key.channel.clone(),
                    device_type: key.device_type.clone(),
                });
            }
        }
    }
    let open = state.ingest_key.is_none() && !(keys_apply && state.keys.has_ingest_keys());
    if open {
        Ok(IngestPins::default())
    } else {
        Err(ApiError::unauthorized())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_sorted_into_surfaces() {
        let main = |p| classify(p, Listener::Main);
        assert_eq!(main("/health"), Surface::Open);
        assert_eq!(main("/sensor-data/a/encoded/b"), Surface::Ingest);
        assert_eq!(main("/api/v1/uplinks/ttn"), Surface::Ingest);
        assert_eq!(main("/iot/json/commands"), Surface::Ingest);
        assert_eq!(main("/v2/entities"), Surface::Ngsi);
        assert_eq!(main("/v2"), Surface::Ngsi);
        assert_eq!(main("/version"), Surface::Ngsi);
        assert_eq!(main("/v2/notify"), Surface::QuantumLeap);
        assert_eq!(main("/ql/v2/entities"), Surface::QuantumLeap);
        assert_eq!(main("/ql/health"), Surface::Open);
        assert_eq!(main("/ql/version"), Surface::QuantumLeap);
        assert_eq!(main("/api/v1/live"), Surface::Live);
        assert_eq!(main("/api/v1/keys/key_1"), Surface::Keys);
        assert_eq!(main("/api/v1/keysmith"), Surface::Own);
        assert_eq!(main("/channel/a/message/b"), Surface::Own);
        assert_eq!(main("/metrics"), Surface::Own);
        assert_eq!(main("/nowhere"), Surface::Own);
        assert_eq!(main("/"), Surface::Open);
        assert_eq!(main("/console/app.js"), Surface::Open);
        assert_eq!(main("/consoles"), Surface::Own);
        let ql = |p| classify(p, Listener::QuantumLeap);
        assert_eq!(ql("/v2/entities"), Surface::QuantumLeap);
        assert_eq!(ql("/health"), Surface::Open);
    }

    #[test]
    fn roles_needed_per_request() {
        let own = |m: Method, p| needed_role(&m, p, Surface::Own);
        assert_eq!(own(Method::GET, "/api/v1/devices"), Role::Read);
        assert_eq!(own(Method::PUT, "/api/v1/devices/d1"), Role::Admin);
        assert_eq!(own(Method::DELETE, "/api/v1/rules/r"), Role::Admin);
        assert_eq!(own(Method::PUT, "/api/v1/pages/p"), Role::Admin);
        assert_eq!(own(Method::PUT, "/admin/jwt/revoke"), Role::Admin);
        assert_eq!(
            own(Method::POST, "/api/v1/device-types/t/decode"),
            Role::Write
        );
        assert_eq!(own(Method::POST, "/api/v1/alarms/a/ack"), Role::Write);
        assert_eq!(own(Method::PUT, "/channel/c/message/m"), Role::Write);
        assert_eq!(
            own(Method::POST, "/api/v1/devices/d1/downlinks"),
            Role::Write
        );
        assert_eq!(
            own(Method::DELETE, "/api/v1/devices/d1/downlinks"),
            Role::Write
        );
        assert_eq!(own(Method::GET, "/api/v1/channels"), Role::Admin);
        assert_eq!(own(Method::GET, "/api/v1/channels/c"), Role::Admin);
        assert_eq!(own(Method::GET, "/api/v1/bridges"), Role::Read);
        let ngsi = |m: Method, p| needed_role(&m, p, Surface::Ngsi);
        assert_eq!(ngsi(Method::POST, "/v2/op/query"), Role::Read);
        assert_eq!(ngsi(Method::POST, "/v2/op/update"), Role::Write);
        assert_eq!(ngsi(Method::DELETE, "/v2/entities/e"), Role::Write);
        assert_eq!(
            needed_role(&Method::GET, "/api/v1/keys", Surface::Keys),
            Role::Admin
        );
    }

    #[test]
    fn tokens_come_from_x_auth_token_then_bearer_then_the_query() {
        let mut h = HeaderMap::new();
        assert_eq!(
            find_token(&h, Some("a=1&access_token=q")),
            Some(("q", Carrier::Query))
        );
        assert_eq!(find_token(&h, None), None);
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("raw-ingest-key"),
        );
        assert_eq!(
            find_token(&h, None),
            None,
            "a raw value is not a bearer token"
        );
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("bearer  b "),
        );
        assert_eq!(
            find_token(&h, Some("access_token=q")),
            Some(("b", Carrier::Authorization))
        );
        h.insert(&X_AUTH_TOKEN, HeaderValue::from_static("x"));
        assert_eq!(find_token(&h, None), Some(("x", Carrier::XAuthToken)));
    }

    #[test]
    fn ingest_pins_fill_in_or_refuse() {
        let pins = IngestPins {
            channel: Some("farm".into()),
            device_type: None,
        };
        let (mut c, mut t) = (None, Some("em300th".to_string()));
        pins.apply(&mut c, &mut t).unwrap();
        assert_eq!(c.as_deref(), Some("farm"));
        assert_eq!(t.as_deref(), Some("em300th"));
        let mut other = Some("city".to_string());
        assert!(pins.apply(&mut other, &mut t).is_err());
    }

    #[test]
    fn retry_after_is_rounded_up_to_whole_seconds() {
        let r = too_many(Duration::from_millis(1500));
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "2");
        let r = too_many(Duration::from_millis(10));
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
    }
}
