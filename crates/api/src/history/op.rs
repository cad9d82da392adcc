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

/// The body against QuantumLeap's `opQueryInput` schema: an object with
/// `entities` (objects whose `idPattern`, `type`, `id` are strings) and
/// `attrs` (strings), `expression` an object. Of several breaches the one
/// nearest the top is refused, the first in the schema's order among
/// equals, as QuantumLeap's validator picks it.
fn check_schema(body: &Value) -> Result<(), QlError> {
    let Value::Object(fields) = body else {
        return Err(not_of_type(body, "object", ""));
    };
    for property in ["entities", "attrs"] {
        if !fields.contains_key(property) {
            return Err(required(property, ""));
        }
    }
    // (depth, breach), in the schema's order.
    let mut breaches: Vec<(usize, QlError)> = Vec::new();
    let mut typed = |value: &Value, ok: bool, json_type: &str, path: String| {
        if !ok {
            let depth = path.split('.').count();
            breaches.push((depth, not_of_type(value, json_type, &path)));
        }
    };
    let entities = &fields["entities"];
    typed(entities, entities.is_array(), "array", "entities".into());
    if let Some(expression) = fields.get("expression") {
        typed(
            expression,
            expression.is_object(),
            "object",
            "expression".into(),
        );
    }
    let attrs = &fields["attrs"];
    typed(attrs, attrs.is_array(), "array", "attrs".into());
    for (i, e) in entities.as_array().into_iter().flatten().enumerate() {
        typed(e, e.is_object(), "object", format!("entities.{i}"));
        for key in ["idPattern", "type", "id"] {
            if let Some(v) = e.get(key) {
                typed(v, v.is_string(), "string", format!("entities.{i}.{key}"));
            }
        }
    }
    for (i, a) in attrs.as_array().into_iter().flatten().enumerate() {
        typed(a, a.is_string(), "string", format!("attrs.{i}"));
    }
    match breaches.into_iter().min_by_key(|(depth, _)| *depth) {
        Some((_, breach)) => Err(breach),
        None => Ok(()),
    }
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
    check_schema(&body)?;
    let (Value::Object(body), Some(Value::Array(entities))) = (&body, body.get("entities")) else {
        return Err(not_of_type(&body, "object", ""));
    };
    let attrs: Vec<String> = match body.get("attrs") {
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        _ => Vec::new(),
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
        let Some(entity_type) = text("type") else {
            return Err(refused("Entity type is required"));
        };
        let Some(id) = text("id") else {
            return Err(refused("Entity id is required"));
        };
        if e.get("idPattern").is_some() {
            return Err(refused("idPattern is Not Supported"));
        }
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
                last_n: Some(1),
                limit: 1,
                ..HistoryQuery::default()
            })
            .await?;
        // The entity's latest record, whichever attributes it holds; an
        // attribute asked that it does not hold is null, as in
        // QuantumLeap's last row. Names asked match whatever their case.
        let Some(latest) = rows.iter().map(|r| (r.time, r.instance)).max() else {
            return Err(QlError::no_records());
        };
        let mut m = Map::new();
        m.insert("id".into(), id.into());
        m.insert("type".into(), entity_type.into());
        let asked =
            |name: &str| attrs.is_empty() || attrs.iter().any(|a| a.eq_ignore_ascii_case(name));
        for r in rows.into_iter().filter(|r| asked(&r.attr)) {
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
