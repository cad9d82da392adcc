//! Batch updates (`POST /v2/op/update`, and `op/notify`'s appends): one
//! action applied to each entity in turn through [`NgsiWriter::apply`],
//! and what failed gathered into one Orion text (`do not exist: E1/T - [
//! B ], E2/T [entity itself]`): 404 when no entity existed, 422
//! Unprocessable when nothing at all was applied, 422 PartialUpdate
//! otherwise.

use weft_model::ngsi::{Entity, NgsiError, UpdateOptions};

use super::{NgsiWriter, Write};
use crate::context::{Target, Tenancy};

/// The `actionType` of a batch update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchAction {
    /// Append attributes, creating entities that do not exist.
    Append,
    /// Append attributes the entities lack, refusing those they have;
    /// entities that do not exist are created.
    AppendStrict,
    /// Update attributes the entities have.
    Update,
    /// Remove the named attributes, or the entities when none is named.
    Delete,
    /// Replace all attributes.
    Replace,
}

impl BatchAction {
    /// Reads Orion's `actionType`, with its 400 text, as Orion reads it
    /// (asked of the real Orion 4.7.0): the NGSIv2 names exactly
    /// (`appendStrict`), and the NGSIv1 names in any case (`APPEND_STRICT`,
    /// `append_strict`, `Append`) — the FIWARE tutorials and ngsi-go write
    /// `append_strict`.
    pub fn parse(s: &str) -> Result<BatchAction, NgsiError> {
        if s == "appendStrict" {
            return Ok(BatchAction::AppendStrict);
        }
        Ok(match s.to_ascii_lowercase().as_str() {
            "append" => BatchAction::Append,
            "append_strict" => BatchAction::AppendStrict,
            "update" => BatchAction::Update,
            "delete" => BatchAction::Delete,
            "replace" => BatchAction::Replace,
            _ => {
                return Err(NgsiError::bad_request(
                    "invalid update action type: right ones are: append, appendStric, delete, replace, update",
                ))
            }
        })
    }
}

/// One entity of a batch, parsed.
#[derive(Debug, Clone)]
pub struct BatchItem {
    /// The entity as given (type `Thing` when none was).
    pub entity: Entity,
    /// Whether the payload named the type (lookups then use it).
    pub typed: bool,
    /// The attribute names given (what a `delete` removes).
    pub names: Vec<String>,
}

/// What failed for one entity.
enum Failure {
    /// The entity does not exist.
    Entity,
    /// These attributes were refused; the flag says whether others of
    /// the entity were applied.
    Attrs(Vec<String>, bool),
}

impl NgsiWriter {
    /// Applies `action` to each of `items` in turn, in `path` of
    /// `tenancy`; Orion's one error for everything that failed.
    pub async fn batch(
        &self,
        tenancy: &Tenancy,
        path: &str,
        action: BatchAction,
        items: Vec<BatchItem>,
        opts: UpdateOptions,
    ) -> Result<(), NgsiError> {
        let opts = match action {
            BatchAction::Append => UpdateOptions {
                append_strict: false,
                ..opts
            },
            BatchAction::AppendStrict => UpdateOptions {
                append_strict: true,
                ..opts
            },
            _ => opts,
        };
        let mut failures: Vec<(String, Option<String>, Failure)> = Vec::new();
        let mut applied = false;
        let mut all_missing = !items.is_empty();
        // One target for the batch, pointed at each entity in turn.
        let mut target = Target {
            tenancy: tenancy.clone(),
            path: path.to_string(),
            ..Target::default()
        };
        for item in items {
            target.id = item.entity.id.clone();
            target.entity_type = item.typed.then(|| item.entity.entity_type.clone());
            let write = match action {
                BatchAction::Append | BatchAction::AppendStrict => Write::Upsert(item.entity),
                BatchAction::Update => Write::Update(item.entity.attrs),
                BatchAction::Replace => Write::Replace(item.entity.attrs),
                BatchAction::Delete if item.names.is_empty() => Write::Delete,
                BatchAction::Delete => Write::DeleteAttrs(item.names),
            };
            let failure = match self.apply(&target, write, opts).await {
                Ok(written) => {
                    let refused = written.refused();
                    (!refused.is_empty())
                        .then(|| Failure::Attrs(refused, !written.nothing_applied()))
                }
                Err(e) if e == NgsiError::entity_not_found() => Some(Failure::Entity),
                Err(e) => return Err(e),
            };
            match failure {
                None => {
                    applied = true;
                    all_missing = false;
                }
                Some(Failure::Entity) => failures.push((
                    target.id.clone(),
                    target.entity_type.clone(),
                    Failure::Entity,
                )),
                Some(Failure::Attrs(names, some_applied)) => {
                    all_missing = false;
                    applied |= some_applied;
                    failures.push((
                        target.id.clone(),
                        target.entity_type.clone(),
                        Failure::Attrs(names, some_applied),
                    ));
                }
            }
        }
        if failures.is_empty() {
            return Ok(());
        }
        let prefix = if action == BatchAction::AppendStrict {
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
        Err(if all_missing {
            NgsiError::new(404, "NotFound", text)
        } else if applied {
            NgsiError::partial_update(text)
        } else {
            NgsiError::unprocessable(text)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The spellings the real Orion 4.7.0 takes, and some it refuses.
    #[test]
    fn action_types_are_read_as_orion_reads_them() {
        for (given, action) in [
            ("appendStrict", BatchAction::AppendStrict),
            ("append_strict", BatchAction::AppendStrict),
            ("APPEND_STRICT", BatchAction::AppendStrict),
            ("Append", BatchAction::Append),
            ("UPDATE", BatchAction::Update),
            ("Update", BatchAction::Update),
            ("REPLACE", BatchAction::Replace),
            ("DELETE", BatchAction::Delete),
        ] {
            assert_eq!(BatchAction::parse(given).unwrap(), action, "{given}");
        }
        for refused in ["appendstrict", "APPENDSTRICT", "upsert", ""] {
            assert_eq!(
                BatchAction::parse(refused).unwrap_err().status,
                400,
                "{refused}"
            );
        }
    }
}
