//! Tenancy as extractors: `Fiware-Service` names the tenant and
//! `Fiware-ServicePath` the paths inside it. A handler that takes
//! [`Tenant`] and [`ServicePath`] cannot forget the scoping, and a bad
//! header is refused with Orion's texts before the handler runs.
//!
//! Service paths: reads take a comma list (`/a,/b/#`; default `/#`,
//! everything), writes exactly one path without `#` (default `/`).

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use weft_model::ngsi::{tenancy, NgsiError};
use weft_pipeline::context::{Target, Tenancy, DEFAULT_TENANT};

use super::error::Error;
use crate::AppState;

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
        let name = raw
            .to_str()
            .map_err(|_| NgsiError::bad_request(tenancy::BAD_TENANT_CHAR))?;
        let tenant = tenancy::check_tenant(name)?;
        if !state.ngsi_multiservice {
            // Orion without `-multiservice`: the header is checked, but
            // there is one tenant; it is only passed on to notifications.
            return Ok(Tenant(DEFAULT_TENANT.to_string()));
        }
        Ok(Tenant(tenant))
    }
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
        let raw = raw
            .to_str()
            .map_err(|_| NgsiError::bad_request(tenancy::ILLEGAL_CHAR))?;
        Ok(ServicePath(Some(tenancy::parse_service_paths(raw)?)))
    }
}

impl ServicePath {
    /// Where a request of `tenant` with these paths looks, and what its
    /// forwards repeat.
    pub fn tenancy(&self, tenant: String) -> Tenancy {
        Tenancy {
            tenant,
            received: self.received(),
            read_paths: self.for_read(),
        }
    }

    /// The entity a write addresses: `id` (and `entity_type`) in the one
    /// path the write goes to (refused as [`ServicePath::for_write`]
    /// refuses).
    pub fn target(
        &self,
        tenant: String,
        op: WriteOp,
        id: String,
        entity_type: Option<&str>,
    ) -> Result<Target, Error> {
        Ok(Target {
            path: self.for_write(op)?,
            tenancy: self.tenancy(tenant),
            id,
            entity_type: entity_type.map(str::to_string),
        })
    }

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
                // As the real Orion 4.7.0 answers creations, appends,
                // replaces and batch updates with a `#`.
                WriteOp::Update => "Bad Character in Service-Path",
                WriteOp::Patch => {
                    "servicepath with wildcard # is not allowed in patch update request"
                }
                WriteOp::Delete => "servicepath with wildcard # is not allowed in DELETE operation",
            }));
        }
        Ok(path)
    }
}
