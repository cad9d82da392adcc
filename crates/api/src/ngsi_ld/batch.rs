//! `/ngsi-ld/v1/entityOperations/{create,upsert,update,delete,merge}`:
//! the batch operations (clauses 5.6.7–5.6.10, 5.6.20). Each entity of a batch is
//! written on its own through the NGSI write; what fails is reported in a
//! batch operation result (207) beside what succeeded.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{json, Value};
use weft_model::ngsi::UpdateOptions;
use weft_model::ngsi_ld::entity;
use weft_model::ngsi_ld::LdError;
use weft_pipeline::ngsi_write::Write;

use super::entities::{create_entity, existing, write};
use super::{from_ngsi, Error, LdParams, LdRequest, Result};
use crate::AppState;

/// The most entities one batch carries.
pub const MAX_BATCH: usize = 1000;

/// What one batch did: the ids written and the errors of the others.
#[derive(Default)]
struct Outcome {
    success: Vec<String>,
    errors: Vec<(String, LdError)>,
}

impl Outcome {
    fn record(&mut self, id: String, result: std::result::Result<(), LdError>) {
        match result {
            Ok(()) => self.success.push(id),
            Err(e) => self.errors.push((id, e)),
        }
    }

    /// 207 with the batch operation result when anything failed, else
    /// `ok`.
    fn answer(self, ok: Response) -> Response {
        if self.errors.is_empty() {
            return ok;
        }
        let errors: Vec<Value> = self
            .errors
            .into_iter()
            .map(|(id, e)| json!({"entityId": id, "error": e.to_json()}))
            .collect();
        (
            StatusCode::MULTI_STATUS,
            [(header::CONTENT_TYPE, "application/json")],
            json!({"success": self.success, "errors": errors}).to_string(),
        )
            .into_response()
    }
}

/// The entities (or, for delete, the ids) of a batch body.
async fn items(req: &mut LdRequest, body: &Bytes) -> Result<Vec<Value>> {
    let value = req.body(body).await?;
    let Value::Array(items) = value else {
        return Err(Error(LdError::invalid("a batch is a JSON array")));
    };
    if items.is_empty() {
        return Err(Error(LdError::bad_request("the batch is empty")));
    }
    if items.len() > MAX_BATCH {
        return Err(Error(LdError::bad_request(format!(
            "a batch carries at most {MAX_BATCH} entities"
        ))));
    }
    Ok(items)
}

/// The id a batch item names, for its error report.
fn item_id(item: &Value) -> String {
    item.get("id")
        .or_else(|| item.get("@id"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// One item's own `@context` (a JSON-LD batch may give one per entity),
/// or the request's.
async fn item_context(
    state: &AppState,
    req: &LdRequest,
    item: &Value,
) -> std::result::Result<std::sync::Arc<weft_model::ngsi_ld::Context>, LdError> {
    match (item.get("@context"), req.body_is_ld()) {
        (Some(ctx), true) => state.services.ld_contexts.resolve(Some(ctx)).await,
        (None, false) => Ok(req.context.clone()),
        // A batch of JSON-LD carries each entity's context in the entity.
        (None, true) => Err(LdError::bad_request(
            "an entity of an application/ld+json batch carries its @context",
        )),
        (Some(_), false) => Err(LdError::bad_request(
            "an entity of an application/json batch cannot carry an @context: send it in a Link header",
        )),
    }
}

/// "Batch Entity Creation": 201 with the ids created, 207 when some
/// failed.
pub async fn create(
    State(state): State<AppState>,
    mut req: LdRequest,
    body: Bytes,
) -> Result<Response> {
    let mut outcome = Outcome::default();
    for item in items(&mut req, &body).await? {
        let id = item_id(&item);
        let result = async {
            let ctx = item_context(&state, &req, &item).await?;
            create_entity(&state, &req, entity::parse_entity(&item, &ctx)?).await
        }
        .await;
        outcome.record(id, result);
    }
    let created = json!(outcome.success).to_string();
    Ok(outcome.answer(
        (
            StatusCode::CREATED,
            [(header::CONTENT_TYPE, "application/json")],
            created,
        )
            .into_response(),
    ))
}

/// "Batch Entity Upsert": entities created, or replaced whole (the
/// default, `options=replace`) or their attributes updated
/// (`options=update`). 201 with the ids created when some were, 204
/// when all existed, 207 when some failed.
pub async fn upsert(
    State(state): State<AppState>,
    mut req: LdRequest,
    params: LdParams,
    body: Bytes,
) -> Result<Response> {
    let merge = params.option("update");
    let mut outcome = Outcome::default();
    let mut created = Vec::new();
    for item in items(&mut req, &body).await? {
        let id = item_id(&item);
        let result = async {
            let ctx = item_context(&state, &req, &item).await?;
            let e = entity::parse_entity(&item, &ctx)?;
            let (target, change) = match existing(&state, &req, &e.id) {
                Err(_) => {
                    created.push(e.id.clone());
                    let target = req.target(&e.id, Some(e.entity_type.clone()));
                    (target, Write::Create(e))
                }
                Ok((_, target)) => {
                    if merge {
                        (target, Write::Append(e.attrs))
                    } else {
                        (target, Write::Replace(e.attrs))
                    }
                }
            };
            let opts = UpdateOptions {
                override_metadata: true,
                ..UpdateOptions::default()
            };
            write(&state, &target, change, opts).await
        }
        .await;
        if result.is_err() {
            created.retain(|c| c != &id);
        }
        outcome.record(id, result);
    }
    let ok = if created.is_empty() {
        StatusCode::NO_CONTENT.into_response()
    } else {
        (
            StatusCode::CREATED,
            [(header::CONTENT_TYPE, "application/json")],
            json!(created).to_string(),
        )
            .into_response()
    };
    Ok(outcome.answer(ok))
}

/// "Batch Entity Update": each entity's attributes appended or replaced
/// (with `options=noOverwrite`, those it has are kept). 204, or 207
/// when some entity failed.
pub async fn update(
    State(state): State<AppState>,
    mut req: LdRequest,
    params: LdParams,
    body: Bytes,
) -> Result<Response> {
    let opts = UpdateOptions {
        append_strict: params.option("noOverwrite"),
        override_metadata: true,
        ..UpdateOptions::default()
    };
    append_each(&state, &mut req, &body, opts).await
}

/// "Batch Entity Merge" (`…/entityOperations/merge`): each entity's
/// attributes added, or merged into those it has (the members and
/// sub-attributes given replace theirs, the others stay; those whose
/// value is `urn:ngsi-ld:null` deleted), as Merge Entity does one. 204,
/// or 207 when some entity failed.
pub async fn merge(
    State(state): State<AppState>,
    mut req: LdRequest,
    body: Bytes,
) -> Result<Response> {
    let mut outcome = Outcome::default();
    for item in items(&mut req, &body).await? {
        let id = item_id(&item);
        let result = async {
            let ctx = item_context(&state, &req, &item).await?;
            let (attrs, nulls) = super::entities::merge_fragment(&ctx, &id, item)?;
            let (found, target) = existing(&state, &req, &id)?;
            super::entities::merge_into(&state, &found.entity, &target, attrs, nulls).await
        }
        .await;
        outcome.record(id, result);
    }
    Ok(outcome.answer(StatusCode::NO_CONTENT.into_response()))
}

/// Appends each entity's attributes to the entity of its id with
/// `opts`, reporting the entities that failed.
async fn append_each(
    state: &AppState,
    req: &mut LdRequest,
    body: &Bytes,
    opts: UpdateOptions,
) -> Result<Response> {
    let mut outcome = Outcome::default();
    for item in items(req, body).await? {
        let id = item_id(&item);
        let result = async {
            let ctx = item_context(state, req, &item).await?;
            let e = entity::parse_entity(&item, &ctx)?;
            let (_, target) = existing(state, req, &e.id)?;
            let written = state
                .services
                .ngsi_writer
                .apply(&target, Write::Append(e.attrs), opts)
                .await
                .map_err(from_ngsi)?;
            match written.outcome.failed.as_slice() {
                [] => Ok(()),
                kept => Err(LdError::bad_request(format!(
                    "attributes exist and noOverwrite was asked: {}",
                    kept.join(", ")
                ))),
            }
        }
        .await;
        outcome.record(id, result);
    }
    Ok(outcome.answer(StatusCode::NO_CONTENT.into_response()))
}

/// "Batch Entity Delete": the body is a list of ids. 204, or 207 when
/// some were not deleted.
pub async fn delete(
    State(state): State<AppState>,
    mut req: LdRequest,
    body: Bytes,
) -> Result<Response> {
    let mut outcome = Outcome::default();
    for item in items(&mut req, &body).await? {
        let id = item.as_str().unwrap_or_default().to_string();
        let result = async {
            if !entity::is_uri(&id) {
                return Err(LdError::bad_request(format!("not an entity id: {item}")));
            }
            let (_, target) = existing(&state, &req, &id)?;
            write(&state, &target, Write::Delete, UpdateOptions::default()).await
        }
        .await;
        outcome.record(id, result);
    }
    Ok(outcome.answer(StatusCode::NO_CONTENT.into_response()))
}
