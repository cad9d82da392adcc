//! Pages (the Knot.x model): templates at `/api/v1/pages/{name}` (the name
//! may contain `/`), the services their snippets call at
//! `/api/v1/page-services/{name}`, and the rendered pages at
//! `GET /pages/{name}`, whose query and headers the services may use.

use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use bytes::Bytes;
use serde_json::{json, Value};
use weft_pages::{PageError, PageService, RequestInfo};

use crate::{ApiError, ApiResult, AppState};

/// The pages routes.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api/v1/pages", get(list_pages))
        .route(
            "/api/v1/pages/{*name}",
            get(get_page).put(put_page).delete(delete_page),
        )
        .route(
            "/api/v1/page-services/{name}",
            get(get_service).put(put_service).delete(delete_service),
        )
        .route("/pages/{*name}", get(render))
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
    Path(name): Path<String>,
) -> ApiResult<Json<PageService>> {
    state
        .pages
        .service(&name)
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("page service '{name}' does not exist")))
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
    Ok(([(header::CONTENT_TYPE, "text/html; charset=utf-8")], html).into_response())
}
