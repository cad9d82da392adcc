//! Who may do what: the check behind every route's declared
//! [`Access`](crate::routes::Access) ([`admit`], run by the route's guard
//! before its handler), and the ingest credentials ([`admit_ingest`]).
//! Nothing here looks at the request's path: a route says who may call it
//! where it is declared ([`crate::routes`]).
//!
//! The order of the checks for a keyed route: find the key
//! (`X-Auth-Token`, else `Authorization: Bearer`, else — live stream only
//! — `?access_token=`), 401 when there is none or it is unknown, expired
//! or revoked; 429 when its rate limit is spent; 403 when its role is
//! below the route's or the request reaches outside its tenant or service
//! path. A tenant key's request without `Fiware-Service` is given the
//! key's tenant, and a service-path key's request without
//! `Fiware-ServicePath` its path, so the handlers need not know about keys
//! at all; those that do (the live stream, the keys API, the renderings
//! that mask secrets) find the key as a [`Principal`] in the request's
//! extensions.
//!
//! Tenants ([`Scope`]): NGSI and QuantumLeap are multi-tenant; weft's own
//! API, the channels, pages and metrics are the default tenant's. A key of
//! another tenant, or one limited to a service path, reaches only the
//! multi-tenant surfaces, the keys API and the live stream. An admin key
//! of the default tenant without a service path is global: it may name
//! any tenant.

use std::sync::Arc;
use std::time::Duration;

use axum::http::{self, header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use weft_model::apikey::{path_within, ApiKey, Role};
use weft_pipeline::keys::KeyEntry;

use crate::routes::{Access, Scope};
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

/// Lets `req` through to a route declared with `access`, or answers
/// instead (`Err`): the module's checks, then the FIWARE headers adapted
/// to the key's scope and the key (as a [`Principal`]) or the ingest pins
/// (as [`IngestPins`]) put in the request's extensions for the handler.
/// Cheap on the hot path: a SHA-256, a map lookup, the bucket.
// The error is the answer itself, built only for a refused request.
#[allow(clippy::result_large_err)]
pub fn admit<B>(
    state: &AppState,
    access: Access,
    req: &mut http::Request<B>,
) -> Result<(), Response> {
    let (role, scope) = match access {
        Access::Open => return Ok(()),
        Access::Ingest => {
            let pins = admit_ingest(state, req.headers(), req.uri().query())
                .map_err(IntoResponse::into_response)?;
            req.extensions_mut().insert(pins);
            return Ok(());
        }
        Access::Key { role, scope } => (role, scope),
    };
    if state.auth != AuthMode::On {
        return Ok(());
    }
    // A request routed twice (NGSI's trailing `/`) was authenticated the
    // first time, and the header that carried its key is gone: it is
    // authorised again for the route it reaches now.
    let entry = match req.extensions().get::<Principal>() {
        Some(known) => known.0.clone(),
        None => authenticate(state, scope, req)?,
    };
    let key = &entry.key;
    if !key.role.allows(role) {
        return Err(forbidden(&format!(
            "this API key's role ({}) may not do this; it needs {}",
            key.role.as_str(),
            role.as_str()
        )));
    }
    match scope {
        Scope::Own if !key.tenant.is_empty() || key.service_path.is_some() => {
            return Err(forbidden(
                "this API key is limited to a tenant or service path; weft's own API belongs to the default tenant",
            ));
        }
        Scope::Ngsi | Scope::QuantumLeap => scope_fiware(key, req, role, scope)?,
        Scope::NgsiLd => scope_ngsi_ld(key, req)?,
        Scope::Own | Scope::Keys | Scope::Live => {}
    }
    req.extensions_mut().insert(Principal(entry));
    Ok(())
}

/// The working key `req` carries (spending a token of its bucket), its
/// header removed: Orion forwards `X-Auth-Token` with notifications, and
/// pages may pass request headers on to their services, so weft's keys
/// must not leave weft.
#[allow(clippy::result_large_err)]
fn authenticate<B>(
    state: &AppState,
    scope: Scope,
    req: &mut http::Request<B>,
) -> Result<Arc<KeyEntry>, Response> {
    let query = (scope == Scope::Live).then(|| req.uri().query()).flatten();
    let Some((token, carrier)) = find_token(req.headers(), query) else {
        return Err(unauthorized(
            "an API key is required: send it as 'Authorization: Bearer <key>' or 'X-Auth-Token: <key>'",
        ));
    };
    let entry = state
        .keys
        .authenticate(token)
        .map_err(|r| unauthorized(r.describe()))?;
    entry.admit().map_err(too_many)?;
    match carrier {
        Carrier::XAuthToken => drop(req.headers_mut().remove(&X_AUTH_TOKEN)),
        Carrier::Authorization => drop(req.headers_mut().remove(header::AUTHORIZATION)),
        Carrier::Query => {}
    }
    Ok(entry)
}

/// Holds a request of a multi-tenant surface to the key's tenant and
/// service path, filling in the headers the request left out (a read,
/// `role` [`Role::Read`], of NGSI covers the key's path and below).
#[allow(clippy::result_large_err)]
fn scope_fiware<B>(
    key: &ApiKey,
    req: &mut http::Request<B>,
    role: Role,
    scope: Scope,
) -> Result<(), Response> {
    if key.is_global() {
        return Ok(());
    }
    hold_tenant(key, req, &FIWARE_SERVICE)?;
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
            let path = if role == Role::Read && scope == Scope::Ngsi {
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

/// Holds a request to the key's tenant through the header naming the
/// tenant (`Fiware-Service`, `NGSILD-Tenant`): a request naming another
/// is refused, one naming none is given the key's.
#[allow(clippy::result_large_err)]
fn hold_tenant<B>(
    key: &ApiKey,
    req: &mut http::Request<B>,
    header: &HeaderName,
) -> Result<(), Response> {
    match req.headers().get(header) {
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
            let value = HeaderValue::from_str(&key.tenant).map_err(|_| {
                forbidden(&format!("this API key's tenant cannot be sent as {header}"))
            })?;
            req.headers_mut().insert(header.clone(), value);
        }
        None => {}
    }
    Ok(())
}

/// Holds an NGSI-LD request to the key's tenant (`NGSILD-Tenant`). NGSI-LD
/// has no service paths and its reads cover all of a tenant, so a key
/// limited to a service path may not call it.
#[allow(clippy::result_large_err)]
fn scope_ngsi_ld<B>(key: &ApiKey, req: &mut http::Request<B>) -> Result<(), Response> {
    if key.is_global() {
        return Ok(());
    }
    if key.service_path.is_some() {
        return Err(forbidden(
            "this API key is limited to a service path; NGSI-LD has none, so it may not call /ngsi-ld",
        ));
    }
    hold_tenant(key, req, &crate::ngsi_ld::NGSILD_TENANT)
}

/// Whether the request's caller may see secrets stored in definitions
/// (custom notification headers, bridge and page-service credentials):
/// an admin key, or any caller when weft does not check keys itself.
/// Everyone else sees them masked ([`weft_model::secret::MASK`]).
pub fn sees_secrets(state: &AppState, principal: Option<&Principal>) -> bool {
    match principal {
        Some(p) => p.key().role == Role::Admin,
        None => state.auth != AuthMode::On,
    }
}

/// What an ingest key pins its uplinks to.
#[derive(Debug, Default, Clone)]
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

/// Checks an ingest request's credential (uplinks and devices' command
/// results alike): `Authorization` (raw or `Bearer`, the header ingest
/// has always read) or the IoT Agents' `k` query parameter (their
/// devices' way of naming their key) must hold the global ingest key, an
/// API key with the `ingest` role, or a global admin key. With keys on
/// (`auth = "on"`) there is no ingest without one of these; with keys off
/// or left to a proxy, ingest is open unless a global ingest key is
/// configured, and API keys are looked at only when keys are not off.
/// The answer holds the key's pins: 401 without a working credential,
/// 403 for a key of another role, 429 past the key's rate limit.
pub fn admit_ingest(
    state: &AppState,
    headers: &HeaderMap,
    query: Option<&str>,
) -> ApiResult<IngestPins> {
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(|g| bearer(g).unwrap_or(g.trim()));
    let k = query.and_then(|q| {
        form_urlencoded::parse(q.as_bytes())
            .find(|(name, _)| name == "k")
            .map(|(_, value)| value.into_owned())
    });
    let keys_apply = state.auth != AuthMode::Off;
    let mut refused = None;
    for token in [given, k.as_deref()].into_iter().flatten() {
        if token.is_empty() {
            continue;
        }
        if state.ingest_key.as_deref() == Some(token) {
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
                "this API key may not post uplinks; ingest needs an ingest key",
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
    if state.ingest_key.is_none() && state.auth != AuthMode::On {
        return Ok(IngestPins::default());
    }
    Err(ApiError::unauthorized())
}

#[cfg(test)]
mod tests {
    use super::*;

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
