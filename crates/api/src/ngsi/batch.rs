//! `/v2/op/update` and `/v2/op/query`: batch operations.
//!
//! An update applies its action to each entity in turn; what failed is
//! gathered into one Orion text (`do not exist: E1/T - [ B ], E2/T
//! [entity itself]`): 404 when no entity existed, 422 Unprocessable when
//! nothing at all was applied, 422 PartialUpdate otherwise. The payload is
//! validated completely before anything is applied.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Map, Value};
use weft_model::ngsi::{self, Entity, NgsiError, UpdateOptions};
use weft_pipeline::context::EntityFilter;

use super::entities::{listing_response, Listing};
use super::error::{Error, Result};
use super::now_ms;
use super::params::{json_body, order_by, Params};
use super::query_body;
use super::tenant::{ServicePath, Tenant, WriteOp};
use crate::AppState;

/// The `actionType` of a batch update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Append,
    AppendStrict,
    Update,
    Delete,
    Replace,
}

impl Action {
    fn parse(s: &str) -> Result<Action> {
        // The upper-case names are NGSIv1's, still accepted (deprecated).
        Ok(match s {
            "append" | "APPEND" => Action::Append,
            "appendStrict" | "APPEND_STRICT" => Action::AppendStrict,
            "update" | "UPDATE" => Action::Update,
            "delete" | "DELETE" => Action::Delete,
            "replace" | "REPLACE" => Action::Replace,
            _ => {
                return Err(Error::bad_request(
                    "invalid update action type: right ones are: append, appendStric, delete, replace, update",
                ))
            }
        })
    }
}

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
    let opts = options.update();
    for item in items {
        apply(&state, &tenant, &sp, &path, Action::Append, item, opts).await?;
    }
    Ok(StatusCode::OK.into_response())
}

/// The entities of an Orion notification, checked as Orion's
/// `parseNotification` checks them (both fields present, then each field
/// in the order written), with its texts.
fn notification_items(value: &Value, key_values: bool) -> Result<Vec<Item>> {
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
                    items.push(parse_item(e, Action::Append, key_values)?);
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

/// One entity of the payload, parsed.
struct Item {
    /// The entity as given (type `Thing` when none was).
    entity: Entity,
    /// Whether the payload named the type (lookups then use it).
    typed: bool,
    /// Attribute names given (for `delete`).
    names: Vec<String>,
}

/// What failed for one entity.
enum Failure {
    /// The entity does not exist.
    Entity,
    /// These attributes were refused; the flag says whether others of
    /// the entity were applied.
    Attrs(Vec<String>, bool),
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
        Some(Value::String(s)) => Action::parse(s)?,
        Some(_) => return Err(NgsiError::parse_error().into()),
    };
    let entities = match obj.get("entities") {
        None => {
            return Err(Error::bad_request(
                "Invalid JSON payload, mandatory field /entities/ not found",
            ))
        }
        Some(Value::Array(a)) => a,
        Some(_) => return Err(NgsiError::parse_error().into()),
    };
    if entities.is_empty() {
        return Err(Error::bad_request("empty entities vector"));
    }
    let mut items = Vec::with_capacity(entities.len());
    for e in entities {
        items.push(parse_item(e, action, options.key_values)?);
    }
    let opts = options.update();
    let mut failures: Vec<(String, Option<String>, Failure)> = Vec::new();
    let mut applied = false;
    let mut all_missing = !items.is_empty();
    for item in items {
        let label_type = item.typed.then(|| item.entity.entity_type.clone());
        let id = item.entity.id.clone();
        match apply(&state, &tenant, &sp, &path, action, item, opts).await? {
            None => {
                applied = true;
                all_missing = false;
            }
            Some(Failure::Entity) => failures.push((id, label_type, Failure::Entity)),
            Some(Failure::Attrs(names, some_applied)) => {
                all_missing = false;
                applied |= some_applied;
                failures.push((id, label_type, Failure::Attrs(names, some_applied)));
            }
        }
    }
    if failures.is_empty() {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    let prefix = if action == Action::AppendStrict {
        "one or more of the attributes in the request already exist: "
    } else {
        "do not exist: "
    };
    let mut text = String::from(prefix);
    for (i, (id, t, f)) in failures.iter().enumerate() {
        if i > 0 {
            text.push_str(", ");
        }
        let label = match t {
            Some(t) => format!("{id}/{t}"),
            None => id.clone(),
        };
        match f {
            Failure::Entity if i == 0 => text.push_str(&format!("{label} - [entity itself]")),
            Failure::Entity => text.push_str(&format!("{label} [entity itself]")),
            Failure::Attrs(names, _) => {
                text.push_str(&format!("{label} - [ {} ]", names.join(", ")))
            }
        }
    }
    Err(Error(if all_missing {
        NgsiError::new(404, "NotFound", text)
    } else if applied {
        NgsiError::partial_update(text)
    } else {
        NgsiError::unprocessable(text)
    }))
}

fn parse_item(e: &Value, action: Action, key_values: bool) -> Result<Item> {
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
    let entity = if action == Action::Delete {
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
    Ok(Item {
        entity,
        typed: obj.contains_key("type"),
        names,
    })
}

/// Applies the action to one entity: `None` when it fully succeeded. An
/// `update` of attributes the entity lacks locally goes to the context
/// providers registered for them (see [`super::forward::update`]).
async fn apply(
    state: &AppState,
    tenant: &str,
    sp: &ServicePath,
    path: &str,
    action: Action,
    mut item: Item,
    opts: UpdateOptions,
) -> Result<Option<Failure>> {
    let context = &state.services.context;
    let paths = vec![path.to_string()];
    let id = item.entity.id.clone();
    let etype = item.typed.then(|| item.entity.entity_type.clone());
    let now = now_ms();
    let local = match context.get(tenant, &paths, &id, etype.as_deref()) {
        Ok(found) => Some(found.entity),
        Err(e) if e.status == 404 => None,
        Err(e) => return Err(e.into()),
    };
    let exists = local.is_some();
    let forwarded = if action == Action::Update {
        let target = super::forward::Target {
            tenant,
            sp,
            path,
            id: &id,
            entity_type: etype.as_deref(),
        };
        super::forward::update(state, &target, &mut item.entity.attrs, local.as_ref()).await
    } else {
        super::forward::ForwardedUpdate::default()
    };
    if forwarded.any() && item.entity.attrs.is_empty() {
        let applied = forwarded.failed.len() < forwarded.sent.len();
        return Ok(
            (!forwarded.failed.is_empty()).then_some(Failure::Attrs(forwarded.failed, applied))
        );
    }
    if !exists {
        return match action {
            Action::Append | Action::AppendStrict => {
                let mut entity = item.entity;
                ngsi::operators::resolve_operators(None, &mut entity.attrs)?;
                entity.stamp_created(now);
                context.create(tenant, path, entity).await?;
                Ok(None)
            }
            _ => Ok(Some(Failure::Entity)),
        };
    }
    let mut attrs = item.entity.attrs;
    let requested = if action == Action::Delete {
        item.names.len()
    } else {
        attrs.len()
    };
    let expires = item.entity.date_expires;
    let failed = match action {
        Action::Append | Action::AppendStrict => {
            let opts = UpdateOptions {
                append_strict: action == Action::AppendStrict,
                ..opts
            };
            let outcome = context
                .modify(tenant, &paths, &id, etype.as_deref(), move |e| {
                    ngsi::operators::resolve_operators(Some(e), &mut attrs)?;
                    let out = ngsi::append(e, attrs, opts, now);
                    if expires.is_some() {
                        e.date_expires = expires;
                    }
                    Ok(out)
                })
                .await?;
            outcome.failed
        }
        Action::Update => {
            let outcome = context
                .modify(tenant, &paths, &id, etype.as_deref(), move |e| {
                    ngsi::operators::resolve_operators(Some(e), &mut attrs)?;
                    Ok(ngsi::update(e, attrs, opts, now))
                })
                .await?;
            outcome.failed
        }
        Action::Replace => {
            context
                .modify(tenant, &paths, &id, etype.as_deref(), move |e| {
                    ngsi::operators::resolve_operators(None, &mut attrs)?;
                    let out = ngsi::replace(e, attrs, opts, now);
                    e.date_expires = expires;
                    Ok(out)
                })
                .await?;
            Vec::new()
        }
        Action::Delete if item.names.is_empty() => {
            context
                .delete(tenant, &paths, &id, etype.as_deref())
                .await?;
            Vec::new()
        }
        Action::Delete => {
            let names = item.names;
            context
                .modify(tenant, &paths, &id, etype.as_deref(), move |e| {
                    let mut outcome = ngsi::UpdateOutcome::default();
                    for n in names {
                        match ngsi::delete_attr(e, &n, now) {
                            Ok(change) => outcome.changes.push(change),
                            Err(_) => outcome.failed.push(n),
                        }
                    }
                    Ok(outcome)
                })
                .await?
                .failed
        }
    };
    let some_applied = failed.len() < requested || forwarded.failed.len() < forwarded.sent.len();
    let mut failed = failed;
    failed.extend(forwarded.failed);
    Ok((!failed.is_empty()).then_some(Failure::Attrs(failed, some_applied)))
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
