//! `pick` and `omit` (clause 4.21): which members of an entity an answer
//! shows and, after a Relationship's name in braces, which members of the
//! entities it links to (`join`, clause 4.5.23) show:
//! `pick=id,locatedAt{id,name}` shows the entity's `id` and `locatedAt`,
//! and of the linked city its `id` and `name`;
//! `omit=type,locatedAt{name}` hides the entity's `type` and the linked
//! city's `name` (a name followed by braces is not itself omitted).

use serde_json::{Map, Value};

/// Whether the names are the members shown or the members hidden.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `pick`: only the members named.
    Pick,
    /// `omit`: every member but those named.
    Omit,
}

/// A parsed `pick` or `omit`.
#[derive(Debug, Clone, PartialEq)]
pub struct Projection {
    mode: Mode,
    members: Vec<Member>,
}

/// One name of a projection, with the projection of the entities it
/// links to when braces follow it.
#[derive(Debug, Clone, PartialEq)]
struct Member {
    name: String,
    linked: Option<Vec<Member>>,
}

impl Projection {
    /// Reads `raw` (`a,b{c,d{e}}`); the reason when it is not a comma
    /// list of names with balanced braces.
    pub fn parse(mode: Mode, raw: &str) -> Result<Projection, String> {
        let mut chars = raw.chars().peekable();
        let members = members(&mut chars, 0)?;
        if chars.next().is_some() {
            return Err(format!("unbalanced braces in {raw}"));
        }
        Ok(Projection { mode, members })
    }

    /// The projection of a flat list of names (a subscription's).
    pub fn of_names(mode: Mode, names: &[String]) -> Projection {
        let members = names
            .iter()
            .map(|name| Member {
                name: name.clone(),
                linked: None,
            })
            .collect();
        Projection { mode, members }
    }

    /// Pick or omit.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The names given at the top level, braces left aside.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.members.iter().map(|m| m.name.as_str())
    }

    /// Whether the entity's own member `name` is shown.
    pub fn shows(&self, name: &str) -> bool {
        let member = self.members.iter().find(|m| m.name == name);
        match self.mode {
            Mode::Pick => member.is_some(),
            Mode::Omit => member.is_none_or(|m| m.linked.is_some()),
        }
    }

    /// Keeps the members of a rendered entity this projection shows.
    pub fn apply(&self, entity: &mut Map<String, Value>) {
        if !self.members.is_empty() {
            entity.retain(|k, _| self.shows(k));
        }
    }

    /// The projection of the entities the Relationship `name` links to:
    /// what its braces hold, `None` (all shown) without braces.
    pub fn linked(&self, name: &str) -> Option<Projection> {
        self.members
            .iter()
            .find(|m| m.name == name)
            .and_then(|m| m.linked.clone())
            .map(|members| Projection {
                mode: self.mode,
                members,
            })
    }
}

/// The members up to the end of the text or a closing brace (left for
/// the caller), at nesting `depth`.
fn members(
    chars: &mut std::iter::Peekable<std::str::Chars<'_>>,
    depth: usize,
) -> Result<Vec<Member>, String> {
    let mut out = Vec::new();
    loop {
        let mut name = String::new();
        while let Some(&c) = chars.peek() {
            if matches!(c, ',' | '{' | '}') {
                break;
            }
            if c.is_whitespace() || "<>\"'=;()[]".contains(c) {
                return Err(format!("{c:?} is not part of a name"));
            }
            name.push(c);
            chars.next();
        }
        if name.is_empty() {
            return Err("an empty name".into());
        }
        let linked = if chars.peek() == Some(&'{') {
            chars.next();
            let inner = members(chars, depth + 1)?;
            if chars.next() != Some('}') {
                return Err("unbalanced braces".into());
            }
            Some(inner)
        } else {
            None
        };
        out.push(Member { name, linked });
        match chars.peek() {
            Some(',') => {
                chars.next();
            }
            Some('}') if depth > 0 => return Ok(out),
            Some(_) => return Err("unbalanced braces".into()),
            None if depth > 0 => return Err("unbalanced braces".into()),
            None => return Ok(out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entity() -> Map<String, Value> {
        json!({"id": "b", "type": "Building", "name": 1, "locatedAt": 2})
            .as_object()
            .unwrap()
            .clone()
    }

    fn keys(m: &Map<String, Value>) -> Vec<&str> {
        m.keys().map(String::as_str).collect()
    }

    #[test]
    fn pick_shows_the_names_and_braces_project_linked_entities() {
        let p = Projection::parse(Mode::Pick, "id,locatedAt{id,name,isIn{id}}").unwrap();
        let mut e = entity();
        p.apply(&mut e);
        assert_eq!(keys(&e), ["id", "locatedAt"]);
        let city = p.linked("locatedAt").unwrap();
        assert_eq!(city.names().collect::<Vec<_>>(), ["id", "name", "isIn"]);
        assert_eq!(
            city.linked("isIn").unwrap().names().collect::<Vec<_>>(),
            ["id"]
        );
        assert_eq!(city.linked("name"), None);
        assert_eq!(p.linked("id"), None);
    }

    #[test]
    fn omit_hides_the_names_but_not_those_with_braces() {
        let p = Projection::parse(Mode::Omit, "type,locatedAt{name}").unwrap();
        let mut e = entity();
        p.apply(&mut e);
        assert_eq!(keys(&e), ["id", "name", "locatedAt"]);
        let mut city = entity();
        p.linked("locatedAt").unwrap().apply(&mut city);
        assert_eq!(keys(&city), ["id", "type", "locatedAt"]);
    }

    #[test]
    fn malformed_projections_are_refused() {
        for raw in [
            "", "a,", ",a", "a{b", "a}b", "a{}", "a b", "a{b}}", "a=b", "{a}",
        ] {
            assert!(Projection::parse(Mode::Pick, raw).is_err(), "{raw:?}");
        }
        assert!(Projection::parse(Mode::Pick, "a,b{c},d").is_ok());
    }
}
