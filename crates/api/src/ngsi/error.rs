//! The error answer of the NGSIv2 surface: Orion's
//! `{"error":"<Name>","description":"<text>"}` with Orion's status codes.
//!
//! The texts themselves come from the model ([`NgsiError`]'s
//! constructors) or from the few HTTP-level constructors below; Orion's
//! functional tests compare them literally, Content-Length included, so
//! the body is compact JSON with `error` before `description`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use weft_model::ngsi::NgsiError;

/// An NGSIv2 error answer. A newtype because [`NgsiError`] lives in the
/// model crate, which knows nothing about HTTP.
#[derive(Debug)]
pub struct Error(pub NgsiError);

/// Result alias for NGSIv2 handlers.
pub type Result<T> = std::result::Result<T, Error>;

impl From<NgsiError> for Error {
    fn from(e: NgsiError) -> Self {
        Error(e)
    }
}

impl Error {
    /// 400 BadRequest with `description`.
    pub fn bad_request(description: impl Into<String>) -> Self {
        Error(NgsiError::bad_request(description))
    }

    /// 400 for a path Orion has no service for.
    pub fn service_not_found() -> Self {
        Self::bad_request("Service not found. Check your URL as probably it is wrong.")
    }

    /// 411: POST/PUT/PATCH without a body.
    pub fn content_length_required() -> Self {
        Error(NgsiError::new(
            411,
            "ContentLengthRequired",
            "Zero/No Content-Length in PUT/POST/PATCH request",
        ))
    }

    /// 413: a body over the 1 MiB limit.
    pub fn too_large(size: u64, max: usize) -> Self {
        Error(NgsiError::new(
            413,
            "RequestEntityTooLarge",
            format!("payload size: {size}, max size supported: {max}"),
        ))
    }

    /// 415: a body in a media type the operation does not read.
    pub fn unsupported_media_type(content_type: &str) -> Self {
        Error(NgsiError::new(
            415,
            "UnsupportedMediaType",
            format!("not supported content type: {content_type}"),
        ))
    }

    /// 406: the client accepts none of the types the answer can take.
    pub fn not_acceptable(accepted: &str) -> Self {
        Error(NgsiError::new(
            406,
            "NotAcceptable",
            format!("accepted MIME types: {accepted}"),
        ))
    }

    /// 501: a valid request Orion does not implement (batch updates with
    /// `idPattern`).
    pub fn not_implemented() -> Self {
        Error(NgsiError::new(501, "NotImplemented", "NotImplemented"))
    }

    /// 400 "empty payload": a body of `{}` where attributes are required.
    pub fn empty_payload() -> Self {
        Self::bad_request("empty payload")
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.0.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = json!({"error": self.0.error, "description": self.0.description});
        (status, axum::Json(body)).into_response()
    }
}

/// The 405 answer of a known path: `Allow` lists the verbs in Orion's
/// order (e.g. `GET, PUT, DELETE`).
pub fn method_not_allowed(allow: &'static str) -> Response {
    let mut resp = Error(NgsiError::new(
        405,
        "MethodNotAllowed",
        "method not allowed",
    ))
    .into_response();
    resp.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allow));
    resp
}
