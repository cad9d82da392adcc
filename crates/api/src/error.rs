//! One error type for weft's own surfaces: every failure becomes
//! `{"error":"<Name>","description":"<text>"}` with its status code.
//! Internal errors are logged and answered with a plain 500 so internals
//! never leak to clients.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use weft_pipeline::{AcceptError, CatalogError};
use weft_store::StoreError;

/// An error answer of the `/api/v1` and ingest surfaces.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    name: &'static str,
    description: String,
    extra: Option<serde_json::Value>,
    /// `Retry-After` in seconds for answers that ask the client to wait;
    /// 0: none. A `u16` keeps the error within clippy's size budget.
    retry_after: u16,
}

impl ApiError {
    /// 400: the request is malformed.
    pub fn bad_request(description: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "BadRequest", description)
    }

    /// 401: the ingest key is missing or wrong.
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "Unauthorized",
            "missing or wrong ingest key in Authorization",
        )
    }

    /// 404: the named object does not exist.
    pub fn not_found(what: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "NotFound", what)
    }

    /// 503 with Retry-After: shed load, the client should retry.
    pub fn overloaded() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "Overloaded",
            "weft is overloaded; retry later",
        )
    }

    /// Any status with a stable error name.
    pub fn new(status: StatusCode, name: &'static str, description: impl Into<String>) -> Self {
        ApiError {
            status,
            name,
            description: description.into(),
            extra: None,
            retry_after: 0,
        }
    }

    /// Adds fields to the JSON body (e.g. the codec's `errors`).
    pub fn with_extra(mut self, extra: serde_json::Value) -> Self {
        self.extra = Some(extra);
        self
    }

    /// Sets `Retry-After` to `wait`, rounded up to whole seconds (at least 1).
    pub fn with_retry_after(mut self, wait: std::time::Duration) -> Self {
        let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        self.retry_after = u16::try_from(secs.max(1)).unwrap_or(u16::MAX);
        self
    }

    fn internal(err: impl std::fmt::Display) -> Self {
        tracing::error!(error = %err, "internal error");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            "internal error",
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({"error": self.name, "description": self.description});
        if let (Some(serde_json::Value::Object(extra)), Some(obj)) =
            (self.extra, body.as_object_mut())
        {
            obj.extend(extra);
        }
        let mut resp = (self.status, axum::Json(body)).into_response();
        if self.retry_after > 0 {
            let secs = self.retry_after;
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        } else if self.status == StatusCode::SERVICE_UNAVAILABLE {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        resp
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Overloaded => ApiError::overloaded(),
            other => ApiError::internal(other),
        }
    }
}

impl From<AcceptError> for ApiError {
    fn from(e: AcceptError) -> Self {
        match e {
            AcceptError::Overloaded => ApiError::overloaded(),
            AcceptError::Store(s) => s.into(),
            AcceptError::Forbidden(why) => ApiError::new(StatusCode::FORBIDDEN, "Forbidden", why),
        }
    }
}

impl From<CatalogError> for ApiError {
    fn from(e: CatalogError) -> Self {
        match e {
            CatalogError::Script(_) => {
                Self::new(StatusCode::BAD_REQUEST, "InvalidScript", e.to_string())
            }
            CatalogError::Language(_) | CatalogError::Invalid(_) => {
                Self::bad_request(e.to_string())
            }
            CatalogError::Store(s) => s.into(),
        }
    }
}

/// Result alias for handlers.
pub type ApiResult<T> = Result<T, ApiError>;
