//! Tenancy as extractors: `Fiware-Service` names the tenant and
//! `Fiware-ServicePath` the paths inside it. A handler that takes
//! [`Tenant`] and [`ServicePath`] cannot forget the scoping, and a bad
//! header is refused with Orion's texts before the handler runs.
//!
//! Service paths: reads take a comma list (`/a,/b/#`; default `/#`,
//! everything), writes exactly one path without `#` (default `/`).

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use weft_pipeline::context::DEFAULT_TENANT;

use super::error::Error;
use crate::AppState;

/// Longest tenant name Orion accepts.
const MAX_TENANT_LEN: usize = 50;
/// Most service paths a read may list.
const MAX_SERVICE_PATHS: usize = 10;
/// Most levels one service path may have.
const MAX_COMPONENTS: usize = 10;
/// Longest level name.
const MAX_COMPONENT_LEN: usize = 50;

/// The tenant of a request (`Fiware-Service`, lowercased;
/// [`DEFAULT_TENANT`] when absent).
#[derive(Debug, Clone)]
pub struct Tenant(pub String);

impl FromRequestParts<AppState> for Tenant {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Error> {
        let Some(raw) = parts.headers.get(&super::FIWARE_SERVICE) else {
            return Ok(Tenant(DEFAULT_TENANT.to_string()));
        };
        let name = raw.to_str().map_err(|_| bad_tenant_char())?;
        let tenant = check_tenant(name)?;
        if !state.ngsi_multiservice {
            // Orion without `-multiservice`: the header is checked, but
            // there is one tenant; it is only passed on to notifications.
            return Ok(Tenant(DEFAULT_TENANT.to_string()));
        }
        Ok(Tenant(tenant))
    }
}

fn bad_tenant_char() -> Error {
    Error::bad_request(
        "bad character in tenant name - only underscore and alphanumeric characters are allowed",
    )
}

/// Validates a tenant name and returns it lowercased.
pub fn check_tenant(name: &str) -> Result<String, Error> {
    if name.len() > MAX_TENANT_LEN {
        return Err(Error::bad_request(
            "bad length - a tenant name can be max 50 characters long",
        ));
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return Err(bad_tenant_char());
    }
    Ok(name.to_ascii_lowercase())
}

/// The validated `Fiware-ServicePath` header: `None` when absent.
#[derive(Debug, Clone)]
pub struct ServicePath(Option<Vec<String>>);

/// The write operations, whose refusals of several or wildcard service
/// paths each have their own text in Orion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOp {
    /// Entity creation and attribute updates of POST/PUT and batches.
    Update,
    /// `PATCH /v2/entities/{id}/attrs`.
    Patch,
    /// `DELETE` of an entity or an attribute.
    Delete,
}

impl<S: Send + Sync> FromRequestParts<S> for ServicePath {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Error> {
        let Some(raw) = parts.headers.get(&super::FIWARE_SERVICEPATH) else {
            return Ok(ServicePath(None));
        };
        let raw = raw.to_str().map_err(|_| illegal_char())?;
        parse_service_paths(raw).map(|p| ServicePath(Some(p)))
    }
}

fn illegal_char() -> Error {
    Error::bad_request("a component of ServicePath contains an illegal character")
}

/// Parses a `Fiware-ServicePath` value into normalized paths (no trailing
/// `/` except for the root).
pub fn parse_service_paths(raw: &str) -> Result<Vec<String>, Error> {
    let paths: Vec<&str> = raw.split(',').map(str::trim).collect();
    if paths.len() > MAX_SERVICE_PATHS {
        return Err(Error::bad_request(
            "too many service paths - a maximum of ten service paths is allowed",
        ));
    }
    paths.into_iter().map(parse_one).collect()
}

fn parse_one(path: &str) -> Result<String, Error> {
    if path.is_empty() {
        return Ok("/".to_string());
    }
    let Some(rest) = path.strip_prefix('/') else {
        return Err(Error::bad_request(
            "Only /absolute/ Service Paths allowed [a service path must begin with /]",
        ));
    };
    if rest.is_empty() {
        return Ok("/".to_string());
    }
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let components: Vec<&str> = rest.split('/').collect();
    if components.len() > MAX_COMPONENTS {
        return Err(Error::bad_request("too many components in ServicePath"));
    }
    let last = components.len() - 1;
    for (i, c) in components.iter().enumerate() {
        if c.is_empty() {
            return Err(Error::bad_request("empty component in ServicePath"));
        }
        if c.len() > MAX_COMPONENT_LEN {
            return Err(Error::bad_request("component-name too long in ServicePath"));
        }
        let wildcard = i == last && *c == "#";
        if !wildcard && !c.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(illegal_char());
        }
    }
    Ok(format!("/{rest}"))
}

impl ServicePath {
    /// The header as received (its paths joined by `,`), which forwarded
    /// requests repeat; `None` when the request had none.
    pub fn received(&self) -> Option<String> {
        self.0.as_ref().map(|paths| paths.join(","))
    }

    /// The paths a read covers, as the context's filter wants them (`/#`
    /// and `/x/#` are subtrees; empty means everything).
    pub fn for_read(&self) -> Vec<String> {
        match &self.0 {
            None => Vec::new(),
            Some(p) if p.iter().any(|p| p == "/#") => Vec::new(),
            Some(p) => p.clone(),
        }
    }

    /// The one path a write goes to (`/` when absent), refusing lists and
    /// wildcards with the texts Orion uses for `op`.
    pub fn for_write(&self, op: WriteOp) -> Result<String, Error> {
        let Some(paths) = &self.0 else {
            return Ok("/".to_string());
        };
        if paths.len() > 1 {
            return Err(Error::bad_request(match op {
                WriteOp::Update => "more than one service path in context update request",
                WriteOp::Patch => {
                    "more than one servicepath in patch update request is not allowed"
                }
                WriteOp::Delete => "more than one servicepath is not allowed in DELETE operation",
            }));
        }
        let path = paths[0].clone();
        if path.ends_with('#') {
            return Err(Error::bad_request(match op {
                WriteOp::Update => "servicepath with wildcard # is not allowed in update request",
                WriteOp::Patch => {
                    "servicepath with wildcard # is not allowed in patch update request"
                }
                WriteOp::Delete => "servicepath with wildcard # is not allowed in DELETE operation",
            }));
        }
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_paths_follow_orions_rules() {
        assert_eq!(parse_service_paths("/a/b/").unwrap(), ["/a/b"]);
        assert_eq!(parse_service_paths("/a, /b/#").unwrap(), ["/a", "/b/#"]);
        assert_eq!(parse_service_paths("/").unwrap(), ["/"]);
        let err = |s: &str| parse_service_paths(s).unwrap_err().0.description;
        assert_eq!(err("//a"), "empty component in ServicePath");
        assert_eq!(err("/a/b//"), "empty component in ServicePath");
        assert_eq!(
            err("/test.2"),
            "a component of ServicePath contains an illegal character"
        );
        assert!(err("a").starts_with("Only /absolute/"));
    }

    #[test]
    fn tenant_names() {
        assert_eq!(check_tenant("Tenant_1").unwrap(), "tenant_1");
        assert!(check_tenant("a-b").is_err());
        assert!(check_tenant(&"x".repeat(51)).is_err());
    }
}
