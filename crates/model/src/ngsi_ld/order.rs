//! `orderBy` (ETSI GS CIM 009 v1.9.1, clause 4.23): the order of the
//! entities a query answers, by a comma list of keys, each a member path
//! (`id`, `type`, `createdAt`, `modifiedAt`, an attribute, an attribute's
//! `createdAt`/`modifiedAt` or sub-attribute: `name.subProperty`) with an
//! optional `;asc` (the default) or `;desc`. Entities lacking a key's
//! value come after those that have one, whichever the direction.

use std::cmp::Ordering;

use serde_json::Value;

use super::context::Context;
use super::LdError;
use crate::ngsi::Entity;

/// A parsed `orderBy`.
#[derive(Debug, Clone, PartialEq)]
pub struct OrderBy(Vec<Key>);

/// One key: what to read and in which direction.
#[derive(Debug, Clone, PartialEq)]
struct Key {
    member: Member,
    descending: bool,
}

/// What a key reads of an entity.
#[derive(Debug, Clone, PartialEq)]
enum Member {
    Id,
    Type,
    CreatedAt,
    ModifiedAt,
    /// An attribute (stored name), and a sub-attribute or system time of
    /// it (stored name), if the path goes on.
    Attribute(String, Option<String>),
}

/// A value read for ordering.
#[derive(Debug, PartialEq)]
enum Sortable<'a> {
    Number(f64),
    Text(&'a str),
    Json(&'a Value),
}

impl OrderBy {
    /// Reads `orderBy`, its names with `ctx`.
    pub fn parse(text: &str, ctx: &Context) -> Result<OrderBy, LdError> {
        let mut keys = Vec::new();
        for part in text.split(',') {
            let (path, direction) = match part.split_once(';') {
                Some((p, d)) => (p, d),
                None => (part, "asc"),
            };
            let descending = match direction {
                "asc" => false,
                "desc" => true,
                other => {
                    return Err(LdError::bad_request(format!(
                        "orderBy: a direction is asc or desc, not {other}"
                    )))
                }
            };
            if path.is_empty()
                || path.contains(|c: char| c.is_whitespace() || "()<>\"'=".contains(c))
            {
                return Err(LdError::bad_request(format!(
                    "orderBy: not a path: {part:?}"
                )));
            }
            let member = match path {
                "id" => Member::Id,
                "type" => Member::Type,
                "createdAt" => Member::CreatedAt,
                "modifiedAt" => Member::ModifiedAt,
                _ => {
                    let (attr, rest) = match path.split_once('.') {
                        Some((a, r)) => (a, Some(r)),
                        None => (path, None),
                    };
                    let sub = rest.map(|r| match r {
                        "createdAt" | "modifiedAt" => r.to_string(),
                        _ => ctx.to_stored(r),
                    });
                    Member::Attribute(ctx.to_stored(attr), sub)
                }
            };
            keys.push(Key { member, descending });
        }
        Ok(OrderBy(keys))
    }

    /// How `a` and `b` compare, key by key.
    pub fn compare(&self, a: &Entity, b: &Entity) -> Ordering {
        for key in &self.0 {
            let order = match (read(&key.member, a), read(&key.member, b)) {
                (Some(x), Some(y)) => {
                    let o = compare(&x, &y);
                    if key.descending {
                        o.reverse()
                    } else {
                        o
                    }
                }
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (None, None) => Ordering::Equal,
            };
            if order != Ordering::Equal {
                return order;
            }
        }
        Ordering::Equal
    }
}

/// What `member` reads of `e`.
fn read<'a>(member: &Member, e: &'a Entity) -> Option<Sortable<'a>> {
    Some(match member {
        Member::Id => Sortable::Text(&e.id),
        Member::Type => Sortable::Text(&e.entity_type),
        Member::CreatedAt => Sortable::Number(e.date_created as f64),
        Member::ModifiedAt => Sortable::Number(e.date_modified as f64),
        Member::Attribute(name, sub) => {
            let attr = e.attrs.get(name)?;
            match sub.as_deref() {
                None => of_value(&attr.value),
                Some("createdAt") => Sortable::Number(attr.date_created as f64),
                Some("modifiedAt") => Sortable::Number(attr.date_modified as f64),
                Some(sub) => of_value(&attr.metadata.get(sub)?.value),
            }
        }
    })
}

fn of_value(v: &Value) -> Sortable<'_> {
    match v {
        Value::Number(n) => n.as_f64().map_or(Sortable::Json(v), Sortable::Number),
        Value::String(s) => Sortable::Text(s),
        other => Sortable::Json(other),
    }
}

/// Numbers before texts before anything else; within a kind, in order.
fn compare(a: &Sortable<'_>, b: &Sortable<'_>) -> Ordering {
    match (a, b) {
        (Sortable::Number(x), Sortable::Number(y)) => x.total_cmp(y),
        (Sortable::Text(x), Sortable::Text(y)) => x.cmp(y),
        (Sortable::Json(x), Sortable::Json(y)) => x.to_string().cmp(&y.to_string()),
        (Sortable::Number(_), _) => Ordering::Less,
        (_, Sortable::Number(_)) => Ordering::Greater,
        (Sortable::Text(_), _) => Ordering::Less,
        (_, Sortable::Text(_)) => Ordering::Greater,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ngsi::Attribute;
    use serde_json::json;

    fn building(id: &str, name: Option<&str>, created: i64) -> Entity {
        let mut e = Entity::new(id, "Building");
        e.date_created = created;
        if let Some(n) = name {
            e.attrs
                .insert("name".to_string(), Attribute::new(json!(n), "Property"));
        }
        e
    }

    fn sorted(text: &str, mut entities: Vec<Entity>) -> Vec<String> {
        let order = OrderBy::parse(text, &Context::core()).unwrap();
        entities.sort_by(|a, b| order.compare(a, b));
        entities.into_iter().map(|e| e.id).collect()
    }

    #[test]
    fn keys_directions_and_missing_values() {
        let all = || {
            vec![
                building("urn:b:2", Some("b"), 1),
                building("urn:b:1", Some("a"), 2),
                building("urn:b:3", None, 3),
            ]
        };
        assert_eq!(sorted("name", all()), ["urn:b:1", "urn:b:2", "urn:b:3"]);
        assert_eq!(
            sorted("name;desc", all()),
            ["urn:b:2", "urn:b:1", "urn:b:3"]
        );
        assert_eq!(sorted("id;desc", all()), ["urn:b:3", "urn:b:2", "urn:b:1"]);
        assert_eq!(
            sorted("createdAt", all()),
            ["urn:b:2", "urn:b:1", "urn:b:3"]
        );
        assert_eq!(
            sorted("type,name", all()),
            ["urn:b:1", "urn:b:2", "urn:b:3"]
        );
        assert!(OrderBy::parse("name;up", &Context::core()).is_err());
        assert!(OrderBy::parse("name,,id", &Context::core()).is_err());
    }
}
