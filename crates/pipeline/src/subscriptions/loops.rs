//! Self-notification loop protection: weft never notifies itself (or
//! another broker that notifies it back) into a loop.
//!
//! Every notification carries the correlator of the request that caused
//! it with `; cbnotif=<n>` appended, as Orion's do; a request made by a
//! notification therefore carries one `cbnotif` mark per hop. Two rules
//! stop a loop:
//!
//! 1. **Orion's rule.** A change made by a custom notification
//!    (`Ngsiv2-AttrsFormat: custom`) to an entity whose previous change
//!    came from the same correlator root (the correlator up to its first
//!    `;`) triggers no subscription: the update is applied, and Orion's
//!    warning is logged ("Notification loop detected for entity id <id>
//!    type <type>, skipping subscription triggering"). A subscription
//!    that writes back into the entity it watches (through
//!    `/v2/entities/<id>/attrs` or `/v2/op/update`) thus sends exactly one
//!    notification per outside change, as on Orion.
//! 2. **A depth limit** (weft's own, beyond Orion): a change made by a
//!    request whose correlator carries [`MAX_NOTIFICATION_DEPTH`] or more
//!    `cbnotif` marks triggers no subscription. This stops the loops
//!    Orion's rule does not see: notifications that are not custom
//!    (`ngsi` patches to `/v2/op/notify`), chains through other brokers,
//!    and a loop whose hops land on different nodes of a cluster (the
//!    entities' last correlators are known per node).
//!
//! Both are counted in `weft_notification_loops_total{rule}`.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use parking_lot::Mutex;

use crate::context::{Alteration, EntityChange};

/// The deepest notification weft sends: a change made by a request that
/// is itself the `MAX_NOTIFICATION_DEPTH`-th notification of a chain
/// (its correlator carrying that many `; cbnotif=` marks) notifies no one.
pub const MAX_NOTIFICATION_DEPTH: usize = 16;

/// Why a change triggers no subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loop {
    /// Orion's rule: a custom notification changed an entity whose last
    /// change came from the same correlator root.
    SameCorrelator,
    /// The request was this many notifications deep.
    TooDeep(usize),
}

/// The last correlator root seen per entity, by hash: 16 bytes per entity
/// changed through the API (changes from device data, which carry no
/// correlator, and deletions forget the entity).
#[derive(Default)]
pub struct LoopGuard {
    last: Mutex<HashMap<u64, u64>>,
}

fn hash_of(parts: &[&str]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for part in parts {
        part.hash(&mut h);
    }
    h.finish()
}

impl LoopGuard {
    /// Notes `change` as its entity's last and answers whether it must
    /// trigger no subscription. Called for every change, in order.
    pub fn check(&self, change: &EntityChange) -> Option<Loop> {
        let entity = hash_of(&[
            &change.tenant,
            &change.service_path,
            &change.entity.id,
            &change.entity.entity_type,
        ]);
        let Some(origin) = &change.origin else {
            self.last.lock().remove(&entity);
            return None;
        };
        let root = hash_of(&[origin.correlator_root()]);
        let previous = if change.alteration == Alteration::Deleted {
            self.last.lock().remove(&entity)
        } else {
            self.last.lock().insert(entity, root)
        };
        let depth = origin.notification_depth();
        let verdict = if origin.custom_notification && previous == Some(root) {
            Some(Loop::SameCorrelator)
        } else if depth >= MAX_NOTIFICATION_DEPTH {
            Some(Loop::TooDeep(depth))
        } else {
            None
        };
        match verdict {
            Some(Loop::SameCorrelator) => {
                metrics::counter!("weft_notification_loops_total", "rule" => "correlator")
                    .increment(1);
                tracing::warn!(
                    correlator = %origin.correlator,
                    "Notification loop detected for entity id <{}> type <{}>, skipping subscription triggering",
                    change.entity.id,
                    change.entity.entity_type
                );
            }
            Some(Loop::TooDeep(depth)) => {
                metrics::counter!("weft_notification_loops_total", "rule" => "depth").increment(1);
                tracing::warn!(
                    correlator = %origin.correlator,
                    depth,
                    max = MAX_NOTIFICATION_DEPTH,
                    "Notification chain too deep for entity id <{}> type <{}>, skipping subscription triggering",
                    change.entity.id,
                    change.entity.entity_type
                );
            }
            None => {}
        }
        verdict
    }

    /// Entities remembered (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.last.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::Origin;
    use weft_model::ngsi::Entity;

    fn change(id: &str, alteration: Alteration, origin: Option<Origin>) -> EntityChange {
        EntityChange {
            tenant: String::new(),
            service_path: "/".into(),
            entity: Entity::new(id, "T").into(),
            alteration,
            attrs: Vec::new(),
            origin,
        }
    }

    fn origin(correlator: &str, custom: bool) -> Option<Origin> {
        Some(Origin {
            correlator: correlator.into(),
            custom_notification: custom,
            ..Origin::default()
        })
    }

    /// A custom notification writing back into the entity whose change it
    /// reports is a loop; the same write from anyone else is not.
    #[test]
    fn orions_rule() {
        let g = LoopGuard::default();
        let updated = Alteration::Updated;
        assert_eq!(g.check(&change("A", updated, origin("c1", false))), None);
        assert_eq!(
            g.check(&change("A", updated, origin("c1; cbnotif=1", true))),
            Some(Loop::SameCorrelator)
        );
        // A custom notification of another request: not a loop.
        assert_eq!(
            g.check(&change("A", updated, origin("c2; cbnotif=1", true))),
            None
        );
        // A → B → A: B is new to c3, A is not.
        assert_eq!(g.check(&change("A", updated, origin("c3", false))), None);
        assert_eq!(
            g.check(&change("B", updated, origin("c3; cbnotif=1", true))),
            None
        );
        assert_eq!(
            g.check(&change(
                "A",
                updated,
                origin("c3; cbnotif=1; cbnotif=1", true)
            )),
            Some(Loop::SameCorrelator)
        );
        // Not custom (a normalized notification): Orion's rule does not apply.
        assert_eq!(
            g.check(&change("A", updated, origin("c3; cbnotif=1", false))),
            None
        );
        // Device data carries no correlator, and a deletion forgets.
        assert_eq!(g.check(&change("A", updated, None)), None);
        assert_eq!(
            g.check(&change("A", updated, origin("c3; cbnotif=2", true))),
            None
        );
        g.check(&change("A", Alteration::Deleted, origin("c4", false)));
        g.check(&change("B", Alteration::Deleted, origin("c4", false)));
        assert_eq!(g.len(), 0);
    }

    /// Whatever the entity, a request that deep notifies no one.
    #[test]
    fn depth_limit() {
        let g = LoopGuard::default();
        let mut correlator = "root".to_string();
        for depth in 0..=MAX_NOTIFICATION_DEPTH {
            let verdict = g.check(&change(
                &format!("E{depth}"),
                Alteration::Updated,
                origin(&correlator, false),
            ));
            if depth < MAX_NOTIFICATION_DEPTH {
                assert_eq!(verdict, None, "depth {depth}");
            } else {
                assert_eq!(verdict, Some(Loop::TooDeep(depth)));
            }
            correlator.push_str("; cbnotif=1");
        }
    }
}
