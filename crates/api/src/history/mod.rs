//! QuantumLeap's API (release 1.0.0): `POST /v2/notify` (an Orion feeding
//! weft's history), the history queries, `POST /v2/op/query`, the deletes
//! and the meta endpoints, under `/ql` on weft's listener (QuantumLeap's
//! own `/v2/entities` would clash with NGSIv2's) and at QuantumLeap's own
//! paths on `history.quantumleap_listen`.
//!
//! The files, one job each:
//! - [`notify`]: `POST /v2/notify`, notifications into the history;
//! - [`body`]: the JSON bodies of the `POST` endpoints, checked as
//!   QuantumLeap's request validation checks them;
//! - [`params`]: the query parameters, checked as QuantumLeap checks them;
//! - [`records`]: stored rows put back together as QuantumLeap's rows (one
//!   per recorded entity state) and cut as its SQL `LIMIT` cuts them;
//! - [`query`]: the `GET` endpoints and their answers' shapes;
//! - [`op`]: `POST /v2/op/query`;
//! - [`delete`]: `DELETE /v2/entities/{id}` and `DELETE /v2/types/{type}`;
//! - [`meta`]: `/version`, `/health`, `/v2/`, `/management/config`, and
//!   the 404 of a path QuantumLeap does not have;
//! - [`render`]: answers on QuantumLeap's own listener rendered as
//!   QuantumLeap renders them (Python's indented JSON, werkzeug's reasons).
//!
//! Errors use QuantumLeap's own mixed shapes ([`QlError`]): `{"error",
//! "description"}` objects, bare JSON strings, and the problem JSON its
//! request validation (Connexion) answers.

use std::sync::Arc;

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde_json::{json, Value};
use weft_store::{Store, StoreError};

use crate::error::ApiError;
use crate::routes::{self, get, post, Access, Routes};
use crate::AppState;

mod body;
mod delete;
mod meta;
mod notify;
mod op;
mod params;
mod query;
mod records;
mod render;
mod variant;

pub use params::DEFAULT_LIMIT;

/// QuantumLeap's API under `/ql` of weft's listener, plus `POST
/// /v2/notify` at the root (NGSIv2 has no such path, so an Orion
/// subscription can name `http://weft/v2/notify` as it names
/// QuantumLeap's).
pub fn routes() -> Routes {
    Routes::new()
        .route("/v2/notify", post(WRITE, notify::notify))
        .nest("/ql", api_routes())
}

/// QuantumLeap's API at its own paths, for the second listener of
/// `history.quantumleap_listen`: every route of [`quantumleap_router`].
pub fn quantumleap_routes() -> Routes {
    api_routes()
}

/// The router of QuantumLeap's own listener ([`quantumleap_routes`]).
pub fn quantumleap_router(state: AppState) -> Router {
    quantumleap_routes()
        .build(&state)
        .layer(axum::middleware::from_fn(render::as_quantumleap))
        .layer(axum::extract::DefaultBodyLimit::max(crate::MAX_BODY_BYTES))
        .with_state(state)
}

/// Reads: any key of the tenant that may read.
const READ: Access = Access::read(routes::Scope::QuantumLeap);
/// Writes (notifications into the history, its deletes).
const WRITE: Access = Access::write(routes::Scope::QuantumLeap);

/// Every route of QuantumLeap's API, relative to its root (`/ql`, or `/`
/// on QuantumLeap's own port); any other path is QuantumLeap's 404. The
/// answers of the data endpoints pass through [`variant`], which decides
/// by [`AppState::quantumleap_master`] which QuantumLeap answers.
fn api_routes() -> Routes {
    Routes::new()
        .merge(data_routes().finish(|routes, state| {
            routes.route_layer(axum::middleware::from_fn_with_state(
                state.clone(),
                variant::master_answers,
            ))
        }))
        .route("/version", get(READ, meta::version))
        .route("/health", get(Access::Open, meta::health))
        .route("/v2", get(READ, meta::to_slash))
        .route("/v2/", get(READ, meta::root))
        .route("/management/config", post(WRITE, meta::config))
        .route("/v2/notify", post(WRITE, notify::notify))
        .fallback(READ, meta::not_found)
}

/// The routes whose answers differ between QuantumLeap 1.0.0 and master:
/// the queries, op/query and the deletes.
fn data_routes() -> Routes {
    Routes::new()
        .route("/v2/op/query", post(READ, op::op_query))
        .route("/v2/entities", get(READ, query::list_entities))
        .route(
            "/v2/entities/{id}",
            get(READ, query::entity).delete(WRITE, delete::delete_entity),
        )
        .route("/v2/entities/{id}/value", get(READ, query::entity_value))
        .route(
            "/v2/entities/{id}/attrs/{attr}",
            get(READ, query::entity_attr),
        )
        .route(
            "/v2/entities/{id}/attrs/{attr}/value",
            get(READ, query::entity_attr_value),
        )
        .route(
            "/v2/types/{type}",
            get(READ, query::type_entities).delete(WRITE, delete::delete_type),
        )
        .route("/v2/types/{type}/value", get(READ, query::type_value))
        .route("/v2/types/{type}/attrs/{attr}", get(READ, query::type_attr))
        .route(
            "/v2/types/{type}/attrs/{attr}/value",
            get(READ, query::type_attr_value),
        )
        .route("/v2/attrs", get(READ, query::attrs))
        .route("/v2/attrs/value", get(READ, query::attrs_value))
        .route("/v2/attrs/{attr}", get(READ, query::attr))
        .route("/v2/attrs/{attr}/value", get(READ, query::attr_value))
}

/// The tenant and service path of a QuantumLeap request.
pub(crate) struct Scope {
    /// `Fiware-Service`, lower-cased (empty: the default tenant).
    tenant: String,
    /// `Fiware-ServicePath`; `None` (QuantumLeap's `/`): every path.
    service_path: Option<String>,
}

/// The request's [`Scope`]; a tenant name weft cannot hold is a 400.
fn scope(headers: &HeaderMap) -> Result<Scope, QlError> {
    let tenant = header(headers, "fiware-service").unwrap_or_default();
    if tenant.len() > 50
        || !tenant
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_')
    {
        return Err(ApiError::bad_request(
            "bad character in tenant name - only underscore and alphanumeric characters are allowed",
        )
        .into());
    }
    Ok(Scope {
        tenant: tenant.to_ascii_lowercase(),
        service_path: header(headers, "fiware-servicepath")
            .filter(|p| *p != "/")
            .map(str::to_string),
    })
}

/// A request header's trimmed, non-empty text.
fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

/// The store, once every notification acknowledged so far has been moved
/// into the history (a client reads back what it was told is stored).
async fn settled_store(state: &AppState) -> &Arc<dyn Store> {
    state.services.history.settle().await;
    &state.services.store
}

/// What a QuantumLeap endpoint answers.
type QlResult = Result<Response, QlError>;

/// An error answer in one of QuantumLeap's shapes.
#[derive(Debug)]
pub(crate) enum QlError {
    /// `{"error","description"}` with a status.
    Api(ApiError),
    /// A bare JSON string with a status (QuantumLeap's notify, op/query
    /// and delete texts).
    Text(StatusCode, String),
    /// `application/problem+json`, as QuantumLeap's request validation
    /// answers a parameter that breaks its specification.
    Problem {
        /// The status (400 for a bad parameter, 404 for an unknown path).
        status: StatusCode,
        /// The status's reason phrase.
        title: &'static str,
        /// What was wrong.
        detail: String,
    },
}

impl QlError {
    /// 404 `{"error":"Not Found","description":"No records were found for
    /// such query."}`: QuantumLeap 1.0's answer to a query, op/query or
    /// delete that matched nothing.
    fn no_records() -> Self {
        QlError::Api(ApiError::new(
            StatusCode::NOT_FOUND,
            "Not Found",
            "No records were found for such query.",
        ))
    }

    /// A parameter breaking QuantumLeap's specification: 400 problem JSON.
    fn bad_parameter(detail: impl Into<String>) -> Self {
        QlError::Problem {
            status: StatusCode::BAD_REQUEST,
            title: "Bad Request",
            detail: detail.into(),
        }
    }

    /// `{"error": name, "description"}` with `status`.
    fn api(status: StatusCode, name: &'static str, description: impl Into<String>) -> Self {
        QlError::Api(ApiError::new(status, name, description))
    }
}

impl From<ApiError> for QlError {
    fn from(e: ApiError) -> Self {
        QlError::Api(e)
    }
}

impl From<StoreError> for QlError {
    fn from(e: StoreError) -> Self {
        QlError::Api(e.into())
    }
}

impl IntoResponse for QlError {
    fn into_response(self) -> Response {
        match self {
            QlError::Api(e) => e.into_response(),
            QlError::Text(status, text) => (status, Json(Value::String(text))).into_response(),
            QlError::Problem {
                status,
                title,
                detail,
            } => {
                let body = json!({
                    "detail": detail, "status": status.as_u16(), "title": title, "type": "about:blank",
                });
                let mut resp = (status, Json(body)).into_response();
                resp.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/problem+json"),
                );
                resp
            }
        }
    }
}
