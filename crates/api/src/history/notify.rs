//! `POST /v2/notify`: an Orion notification (`{"subscriptionId"?,
//! "data":[entity…]}`, normalized entities) into the history, one record
//! per entity, as QuantumLeap stores it. The whole notification is checked
//! before anything is stored: one bad entity refuses it all, with
//! QuantumLeap's text.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use bytes::Bytes;
use serde_json::Value;
use weft_model::ngsi::{parse_entity, Entity};

use super::{header, scope, QlError, QlResult};
use crate::AppState;

/// A 400 with QuantumLeap's text as a JSON string.
fn refused(text: impl Into<String>) -> QlError {
    QlError::Text(StatusCode::BAD_REQUEST, text.into())
}

/// `POST /v2/notify` (QuantumLeap's `notify`): 200 `"Notification
/// successfully processed"` once the entities are durably queued for the
/// history. `NGSILD-Tenant` names the tenant before `Fiware-Service`; a
/// comma list in `Fiware-ServicePath` gives each entity its own path when
/// it has one path per entity.
pub(super) async fn notify(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> QlResult {
    let mut headers = headers;
    if let Some(tenant) = header(&headers, "ngsild-tenant").map(str::to_string) {
        if let Ok(v) = tenant.parse() {
            headers.insert("fiware-service", v);
        }
    }
    let scope = scope(&headers)?;
    let Ok(Value::Object(body)) = serde_json::from_slice::<Value>(&body) else {
        return Err(refused(
            "Discarding notification due to lack of request body. Lost in a redirect maybe?",
        ));
    };
    let Some(data) = body.get("data") else {
        return Err(refused(
            "Discarding notification due to lack of request body content.",
        ));
    };
    let Some(data) = data.as_array() else {
        return Err(QlError::bad_parameter(format!(
            "{data} is not of type 'array' - 'data'"
        )));
    };
    let paths: Vec<String> = match header(&headers, "fiware-servicepath") {
        None => vec!["/".to_string()],
        Some(p) => p.split(',').map(|s| s.trim().to_string()).collect(),
    };
    if paths.len() > 1 && paths.len() != data.len() {
        return Err(refused(format!(
            "Notification not processed or not updated: the Fiware-ServicePath header lists {} \
             paths for {} entities",
            paths.len(),
            data.len()
        )));
    }
    let mut entities: Vec<(Entity, &str)> = Vec::with_capacity(data.len());
    for (i, item) in data.iter().enumerate() {
        let entity = notified_entity(item)?;
        let path = paths.get(i).unwrap_or(&paths[0]);
        if let Some(entity) = entity {
            entities.push((entity, path.as_str()));
        }
    }
    let time_attr = header(&headers, "fiware-timeindex-attribute");
    let arrival = weft_model::now_ms();
    let mut by_path: BTreeMap<&str, Vec<Entity>> = BTreeMap::new();
    for (entity, path) in entities {
        by_path.entry(path).or_default().push(entity);
    }
    let mut stored = 0;
    for (path, batch) in by_path {
        stored += state
            .services
            .history
            .record_entities(&scope.tenant, path, &batch, time_attr, arrival)
            .await
            .map_err(QlError::from)?;
    }
    metrics::counter!("weft_history_notified_rows_total").increment(stored);
    Ok((
        StatusCode::OK,
        Json(Value::String("Notification successfully processed".into())),
    )
        .into_response())
}

/// One entity of a notification, as QuantumLeap takes it: `type` and `id`
/// required; an attribute without a value, or with a blank one where text
/// is not expected, is stored as `null`; an entity left without any
/// attribute that has a value (a number, a boolean, or anything not empty)
/// is dropped (`None`), as QuantumLeap's filter drops it.
fn notified_entity(item: &Value) -> Result<Option<Entity>, QlError> {
    let Some(obj) = item.as_object() else {
        return Err(QlError::bad_parameter(format!(
            "{item} is not of type 'object' - 'data'"
        )));
    };
    if !obj.get("type").is_some_and(Value::is_string) {
        return Err(refused("Entity type is required in notifications"));
    }
    if !obj.get("id").is_some_and(Value::is_string) {
        return Err(refused("Entity id is required in notifications"));
    }
    let mut normalized = obj.clone();
    let mut any_value = false;
    for (name, attr) in normalized.iter_mut() {
        if name == "id" || name == "type" {
            continue;
        }
        let Some(attr) = attr.as_object_mut() else {
            return Err(refused(format!(
                "Notification not processed or not updated: attribute {name} of entity {} is \
                 not in normalized form (keyValues notifications are not supported)",
                obj["id"].as_str().unwrap_or_default()
            )));
        };
        let text = attr.get("type").and_then(Value::as_str) == Some("Text");
        let value = attr.entry("value").or_insert(Value::Null);
        if value.as_str() == Some("") && !text {
            *value = Value::Null;
        }
        any_value |= has_value(value);
    }
    if !any_value {
        return Ok(None);
    }
    parse_entity(&Value::Object(normalized), false)
        .map(Some)
        .map_err(|e| {
            refused(format!(
                "Notification not processed or not updated: {}",
                e.description
            ))
        })
}

/// Whether a value counts as one for QuantumLeap's filter: an integer or
/// a boolean, or anything truthy.
fn has_value(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(_) => true,
        Value::Number(n) => n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}
