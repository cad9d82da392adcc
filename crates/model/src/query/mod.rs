//! The NGSI Simple Query Language: `q` (conditions on attribute values) and
//! `mq` (conditions on metadata values). One parser and evaluator serves
//! live-stream filters, NGSI queries, subscriptions and rule conditions,
//! so a condition means the same thing everywhere.
//!
//! A query is `;`-separated items, all of which must hold (one trailing `;`
//! is allowed). An item is:
//!
//! - `path` (exists) or `!path` (does not exist);
//! - `path==v` (or `path:v`), `path!=v`, where `v` is a value, a comma list
//!   `a,b,c` (any of) or a range `a..b` (inclusive);
//! - `path>v`, `path>=v`, `path<v`, `path<=v` with a number, date or string;
//! - `path~=regex` (string values matching the regular expression).
//!
//! Values: unquoted literals are numbers if they read as numbers, date-times
//! if they read as ISO-8601 dates ([`parse_datetime`]), `true`, `false` and
//! `null` JSON literals, otherwise strings; `'quoted'` literals are always
//! strings. Types do not mix: `A1==10` does not match the string `"10"`
//! (case 1595_query_with_q_and_string_values), and an attribute of another
//! type never satisfies `>`/`<` (case 2995_q_in_subscriptions).
//!
//! Paths: `attr` or `attr.a.b` into a structured value (`q`), and
//! `attr.metadata` or `attr.metadata.a.b` (`mq`). Single quotes put dots
//! in a name: `'A1.B1'.C1` is key `C1` of attribute `A1.B1` (case
//! 1490_compound_values_with_dot_in_key). What a path refers to is the
//! caller's business, see [`Resolver`]; [`Query::matches`] is the simpler
//! form for callers that look values up by dotted name.

mod date;
mod parse;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

use std::borrow::Cow;
use std::cmp::Ordering;
use std::fmt;

use serde_json::Value;
use thiserror::Error;

pub use date::parse_datetime;

/// A decimal number as the query language reads an unquoted literal
/// (`10`, `-1.5`, `3e2`; not `inf`, `NaN` or hex). Shared with geo-query
/// coordinates so both read numbers alike.
pub fn parse_number(s: &str) -> Option<f64> {
    parse::number(s)
}

/// A parsed query, ready to be evaluated many times; parsing (regexes
/// included) happens once.
#[derive(Debug, Clone, PartialEq)]
pub struct Query {
    kind: QueryKind,
    items: Vec<Item>,
}

/// Whether a query is about attribute values (`q`) or metadata values
/// (`mq`): the same grammar, but `mq` paths start `attr.metadata`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueryKind {
    /// `q`: paths are `attr[.path]`.
    Q,
    /// `mq`: paths are `attr.metadata[.path]`.
    Mq,
}

/// The left-hand side of a query item, split into names: quotes removed,
/// dots inside quotes kept as part of the name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Path {
    segments: Vec<String>,
    dotted: String,
}

impl Path {
    /// The names, in order (`'a.b'.c` gives `["a.b", "c"]`). Never empty.
    pub fn segments(&self) -> &[String] {
        &self.segments
    }

    /// The segments joined with `.`: the form [`Query::matches`] hands its
    /// lookup (quoted dots are indistinguishable there).
    pub fn dotted(&self) -> &str {
        &self.dotted
    }
}

#[derive(Debug, Clone, PartialEq)]
struct Item {
    path: Path,
    op: Op,
}

#[derive(Debug, Clone, PartialEq)]
enum Op {
    Exists,
    NotExists,
    Equal(Rhs),
    NotEqual(Rhs),
    Greater(Literal),
    GreaterEq(Literal),
    Less(Literal),
    LessEq(Literal),
    Matches(Pattern),
}

#[derive(Debug, Clone, PartialEq)]
enum Rhs {
    One(Literal),
    List(Vec<Literal>),
    Range(Literal, Literal),
}

#[derive(Debug, Clone, PartialEq)]
enum Literal {
    Number(f64),
    /// Milliseconds since the epoch.
    Date(i64),
    Text(String),
    Bool(bool),
    Null,
}

/// A compiled regular expression; equal when the sources are.
#[derive(Debug, Clone)]
struct Pattern(regex::Regex);

impl PartialEq for Pattern {
    fn eq(&self, other: &Pattern) -> bool {
        self.0.as_str() == other.0.as_str()
    }
}

/// Why a `q` or `mq` string was rejected. [`QueryError::description`] is
/// the text Orion answers with (400 BadRequest), so the HTTP layer can
/// reproduce it exactly; `Display` adds the offending item for logs and
/// weft's own APIs.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid query '{statement}': {}", .kind.description())]
pub struct QueryError {
    /// The offending item (the whole query when the item cannot be told).
    pub statement: String,
    /// What is wrong with it: Orion's text, without variable parts.
    pub reason: &'static str,
    /// What is wrong, as data.
    pub kind: QueryErrorKind,
}

impl QueryError {
    fn new(statement: &str, kind: QueryErrorKind) -> QueryError {
        QueryError {
            statement: statement.to_string(),
            reason: kind.reason(),
            kind,
        }
    }

    /// Orion's error description for this error, as sent in
    /// `{"error":"BadRequest","description":…}`.
    pub fn description(&self) -> String {
        self.kind.description()
    }
}

/// The validation failures of the query language, each with Orion's text
/// (the cases cited are in Orion's functional tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueryErrorKind {
    /// `;`: "empty q".
    EmptyQuery,
    /// `a;;b`: "empty q-item" (2086_allow_trailing_semicolon).
    EmptyItem,
    /// `a; ;b`: "empty q-item (only whitespace)".
    WhitespaceItem,
    /// `<speed`: "empty left-hand-side in q-item" (2106).
    EmptyLhs,
    /// `a==`: "empty right-hand-side in q-item".
    EmptyRhs,
    /// A character not allowed in names on the left-hand side:
    /// "invalid character found in URI param /q/" (or `/mq/`).
    BadLhsChar(QueryKind),
    /// A left-hand side with an empty name (`a..b`, `'a'.`): weft's text
    /// "empty name in attribute path".
    EmptyName,
    /// `< > " ' = ; ( )` in a value, or misplaced quotes:
    /// "forbidden characters in String Filter" (1994, 2226).
    ForbiddenChars,
    /// `'10'x`: "non-terminated forced string" (1595).
    NonTerminatedString,
    /// `'10'x'`: "quote in forced string" (1595).
    QuoteInString,
    /// `A1>=0..20`: "ranges only valid for equal and not equal ops" (1607).
    RangeWithOrderOp,
    /// `A1>1,2`: "lists only valid for equal and not equal ops".
    ListWithOrderOp,
    /// `a==1..`: "empty item in range".
    EmptyRangeItem,
    /// `a==true..3`: "invalid data type for /range-from/".
    BadRangeFrom,
    /// `a==3..null`: "invalid data type for /range-to/".
    BadRangeTo,
    /// `A==B..14`: "invalid range: types mixed" (1306, 1039).
    RangeTypesMixed,
    /// `a==1,,2`: "empty item in list".
    EmptyListItem,
    /// `a==1,b` or a boolean in a list: "invalid JSON value type in list".
    ListTypesMixed,
    /// `a>true`: "values of type /Bool/ not supported for operator /GreaterThan/".
    OrderOpType {
        /// Orion's name of the value type (`Bool`, `Null`).
        value_type: &'static str,
        /// Orion's name of the operator (`GreaterThan`, …).
        op: &'static str,
    },
    /// `a~=(`: "error compiling filter regex: '<regex>'".
    BadRegex(String),
    /// A unary `mq` item without a metadata name (`!temp`):
    /// "no metadata in right-hand-side of q-item".
    NoMetadata,
}

impl QueryErrorKind {
    /// The fixed part of the text.
    fn reason(&self) -> &'static str {
        use QueryErrorKind::*;
        match self {
            EmptyQuery => "empty q",
            EmptyItem => "empty q-item",
            WhitespaceItem => "empty q-item (only whitespace)",
            EmptyLhs => "empty left-hand-side in q-item",
            EmptyRhs => "empty right-hand-side in q-item",
            BadLhsChar(QueryKind::Q) => "invalid character found in URI param /q/",
            BadLhsChar(QueryKind::Mq) => "invalid character found in URI param /mq/",
            EmptyName => "empty name in attribute path",
            ForbiddenChars => "forbidden characters in String Filter",
            NonTerminatedString => "non-terminated forced string",
            QuoteInString => "quote in forced string",
            RangeWithOrderOp => "ranges only valid for equal and not equal ops",
            ListWithOrderOp => "lists only valid for equal and not equal ops",
            EmptyRangeItem => "empty item in range",
            BadRangeFrom => "invalid data type for /range-from/",
            BadRangeTo => "invalid data type for /range-to/",
            RangeTypesMixed => "invalid range: types mixed",
            EmptyListItem => "empty item in list",
            ListTypesMixed => "invalid JSON value type in list",
            OrderOpType { .. } => "value type not supported for operator",
            BadRegex(_) => "error compiling filter regex",
            NoMetadata => "no metadata in right-hand-side of q-item",
        }
    }

    /// Orion's full text.
    pub fn description(&self) -> String {
        match self {
            QueryErrorKind::OrderOpType { value_type, op } => {
                format!("values of type /{value_type}/ not supported for operator /{op}/")
            }
            QueryErrorKind::BadRegex(re) => format!("error compiling filter regex: '{re}'"),
            other => other.reason().to_string(),
        }
    }
}

impl fmt::Display for QueryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QueryKind::Q => "q",
            QueryKind::Mq => "mq",
        })
    }
}

/// What a [`Resolver`] found at a path: the value and how it compares.
#[derive(Debug, Clone, PartialEq)]
pub enum Operand<'a> {
    /// A typed JSON value (an NGSI attribute or metadata value, or an item
    /// inside one): numbers compare with numbers, strings with strings;
    /// a string never compares as a date (Orion: a `Text` attribute holding
    /// `"2016-02-25T10:00:00.000Z"` does not match
    /// `birthdate==2016-02-25T10:00:00.000Z`, case 1039 dates_in_q_uri_param
    /// step 11). Arrays match when one of their elements does.
    Json(Cow<'a, Value>),
    /// A JSON value from a schemaless source (a data unit's measures): as
    /// `Json`, except that a string that reads as a number compares with
    /// number literals and one that reads as an ISO-8601 date-time compares
    /// with date literals as an instant.
    Untyped(Cow<'a, Value>),
    /// An instant in milliseconds since the epoch: a `DateTime` attribute
    /// or metadata, `dateCreated`, `dateModified`… Compares with date
    /// literals only.
    DateTime(i64),
}

/// Gives a query the values its paths refer to. The caller decides what a
/// name means: an NGSI entity's attribute (with its type, so `DateTime`
/// attributes come back as [`Operand::DateTime`]), a data unit's measure…
///
/// Both methods return `None` when nothing is there; `path` is the rest of
/// the item's path, to follow inside the (structured) value, empty for the
/// value itself. [`descend`] does that walk for JSON values. Returning
/// borrowed values ([`Cow::Borrowed`]) keeps evaluation allocation-free.
pub trait Resolver {
    /// The value of attribute `attr`, or the item at `path` inside it (`q`).
    fn attribute(&self, attr: &str, path: &[String]) -> Option<Operand<'_>>;

    /// The value of metadata `md` of attribute `attr`, or the item at
    /// `path` inside it (`mq`).
    fn metadata(&self, attr: &str, md: &str, path: &[String]) -> Option<Operand<'_>>;
}

/// The item at `path` inside `value`: object members by key, array
/// elements by index; `value` itself for an empty path.
pub fn descend<'v>(value: &'v Value, path: &[String]) -> Option<&'v Value> {
    path.iter().try_fold(value, |cur, seg| match cur {
        Value::Object(map) => map.get(seg.as_str()),
        Value::Array(items) => items.get(seg.parse::<usize>().ok()?),
        _ => None,
    })
}

/// A [`Resolver`] over one JSON object whose members are the attributes
/// (like an entity in `keyValues` form or a data unit's measures), read as
/// [`Operand::Untyped`]; it has no metadata.
#[derive(Debug, Clone, Copy)]
pub struct JsonResolver<'a>(pub &'a Value);

impl Resolver for JsonResolver<'_> {
    fn attribute(&self, attr: &str, path: &[String]) -> Option<Operand<'_>> {
        let v = descend(self.0.get(attr)?, path)?;
        Some(Operand::Untyped(Cow::Borrowed(v)))
    }

    fn metadata(&self, _attr: &str, _md: &str, _path: &[String]) -> Option<Operand<'_>> {
        None
    }
}

impl Query {
    /// Parses a `q` string. An empty string is a query that matches
    /// everything.
    pub fn parse(q: &str) -> Result<Query, QueryError> {
        parse::parse(q, QueryKind::Q)
    }

    /// Parses an `mq` string, whose paths are `attr.metadata[.path]`.
    pub fn parse_mq(mq: &str) -> Result<Query, QueryError> {
        parse::parse(mq, QueryKind::Mq)
    }

    /// Whether this is a `q` or an `mq` query.
    pub fn kind(&self) -> QueryKind {
        self.kind
    }

    /// Whether the query has no items (and so matches everything).
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The paths the query looks at, in order (one per item), e.g. to know
    /// which attributes a subscription's condition depends on.
    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        self.items.iter().map(|i| &i.path)
    }

    /// Whether every item holds, with `lookup` giving the value at a
    /// dotted path ([`Path::dotted`]). Values are read as
    /// [`Operand::Untyped`]. Does not allocate.
    pub fn matches<'a>(&self, lookup: impl Fn(&str) -> Option<&'a Value>) -> bool {
        self.items.iter().all(|item| {
            let v = lookup(item.path.dotted()).map(|v| Subject::Json(v, true));
            item.op.holds(v)
        })
    }

    /// Whether every item holds, with `resolver` giving the values: `q`
    /// items ask [`Resolver::attribute`], `mq` items
    /// [`Resolver::metadata`].
    pub fn matches_with<R: Resolver + ?Sized>(&self, resolver: &R) -> bool {
        self.items.iter().all(|item| {
            let segs = item.path.segments();
            let found = match self.kind {
                QueryKind::Q => resolver.attribute(&segs[0], &segs[1..]),
                QueryKind::Mq => match segs.get(1) {
                    Some(md) => resolver.metadata(&segs[0], md, &segs[2..]),
                    None => None,
                },
            };
            let subject = found.as_ref().map(|o| match o {
                Operand::Json(v) => Subject::Json(v, false),
                Operand::Untyped(v) => Subject::Json(v, true),
                Operand::DateTime(ms) => Subject::Date(*ms),
            });
            item.op.holds(subject)
        })
    }
}

/// A value under test: JSON (with "untyped" leniency or not) or an instant.
#[derive(Clone, Copy)]
enum Subject<'a> {
    Json(&'a Value, bool),
    Date(i64),
}

impl Op {
    fn holds(&self, subject: Option<Subject<'_>>) -> bool {
        let Some(s) = subject else {
            return matches!(self, Op::NotExists);
        };
        match self {
            Op::Exists => true,
            Op::NotExists => false,
            Op::Equal(rhs) => any_element(s, |s| rhs.contains(s)),
            Op::NotEqual(rhs) => !any_element(s, |s| rhs.contains(s)),
            Op::Greater(l) => any_element(s, |s| compare(s, l) == Some(Ordering::Greater)),
            Op::GreaterEq(l) => any_element(s, |s| {
                matches!(compare(s, l), Some(Ordering::Greater | Ordering::Equal))
            }),
            Op::Less(l) => any_element(s, |s| compare(s, l) == Some(Ordering::Less)),
            Op::LessEq(l) => any_element(s, |s| {
                matches!(compare(s, l), Some(Ordering::Less | Ordering::Equal))
            }),
            Op::Matches(p) => any_element(s, |s| match s {
                Subject::Json(Value::String(text), _) => p.0.is_match(text),
                _ => false,
            }),
        }
    }
}

/// `f` on the subject, or on any of its elements when it is an array (the
/// way Orion's store matches arrays; case 2446_mq_and_vector).
fn any_element(s: Subject<'_>, f: impl Fn(Subject<'_>) -> bool) -> bool {
    match s {
        Subject::Json(Value::Array(items), loose) => {
            items.iter().any(|v| f(Subject::Json(v, loose)))
        }
        _ => f(s),
    }
}

impl Rhs {
    fn contains(&self, s: Subject<'_>) -> bool {
        match self {
            Rhs::One(l) => compare(s, l) == Some(Ordering::Equal),
            Rhs::List(ls) => ls.iter().any(|l| compare(s, l) == Some(Ordering::Equal)),
            Rhs::Range(lo, hi) => {
                matches!(compare(s, lo), Some(Ordering::Greater | Ordering::Equal))
                    && matches!(compare(s, hi), Some(Ordering::Less | Ordering::Equal))
            }
        }
    }
}

/// Orders a subject against a literal of the same type; `None` when the
/// types differ (so neither `==` nor `>`/`<` hold, and `!=` does).
fn compare(s: Subject<'_>, l: &Literal) -> Option<Ordering> {
    match (s, l) {
        (Subject::Date(ms), Literal::Date(d)) => Some(ms.cmp(d)),
        (Subject::Date(_), _) => None,
        (Subject::Json(v, loose), l) => match (v, l) {
            (Value::Number(n), Literal::Number(x)) => n.as_f64()?.partial_cmp(x),
            (Value::String(t), Literal::Text(x)) => Some(t.as_str().cmp(x.as_str())),
            (Value::String(t), Literal::Number(x)) if loose => {
                parse::number(t.trim())?.partial_cmp(x)
            }
            (Value::String(t), Literal::Date(d)) if loose => Some(parse_datetime(t)?.cmp(d)),
            (Value::Bool(b), Literal::Bool(x)) => Some(b.cmp(x)),
            (Value::Null, Literal::Null) => Some(Ordering::Equal),
            _ => None,
        },
    }
}
