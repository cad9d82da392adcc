//! Which part of a request goes to which context provider, and how the
//! answers merge with local data, as Orion does: the part of a query or
//! an update that a registration covers is sent to its provider and the
//! answer merged into the client's response.
//!
//! - Queries (retrieve an entity, its attributes, one attribute or its
//!   value; list entities; `op/query`): every registration covering the
//!   entity (and accepting queries) gets `POST <url>/op/query` for the
//!   attributes it provides that are not local; what it returns is added
//!   to the local entity (local attributes win: Orion's "shadowing"), or
//!   becomes the entity when there is none locally. A provider that fails
//!   adds nothing: the local answer stands. `options=skipForwarding`
//!   answers from local data alone.
//! - Updates (the NGSI write's update paths, see [`crate::ngsi_write`]):
//!   an attribute the local entity lacks and a registration provides is
//!   sent as `POST <url>/op/update` with `actionType: update`; the rest is
//!   applied locally. A provider that does not apply it makes the request
//!   fail with Orion's texts.
//!
//! Providers are contacted one after the other, at most [`MAX_FORWARDS`]
//! per request, all of them within one forwarding timeout (the deadline
//! of the request's forwarding session), so a request covered by many
//! slow providers still answers in bounded time; every forward is counted
//! on its registration (`forwardingInformation`) and in Orion's metrics
//! ([`crate::orion_metrics`]). The HTTP side is [`super::Forwarder`].

use std::sync::Arc;

use serde_json::{Map, Value};
use weft_model::ngsi::registration::Registration;
use weft_model::ngsi::{render_attr, AttrMap, Entity, NgsiError};
use weft_model::now_ms;

use super::{ForwardContext, ForwardError, Forwarder, UpdateAnswer, DEFAULT_PAGE, MAX_PAGE};
use crate::context::{Context, EntityFilter, StoredEntity, Target, Tenancy, ORIGIN};
use crate::registrations::{ForwardKind, Registrations};

/// The most providers one request is forwarded to (Orion's
/// `-cprForwardLimit`): a request covered by many registrations cannot
/// turn into an unbounded fan-out.
pub const MAX_FORWARDS: usize = 100;

/// The forwards of one client request: what they repeat of it, and the
/// deadline they share. A request reaching several slow providers waits
/// for them one forwarding timeout in all, not one per provider.
struct Session {
    /// What forwarded requests repeat of the client's request.
    ctx: ForwardContext,
    /// When the last forward of this request must have been answered.
    deadline: tokio::time::Instant,
}

impl Session {
    /// A session for the request being served, starting now.
    fn start(forwarder: &Forwarder, tenancy: &Tenancy) -> Session {
        let origin = ORIGIN.try_with(|o| o.clone()).ok();
        Session {
            ctx: ForwardContext {
                service: origin.as_ref().and_then(|o| o.service.clone()),
                service_path: tenancy.received.clone(),
                auth_token: origin.as_ref().and_then(|o| o.auth_token.clone()),
                correlator: origin.map(|o| o.correlator).unwrap_or_default(),
            },
            deadline: tokio::time::Instant::now() + forwarder.timeout(),
        }
    }

    /// Runs one forward within what is left of the session's time.
    async fn within<T>(
        &self,
        forward: impl std::future::Future<Output = Result<T, ForwardError>>,
    ) -> Result<T, ForwardError> {
        tokio::time::timeout_at(self.deadline, forward)
            .await
            .unwrap_or_else(|_| Err(ForwardError::Unreachable("Timeout was reached".into())))
    }
}

/// Counts a forward in `/admin/metrics`, under the request's service and
/// service path.
fn count_outgoing(ctx: &ForwardContext, body: &Value, error: bool) {
    let keys = crate::orion_metrics::keys(ctx.service.as_deref(), ctx.service_path.as_deref());
    if let Some(keys) = keys {
        crate::orion_metrics::record_outgoing(&keys, body.to_string().len() as u64, 0, error);
    }
}

/// The entity selector sent to a provider: `{"id", "type"?}`.
fn selector(id: &str, entity_type: Option<&str>) -> Value {
    let mut out = Map::new();
    out.insert("id".into(), id.into());
    if let Some(t) = entity_type {
        out.insert("type".into(), t.into());
    }
    Value::Object(out)
}

/// The body of `op/query`: the entities, and the attributes when some are
/// named (none means all).
fn query_body(entities: Vec<Value>, attrs: Option<Vec<String>>) -> Value {
    let mut body = Map::new();
    body.insert("entities".into(), Value::Array(entities));
    if let Some(attrs) = attrs {
        body.insert(
            "attrs".into(),
            Value::Array(attrs.into_iter().map(Value::from).collect()),
        );
    }
    Value::Object(body)
}

/// The type a registration gives an entity it provides by id, when the
/// request named none.
fn registered_type(reg: &Registration, id: &str) -> Option<String> {
    reg.entities
        .iter()
        .find(|e| e.id.as_deref() == Some(id))
        .and_then(|e| e.entity_type.clone())
}

/// Adds `from`'s attributes that `into` lacks (restricted to `wanted`
/// when given): the provider's part of an entity.
fn merge_attrs(into: &mut Entity, from: Entity, wanted: Option<&[String]>) {
    for (name, attr) in from.attrs {
        if into.attrs.contains_key(&name) || wanted.is_some_and(|w| !w.contains(&name)) {
            continue;
        }
        into.attrs.insert(name, attr);
    }
}

/// The entity selectors of a listing that a registration's selector
/// reaches: a registered id that the filter admits, or, for an `.*`
/// registration, the filter's own ids or pattern.
fn listing_selectors(reg: &Registration, filter: &EntityFilter) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    let single_type = match filter.types.as_slice() {
        [one] => Some(one.as_str()),
        _ => None,
    };
    for sel in &reg.entities {
        let type_ok = match &sel.entity_type {
            Some(t) => {
                (filter.types.is_empty() || filter.types.contains(t))
                    && filter.type_pattern.as_ref().is_none_or(|p| p.is_match(t))
            }
            None => true,
        };
        if !type_ok {
            continue;
        }
        let etype = sel.entity_type.as_deref().or(single_type);
        let mut push = |v: Value| {
            if !out.contains(&v) {
                out.push(v);
            }
        };
        match &sel.id {
            Some(id) => {
                if (filter.ids.is_empty() || filter.ids.contains(id))
                    && filter.id_pattern.as_ref().is_none_or(|p| p.is_match(id))
                {
                    push(selector(id, etype));
                }
            }
            None if !filter.ids.is_empty() => {
                for id in &filter.ids {
                    push(selector(id, etype));
                }
            }
            None => {
                let mut v = Map::new();
                let pattern = filter.id_pattern.as_ref().map_or(".*", |p| p.as_str());
                v.insert("idPattern".into(), pattern.into());
                if let Some(t) = etype {
                    v.insert("type".into(), t.into());
                }
                push(Value::Object(v));
            }
        }
    }
    out
}

/// What forwarding did with the attributes of an update.
#[derive(Debug, Default)]
pub struct ForwardedUpdate {
    /// The attributes sent to providers.
    pub sent: Vec<String>,
    /// Those a provider did not apply (or could not be reached for).
    pub failed: Vec<String>,
}

impl ForwardedUpdate {
    /// Whether anything was forwarded.
    pub fn any(&self) -> bool {
        !self.sent.is_empty()
    }

    /// Orion's error for the failed attributes, if any: 404 NotFound when
    /// nothing at all was applied (`applied_locally` false and every
    /// forward failed), 404 PartialUpdate naming them otherwise.
    pub fn error(
        &self,
        id: &str,
        entity_type: Option<&str>,
        applied_locally: bool,
    ) -> Option<NgsiError> {
        if self.failed.is_empty() {
            return None;
        }
        if !applied_locally && self.failed.len() == self.sent.len() {
            return Some(NgsiError::new(
                404,
                "NotFound",
                "The requested entity has not been found. Check type and id",
            ));
        }
        Some(NgsiError::new(
            404,
            "PartialUpdate",
            format!(
                "Some of the following attributes were not updated: {{ {id}-{} : [{}] }}",
                entity_type.unwrap_or(""),
                self.failed.join(", ")
            ),
        ))
    }
}

/// Forwarding's decisions: which providers a request reaches, what each
/// is sent, and how their answers merge with the local entities.
pub struct Providers {
    context: Arc<Context>,
    registrations: Arc<Registrations>,
    forwarder: Arc<Forwarder>,
}

impl Providers {
    /// Providers found in `registrations`, reached through `forwarder`,
    /// completing the entities of `context`.
    pub fn new(
        context: Arc<Context>,
        registrations: Arc<Registrations>,
        forwarder: Arc<Forwarder>,
    ) -> Providers {
        Providers {
            context,
            registrations,
            forwarder,
        }
    }

    /// Sends one query to `reg`'s provider and counts it; the entities it
    /// returned, nothing when it failed.
    async fn query_provider(
        &self,
        tenant: &str,
        reg: &Registration,
        session: &Session,
        seq: usize,
        body: &Value,
        limit: Option<usize>,
    ) -> Vec<Entity> {
        let forward = self
            .forwarder
            .query(&reg.provider.url, &session.ctx, seq, body, limit);
        let answer = session.within(forward).await;
        count_outgoing(&session.ctx, body, answer.is_err());
        self.registrations
            .record_forward(tenant, &reg.id, answer.is_ok(), now_ms());
        answer.unwrap_or_else(|e| {
            tracing::warn!(registration = %reg.id, url = %reg.provider.url, error = %e, "forwarded query failed");
            Vec::new()
        })
    }

    /// One entity as local data and the providers covering it give it
    /// (retrieve, `…/attrs`, `…/attrs/{a}`, `…/value`): `local` completed
    /// with the attributes of `wanted` (all when `None`) it lacks, or built
    /// from the providers when there is no local entity. `None` when neither
    /// has it.
    pub async fn complete_entity(
        &self,
        tenancy: &Tenancy,
        id: &str,
        entity_type: Option<&str>,
        wanted: Option<&[String]>,
        local: Option<Entity>,
    ) -> Option<Entity> {
        let match_type = entity_type
            .map(str::to_string)
            .or_else(|| local.as_ref().map(|e| e.entity_type.clone()));
        let tenant = tenancy.tenant.as_str();
        let regs = self.registrations.providers(
            tenant,
            &tenancy.read_paths,
            id,
            match_type.as_deref(),
            ForwardKind::Query,
            now_ms(),
        );
        if regs.is_empty() {
            return local;
        }
        let session = Session::start(&self.forwarder, tenancy);
        let mut merged = local;
        for (seq, reg) in regs.iter().take(MAX_FORWARDS).enumerate() {
            let attrs = match reg.provided(wanted) {
                // Attributes the local entity has are not asked for.
                Some(list) => {
                    let missing: Vec<String> = list
                        .into_iter()
                        .filter(|a| merged.as_ref().is_none_or(|e| !e.attrs.contains_key(a)))
                        .collect();
                    if missing.is_empty() {
                        continue;
                    }
                    Some(missing)
                }
                None => None,
            };
            let etype = match_type.clone().or_else(|| registered_type(reg, id));
            let body = query_body(vec![selector(id, etype.as_deref())], attrs.clone());
            for remote in self
                .query_provider(tenant, reg, &session, seq + 1, &body, None)
                .await
            {
                if remote.id != id || etype.as_deref().is_some_and(|t| t != remote.entity_type) {
                    continue;
                }
                let only = attrs.as_deref().or(wanted);
                match &mut merged {
                    Some(e) => merge_attrs(e, remote, only),
                    None => {
                        let mut e = Entity::new(remote.id.clone(), remote.entity_type.clone());
                        merge_attrs(&mut e, remote, only);
                        merged = Some(e);
                    }
                }
            }
        }
        merged
    }

    /// Looks an entity up for a retrieve: the local one completed by the
    /// providers (unless `skip`, `options=skipForwarding`), Orion's 404 when
    /// neither has it, and the context's other errors (409 for an ambiguous
    /// id) as they are.
    pub async fn retrieve(
        &self,
        tenancy: &Tenancy,
        id: &str,
        entity_type: Option<&str>,
        wanted: Option<&[String]>,
        skip: bool,
    ) -> Result<StoredEntity, NgsiError> {
        self.context
            .catch_up(&tenancy.tenant, &tenancy.read_paths, id, entity_type)
            .await;
        let (local, missing) =
            match self
                .context
                .get(&tenancy.tenant, &tenancy.read_paths, id, entity_type)
            {
                Ok(found) => (Some(found), None),
                Err(e) if e.status == 404 => (None, Some(e)),
                Err(e) => return Err(e),
            };
        let found = if skip {
            local
        } else {
            // Where the local entity lives stays; one only a provider has is
            // shown at `/`, as listings show provider-only entities.
            let (service_path, created) = local
                .as_ref()
                .map(|l| (l.service_path.clone(), l.created))
                .unwrap_or_else(|| ("/".to_string(), u64::MAX));
            let entity = local.map(|l| Arc::unwrap_or_clone(l.entity));
            self.complete_entity(tenancy, id, entity_type, wanted, entity)
                .await
                .map(|entity| StoredEntity {
                    service_path,
                    entity: Arc::new(entity),
                    created,
                })
        };
        match (found, missing) {
            (Some(e), _) => Ok(e),
            (None, Some(e)) => Err(e),
            (None, None) => Err(NgsiError::new(
                404,
                "NotFound",
                "The requested entity has not been found. Check type and id",
            )),
        }
    }

    /// The entities the providers give for a listing (`GET /v2/entities`,
    /// `POST /v2/op/query`): each registration accepting queries under the
    /// request's service paths is asked once, for the entities of `filters`
    /// it covers and the attributes of `wanted` it provides (or, when it
    /// provides none of them, `wanted` itself), and for `needed` entities
    /// (offset plus limit of the page) when that is more than a provider's
    /// default page. `q`, `mq` and geo
    /// filters are neither forwarded nor applied to what comes back, as in
    /// Orion.
    pub async fn listing_entities(
        &self,
        tenancy: &Tenancy,
        filters: &[EntityFilter],
        wanted: Option<&[String]>,
        needed: usize,
    ) -> Vec<Entity> {
        // A page that reaches past the provider's default page asks for
        // what it needs (a provider's entities come after the local ones).
        let limit = (needed > DEFAULT_PAGE).then(|| needed.min(MAX_PAGE));
        let now = now_ms();
        let tenant = tenancy.tenant.as_str();
        let regs = self
            .registrations
            .query_providers(tenant, &tenancy.read_paths, now);
        if regs.is_empty() {
            return Vec::new();
        }
        let session = Session::start(&self.forwarder, tenancy);
        let mut found: Vec<Entity> = Vec::new();
        let mut seq = 0;
        for reg in &regs {
            if seq >= MAX_FORWARDS {
                break;
            }
            let mut selectors: Vec<Value> = Vec::new();
            for f in filters {
                for s in listing_selectors(reg, f) {
                    if !selectors.contains(&s) {
                        selectors.push(s);
                    }
                }
            }
            if selectors.is_empty() {
                continue;
            }
            // A provider registered for other attributes than those asked
            // for is still asked (with the request's list): its entities are
            // listed, without attributes, as Orion lists them.
            let attrs = match reg.provided(wanted) {
                Some(list) if list.is_empty() => wanted.map(<[String]>::to_vec),
                other => other,
            };
            seq += 1;
            let body = query_body(selectors, attrs.clone());
            for remote in self
                .query_provider(tenant, reg, &session, seq, &body, limit)
                .await
            {
                let only = attrs.as_deref();
                match found
                    .iter_mut()
                    .find(|e| e.id == remote.id && e.entity_type == remote.entity_type)
                {
                    Some(e) => merge_attrs(e, remote, only),
                    None => {
                        let mut e = Entity::new(remote.id.clone(), remote.entity_type.clone());
                        merge_attrs(&mut e, remote, only);
                        found.push(e);
                    }
                }
            }
        }
        found
    }

    /// Whether an update of `target` may reach a provider at all: a cheap
    /// look at the registrations, so that updates nobody registered for (the
    /// usual case) cost no extra lookup of the local entity.
    pub fn may_forward_update(&self, target: &Target) -> bool {
        !self
            .registrations
            .providers(
                &target.tenancy.tenant,
                std::slice::from_ref(&target.path),
                &target.id,
                target.entity_type.as_deref(),
                ForwardKind::Update,
                now_ms(),
            )
            .is_empty()
    }

    /// Forwards the attributes of an update of `target` that `local` (the
    /// local entity, if any) lacks and a registration accepting updates
    /// provides; they are taken out of `attrs`, which keeps what is applied
    /// locally. One `op/update` per provider.
    pub async fn update(
        &self,
        target: &Target,
        attrs: &mut AttrMap,
        local: Option<&Entity>,
    ) -> ForwardedUpdate {
        let tenant = target.tenancy.tenant.as_str();
        let id = target.id.as_str();
        let mut outcome = ForwardedUpdate::default();
        let match_type = target
            .entity_type
            .clone()
            .or_else(|| local.map(|e| e.entity_type.clone()));
        let regs = self.registrations.providers(
            tenant,
            std::slice::from_ref(&target.path),
            id,
            match_type.as_deref(),
            ForwardKind::Update,
            now_ms(),
        );
        if regs.is_empty() {
            return outcome;
        }
        // Each attribute the local entity lacks goes to the first
        // registration providing it.
        let mut batches: Vec<(usize, Map<String, Value>)> = Vec::new();
        let names: Vec<String> = attrs.keys().map(str::to_string).collect();
        for name in names {
            if local.is_some_and(|e| e.attrs.contains_key(&name)) {
                continue;
            }
            let wanted = [name.clone()];
            let Some(at) = regs
                .iter()
                .position(|r| r.provided(Some(&wanted)).is_some_and(|p| !p.is_empty()))
            else {
                continue;
            };
            let Some(attr) = attrs.remove(&name) else {
                continue;
            };
            let rendered = render_attr(&attr, None);
            match batches.iter_mut().find(|(i, _)| *i == at) {
                Some((_, batch)) => {
                    batch.insert(name.clone(), rendered);
                }
                None => {
                    let mut batch = Map::new();
                    batch.insert(name.clone(), rendered);
                    batches.push((at, batch));
                }
            }
            outcome.sent.push(name);
        }
        let session = Session::start(&self.forwarder, &target.tenancy);
        for (seq, (at, batch)) in batches.into_iter().take(MAX_FORWARDS).enumerate() {
            let reg = &regs[at];
            let etype = match_type.clone().or_else(|| registered_type(reg, id));
            let mut entity = match selector(id, etype.as_deref()) {
                Value::Object(m) => m,
                _ => Map::new(),
            };
            let names: Vec<String> = batch.keys().cloned().collect();
            entity.extend(batch);
            let body =
                serde_json::json!({"actionType": "update", "entities": [Value::Object(entity)]});
            let forward = self
                .forwarder
                .update(&reg.provider.url, &session.ctx, seq + 1, &body);
            let answer = session.within(forward).await;
            let ok = matches!(answer, Ok(UpdateAnswer::Applied));
            count_outgoing(&session.ctx, &body, answer.is_err());
            self.registrations
                .record_forward(tenant, &reg.id, answer.is_ok(), now_ms());
            if !ok {
                tracing::warn!(registration = %reg.id, url = %reg.provider.url, answer = ?answer, "forwarded update not applied");
                outcome.failed.extend(names);
            }
        }
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn reg(body: Value) -> Registration {
        Registration::parse(&body, "r".into()).unwrap()
    }

    #[test]
    fn listing_selectors_follow_the_filter() {
        let by_id = reg(json!({
            "dataProvided": {"entities": [{"id": "E1", "type": "T"}], "attrs": ["A"]},
            "provider": {"http": {"url": "http://cp"}}
        }));
        let filter = |ids: &[&str], types: &[&str]| EntityFilter {
            ids: ids.iter().map(|s| s.to_string()).collect(),
            types: types.iter().map(|s| s.to_string()).collect(),
            ..EntityFilter::default()
        };
        assert_eq!(
            listing_selectors(&by_id, &filter(&[], &[])),
            [json!({"id": "E1", "type": "T"})]
        );
        assert!(listing_selectors(&by_id, &filter(&["E2"], &[])).is_empty());
        assert!(listing_selectors(&by_id, &filter(&[], &["U"])).is_empty());
        let any = reg(json!({
            "dataProvided": {"entities": [{"idPattern": ".*", "type": "T"}]},
            "provider": {"http": {"url": "http://cp"}}
        }));
        assert_eq!(
            listing_selectors(&any, &filter(&[], &["T"])),
            [json!({"idPattern": ".*", "type": "T"})]
        );
        assert_eq!(
            listing_selectors(&any, &filter(&["X", "Y"], &[])),
            [
                json!({"id": "X", "type": "T"}),
                json!({"id": "Y", "type": "T"})
            ]
        );
    }

    #[test]
    fn update_errors_are_orions() {
        let all = ForwardedUpdate {
            sent: vec!["A".into()],
            failed: vec!["A".into()],
        };
        assert_eq!(all.error("E", Some("T"), false).unwrap().status, 404);
        assert_eq!(all.error("E", Some("T"), false).unwrap().error, "NotFound");
        let some = all.error("E", Some("T"), true).unwrap();
        assert_eq!(
            (some.status, some.error, some.description.as_str()),
            (
                404,
                "PartialUpdate",
                "Some of the following attributes were not updated: { E-T : [A] }"
            )
        );
        assert!(ForwardedUpdate::default().error("E", None, false).is_none());
    }
}
