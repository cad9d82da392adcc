//! QuantumLeap's unreleased master (`1.0.1-dev`), served on request
//! (`history.quantumleap_master`): its query answers name entities `id`
//! and `type` instead of `entityId` and `entityType`, and a query, op/query
//! or delete that finds nothing answers 200 `[]` instead of 1.0.0's 404.
//! weft answers 1.0.0 by default, the release deployed clients expect;
//! this layer rewrites those answers for clients written against master.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use crate::AppState;

/// Largest answer the layer rewrites (a query's answer is at most 10,000
/// records per series; anything bigger passes through unchanged).
const MAX_REWRITTEN_BYTES: usize = 64 * 1024 * 1024;

/// Rewrites an answer of QuantumLeap's API as master gives it, when
/// `history.quantumleap_master` is on; passes it through otherwise.
pub(crate) async fn master_answers(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Response {
    if !state.quantumleap_master {
        return next.run(req).await;
    }
    let rename = req.method() == Method::GET;
    let resp = next.run(req).await;
    let status = resp.status();
    if status != StatusCode::OK && status != StatusCode::NOT_FOUND {
        return resp;
    }
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !is_json {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_REWRITTEN_BYTES).await else {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(json!("answer too large")),
        )
            .into_response();
    };
    let Ok(mut value) = serde_json::from_slice::<Value>(&bytes) else {
        return Response::from_parts(parts, Body::from(bytes));
    };
    if status == StatusCode::NOT_FOUND {
        if value["error"] == "Not Found" {
            return Json(json!([])).into_response();
        }
        return Response::from_parts(parts, Body::from(bytes));
    }
    if rename {
        rename_keys(&mut value);
    }
    let mut resp = Json(value).into_response();
    *resp.headers_mut() = parts.headers;
    resp.headers_mut().remove(header::CONTENT_LENGTH);
    resp
}

/// Renames `entityId` to `id` and `entityType` to `type` in the objects
/// of a query answer (not inside the values: those are arrays).
fn rename_keys(v: &mut Value) {
    match v {
        Value::Object(map) => {
            for (from, to) in [("entityId", "id"), ("entityType", "type")] {
                if let Some(x) = map.remove(from) {
                    map.insert(to.to_string(), x);
                }
            }
            // An object with an `index` or an `attrName` holds attribute
            // values under `values`; elsewhere (`/…/value` answers)
            // `values` holds entities or types.
            let holds_attribute_values = map.contains_key("index") || map.contains_key("attrName");
            for (key, child) in map.iter_mut() {
                if key != "values" || !holds_attribute_values {
                    rename_keys(child);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(rename_keys),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn master_names_entities_id_and_type_outside_the_values() {
        let mut v = json!({"entityType": "Room", "entities": [
            {"entityId": "Room:1", "index": [], "values": [{"entityId": "a value"}]}]});
        rename_keys(&mut v);
        assert_eq!(
            v,
            json!({"type": "Room", "entities": [
                {"id": "Room:1", "index": [], "values": [{"entityId": "a value"}]}]})
        );
        let mut v = json!({"values": [{"entityId": "Room:1", "index": [], "values": [1]}]});
        rename_keys(&mut v);
        assert_eq!(
            v,
            json!({"values": [{"id": "Room:1", "index": [], "values": [1]}]})
        );
    }
}
