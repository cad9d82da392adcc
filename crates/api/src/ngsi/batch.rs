//! `/v2/op/update` and `/v2/op/query`: batch operations.
//!
//! An update's payload is validated completely here, then applied by the
//! NGSI write ([`weft_pipeline::ngsi_write::NgsiWriter::batch`]), which
//! gathers what failed into Orion's one text.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Map, Value};
use weft_model::ngsi::{self, NgsiError};
use weft_pipeline::context::EntityFilter;

use super::entities::{listing_response, Listing};
use super::error::{Error, Result};
use super::params::{json_body, order_by, Params};
use super::query_body;
use super::tenant::{ServicePath, Tenant, WriteOp};
use crate::AppState;
use weft_pipeline::ngsi_write::{BatchAction, BatchItem};

/// Orion's "Notify" operation (`POST /v2/op/notify`): a notification
/// from another broker, `{"subscriptionId", "data": [entities]}`, applied
/// as an `append` of each entity (created if missing). 200 with no body.
pub async fn notify(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    sp: ServicePath,
    params: Params,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response> {
    let path = sp.for_write(WriteOp::Update)?;
    let options = params.options()?;
    let value = json_body(&headers, &body)?;
    let items = notification_items(&value, options.key_values)?;
    state
        .services
        .ngsi_writer
        .batch(
            &sp.tenancy(tenant),
            &path,
            BatchAction::Append,
            items,
            options.update(),
        )
        .await?;
    Ok(StatusCode::OK.into_response())
}

/// The entities of an Orion notification, checked as Orion's
/// `parseNotification` checks them (both fields present, then each field
/// in the order written), with its texts.
fn notification_items(value: &Value, key_values: bool) -> Result<Vec<BatchItem>> {
    let Value::Object(obj) = value else {
        return Err(NgsiError::parse_error().into());
    };
    if obj.is_empty() {
        return Err(Error::empty_payload());
    }
    for field in ["subscriptionId", "data"] {
        if !obj.contains_key(field) {
            return Err(Error::bad_request(format!(
                "Invalid JSON payload, mandatory field /{field}/ not found"
            )));
        }
    }
    let mut items = Vec::new();
    for (name, v) in obj {
        match (name.as_str(), v) {
            ("subscriptionId", Value::String(_)) => {}
            ("subscriptionId", _) => {
                return Err(Error::bad_request("/subscriptionId/ must be a JSON String"))
            }
            ("data", Value::Array(entities)) => {
                for e in entities {
                    if !e.is_object() {
                        return Err(Error::bad_request(
                            "notification data vector item must be a JSON Object",
                        ));
                    }
                    items.push(parse_item(e, BatchAction::Append, key_values)?);
                }
            }
            ("data", _) => return Err(Error::bad_request("/data/ must be a JSON Array")),
            (other, _) => {
                return Err(Error::bad_request(format!(
                    "Unrecognized field in JSON payload: /{other}/"
                )))
            }
        }
    }
    Ok(items)
}

/// Orion's "Update" batch operation (`POST /v2/op/update`).
pub async fn update(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    sp: ServicePath,
    params: Params,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response> {
    let path = sp.for_write(WriteOp::Update)?;
    let options = params.options()?;
    let value = json_body(&headers, &body)?;
    let Value::Object(obj) = &value else {
        return Err(NgsiError::parse_error().into());
    };
    if obj.is_empty() {
        return Err(Error::empty_payload());
    }
    for key in obj.keys() {
        if key != "actionType" && key != "entities" {
            return Err(Error::bad_request(format!(
                "Unrecognized field in JSON payload: /{key}/"
            )));
        }
    }
    let action = match obj.get("actionType") {
        None => {
            return Err(Error::bad_request(
                "Invalid JSON payload, mandatory field /actionType/ not found",
            ))
        }
        Some(Value::String(s)) => BatchAction::parse(s)?,
        Some(_) => return Err(NgsiError::parse_error().into()),
    };
    let entities = match obj.get("entities") {
        None => {
            return Err(Error::bad_request(
                "Invalid JSON payload, mandatory field /entities/ not found",
            ))
        }
        Some(Value::Array(a)) => a,
        Some(_) => return Err(Error::bad_request("not a JSON array")),
    };
    if entities.is_empty() {
        return Err(Error::bad_request("empty entities vector"));
    }
    let mut items = Vec::with_capacity(entities.len());
    for e in entities {
        items.push(parse_item(e, action, options.key_values)?);
    }
    state
        .services
        .ngsi_writer
        .batch(&sp.tenancy(tenant), &path, action, items, options.update())
        .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

fn parse_item(e: &Value, action: BatchAction, key_values: bool) -> Result<BatchItem> {
    let Value::Object(obj) = e else {
        return Err(NgsiError::parse_error().into());
    };
    if !obj.contains_key("id") {
        if obj.contains_key("idPattern") {
            return Err(Error::not_implemented());
        }
        return Err(Error::bad_request("nor /id/ nor /idPattern/ present"));
    }
    let names: Vec<String> = obj
        .keys()
        .filter(|k| *k != "id" && *k != "type")
        .cloned()
        .collect();
    let entity = if action == BatchAction::Delete {
        // Attribute values of a delete are ignored (Orion accepts nulls).
        let mut head = Map::new();
        for k in ["id", "type"] {
            if let Some(v) = obj.get(k) {
                head.insert(k.to_string(), v.clone());
            }
        }
        ngsi::parse_entity(&Value::Object(head), key_values)?
    } else {
        ngsi::parse_entity(e, key_values)?
    };
    Ok(BatchItem {
        entity,
        typed: obj.contains_key("type"),
        names,
    })
}

/// Orion's "Query" batch operation (`POST /v2/op/query`): the entities
/// matching any of `entities` (all when absent) and every condition of
/// `expression`, rendered with `attrs`/`metadata`, paged and ordered by
/// the URL's `limit`, `offset`, `orderBy` and `options`.
pub async fn query(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    sp: ServicePath,
    params: Params,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response> {
    let value = json_body(&headers, &body)?;
    let request = query_body::parse(&value)?;
    let service_paths = sp.for_read();
    let expression = &request.expression;
    let base = || EntityFilter {
        service_paths: service_paths.clone(),
        q: expression.q.clone(),
        mq: expression.mq.clone(),
        geo: expression.geo.clone(),
        ..EntityFilter::default()
    };
    let mut filters: Vec<EntityFilter> = request
        .entities
        .into_iter()
        .map(|sel| EntityFilter {
            ids: sel.id.into_iter().collect(),
            id_pattern: sel.id_pattern,
            types: sel.entity_type.into_iter().collect(),
            type_pattern: sel.type_pattern,
            ..base()
        })
        .collect();
    if filters.is_empty() {
        filters.push(base());
    }
    let non_empty = |list: Option<Vec<String>>| list.filter(|l| !l.is_empty());
    // `attributes` also requires one of the (user) attributes it names.
    let required_attrs: Vec<String> = request
        .attributes
        .iter()
        .flatten()
        .filter(|a| !matches!(a.as_str(), "dateCreated" | "dateModified" | "*"))
        .cloned()
        .collect();
    let listing = Listing {
        filters,
        attrs: non_empty(request.attrs).or_else(|| non_empty(request.attributes)),
        metadata: non_empty(request.metadata),
        required_attrs,
        order: order_by(&params)?,
        page: params.paging()?,
        options: params.options()?,
    };
    let remote = listing.forwarded(&state, &tenant, &sp).await;
    let (body, total) = listing.run_with(&state, &tenant, remote);
    Ok(listing_response(
        body,
        listing.options.count.then_some(total),
    ))
}
