//! Linked entity retrieval (`join`, clause 4.5.23): the entities an
//! answer's Relationships point to, shown inside the Relationship
//! (`join=inline`: an `entity` member, or the entity itself in place of
//! the object's id with `keyValues`) or listed after the entities asked
//! for (`join=flat`), following Relationships `joinLevel` levels deep
//! (1 by default). Only Relationships the answer shows are followed; a
//! Relationship's braces in `pick`/`omit` project the entities it links
//! to ([`Projection::linked`]). A linked entity that does not exist is
//! left out, the Relationship shown as it is.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::{Map, Value};
use weft_model::ngsi::Entity;
use weft_model::ngsi_ld::entity::{self, Format, Render};
use weft_model::ngsi_ld::projection::Projection;

use super::entities::find;
use super::LdParams;
use crate::AppState;

/// How linked entities are shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Join {
    /// Inside the Relationship.
    Inline {
        /// Levels of Relationships followed.
        level: u32,
    },
    /// After the entities asked for.
    Flat {
        /// Levels of Relationships followed.
        level: u32,
    },
}

impl Join {
    /// The join `join` and `joinLevel` ask for; `None` without one (or
    /// with `@none`). [`LdParams`] checked both.
    pub fn of(params: &LdParams) -> Option<Join> {
        let level = params
            .get("joinLevel")
            .and_then(|l| l.parse().ok())
            .unwrap_or(1);
        match params.get("join") {
            Some("inline") => Some(Join::Inline { level }),
            Some("flat") => Some(Join::Flat { level }),
            _ => None,
        }
    }
}

/// What linked entities are looked up in and shown with.
pub struct Linker<'a> {
    /// Where entities are found.
    pub state: &'a AppState,
    /// The tenant they are found in.
    pub tenant: &'a str,
    /// How a linked entity is rendered (all its attributes).
    pub how: Render<'a>,
}

impl Linker<'_> {
    /// Inlines into `shown` (the rendering of `stored`) the entities its
    /// Relationships link to, `level` levels deep.
    pub fn inline(
        &self,
        stored: &Entity,
        shown: &mut Map<String, Value>,
        projection: Option<&Projection>,
        level: u32,
    ) {
        if level == 0 {
            return;
        }
        for (name, objects) in relationships(stored) {
            let key = self.how.context.from_stored(name);
            let Some(member) = shown.get_mut(&key) else {
                continue;
            };
            let inner = projection.and_then(|p| p.linked(&key));
            let mut linked: Vec<Value> = Vec::new();
            for id in &objects {
                let Some(found) = find(self.state, self.tenant, id) else {
                    continue;
                };
                let mut entity = self.render(&found.entity, inner.as_ref());
                self.inline(&found.entity, &mut entity, inner.as_ref(), level - 1);
                linked.push(Value::Object(entity));
            }
            if linked.is_empty() {
                continue;
            }
            let linked = if linked.len() == 1 && !objects_are_a_list(stored, name) {
                linked.remove(0)
            } else {
                Value::Array(linked)
            };
            match (self.how.format, member) {
                (Format::KeyValues, member) => *member = linked,
                (_, Value::Object(relationship)) => {
                    relationship.insert("entity".into(), linked);
                }
                _ => {}
            }
        }
    }

    /// The entities `roots` (stored, as shown) link to, `level` levels
    /// deep, each once and none of the roots, in the order they are met.
    pub fn flat(
        &self,
        roots: &[(&Arc<Entity>, &Map<String, Value>)],
        projection: Option<&Projection>,
        level: u32,
    ) -> Vec<Value> {
        let mut seen: HashSet<String> = roots.iter().map(|(e, _)| e.id.clone()).collect();
        let mut out = Vec::new();
        let mut frontier: Vec<Reached> = roots
            .iter()
            .map(|(e, shown)| (Arc::clone(e), (*shown).clone(), projection.cloned()))
            .collect();
        for _ in 0..level {
            let mut next = Vec::new();
            for (stored, shown, projection) in &frontier {
                for (name, objects) in relationships(stored) {
                    let key = self.how.context.from_stored(name);
                    if !shown.contains_key(&key) {
                        continue;
                    }
                    let inner = projection.as_ref().and_then(|p| p.linked(&key));
                    for id in objects {
                        if !seen.insert(id.clone()) {
                            continue;
                        }
                        let Some(found) = find(self.state, self.tenant, &id) else {
                            continue;
                        };
                        let entity = self.render(&found.entity, inner.as_ref());
                        out.push(Value::Object(entity.clone()));
                        next.push((found.entity, entity, inner.clone()));
                    }
                }
            }
            frontier = next;
        }
        out
    }

    /// A linked entity as shown: rendered, then projected.
    fn render(&self, stored: &Entity, projection: Option<&Projection>) -> Map<String, Value> {
        let mut shown = entity::render_entity(stored, &self.how);
        if let Some(p) = projection {
            p.apply(&mut shown);
        }
        shown
    }
}

/// An entity reached while following Relationships: stored, as shown,
/// and the projection of the entities it links to.
type Reached = (Arc<Entity>, Map<String, Value>, Option<Projection>);

/// The Relationships of `entity`: stored name and the ids it links to.
fn relationships(entity: &Entity) -> Vec<(&str, Vec<String>)> {
    entity
        .attrs
        .iter()
        .filter(|(name, attr)| {
            attr.attr_type == "Relationship" && !name.contains(entity::DATASET_SEPARATOR)
        })
        .filter_map(|(name, attr)| {
            let ids: Vec<String> = match &attr.value {
                Value::String(id) => vec![id.clone()],
                Value::Array(items) => items
                    .iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect(),
                _ => return None,
            };
            Some((name, ids))
        })
        .collect()
}

/// Whether the Relationship `name` of `entity` holds a list of ids.
fn objects_are_a_list(entity: &Entity, name: &str) -> bool {
    entity.attrs.get(name).is_some_and(|a| a.value.is_array())
}
