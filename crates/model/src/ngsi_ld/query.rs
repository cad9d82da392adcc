//! NGSI-LD's query language (clause 4.9): terms joined by `;` (and) and
//! `|` (or), grouped by parentheses; attribute paths that name a
//! sub-attribute (`speed.observedAt`) or a part of a value
//! (`address[city]`); strings in double quotes.
//!
//! A term means what the NGSI Simple Query Language's item of the same
//! operator means ([`crate::query`]), so each term is read into one: the
//! names expanded with the request's context into stored names (see
//! [`Context::to_stored`]), a sub-attribute's path into an `mq` path
//! (`'speed'.'observedAt'`), a part of a value into a `q` path
//! (`'address'.'city'`), a double-quoted string into a quoted literal. The
//! same evaluator then serves NGSIv2's `q`, subscriptions and NGSI-LD's
//! `q`, so a comparison means the same thing on both APIs.

use crate::query::{Query, Resolver};

use super::context::Context;
use super::LdError;

/// A parsed NGSI-LD query.
#[derive(Debug, Clone, PartialEq)]
pub enum LdQuery {
    /// Every part holds.
    And(Vec<LdQuery>),
    /// Some part holds.
    Or(Vec<LdQuery>),
    /// The part does not hold (`!~=`).
    Not(Box<LdQuery>),
    /// One term.
    Term(Query),
}

/// The deepest nesting of parentheses read.
const MAX_DEPTH: usize = 32;

/// The comparison operators, longest first so that `>=` is not read as
/// `>`.
const OPERATORS: &[&str] = &["!~=", "==", "!=", ">=", "<=", "~=", ">", "<"];

impl LdQuery {
    /// Parses `q`, reading its names with `ctx`.
    pub fn parse(q: &str, ctx: &Context) -> Result<LdQuery, LdError> {
        let mut parser = Parser {
            text: q,
            pos: 0,
            ctx,
        };
        let query = parser.expression(0)?;
        parser.skip_blanks();
        if parser.pos != q.len() {
            return Err(parser.error("unexpected text"));
        }
        Ok(query)
    }

    /// Whether the query holds for the entity `resolver` reads.
    pub fn matches_with<R: Resolver + ?Sized>(&self, resolver: &R) -> bool {
        match self {
            LdQuery::And(parts) => parts.iter().all(|p| p.matches_with(resolver)),
            LdQuery::Or(parts) => parts.iter().any(|p| p.matches_with(resolver)),
            LdQuery::Not(part) => !part.matches_with(resolver),
            LdQuery::Term(q) => q.matches_with(resolver),
        }
    }
}

struct Parser<'a> {
    text: &'a str,
    pos: usize,
    ctx: &'a Context,
}

impl Parser<'_> {
    fn rest(&self) -> &str {
        &self.text[self.pos..]
    }

    fn skip_blanks(&mut self) {
        let rest = self.rest();
        self.pos += rest.len() - rest.trim_start().len();
    }

    fn error(&self, what: &str) -> LdError {
        LdError::bad_request(format!("q: {what} at {}: {}", self.pos, self.text))
    }

    /// Terms and groups joined by `;` and `|`; `;` binds tighter.
    fn expression(&mut self, depth: usize) -> Result<LdQuery, LdError> {
        if depth > MAX_DEPTH {
            return Err(self.error("parentheses nest too deeply"));
        }
        let mut ors = Vec::new();
        let mut ands = vec![self.operand(depth)?];
        loop {
            self.skip_blanks();
            match self.rest().chars().next() {
                Some(';') => {
                    self.pos += 1;
                    ands.push(self.operand(depth)?);
                }
                Some('|') => {
                    self.pos += 1;
                    ors.push(collapse(std::mem::take(&mut ands), LdQuery::And));
                    ands.push(self.operand(depth)?);
                }
                _ => break,
            }
        }
        ors.push(collapse(ands, LdQuery::And));
        Ok(collapse(ors, LdQuery::Or))
    }

    /// A parenthesised expression or a term.
    fn operand(&mut self, depth: usize) -> Result<LdQuery, LdError> {
        self.skip_blanks();
        if self.rest().starts_with('(') {
            self.pos += 1;
            let inner = self.expression(depth + 1)?;
            self.skip_blanks();
            if !self.rest().starts_with(')') {
                return Err(self.error("a parenthesis is not closed"));
            }
            self.pos += 1;
            return Ok(inner);
        }
        let end = term_end(self.rest());
        let term = self.rest()[..end].trim();
        if term.is_empty() {
            return Err(self.error("a term is missing"));
        }
        let parsed = self.term(term)?;
        self.pos += end;
        Ok(parsed)
    }

    /// One term, read into an item of the NGSI Simple Query Language.
    fn term(&self, term: &str) -> Result<LdQuery, LdError> {
        let (negated_exists, term) = match term.strip_prefix('!') {
            Some(rest) if !rest.starts_with('=') => (true, rest),
            _ => (false, term),
        };
        let found = OPERATORS
            .iter()
            .filter_map(|op| find_outside_quotes(term, op).map(|at| (at, *op)))
            .min_by_key(|(at, op)| (*at, std::cmp::Reverse(op.len())));
        let (path, op, value) = match found {
            Some((at, op)) => (&term[..at], op, Some(&term[at + op.len()..])),
            None => (term, "", None),
        };
        let (text, metadata) = self.path(path.trim())?;
        let mut item = text;
        let negate = op == "!~=";
        match value {
            None if negated_exists => item.insert(0, '!'),
            None => {}
            Some(value) if op.ends_with("~=") => {
                // A pattern is written bare in the NGSI Simple Query
                // Language.
                let value = value.trim();
                let pattern = value
                    .strip_prefix('"')
                    .and_then(|v| v.strip_suffix('"'))
                    .unwrap_or(value);
                item.push_str("~=");
                item.push_str(pattern);
            }
            Some(value) => {
                item.push_str(op);
                item.push_str(&literal(value.trim())?);
            }
        }
        let parsed = if metadata {
            Query::parse_mq(&item)
        } else {
            Query::parse(&item)
        }
        .map_err(|e| LdError::bad_request(format!("q: {term}: {}", e.description())))?;
        let term = LdQuery::Term(parsed);
        Ok(if negate {
            LdQuery::Not(Box::new(term))
        } else {
            term
        })
    }

    /// An attribute path as a `q` or `mq` path (whether it is `mq`):
    /// `attr`, `attr.sub` (a sub-attribute), `attr[a][b]` (inside the
    /// value), `attr.sub[a]`.
    fn path(&self, path: &str) -> Result<(String, bool), LdError> {
        let (names, parts) = match path.find('[') {
            Some(at) => (&path[..at], &path[at..]),
            None => (path, ""),
        };
        let mut names = names.split('.');
        let attr = names.next().unwrap_or("");
        if attr.is_empty() {
            return Err(LdError::bad_request(format!("q: no attribute in {path:?}")));
        }
        let mut out = quote(&self.ctx.to_stored(attr));
        let mut metadata = false;
        if let Some(sub) = names.next() {
            if names.next().is_some() || sub.is_empty() {
                return Err(LdError::bad_request(format!(
                    "q: only one sub-attribute level is read: {path:?}"
                )));
            }
            out.push('.');
            out.push_str(&quote(&self.ctx.to_stored(sub)));
            metadata = true;
        }
        let mut rest = parts;
        while !rest.is_empty() {
            let Some(close) = rest.find(']').filter(|_| rest.starts_with('[')) else {
                return Err(LdError::bad_request(format!("q: bad brackets in {path:?}")));
            };
            out.push('.');
            out.push_str(&quote(&rest[1..close]));
            rest = &rest[close + 1..];
        }
        Ok((out, metadata))
    }
}

/// One part, or the parts joined.
fn collapse(mut parts: Vec<LdQuery>, join: fn(Vec<LdQuery>) -> LdQuery) -> LdQuery {
    if parts.len() == 1 {
        parts.pop().expect("one part")
    } else {
        join(parts)
    }
}

/// Where the term starting `text` ends: at a `;`, `|` or `)` outside
/// quotes, or the end.
fn term_end(text: &str) -> usize {
    let mut quoted = false;
    for (i, c) in text.char_indices() {
        match c {
            '"' => quoted = !quoted,
            ';' | '|' | ')' if !quoted => return i,
            _ => {}
        }
    }
    text.len()
}

/// Where `needle` first occurs in `text` outside double quotes.
fn find_outside_quotes(text: &str, needle: &str) -> Option<usize> {
    let mut quoted = false;
    for (i, c) in text.char_indices() {
        if c == '"' {
            quoted = !quoted;
        } else if !quoted && text[i..].starts_with(needle) {
            return Some(i);
        }
    }
    None
}

/// A name as a quoted path segment of the NGSI Simple Query Language.
fn quote(name: &str) -> String {
    format!("'{name}'")
}

/// A value of a term as the NGSI Simple Query Language writes it: each
/// double-quoted string (alone, in a list, or a range's end) single-
/// quoted; anything else as it is.
fn literal(value: &str) -> Result<String, LdError> {
    let mut out = String::with_capacity(value.len());
    let mut quoted = false;
    for c in value.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                out.push('\'');
            }
            '\'' if quoted => {
                return Err(LdError::bad_request(
                    "q: a string holding ' cannot be compared",
                ))
            }
            c => out.push(c),
        }
    }
    if quoted {
        return Err(LdError::bad_request(format!(
            "q: a string is not closed: {value}"
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    use crate::query::{descend, Operand};

    /// An entity in NGSI-LD's normalized form, as a resolver: attribute
    /// values and sub-attribute values.
    struct Ld(Value);

    impl Resolver for Ld {
        fn attribute(&self, attr: &str, path: &[String]) -> Option<Operand<'_>> {
            let a = self.0.get(attr)?;
            let v = a.get("value").or_else(|| a.get("object"))?;
            Some(Operand::Json(std::borrow::Cow::Borrowed(descend(v, path)?)))
        }

        fn metadata(&self, attr: &str, md: &str, path: &[String]) -> Option<Operand<'_>> {
            let m = self.0.get(attr)?.get(md)?;
            let v = m.get("value").unwrap_or(m);
            Some(Operand::Json(std::borrow::Cow::Borrowed(descend(v, path)?)))
        }
    }

    fn car() -> Ld {
        Ld(json!({
            "speed": {"value": 80, "unitCode": "KMH"},
            "brandName": {"value": "Mercedes"},
            "isParked": {"object": "urn:ngsi-ld:Parking:1"},
            "address": {"value": {"city": "Porto", "zip": "4000"}}
        }))
    }

    fn holds(q: &str) -> bool {
        LdQuery::parse(q, &Context::core())
            .unwrap()
            .matches_with(&car())
    }

    #[test]
    fn terms_and_connectives() {
        assert!(holds("speed>50"));
        assert!(!holds("speed>90"));
        assert!(holds("brandName==\"Mercedes\""));
        assert!(holds("speed>50;brandName==\"Mercedes\""));
        assert!(!holds("speed>90;brandName==\"Mercedes\""));
        assert!(holds("speed>90|brandName==\"Mercedes\""));
        assert!(holds("(speed>90|speed<100);brandName!=\"BMW\""));
        assert!(!holds("(speed>90|speed<50);brandName!=\"BMW\""));
        assert!(holds("speed==70..90"));
        assert!(holds("brandName==\"BMW\",\"Mercedes\""));
        assert!(holds("isParked==\"urn:ngsi-ld:Parking:1\""));
        assert!(holds("brandName~=\"^Mer\""));
        assert!(holds("brandName!~=\"^BMW\""));
        assert!(holds("speed") && !holds("color") && holds("!color"));
    }

    #[test]
    fn paths_into_values_and_sub_attributes() {
        assert!(holds("address[city]==\"Porto\""));
        assert!(!holds("address[city]==\"Lisboa\""));
        assert!(holds("speed.unitCode==\"KMH\""));
    }

    #[test]
    fn names_are_read_with_the_context() {
        let ctx = Context::build(&json!({"speed": "http://example.org/speed"}), &|_: &str| {
            None
        })
        .unwrap();
        let q = LdQuery::parse("speed>1", &ctx).unwrap();
        let stored = Ld(json!({"http://example.org/speed": {"value": 3}}));
        assert!(q.matches_with(&stored));
        assert!(!q.matches_with(&car()));
    }

    #[test]
    fn bad_queries_are_bad_request_data() {
        for q in [
            "",
            "speed>",
            "(speed>1",
            "speed>1;",
            "brandName==\"open",
            "a.b.c==1",
            "a[b==1",
            "speed>1)",
        ] {
            let e = LdQuery::parse(q, &Context::core());
            assert!(e.is_err(), "{q:?} parsed: {e:?}");
        }
    }
}
