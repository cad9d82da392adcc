//! `POST /v2/op/query`: QuantumLeap as a context provider, answering the
//! latest stored state of each listed entity as an NGSI entity.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use bytes::Bytes;
use serde_json::{json, Map, Value};
use weft_model::history::format_index;
use weft_store::HistoryQuery;

use super::body::{json_body, not_of_type, required};
use super::{scope, settled_store, QlError, QlResult};
use crate::AppState;

/// A 400 with QuantumLeap's text as a JSON string.
fn refused(text: &str) -> QlError {
    QlError::Text(StatusCode::BAD_REQUEST, text.into())
}

/// `POST /v2/op/query` (QuantumLeap's `query`): body `{"entities":[{"id",
/// "type"}],"attrs":[…]}`; answers, per entity in order, its latest record
/// (`attrs`, or every attribute) as `{"id","type",attr:{"type","value"},
/// …,"dateModified":{"type":"DateTime","value":<its time index>}}`. An
/// entity without history makes the whole answer QuantumLeap 1.0's 404.
/// The body is checked as QuantumLeap's request validation checks it
/// ([`super::body`]); `expression`, `metadata` and `idPattern` are
/// refused as QuantumLeap refuses them.
pub(super) async fn op_query(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> QlResult {
    let scope = scope(&headers)?;
    let body = json_body(&headers, &body)?;
    let Value::Object(body) = &body else {
        return Err(not_of_type(&body, "object", ""));
    };
    let Some(entities) = body.get("entities") else {
        return Err(required("entities", ""));
    };
    let Some(entities) = entities.as_array() else {
        return Err(not_of_type(entities, "array", "entities"));
    };
    let attrs: Vec<String> = match body.get("attrs") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        Some(other) => return Err(not_of_type(other, "array", "attrs")),
    };
    if body.contains_key("expression") {
        return Err(refused("expression is Not Supported"));
    }
    if body.contains_key("metadata") {
        return Err(refused("metadata is Not Supported"));
    }
    let mut wanted = Vec::with_capacity(entities.len());
    for e in entities {
        let text = |k: &str| e.get(k).and_then(Value::as_str).map(str::to_string);
        if e.get("idPattern").is_some() {
            return Err(refused("idPattern is Not Supported"));
        }
        let Some(entity_type) = text("type") else {
            return Err(refused("Entity type is required"));
        };
        let Some(id) = text("id") else {
            return Err(refused("Entity id is required"));
        };
        wanted.push((id, entity_type));
    }
    let store = settled_store(&state).await;
    let mut out = Vec::with_capacity(wanted.len());
    for (id, entity_type) in wanted {
        let rows = store
            .query_history(&HistoryQuery {
                tenant: scope.tenant.clone(),
                service_path: scope.service_path.clone(),
                entity_ids: vec![id.clone()],
                entity_type: Some(entity_type.clone()),
                attrs: attrs.clone(),
                last_n: Some(1),
                limit: 1,
                ..HistoryQuery::default()
            })
            .await?;
        // The latest record; an attribute it does not hold is null, as
        // in QuantumLeap's last row.
        let Some(latest) = rows.iter().map(|r| (r.time, r.instance)).max() else {
            return Err(QlError::no_records());
        };
        let mut m = Map::new();
        m.insert("id".into(), id.into());
        m.insert("type".into(), entity_type.into());
        for r in rows {
            let value = if (r.time, r.instance) == latest {
                super::records::render_value(&r.attr_type, &r.value)
            } else {
                Value::Null
            };
            m.insert(r.attr, json!({"type": r.attr_type, "value": value}));
        }
        m.insert(
            "dateModified".into(),
            json!({"type": "DateTime", "value": format_index(latest.0)}),
        );
        out.push(Value::Object(m));
    }
    Ok(Json(Value::Array(out)).into_response())
}
