//! Orion's registrations (`/v2/registrations`): stored and listed.

use axum::response::{IntoResponse, Response};

use super::error::Error;

/// Placeholder until registrations are served.
pub async fn not_implemented() -> Response {
    Error(weft_model::ngsi::NgsiError::new(501, "NotImplemented", "registrations are not implemented")).into_response()
}
