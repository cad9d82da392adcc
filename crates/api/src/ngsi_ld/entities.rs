//! `/ngsi-ld/v1/entities` and below: create, retrieve, query and delete
//! entities (clauses 5.6.1, 5.6.6, 5.7.1, 5.7.2), append, update and
//! delete their attributes (5.6.2–5.6.5).
//!
//! Each handler reads the request with the model ([`entity`]), writes
//! through the NGSI write ([`weft_pipeline::ngsi_write`], the one NGSIv2
//! uses) or reads the context, and renders.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use regex::Regex;
use serde_json::{json, Map, Value};
use weft_model::geo::Shape;
use weft_model::ngsi::{AttrMap, UpdateOptions};
use weft_model::ngsi_ld::entity::{self, Format, Render};
use weft_model::ngsi_ld::order::OrderBy;
use weft_model::ngsi_ld::projection::{Mode, Projection};
use weft_model::ngsi_ld::{Context, LdError, LdQuery};
use weft_pipeline::context::{EntityFilter, EntityResolver, StoredEntity, Target};
use weft_pipeline::ngsi_write::{Write, Written};

use super::join::{Join, Linker};
use super::{Error, LdParams, LdRequest, Result};
use crate::AppState;

/// Entities a query answers by default.
pub const DEFAULT_LIMIT: usize = 20;
/// The most entities one query answers.
pub const MAX_LIMIT: usize = 1000;

/// The representation and system attributes `options` asks for.
fn render_options<'a>(req: &'a LdRequest, params: &'a LdParams) -> Render<'a> {
    let format = if params.option("keyValues") || params.option("simplified") {
        Format::KeyValues
    } else if params.option("concise") {
        Format::Concise
    } else {
        Format::Normalized
    };
    Render {
        context: &req.context,
        format,
        sys_attrs: params.option("sysAttrs"),
        attrs: None,
        lang: params.get("lang"),
        datasets: None,
    }
}

/// `attrs` (and `pick`'s attribute names) as stored names.
fn stored_attrs(req: &LdRequest, params: &LdParams) -> Option<Vec<String>> {
    let mut names: Option<Vec<String>> = None;
    let picked = picked(params);
    for list in [params.list("attrs"), picked].into_iter().flatten() {
        let list = list
            .iter()
            .filter(|n| !matches!(n.as_str(), "id" | "type"))
            .map(|n| req.context.to_stored(n));
        names.get_or_insert_with(Vec::new).extend(list);
    }
    names
}

/// The names `pick` gives at its top level.
fn picked(params: &LdParams) -> Option<Vec<String>> {
    let projection = params.projection().ok().flatten()?;
    (projection.mode() == Mode::Pick).then(|| projection.names().map(str::to_string).collect())
}

/// Entities as shown, their linked entities (`join`) added: inline in
/// each, or listed after them (a single entity with none linked stays
/// an object).
fn joined(
    state: &AppState,
    req: &LdRequest,
    params: &LdParams,
    projection: Option<&Projection>,
    mut entities: Vec<(&Arc<weft_model::ngsi::Entity>, Map<String, Value>)>,
    single: bool,
) -> Value {
    let linker = Linker {
        state,
        tenant: &req.tenant,
        how: render_options(req, params),
    };
    let mut linked = Vec::new();
    match Join::of(params) {
        Some(Join::Inline { level }) => {
            for (stored, shown) in &mut entities {
                linker.inline(stored, shown, projection, level);
            }
        }
        Some(Join::Flat { level }) => {
            let roots: Vec<_> = entities.iter().map(|(e, m)| (*e, m)).collect();
            linked = linker.flat(&roots, projection, level);
        }
        None => {}
    }
    let mut shown: Vec<Value> = entities
        .into_iter()
        .map(|(_, m)| Value::Object(m))
        .collect();
    if single && linked.is_empty() {
        return shown.pop().unwrap_or(Value::Null);
    }
    shown.extend(linked);
    Value::Array(shown)
}

/// "Create Entity" (`POST /ngsi-ld/v1/entities`): 201 with its
/// `Location`, 409 when an entity of that id exists.
pub async fn create(
    State(state): State<AppState>,
    mut req: LdRequest,
    body: Bytes,
) -> Result<Response> {
    let value = req.body(&body).await?;
    let entity = entity::parse_entity(&value, &req.context)?;
    let location = format!("/ngsi-ld/v1/entities/{}", encode_segment(&entity.id));
    create_entity(&state, &req, entity).await?;
    Ok((StatusCode::CREATED, [(header::LOCATION, location)]).into_response())
}

/// Creates `entity`; `AlreadyExists` when the tenant has an entity of its
/// id, whatever its type and service path (the context checks it with
/// the creation).
pub(super) async fn create_entity(
    state: &AppState,
    req: &LdRequest,
    entity: weft_model::ngsi::Entity,
) -> std::result::Result<(), LdError> {
    let target = req.target(&entity.id, Some(entity.entity_type.clone()));
    let opts = UpdateOptions {
        unique_id: true,
        ..UpdateOptions::default()
    };
    write(state, &target, Write::Create(entity), opts).await
}

/// Runs `change` on `target` through the NGSI write, its refusals in
/// NGSI-LD's kinds.
pub(super) async fn write(
    state: &AppState,
    target: &Target,
    change: Write,
    opts: UpdateOptions,
) -> std::result::Result<(), LdError> {
    state
        .services
        .ngsi_writer
        .write(target, change, opts)
        .await
        .map(drop)
        .map_err(super::from_ngsi)
}

/// [`write`], answered 204.
async fn write_then_no_content(
    state: &AppState,
    target: &Target,
    change: Write,
    opts: UpdateOptions,
) -> Result<Response> {
    write(state, target, change, opts).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// "Retrieve Entity" (`GET /ngsi-ld/v1/entities/{id}`).
pub async fn retrieve(
    State(state): State<AppState>,
    req: LdRequest,
    params: LdParams,
    Path(id): Path<String>,
) -> Result<Response> {
    check_id(&id)?;
    let found = find(&state, &req.tenant, &id)
        .filter(|e| type_matches(&req, &params, e))
        .ok_or_else(|| LdError::not_found(format!("no entity with id {id}")))?;
    let attrs = stored_attrs(&req, &params);
    if let Some(names) = &attrs {
        if !names.is_empty() && !names.iter().any(|n| found.entity.attrs.contains_key(n)) {
            return Err(Error(LdError::not_found(format!(
                "entity {id} has none of the attributes asked"
            ))));
        }
    }
    let datasets = params.list("datasetId");
    let how = Render {
        attrs: attrs.as_deref(),
        datasets: datasets.as_deref(),
        ..render_options(&req, &params)
    };
    let projection = params.projection()?;
    let shown = projected(
        entity::render_entity(&found.entity, &how),
        projection.as_ref(),
    );
    if shown.is_empty() {
        return Err(Error(LdError::not_found(format!(
            "nothing of entity {id} is left to show"
        ))));
    }
    let answer = joined(
        &state,
        &req,
        &params,
        projection.as_ref(),
        vec![(&found.entity, shown)],
        true,
    );
    Ok(req.answer_entities(answer, params.get("geometryProperty").unwrap_or("location")))
}

/// `idPattern` compiled; quantifiers on quantifiers (`**`), which POSIX
/// regular expressions leave undefined, are refused.
fn id_pattern(p: &str) -> std::result::Result<Regex, LdError> {
    let stacked = ["**", "++", "*+", "+*", "?*", "?+"]
        .iter()
        .any(|q| p.contains(q));
    if stacked {
        return Err(LdError::bad_request(format!(
            "idPattern: repeated quantifiers in {p}"
        )));
    }
    Regex::new(p).map_err(|e| LdError::bad_request(format!("idPattern: {e}")))
}

/// An entity as `pick` (only the members named, `id` and `type`
/// included) or `omit` (all but those named) project it.
fn projected(
    mut entity: Map<String, Value>,
    projection: Option<&Projection>,
) -> Map<String, Value> {
    if let Some(p) = projection {
        p.apply(&mut entity);
    }
    entity
}

/// "Query Entities" (`GET /ngsi-ld/v1/entities`): by `id`, `idPattern`,
/// `type`, `attrs`, `q` and a geo-query on `geoproperty` (`location` by
/// default), paged by `limit` and `offset`, counted with
/// `count=true` (`NGSILD-Results-Count`).
pub async fn query(
    State(state): State<AppState>,
    req: LdRequest,
    params: LdParams,
) -> Result<Response> {
    let attrs = stored_attrs(&req, &params);
    // Entities are chosen by `attrs` only; `pick` shapes what is shown.
    let having: Option<Vec<String>> = params
        .list("attrs")
        .map(|names| names.iter().map(|n| req.context.to_stored(n)).collect());
    let ids = params.list("id").unwrap_or_default();
    if params.get("id").is_some() && ids.is_empty() {
        return Err(Error(LdError::bad_request("id names at least one entity")));
    }
    for id in &ids {
        if !entity::is_uri(id) {
            return Err(Error(LdError::bad_request(format!(
                "id is a list of URIs: {id:?}"
            ))));
        }
    }
    let filter = EntityFilter {
        ids,
        id_pattern: params.get("idPattern").map(id_pattern).transpose()?,
        types: params
            .list("type")
            .unwrap_or_default()
            .iter()
            .map(|t| req.context.to_stored(t))
            .collect(),
        ..EntityFilter::default()
    };
    let q = params
        .get("q")
        .map(|q| LdQuery::parse(q, &req.context))
        .transpose()?;
    let geo = weft_model::ngsi_ld::geo::geo_query(
        params.get("georel"),
        params.get("geometry"),
        params.get("coordinates"),
    )?;
    let geoproperty = req
        .context
        .to_stored(params.get("geoproperty").unwrap_or("location"));
    // Ids alone are not enough: a query names what kind of entities
    // (5.7.2: type, attrs, q, a geo-query, or local=true).
    let unfiltered = filter.types.is_empty()
        && q.is_none()
        && geo.is_none()
        && having.is_none()
        && params.get("local") != Some("true");
    if unfiltered {
        return Err(Error(LdError::bad_request(
            "a query names at least one of type, attrs, q or a geo-query",
        )));
    }
    let (limit, offset) = paging(&params)?;
    let order = params
        .get("orderBy")
        .map(|o| OrderBy::parse(o, &req.context))
        .transpose()?;
    let mut found: Vec<StoredEntity> = state
        .services
        .context
        .query(&req.tenant, &filter)
        .into_iter()
        .filter(|e| {
            having
                .as_ref()
                .is_none_or(|names| names.iter().any(|n| e.entity.attrs.contains_key(n)))
                && q.as_ref()
                    .is_none_or(|q| q.matches_with(&EntityResolver(&e.entity, &e.service_path)))
                && geo.as_ref().is_none_or(|g| {
                    e.entity
                        .attrs
                        .get(&geoproperty)
                        .and_then(|a| Shape::of_stored_attribute("geo:json", &a.value))
                        .is_some_and(|shape| g.matches(&shape))
                })
        })
        .collect();
    if let Some(pick) = picked(&params) {
        // An entity of which nothing picked is left is not an answer.
        let core = pick.iter().any(|p| p == "id" || p == "type");
        found.retain(|e| {
            core || e.entity.attrs.keys().any(|n| {
                let base = entity::split_instance(n).0;
                pick.iter().any(|p| *p == req.context.from_stored(base))
            })
        });
    }
    if let Some(order) = &order {
        // Stable: ties keep the order of creation.
        found.sort_by(|a, b| order.compare(&a.entity, &b.entity));
    }
    let datasets = params.list("datasetId");
    let how = Render {
        attrs: attrs.as_deref(),
        datasets: datasets.as_deref(),
        ..render_options(&req, &params)
    };
    let projection = params.projection()?;
    let page: Vec<_> = found
        .iter()
        .skip(offset)
        .take(limit)
        .map(|e| {
            let shown = projected(entity::render_entity(&e.entity, &how), projection.as_ref());
            (&e.entity, shown)
        })
        .collect();
    let answer = joined(&state, &req, &params, projection.as_ref(), page, false);
    let mut resp =
        req.answer_entities(answer, params.get("geometryProperty").unwrap_or("location"));
    if params.get("count") == Some("true") {
        resp.headers_mut()
            .insert("ngsild-results-count", found.len().into());
    }
    Ok(resp)
}

/// "Query Entities" by POST (`POST /ngsi-ld/v1/entityOperations/query`,
/// 5.7.2): the query in the body ([`query_params`]), paging and options
/// in the URL; answered as the GET is.
pub async fn query_by_post(
    State(state): State<AppState>,
    mut req: LdRequest,
    params: LdParams,
    body: Bytes,
) -> Result<Response> {
    let value = req.body(&body).await?;
    let params = params.extended(query_params(&value)?)?;
    query(State(state), req, params).await
}

/// A `Query` (5.2.23) read as the URL parameters of the same query:
/// `entities` (their ids, id patterns and types read as one), `attrs`,
/// `q`, `geoQ`, `temporalQ`, and `join`, `joinLevel`, `pick`, `omit`,
/// `lang`, `geometryProperty`, `aggrMethods`, `aggrPeriodDuration` as
/// themselves. Both POST queries (entities and temporal) read their body
/// with it.
pub(super) fn query_params(value: &Value) -> Result<Vec<(String, String)>> {
    let Value::Object(map) = value else {
        return Err(Error(LdError::invalid("a query is a JSON object")));
    };
    if map.get("type").and_then(Value::as_str) != Some("Query") {
        return Err(Error(LdError::bad_request(
            "the type of a query is \"Query\"",
        )));
    }
    let bad = |what: &str| Error(LdError::bad_request(format!("query: {what}")));
    let texts = |v: &Value| -> Result<Vec<String>> {
        v.as_array()
            .ok_or_else(|| bad("attrs is an array of names"))?
            .iter()
            .map(|n| {
                n.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| bad("attrs is an array of names"))
            })
            .collect()
    };
    let mut extra: Vec<(String, String)> = Vec::new();
    if let Some(entities) = map.get("entities") {
        let (mut ids, mut types) = (Vec::new(), Vec::new());
        for selector in entities
            .as_array()
            .ok_or_else(|| bad("entities is an array"))?
        {
            let field = |k: &str| selector.get(k).and_then(Value::as_str).map(str::to_string);
            if let Some(id) = field("id") {
                ids.push(id);
            }
            if let Some(pattern) = field("idPattern") {
                extra.push(("idPattern".into(), pattern));
            }
            if let Some(t) = field("type") {
                types.push(t);
            }
        }
        if !ids.is_empty() {
            extra.push(("id".into(), ids.join(",")));
        }
        if !types.is_empty() {
            extra.push(("type".into(), types.join(",")));
        }
    }
    if let Some(attrs) = map.get("attrs") {
        extra.push(("attrs".into(), texts(attrs)?.join(",")));
    }
    if let Some(q) = map.get("q") {
        extra.push((
            "q".into(),
            q.as_str().ok_or_else(|| bad("q is a string"))?.into(),
        ));
    }
    // Members named as the URL's parameters, read as those.
    let temporal = map.get("temporalQ").and_then(Value::as_object);
    let members = [
        "join",
        "joinLevel",
        "pick",
        "omit",
        "lang",
        "geometryProperty",
        "aggrMethods",
        "aggrPeriodDuration",
    ]
    .into_iter()
    .map(|k| (k, map.get(k)));
    let temporal_members = ["timerel", "timeAt", "endTimeAt", "lastN", "timeproperty"]
        .into_iter()
        .map(|k| (k, temporal.and_then(|t| t.get(k))));
    for (key, found) in members.chain(temporal_members) {
        match found {
            Some(Value::String(v)) => extra.push((key.into(), v.clone())),
            Some(Value::Number(n)) => extra.push((key.into(), n.to_string())),
            Some(names @ Value::Array(_)) if matches!(key, "pick" | "omit" | "aggrMethods") => {
                extra.push((key.into(), texts(names)?.join(",")))
            }
            Some(_) => return Err(bad(&format!("{key} is a string"))),
            None => {}
        }
    }
    if let Some(geo) = map.get("geoQ") {
        for key in ["georel", "geometry", "geoproperty"] {
            if let Some(v) = geo.get(key).and_then(Value::as_str) {
                extra.push((key.into(), v.into()));
            }
        }
        match geo.get("coordinates") {
            Some(Value::String(c)) => extra.push(("coordinates".into(), c.clone())),
            Some(c @ Value::Array(_)) => extra.push(("coordinates".into(), c.to_string())),
            _ => {}
        }
    }
    Ok(extra)
}

/// "Delete Entity" (`DELETE /ngsi-ld/v1/entities/{id}`).
pub async fn remove(
    State(state): State<AppState>,
    req: LdRequest,
    Path(id): Path<String>,
) -> Result<Response> {
    check_id(&id)?;
    let (_, target) = existing(&state, &req, &id)?;
    write_then_no_content(&state, &target, Write::Delete, UpdateOptions::default()).await
}

/// "Append Entity Attributes" (`POST …/entities/{id}/attrs`): every
/// attribute added or replaced; with `options=noOverwrite` those the
/// entity has are left as they are and reported (207).
pub async fn append(
    State(state): State<AppState>,
    mut req: LdRequest,
    params: LdParams,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response> {
    let (attrs, nulls) = attrs_body(&mut req, &id, &body).await?;
    let opts = UpdateOptions {
        append_strict: params.option("noOverwrite"),
        override_metadata: true,
        ..UpdateOptions::default()
    };
    let reason = "attribute exists and noOverwrite was asked";
    write_reported(
        &state,
        &req,
        &id,
        (Write::Append(attrs), nulls),
        opts,
        reason,
    )
    .await
}

/// "Update Entity Attributes" (`PATCH …/entities/{id}/attrs`): the
/// attributes the entity has are replaced; the others are reported
/// (207).
pub async fn update(
    State(state): State<AppState>,
    mut req: LdRequest,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response> {
    let (attrs, nulls) = attrs_body(&mut req, &id, &body).await?;
    let opts = UpdateOptions {
        override_metadata: true,
        ..UpdateOptions::default()
    };
    // Since NGSI-LD 1.6 an attribute (or instance) the entity lacks is
    // appended, not refused, as ETSI's suite and Stellio have it.
    let reason = "the attribute could not be written";
    write_reported(
        &state,
        &req,
        &id,
        (Write::Append(attrs), nulls),
        opts,
        reason,
    )
    .await
}

/// "Replace Entity" (`PUT /ngsi-ld/v1/entities/{id}`): every attribute
/// replaced by the body's.
pub async fn replace(
    State(state): State<AppState>,
    mut req: LdRequest,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response> {
    let value = req.body(&body).await?;
    let attrs = fragment_attrs(&req.context, &id, value)?;
    let (_, target) = existing(&state, &req, &id)?;
    let opts = UpdateOptions {
        override_metadata: true,
        ..UpdateOptions::default()
    };
    write_then_no_content(&state, &target, Write::Replace(attrs), opts).await
}

/// "Merge Entity" (`PATCH /ngsi-ld/v1/entities/{id}`): the body's
/// attributes added, or merged into those the entity has (the members
/// and sub-attributes given replace theirs, the others stay).
pub async fn merge(
    State(state): State<AppState>,
    mut req: LdRequest,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response> {
    let value = req.body(&body).await?;
    let (attrs, nulls) = merge_fragment(&req.context, &id, value)?;
    let (found, target) = existing(&state, &req, &id)?;
    merge_into(&state, &found.entity, &target, attrs, nulls).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// A merge fragment for entity `id`: the attributes to merge, and those
/// to delete (their value is `urn:ngsi-ld:null`), as stored names.
pub(super) fn merge_fragment(
    ctx: &Context,
    id: &str,
    value: Value,
) -> std::result::Result<(AttrMap, Vec<String>), LdError> {
    let Value::Object(mut map) = value else {
        return Err(LdError::invalid("an entity is a JSON object"));
    };
    let nulls: Vec<String> = map
        .iter()
        .filter(|(_, v)| entity::is_null_attribute(v))
        .map(|(k, _)| k.clone())
        .collect();
    for name in &nulls {
        map.remove(name);
    }
    let attrs = fragment_attrs(ctx, id, Value::Object(map))?;
    let nulls = nulls.iter().map(|n| ctx.to_stored(n)).collect();
    Ok((attrs, nulls))
}

/// Merges `attrs` into `entity` (at `target`) and deletes the attributes
/// named in `nulls` it has.
pub(super) async fn merge_into(
    state: &AppState,
    entity: &weft_model::ngsi::Entity,
    target: &Target,
    attrs: AttrMap,
    nulls: Vec<String>,
) -> std::result::Result<(), LdError> {
    if !attrs.is_empty() || nulls.is_empty() {
        write(
            state,
            target,
            Write::Append(attrs),
            UpdateOptions::default(),
        )
        .await?;
    }
    let doomed: Vec<String> = nulls
        .into_iter()
        .filter(|n| entity.attrs.contains_key(n))
        .collect();
    if !doomed.is_empty() {
        write(
            state,
            target,
            Write::DeleteAttrs(doomed),
            UpdateOptions::default(),
        )
        .await?;
    }
    Ok(())
}

/// "Replace Attribute" (`PUT …/entities/{id}/attrs/{attr}`): the
/// attribute the entity has replaced whole.
pub async fn replace_attr(
    State(state): State<AppState>,
    mut req: LdRequest,
    Path((id, attr)): Path<(String, String)>,
    body: Bytes,
) -> Result<Response> {
    check_id(&id)?;
    entity::check_attribute_name(&attr)?;
    if req.context.to_stored(&attr) == entity::SCOPE {
        return Err(Error(LdError::bad_request(
            "scope is not an attribute: it is replaced with the entity",
        )));
    }
    let mut fragment = req.body(&body).await?;
    if let Value::Object(map) = &mut fragment {
        map.remove("@context");
    }
    let dataset = entity::dataset_of(&fragment)?;
    let name = entity::instance_name(&req.context.to_stored(&attr), dataset.as_deref());
    let parsed = entity::parse_attribute(&attr, &fragment, &req.context)?;
    let (found, target) = existing(&state, &req, &id)?;
    if !found.entity.attrs.contains_key(&name) {
        return Err(Error(LdError::not_found(format!(
            "entity {id} has no attribute {attr}"
        ))));
    }
    let opts = UpdateOptions {
        override_metadata: true,
        ..UpdateOptions::default()
    };
    write_then_no_content(
        &state,
        &target,
        Write::UpdateAttr { name, attr: parsed },
        opts,
    )
    .await
}

/// The attributes of an entity fragment addressed to entity `id` (an
/// `id` in the body must be that one).
fn fragment_attrs(ctx: &Context, id: &str, value: Value) -> std::result::Result<AttrMap, LdError> {
    if !entity::is_uri(id) {
        return Err(LdError::bad_request(format!("the id is not a URI: {id:?}")));
    }
    let Value::Object(map) = value else {
        return Err(LdError::invalid("an entity is a JSON object"));
    };
    if let Some(given) = map.get("id").or_else(|| map.get("@id")) {
        if given.as_str() != Some(id) {
            return Err(LdError::bad_request(
                "the body's id is not the entity's of the path",
            ));
        }
    }
    entity::parse_attrs(&map, ctx)
}

/// "Partial Attribute Update" (`PATCH …/entities/{id}/attrs/{attr}`):
/// the members given replace the attribute's, the others stay.
pub async fn update_attr(
    State(state): State<AppState>,
    mut req: LdRequest,
    Path((id, attr)): Path<(String, String)>,
    body: Bytes,
) -> Result<Response> {
    check_id(&id)?;
    let mut fragment = req.body(&body).await?;
    let dataset = entity::dataset_of(&fragment)?;
    let name = entity::instance_name(&req.context.to_stored(&attr), dataset.as_deref());
    let (found, target) = existing(&state, &req, &id)?;
    let current = found
        .entity
        .attrs
        .get(&name)
        .ok_or_else(|| LdError::not_found(format!("entity {id} has no attribute {attr}")))?;
    if entity::is_null_attribute(&fragment) {
        return write_then_no_content(
            &state,
            &target,
            Write::DeleteAttr(name),
            UpdateOptions::default(),
        )
        .await;
    }
    if let Value::Object(map) = &mut fragment {
        map.remove("@context");
        // A fragment naming no value keeps the attribute's (and its kind).
        let kind = entity::AttrKind::of_stored(&current.attr_type);
        // A partial update changes an attribute, not what kind it is.
        if let Some(given) = map.get("type").and_then(Value::as_str) {
            if given != kind.name() {
                return Err(Error(LdError::bad_request(format!(
                    "attribute {attr} is a {}, not a {given}",
                    kind.name()
                ))));
            }
        }
        if !map.contains_key("type") && !entity::has_value_member(map) {
            map.insert("type".into(), Value::String(kind.name().into()));
            map.insert(kind.value_member().into(), current.value.clone());
        }
    }
    let parsed = entity::parse_attribute(&attr, &fragment, &req.context)?;
    write_then_no_content(
        &state,
        &target,
        Write::UpdateAttr { name, attr: parsed },
        UpdateOptions::default(),
    )
    .await
}

/// "Delete Entity Attribute" (`DELETE …/entities/{id}/attrs/{attr}`):
/// the default instance, the one of `datasetId`, or with `deleteAll=true`
/// every instance.
pub async fn remove_attr(
    State(state): State<AppState>,
    req: LdRequest,
    params: LdParams,
    Path((id, attr)): Path<(String, String)>,
) -> Result<Response> {
    check_id(&id)?;
    let (found, target) = existing(&state, &req, &id)?;
    let base = req.context.to_stored(&attr);
    let doomed: Vec<String> = if params.get("deleteAll") == Some("true") {
        found
            .entity
            .attrs
            .keys()
            .filter(|n| entity::split_instance(n).0 == base)
            .map(str::to_string)
            .collect()
    } else {
        let dataset = params.get("datasetId");
        if dataset.is_some_and(|d| !entity::is_uri(d)) {
            return Err(Error(LdError::bad_request("datasetId is a URI")));
        }
        let name = entity::instance_name(&base, dataset);
        if found.entity.attrs.contains_key(&name) {
            vec![name]
        } else {
            Vec::new()
        }
    };
    if doomed.is_empty() {
        return Err(Error(LdError::not_found(format!(
            "entity {id} has no attribute {attr} (of that datasetId)"
        ))));
    }
    write_then_no_content(
        &state,
        &target,
        Write::DeleteAttrs(doomed),
        UpdateOptions::default(),
    )
    .await
}

/// The attributes of an append or update body, and those it deletes
/// (their value is `urn:ngsi-ld:null`).
async fn attrs_body(req: &mut LdRequest, id: &str, body: &Bytes) -> Result<(AttrMap, Vec<String>)> {
    let value = req.body(body).await?;
    let Value::Object(map) = &value else {
        return Err(Error(LdError::invalid("the attributes are a JSON object")));
    };
    if map.keys().all(|k| k == "@context") {
        return Err(Error(LdError::bad_request("no attribute given")));
    }
    Ok(merge_fragment(&req.context, id, value)?)
}

/// Runs an attribute write on entity `id`, wherever it lives: 204 when
/// every attribute was written, else 207 with the update result, each
/// attribute refused reported with `reason`.
async fn write_reported(
    state: &AppState,
    req: &LdRequest,
    id: &str,
    (write, nulls): (Write, Vec<String>),
    opts: UpdateOptions,
    reason: &str,
) -> Result<Response> {
    check_id(id)?;
    let (found, target) = existing(state, req, id)?;
    let attrs_given = match &write {
        Write::Append(a) | Write::Update(a) => !a.is_empty(),
        _ => true,
    };
    let written = if attrs_given || nulls.is_empty() {
        Some(
            state
                .services
                .ngsi_writer
                .apply(&target, write, opts)
                .await?,
        )
    } else {
        None
    };
    if !nulls.is_empty() {
        merge_into(state, &found.entity, &target, AttrMap::new(), nulls).await?;
    }
    Ok(match written {
        Some(written) => update_result(req, &written, reason),
        None => StatusCode::NO_CONTENT.into_response(),
    })
}

/// 204 when every attribute was written, else 207 with the update
/// result (`updated`, `notUpdated` with `reason`).
fn update_result(req: &LdRequest, written: &Written, reason: &str) -> Response {
    if written.outcome.failed.is_empty() {
        return StatusCode::NO_CONTENT.into_response();
    }
    let updated: Vec<Value> = written
        .outcome
        .changes
        .iter()
        .map(|c| Value::String(req.context.from_stored(&c.name)))
        .collect();
    let not_updated: Vec<Value> = written
        .outcome
        .failed
        .iter()
        .map(|name| json!({"attributeName": req.context.from_stored(name), "reason": reason}))
        .collect();
    (
        StatusCode::MULTI_STATUS,
        [(header::CONTENT_TYPE, "application/json")],
        json!({"updated": updated, "notUpdated": not_updated}).to_string(),
    )
        .into_response()
}

/// The entity with `id` and the target a write to it addresses,
/// wherever it lives; `ResourceNotFound` when there is none.
pub(super) fn existing(
    state: &AppState,
    req: &LdRequest,
    id: &str,
) -> std::result::Result<(StoredEntity, Target), LdError> {
    let found = find(state, &req.tenant, id)
        .ok_or_else(|| LdError::not_found(format!("no entity with id {id}")))?;
    let mut target = req.target(id, Some(found.entity.entity_type.clone()));
    target.path = found.service_path.clone();
    Ok((found, target))
}

/// The entity with `id` in the tenant, whatever its type and service
/// path: NGSI-LD names an entity by its id alone.
pub(super) fn find(state: &AppState, tenant: &str, id: &str) -> Option<StoredEntity> {
    let filter = EntityFilter {
        ids: vec![id.to_string()],
        ..EntityFilter::default()
    };
    state
        .services
        .context
        .query(tenant, &filter)
        .into_iter()
        .next()
}

/// Whether the entity is of the `type` the request names, if it names
/// one.
fn type_matches(req: &LdRequest, params: &LdParams, e: &StoredEntity) -> bool {
    params
        .get("type")
        .is_none_or(|t| req.context.to_stored(t) == e.entity.entity_type)
}

/// An id in a path must be a URI.
pub(super) fn check_id(id: &str) -> Result<()> {
    if entity::is_uri(id) {
        Ok(())
    } else {
        Err(Error(LdError::bad_request(format!(
            "the id is not a URI: {id:?}"
        ))))
    }
}

/// `limit` and `offset`, checked.
pub(super) fn paging(params: &LdParams) -> Result<(usize, usize)> {
    let number = |key: &str, default: usize| -> Result<usize> {
        match params.get(key) {
            None => Ok(default),
            Some(v) => v.parse::<usize>().map_err(|_| {
                Error(LdError::bad_request(format!(
                    "{key} is not a non-negative integer: {v}"
                )))
            }),
        }
    };
    let limit = number("limit", DEFAULT_LIMIT)?;
    if limit > MAX_LIMIT {
        return Err(Error(LdError::new(
            weft_model::ngsi_ld::ErrorKind::TooManyResults,
            format!("limit {limit} is over {MAX_LIMIT}"),
        )));
    }
    Ok((limit, number("offset", 0)?))
}

/// An entity id as a path segment.
pub(super) fn encode_segment(id: &str) -> String {
    percent_encoding::utf8_percent_encode(id, percent_encoding::NON_ALPHANUMERIC)
        .to_string()
        .replace("%3A", ":")
        .replace("%2D", "-")
        .replace("%2E", ".")
        .replace("%5F", "_")
}
