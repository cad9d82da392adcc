//! QuantumLeap's meta endpoints: `/version`, `/health`, the `/v2/` index,
//! `/management/config` (not implemented, as in QuantumLeap), and the
//! answer to a path QuantumLeap does not have.

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::QlError;
use crate::AppState;

/// The QuantumLeap release whose API weft serves.
pub const QUANTUMLEAP_VERSION: &str = "1.0.0";

/// `GET /version`: `{"version":"1.0.0"}`, the QuantumLeap release weft
/// implements (clients check it to know which shapes to expect).
pub(super) async fn version() -> Response {
    Json(json!({"version": QUANTUMLEAP_VERSION})).into_response()
}

/// `GET /health`: `{"status":"pass"}` when the store answers, 503
/// `{"status":"fail","details":{…}}` otherwise; cacheable for 180 s, as
/// QuantumLeap's.
pub(super) async fn health(State(state): State<AppState>) -> Response {
    let mut resp = match state.services.store.ping().await {
        Ok(()) => Json(json!({"status": "pass"})).into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({
                "status": "fail",
                "details": {"store": {"status": "fail", "output": e.to_string()}},
            })),
        )
            .into_response(),
    };
    resp.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("max-age=180"),
    );
    resp
}

/// `GET /v2/`: the API's index, QuantumLeap's own (which still names the
/// removed subscriptions URL).
pub(super) async fn root() -> Response {
    Json(json!({
        "notify_url": "/v2/notify",
        "subscriptions_url": "/v2/subscriptions",
        "entities_url": "/v2/entities",
        "types_url": "/v2/types",
        "attributes_url": "/v2/attrs",
    }))
    .into_response()
}

/// `POST /management/config`: 501, not implemented in QuantumLeap either.
pub(super) async fn config() -> Response {
    QlError::api(
        StatusCode::NOT_IMPLEMENTED,
        "Not Implemented",
        "This API method is not yet implemented.",
    )
    .into_response()
}

/// Any other path (among them QuantumLeap's `/v2/subscribe`, removed in
/// 1.0.0): its request validation's 404 problem JSON.
pub(super) async fn not_found() -> Response {
    QlError::Problem {
        status: StatusCode::NOT_FOUND,
        title: "Not Found",
        detail: "The requested URL was not found on the server. If you entered the URL manually \
                 please check your spelling and try again."
            .into(),
    }
    .into_response()
}

/// `GET /v2` (no slash): QuantumLeap's web framework redirects it to
/// `/v2/` with a 308 and a small HTML page naming the absolute URL (from
/// the request's `Host`), as it does every path missing its final slash.
pub(super) async fn to_slash(
    axum::extract::OriginalUri(uri): axum::extract::OriginalUri,
    headers: axum::http::HeaderMap,
) -> Response {
    let host = headers
        .get(axum::http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost");
    let query = uri.query().map(|q| format!("?{q}")).unwrap_or_default();
    let target = format!("http://{host}{}/{query}", uri.path());
    let page = format!(
        "<!doctype html>\n<html lang=en>\n<title>Redirecting...</title>\n<h1>Redirecting...</h1>\n\
         <p>You should be redirected automatically to the target URL: <a href=\"{target}\">{target}</a>. \
         If not, click the link.\n"
    );
    let location = axum::http::HeaderValue::from_str(&target)
        .unwrap_or_else(|_| axum::http::HeaderValue::from_static("/v2/"));
    (
        StatusCode::PERMANENT_REDIRECT,
        [
            (
                axum::http::header::CONTENT_TYPE,
                axum::http::HeaderValue::from_static("text/html; charset=utf-8"),
            ),
            (axum::http::header::LOCATION, location),
        ],
        page,
    )
        .into_response()
}
