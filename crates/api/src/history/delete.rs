//! `DELETE /v2/entities/{id}` and `DELETE /v2/types/{type}`: history
//! removed within the request's tenant and service path, optionally
//! between `fromDate` and `toDate` (inclusive, as QuantumLeap's
//! `time_index >= fromDate AND time_index <= toDate`).

use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use weft_store::HistoryDelete;

use super::params::{Attrs, Params};
use super::{header, scope, settled_store, QlError, QlResult, Scope};
use crate::AppState;

/// The delete of `entity_id`/`entity_type` in `scope`, bounded by the
/// dates of `q` (a date that does not parse is QuantumLeap's 422, before
/// anything is deleted).
fn target(
    scope: Scope,
    q: &HashMap<String, String>,
    entity_id: Option<String>,
    entity_type: Option<String>,
) -> Result<HistoryDelete, QlError> {
    let dates: HashMap<String, String> = q
        .iter()
        .filter(|(k, _)| *k == "fromDate" || *k == "toDate")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let params = Params::parse(&dates, Attrs::InPath)?;
    Ok(HistoryDelete {
        tenant: scope.tenant,
        service_path: scope.service_path,
        entity_id,
        entity_type,
        from: params.from.map(|d| d.1),
        to: params.to.map(|d| d.1),
        attrs: Vec::new(),
    })
}

/// `DELETE /v2/entities/{id}` (QuantumLeap's `delete_entity`): the
/// entity's history (of `type`, or of the one type it has); 204, 404 when
/// nothing was deleted, 409 when the id has history under several types
/// and no `type` says which.
pub(super) async fn delete_entity(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> QlResult {
    let scope = scope(&headers)?;
    let store = settled_store(&state).await;
    let entity_type = q.get("type").filter(|t| !t.is_empty()).cloned();
    if entity_type.is_none() && super::query::types_of(store, &scope, &id).await?.len() > 1 {
        return Err(QlError::api(
            StatusCode::CONFLICT,
            "AmbiguousNGSIIdError",
            format!(
                "There are multiple entities with the given entity_id {id}. \
                 Please specify entity_type."
            ),
        ));
    }
    let target = target(scope, &q, Some(id), entity_type)?;
    if store.delete_history(&target).await? == 0 {
        return Err(QlError::no_records());
    }
    Ok(deleted())
}

/// `DELETE /v2/types/{type}` (QuantumLeap's `delete_entities`): the
/// history of every entity of the type; 204, 404 when nothing was deleted.
/// `dropTable=true` removes all of the type's history whatever the dates
/// (QuantumLeap drops its table) and needs the root service path.
pub(super) async fn delete_type(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(entity_type): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> QlResult {
    // A boolean as QuantumLeap's request validation reads one: `true` or
    // `false` in any case.
    let drop_table = match q.get("dropTable").map(|v| v.to_ascii_lowercase()) {
        None => false,
        Some(v) if v == "true" => true,
        Some(v) if v == "false" => false,
        Some(_) => {
            return Err(QlError::bad_parameter(
                "Wrong type, expected 'boolean' for query parameter 'dropTable'",
            ))
        }
    };
    let root = header(&headers, "fiware-servicepath").is_none_or(|p| p == "/");
    let scope = scope(&headers)?;
    let store = settled_store(&state).await;
    if drop_table {
        if !root {
            return Err(QlError::Text(
                StatusCode::UNPROCESSABLE_ENTITY,
                "dropTable requires the root fiware-servicepath: '/'".into(),
            ));
        }
        store
            .delete_history(&HistoryDelete {
                tenant: scope.tenant,
                entity_type: Some(entity_type),
                ..HistoryDelete::default()
            })
            .await?;
        return Ok(deleted());
    }
    let target = target(scope, &q, None, Some(entity_type))?;
    if store.delete_history(&target).await? == 0 {
        return Err(QlError::no_records());
    }
    Ok(deleted())
}

/// QuantumLeap's answer to a delete that removed something: 204, labelled
/// JSON as all its answers are.
fn deleted() -> Response {
    (
        StatusCode::NO_CONTENT,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
    )
        .into_response()
}
