//! The NGSI write: every change a client makes to entities through
//! Orion's API, as one typed operation ([`Write`]) run by one service
//! ([`NgsiWriter`]). The NGSI surface parses a request into a [`Write`],
//! calls [`NgsiWriter::write`] (or [`NgsiWriter::batch`]) and renders what
//! comes back; it decides nothing itself.
//!
//! A write goes through these steps, each in one place:
//!
//! 1. **Commands.** Attributes that are commands of a device's entity
//!    (its device type declares them) are taken out of the write, on every
//!    path that writes attributes of an existing entity (append, update,
//!    one attribute, one value, upsert, the batch actions that do these),
//!    as the IoT Agents take them from Orion. A write carrying only
//!    commands needs the entity to exist.
//! 2. **Forwarding.** On the update paths (update, one attribute, one
//!    value), attributes the local entity lacks and a registration
//!    provides go to their context provider ([`crate::forwarding`]).
//! 3. **Operators and stamps.** Update operators (`{"$inc": 1}`) are
//!    resolved against the entity's current values (or against nothing,
//!    for a creation or a replace) and creations are stamped, under the
//!    context's lock.
//! 4. **The write**, atomic in the context ([`Context::modify`],
//!    [`Context::upsert`], [`Context::create`], [`Context::delete`]):
//!    stored before it returns; an upsert cannot turn into a 404 or a 422
//!    under a concurrent delete or create.
//! 5. **The commands sent** as downlinks, once the local part is written.
//! 6. **The announcement** of the change to subscriptions, history and
//!    other nodes, made by the context as it commits.
//!
//! What failed is reported the way Orion reports it: [`NgsiWriter::write`]
//! gives the single-entity texts, [`NgsiWriter::batch`] the `op/update`
//! ones.

mod batch;
#[cfg(test)]
mod tests;

pub use batch::{BatchAction, BatchItem};

use std::sync::Arc;

use serde_json::Value;
use weft_model::ngsi::{
    self, operators, AttrMap, Attribute, Entity, NgsiError, UpdateOptions, UpdateOutcome,
};
use weft_model::now_ms;

use crate::context::{Context, Target, Upserted};
use crate::downlinks::{DownlinkError, Downlinks};
use crate::forwarding::{ForwardedUpdate, Providers};

/// One change to one entity, as a client asks for it.
#[derive(Debug, Clone)]
pub enum Write {
    /// Create the entity; 422 `Already Exists` if it does
    /// (`POST /v2/entities`).
    Create(Entity),
    /// Append the entity's attributes to it, or create it when there is
    /// none (`POST /v2/entities?options=upsert`, batch `append` and
    /// `appendStrict`).
    Upsert(Entity),
    /// Add attributes to the entity, updating those it has (or refusing
    /// them, with `append_strict`): `POST /v2/entities/{id}/attrs`.
    Append(AttrMap),
    /// Update attributes the entity has: `PATCH /v2/entities/{id}/attrs`,
    /// batch `update`.
    Update(AttrMap),
    /// Replace all of the entity's attributes: `PUT
    /// /v2/entities/{id}/attrs`, batch `replace`.
    Replace(AttrMap),
    /// Update one attribute the entity has: `PUT …/attrs/{name}`.
    UpdateAttr {
        /// The attribute's name.
        name: String,
        /// Its new content.
        attr: Attribute,
    },
    /// Set the value of one attribute the entity has: `PUT
    /// …/attrs/{name}/value`.
    SetValue {
        /// The attribute's name.
        name: String,
        /// Its new value (or an update operator).
        value: Value,
    },
    /// Remove one attribute; 404 if the entity lacks it: `DELETE
    /// …/attrs/{name}`.
    DeleteAttr(String),
    /// Remove attributes; those the entity lacks are refused (batch
    /// `delete` naming attributes).
    DeleteAttrs(Vec<String>),
    /// Remove the entity: `DELETE /v2/entities/{id}`, batch `delete`
    /// naming none.
    Delete,
}

/// What a write did.
#[derive(Debug, Default)]
pub struct Written {
    /// The entity was created (a create, or an upsert that found none).
    pub created: bool,
    /// Whether a local write ran (not when everything went to providers
    /// or was a command).
    pub applied_locally: bool,
    /// The local write's outcome: the attributes touched and those
    /// refused (missing for an update or a delete, existing for a strict
    /// append) out of how many it carried.
    pub outcome: UpdateOutcome,
    /// What went to context providers.
    pub forwarded: ForwardedUpdate,
}

impl Written {
    /// Whether nothing at all was applied: every attribute was refused,
    /// locally or by its provider.
    fn nothing_applied(&self) -> bool {
        self.outcome.failed.len() >= self.outcome.requested
            && self.forwarded.failed.len() >= self.forwarded.sent.len()
    }

    /// The attributes refused, locally then by providers.
    fn refused(&self) -> Vec<String> {
        let mut all = self.outcome.failed.clone();
        all.extend(self.forwarded.failed.iter().cloned());
        all
    }
}

/// The one way NGSI writes reach the context: commands, forwarding,
/// operators and stamps, then the atomic write.
pub struct NgsiWriter {
    context: Arc<Context>,
    downlinks: Arc<Downlinks>,
    providers: Arc<Providers>,
}

impl NgsiWriter {
    /// A writer of `context`'s entities, taking commands out for
    /// `downlinks` and forwarding to `providers`.
    pub fn new(
        context: Arc<Context>,
        downlinks: Arc<Downlinks>,
        providers: Arc<Providers>,
    ) -> NgsiWriter {
        NgsiWriter {
            context,
            downlinks,
            providers,
        }
    }

    /// Runs one write on the entity `target` names, with Orion's
    /// single-entity errors: what the local write refused (Unprocessable,
    /// or PartialUpdate when some was applied), then what providers did
    /// not apply (NotFound or PartialUpdate).
    pub async fn write(
        &self,
        target: &Target,
        write: Write,
        opts: UpdateOptions,
    ) -> Result<Written, NgsiError> {
        let check_existing = matches!(write, Write::Append(_));
        let check_missing = matches!(write, Write::Update(_));
        let written = self.apply(target, write, opts).await?;
        let (id, etype) = (target.id.as_str(), target.entity_type.as_deref());
        let refused = if check_existing {
            written.outcome.existing_error(id, etype)
        } else if check_missing {
            written.outcome.missing_error(id, etype)
        } else {
            None
        };
        if let Some(e) = refused {
            return Err(e);
        }
        if let Some(e) = written.forwarded.error(id, etype, written.applied_locally) {
            return Err(e);
        }
        Ok(written)
    }

    /// Runs one write and reports everything it did, refusals included,
    /// for the caller to judge: the steps of the module's documentation.
    /// [`NgsiWriter::write`] turns refusals into Orion's errors; NGSI-LD
    /// reports them in a 207 instead.
    pub async fn apply(
        &self,
        target: &Target,
        write: Write,
        opts: UpdateOptions,
    ) -> Result<Written, NgsiError> {
        let context = &self.context;
        let tenant = target.tenancy.tenant.as_str();
        let paths = std::slice::from_ref(&target.path);
        let (id, etype) = (target.id.as_str(), target.entity_type.as_deref());
        let now = now_ms();
        let locally = |outcome: UpdateOutcome| Written {
            applied_locally: true,
            outcome,
            ..Written::default()
        };
        match write {
            Write::Create(mut entity) => {
                prepare_new(&mut entity, now)?;
                context
                    .create_with(tenant, &target.path, entity, opts.unique_id)
                    .await?;
                Ok(Written {
                    created: true,
                    ..locally(UpdateOutcome::default())
                })
            }
            Write::Delete => {
                context.delete(tenant, paths, id, etype).await?;
                Ok(locally(UpdateOutcome::default()))
            }
            Write::DeleteAttr(name) => {
                let change = self
                    .modify(target, |e| ngsi::delete_attr(e, &name, now))
                    .await?;
                Ok(locally(UpdateOutcome {
                    changes: vec![change],
                    failed: Vec::new(),
                    requested: 1,
                }))
            }
            Write::DeleteAttrs(names) => {
                let outcome = self
                    .modify(target, |e| {
                        let mut outcome = UpdateOutcome {
                            requested: names.len(),
                            ..UpdateOutcome::default()
                        };
                        for name in names {
                            match ngsi::delete_attr(e, &name, now) {
                                Ok(change) => outcome.changes.push(change),
                                Err(_) => outcome.failed.push(name),
                            }
                        }
                        Ok(outcome)
                    })
                    .await?;
                Ok(locally(outcome))
            }
            Write::Replace(mut attrs) => {
                let outcome = self
                    .modify(target, |e| {
                        operators::resolve_operators(None, &mut attrs)?;
                        Ok(ngsi::replace(e, attrs, opts, now))
                    })
                    .await?;
                Ok(locally(outcome))
            }
            Write::Upsert(mut entity) => {
                let commands = self.take_commands(target, &mut entity.attrs);
                if !commands.is_empty() && entity.attrs.is_empty() {
                    return self.commands_only(target, commands).await;
                }
                let done = context
                    .upsert(
                        tenant,
                        &target.path,
                        etype,
                        entity,
                        |new| prepare_new(new, now),
                        |e, mut attrs| {
                            operators::resolve_operators(Some(e), &mut attrs)?;
                            Ok(ngsi::append(e, attrs, opts, now))
                        },
                    )
                    .await?;
                self.send_commands(id, commands).await?;
                Ok(match done {
                    Upserted::Created => Written {
                        created: true,
                        ..locally(UpdateOutcome::default())
                    },
                    Upserted::Modified(outcome) => locally(outcome),
                })
            }
            Write::Append(attrs) => self.write_attrs(target, attrs, false, opts).await,
            Write::Update(attrs) => self.write_attrs(target, attrs, true, opts).await,
            Write::UpdateAttr { name, attr } => {
                self.write_one(target, name, One::Attr(attr), opts).await
            }
            Write::SetValue { name, value } => {
                self.write_one(target, name, One::Value(value), opts).await
            }
        }
    }

    /// An append (`update` false) or an update of several attributes of
    /// an existing entity: commands, forwarding (updates only), then the
    /// local write.
    async fn write_attrs(
        &self,
        target: &Target,
        mut attrs: AttrMap,
        update: bool,
        opts: UpdateOptions,
    ) -> Result<Written, NgsiError> {
        let commands = self.take_commands(target, &mut attrs);
        if !commands.is_empty() && attrs.is_empty() {
            return self.commands_only(target, commands).await;
        }
        let mut written = Written::default();
        if update && self.providers.may_forward_update(target) {
            let local = self.local_entity(target)?;
            written.forwarded = self
                .providers
                .update(target, &mut attrs, local.as_ref())
                .await;
            if written.forwarded.any() && attrs.is_empty() {
                return Ok(written);
            }
        }
        let now = now_ms();
        written.outcome = self
            .modify(target, |e| {
                operators::resolve_operators(Some(e), &mut attrs)?;
                Ok(if update {
                    ngsi::update(e, attrs, opts, now)
                } else {
                    ngsi::append(e, attrs, opts, now)
                })
            })
            .await?;
        written.applied_locally = true;
        self.send_commands(&target.id, commands).await?;
        Ok(written)
    }

    /// An update of one attribute the entity has (`PUT …/attrs/{name}`
    /// and `…/value`): a command, a forward when the entity lacks it and a
    /// provider has it, or the local write (404 when it lacks it).
    async fn write_one(
        &self,
        target: &Target,
        name: String,
        one: One,
        opts: UpdateOptions,
    ) -> Result<Written, NgsiError> {
        // What a command or a provider gets: the attribute, or the value
        // with the type a new attribute of it would have (an operator
        // stays as it is; the local write resolves it).
        let as_attr = match &one {
            One::Attr(attr) => attr.clone(),
            One::Value(value) => {
                ngsi::parse_attr(&name, &serde_json::json!({ "value": value.clone() }))?
            }
        };
        let mut attrs = AttrMap::new();
        attrs.insert(name.as_str(), as_attr);
        let commands = self.take_commands(target, &mut attrs);
        if !commands.is_empty() {
            return self.commands_only(target, commands).await;
        }
        if self.providers.may_forward_update(target) {
            let local = self.local_entity(target)?;
            if !local.as_ref().is_some_and(|e| e.attrs.contains_key(&name)) {
                let forwarded = self
                    .providers
                    .update(target, &mut attrs, local.as_ref())
                    .await;
                if forwarded.any() {
                    return Ok(Written {
                        forwarded,
                        ..Written::default()
                    });
                }
            }
        }
        let now = now_ms();
        let change = self
            .modify(target, |e| match one {
                One::Attr(mut attr) => {
                    if !operators::resolve_attr(e.attrs.get(&name), &mut attr)? {
                        return Err(NgsiError::attribute_not_found());
                    }
                    ngsi::update_attr(e, &name, attr, opts, now)
                }
                One::Value(value) => {
                    let value = if operators::is_operator(&value) {
                        let current = e.attrs.get(&name).map(|a| &a.value);
                        match operators::apply(current, &value)? {
                            operators::Resolved::Value(v) => v,
                            operators::Resolved::Skip => {
                                return Err(NgsiError::attribute_not_found())
                            }
                        }
                    } else {
                        value
                    };
                    ngsi::set_attr_value(e, &name, value, opts, now)
                }
            })
            .await?;
        Ok(Written {
            applied_locally: true,
            outcome: UpdateOutcome {
                changes: vec![change],
                failed: Vec::new(),
                requested: 1,
            },
            ..Written::default()
        })
    }

    /// Changes the entity `target` names ([`Context::modify`]).
    async fn modify<T: crate::context::Touched>(
        &self,
        target: &Target,
        change: impl FnOnce(&mut Entity) -> Result<T, NgsiError>,
    ) -> Result<T, NgsiError> {
        self.context
            .modify(
                &target.tenancy.tenant,
                std::slice::from_ref(&target.path),
                &target.id,
                target.entity_type.as_deref(),
                change,
            )
            .await
    }

    /// The command attributes of a device's entity, taken out of `attrs`.
    fn take_commands(&self, target: &Target, attrs: &mut AttrMap) -> Vec<(String, Value)> {
        self.downlinks.take_commands(
            &target.tenancy.tenant,
            &target.path,
            &target.id,
            target.entity_type.as_deref(),
            attrs,
        )
    }

    /// A write that carried only commands: sent if the entity exists.
    async fn commands_only(
        &self,
        target: &Target,
        commands: Vec<(String, Value)>,
    ) -> Result<Written, NgsiError> {
        self.local_entity(target)?
            .ok_or_else(NgsiError::entity_not_found)?;
        self.send_commands(&target.id, commands).await?;
        Ok(Written::default())
    }

    /// Queues the commands as downlinks to the device (`<command>_status`
    /// becomes `PENDING`); a command the device type's codec cannot
    /// encode is a 422 with the codec's words.
    async fn send_commands(
        &self,
        device_id: &str,
        commands: Vec<(String, Value)>,
    ) -> Result<(), NgsiError> {
        if commands.is_empty() {
            return Ok(());
        }
        self.downlinks
            .send_commands(device_id, commands)
            .await
            .map_err(|e| match e {
                DownlinkError::UnknownDevice(_) => NgsiError::entity_not_found(),
                DownlinkError::Encode { description, .. } => {
                    NgsiError::new(422, "Unprocessable", description)
                }
                DownlinkError::Busy => NgsiError::new(
                    503,
                    "ServiceUnavailable",
                    "the script engine is busy, retry later",
                ),
                DownlinkError::Store(e) => {
                    NgsiError::new(500, "InternalServerError", e.to_string())
                }
            })
    }

    /// The entity `target` names, if it exists locally (409 and other
    /// errors than 404 are returned as they are).
    fn local_entity(&self, target: &Target) -> Result<Option<Entity>, NgsiError> {
        match self.context.get(
            &target.tenancy.tenant,
            std::slice::from_ref(&target.path),
            &target.id,
            target.entity_type.as_deref(),
        ) {
            Ok(found) => Ok(Some(Arc::unwrap_or_clone(found.entity))),
            Err(e) if e.status == 404 => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// The new content of one attribute: the whole attribute (`PUT
/// …/attrs/{name}`) or its value alone (`…/value`, which keeps the type
/// and metadata).
enum One {
    Attr(Attribute),
    Value(Value),
}

/// Makes a new entity of a request ready to be stored: its operators
/// resolved against nothing (`{"$inc": 2}` is 2) and its dates stamped.
fn prepare_new(entity: &mut Entity, now: i64) -> Result<(), NgsiError> {
    operators::resolve_operators(None, &mut entity.attrs)?;
    entity.stamp_created(now);
    Ok(())
}
