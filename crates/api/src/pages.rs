//! Pages (the Knot.x model): templates at `/api/v1/pages/{name}` (the name
//! may contain `/`), the services their snippets call at
//! `/api/v1/page-services/{name}`, and the rendered pages at
//! `GET /pages/{name}`, whose query and headers the services may use.

use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use bytes::Bytes;
use serde_json::{json, Value};
use weft_model::secret;
use weft_pages::{PageError, PageService, RequestInfo};

use crate::auth::{sees_secrets, Principal};
use crate::routes::{get, Access, Routes, Scope::Own};
use crate::{ApiError, ApiResult, AppState};

/// The pages routes: templates and services are definitions (admin),
/// whatever their names end with; reading them and the rendered pages
/// wants a read key.
pub fn routes() -> Routes {
    Routes::new()
        .route("/api/v1/pages", get(Access::read(Own), list_pages))
        .route(
            "/api/v1/pages/{*name}",
            get(Access::read(Own), get_page)
                .put(Access::admin(Own), put_page)
                .delete(Access::admin(Own), delete_page),
        )
        .route(
            "/api/v1/page-services/{name}",
            get(Access::read(Own), get_service)
                .put(Access::admin(Own), put_service)
                .delete(Access::admin(Own), delete_service),
        )
        .route("/pages/{*name}", get(Access::read(Own), render))
}

impl From<PageError> for ApiError {
    fn from(e: PageError) -> Self {
        match e {
            PageError::NotFound(_) => ApiError::not_found(e.to_string()),
            PageError::Invalid(text) => ApiError::bad_request(text),
            PageError::Busy => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "Busy", e.to_string())
            }
            PageError::Broken { .. } => ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "BrokenPage",
                e.to_string(),
            ),
            PageError::OverBudget { .. } => ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "PageOverBudget",
                e.to_string(),
            ),
            PageError::Store(s) => s.into(),
        }
    }
}

fn created(new: bool) -> StatusCode {
    if new {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    }
}

/// `GET /api/v1/pages`: the names.
async fn list_pages(State(state): State<AppState>) -> Json<Value> {
    Json(json!(state.pages.page_names()))
}

/// `GET /api/v1/pages/{name}`: the template as stored.
async fn get_page(State(state): State<AppState>, Path(name): Path<String>) -> ApiResult<Response> {
    let source = state
        .pages
        .page(&name)
        .ok_or_else(|| ApiError::not_found(format!("page '{name}' does not exist")))?;
    Ok(([(header::CONTENT_TYPE, "text/html; charset=utf-8")], source).into_response())
}

/// `PUT /api/v1/pages/{name}` with the template as the body: 201/200; a
/// template that cannot be split or compiled is a 400 and changes nothing.
async fn put_page(
    State(state): State<AppState>,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let source = String::from_utf8(body.to_vec())
        .map_err(|_| ApiError::bad_request("the template must be UTF-8"))?;
    Ok(created(state.pages.put_page(&name, source).await?))
}

/// `DELETE /api/v1/pages/{name}`.
async fn delete_page(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    if state.pages.delete_page(&name).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(format!("page '{name}' does not exist")))
    }
}

/// `GET /api/v1/page-services/{name}`.
async fn get_service(
    State(state): State<AppState>,
    caller: Option<Extension<Principal>>,
    Path(name): Path<String>,
) -> ApiResult<Json<PageService>> {
    let mut service = state
        .pages
        .service(&name)
        .ok_or_else(|| ApiError::not_found(format!("page service '{name}' does not exist")))?;
    if !sees_secrets(&state, caller.as_deref()) {
        if let Some(http) = &mut service.http {
            http.url = secret::mask_url(&http.url);
        }
    }
    Ok(Json(service))
}

/// `PUT /api/v1/page-services/{name}`: 201/200.
async fn put_service(
    State(state): State<AppState>,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let service: PageService = crate::catalog::parse_definition(&body)?;
    Ok(created(state.pages.put_service(&name, service).await?))
}

/// `DELETE /api/v1/page-services/{name}`.
async fn delete_service(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    if state.pages.delete_service(&name).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(format!(
            "page service '{name}' does not exist"
        )))
    }
}

/// `GET /pages/{name}`: the rendered page (200 even when snippets fell
/// back; 503 with Retry-After when too many renders run).
async fn render(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let request = RequestInfo {
        query,
        headers: headers
            .iter()
            .filter_map(|(k, v)| Some((k.as_str().to_string(), v.to_str().ok()?.to_string())))
            .collect(),
    };
    let html = state.pages.render(&name, &request).await?;
    Ok((
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CONTENT_SECURITY_POLICY, PAGE_POLICY),
        ],
        html,
    )
        .into_response())
}

/// The `Content-Security-Policy` of a rendered page: it runs in a
/// sandbox of its own origin, so a page's scripts (pages are served on
/// the console's origin) can read neither the console's stored key nor
/// weft's API with the browser's credentials; its scripts, forms and
/// links still work.
pub const PAGE_POLICY: &str =
    "sandbox allow-scripts allow-forms allow-popups allow-popups-to-escape-sandbox allow-downloads";
