//! `/v2/entities` and `/v2/entities/{id}`: list (with every filter),
//! create (with `upsert`), retrieve and delete.
//!
//! Each handler goes parse → validate → call the context → render. The
//! listing logic (filter, order, page, render) is shared with
//! `POST /v2/op/query` through [`Listing`].

use std::cmp::Ordering;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use regex::Regex;
use serde_json::Value;
use weft_model::geo::{GeoQuery, GeoRel};
use weft_model::ngsi::{self, render_with, Format, NgsiError, RenderContext};
use weft_model::query::Query;
use weft_pipeline::context::{location, EntityFilter, StoredEntity};

use super::error::{Error, Result};
use super::params::{json_body, order_by, Options, OrderKey, Params};
use super::tenant::{ServicePath, Tenant, WriteOp};
use super::{check_segment, json_response};
use crate::AppState;
use weft_pipeline::ngsi_write::Write;

/// What a listing selects and how it shows it; built from URI parameters
/// (`GET /v2/entities`) or from a query body (`POST /v2/op/query`).
pub struct Listing {
    /// Which entities: those passing any of these filters.
    pub filters: Vec<EntityFilter>,
    /// `attrs` to render (None: all).
    pub attrs: Option<Vec<String>>,
    /// `metadata` to render (None: all).
    pub metadata: Option<Vec<String>>,
    /// Attributes of which an entity must have at least one (op/query's
    /// deprecated `attributes`); empty: no such condition.
    pub required_attrs: Vec<String>,
    /// `orderBy`.
    pub order: Vec<OrderKey>,
    /// `limit`, `offset`.
    pub page: (usize, usize),
    /// `options`.
    pub options: Options,
}

/// Compiles an `idPattern`/`typePattern` regex with Orion's error text.
pub fn pattern(re: &str, what: &str) -> Result<Regex> {
    Regex::new(re).map_err(|_| Error::bad_request(format!("Invalid regex for entity {what}")))
}

/// Parses `q` with Orion's 400 texts.
pub fn parse_q(q: Option<&str>) -> Result<Option<Query>> {
    q.map(|q| Query::parse(q).map_err(|e| Error::bad_request(e.description())))
        .transpose()
}

/// Parses `mq` with Orion's 400 texts.
pub fn parse_mq(mq: Option<&str>) -> Result<Option<Query>> {
    mq.map(|q| Query::parse_mq(q).map_err(|e| Error::bad_request(e.description())))
        .transpose()
}

/// Parses the geo-query parameters with Orion's 400 texts.
pub fn parse_geo(
    georel: Option<&str>,
    geometry: Option<&str>,
    coords: Option<&str>,
) -> Result<Option<GeoQuery>> {
    GeoQuery::from_ngsi_params(georel, geometry, coords)
        .map_err(|e| Error::bad_request(e.description()))
}

impl Listing {
    /// The listing `GET /v2/entities` asks for.
    fn from_params(p: &Params, service_paths: Vec<String>) -> Result<Listing> {
        if p.get("id").is_some() && p.get("idPattern").is_some() {
            return Err(Error::bad_request("Incompatible parameters: id, IdPattern"));
        }
        if p.get("type").is_some() && p.get("typePattern").is_some() {
            return Err(Error::bad_request(
                "Incompatible parameters: type, typePattern",
            ));
        }
        let filter = EntityFilter {
            service_paths,
            ids: p.list("id").unwrap_or_default(),
            id_pattern: p
                .get("idPattern")
                .map(|r| pattern(r, "idPattern"))
                .transpose()?,
            types: p.list("type").unwrap_or_default(),
            type_pattern: p
                .get("typePattern")
                .map(|r| pattern(r, "typePattern"))
                .transpose()?,
            q: parse_q(p.get("q"))?,
            mq: parse_mq(p.get("mq"))?,
            geo: parse_geo(p.get("georel"), p.get("geometry"), p.get("coords"))?,
        };
        Ok(Listing {
            filters: vec![filter],
            attrs: p.list("attrs"),
            metadata: p.list("metadata"),
            required_attrs: Vec::new(),
            order: order_by(p)?,
            page: p.paging()?,
            options: p.options()?,
        })
    }

    /// What the registered context providers give for this listing
    /// (nothing with `options=skipForwarding`); see
    /// [`weft_pipeline::forwarding::Providers::listing_entities`].
    pub async fn forwarded(
        &self,
        state: &AppState,
        tenant: &str,
        sp: &ServicePath,
    ) -> Vec<ngsi::Entity> {
        if self.options.skip_forwarding {
            return Vec::new();
        }
        let (limit, offset) = self.page;
        state
            .services
            .providers
            .listing_entities(
                &sp.tenancy(tenant.to_string()),
                &self.filters,
                self.attrs.as_deref(),
                limit.saturating_add(offset),
            )
            .await
    }

    /// Runs the listing: the page rendered, and the total count.
    pub fn run(&self, state: &AppState, tenant: &str) -> (Value, usize) {
        self.run_with(state, tenant, Vec::new())
    }

    /// Runs the listing over the local entities and `remote` (from
    /// context providers): a remote entity adds the attributes a local
    /// one of the same id and type lacks, or is listed after the local
    /// ones. Ordering and paging span both.
    pub fn run_with(
        &self,
        state: &AppState,
        tenant: &str,
        remote: Vec<ngsi::Entity>,
    ) -> (Value, usize) {
        let context = &state.services.context;
        let mut found = match self.filters.as_slice() {
            [one] => context.query(tenant, one),
            many => {
                let mut all: Vec<StoredEntity> = Vec::new();
                for f in many {
                    for e in context.query(tenant, f) {
                        if !all.iter().any(|a| a.created == e.created) {
                            all.push(e);
                        }
                    }
                }
                all.sort_by_key(|e| e.created);
                all
            }
        };
        for entity in remote {
            match found
                .iter_mut()
                .find(|e| e.entity.id == entity.id && e.entity.entity_type == entity.entity_type)
            {
                Some(local) => {
                    for (name, attr) in entity.attrs.iter() {
                        if !local.entity.attrs.contains_key(name) {
                            Arc::make_mut(&mut local.entity)
                                .attrs
                                .insert(name, attr.clone());
                        }
                    }
                }
                None => found.push(StoredEntity {
                    service_path: "/".to_string(),
                    entity: Arc::new(entity),
                    created: u64::MAX,
                }),
            }
        }
        if !self.required_attrs.is_empty() {
            found.retain(|e| {
                self.required_attrs
                    .iter()
                    .any(|a| e.entity.attrs.contains_key(a))
            });
        }
        self.sort(&mut found);
        let total = found.len();
        let (limit, offset) = self.page;
        let format = self.options.format();
        let attrs = self.options.attrs_with_dates(self.attrs.clone());
        let page: Vec<Value> = found
            .iter()
            .skip(offset)
            .take(limit)
            .map(|e| render_entity(e, format, attrs.as_deref(), self.metadata.as_deref()))
            .collect();
        (Value::Array(page), total)
    }

    /// Orders the matches. Orion keeps creation order unless `orderBy`
    /// says otherwise, also for `near` queries; `orderBy=geo:distance`
    /// alone sorts a `near` query's matches nearest first, and anywhere
    /// else (descending, among other keys, without `near`) names an
    /// attribute no entity has.
    fn sort(&self, found: &mut [StoredEntity]) {
        if let [key] = self.order.as_slice() {
            if key.name == "geo:distance" && !key.descending {
                let geo = self.filters.first().and_then(|f| f.geo.as_ref());
                if let Some(g) = geo.filter(|g| matches!(g.rel(), GeoRel::Near { .. })) {
                    found.sort_by(|a, b| cmp_f64(distance(g, a), distance(g, b)));
                }
                return;
            }
        }
        if self.order.is_empty() {
            return;
        }
        found.sort_by(|a, b| {
            for key in &self.order {
                let ord = cmp_values(&sort_value(a, &key.name), &sort_value(b, &key.name));
                let ord = if key.descending { ord.reverse() } else { ord };
                if ord != Ordering::Equal {
                    return ord;
                }
            }
            Ordering::Equal
        });
    }
}

/// Renders an entity in its service path (for the builtin `servicePath`);
/// `values` and `unique` without an `attrs` list give the values in
/// attribute-name order, as Orion does, without the builtin `dateExpires`.
pub fn render_entity(
    stored: &StoredEntity,
    format: Format,
    attrs: Option<&[String]>,
    metadata: Option<&[String]>,
) -> Value {
    let entity = &stored.entity;
    let ctx = RenderContext {
        service_path: Some(&stored.service_path),
        ..RenderContext::default()
    };
    if matches!(format, Format::Values | Format::Unique) && attrs.is_none_or(|a| a.is_empty()) {
        let mut names: Vec<String> = entity
            .attrs
            .keys()
            .filter(|n| *n != ngsi::EXPIRATION_ATTR)
            .map(str::to_string)
            .collect();
        names.sort();
        return render_with(entity, format, Some(&names), metadata, &ctx);
    }
    render_with(entity, format, attrs, metadata, &ctx)
}

fn distance(g: &GeoQuery, e: &StoredEntity) -> f64 {
    location(&e.entity)
        .map(|s| g.distance_m(&s))
        .unwrap_or(f64::INFINITY)
}

fn cmp_f64(a: f64, b: f64) -> Ordering {
    a.partial_cmp(&b).unwrap_or(Ordering::Equal)
}

/// The value an entity sorts by for `name` (null when missing). The
/// builtins sort by their own value even when a user attribute has their
/// name, as `q` filters by it.
fn sort_value(e: &StoredEntity, name: &str) -> Value {
    let entity = &e.entity;
    match name {
        "id" => Value::String(entity.id.clone()),
        "type" => Value::String(entity.entity_type.clone()),
        "dateCreated" => Value::from(entity.date_created),
        "dateModified" => Value::from(entity.date_modified),
        "dateExpires" if entity.date_expires.is_some() => Value::from(entity.date_expires),
        "servicePath" => Value::String(e.service_path.clone()),
        _ => entity
            .attrs
            .get(name)
            .map(|a| a.value.clone())
            .unwrap_or(Value::Null),
    }
}

/// MongoDB's order of values, which Orion's sorting follows: null, then
/// numbers, strings, objects, arrays, booleans.
fn cmp_values(a: &Value, b: &Value) -> Ordering {
    fn rank(v: &Value) -> u8 {
        match v {
            Value::Null => 0,
            Value::Number(_) => 1,
            Value::String(_) => 2,
            Value::Object(_) => 3,
            Value::Array(_) => 4,
            Value::Bool(_) => 5,
        }
    }
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            cmp_f64(x.as_f64().unwrap_or(0.0), y.as_f64().unwrap_or(0.0))
        }
        (Value::String(x), Value::String(y)) => x.cmp(y),
        (Value::Bool(x), Value::Bool(y)) => x.cmp(y),
        _ => rank(a).cmp(&rank(b)),
    }
}

/// A JSON answer with an optional `Fiware-Total-Count`.
pub fn listing_response(body: Value, total: Option<usize>) -> Response {
    let mut resp = json_response(&body);
    if let Some(total) = total {
        resp.headers_mut()
            .insert("fiware-total-count", HeaderValue::from(total));
    }
    resp
}

/// Orion's "List Entities" (`GET /v2/entities`).
pub async fn list(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    sp: ServicePath,
    params: Params,
) -> Result<Response> {
    let listing = Listing::from_params(&params, sp.for_read())?;
    let remote = listing.forwarded(&state, &tenant, &sp).await;
    let (body, total) = listing.run_with(&state, &tenant, remote);
    Ok(listing_response(
        body,
        listing.options.count.then_some(total),
    ))
}

/// Orion's "Create Entity" (`POST /v2/entities`, with `options=upsert`
/// "Create or Update Entity").
pub async fn create(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    sp: ServicePath,
    params: Params,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response> {
    // The id and type come from the body, read after the paths.
    let mut target = sp.target(tenant, WriteOp::Update, String::new(), None)?;
    let options = params.options()?;
    let value = match json_body(&headers, &body) {
        // `id` and `type` are not attributes: Orion takes the last one
        // given instead of refusing a duplicate.
        Err(Error(e))
            if e.description == "duplicated attribute /id/"
                || e.description == "duplicated attribute /type/" =>
        {
            serde_json::from_slice(&body).map_err(|_| NgsiError::parse_error())?
        }
        other => other?,
    };
    let entity = ngsi::parse_entity(&value, options.key_values)?;
    let location = format!("/v2/entities/{}?type={}", entity.id, entity.entity_type);
    target.id = entity.id.clone();
    target.entity_type = Some(entity.entity_type.clone());
    let (write, status) = if options.upsert {
        (Write::Upsert(entity), StatusCode::NO_CONTENT)
    } else {
        (Write::Create(entity), StatusCode::CREATED)
    };
    state
        .services
        .ngsi_writer
        .write(&target, write, options.update())
        .await?;
    Ok((status, [("location", location)]).into_response())
}

/// Orion's "Retrieve Entity" (`GET /v2/entities/{id}`).
pub async fn retrieve(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    sp: ServicePath,
    params: Params,
    Path(id): Path<String>,
) -> Result<Response> {
    check_segment(&id)?;
    let options = params.options()?;
    let attrs = params.list("attrs");
    let metadata = params.list("metadata");
    let entity = state
        .services
        .providers
        .retrieve(
            &sp.tenancy(tenant),
            &id,
            params.get("type"),
            attrs.as_deref(),
            options.skip_forwarding,
        )
        .await?;
    let body = render_entity(
        &entity,
        options.format(),
        options.attrs_with_dates(attrs).as_deref(),
        metadata.as_deref(),
    );
    Ok(json_response(&body))
}

/// Orion's "Remove Entity" (`DELETE /v2/entities/{id}`).
pub async fn remove(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    sp: ServicePath,
    params: Params,
    Path(id): Path<String>,
) -> Result<Response> {
    check_segment(&id)?;
    let target = sp.target(tenant, WriteOp::Delete, id, params.get("type"))?;
    state
        .services
        .ngsi_writer
        .write(&target, Write::Delete, Default::default())
        .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn values_sort_in_mongo_order() {
        let mut v = vec![
            json!("b"),
            json!(true),
            json!(2),
            Value::Null,
            json!("a"),
            json!(1.5),
        ];
        v.sort_by(cmp_values);
        assert_eq!(
            v,
            vec![
                Value::Null,
                json!(1.5),
                json!(2),
                json!("a"),
                json!("b"),
                json!(true)
            ]
        );
    }
}
