//! `POST /v2/notify`: an Orion notification (`{"subscriptionId"?,
//! "data":[entity…]}`, NGSIv2 or NGSI-LD shaped entities) into the
//! history, one record per entity, as QuantumLeap stores it. The body is
//! checked as QuantumLeap's request validation checks it ([`super::body`]),
//! and every entity read ([`NotifiedEntity::read`]) before anything is
//! stored: one bad entity refuses it all.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use bytes::Bytes;
use serde_json::Value;
use weft_model::history::notified::NotifiedEntity;

use super::body::{json_body, not_of_type, required};
use super::{header, scope, QlError, QlResult};
use crate::AppState;

/// A 400 with weft's text as a JSON string, in QuantumLeap's words.
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
    let body = json_body(&headers, &body)?;
    let data = notified_data(&body)?;
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
    let mut entities: Vec<(NotifiedEntity, &str)> = Vec::with_capacity(data.len());
    for (i, (id, entity_type, obj)) in data.into_iter().enumerate() {
        let entity = NotifiedEntity::read(id, entity_type, obj)
            .map_err(|e| refused(format!("Notification not processed or not updated: {e}")))?;
        let path = paths.get(i).unwrap_or(&paths[0]);
        if let Some(entity) = entity {
            entities.push((entity, path.as_str()));
        }
    }
    let time_attr = header(&headers, "fiware-timeindex-attribute");
    let arrival = weft_model::now_ms();
    let mut by_path: BTreeMap<&str, Vec<NotifiedEntity>> = BTreeMap::new();
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

/// A notified entity's id, type and keys.
type Notified<'a> = (&'a str, &'a str, &'a serde_json::Map<String, Value>);

/// The entities of a notification body, checked against QuantumLeap's
/// schema of it in its order: the body an object requiring `data`; then
/// `subscriptionId` a string and `data` an array; then each entity, in
/// order, an object requiring `id` and `type`, its `type` then its `id`
/// strings. Anything else an entity holds is [`NotifiedEntity::read`]'s.
fn notified_data(body: &Value) -> Result<Vec<Notified<'_>>, QlError> {
    let Value::Object(body) = body else {
        return Err(not_of_type(body, "object", ""));
    };
    let Some(data) = body.get("data") else {
        return Err(required("data", ""));
    };
    if let Some(id) = body.get("subscriptionId").filter(|v| !v.is_string()) {
        return Err(not_of_type(id, "string", "subscriptionId"));
    }
    let Value::Array(items) = data else {
        return Err(not_of_type(data, "array", "data"));
    };
    let mut entities = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let path = format!("data.{i}");
        let Value::Object(obj) = item else {
            return Err(not_of_type(item, "object", &path));
        };
        for key in ["id", "type"] {
            if !obj.contains_key(key) {
                return Err(required(key, &path));
            }
        }
        let text = |key: &str| match &obj[key] {
            Value::String(s) => Ok(s.as_str()),
            other => Err(not_of_type(other, "string", &format!("{path}.{key}"))),
        };
        let entity_type = text("type")?;
        let id = text("id")?;
        entities.push((id, entity_type, obj));
    }
    Ok(entities)
}
